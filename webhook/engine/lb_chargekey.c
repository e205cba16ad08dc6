/*
 * lb_chargekey.c - gpuguard.charge_key: the key under which lua/intent.lua
 * remembers a pod's charge from one request to the next.
 *
 * The key holds, as JSON text, every part of the pod its charge spec is cut
 * from (kube/infscan.h: exactly what the charge model reads of a pod):
 * metadata.namespace, the annotations the charge reads, spec.nodeSelector,
 * spec.resourceClaims, the name, restartPolicy and the extended resources of
 * the limits and requests of each container and init container, and
 * status.resourceClaimStatuses, each value whole, as the policies see it at
 * that moment: its tables where a policy filled or edited them, its JSON
 * where they are still stubs, the table a read-only view shows in
 * validate.  Nothing is filled.  So two pods with one key have one charge
 * spec (tests/unit/test_chargekey.c holds the key to the informer's spec of
 * every pod of the tests' data).  The annotations and resources are picked
 * by infscan's own tests of a name.  Keys are compared in full by the Lua
 * table holding them: a crafted pod cannot take a cheaper pod's charge.
 */
#include "engine/lb_internal.h"
#include "kube/infscan.h"
#include "kube/inventory.h"
#include "util/jsonfast.h"
#include "util/jsonwrite.h"

#include <math.h>
#include <string.h>

/* The key's text: a charge spec is a small part of a pod. */
#define KEY_TEXT_MAX (1u << 20)

/* A value of the object: a JSON node under a stub, else the Lua value at a stack index;
 * absent when neither. */
struct val {
    const struct jf_node *node;
    int idx;
};

static bool absent(struct val v)
{
    return !v.node && !v.idx;
}

/* The Lua value at idx (absolute) as the diff reads it: the table a view shows, a stub's
 * JSON.  A stub of an earlier request has no JSON and reads as empty, as it fills. */
static struct val resolve(lua_State *L, int idx)
{
    if (!lua_istable(L, idx))
        return (struct val){NULL, idx};
    enum shape s = lb_shape_of(L, idx);
    if (s == SHAPE_FROZEN) {
        lb_push_shown(L, idx);
        idx = lua_gettop(L);
        s = lb_shape_of(L, idx);
    }
    return (struct val){lb_is_lazy(s) ? lb_stub_source(L, idx) : NULL, idx};
}

/* 1: v is an object, 0: an array, -1: anything else (a table of both, an empty table made
 * without gpuguard.object() or gpuguard.array()). */
static int shape_of(lua_State *L, struct val v)
{
    if (v.node)
        return v.node->type == JF_OBJECT ? 1 : v.node->type == JF_ARRAY ? 0 : -1;
    if (!v.idx || !lua_istable(L, v.idx))
        return -1;
    enum shape s = lb_shape_of(L, v.idx);
    if (s == SHAPE_OBJECT || s == SHAPE_LAZY_OBJECT)
        return 1;
    if (s == SHAPE_ARRAY || s == SHAPE_LAZY_ARRAY)
        return 0;
    int inferred = lb_infer_shape(L, v.idx); /* 1: an array, 0: an object */
    return inferred == 1 ? 0 : inferred == 0 ? 1 : -1;
}

/* v[key] (v an object), pushing a Lua value it reaches. */
static struct val member(lua_State *L, struct val v, const char *key)
{
    if (v.node)
        return (struct val){v.node->type == JF_OBJECT ? jf_get(v.node, key, strlen(key)) : NULL, 0};
    if (!v.idx || !lua_istable(L, v.idx))
        return (struct val){NULL, 0};
    lua_pushstring(L, key);
    if (lua_rawget(L, v.idx) == LUA_TNIL) {
        lua_pop(L, 1);
        return (struct val){NULL, 0};
    }
    return resolve(L, lua_gettop(L));
}

/* The number of elements of the array v, and its element i (0-based), pushing a Lua value. */
static uint32_t length(lua_State *L, struct val v)
{
    return v.node ? v.node->n : (uint32_t)lua_rawlen(L, v.idx);
}

static struct val element(lua_State *L, struct val v, uint32_t i)
{
    if (v.node)
        return (struct val){&v.node->u.items[i], 0};
    lua_rawgeti(L, v.idx, (lua_Integer)i + 1);
    return resolve(L, lua_gettop(L));
}

static bool put(struct buf *b, const char *text, size_t n)
{
    return buf_append(b, text, n) == GG_OK;
}

/* "key": after the members written so far (*first: none yet). */
static bool put_key(struct buf *b, bool *first, const char *key, size_t len)
{
    bool ok = (*first || put(b, ",", 1)) && jw_string(b, key, len) == GG_OK && put(b, ":", 1);
    *first = false;
    return ok;
}

static bool emit(lua_State *L, struct val v, struct buf *b, int depth);

