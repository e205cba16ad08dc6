/*
 * lb_diff.c - the JSON patch from the original object (nodes) to the object
 * as the policies left it, converting only the parts that differ.
 */
#include "engine/lb_internal.h"
#include "codec/jsonpatch.h"
#include "util/jsonfast.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Exact equality of the Lua value at idx and v, as JSON (1 and 1.0 differ). */
static bool equals_json(lua_State *L, int idx, const struct jf_node *v, int depth)
{
    size_t len;
    const char *s;
    switch (lua_type(L, idx)) {
    case LUA_TSTRING:
        s = lua_tolstring(L, idx, &len);
        return v->type == JF_STRING && v->n == len && memcmp(v->u.s, s, len) == 0;
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx))
            return v->type == JF_INTEGER && v->u.i == lua_tointeger(L, idx);
        return v->type == JF_REAL && v->u.d == lua_tonumber(L, idx) &&
               signbit(v->u.d) == signbit(lua_tonumber(L, idx));
    case LUA_TBOOLEAN:
        return (v->type == JF_TRUE || v->type == JF_FALSE) &&
               (v->type == JF_TRUE) == lua_toboolean(L, idx);
    case LUA_TLIGHTUSERDATA:
        return v->type == JF_NULL && lb_is_null(L, idx);
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
        const struct jf_node *src = lb_stub_source(L, idx);
        return src && jf_same(src, v);
    }
    if (shape == SHAPE_ARRAY) {
        size_t n = lua_rawlen(L, idx);
        if (v->type != JF_ARRAY || v->n != n)
            return false;
        for (size_t i = 0; i < n; i++) {
            lua_rawgeti(L, idx, (lua_Integer)i + 1);
            bool eq = equals_json(L, -1, &v->u.items[i], depth + 1);
            lua_pop(L, 1);
            if (!eq)
                return false;
        }
        return true;
    }
    if (v->type != JF_OBJECT)
        return false;
    size_t count = 0, klen;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        /* By length: a key with a NUL byte must not match the key before it. */
        const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &klen) : NULL;
        const struct jf_node *item = key ? jf_get(v, key, klen) : NULL;
        count++;
        if (!item || !equals_json(L, -1, item, depth + 1)) {
            lua_pop(L, 2);
            return false;
        }
        lua_pop(L, 1);
    }
    return count == v->n;
}

/*
 * The patch comes straight from the walk: the Lua side is compared with the
 * original where it stands, and only what differs is converted to JSON and
 * handed to the differ at its path (jp_differ_value gives the ops jp_diff
 * would give for that pair).  Object members are visited in jp_key_cmp
 * order, as jp_diff visits them, so the patch is the one jp_diff would
 * write for the whole objects, without converting what is equal.
 */

/* A member that may differ: only in Lua (ov NULL), only in the original (removed), or both. */
struct member {
    struct jp_key key; /* a string held by the Lua table or the original */
    const struct jf_node *ov;
    bool removed;
};

/*
 * One diff.  The members of every object being walked share one list, the
 * innermost last; it and the differ live outside the protected call, so a
 * Lua error that unwinds the walk (out of memory) leaves nothing behind.
 */
struct walk {
    struct jp_differ d;
    struct lb_path p;
    struct member *members;
    size_t n_members, cap;
    struct gg_err sub;
};

static enum gg_status diff_value(lua_State *L, int idx, const struct jf_node *ov, struct walk *w);

static bool members_add(struct walk *w, const char *key, size_t len, const struct jf_node *ov,
                        bool removed)
{
    if (w->n_members == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        struct member *at = realloc(w->members, cap * sizeof(*at));
        if (!at)
            return false;
        w->members = at;
        w->cap = cap;
    }
    w->members[w->n_members++] = (struct member){{key, len}, ov, removed};
    return true;
}

/* A filled table may differ anywhere inside; anything else is compared now. */
static bool may_differ(lua_State *L, int idx, const struct jf_node *ov)
{
    if (lua_type(L, idx) == LUA_TTABLE) {
        enum shape shape = lb_shape_of(L, idx);
        if (shape == SHAPE_OBJECT || shape == SHAPE_ARRAY)
            return true;
    }
    return !equals_json(L, idx, ov, 0);
}

