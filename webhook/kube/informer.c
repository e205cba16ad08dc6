/*
 * informer.c - list + watch of /api/v1/pods into an inventory: watch lines
 * decoded one at a time, lists cut into items as they stream in (each read
 * by infscan.c), and the thread that drives it all with backoff.
 */
#include "kube/informer.h"
#include "util/clock.h"

#include "util/jsonfast.h"
#include "kube/gpuquota.h"
#include "util/log.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- watch events ---------------------------------------------------------- */

static const char *const event_types[] = {"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"};

void inf_event_clear(struct inf_event *ev)
{
    json_decref(ev->obj);
    memset(ev, 0, sizeof(*ev));
}

static enum gg_status event_error(struct inf_event *ev, const char *obj, size_t len)
{
    json_t *status = len ? jf_loadb(obj, len, 64, NULL) : NULL;
    json_t *code = json_object_get(status, "code");
    ev->code = json_is_integer(code) ? (long)json_integer_value(code) : 0;
    const char *msg = json_string_value(json_object_get(status, "message"));
    snprintf(ev->message, sizeof(ev->message), "%s", msg ? msg : "");
    json_decref(status);
    return GG_OK;
}

/*
 * The type of a watch line and the span of its object: GG_OK with *obj set
 * for an event with an object to read (ERROR is read here: *obj stays
 * NULL); else an error.
 */
static enum gg_status event_frame(const char *line, size_t len, struct inf_event *ev,
                                  const char **obj, size_t *obj_len, struct gg_err *err)
{
    memset(ev, 0, sizeof(*ev));
    *obj = NULL;
    struct inf_scan s = {.p = line, .end = line + len};
    const char *at = NULL, *end = NULL;
    char type[16] = "", key[INF_SCAN_KEY_MAX];
    bool first = true;
    int r = -1;
    inf_scan_ws(&s);
    if (s.p < s.end && *s.p == '{' && inf_scan_enter(&s)) {
        while ((r = inf_scan_member(&s, &first, key)) == 1) {
            if (!strcmp(key, "type") && *s.p == '"') {
                json_t *t = inf_scan_string(&s);
                snprintf(type, sizeof(type), "%s", t ? json_string_value(t) : "");
                json_decref(t);
                if (!t)
                    break;
            } else if (!strcmp(key, "object")) {
                at = s.p;
                if (!inf_scan_skip(&s))
                    break;
                end = s.p;
            } else if (!inf_scan_skip(&s)) {
                break;
            }
        }
        inf_scan_ws(&s);
    }
    if (r != 0 || s.p != s.end)
        return gg_fail(err, GG_ERR_PARSE, "not one JSON object: byte %zu: %s", (size_t)(s.p - line),
                       s.why ? s.why : "expected {");
    size_t t = 0;
    while (t < 5 && strcmp(type, event_types[t]) != 0)
        t++;
    if (t == 5)
        return gg_fail(err, GG_ERR_INVALID, "unknown event type \"%s\"", type);
    ev->type = (enum inf_event_type)t;
    if (ev->type == INF_ERROR)
        return event_error(ev, at, at ? (size_t)(end - at) : 0);
    if (!at)
        return gg_fail(err, GG_ERR_INVALID, "%s event without an object", type);
    *obj = at;
    *obj_len = (size_t)(end - at);
    return GG_OK;
}

/* What every event with an object needs: a bookmark its resourceVersion, the others a uid. */
static enum gg_status event_checked(struct inf_event *ev, const char *uid, struct gg_err *err)
{
    if (ev->type == INF_BOOKMARK) {
        json_decref(ev->obj);
        ev->obj = NULL;
        ev->pod = NULL;
        if (!ev->rv[0])
            return gg_fail(err, GG_ERR_INVALID, "BOOKMARK event without a resourceVersion");
    } else if (!uid || !*uid) {
        const char *type = event_types[ev->type];
        inf_event_clear(ev);
        return gg_fail(err, GG_ERR_INVALID, "%s event: the pod has no metadata.uid", type);
    }
    return GG_OK;
}

/* A watch line's object read into pod, or (pod NULL) by read into ev->obj. */
static enum gg_status parse_event(const char *line, size_t len, struct inf_pod *pod,
                                  inf_read_fn read, struct inf_event *ev, struct gg_err *err)
{
    const char *obj;
    size_t obj_len;
    enum gg_status st = event_frame(line, len, ev, &obj, &obj_len, err);
    if (st != GG_OK || !obj)
        return st;
    struct gg_err perr = {{0}};
    if (pod ? !inf_pod_of_text(obj, obj_len, pod, &perr)
            : !(ev->obj = read(obj, obj_len, ev->rv, &perr)))
        return gg_fail(err, GG_ERR_PARSE, "%s event: %s", event_types[ev->type], perr.msg);
    if (!pod)
        return event_checked(
            ev, json_string_value(json_object_get(json_object_get(ev->obj, "metadata"), "uid")),
            err);
    ev->pod = pod;
    snprintf(ev->rv, sizeof(ev->rv), "%s", pod->rv);
    return event_checked(ev, pod->uid, err);
}

enum gg_status inf_parse_event(const char *line, size_t len, struct inf_pod *pod,
                               struct inf_event *ev, struct gg_err *err)
{
    return parse_event(line, len, pod, NULL, ev, err);
}

enum gg_status inf_parse_event_as(const char *line, size_t len, inf_read_fn read,
                                  struct inf_event *ev, struct gg_err *err)
{
    return parse_event(line, len, NULL, read, ev, err);
}

/* ---- lists as a stream ------------------------------------------------------ */

enum member { M_OTHER, M_ITEMS, M_METADATA };

