/*
 * lb_stdlib.c - bounded replacements for the library functions that could
 * run long in C.
 *
 * The budgets act between Lua instructions; these library functions could
 * loop in C for hours on one call.  The ones whose work depends on what
 * they are given charge it as instructions (lb_budget_charge), which also
 * checks the deadline: the pattern functions use gpuguard's own matcher
 * (luapattern.c), which counts its steps, gsub charges the walk of its
 * replacement string, and table.sort is a merge sort of its own that
 * charges each comparison, strings by their length.  The functions that
 * loop over a count refuse counts that could not fit in the VM's memory
 * anyway.
 */
#include "engine/lb_internal.h"
#include "engine/luapattern.h"

#include <ctype.h>
#include <limits.h>
#include <string.h>

/* Bytes that C compares or copies for one instruction's worth of budget
 * (strcmp does some hundred in the time of a VM instruction). */
#define LB_BYTES_PER_STEP 64

static int stopped(lua_State *L)
{
    return luaL_error(L, "%s", lb_kill_message(lb_vm_of(L)->kill));
}

/* Charge steps of C work; raise the kill's error when a budget is broken. */
static void charge(lua_State *L, int64_t steps)
{
    if (lb_budget_charge(lb_vm_of(L), steps))
        stopped(L);
}

/* A pattern match's budget check: its steps count as instructions. */
static bool pattern_budget(void *ctx, size_t steps)
{
    return lb_budget_charge(ctx, (int64_t)steps);
}

