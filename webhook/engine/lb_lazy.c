/*
 * lb_lazy.c - the request's object in Lua as stubs filled on first use.
 *
 * The request's object reaches Lua lazily: an object or array is first a
 * "stub", an empty table (sized for what it will hold) with a lazy
 * metatable, whose JSON source the request's stub map gives by the table's
 * address.  The first read, write, length or pairs on a stub fills the
 * table one level deep (children are stubs in turn) and gives it its plain
 * mark, after which it is an ordinary table.  Policies read a fraction of a
 * pod, so most of it is never converted, and the diff knows without looking
 * that a stub still holding its original source is unchanged.  next, rawget
 * and rawlen are wrapped to fill a stub first; nothing else in the sandbox
 * reads a table raw.  The map is emptied when the request ends, before its
 * JSON is freed, so a stub kept past its request fills as empty.
 * gpuguard.peek and gpuguard.fields read through stubs without filling them.
 *
 * The map is open addressing by table address, in memory from the VM's
 * allocator (it counts against the policies' memory).  An entry may outlive
 * its table when the collector takes the table; the address may then come
 * back as another table, and only push_lazy_at makes a table a stub (the
 * lazy metatables are hidden), which replaces the entry.  The source used
 * to be the stub's one hidden entry (a light userdata key): setting it, and
 * finding it again with lua_next (past an array's empty slots), cost more
 * than the rest of the stub, and an array stub needed a hash part for it.
 */
#include "engine/lb_internal.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>

#define STUBS_MIN 64u    /* the map's first size */
#define STUBS_KEEP 1024u /* a larger map is freed when its request ends */

/* The slot of table, or the empty slot where it would go (the map has one). */
static struct lb_stub *stub_slot(const struct lb_vm *vm, const void *table)
{
    size_t mask = vm->stubs_cap - 1;
    /* Fibonacci hashing: the high bits of the product mix every bit of the address. */
    uint64_t h = (uint64_t)(uintptr_t)table * UINT64_C(0x9E3779B97F4A7C15);
    for (size_t i = (size_t)(h >> 32) & mask;; i = (i + 1) & mask) {
        struct lb_stub *e = &vm->stubs[i];
        if (e->table == table || !e->table)
            return e;
    }
}

/* The VM closes (or its request's map was large). */
void lb_stubs_free(struct lb_vm *vm)
{
    if (vm->stubs)
        lb_alloc(vm, vm->stubs, vm->stubs_cap * sizeof(*vm->stubs), 0);
    vm->stubs = NULL;
    vm->stubs_cap = vm->stubs_n = 0;
}

/*
 * Double the map (raises when the allocator refuses).  As Lua does for its own
 * blocks, a refusal outside a policy call is retried once after a full
 * collection; inside one the refusal has armed the kill already.
 */
static void stubs_grow(lua_State *L, struct lb_vm *vm)
{
    size_t cap = vm->stubs_cap ? 2 * vm->stubs_cap : STUBS_MIN;
    size_t bytes = cap <= SIZE_MAX / 2 / sizeof(struct lb_stub) ? cap * sizeof(struct lb_stub) : 0;
    struct lb_stub *at = bytes ? lb_alloc(vm, NULL, 0, bytes) : NULL;
    if (!at && bytes && !vm->running) {
        lua_gc(L, LUA_GCCOLLECT);
        at = lb_alloc(vm, NULL, 0, bytes);
    }
    if (!at)
        luaL_error(L, "not enough memory for the object's tables");
    memset(at, 0, bytes);
    struct lb_stub *old = vm->stubs;
    size_t old_cap = vm->stubs_cap, n = vm->stubs_n;
    vm->stubs = at;
    vm->stubs_cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].table)
            *stub_slot(vm, old[i].table) = old[i];
    if (old)
        lb_alloc(vm, old, old_cap * sizeof(*old), 0);
    vm->stubs_n = n;
}

