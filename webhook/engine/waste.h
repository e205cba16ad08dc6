/*
 * waste.h - the GPU running workloads hold against what their memory history says they need
 * (docs/audit.md): `gpuguard report` from a dump, the audit (audit.h) from the cluster.
 *
 * The running GPU pods are grouped by controller (one pod without is a workload of its own);
 * the first pod of each is reviewed as stored, when it comes (dr_evaluate, background; the
 * pod is not kept, so that memory grows with the workloads' count alone): the rightsizing policy's
 * finding (rsstore.h, rss_take_last) gives what a pod holds and needs, in milli-GPU, and the
 * allocation that would hold it.  A workload the history does not cover counts as held, its
 * need unknown.
 */
#ifndef GG_WASTE_H
#define GG_WASTE_H

#include "engine/policy.h"
#include "kube/rsstore.h"
#include "util/gpuguard.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* One workload: the running pods of one controller (or one pod without). */
struct waste_workload {
    char *ns, *owner; /* the owner's "Kind/name", or the pod's name */
    long pods;
    bool known;         /* the rightsizing policy reported it */
    struct rss_last rs; /* what it reported: per pod */
    int64_t held_milli; /* per pod, when not known: the charge the review gave */
    char *would_hold;   /* the recommendation, or NULL */
};

struct waste_set {
    struct waste_workload *w;
    size_t n, cap;
    json_t *index; /* "ns\x1fowner" -> its position */
};

/* A pod that holds its GPU now: on a node, neither succeeded nor failed. */
bool waste_running(const json_t *pod);

/*
 * Count a running pod in its workload.  The first pod of a workload is reviewed at once (before,
 * unless NULL, is called first): its finding, else its charge.  An error leaves the workload
 * counted, its need unknown, and says why.
 */
enum gg_status waste_add_pod(struct engine *e, struct waste_set *s, const json_t *pod,
                             void (*before)(void *ctx), void *ctx, struct gg_err *err);
/* Once every pod is in: drop the workloads that hold nothing and have no finding. */
void waste_finish(struct waste_set *s);
void waste_set_clear(struct waste_set *s);

/* What a workload holds, and needs (0 when not known), in milli-GPU, its pods together. */
int64_t waste_held(const struct waste_workload *w);
int64_t waste_needed(const struct waste_workload *w);
/* The workload's name as reports and metrics show it. */
const char *waste_name(const struct waste_workload *w);

/* Totals of a namespace or the cluster. */
struct waste_totals {
    int64_t held, needed, held_known;
    long workloads, unknown;
};
void waste_add(struct waste_totals *t, const struct waste_workload *w);
/* {held_gpus, needed_gpus, waste_gpus, workloads, without_history} */
json_t *waste_totals_json(const struct waste_totals *t);
/* Per namespace, [held with history, needed, waste, held without history] in milli-GPU
 * (rss_publish_audit's figures). */
json_t *waste_by_namespace(const struct waste_set *s);

#endif
