/*
 * luabridge.c - sandboxed Lua VMs for policies: allocator with a cap,
 * instruction and wall-clock budgets, read-only shared tables, restricted
 * require, JSON <-> Lua conversion and the `gpuguard` C module.
 *
 * The only file that includes lua.h.  Budgets follow Redis: a count hook
 * checks the budget every LB_HOOK_STEP instructions; once a budget is
 * broken the hook fires on every instruction and raises again, so a policy
 * that catches the error with pcall is stopped at its next instruction.
 *
 * The hook is not set while a request is young: Lua 5.4 traps every
 * instruction while any count hook is set (about a fifth of a short
 * request's time).  A watchdog timer sets it LB_GRACE_US into the request
 * (or at the deadline, if sooner); instructions count from then on.
 */
#include "engine/luabridge.h"
#include "util/clock.h"

#include "util/blockpool.h"
#include "kube/inventory.h"
#include "codec/jsonpatch.h"
#include "util/log.h"
#include "engine/luapattern.h"
#include "kube/ownerfold.h"
#include "codec/quantity.h"
#include "kube/rsstore.h"
#include "engine/watchdog.h"

#include <lauxlib.h>
#include <lua.h>
#include <ctype.h>
#include <lualib.h>
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LB_HOOK_STEP 1000
/* Address space for a VM's small blocks (see blockpool.h). */
#define LB_POOL_RESERVE (8u << 20)
/* Run time before the count hook is set (see the top of the file). */
#define LB_GRACE_US 1000
/* A library call that waits (the template GET of gpuguard.dra) ends this long before the
 * budget's deadline, so the policy can still deny with its reason. */
#define LB_WAIT_RESERVE_US 50000
static _Atomic int64_t grace_us = LB_GRACE_US;

/* Registry keys (addresses of these statics are unique light userdata). */
static const char key_array_mt, key_object_mt, key_ro_target, key_ro_cache;
static const char key_req_proxy, key_req_proxy_mt, key_req_shadow_mt;
static const char key_loaded, key_globals, key_policies, key_module, key_null_marker;
static const char key_shadow;       /* a frozen proxy's one (hidden) entry: its shadow */
static const char key_frozen_cache; /* the request's frozen proxies, by the table they show */

/* What a table's metatable says it is (see shape_of). */
enum shape {
    SHAPE_NONE,
    SHAPE_OBJECT,
    SHAPE_ARRAY,
    SHAPE_LAZY_OBJECT,
    SHAPE_LAZY_ARRAY,
    SHAPE_FROZEN, /* a frozen proxy: validate's read-only view of a table of the object */
    N_SHAPES
};

struct lb_vm {
    lua_State *L;
    const void *marks[N_SHAPES]; /* the marking metatables, by shape */
    int lazy_mt_ref[2];          /* registry refs of the lazy object and array metatables */
    int frozen_mt_ref;           /* registry ref of the frozen proxies' metatable */
    lua_Integer epoch;           /* the current request's number, for its stubs */
    struct lb_limits limits;
    const struct lb_source *modules; /* borrowed from the policy set */
    size_t n_modules;
    struct inventory *inventory; /* borrowed; NULL without one */
    struct watchdog *watchdog;   /* NULL: the hook is set from the start */
    struct blockpool *pool;      /* NULL: every block from malloc */
    size_t mem, mem_peak;
    size_t mem_settled;  /* after the last full collection at a request's end */
    int64_t used;        /* instructions counted in the current budget window */
    int64_t deadline_us; /* 0: none */
    bool running;        /* inside a policy call: budget kills are armed */
    enum lb_outcome kill;
    bool broken;
    int n_policies;
    int obj_ref, req_ref;          /* the current request's tables */
    int frozen_ref;                /* the object as validate sees it: read-only */
    const struct adm_request *req; /* the current request; NULL between requests */
    struct lb_report report;       /* the current call's report */
    bool report_lost;              /* a req:deny failed: the call fails, even if it went on */
};

/* Tests only: decides whether an allocation fails (see lb_set_alloc_hook). */
static bool (*alloc_hook)(size_t size);

void lb_set_alloc_hook(bool (*fail)(size_t size))
{
    alloc_hook = fail;
}

static struct lb_vm *vm_of(lua_State *L)
{
    return *(struct lb_vm **)lua_getextraspace(L);
}

/*
 * The JSON shape of the value at idx.  The marking metatables are known by
 * address, so this costs no registry lookup (it runs for every table the
 * diff visits and every gpuguard.is_array call).
 */
static enum shape shape_of(lua_State *L, int idx)
{
    if (!lua_istable(L, idx) || !lua_getmetatable(L, idx))
        return SHAPE_NONE;
    const void *mt = lua_topointer(L, -1);
    lua_pop(L, 1);
    const struct lb_vm *vm = vm_of(L);
    for (int s = SHAPE_OBJECT; s < N_SHAPES; s++)
        if (vm->marks[s] == mt)
            return (enum shape)s;
    return SHAPE_NONE;
}

static bool is_lazy(enum shape s)
{
    return s == SHAPE_LAZY_OBJECT || s == SHAPE_LAZY_ARRAY;
}

/* ---- budgets ---------------------------------------------------------- */

static const char *kill_message(enum lb_outcome kill)
{
    switch (kill) {
    case LB_OUT_OF_BUDGET:
        return "instruction budget exhausted";
    case LB_OUT_OF_MEMORY:
        return "memory limit exceeded";
    case LB_OUT_OF_TIME:
        return "deadline exceeded";
    default:
        return "stopped";
    }
}

static void budget_hook(lua_State *L, lua_Debug *ar);

/* From now on the hook fires on every instruction and raises. */
static void arm_kill(struct lb_vm *vm, enum lb_outcome why)
{
    if (vm->kill == LB_DONE)
        vm->kill = why;
    vm->broken = true;
    lua_sethook(vm->L, budget_hook, LUA_MASKCOUNT, 1);
}

static void budget_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    struct lb_vm *vm = vm_of(L);
    if (vm->kill == LB_DONE) {
        vm->used += LB_HOOK_STEP;
        if (vm->used > vm->limits.instructions)
            arm_kill(vm, LB_OUT_OF_BUDGET);
        else if (vm->deadline_us && gg_now_us() > vm->deadline_us)
            arm_kill(vm, LB_OUT_OF_TIME);
        else
            return;
    }
    luaL_error(L, "%s", kill_message(vm->kill));
}

/* Signal context: only set the hook (lua_sethook is safe there). */
static void watchdog_fired(void *arg)
{
    struct lb_vm *vm = arg;
    if (!lua_gethook(vm->L))
        lua_sethook(vm->L, budget_hook, LUA_MASKCOUNT, LB_HOOK_STEP);
}

/* Start a budget: a request's policy calls, or one load-time call. */
static void budget_open(struct lb_vm *vm, int64_t deadline_us)
{
    vm->used = 0;
    vm->deadline_us = deadline_us;
    vm->kill = LB_DONE;
    int64_t delay = atomic_load_explicit(&grace_us, memory_order_relaxed),
            left = deadline_us ? deadline_us - gg_now_us() : delay;
    if (left < delay)
        delay = left;
    if (vm->watchdog && delay > 0 && watchdog_owned(vm->watchdog))
        watchdog_arm(vm->watchdog, delay, vm);
    else
        lua_sethook(vm->L, budget_hook, LUA_MASKCOUNT, LB_HOOK_STEP);
}

void lb_set_grace_us(int64_t us)
{
    atomic_store(&grace_us, us);
}

static void budget_close(struct lb_vm *vm)
{
    if (vm->watchdog)
        watchdog_disarm(vm->watchdog);
    lua_sethook(vm->L, NULL, 0, 0);
}

static void *new_block(struct lb_vm *vm, size_t size)
{
    void *p = vm->pool && size <= BLOCKPOOL_MAX ? blockpool_get(vm->pool, size) : NULL;
    return p ? p : malloc(size);
}

/*
 * Lua's allocator.  A pooled block that shrinks stays where it is (Lua
 * requires shrinking never to fail; the block is big enough for the smaller
 * class it is given back to later).
 */
static void *lb_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    struct lb_vm *vm = ud;
    size_t old = ptr ? osize : 0;
    bool pooled = ptr && blockpool_owns(vm->pool, ptr);
    if (nsize == 0) {
        if (pooled)
            blockpool_put(vm->pool, ptr, osize);
        else
            free(ptr);
        vm->mem -= old;
        return NULL;
    }
    void *p = NULL;
    if ((nsize > old && vm->mem + (nsize - old) > vm->limits.memory) ||
        (alloc_hook && nsize > old && alloc_hook(nsize)))
        goto refused;
    if (!pooled) {
        p = ptr ? realloc(ptr, nsize) : new_block(vm, nsize);
        if (!p && nsize <= osize)
            p = ptr; /* a shrink must not fail: keep the larger block */
    } else if (nsize <= osize || (nsize <= BLOCKPOOL_MAX && blockpool_same_class(osize, nsize))) {
        p = ptr;
    } else if ((p = new_block(vm, nsize)) != NULL) {
        memcpy(p, ptr, osize);
        blockpool_put(vm->pool, ptr, osize);
    }
    if (!p)
        goto refused;
    vm->mem = vm->mem - old + nsize;
    if (vm->mem > vm->mem_peak)
        vm->mem_peak = vm->mem;
    return p;
refused:
    /* Lua raises a memory error, which a policy could catch with pcall:
     * the kill makes sure the call fails all the same. */
    if (vm->running)
        arm_kill(vm, LB_OUT_OF_MEMORY);
    return NULL;
}

/* ---- read-only proxies ------------------------------------------------ */

static void push_registry(lua_State *L, const void *key)
{
    lua_rawgetp(L, LUA_REGISTRYINDEX, key);
}

static enum shape shape_of(lua_State *L, int idx);
static void materialize_if_lazy(lua_State *L, int idx);

/* Whether the value at idx is a read-only proxy (frozen ones included). */
static bool is_proxy(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx))
        return false;
    if (shape_of(L, idx) == SHAPE_FROZEN)
        return true;
    push_registry(L, &key_ro_target);
    lua_pushvalue(L, idx);
    bool proxy = lua_rawget(L, -2) == LUA_TTABLE;
    lua_pop(L, 2);
    return proxy;
}

/* If the value at idx is a read-only proxy, replace it with its shadow (filled). */
static void unproxy(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx))
        return;
    if (shape_of(L, idx) == SHAPE_FROZEN) {
        lua_rawgetp(L, idx, &key_shadow);
        lua_replace(L, idx);
        materialize_if_lazy(L, idx);
        return;
    }
    push_registry(L, &key_ro_target);
    lua_pushvalue(L, idx);
    if (lua_rawget(L, -2) == LUA_TTABLE)
        lua_replace(L, idx);
    else
        lua_pop(L, 1);
    lua_pop(L, 1);
}

static int ro_newindex(lua_State *L)
{
    return luaL_error(L, "attempt to modify a read-only table (shared configuration or "
                         "library): copy what you need into a table of your own");
}

/* The shadow behind a proxy (its metatable's __index, or a frozen proxy's entry). */
static void push_shadow(lua_State *L, int proxy)
{
    lua_pushvalue(L, proxy);
    unproxy(L, -1);
}

static int ro_len(lua_State *L)
{
    push_shadow(L, 1);
    lua_pushinteger(L, (lua_Integer)lua_rawlen(L, -1));
    return 1;
}

static int ro_next(lua_State *L)
{
    push_shadow(L, 1);
    lua_replace(L, 1);
    lua_settop(L, 2);
    return lua_next(L, 1) ? 2 : 0;
}

static int ro_pairs(lua_State *L)
{
    lua_pushcfunction(L, ro_next);
    lua_pushvalue(L, 1);
    lua_pushnil(L);
    return 3;
}

