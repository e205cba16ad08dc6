/*
 * lb_module.c - the `gpuguard` module policies require: JSON shapes,
 * quantities, logging, and what the cluster knows (GPU usage per namespace,
 * usage history, DRA claims).
 */
#include "engine/lb_internal.h"
#include "engine/cfgkeys.h"
#include "codec/keys.h"
#include "kube/gpuquota.h"
#include "kube/inventory.h"
#include "kube/ownerfold.h"
#include "kube/rsstore.h"
#include "codec/quantity.h"
#include "util/log.h"

#include <stdio.h>

/* A library call that waits (the template GET of gpuguard.dra) ends this long before the
 * budget's deadline, so the policy can still deny with its reason. */
#define LB_WAIT_RESERVE_US 50000

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
    enum shape shape = lb_shape_of(L, 1);
    if (lb_is_proxy(L, 1)) {
        lb_push_copy(L, 1);
        lua_replace(L, 1);
    } else if (lb_is_lazy(shape)) {
        lb_materialize(L, 1, shape); /* marked plain unfilled, it would read as empty */
    } else if (shape == SHAPE_NONE && luaL_getmetafield(L, 1, "__metatable") != LUA_TNIL) {
        return luaL_error(L, "cannot mark a table whose metatable is protected");
    }
    lb_mark(L, mt_key);
    return 1;
}

static int l_array(lua_State *L)
{
    return l_mark(L, &lb_key_array_mt);
}

static int l_object(lua_State *L)
{
    return l_mark(L, &lb_key_object_mt);
}

/*
 * gpuguard.frozen(t): the read-only view validate's policies get of t, a
 * table of the request's object: the same view all request long, so a
 * library can key what it remembers of a pod by it in both phases.  t
 * itself when it is a read-only view already, not a table, or used
 * between requests.
 */
static int l_frozen(lua_State *L)
{
    lua_settop(L, 1);
    if (lua_istable(L, 1) && lb_vm_of(L)->frozen_cache_ref != LUA_NOREF)
        lb_freeze(L);
    return 1;
}

/*
 * gpuguard.readonly(t): a read-only view of t, the kind the configuration
 * and library modules are (reads as t, any write raises, nested tables
 * behind views of their own).  Made once per table and kept: the same view
 * for every call, whose reads are plain table lookups.  What a library
 * keeps for all requests of the VM (per configuration caches) is handed
 * out this way.  The view shows t as it is now (a table of the object is
 * filled first): t must not change afterwards.  A value that is not a
 * table, or a read-only view already, is returned as is.
 */
static int l_readonly(lua_State *L)
{
    luaL_checkany(L, 1);
    lb_push_readonly(L, 1);
    return 1;
}

static enum shape arg_shape(lua_State *L)
{
    lua_settop(L, 1);
    lb_unproxy(L, 1);
    enum shape s = lb_shape_of(L, 1);
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
    lb_impure(L);
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

/*
 * gpuguard.unknown_key(path, key, known): the message that refuses key, unknown at path, with
 * the nearest of the list known (lua/schema.lua raises it).
 */
static int l_unknown_key(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    const char *key = luaL_checkstring(L, 2);
    luaL_checktype(L, 3, LUA_TTABLE);
    lua_Integer n = luaL_len(L, 3);
    luaL_argcheck(L, n >= 0 && n <= 256, 3, "at most 256 known keys");
    const char **known = lua_newuserdatauv(L, (size_t)(n + 1) * sizeof(*known), 0);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, 3, i);
        known[i - 1] = luaL_checkstring(L, -1);
        lua_pop(L, 1); /* the list holds the string */
    }
    char msg[1024];
    cfgkeys_unknown(msg, sizeof(msg), path, key, known, (size_t)n);
    lua_pushstring(L, msg);
    return 1;
}

/*
 * gpuguard.usage(namespace[, class[, pool]]): milli-GPU in use (reservations included), whether
 * that is known, and the inventory's state: "ready", "syncing" or "off".  With pool: the pods
 * placed in that pool (gpuguard.io/pool) only.
 */
static int l_usage(lua_State *L)
{
    lb_impure(L);
    const char *ns = luaL_checkstring(L, 1);
    const char *cls = luaL_optstring(L, 2, NULL);
    const char *pool = luaL_optstring(L, 3, NULL);
    struct inventory *inv = lb_vm_of(L)->inventory;
    bool ready = inv && inv_ready(inv);
    lua_pushinteger(L, !inv   ? 0
                       : pool ? (lua_Integer)inv_pool_usage(inv, ns, pool)
                              : (lua_Integer)inv_usage(inv, ns, cls));
    lua_pushboolean(L, ready);
    lua_pushstring(L, !inv ? "off" : ready ? "ready" : "syncing");
    return 3;
}

/*
 * gpuguard.gpuquota(namespace): the namespace's GPUQuota as { name, hard = milli-GPU, pools =
 * { [pool] = milli-GPU } }, or nil when it has none; nil and a message when it has several (the
 * caller denies: which one would hold is not for gpuguard to guess) or one it cannot read.
 */
