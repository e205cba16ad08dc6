/*
 * rsstore.c - the published rightsizing snapshot, the source's state and
 * the policies' reports, under one mutex.
 */
#include "rsstore.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    struct rs_data data; /* workloads NULL until the first snapshot */
    int64_t stale_after_s;
    int64_t published_s; /* monotonic seconds of the last publish */
    char source[64];     /* "" while off */
    bool last_ok;
    char last_error[200];
    unsigned long long refreshes_ok, refreshes_failed;
    unsigned long long recommended, applied;
    json_t *reported; /* "ns/workload" -> [namespace, requested, needed] */
} S;
static bool template_reviews;

static int64_t mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec;
}

void rss_publish(struct rs_data *d, int64_t stale_after_s)
{
    struct rs_data old;
    pthread_mutex_lock(&lock);
    old = S.data;
    S.data = *d;
    S.stale_after_s = stale_after_s;
    S.published_s = mono_s();
    pthread_mutex_unlock(&lock);
    memset(d, 0, sizeof(*d));
    rs_data_clear(&old); /* freed outside the lock */
}

void rss_source_result(bool ok, const char *error)
{
    pthread_mutex_lock(&lock);
    S.last_ok = ok;
    snprintf(S.last_error, sizeof(S.last_error), "%s", ok ? "" : error);
    if (ok)
        S.refreshes_ok++;
    else
        S.refreshes_failed++;
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
    int64_t now = mono_s();
    pthread_mutex_lock(&lock);
    if (!*S.source)
        r = RSS_OFF;
    else if (!S.data.workloads)
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

void rss_set_template_reviews(bool on)
{
    template_reviews = on;
}

bool rss_template_reviews(void)
{
    return template_reviews;
}

void rss_report(const char *ns, const char *workload, const char *action, int64_t requested_milli,
                int64_t needed_milli)
{
    char key[640];
    snprintf(key, sizeof(key), "%s/%s", ns, workload);
    pthread_mutex_lock(&lock);
    if (strcmp(action, "recommend") == 0)
        S.recommended++;
    else if (strcmp(action, "apply") == 0)
        S.applied++;
    if (!S.reported)
        S.reported = json_object();
    if (S.reported &&
        (json_object_get(S.reported, key) || json_object_size(S.reported) < RSS_MAX_REPORTED))
        json_object_set_new(
            S.reported, key,
            json_pack("[s,I,I]", ns, (json_int_t)requested_milli, (json_int_t)needed_milli));
    pthread_mutex_unlock(&lock);
}

void rss_describe(char *out, size_t size)
{
    int64_t now = mono_s();
    pthread_mutex_lock(&lock);
    if (!*S.source)
        snprintf(out, size, "rightsizing: off");
    else if (!S.data.workloads)
        snprintf(out, size, "rightsizing: no data yet%s%.200s", S.last_error[0] ? ": " : "",
                 S.last_error);
    else
        snprintf(out, size, "rightsizing: %s (%zu workloads, updated %llds ago)%s%.200s",
                 stale_locked(now) ? "stale"
                 : S.last_ok       ? "ok"
                                   : "failing",
                 json_object_size(S.data.workloads), (long long)(now - S.published_s),
                 S.last_error[0] ? ": " : "", S.last_error);
    pthread_mutex_unlock(&lock);
}

/* Requested and needed milli-GPU summed per namespace, from the reports. */
static json_t *per_namespace_locked(void)
{
    json_t *sums = json_object();
    const char *key;
    json_t *r;
    json_object_foreach(S.reported, key, r)
    {
        const char *ns = json_string_value(json_array_get(r, 0));
        json_t *sum = json_object_get(sums, ns);
        if (!sum)
            json_object_set_new(sums, ns, sum = json_pack("[I,I]", (json_int_t)0, (json_int_t)0));
        for (size_t i = 0; i < 2; i++)
            json_array_set_new(sum, i,
                               json_integer(json_integer_value(json_array_get(sum, i)) +
                                            json_integer_value(json_array_get(r, i + 1))));
    }
    return sums;
}

enum gg_status rss_render_metrics(struct buf *out)
{
    int64_t now = mono_s();
    pthread_mutex_lock(&lock);
    if (!*S.source) {
        pthread_mutex_unlock(&lock);
        return GG_OK;
    }
    bool fresh = S.data.workloads && !stale_locked(now);
    enum gg_status st = buf_appendf(
        out,
        "# HELP gpuguard_rightsizing_source_up Whether policies see fresh usage history.\n"
        "# TYPE gpuguard_rightsizing_source_up gauge\n"
        "gpuguard_rightsizing_source_up %d\n"
        "# HELP gpuguard_rightsizing_data_age_seconds Age of the usage history policies see.\n"
        "# TYPE gpuguard_rightsizing_data_age_seconds gauge\n"
        "gpuguard_rightsizing_data_age_seconds %lld\n"
        "# HELP gpuguard_rightsizing_refreshes_total Queries of the usage source, by result.\n"
        "# TYPE gpuguard_rightsizing_refreshes_total counter\n"
        "gpuguard_rightsizing_refreshes_total{result=\"ok\"} %llu\n"
        "gpuguard_rightsizing_refreshes_total{result=\"error\"} %llu\n"
        "# HELP gpuguard_rightsizing_workloads Workloads with usage history.\n"
        "# TYPE gpuguard_rightsizing_workloads gauge\n"
        "gpuguard_rightsizing_workloads %zu\n"
        "# HELP gpuguard_rightsizing_recommendations_total Smaller GPU requests recommended or "
        "applied.\n"
        "# TYPE gpuguard_rightsizing_recommendations_total counter\n"
        "gpuguard_rightsizing_recommendations_total{action=\"recommend\"} %llu\n"
        "gpuguard_rightsizing_recommendations_total{action=\"apply\"} %llu\n",
        fresh ? 1 : 0, S.data.workloads ? (long long)(now - S.published_s) : -1LL, S.refreshes_ok,
        S.refreshes_failed, json_object_size(S.data.workloads), S.recommended, S.applied);
    json_t *sums = per_namespace_locked();
    pthread_mutex_unlock(&lock);
    static const char *const names[] = {"requested", "needed"};
    static const char *const helps[] = {
        "GPU-equivalents the workloads with usage history request, as last admitted.",
        "GPU-equivalents their peak GPU memory x headroom needs on the same pools."};
    for (size_t i = 0; i < 2 && st == GG_OK; i++) {
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
    json_decref(S.reported);
    memset(&S, 0, sizeof(S));
    pthread_mutex_unlock(&lock);
}
