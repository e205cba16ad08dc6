/*
 * quotactl.c - the quota controller: each GPUQuota's ledger recounted from
 * the pods the watch shows, on the replica that holds the Lease
 * (quotactl.h).
 */
#include "kube/quotactl.h"

#include "kube/gpuquota.h"
#include "kube/ledger.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define QC_WRITE_TRIES 5 /* a recount and its write, again after each 409 */

struct quotactl {
    struct kc_client *client;
    struct inventory *inv;
    struct quotactl_options o;
    struct lease *lease;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_bool stop;
    json_t *told; /* namespaces whose quotas.namespaces entry was said to give way */
};

/* Say once per namespace that its GPUQuota wins over the configuration's quota. */
static void tell_override(struct quotactl *q, const json_t *obj)
{
    const json_t *meta = json_object_get(obj, "metadata");
    const char *ns = json_string_value(json_object_get(meta, "namespace"));
    if (!ns || !q->o.configured || json_object_get(q->told, ns) ||
        !q->o.configured(q->o.configured_ctx, ns))
        return;
    json_object_set_new(q->told, ns, json_true());
    log_fields(LOG_WARN,
               "GPUQuota holds the namespace's limit; its quotas.namespaces entry is not used",
               json_pack("{s:s,s:s}", "namespace", ns, "name",
                         json_string_value(json_object_get(meta, "name"))));
}

/* An entry's admitted time (MicroTime) in wall-clock microseconds; -1 when unreadable. */
static int64_t admitted_us(const json_t *entry)
{
    const char *s = json_string_value(json_object_get(entry, "admitted"));
    struct tm tm = {0};
    const char *rest = s ? strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
    if (!rest)
        return -1;
    long micro = 0;
    if (*rest == '.')
        micro = strtol(rest + 1, NULL, 10);
    return (int64_t)timegm(&tm) * 1000000 + micro;
}

static int64_t entry_charge(const json_t *entry)
{
    int64_t milli = 0;
    return gq_amount(json_object_get(entry, "charge"), &milli) ? milli : 0;
}

/* The Ready condition: the old one when it was already True (its transition time stays). */
static json_t *ready_condition(const json_t *old_status, int64_t now_us)
{
    size_t i;
    const json_t *c;
    json_array_foreach(json_object_get(old_status, "conditions"), i, c)
    {
        const char *type = json_string_value(json_object_get(c, "type"));
        const char *status = json_string_value(json_object_get(c, "status"));
        if (type && status && strcmp(type, "Ready") == 0 && strcmp(status, "True") == 0)
            return json_pack("[O]", c);
    }
    char when[LEASE_MICROTIME_LEN], rfc3339[32];
    struct timespec now = {(time_t)(now_us / 1000000), 0};
    if (!lease_microtime(&now, when))
        return NULL;
    snprintf(rfc3339, sizeof(rfc3339), "%.19sZ", when); /* metav1.Time: whole seconds */
    return json_pack("[{s:s,s:s,s:s,s:s,s:s}]", "type", "Ready", "status", "True", "reason",
                     "Counted", "message",
                     "status.used is the pods the watch shows plus the entries not seen yet",
                     "lastTransitionTime", rfc3339);
}

json_t *quotactl_recount(const json_t *obj, struct inventory *inv, int64_t now_us,
                         int64_t entry_bound_ms, unsigned *corrections)
{
    struct gq_view v;
    struct gg_err err;
    *corrections = 0;
    if (gq_read(obj, &v, &err) != GG_OK)
        return NULL; /* the schema refuses such objects; nothing to count against */
    const json_t *status = json_object_get(obj, "status");
    json_t *kept = json_array();
    int64_t in_entries = 0, pool_entries[GQ_MAX_POOLS] = {0};
    size_t i;
    const json_t *e;
    json_array_foreach(json_object_get(status, "entries"), i, e)
    {
        const char *uid = json_string_value(json_object_get(e, "uid"));
        int64_t at = admitted_us(e);
        if (!uid || inv_pod_seen(inv, uid) != INV_POD_UNSEEN)
            continue; /* counted from the pod now, or gone */
        if (at < 0 || now_us - at > entry_bound_ms * 1000) {
            (*corrections)++; /* admitted, never created: a later step refused it */
            continue;
        }
        int64_t charge = entry_charge(e);
        in_entries += charge;
        const char *pool = json_string_value(json_object_get(e, "pool"));
        for (size_t p = 0; pool && p < v.n_hard_pools; p++)
            if (strcmp(v.hard_pools[p].pool, pool) == 0)
                pool_entries[p] += charge;
        json_array_append(kept, (json_t *)e);
    }
    json_t *used = json_object(), *pools = json_object();
    char text[32];
    gq_format(inv_held(inv, v.ns, NULL) + in_entries, text, sizeof(text));
    json_object_set_new(used, "gpu", json_string(text));
    for (size_t p = 0; p < v.n_hard_pools; p++) {
        gq_format(inv_held(inv, v.ns, v.hard_pools[p].pool) + pool_entries[p], text, sizeof(text));
        json_object_set_new(pools, v.hard_pools[p].pool, json_string(text));
    }
    if (json_object_size(pools))
        json_object_set(used, "pools", pools);
    json_decref(pools);
    const json_t *generation = json_object_get(json_object_get(obj, "metadata"), "generation");
    json_t *next_status = json_pack("{s:o,s:o,s:o*}", "used", used, "entries", kept, "conditions",
                                    ready_condition(status, now_us));
    if (next_status && generation)
        json_object_set(next_status, "observedGeneration", (json_t *)generation);
    if (!next_status)
        return NULL;
    if (json_equal(next_status, (json_t *)status)) {
        json_decref(next_status);
        return NULL;
    }
    if (!json_equal(json_object_get(next_status, "used"), json_object_get(status, "used")) &&
        v.counted)
        (*corrections)++;
    json_t *next = json_deep_copy(obj);
    if (!next || json_object_set_new(next, "status", next_status) != 0) {
        json_decref(next);
        return NULL;
    }
    return next;
}

