/*
 * promsource.c - Prometheus queries for rightsizing and the thread that
 * refreshes the published snapshot.
 */
#include "kube/promsource.h"

#include "util/log.h"
#include "kube/rsstore.h"

#include <errno.h>
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

/* One answer arriving: counted, folded, passed on. */
struct answer {
    struct rs_reader *reader;
    const struct ps_sink *sink;
    size_t bytes;
    bool over_bytes;
    enum gg_status st;
    struct gg_err err;
};

static bool on_body(void *ctx, const char *data, size_t len)
{
    struct answer *a = ctx;
    if (len > RS_MAX_RESPONSE - a->bytes) {
        a->over_bytes = true;
        return false;
    }
    a->bytes += len;
    if ((a->st = rs_reader_feed(a->reader, data, len, &a->err)) != GG_OK)
        return false;
    if (a->sink && !a->sink->write(a->sink->ctx, data, len)) {
        a->st = gg_fail(&a->err, GG_ERR_IO, "cannot save the answer: %s", strerror(errno));
        return false;
    }
    return true;
}

enum gg_status ps_query(struct kc_client *c, const struct rs_settings *s, enum rs_query which,
                        const atomic_bool *cancel, const json_t *owners, const struct ps_sink *sink,
                        struct rs_data *d, enum ps_over *over, struct gg_err *err)
{
    const char *name = which == RS_QUERY_PEAK ? "peak" : "history";
    char promql[RS_QUERY_MAX], escaped[3 * RS_QUERY_MAX], path[3 * RS_QUERY_MAX + 32];
    if (!rs_query(s, which, promql, sizeof(promql)) ||
        !kc_query_escape(promql, escaped, sizeof(escaped)))
        return gg_fail(err, GG_ERR_TOOBIG, "%s query: too long", name);
    snprintf(path, sizeof(path), "/api/v1/query?query=%s", escaped);
    struct rs_fold_opts o = {s->ns_label, s->pod_label, owners, s->max_series};
    struct answer a = {.reader = rs_reader_new(d, which, &o), .sink = sink};
    if (!a.reader)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    struct kc_request rq = {.path = path,
                            .what = "/api/v1/query",
                            .timeout_s = s->timeout_s,
                            .on_body = on_body,
                            .ctx = &a,
                            .cancel = cancel};
    struct kc_response resp;
    struct gg_err inner = {{0}};
    enum gg_status st = kc_get(c, &rq, &resp, &inner);
    if (st != GG_OK && resp.aborted && a.over_bytes) {
        st = gg_fail(err, GG_ERR_TOOBIG, "%s query: answer over %zu bytes: refused", name,
                     RS_MAX_RESPONSE);
        if (over)
            *over = PS_OVER_BYTES;
    } else if (st != GG_OK && resp.aborted) { /* the reader's or the sink's */
        st = a.st;
        *err = a.err;
        if (over && st == GG_ERR_TOOBIG)
            *over = PS_OVER_SERIES;
    } else if (st != GG_OK) {
        gg_fail(err, st, "%s query: %s", name, inner.msg);
    } else if (resp.status < 200 || resp.status >= 300) {
        json_t *e = resp.body ? json_loads(resp.body, 0, NULL) : NULL;
        const char *why = json_string_value(json_object_get(e, "error"));
        st = gg_fail(err, GG_ERR_IO, "%s query: HTTP %ld: %.160s", name, resp.status,
                     why         ? why
                     : resp.body ? resp.body
                                 : "");
        json_decref(e);
    } else {
        st = rs_reader_end(a.reader, err);
    }
    kc_response_clear(&resp);
    rs_reader_free(a.reader);
    return st;
}

enum gg_status ps_fetch(struct kc_client *c, const struct rs_settings *s, const atomic_bool *cancel,
                        const json_t *owners, struct rs_data *d, enum ps_over *over,
                        struct gg_err *err)
{
    enum gg_status st = ps_query(c, s, RS_QUERY_PEAK, cancel, owners, NULL, d, over, err);
    if (st == GG_OK)
        st = ps_query(c, s, RS_QUERY_HISTORY, cancel, owners, NULL, d, over, err);
    if (st == GG_OK)
        rs_data_finish(d);
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

/* One refresh: query and fold, publish. */
static enum gg_status refresh(struct ps_source *p, enum ps_over *over, struct gg_err *err)
{
    json_t *owners = json_object();
    if (p->inv && owners)
        inv_each_owner(p->inv, add_owner, owners);
    struct rs_data d = {.window_s = p->s.window_s, .time_s = (int64_t)time(NULL)};
    enum gg_status st = ps_fetch(p->client, &p->s, &p->stop, owners, &d, over, err);
    json_decref(owners);
    if (st == GG_OK) {
        log_fields(LOG_DEBUG, "rightsizing: usage refreshed",
                   json_pack("{s:I,s:I,s:I,s:I}", "workloads", (json_int_t)d.n, "series",
                             (json_int_t)d.series, "no_evidence", (json_int_t)d.no_evidence,
                             "max_series", (json_int_t)p->s.max_series));
        rss_publish(&d, 3 * p->s.refresh_s + p->s.timeout_s);
    }
    rs_data_clear(&d); /* what was folded before an error */
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
        enum ps_over over = PS_OVER_NONE;
        enum gg_status st = refresh(p, &over, &err);
        if (atomic_load(&p->stop))
            break;
        rss_source_result(st == GG_OK              ? RSS_REFRESH_OK
                          : over == PS_OVER_SERIES ? RSS_REFRESH_OVER_SERIES
                          : over == PS_OVER_BYTES  ? RSS_REFRESH_OVER_BYTES
                                                   : RSS_REFRESH_FAILED,
                          err.msg);
        if (st != GG_OK) {
            log_fields(LOG_WARN,
                       over ? "rightsizing: usage answer refused, past a bound (policies keep "
                              "the last data until it is stale, then see none)"
                            : "rightsizing: usage source failing (policies keep the last data "
                              "until it is stale, then see none)",
                       json_pack("{s:s}", "error", err.msg));
            failing = true;
        } else if (failing) {
            log_msg(LOG_INFO, "rightsizing: usage source recovered");
            failing = false;
        }
        /* An answer too large is no smaller a second later: the next try is a refresh away. */
        int64_t wait = st == GG_OK || over       ? refresh_ms
                       : backoff_ms < refresh_ms ? backoff_ms
                                                 : refresh_ms;
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
    kc_cond_init(&p->cond);
    rss_set_source("prometheus");
    rss_set_max_series(s->max_series);
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
               json_pack("{s:s,s:s,s:s,s:s,s:I}", "prometheus", s->url, "auth",
                         kc_auth_kind(p->client), "window", window, "refresh", every, "max_series",
                         (json_int_t)s->max_series));
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