static int pattern_error(lua_State *L, const struct lp_state *ms)
{
    if (ms->stopped)
        return stopped(L);
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

/* Whether find searches for pattern p plainly: asked to (argument 4), or p has no
 * pattern character (a step per byte looked at, as the matcher counts them). */
static bool plain_find(lua_State *L, const char *p, size_t lp)
{
    if (lua_toboolean(L, 4))
        return true;
    size_t plain = lp_plain_prefix(p, lp);
    charge(L, (int64_t)plain);
    return plain == lp;
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
    if (find && plain_find(L, p, lp)) {
        start = lp_memfind(s + init, ls - init, p, lp);
        if (start) {
            lua_pushinteger(L, (lua_Integer)(start - s) + 1);
            lua_pushinteger(L, (lua_Integer)(start - s + lp));
            return 2;
        }
    } else {
        struct lp_state ms;
        lp_init(&ms, s, ls, p, lp, true, pattern_budget, lb_vm_of(L));
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
    lp_init(&gm->ms, s, ls, p, lp, false, pattern_budget, lb_vm_of(L));
    gm->src = s + (init > ls ? ls + 1 : init);
    gm->last = NULL;
    lua_pushcclosure(L, gmatch_next, 3);
    return 1;
}

/*
 * gsub's replacement string for the match [s, e): %0-%9 and %%.  The walk
 * is charged a step per escape and per LB_BYTES_PER_STEP bytes of text.
 */
static void add_replacement(lua_State *L, luaL_Buffer *b, const struct lp_state *ms, const char *s,
                            const char *e)
{
    size_t l;
    const char *text = lua_tolstring(L, 3, &l), *esc;
    charge(L, (int64_t)(l / LB_BYTES_PER_STEP));
    while ((esc = memchr(text, '%', l)) != NULL) {
        charge(L, 1);
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
    lp_init(&ms, src, ls, p, lp, true, pattern_budget, lb_vm_of(L));
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
    lua_Unsigned cap = lb_vm_of(L)->limits.memory / 16;
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
    if (n > 0 && (lua_Unsigned)n > lb_vm_of(L)->limits.memory / (l + lsep))
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

/*
 * table.sort(t [, comp]): a stable merge sort on the Lua stack, O(n log n)
 * comparisons whatever the order.  The list is read into slots once, sorted
 * there with half as many slots again as the merge buffer, and written back
 * only if an element moved: t is as it was when a comparison raises.  An
 * order function that contradicts itself gets some permutation of the
 * list (the stock sort may raise "invalid order function for sorting").
 */
struct sort {
    lua_State *L;
    int comp; /* the order function's stack index; 0: the < operator */
    int list; /* the slot of element 0; elements 0..n-1 follow */
    int buf;  /* the merge buffer's first slot; n/2 slots */
};

/* A comparison of two strings is charged their common length (what strcmp may read). */
static int64_t compare_cost(lua_State *L, int a, int b)
{
    if (lua_type(L, a) != LUA_TSTRING || lua_type(L, b) != LUA_TSTRING)
        return 1;
    size_t la = lua_rawlen(L, a), lb = lua_rawlen(L, b);
    return 1 + (int64_t)((la < lb ? la : lb) / LB_BYTES_PER_STEP);
}

/* Whether the value in slot a goes before the one in slot b; charged before it runs. */
static bool sorts_before(const struct sort *st, int a, int b)
{
    lua_State *L = st->L;
    if (!st->comp) {
        charge(L, compare_cost(L, a, b));
        return lua_compare(L, a, b, LUA_OPLT);
    }
    charge(L, 1); /* the function's own instructions count as any others */
    lua_pushvalue(L, st->comp);
    lua_pushvalue(L, a);
    lua_pushvalue(L, b);
    lua_call(L, 2, 1);
    bool before = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return before;
}

/* Merge the sorted runs lo..mid-1 and mid..hi-1: the first through the buffer. */
static void merge(const struct sort *st, int lo, int mid, int hi)
{
    lua_State *L = st->L;
    int n = mid - lo, i = 0, j = mid, to = lo;
    for (int k = 0; k < n; k++)
        lua_copy(L, st->list + lo + k, st->buf + k);
    while (i < n && j < hi) {
        if (sorts_before(st, st->list + j, st->buf + i))
            lua_copy(L, st->list + j++, st->list + to++);
        else
            lua_copy(L, st->buf + i++, st->list + to++);
    }
    while (i < n)
        lua_copy(L, st->buf + i++, st->list + to++);
}

/* Sort elements lo..hi-1; true when one of them moved. */
static bool merge_sort(const struct sort *st, int lo, int hi)
{
    if (hi - lo < 2)
        return false;
    int mid = lo + (hi - lo) / 2;
    bool moved = merge_sort(st, lo, mid);
    moved |= merge_sort(st, mid, hi);
    if (!sorts_before(st, st->list + mid, st->list + mid - 1))
        return moved; /* the runs are in order already */
    merge(st, lo, mid, hi);
    return true;
}

static int l_sort(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_Integer n = luaL_len(L, 1);
    if (n < 2)
        return 0;
    luaL_argcheck(L, n < INT_MAX / 2, 1, "array too big"); /* the slots below stay ints */
    check_count(L, "table.sort", 1, n);
    if (!lua_isnoneornil(L, 2))
        luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_settop(L, 2);
    int len = (int)n;
    /* the list, the buffer, and an order function's call */
    luaL_checkstack(L, len + len / 2 + 3, "too many elements to sort");
    struct sort st = {.L = L, .comp = lua_isnil(L, 2) ? 0 : 2, .list = 3, .buf = 3 + len};
    for (int i = 1; i <= len; i++)
        lua_geti(L, 1, i);
    lua_settop(L, st.buf + len / 2 - 1);
    if (merge_sort(&st, 0, len))
        for (int i = 0; i < len; i++) {
            lua_pushvalue(L, st.list + i);
            lua_seti(L, 1, i + 1);
        }
    return 0;
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

void lb_stdlib_open(lua_State *L)
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
    lua_getglobal(L, "table");
    lua_pushcfunction(L, l_sort);
    lua_setfield(L, -2, "sort");
    lua_pop(L, 1);
    wrap(L, "string", "rep", l_rep);
    wrap(L, "table", "move", l_move);
    wrap(L, "table", "concat", l_concat);
    wrap(L, "table", "unpack", l_unpack);
    wrap(L, "utf8", "char", l_utf8_char);
}
