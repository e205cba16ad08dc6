/*
 * ledger.c - a GPU pod's charge written into its namespace's GPUQuota
 * before the pod is admitted (ledger.h).
 *
 * One write at a time per replica: a replica's reviews of one namespace
 * would only conflict with each other, and the client belongs to one
 * thread.  Each write starts from the newest object this replica knows (its
 * own last write, or the watch's copy when that is newer) and, on 409, from
 * a fresh GET.
 */
#include "kube/ledger.h"

#include "kube/gpuquota.h"
#include "util/arena.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LEDGER_MARGIN_US 150000    /* kept back from the deadline for the answer itself */
#define LEDGER_REQUEST_MAX_MS 2000 /* one GET or PUT, at most */
#define LEDGER_BACKOFF_MAX_MS 200  /* between attempts after an error (not after a 409) */

struct ledger {
    pthread_mutex_t lock; /* one write at a time; the client and latest are under it */
    struct kc_client *client;
    struct inventory *inv;
    json_t *latest; /* ns -> the object as this replica last wrote or read it */
};

enum gg_status ledger_new(struct kc_client *client, struct inventory *inv, struct ledger **out,
                          struct gg_err *err)
{
    struct ledger *l = calloc(1, sizeof(*l));
    if (!l || !(l->latest = json_object())) {
        free(l);
        kc_free(client);
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&l->lock, NULL);
    l->client = client;
    l->inv = inv;
    metrics_ledger_enable();
    *out = l;
    return GG_OK;
}

void ledger_free(struct ledger *l)
{
    if (!l)
        return;
    kc_free(l->client);
    json_decref(l->latest);
    pthread_mutex_destroy(&l->lock);
    free(l);
}

/* resourceVersion as a number (etcd's are; 0 when not one): which of two copies is newer. */
static unsigned long long rv_of(const json_t *obj)
{
    const char *rv =
        json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
    char *end = NULL;
    unsigned long long n = rv ? strtoull(rv, &end, 10) : 0;
    return rv && *rv && !*end ? n : 0;
}

static void object_path(const json_t *obj, bool status, char *out, size_t size)
{
    const json_t *meta = json_object_get(obj, "metadata");
    snprintf(out, size, "/apis/%s/%s/namespaces/%s/%s/%s%s", GQ_GROUP, GQ_VERSION,
             json_string_value(json_object_get(meta, "namespace")), GQ_PLURAL,
             json_string_value(json_object_get(meta, "name")), status ? "/status" : "");
}

/* The time left before deadline_us for one request, in ms (at most LEDGER_REQUEST_MAX_MS). */
static long request_ms(int64_t deadline_us)
{
    int64_t left = (deadline_us - gg_now_us()) / 1000;
    return left > LEDGER_REQUEST_MAX_MS ? LEDGER_REQUEST_MAX_MS : left > 0 ? (long)left : 0;
}

/* The message of a Kubernetes Status body, or the body's start (a static buffer per thread). */
static const char *status_message(const char *body)
{
    static _Thread_local char text[256];
    json_t *st = body ? json_loads(body, 0, NULL) : NULL;
    const char *msg = json_string_value(json_object_get(st, "message"));
    snprintf(text, sizeof(text), "%.200s", msg ? msg : body ? body : "no answer");
    json_decref(st);
    return text;
}

enum gg_status ledger_fetch(struct kc_client *client, const json_t *obj, int64_t deadline_us,
                            json_t **out, long *status, struct gg_err *err)
{
    char path[1024];
    object_path(obj, false, path, sizeof(path));
    struct kc_request rq = {.path = path, .timeout_ms = request_ms(deadline_us)};
    struct kc_response resp = {0};
    struct kc_write get = {.method = "GET"};
    *out = NULL;
    *status = 0;
    if (rq.timeout_ms <= 0)
        return gg_fail(err, GG_ERR_TIMEOUT, "no time left to read GPUQuota");
    enum gg_status st = kc_send(client, &rq, &get, &resp, err);
    *status = st == GG_OK ? resp.status : 0; /* a transfer cut after the headers is no answer */
    if (st == GG_OK && resp.status == 200 && !(*out = json_loads(resp.body, 0, NULL)))
        st = gg_fail(err, GG_ERR_PARSE, "GET %s: not JSON", path);
    else if (st == GG_OK && resp.status != 200)
        st = gg_fail(err, GG_ERR_IO, "GET %s: HTTP %ld: %s", path, resp.status,
                     status_message(resp.body));
    kc_response_clear(&resp);
    return st;
}

