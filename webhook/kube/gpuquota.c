/*
 * gpuquota.c - reading a GPUQuota, writing its next status, and the store of
 * the objects the watch shows (gpuquota.h).
 */
#include "kube/gpuquota.h"

#include "codec/quantity.h"
#include "kube/lease.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- reading -------------------------------------------------------------- */

bool gq_amount(const json_t *v, int64_t *milli)
{
    char text[64];
    if (json_is_integer(v))
        snprintf(text, sizeof(text), "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        snprintf(text, sizeof(text), "%.6f", json_real_value(v));
    else if (json_is_string(v) && json_string_length(v) < sizeof(text))
        snprintf(text, sizeof(text), "%s", json_string_value(v));
    else
        return false;
    struct gg_err ignored;
    return qty_parse(text, milli, NULL, &ignored) == GG_OK && *milli >= 0;
}

static void copy_name(char *out, const char *s)
{
    snprintf(out, GQ_NAME_MAX, "%s", s ? s : "");
}

/* The pools of a {pool: quantity} mapping; what names the mapping in messages. */
static enum gg_status read_pools(const json_t *pools, const char *what, struct gq_amount *out,
                                 size_t *n, struct gg_err *err)
{
    const char *pool;
    const json_t *v;
    *n = 0;
    if (pools && !json_is_object(pools))
        return gg_fail(err, GG_ERR_INVALID, "%s: must map pool names to GPU-equivalents", what);
    json_object_foreach((json_t *)pools, pool, v)
    {
        if (*n == GQ_MAX_POOLS)
            return gg_fail(err, GG_ERR_TOOBIG, "%s: more than %d pools", what, GQ_MAX_POOLS);
        copy_name(out[*n].pool, pool);
        if (!gq_amount(v, &out[*n].milli))
            return gg_fail(err, GG_ERR_INVALID, "%s.%s: must be a quantity of GPU-equivalents",
                           what, pool);
        (*n)++;
    }
    return GG_OK;
}

enum gg_status gq_read(const json_t *obj, struct gq_view *out, struct gg_err *err)
{
    memset(out, 0, sizeof(*out));
    const json_t *meta = json_object_get(obj, "metadata");
    copy_name(out->ns, json_string_value(json_object_get(meta, "namespace")));
    copy_name(out->name, json_string_value(json_object_get(meta, "name")));
    snprintf(out->rv, sizeof(out->rv), "%s",
             json_string_value(json_object_get(meta, "resourceVersion"))
                 ? json_string_value(json_object_get(meta, "resourceVersion"))
                 : "");
    const json_t *hard = json_object_get(json_object_get(obj, "spec"), "hard");
    if (!gq_amount(json_object_get(hard, "gpu"), &out->hard))
        return gg_fail(err, GG_ERR_INVALID,
                       "GPUQuota %s/%s: spec.hard.gpu must be a quantity of GPU-equivalents",
                       out->ns, out->name);
    const json_t *status = json_object_get(obj, "status");
    const json_t *used = json_object_get(status, "used");
    out->counted = gq_amount(json_object_get(used, "gpu"), &out->used);
    out->n_entries = json_array_size(json_object_get(status, "entries"));
    char what[2 * GQ_NAME_MAX + 40];
    snprintf(what, sizeof(what), "GPUQuota %s/%s: spec.hard.pools", out->ns, out->name);
    enum gg_status st =
        read_pools(json_object_get(hard, "pools"), what, out->hard_pools, &out->n_hard_pools, err);
    snprintf(what, sizeof(what), "GPUQuota %s/%s: status.used.pools", out->ns, out->name);
    if (st == GG_OK)
        st = read_pools(json_object_get(used, "pools"), what, out->used_pools, &out->n_used_pools,
                        err);
    return st;
}

static int64_t find_amount(const struct gq_amount *a, size_t n, const char *pool, int64_t none)
{
    for (size_t i = 0; pool && i < n; i++)
        if (strcmp(a[i].pool, pool) == 0)
            return a[i].milli;
    return none;
}

int64_t gq_used_pool(const struct gq_view *v, const char *pool)
{
    return find_amount(v->used_pools, v->n_used_pools, pool, 0);
}

int64_t gq_hard_pool(const struct gq_view *v, const char *pool)
{
    return find_amount(v->hard_pools, v->n_hard_pools, pool, -1);
}

bool gq_has_entry(const json_t *obj, const char *uid)
{
    size_t i;
    const json_t *e;
    json_array_foreach(json_object_get(json_object_get(obj, "status"), "entries"), i, e)
    {
        const char *have = json_string_value(json_object_get(e, "uid"));
        if (have && strcmp(have, uid) == 0)
            return true;
    }
    return false;
}

void gq_format(int64_t milli, char *out, size_t size)
{
    snprintf(out, size, "%lld.%03lld", (long long)(milli / 1000), (long long)(milli % 1000));
}

bool gq_fits(const struct gq_view *v, int64_t charge, const char *pool, char *why, size_t size)
{
    char used[32], hard[32], need[32];
    *why = '\0';
    if (!v->counted) {
        snprintf(why, size,
                 "GPUQuota %s/%s has not been counted yet (status.used is empty): GPU pods of "
                 "namespace %s wait for the quota controller, a few seconds after the object is "
                 "made",
                 v->ns, v->name, v->ns);
        return false;
    }
    gq_format(charge, need, sizeof(need));
    if (v->used + charge > v->hard) {
        gq_format(v->used, used, sizeof(used));
        gq_format(v->hard, hard, sizeof(hard));
        snprintf(why, size,
                 "namespace %s would use %lld.%03lld of the %s GPU-equivalents of GPUQuota %s "
                 "(in use %s, this pod %s); ask for fewer GPUs or free GPUs",
                 v->ns, (long long)((v->used + charge) / 1000),
                 (long long)((v->used + charge) % 1000), hard, v->name, used, need);
        return false;
    }
    int64_t limit = pool && *pool ? gq_hard_pool(v, pool) : -1;
    int64_t in_pool = limit >= 0 ? gq_used_pool(v, pool) : 0;
    if (limit >= 0 && in_pool + charge > limit) {
        gq_format(in_pool, used, sizeof(used));
        gq_format(limit, hard, sizeof(hard));
        snprintf(why, size,
                 "namespace %s would use %lld.%03lld of the %s GPU-equivalents GPUQuota %s "
                 "allows on pool %s (in use %s, this pod %s); ask for fewer GPUs, another pool, "
                 "or free GPUs",
                 v->ns, (long long)((in_pool + charge) / 1000),
                 (long long)((in_pool + charge) % 1000), hard, v->name, pool, used, need);
        return false;
    }
    return true;
}

/* ---- writing the next status --------------------------------------------- */

/* json_object_set_new of a quantity string; false when out of memory. */
static bool set_amount(json_t *obj, const char *key, int64_t milli)
{
    char text[32];
    gq_format(milli, text, sizeof(text));
    return json_object_set_new(obj, key, json_string(text)) == 0;
}

json_t *gq_charged(const json_t *obj, const struct gq_charge *c)
{
    struct gq_view v;
    struct gg_err err;
    if (gq_read(obj, &v, &err) != GG_OK || v.n_entries >= GQ_MAX_ENTRIES)
        return NULL;
    json_t *out = json_deep_copy(obj);
    json_t *status = json_object_get(out, "status");
    if (!json_is_object(status) && json_object_set_new(out, "status", json_object()) == 0)
        status = json_object_get(out, "status");
    json_t *used = json_object_get(status, "used");
    if (!json_is_object(used) && status && json_object_set_new(status, "used", json_object()) == 0)
        used = json_object_get(status, "used");
    bool has_pool = c->pool && *c->pool;
    bool pool = has_pool && gq_hard_pool(&v, c->pool) >= 0; /* used.pools: the limited ones */
    json_t *pools = pool ? json_object_get(used, "pools") : NULL;
    if (pool && !json_is_object(pools) && used &&
        json_object_set_new(used, "pools", json_object()) == 0)
        pools = json_object_get(used, "pools");
    json_t *entries = json_object_get(status, "entries");
    if (!json_is_array(entries) && status &&
        json_object_set_new(status, "entries", json_array()) == 0)
        entries = json_object_get(status, "entries");
    char admitted[LEASE_MICROTIME_LEN], charge[32];
    struct timespec now = {(time_t)(c->now_us / 1000000), (long)(c->now_us % 1000000) * 1000};
    if (!lease_microtime(&now, admitted))
        snprintf(admitted, sizeof(admitted), "1970-01-01T00:00:00.000000Z");
    gq_format(c->charge, charge, sizeof(charge));
    json_t *entry = json_pack("{s:s,s:s,s:s,s:s}", "uid", c->uid, "pod", c->pod ? c->pod : "",
                              "charge", charge, "admitted", admitted);
    bool ok = status && used && entries && entry && (!pool || pools) &&
              set_amount(used, "gpu", v.used + c->charge) &&
              (!pool || set_amount(pools, c->pool, gq_used_pool(&v, c->pool) + c->charge)) &&
              (!has_pool || json_object_set_new(entry, "pool", json_string(c->pool)) == 0) &&
              json_array_append(entries, entry) == 0;
    json_decref(entry);
    if (!ok) {
        json_decref(out);
        return NULL;
    }
    return out;
}

/* ---- the store ----------------------------------------------------------- */

struct gq_store {
    pthread_mutex_t lock;
    json_t *by_ns;   /* ns -> {name -> {"obj": object, "seen": relist}} */
    uint64_t relist; /* the latest relist number put */
};

struct gq_store *gq_store_new(void)
{
    struct gq_store *s = calloc(1, sizeof(*s));
    if (!s || !(s->by_ns = json_object())) {
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->lock, NULL);
    return s;
}

void gq_store_free(struct gq_store *s)
{
    if (!s)
        return;
    json_decref(s->by_ns);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static const char *meta(const json_t *obj, const char *key)
{
    const char *v = json_string_value(json_object_get(json_object_get(obj, "metadata"), key));
    return v ? v : "";
}

void gq_store_put(struct gq_store *s, const json_t *obj, uint64_t relist)
{
    const char *ns = meta(obj, "namespace"), *name = meta(obj, "name");
    if (!*ns || !*name)
        return;
    json_t *kept = json_pack("{s:O,s:I}", "obj", obj, "seen", (json_int_t)relist);
    pthread_mutex_lock(&s->lock);
    json_t *names = json_object_get(s->by_ns, ns);
    if (!names && json_object_set_new(s->by_ns, ns, json_object()) == 0)
        names = json_object_get(s->by_ns, ns);
    if (relist > s->relist)
        s->relist = relist;
    if (kept && relist == 0)
        json_object_set_new(kept, "seen", json_integer((json_int_t)s->relist));
    if (names && kept)
        json_object_set(names, name, kept);
    pthread_mutex_unlock(&s->lock);
    json_decref(kept);
}

void gq_store_delete(struct gq_store *s, const json_t *obj)
{
    const char *ns = meta(obj, "namespace");
    pthread_mutex_lock(&s->lock);
    json_t *names = json_object_get(s->by_ns, ns);
    json_object_del(names, meta(obj, "name"));
    if (names && json_object_size(names) == 0)
        json_object_del(s->by_ns, ns);
    pthread_mutex_unlock(&s->lock);
}

void gq_store_relist_end(struct gq_store *s, uint64_t relist)
{
    pthread_mutex_lock(&s->lock);
    const char *ns, *name;
    json_t *names, *kept;
    void *tmp, *tmp2;
    json_object_foreach_safe(s->by_ns, tmp, ns, names)
    {
        json_object_foreach_safe(names, tmp2, name, kept)
        {
            if ((uint64_t)json_integer_value(json_object_get(kept, "seen")) < relist)
                json_object_del(names, name);
        }
        if (json_object_size(names) == 0)
            json_object_del(s->by_ns, ns);
    }
    pthread_mutex_unlock(&s->lock);
}

json_t *gq_store_get(struct gq_store *s, const char *ns, size_t *count)
{
    pthread_mutex_lock(&s->lock);
    json_t *names = json_object_get(s->by_ns, ns);
    *count = json_object_size(names);
    json_t *out = NULL;
    if (*count == 1) {
        void *it = json_object_iter(names);
        out = json_deep_copy(json_object_get(json_object_iter_value(it), "obj"));
    }
    pthread_mutex_unlock(&s->lock);
    return out;
}

size_t gq_store_count(struct gq_store *s, const char *ns)
{
    pthread_mutex_lock(&s->lock);
    size_t n = json_object_size(json_object_get(s->by_ns, ns));
    pthread_mutex_unlock(&s->lock);
    return n;
}

json_t *gq_store_all(struct gq_store *s)
{
    json_t *out = json_array();
    pthread_mutex_lock(&s->lock);
    const char *ns, *name;
    json_t *names, *kept;
    json_object_foreach(s->by_ns, ns, names)
    {
        json_object_foreach(names, name, kept)
        {
            json_array_append_new(out, json_deep_copy(json_object_get(kept, "obj")));
        }
    }
    pthread_mutex_unlock(&s->lock);
    return out;
}