/* A read-only proxy's metatable, but for its __index (the shadow). */
static void push_ro_metatable(lua_State *L, lua_CFunction pairs)
{
    lua_createtable(L, 0, 5);
    lua_pushcfunction(L, ro_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_pushcfunction(L, ro_len);
    lua_setfield(L, -2, "__len");
    lua_pushcfunction(L, pairs);
    lua_setfield(L, -2, "__pairs");
    lua_pushliteral(L, "read-only");
    lua_setfield(L, -2, "__metatable");
}

/* Make the table at proxy a read-only view of the table at shadow. */
static void set_shadow(lua_State *L, int proxy, int shadow)
{
    push_registry(L, &key_ro_target);
    lua_pushvalue(L, proxy);
    lua_pushvalue(L, shadow);
    lua_rawset(L, -3);
    lua_pop(L, 1);
    push_ro_metatable(L, ro_pairs);
    lua_pushvalue(L, shadow);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, proxy);
}

/*
 * Push a read-only view of the table at idx (other values are pushed as is).
 *
 * The view is an empty proxy whose metatable's __index is a shadow: a copy
 * of the table with every nested table replaced by its own view.  Reads are
 * then plain table lookups inside the VM, with no C call, which matters
 * because policies read the configuration and the library on every request.
 * The copy is made once; the table must not change afterwards (modules are
 * complete when require returns, the configuration never changes).
 */
static void push_readonly_at(lua_State *L, int idx, int depth)
{
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx)) {
        lua_pushvalue(L, idx);
        return;
    }
    if (is_proxy(L, idx)) {
        lua_pushvalue(L, idx);
        return;
    }
    push_registry(L, &key_ro_cache);
    lua_pushvalue(L, idx);
    if (lua_rawget(L, -2) == LUA_TTABLE) {
        lua_remove(L, -2);
        return;
    }
    lua_pop(L, 2);
    luaL_checkstack(L, 10, "read-only table too deep");
    lua_newtable(L); /* the proxy */
    int proxy = lua_gettop(L);
    lua_newtable(L); /* the shadow, keeping the array/object mark */
    int shadow = lua_gettop(L);
    if (lua_getmetatable(L, idx))
        lua_setmetatable(L, shadow);
    push_registry(L, &key_ro_cache); /* before filling: cycles find the proxy */
    lua_pushvalue(L, idx);
    lua_pushvalue(L, proxy);
    lua_rawset(L, -3);
    lua_pop(L, 1);
    set_shadow(L, proxy, shadow);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (depth < LB_MAX_DEPTH)
            push_readonly_at(L, -1, depth + 1);
        else
            lua_pushnil(L); /* deeper than anything converted from JSON */
        lua_pushvalue(L, -3);
        lua_insert(L, -2);
        lua_rawset(L, shadow);
        lua_pop(L, 1);
    }
    lua_settop(L, proxy);
}

static void push_readonly(lua_State *L, int idx)
{
    push_readonly_at(L, idx, 0);
}

static void make_ro_metatable(lua_State *L)
{
    const void *weak[] = {&key_ro_target, &key_ro_cache};
    for (int i = 0; i < 2; i++) {
        lua_newtable(L);
        lua_newtable(L);
        lua_pushliteral(L, "k");
        lua_setfield(L, -2, "__mode");
        lua_setmetatable(L, -2);
        lua_rawsetp(L, LUA_REGISTRYINDEX, weak[i]);
    }
}

/* ---- JSON -> Lua ------------------------------------------------------- */

static void mark(lua_State *L, const void *mt_key)
{
    push_registry(L, mt_key);
    lua_setmetatable(L, -2);
}

static bool is_null(lua_State *L, int idx)
{
    return lua_touserdata(L, idx) == (void *)&key_null_marker;
}

static void push_scalar(lua_State *L, const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_STRING:
        lua_pushlstring(L, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        lua_pushinteger(L, (lua_Integer)json_integer_value(v));
        break;
    case JSON_REAL:
        lua_pushnumber(L, json_real_value(v));
        break;
    case JSON_TRUE:
    case JSON_FALSE:
        lua_pushboolean(L, json_is_true(v));
        break;
    default:
        lua_pushlightuserdata(L, (void *)&key_null_marker);
        break;
    }
}

/*
 * The conversion keeps the two marking metatables at fixed stack slots
 * (mts, mts + 1: object, array) rather than fetching them from the registry
 * for every table, and hands keys over with their length.
 */
static int push_json(lua_State *L, const json_t *v, int depth, int mts)
{
    if (depth > LB_MAX_DEPTH)
        return -1;
    luaL_checkstack(L, 4, "JSON too deep");
    size_t i, n, key_len;
    const char *key;
    json_t *item;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        lua_createtable(L, 0, (int)json_object_size(v));
        lua_pushvalue(L, mts);
        lua_setmetatable(L, -2);
        json_object_keylen_foreach((json_t *)v, key, key_len, item)
        {
            lua_pushlstring(L, key, key_len);
            if (push_json(L, item, depth + 1, mts))
                return -1;
            lua_rawset(L, -3);
        }
        return 0;
    case JSON_ARRAY:
        n = json_array_size(v);
        lua_createtable(L, (int)n, 0);
        lua_pushvalue(L, mts + 1);
        lua_setmetatable(L, -2);
        for (i = 0; i < n; i++) {
            if (push_json(L, json_array_get(v, i), depth + 1, mts))
                return -1;
            lua_rawseti(L, -2, (lua_Integer)i + 1);
        }
        return 0;
    default:
        push_scalar(L, v);
        return 0;
    }
}

/* Push v or raise a Lua error that says it is too deep. */
static void push_json_or_raise(lua_State *L, const json_t *v, const char *what)
{
    int top = lua_gettop(L);
    push_registry(L, &key_object_mt);
    push_registry(L, &key_array_mt);
    if (push_json(L, v, 0, top + 1)) {
        lua_settop(L, top);
        luaL_error(L, "%s nests deeper than %d levels", what, LB_MAX_DEPTH);
    }
    lua_remove(L, top + 1); /* the two metatables under the value */
    lua_remove(L, top + 1);
}

/* ---- lazy tables ------------------------------------------------------ */

/*
 * The request's object reaches Lua lazily: an object or array is first a
 * "stub", a table with a lazy metatable whose only entry is hidden: its
 * JSON source (a light userdata key) and the request it belongs to (an
 * integer value, vm->epoch).  The first read, write, length or pairs on a
 * stub drops that entry, fills the table one level deep (children are stubs
 * in turn) and gives it its plain mark, after which it is an ordinary
 * table.  Policies read a fraction of a pod, so most of it is never
 * converted, and the diff knows without looking that a stub still holding
 * its original source is unchanged.  next, rawget and rawlen are wrapped to
 * fill a stub first; nothing else in the sandbox reads a table raw.  A stub
 * kept past its request fills as empty: its epoch is over.
 *
 *
 * Validate sees the object frozen: the same tables (as mutate left them),
 * each behind a frozen proxy made when it is first reached.  A frozen proxy
 * is a table whose only entry is hidden (a light userdata key: the table it
 * shows); its metatable, one for all of them, reads through to that table,
 * gives nested tables behind their own proxies and raises on any write.
 * The request keeps one proxy per table, so nothing is copied and nothing a
 * policy can reach in validate is writable.
 */

/* The two lazy metatables, pushed by integer registry refs (array lookups). */
static void push_lazy_mts(lua_State *L)
{
    const struct lb_vm *vm = vm_of(L);
    luaL_checkstack(L, 6, "object too deep");
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->lazy_mt_ref[0]);
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->lazy_mt_ref[1]);
}

/* Push v, a container as a stub; mts is where push_lazy_mts put the object one. */
static void push_lazy_at(lua_State *L, const json_t *v, int mts)
{
    if (!json_is_object(v) && !json_is_array(v)) {
        push_scalar(L, v);
        return;
    }
    bool array = json_is_array(v);
    /* Sized now: filling an empty table later would grow it step by step. */
    int n = (int)(array ? json_array_size(v) : json_object_size(v));
    lua_createtable(L, array ? n : 0, array ? 1 : n + 1);
    lua_pushvalue(L, mts + array);
    lua_setmetatable(L, -2);
    lua_pushlightuserdata(L, (void *)v);
    lua_pushinteger(L, vm_of(L)->epoch);
    lua_rawset(L, -3);
}

/*
 * Replace the table on the top of the stack with its frozen proxy (made
 * once per request); other values, read-only proxies included, stay.
 */
static void freeze(lua_State *L)
{
    if (!lua_istable(L, -1))
        return;
    luaL_checkstack(L, 4, "object too deep");
    lua_rawgetp(L, LUA_REGISTRYINDEX, &key_frozen_cache);
    lua_pushvalue(L, -2);
    if (lua_rawget(L, -2) == LUA_TTABLE) {
        lua_replace(L, -3);
        lua_pop(L, 1);
        return;
    }
    lua_pop(L, 1);
    if (is_proxy(L, -2)) {
        lua_pop(L, 1);
        return;
    }
    lua_createtable(L, 0, 1); /* the proxy */
    lua_pushvalue(L, -3);
    lua_rawsetp(L, -2, &key_shadow);
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm_of(L)->frozen_mt_ref);
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -3);
    lua_pushvalue(L, -2);
    lua_rawset(L, -4); /* cache[table] = proxy */
    lua_replace(L, -3);
    lua_pop(L, 1);
}

/* A frozen proxy's metamethods: read through to the table it shows, refuse writes. */
static int frozen_index(lua_State *L)
{
    lua_settop(L, 2);
    lua_rawgetp(L, 1, &key_shadow);
    lua_replace(L, 1);
    materialize_if_lazy(L, 1);
    lua_pushvalue(L, 2);
    lua_rawget(L, 1);
    freeze(L);
    return 1;
}

static int frozen_newindex(lua_State *L)
{
    return luaL_error(L, "the object is read-only in validate (edit it in mutate)");
}

static int frozen_next(lua_State *L)
{
    lua_settop(L, 2);
    unproxy(L, 1);
    if (!lua_next(L, 1))
        return 0;
    freeze(L);
    return 2;
}

static int frozen_pairs(lua_State *L)
{
    lua_pushcfunction(L, frozen_next);
    lua_pushvalue(L, 1);
    lua_pushnil(L);
    return 3;
}

/*
 * The JSON source of the stub at idx, NULL when its request is over.  With
 * take, the hidden entry is removed.
 */
static const json_t *stub_source(lua_State *L, int idx, bool take)
{
    lua_pushnil(L);
    if (!lua_next(L, idx))
        return NULL;
    const json_t *v = lua_touserdata(L, -2);
    if (lua_tointeger(L, -1) != vm_of(L)->epoch)
        v = NULL;
    lua_pop(L, 1);
    if (take) {
        lua_pushnil(L);
        lua_rawset(L, idx);
    } else {
        lua_pop(L, 1);
    }
    return v;
}

/* Fill the stub at idx one level deep and give it its plain mark. */
static void materialize(lua_State *L, int idx, enum shape shape)
{
    idx = lua_absindex(L, idx);
    int top = lua_gettop(L);
    const json_t *v = stub_source(L, idx, true), *item;
    push_registry(L, shape == SHAPE_LAZY_ARRAY ? &key_array_mt : &key_object_mt);
    lua_setmetatable(L, idx);
    push_lazy_mts(L);
    const char *key;
    size_t key_len, i;
    if (json_is_object(v)) {
        json_object_keylen_foreach((json_t *)v, key, key_len, item)
        {
            lua_pushlstring(L, key, key_len);
            push_lazy_at(L, item, top + 1);
            lua_rawset(L, idx);
        }
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, item)
        {
            push_lazy_at(L, item, top + 1);
            lua_rawseti(L, idx, (lua_Integer)i + 1);
        }
    }
    lua_settop(L, top);
}

static void materialize_if_lazy(lua_State *L, int idx)
{
    enum shape s = shape_of(L, idx);
    if (is_lazy(s))
        materialize(L, idx, s);
}

/* Push the request's object, lazily. */
static void push_lazy(lua_State *L, const json_t *v)
{
    int top = lua_gettop(L);
    push_lazy_mts(L);
    push_lazy_at(L, v, top + 1);
    lua_replace(L, top + 1);
    lua_settop(L, top + 1);
}

/* A stub's metamethods: fill it, then do the raw operation. */
static int lazy_index(lua_State *L)
{
    materialize_if_lazy(L, 1);
    lua_settop(L, 2);
    lua_rawget(L, 1);
    return 1;
}

