/*
 * charger.h - the inventory's charges from the Lua library's own model.
 *
 * A pod's GPU charge is defined once, in lua/intent.lua (intent.usage_charge,
 * which admission's intent.charge also is): a charger runs it in a Lua VM of
 * its own, built from the engine's live library and configuration and
 * rebuilt when a reload changes them, so the usage the inventory sums and
 * the charge admission checks are the same numbers.  One VM, one lock:
 * charger_charge may be called from any thread.
 */
#ifndef GG_CHARGER_H
#define GG_CHARGER_H

#include "util/gpuguard.h"
#include "kube/infscan.h"
#include "util/jsonfast.h"

#include <jansson.h>
#include <stdint.h>

struct engine;
struct inventory;
struct charger;

/*
 * A charger on the engine's live policy set, reading DRA objects from inv
 * (gpuguard.dra), and set as inv's charger.  The engine and the inventory
 * must outlive it.
 */
enum gg_status charger_new(struct engine *engine, struct inventory *inv, struct charger **out,
                           struct gg_err *err);
/* Also unsets it as its inventory's charger. */
void charger_free(struct charger *c);

/*
 * milli-GPU held by a pod as the informer reads one (pod: charged from its
 * charge spec), or by obj: a ResourceClaim, or a pod the informer's reader
 * refuses, charged by the model as it is; one of pod and obj is NULL.  A
 * failure of the model itself (out of memory, a broken library) is logged
 * and counted as the pod's containers' whole GPUs would be: one GPU per
 * container that names a GPU resource, at least one (fail closed).
 */
int64_t charger_charge(void *charger, const struct inf_pod *pod, const struct jf_node *obj);

/* How the charges were answered (chargememo.h): for the benchmark, the tests and the logs. */
struct charger_stats {
    uint64_t evaluated;  /* by the model */
    uint64_t remembered; /* from the memo */
    size_t remembering;  /* keys held now */
};
struct charger_stats charger_stats(struct charger *c);

#endif
