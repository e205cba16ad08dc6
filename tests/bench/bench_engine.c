/*
 * bench_engine.c - the in-process engine benchmark: one AdmissionReview
 * evaluated N times with a policy set, time split by stage.
 *
 *   bench_engine --policies DIR --lua DIR [--config FILE] [-n N] [--grace-us N]
 *                [--phases mutate|validate|both] REVIEW.json
 *
 * Prints microseconds per review for decode, JSON->Lua, mutate, diff,
 * validate and encode, and their total (one thread, one VM, warm).
 * JSON->Lua is the request's set-up only: the object is converted lazily,
 * table by table as policies read it, so that cost is part of mutate and
 * validate (see "The object in Lua" in policies/README.md).
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
#include "engine/luabridge.h"
#include "engine/policy.h"
#ifdef GG_LUA_PROFILE
#include "profile/lua_profile.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { DECODE, TO_LUA, MUTATE, DIFF, VALIDATE, ENCODE, STAGES };
static const char *const stage_names[STAGES] = {"decode", "json->lua", "mutate",
                                                "diff",   "validate",  "encode"};

/* One review through every stage; adds the time of each to sum. */
static long n_reviews = 20000;
static unsigned phases = PHASE_MUTATE | PHASE_VALIDATE;

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
    int64_t t1 = gg_now_ns();
    struct policy_verdict v;
    if (engine_evaluate(e, &req, phases, gg_now_ns() / 1000 + 10000000, &v, &err) != GG_OK) {
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
    sum[TO_LUA] += v.timing.to_lua;
    sum[MUTATE] += v.timing.mutate;
    sum[DIFF] += v.timing.diff;
    sum[VALIDATE] += v.timing.validate;
    sum[ENCODE] += t3 - t2;
    free(out);
    policy_verdict_clear(&v);
    adm_request_clear(&req); /* as http/review.c does */
    arena_end();
    return 0;
}

static const struct option long_options[] = {{"grace-us", required_argument, NULL, 256},
                                             {"phases", required_argument, NULL, 257},
                                             {NULL, 0, NULL, 0}};

static int take_flag(void *ctx, int opt, const char *arg)
{
    (void)ctx;
    if (opt == 'n') {
        n_reviews = strtol(arg, NULL, 10);
    } else if (opt == 256) {
        lb_set_grace_us(strtoll(arg, NULL, 10));
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
        "  --phases P             mutate (as /mutate), validate (as /validate) or both [both]\n",
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
    char *text = NULL;
    size_t len = 0;
    if (n < 1 || eo_engine_new(&eo, &e, &err) != GG_OK ||
        gg_read_file(review, 64 << 20, &text, &len, &err) != GG_OK) {
        fprintf(stderr, "bench_engine: %s\n", n < 1 ? "-n must be at least 1" : err.msg);
        engine_free(e);
        return 2;
    }
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
#ifdef GG_LUA_PROFILE
    lua_profile_report(stdout, n);
#endif
    free(text);
    engine_free(e);
    return 0;
}
