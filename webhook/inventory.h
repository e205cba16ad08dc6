/*
 * inventory.h - GPU usage per namespace in milli-GPU: the pods that hold
 * GPUs, kept as small records, and reservations for pods admitted but not
 * yet seen.
 *
 * The server fills it from the API server (list + watch); the CLI from a
 * `kubectl get pods -A -o json` snapshot.  Policies read it through
 * gpuguard.usage().  Every function is thread-safe.
 *
 * A pod's charge is its `gpuguard.io/charge` annotation (milli-GPU, written
 * by the gpu-sharing policy) when present; otherwise it is estimated from
 * its GPU resources: nvidia.com/gpu N counts N x 1000; nvidia.com/mig-<g>g.*
 * counts ceil(g x 1000 / 7) per device (g / 4 for the A30 profiles 1g.6gb,
 * 2g.12gb and 4g.24gb); a shared replica (nvidia.com/gpu.shared)
 * counts 1000, since its share of the GPU is unknown.  Pods that Succeeded
 * or Failed count nothing.
 */
#ifndef GG_INVENTORY_H
#define GG_INVENTORY_H

#include "gpuguard.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define INV_CHARGE_ANNOTATION "gpuguard.io/charge"
#define INV_CLASS_LABEL "gpuguard.io/workload-class"
/* How long an admitted pod counts before the watch must have shown it. */
#define INV_RESERVATION_TTL_MS 60000

struct inventory;

struct inventory *inv_new(void);
void inv_free(struct inventory *inv);

/* The charge of a pod object in milli-GPU (0 when it holds no GPU). */
int64_t inv_pod_charge(const json_t *pod);

/* Add or update a pod from its object; pods with no charge are dropped. */
void inv_upsert(struct inventory *inv, const json_t *pod);
void inv_delete(struct inventory *inv, const json_t *pod);
/*
 * Replace everything with the pods of a List's items (a relist): the new
 * state is built with no lock held, then swapped in at once.
 */
void inv_replace(struct inventory *inv, const json_t *items);

/*
 * A relist in steps, for lists read a pod at a time: inv_stage_add() each
 * pod into a stage (private to the caller, no lock), then
 * inv_stage_commit() swaps the stage in as the whole state at once and
 * frees it.  Only the compact records are kept, so a caller can free each
 * pod right after adding it.  The commit settles the reservations of pods
 * the stage holds (same namespace and name, or generateName).
 */
struct inv_stage;
struct inv_stage *inv_stage_new(void);
void inv_stage_free(struct inv_stage *stage);
void inv_stage_add(struct inv_stage *stage, const json_t *pod);
/* Pods that hold GPUs in the stage so far. */
size_t inv_stage_pods(const struct inv_stage *stage);
void inv_stage_commit(struct inventory *inv, struct inv_stage *stage);

/*
 * Count a pod this replica just admitted until a pod with that namespace
 * and name (or generateName prefix) is seen, or ttl_ms passes.
 */
void inv_reserve(struct inventory *inv, const char *ns, const char *name, const char *cls,
                 int64_t charge, int64_t ttl_ms);

/* Usage of a namespace (and of one workload class in it when cls is not NULL). */
int64_t inv_usage(struct inventory *inv, const char *ns, const char *cls);
/* Pods that hold GPUs (those with a record). */
size_t inv_pod_count(struct inventory *inv);

/* Usage per namespace from the pods seen (reservations not included). */
struct inv_ns_usage {
    const char *ns;
    int64_t milli;
};
/*
 * Every namespace the inventory has summed, sorted by name: *out is one
 * malloc'ed block (the names inside it), released with free(); the count
 * is returned (0 with *out NULL when none or out of memory).
 */
size_t inv_usage_by_namespace(struct inventory *inv, struct inv_ns_usage **out);

/* Forget every reservation (for callers whose requests are independent, like test cases). */
void inv_clear_reservations(struct inventory *inv);

void inv_set_ready(struct inventory *inv, bool ready);
bool inv_ready(struct inventory *inv);

/*
 * Call fn for every pod with a controller owner, with its namespace, name
 * and "<kind>/<name>" of the controller (under the lock: fn must be quick
 * and must not call back into the inventory).
 */
void inv_each_owner(struct inventory *inv,
                    void (*fn)(void *ctx, const char *ns, const char *pod, const char *owner),
                    void *ctx);

/* Load a `kubectl get pods -A -o json` dump (a List of Pods); marks ready. */
enum gg_status inv_load_snapshot(struct inventory *inv, const char *path, struct gg_err *err);

#endif
