/*
 * workloads.h - a workload (a Deployment, a Job, an operator's custom
 * resource: every kind manifest.h finds pod templates in) through the pod
 * policies: each template becomes the Pod its controller would create
 * (manifest.c), goes through both webhooks (dryrun.c), and the patch on
 * that Pod is mapped back onto the template.  `gpuguard check` and the
 * server's /mutate and /validate both go through wl_template, so a
 * workload gets the same answer from either.
 */
#ifndef GG_WORKLOADS_H
#define GG_WORKLOADS_H

#include "codec/keys.h"
#include "codec/admission.h"
#include "engine/dryrun.h"
#include "util/gpuguard.h"
#include "codec/manifest.h"
#include "engine/policy.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define WL_MAX_TEMPLATES 64 /* pod templates in one workload under review */
/* queues.<key>: users whose UPDATEs of workloads are allowed unreviewed (Kueue's controller) */
#define WL_CONTROLLER_ACCOUNTS_KEY "controller_accounts"
#define WL_MAX_PODS 1000000 /* a bound on the pods counted for one template */
#define WL_CHARGE_TEXT 512  /* the per-template part of the charge's audit annotation */
#define WL_CHARGE_AUDIT_KEY "workload-charge"

/* One template through the policies. */
struct wl_result {
    struct dr_result pod; /* the Pod's answer: allowed, message, warnings, patch on the Pod */
    json_t *mapped;       /* that patch on the document (RFC 6902); [] when denied or none */
    json_t *dropped;      /* ops on the Pod with no place in the template; [] when none */
};

/*
 * Put e's Pod through the webhooks as dr_evaluate does and map an allowed
 * Pod's patch onto doc (the document e was collected from, as it is now).
 * The policies see the Pod of a workload's template with req.template, the
 * template's path (wl_options); a Pod document's without.
 */
enum gg_status wl_template(struct engine *engine, const struct mf_entry *e, const json_t *doc,
                           const struct dr_options *o, struct wl_result *out, struct gg_err *err);
void wl_result_clear(struct wl_result *r);

/* o for e's Pod: with template_path set to e's path when e is a workload's template. */
struct dr_options wl_options(const struct mf_entry *e, const struct dr_options *o);

/*
 * The object itself (not its templates) through both webhooks, for the
 * policies that match its kind, queue routing above all: dr_evaluate.
 */
enum gg_status wl_object(struct engine *engine, const json_t *obj, const struct dr_options *o,
                         struct dr_result *out, struct gg_err *err);

/*
 * What check and test report for one of a workload's templates: its Pod's
 * result with the workload's own (wl_object; NULL: a Pod document, nothing)
 * folded in: denied if either was (the Pod's message first, else the
 * object's, denied_by "object"), the object's warnings before the Pod's,
 * both calls' policy errors.
 */
void wl_fold(struct dr_result *pod, const struct dr_result *object);

/*
 * A walk of a manifest's entries in order (check, test): the workload's own
 * result, evaluated (wl_object, with o) at the workload's first template and
 * kept for its others.
 */
struct wl_walk {
    struct dr_result object;
    bool have;
};
/*
 * At entry i of set (a template; doc: its document): make w's object the
 * workload's own result; with apply, its allowed patch goes onto the
 * workload in doc (--emit-mutated).
 */
enum gg_status wl_walk_at(struct wl_walk *w, struct engine *engine, const struct mf_set *set,
                          size_t i, json_t *doc, const struct dr_options *o, bool apply,
                          struct gg_err *err);
/* The workload's own result at the walk's entry; NULL for a Pod document. */
const struct dr_result *wl_walk_object(const struct wl_walk *w);
void wl_walk_clear(struct wl_walk *w);

/*
 * How many pods obj asks for from the template at template_ptr: the
 * replicas and parallelism of every object on the way to it (a Deployment's
 * replicas, a JobSet's replicated job's replicas times its Job's
 * parallelism, a Kubeflow role's or Ray group's replicas), times size - 1
 * for a LeaderWorkerSet's workers; 1 when nothing says.  A DaemonSet counts
 * one (per node).  At most WL_MAX_PODS.
 */
long long wl_pod_count(const json_t *obj, const char *template_ptr);

/* The charge the policies wrote on a mutated pod (gpuguard.io/charge, milli-GPU), or 0. */
long long wl_pod_charge(const json_t *pod);

/* The queue obj names (Kueue's or KAI's label), or NULL. */
const char *wl_queue(const json_t *obj);

/*
 * Answer a review of a workload at endpoint: *handled is false (and *out
 * untouched) when the request is not for an object with pod templates
 * (Pods included), which the caller evaluates as it is.  Otherwise *out is
 * the workload's verdict:
 *   - UPDATE that leaves every template as it was, or by one of
 *     queues.controller_accounts: allowed, nothing run;
 *   - the object through wl_object, then each template of the object as
 *     that left it through wl_template;
 *   - any template denied: denied, each denial prefixed by its template's
 *     path ("spec.template: gpu-sharing: ...");
 *   - else allowed, with the object's patch and the templates' patches
 *     mapped onto the object on the mutating endpoint, unless
 *     workloads.mode is validate: then no patch and one warning per change.
 * Warnings are the templates', prefixed by their path.  The workload's
 * charge (each template's gpuguard.io/charge times wl_pod_count) is the
 * audit annotation WL_CHARGE_AUDIT_KEY: "2.286 GPU-equivalents:
 * spec.template 1.143 x 2".
 */
enum gg_status wl_review(struct engine *engine, const struct adm_request *req,
                         enum adm_endpoint endpoint, int64_t deadline_us, bool *handled,
                         struct policy_verdict *out, struct gg_err *err);

#endif