static int lazy_newindex(lua_State *L)
{
    materialize_if_lazy(L, 1);
    lua_settop(L, 3);
    lua_rawset(L, 1);
    return 0;
}

static int lazy_len(lua_State *L)
{
    materialize_if_lazy(L, 1);
    lua_pushinteger(L, (lua_Integer)lua_rawlen(L, 1));
    return 1;
}

static int raw_next(lua_State *L)
{
    lua_settop(L, 2);
    if (lua_next(L, 1))
        return 2;
    lua_pushnil(L);
    return 1;
}

static int lazy_pairs(lua_State *L)
{
    materialize_if_lazy(L, 1);
    lua_pushcfunction(L, raw_next);
    lua_pushvalue(L, 1);
    lua_pushnil(L);
    return 3;
}

/* The sandbox's next, rawget and rawlen: as Lua's, after filling a stub. */
/* (A read-only proxy is read through its shadow, which holds its members.) */
static int l_next(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    if (shape_of(L, 1) == SHAPE_FROZEN) {
        if (frozen_next(L))
            return 2;
        lua_pushnil(L);
        return 1;
    }
    unproxy(L, 1);
    materialize_if_lazy(L, 1);
    return raw_next(L);
}

static int l_rawget(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_checkany(L, 2);
    if (shape_of(L, 1) == SHAPE_FROZEN)
        return frozen_index(L);
    unproxy(L, 1);
    return lazy_index(L);
}

static int l_rawlen(lua_State *L)
{
    int t = lua_type(L, 1);
    luaL_argexpected(L, t == LUA_TTABLE || t == LUA_TSTRING, 1, "table or string");
    unproxy(L, 1);
    return lazy_len(L);
}

/* The marking metatables, each hiding itself behind its shape's name. */
static void make_marks(lua_State *L, struct lb_vm *vm)
{
    static const luaL_Reg lazy[] = {{"__index", lazy_index},
                                    {"__newindex", lazy_newindex},
                                    {"__len", lazy_len},
                                    {"__pairs", lazy_pairs},
                                    {NULL, NULL}};
    static const luaL_Reg frozen[] = {{"__index", frozen_index},
                                      {"__newindex", frozen_newindex},
                                      {"__len", ro_len},
                                      {"__pairs", frozen_pairs},
                                      {NULL, NULL}};
    const struct {
        const void *key;
        const char *name;
        enum shape shape;
    } marks[] = {{&key_object_mt, "object", SHAPE_OBJECT},
                 {&key_array_mt, "array", SHAPE_ARRAY},
                 {NULL, "object", SHAPE_LAZY_OBJECT},
                 {NULL, "array", SHAPE_LAZY_ARRAY},
                 {NULL, "read-only", SHAPE_FROZEN}};
    for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++) {
        lua_newtable(L);
        if (is_lazy(marks[i].shape))
            luaL_setfuncs(L, lazy, 0);
        else if (marks[i].shape == SHAPE_FROZEN)
            luaL_setfuncs(L, frozen, 0);
        lua_pushstring(L, marks[i].name);
        lua_setfield(L, -2, "__metatable");
        vm->marks[marks[i].shape] = lua_topointer(L, -1);
        if (is_lazy(marks[i].shape))
            vm->lazy_mt_ref[marks[i].shape - SHAPE_LAZY_OBJECT] = luaL_ref(L, LUA_REGISTRYINDEX);
        else if (marks[i].shape == SHAPE_FROZEN)
            vm->frozen_mt_ref = luaL_ref(L, LUA_REGISTRYINDEX);
        else
            lua_rawsetp(L, LUA_REGISTRYINDEX, marks[i].key);
    }
}

/* True when a value inside v sits deeper than LB_MAX_DEPTH (v is at depth). */
static bool too_deep(const json_t *v, int depth)
{
    size_t i;
    const char *key;
    json_t *item;
    if (json_is_array(v)) {
        json_array_foreach(v, i, item) if (depth >= LB_MAX_DEPTH ||
                                           too_deep(item, depth + 1)) return true;
    } else if (json_is_object(v)) {
        json_object_foreach((json_t *)v, key, item)
        {
            if (depth >= LB_MAX_DEPTH || too_deep(item, depth + 1))
                return true;
        }
    }
    return false;
}

/* ---- Lua -> JSON ------------------------------------------------------- */

/* The path of the value being converted, for error messages. */
struct path {
    int depth;
    struct {
        const char *key; /* NULL for an array index */
        size_t index;
    } seg[LB_MAX_DEPTH + 2];
};

static void path_format(const struct path *p, char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < p->depth && used < size; i++) {
        int n = p->seg[i].key ? snprintf(out + used, size - used, "/%s", p->seg[i].key)
                              : snprintf(out + used, size - used, "/%zu", p->seg[i].index);
        used += n > 0 ? (size_t)n : 0;
    }
    if (!out[0])
        snprintf(out, size, "/");
}

static enum gg_status path_fail(const struct path *p, struct gg_err *err, const char *what)
{
    char where[160];
    path_format(p, where, sizeof(where));
    return gg_fail(err, GG_ERR_INVALID, "%s at %s", what, where);
}

static enum gg_status to_json(lua_State *L, int idx, struct path *p, json_t **out,
                              struct gg_err *err);

/* Which shape an unmarked table has: 1 array, 0 object, -1 neither, -2 empty. */
static int infer_shape(lua_State *L, int idx)
{
    size_t n = lua_rawlen(L, idx), count = 0;
    bool all_strings = true;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        count++;
        if (lua_type(L, -2) != LUA_TSTRING)
            all_strings = false;
        lua_pop(L, 1);
    }
    if (count == 0)
        return -2;
    if (count == n && n > 0)
        return 1;
    return all_strings ? 0 : -1;
}

/* v, or a failure that names the path when making it ran out of memory. */
static enum gg_status made(json_t *v, struct path *p, struct gg_err *err)
{
    return v ? GG_OK : path_fail(p, err, "out of memory");
}

static enum gg_status array_to_json(lua_State *L, int idx, struct path *p, json_t **out,
                                    struct gg_err *err)
{
    size_t n = lua_rawlen(L, idx);
    json_t *arr = json_array();
    if (!arr)
        return made(arr, p, err);
    for (size_t i = 1; i <= n; i++) {
        json_t *item;
        p->seg[p->depth].key = NULL;
        p->seg[p->depth].index = i - 1;
        p->depth++;
        lua_rawgeti(L, idx, (lua_Integer)i);
        enum gg_status st = to_json(L, -1, p, &item, err);
        lua_pop(L, 1);
        p->depth--;
        if (st != GG_OK) {
            json_decref(arr);
            return st;
        }
        if (json_array_append_new(arr, item) != 0) {
            json_decref(arr);
            return made(NULL, p, err);
        }
    }
    *out = arr;
    return GG_OK;
}

static enum gg_status object_to_json(lua_State *L, int idx, struct path *p, json_t **out,
                                     struct gg_err *err)
{
    json_t *obj = json_object();
    enum gg_status st = made(obj, p, err);
    lua_pushnil(L);
    while (st == GG_OK && lua_next(L, idx)) {
        if (lua_type(L, -2) != LUA_TSTRING) {
            st = path_fail(p, err, "an object has a key that is not a string");
            lua_pop(L, 2);
            break;
        }
        size_t klen;
        const char *key = lua_tolstring(L, -2, &klen);
        p->seg[p->depth].key = key;
        p->depth++;
        json_t *item = NULL;
        st = to_json(L, -1, p, &item, err);
        p->depth--;
        if (st == GG_OK && json_object_setn_new(obj, key, klen, item) != 0)
            st = path_fail(p, err, "an object key is not valid UTF-8");
        lua_pop(L, 1);
        if (st != GG_OK)
            lua_pop(L, 1);
    }
    if (st != GG_OK) {
        json_decref(obj);
        return st;
    }
    *out = obj;
    return GG_OK;
}

static enum gg_status table_to_json(lua_State *L, int idx, struct path *p, json_t **out,
                                    struct gg_err *err)
{
    if (p->depth > LB_MAX_DEPTH)
        return path_fail(p, err, "nesting deeper than 100 levels");
    lua_pushvalue(L, idx);
    unproxy(L, -1);
    int t = lua_gettop(L);
    luaL_checkstack(L, 6, "object too deep");
    materialize_if_lazy(L, t); /* moved from elsewhere: convert what it holds */
    int shape;
    if (lua_getmetatable(L, t)) {
        lua_pop(L, 1);
        shape = shape_of(L, t) == SHAPE_ARRAY ? 1 : 0;
    } else {
        shape = infer_shape(L, t);
    }
    enum gg_status st;
    if (shape == -2)
        st = path_fail(p, err,
                       "an empty table is ambiguous: use gpuguard.array() or gpuguard.object()");
    else if (shape == -1)
        st = path_fail(p, err, "a table mixes array and object keys");
    else
        st = shape == 1 ? array_to_json(L, t, p, out, err) : object_to_json(L, t, p, out, err);
    lua_pop(L, 1);
    return st;
}

static enum gg_status to_json(lua_State *L, int idx, struct path *p, json_t **out,
                              struct gg_err *err)
{
    idx = lua_absindex(L, idx);
    size_t len;
    const char *s;
    switch (lua_type(L, idx)) {
    case LUA_TTABLE:
        return table_to_json(L, idx, p, out, err);
    case LUA_TSTRING:
        s = lua_tolstring(L, idx, &len);
        *out = json_stringn(s, len);
        return *out ? GG_OK : path_fail(p, err, "a string is not valid UTF-8");
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) {
            *out = json_integer((json_int_t)lua_tointeger(L, idx));
            return made(*out, p, err);
        }
        if (!isfinite(lua_tonumber(L, idx)))
            return path_fail(p, err, "a number is not finite (JSON has no inf or nan)");
        *out = json_real(lua_tonumber(L, idx));
        return made(*out, p, err);
    case LUA_TBOOLEAN:
        *out = json_boolean(lua_toboolean(L, idx));
        return GG_OK;
    case LUA_TLIGHTUSERDATA:
        if (is_null(L, idx)) {
            *out = json_null();
            return GG_OK;
        }
        /* fall through */
    default:;
        char what[64];
        snprintf(what, sizeof(what), "a %s cannot be converted to JSON", luaL_typename(L, idx));
        return path_fail(p, err, what);
    }
}

static enum gg_status lua_to_json(lua_State *L, int idx, json_t **out, struct gg_err *err)
{
    struct path p = {0};
    return to_json(L, idx, &p, out, err);
}

/* ---- the gpuguard module ---------------------------------------------- */

static void push_copy(lua_State *L, int idx);

/*
 * gpuguard.array(t) / gpuguard.object(t): t marked, and returned.  A
 * read-only table (configuration, library, request) is never changed: the
 * result is a marked shallow copy (its nested tables stay read-only), so
 * `spec.nodeSelector = gg.object(pool.node_selector)` works and leaves the
 * pool as it was.  A table whose metatable is protected is refused.
 */
