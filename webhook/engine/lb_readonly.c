/*
 * lb_readonly.c - read-only views of tables: the shared ones (the
 * configuration, library modules, req, what libraries keep across requests
 * through gpuguard.readonly) and validate's frozen object.
 *
 * A plain Lua table cannot be read-only (__newindex fires only for absent
 * keys), so a view is an empty proxy whose metatable refuses writes.  For a
 * shared table the metatable's __index is a shadow: a copy of the table
 * with every nested table replaced by its own view, made once, so reads
 * (ipairs' too) are table lookups inside the VM with no C call, and # and
 * pairs cost about what they cost on a plain table.
 *
 * Validate sees the object frozen: the same tables (as mutate left them),
 * each behind a frozen proxy made when it is first reached.  A frozen proxy
 * is a table whose only entry is hidden (a light userdata key: the table it
 * shows); its metatable reads through to that table, gives nested tables
 * behind their own proxies and raises on any write.  There are two such
 * metatables, each shared by all proxies: the first fills a stub on a read
 * and moves the proxy to the second, whose reads skip the stub check.
 * The request keeps one proxy per table, so nothing is copied and nothing a
 * policy can reach in validate is writable.
 *
 * Frozen proxies have no shadow like the shared views': a policy reads a
 * table of the object a few times per request (a pod's tables about five
 * on average), and mostly different keys.  A shadow of its own made at a
 * proxy's first or second read in validate, with nested tables frozen on
 * their first read and kept in it, saved only the repeated reads (about 15
 * of 110 per review of the bench pod) and cost more than that to make (a
 * shadow and a metatable: some 3,500 instructions): 7-15% more
 * instructions per review, scalars copied at once or on their first read.
 * So reads stay C calls, kept short: a filled proxy's __index and pairs'
 * steps find the table shown through the hidden entry alone, and a nested
 * table's proxy through the request's cache, sized for as many proxies as
 * the last request made.
 */
#include "engine/lb_internal.h"

static const char key_ro_cache; /* table -> its view, made once (weak keys) */
static const char key_shadow;   /* a frozen proxy's one (hidden) entry: its table */

/* Push the shadow of the shared proxy at idx (absolute), or nil when it is not one. */
static int push_shared_shadow(lua_State *L, int idx)
{
    lua_rawgeti(L, LUA_REGISTRYINDEX, lb_vm_of(L)->ro_target_ref);
    lua_pushvalue(L, idx);
    int type = lua_rawget(L, -2);
    lua_remove(L, -2);
    return type;
}

/* If the table at idx is a shared proxy, replace it with its shadow. */
void lb_unshare(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    if (push_shared_shadow(L, idx) == LUA_TTABLE)
        lua_replace(L, idx);
    else
        lua_pop(L, 1);
}

/* Whether the value at idx is a read-only proxy (frozen ones included). */
bool lb_is_proxy(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx))
        return false;
    if (lb_shape_of(L, idx) == SHAPE_FROZEN)
        return true;
    bool proxy = push_shared_shadow(L, idx) == LUA_TTABLE;
    lua_pop(L, 1);
    return proxy;
}

/*
 * Push what the value at idx shows without filling it: the table behind a
 * frozen proxy, the shadow of a shared one, else the value itself.
 */
void lb_push_shown(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx)) {
        lua_pushvalue(L, idx);
        return;
    }
    if (lua_rawgetp(L, idx, &key_shadow) == LUA_TTABLE)
        return; /* only a frozen proxy holds that key */
    lua_pop(L, 1);
    lua_pushvalue(L, idx);
    lb_unshare(L, -1);
}

/* If the value at idx is a read-only proxy, replace it with its shadow (filled). */
void lb_unproxy(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx))
        return;
    if (lb_shape_of(L, idx) == SHAPE_FROZEN) {
        lua_getmetatable(L, idx); /* only a proxy with the first metatable may show a stub */
        bool filled = lua_topointer(L, -1) == lb_vm_of(L)->frozen_filled;
        lua_pop(L, 1);
        lua_rawgetp(L, idx, &key_shadow);
        lua_replace(L, idx);
        if (!filled)
            lb_materialize_if_lazy(L, idx);
        return;
    }
    lb_unshare(L, idx);
}

static int ro_newindex(lua_State *L)
{
    return luaL_error(L, "attempt to modify a read-only table (shared configuration or "
                         "library): copy what you need into a table of your own");
}

/*
 * A shared proxy's __len and its pairs iterator read the shadow from their
 * upvalue: no lookup to find it, so # and pairs cost about what they cost
 * on a plain table.
 */
static int ro_len(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)lua_rawlen(L, lua_upvalueindex(1)));
    return 1;
}

static int ro_next(lua_State *L)
{
    lua_settop(L, 2);
    return lua_next(L, lua_upvalueindex(1)) ? 2 : 0;
}

/* __pairs: the iterator over the shadow (upvalue 1), with the proxy as its state. */
int lb_ro_pairs(lua_State *L)
{
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_pushvalue(L, 1);
    lua_pushnil(L);
    return 3;
}