struct inf_list_reader {
    bool (*on_pod)(void *ctx, json_t *pod, const char *why);
    bool (*on_read_pod)(void *ctx, const struct inf_pod *pod, const char *why); /* or this */
    void *ctx;
    inf_read_fn read;   /* NULL: inf_read_pod, in place when an item lies in one chunk */
    struct inf_pod pod; /* each item, read as a pod */
    int depth;
    bool in_string, escape, done;
    bool want_key;       /* depth 1: the next string is a key */
    bool want_value;     /* depth 1: a member's value starts next */
    bool reading_key;    /* in a depth 1 key */
    char key[16];        /* that key (longer keys are not ours) */
    size_t key_len;      /* may exceed the buffer: then not ours */
    enum member member;  /* the depth 1 member being read */
    bool in_items;       /* inside the items array */
    int capture;         /* depth at which the capture ends (0: not capturing) */
    bool capture_meta;   /* the capture is the list metadata, not an item */
    bool capture_direct; /* the capture started in the current chunk, nothing buffered */
    bool discard;        /* the item is too large: skipped */
    struct buf item;
    struct buf meta;
    size_t items, oversized;
};

struct inf_list_reader *inf_list_reader_new(bool (*on_pod)(void *ctx, json_t *pod, const char *why),
                                            void *ctx)
{
    struct inf_list_reader *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->on_pod = on_pod;
    r->ctx = ctx;
    buf_init(&r->item, INF_MAX_LINE);
    buf_init(&r->meta, 1 << 20);
    inf_pod_init(&r->pod);
    return r;
}

void inf_list_reader_read_with(struct inf_list_reader *r, inf_read_fn read)
{
    r->read = read;
}

void inf_list_reader_read_pods(struct inf_list_reader *r,
                               bool (*on_pod)(void *ctx, const struct inf_pod *pod,
                                              const char *why))
{
    r->on_read_pod = on_pod;
}

void inf_list_reader_free(struct inf_list_reader *r)
{
    if (!r)
        return;
    buf_clear(&r->item);
    buf_clear(&r->meta);
    inf_pod_free(&r->pod);
    free(r);
}

/* r->pod, read whole, to the caller: as it is, or as an object; false to stop. */
static bool hand_over(struct inf_list_reader *r, bool read, const char *why)
{
    if (r->on_read_pod)
        return r->on_read_pod(r->ctx, read ? &r->pod : NULL, why);
    json_t *pod = read ? inf_pod_json(&r->pod) : NULL;
    bool go_on = r->on_pod(r->ctx, pod, pod ? NULL : why ? why : "out of memory");
    json_decref(pod);
    return go_on;
}

static void key_chars(struct inf_list_reader *r, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++, r->key_len++)
        if (r->key_len < sizeof(r->key) - 1)
            r->key[r->key_len] = p[i];
}

/* Append data[from, to) to the capture buffer. */
static void capture_span(struct inf_list_reader *r, const char *from, const char *to)
{
    struct buf *b = r->capture_meta ? &r->meta : &r->item;
    if (r->discard || to == from)
        return;
    if (buf_append(b, from, (size_t)(to - from)) != GG_OK) {
        r->discard = true;
        b->len = 0;
    }
}

/* The capture that started at start ends with the byte at end (inclusive). */
static enum gg_status capture_done(struct inf_list_reader *r, const char *start, const char *end,
                                   struct gg_err *err)
{
    r->capture = 0;
    if (r->capture_meta) {
        capture_span(r, start, end + 1);
        if (r->discard)
            return gg_fail(err, GG_ERR_TOOBIG, "the list's metadata is over 1 MiB");
        return GG_OK;
    }
    const char *text = start;
    size_t len = (size_t)(end + 1 - start);
    if (!r->capture_direct) {
        capture_span(r, start, end + 1);
        text = r->item.data;
        len = r->item.len;
    }
    bool keep_going = true;
    if (r->discard || len > INF_MAX_LINE) {
        r->oversized++;
    } else {
        struct gg_err perr = {{0}};
        r->items++;
        if (r->read) {
            json_t *obj = r->read(text, len, NULL, &perr);
            keep_going = r->on_pod(r->ctx, obj, obj ? NULL : perr.msg);
            json_decref(obj);
        } else {
            bool read = inf_pod_of_text(text, len, &r->pod, &perr);
            keep_going = hand_over(r, read, read ? NULL : perr.msg);
        }
    }
    r->item.len = 0;
    r->discard = false;
    if (!keep_going)
        return gg_fail(err, GG_ERR_INVALID, "stopped at item %zu", r->items);
    return GG_OK;
}

/*
 * An item that starts at p and ends in this chunk is read in place, in one
 * pass: true when it was (*next is past it).  Otherwise (it goes on in the
 * next chunk, or it is malformed) the caller captures it, finds its end,
 * then reads the copy.
 */
static bool item_in_place(struct inf_list_reader *r, const char *p, const char *end,
                          const char **next, enum gg_status *st, struct gg_err *err)
{
    struct inf_scan s = {.p = p, .end = end};
    if (!inf_scan_pod(&s, &r->pod))
        return false;
    *next = s.p;
    if ((size_t)(s.p - p) > INF_MAX_LINE) {
        r->oversized++;
    } else {
        r->items++;
        if (!hand_over(r, true, NULL))
            *st = gg_fail(err, GG_ERR_INVALID, "stopped at item %zu", r->items);
    }
    return true;
}

/* A depth 1 member's value starts with ch; true when it is to be captured. */
static enum gg_status value_starts(struct inf_list_reader *r, char ch, bool *capture,
                                   struct gg_err *err)
{
    r->want_value = false;
    bool named = r->key_len < sizeof(r->key);
    r->member = M_OTHER;
    *capture = false;
    if (named && strcmp(r->key, "items") == 0) {
        r->member = M_ITEMS;
        if (ch != '[' && ch != 'n')
            return gg_fail(err, GG_ERR_PARSE, "items is not an array");
        r->in_items = ch == '[';
    } else if (named && strcmp(r->key, "metadata") == 0 && ch == '{') {
        r->member = M_METADATA;
        r->capture = 1; /* ends when the depth is back to 1 */
        r->capture_meta = true;
        r->capture_direct = false;
        r->meta.len = 0;
        *capture = true;
    }
    return GG_OK;
}

