/*
 * bench_engine.c - the in-process engine benchmark: one AdmissionReview
 * evaluated N times with a policy set, time split by stage.
 *
 *   bench_engine --policies DIR --lua DIR [--config FILE] [-n N] [--grace-us N]
 *                [--phases mutate|validate|both] [--cluster-state FILE] REVIEW.json
 *
 * Prints microseconds per review for decode, JSON->Lua, mutate, diff,
 * validate and encode, and their total (one thread, one VM, warm), then the
 * last review's verdict.  JSON->Lua is the request's set-up only: the object
 * is converted lazily, table by table as policies read it, so that cost is
 * part of mutate and validate (see "The object in Lua" in policies/README.md).
 *
 * A review is handled as http/review.c handles it: a workload (an object with
 * pod templates: a Deployment, a PyTorchJob) goes through wl_review, its
 * templates' pods through both phases (their time is the "workload" stage; the
 * mutating endpoint's path unless --phases validate), anything else through
 * engine_evaluate.  --cluster-state loads a cluster's objects (pods, claims,
 * ResourceClaimTemplates, ... as `gpuguard check --cluster-state` reads them,
 * eo_load_snapshot) into the inventory the policies read, and runs each
 * review as a dry run (it reserves nothing; the policies see req.dry_run);
 * without it the engine has no inventory.
 *
 * --grace-us sets the run time before the instruction-count hook is set
 * (the server's by default).  Under callgrind a review runs ~50x slower:
 * raise it there, or the count includes a hook that native runs never set.
 *
 * Built with GG_LUA_PROFILE and profile/lua_profile.c (bench_engine_profile,
 * `make lua-profile`), it also counts the Lua VM instructions of the timed
 * reviews per policy function and line, and prints them after the times
 * (which the profiler's hook makes meaningless).
 */
#include "cli/engine_opts.h"
#include "codec/admission.h"
#include "util/clock.h"
#include "util/arena.h"
#include "engine/charger.h"
#include "engine/luabridge.h"
#include "engine/policy.h"
#include "engine/workloads.h"
#include "kube/inventory.h"
#ifdef GG_LUA_PROFILE
#include "profile/lua_profile.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { DECODE, TO_LUA, MUTATE, DIFF, VALIDATE, WORKLOAD, ENCODE, STAGES };
static const char *const stage_names[STAGES] = {"decode",   "json->lua", "mutate", "diff",
                                                "validate", "workload",  "encode"};

static long n_reviews = 20000;
static unsigned phases = PHASE_MUTATE | PHASE_VALIDATE;
static const char *cluster_state; /* --cluster-state FILE, or NULL */

/* The last review's answer, printed after the times: what path the review took. */
static struct {
    bool allowed;
    size_t patch_ops, warnings;
} last;

