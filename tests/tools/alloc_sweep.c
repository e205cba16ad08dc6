/*
 * alloc_sweep.c - the allocation-failure sweep: no failed allocation may
 * turn a denial into "allowed" or crash the engine.
 *
 *   alloc_sweep --policies DIR --lua DIR [--config FILE] [--layer L] [--load] [--dryrun]
 *               [--stride S] REVIEW.json
 *
 * REVIEW.json must be denied; it is evaluated as the server's /validate
 * does (a workload through its pod templates), with both phases for a pod.
 * For each allocator layer (L: libc, jansson,
 * lua, or all) the sweep counts the allocations of one evaluation of the
 * review, then evaluates it again and again in this one process with the
 * K-th allocation of that layer failing, for every K up to the count (every
 * S-th with --stride).  Each run must end in a denial or an engine error,
 * never "allowed".  With --load the same is done for loading the policy
 * set (engine_new) and for reloading it (engine_reload), which must either
 * succeed or fail and keep the last good set, still denying the review.
 * With --dryrun each evaluation is the CLI's (dr_evaluate, as `gpuguard
 * check` runs it) on the review's object without its namespace, which the
 * dry run must add back.
 *
 * The layers: libc's malloc, calloc and realloc are replaced in this
 * program (glibc lets a program do so; its own strdup, asprintf and the
 * libraries' allocations come here too), jansson's allocator through
 * json_set_alloc_funcs, the Lua allocator through lb_set_alloc_hook.
 * Under AddressSanitizer, which owns malloc, the libc layer is left out.
 *
 * Prints one line per layer and phase; exit 0 when no run allowed the
 * review, 1 when one did (each such K is printed), 2 on bad usage.
 */
#include "cli/engine_opts.h"
#include "codec/admission.h"
#include "util/clock.h"
#include "engine/dryrun.h"
#include "engine/luabridge.h"
#include "engine/policy.h"
#include "engine/workloads.h"

#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__SANITIZE_ADDRESS__)
#define SWEEP_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SWEEP_ASAN 1
#endif
#endif

enum layer { LAYER_LIBC, LAYER_JANSSON, LAYER_LUA, N_LAYERS };
static const char *const layer_names[] = {"libc", "jansson", "lua"};

/* The injector: while armed, counts the allocations of one layer and fails
 * the fail_at-th (0: none).  Single-threaded: the engine runs here alone. */
static struct {
    bool armed;
    enum layer layer;
    long count, fail_at;
    bool failed;
} inj;

static bool inject(enum layer l)
{
    if (!inj.armed || inj.layer != l)
        return false;
    if (++inj.count != inj.fail_at)
        return false;
    inj.failed = true;
    errno = ENOMEM; /* as the real allocator does: scandir, for one, reads it */
    return true;
}

#ifndef SWEEP_ASAN
void *__libc_malloc(size_t size);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t size);

void *malloc(size_t size)
{
    return inject(LAYER_LIBC) ? NULL : __libc_malloc(size);
}

void *calloc(size_t n, size_t size)
{
    return inject(LAYER_LIBC) ? NULL : __libc_calloc(n, size);
}

/* A shrink never fails (Lua relies on it): only growth counts. */
void *realloc(void *p, size_t size)
{
    if (p && size <= malloc_usable_size(p))
        return __libc_realloc(p, size);
    return inject(LAYER_LIBC) ? NULL : __libc_realloc(p, size);
}
#endif

static void *json_alloc(size_t size)
{
    return inject(LAYER_JANSSON) ? NULL : malloc(size);
}

static bool lua_fails(size_t size)
{
    (void)size;
    return inject(LAYER_LUA);
}

static void arm(enum layer l, long fail_at)
{
    inj.layer = l;
    inj.count = 0;
    inj.fail_at = fail_at;
    inj.failed = false;
    inj.armed = true;
}

static long disarm(void)
{
    inj.armed = false;
    return inj.count;
}