/* Pass one: which members differ or may; pass two, in key order, their ops. */
static enum gg_status collect_members(lua_State *L, int idx, const struct jf_node *original,
                                      struct walk *w)
{
    enum gg_status st = GG_OK;
    size_t matched = 0; /* Lua keys the original has: fewer than its size means removals */
    const char *key;
    size_t key_len;
    lua_pushnil(L);
    while (lb_next_member(L, idx, &w->p, &key, &key_len, &st, &w->sub)) {
        const struct jf_node *ov = jf_get(original, key, key_len);
        matched += ov != NULL;
        if (!ov && !jf_utf8_valid(key, key_len)) /* the original's keys are */
            st = lb_path_fail(&w->p, &w->sub, "an object key is not valid UTF-8");
        else if ((!ov || may_differ(L, -1, ov)) && !members_add(w, key, key_len, ov, false))
            st = lb_path_fail(&w->p, &w->sub, "out of memory");
        w->p.depth--;
        lua_pop(L, st == GG_OK ? 1 : 2);
    }
    if (st != GG_OK || matched == original->n)
        return st;
    for (uint32_t i = 0; i < original->n; i++) {
        const struct jf_node *ov = &original->u.items[i];
        lua_pushlstring(L, ov->key, ov->key_len);
        bool gone = lua_rawget(L, idx) == LUA_TNIL;
        lua_pop(L, 1);
        if (gone && !members_add(w, ov->key, ov->key_len, ov, true))
            return lb_path_fail(&w->p, &w->sub, "out of memory");
    }
    return GG_OK;
}

static enum gg_status diff_member(lua_State *L, int idx, const struct member *mb, struct walk *w)
{
    if (mb->removed)
        return jp_differ_emit(&w->d, "remove", NULL);
    lua_pushlstring(L, mb->key.s, mb->key.len);
    lua_rawget(L, idx);
    enum gg_status st;
    if (mb->ov) {
        st = diff_value(L, -1, mb->ov, w);
    } else {
        json_t *added = NULL;
        st = lb_to_json(L, -1, &w->p, &added, &w->sub);
        if (st == GG_OK)
            st = jp_differ_emit(&w->d, "add", added);
        json_decref(added);
    }
    lua_pop(L, 1);
    return st;
}

static enum gg_status diff_object(lua_State *L, int idx, const struct jf_node *original,
                                  struct walk *w)
{
    idx = lua_absindex(L, idx);
    luaL_checkstack(L, 4, "object too deep");
    size_t base = w->n_members, mark = w->d.path.len;
    enum gg_status st = collect_members(L, idx, original, w);
    size_t n = w->n_members - base;
    if (st == GG_OK && n > 1) /* the key comes first in a member */
        qsort(w->members + base, n, sizeof(*w->members), jp_key_cmp);
    for (size_t i = 0; st == GG_OK && i < n; i++) {
        struct member mb = w->members[base + i]; /* a copy: deeper objects may move the list */
        w->p.seg[w->p.depth].key = mb.key.s;
        w->p.depth++;
        st = jp_differ_key(&w->d, mb.key.s, mb.key.len);
        if (st == GG_OK)
            st = diff_member(L, idx, &mb, w);
        w->p.depth--;
        w->d.path.len = mark;
    }
    w->n_members = base;
    return st;
}

/* Arrays of the same length keep their positions: elements are compared in place. */
static enum gg_status diff_array(lua_State *L, int idx, const struct jf_node *original,
                                 struct walk *w)
{
    idx = lua_absindex(L, idx);
    luaL_checkstack(L, 4, "object too deep");
    size_t n = original->n, mark = w->d.path.len;
    enum gg_status st = GG_OK;
    for (size_t i = 0; st == GG_OK && i < n; i++) {
        lua_rawgeti(L, idx, (lua_Integer)i + 1);
        const struct jf_node *ov = &original->u.items[i];
        if (may_differ(L, -1, ov)) {
            lb_path_index(&w->p, i);
            st = jp_differ_index(&w->d, i);
            if (st == GG_OK)
                st = diff_value(L, -1, ov, w);
            w->p.depth--;
            w->d.path.len = mark;
        }
        lua_pop(L, 1);
    }
    return st;
}

/*
 * The edited side of an array that grew or shrank as JSON, sharing the
 * original's elements (original_json, its conversion) where the Lua array
 * still holds equal ones: *edited stays NULL when one of those differs
 * (then the whole array is converted).  jp_differ_value finds the shared
 * prefix by identity and appends or removes the rest, as it would after
 * converting everything.
 */
static enum gg_status resized_array(lua_State *L, int idx, const struct jf_node *original,
                                    const json_t *original_json, json_t **edited, struct walk *w)
{
    idx = lua_absindex(L, idx);
    luaL_checkstack(L, 4, "object too deep");
    size_t n = lua_rawlen(L, idx), keep = n < original->n ? n : original->n;
    *edited = NULL;
    for (size_t i = 0; i < keep; i++) {
        lua_rawgeti(L, idx, (lua_Integer)i + 1);
        bool same = equals_json(L, -1, &original->u.items[i], 0);
        lua_pop(L, 1);
        if (!same)
            return GG_OK;
    }
    json_t *arr = json_array();
    enum gg_status st = arr ? GG_OK : lb_path_fail(&w->p, &w->sub, "out of memory");
    for (size_t i = 0; st == GG_OK && i < n; i++) {
        json_t *item = NULL;
        if (i < keep) {
            item = json_incref(json_array_get(original_json, i));
        } else {
            lua_rawgeti(L, idx, (lua_Integer)i + 1);
            lb_path_index(&w->p, i);
            st = lb_to_json(L, -1, &w->p, &item, &w->sub);
            w->p.depth--;
            lua_pop(L, 1);
        }
        if (st == GG_OK && json_array_append_new(arr, item) != 0)
            st = lb_path_fail(&w->p, &w->sub, "out of memory");
    }
    if (st != GG_OK)
        json_decref(arr);
    else
        *edited = arr;
    return st;
}

