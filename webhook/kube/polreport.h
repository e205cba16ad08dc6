/*
 * polreport.h - the policy reports the audit writes (docs/audit.md): wgpolicyk8s.io/v1alpha2
 * PolicyReport and ClusterPolicyReport, or openreports.io/v1alpha1 Report and ClusterReport,
 * as Kyverno, Kubewarden and Policy Reporter read them.
 *
 * One report per audited resource, named gpuguard-<its uid>, in its namespace, owned by it
 * (an ownerReference: the garbage collector deletes it with the resource), with scope the
 * resource; one cluster-scoped report, gpuguard-cluster, for what belongs to no resource.
 * Every report carries the label app.kubernetes.io/managed-by=gpuguard, and gpuguard touches
 * no report without it.  A report is written only when its results changed (compared without
 * their timestamps): a result keeps the timestamp of the audit that first wrote it as it is.
 *
 * Bounds: PR_MAX_RESULTS results a report (failures and errors first; past it, the last is a
 * skip that says how many were left out), PR_MESSAGE_MAX bytes a message: a report stays far
 * below etcd's 1.5 MiB.  Requests are bounded in time (PR_TIMEOUT_MS) and answers in size.
 *
 * RBAC: get, list, create, update and delete on the report kinds of the API in use.
 */
#ifndef GG_POLREPORT_H
#define GG_POLREPORT_H

#include "kube/kubeclient.h"
#include "util/gpuguard.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define PR_MAX_RESULTS 200
#define PR_MESSAGE_MAX 2048
#define PR_TIMEOUT_MS 10000
#define PR_NAME_PREFIX "gpuguard-"
#define PR_CLUSTER_NAME "gpuguard-cluster"
#define PR_MANAGED_BY_LABEL "app.kubernetes.io/managed-by"
#define PR_SOURCE "gpuguard"

enum pr_api { PR_WGPOLICY, PR_OPENREPORTS, PR_N_APIS };

/* "wgpolicyk8s.io/v1alpha2" or "openreports.io/v1alpha1"; false for anything else. */
bool pr_api_parse(const char *s, enum pr_api *out);
const char *pr_api_version(enum pr_api api);

/* An audited resource; ns NULL or "" for a cluster-scoped one; uid NULL only in a result's
 * reference (a report's resource has one). */
struct pr_resource {
    const char *api_version, *kind, *ns, *name, *uid;
};

/* One result.  category, severity NULL: none; res NULL: the report's scope. */
struct pr_finding {
    const char *policy, *rule, *result, *message, *severity, *category;
    bool scored;
    json_t *properties; /* object of strings, or NULL; borrowed */
};
json_t *pr_result(const struct pr_finding *f, const struct pr_resource *res, int64_t now_s);

/*
 * The report of res (NULL: the cluster's), its results taken over (in the order fail, error,
 * warn, the rest; cut at PR_MAX_RESULTS) and counted in its summary.  NULL when out of memory.
 */
json_t *pr_report(enum pr_api api, const struct pr_resource *res, json_t *results);

/* What the API holds of gpuguard's reports. */
struct pr_existing {
    json_t *reports; /* "ns/name" ("/name" cluster-scoped) -> [digest of the results, kept] */
    bool unserved;   /* the list found no such API (404): its CRDs are not installed */
};

/* Whether to go on: asked before each request (the audit's replica still leads). */
typedef bool (*pr_go_on_fn)(void *ctx);

/*
 * List gpuguard's reports of api (paged, every namespace, and the cluster's).  An API the
 * cluster does not serve (404) lists none.
 */
enum gg_status pr_list(struct kc_client *c, enum pr_api api, struct pr_existing *out,
                       struct gg_err *err);

/*
 * Create report, or replace the one ex lists when its results differ (a 409: read again and
 * replace once more); nothing when they are the same.  The key is marked kept first, so that a
 * write that fails leaves the report there is.  *wrote says whether a request changed it.  A
 * namespace gone or going (404, 403 NamespaceTerminating on create) is no error.  Not for an
 * API ex found unserved: its caller says so once instead of writing.  go_on false: stopped,
 * GG_ERR_INVALID.
 */
enum gg_status pr_write(struct kc_client *c, enum pr_api api, struct pr_existing *ex,
                        json_t *report, pr_go_on_fn go_on, void *ctx, bool *wrote,
                        struct gg_err *err);

/* Delete the reports ex lists and no pr_write kept; *deleted counts them.  go_on as above. */
enum gg_status pr_sweep(struct kc_client *c, enum pr_api api, struct pr_existing *ex,
                        pr_go_on_fn go_on, void *ctx, size_t *deleted, struct gg_err *err);
void pr_existing_clear(struct pr_existing *ex);

/* The digest pr_write compares: SHA-256 of the results without their timestamps, in hex. */
bool pr_digest(const json_t *results, char out[65]);

#endif
