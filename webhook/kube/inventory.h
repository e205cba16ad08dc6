/*
 * inventory.h - GPU usage per namespace in milli-GPU: the pods that hold
 * GPUs, kept as small records, and reservations for pods admitted but not
 * yet seen.
 *
 * The server fills it from the API server (list + watch); the CLI from a
 * `kubectl get pods,resourceclaims,resourceclaimtemplates,deviceclasses,resourceslices,gpuquotas
 * -A -o json`
 * snapshot (inv_read_snapshot).  Policies read it through
 * gpuguard.usage().  Every function is thread-safe.
 *
 * What a pod or a ResourceClaim holds is its charger's answer (see
 * charger.h: the Lua library's intent.usage_charge, the model admission
 * charges with); the inventory has no charge rules of its own.  Pods that
 * Succeeded or Failed hold nothing.  ResourceClaims,
 * ResourceClaimTemplates and DeviceClasses are also kept, trimmed, for the
 * charger to read back (inv_dra_get); claims and templates are immutable, so
 * a cached one is never stale; a class that changes is counted
 * (inv_class_changes).
 */
#ifndef GG_INVENTORY_H
#define GG_INVENTORY_H

#include "codec/keys.h"
#include "codec/manifest.h"
#include "util/gpuguard.h"
#include "kube/infscan.h"
#include "util/jsonfast.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* How long an admitted pod counts before the watch must have shown it. */
#define INV_RESERVATION_TTL_MS 60000

struct inventory;

struct inventory *inv_new(void);
void inv_free(struct inventory *inv);

/*
 * The charge in milli-GPU of a pod (pod: as the informer reads one, see
 * kube/infscan.h; or obj) or of a ResourceClaim charged on its own (obj);
 * one of pod and obj is NULL.  Called with no inventory lock held, from any
 * thread: it must be thread-safe.
 */
typedef int64_t (*inv_charge_fn)(void *ctx, const struct inf_pod *pod, const struct jf_node *obj);
/* Set before the first object arrives; without one nothing is charged. */
void inv_set_charger(struct inventory *inv, inv_charge_fn fn, void *ctx);
/* The charger's answer (0 without a charger) for obj, a claim or a pod the informer's reader
 * refuses (util/jsonfast.h's nodes), charged by the model as it is; or for a pod read. */
int64_t inv_charge(struct inventory *inv, const struct jf_node *obj);
int64_t inv_charge_pod(struct inventory *inv, const struct inf_pod *pod);

/*
 * Add or update a pod, ResourceClaim, ResourceClaimTemplate or DeviceClass (by "kind";
 * an object without one is a pod); other kinds are ignored.  Objects that
 * hold no charge keep no usage record.
 */
void inv_upsert(struct inventory *inv, const json_t *obj);
void inv_delete(struct inventory *inv, const json_t *obj);
/* The same for a pod already read (a watch event's, inf_parse_event), and by its uid. */
struct inf_pod;
void inv_upsert_pod(struct inventory *inv, const struct inf_pod *pod);
void inv_delete_pod(struct inventory *inv, const char *uid);

/*
 * A copy of the kept ResourceClaim, ResourceClaimTemplate or DeviceClass
 * (kind; a class's namespace is ""), or NULL.
 * A template not kept yet is asked of the fetcher, when one is set, and kept
 * when it exists (the API server's answer, not a guess); when the fetcher
 * could not tell, err (may be NULL) says why.  deadline_us (CLOCK_MONOTONIC
 * microseconds, 0: none) bounds the fetch: one that cannot end by then fails
 * with GG_ERR_TIMEOUT's message in err, so a caller never outlives it.
 */
json_t *inv_dra_get(struct inventory *inv, const char *kind, const char *ns, const char *name,
                    int64_t deadline_us, struct gg_err *err);
/* Claims, templates and classes kept. */
size_t inv_dra_count(struct inventory *inv);