/* Enter the table on the top as a stub of v. */
static void stub_add(lua_State *L, const struct jf_node *v)
{
    struct lb_vm *vm = lb_vm_of(L);
    if (4 * (vm->stubs_n + 1) > 3 * vm->stubs_cap)
        stubs_grow(L, vm);
    const void *table = lua_topointer(L, -1);
    struct lb_stub *e = stub_slot(vm, table);
    vm->stubs_n += e->table == NULL;
    *e = (struct lb_stub){table, v};
}

/* The request is over: no stub may reach its JSON any more. */
void lb_stubs_end(struct lb_vm *vm)
{
    if (!vm->stubs_n)
        return;
    if (vm->stubs_cap > STUBS_KEEP) {
        lb_stubs_free(vm);
        return;
    }
    memset(vm->stubs, 0, vm->stubs_cap * sizeof(*vm->stubs));
    vm->stubs_n = 0;
}

/* The two lazy metatables, pushed by integer registry refs (array lookups). */
static void push_lazy_mts(lua_State *L)
{
    const struct lb_vm *vm = lb_vm_of(L);
    luaL_checkstack(L, 6, "object too deep");
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->lazy_mt_ref[0]);
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->lazy_mt_ref[1]);
}

/* Push v, a container as a stub; mts is where push_lazy_mts put the object one. */
static void push_lazy_at(lua_State *L, const struct jf_node *v, int mts)
{
    if (!jf_is_container(v)) {
        lb_push_scalar(L, v);
        return;
    }
    bool array = v->type == JF_ARRAY;
    /* Sized now: filling an empty table later would grow it step by step. */
    int n = (int)v->n;
    lua_createtable(L, array ? n : 0, array ? 0 : n);
    lua_pushvalue(L, mts + array);
    lua_setmetatable(L, -2);
    stub_add(L, v);
}

/* The JSON source of the stub at idx, NULL when its request is over. */
const struct jf_node *lb_stub_source(lua_State *L, int idx)
{
    const struct lb_vm *vm = lb_vm_of(L);
    if (!vm->stubs_n)
        return NULL;
    const struct lb_stub *e = stub_slot(vm, lua_topointer(L, idx));
    return e->table ? e->node : NULL;
}

/* Fill the stub at idx one level deep and give it its plain mark. */
void lb_materialize(lua_State *L, int idx, enum shape shape)
{
    idx = lua_absindex(L, idx);
    int top = lua_gettop(L);
    const struct jf_node *v = lb_stub_source(L, idx);
    lb_push_registry(L, shape == SHAPE_LAZY_ARRAY ? &lb_key_array_mt : &lb_key_object_mt);
    lua_setmetatable(L, idx);
    push_lazy_mts(L);
    if (v && v->type == JF_OBJECT) {
        for (uint32_t i = 0; i < v->n; i++) {
            const struct jf_node *item = &v->u.items[i];
            lua_pushlstring(L, item->key, item->key_len);
            push_lazy_at(L, item, top + 1);
            lua_rawset(L, idx);
        }
    } else if (v && v->type == JF_ARRAY) {
        for (uint32_t i = 0; i < v->n; i++) {
            push_lazy_at(L, &v->u.items[i], top + 1);
            lua_rawseti(L, idx, (lua_Integer)i + 1);
        }
    }
    lua_settop(L, top);
}

void lb_materialize_if_lazy(lua_State *L, int idx)
{
    enum shape s = lb_shape_of(L, idx);
    if (lb_is_lazy(s))
        lb_materialize(L, idx, s);
}

/* Push the request's object, lazily. */
void lb_push_lazy(lua_State *L, const struct jf_node *v)
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
    lb_materialize_if_lazy(L, 1);
    lua_settop(L, 2);
    lua_rawget(L, 1);
    return 1;
}

static int lazy_newindex(lua_State *L)
{
    lb_materialize_if_lazy(L, 1);
    lua_settop(L, 3);
    lua_rawset(L, 1);
    return 0;
}

static int lazy_len(lua_State *L)
{
    lb_materialize_if_lazy(L, 1);
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
    lb_materialize_if_lazy(L, 1);
    return lb_pairs_of(L, raw_next);
}

const luaL_Reg lb_lazy_methods[] = {{"__index", lazy_index},
                                    {"__newindex", lazy_newindex},
                                    {"__len", lazy_len},
                                    {"__pairs", lazy_pairs},
                                    {NULL, NULL}};

