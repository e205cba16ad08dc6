/*
 * lb_json.c - JSON -> Lua and Lua -> JSON, whole values at a time (the
 * request's object goes to Lua lazily instead: lb_lazy.c).  JSON comes in
 * as nodes (util/jsonfast.h); jansson values are read through nodes too.
 *
 * Objects and arrays are tables with the object or array mark, null is the
 * light userdata gpuguard.null, integers stay integers; a table a policy
 * made is an array when its keys are 1..n and an object when they are
 * strings.  Conversions refuse nesting deeper than LB_MAX_DEPTH.
 */
#include "engine/lb_internal.h"
#include "util/jsonfast.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void lb_mark(lua_State *L, const void *mt_key)
{
    lb_push_registry(L, mt_key);
    lua_setmetatable(L, -2);
}

bool lb_is_null(lua_State *L, int idx)
{
    return lua_touserdata(L, idx) == (void *)&lb_key_null_marker;
}

void lb_push_scalar(lua_State *L, const struct jf_node *v)
{
    switch (v->type) {
    case JF_STRING:
        lua_pushlstring(L, v->u.s, v->n);
        break;
    case JF_INTEGER:
        lua_pushinteger(L, (lua_Integer)v->u.i);
        break;
    case JF_REAL:
        lua_pushnumber(L, v->u.d);
        break;
    case JF_TRUE:
    case JF_FALSE:
        lua_pushboolean(L, v->type == JF_TRUE);
        break;
    default:
        lua_pushlightuserdata(L, (void *)&lb_key_null_marker);
        break;
    }
}

/*
 * The conversion keeps the two marking metatables at fixed stack slots
 * (mts, mts + 1: object, array) rather than fetching them from the registry
 * for every table, and hands keys over with their length.
 */
static int push_node(lua_State *L, const struct jf_node *v, int depth, int mts)
{
    if (depth > LB_MAX_DEPTH)
        return -1;
    luaL_checkstack(L, 4, "JSON too deep");
    if (!jf_is_container(v)) {
        lb_push_scalar(L, v);
        return 0;
    }
    bool array = v->type == JF_ARRAY;
    lua_createtable(L, array ? (int)v->n : 0, array ? 0 : (int)v->n);
    lua_pushvalue(L, mts + array);
    lua_setmetatable(L, -2);
    for (uint32_t i = 0; i < v->n; i++) {
        const struct jf_node *item = &v->u.items[i];
        if (!array)
            lua_pushlstring(L, item->key, item->key_len);
        if (push_node(L, item, depth + 1, mts))
            return -1;
        if (array)
            lua_rawseti(L, -2, (lua_Integer)i + 1);
        else
            lua_rawset(L, -3);
    }
    return 0;
}

void lb_push_node_or_raise(lua_State *L, const struct jf_node *v, const char *what)
{
    int top = lua_gettop(L);
    lb_push_registry(L, &lb_key_object_mt);
    lb_push_registry(L, &lb_key_array_mt);
    if (push_node(L, v, 0, top + 1)) {
        lua_settop(L, top);
        luaL_error(L, "%s nests deeper than %d levels", what, LB_MAX_DEPTH);
    }
    lua_remove(L, top + 1); /* the two metatables under the value */
    lua_remove(L, top + 1);
}

/* lb_push_json_or_raise's conversion, run in protected mode. */
struct json_push {
    const json_t *value;
    struct jf_doc doc;
    const char *what;
};

static int push_json_protected(lua_State *L)
{
    struct json_push *c = lua_touserdata(L, 1);
    if (jf_from_json(c->value, &c->doc) != 0)
        return luaL_error(L, "out of memory converting %s", c->what);
    lb_push_node_or_raise(L, c->doc.root, c->what);
    return 1;
}

/*
 * Protected, so that v and its nodes are released before any error goes
 * on: v may live in the request's arena (a DRA object), which is gone by
 * the time a collection would find anything that held it.  A budget's
 * refusal still ends the policy's call as out of memory (the kill is armed).
 */
