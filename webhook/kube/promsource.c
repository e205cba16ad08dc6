/*
 * promsource.c - Prometheus queries for rightsizing and the thread that
 * refreshes the published snapshot.
 */
#include "kube/promsource.h"

#include "util/buf.h"
#include "util/log.h"
#include "kube/rsstore.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum gg_status ps_client_new(const struct rs_settings *s, struct kc_client **out,
                             struct gg_err *err)
{
    struct kc_endpoint ep = {s->url, s->token_file, s->ca_file, s->cert_file, s->key_file};
    return kc_new_endpoint(&ep, out, err);
}

static bool on_body(void *ctx, const char *data, size_t len)
{
    return buf_append(ctx, data, len) == GG_OK; /* false past RS_MAX_RESPONSE: abort */
}

static enum gg_status query(struct kc_client *c, const struct rs_settings *s, enum rs_query which,
                            const atomic_bool *cancel, json_t **out, struct gg_err *err)
{
    const char *name = which == RS_QUERY_PEAK ? "peak" : "history";
    char promql[RS_QUERY_MAX], escaped[3 * RS_QUERY_MAX], path[3 * RS_QUERY_MAX + 32];
    if (!rs_query(s, which, promql, sizeof(promql)) ||
        !kc_query_escape(promql, escaped, sizeof(escaped)))
        return gg_fail(err, GG_ERR_TOOBIG, "%s query: too long", name);
    snprintf(path, sizeof(path), "/api/v1/query?query=%s", escaped);
    struct buf body;
    buf_init(&body, RS_MAX_RESPONSE);
    struct kc_request rq = {.path = path,
                            .what = "/api/v1/query",
                            .timeout_s = s->timeout_s,
                            .on_body = on_body,
                            .ctx = &body,
                            .cancel = cancel};
    struct kc_response resp;
    struct gg_err inner = {{0}};
    enum gg_status st = kc_get(c, &rq, &resp, &inner);
    if (st != GG_OK && resp.aborted)
        st = gg_fail(err, GG_ERR_TOOBIG, "%s query: answer over %zu bytes", name, RS_MAX_RESPONSE);
    else if (st != GG_OK)
        gg_fail(err, st, "%s query: %s", name, inner.msg);
    else if (resp.status < 200 || resp.status >= 300) {
        json_t *e = resp.body ? json_loads(resp.body, 0, NULL) : NULL;
        const char *why = json_string_value(json_object_get(e, "error"));
        st = gg_fail(err, GG_ERR_IO, "%s query: HTTP %ld: %.160s", name, resp.status,
                     why         ? why
                     : resp.body ? resp.body
                                 : "");
        json_decref(e);
    } else {
        json_error_t je;
        if (!(*out = json_loadb(body.data ? body.data : "", body.len, 0, &je)))
            st = gg_fail(err, GG_ERR_PARSE, "%s query: the answer is not JSON: %s", name, je.text);
    }
    kc_response_clear(&resp);
    buf_clear(&body);
    return st;
}

enum gg_status ps_fetch(struct kc_client *c, const struct rs_settings *s, const atomic_bool *cancel,
                        json_t **peak, json_t **history, struct gg_err *err)
{
    enum gg_status st = query(c, s, RS_QUERY_PEAK, cancel, peak, err);
    if (st == GG_OK && (st = query(c, s, RS_QUERY_HISTORY, cancel, history, err)) != GG_OK) {
        json_decref(*peak);
        *peak = NULL;
    }
    return st;
}

/* ---- the thread ------------------------------------------------------------ */

struct ps_source {
    struct rs_settings s;
    struct kc_client *client;
    struct inventory *inv;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    atomic_bool stop;
};

static void add_owner(void *ctx, const char *ns, const char *pod, const char *owner)
{
    char key[640];
    snprintf(key, sizeof(key), "%s/%s", ns, pod);
    json_object_set_new(ctx, key, json_string(owner));
}