/* With --dryrun: the object evaluated through dr_evaluate, and its namespace. */
static json_t *dry_pod;
static const char *dry_namespace;

/* 1: allowed, 0: denied, -1: the engine could not evaluate. */
static int evaluate(struct engine *e, const struct adm_request *req)
{
    if (dry_pod) {
        struct dr_options o = {.namespace = dry_namespace};
        struct dr_result r;
        struct gg_err err = {{0}};
        if (dr_evaluate(e, dry_pod, &o, &r, &err) != GG_OK)
            return -1;
        int allowed = r.allowed ? 1 : 0;
        dr_result_clear(&r);
        return allowed;
    }
    /* As the server answers /validate: a workload through its templates' dry runs, anything
     * else through the policies (both phases, to sweep mutate's allocations too). */
    struct policy_verdict v;
    struct gg_err err = {{0}};
    int64_t deadline = gg_now_us() + 10000000;
    bool workload = false;
    enum gg_status st = wl_review(e, req, ADM_VALIDATING, deadline, &workload, &v, &err);
    if (st == GG_OK && !workload)
        st = engine_evaluate(e, req, PHASE_MUTATE | PHASE_VALIDATE, deadline, &v, &err);
    if (st != GG_OK)
        return -1;
    int allowed = v.allowed ? 1 : 0;
    policy_verdict_clear(&v);
    return allowed;
}

struct tally {
    long runs, denied, errors, allowed;
};

static void report(const char *what, enum layer l, long n, const struct tally *t)
{
    printf("%s %s: %ld allocations, %ld runs: %ld denied, %ld engine errors, %ld allowed\n", what,
           layer_names[l], n, t->runs, t->denied, t->errors, t->allowed);
}

/* Evaluations with the K-th allocation of layer l failing. */
static long sweep_review(struct engine *e, const struct adm_request *req, enum layer l, long stride)
{
    arm(l, 0);
    evaluate(e, req);
    long n = disarm();
    struct tally t = {0};
    for (long k = 1; k <= n; k += stride) {
        arm(l, k);
        int r = evaluate(e, req);
        disarm();
        t.runs++;
        if (r > 0) {
            printf("ALLOWED: review, %s allocation %ld of %ld failing\n", layer_names[l], k, n);
            t.allowed++;
        } else if (r < 0) {
            t.errors++;
        } else {
            t.denied++;
        }
    }
    report("review", l, n, &t);
    return t.allowed;
}