void lb_push_json_or_raise(lua_State *L, json_t *v, const char *what)
{
    struct json_push c = {v, {NULL, NULL, NULL}, what};
    lua_pushcfunction(L, push_json_protected);
    lua_pushlightuserdata(L, &c);
    int st = lua_pcall(L, 1, 1, 0);
    jf_doc_free(&c.doc);
    json_decref(v);
    if (st != LUA_OK)
        lua_error(L);
}

/* True when a value inside v sits deeper than LB_MAX_DEPTH (v is at depth). */
bool lb_too_deep(const struct jf_node *v, int depth)
{
    if (!jf_is_container(v))
        return false;
    for (uint32_t i = 0; i < v->n; i++)
        if (depth >= LB_MAX_DEPTH || lb_too_deep(&v->u.items[i], depth + 1))
            return true;
    return false;
}

/*
 * Append key to out: as it is when it is UTF-8, control characters and the
 * bytes of a key that is not UTF-8 as \xNN, cut only between characters,
 * so the message that names the path is valid UTF-8 whatever the key.
 */
static size_t put_key(char *out, size_t size, size_t used, const char *key)
{
    size_t len = strlen(key), n;
    bool utf8 = jf_utf8_valid(key, len);
    for (size_t i = 0; i < len; i += n) {
        unsigned char c = (unsigned char)key[i];
        char piece[5];
        if (c < 0x20 || c == 0x7f || (c >= 0x80 && !utf8)) {
            n = 1;
            snprintf(piece, sizeof(piece), "\\x%02x", c);
        } else {
            n = gg_utf8_len(c);
            memcpy(piece, key + i, n);
            piece[n] = '\0';
        }
        size_t w = strlen(piece);
        if (used + w >= size)
            break;
        memcpy(out + used, piece, w + 1);
        used += w;
    }
    return used;
}

static void path_format(const struct lb_path *p, char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < p->depth && used + 1 < size; i++) {
        out[used++] = '/';
        out[used] = '\0';
        if (p->seg[i].key) {
            used = put_key(out, size, used, p->seg[i].key);
        } else {
            int n = snprintf(out + used, size - used, "%zu", p->seg[i].index);
            used = n > 0 && (size_t)n < size - used ? used + (size_t)n : size - 1;
        }
    }
    if (!out[0])
        snprintf(out, size, "/");
}

enum gg_status lb_path_fail(const struct lb_path *p, struct gg_err *err, const char *what)
{
    char where[160];
    path_format(p, where, sizeof(where));
    return gg_fail(err, GG_ERR_INVALID, "%s at %s", what, where);
}

/* Which shape an unmarked table has: 1 array, 0 object, -1 neither, -2 empty. */
int lb_infer_shape(lua_State *L, int idx)
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
static enum gg_status made(json_t *v, struct lb_path *p, struct gg_err *err)
{
    return v ? GG_OK : lb_path_fail(p, err, "out of memory");
}

