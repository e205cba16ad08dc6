/*
 * lua_profile.c - where the policies' Lua time goes, in VM instructions.
 *
 * Linked into build/bench/bench_engine_profile (`make lua-profile`) with
 * -Wl,--wrap=lua_sethook,--wrap=lua_gethook,--wrap=lua_newstate: every VM
 * gets a hook on every instruction and every call, and between
 * lua_profile_start and lua_profile_report each instruction is counted
 * against its line, against its function (self) and against every function
 * on the stack (inclusive, once per function however deep it recurses).
 * Callgrind sees the interpreter but not which policy line it runs; this
 * sees the lines.  The hook slows a review a hundredfold, so its figures are
 * counts, never times.
 *
 * The engine's own hook (the instruction budget) still runs: the wrappers
 * keep it aside and the profiling hook calls it every `count` instructions,
 * as Lua would, so a runaway policy is stopped here as in the server.  Only
 * count hooks are passed on (the engine sets no other), and the state is
 * global: for bench_engine's one thread, not for the server's workers.
 */
#include "lua_profile.h"

#include <lauxlib.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS (1 << 16) /* per table; a profile of the shipped policies fills ~1,500 */
#define SHOWN 60        /* rows per section of the report */
#define DEPTH 64        /* stack levels an instruction is counted against */

struct entry {
    char *key;
    long self, inclusive;
};

static struct entry funcs[SLOTS], lines[SLOTS], calls[SLOTS];
static bool counting, full, deep;
static long instructions;

/* The engine's hook, kept aside: set by the wrapped lua_sethook (possibly
 * from the watchdog's signal handler, hence the plain volatile stores). */
static volatile lua_Hook engine_hook;
static volatile int engine_count, engine_left;

void __real_lua_sethook(lua_State *L, lua_Hook f, int mask, int count);
lua_State *__real_lua_newstate(lua_Alloc f, void *ud);

static struct entry *slot(struct entry *table, const char *key)
{
    uint32_t h = 2166136261u;
    for (const char *p = key; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    for (uint32_t i = h & (SLOTS - 1), n = 0; n < SLOTS / 2; i = (i + 1) & (SLOTS - 1), n++) {
        if (!table[i].key && !(table[i].key = strdup(key)))
            break;
        if (strcmp(table[i].key, key) == 0)
            return &table[i];
    }
    full = true; /* reported: the figures are then incomplete */
    return NULL;
}

static void count_instruction(lua_State *L, lua_Debug *ar)
{
    char key[256];
    const char *seen[DEPTH];
    int nseen = 0;
    lua_Debug frame;
    instructions++;
    lua_getinfo(L, "Sl", ar);
    snprintf(key, sizeof(key), "%s:%d", ar->short_src, ar->currentline);
    struct entry *e = slot(lines, key);
    if (e)
        e->self++;
    if (lua_getstack(L, DEPTH, &frame))
        deep = true;
    for (int level = 0; level < DEPTH && lua_getstack(L, level, &frame); level++) {
        lua_getinfo(L, "S", &frame);
        if (*frame.what == 'C')
            continue;
        snprintf(key, sizeof(key), "%s:%d", frame.short_src, frame.linedefined);
        if (!(e = slot(funcs, key)))
            continue;
        if (level == 0)
            e->self++;
        bool again = false;
        for (int i = 0; i < nseen && !again; i++)
            again = seen[i] == e->key;
        if (!again) {
            e->inclusive++;
            seen[nseen++] = e->key;
        }
    }
}

static void count_call(lua_State *L, lua_Debug *ar)
{
    char key[256];
    lua_Debug caller;
    lua_getinfo(L, "Sn", ar);
    if (*ar->what == 'C') {
        const char *from = "?";
        int line = 0;
        if (lua_getstack(L, 1, &caller) && lua_getinfo(L, "Sl", &caller))
            from = caller.short_src, line = caller.currentline;
        snprintf(key, sizeof(key), "C function %s, from %s:%d", ar->name ? ar->name : "?", from,
                 line);
    } else {
        snprintf(key, sizeof(key), "%s:%d", ar->short_src, ar->linedefined);
    }
    struct entry *e = slot(calls, key);
    if (e)
        e->self++;
}

static void hook(lua_State *L, lua_Debug *ar)
{
    if (ar->event != LUA_HOOKCOUNT) {
        if (counting)
            count_call(L, ar);
        return;
    }
    if (counting)
        count_instruction(L, ar);
    lua_Hook f = engine_hook;
    if (f && --engine_left <= 0) {
        engine_left = engine_count;
        f(L, ar);
    }
}

void __wrap_lua_sethook(lua_State *L, lua_Hook f, int mask, int count)
{
    (void)L;
    engine_count = engine_left = count > 0 ? count : 1;
    engine_hook = mask & LUA_MASKCOUNT ? f : NULL; /* no mask or no f: none, as in Lua */
}

lua_Hook __wrap_lua_gethook(lua_State *L)
{
    (void)L;
    return engine_hook;
}

lua_State *__wrap_lua_newstate(lua_Alloc f, void *ud)
{
    lua_State *L = __real_lua_newstate(f, ud);
    if (L)
        __real_lua_sethook(L, hook, LUA_MASKCOUNT | LUA_MASKCALL, 1);
    return L;
}

void lua_profile_start(void)
{
    counting = true;
}

static int by_inclusive(const void *a, const void *b)
{
    const struct entry *x = a, *y = b;
    return (y->inclusive > x->inclusive) - (y->inclusive < x->inclusive);
}

static int by_self(const void *a, const void *b)
{
    const struct entry *x = a, *y = b;
    return (y->self > x->self) - (y->self < x->self);
}

static void section(FILE *out, const char *title, struct entry *table,
                    int (*order)(const void *, const void *), bool both, double per)
{
    qsort(table, SLOTS, sizeof(*table), order);
    fprintf(out, "\n%s\n", title);
    for (int i = 0; i < SHOWN && table[i].key && (table[i].self || table[i].inclusive); i++) {
        if (both)
            fprintf(out, "%10.1f %10.1f  %s\n", table[i].inclusive / per, table[i].self / per,
                    table[i].key);
        else
            fprintf(out, "%10.1f  %s\n", table[i].self / per, table[i].key);
    }
}

void lua_profile_report(FILE *out, long reviews)
{
    counting = false;
    double per = reviews > 0 ? (double)reviews : 1;
    fprintf(out, "\nLua VM instructions per review: %.1f (%ld reviews profiled)%s%s\n",
            instructions / per, reviews, full ? "; a table filled up, figures incomplete" : "",
            deep ? "; stacks deeper than 64 levels: outer functions' inclusive counts are short"
                 : "");
    section(out, "per function (inclusive, self; source:line where it is defined)", funcs,
            by_inclusive, true, per);
    section(out, "per line (self)", lines, by_self, false, per);
    section(out, "calls per review (Lua functions by where they are defined)", calls, by_self,
            false, per);
}