/* The sandbox's next, rawget and rawlen: as Lua's, after filling a stub. */
/* (A read-only proxy is read through its shadow, which holds its members.) */
static int l_next(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    enum shape s = lb_shape_of(L, 1);
    if (s == SHAPE_FROZEN) {
        if (lb_frozen_next(L))
            return 2;
        lua_pushnil(L);
        return 1;
    }
    if (lb_is_lazy(s))
        lb_materialize(L, 1, s);
    else if (s == SHAPE_NONE) /* maybe a shared proxy (unmarked; its shadow is not lazy) */
        lb_unshare(L, 1);
    return raw_next(L);
}

static int l_rawget(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_checkany(L, 2);
    if (lb_shape_of(L, 1) == SHAPE_FROZEN)
        return lb_frozen_index(L);
    lb_unproxy(L, 1);
    return lazy_index(L);
}

/* Also a frozen proxy's __len: the length of the table it shows. */
int lb_rawlen(lua_State *L)
{
    int t = lua_type(L, 1);
    luaL_argexpected(L, t == LUA_TTABLE || t == LUA_TSTRING, 1, "table or string");
    lb_unproxy(L, 1);
    return lazy_len(L);
}

/* The sandbox's next, rawget and rawlen (see lb_sandbox.c). */
const luaL_Reg lb_raw_access[] = {
    {"next", l_next}, {"rawget", l_rawget}, {"rawlen", lb_rawlen}, {NULL, NULL}};

/*
 * gpuguard.peek and gpuguard.fields read the object without filling it: a
 * policy that asks each of a pod's thirty containers whether it has a GPU
 * resource would otherwise fill every container and its resources (a
 * quarter of a /mutate review of such a pod), and the diff would then walk
 * them all.  Under a stub, the request's JSON is what filling would give.
 */

/*
 * The JSON source of the table on the top if it is an unfilled stub of this
 * request (or a read-only view of one), else NULL.  A view on the top is
 * replaced by the table it shows and *viewed set: the walk reads on through
 * plain tables, as the view would (see read_step), without making a view
 * of each table it passes; nothing it reads that way is handed to the
 * policy.
 */
static const struct jf_node *source_or_shown(lua_State *L, bool *viewed)
{
    enum shape s = lb_shape_of(L, -1);
    if (s == SHAPE_FROZEN) {
        lb_push_shown(L, -1);
        lua_remove(L, -2);
        s = lb_shape_of(L, -1);
        *viewed = true;
    }
    return lb_is_lazy(s) ? lb_stub_source(L, -1) : NULL;
}

/* v[key at stack index k], as a filled table would have it (integer keys 1-based), or NULL. */
static const struct jf_node *node_member(lua_State *L, const struct jf_node *v, int k)
{
    int is_int = 0;
    if (v->type == JF_OBJECT && lua_type(L, k) == LUA_TSTRING) {
        size_t len;
        const char *key = lua_tolstring(L, k, &len);
        return jf_get(v, key, len);
    }
    lua_Integer i = lua_type(L, k) == LUA_TNUMBER ? lua_tointegerx(L, k, &is_int) : 0;
    if (v->type == JF_ARRAY && is_int && i >= 1 && (lua_Unsigned)i <= v->n)
        return &v->u.items[i - 1];
    return NULL;
}

/* Replace the value on the top of the stack with value[k] for the keys in arguments from..to,
 * read as a policy would (a stub filled, a view's member behind its view). */
static void read_keys(lua_State *L, int from, int to)
{
    for (int i = from; i <= to; i++) {
        lua_pushvalue(L, i);
        lua_gettable(L, -2);
        lua_remove(L, -2);
    }
}

/*
 * Replace the table on the top with its member at key k.  Past a view, read
 * as views read the tables they show, with rawget: a metatable a mutate
 * call gave a table of the object runs no __index in validate (it would get
 * the writable table).  A stub is not read here: the walk reads its JSON.
 */
static void read_step(lua_State *L, int k, bool viewed)
{
    lua_pushvalue(L, k);
    if (viewed)
        lua_rawget(L, -2);
    else
        lua_gettable(L, -2);
    lua_remove(L, -2);
}

