/*
 * lb_diff.c - the JSON patch from the original object to the object as the
 * policies left it, converting only the parts that differ.
 */
#include "engine/lb_internal.h"
#include "codec/jsonpatch.h"

#include <math.h>
#include <string.h>

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
        return json_is_null(v) && lb_is_null(L, idx);
    case LUA_TTABLE:
        break;
    default:
        return false;
    }
    enum shape shape = lb_shape_of(L, idx);
    if (depth > LB_MAX_DEPTH || shape == SHAPE_NONE)
        return false; /* unmarked tables are new: let the conversion judge them */
    luaL_checkstack(L, 4, "object too deep");
    idx = lua_absindex(L, idx);
    if (lb_is_lazy(shape)) {
        /* Never touched: equal when it still stands where it came from. */
        const json_t *src = lb_stub_source(L, idx, false);
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
static enum gg_status prune_value(lua_State *L, int idx, json_t *ov, struct lb_path *p, json_t **so,
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
static enum gg_status prune_array(lua_State *L, int idx, const json_t *original, struct lb_path *p,
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
        st = lb_path_fail(p, err, "out of memory");
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

static enum gg_status prune_object(lua_State *L, int idx, const json_t *original, struct lb_path *p,
                                   json_t **orig_out, json_t **edit_out, struct gg_err *err)
{
    struct pruned r = {NULL, NULL, false};
    enum gg_status st = GG_OK;
    size_t matched = 0; /* Lua keys the original has: fewer than its size means removals */
    idx = lua_absindex(L, idx);
    luaL_checkstack(L, 4, "object too deep");
    const char *key;
    size_t key_len;
    lua_pushnil(L);
    while (lb_next_member(L, idx, p, &key, &key_len, &st, err)) {
        json_t *ov = json_object_getn(original, key, key_len), *so = NULL, *se = NULL;
        if (ov) {
            matched++;
            st = prune_value(L, -1, ov, p, &so, &se, err);
        } else {
            st = lb_to_json(L, -1, p, &se, err);
        }
        if (st == GG_OK && (so || se)) {
            pruned_start(&r);
            if (so)
                r.failed |= json_object_setn_new(r.o, key, key_len, so) != 0;
            if (se && json_object_setn_new(r.e, key, key_len, se) != 0)
                st = lb_path_fail(p, err, "an object key is not valid UTF-8");
        }
        p->depth--;
        lua_pop(L, 1);
        if (st != GG_OK)
            lua_pop(L, 1);
    }
    if (st == GG_OK && matched < json_object_size(original))
        prune_removed(L, idx, original, &r);
    if (st == GG_OK && r.failed)
        st = lb_path_fail(p, err, "out of memory");
    if (st != GG_OK)
        pruned_drop(&r);
    *orig_out = r.o;
    *edit_out = r.e;
    return st;
}

/* The differing parts of one value: both NULL when equal. */
static enum gg_status prune_value(lua_State *L, int idx, json_t *ov, struct lb_path *p, json_t **so,
                                  json_t **se, struct gg_err *err)
{
    *so = *se = NULL;
    enum shape shape = lb_shape_of(L, idx);
    if (p->depth < LB_MAX_DEPTH && shape == SHAPE_OBJECT && json_is_object(ov))
        return prune_object(L, idx, ov, p, so, se, err);
    if (p->depth < LB_MAX_DEPTH && shape == SHAPE_ARRAY && json_is_array(ov) &&
        lua_rawlen(L, idx) == json_array_size(ov))
        return prune_array(L, idx, ov, p, so, se, err);
    if (equals_json(L, idx, ov, 0))
        return GG_OK;
    enum gg_status st = lb_to_json(L, idx, p, se, err);
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
    lua_rawgeti(L, LUA_REGISTRYINDEX, lb_vm_of(L)->obj_ref);
    struct lb_path p = {0};
    struct gg_err sub = {{0}};
    json_t *o = NULL, *e = NULL;
    enum gg_status st;
    enum shape shape = lb_shape_of(L, -1);
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
