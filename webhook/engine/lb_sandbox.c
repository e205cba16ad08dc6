/*
 * lb_sandbox.c - what a chunk sees: its own environment of allow-listed
 * globals, setmetatable without finalizers, print to the log, and require
 * restricted to the Lua library directory, whose modules are read-only.
 *
 * Only text chunks load (crafted bytecode can crash the VM).
 */
#include "engine/lb_internal.h"
#include "util/log.h"

#include <stdio.h>
#include <string.h>

static const char key_globals; /* the template of every chunk's globals */
static const char key_loaded;  /* module name -> its read-only table (false: loading) */

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

/*
 * type(v), as Lua's, but answering with names interned once (its upvalues,
 * by type number): Lua's pushes a C string per call, which goes through
 * the string cache's lookup and strcmp.  Policies call type() more than
 * any other function, about 120 times a review of a GPU pod.
 */
static int l_type(lua_State *L)
{
    int t = lua_type(L, 1);
    luaL_argcheck(L, t != LUA_TNONE, 1, "value expected");
    lua_pushvalue(L, lua_upvalueindex(t + 1));
    return 1;
}

static void push_type(lua_State *L)
{
    for (int t = 0; t < LUA_NUMTYPES; t++)
        lua_pushstring(L, lua_typename(L, t));
    lua_pushcclosure(L, l_type, LUA_NUMTYPES);
}

/*
 * xpcall(f, msgh, ...), as Lua's, with the handler behind a guard.  Lua
 * calls a message handler where the error was raised, and a budget kill is
 * raised from the count hook, where hooks are off: a handler that looped
 * there would run beyond every budget and deadline.  Once a kill is armed,
 * the guard hands the error on as it came instead of calling the handler.
 */
static int xpcall_guard(lua_State *L)
{
    if (lb_vm_of(L)->kill != LB_DONE)
        return 1;
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

/* Below the call's results: true, the guard.  extra is their top. */
static int xpcall_finish(lua_State *L, int status, lua_KContext extra)
{
    if (status != LUA_OK && status != LUA_YIELD) {
        lua_pushboolean(L, 0);
        lua_pushvalue(L, -2);
        return 2;
    }
    return lua_gettop(L) - (int)extra;
}

static int l_xpcall(lua_State *L)
{
    int n = lua_gettop(L);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_pushvalue(L, 2);
    lua_pushcclosure(L, xpcall_guard, 1);
    lua_replace(L, 2); /* f, guard, args... */
    lua_pushboolean(L, 1);
    lua_pushvalue(L, 1);
    lua_rotate(L, 3, 2); /* f, guard, true, f, args... */
    int status = lua_pcallk(L, n - 2, LUA_MULTRET, 2, 2, xpcall_finish);
    return xpcall_finish(L, status, 2);
}

static int l_require(lua_State *L);

/*
 * The globals every chunk starts with, kept in the registry as a template,
 * and the table of loaded modules.
 */
void lb_sandbox_open(lua_State *L)
{
    static const char *const base_names[] = {
        "assert",   "error", "ipairs",       "pairs",  "pcall", "rawequal", "select", "tonumber",
        "tostring", "type",  "getmetatable", "string", "table", "math",     "utf8",   "_VERSION"};
    static const luaL_Reg wrapped[] = {{"setmetatable", l_setmetatable},
                                       {"require", l_require},
                                       {"print", l_print},
                                       {"xpcall", l_xpcall},
                                       {NULL, NULL}};
    /* In the real globals too: error messages and tracebacks name a C function
     * by looking for it among the loaded modules (_G.type). */
    push_type(L);
    lua_setglobal(L, "type");
    lua_pushcfunction(L, l_xpcall);
    lua_setglobal(L, "xpcall");
    lua_newtable(L);
    for (size_t i = 0; i < sizeof(base_names) / sizeof(base_names[0]); i++) {
        lua_getglobal(L, base_names[i]);
        lua_setfield(L, -2, base_names[i]);
    }
    luaL_setfuncs(L, wrapped, 0);
    luaL_setfuncs(L, lb_raw_access, 0);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &key_globals);
    lua_newtable(L);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &key_loaded);
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
    lb_push_registry(L, &key_globals);
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        lua_pushvalue(L, -2);
        if (lua_istable(L, -2))
            lb_push_copy(L, -2);
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
int lb_load_chunk(lua_State *L, const char *name, const char *text, size_t len)
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
    lb_push_registry(L, &key_loaded);
    if (lua_getfield(L, 2, name) != LUA_TNIL) {
        if (lua_toboolean(L, -1) == 0)
            return luaL_error(L, "require \"%s\": circular require", name);
        if (lua_istable(L, -1))
            lb_push_copy(L, -1);
        return 1;
    }
    lua_pop(L, 1);
    if (strcmp(name, "gpuguard") == 0) {
        lb_push_registry(L, &lb_key_module);
    } else {
        struct lb_vm *vm = lb_vm_of(L);
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
        if (lb_load_chunk(L, chunkname, src->text, src->len) != LUA_OK)
            return lua_error(L);
        lua_call(L, 0, 1);
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            lua_pushboolean(L, 1);
        }
    }
    lb_push_readonly(L, -1);
    lua_pushvalue(L, -1);
    lua_setfield(L, 2, name);
    /* Each requirer gets its own copy of the top level (nested tables stay read-only). */
    if (lua_istable(L, -1))
        lb_push_copy(L, -1);
    return 1;
}