/* The filled table v as a JSON array or object (keep: which members, NULL for all). */
static bool emit_table(lua_State *L, struct val v, struct buf *b, int depth,
                       bool (*keep)(const char *key))
{
    int shape = shape_of(L, v), top = lua_gettop(L);
    if (shape < 0 || !lua_checkstack(L, 4))
        return false;
    bool ok = put(b, shape ? "{" : "[", 1), first = true;
    if (shape == 0) {
        uint32_t n = length(L, v);
        for (uint32_t i = 0; ok && i < n; i++) {
            ok = (i == 0 || put(b, ",", 1)) && emit(L, element(L, v, i), b, depth + 1);
            lua_settop(L, top);
        }
    } else {
        lua_pushnil(L);
        while (ok && lua_next(L, v.idx)) {
            size_t len;
            const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &len) : NULL;
            ok = key && jf_utf8_valid(key, len);
            if (ok && (!keep || keep(key)))
                ok = put_key(b, &first, key, len) &&
                     emit(L, resolve(L, lua_gettop(L)), b, depth + 1);
            lua_settop(L, top + 1); /* the key, for lua_next */
        }
        lua_settop(L, top);
    }
    return ok && put(b, shape ? "}" : "]", 1);
}

/* The object node v with the members keep picks. */
static bool emit_node_kept(const struct jf_node *v, struct buf *b, bool (*keep)(const char *key))
{
    bool ok = put(b, "{", 1), first = true;
    for (uint32_t i = 0; ok && i < v->n; i++)
        if (keep(v->u.items[i].key))
            ok = put_key(b, &first, v->u.items[i].key, v->u.items[i].key_len) &&
                 jw_node(b, &v->u.items[i]) == GG_OK;
    return ok && put(b, "}", 1);
}

/* v as JSON text, whole; false when it is not JSON (a function, a mixed table, too deep). */
static bool emit(lua_State *L, struct val v, struct buf *b, int depth)
{
    if (depth > LB_MAX_DEPTH)
        return false;
    if (v.node)
        return jw_node(b, v.node) == GG_OK;
    size_t len;
    const char *s;
    switch (lua_type(L, v.idx)) {
    case LUA_TSTRING:
        s = lua_tolstring(L, v.idx, &len);
        return jf_utf8_valid(s, len) && jw_string(b, s, len) == GG_OK;
    case LUA_TNUMBER:
        if (lua_isinteger(L, v.idx))
            return jw_integer(b, (json_int_t)lua_tointeger(L, v.idx)) == GG_OK;
        return isfinite(lua_tonumber(L, v.idx)) && jw_real(b, lua_tonumber(L, v.idx)) == GG_OK;
    case LUA_TBOOLEAN:
        return lua_toboolean(L, v.idx) ? put(b, "true", 4) : put(b, "false", 5);
    case LUA_TLIGHTUSERDATA:
        return lb_is_null(L, v.idx) && put(b, "null", 4);
    case LUA_TTABLE:
        return emit_table(L, v, b, depth, NULL);
    default:
        return false;
    }
}

/* An object with the members keep picks, each whole; anything else whole. */
static bool emit_kept(lua_State *L, struct val v, struct buf *b, bool (*keep)(const char *key))
{
    if (shape_of(L, v) != 1)
        return emit(L, v, b, 2);
    return v.node ? emit_node_kept(v.node, b, keep) : emit_table(L, v, b, 2, keep);
}

/* "key":v[key] after what is written (*first as for put_key); nothing when it is absent.
 * keep: for an object, the members kept (NULL: all). */
static bool emit_member(lua_State *L, struct buf *b, bool *first, struct val obj, const char *key,
                        bool (*keep)(const char *key))
{
    int top = lua_gettop(L);
    struct val v = member(L, obj, key);
    bool ok = absent(v) || (put_key(b, first, key, strlen(key)) &&
                            (keep ? emit_kept(L, v, b, keep) : emit(L, v, b, 2)));
    lua_settop(L, top);
    return ok;
}

/* A container: its name, restartPolicy, and the extended resources of its limits and requests. */
static bool emit_container(lua_State *L, struct val c, struct buf *b)
{
    if (shape_of(L, c) != 1)
        return emit(L, c, b, 3);
    int top = lua_gettop(L);
    bool first = true;
    bool ok = put(b, "{", 1) && emit_member(L, b, &first, c, "name", NULL) &&
              emit_member(L, b, &first, c, "restartPolicy", NULL);
    struct val res = member(L, c, "resources");
    if (ok && !absent(res)) {
        ok = put_key(b, &first, "resources", 9);
        if (ok && shape_of(L, res) != 1) {
            ok = emit(L, res, b, 4);
        } else if (ok) {
            bool inner = true;
            ok = put(b, "{", 1) && emit_member(L, b, &inner, res, "limits", inf_charged_resource) &&
                 emit_member(L, b, &inner, res, "requests", inf_charged_resource) && put(b, "}", 1);
        }
    }
    lua_settop(L, top);
    return ok && put(b, "}", 1);
}

/* A list of containers, each as emit_container writes it; anything else whole. */
static bool emit_containers(lua_State *L, struct val list, struct buf *b)
{
    if (shape_of(L, list) != 0)
        return emit(L, list, b, 2);
    uint32_t n = length(L, list);
    int top = lua_gettop(L);
    bool ok = put(b, "[", 1);
    for (uint32_t i = 0; ok && i < n; i++) {
        ok = (i == 0 || put(b, ",", 1)) && emit_container(L, element(L, list, i), b);
        lua_settop(L, top);
    }
    return ok && put(b, "]", 1);
}

