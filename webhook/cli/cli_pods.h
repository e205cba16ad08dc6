/*
 * cli_pods.h - how many of a workload's pods `gpuguard check` admits.
 *
 * The API server admits a Deployment of 6 replicas and then each of its
 * pods one by one, so a quota that holds 3 of them admits 3 and denies the
 * rest.  check says the same: after a template's first pod is admitted
 * (and charged in the inventory, as every admitted pod is), the pods after
 * it are judged as if those before them were running, by reserving their
 * charge and putting the pod through the policies again as a dry run; a
 * binary search finds the last one admitted in O(log pods) evaluations.
 * The admitted pods stay charged, for the documents after the workload.
 */
#ifndef GG_CLI_PODS_H
#define GG_CLI_PODS_H

#include "codec/manifest.h"
#include "engine/dryrun.h"
#include "engine/policy.h"
#include "util/gpuguard.h"

#include <jansson.h>

struct inventory;

struct pods_fit {
    long long pods;     /* the pods the workload asks for from the template (wl_pod_count) */
    long long admitted; /* of them, those admitted one after another */
    long long charge;   /* milli-GPU-equivalents of one pod; 0 when it holds no GPU */
    char *denial;       /* why the first pod not admitted is denied; NULL when all are */
};

/*
 * Count e's pods: first is the answer to its first pod (dr_evaluate's,
 * through wl_template, with the options o), which is charged already.
 * Only an allowed pod with a charge is counted further; any other has
 * admitted = pods (allowed) or 0 (denied).
 */
enum gg_status cli_fit_pods(struct engine *engine, struct inventory *inv, const struct mf_entry *e,
                            const json_t *doc, const struct dr_options *o,
                            const struct dr_result *first, struct pods_fit *out,
                            struct gg_err *err);
void pods_fit_clear(struct pods_fit *f);

#endif
