/*
 * waste.c - the GPU running workloads hold against what their memory history says they need:
 * grouping the running pods by controller, one review per workload, the totals (waste.h).
 */
#include "engine/waste.h"

#include "codec/keys.h"
#include "engine/dryrun.h"
#include "kube/inventory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RECOMMENDATION_KEY "gpuguard.io/recommendation"

static const char *str(const json_t *obj, const char *a, const char *b)
{
    const json_t *v = json_object_get(obj, a);
    return json_string_value(b ? json_object_get(v, b) : v);
}

bool waste_running(const json_t *pod)
{
    const char *phase = str(pod, "status", "phase");
    return str(pod, "spec", "nodeName") &&
           !(phase && (strcmp(phase, "Succeeded") == 0 || strcmp(phase, "Failed") == 0));
}

/* Review one workload's pod: what the rightsizing policy found for it, else its charge. */
static enum gg_status review(struct engine *e, struct waste_workload *w, const json_t *pod,
                             struct gg_err *err)
{
    struct dr_options o = {.namespace = w->ns, .user = DR_BACKGROUND_USER, .background = true};
    struct dr_result res = {0};
    struct rss_last ignored;
    rss_record_last();
    rss_take_last(&ignored);
    enum gg_status st = dr_evaluate(e, pod, &o, &res, err);
    if (st != GG_OK)
        return st;
    w->known = rss_take_last(&w->rs);
    /* The charge of the review, else (a pod the policies now refuse) the one it was admitted
     * with. */
    const json_t *ann = json_object_get(json_object_get(res.mutated, "metadata"), "annotations");
    const json_t *stored = json_object_get(json_object_get(pod, "metadata"), "annotations");
    const char *charge = json_string_value(json_object_get(ann, GG_KEY_CHARGE));
    if (!charge)
        charge = json_string_value(json_object_get(stored, GG_KEY_CHARGE));
    w->held_milli = charge ? strtoll(charge, NULL, 10) : 0;
    const char *rec = json_string_value(json_object_get(ann, RECOMMENDATION_KEY));
    w->would_hold = rec ? strdup(rec) : NULL;
    dr_result_clear(&res);
    return GG_OK;
}

enum gg_status waste_add_pod(struct engine *e, struct waste_set *s, const json_t *pod,
                             void (*before)(void *ctx), void *ctx, struct gg_err *err)
{
    const char *ns = str(pod, "metadata", "namespace"), *name = str(pod, "metadata", "name");
    if (!ns || !name)
        return GG_OK;
    char *owner = inv_controller(pod), *key = NULL;
    if (owner && !*owner) { /* no controller: the pod is a workload of its own */
        free(owner);
        owner = strdup(name);
    }
    if (!owner)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    if ((!s->index && !(s->index = json_object())) || asprintf(&key, "%s\x1f%s", ns, owner) < 0) {
        free(owner);
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    const json_t *at = json_object_get(s->index, key);
    if (at) {
        s->w[json_integer_value(at)].pods++;
        free(owner);
        free(key);
        return GG_OK;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        struct waste_workload *more = realloc(s->w, cap * sizeof(*more));
        if (!more) {
            free(owner);
            free(key);
            return gg_fail(err, GG_ERR_NOMEM, "out of memory");
        }
        s->w = more;
        s->cap = cap;
    }
    struct waste_workload *w = &s->w[s->n];
    *w = (struct waste_workload){.ns = strdup(ns), .owner = owner, .pods = 1};
    bool ok = w->ns && json_object_set_new(s->index, key, json_integer((json_int_t)s->n)) == 0;
    free(key);
    s->n++; /* freed with the set, whatever happened */
    if (!ok)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    if (before)
        before(ctx);
    struct gg_err sub = {{0}};
    enum gg_status st = review(e, w, pod, &sub);
    return st == GG_OK ? GG_OK : gg_fail(err, st, "%s/%s: %s", w->ns, w->owner, sub.msg);
}

static void workload_clear(struct waste_workload *w)
{
    free(w->ns);
    free(w->owner);
    free(w->would_hold);
}

void waste_finish(struct waste_set *s)
{
    size_t kept = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (waste_held(&s->w[i]) > 0 || s->w[i].known)
            s->w[kept++] = s->w[i];
        else
            workload_clear(&s->w[i]);
    }
    s->n = kept;
    json_decref(s->index); /* the positions moved */
    s->index = NULL;
}

void waste_set_clear(struct waste_set *s)
{
    for (size_t i = 0; i < s->n; i++)
        workload_clear(&s->w[i]);
    free(s->w);
    json_decref(s->index);
    memset(s, 0, sizeof(*s));
}

int64_t waste_held(const struct waste_workload *w)
{
    return (w->known ? w->rs.requested : w->held_milli) * w->pods;
}

int64_t waste_needed(const struct waste_workload *w)
{
    return w->known ? w->rs.needed * w->pods : 0;
}

const char *waste_name(const struct waste_workload *w)
{
    return w->known ? w->rs.workload : w->owner;
}

void waste_add(struct waste_totals *t, const struct waste_workload *w)
{
    t->held += waste_held(w);
    t->workloads++;
    if (w->known) {
        t->needed += waste_needed(w);
        t->held_known += waste_held(w);
    } else {
        t->unknown++;
    }
}

static json_t *gpus(int64_t milli)
{
    return json_real((double)milli / 1000.0);
}

json_t *waste_totals_json(const struct waste_totals *t)
{
    return json_pack("{s:o,s:o,s:o,s:I,s:I}", "held_gpus", gpus(t->held), "needed_gpus",
                     gpus(t->needed), "waste_gpus", gpus(t->held_known - t->needed), "workloads",
                     (json_int_t)t->workloads, "without_history", (json_int_t)t->unknown);
}

json_t *waste_by_namespace(const struct waste_set *s)
{
    json_t *out = json_object();
    for (size_t i = 0; out && i < s->n; i++) {
        const struct waste_workload *w = &s->w[i];
        json_t *sum = json_object_get(out, w->ns);
        int64_t f[4];
        for (size_t k = 0; k < 4; k++)
            f[k] = json_integer_value(json_array_get(sum, k));
        if (w->known) {
            f[0] += waste_held(w);
            f[1] += waste_needed(w);
            f[2] += waste_held(w) - waste_needed(w);
        } else {
            f[3] += waste_held(w);
        }
        if (json_object_set_new(out, w->ns,
                                json_pack("[I,I,I,I]", (json_int_t)f[0], (json_int_t)f[1],
                                          (json_int_t)f[2], (json_int_t)f[3])) != 0) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}