enum gg_status inf_list_feed(struct inf_list_reader *r, const char *data, size_t len,
                             struct gg_err *err)
{
    const char *p = data, *end = data + len;
    const char *cap_start = r->capture ? data : NULL;
    if (r->capture)
        r->capture_direct = false;
    enum gg_status st = GG_OK;
    while (p < end) {
        if (r->in_string) {
            const char *q = p;
            if (r->escape) {
                r->escape = false;
                q++;
            }
            while (q < end && *q != '"' && *q != '\\')
                q++;
            if (r->reading_key)
                key_chars(r, p, (size_t)(q - p));
            if (q >= end)
                break;
            if (*q == '\\') {
                if (r->reading_key)
                    key_chars(r, q, 1);
                r->escape = true;
                p = q + 1;
                continue;
            }
            r->in_string = false;
            if (r->reading_key) {
                r->reading_key = false;
                r->key[r->key_len < sizeof(r->key) ? r->key_len : sizeof(r->key) - 1] = '\0';
            }
            p = q + 1;
            continue;
        }
        char ch = *p;
        if (ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t' || ch == ':') {
            p++;
            continue;
        }
        if (r->done)
            return gg_fail(err, GG_ERR_PARSE, "data after the list");
        if (r->depth == 0 && ch != '{')
            return gg_fail(err, GG_ERR_PARSE, "the response is not a JSON object");
        if (r->depth == 1 && ch == ',') {
            r->want_key = true;
            p++;
            continue;
        }
        if (r->depth == 1 && r->want_key && ch == '"') {
            r->want_key = false;
            r->want_value = true;
            r->reading_key = true;
            r->in_string = true;
            r->key_len = 0;
            p++;
            continue;
        }
        if (r->depth == 1 && r->want_value && ch != '}') {
            bool capture;
            if ((st = value_starts(r, ch, &capture, err)) != GG_OK)
                return st;
            if (capture)
                cap_start = p;
        }
        if (r->in_items && r->depth == 2 && !r->capture) {
            if (ch == ',') {
                p++;
                continue;
            }
            if (ch != '{' && ch != ']')
                return gg_fail(err, GG_ERR_PARSE, "items[%zu] is not an object",
                               r->items + r->oversized);
            const char *next;
            if (ch == '{' && !r->read && item_in_place(r, p, end, &next, &st, err)) {
                if (st != GG_OK)
                    return st;
                p = next;
                continue;
            }
            if (ch == '{') {
                r->capture = 2; /* ends when the depth is back to 2 */
                r->capture_meta = false;
                r->capture_direct = true;
                cap_start = p;
            }
        }
        if (ch == '"') {
            r->in_string = true;
        } else if (ch == '{' || ch == '[') {
            if (++r->depth > INF_SCAN_MAX_DEPTH)
                return gg_fail(err, GG_ERR_PARSE, "nested too deeply");
            if (r->depth == 1)
                r->want_key = true;
        } else if (ch == '}' || ch == ']') {
            if (r->depth == 0)
                return gg_fail(err, GG_ERR_PARSE, "unbalanced %c", ch);
            r->depth--;
            if (r->capture && r->depth == r->capture) {
                if ((st = capture_done(r, cap_start, p, err)) != GG_OK)
                    return st;
                cap_start = NULL;
            }
            if (r->depth == 1 && ch == ']' && r->in_items)
                r->in_items = false;
            if (r->depth == 0)
                r->done = true;
        }
        p++;
    }
    if (r->capture && cap_start) {
        capture_span(r, cap_start, end);
        r->capture_direct = false;
    }
    return GG_OK;
}

enum gg_status inf_list_finish(struct inf_list_reader *r, struct inf_list_meta *meta,
                               struct gg_err *err)
{
    memset(meta, 0, sizeof(*meta));
    if (!r->done)
        return gg_fail(err, GG_ERR_PARSE, "the list ended early (after %zu items)", r->items);
    meta->items = r->items;
    meta->oversized = r->oversized;
    if (!r->meta.len)
        return GG_OK;
    struct jf_error jerr;
    json_t *m = jf_loadb(r->meta.data, r->meta.len, 32, &jerr);
    if (!m)
        return gg_fail(err, GG_ERR_PARSE, "the list's metadata: %s", jerr.text);
    const char *rv = json_string_value(json_object_get(m, "resourceVersion"));
    const char *cont = json_string_value(json_object_get(m, "continue"));
    enum gg_status st = GG_OK;
    if (rv && strlen(rv) >= INF_RV_MAX)
        st = gg_fail(err, GG_ERR_PARSE, "the list's resourceVersion is too long");
    else if (rv)
        strcpy(meta->resource_version, rv);
    if (st == GG_OK && cont && *cont && !(meta->continue_token = strdup(cont)))
        st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
    json_decref(m);
    return st;
}

/* ---- the informer thread ---------------------------------------------------- */

/* Process-wide counters: one informer per process. */
static atomic_uint_fast64_t watch_restarts, relists, malformed;
static atomic_int_fast64_t last_sync_ms; /* wall clock; 0 before the first sync */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct inventory *registered;

struct informer {
    struct kc_client *kc;
    struct inventory *inv;
    struct inf_options o;
    atomic_uint version;        /* DRA: the index in dra_versions being used */
    uint64_t listed_generation; /* o.generation's answer when the last list started */
    pthread_mutex_t fetch_lock; /* o.fetch_client belongs to one thread at a time */
    pthread_t thread;
    atomic_bool stop;
    pthread_mutex_t lock; /* cond, last_error */
    pthread_cond_t cond;
    char last_error[200];
    char rv[INF_RV_MAX];
    uint64_t rng;
};

enum outcome {
    DONE,         /* a list completed, or a watch ended as the server meant it to */
    GONE,         /* 410: the resourceVersion is too old, relist */
    UNAUTHORIZED, /* 401: read the token again, then retry */
    NOT_SERVED,   /* 404 on a list: the API server has no such resource (that version) */
    FAILED,       /* anything else: back off and retry */
    STOPPED,
};