/* A member of a section of the pod the key holds: whole, with the members keep picks, or a
 * list of containers. */
struct kept {
    const char *key;
    bool (*keep)(const char *key);
    bool containers;
};

/* "key":pod[key] after what is written (*first as for put_key), an object with the members
 * kept (n of them); anything but an object whole; nothing when it is absent. */
static bool emit_section(lua_State *L, struct buf *b, bool *first, struct val pod, const char *key,
                         const struct kept *kept, size_t n)
{
    int top = lua_gettop(L);
    struct val v = member(L, pod, key);
    bool ok = absent(v) || put_key(b, first, key, strlen(key));
    if (ok && !absent(v) && shape_of(L, v) != 1) {
        ok = emit(L, v, b, 1);
    } else if (ok && !absent(v)) {
        bool inner = true;
        ok = put(b, "{", 1);
        for (size_t i = 0; ok && i < n; i++) {
            if (!kept[i].containers) {
                ok = emit_member(L, b, &inner, v, kept[i].key, kept[i].keep);
                continue;
            }
            int at = lua_gettop(L);
            struct val list = member(L, v, kept[i].key);
            ok = absent(list) || (put_key(b, &inner, kept[i].key, strlen(kept[i].key)) &&
                                  emit_containers(L, list, b));
            lua_settop(L, at);
        }
        ok = ok && put(b, "}", 1);
    }
    lua_settop(L, top);
    return ok;
}

/* Does the pod name claims: a spec.resourceClaims that is not null or an empty list? */
static bool names_claims(lua_State *L, struct val pod)
{
    int top = lua_gettop(L);
    struct val rc = member(L, member(L, pod, "spec"), "resourceClaims");
    bool none = absent(rc) || (shape_of(L, rc) == 0 && length(L, rc) == 0) ||
                (rc.node ? rc.node->type == JF_NULL : lb_is_null(L, rc.idx));
    lua_settop(L, top);
    return !none;
}

/* The parts of the pod at idx its charge spec is cut from, as a JSON object. */
static bool emit_pod(lua_State *L, int idx, struct buf *b)
{
    static const struct kept metadata[] = {{"namespace", NULL, false},
                                           {"annotations", inf_charge_annotation, false}};
    static const struct kept spec[] = {{"nodeSelector", NULL, false},
                                       {"resourceClaims", NULL, false},
                                       {"containers", NULL, true},
                                       {"initContainers", NULL, true}};
    static const struct kept status[] = {{"resourceClaimStatuses", NULL, false}};
    struct val pod = resolve(L, idx);
    bool first = true;
    return put(b, "{", 1) && emit_section(L, b, &first, pod, "metadata", metadata, 2) &&
           emit_section(L, b, &first, pod, "spec", spec, 4) &&
           emit_section(L, b, &first, pod, "status", status, 1) && put(b, "}", 1);
}

/*
 * gpuguard.charge_key(pod, namespace): the key of pod's charge in a request
 * of namespace (a string, or nil): the namespace, a NUL byte, and the text
 * above; and for a pod naming claims the version of the DRA objects its
 * charge reads (0 without an inventory), false for a pod naming none.  nil
 * when a part of the pod is not JSON (a function, a mixed table).
 */
int lb_charge_key(lua_State *L)
{
    size_t ns_len = 0;
    const char *ns = luaL_optlstring(L, 2, "", &ns_len);
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 2);
    luaL_checkstack(L, 2 * LB_MAX_DEPTH + 32, "object too deep");
    struct buf text;
    buf_init(&text, KEY_TEXT_MAX);
    bool ok = put(&text, ns, ns_len) && put(&text, "", 1) && emit_pod(L, 1, &text);
    bool claims = ok && names_claims(L, resolve(L, 1));
    lua_settop(L, 2);
    struct lb_vm *vm = lb_vm_of(L);
    if (claims)
        lb_read_dra(L); /* the charge of such a pod reads DRA objects */
    if (ok) {
        lua_pushlstring(L, text.data, text.len);
        if (claims)
            lua_pushinteger(L, vm->inventory ? (lua_Integer)inv_dra_version(vm->inventory) : 0);
        else
            lua_pushboolean(L, false);
    }
    size_t work = text.len;
    buf_clear(&text);
    if (lb_budget_charge(vm, (int64_t)(work / 16)))
        return luaL_error(L, "%s", lb_kill_message(vm->kill));
    if (!ok) {
        lua_pushnil(L);
        return 1;
    }
    return 2;
}

/* gpuguard.dra_version(): the version of the DRA objects, as charge_key gives it; nil once a
 * DRA object could not be known in this request (what was worked out of it holds for none). */
int lb_dra_version(lua_State *L)
{
    lb_read_dra(L);
    struct lb_vm *vm = lb_vm_of(L);
    if (vm->dra_unknown)
        lua_pushnil(L);
    else
        lua_pushinteger(L, vm->inventory ? (lua_Integer)inv_dra_version(vm->inventory) : 0);
    return 1;
}