enum gg_status ledger_write(struct kc_client *client, const json_t *next, int64_t deadline_us,
                            json_t **written, long *status, struct gg_err *err)
{
    char path[1024];
    object_path(next, true, path, sizeof(path));
    char *body = json_dumps(next, JSON_COMPACT);
    struct kc_request rq = {.path = path, .timeout_ms = request_ms(deadline_us)};
    struct kc_response resp = {0};
    *written = NULL;
    *status = 0;
    if (!body)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    if (rq.timeout_ms <= 0) {
        free(body);
        return gg_fail(err, GG_ERR_TIMEOUT, "no time left to write GPUQuota");
    }
    struct kc_write put = {.method = "PUT", .body = body, .len = strlen(body)};
    enum gg_status st = kc_send(client, &rq, &put, &resp, err);
    free(body);
    *status = st == GG_OK ? resp.status : 0; /* a transfer cut after the headers is no answer */
    if (st == GG_OK && resp.status == 200 && !(*written = json_loads(resp.body, 0, NULL)))
        st = gg_fail(err, GG_ERR_PARSE, "PUT %s: the answer is not JSON", path);
    else if (st == GG_OK && resp.status != 200)
        st = gg_fail(err, resp.status == 409 ? GG_ERR_INVALID : GG_ERR_IO, "PUT %s: HTTP %ld: %s",
                     path, resp.status, status_message(resp.body));
    kc_response_clear(&resp);
    return st;
}

/* The newest copy of ns's GPUQuota this replica knows (lock held): the watch's or its own. */
static json_t *newest(struct ledger *l, const char *ns, size_t *count)
{
    json_t *watched = inv_quota(l->inv, ns, count);
    json_t *own = json_object_get(l->latest, ns);
    if (!watched) {
        json_object_del(l->latest, ns); /* deleted, or several: forget our copy */
        return NULL;
    }
    const char *wname =
        json_string_value(json_object_get(json_object_get(watched, "metadata"), "name"));
    const char *oname =
        json_string_value(json_object_get(json_object_get(own, "metadata"), "name"));
    if (own && wname && oname && strcmp(wname, oname) == 0 && rv_of(own) > rv_of(watched)) {
        json_decref(watched);
        return json_incref(own);
    }
    return watched;
}

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Keep e as what a denial says: the last failure the API server answered (its status says more
 * than a timeout that followed it), else the last one. */
static void note_failure(struct gg_err *said, bool *answered, const struct gg_err *e, long status)
{
    if (status != 0 || !*answered)
        *said = *e;
    *answered = *answered || status != 0;
}