/* What each kind of informer follows. */
static const struct {
    const char *name;   /* for messages */
    const char *kind;   /* the objects' kind (list items carry none); NULL for trimmed pods */
    const char *plural; /* in the API path */
} resources[] = {
    [INF_PODS] = {"pods", NULL, "pods"},
    [INF_CLAIMS] = {"ResourceClaims", "ResourceClaim", "resourceclaims"},
    [INF_TEMPLATES] = {"ResourceClaimTemplates", "ResourceClaimTemplate", "resourceclaimtemplates"},
    [INF_CLASSES] = {"DeviceClasses", "DeviceClass", "deviceclasses"},
    [INF_SLICES] = {"ResourceSlices", "ResourceSlice", "resourceslices"},
    [INF_QUOTAS] = {"GPUQuotas", "GPUQuota", GQ_PLURAL},
};
/* resource.k8s.io versions, newest first: v1 since Kubernetes 1.34, v1beta2 1.33, v1beta1 1.32. */
static const char *const dra_versions[] = {"v1", "v1beta2", "v1beta1"};
#define N_DRA_VERSIONS (sizeof(dra_versions) / sizeof(dra_versions[0]))

/* The objects' group/version: "resource.k8s.io/v1", "v1" for pods. */
static void api_version(struct informer *f, char *out, size_t size)
{
    if (f->o.kind == INF_PODS)
        snprintf(out, size, "v1");
    else if (f->o.kind == INF_QUOTAS)
        snprintf(out, size, "%s/%s", GQ_GROUP, GQ_VERSION);
    else
        snprintf(out, size, "resource.k8s.io/%s", dra_versions[atomic_load(&f->version)]);
}

/* The collection's path without a query. */
static void base_path(struct informer *f, char *out, size_t size)
{
    char api[64];
    api_version(f, api, sizeof(api));
    snprintf(out, size, "/api%s/%s/%s", f->o.kind == INF_PODS ? "" : "s", api,
             resources[f->o.kind].plural);
}

/* A DRA object as the inventory reads it: list items come without their kind. */
static void set_kind(struct informer *f, json_t *obj)
{
    if (obj && f->o.kind != INF_PODS && !json_object_get(obj, "kind")) {
        char api[64];
        api_version(f, api, sizeof(api));
        json_object_set_new(obj, "kind", json_string(resources[f->o.kind].kind));
        json_object_set_new(obj, "apiVersion", json_string(api));
    }
}

