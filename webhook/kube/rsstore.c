/*
 * rsstore.c - the published rightsizing snapshot, the source's state and
 * the policies' reports, under one mutex.
 *
 * Reports arrive on request threads, whose jansson allocations live in the
 * request's arena (arena.h): what outlives a request is kept in plain
 * malloc'ed memory here, never in JSON values.
 */
#include "kube/rsstore.h"
#include "util/clock.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A workload's last finding: namespace and workload in key, "ns/workload". */
struct report {
    char *key;
    size_t ns_len;
    int64_t requested, needed;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    struct rs_data data;
    bool have_data; /* false until the first snapshot */
    int64_t stale_after_s;
    int64_t published_s; /* monotonic seconds of the last publish */
    char source[64];     /* "" while off */
    bool last_ok;
    char last_error[200];
    unsigned long long refreshes_ok, refreshes_failed;
    unsigned long long refused_series, refused_bytes;
    size_t max_series;
    unsigned long long recommended, applied;
    struct report *reported; /* open addressing on "ns/workload"; cap a power of two */
    size_t n_reported, cap_reported;
    json_t *audited; /* rss_publish_audit's figures; NULL: none, the reports' sums are shown */
} S;

/* rss_record_last: this thread's reports are kept for rss_take_last, and not counted. */
static _Thread_local struct {
    struct rss_last last;
    bool record, have;
} T;

void rss_publish(struct rs_data *d, int64_t stale_after_s)
{
    struct rs_data old;
    pthread_mutex_lock(&lock);
    old = S.data;
    S.data = *d;
    S.have_data = true;
    S.stale_after_s = stale_after_s;
    S.published_s = (gg_now_us() / 1000000);
    pthread_mutex_unlock(&lock);
    memset(d, 0, sizeof(*d));
    rs_data_clear(&old); /* freed outside the lock */
}

void rss_source_result(enum rss_refresh result, const char *error)
{
    bool ok = result == RSS_REFRESH_OK;
    pthread_mutex_lock(&lock);
    S.last_ok = ok;
    snprintf(S.last_error, sizeof(S.last_error), "%s", ok ? "" : error);
    if (ok)
        S.refreshes_ok++;
    else
        S.refreshes_failed++;
    if (result == RSS_REFRESH_OVER_SERIES)
        S.refused_series++;
    else if (result == RSS_REFRESH_OVER_BYTES)
        S.refused_bytes++;
    pthread_mutex_unlock(&lock);
}

void rss_set_max_series(size_t max_series)
{
    pthread_mutex_lock(&lock);
    S.max_series = max_series;
    pthread_mutex_unlock(&lock);
}

void rss_set_source(const char *what)
{
    pthread_mutex_lock(&lock);
    snprintf(S.source, sizeof(S.source), "%s", what);
    pthread_mutex_unlock(&lock);
}

static bool stale_locked(int64_t now)
{
    return S.stale_after_s > 0 && now - S.published_s > S.stale_after_s;
}