/*
 * Push a read-only proxy's metatable, not yet pointing at a shadow (see
 * lb_ro_point).  pairs is its __pairs, a C closure whose upvalue is the
 * iterator.
 */
void lb_push_ro_metatable(lua_State *L, lua_CFunction pairs)
{
    lua_createtable(L, 0, 5);
    lua_pushcfunction(L, ro_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_pushnil(L);
    lua_pushcclosure(L, ro_len, 1);
    lua_setfield(L, -2, "__len");
    lua_pushnil(L);
    lua_pushcclosure(L, ro_next, 1);
    lua_pushcclosure(L, pairs, 1);
    lua_setfield(L, -2, "__pairs");
    lua_pushliteral(L, "read-only");
    lua_setfield(L, -2, "__metatable");
}

/* Make the proxy at proxy (with such a metatable) a read-only view of the table at shadow. */
void lb_ro_point(lua_State *L, int proxy, int shadow)
{
    proxy = lua_absindex(L, proxy);
    shadow = lua_absindex(L, shadow);
    lua_rawgeti(L, LUA_REGISTRYINDEX, lb_vm_of(L)->ro_target_ref); /* what lb_unshare reads */
    lua_pushvalue(L, proxy);
    lua_pushvalue(L, shadow);
    lua_rawset(L, -3);
    lua_getmetatable(L, proxy);
    lua_pushvalue(L, shadow);
    lua_setfield(L, -2, "__index");
    lua_getfield(L, -1, "__len");
    lua_pushvalue(L, shadow);
    lua_setupvalue(L, -2, 1);
    lua_getfield(L, -2, "__pairs");
    lua_getupvalue(L, -1, 1); /* the iterator */
    lua_pushvalue(L, shadow);
    lua_setupvalue(L, -2, 1);
    lua_pop(L, 5);
}

/*
 * Push a read-only view of the table at idx (other values are pushed as is).
 *
 * The view is an empty proxy whose metatable's __index is a shadow: a copy
 * of the table with every nested table replaced by its own view.  Reads are
 * then plain table lookups inside the VM, with no C call, which matters
 * because policies read the configuration and the library on every request.
 * The copy is made once; the table must not change afterwards (modules are
 * complete when require returns, the configuration never changes, and what
 * a library hands to gpuguard.readonly it has finished building).
 */
static void push_readonly_at(lua_State *L, int idx, int depth)
{
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx)) {
        lua_pushvalue(L, idx);
        return;
    }
    if (lb_is_proxy(L, idx)) {
        lua_pushvalue(L, idx);
        return;
    }
    lb_push_registry(L, &key_ro_cache);
    lua_pushvalue(L, idx);
    if (lua_rawget(L, -2) == LUA_TTABLE) {
        lua_remove(L, -2);
        return;
    }
    lua_pop(L, 2);
    luaL_checkstack(L, 10, "read-only table too deep");
    /* A table of the object (gpuguard.readonly of one) is shown as it reads: filled. */
    lb_materialize_if_lazy(L, idx);
    lua_newtable(L); /* the proxy */
    int proxy = lua_gettop(L);
    lua_newtable(L); /* the shadow, keeping the array/object mark */
    int shadow = lua_gettop(L);
    if (lua_getmetatable(L, idx))
        lua_setmetatable(L, shadow);
    lb_push_registry(L, &key_ro_cache); /* before filling: cycles find the proxy */
    lua_pushvalue(L, idx);
    lua_pushvalue(L, proxy);
    lua_rawset(L, -3);
    lua_pop(L, 1);
    lb_push_ro_metatable(L, lb_ro_pairs);
    lua_setmetatable(L, proxy);
    lb_ro_point(L, proxy, shadow);
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

void lb_push_readonly(lua_State *L, int idx)
{
    push_readonly_at(L, idx, 0);
}

void lb_readonly_open(lua_State *L)
{
    for (int i = 0; i < 2; i++) {
        lua_newtable(L);
        lua_newtable(L);
        lua_pushliteral(L, "k");
        lua_setfield(L, -2, "__mode");
        lua_setmetatable(L, -2);
    }
    lua_rawsetp(L, LUA_REGISTRYINDEX, &key_ro_cache);
    lb_vm_of(L)->ro_target_ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

/* lb_freeze of the table on the top of the stack, with 4 free slots above it. */
static void freeze_table(lua_State *L)
{
    struct lb_vm *vm = lb_vm_of(L);
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->frozen_cache_ref);
    lua_pushvalue(L, -2);
    if (lua_rawget(L, -2) == LUA_TTABLE) {
        lua_replace(L, -3);
        lua_pop(L, 1);
        return;
    }
    lua_pop(L, 1);
    /* A table of the object is marked; an unmarked one may be a shared proxy already. */
    enum shape s = lb_shape_of(L, -2);
    bool shared = s == SHAPE_NONE && push_shared_shadow(L, lua_absindex(L, -2)) == LUA_TTABLE;
    if (s == SHAPE_NONE)
        lua_pop(L, 1); /* the shadow, or nil */
    if (s == SHAPE_FROZEN || shared) {
        lua_pop(L, 1);
        return;
    }
    vm->frozen_made++;
    lua_createtable(L, 0, 1); /* the proxy */
    lua_pushvalue(L, -3);
    lua_rawsetp(L, -2, &key_shadow);
    lua_rawgeti(L, LUA_REGISTRYINDEX, lb_is_lazy(s) ? vm->frozen_mt_ref : vm->frozen_filled_mt_ref);
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -3);
    lua_pushvalue(L, -2);
    lua_rawset(L, -4); /* cache[table] = proxy */
    lua_replace(L, -3);
    lua_pop(L, 1);
}