static enum ledger_verdict charge_locked(struct ledger *l, const struct ledger_charge *c, char *why,
                                         size_t size)
{
    size_t count = 0;
    json_t *obj = newest(l, c->ns, &count);
    if (!obj && count > 1) {
        snprintf(why, size, "namespace %s has %zu GPUQuota objects; keep one", c->ns, count);
        return LEDGER_OVER;
    }
    if (!obj)
        return LEDGER_NONE;
    int64_t deadline = c->deadline_us - LEDGER_MARGIN_US;
    struct gg_err err = {{0}}, said = {{0}};
    bool answered = false;
    long backoff = 10;
    enum ledger_verdict verdict = LEDGER_UNAVAILABLE;
    snprintf(said.msg, sizeof(said.msg), "no time left");
    while (obj && gg_now_us() < deadline) {
        struct gq_view v;
        if (gq_has_entry(obj, c->uid)) { /* this review was sent again: charged already */
            verdict = LEDGER_ADMITTED;
            break;
        }
        if (gq_read(obj, &v, &said) != GG_OK)
            break;
        if (!gq_fits(&v, c->charge, c->pool, why, size)) {
            verdict = LEDGER_OVER;
            break;
        }
        if (c->dry_run) {
            verdict = LEDGER_ADMITTED;
            break;
        }
        struct gq_charge gc = {.uid = c->uid,
                               .pod = c->pod,
                               .pool = c->pool,
                               .charge = c->charge,
                               .now_us = gg_wall_us()};
        json_t *next = gq_charged(obj, &gc), *written = NULL;
        if (!next) {
            snprintf(said.msg, sizeof(said.msg),
                     "its ledger holds %zu entries, the most it may: the quota controller has not "
                     "caught up",
                     v.n_entries);
            break;
        }
        long status = 0;
        enum gg_status st = ledger_write(l->client, next, deadline, &written, &status, &err);
        json_decref(next);
        if (st == GG_OK) {
            metrics_ledger_write(c->ns, MET_LEDGER_OK);
            json_object_set_new(l->latest, c->ns, written);
            verdict = LEDGER_ADMITTED;
            break;
        }
        metrics_ledger_write(c->ns, status == 409 ? MET_LEDGER_CONFLICT : MET_LEDGER_ERROR);
        note_failure(&said, &answered, &err, status);
        if (status == 404) { /* deleted under us: the namespace has no GPUQuota any more */
            json_object_del(l->latest, c->ns);
            verdict = LEDGER_NONE;
            break;
        }
        if (status != 409) {
            pause_ms(backoff);
            backoff = backoff * 2 > LEDGER_BACKOFF_MAX_MS ? LEDGER_BACKOFF_MAX_MS : backoff * 2;
        }
        json_t *fresh = NULL;
        enum gg_status got = ledger_fetch(l->client, obj, deadline, &fresh, &status, &err);
        if (got != GG_OK)
            note_failure(&said, &answered, &err, status);
        if (got == GG_OK) {
            json_decref(obj);
            obj = fresh;
            json_object_set(l->latest, c->ns, obj);
        } else if (status == 404) {
            json_object_del(l->latest, c->ns);
            verdict = LEDGER_NONE;
            break;
        }
    }
    if (verdict == LEDGER_UNAVAILABLE) {
        const char *name =
            json_string_value(json_object_get(json_object_get(obj, "metadata"), "name"));
        snprintf(why, size,
                 "the GPU quota ledger (GPUQuota %s/%s) could not be written before the review's "
                 "deadline: %s; the pod is refused until it can be, try again",
                 c->ns, name ? name : "?", said.msg);
    }
    json_decref(obj);
    return verdict;
}

enum ledger_verdict ledger_charge(struct ledger *l, const struct ledger_charge *c, char *why,
                                  size_t size)
{
    *why = '\0';
    /* Most GPU pods are in namespaces without a GPUQuota: they never wait on the ledger's lock,
     * which a write of another namespace may hold for an API server round trip. */
    if (inv_quota_count(l->inv, c->ns) == 0)
        return LEDGER_NONE;
    int64_t t0 = gg_now_us();
    bool in_request = arena_pause(); /* what the ledger keeps (latest) outlives the review */
    pthread_mutex_lock(&l->lock);
    enum ledger_verdict v = charge_locked(l, c, why, size);
    pthread_mutex_unlock(&l->lock);
    arena_resume(in_request);
    if (v != LEDGER_NONE)
        metrics_ledger_seconds((double)(gg_now_us() - t0) / 1e6);
    if (v == LEDGER_OVER || v == LEDGER_UNAVAILABLE)
        metrics_ledger_denial(c->ns, v == LEDGER_OVER ? "over" : "unavailable");
    if (v == LEDGER_UNAVAILABLE)
        log_fields(LOG_WARN, "quota ledger unavailable: pod refused",
                   json_pack("{s:s,s:s,s:s}", "namespace", c->ns, "pod", c->pod ? c->pod : "",
                             "error", why));
    return v;
}