static int l_mark(lua_State *L, const void *mt_key)
{
    if (lua_isnoneornil(L, 1))
        lua_newtable(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    enum shape shape = shape_of(L, 1);
    if (is_proxy(L, 1)) {
        push_copy(L, 1);
        lua_replace(L, 1);
    } else if (is_lazy(shape)) {
        materialize(L, 1, shape); /* its hidden entry must not become a member */
    } else if (shape == SHAPE_NONE && luaL_getmetafield(L, 1, "__metatable") != LUA_TNIL) {
        return luaL_error(L, "cannot mark a table whose metatable is protected");
    }
    mark(L, mt_key);
    return 1;
}

static int l_array(lua_State *L)
{
    return l_mark(L, &key_array_mt);
}

static int l_object(lua_State *L)
{
    return l_mark(L, &key_object_mt);
}

static enum shape arg_shape(lua_State *L)
{
    lua_settop(L, 1);
    unproxy(L, 1);
    enum shape s = shape_of(L, 1);
    return s == SHAPE_LAZY_OBJECT ? SHAPE_OBJECT : s == SHAPE_LAZY_ARRAY ? SHAPE_ARRAY : s;
}

static int l_is_array(lua_State *L)
{
    lua_pushboolean(L, arg_shape(L) == SHAPE_ARRAY);
    return 1;
}

static int l_is_object(lua_State *L)
{
    lua_pushboolean(L, arg_shape(L) == SHAPE_OBJECT);
    return 1;
}

static int l_quantity(lua_State *L)
{
    const char *s = luaL_checkstring(L, 1);
    int64_t milli;
    struct gg_err err = {{0}};
    if (qty_parse(s, &milli, NULL, &err) != GG_OK) {
        lua_pushnil(L);
        lua_pushstring(L, err.msg);
        return 2;
    }
    lua_pushinteger(L, (lua_Integer)milli);
    return 1;
}

static int l_format_quantity(lua_State *L)
{
    lua_Integer milli = luaL_checkinteger(L, 1);
    static const char *const names[] = {"DecimalSI", "BinarySI", "DecimalExponent", NULL};
    static const enum qty_format formats[] = {QTY_DECIMAL_SI, QTY_BINARY_SI, QTY_DECIMAL_EXPONENT};
    int f = luaL_checkoption(L, 2, "DecimalSI", names);
    char out[QTY_STR_MAX];
    if (qty_format_milli((int64_t)milli, formats[f], out, sizeof(out)) != GG_OK)
        return luaL_error(L, "cannot format quantity %I", milli);
    lua_pushstring(L, out);
    return 1;
}

static int l_log(lua_State *L)
{
    static const char *const levels[] = {"debug", "info", "warn", "error", NULL};
    int level = luaL_checkoption(L, 1, NULL, levels);
    const char *msg = luaL_checkstring(L, 2);
    lua_Debug ar;
    char where[128] = "";
    if (lua_getstack(L, 1, &ar) && lua_getinfo(L, "Sl", &ar))
        snprintf(where, sizeof(where), "%s:%d", ar.short_src, ar.currentline);
    log_fields((enum log_level)level, msg, json_pack("{s:s}", "lua", where));
    return 0;
}

static int l_usage(lua_State *L)
{
    const char *ns = luaL_checkstring(L, 1);
    const char *cls = luaL_optstring(L, 2, NULL);
    struct inventory *inv = vm_of(L)->inventory;
    lua_pushinteger(L, inv ? (lua_Integer)inv_usage(inv, ns, cls) : 0);
    lua_pushboolean(L, inv && inv_ready(inv));
    return 2;
}

/*
 * gpuguard.rightsize(namespace, name, owner_kind, owner_name): the usage
 * history of the workload a pod (or, with its own kind and name as the
 * owner, a workload) belongs to: a table, or nil, why ("off", "no data
 * yet", "stale", "unknown") and the workload's name.
 */
static int l_rightsize(lua_State *L)
{
    const char *ns = luaL_checkstring(L, 1), *name = luaL_checkstring(L, 2);
    const char *kind = luaL_optstring(L, 3, NULL), *owner = luaL_optstring(L, 4, NULL);
    char workload[512];
    if (!(kind && owner ? of_from_owner(kind, owner, workload, sizeof(workload))
                        : of_from_pod_name(name, workload, sizeof(workload))))
        return luaL_error(L, "gpuguard.rightsize: name too long");
    struct rs_usage u;
    int64_t window_s = 0, age_s = 0;
    static const char *const why[] = {"", "off", "no data yet", "stale", "unknown"};
    enum rss_result r = rss_lookup(ns, workload, &u, &window_s, &age_s);
    if (r != RSS_FOUND) {
        lua_pushnil(L);
        lua_pushstring(L, why[r]);
        lua_pushstring(L, workload);
        return 3;
    }
    lua_createtable(L, 0, 8);
    lua_pushstring(L, workload);
    lua_setfield(L, -2, "workload");
    lua_pushnumber(L, u.peak_mib);
    lua_setfield(L, -2, "peak_mib");
    lua_pushinteger(L, u.last_s > u.first_s ? u.last_s - u.first_s : 0);
    lua_setfield(L, -2, "history_s");
    lua_pushinteger(L, window_s);
    lua_setfield(L, -2, "window_s");
    lua_pushinteger(L, age_s);
    lua_setfield(L, -2, "age_s");
    lua_pushinteger(L, u.pods);
    lua_setfield(L, -2, "pods");
    return 1;
}

/* gpuguard.rightsize_report(namespace, workload, action, requested_milli, needed_milli) */
static int l_rightsize_report(lua_State *L)
{
    static const char *const actions[] = {"none", "recommend", "apply", NULL};
    const char *ns = luaL_checkstring(L, 1), *workload = luaL_checkstring(L, 2);
    int action = luaL_checkoption(L, 3, NULL, actions);
    rss_report(ns, workload, actions[action], (int64_t)luaL_checkinteger(L, 4),
               (int64_t)luaL_checkinteger(L, 5));
    return 0;
}

/*
 * gpuguard.dra(kind, namespace, name): a kept ResourceClaim or
 * ResourceClaimTemplate; nil when there is none; nil and a message when
 * whether there is one could not be known.
 */
static int l_dra(lua_State *L)
{
    const char *kind = luaL_checkstring(L, 1);
    const char *ns = luaL_checkstring(L, 2);
    const char *name = luaL_checkstring(L, 3);
    struct inventory *inv = vm_of(L)->inventory;
    struct gg_err err = {{0}};
    /* A template not kept yet is asked of the API server: that GET ends before the budget's
     * deadline, leaving the policy time to act on its failure. */
    int64_t deadline = vm_of(L)->deadline_us; /* 0: none */
    if (deadline)
        deadline = deadline > LB_WAIT_RESERVE_US ? deadline - LB_WAIT_RESERVE_US : 1;
    json_t *obj = inv ? inv_dra_get(inv, kind, ns, name, deadline, &err) : NULL;
    if (!obj) {
        lua_pushnil(L);
        if (!err.msg[0])
            return 1;
        lua_pushstring(L, err.msg);
        return 2;
    }
    int top = lua_gettop(L);
    push_registry(L, &key_object_mt);
    push_registry(L, &key_array_mt);
    int bad = push_json(L, obj, 0, top + 1);
    json_decref(obj); /* before a raise, which would not return here */
    if (bad) {
        lua_settop(L, top);
        return luaL_error(L, "%s %s/%s nests deeper than %d levels", kind, ns, name, LB_MAX_DEPTH);
    }
    lua_remove(L, top + 1); /* the two metatables under the value */
    lua_remove(L, top + 1);
    return 1;
}

static int l_print(lua_State *L)
{
    int n = lua_gettop(L); /* before luaL_buffinit, which may push a placeholder */
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 1; i <= n; i++) {
        if (i > 1)
            luaL_addchar(&b, '\t');
        luaL_tolstring(L, i, NULL);
        luaL_addvalue(&b);
    }
    luaL_pushresult(&b);
    log_msg(LOG_INFO, "%s", lua_tostring(L, -1));
    return 0;
}

static void open_gpuguard_module(lua_State *L)
{
    static const luaL_Reg funcs[] = {{"array", l_array},
                                     {"object", l_object},
                                     {"is_array", l_is_array},
                                     {"is_object", l_is_object},
                                     {"quantity", l_quantity},
                                     {"format_quantity", l_format_quantity},
                                     {"log", l_log},
                                     {"usage", l_usage},
                                     {"rightsize", l_rightsize},
                                     {"rightsize_report", l_rightsize_report},
                                     {"dra", l_dra}, /* lua/intent.lua's DRA lookups */
                                     {NULL, NULL}};
    luaL_newlib(L, funcs);
    lua_pushlightuserdata(L, (void *)&key_null_marker);
    lua_setfield(L, -2, "null");
    lua_rawsetp(L, LUA_REGISTRYINDEX, &key_module);
}

/* ---- sandbox ---------------------------------------------------------- */

/* setmetatable without __gc: a finalizer would run outside any budget. */
static int l_setmetatable(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    if (lua_istable(L, 2) && lua_getfield(L, 2, "__gc") != LUA_TNIL)
        return luaL_error(L, "__gc metamethods are not allowed in policies");
    lua_settop(L, 2);
    lua_getglobal(L, "setmetatable");
    lua_insert(L, 1);
    lua_call(L, 2, 1);
    return 1;
}

/* ---- library functions that run long in C ---------------------------- */

/*
 * The budgets act between Lua instructions; these library functions could
 * loop in C for hours on one call.  The pattern functions use gpuguard's
 * own matcher (luapattern.c), which counts its steps against the
 * instruction budget and checks the deadline; the functions that loop over
 * a count refuse counts that could not fit in the VM's memory anyway.
 */

/* A pattern match's budget check: its steps count as instructions. */
static bool pattern_budget(void *ctx)
{
    struct lb_vm *vm = ctx;
    if (vm->kill == LB_DONE && vm->running) {
        vm->used += LP_CHECK_STEPS;
        if (vm->used > vm->limits.instructions)
            arm_kill(vm, LB_OUT_OF_BUDGET);
        else if (vm->deadline_us && gg_now_us() > vm->deadline_us)
            arm_kill(vm, LB_OUT_OF_TIME);
    }
    return vm->kill != LB_DONE;
}

static int pattern_error(lua_State *L, const struct lp_state *ms)
{
    if (ms->stopped)
        return luaL_error(L, "%s", kill_message(vm_of(L)->kill));
    return luaL_error(L, "%s", ms->error);
}

/* The subject of a pattern function (argument 1), at most LB_MAX_PATTERN_SUBJECT bytes. */
static const char *subject(lua_State *L, size_t *len)
{
    const char *s = luaL_checklstring(L, 1, len);
    if (*len > LB_MAX_PATTERN_SUBJECT)
        luaL_error(L, "pattern matching on a string of %d bytes (the limit is %d)", (int)*len,
                   LB_MAX_PATTERN_SUBJECT);
    return s;
}

/* Where a match starts for init (1-based, negative from the end), as string.find. */
static size_t start_index(lua_Integer pos, size_t len)
{
    if (pos > 0)
        return (size_t)pos;
    if (pos == 0 || pos < -(lua_Integer)len)
        return 1;
    return len + (size_t)pos + 1;
}

/* Capture i of the match [s, e): the whole match when there are no captures. */
static void push_capture(lua_State *L, const struct lp_state *ms, int i, const char *s,
                         const char *e)
{
    if (i >= ms->level) {
        if (i != 0)
            luaL_error(L, "invalid capture index %%%d", i + 1);
        lua_pushlstring(L, s, (size_t)(e - s));
    } else if (ms->capture[i].len == LP_CAP_UNFINISHED) {
        luaL_error(L, "unfinished capture");
    } else if (ms->capture[i].len == LP_CAP_POSITION) {
        lua_pushinteger(L, (lua_Integer)(ms->capture[i].init - ms->src) + 1);
    } else {
        lua_pushlstring(L, ms->capture[i].init, (size_t)ms->capture[i].len);
    }
}

/* All captures (the whole match when there are none and s is set). */
static int push_captures(lua_State *L, const struct lp_state *ms, const char *s, const char *e)
{
    int n = ms->level == 0 && s ? 1 : ms->level;
    luaL_checkstack(L, n, "too many captures");
    for (int i = 0; i < n; i++)
        push_capture(L, ms, i, s, e);
    return n;
}