enum rss_result rss_lookup(const char *ns, const char *workload, struct rs_usage *u,
                           int64_t *window_s, int64_t *age_s)
{
    enum rss_result r;
    int64_t now = (gg_now_us() / 1000000);
    pthread_mutex_lock(&lock);
    if (!*S.source)
        r = RSS_OFF;
    else if (!S.have_data)
        r = RSS_NO_DATA_YET;
    else if (stale_locked(now))
        r = RSS_STALE;
    else if (!rs_data_get(&S.data, ns, workload, u))
        r = RSS_UNKNOWN;
    else {
        r = RSS_FOUND;
        *window_s = S.data.window_s;
        *age_s = now - S.published_s;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static size_t slot_of(const struct report *slots, size_t cap, const char *key)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (const char *p = key; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    size_t i = h & (cap - 1);
    while (slots[i].key && strcmp(slots[i].key, key) != 0)
        i = (i + 1) & (cap - 1);
    return i;
}

/* Room for one more report; false when out of memory or full. */
static bool reports_room_locked(void)
{
    if ((S.n_reported + 1) * 10 <= S.cap_reported * 7)
        return true;
    if (S.n_reported >= RSS_MAX_REPORTED)
        return false;
    size_t cap = S.cap_reported ? S.cap_reported * 2 : 256;
    struct report *slots = calloc(cap, sizeof(*slots));
    if (!slots)
        return false;
    for (size_t i = 0; i < S.cap_reported; i++)
        if (S.reported[i].key)
            slots[slot_of(slots, cap, S.reported[i].key)] = S.reported[i];
    free(S.reported);
    S.reported = slots;
    S.cap_reported = cap;
    return true;
}

void rss_report(const char *ns, const char *workload, const char *action, int64_t requested_milli,
                int64_t needed_milli)
{
    char key[640];
    snprintf(key, sizeof(key), "%s/%s", ns, workload);
    if (T.record) {
        T.last = (struct rss_last){.requested = requested_milli, .needed = needed_milli};
        snprintf(T.last.ns, sizeof(T.last.ns), "%s", ns);
        snprintf(T.last.workload, sizeof(T.last.workload), "%s", workload);
        snprintf(T.last.action, sizeof(T.last.action), "%s", action);
        T.have = true;
        return;
    }
    pthread_mutex_lock(&lock);
    if (strcmp(action, "recommend") == 0)
        S.recommended++;
    else if (strcmp(action, "apply") == 0)
        S.applied++;
    struct report *r =
        S.cap_reported ? &S.reported[slot_of(S.reported, S.cap_reported, key)] : NULL;
    if ((!r || !r->key) && reports_room_locked()) {
        r = &S.reported[slot_of(S.reported, S.cap_reported, key)];
        if ((r->key = strdup(key)))
            S.n_reported++;
        r->ns_len = strlen(ns);
    }
    if (r && r->key) {
        r->requested = requested_milli;
        r->needed = needed_milli;
    }
    pthread_mutex_unlock(&lock);
}

void rss_record_last(void)
{
    T.record = true;
}

bool rss_take_last(struct rss_last *out)
{
    bool had = T.have;
    if (had)
        *out = T.last;
    T.have = false;
    return had;
}

void rss_publish_audit(json_t *by_namespace)
{
    pthread_mutex_lock(&lock);
    json_t *old = S.audited;
    S.audited = by_namespace;
    pthread_mutex_unlock(&lock);
    json_decref(old);
}

void rss_describe(char *out, size_t size)
{
    int64_t now = (gg_now_us() / 1000000);
    pthread_mutex_lock(&lock);
    const char *sep = S.last_error[0] ? ": " : "";
    if (!*S.source)
        *out = '\0';
    else if (!S.have_data)
        snprintf(out, size, "rightsizing: no data yet%s%.200s", sep, S.last_error);
    else
        snprintf(out, size, "rightsizing: %s (%zu workloads, updated %llds ago)%s%.200s",
                 stale_locked(now) ? "stale, policies see no data"
                 : S.last_ok       ? "ok"
                                   : "failing, policies see the last data",
                 S.data.n, (long long)(now - S.published_s), sep, S.last_error);
    pthread_mutex_unlock(&lock);
}

/* Requested and needed milli-GPU summed per namespace, from the reports. */
static json_t *per_namespace_locked(void)
{
    json_t *sums = json_object();
    for (size_t i = 0; sums && i < S.cap_reported; i++) {
        const struct report *r = &S.reported[i];
        char ns[256];
        if (!r->key || r->ns_len >= sizeof(ns))
            continue;
        memcpy(ns, r->key, r->ns_len);
        ns[r->ns_len] = '\0';
        json_t *sum = json_object_get(sums, ns);
        int64_t requested = json_integer_value(json_array_get(sum, 0)) + r->requested;
        int64_t needed = json_integer_value(json_array_get(sum, 1)) + r->needed;
        json_object_set_new(sums, ns,
                            json_pack("[I,I]", (json_int_t)requested, (json_int_t)needed));
    }
    return sums;
}

enum gg_status rss_render_metrics(struct buf *out)
{
    int64_t now = (gg_now_us() / 1000000);
    pthread_mutex_lock(&lock);
    bool fresh = S.have_data && !stale_locked(now);
    enum gg_status st =
        !*S.source
            ? GG_OK
            : buf_appendf(
                  out,
                  "# HELP gpuguard_rightsizing_source_up Whether policies see fresh usage "
                  "history.\n"
                  "# TYPE gpuguard_rightsizing_source_up gauge\n"
                  "gpuguard_rightsizing_source_up %d\n"
                  "# HELP gpuguard_rightsizing_data_age_seconds Age of the usage history policies "
                  "see.\n"
                  "# TYPE gpuguard_rightsizing_data_age_seconds gauge\n"
                  "gpuguard_rightsizing_data_age_seconds %lld\n"
                  "# HELP gpuguard_rightsizing_refreshes_total Queries of the usage source, by "
                  "result.\n"
                  "# TYPE gpuguard_rightsizing_refreshes_total counter\n"
                  "gpuguard_rightsizing_refreshes_total{result=\"ok\"} %llu\n"
                  "gpuguard_rightsizing_refreshes_total{result=\"error\"} %llu\n"
                  "# HELP gpuguard_rightsizing_workloads Workloads with usage history.\n"
                  "# TYPE gpuguard_rightsizing_workloads gauge\n"
                  "gpuguard_rightsizing_workloads %zu\n"
                  "# HELP gpuguard_rightsizing_recommendations_total Smaller GPU requests "
                  "recommended or "
                  "applied.\n"
                  "# TYPE gpuguard_rightsizing_recommendations_total counter\n"
                  "gpuguard_rightsizing_recommendations_total{action=\"recommend\"} %llu\n"
                  "gpuguard_rightsizing_recommendations_total{action=\"apply\"} %llu\n"
                  "# HELP gpuguard_rightsizing_no_evidence_workloads Workloads left out of the "
                  "usage "
                  "history: their peak is below 1 GiB, no evidence of a small workload.\n"
                  "# TYPE gpuguard_rightsizing_no_evidence_workloads gauge\n"
                  "gpuguard_rightsizing_no_evidence_workloads %zu\n"
                  "# HELP gpuguard_rightsizing_series Series of each answer in the usage history "
                  "policies "
                  "see.\n"
                  "# TYPE gpuguard_rightsizing_series gauge\n"
                  "gpuguard_rightsizing_series{query=\"peak\"} %zu\n"
                  "gpuguard_rightsizing_series{query=\"history\"} %zu\n"
                  "# HELP gpuguard_rightsizing_max_series The most series an answer may have "
                  "(rightsizing.max_series).\n"
                  "# TYPE gpuguard_rightsizing_max_series gauge\n"
                  "gpuguard_rightsizing_max_series %zu\n"
                  "# HELP gpuguard_rightsizing_refused_total Refreshes refused for an answer past "
                  "a bound "
                  "(the last data is kept until stale).\n"
                  "# TYPE gpuguard_rightsizing_refused_total counter\n"
                  "gpuguard_rightsizing_refused_total{limit=\"series\"} %llu\n"
                  "gpuguard_rightsizing_refused_total{limit=\"bytes\"} %llu\n",
                  fresh ? 1 : 0, S.have_data ? (long long)(now - S.published_s) : -1LL,
                  S.refreshes_ok, S.refreshes_failed, S.data.n, S.recommended, S.applied,
                  S.data.no_evidence, S.data.peak_series, S.data.history_series, S.max_series,
                  S.refused_series, S.refused_bytes);
    /* The last audit's figures when there are some; else, with a source, the reviews'. */
    json_t *sums = S.audited ? json_incref(S.audited) : *S.source ? per_namespace_locked() : NULL;
    size_t figures = S.audited ? 4 : 2;
    pthread_mutex_unlock(&lock);
    static const char *const names[] = {"requested", "needed", "waste", "unknown"};
    static const char *const helps[] = {
        "GPU-equivalents the workloads with usage history request: the running ones at the "
        "last audit, else as last admitted.",
        "GPU-equivalents their peak GPU memory x headroom needs, at the allocation the fleet "
        "would give.",
        "GPU-equivalents the running workloads with usage history hold beyond what they need.",
        "GPU-equivalents the running workloads without usage history hold."};
    for (size_t i = 0; i < figures && st == GG_OK; i++) {
        st = buf_appendf(out,
                         "# HELP gpuguard_rightsizing_%s_gpus %s\n"
                         "# TYPE gpuguard_rightsizing_%s_gpus gauge\n",
                         names[i], helps[i], names[i]);
        const char *ns;
        json_t *sum;
        json_object_foreach(sums, ns, sum)
        {
            if (st == GG_OK)
                st = buf_appendf(out, "gpuguard_rightsizing_%s_gpus{namespace=\"%s\"} %.3f\n",
                                 names[i], ns,
                                 (double)json_integer_value(json_array_get(sum, i)) / 1000);
        }
    }
    json_decref(sums);
    return st;
}

void rss_reset(void)
{
    pthread_mutex_lock(&lock);
    rs_data_clear(&S.data);
    json_decref(S.audited);
    for (size_t i = 0; i < S.cap_reported; i++)
        free(S.reported[i].key);
    free(S.reported);
    memset(&S, 0, sizeof(S));
    pthread_mutex_unlock(&lock);
}