static int l_gpuquota(lua_State *L)
{
    lb_impure(L);
    const char *ns = luaL_checkstring(L, 1);
    struct inventory *inv = lb_vm_of(L)->inventory;
    size_t count = 0;
    json_t *obj = inv ? inv_quota(inv, ns, &count) : NULL;
    struct gq_view *v = obj ? lua_newuserdatauv(L, sizeof(*v), 0) : NULL;
    struct gg_err err;
    if (obj && gq_read(obj, v, &err) != GG_OK) {
        json_decref(obj);
        lua_pushnil(L);
        lua_pushstring(L, err.msg);
        return 2;
    }
    json_decref(obj);
    if (!v) {
        lua_pushnil(L);
        if (count < 2)
            return 1;
        lua_pushfstring(
            L, "namespace %s has %d GPUQuota objects; keep one (kubectl get gpuquotas -n %s)", ns,
            (int)count, ns);
        return 2;
    }
    lua_createtable(L, 0, 3);
    lua_pushstring(L, v->name);
    lua_setfield(L, -2, "name");
    lua_pushinteger(L, (lua_Integer)v->hard);
    lua_setfield(L, -2, "hard");
    lua_createtable(L, 0, (int)v->n_hard_pools);
    for (size_t i = 0; i < v->n_hard_pools; i++) {
        lua_pushinteger(L, (lua_Integer)v->hard_pools[i].milli);
        lua_setfield(L, -2, v->hard_pools[i].pool);
    }
    lua_setfield(L, -2, "pools");
    return 1;
}

/*
 * gpuguard.rightsize(namespace, name, owner_kind, owner_name): the usage
 * history of the workload a pod (or, with its own kind and name as the
 * owner, a workload) belongs to: a table, or nil, why ("off", "no data
 * yet", "stale", "unknown") and the workload's name.
 */
static int l_rightsize(lua_State *L)
{
    lb_impure(L);
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
    lb_impure(L);
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
    lb_read_dra(L);
    const char *kind = luaL_checkstring(L, 1);
    const char *ns = luaL_checkstring(L, 2);
    const char *name = luaL_checkstring(L, 3);
    struct inventory *inv = lb_vm_of(L)->inventory;
    struct gg_err err = {{0}};
    /* A template not kept yet is asked of the API server: that GET ends before the budget's
     * deadline, leaving the policy time to act on its failure. */
    int64_t deadline = lb_vm_of(L)->deadline_us; /* 0: none */
    if (deadline)
        deadline = deadline > LB_WAIT_RESERVE_US ? deadline - LB_WAIT_RESERVE_US : 1;
    json_t *obj = inv ? inv_dra_get(inv, kind, ns, name, deadline, &err) : NULL;
    if (!obj) {
        lua_pushnil(L);
        if (!err.msg[0])
            return 1;
        /* Not known this time (the API server did not answer): nothing worked out of it in
         * this request may answer a later one. */
        lb_vm_of(L)->dra_unknown = true;
        lua_pushstring(L, err.msg);
        return 2;
    }
    char what[256];
    snprintf(what, sizeof(what), "%s %s/%s", kind, ns, name);
    lb_push_json_or_raise(L, obj, what);
    return 1;
}

void lb_module_open(lua_State *L)
{
    static const luaL_Reg funcs[] = {{"array", l_array},
                                     {"object", l_object},
                                     {"is_array", l_is_array},
                                     {"is_object", l_is_object},
                                     {"frozen", l_frozen},
                                     {"readonly", l_readonly},
                                     {"peek", lb_peek},
                                     {"fields", lb_fields},
                                     {"quantity", l_quantity},
                                     {"format_quantity", l_format_quantity},
                                     {"log", l_log},
                                     {"usage", l_usage},
                                     {"gpuquota", l_gpuquota}, /* 40-gpu-quota */
                                     {"rightsize", l_rightsize},
                                     {"rightsize_report", l_rightsize_report},
                                     {"dra", l_dra}, /* lua/intent.lua's DRA lookups */
                                     {"dra_version", lb_dra_version},
                                     {"charge_key", lb_charge_key},  /* intent.charge's memo */
                                     {"unknown_key", l_unknown_key}, /* lua/schema.lua */
                                     {NULL, NULL}};
    luaL_newlib(L, funcs);
    lua_pushlightuserdata(L, (void *)&lb_key_null_marker);
    lua_setfield(L, -2, "null");
    lua_newtable(L); /* gpuguard.keys (the module is made read-only with the library) */
#define SET_KEY(name, key)                                                                         \
    lua_pushliteral(L, key);                                                                       \
    lua_setfield(L, -2, name);
    GG_KEYS(SET_KEY)
#undef SET_KEY
    lua_setfield(L, -2, "keys");
    lua_rawsetp(L, LUA_REGISTRYINDEX, &lb_key_module);
}
