/*
 * dryrun.h - one object through gpuguard's mutating and then validating webhook, as the API
 * server would call them, for `gpuguard check`, `gpuguard test` and the webhook's workload
 * templates (workloads.c).
 *
 * It builds the AdmissionReview the API server would send and goes through
 * the server's decode (adm_decode_value) and engine (engine_evaluate), so
 * the CLI decides exactly as the server does.  It reads the verdict itself
 * instead of encoding a response (adm_encode): the CLI reports what the
 * response does not carry (the policies that fired, the mutated object).
 *
 * No I/O beyond what the engine does (it may log policy failures).
 */
#ifndef GG_DRYRUN_H
#define GG_DRYRUN_H

#include "codec/keys.h"
#include "util/gpuguard.h"
#include "engine/policy.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define DR_DEFAULT_USER "gpuguard-check"
/* The user of a background review (o.background): who created a stored object is not known. */
#define DR_BACKGROUND_USER "gpuguard-audit"

/* What the API server fills in around the object.  Zero means the default. */
struct dr_options {
    const char *namespace;    /* when the pod has none; "default" when NULL or "" */
    const char *operation;    /* CREATE (default), UPDATE, DELETE or CONNECT */
    const char *user;         /* userInfo.username; DR_DEFAULT_USER when NULL */
    const json_t *groups;     /* userInfo.groups; ["system:authenticated"] when NULL */
    const char *sub_resource; /* subResource ("ephemeralcontainers"); none when NULL or "" */
    const json_t *old_object; /* UPDATE: the object before (the pod itself when NULL) */
    int64_t timeout_ms;       /* the webhook timeout the API server sends; 10 s when 0 */
    int64_t deadline_us;      /* CLOCK_MONOTONIC time to answer by; now + timeout_ms when 0 */
    /* The object is the Pod built from a workload's pod template at this path
     * ("spec.template"): policies see it as req.template.  NULL for a Pod. */
    const char *template_path;
    /* The review says dryRun: an admitted pod is not reserved in the inventory.  The
     * webhook's workload templates: their pods are charged when they are created. */
    bool dry_run;
    /* The object is one the API server stores, audited (engine/audit.h): req.background, and
     * a dry run.  Its own charge is not counted in the usage its quota is checked against. */
    bool background;
};

struct dr_result {
    bool allowed;
    char *message;         /* the denial, NULL when allowed */
    const char *denied_by; /* "mutate" or "validate"; NULL when allowed */
    char namespace[256];   /* the request's namespace */
    json_t *patch;         /* the mutating call's patch on the pod; [] when none */
    json_t *mutated;       /* the pod with the patch applied (NULL on DELETE and CONNECT) */
    json_t *warnings;      /* both calls' warnings, in order */
    json_t *audit;         /* both calls' audit annotations */
    json_t *fired;         /* policies that denied, warned or changed something, once each */
    unsigned errors;       /* policy calls of both that raised or broke a budget */
    char *decision;        /* the mutated pod's gpuguard.io/decision annotation, or NULL */
};

/*
 * Put pod through the mutating call, then (unless it was denied there) the
 * validating call with the patched pod.  Policy denials and failures are
 * results; an error here means the engine could not run or the patch did
 * not apply.  *out is written only on success.
 */
enum gg_status dr_evaluate(struct engine *e, const json_t *pod, const struct dr_options *o,
                           struct dr_result *out, struct gg_err *err);
void dr_result_clear(struct dr_result *r);

/*
 * Only the mutating call, for idempotence checks: *patch (a new array) is
 * its patch; *denial (malloc'ed, may be NULL) the denial if it denied.
 */
enum gg_status dr_mutate(struct engine *e, const json_t *pod, const struct dr_options *o,
                         json_t **patch, char **denial, struct gg_err *err);

/*
 * Only the validating call, on obj as it is, with PHASE_OUTCOMES: what each policy that ran
 * made of it (the audit, engine/audit.h).  *out as engine_evaluate fills it.
 */
enum gg_status dr_validate(struct engine *e, const json_t *obj, const struct dr_options *o,
                           struct policy_verdict *out, struct gg_err *err);

/* Append to the array into the names of names it does not hold yet. */
void dr_add_fired(json_t *into, const json_t *names);

#endif
