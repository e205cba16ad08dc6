/*
 * metrics.c - the metric tables and their Prometheus text exposition.
 */
#include "util/metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const endpoint_names[MET_ENDPOINTS] = {"mutate", "validate"};
static const char *const verdict_names[MET_VERDICTS] = {"allowed", "patched", "denied", "error"};

/* A histogram's upper bounds in seconds. */
struct bounds {
    const double *le;
    size_t n; /* at most MAX_BUCKETS */
};
#define MAX_BUCKETS 16
#define BOUNDS(a)                                                                                  \
    {                                                                                              \
        (a), sizeof(a) / sizeof((a)[0])                                                            \
    }

/* Reviews and policy calls: 50 us to 5 s. */
static const double request_le[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                    0.025,   0.05,   0.1,     0.25,   0.5,   1,      2.5,   5};
static const struct bounds request_bounds = BOUNDS(request_le);
/* A review's time on the quota ledger (API server round trips): 1 ms to 5 s. */
static const double ledger_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                   0.1,   0.25,   0.5,   1,    2.5,   5};
static const struct bounds ledger_bounds = BOUNDS(ledger_le);

struct histogram {
    atomic_uint_fast64_t count[MAX_BUCKETS + 1]; /* slot n: above the largest bound */
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

/* The quota controller's election (metrics_leader). */
static atomic_bool leader_on;
static atomic_int leader;
static atomic_uint_fast64_t leader_changes;

/*
 * The quota ledger: a slot per namespace, handed out on first use and never
 * reused, found through an open-addressing index read without the lock.
 * The last slot is "_other".
 */
#define LEDGER_OTHER METRICS_LEDGER_NAMESPACES
#define LEDGER_INDEX 512 /* a power of two, twice the namespaces */
static const char *const ledger_result_names[MET_LEDGER_RESULTS] = {"ok", "conflict", "error"};
static const char *const ledger_denial_names[] = {"over", "unavailable"};
#define LEDGER_DENIALS (sizeof(ledger_denial_names) / sizeof(ledger_denial_names[0]))
struct ledger_ns {
    _Atomic(const char *) name; /* set once under the lock, before the index points here */
    atomic_uint_fast64_t writes[MET_LEDGER_RESULTS];
    atomic_uint_fast64_t corrections;
    atomic_uint_fast64_t denials[LEDGER_DENIALS];
};
static struct ledger_ns ledger_ns[METRICS_LEDGER_NAMESPACES + 1] = {
    [LEDGER_OTHER] = {.name = "_other"}};
static atomic_int ledger_index[LEDGER_INDEX]; /* 1 + slot; 0: empty */
static atomic_int n_ledger_ns;
static pthread_mutex_t ledger_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool ledger_on;
static struct histogram ledger_seconds;

static void observe(struct histogram *h, const struct bounds *b, double seconds)
{
    size_t i = 0;
    while (i < b->n && seconds > b->le[i])
        i++;
    atomic_fetch_add_explicit(&h->count[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, (uint64_t)(seconds * 1e9), memory_order_relaxed);
}

void metrics_observe_admission(enum metrics_endpoint ep, enum metrics_operation op,
                               enum metrics_verdict verdict, double seconds)
{
    observe(&durations[ep][verdict], &request_bounds, seconds);
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
    observe(&policies[slot].duration, &request_bounds, seconds);
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

void metrics_leader(bool leading)
{
    atomic_store(&leader_on, true);
    if (atomic_exchange(&leader, leading) == 0 && leading)
        atomic_fetch_add(&leader_changes, 1);
}

static uint32_t ns_hash(const char *s)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* The slot of ns in the index from at, or -(first empty index position) - 1. */
static int ledger_find(const char *ns, uint32_t at)
{
    for (uint32_t k = 0; k < LEDGER_INDEX; k++) {
        uint32_t i = (at + k) & (LEDGER_INDEX - 1);
        int slot = atomic_load(&ledger_index[i]) - 1;
        if (slot < 0)
            return -(int)i - 1;
        if (strcmp(atomic_load(&ledger_ns[slot].name), ns) == 0)
            return slot;
    }
    return -1; /* cannot happen: the index is never more than half full */
}

/* ns's slot, registered on first use; "_other" past the cap and for what is not a namespace. */
static struct ledger_ns *ledger_slot(const char *ns)
{
    atomic_store_explicit(&ledger_on, true, memory_order_relaxed);
    if (!ns || !gg_dns_label(ns))
        return &ledger_ns[LEDGER_OTHER];
    uint32_t at = ns_hash(ns);
    int slot = ledger_find(ns, at);
    if (slot >= 0)
        return &ledger_ns[slot];
    if (atomic_load(&n_ledger_ns) >= METRICS_LEDGER_NAMESPACES)
        return &ledger_ns[LEDGER_OTHER];
    pthread_mutex_lock(&ledger_lock);
    slot = ledger_find(ns, at);
    int n = atomic_load(&n_ledger_ns);
    if (slot < 0 && n < METRICS_LEDGER_NAMESPACES) {
        char *copy = strdup(ns);
        if (copy) {
            atomic_store(&ledger_ns[n].name, copy);
            atomic_store(&ledger_index[-slot - 1], n + 1);
            atomic_store(&n_ledger_ns, n + 1);
            slot = n;
        }
    }
    pthread_mutex_unlock(&ledger_lock);
    return &ledger_ns[slot >= 0 ? slot : LEDGER_OTHER];
}

void metrics_ledger_enable(void)
{
    atomic_store(&ledger_on, true);
}

void metrics_ledger_write(const char *ns, enum metrics_ledger_result r)
{
    if ((unsigned)r < MET_LEDGER_RESULTS)
        atomic_fetch_add_explicit(&ledger_slot(ns)->writes[r], 1, memory_order_relaxed);
}

void metrics_ledger_seconds(double s)
{
    atomic_store_explicit(&ledger_on, true, memory_order_relaxed);
    observe(&ledger_seconds, &ledger_bounds, s < 0 ? 0 : s);
}

void metrics_ledger_correction(const char *ns, unsigned n)
{
    atomic_fetch_add_explicit(&ledger_slot(ns)->corrections, n, memory_order_relaxed);
}

void metrics_ledger_denial(const char *ns, const char *reason)
{
    for (size_t i = 0; reason && i < LEDGER_DENIALS; i++)
        if (strcmp(reason, ledger_denial_names[i]) == 0)
            atomic_fetch_add_explicit(&ledger_slot(ns)->denials[i], 1, memory_order_relaxed);
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

/* One histogram's series; labels is the text inside the braces, e.g. endpoint="mutate", or "". */
static enum gg_status render_histogram(struct buf *out, const char *name, const char *labels,
                                       struct histogram *h, const struct bounds *b)
{
    uint64_t cumulative = 0;
    enum gg_status st = GG_OK;
    const char *comma = *labels ? "," : "";
    for (size_t i = 0; i <= b->n && st == GG_OK; i++) {
        cumulative += load(&h->count[i]);
        char le[32];
        if (i < b->n)
            snprintf(le, sizeof(le), "%g", b->le[i]);
        else
            snprintf(le, sizeof(le), "+Inf");
        st = buf_appendf(out, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, labels, comma, le,
                         (unsigned long long)cumulative);
    }
    const char *open = *labels ? "{" : "", *close = *labels ? "}" : "";
    if (st == GG_OK)
        st = buf_appendf(out, "%s_sum%s%s%s %.9f\n%s_count%s%s%s %llu\n", name, open, labels, close,
                         load(&h->sum_ns) / 1e9, name, open, labels, close,
                         (unsigned long long)cumulative);
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
                                  &durations[e][v], &request_bounds);
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
                              &policies[i].duration, &request_bounds);
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

static enum gg_status render_leader(struct buf *out)
{
    if (!atomic_load(&leader_on))
        return GG_OK;
    return buf_appendf(
        out,
        "# HELP gpuguard_leader Whether this replica leads the quota controller (holds its "
        "Lease and renewed it within the renew deadline).\n"
        "# TYPE gpuguard_leader gauge\n"
        "gpuguard_leader %d\n"
        "# HELP gpuguard_leader_changes_total Times this replica became the quota controller's "
        "leader.\n"
        "# TYPE gpuguard_leader_changes_total counter\n"
        "gpuguard_leader_changes_total %llu\n",
        atomic_load(&leader), (unsigned long long)load(&leader_changes));
}

/* A ledger family with a namespace label: its counters in struct ledger_ns, one per value of
 * its second label (key), or a single one when key is NULL. */
struct ledger_family {
    const char *name, *help, *key;
    const char *const *values;
    size_t n, offset;
};

static const struct ledger_family ledger_families[] = {
    {"gpuguard_quota_ledger_writes_total",
     "Writes of a GPUQuota's status by admission, by result (ok, conflict: 409, error).", "result",
     ledger_result_names, MET_LEDGER_RESULTS, offsetof(struct ledger_ns, writes)},
    {"gpuguard_quota_ledger_corrections_total",
     "Ledger entries or usage the quota controller corrected.", NULL, NULL, 1,
     offsetof(struct ledger_ns, corrections)},
    {"gpuguard_quota_ledger_denials_total",
     "Reviews the quota ledger denied, by reason (over: past the quota, unavailable: the ledger "
     "could not be read or written).",
     "reason", ledger_denial_names, LEDGER_DENIALS, offsetof(struct ledger_ns, denials)},
};

/* One family: each namespace that counted in it (in order of first use), then "_other". */
static enum gg_status render_ledger_family(struct buf *out, const struct ledger_family *f)
{
    int n = atomic_load(&n_ledger_ns);
    enum gg_status st = buf_appendf(out,
                                    "# HELP %s %s The first %d namespaces have series of their "
                                    "own, the rest are counted under namespace=\"_other\".\n"
                                    "# TYPE %s counter\n",
                                    f->name, f->help, METRICS_LEDGER_NAMESPACES, f->name);
    for (int k = 0; k <= n && st == GG_OK; k++) {
        struct ledger_ns *ns = &ledger_ns[k < n ? k : LEDGER_OTHER];
        atomic_uint_fast64_t *c = (atomic_uint_fast64_t *)((char *)ns + f->offset);
        bool used = false;
        for (size_t v = 0; v < f->n; v++)
            used |= load(&c[v]) != 0;
        for (size_t v = 0; used && v < f->n && st == GG_OK; v++) {
            char second[64] = ""; /* ,result="ok" */
            if (f->key)
                snprintf(second, sizeof(second), ",%s=\"%s\"", f->key, f->values[v]);
            st = buf_appendf(out, "%s{namespace=\"%s\"%s} %llu\n", f->name, atomic_load(&ns->name),
                             second, (unsigned long long)load(&c[v]));
        }
    }
    return st;
}

static enum gg_status render_ledger(struct buf *out)
{
    if (!atomic_load(&ledger_on))
        return GG_OK;
    enum gg_status st = render_ledger_family(out, &ledger_families[0]);
    if (st == GG_OK)
        st = buf_appendf(out, "# HELP gpuguard_quota_ledger_seconds Time a review spent on the "
                              "quota ledger.\n"
                              "# TYPE gpuguard_quota_ledger_seconds histogram\n");
    if (st == GG_OK)
        st = render_histogram(out, "gpuguard_quota_ledger_seconds", "", &ledger_seconds,
                              &ledger_bounds);
    for (size_t i = 1; i < sizeof(ledger_families) / sizeof(ledger_families[0]) && st == GG_OK; i++)
        st = render_ledger_family(out, &ledger_families[i]);
    return st;
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
    if (st == GG_OK)
        st = render_leader(out);
    if (st == GG_OK)
        st = render_ledger(out);
    return st;
}
