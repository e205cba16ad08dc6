/*
 * luapattern.h - Lua 5.4 string patterns (the manual's section 6.4.1),
 * matched with a step budget.
 *
 * The matcher of string.find, match, gmatch and gsub in the policy sandbox.
 * It gives the stock library's results (tests/fuzz/fuzz_luapattern.c checks
 * that), but it counts its work in steps (a matching call, a pattern item,
 * a character a repetition takes, a byte of a set scanned) and every few
 * thousand steps it asks its caller whether to go on, so a pattern that
 * backtracks for hours stops at the request's budgets.
 * Pure: no Lua, no allocation, no I/O; errors come back as messages.
 */
#ifndef GG_LUAPATTERN_H
#define GG_LUAPATTERN_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>

#define LP_MAX_CAPTURES 32   /* as Lua's LUA_MAXCAPTURES */
#define LP_MAX_DEPTH 200     /* nested matching calls, as Lua's MAXCCALLS */
#define LP_CHECK_STEPS 4096  /* steps charged to the budget function at a time (or more) */
#define LP_CAP_UNFINISHED -1 /* a capture's len while it is open */
#define LP_CAP_POSITION -2   /* a position capture, "()" */

struct lp_capture {
    const char *init;
    ptrdiff_t len; /* or LP_CAP_UNFINISHED, LP_CAP_POSITION */
};

/* Charge the steps done since the last call; return true to stop the match
 * (it then fails with "stopped"). */
typedef bool (*lp_budget_fn)(void *ctx, size_t steps);

struct lp_state {
    const char *src, *src_end; /* the subject */
    const char *p, *p_end;     /* the pattern (without a leading '^' when anchored) */
    bool anchor;
    int level; /* captures open or closed */
    int depth; /* matching calls left before "pattern too complex" */
    struct lp_capture capture[LP_MAX_CAPTURES];
    size_t steps; /* since the last budget check */
    lp_budget_fn budget;
    void *ctx;
    bool stopped; /* the budget said stop */
    char error[96];
    sigjmp_buf fail;
};

/*
 * Prepare to match pattern p (lp bytes) on s (ls bytes).  anchor: a leading
 * '^' anchors the match (find, match, gsub; not gmatch).
 */
void lp_init(struct lp_state *ms, const char *s, size_t ls, const char *p, size_t lp, bool anchor,
             lp_budget_fn budget, void *ctx);

/*
 * The first match starting at or after `from` (only at `from` when
 * anchored) whose end is not `last` (pass NULL for none; gmatch and gsub
 * pass the end of their previous match).  1: found, *start and *end set,
 * ms->level captures; 0: none; -1: an error, message in ms->error
 * (ms->stopped when the budget stopped it).
 */
int lp_find(struct lp_state *ms, const char *from, const char *last, const char **start,
            const char **end);

/* How many bytes at the start of p have none of the pattern characters: when
 * all lp of them, find may search plainly. */
size_t lp_plain_prefix(const char *p, size_t lp);

/* Where p (lp bytes) first occurs in s (ls bytes), or NULL. */
const char *lp_memfind(const char *s, size_t ls, const char *p, size_t lp);

#endif