/*
 * The object kind/ns/name from the API server (a new reference); NULL when it
 * has none, or with err set when that could not be known, including when it
 * could not be known by deadline_us (CLOCK_MONOTONIC microseconds, 0: none).
 */
typedef json_t *(*inv_fetch_fn)(void *ctx, const char *kind, const char *ns, const char *name,
                                int64_t deadline_us, struct gg_err *err);
void inv_set_fetcher(struct inventory *inv, inv_fetch_fn fn, void *ctx);

/*
 * A relist of claims, templates or classes, apart from the pods': number it
 * with inv_dra_relist_begin, inv_dra_add every object listed, then
 * inv_dra_relist_end forgets the objects of kind ("ResourceClaim",
 * "ResourceClaimTemplate", "DeviceClass"; NULL: all) that it did not show.
 */
uint64_t inv_dra_relist_begin(struct inventory *inv);
void inv_dra_add(struct inventory *inv, const json_t *obj, uint64_t relist);
void inv_dra_relist_end(struct inventory *inv, const char *kind, uint64_t relist);
/*
 * Replace everything with the objects of a List's items (a relist), in any
 * order: the new state is built with no lock held, then swapped in at once.
 */
void inv_replace(struct inventory *inv, const json_t *items);

/*
 * A relist in steps, for lists read a pod at a time: inv_stage_add() each
 * pod into a stage (private to the caller, no lock), then
 * inv_stage_commit() swaps the stage in as the whole state at once and
 * frees it.  Only the compact records are kept, so a caller can free each
 * pod right after adding it.  The commit settles the reservations of pods
 * the stage holds (by uid, or namespace and name).
 */
struct inv_stage;
/* A stage of pods for inv, charged by inv's charger (other kinds are ignored: see
 * inv_dra_relist_begin). */
struct inv_stage *inv_stage_new(struct inventory *inv);
void inv_stage_free(struct inv_stage *stage);
void inv_stage_add(struct inv_stage *stage, const json_t *pod);
/* inv_stage_add of a pod as the informer reads one: the relist's own way, with no object. */
void inv_stage_add_pod(struct inv_stage *stage, const struct inf_pod *pod);
/* Pods that hold GPUs in the stage so far. */
size_t inv_stage_pods(const struct inv_stage *stage);
void inv_stage_commit(struct inventory *inv, struct inv_stage *stage);

/* What a pod (or ResourceClaim) under review would hold. */
struct inv_hold {
    const char *ns;
    const char *uid;  /* metadata.uid, which the validating call has; NULL or "": none */
    const char *name; /* used when there is no uid; NULL or "": generated, not known yet */
    const char *cls;  /* the workload class label; NULL: none */
    const char *pool; /* gpuguard.io/pool; NULL: none */
    int64_t charge;
};

/*
 * Count a pod (or ResourceClaim) under review until the watch shows the
 * object of that uid (else that namespace and name), ttl_ms passes, or
 * inv_unreserve drops it (the review denied it).  Returns the reservation's
 * number, which orders reviews (inv_read_before); 0 when out of memory.
 */
uint64_t inv_reserve(struct inventory *inv, const struct inv_hold *h, int64_t ttl_ms);
void inv_unreserve(struct inventory *inv, uint64_t seq);
/*
 * This thread's inv_usage calls count only reservations numbered below seq,
 * those of the reviews that reserved before its own (0: all).  A review
 * that reserves before its policies read the usage then takes room exactly:
 * of two concurrent reviews, the later sees the earlier's charge, and the
 * earlier need not see the later's, which saw its own.
 */
void inv_read_before(uint64_t seq);
/*
 * This thread's inv_usage and inv_pool_usage calls leave out the pod with this uid (NULL:
 * none): an audited pod is judged against the usage of the others, as at its admission.
 * The string must live until the next call.
 */
void inv_read_without(const char *uid);