/*
 * Walk t (argument 1) by the keys in arguments 2..n.  Leaves on the top the
 * value reached (a table as the table a view shows) and returns NULL, or,
 * from an unfilled stub on, walks the JSON instead and returns the JSON
 * value reached (pushing nothing); *absent is set when a step finds no
 * member or no table, *viewed when the walk went past a read-only view.
 */
static const struct jf_node *walk(lua_State *L, int n, bool *absent, bool *viewed)
{
    *absent = *viewed = false;
    luaL_checkstack(L, 4, "object too deep");
    lua_pushvalue(L, 1);
    for (int i = 2; i <= n; i++) {
        if (!lua_istable(L, -1)) {
            *absent = true;
            lua_pop(L, 1);
            return NULL;
        }
        const struct jf_node *v = source_or_shown(L, viewed);
        if (v) {
            lua_pop(L, 1);
            for (; i <= n && v; i++)
                v = jf_is_container(v) ? node_member(L, v, i) : NULL;
            *absent = v == NULL;
            return v;
        }
        read_step(L, i, *viewed);
    }
    const struct jf_node *v = lua_istable(L, -1) ? source_or_shown(L, viewed) : NULL;
    if (v)
        lua_pop(L, 1);
    return v;
}

/*
 * gpuguard.peek(t, k1, k2, ...): t[k1][k2]..., nil when a step is not a
 * table, without filling what is untouched.  A table at the end is read as
 * usual (filled, and read-only in validate).
 */
int lb_peek(lua_State *L)
{
    int n = lua_gettop(L);
    bool absent, viewed;
    const struct jf_node *v = walk(L, n, &absent, &viewed);
    if (absent) {
        lua_pushnil(L);
    } else if (v && !jf_is_container(v)) {
        lb_push_scalar(L, v);
    } else if (v || (viewed && lua_istable(L, -1))) {
        /* A table under a stub, or one the walk reached past a view (it holds
         * the writable table): the usual reads make it, filled, and a view
         * in validate.  A table reached by the usual reads is on the top. */
        if (!v)
            lua_pop(L, 1);
        lua_pushvalue(L, 1);
        read_keys(L, 2, n);
    }
    return 1;
}

/*
 * gpuguard.fields(t, k1, ...): a new list of the keys of t[k1]... (strings
 * of an object, 1..n of an array), empty when that is not a table; in no
 * particular order, and without filling what is untouched.
 */
int lb_fields(lua_State *L)
{
    int n = lua_gettop(L);
    bool absent, viewed;
    const struct jf_node *v = walk(L, n, &absent, &viewed);
    /* Sized at once: a list grown key by key is rehashed at every power of two. */
    if (absent || v) {
        uint32_t size = absent ? 0 : jf_size(v);
        lua_createtable(L, size < INT_MAX ? (int)size : 0, 0);
        for (uint32_t i = 0; i < size; i++) {
            if (v->type == JF_OBJECT)
                lua_pushlstring(L, v->u.items[i].key, v->u.items[i].key_len);
            else
                lua_pushinteger(L, (lua_Integer)i + 1);
            lua_rawseti(L, -2, (lua_Integer)i + 1);
        }
        return 1;
    }
    if (!lua_istable(L, -1)) {
        lua_newtable(L);
        return 1;
    }
    lb_push_shown(L, -1);          /* a shared view (configuration, library): its shadow */
    lb_materialize_if_lazy(L, -1); /* a stub of an earlier request: it fills as empty */
    int t = lua_gettop(L), size = 0;
    lua_pushnil(L);
    while (lua_next(L, t)) { /* counted first, for the size */
        lua_pop(L, 1);
        size++;
    }
    lua_createtable(L, size, 0);
    int out = lua_gettop(L);
    lua_Integer count = 0;
    lua_pushnil(L);
    while (lua_next(L, t)) {
        lua_pop(L, 1);
        lua_pushvalue(L, -1);
        lua_rawseti(L, out, ++count);
    }
    lua_settop(L, out);
    return 1;
}
