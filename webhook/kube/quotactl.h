/*
 * quotactl.h - the quota controller: keeps each GPUQuota's ledger true
 * (docs/inventory.md, "Exact quotas with any number of replicas").
 *
 * One replica at a time works (leader election on a Lease, lease.h); every
 * period it recounts each GPUQuota the watch shows, from the pods this
 * replica's inventory sees:
 *
 *   - an entry whose pod the watch shows (holding GPUs, or deleted or
 *     finished) goes: the pod's charge is now counted from the pod;
 *   - an entry whose pod never appeared goes once it is older than the
 *     bound (another webhook or ResourceQuota refused the pod after
 *     gpuguard admitted it);
 *   - status.used is the pods' charges plus the entries kept, in total and
 *     for each pool spec.hard limits.
 *
 * The write carries the resourceVersion the recount read: an admission
 * that charged in between makes it fail with 409, and the recount is done
 * again on top of it, so a recount never erases a charge in flight.  A pod
 * admitted while gpuguard was not in the path is counted from the pod as
 * any other.  Entries are kept only until their pod is seen, so an object
 * stays small however many pods its namespace runs.
 */
#ifndef GG_QUOTACTL_H
#define GG_QUOTACTL_H

#include "kube/inventory.h"
#include "kube/kubeclient.h"
#include "kube/lease.h"
#include "util/gpuguard.h"

#include <jansson.h>
#include <stdint.h>

#define QC_DEFAULT_PERIOD_MS 2000
#define QC_DEFAULT_ENTRY_BOUND_MS 30000

struct quotactl_options {
    int64_t period_ms;      /* between recounts; 0: QC_DEFAULT_PERIOD_MS */
    int64_t entry_bound_ms; /* an entry whose pod never appeared goes after this; 0: default */
    struct lease *lease;    /* the election it works under (borrowed: stopped after it) */
    /* Whether the configuration also gives namespace ns a quota (quotas.namespaces): the
     * GPUQuota wins, and the controller says so once per namespace.  NULL: never. */
    bool (*configured)(void *ctx, const char *ns);
    void *configured_ctx;
};

struct quotactl;

/*
 * Start the controller's thread: while o->lease leads, it recounts.  client is taken over.
 */
enum gg_status quotactl_start(struct kc_client *client, struct inventory *inv,
                              const struct quotactl_options *o, struct quotactl **out,
                              struct gg_err *err);
/* Stop recounting; free (the lease is the caller's). */
void quotactl_stop(struct quotactl *q);

/*
 * The recount of obj (pure but for reading inv): obj as it should be
 * written, a new reference, or NULL when it is right as it is; *corrections
 * says how many entries went or usages moved other than by their entries.
 * now_us: the wall clock, which entries' admitted times are read against.
 */
json_t *quotactl_recount(const json_t *obj, struct inventory *inv, int64_t now_us,
                         int64_t entry_bound_ms, unsigned *corrections);

#endif