/* Loading and reloading with the K-th allocation of layer l failing. */
static long sweep_load(const struct engine_opts *paths, const struct adm_request *req, enum layer l,
                       long stride)
{
    struct gg_err err = {{0}};
    struct engine *e = NULL;
    arm(l, 0);
    enum gg_status st = eo_engine_new(paths, &e, &err);
    long n = disarm();
    if (st != GG_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    struct tally load = {0}, reload = {0};
    for (long k = 1; k <= n; k += stride) {
        struct engine *fresh = NULL;
        arm(l, k);
        st = eo_engine_new(paths, &fresh, &err);
        disarm();
        load.runs++;
        if (st != GG_OK) {
            load.errors++;
            continue;
        }
        /* Loaded despite the failure: it must be the whole set. */
        if (evaluate(fresh, req) > 0) {
            printf("ALLOWED: load, %s allocation %ld of %ld failing\n", layer_names[l], k, n);
            load.allowed++;
        } else {
            load.denied++;
        }
        engine_free(fresh);
    }
    for (long k = 1; k <= n; k += stride) {
        uint64_t generation = engine_generation(e);
        arm(l, k);
        st = engine_reload(e, &err);
        disarm();
        reload.runs++;
        if (st != GG_OK && engine_generation(e) != generation) {
            printf("FAILED: reload, %s allocation %ld: the set changed\n", layer_names[l], k);
            reload.allowed++;
        } else if (evaluate(e, req) > 0) {
            printf("ALLOWED: reload, %s allocation %ld of %ld failing\n", layer_names[l], k, n);
            reload.allowed++;
        } else if (st != GG_OK) {
            reload.errors++;
        } else {
            reload.denied++;
        }
    }
    engine_free(e);
    report("load", l, n, &load);
    report("reload", l, n, &reload);
    return load.allowed + reload.allowed;
}

struct sweep_opts {
    const char *layer;
    bool load, dryrun;
    long stride;
};

enum { OPT_LAYER = 256, OPT_STRIDE, OPT_LOAD, OPT_DRYRUN };

static const struct option long_options[] = {
    {"layer", required_argument, NULL, OPT_LAYER},
    {"stride", required_argument, NULL, OPT_STRIDE},
    {"load", no_argument, NULL, OPT_LOAD},
    {"dryrun", no_argument, NULL, OPT_DRYRUN},
    {NULL, 0, NULL, 0},
};

static int take_flag(void *ctx, int opt, const char *arg)
{
    struct sweep_opts *o = ctx;
    if (opt == OPT_LAYER) {
        o->layer = arg;
    } else if (opt == OPT_STRIDE) {
        o->stride = strtol(arg, NULL, 10);
        if (o->stride < 1) {
            fprintf(stderr, "alloc_sweep: --stride must be at least 1\n");
            return -1;
        }
    } else {
        *(opt == OPT_LOAD ? &o->load : &o->dryrun) = true;
    }
    return 0;
}

static const struct eo_command tool_command = {
    .name = "alloc_sweep",
    .shared = EO_ENGINE,
    .log_level = LOG_INFO,
    .options = long_options,
    .take = take_flag,
    .usage = "alloc_sweep [flags] REVIEW.json",
    .own_flags = "  --layer L              libc, jansson, lua or all [all]\n"
                 "  --load                 sweep loading and reloading the policy set\n"
                 "  --dryrun               evaluate as gpuguard check does (dr_evaluate)\n"
                 "  --stride S             every S-th allocation [1]\n",
    .missing_args = "no REVIEW.json given",
};

int main(int argc, char **argv)
{
    struct engine_opts paths;
    struct sweep_opts o = {.layer = "all", .stride = 1};
    int rc = 2;
    if (!eo_parse(&tool_command, &o, argc, argv, &paths, &rc))
        return rc;
    const char *review = paths.args[0], *layer = o.layer;
    bool load = o.load, dryrun = o.dryrun;
    long stride = o.stride;
    json_set_alloc_funcs(json_alloc, free);
    lb_set_alloc_hook(lua_fails);
    struct gg_err err = {{0}};
    struct engine *engine = NULL;
    char *text = NULL;
    size_t len = 0;
    struct adm_request req;
    if (eo_engine_new(&paths, &engine, &err) != GG_OK ||
        gg_read_file(review, 64 << 20, &text, &len, &err) != GG_OK ||
        adm_decode(text, len, &req, &err) != GG_OK) {
        fprintf(stderr, "%s\n", err.msg);
        engine_free(engine);
        free(text);
        return 2;
    }
    free(text);
    if (dryrun) {
        dry_pod = jf_to_json(req.object);
        json_object_del(json_object_get(dry_pod, "metadata"), "namespace");
        dry_namespace = req.namespace;
    }
    long allowed = 0;
    if (evaluate(engine, &req) != 0) {
        fprintf(stderr, "%s: not denied without failures; the sweep needs a denial\n", review);
        allowed = 1;
    }
    for (int l = 0; l < N_LAYERS && !allowed; l++) {
#ifdef SWEEP_ASAN
        if (l == LAYER_LIBC)
            continue;
#endif
        if (strcmp(layer, "all") != 0 && strcmp(layer, layer_names[l]) != 0)
            continue;
        allowed += load ? sweep_load(&paths, &req, (enum layer)l, stride)
                        : sweep_review(engine, &req, (enum layer)l, stride);
    }
    json_decref(dry_pod);
    adm_request_clear(&req);
    engine_free(engine);
    return allowed ? 1 : 0;
}