/*
 * Replace the table on the top of the stack with its frozen proxy (made
 * once per request); other values, read-only proxies included, stay.
 */
void lb_freeze(lua_State *L)
{
    if (!lua_istable(L, -1))
        return;
    luaL_checkstack(L, 4, "object too deep");
    freeze_table(L);
}

/*
 * A frozen proxy's metamethods: read through to the table it shows, refuse
 * writes.  lb_frozen_index is the first metatable's __index (and the
 * sandbox's rawget of any frozen proxy): it fills a stub and moves the
 * proxy to the second metatable, whose reads skip that check.
 */
int lb_frozen_index(lua_State *L)
{
    lua_settop(L, 2);
    lua_rawgetp(L, 1, &key_shadow);
    lb_materialize_if_lazy(L, 3);
    lua_rawgeti(L, LUA_REGISTRYINDEX, lb_vm_of(L)->frozen_filled_mt_ref);
    lua_setmetatable(L, 1);
    lua_pushvalue(L, 2);
    if (lua_rawget(L, 3) == LUA_TTABLE)
        freeze_table(L); /* a C function has LUA_MINSTACK slots: 4 used */
    return 1;
}

/* Only ever called as __index (its metatable is hidden): the proxy and the key. */
static int frozen_filled_index(lua_State *L)
{
    lua_rawgetp(L, 1, &key_shadow);
    lua_pushvalue(L, 2);
    if (lua_rawget(L, 3) == LUA_TTABLE)
        freeze_table(L);
    return 1;
}

static int frozen_filled_len(lua_State *L)
{
    lua_rawgetp(L, 1, &key_shadow);
    lua_pushinteger(L, (lua_Integer)lua_rawlen(L, -1));
    return 1;
}

static int frozen_newindex(lua_State *L)
{
    return luaL_error(L, "the object is read-only in validate (edit it in mutate)");
}

int lb_frozen_next(lua_State *L)
{
    lua_settop(L, 2);
    /* A frozen proxy (only it holds key_shadow) but when a policy calls pairs'
     * iterator itself: find its table directly, not through lb_unproxy's checks. */
    if (lua_type(L, 1) == LUA_TTABLE && lua_rawgetp(L, 1, &key_shadow) == LUA_TTABLE) {
        if (lua_getmetatable(L, 1)) {
            bool stub = lua_topointer(L, -1) == lb_vm_of(L)->marks[SHAPE_FROZEN];
            lua_pop(L, 1);
            if (stub)
                lb_materialize_if_lazy(L, 3);
        }
        lua_replace(L, 1);
    } else {
        lua_settop(L, 2);
        luaL_checktype(L, 1, LUA_TTABLE);
        lb_unproxy(L, 1);
    }
    if (!lua_next(L, 1))
        return 0;
    lb_freeze(L);
    return 2;
}

static int frozen_pairs(lua_State *L)
{
    return lb_pairs_of(L, lb_frozen_next);
}

/* What a __pairs returns: the iterator next, the table (argument 1) and nil. */
int lb_pairs_of(lua_State *L, lua_CFunction next)
{
    lua_pushcfunction(L, next);
    lua_pushvalue(L, 1);
    lua_pushnil(L);
    return 3;
}

const luaL_Reg lb_frozen_methods[] = {{"__index", lb_frozen_index},
                                      {"__newindex", frozen_newindex},
                                      {"__len", lb_rawlen},
                                      {"__pairs", frozen_pairs},
                                      {NULL, NULL}};

const luaL_Reg lb_frozen_filled_methods[] = {{"__index", frozen_filled_index},
                                             {"__newindex", frozen_newindex},
                                             {"__len", frozen_filled_len},
                                             {"__pairs", frozen_pairs},
                                             {NULL, NULL}};

/* A shallow copy of the table at idx (a proxy is copied from its shadow). */
void lb_push_copy(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    bool frozen = lb_shape_of(L, idx) == SHAPE_FROZEN;
    lua_pushvalue(L, idx);
    lb_unproxy(L, -1);
    int src = lua_gettop(L);
    lua_newtable(L);
    lua_pushnil(L);
    while (lua_next(L, src)) {
        if (frozen) /* the copy's children stay read-only */
            lb_freeze(L);
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_rawset(L, src + 1);
    }
    lua_remove(L, src);
}