static int find_or_match(lua_State *L, bool find)
{
    size_t ls, lp;
    const char *s = subject(L, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    size_t init = start_index(luaL_optinteger(L, 3, 1), ls) - 1;
    if (init > ls) {
        luaL_pushfail(L);
        return 1;
    }
    const char *start, *end;
    if (find && (lua_toboolean(L, 4) || lp_plain(p, lp))) {
        start = lp_memfind(s + init, ls - init, p, lp);
        if (start) {
            lua_pushinteger(L, (lua_Integer)(start - s) + 1);
            lua_pushinteger(L, (lua_Integer)(start - s + lp));
            return 2;
        }
    } else {
        struct lp_state ms;
        lp_init(&ms, s, ls, p, lp, true, pattern_budget, vm_of(L));
        int found = lp_find(&ms, s + init, NULL, &start, &end);
        if (found < 0)
            return pattern_error(L, &ms);
        if (found && find) {
            lua_pushinteger(L, (lua_Integer)(start - s) + 1);
            lua_pushinteger(L, (lua_Integer)(end - s));
            return push_captures(L, &ms, NULL, NULL) + 2;
        }
        if (found)
            return push_captures(L, &ms, start, end);
    }
    luaL_pushfail(L);
    return 1;
}

static int l_find(lua_State *L)
{
    return find_or_match(L, true);
}

static int l_match(lua_State *L)
{
    return find_or_match(L, false);
}

/* gmatch's state, kept with the subject and pattern as the iterator's upvalues. */
struct gmatch {
    struct lp_state ms;
    const char *src;  /* where the next search starts */
    const char *last; /* the end of the last match */
};

static int gmatch_next(lua_State *L)
{
    struct gmatch *gm = lua_touserdata(L, lua_upvalueindex(3));
    const char *start, *end;
    if (gm->src > gm->ms.src_end)
        return 0;
    int found = lp_find(&gm->ms, gm->src, gm->last, &start, &end);
    if (found < 0)
        return pattern_error(L, &gm->ms);
    if (!found)
        return 0;
    gm->src = gm->last = end;
    return push_captures(L, &gm->ms, start, end);
}

static int l_gmatch(lua_State *L)
{
    size_t ls, lp;
    const char *s = subject(L, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    size_t init = start_index(luaL_optinteger(L, 3, 1), ls) - 1;
    lua_settop(L, 2);
    struct gmatch *gm = lua_newuserdatauv(L, sizeof(*gm), 0);
    /* A '^' does not anchor gmatch: it would stop the iteration. */
    lp_init(&gm->ms, s, ls, p, lp, false, pattern_budget, vm_of(L));
    gm->src = s + (init > ls ? ls + 1 : init);
    gm->last = NULL;
    lua_pushcclosure(L, gmatch_next, 3);
    return 1;
}

/* gsub's replacement string for the match [s, e): %0-%9 and %%. */
static void add_replacement(lua_State *L, luaL_Buffer *b, const struct lp_state *ms, const char *s,
                            const char *e)
{
    size_t l;
    const char *text = lua_tolstring(L, 3, &l), *esc;
    while ((esc = memchr(text, '%', l)) != NULL) {
        luaL_addlstring(b, text, (size_t)(esc - text));
        esc++; /* the repl string's NUL ends a trailing '%' */
        if (*esc == '%') {
            luaL_addchar(b, '%');
        } else if (*esc == '0') {
            luaL_addlstring(b, s, (size_t)(e - s));
        } else if (isdigit((unsigned char)*esc)) {
            push_capture(L, ms, *esc - '1', s, e);
            luaL_tolstring(L, -1, NULL);
            lua_remove(L, -2);
            luaL_addvalue(b);
        } else {
            luaL_error(L, "invalid use of '%c' in replacement string", '%');
        }
        l -= (size_t)(esc + 1 - text);
        text = esc + 1;
    }
    luaL_addlstring(b, text, l);
}

/* gsub's replacement for the match [s, e), by the type of argument 3. */
static void add_value(lua_State *L, luaL_Buffer *b, const struct lp_state *ms, const char *s,
                      const char *e, int type)
{
    if (type == LUA_TFUNCTION) {
        lua_pushvalue(L, 3);
        lua_call(L, push_captures(L, ms, s, e), 1);
    } else if (type == LUA_TTABLE) {
        push_capture(L, ms, 0, s, e);
        lua_gettable(L, 3);
    } else {
        add_replacement(L, b, ms, s, e);
        return;
    }
    if (!lua_toboolean(L, -1)) { /* nil or false: keep the original */
        lua_pop(L, 1);
        luaL_addlstring(b, s, (size_t)(e - s));
    } else if (!lua_isstring(L, -1)) {
        luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
    } else {
        luaL_addvalue(b);
    }
}

static int l_gsub(lua_State *L)
{
    size_t ls, lp;
    const char *src = subject(L, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    int type = lua_type(L, 3);
    lua_Integer max = luaL_optinteger(L, 4, (lua_Integer)ls + 1), n = 0;
    luaL_argexpected(L,
                     type == LUA_TNUMBER || type == LUA_TSTRING || type == LUA_TFUNCTION ||
                         type == LUA_TTABLE,
                     3, "string/function/table");
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    struct lp_state ms;
    lp_init(&ms, src, ls, p, lp, true, pattern_budget, vm_of(L));
    const char *s = src, *last = NULL, *start, *end;
    while (n < max) {
        int found = lp_find(&ms, s, last, &start, &end);
        if (found < 0)
            return pattern_error(L, &ms);
        if (!found)
            break;
        luaL_addlstring(&b, s, (size_t)(start - s));
        n++;
        add_value(L, &b, &ms, start, end, type);
        s = last = end;
        if (ms.anchor)
            break;
    }
    luaL_addlstring(&b, s, (size_t)(ms.src_end - s));
    luaL_pushresult(&b);
    lua_pushinteger(L, n);
    return 2;
}

/* The stock function (upvalue 1) with the arguments as they are. */
static int call_stock(lua_State *L)
{
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* Refuse a count of elements that could not fit in the VM's memory (16 bytes each). */
static void check_count(lua_State *L, const char *fn, lua_Integer from, lua_Integer to)
{
    lua_Unsigned cap = vm_of(L)->limits.memory / 16;
    if (to >= from && (lua_Unsigned)to - (lua_Unsigned)from >= cap)
        luaL_error(L, "%s: %I elements cannot fit in the memory limit", fn,
                   (lua_Integer)((lua_Unsigned)to - (lua_Unsigned)from + 1));
}

static int l_rep(lua_State *L)
{
    size_t l, lsep;
    luaL_checklstring(L, 1, &l);
    lua_Integer n = luaL_checkinteger(L, 2);
    luaL_optlstring(L, 3, "", &lsep);
    if (n > 0 && l + lsep == 0) { /* empty, however many times: no loop */
        lua_pushliteral(L, "");
        return 1;
    }
    if (n > 0 && (lua_Unsigned)n > vm_of(L)->limits.memory / (l + lsep))
        return luaL_error(L, "string.rep: the result would exceed the memory limit");
    return call_stock(L);
}

static int l_move(lua_State *L)
{
    check_count(L, "table.move", luaL_checkinteger(L, 2), luaL_checkinteger(L, 3));
    return call_stock(L);
}

/* table.concat and table.unpack: list, then the range (i, j) at argument first. */
static int l_ranged(lua_State *L, const char *fn, int first)
{
    if (lua_type(L, 1) != LUA_TTABLE)
        return call_stock(L); /* it says what is wrong */
    lua_Integer i = luaL_optinteger(L, first, 1);
    lua_Integer j =
        lua_isnoneornil(L, first + 1) ? luaL_len(L, 1) : luaL_checkinteger(L, first + 1);
    check_count(L, fn, i, j);
    lua_settop(L, first + 1);
    lua_pushinteger(L, j); /* the length, once: __len may not change its mind */
    lua_replace(L, first + 1);
    return call_stock(L);
}

static int l_concat(lua_State *L)
{
    return l_ranged(L, "table.concat", 3);
}

static int l_unpack(lua_State *L)
{
    return l_ranged(L, "table.unpack", 2);
}

static int l_utf8_char(lua_State *L)
{
    check_count(L, "utf8.char", 1, lua_gettop(L));
    return call_stock(L);
}

/* Install fn as lib.name, with the stock lib.name as its upvalue. */
static void wrap(lua_State *L, const char *lib, const char *name, lua_CFunction fn)
{
    lua_getglobal(L, lib);
    lua_getfield(L, -1, name);
    lua_pushcclosure(L, fn, 1);
    lua_setfield(L, -2, name);
    lua_pop(L, 1);
}

static void guard_libraries(lua_State *L)
{
    static const luaL_Reg patterned[] = {
        {"find", l_find}, {"match", l_match}, {"gmatch", l_gmatch}, {"gsub", l_gsub}, {NULL, NULL}};
    lua_getglobal(L, "string");
    luaL_setfuncs(L, patterned, 0);
    lua_pushnil(L);
    lua_setfield(L, -2, "dump");
    /* Hide the string metatable (its __index is this string table). */
    lua_pushliteral(L, "");
    lua_getmetatable(L, -1);
    lua_pushliteral(L, "string");
    lua_setfield(L, -2, "__metatable");
    lua_pop(L, 3);
    wrap(L, "string", "rep", l_rep);
    wrap(L, "table", "move", l_move);
    wrap(L, "table", "concat", l_concat);
    wrap(L, "table", "unpack", l_unpack);
    wrap(L, "utf8", "char", l_utf8_char);
}

static int l_require(lua_State *L);

/* The globals every chunk starts with, kept in the registry as a template. */
static void build_globals(lua_State *L)
{
    static const char *const base_names[] = {
        "assert", "error",    "ipairs",   "pairs", "pcall",   "rawequal",
        "select", "tonumber", "tostring", "type",  "xpcall",  "getmetatable",
        "string", "table",    "math",     "utf8",  "_VERSION"};
    static const luaL_Reg wrapped[] = {{"next", l_next},
                                       {"rawget", l_rawget},
                                       {"rawlen", l_rawlen},
                                       {"setmetatable", l_setmetatable},
                                       {"require", l_require},
                                       {"print", l_print},
                                       {NULL, NULL}};
    lua_newtable(L);
    for (size_t i = 0; i < sizeof(base_names) / sizeof(base_names[0]); i++) {
        lua_getglobal(L, base_names[i]);
        lua_setfield(L, -2, base_names[i]);
    }
    luaL_setfuncs(L, wrapped, 0);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &key_globals);
}

/* A shallow copy of the table at idx (a proxy is copied from its shadow). */
static void push_copy(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    bool frozen = shape_of(L, idx) == SHAPE_FROZEN;
    lua_pushvalue(L, idx);
    unproxy(L, -1);
    int src = lua_gettop(L);
    lua_newtable(L);
    lua_pushnil(L);
    while (lua_next(L, src)) {
        if (frozen) /* the copy's children stay read-only */
            freeze(L);
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_rawset(L, src + 1);
    }
    lua_remove(L, src);
}

/*
 * A new environment: the policy's own copy of the globals, with its own
 * copies of the library tables.  Whatever a chunk writes stays in its own
 * tables, and reading a global is a single table lookup.
 */
static void push_env(lua_State *L)
{
    lua_newtable(L);
    int env = lua_gettop(L);
    push_registry(L, &key_globals);
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        lua_pushvalue(L, -2);
        if (lua_istable(L, -2))
            push_copy(L, -2);
        else
            lua_pushvalue(L, -2);
        lua_rawset(L, env);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    lua_pushvalue(L, env);
    lua_setfield(L, env, "_G");
}

/* Load a text chunk into its own environment; pushes the function. */
static int load_chunk(lua_State *L, const char *name, const char *text, size_t len)
{
    int st = luaL_loadbufferx(L, text, len, name, "t");
    if (st != LUA_OK)
        return st;
    push_env(L);
    lua_setupvalue(L, -2, 1);
    return LUA_OK;
}

static bool valid_module_name(const char *name)
{
    if (!*name)
        return false;
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '-'))
            return false;
    return true;
}

static int l_require(lua_State *L)
{
    const char *name = luaL_checkstring(L, 1);
    lua_settop(L, 1);
    push_registry(L, &key_loaded);
    if (lua_getfield(L, 2, name) != LUA_TNIL) {
        if (lua_toboolean(L, -1) == 0)
            return luaL_error(L, "require \"%s\": circular require", name);
        if (lua_istable(L, -1))
            push_copy(L, -1);
        return 1;
    }
    lua_pop(L, 1);
    if (strcmp(name, "gpuguard") == 0) {
        push_registry(L, &key_module);
    } else {
        struct lb_vm *vm = vm_of(L);
        const struct lb_source *src = NULL;
        for (size_t i = 0; valid_module_name(name) && i < vm->n_modules; i++)
            if (strcmp(vm->modules[i].name, name) == 0)
                src = &vm->modules[i];
        if (!src)
            return luaL_error(L, "require \"%s\": no such module in the Lua library directory",
                              name);
        lua_pushboolean(L, 0); /* loading: catches cycles */
        lua_setfield(L, 2, name);
        char chunkname[128];
        snprintf(chunkname, sizeof(chunkname), "@lua/%s.lua", name);
        if (load_chunk(L, chunkname, src->text, src->len) != LUA_OK)
            return lua_error(L);
        lua_call(L, 0, 1);
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            lua_pushboolean(L, 1);
        }
    }
    push_readonly(L, -1);
    lua_pushvalue(L, -1);
    lua_setfield(L, 2, name);
    /* Each requirer gets its own copy of the top level (nested tables stay read-only). */
    if (lua_istable(L, -1))
        push_copy(L, -1);
    return 1;
}