static enum gg_status array_to_json(lua_State *L, int idx, struct lb_path *p, json_t **out,
                                    struct gg_err *err)
{
    size_t n = lua_rawlen(L, idx);
    json_t *arr = json_array();
    if (!arr)
        return made(arr, p, err);
    for (size_t i = 1; i <= n; i++) {
        json_t *item;
        lb_path_index(p, i - 1);
        lua_rawgeti(L, idx, (lua_Integer)i);
        enum gg_status st = lb_to_json(L, -1, p, &item, err);
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

bool lb_next_member(lua_State *L, int idx, struct lb_path *p, const char **key, size_t *len,
                    enum gg_status *st, struct gg_err *err)
{
    if (*st != GG_OK || !lua_next(L, idx))
        return false;
    if (lua_type(L, -2) != LUA_TSTRING) {
        *st = lb_path_fail(p, err, "an object has a key that is not a string");
        lua_pop(L, 2);
        return false;
    }
    *key = lua_tolstring(L, -2, len);
    p->seg[p->depth].key = *key;
    p->depth++;
    return true;
}

/*
 * Set obj[key] = item (taken, dropped on failure), for a key from Lua: it
 * must be UTF-8, and a NUL byte in it is refused as jp_diff refuses one.
 * p names the key.
 */
static enum gg_status set_member(json_t *obj, const char *key, size_t len, json_t *item,
                                 const struct lb_path *p, struct gg_err *err)
{
    const char *bad = !jf_utf8_valid(key, len)         ? "an object key is not valid UTF-8"
                      : memchr(key, '\0', len) != NULL ? "an object key contains a NUL byte"
                                                       : NULL;
    if (bad) {
        json_decref(item);
        return lb_path_fail(p, err, bad);
    }
    if (json_object_setn_new_nocheck(obj, key, len, item) != 0)
        return lb_path_fail(p, err, "out of memory");
    return GG_OK;
}

static enum gg_status object_to_json(lua_State *L, int idx, struct lb_path *p, json_t **out,
                                     struct gg_err *err)
{
    json_t *obj = json_object();
    enum gg_status st = made(obj, p, err);
    if (st != GG_OK)
        return st;
    const char *key;
    size_t klen;
    lua_pushnil(L);
    while (lb_next_member(L, idx, p, &key, &klen, &st, err)) {
        json_t *item = NULL;
        st = lb_to_json(L, -1, p, &item, err);
        if (st == GG_OK)
            st = set_member(obj, key, klen, item, p, err);
        p->depth--;
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

static enum gg_status table_to_json(lua_State *L, int idx, struct lb_path *p, json_t **out,
                                    struct gg_err *err)
{
    if (p->depth > LB_MAX_DEPTH)
        return lb_path_fail(p, err, "nesting deeper than 100 levels");
    lua_pushvalue(L, idx);
    lb_unproxy(L, -1);
    int t = lua_gettop(L);
    luaL_checkstack(L, 6, "object too deep");
    lb_materialize_if_lazy(L, t); /* moved from elsewhere: convert what it holds */
    int shape;
    if (lua_getmetatable(L, t)) {
        lua_pop(L, 1);
        shape = lb_shape_of(L, t) == SHAPE_ARRAY ? 1 : 0;
    } else {
        shape = lb_infer_shape(L, t);
    }
    enum gg_status st;
    if (shape == -2)
        st = lb_path_fail(p, err,
                          "an empty table is ambiguous: use gpuguard.array() or gpuguard.object()");
    else if (shape == -1)
        st = lb_path_fail(p, err, "a table mixes array and object keys");
    else
        st = shape == 1 ? array_to_json(L, t, p, out, err) : object_to_json(L, t, p, out, err);
    lua_pop(L, 1);
    return st;
}

enum gg_status lb_to_json(lua_State *L, int idx, struct lb_path *p, json_t **out,
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
        if (!jf_utf8_valid(s, len))
            return lb_path_fail(p, err, "a string is not valid UTF-8");
        *out = json_stringn_nocheck(s, len);
        return made(*out, p, err);
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) {
            *out = json_integer((json_int_t)lua_tointeger(L, idx));
            return made(*out, p, err);
        }
        if (!isfinite(lua_tonumber(L, idx)))
            return lb_path_fail(p, err, "a number is not finite (JSON has no inf or nan)");
        *out = json_real(lua_tonumber(L, idx));
        return made(*out, p, err);
    case LUA_TBOOLEAN:
        *out = json_boolean(lua_toboolean(L, idx));
        return GG_OK;
    case LUA_TLIGHTUSERDATA:
        if (lb_is_null(L, idx)) {
            *out = json_null();
            return GG_OK;
        }
        /* fall through */
    default:;
        char what[64];
        snprintf(what, sizeof(what), "a %s cannot be converted to JSON", luaL_typename(L, idx));
        return lb_path_fail(p, err, what);
    }
}

enum gg_status lb_lua_to_json(lua_State *L, int idx, json_t **out, struct gg_err *err)
{
    struct lb_path p = {0};
    return lb_to_json(L, idx, &p, out, err);
}
