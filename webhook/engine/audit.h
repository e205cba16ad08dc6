/*
 * audit.h - the background audit (docs/audit.md): what already runs, judged by the validate
 * policies of today, into policy reports (kube/polreport.h), and the GPU its workloads hold
 * against what their history says they need (engine/waste.h) into the rightsizing metrics.
 *
 * One thread, working only while its replica leads (the server's Lease, kube/lease.h) and
 * the inventory has synced; it audits at once on taking the lead, after every policy or
 * configuration reload, and every audit.interval.  An audit:
 *
 *   1. lists gpuguard's reports (to write only what changed and delete what no longer is),
 *      and reads the namespaceSelector of gpuguard's pods webhook: a namespace admission
 *      leaves out, or one being deleted, is left out (one that cannot be read is audited);
 *   2. lists the pods, 100 a page, and takes those the inventory counts as holding GPUs:
 *      each goes through the validate policies as a background review (dr_validate:
 *      req.background, a dry run, the object as stored, its own charge left out of its
 *      quota's usage), and the top-level workload that owns it (ReplicaSet -> Deployment,
 *      Job -> CronJob, an operator's kind) once, its pod templates and itself;
 *   3. reviews the first running pod of each workload, as it comes, for the rightsizing
 *      finding (waste.h);
 *   4. writes one report per pod and per workload (rightsizing results on the workload's,
 *      or on a bare pod's own), the cluster's report (waste per namespace, what could not be
 *      audited), deletes the reports of resources gone, and publishes the figures.
 *
 * Evaluations are spread at audit.rate a second at most, and the audit runs on a thread of
 * its own with its own Lua VM: admission never waits on it.  An audit stops where it is when
 * the replica loses the lead or the server stops; an audit that is not whole (a list or a
 * read failed, the report API is not served) deletes nothing.
 */
#ifndef GG_AUDIT_H
#define GG_AUDIT_H

#include "engine/policy.h"
#include "kube/inventory.h"
#include "kube/kubeclient.h"
#include "kube/lease.h"
#include "util/buf.h"
#include "util/gpuguard.h"

#include <stdint.h>

#define AUDIT_POD_PAGE 100             /* pods a list page asks for */
#define AUDIT_MAX_PAGE_BODY (32 << 20) /* bytes of one page of pods: jansson holds ~6 times it */
#define AUDIT_REQUEST_TIMEOUT_MS 60000 /* one API request */
#define AUDIT_OWNER_DEPTH 4            /* owners followed up from a pod */
#define AUDIT_MAX_ERRORS 20            /* audit errors kept for the cluster's report */

struct audit_options {
    struct kc_client *client; /* taken over */
    struct engine *engine;
    struct inventory *inv;
    struct lease *lease; /* the server's election (borrowed; stopped after the audit) */
    /* The ValidatingWebhookConfiguration whose pods webhook's namespaceSelector scopes the
     * audit to what admission sees; NULL: "gpuguard". */
    const char *webhook_config;
};

struct audit;

enum gg_status audit_start(const struct audit_options *o, struct audit **out, struct gg_err *err);
/* Stop (an audit in progress ends at its next step); free.  NULL is a no-op. */
void audit_stop(struct audit *a);

/* The gpuguard_audit_* metrics in Prometheus text (nothing before the first audit). */
enum gg_status audit_render_metrics(struct buf *out);

#endif