/*
 * req is one read-only proxy per VM that each request points at a new
 * shadow (see push_readonly).  user, old_object and options are converted
 * when a policy first reads them, by the shadow's __index: the shipped
 * policies never do, and building their read-only views every request was
 * a third of a request's set-up.
 */
static const struct {
    const char *key, *what;
    size_t offset;
} lazy_req_fields[] = {
    {"user", "userInfo", offsetof(struct adm_request, user_info)},
    {"old_object", "the old object", offsetof(struct adm_request, old_object)},
    {"options", "the options", offsetof(struct adm_request, options)},
};

static const json_t *req_json(const struct adm_request *req, size_t i)
{
    return *(json_t *const *)((const char *)req + lazy_req_fields[i].offset);
}

/* The shadow's __index (shadow, key): convert a lazy field once. */
static int req_field(lua_State *L)
{
    const struct adm_request *req = vm_of(L)->req;
    if (!req || lua_type(L, 2) != LUA_TSTRING)
        return 0;
    const char *key = lua_tostring(L, 2);
    for (size_t i = 0; i < sizeof(lazy_req_fields) / sizeof(lazy_req_fields[0]); i++) {
        if (strcmp(key, lazy_req_fields[i].key) != 0)
            continue;
        if (!req_json(req, i))
            return 0;
        push_json_or_raise(L, req_json(req, i), lazy_req_fields[i].what);
        push_readonly(L, -1);
        lua_pushvalue(L, 2);
        lua_pushvalue(L, -2);
        lua_rawset(L, 1);
        return 1;
    }
    return 0;
}

/* pairs(req) lists the lazy fields too. */
static int req_pairs(lua_State *L)
{
    push_shadow(L, 1);
    for (size_t i = 0; i < sizeof(lazy_req_fields) / sizeof(lazy_req_fields[0]); i++) {
        lua_getfield(L, -1, lazy_req_fields[i].key);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return ro_pairs(L);
}

static void make_req_proxy(lua_State *L)
{
    lua_newtable(L);
    lua_pushcfunction(L, req_field);
    lua_setfield(L, -2, "__index");
    lua_rawsetp(L, LUA_REGISTRYINDEX, &key_req_shadow_mt);
    lua_newtable(L); /* the proxy */
    push_ro_metatable(L, req_pairs);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &key_req_proxy_mt);
    lua_setmetatable(L, -2);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &key_req_proxy);
}

/* Point the req proxy at the shadow on the top of the stack (popped); push the proxy. */
static void push_req_proxy(lua_State *L)
{
    int shadow = lua_gettop(L);
    push_registry(L, &key_req_shadow_mt);
    lua_setmetatable(L, shadow);
    push_registry(L, &key_req_proxy_mt);
    lua_pushvalue(L, shadow);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
    push_registry(L, &key_req_proxy);
    push_registry(L, &key_ro_target); /* what unproxy() reads */
    lua_pushvalue(L, -2);
    lua_pushvalue(L, shadow);
    lua_rawset(L, -3);
    lua_pop(L, 1);
    lua_replace(L, shadow);
}

static int open_sandbox(lua_State *L)
{
    struct lb_vm *vm = lua_touserdata(L, 1);
    const json_t *config = lua_touserdata(L, 2);
    static const luaL_Reg libs[] = {
        {LUA_GNAME, luaopen_base},       {LUA_STRLIBNAME, luaopen_string},
        {LUA_TABLIBNAME, luaopen_table}, {LUA_MATHLIBNAME, luaopen_math},
        {LUA_UTF8LIBNAME, luaopen_utf8}, {NULL, NULL}};
    for (const luaL_Reg *lib = libs; lib->func; lib++) {
        luaL_requiref(L, lib->name, lib->func, 1);
        lua_pop(L, 1);
    }
    guard_libraries(L);
    make_ro_metatable(L);
    make_marks(L, vm);
    make_req_proxy(L);
    open_gpuguard_module(L);
    build_globals(L);
    lua_newtable(L);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &key_loaded);
    lua_newtable(L);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &key_policies);
    /* The configuration, converted once per VM and shared read-only. */
    if (config)
        push_json_or_raise(L, config, "the configuration");
    else {
        lua_newtable(L);
        mark(L, &key_object_mt);
    }
    push_readonly(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, "gpuguard.config");
    return 0;
}

enum gg_status lb_vm_new(const struct lb_limits *limits, const struct lb_source *modules,
                         size_t n_modules, const json_t *config, struct inventory *inventory,
                         struct lb_vm **out, struct gg_err *err)
{
    struct lb_vm *vm = calloc(1, sizeof(*vm));
    if (!vm)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory creating a Lua VM");
    vm->limits = *limits;
    vm->modules = modules;
    vm->n_modules = n_modules;
    vm->inventory = inventory;
    vm->obj_ref = vm->req_ref = vm->frozen_ref = LUA_NOREF;
    vm->watchdog = watchdog_new(watchdog_fired);
    vm->pool = blockpool_new(LB_POOL_RESERVE);
    vm->L = lua_newstate(lb_alloc, vm);
    if (!vm->L) {
        watchdog_free(vm->watchdog);
        blockpool_free(vm->pool);
        free(vm);
        return gg_fail(err, GG_ERR_NOMEM, "cannot create a Lua VM within %zu bytes",
                       limits->memory);
    }
    *(struct lb_vm **)lua_getextraspace(vm->L) = vm;
    /* A request's tables die young: the generational collector suits that. */
    lua_gc(vm->L, LUA_GCGEN, 0, 0);
    lua_pushcfunction(vm->L, open_sandbox);
    lua_pushlightuserdata(vm->L, vm);
    lua_pushlightuserdata(vm->L, (void *)config);
    if (lua_pcall(vm->L, 2, 0, 0) != LUA_OK) {
        gg_fail(err, GG_ERR_NOMEM, "cannot set up the Lua sandbox: %s", lua_tostring(vm->L, -1));
        lb_vm_free(vm);
        return GG_ERR_NOMEM;
    }
    *out = vm;
    return GG_OK;
}

void lb_vm_free(struct lb_vm *vm)
{
    if (!vm)
        return;
    /* Nothing a policy left behind may run while the VM closes. */
    vm->running = false;
    budget_close(vm);
    watchdog_free(vm->watchdog);
    lua_close(vm->L);
    blockpool_free(vm->pool);
    lb_report_clear(&vm->report);
    free(vm);
}

bool lb_vm_broken(const struct lb_vm *vm)
{
    return vm->broken;
}

size_t lb_vm_memory(const struct lb_vm *vm)
{
    return vm->mem;
}

size_t lb_vm_memory_peak(const struct lb_vm *vm)
{
    return vm->mem_peak;
}

int lb_policy_count(const struct lb_vm *vm)
{
    return vm->n_policies;
}

/* ---- calling into Lua ------------------------------------------------- */

static int traceback_handler(lua_State *L)
{
    const char *msg = lua_tostring(L, 1);
    if (!msg)
        msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/*
 * Call the function below nargs arguments under the budgets.  On failure
 * err gets the error's first line and *traceback the whole text.
 */
static enum lb_outcome protected_call(struct lb_vm *vm, int nargs, struct gg_err *err,
                                      char **traceback)
{
    lua_State *L = vm->L;
    int base = lua_gettop(L) - nargs;
    lua_pushcfunction(L, traceback_handler);
    lua_insert(L, base);
    vm->running = true;
    int st = lua_pcall(L, nargs, 0, base);
    vm->running = false;
    enum lb_outcome outcome = LB_DONE;
    if (st != LUA_OK) {
        outcome = vm->kill != LB_DONE ? vm->kill : st == LUA_ERRMEM ? LB_OUT_OF_MEMORY : LB_RAISED;
        if (outcome == LB_OUT_OF_MEMORY)
            vm->broken = true;
        const char *text = lua_tostring(L, -1);
        if (!text)
            text = "(no message)";
        if (traceback)
            *traceback = strdup(text);
        size_t first = strcspn(text, "\n");
        if (vm->kill != LB_DONE)
            gg_fail(err, GG_ERR_POLICY, "%s", kill_message(vm->kill));
        else
            gg_fail(err, GG_ERR_POLICY, "%.*s", (int)first, text);
    }
    lua_settop(L, base - 1);
    return outcome;
}

/* The declarative fields of the policy table at the top of the stack. */
static enum gg_status read_decl(lua_State *L, const char *file, struct lb_policy_info *info,
                                struct gg_err *err)
{
    static const char *const fields[] = {"name", "description", "mode", "failure", "match"};
    int t = lua_gettop(L);
    json_t *decl = json_object();
    if (!decl)
        return gg_fail(err, GG_ERR_NOMEM, "%s: out of memory", file);
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (lua_getfield(L, t, fields[i]) != LUA_TNIL) {
            json_t *v = NULL;
            struct gg_err sub = {{0}};
            if (lua_istable(L, -1) && infer_shape(L, lua_absindex(L, -1)) == -2 &&
                !lua_getmetatable(L, -1))
                v = json_object(); /* `match = {}`: nothing to restrict */
            else if (lua_to_json(L, -1, &v, &sub) != GG_OK) {
                json_decref(decl);
                return gg_fail(err, GG_ERR_INVALID, "%s: field %s: %s", file, fields[i], sub.msg);
            }
            if (json_object_set_new(decl, fields[i], v) != 0) {
                json_decref(decl);
                return gg_fail(err, GG_ERR_NOMEM, "%s: out of memory", file);
            }
        }
        lua_pop(L, 1);
    }
    lua_getfield(L, t, "mutate");
    lua_getfield(L, t, "validate");
    info->has_mutate = lua_isfunction(L, -2);
    info->has_validate = lua_isfunction(L, -1);
    lua_pop(L, 2);
    info->decl = decl;
    return GG_OK;
}

/*
 * Load src under chunkname and run it once under the load-time budgets (a
 * policy file, a test file).  On success its result is on the stack; on
 * failure err has the file name and the error's first line, and the stack
 * is as it was.
 */
static enum gg_status run_file(struct lb_vm *vm, const char *chunkname, const struct lb_source *src,
                               struct gg_err *err)
{
    lua_State *L = vm->L;
    int top = lua_gettop(L);
    if (load_chunk(L, chunkname, src->text, src->len) != LUA_OK) {
        gg_fail(err, GG_ERR_POLICY, "%s", lua_tostring(L, -1));
        lua_settop(L, top);
        return GG_ERR_POLICY;
    }
    lua_pushcfunction(L, traceback_handler);
    lua_insert(L, -2);
    budget_open(vm, gg_now_us() + vm->limits.load_time_us);
    vm->running = true;
    int st = lua_pcall(L, 0, 1, -2);
    vm->running = false;
    budget_close(vm);
    if (st != LUA_OK) {
        const char *text = vm->kill != LB_DONE ? kill_message(vm->kill) : lua_tostring(L, -1);
        gg_fail(err, GG_ERR_POLICY, "%s: %.*s", src->name, (int)strcspn(text, "\n"), text);
        lua_settop(L, top);
        return GG_ERR_POLICY;
    }
    lua_remove(L, -2); /* the message handler */
    return GG_OK;
}

