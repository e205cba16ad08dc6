/*
 * cli_pods.c - how many of a workload's pods `gpuguard check` admits
 * (cli_pods.h).
 */
#include "cli/cli_pods.h"

#include "codec/keys.h"
#include "engine/workloads.h"
#include "kube/inventory.h"

#include <stdlib.h>
#include <string.h>

/* The pods before pod n (counted from 1) as if running: all but the first, which is charged. */
static uint64_t hold_before(struct inventory *inv, const struct dr_result *first, long long n,
                            long long charge)
{
    if (n <= 2)
        return 0;
    const json_t *meta = json_object_get(first->mutated, "metadata");
    struct inv_hold h = {
        .ns = first->namespace,
        .cls = json_string_value(
            json_object_get(json_object_get(meta, "labels"), GG_KEY_WORKLOAD_CLASS)),
        .pool =
            json_string_value(json_object_get(json_object_get(meta, "annotations"), GG_KEY_POOL)),
        .charge = (n - 2) * charge,
    };
    return inv_reserve(inv, &h, INV_RESERVATION_TTL_MS);
}

/* Is pod n admitted after the n - 1 before it?  *denial gets why not (replacing what it had). */
static enum gg_status probe(struct engine *engine, struct inventory *inv, const struct mf_entry *e,
                            const json_t *doc, const struct dr_options *o,
                            const struct dr_result *first, long long n, long long charge,
                            bool *admitted, char **denial, struct gg_err *err)
{
    uint64_t seq = hold_before(inv, first, n, charge);
    if (n > 2 && seq == 0)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory counting a workload's pods");
    struct dr_options dry = *o;
    dry.dry_run = true; /* judged, not charged: the charge is this module's to hold */
    struct wl_result r;
    enum gg_status st = wl_template(engine, e, doc, &dry, &r, err);
    if (seq)
        inv_unreserve(inv, seq);
    if (st != GG_OK)
        return st;
    *admitted = r.pod.allowed;
    if (!r.pod.allowed) {
        free(*denial);
        *denial = strdup(r.pod.message ? r.pod.message : "denied");
        if (!*denial)
            st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    wl_result_clear(&r);
    return st;
}

enum gg_status cli_fit_pods(struct engine *engine, struct inventory *inv, const struct mf_entry *e,
                            const json_t *doc, const struct dr_options *o,
                            const struct dr_result *first, struct pods_fit *out, struct gg_err *err)
{
    *out = (struct pods_fit){.pods = wl_pod_count(doc, e->template_ptr),
                             .charge = first->allowed ? wl_pod_charge(first->mutated) : 0};
    out->admitted = first->allowed ? out->pods : 0;
    if (out->charge == 0 || out->pods <= 1)
        return GG_OK;
    /* Pod lo is admitted, pod hi is not (pods + 1: none is); out->denial is pod hi's own. */
    long long lo = 1, hi = out->pods + 1;
    enum gg_status st = GG_OK;
    while (st == GG_OK && hi - lo > 1) {
        long long mid = lo + (hi - lo) / 2;
        bool admitted = false;
        st = probe(engine, inv, e, doc, o, first, mid, out->charge, &admitted, &out->denial, err);
        if (admitted)
            lo = mid;
        else
            hi = mid;
    }
    if (st != GG_OK)
        return st;
    out->admitted = lo;
    /* The admitted pods after the first count for the documents after this one. */
    if (lo > 1 && hold_before(inv, first, lo + 1, out->charge) == 0)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory counting a workload's pods");
    return GG_OK;
}

void pods_fit_clear(struct pods_fit *f)
{
    free(f->denial);
    f->denial = NULL;
}
