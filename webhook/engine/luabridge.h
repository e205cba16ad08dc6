/*
 * luabridge.h - the Lua side of the engine: sandboxed VMs, JSON <-> Lua,
 * budgets, and the `gpuguard` C module policies require.
 *
 * Implemented by engine/lb_*.c, the only files of webhook/ that include
 * lua.h (engine/lb_internal.h says which does what).  One VM belongs to one
 * thread at a time and is never shared.  A VM whose policy broke a budget
 * (instructions, memory, wall clock) is marked broken: throw it away.
 *
 * Lua view of JSON: objects and arrays are tables marked with an object or
 * array metatable (arrays 1-based), null is the light userdata gpuguard.null,
 * integers are Lua integers and other numbers Lua floats, so an untouched
 * value converts back to exactly the JSON it came from.  Tables a policy
 * creates are arrays when their keys are 1..n and objects when their keys are
 * strings; an empty unmarked table is ambiguous and is an error that names
 * its path (use gpuguard.array() or gpuguard.object()).
 */
#ifndef GG_LUABRIDGE_H
#define GG_LUABRIDGE_H

#include "codec/admission.h"
#include "util/gpuguard.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* Nesting deeper than this is refused when converting JSON <-> Lua. */
#define LB_MAX_DEPTH 100
/* Lua pattern functions refuse longer subjects (their steps are budgeted,
 * but a subject this long is a mistake). */
#define LB_MAX_PATTERN_SUBJECT (64 * 1024)

struct lb_limits {
    size_t memory;        /* bytes per VM */
    int64_t instructions; /* per request (and per policy load) */
    int64_t load_time_us; /* wall clock for loading one policy */
};

/* A Lua source text: a library module (name "k8s") or a policy file. */
struct lb_source {
    char *name; /* module name, or the policy file name */
    char *text;
    size_t len;
};

enum lb_phase { LB_MUTATE, LB_VALIDATE };

/* How a policy call ended. */
enum lb_outcome {
    LB_DONE,          /* returned normally */
    LB_RAISED,        /* raised an error */
    LB_OUT_OF_BUDGET, /* ran past the instruction budget */
    LB_OUT_OF_MEMORY, /* ran past the memory cap */
    LB_OUT_OF_TIME,   /* ran past the request's deadline */
};

/*
 * What one call (and, in policy.c, one review) keeps of req:deny, req:warn
 * and req:audit, far above what the shipped policies report
 * (policies/README.md, "Reports").  Past these, reports are counted and left
 * out, never kept: what is kept counts against the VM's memory while the
 * call runs.
 */
#define LB_REPORT_TEXT_MAX 4096     /* bytes of a denial, a warning, an audit value; more is cut */
#define LB_REPORT_DENIALS_MAX 65536 /* bytes of the denials together */
#define LB_REPORT_WARNINGS 100      /* warnings (a review keeps what the API server shows) */
#define LB_REPORT_AUDIT 32          /* audit annotations (a policy's keys) */
#define LB_REPORT_KEY_MAX 63        /* bytes of an audit key that can reach the annotation */

/* What a policy reported through req:deny / req:warn / req:audit. */
struct lb_report {
    json_t *denials;                                            /* array of strings */
    json_t *warnings;                                           /* array of strings */
    json_t *audit;                                              /* object: key -> string */
    size_t denials_left_out, warnings_left_out, audit_left_out; /* past the limits above */
};

/* The declarative part of a loaded policy. */
struct lb_policy_info {
    json_t *decl; /* name, description, mode, failure, match ... as JSON (owned) */
    bool has_mutate;
    bool has_validate;
};

struct lb_vm;

struct inventory;

/*
 * Run time before a request's instructions are counted, for every VM of
 * the process (LB_GRACE_US unless set); benchmarks under an instruction
 * counter raise it so that the count reflects a native run.
 */
void lb_set_grace_us(int64_t us);

/*
 * A fresh sandboxed VM with the library modules, the configuration
 * (read-only in Lua; NULL for an empty table) and the inventory that
 * gpuguard.usage() reads (NULL: usage 0, not ready).
 */
enum gg_status lb_vm_new(const struct lb_limits *limits, const struct lb_source *modules,
                         size_t n_modules, const json_t *config, struct inventory *inventory,
                         struct lb_vm **out, struct gg_err *err);
void lb_vm_free(struct lb_vm *vm);
bool lb_vm_broken(const struct lb_vm *vm);
size_t lb_vm_memory_peak(const struct lb_vm *vm);
size_t lb_vm_memory(const struct lb_vm *vm);