/*
 * The ops for one value that exists on both sides (w->p.depth tokens deep).
 * Where the two differ other than member by member, the original's part is
 * converted to JSON for the differ: only what a policy changed.
 */
static enum gg_status diff_value(lua_State *L, int idx, const struct jf_node *ov, struct walk *w)
{
    enum shape shape = lb_shape_of(L, idx);
    bool deeper = w->p.depth < LB_MAX_DEPTH;
    if (deeper && lb_is_lazy(shape) &&
        ov->type == (shape == SHAPE_LAZY_OBJECT ? JF_OBJECT : JF_ARRAY)) {
        /* A stub here differs from ov (may_differ found it so): one of another document, a
         * replayed call's (lb_request_rewind).  Filled and walked member by member, where most
         * members are the original's own nodes, rather than both sides made JSON. */
        lb_materialize(L, idx, shape);
        shape = shape == SHAPE_LAZY_OBJECT ? SHAPE_OBJECT : SHAPE_ARRAY;
    }
    if (deeper && shape == SHAPE_OBJECT && ov->type == JF_OBJECT)
        return diff_object(L, idx, ov, w);
    if (deeper && shape == SHAPE_ARRAY && ov->type == JF_ARRAY && lua_rawlen(L, idx) == ov->n)
        return diff_array(L, idx, ov, w);
    bool resized = deeper && shape == SHAPE_ARRAY && ov->type == JF_ARRAY;
    if (!resized && equals_json(L, idx, ov, 0))
        return GG_OK;
    json_t *edited = NULL, *original = jf_to_json(ov);
    enum gg_status st = original ? GG_OK : lb_path_fail(&w->p, &w->sub, "out of memory");
    if (st == GG_OK && resized)
        st = resized_array(L, idx, ov, original, &edited, w);
    if (st == GG_OK && !edited)
        st = lb_to_json(L, idx, &w->p, &edited, &w->sub);
    if (st == GG_OK)
        st = jp_differ_value(&w->d, original, edited, (size_t)w->p.depth);
    json_decref(edited);
    json_decref(original);
    return st;
}

/* lb_request_patch's work, run in protected mode. */
struct patch_call {
    const struct jf_node *original;
    struct walk *w;
    enum gg_status st;
};

static int patch_protected(lua_State *L)
{
    struct patch_call *c = lua_touserdata(L, 1);
    lua_settop(L, 0);
    lua_rawgeti(L, LUA_REGISTRYINDEX, lb_vm_of(L)->obj_ref);
    enum shape shape = lb_shape_of(L, -1);
    const struct jf_node *source = shape == SHAPE_LAZY_OBJECT ? lb_stub_source(L, -1) : NULL;
    if (source && source != c->original) {
        lb_materialize(L, -1, shape); /* a stub of another object (lb_request_rewind) */
        shape = SHAPE_OBJECT;
    }
    if (shape == SHAPE_OBJECT)
        c->st = diff_object(L, -1, c->original, c->w);
    else if (shape != SHAPE_LAZY_OBJECT) /* a stub: no policy looked at it */
        c->st = gg_fail(&c->w->sub, GG_ERR_INVALID, "the object was replaced by something else");
    else
        c->st = GG_OK;
    return 0;
}

/*
 * The diff pushes strings and grows the stack, which raise on a failed
 * allocation: it runs under lua_pcall, and such a failure refuses the edit.
 */
enum gg_status lb_request_patch(struct lb_vm *vm, const struct jf_node *original, json_t **patch,
                                struct gg_err *err)
{
    struct walk w = {.members = NULL};
    struct patch_call c = {original, &w, GG_ERR_NOMEM};
    lua_State *L = vm->L;
    if (jp_differ_begin(&w.d, &w.sub) != GG_OK)
        return gg_fail(err, GG_ERR_NOMEM, "the edited object cannot be JSON: out of memory");
    lua_pushcfunction(L, patch_protected);
    lua_pushlightuserdata(L, &c);
    if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
        c.st = gg_fail(&w.sub, GG_ERR_NOMEM, "%s",
                       lua_tostring(L, -1) ? lua_tostring(L, -1) : "out of memory");
        lua_pop(L, 1);
    }
    free(w.members);
    json_t *done = jp_differ_end(&w.d, c.st == GG_OK);
    if (c.st != GG_OK)
        return gg_fail(err, c.st, "the edited object cannot be JSON: %s", w.sub.msg);
    *patch = done;
    return GG_OK;
}
