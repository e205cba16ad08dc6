/*
 * policy.h - the policy engine: a policy set (configuration, Lua library and
 * policy files read into memory and checked), per-thread Lua VMs built from
 * it, and the evaluation of one admission request into a verdict.
 *
 * A policy set is immutable once loaded and reference-counted: a reload
 * builds and checks a new set, then swaps it in; each worker thread notices
 * the new generation at its next request and rebuilds its own VM.  A broken
 * new set is refused and the old one keeps serving.
 */
#ifndef GG_POLICY_H
#define GG_POLICY_H

#include "codec/admission.h"
#include "engine/config.h"
#include "util/gpuguard.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* The most policy directories one engine reads (policies and more_policies together). */
#define POLICY_MAX_DIRS 16

/* Where the engine reads its inputs from. */
struct policy_paths {
    const char *policies; /* directory of *.lua policy files, run in name order */
    const char *lua;      /* directory of library modules for require */
    const char *config;   /* YAML configuration file; NULL for none */
    /*
     * More policy directories, read with policies as if their files were in one directory:
     * every file runs in name order across all of them, and a file name in two of them is
     * refused.  At most POLICY_MAX_DIRS - 1; NULL and 0 for none.
     */
    const char *const *more_policies;
    size_t n_more_policies;
};

struct policy_set;
struct engine;
struct lb_source;

/* The policy directories of paths, policies first, into out; how many. */
size_t policy_dirs(const struct policy_paths *paths, const char *out[POLICY_MAX_DIRS]);

/* Every *.lua file of dir in name order (modules: named without ".lua"). */
enum gg_status policy_read_sources(const char *dir, bool strip_ext, struct lb_source **out,
                                   size_t *n_out, struct gg_err *err);
void policy_free_sources(struct lb_source *src, size_t n);

void policy_set_release(struct policy_set *set);
size_t policy_set_count(const struct policy_set *set);
/*
 * A Lua VM with the set's library modules and configuration and none of its
 * policies (the inventory's charger runs the library's charge model in it).
 */
struct lb_vm;
struct inventory;
enum gg_status policy_set_library_vm(const struct policy_set *set, struct inventory *inventory,
                                     struct lb_vm **out, struct gg_err *err);
const char *policy_set_name(const struct policy_set *set, size_t i);
/* The set's configuration file as JSON (an object; empty without a file). */
const json_t *policy_set_config(const struct policy_set *set);

/*
 * The engine: the live policy set and its generation.  Every file of the policy directories
 * is loaded (a policy's name is known once its file has run, its check function with it);
 * those the configuration's policies.disabled names are then dropped: never evaluated, never
 * listed.  The configuration sections they declare stay known.
 */
enum gg_status engine_new(const struct policy_paths *paths, struct engine **out,
                          struct gg_err *err);
void engine_free(struct engine *e);

/*
 * Load the inputs again; on success the new set serves from the next
 * request on, on failure the old one stays and err says why.
 */
enum gg_status engine_reload(struct engine *e, struct gg_err *err);
uint64_t engine_generation(struct engine *e);
/* The live set, with a reference the caller releases. */
struct policy_set *engine_live_set(struct engine *e);
/* "ok" or the last reload's error message. */
void engine_last_reload(struct engine *e, char *out, size_t size);
const struct policy_paths *engine_paths(const struct engine *e);

/*
 * Where gpuguard.usage() reads GPU usage from, and where admitted pods are
 * reserved; set before the first evaluation (NULL: none).
 */
struct inventory;
void engine_set_inventory(struct engine *e, struct inventory *inventory);
/* The GPUQuota ledger admitted GPU pods are charged in (kube/ledger.h); NULL: none.  Set before
 * the first evaluation; borrowed. */
struct ledger;
void engine_set_ledger(struct engine *e, struct ledger *ledger);
struct inventory *engine_inventory(struct engine *e);

/*
 * Collect the Lua garbage of this thread's evaluations if the collector's
 * schedule says so (lb_vm_collect): the webhook calls it once an answer is
 * sent, so that the collector's pauses fall between reviews instead of in
 * the middle of one.
 */
void engine_collect(struct engine *e);

/* The configured GPU quotas (quotas.namespaces, quotas.default) as Prometheus gauges. */
struct buf;
enum gg_status engine_render_quotas(struct engine *e, struct buf *out);

/* Which functions of the policies run. */
enum policy_phases {
    PHASE_MUTATE = 1,
    PHASE_VALIDATE = 2,
    PHASE_KEEP_MUTATED = 4, /* also fill verdict.mutated (the CLI); the server never needs it */
    PHASE_OUTCOMES = 8,     /* also fill verdict.outcomes: each validate call's result (audit) */
};

/* A policy's severity when it declares none: the reports' severity of its failures. */
#define POLICY_DEFAULT_SEVERITY "medium"

/* Where the time of one evaluation went, in nanoseconds. */
struct policy_timing {
    int64_t to_lua;   /* the request into Lua (the object is filled in lazily) */
    int64_t mutate;   /* mutate functions */
    int64_t diff;     /* edited object back to JSON and the patch */
    int64_t validate; /* validate functions */
};

/* The verdict's message when a denial could not be recorded for want of memory (a literal:
 * showing it needs no allocation). */
#define POLICY_LOST_DENIAL "gpuguard: out of memory while recording a denial; denied to be safe"

struct policy_verdict {
    bool allowed;
    char *message;    /* denial message, malloc'ed; NULL when allowed */
    json_t *patch;    /* RFC 6902 array (possibly empty) after the mutate phase */
    json_t *mutated;  /* the object after the mutate phase, with PHASE_KEEP_MUTATED */
    json_t *warnings; /* sanitized array of strings */
    json_t *audit;    /* object of valid audit annotation keys */
    json_t *fired;    /* names of the policies that denied, warned or changed something */
    /*
     * With PHASE_OUTCOMES: one object per validate call, in the order they ran: "policy",
     * "result" (pass: nothing reported; fail: a denial, in whatever mode; warn: warnings only;
     * error: it raised or broke a budget), "message" (the denials, else the warnings, else the
     * error, one a line; the policy's description on pass) and "severity".
     */
    json_t *outcomes;
    unsigned errors; /* policies that raised or broke a budget (their failure verdict applies) */
    struct policy_timing timing;
};

/*
 * Evaluate the request with the policies that match it.  deadline_us
 * (CLOCK_MONOTONIC) bounds all Lua work.  Policy failures are verdicts, not
 * errors; an error here means the engine itself could not run.
 */
enum gg_status engine_evaluate(struct engine *e, const struct adm_request *req, unsigned phases,
                               int64_t deadline_us, struct policy_verdict *out, struct gg_err *err);
void policy_verdict_clear(struct policy_verdict *v);

/*
 * Evaluations still running ENGINE_STUCK_GRACE_US past their deadline_us:
 * a worker stuck where no budget reaches (/healthz fails while there are
 * any).  Evaluations that end past their deadline are counted in
 * gpuguard_deadline_overruns_total.
 */
#define ENGINE_STUCK_GRACE_US 2000000
int engine_overdue(void);

#endif
