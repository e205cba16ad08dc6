/*
 * engine_tool.c - evaluate one AdmissionReview with the policy engine, for
 * the Python tests: prints the verdict as JSON.
 *
 *   engine_tool --policies DIR --lua DIR [--config FILE] [--phases mutate|validate|both]
 *               [--cluster-state PODS.json] [--repeat N] REVIEW.json
 *
 * --repeat evaluates the same review N times on one engine (VM reuse).
 * Exit 0 with the verdict, 1 when the engine cannot load or the review
 * cannot be decoded (message on stderr).
 */
#include "codec/admission.h"
#include "util/clock.h"
#include "kube/inventory.h"
#include "engine/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


int main(int argc, char **argv)
{
    struct policy_paths paths = {.policies = "policies", .lua = "lua"};
    unsigned phases = PHASE_MUTATE | PHASE_VALIDATE | PHASE_KEEP_MUTATED;
    const char *review = NULL, *cluster_state = NULL;
    long repeat = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--policies") == 0 && i + 1 < argc)
            paths.policies = argv[++i];
        else if (strcmp(argv[i], "--lua") == 0 && i + 1 < argc)
            paths.lua = argv[++i];
        else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            paths.config = argv[++i];
        else if (strcmp(argv[i], "--cluster-state") == 0 && i + 1 < argc)
            cluster_state = argv[++i];
        else if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc)
            repeat = strtol(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--phases") == 0 && i + 1 < argc) {
            const char *p = argv[++i];
            phases =
                PHASE_KEEP_MUTATED | (strcmp(p, "mutate") == 0     ? PHASE_MUTATE
                                      : strcmp(p, "validate") == 0 ? PHASE_VALIDATE
                                                                   : PHASE_MUTATE | PHASE_VALIDATE);
        } else
            review = argv[i];
    }
    if (!review) {
        fprintf(stderr, "usage: engine_tool --policies DIR --lua DIR [--config FILE] "
                        "[--phases mutate|validate|both] [--repeat N] REVIEW.json\n");
        return 2;
    }
    struct gg_err err = {{0}};
    struct engine *engine = NULL;
    char *text = NULL;
    size_t len = 0;
    struct adm_request req;
    struct inventory *inv = inv_new();
    if ((cluster_state && inv_load_snapshot(inv, cluster_state, &err) != GG_OK) ||
        engine_new(&paths, &engine, &err) != GG_OK ||
        gg_read_file(review, 64 << 20, &text, &len, &err) != GG_OK ||
        adm_decode(text, len, &req, &err) != GG_OK) {
        fprintf(stderr, "%s\n", err.msg);
        engine_free(engine);
        inv_free(inv);
        free(text);
        return 1;
    }
    if (cluster_state)
        engine_set_inventory(engine, inv);
    int rc = 0;
    for (long n = 0; n < repeat; n++) {
        struct policy_verdict v;
        if (engine_evaluate(engine, &req, phases, gg_now_us() + 10000000, &v, &err) != GG_OK) {
            fprintf(stderr, "%s\n", err.msg);
            rc = 1;
            break;
        }
        if (n == repeat - 1) {
            json_t *out = json_pack("{s:b,s:s?,s:O?,s:O?,s:O,s:O,s:O}", "allowed", v.allowed,
                                    "message", v.message, "patch", v.patch, "mutated", v.mutated,
                                    "warnings", v.warnings, "audit", v.audit, "fired", v.fired);
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
    engine_free(engine);
    inv_free(inv);
    return rc;
}
