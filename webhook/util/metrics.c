/*
 * metrics.c - the metric tables and their Prometheus text exposition.
 */
#include "util/metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const endpoint_names[MET_ENDPOINTS] = {"mutate", "validate"};
static const char *const verdict_names[MET_VERDICTS] = {"allowed", "patched", "denied", "error"};

/* Upper bounds in seconds, 50 us to 5 s. */
static const double buckets[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                 0.025,   0.05,   0.1,     0.25,   0.5,   1,      2.5,   5};
#define N_BUCKETS (sizeof(buckets) / sizeof(buckets[0]))

struct histogram {
    atomic_uint_fast64_t count[N_BUCKETS + 1]; /* last slot: above the largest bound */
    atomic_uint_fast64_t sum_ns;
};

static struct histogram durations[MET_ENDPOINTS][MET_VERDICTS];
static atomic_uint_fast64_t requests[MET_ENDPOINTS][MET_OPERATIONS][MET_VERDICTS];
static const char *const operation_names[MET_OPERATIONS] = {"CREATE", "UPDATE", "DELETE", "CONNECT",
                                                            "none"};

/* Per-policy evaluations: slots handed out by name, never reused. */
#define MAX_POLICIES 128
static const char *const policy_result_names[MET_POLICY_RESULTS] = {
    "ok", "denied", "warned", "error", "budget", "memory", "timeout"};
static struct {
    _Atomic(const char *) name; /* set once under the lock, read without it */
    atomic_uint_fast64_t results[MET_POLICY_RESULTS];
    struct histogram duration;
} policies[MAX_POLICIES];
static atomic_int n_policies;
static pthread_mutex_t policy_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_size_t lua_memory_peak;
static atomic_uint_fast64_t deadline_overruns;

/* HTTP error statuses we answer, 400..599, one counter each. */
static atomic_uint_fast64_t http_errors[200];
static atomic_long inflight;
static atomic_uint_fast64_t reloads[2]; /* failed, succeeded */
static atomic_uint_fast64_t generation = 1;
static atomic_int last_reload_ok = 1;
static atomic_uint_fast64_t tls_loads[2]; /* refused, accepted */
static atomic_int_fast64_t tls_not_after;
static atomic_long connections;