static void mark_synced(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    atomic_store(&last_sync_ms, (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

static void set_error(struct informer *f, const char *msg)
{
    pthread_mutex_lock(&f->lock);
    snprintf(f->last_error, sizeof(f->last_error), "%.199s", msg ? msg : "");
    pthread_mutex_unlock(&f->lock);
}

static uint64_t next_random(struct informer *f)
{
    f->rng ^= f->rng << 13; /* xorshift64 */
    f->rng ^= f->rng >> 7;
    f->rng ^= f->rng << 17;
    return f->rng;
}

/* Sleep up to ms unless stopped; false when stopped. */
static bool pause_ms(struct informer *f, int64_t ms)
{
    return kc_pause_ms(&f->lock, &f->cond, &f->stop, ms);
}

/* Capped exponential backoff with jitter: between half and all of min(max, initial x 2^n). */
static bool back_off(struct informer *f, unsigned *failures)
{
    int64_t delay = f->o.backoff_initial_ms;
    for (unsigned i = 0; i < *failures && delay < f->o.backoff_max_ms; i++)
        delay *= 2;
    if (delay > f->o.backoff_max_ms)
        delay = f->o.backoff_max_ms;
    (*failures)++;
    delay = delay / 2 + (int64_t)(next_random(f) % (uint64_t)(delay / 2 + 1));
    return pause_ms(f, delay);
}

/* The message of a Status body, else the HTTP status. */
static void status_message(const struct kc_response *resp, char *out, size_t size)
{
    json_t *status = resp->body ? json_loads(resp->body, 0, NULL) : NULL;
    const char *msg = json_string_value(json_object_get(status, "message"));
    if (resp->status == 403)
        snprintf(out, size, "HTTP 403: %s (the service account needs list and watch on pods)",
                 msg ? msg : "forbidden");
    else
        snprintf(out, size, "HTTP %ld%s%s", resp->status, msg ? ": " : "", msg ? msg : "");
    json_decref(status);
}

static enum outcome http_outcome(struct informer *f, const struct kc_response *resp,
                                 const char *what)
{
    char msg[220];
    status_message(resp, msg, sizeof(msg));
    set_error(f, msg);
    log_fields(LOG_WARN, what, json_pack("{s:i,s:s}", "status", (int)resp->status, "error", msg));
    if (resp->status == 410)
        return GONE;
    if (resp->status == 401) {
        kc_token_invalidate(f->kc);
        return UNAUTHORIZED;
    }
    return FAILED;
}

/* -- list -- */

struct list_ctx {
    struct informer *f;
    struct inv_stage *stage; /* pods */
    uint64_t relist;         /* claims and templates */
    struct inf_list_reader *reader;
    struct gg_err feed_err;
    bool feed_failed;
    size_t malformed;
    size_t pods;
};

/* Counts an item of the list (read: it was, else why not, logged once); false past
 * INF_MAX_LIST_PODS. */
static bool list_item(struct list_ctx *lc, bool read, const char *why)
{
    if (++lc->pods > INF_MAX_LIST_PODS)
        return false;
    if (!read) {
        atomic_fetch_add(&malformed, 1);
        if (lc->malformed++ == 0)
            log_fields(LOG_WARN, "inventory: malformed pod in the list skipped",
                       json_pack("{s:s}", "error", why));
    }
    return true;
}

static bool on_list_pod(void *ctx, const struct inf_pod *pod, const char *why)
{
    struct list_ctx *lc = ctx;
    if (!list_item(lc, pod != NULL, why))
        return false;
    if (pod)
        inv_stage_add_pod(lc->stage, pod);
    return true;
}

static bool on_list_object(void *ctx, json_t *obj, const char *why)
{
    struct list_ctx *lc = ctx;
    if (!list_item(lc, obj != NULL, why))
        return false;
    if (obj) {
        set_kind(lc->f, obj);
        inv_dra_add(lc->f->inv, obj, lc->relist);
    }
    return true;
}

static bool on_list_body(void *ctx, const char *data, size_t len)
{
    struct list_ctx *lc = ctx;
    if (inf_list_feed(lc->reader, data, len, &lc->feed_err) != GG_OK) {
        lc->feed_failed = true;
        return false;
    }
    return true;
}

static char *list_path(struct informer *f, const char *cont)
{
    char base[128];
    base_path(f, base, sizeof(base));
    size_t n = 64 + sizeof(base) + (cont ? strlen(cont) * 3 : 0);
    char *path = malloc(n);
    if (!path)
        return NULL;
    int k = snprintf(path, n, "%s?limit=%u", base, f->o.page_size);
    if (cont) {
        memcpy(path + k, "&continue=", 11);
        kc_query_escape(cont, path + k + 10, n - (size_t)k - 10);
    }
    return path;
}

/* One page; *cont gets the next page's token (NULL on the last). */
static enum outcome list_page(struct informer *f, struct list_ctx *lc, char **cont, char *rv)
{
    char *path = list_path(f, *cont);
    free(*cont);
    *cont = NULL;
    lc->reader = inf_list_reader_new(on_list_object, lc);
    if (lc->reader && f->o.kind != INF_PODS)
        inf_list_reader_read_with(lc->reader, inf_read_object);
    else if (lc->reader)
        inf_list_reader_read_pods(lc->reader, on_list_pod);
    lc->feed_failed = false;
    if (!path || !lc->reader) {
        free(path);
        inf_list_reader_free(lc->reader);
        set_error(f, "out of memory");
        return FAILED;
    }
    struct kc_request rq = {
        .path = path, .stall_s = 60, .on_body = on_list_body, .ctx = lc, .cancel = &f->stop};
    struct kc_response resp;
    struct gg_err err = {{0}};
    enum gg_status st = kc_get(f->kc, &rq, &resp, &err);
    enum outcome out = FAILED;
    struct inf_list_meta meta;
    if (resp.cancelled) {
        out = STOPPED;
    } else if (st != GG_OK && lc->feed_failed) {
        snprintf(err.msg, sizeof(err.msg), "the %s list: %.200s", resources[f->o.kind].name,
                 lc->feed_err.msg);
    } else if (st == GG_OK && resp.status == 404 && f->o.kind != INF_PODS) {
        out = NOT_SERVED;
    } else if (st == GG_OK && resp.status != 200) {
        out = http_outcome(f, &resp, "inventory: list refused");
    } else if (st == GG_OK && inf_list_finish(lc->reader, &meta, &err) == GG_OK) {
        out = DONE;
        *cont = meta.continue_token;
        snprintf(rv, INF_RV_MAX, "%s", meta.resource_version);
    }
    if (out == FAILED && (st != GG_OK || resp.status == 200)) {
        set_error(f, err.msg);
        log_fields(LOG_WARN, "inventory: list failed", json_pack("{s:s}", "error", err.msg));
    }
    kc_response_clear(&resp);
    inf_list_reader_free(lc->reader);
    lc->reader = NULL;
    free(path);
    return out;
}

/* Claims and templates: the next version of resource.k8s.io after a 404, up to none.  GPUQuotas:
 * none (their CRD is not installed; retried with the backoff). */
static enum outcome next_version(struct informer *f)
{
    if (f->o.kind == INF_QUOTAS) {
        char msg[200];
        snprintf(
            msg, sizeof(msg),
            "the API server serves no %s.%s/%s: GPUQuota limits are off "
            "until its CustomResourceDefinition is installed (charts/gpuguard/crds/gpuquota.yaml)",
            GQ_PLURAL, GQ_GROUP, GQ_VERSION);
        set_error(f, msg);
        log_fields(LOG_INFO, "inventory: no GPUQuota API", json_pack("{s:s}", "message", msg));
        return FAILED;
    }
    unsigned v = atomic_load(&f->version) + 1;
    if (v < N_DRA_VERSIONS) {
        atomic_store(&f->version, v);
        return GONE; /* list again at once, with that version */
    }
    atomic_store(&f->version, 0);
    char msg[200];
    snprintf(msg, sizeof(msg), "the API server serves no resource.k8s.io %s (v1, v1beta2, v1beta1)",
             resources[f->o.kind].name);
    set_error(f, msg);
    log_fields(LOG_INFO, "inventory: no DRA API", json_pack("{s:s}", "message", msg));
    return FAILED;
}

static enum outcome list_all(struct informer *f)
{
    int64_t t0 = (gg_now_us() / 1000);
    bool pods = f->o.kind == INF_PODS;
    struct list_ctx lc = {.f = f};
    if (pods && !(lc.stage = inv_stage_new(f->inv)))
        return FAILED;
    if (f->o.generation)
        f->listed_generation = f->o.generation(f->o.generation_ctx);
    if (!pods)
        lc.relist = inv_dra_relist_begin(f->inv);
    char *cont = NULL, rv[INF_RV_MAX] = "";
    unsigned pages = 0;
    enum outcome out;
    do {
        out = list_page(f, &lc, &cont, rv);
        pages++;
    } while (out == DONE && cont);
    free(cont);
    if (out != DONE) {
        inv_stage_free(lc.stage);
        return out == NOT_SERVED ? next_version(f) : out;
    }
    size_t gpu_pods = 0;
    if (pods) {
        gpu_pods = inv_stage_pods(lc.stage);
        inv_stage_commit(f->inv, lc.stage);
        inv_set_ready(f->inv, true);
        atomic_fetch_add(&relists, 1);
        mark_synced();
    } else {
        inv_dra_relist_end(f->inv, resources[f->o.kind].kind, lc.relist);
    }
#ifndef GG_ASAN
    /* Give the list's transient memory back.  Not under ASan: its allocator holds the
     * memory, and glibc's arena bookkeeping raced with exiting threads there. */
    malloc_trim(0);
#endif
    snprintf(f->rv, sizeof(f->rv), "%s", rv);
    set_error(f, NULL);
    char what[64];
    snprintf(what, sizeof(what), "inventory: %s listed", resources[f->o.kind].name);
    char api[64];
    api_version(f, api, sizeof(api));
    log_fields(LOG_INFO, what,
               json_pack("{s:I,s:I,s:i,s:s,s:s,s:f}", "items", (json_int_t)lc.pods, "gpu_pods",
                         (json_int_t)gpu_pods, "pages", (int)pages, "resource_version", rv,
                         "api_version", api, "seconds", ((gg_now_us() / 1000) - t0) / 1000.0));
    return DONE;
}

/* -- watch -- */

struct watch_ctx {
    struct informer *f;
    struct inf_pod pod; /* each pod event read into it, its buffers kept */
    struct buf line;
    bool skipping; /* the rest of an over-long line */
    size_t events, malformed;
    enum outcome stop_with; /* DONE: go on */
    char error[200];
};

static void handle_line(struct watch_ctx *w, const char *text, size_t len)
{
    while (len && (text[len - 1] == '\r' || text[len - 1] == ' '))
        len--;
    if (!len)
        return;
    struct inf_event ev;
    struct gg_err err = {{0}};
    bool pods = w->f->o.kind == INF_PODS;
    if ((pods ? inf_parse_event(text, len, &w->pod, &ev, &err)
              : inf_parse_event_as(text, len, inf_read_object, &ev, &err)) != GG_OK) {
        atomic_fetch_add(&malformed, 1);
        if (w->malformed++ == 0)
            log_fields(LOG_WARN, "inventory: malformed watch event skipped",
                       json_pack("{s:s,s:s%}", "error", err.msg, "line", text,
                                 len < 120 ? len : (size_t)120));
        return;
    }
    struct informer *f = w->f;
    switch (ev.type) {
    case INF_ADDED:
    case INF_MODIFIED:
        if (pods) {
            inv_upsert_pod(f->inv, ev.pod);
        } else {
            set_kind(f, ev.obj);
            inv_upsert(f->inv, ev.obj);
        }
        break;
    case INF_DELETED:
        if (pods) {
            inv_delete_pod(f->inv, ev.pod->uid);
        } else {
            set_kind(f, ev.obj);
            inv_delete(f->inv, ev.obj);
        }
        break;
    case INF_BOOKMARK:
        break;
    case INF_ERROR:
        w->stop_with = ev.code == 410 ? GONE : FAILED;
        snprintf(w->error, sizeof(w->error), "watch ERROR event %ld: %s", ev.code, ev.message);
        break;
    }
    if (ev.type != INF_ERROR) {
        w->events++;
        if (ev.rv[0])
            memcpy(f->rv, ev.rv, sizeof(f->rv));
        if (f->o.kind == INF_PODS)
            mark_synced();
    }
    inf_event_clear(&ev);
}

/* Whether the charges listed still hold: a new configuration (or DeviceClass) ends the watch
 * within about a second, data or not, and every object is listed and charged again. */
static bool watch_current(void *ctx)
{
    struct watch_ctx *w = ctx;
    struct informer *f = w->f;
    if (f->o.generation && f->o.generation(f->o.generation_ctx) != f->listed_generation) {
        w->stop_with = GONE;
        snprintf(w->error, sizeof(w->error), "the configuration changed: charging every pod again");
        return false;
    }
    return true;
}

static bool on_watch_body(void *ctx, const char *data, size_t len)
{
    struct watch_ctx *w = ctx;
    if (!watch_current(w))
        return false;
    while (len && w->stop_with == DONE) {
        const char *nl = memchr(data, '\n', len);
        size_t n = nl ? (size_t)(nl - data) : len;
        if (w->skipping) {
            w->skipping = !nl;
        } else if (!w->line.len && nl) {
            handle_line(w, data, n); /* a whole line in the chunk: no copy */
        } else if (buf_append(&w->line, data, n) != GG_OK) {
            atomic_fetch_add(&malformed, 1);
            log_fields(LOG_WARN, "inventory: watch event over the size limit skipped",
                       json_pack("{s:I}", "limit", (json_int_t)INF_MAX_LINE));
            w->line.len = 0;
            w->skipping = !nl;
        } else if (nl) {
            handle_line(w, w->line.data, w->line.len);
            w->line.len = 0;
        }
        if (!nl)
            break;
        data = nl + 1;
        len -= n + 1;
    }
    return w->stop_with == DONE;
}

static enum outcome watch(struct informer *f, size_t *events)
{
    char path[320], base[128];
    unsigned timeout =
        f->o.watch_timeout_s ? f->o.watch_timeout_s : 300 + (unsigned)(next_random(f) % 300);
    base_path(f, base, sizeof(base));
    snprintf(path, sizeof(path),
             "%s?watch=1&allowWatchBookmarks=true&resourceVersion=%s&timeoutSeconds=%u", base,
             f->rv, timeout);
    struct watch_ctx w = {.f = f, .stop_with = DONE};
    inf_pod_init(&w.pod);
    buf_init(&w.line, INF_MAX_LINE);
    struct kc_request rq = {.path = path,
                            .timeout_s = (long)timeout + 60,
                            .on_body = on_watch_body,
                            .keep_going = watch_current,
                            .ctx = &w,
                            .cancel = &f->stop};
    struct kc_response resp;
    struct gg_err err = {{0}};
    enum gg_status st = kc_get(f->kc, &rq, &resp, &err);
    enum outcome out = DONE;
    *events = w.events;
    if (resp.cancelled) {
        out = STOPPED;
    } else if (w.stop_with != DONE) {
        out = w.stop_with;
        set_error(f, w.error);
        log_fields(out == GONE ? LOG_INFO : LOG_WARN,
                   out == GONE ? "inventory: resourceVersion expired, relisting"
                               : "inventory: watch ended by an ERROR event",
                   json_pack("{s:s}", "error", w.error));
    } else if (st != GG_OK) {
        out = FAILED;
        set_error(f, err.msg);
        log_fields(LOG_WARN, "inventory: watch connection lost",
                   json_pack("{s:s,s:I,s:b}", "error", err.msg, "events", (json_int_t)w.events,
                             "mid_event", w.line.len > 0));
    } else if (resp.status != 200) {
        out = http_outcome(f, &resp, "inventory: watch refused");
    }
    kc_response_clear(&resp);
    buf_clear(&w.line);
    inf_pod_free(&w.pod);
    return out;
}

static void *run(void *arg)
{
    struct informer *f = arg;
    unsigned failures = 0, gone = 0; /* in a row, for the backoff */
    bool need_list = true;
    while (!atomic_load(&f->stop)) {
        if (need_list) {
            enum outcome o = list_all(f);
            if (o == STOPPED)
                break;
            if (o == GONE) /* an older resource.k8s.io version to try */
                continue;
            if (o != DONE) {
                if (!back_off(f, &failures))
                    break;
                continue;
            }
            need_list = false;
            failures = 0;
        }
        int64_t started = (gg_now_us() / 1000);
        size_t events = 0;
        enum outcome o = watch(f, &events);
        if (o == STOPPED)
            break;
        if (f->o.kind == INF_PODS)
            atomic_fetch_add(&watch_restarts, 1);
        bool healthy = events > 0 || (gg_now_us() / 1000) - started >= 1000;
        if (healthy)
            failures = gone = 0;
        if (o == GONE) {
            /* Relist at once the first time; a server that keeps answering 410 right
             * after a list gets relists spaced by the backoff, not a stream of them. */
            need_list = true;
            unsigned step = gone > 0 ? gone - 1 : 0;
            if (gone++ > 0 && !back_off(f, &step))
                break;
            continue;
        }
        if (o == DONE && healthy)
            continue;
        if (!back_off(f, &failures))
            break;
    }
    return NULL;
}

/* -- the GET of a template the watch has not shown yet -- */

#define FETCH_TIMEOUT_MS 3000 /* well inside the API server's webhook timeout (10 s by default) */
#define FETCH_MIN_MS 10       /* less left before the review's deadline: not worth asking */

static bool on_fetch_body(void *ctx, const char *data, size_t len)
{
    return buf_append(ctx, data, len) == GG_OK;
}

/* A DNS subdomain, as namespaces and object names are: nothing to escape in a path. */
static bool is_name(const char *s)
{
    size_t n = strlen(s);
    return n && n <= 253 && strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789-.") == n;
}

/* Milliseconds the GET may take: FETCH_TIMEOUT_MS, or what is left before deadline_us. */
static long fetch_budget_ms(int64_t deadline_us)
{
    int64_t left = deadline_us ? (deadline_us - gg_now_us()) / 1000 : FETCH_TIMEOUT_MS;
    return left < FETCH_TIMEOUT_MS ? (long)(left > 0 ? left : 0) : FETCH_TIMEOUT_MS;
}

/*
 * The GET runs on a policy's thread, inside a review: it must end by the
 * review's deadline, waiting for the client included (another review's GET
 * may hold it), or the review would outlive its ?timeout=.
 */
static json_t *fetch(void *ctx, const char *kind, const char *ns, const char *name,
                     int64_t deadline_us, struct gg_err *err)
{
    struct informer *f = ctx;
    if (strcmp(kind, "ResourceClaimTemplate") != 0 || !is_name(ns) || !is_name(name))
        return NULL; /* no such object can exist */
    char path[700];
    snprintf(path, sizeof(path), "/apis/resource.k8s.io/%s/namespaces/%s/resourceclaimtemplates/%s",
             dra_versions[atomic_load(&f->version)], ns, name);
    struct kc_response resp = {0};
    struct gg_err why = {{0}};
    enum gg_status st = GG_ERR_TIMEOUT;
    long budget_ms = fetch_budget_ms(deadline_us);
    struct timespec until = gg_timespec_in_ms(budget_ms);
    struct buf body;
    buf_init(&body, INF_MAX_LINE);
    if (budget_ms >= FETCH_MIN_MS &&
        pthread_mutex_clocklock(&f->fetch_lock, CLOCK_MONOTONIC, &until) == 0) {
        struct kc_request rq = {.path = path,
                                .timeout_ms = fetch_budget_ms(deadline_us),
                                .on_body = on_fetch_body,
                                .ctx = &body,
                                .cancel = &f->stop};
        if (rq.timeout_ms >= FETCH_MIN_MS) {
            st = kc_get(f->o.fetch_client, &rq, &resp, &why);
            if (st == GG_OK && resp.status == 401)
                kc_token_invalidate(f->o.fetch_client);
        }
        pthread_mutex_unlock(&f->fetch_lock);
    }
    if (st == GG_ERR_TIMEOUT && deadline_us && gg_now_us() + FETCH_MIN_MS * 1000 >= deadline_us)
        gg_fail(err, st, "the API server did not answer before the review's deadline");
    else if (st != GG_OK && !why.msg[0]) /* the client stayed busy with another review's GET */
        gg_fail(err, st, "no answer from the API server within %d ms", FETCH_TIMEOUT_MS);
    else if (st != GG_OK)
        gg_fail(err, st, "%s", why.msg);
    json_t *obj = NULL;
    if (st == GG_OK && resp.status == 200) {
        obj = inf_read_object(body.data, body.len, NULL, err);
        set_kind(f, obj);
    } else if (st == GG_OK && resp.status != 404) {
        gg_fail(err, GG_ERR_IO, "the API server answered %ld", resp.status);
    }
    log_fields(obj ? LOG_INFO : LOG_WARN, "inventory: ResourceClaimTemplate fetched",
               json_pack("{s:s,s:s,s:i,s:s}", "namespace", ns, "name", name, "status",
                         (int)resp.status, "error", err->msg));
    kc_response_clear(&resp);
    buf_clear(&body);
    return obj;
}

/* The pods' informer is the one /metrics and inf_describe report. */
static void set_registered(struct informer *f, struct inventory *inv)
{
    if (f->o.kind != INF_PODS)
        return;
    pthread_mutex_lock(&registry_lock);
    registered = inv;
    pthread_mutex_unlock(&registry_lock);
}

static void informer_free(struct informer *f)
{
    if (f->o.fetch_client)
        inv_set_fetcher(f->inv, NULL, NULL);
    set_registered(f, NULL);
    pthread_cond_destroy(&f->cond);
    pthread_mutex_destroy(&f->lock);
    pthread_mutex_destroy(&f->fetch_lock);
    kc_free(f->kc);
    kc_free(f->o.fetch_client);
    free(f);
}

enum gg_status inf_start(struct kc_client *client, struct inventory *inv,
                         const struct inf_options *opts, struct informer **out, struct gg_err *err)
{
    struct informer *f = calloc(1, sizeof(*f));
    if (!f) {
        kc_free(client);
        if (opts)
            kc_free(opts->fetch_client);
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    f->kc = client;
    f->inv = inv;
    if (opts)
        f->o = *opts;
    if (f->o.kind != INF_TEMPLATES && f->o.fetch_client) {
        kc_free(f->o.fetch_client); /* only templates are fetched */
        f->o.fetch_client = NULL;
    }
    if (!f->o.page_size)
        f->o.page_size = 500;
    if (!f->o.backoff_initial_ms)
        f->o.backoff_initial_ms = 500;
    if (!f->o.backoff_max_ms)
        f->o.backoff_max_ms = 30000;
    f->rng = (uint64_t)(gg_now_us() / 1000) * 2654435761u ^ (uint64_t)getpid() << 32 ^ (uintptr_t)f;
    if (!f->rng)
        f->rng = 88172645463325252ULL;
    kc_cond_init(&f->cond);
    pthread_mutex_init(&f->lock, NULL);
    pthread_mutex_init(&f->fetch_lock, NULL);
    set_registered(f, inv);
    if (f->o.fetch_client)
        inv_set_fetcher(inv, fetch, f);
    if (pthread_create(&f->thread, NULL, run, f) != 0) {
        informer_free(f);
        return gg_fail(err, GG_ERR_NOMEM, "cannot start the inventory thread");
    }
    char what[64];
    snprintf(what, sizeof(what), "inventory: syncing %s", resources[f->o.kind].name);
    log_fields(LOG_INFO, what,
               json_pack("{s:s,s:s}", "server", kc_server(client), "auth", kc_auth_kind(client)));
    *out = f;
    return GG_OK;
}

void inf_stop(struct informer *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->lock);
    atomic_store(&f->stop, true);
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
    pthread_join(f->thread, NULL);
    informer_free(f);
}

void inf_describe(struct informer *f, char *out, size_t size)
{
    if (inv_ready(f->inv)) {
        snprintf(out, size, "ready (%zu pods)", inv_pod_count(f->inv));
        return;
    }
    pthread_mutex_lock(&f->lock);
    if (f->last_error[0])
        snprintf(out, size, "syncing (last error: %s)", f->last_error);
    else
        snprintf(out, size, "syncing");
    pthread_mutex_unlock(&f->lock);
}

/* A label value escaped for the text format: backslash, quote, newline. */
static enum gg_status append_label(struct buf *out, const char *v)
{
    enum gg_status st = GG_OK;
    for (; *v && st == GG_OK; v++) {
        if (*v == '\\' || *v == '"')
            st = buf_appendf(out, "\\%c", *v);
        else if (*v == '\n')
            st = buf_append(out, "\\n", 2);
        else
            st = buf_append(out, v, 1);
    }
    return st;
}

static enum gg_status render_usage(struct buf *out, struct inventory *inv)
{
    struct inv_ns_usage *list = NULL;
    size_t n = inv_usage_by_namespace(inv, &list);
    enum gg_status st = buf_appendf(
        out, "# HELP gpuguard_inventory_usage_gpus GPUs (GPU-equivalents) held by the pods of a "
             "namespace, as the watch shows them.\n"
             "# TYPE gpuguard_inventory_usage_gpus gauge\n");
    for (size_t i = 0; i < n && st == GG_OK; i++) {
        st = buf_appendf(out, "gpuguard_inventory_usage_gpus{namespace=\"");
        if (st == GG_OK)
            st = append_label(out, list[i].ns);
        if (st == GG_OK)
            st = buf_appendf(out, "\"} %lld.%03lld\n", (long long)(list[i].milli / 1000),
                             (long long)(list[i].milli % 1000));
    }
    free(list);
    return st;
}

enum gg_status inf_render_metrics(struct buf *out)
{
    pthread_mutex_lock(&registry_lock);
    struct inventory *inv = registered;
    enum gg_status st = GG_OK;
    if (inv)
        st = render_usage(out, inv);
    if (inv && st == GG_OK)
        st = buf_appendf(
            out,
            "# HELP gpuguard_inventory_pods Pods holding GPUs in the inventory.\n"
            "# TYPE gpuguard_inventory_pods gauge\n"
            "gpuguard_inventory_pods %zu\n"
            "# HELP gpuguard_inventory_ready Whether the first pod list has completed.\n"
            "# TYPE gpuguard_inventory_ready gauge\n"
            "gpuguard_inventory_ready %d\n"
            "# HELP gpuguard_inventory_watch_restarts_total Pod watches that ended and were "
            "opened again.\n"
            "# TYPE gpuguard_inventory_watch_restarts_total counter\n"
            "gpuguard_inventory_watch_restarts_total %llu\n"
            "# HELP gpuguard_inventory_relists_total Complete pod lists (the first sync and "
            "every relist).\n"
            "# TYPE gpuguard_inventory_relists_total counter\n"
            "gpuguard_inventory_relists_total %llu\n"
            "# HELP gpuguard_inventory_malformed_events_total Watch events and list items "
            "skipped as malformed.\n"
            "# TYPE gpuguard_inventory_malformed_events_total counter\n"
            "gpuguard_inventory_malformed_events_total %llu\n"
            "# HELP gpuguard_inventory_last_sync_timestamp_seconds When the inventory was last "
            "known in sync (a list completed or a watch event came).\n"
            "# TYPE gpuguard_inventory_last_sync_timestamp_seconds gauge\n"
            "gpuguard_inventory_last_sync_timestamp_seconds %.3f\n",
            inv_pod_count(inv), inv_ready(inv) ? 1 : 0,
            (unsigned long long)atomic_load(&watch_restarts),
            (unsigned long long)atomic_load(&relists), (unsigned long long)atomic_load(&malformed),
            atomic_load(&last_sync_ms) / 1000.0);
    pthread_mutex_unlock(&registry_lock);
    return st;
}