/* lb_policy_load's arguments and result, for load_protected. */
struct load_call {
    struct lb_vm *vm;
    const struct lb_source *src;
    struct lb_policy_info *info;
    struct gg_err *err;
    enum gg_status st;
};

static enum gg_status policy_load(struct lb_vm *vm, const struct lb_source *src,
                                  struct lb_policy_info *info, struct gg_err *err);

static int load_protected(lua_State *L)
{
    struct load_call *c = lua_touserdata(L, 1);
    lua_settop(L, 0);
    c->st = policy_load(c->vm, c->src, c->info, c->err);
    return 0;
}

/* Reading the declaration makes strings, which raise on a failed allocation:
 * the load runs under lua_pcall, and such a failure refuses the policy. */
enum gg_status lb_policy_load(struct lb_vm *vm, const struct lb_source *src,
                              struct lb_policy_info *info, struct gg_err *err)
{
    memset(info, 0, sizeof(*info));
    struct load_call c = {vm, src, NULL, err, GG_ERR_NOMEM};
    c.info = info;
    lua_pushcfunction(vm->L, load_protected);
    lua_pushlightuserdata(vm->L, &c);
    if (lua_pcall(vm->L, 1, 0, 0) != LUA_OK) {
        c.st = gg_fail(err, GG_ERR_NOMEM, "%s: %s", src->name,
                       lua_tostring(vm->L, -1) ? lua_tostring(vm->L, -1) : "out of memory");
        lua_pop(vm->L, 1);
        lb_policy_info_clear(info);
    }
    return c.st;
}

static enum gg_status policy_load(struct lb_vm *vm, const struct lb_source *src,
                                  struct lb_policy_info *info, struct gg_err *err)
{
    lua_State *L = vm->L;
    int top = lua_gettop(L);
    char chunkname[160];
    snprintf(chunkname, sizeof(chunkname), "@policies/%s", src->name);
    if (run_file(vm, chunkname, src, err) != GG_OK)
        return GG_ERR_POLICY;
    if (!lua_istable(L, -1)) {
        gg_fail(err, GG_ERR_POLICY, "%s: must return a table (got %s)", src->name,
                luaL_typename(L, -1));
        lua_settop(L, top);
        return GG_ERR_POLICY;
    }
    enum gg_status gst = read_decl(L, src->name, info, err);
    if (gst == GG_OK && lua_getfield(L, -1, "check") == LUA_TFUNCTION) {
        lua_getfield(L, LUA_REGISTRYINDEX, "gpuguard.config");
        struct gg_err sub = {{0}};
        budget_open(vm, gg_now_us() + vm->limits.load_time_us);
        enum lb_outcome outcome = protected_call(vm, 1, &sub, NULL);
        budget_close(vm);
        if (outcome != LB_DONE) {
            const char *name = json_string_value(json_object_get(info->decl, "name"));
            gst = gg_fail(err, GG_ERR_POLICY, "policy %s: configuration check failed: %s",
                          name ? name : src->name, sub.msg);
        }
    } else if (gst == GG_OK) {
        lua_pop(L, 1);
    }
    if (gst != GG_OK) {
        lb_policy_info_clear(info);
        lua_settop(L, top);
        return gst;
    }
    push_registry(L, &key_policies);
    lua_pushvalue(L, -2);
    lua_rawseti(L, -2, ++vm->n_policies);
    lua_settop(L, top);
    return GG_OK;
}

void lb_policy_info_clear(struct lb_policy_info *info)
{
    if (!info)
        return;
    json_decref(info->decl);
    memset(info, 0, sizeof(*info));
}

/* ---- requests --------------------------------------------------------- */

void lb_report_clear(struct lb_report *report)
{
    if (!report)
        return;
    json_decref(report->denials);
    json_decref(report->warnings);
    json_decref(report->audit);
    memset(report, 0, sizeof(*report));
}

/* The current call's report; a part that cannot be made stays NULL (appends then fail). */
static struct lb_report *current_report(lua_State *L)
{
    struct lb_report *r = &vm_of(L)->report;
    if (!r->denials)
        r->denials = json_array();
    if (!r->warnings)
        r->warnings = json_array();
    if (!r->audit)
        r->audit = json_object();
    return r;
}

/* Messages must be valid UTF-8: they end up in JSON. */
static json_t *checked_string(lua_State *L, int idx, const char *what)
{
    size_t len;
    const char *s = luaL_checklstring(L, idx, &len);
    json_t *v = json_stringn(s, len);
    if (!v)
        luaL_error(L, "%s is not valid UTF-8", what);
    return v;
}

/* A denial that cannot be recorded fails the call even when pcall catches the error. */
static int l_req_deny(lua_State *L)
{
    struct lb_vm *vm = vm_of(L);
    bool lost = vm->report_lost;
    vm->report_lost = true;
    json_t *msg = checked_string(L, 2, "req:deny message");
    if (json_array_append_new(current_report(L)->denials, msg) != 0)
        return luaL_error(L, "req:deny: out of memory recording the denial");
    vm->report_lost = lost;
    return 0;
}

static int l_req_warn(lua_State *L)
{
    json_array_append_new(current_report(L)->warnings, checked_string(L, 2, "req:warn message"));
    return 0;
}

static int l_req_audit(lua_State *L)
{
    const char *key = luaL_checkstring(L, 2);
    json_t *value = checked_string(L, 3, "req:audit value");
    json_object_set_new(current_report(L)->audit, key, value);
    return 0;
}

static void set_string(lua_State *L, const char *key, const char *value)
{
    lua_pushstring(L, value ? value : "");
    lua_setfield(L, -2, key);
}

static int build_request(lua_State *L)
{
    const struct adm_request *req = lua_touserdata(L, 1);
    json_t *object = lua_touserdata(L, 2);
    lua_settop(L, 0);
    /* The object and the lazy fields sit at depth 3 of a review: no walk
     * when the decoder saw nothing deeper than the limit below them. */
    if (!req->depth || req->depth > LB_MAX_DEPTH + 3) {
        if (object && too_deep(object, 0))
            luaL_error(L, "the object nests deeper than %d levels", LB_MAX_DEPTH);
        for (size_t i = 0; i < sizeof(lazy_req_fields) / sizeof(lazy_req_fields[0]); i++)
            if (too_deep(req_json(req, i), 0))
                luaL_error(L, "%s nests deeper than %d levels", lazy_req_fields[i].what,
                           LB_MAX_DEPTH);
    }
    lua_newtable(L); /* this request's frozen proxies (a proxy nobody holds may go) */
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "v");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &key_frozen_cache);
    if (object)
        push_lazy(L, object);
    else
        lua_pushnil(L);
    lua_pushvalue(L, -1);
    freeze(L); /* what validate gets */
    static const luaL_Reg methods[] = {
        {"deny", l_req_deny}, {"warn", l_req_warn}, {"audit", l_req_audit}, {NULL, NULL}};
    lua_createtable(L, 0, 12);
    luaL_setfuncs(L, methods, 0);
    set_string(L, "uid", req->uid);
    set_string(L, "operation", adm_operation_name(req->operation));
    set_string(L, "namespace", req->namespace);
    set_string(L, "name", req->name);
    set_string(L, "kind", req->kind);
    set_string(L, "group", req->group);
    set_string(L, "sub_resource", req->sub_resource);
    lua_pushboolean(L, req->dry_run);
    lua_setfield(L, -2, "dry_run");
    if (req->template_path) { /* nil for a Pod under review */
        lua_pushstring(L, req->template_path);
        lua_setfield(L, -2, "template");
    }
    push_req_proxy(L);
    /* Here, in protected mode: luaL_ref allocates. */
    struct lb_vm *vm = vm_of(L);
    vm->req_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    vm->frozen_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    vm->obj_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

enum gg_status lb_request_begin(struct lb_vm *vm, const struct adm_request *req, json_t *object,
                                int64_t deadline_us, struct gg_err *err)
{
    lua_State *L = vm->L;
    lb_request_end(vm);
    vm->req = req;
    lua_pushcfunction(L, build_request);
    lua_pushlightuserdata(L, (void *)req);
    lua_pushlightuserdata(L, object);
    if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
        enum gg_status st = gg_fail(err, GG_ERR_INVALID, "%s", lua_tostring(L, -1));
        lua_pop(L, 1);
        return st;
    }
    budget_open(vm, deadline_us);
    return GG_OK;
}

enum lb_outcome lb_policy_call(struct lb_vm *vm, int index, enum lb_phase phase,
                               struct lb_report *report, struct gg_err *err, char **traceback)
{
    lua_State *L = vm->L;
    memset(report, 0, sizeof(*report));
    if (traceback)
        *traceback = NULL;
    if (vm->broken) {
        gg_fail(err, GG_ERR_POLICY, "the Lua VM was stopped earlier in this request");
        return LB_RAISED;
    }
    push_registry(L, &key_policies);
    lua_rawgeti(L, -1, index + 1);
    lua_getfield(L, -1, phase == LB_MUTATE ? "mutate" : "validate");
    lua_replace(L, -3);
    lua_pop(L, 1);
    if (!lua_isfunction(L, -1)) {
        lua_pop(L, 1);
        return LB_DONE;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->req_ref);
    lua_rawgeti(L, LUA_REGISTRYINDEX, phase == LB_VALIDATE ? vm->frozen_ref : vm->obj_ref);
    lua_getfield(L, LUA_REGISTRYINDEX, "gpuguard.config");
    /* One budget for the whole request, opened by lb_request_begin. */
    vm->report_lost = false;
    enum lb_outcome outcome = protected_call(vm, 3, err, traceback);
    if (outcome == LB_DONE && vm->report_lost) {
        outcome = LB_RAISED;
        gg_fail(err, GG_ERR_POLICY, "a req:deny call failed and the policy went on");
    }
    *report = vm->report;
    memset(&vm->report, 0, sizeof(vm->report));
    return outcome;
}

/* Exact equality of the Lua value at idx and v, as JSON (1 and 1.0 differ). */
static bool equals_json(lua_State *L, int idx, const json_t *v, int depth)
{
    size_t len;
    const char *s;
    switch (lua_type(L, idx)) {
    case LUA_TSTRING:
        s = lua_tolstring(L, idx, &len);
        return json_is_string(v) && json_string_length(v) == len &&
               memcmp(json_string_value(v), s, len) == 0;
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx))
            return json_is_integer(v) && json_integer_value(v) == lua_tointeger(L, idx);
        return json_is_real(v) && json_real_value(v) == lua_tonumber(L, idx) &&
               signbit(json_real_value(v)) == signbit(lua_tonumber(L, idx));
    case LUA_TBOOLEAN:
        return json_is_boolean(v) && json_is_true(v) == lua_toboolean(L, idx);
    case LUA_TLIGHTUSERDATA:
        return json_is_null(v) && is_null(L, idx);
    case LUA_TTABLE:
        break;
    default:
        return false;
    }
    enum shape shape = shape_of(L, idx);
    if (depth > LB_MAX_DEPTH || shape == SHAPE_NONE)
        return false; /* unmarked tables are new: let the conversion judge them */
    luaL_checkstack(L, 4, "object too deep");
    idx = lua_absindex(L, idx);
    if (is_lazy(shape)) {
        /* Never touched: equal when it still stands where it came from. */
        const json_t *src = stub_source(L, idx, false);
        return src && (src == v || json_equal(src, v));
    }
    if (shape == SHAPE_ARRAY) {
        size_t n = lua_rawlen(L, idx);
        if (!json_is_array(v) || json_array_size(v) != n)
            return false;
        for (size_t i = 0; i < n; i++) {
            lua_rawgeti(L, idx, (lua_Integer)i + 1);
            bool eq = equals_json(L, -1, json_array_get(v, i), depth + 1);
            lua_pop(L, 1);
            if (!eq)
                return false;
        }
        return true;
    }
    if (!json_is_object(v))
        return false;
    size_t count = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        json_t *item =
            lua_type(L, -2) == LUA_TSTRING ? json_object_get(v, lua_tostring(L, -2)) : NULL;
        count++;
        if (!item || !equals_json(L, -1, item, depth + 1)) {
            lua_pop(L, 2);
            return false;
        }
        lua_pop(L, 1);
    }
    return count == json_object_size(v);
}