static void observe(struct histogram *h, double seconds)
{
    size_t i = 0;
    while (i < N_BUCKETS && seconds > buckets[i])
        i++;
    atomic_fetch_add_explicit(&h->count[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, (uint64_t)(seconds * 1e9), memory_order_relaxed);
}

void metrics_observe_admission(enum metrics_endpoint ep, enum metrics_operation op,
                               enum metrics_verdict verdict, double seconds)
{
    observe(&durations[ep][verdict], seconds);
    atomic_fetch_add_explicit(&requests[ep][op][verdict], 1, memory_order_relaxed);
}

int metrics_policy_slot(const char *name)
{
    int n = atomic_load(&n_policies);
    for (int i = 0; i < n; i++)
        if (strcmp(atomic_load(&policies[i].name), name) == 0)
            return i;
    pthread_mutex_lock(&policy_lock);
    int slot = -1;
    n = atomic_load(&n_policies);
    for (int i = 0; i < n && slot < 0; i++)
        if (strcmp(atomic_load(&policies[i].name), name) == 0)
            slot = i;
    if (slot < 0 && n < MAX_POLICIES) {
        char *copy = strdup(name);
        if (copy) {
            atomic_store(&policies[n].name, copy);
            atomic_store(&n_policies, n + 1);
            slot = n;
        }
    }
    pthread_mutex_unlock(&policy_lock);
    return slot;
}

void metrics_policy_observe(int slot, enum metrics_policy_result result, double seconds)
{
    if (slot < 0 || slot >= MAX_POLICIES)
        return;
    atomic_fetch_add_explicit(&policies[slot].results[result], 1, memory_order_relaxed);
    observe(&policies[slot].duration, seconds);
}

void metrics_deadline_overrun(void)
{
    atomic_fetch_add_explicit(&deadline_overruns, 1, memory_order_relaxed);
}

void metrics_lua_memory(size_t peak)
{
    size_t seen = atomic_load(&lua_memory_peak);
    while (peak > seen && !atomic_compare_exchange_weak(&lua_memory_peak, &seen, peak))
        ;
}

void metrics_http_error(int status)
{
    if (status >= 400 && status < 600)
        atomic_fetch_add_explicit(&http_errors[status - 400], 1, memory_order_relaxed);
}

void metrics_inflight_add(int delta)
{
    atomic_fetch_add(&inflight, delta);
}

void metrics_reload(bool ok, uint64_t live_generation)
{
    atomic_fetch_add(&reloads[ok], 1);
    atomic_store(&generation, live_generation);
    atomic_store(&last_reload_ok, ok);
}

void metrics_tls(bool ok, int64_t not_after)
{
    atomic_fetch_add(&tls_loads[ok], 1);
    atomic_store(&tls_not_after, not_after);
}

void metrics_connections_add(int delta)
{
    atomic_fetch_add(&connections, delta);
}

long metrics_inflight(void)
{
    return atomic_load(&inflight);
}

static uint64_t load(atomic_uint_fast64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

static enum gg_status render_admissions(struct buf *out)
{
    enum gg_status st =
        buf_appendf(out, "# HELP gpuguard_admission_requests_total Admission reviews answered.\n"
                         "# TYPE gpuguard_admission_requests_total counter\n");
    for (int e = 0; e < MET_ENDPOINTS && st == GG_OK; e++)
        for (int o = 0; o < MET_OPERATIONS && st == GG_OK; o++)
            for (int v = 0; v < MET_VERDICTS && st == GG_OK; v++) {
                uint64_t n = load(&requests[e][o][v]);
                if (n || o == 0)
                    st = buf_appendf(out,
                                     "gpuguard_admission_requests_total{endpoint=\"%s\","
                                     "operation=\"%s\",verdict=\"%s\"} %llu\n",
                                     endpoint_names[e], operation_names[o], verdict_names[v],
                                     (unsigned long long)n);
            }
    return st;
}

/* One histogram's series; labels is the text inside the braces, e.g. endpoint="mutate". */
static enum gg_status render_histogram(struct buf *out, const char *name, const char *labels,
                                       struct histogram *h)
{
    uint64_t cumulative = 0;
    enum gg_status st = GG_OK;
    for (size_t i = 0; i <= N_BUCKETS && st == GG_OK; i++) {
        cumulative += load(&h->count[i]);
        char le[32];
        if (i < N_BUCKETS)
            snprintf(le, sizeof(le), "%g", buckets[i]);
        else
            snprintf(le, sizeof(le), "+Inf");
        st = buf_appendf(out, "%s_bucket{%s,le=\"%s\"} %llu\n", name, labels, le,
                         (unsigned long long)cumulative);
    }
    if (st == GG_OK)
        st = buf_appendf(out, "%s_sum{%s} %.9f\n%s_count{%s} %llu\n", name, labels,
                         load(&h->sum_ns) / 1e9, name, labels, (unsigned long long)cumulative);
    return st;
}

static enum gg_status render_durations(struct buf *out)
{
    enum gg_status st =
        buf_appendf(out, "# HELP gpuguard_admission_request_duration_seconds Time from the "
                         "request's first byte to its answer.\n"
                         "# TYPE gpuguard_admission_request_duration_seconds histogram\n");
    for (int e = 0; e < MET_ENDPOINTS && st == GG_OK; e++)
        for (int v = 0; v < MET_VERDICTS && st == GG_OK; v++) {
            char labels[96];
            snprintf(labels, sizeof(labels), "endpoint=\"%s\",verdict=\"%s\"", endpoint_names[e],
                     verdict_names[v]);
            st = render_histogram(out, "gpuguard_admission_request_duration_seconds", labels,
                                  &durations[e][v]);
        }
    return st;
}

static enum gg_status render_policies(struct buf *out)
{
    int n = atomic_load(&n_policies);
    enum gg_status st = buf_appendf(
        out, "# HELP gpuguard_policy_evaluations_total Policy function calls by result.\n"
             "# TYPE gpuguard_policy_evaluations_total counter\n");
    for (int i = 0; i < n && st == GG_OK; i++)
        for (int r = 0; r < MET_POLICY_RESULTS && st == GG_OK; r++)
            st = buf_appendf(out,
                             "gpuguard_policy_evaluations_total{policy=\"%s\",result=\"%s\"} "
                             "%llu\n",
                             atomic_load(&policies[i].name), policy_result_names[r],
                             (unsigned long long)load(&policies[i].results[r]));
    if (st == GG_OK)
        st = buf_appendf(out, "# HELP gpuguard_policy_duration_seconds Time in one policy "
                              "function call.\n"
                              "# TYPE gpuguard_policy_duration_seconds histogram\n");
    for (int i = 0; i < n && st == GG_OK; i++) {
        char labels[96];
        snprintf(labels, sizeof(labels), "policy=\"%s\"", atomic_load(&policies[i].name));
        st = render_histogram(out, "gpuguard_policy_duration_seconds", labels,
                              &policies[i].duration);
    }
    if (st == GG_OK)
        st = buf_appendf(out,
                         "# HELP gpuguard_lua_memory_peak_bytes Largest Lua VM memory seen.\n"
                         "# TYPE gpuguard_lua_memory_peak_bytes gauge\n"
                         "gpuguard_lua_memory_peak_bytes %zu\n"
                         "# HELP gpuguard_deadline_overruns_total Evaluations that ended past "
                         "their request's deadline.\n"
                         "# TYPE gpuguard_deadline_overruns_total counter\n"
                         "gpuguard_deadline_overruns_total %llu\n"
                         "# HELP gpuguard_build_info The running gpuguard build.\n"
                         "# TYPE gpuguard_build_info gauge\n"
                         "gpuguard_build_info{version=\"%s\"} 1\n",
                         atomic_load(&lua_memory_peak),
                         (unsigned long long)atomic_load(&deadline_overruns), GG_VERSION);
    return st;
}

static enum gg_status render_http(struct buf *out)
{
    enum gg_status st = buf_appendf(
        out, "# HELP gpuguard_http_errors_total Requests refused with an HTTP error status.\n"
             "# TYPE gpuguard_http_errors_total counter\n");
    for (int i = 0; i < 200 && st == GG_OK; i++) {
        uint64_t n = load(&http_errors[i]);
        if (n)
            st = buf_appendf(out, "gpuguard_http_errors_total{code=\"%d\"} %llu\n", 400 + i,
                             (unsigned long long)n);
    }
    if (st == GG_OK)
        st = buf_appendf(out,
                         "# HELP gpuguard_inflight_requests Admission requests being handled.\n"
                         "# TYPE gpuguard_inflight_requests gauge\n"
                         "gpuguard_inflight_requests %ld\n"
                         "# HELP gpuguard_open_connections Connections open on the webhook port.\n"
                         "# TYPE gpuguard_open_connections gauge\n"
                         "gpuguard_open_connections %ld\n",
                         metrics_inflight(), atomic_load(&connections));
    return st;
}

static enum gg_status render_reloads(struct buf *out)
{
    return buf_appendf(
        out,
        "# HELP gpuguard_policy_reloads_total Policy set reloads by result.\n"
        "# TYPE gpuguard_policy_reloads_total counter\n"
        "gpuguard_policy_reloads_total{result=\"ok\"} %llu\n"
        "gpuguard_policy_reloads_total{result=\"error\"} %llu\n"
        "# HELP gpuguard_policy_generation Generation of the policy set serving requests.\n"
        "# TYPE gpuguard_policy_generation gauge\n"
        "gpuguard_policy_generation %llu\n"
        "# HELP gpuguard_policy_last_reload_success Whether the last reload was accepted.\n"
        "# TYPE gpuguard_policy_last_reload_success gauge\n"
        "gpuguard_policy_last_reload_success %d\n",
        (unsigned long long)load(&reloads[1]), (unsigned long long)load(&reloads[0]),
        (unsigned long long)load(&generation), atomic_load(&last_reload_ok));
}

static enum gg_status render_tls(struct buf *out)
{
    return buf_appendf(
        out,
        "# HELP gpuguard_tls_certificate_expiry_timestamp_seconds notAfter of the serving "
        "certificate.\n"
        "# TYPE gpuguard_tls_certificate_expiry_timestamp_seconds gauge\n"
        "gpuguard_tls_certificate_expiry_timestamp_seconds %lld\n"
        "# HELP gpuguard_tls_certificate_loads_total Serving certificate loads by result.\n"
        "# TYPE gpuguard_tls_certificate_loads_total counter\n"
        "gpuguard_tls_certificate_loads_total{result=\"ok\"} %llu\n"
        "gpuguard_tls_certificate_loads_total{result=\"error\"} %llu\n",
        (long long)atomic_load(&tls_not_after), (unsigned long long)load(&tls_loads[1]),
        (unsigned long long)load(&tls_loads[0]));
}

enum gg_status metrics_render(struct buf *out)
{
    enum gg_status st = render_admissions(out);
    if (st == GG_OK)
        st = render_tls(out);
    if (st == GG_OK)
        st = render_reloads(out);
    if (st == GG_OK)
        st = render_durations(out);
    if (st == GG_OK)
        st = render_policies(out);
    if (st == GG_OK)
        st = render_http(out);
    return st;
}