/* Usage of a namespace (and of one workload class in it when cls is not NULL). */
int64_t inv_usage(struct inventory *inv, const char *ns, const char *cls);
/* Usage of the pods of a namespace placed in pool (gpuguard.io/pool), reservations included. */
int64_t inv_pool_usage(struct inventory *inv, const char *ns, const char *pool);
/* Pods that hold GPUs (those with a record). */
size_t inv_pod_count(struct inventory *inv);

/*
 * What the pods (and, with pool NULL, the claims charged on their own) of ns
 * hold, without reservations: the usage the quota controller counts.  pool:
 * the pods placed in that pool (gpuguard.io/pool).
 */
int64_t inv_held(struct inventory *inv, const char *ns, const char *pool);

/* What the watch showed of a pod (or of a ResourceClaim charged on its own): holding GPUs now,
 * deleted or finished lately (pods), or nothing. */
enum inv_pod_seen { INV_POD_UNSEEN, INV_POD_HOLDING, INV_POD_GONE };
enum inv_pod_seen inv_pod_seen(struct inventory *inv, const char *uid);
/* Whether the pod of uid holds GPUs now (inv_pod_seen's first answer for pods alone: no claim
 * is looked through, so that a walk over every pod of a cluster stays cheap). */
bool inv_pod_holding(struct inventory *inv, const char *uid);

/*
 * GPUQuota objects (kind "GPUQuota", through inv_upsert, inv_delete and the
 * inv_dra_* relists): a copy of the namespace's when it has exactly one, with
 * *count how many it has (gpuquota.h, gq_store_get); every one kept.
 */
json_t *inv_quota(struct inventory *inv, const char *ns, size_t *count);
size_t inv_quota_count(struct inventory *inv, const char *ns);
json_t *inv_quotas(struct inventory *inv);

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

/*
 * How many times a DeviceClass was added, changed (its spec) or removed: the
 * charges of claims and pods read their classes, so a change calls for
 * charging every object again (the informers' generation).
 */
uint64_t inv_class_changes(struct inventory *inv);

/*
 * A number that moves whenever a DRA object is added, changed or removed,
 * or a charge asks the API server for one the inventory lacks: two charges
 * of the same pod read the same DRA objects while it stays the same.
 */
uint64_t inv_dra_version(struct inventory *inv);

void inv_set_ready(struct inventory *inv, bool ready);
bool inv_ready(struct inventory *inv);

/* The controller ownerReference of obj's metadata (the first with controller: true and a kind
 * and a name, neither empty, as the informer's reader takes it: infscan.c), or NULL. */
const json_t *inv_controller_ref(const json_t *obj);
/* "<kind>/<name>" of it, malloc'ed: "" when obj has none, NULL when out of memory. */
char *inv_controller(const json_t *obj);

/*
 * Call fn for every pod with a controller owner, with its namespace, name
 * and "<kind>/<name>" of the controller (under the lock: fn must be quick
 * and must not call back into the inventory).
 */
void inv_each_owner(struct inventory *inv,
                    void (*fn)(void *ctx, const char *ns, const char *pod, const char *owner),
                    void *ctx);

/*
 * Read and check the cluster snapshot in file path (`kubectl get pods,
 * resourceclaims,resourceclaimtemplates,deviceclasses,resourceslices,gpuquotas -A -o json`, at most
 * MF_MAX_CLUSTER_STATE bytes, see mf_cluster_state): *state (a new
 * reference) keeps its pods, claims and templates, counts its items per
 * kind.  Errors name the file and what is wrong.  The one reader of
 * snapshots: callers that need a charger set first use it, then inv_replace.
 */
enum gg_status inv_read_snapshot(const char *path, json_t **state, size_t counts[MF_STATE_N],
                                 struct gg_err *err);
/* inv_read_snapshot, then its objects are inv's and inv is ready; inv is unchanged on failure. */
enum gg_status inv_load_snapshot(struct inventory *inv, const char *path, struct gg_err *err);

#endif
