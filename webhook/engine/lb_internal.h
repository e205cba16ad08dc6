/*
 * lb_internal.h - what the engine/lb_*.c files share to implement
 * luabridge.h: the VM's state, the shapes of tables, registry keys and the
 * functions one part of the bridge calls in another.  Only engine/lb_*.c
 * include it (and with it lua.h); the rest of gpuguard uses luabridge.h.
 *
 * The files, one job each:
 *   lb_vm.c        a VM's life: create the sandbox, free, the marking metatables
 *   lb_budget.c    instruction, wall-clock and memory budgets (hook, allocator)
 *   lb_sandbox.c   the globals a chunk sees, its environment, require
 *   lb_stdlib.c    bounded replacements for library functions that loop in C
 *   lb_module.c    the `gpuguard` module policies require
 *   lb_readonly.c  read-only views: shared tables (configuration, library) and validate's object
 *   lb_json.c      JSON -> Lua and Lua -> JSON
 *   lb_lazy.c      the request's object as stubs filled on first use
 *   lb_chargekey.c the key a pod's charge is remembered under, read from the object
 *   lb_call.c      loading and calling policy and test files under the budgets
 *   lb_request.c   a request: the req table, policy calls, reports, the object rebuilt
 *   lb_diff.c      the JSON patch from the original object to the edited one
 */
#ifndef GG_LB_INTERNAL_H
#define GG_LB_INTERNAL_H

#include "engine/luabridge.h"

#include <lauxlib.h>
#include <lua.h>

/* What a table's metatable says it is (see lb_shape_of). */
enum shape {
    SHAPE_NONE,
    SHAPE_OBJECT,
    SHAPE_ARRAY,
    SHAPE_LAZY_OBJECT,
    SHAPE_LAZY_ARRAY,
    SHAPE_FROZEN, /* a frozen proxy: validate's read-only view of a table of the object */
    N_SHAPES
};

struct watchdog;
struct blockpool;

/* A stub of the current request: its table (lua_topointer) and its JSON. */
struct lb_stub {
    const void *table;
    const struct jf_node *node;
};

struct lb_vm {
    lua_State *L;
    const void *marks[N_SHAPES]; /* the marking metatables, by shape */
    int lazy_mt_ref[2];          /* registry refs of the lazy object and array metatables */
    int frozen_mt_ref;           /* registry ref of the frozen proxies' first metatable */
    int frozen_filled_mt_ref;    /* and of their second: the table shown is filled */
    const void *frozen_filled;   /* that second metatable (also SHAPE_FROZEN) */
    int ro_target_ref;           /* registry ref of shared proxy -> shadow (weak keys) */
    struct lb_stub *stubs;       /* the current request's stubs by table (see lb_lazy.c) */
    size_t stubs_cap, stubs_n;   /* slots (a power of two, or 0) and those taken */
    struct lb_limits limits;
    const struct lb_source *modules; /* borrowed from the policy set */
    size_t n_modules;
    struct inventory *inventory; /* borrowed; NULL without one */
    struct watchdog *watchdog;   /* NULL: the hook is set from the start */
    struct blockpool *pool;      /* NULL: every block from malloc */
    size_t mem, mem_peak;
    size_t mem_settled;   /* after the last full collection (collect_all) */
    size_t mem_collected; /* after the last collection lb_vm_collect ran */
    int64_t used;         /* instructions counted in the current budget window */
    int64_t unchecked;    /* C work charged but not yet counted in used (lb_budget_charge) */
    int64_t deadline_us;  /* 0: none */
    bool running;         /* inside a policy call: budget kills are armed */
    bool call_pure;       /* the call read nothing of the cluster, wrote no log (lb_impure) */
    bool read_dra;        /* a call of the request read DRA objects (lb_read_dra) */
    bool dra_unknown;     /* one could not be known in this request (gpuguard.dra) */
    enum lb_outcome kill;
    bool broken;
    int obj_ref, req_ref;          /* the current request's tables */
    int frozen_ref;                /* the object as validate sees it: read-only */
    int frozen_cache_ref;          /* its frozen proxies, by the table they show (weak) */
    int frozen_made;               /* proxies made in this request */
    int frozen_cache_hint;         /* and in the last one: the next cache's size */
    const struct adm_request *req; /* the current request; NULL between requests */
    struct lb_report report;       /* the current call's report */
    size_t report_held;            /* its bytes, counted in mem while the call runs */
    size_t report_denied;          /* the bytes of its denials */
    bool report_lost;              /* a req:deny failed: the call fails, even if it went on */
};

/* Registry keys shared between files (their addresses are the keys). */
extern const char lb_key_object_mt, lb_key_array_mt; /* the plain marks */
extern const char lb_key_null_marker;                /* gpuguard.null's address */
extern const char lb_key_module;                     /* the gpuguard module */
extern const char lb_key_policies;                   /* loaded policy tables, 1..n */

static inline struct lb_vm *lb_vm_of(lua_State *L)
{
    return *(struct lb_vm **)lua_getextraspace(L);
}

static inline void lb_push_registry(lua_State *L, const void *key)
{
    lua_rawgetp(L, LUA_REGISTRYINDEX, key);
}