/*
 * Run a policy file and keep the table it returns as the next policy
 * (numbered from 0 in load order, as lb_policy_call takes them).  Runs its
 * check(cfg) function when it has one.
 *
 * Where its errors are placed, here, in lb_policy_call and in lb_run_tests:
 * Lua names the file and line that raised one
 * ("/etc/gpuguard/policies/10-gpu-sharing.lua:42: ...", a path longer than
 * LUA_IDSIZE as "..." and its end).  One raised in a library module on a
 * policy's behalf leads with the policy's innermost line on the stack, then
 * the library's as Lua gave it
 * ("policies/p.lua:7: lua/k8s.lua:114: the object is read-only ...").
 */
enum gg_status lb_policy_load(struct lb_vm *vm, const struct lb_source *src,
                              struct lb_policy_info *info, struct gg_err *err);
/* lb_policy_load naming the policy by the file it was read from; lb_policy_load names it
 * [string "<src->name>"] (a policy built into gpuguard). */
enum gg_status lb_policy_load_file(struct lb_vm *vm, const struct lb_source *src, const char *path,
                                   struct lb_policy_info *info, struct gg_err *err);
void lb_policy_info_clear(struct lb_policy_info *info);

/*
 * Start a request: convert the object (NULL for none) and build the req
 * table.  deadline_us (CLOCK_MONOTONIC) bounds every call until
 * lb_request_end.
 */
enum gg_status lb_request_begin(struct lb_vm *vm, const struct adm_request *req,
                                const struct jf_node *object, int64_t deadline_us,
                                struct gg_err *err);

/*
 * Call policy `index`'s mutate or validate (which gets the object read-only,
 * as mutate left it).  report gets what it reported
 * (fresh JSON owned by the caller, also on failure); on a failure err holds
 * the message and *traceback (malloc'ed, may be NULL) the Lua traceback.
 */
enum lb_outcome lb_policy_call(struct lb_vm *vm, int index, enum lb_phase phase,
                               struct lb_report *report, struct gg_err *err, char **traceback);

/*
 * Whether the last lb_policy_call read nothing of the cluster and wrote no
 * log: it called none of gpuguard.usage, gpuquota, rightsize,
 * rightsize_report and log, and no DRA object was unknown in the request
 * (gpuguard.dra answered that it could not tell).  Its report is then a function of the request,
 * the configuration (and the policy's own Lua) and, when
 * lb_call_read_dra, the DRA objects: a call of the request so far called
 * gpuguard.dra, dra_version, or charge_key for a pod naming claims (whose
 * charge reads them).  For the whole request, not the call: the library
 * keeps what it worked out of DRA objects for the rest of the request
 * (intent's claims, workload's wants_gpu), and a later call may answer
 * from that.
 */
bool lb_call_was_pure(const struct lb_vm *vm);
bool lb_call_read_dra(const struct lb_vm *vm);

/*
 * The JSON patch from original to the object as the policies left it.
 * Only the parts that differ are converted back to JSON.
 */
enum gg_status lb_request_patch(struct lb_vm *vm, const struct jf_node *original, json_t **patch,
                                struct gg_err *err);

/*
 * Make object (which must outlive the request) the request's object from
 * now on, for mutate and validate alike, in place of the one the policies
 * have edited so far (policy.c drops a failed call's edits so).  The budgets
 * go on as they were; the patch is still taken against the original.
 */
enum gg_status lb_request_rewind(struct lb_vm *vm, const struct jf_node *object,
                                 struct gg_err *err);
void lb_request_end(struct lb_vm *vm);

/*
 * Collect garbage now if the collector's schedule says so (true when it
 * did): a caller with idle time after a request (the webhook, once its
 * answer is sent) runs the collections there, and requests, which the
 * collector by itself interrupts only after twice that growth, rarely pause
 * in their middle.  Without calls it collects on its own schedule alone.
 */
bool lb_vm_collect(struct lb_vm *vm);

void lb_report_clear(struct lb_report *report);

/*
 * Run a Lua test file in the sandbox: a chunk returning a table of
 * name -> function.  Each function runs under the request budgets; a raised
 * error fails it.  *results is a JSON array of {name, ok, error} in name
 * order.  GG_ERR_POLICY when the file itself does not load.
 */
enum gg_status lb_run_tests(struct lb_vm *vm, const struct lb_source *src, json_t **results,
                            struct gg_err *err);

/*
 * Tests only: fail a Lua allocation of size bytes when fail() says so, as
 * if the allocator had run out (NULL: never).  Process-wide.
 */
void lb_set_alloc_hook(bool (*fail)(size_t size));

#endif
