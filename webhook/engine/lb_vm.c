/*
 * lb_vm.c - a sandboxed Lua VM's life: create it with its sandbox, the
 * marking metatables and the shared configuration; free it.
 *
 * In webhook/, the only files that include lua.h are engine/lb_*.c
 * (through engine/lb_internal.h, which lists what each of them does).  One
 * VM belongs to one thread at a time and is never shared.
 */
#include "engine/lb_internal.h"
#include "engine/watchdog.h"
#include "util/blockpool.h"

#include <lualib.h>
#include <stdlib.h>

/* Address space for a VM's small blocks (see blockpool.h). */
#define LB_POOL_RESERVE (8u << 20)
/* The collector's own minor step, in % of heap growth (Lua's default: 20); see lb_vm_new. */
#define LB_GC_MINOR_MUL 40

const char lb_key_object_mt, lb_key_array_mt, lb_key_null_marker, lb_key_module, lb_key_policies;

/*
 * The JSON shape of the value at idx.  The marking metatables are known by
 * address, so this costs no registry lookup (it runs for every table the
 * diff visits and every gpuguard.is_array call).
 */
enum shape lb_shape_of(lua_State *L, int idx)
{
    /* No lua_istable first: no other value's metatable (a string's) is one of the marks. */
    if (!lua_getmetatable(L, idx))
        return SHAPE_NONE;
    const void *mt = lua_topointer(L, -1);
    lua_pop(L, 1);
    const struct lb_vm *vm = lb_vm_of(L);
    for (int s = SHAPE_OBJECT; s < N_SHAPES; s++)
        if (vm->marks[s] == mt)
            return (enum shape)s;
    return mt == vm->frozen_filled ? SHAPE_FROZEN : SHAPE_NONE;
}

/* The marking metatables, each hiding itself behind its shape's name. */
static void make_marks(lua_State *L, struct lb_vm *vm)
{
    const struct {
        const void *key;
        const char *name;
        enum shape shape;
    } marks[] = {{&lb_key_object_mt, "object", SHAPE_OBJECT},
                 {&lb_key_array_mt, "array", SHAPE_ARRAY},
                 {NULL, "object", SHAPE_LAZY_OBJECT},
                 {NULL, "array", SHAPE_LAZY_ARRAY},
                 {NULL, "read-only", SHAPE_FROZEN}};
    for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++) {
        lua_newtable(L);
        if (lb_is_lazy(marks[i].shape))
            luaL_setfuncs(L, lb_lazy_methods, 0);
        else if (marks[i].shape == SHAPE_FROZEN)
            luaL_setfuncs(L, lb_frozen_methods, 0);
        lua_pushstring(L, marks[i].name);
        lua_setfield(L, -2, "__metatable");
        vm->marks[marks[i].shape] = lua_topointer(L, -1);
        if (lb_is_lazy(marks[i].shape))
            vm->lazy_mt_ref[marks[i].shape - SHAPE_LAZY_OBJECT] = luaL_ref(L, LUA_REGISTRYINDEX);
        else if (marks[i].shape == SHAPE_FROZEN)
            vm->frozen_mt_ref = luaL_ref(L, LUA_REGISTRYINDEX);
        else
            lua_rawsetp(L, LUA_REGISTRYINDEX, marks[i].key);
    }
    /* A frozen proxy whose table is filled: its reads skip the stub check. */
    lua_newtable(L);
    luaL_setfuncs(L, lb_frozen_filled_methods, 0);
    lua_pushliteral(L, "read-only");
    lua_setfield(L, -2, "__metatable");
    vm->frozen_filled = lua_topointer(L, -1);
    vm->frozen_filled_mt_ref = luaL_ref(L, LUA_REGISTRYINDEX);
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
    lb_stdlib_open(L);
    lb_readonly_open(L);
    make_marks(L, vm);
    lb_request_open(L);
    lb_module_open(L);
    lb_sandbox_open(L);
    lua_newtable(L);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &lb_key_policies);
    /* The configuration, converted once per VM and shared read-only. */
    if (config)
        lb_push_json_or_raise(L, json_incref((json_t *)config), "the configuration");
    else {
        lua_newtable(L);
        lb_mark(L, &lb_key_object_mt);
    }
    lb_push_readonly(L, -1);
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
    vm->obj_ref = vm->req_ref = vm->frozen_ref = vm->frozen_cache_ref = LUA_NOREF;
    vm->watchdog = watchdog_new(lb_watchdog_fired);
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
    /* A request's tables die young: the generational collector suits that.
     * Its minor collections come after the heap grew by LB_GC_MINOR_MUL %,
     * twice Lua's default: lb_vm_collect runs them at the default between
     * requests where the caller has time for it (the webhook). */
    lua_gc(vm->L, LUA_GCGEN, LB_GC_MINOR_MUL, 0);
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
    lb_budget_close(vm);
    watchdog_free(vm->watchdog);
    lb_stubs_free(vm);
    lua_close(vm->L);
    blockpool_free(vm->pool);
    lb_report_clear(&vm->report);
    free(vm);
}

bool lb_vm_broken(const struct lb_vm *vm)
{
    return vm->broken;
}

size_t lb_vm_memory_peak(const struct lb_vm *vm)
{
    return vm->mem_peak;
}

size_t lb_vm_memory(const struct lb_vm *vm)
{
    return vm->mem;
}