/*
 * Reduce original and the edited Lua object at idx to the parts that
 * differ: *orig_out borrows the original's differing members, *edit_out
 * holds the Lua side converted to JSON; both are NULL when nothing differs.
 * Diffing the two gives the same patch as diffing the whole objects,
 * without converting what is equal.  Each table is walked once: equality
 * is what is left when pruning finds no difference.
 */
static enum gg_status prune_value(lua_State *L, int idx, json_t *ov, struct path *p, json_t **so,
                                  json_t **se, struct gg_err *err);

/* The two halves of a pruned container, made at its first difference. */
struct pruned {
    json_t *o, *e;
    bool failed; /* an allocation failed: the halves are incomplete */
};

static void pruned_drop(struct pruned *r)
{
    json_decref(r->o);
    json_decref(r->e);
    r->o = r->e = NULL;
}

/*
 * Arrays of the same length keep their positions: equal elements become a
 * null on both sides (the diff sees nothing there), the others are pruned.
 */
static enum gg_status prune_array(lua_State *L, int idx, const json_t *original, struct path *p,
                                  json_t **orig_out, json_t **edit_out, struct gg_err *err)
{
    struct pruned r = {NULL, NULL, false};
    enum gg_status st = GG_OK;
    idx = lua_absindex(L, idx);
    size_t n = json_array_size(original);
    for (size_t i = 0; st == GG_OK && i < n; i++) {
        lua_rawgeti(L, idx, (lua_Integer)i + 1);
        p->seg[p->depth].key = NULL;
        p->seg[p->depth].index = i;
        p->depth++;
        json_t *so = NULL, *se = NULL;
        st = prune_value(L, -1, json_array_get(original, i), p, &so, &se, err);
        p->depth--;
        lua_pop(L, 1);
        if (st == GG_OK && (so || se) && !r.o) {
            r.o = json_array();
            r.e = json_array();
            for (size_t k = 0; k < i; k++)
                r.failed |= json_array_append_new(r.o, json_null()) ||
                            json_array_append_new(r.e, json_null());
        }
        if (r.o || r.e) {
            r.failed |= json_array_append_new(r.o, so ? so : json_null()) != 0;
            r.failed |= json_array_append_new(r.e, se ? se : json_null()) != 0;
        }
    }
    if (st == GG_OK && r.failed)
        st = path_fail(p, err, "out of memory");
    if (st != GG_OK)
        pruned_drop(&r);
    *orig_out = r.o;
    *edit_out = r.e;
    return st;
}

static void pruned_start(struct pruned *r)
{
    if (!r->o && !r->e) {
        r->o = json_object();
        r->e = json_object();
    }
    r->failed |= !r->o || !r->e;
}

/* Members of original whose key the Lua table at idx no longer has. */
static void prune_removed(lua_State *L, int idx, const json_t *original, struct pruned *r)
{
    const char *key;
    size_t key_len;
    json_t *ov;
    json_object_keylen_foreach((json_t *)original, key, key_len, ov)
    {
        lua_pushlstring(L, key, key_len);
        if (lua_rawget(L, idx) == LUA_TNIL) {
            pruned_start(r);
            r->failed |= json_object_setn(r->o, key, key_len, ov) != 0;
        }
        lua_pop(L, 1);
    }
}

static enum gg_status prune_object(lua_State *L, int idx, const json_t *original, struct path *p,
                                   json_t **orig_out, json_t **edit_out, struct gg_err *err)
{
    struct pruned r = {NULL, NULL, false};
    enum gg_status st = GG_OK;
    size_t matched = 0; /* Lua keys the original has: fewer than its size means removals */
    idx = lua_absindex(L, idx);
    luaL_checkstack(L, 4, "object too deep");
    lua_pushnil(L);
    while (st == GG_OK && lua_next(L, idx)) {
        if (lua_type(L, -2) != LUA_TSTRING) {
            st = path_fail(p, err, "an object has a key that is not a string");
            lua_pop(L, 2);
            break;
        }
        size_t key_len;
        const char *key = lua_tolstring(L, -2, &key_len);
        json_t *ov = json_object_getn(original, key, key_len), *so = NULL, *se = NULL;
        p->seg[p->depth].key = key;
        p->depth++;
        if (ov) {
            matched++;
            st = prune_value(L, -1, ov, p, &so, &se, err);
        } else {
            st = to_json(L, -1, p, &se, err);
        }
        if (st == GG_OK && (so || se)) {
            pruned_start(&r);
            if (so)
                r.failed |= json_object_setn_new(r.o, key, key_len, so) != 0;
            if (se && json_object_setn_new(r.e, key, key_len, se) != 0)
                st = path_fail(p, err, "an object key is not valid UTF-8");
        }
        p->depth--;
        lua_pop(L, 1);
        if (st != GG_OK)
            lua_pop(L, 1);
    }
    if (st == GG_OK && matched < json_object_size(original))
        prune_removed(L, idx, original, &r);
    if (st == GG_OK && r.failed)
        st = path_fail(p, err, "out of memory");
    if (st != GG_OK)
        pruned_drop(&r);
    *orig_out = r.o;
    *edit_out = r.e;
    return st;
}

/* The differing parts of one value: both NULL when equal. */
static enum gg_status prune_value(lua_State *L, int idx, json_t *ov, struct path *p, json_t **so,
                                  json_t **se, struct gg_err *err)
{
    *so = *se = NULL;
    enum shape shape = shape_of(L, idx);
    if (p->depth < LB_MAX_DEPTH && shape == SHAPE_OBJECT && json_is_object(ov))
        return prune_object(L, idx, ov, p, so, se, err);
    if (p->depth < LB_MAX_DEPTH && shape == SHAPE_ARRAY && json_is_array(ov) &&
        lua_rawlen(L, idx) == json_array_size(ov))
        return prune_array(L, idx, ov, p, so, se, err);
    if (equals_json(L, idx, ov, 0))
        return GG_OK;
    enum gg_status st = to_json(L, idx, p, se, err);
    if (st == GG_OK)
        *so = json_incref(ov);
    return st;
}

/* lb_request_patch's work and its result, run in protected mode. */
struct patch_call {
    const json_t *original;
    json_t *patch;
    struct gg_err *err;
    enum gg_status st;
};

static enum gg_status request_patch(lua_State *L, const json_t *original, json_t **patch,
                                    struct gg_err *err);

static int patch_protected(lua_State *L)
{
    struct patch_call *c = lua_touserdata(L, 1);
    lua_settop(L, 0);
    c->st = request_patch(L, c->original, &c->patch, c->err);
    return 0;
}

/*
 * The diff pushes strings and grows the stack, which raise on a failed
 * allocation: it runs under lua_pcall, and such a failure refuses the edit.
 */
enum gg_status lb_request_patch(struct lb_vm *vm, const json_t *original, json_t **patch,
                                struct gg_err *err)
{
    struct patch_call c = {original, NULL, err, GG_ERR_NOMEM};
    lua_State *L = vm->L;
    lua_pushcfunction(L, patch_protected);
    lua_pushlightuserdata(L, &c);
    if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
        c.st = gg_fail(err, GG_ERR_NOMEM, "the edited object cannot be JSON: %s",
                       lua_tostring(L, -1) ? lua_tostring(L, -1) : "out of memory");
        lua_pop(L, 1);
        json_decref(c.patch);
        return c.st;
    }
    if (c.st == GG_OK)
        *patch = c.patch;
    return c.st;
}

static enum gg_status request_patch(lua_State *L, const json_t *original, json_t **patch,
                                    struct gg_err *err)
{
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm_of(L)->obj_ref);
    struct path p = {0};
    struct gg_err sub = {{0}};
    json_t *o = NULL, *e = NULL;
    enum gg_status st;
    enum shape shape = shape_of(L, -1);
    if (shape == SHAPE_LAZY_OBJECT) { /* no policy looked at it */
        lua_pop(L, 1);
        *patch = json_array();
        return *patch ? GG_OK : gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    if (shape != SHAPE_OBJECT)
        st = gg_fail(&sub, GG_ERR_INVALID, "the object was replaced by something else");
    else
        st = prune_object(L, -1, original, &p, &o, &e, &sub);
    lua_pop(L, 1);
    if (st == GG_OK && !o && !(*patch = json_array())) /* nothing differs */
        st = gg_fail(&sub, GG_ERR_NOMEM, "out of memory");
    else if (st == GG_OK && o)
        st = jp_diff(o, e, patch, &sub);
    json_decref(o);
    json_decref(e);
    if (st != GG_OK)
        return gg_fail(err, st, "the edited object cannot be JSON: %s", sub.msg);
    return GG_OK;
}

/* Growth past twice the settled size plus this triggers a full collection. */
#define GC_SLACK (4u << 20)

void lb_request_end(struct lb_vm *vm)
{
    budget_close(vm);
    vm->req = NULL;
    vm->epoch++; /* stubs kept past the request must not reach its JSON */
    luaL_unref(vm->L, LUA_REGISTRYINDEX, vm->obj_ref);
    luaL_unref(vm->L, LUA_REGISTRYINDEX, vm->req_ref);
    luaL_unref(vm->L, LUA_REGISTRYINDEX, vm->frozen_ref);
    vm->obj_ref = vm->req_ref = vm->frozen_ref = LUA_NOREF;
    lua_pushnil(vm->L);
    lua_rawsetp(vm->L, LUA_REGISTRYINDEX, &key_frozen_cache);
    lb_report_clear(&vm->report);
    /* A big object (a 10 MB annotation) is copied into the VM, and once the
     * generational collector has aged the copy only a major collection frees
     * it, which may not come for thousands of requests: each worker's VM
     * would keep its largest request's garbage.  Collect it now instead. */
    if (vm->mem > 2 * vm->mem_settled + GC_SLACK) {
        lua_gc(vm->L, LUA_GCCOLLECT);
        vm->mem_settled = vm->mem;
    }
}

/* ---- Lua test files --------------------------------------------------- */

static int compare_names(const void *a, const void *b)
{
    return strcmp(json_string_value(*(json_t *const *)a), json_string_value(*(json_t *const *)b));
}

enum gg_status lb_run_tests(struct lb_vm *vm, const struct lb_source *src, json_t **results,
                            struct gg_err *err)
{
    lua_State *L = vm->L;
    int top = lua_gettop(L);
    char chunkname[256];
    snprintf(chunkname, sizeof(chunkname), "@%s", src->name);
    struct gg_err sub = {{0}};
    if (run_file(vm, chunkname, src, err) != GG_OK)
        return GG_ERR_POLICY;
    if (!lua_istable(L, -1)) {
        gg_fail(err, GG_ERR_POLICY, "%s: must return a table of test functions", src->name);
        lua_settop(L, top);
        return GG_ERR_POLICY;
    }
    int tests = lua_gettop(L);
    json_t *names = json_array();
    lua_pushnil(L);
    while (lua_next(L, tests)) {
        if (lua_type(L, -2) == LUA_TSTRING && lua_isfunction(L, -1))
            json_array_append_new(names, json_string(lua_tostring(L, -2)));
        lua_pop(L, 1);
    }
    size_t n = json_array_size(names);
    json_t **sorted = calloc(n + 1, sizeof(*sorted));
    for (size_t i = 0; i < n; i++)
        sorted[i] = json_array_get(names, i);
    qsort(sorted, n, sizeof(*sorted), compare_names);
    json_t *out = json_array();
    for (size_t i = 0; i < n && !vm->broken; i++) {
        const char *name = json_string_value(sorted[i]);
        lua_getfield(L, tests, name);
        memset(&sub, 0, sizeof(sub));
        budget_open(vm, gg_now_us() + vm->limits.load_time_us);
        enum lb_outcome o = protected_call(vm, 0, &sub, NULL);
        budget_close(vm);
        json_array_append_new(out, json_pack("{s:s,s:b,s:s?}", "name", name, "ok", o == LB_DONE,
                                             "error", o == LB_DONE ? NULL : sub.msg));
    }
    free(sorted);
    json_decref(names);
    lua_settop(L, top);
    *results = out;
    return GG_OK;
}
