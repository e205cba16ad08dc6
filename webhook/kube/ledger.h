/*
 * ledger.h - admission's side of exact GPU quotas: a GPU pod in a namespace
 * with a GPUQuota is admitted only once its charge is written into that
 * object's status, with the object's resourceVersion as the precondition
 * (docs/inventory.md, "Exact quotas with any number of replicas").
 *
 * The write is a compare-and-swap on the API server: of two replicas that
 * read the same status, one PUT succeeds and the other gets 409 Conflict,
 * re-reads and charges again on top of the first.  So no two reviews ever
 * spend the same headroom, however many replicas answer them.  The status
 * holds the total in use and an entry per pod admitted but not yet seen
 * by the quota controller (quotactl.h), which keeps it true.
 *
 * Fail closed: a write that cannot be made by the review's deadline
 * (API server unreachable, conflicts all along) denies the pod, saying so.
 * A dry run reads and judges but writes nothing (sideEffects: NoneOnDryRun).
 */
#ifndef GG_LEDGER_H
#define GG_LEDGER_H

#include "kube/inventory.h"
#include "kube/kubeclient.h"
#include "util/gpuguard.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

struct ledger;

/* A ledger writing with client (taken over, also on failure), reading the GPUQuotas inv keeps. */
enum gg_status ledger_new(struct kc_client *client, struct inventory *inv, struct ledger **out,
                          struct gg_err *err);
void ledger_free(struct ledger *l);

enum ledger_verdict {
    LEDGER_NONE,        /* the namespace has no GPUQuota: the configuration's quotas apply */
    LEDGER_ADMITTED,    /* charged (or, on a dry run, it would be) */
    LEDGER_OVER,        /* past the quota: deny, why says by how much */
    LEDGER_UNAVAILABLE, /* the ledger could not be read or written in time: deny (fail closed) */
};

struct ledger_charge {
    const char *ns, *uid, *pod; /* the pod: its uid, and its name for people */
    const char *pool;           /* gpuguard.io/pool; NULL or "": none */
    int64_t charge;             /* milli-GPU, > 0 */
    bool dry_run;
    int64_t deadline_us; /* CLOCK_MONOTONIC: the review's answer is due */
};

/*
 * The GPUQuota obj names, read again (200), into *out; and next (an object
 * with the resourceVersion it was read at) written to its /status, the
 * answer in *written.  *status is the HTTP status (0 when none came: err
 * says why); 409 means someone wrote since.  A request never outlasts
 * deadline_us (CLOCK_MONOTONIC).  The quota controller writes with these too.
 */
enum gg_status ledger_fetch(struct kc_client *client, const json_t *obj, int64_t deadline_us,
                            json_t **out, long *status, struct gg_err *err);
enum gg_status ledger_write(struct kc_client *client, const json_t *next, int64_t deadline_us,
                            json_t **written, long *status, struct gg_err *err);

/* Charge c in its namespace's GPUQuota; why gets the reason of a denial. */
enum ledger_verdict ledger_charge(struct ledger *l, const struct ledger_charge *c, char *why,
                                  size_t size);

#endif