static inline bool lb_is_lazy(enum shape s)
{
    return s == SHAPE_LAZY_OBJECT || s == SHAPE_LAZY_ARRAY;
}

/* lb_vm.c */
enum shape lb_shape_of(lua_State *L, int idx);

/* lb_budget.c */
void *lb_alloc(void *ud, void *ptr, size_t osize, size_t nsize);
void lb_watchdog_fired(void *arg);
void lb_budget_open(struct lb_vm *vm, int64_t deadline_us);
void lb_budget_close(struct lb_vm *vm);
bool lb_budget_spend(struct lb_vm *vm, int64_t instructions);
bool lb_budget_charge(struct lb_vm *vm, int64_t steps);
const char *lb_kill_message(enum lb_outcome kill);
bool lb_budget_hold(struct lb_vm *vm, size_t bytes);
void lb_budget_release(struct lb_vm *vm, size_t bytes);

/* lb_sandbox.c */
void lb_sandbox_open(lua_State *L);
int lb_load_chunk(lua_State *L, const char *name, const char *text, size_t len);

/* lb_stdlib.c */
void lb_stdlib_open(lua_State *L);

/* lb_module.c */
void lb_module_open(lua_State *L);

/* lb_readonly.c */
extern const luaL_Reg lb_frozen_methods[], lb_frozen_filled_methods[];
void lb_readonly_open(lua_State *L);
bool lb_is_proxy(lua_State *L, int idx);
void lb_unproxy(lua_State *L, int idx);
void lb_push_shown(lua_State *L, int idx);
void lb_unshare(lua_State *L, int idx);
void lb_push_readonly(lua_State *L, int idx);
void lb_push_ro_metatable(lua_State *L, lua_CFunction pairs);
void lb_ro_point(lua_State *L, int proxy, int shadow);
int lb_ro_pairs(lua_State *L);
int lb_pairs_of(lua_State *L, lua_CFunction next);
void lb_push_copy(lua_State *L, int idx);
void lb_freeze(lua_State *L);
int lb_frozen_index(lua_State *L);
int lb_frozen_next(lua_State *L);

/* lb_json.c */
struct lb_path { /* the path of the value being converted, for error messages */
    int depth;
    struct {
        const char *key; /* NULL for an array index */
        size_t index;
    } seg[LB_MAX_DEPTH + 2];
};
void lb_mark(lua_State *L, const void *mt_key);
bool lb_is_null(lua_State *L, int idx);
void lb_push_scalar(lua_State *L, const struct jf_node *v);
/* Push v, or raise a Lua error that says what is too deep. */
void lb_push_node_or_raise(lua_State *L, const struct jf_node *v, const char *what);
/* lb_push_node_or_raise of v, which is stolen (released also when it raises). */
void lb_push_json_or_raise(lua_State *L, json_t *v, const char *what);
bool lb_too_deep(const struct jf_node *v, int depth);
int lb_infer_shape(lua_State *L, int idx);
/* Enter array index i (0-based) in p; the caller leaves it (p->depth--). */
static inline void lb_path_index(struct lb_path *p, size_t i)
{
    p->seg[p->depth].key = NULL;
    p->seg[p->depth].index = i;
    p->depth++;
}
enum gg_status lb_path_fail(const struct lb_path *p, struct gg_err *err, const char *what);
enum gg_status lb_to_json(lua_State *L, int idx, struct lb_path *p, json_t **out,
                          struct gg_err *err);
enum gg_status lb_lua_to_json(lua_State *L, int idx, json_t **out, struct gg_err *err);
/* lua_next over the Lua object at idx in a conversion: pushes the next key and value and
 * enters the key in p (the caller leaves it: p->depth--); false at the end, or with *st set
 * when a key is not a string, nothing pushed then. */
bool lb_next_member(lua_State *L, int idx, struct lb_path *p, const char **key, size_t *len,
                    enum gg_status *st, struct gg_err *err);

/* lb_lazy.c */
extern const luaL_Reg lb_lazy_methods[];
extern const luaL_Reg lb_raw_access[];
int lb_rawlen(lua_State *L);
void lb_push_lazy(lua_State *L, const struct jf_node *v);
const struct jf_node *lb_stub_source(lua_State *L, int idx);
void lb_stubs_end(struct lb_vm *vm);
void lb_stubs_free(struct lb_vm *vm);
int lb_peek(lua_State *L);
int lb_fields(lua_State *L);
void lb_materialize(lua_State *L, int idx, enum shape shape);
void lb_materialize_if_lazy(lua_State *L, int idx);

/* A gpuguard function that reads the cluster (or writes a log) makes the call impure; one
 * that reads DRA objects, whose version tells when they change, makes it read them. */
static inline void lb_impure(lua_State *L)
{
    lb_vm_of(L)->call_pure = false;
}

static inline void lb_read_dra(lua_State *L)
{
    lb_vm_of(L)->read_dra = true;
}

/* lb_chargekey.c */
int lb_charge_key(lua_State *L);
int lb_dra_version(lua_State *L);

/* lb_call.c */
enum lb_outcome lb_protected_call(struct lb_vm *vm, int nargs, struct gg_err *err,
                                  char **traceback);

/* lb_request.c */
void lb_request_open(lua_State *L);

#endif