/* One review through every stage, as http/review.c runs it; adds the time of each to sum. */
static int run_once(struct engine *e, const char *text, size_t len, int64_t sum[STAGES])
{
    struct gg_err err = {{0}};
    struct adm_request req;
    arena_begin();
    int64_t t0 = gg_now_ns();
    if (adm_decode(text, len, &req, &err) != GG_OK) {
        fprintf(stderr, "%s\n", err.msg);
        arena_end();
        return -1;
    }
    /* With an inventory, a dry run: each review finds it as the first did.  Otherwise each
     * would leave its reservation (inventory.h: until the watch shows the pod) for the next to
     * count, the usage growing with every review until the quota denies them. */
    req.dry_run = req.dry_run || cluster_state != NULL;
    int64_t t1 = gg_now_ns();
    struct policy_verdict v;
    bool workload = false;
    int64_t deadline_us = gg_now_ns() / 1000 + 10000000;
    enum adm_endpoint endpoint = phases == PHASE_VALIDATE ? ADM_VALIDATING : ADM_MUTATING;
    if (wl_review(e, &req, endpoint, deadline_us, &workload, &v, &err) != GG_OK ||
        (!workload && engine_evaluate(e, &req, phases, deadline_us, &v, &err) != GG_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        adm_request_clear(&req);
        arena_end();
        return -1;
    }
    int64_t t2 = gg_now_ns();
    struct adm_verdict answer = {.allowed = v.allowed,
                                 .message = v.message,
                                 .patch = v.patch,
                                 .warnings = v.warnings,
                                 .audit = v.audit};
    char *out = NULL;
    size_t out_len;
    adm_encode(&req, &answer, ADM_MUTATING, &out, &out_len, &err);
    int64_t t3 = gg_now_ns();
    sum[DECODE] += t1 - t0;
    if (workload) {
        sum[WORKLOAD] += t2 - t1;
    } else {
        sum[TO_LUA] += v.timing.to_lua;
        sum[MUTATE] += v.timing.mutate;
        sum[DIFF] += v.timing.diff;
        sum[VALIDATE] += v.timing.validate;
    }
    sum[ENCODE] += t3 - t2;
    last.allowed = v.allowed;
    last.patch_ops = json_array_size(v.patch);
    last.warnings = json_array_size(v.warnings);
    free(out);
    policy_verdict_clear(&v);
    adm_request_clear(&req); /* as http/review.c does */
    arena_end();
    return 0;
}

static const struct option long_options[] = {{"grace-us", required_argument, NULL, 256},
                                             {"phases", required_argument, NULL, 257},
                                             {"cluster-state", required_argument, NULL, 258},
                                             {NULL, 0, NULL, 0}};

static int take_flag(void *ctx, int opt, const char *arg)
{
    (void)ctx;
    if (opt == 'n') {
        n_reviews = strtol(arg, NULL, 10);
    } else if (opt == 256) {
        lb_set_grace_us(strtoll(arg, NULL, 10));
    } else if (opt == 258) {
        cluster_state = arg;
    } else if (strcmp(arg, "mutate") == 0) {
        phases = PHASE_MUTATE; /* what the server's /mutate runs */
    } else if (strcmp(arg, "validate") == 0) {
        phases = PHASE_VALIDATE;
    } else if (strcmp(arg, "both") == 0) {
        phases = PHASE_MUTATE | PHASE_VALIDATE;
    } else {
        fprintf(stderr, "bench_engine: --phases must be mutate, validate or both, not %s\n", arg);
        return -1;
    }
    return 0;
}

static const struct eo_command tool_command = {
    .name = "bench_engine",
    .shared = EO_ENGINE,
    .log_level = LOG_INFO,
    .options = long_options,
    .short_options = "n:",
    .take = take_flag,
    .usage = "bench_engine [flags] REVIEW.json",
    .own_flags =
        "  -n N                   reviews to time [20000]\n"
        "  --grace-us N           run time before the instruction-count hook [the server's]\n"
        "  --phases P             mutate (as /mutate), validate (as /validate) or both [both]\n"
        "  --cluster-state FILE   the cluster's objects for the inventory, as gpuguard check\n"
        "                         --cluster-state reads them [none: no inventory]\n",
    .missing_args = "no REVIEW.json given",
};

int main(int argc, char **argv)
{
    struct engine_opts eo;
    int rc = 2;
    arena_install();
    if (!eo_parse(&tool_command, NULL, argc, argv, &eo, &rc))
        return rc;
    const char *review = eo.args[0];
    long n = n_reviews;
    struct gg_err err = {{0}};
    struct engine *e = NULL;
    struct inventory *inv = NULL;
    struct charger *charger = NULL;
    size_t counts[MF_STATE_N];
    char *text = NULL;
    size_t len = 0;
    if (n < 1 || eo_engine_new(&eo, &e, &err) != GG_OK ||
        (cluster_state &&
         (!(inv = inv_new())
              ? gg_fail(&err, GG_ERR_NOMEM, "out of memory") != GG_OK
              : eo_load_snapshot(e, inv, cluster_state, counts, &charger, NULL, &err) != GG_OK)) ||
        gg_read_file(review, 64 << 20, &text, &len, &err) != GG_OK) {
        fprintf(stderr, "bench_engine: %s\n", n < 1 ? "-n must be at least 1" : err.msg);
        charger_free(charger);
        engine_free(e);
        inv_free(inv);
        return 2;
    }
    if (inv)
        engine_set_inventory(e, inv);
    int64_t sum[STAGES] = {0}, warm[STAGES] = {0};
    for (int i = 0; i < 200; i++)
        if (run_once(e, text, len, warm))
            return 1;
#ifdef GG_LUA_PROFILE
    lua_profile_start();
#endif
    int64_t start = gg_now_ns();
    for (long i = 0; i < n; i++)
        if (run_once(e, text, len, sum))
            return 1;
    double wall_us = (gg_now_ns() - start) / 1e3 / (double)n;
    struct policy_set *set = engine_live_set(e);
    printf("engine: %ld reviews of %zu bytes, %zu policies\n", n, len, policy_set_count(set));
    policy_set_release(set);
    double total = 0;
    for (int s = 0; s < STAGES; s++) {
        double us = sum[s] / 1e3 / (double)n;
        total += us;
        printf("  %-10s %8.2f us\n", stage_names[s], us);
    }
    printf("  %-10s %8.2f us (wall clock per review %.2f us)\n", "total", total, wall_us);
    printf("verdict: %s, %zu patch ops, %zu warnings\n",
           !last.allowed    ? "denied"
           : last.patch_ops ? "patched"
                            : "allowed",
           last.patch_ops, last.warnings);
#ifdef GG_LUA_PROFILE
    lua_profile_report(stdout, n);
#endif
    free(text);
    charger_free(charger);
    engine_free(e);
    inv_free(inv);
    return 0;
}