/* Recount obj and write it, again on top of whatever a 409 shows; leading throughout. */
static void reconcile(struct quotactl *q, json_t *obj)
{
    const json_t *meta = json_object_get(obj, "metadata");
    const char *ns = json_string_value(json_object_get(meta, "namespace"));
    json_incref(obj);
    for (int tries = 0; tries < QC_WRITE_TRIES && lease_is_leader(q->lease); tries++) {
        unsigned corrections = 0;
        json_t *next =
            quotactl_recount(obj, q->inv, gg_wall_us(), q->o.entry_bound_ms, &corrections);
        if (!next)
            break;
        json_t *written = NULL;
        long status = 0;
        struct gg_err err = {{0}};
        int64_t deadline = gg_now_us() + q->o.period_ms * 1000;
        enum gg_status st = ledger_write(q->client, next, deadline, &written, &status, &err);
        json_decref(next);
        json_decref(written);
        if (st == GG_OK) {
            if (corrections) {
                metrics_ledger_correction(ns, corrections);
                log_fields(LOG_INFO, "quota ledger corrected",
                           json_pack("{s:s,s:s,s:i}", "namespace", ns ? ns : "", "name",
                                     json_string_value(json_object_get(meta, "name")),
                                     "corrections", (int)corrections));
            }
            break;
        }
        json_t *fresh = NULL;
        if (status != 409 ||
            ledger_fetch(q->client, obj, deadline, &fresh, &status, &err) != GG_OK) {
            log_fields(LOG_WARN, "quota ledger: recount not written",
                       json_pack("{s:s,s:s}", "namespace", ns ? ns : "", "error", err.msg));
            break;
        }
        json_decref(obj);
        obj = fresh;
        meta = json_object_get(obj, "metadata");
    }
    json_decref(obj);
}

static void *run(void *arg)
{
    struct quotactl *q = arg;
    while (!atomic_load(&q->stop)) {
        if (lease_is_leader(q->lease) && inv_ready(q->inv)) {
            json_t *all = inv_quotas(q->inv);
            size_t i;
            json_t *obj;
            json_array_foreach(all, i, obj)
            {
                if (atomic_load(&q->stop))
                    break;
                tell_override(q, obj);
                reconcile(q, obj);
            }
            json_decref(all);
        }
        kc_pause_ms(&q->lock, &q->wake, &q->stop, q->o.period_ms);
    }
    return NULL;
}

enum gg_status quotactl_start(struct kc_client *client, struct inventory *inv,
                              const struct quotactl_options *o, struct quotactl **out,
                              struct gg_err *err)
{
    struct quotactl *q = calloc(1, sizeof(*q));
    if (!q) {
        kc_free(client);
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    q->client = client;
    q->inv = inv;
    q->o = *o;
    q->told = json_object();
    if (q->o.period_ms <= 0)
        q->o.period_ms = QC_DEFAULT_PERIOD_MS;
    if (q->o.entry_bound_ms <= 0)
        q->o.entry_bound_ms = QC_DEFAULT_ENTRY_BOUND_MS;
    pthread_mutex_init(&q->lock, NULL);
    kc_cond_init(&q->wake);
    q->lease = o->lease;
    enum gg_status st = GG_OK;
    if (pthread_create(&q->thread, NULL, run, q) != 0)
        st = gg_fail(err, GG_ERR_NOMEM, "cannot start the quota controller's thread");
    if (st != GG_OK) {
        kc_free(client);
        json_decref(q->told);
        pthread_cond_destroy(&q->wake);
        pthread_mutex_destroy(&q->lock);
        free(q);
        return st;
    }
    *out = q;
    return GG_OK;
}

void quotactl_stop(struct quotactl *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->lock);
    atomic_store(&q->stop, true);
    pthread_cond_broadcast(&q->wake);
    pthread_mutex_unlock(&q->lock);
    pthread_join(q->thread, NULL);
    kc_free(q->client);
    json_decref(q->told);
    pthread_cond_destroy(&q->wake);
    pthread_mutex_destroy(&q->lock);
    free(q);
}