/* One refresh: query, fold, publish. */
static enum gg_status refresh(struct ps_source *p, struct gg_err *err)
{
    json_t *peak = NULL, *history = NULL;
    enum gg_status st = ps_fetch(p->client, &p->s, &p->stop, &peak, &history, err);
    if (st != GG_OK)
        return st;
    json_t *owners = json_object();
    if (p->inv && owners)
        inv_each_owner(p->inv, add_owner, owners);
    struct rs_data d = {.window_s = p->s.window_s, .time_s = (int64_t)time(NULL)};
    st = rs_data_fold(&d, peak, history, p->s.ns_label, p->s.pod_label, owners, err);
    json_decref(owners);
    json_decref(peak);
    json_decref(history);
    if (st == GG_OK) {
        log_fields(LOG_DEBUG, "rightsizing: usage refreshed",
                   json_pack("{s:I,s:I}", "workloads", (json_int_t)json_object_size(d.workloads),
                             "series", (json_int_t)d.series));
        rss_publish(&d, 3 * p->s.refresh_s + p->s.timeout_s);
    }
    rs_data_clear(&d);
    return st;
}

/* Sleep up to ms unless stopped; false when stopped. */
static bool pause_ms(struct ps_source *p, int64_t ms)
{
    return kc_pause_ms(&p->lock, &p->cond, &p->stop, ms);
}

static void *run(void *arg)
{
    struct ps_source *p = arg;
    int64_t backoff_ms = 1000, refresh_ms = p->s.refresh_s * 1000;
    bool failing = false;
    do {
        struct gg_err err = {{0}};
        enum gg_status st = refresh(p, &err);
        if (atomic_load(&p->stop))
            break;
        rss_source_result(st == GG_OK, err.msg);
        if (st != GG_OK) {
            log_fields(LOG_WARN,
                       "rightsizing: usage source failing (policies keep the last data "
                       "until it is stale, then see none)",
                       json_pack("{s:s}", "error", err.msg));
            failing = true;
        } else if (failing) {
            log_msg(LOG_INFO, "rightsizing: usage source recovered");
            failing = false;
        }
        int64_t wait = st == GG_OK ? refresh_ms : backoff_ms < refresh_ms ? backoff_ms : refresh_ms;
        backoff_ms = st == GG_OK ? 1000 : backoff_ms * 2;
        if (!pause_ms(p, wait))
            break;
    } while (true);
    return NULL;
}

enum gg_status ps_start(const struct rs_settings *s, struct inventory *inv, struct ps_source **out,
                        struct gg_err *err)
{
    struct ps_source *p = calloc(1, sizeof(*p));
    if (!p)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    p->s = *s;
    p->inv = inv;
    enum gg_status st = ps_client_new(s, &p->client, err);
    if (st != GG_OK) {
        free(p);
        return st;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cond, &attr);
    pthread_condattr_destroy(&attr);
    rss_set_source("prometheus");
    if (pthread_create(&p->thread, NULL, run, p) != 0) {
        rss_set_source("");
        pthread_cond_destroy(&p->cond);
        pthread_mutex_destroy(&p->lock);
        kc_free(p->client);
        free(p);
        return gg_fail(err, GG_ERR_NOMEM, "cannot start the rightsizing thread");
    }
    char window[32], every[32];
    rs_format_duration(s->window_s, window, sizeof(window));
    rs_format_duration(s->refresh_s, every, sizeof(every));
    log_fields(LOG_INFO, "rightsizing: querying usage history",
               json_pack("{s:s,s:s,s:s,s:s}", "prometheus", s->url, "auth", kc_auth_kind(p->client),
                         "window", window, "refresh", every));
    *out = p;
    return GG_OK;
}

void ps_stop(struct ps_source *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->cond);
    pthread_mutex_destroy(&p->lock);
    kc_free(p->client);
    free(p);
}
