/*
 * engine_tool.c - evaluate one AdmissionReview with the policy engine, for
 * the Python tests: prints the verdict as JSON.
 *
 *   engine_tool --policies DIR --lua DIR [--config FILE] [--phases mutate|validate|both|audit]
 *               [--cluster-state PODS.json] [--repeat N] REVIEW.json
 *
 * --repeat evaluates the same review N times on one engine (VM reuse).  --phases audit
 * evaluates the review's object as the audit does (validate, req.background, each policy's
 * outcome under "outcomes").
 * Exit 0 with the verdict, 1 when the engine cannot load or the review
 * cannot be decoded (message on stderr).
 */
#include "cli/engine_opts.h"
#include "codec/admission.h"
#include "util/clock.h"
#include "kube/inventory.h"
#include "engine/charger.h"
#include "engine/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct tool_opts {
    unsigned phases;
    bool background;
    const char *cluster_state;
    long repeat;
};

enum { OPT_PHASES = 256, OPT_CLUSTER_STATE, OPT_REPEAT };

static const struct option long_options[] = {
    {"phases", required_argument, NULL, OPT_PHASES},
    {"cluster-state", required_argument, NULL, OPT_CLUSTER_STATE},
    {"repeat", required_argument, NULL, OPT_REPEAT},
    {NULL, 0, NULL, 0},
};

static int take_flag(void *ctx, int opt, const char *arg)
{
    struct tool_opts *t = ctx;
    if (opt == OPT_CLUSTER_STATE)
        t->cluster_state = arg;
    else if (opt == OPT_REPEAT)
        t->repeat = strtol(arg, NULL, 10);
    else if (strcmp(arg, "audit") == 0) {
        t->phases = PHASE_VALIDATE | PHASE_OUTCOMES;
        t->background = true;
    } else /* OPT_PHASES */
        t->phases =
            PHASE_KEEP_MUTATED | (strcmp(arg, "mutate") == 0     ? PHASE_MUTATE
                                  : strcmp(arg, "validate") == 0 ? PHASE_VALIDATE
                                                                 : PHASE_MUTATE | PHASE_VALIDATE);
    return 0;
}

static const struct eo_command tool_command = {
    .name = "engine_tool",
    .shared = EO_ENGINE,
    .log_level = LOG_INFO,
    .options = long_options,
    .take = take_flag,
    .usage = "engine_tool [flags] REVIEW.json",
    .own_flags = "  --phases PHASES        mutate, validate, both or audit [both]\n"
                 "  --cluster-state FILE   pods in use, for gpuguard.usage() [none]\n"
                 "  --repeat N             evaluations on one engine [1]\n",
    .missing_args = "no REVIEW.json given",
};

int main(int argc, char **argv)
{
    struct engine_opts eo;
    struct tool_opts t = {.phases = PHASE_MUTATE | PHASE_VALIDATE | PHASE_KEEP_MUTATED,
                          .repeat = 1};
    int rc = 2;
    if (!eo_parse(&tool_command, &t, argc, argv, &eo, &rc))
        return rc;
    const char *review = eo.args[0], *cluster_state = t.cluster_state;
    unsigned phases = t.phases;
    long repeat = t.repeat;
    struct gg_err err = {{0}};
    struct engine *engine = NULL;
    char *text = NULL;
    size_t len = 0;
    struct adm_request req;
    struct inventory *inv = inv_new();
    struct charger *charger = NULL;
    size_t counts[MF_STATE_N];
    if (eo_engine_new(&eo, &engine, &err) != GG_OK ||
        (cluster_state &&
         eo_load_snapshot(engine, inv, cluster_state, counts, &charger, NULL, &err) != GG_OK) ||
        gg_read_file(review, 64 << 20, &text, &len, &err) != GG_OK ||
        adm_decode(text, len, &req, &err) != GG_OK) {
        fprintf(stderr, "%s\n", err.msg);
        charger_free(charger);
        engine_free(engine);
        inv_free(inv);
        free(text);
        return 1;
    }
    if (cluster_state)
        engine_set_inventory(engine, inv);
    req.background = t.background;
    req.dry_run = req.dry_run || t.background;
    rc = 0;
    for (long n = 0; n < repeat; n++) {
        struct policy_verdict v;
        if (engine_evaluate(engine, &req, phases, gg_now_us() + 10000000, &v, &err) != GG_OK) {
            fprintf(stderr, "%s\n", err.msg);
            rc = 1;
            break;
        }
        if (n == repeat - 1) {
            json_t *out =
                json_pack("{s:b,s:s?,s:O?,s:O?,s:O,s:O,s:O,s:O?}", "allowed", v.allowed, "message",
                          v.message, "patch", v.patch, "mutated", v.mutated, "warnings", v.warnings,
                          "audit", v.audit, "fired", v.fired, "outcomes", v.outcomes);
            if (!v.message)
                json_object_del(out, "message");
            char *dump = NULL;
            size_t dump_len;
            gg_json_dump(out, JSON_COMPACT | JSON_SORT_KEYS, &dump, &dump_len);
            printf("%s\n", dump);
            free(dump);
            json_decref(out);
        }
        policy_verdict_clear(&v);
    }
    adm_request_clear(&req);
    free(text);
    charger_free(charger);
    engine_free(engine);
    inv_free(inv);
    return rc;
}
