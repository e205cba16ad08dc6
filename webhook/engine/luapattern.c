/*
 * luapattern.c - Lua 5.4 pattern matching with a step budget.
 *
 * Written from the grammar of the Lua 5.4 manual (section 6.4.1): single
 * character classes (., %a %c %d %g %l %p %s %u %w %x and their complements,
 * %<punctuation>, [sets] with ranges and classes, [^complements]), the
 * repetitions *, +, - and ?, captures (...) and position captures (),
 * back-references %1-%9, %bxy and %f[set], and the anchors ^ and $.  Where
 * the manual leaves a corner open (a ']' first in a set, a '-' at a set's
 * end, a back-reference to a position capture, the old class %z) the choices
 * are those of the stock library, which the differential fuzz target holds
 * it to.
 *
 * Matching is a backtracking walk over the pattern: one call per item that
 * may backtrack, a loop for the others, at most LP_MAX_DEPTH calls deep.
 * The work is counted in steps, so that what it costs is what the budget
 * sees however the pattern is written: every call, every pattern item
 * tried (an optional item that does not match too), every character a
 * repetition or %b takes, and every byte of a [set] scanned, to find its
 * end or to test a character (a set of a megabyte costs a megabyte of
 * steps per character tried).  Every LP_CHECK_STEPS steps the caller's
 * budget function is charged and may stop the match.
 * Errors leave through siglongjmp to lp_find (nothing here allocates).
 * Subject and pattern must be followed by a NUL byte, as Lua strings are:
 * the matcher may read that byte, never past it.
 */
#include "engine/luapattern.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define ESC '%'

__attribute__((noreturn, format(printf, 2, 3))) static void fail(struct lp_state *ms,
                                                                 const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ms->error, sizeof(ms->error), fmt, ap);
    va_end(ap);
    siglongjmp(ms->fail, 1);
}

/* Charge the steps counted so far to the caller's budget, which may stop the match. */
static void check_budget(struct lp_state *ms)
{
    size_t due = ms->steps;
    ms->steps = 0;
    if (ms->budget && ms->budget(ms->ctx, due)) {
        ms->stopped = true;
        fail(ms, "stopped");
    }
}

/* Count steps of work; LP_CHECK_STEPS of them go to the budget at a time. */
static inline void spend(struct lp_state *ms, size_t steps)
{
    ms->steps += steps;
    if (ms->steps >= LP_CHECK_STEPS)
        check_budget(ms);
}

void lp_init(struct lp_state *ms, const char *s, size_t ls, const char *p, size_t lp, bool anchor,
             lp_budget_fn budget, void *ctx)
{
    ms->src = s;
    ms->src_end = s + ls;
    ms->anchor = anchor && lp > 0 && p[0] == '^';
    ms->p = ms->anchor ? p + 1 : p;
    ms->p_end = p + lp;
    ms->level = 0;
    ms->depth = LP_MAX_DEPTH;
    ms->steps = 0;
    ms->budget = budget;
    ms->ctx = ctx;
    ms->stopped = false;
    ms->error[0] = '\0';
}

/* Whether c is in the class named by letter cl (%a, %A ...), or is cl itself. */
static bool in_class(int c, int cl)
{
    bool in;
    switch (tolower(cl)) {
    case 'a':
        in = isalpha(c);
        break;
    case 'c':
        in = iscntrl(c);
        break;
    case 'd':
        in = isdigit(c);
        break;
    case 'g':
        in = isgraph(c);
        break;
    case 'l':
        in = islower(c);
        break;
    case 'p':
        in = ispunct(c);
        break;
    case 's':
        in = isspace(c);
        break;
    case 'u':
        in = isupper(c);
        break;
    case 'w':
        in = isalnum(c);
        break;
    case 'x':
        in = isxdigit(c);
        break;
    case 'z': /* the NUL byte: gone from the manual since 5.2, kept by the stock library */
        in = c == 0;
        break;
    default:
        return cl == c; /* %<other>: that character */
    }
    return isupper(cl) ? !in : in;
}

/* Whether c is in the set from '[' at p to its ']' at close; a step per byte scanned. */
static bool in_set(struct lp_state *ms, int c, const char *p, const char *close)
{
    const char *open = p;
    bool yes = true, found = false;
    if (p[1] == '^') {
        yes = false;
        p++;
    }
    while (!found && ++p < close) {
        unsigned char first = (unsigned char)*p;
        if (first == ESC) {
            p++;
            found = in_class(c, (unsigned char)*p);
        } else if (p[1] == '-' && p + 2 < close) {
            p += 2;
            found = first <= c && c <= (unsigned char)*p;
        } else {
            found = first == c;
        }
    }
    spend(ms, (size_t)(p - open));
    return found == yes;
}

/* Just past the single character class that starts at p; a step per byte of a set. */
static const char *class_end(struct lp_state *ms, const char *p)
{
    const char *open = p;
    char c = *p++;
    if (c == ESC) {
        if (p == ms->p_end)
            fail(ms, "malformed pattern (ends with '%%')");
        return p + 1;
    }
    if (c == '[') {
        if (*p == '^')
            p++;
        /* The first character is a member even when it is ']'. */
        do {
            if (p == ms->p_end)
                fail(ms, "malformed pattern (missing ']')");
            if (*p++ == ESC && p < ms->p_end)
                p++;
        } while (*p != ']');
        spend(ms, (size_t)(p - open));
        return p + 1;
    }
    return p;
}

/* Whether the subject character at s is in the class from p to ep. */
static bool single(struct lp_state *ms, const char *s, const char *p, const char *ep)
{
    if (s >= ms->src_end)
        return false;
    int c = (unsigned char)*s;
    switch (*p) {
    case '.':
        return true;
    case ESC:
        return in_class(c, (unsigned char)p[1]);
    case '[':
        return in_set(ms, c, p, ep - 1);
    default:
        return (unsigned char)*p == c;
    }
}

static const char *match(struct lp_state *ms, const char *s, const char *p);

/* x* and x+: as many as possible, then give back one at a time. */
static const char *longest(struct lp_state *ms, const char *s, const char *p, const char *ep)
{
    ptrdiff_t n = 0;
    while (single(ms, s + n, p, ep))
        n++;
    spend(ms, (size_t)n);
    for (; n >= 0; n--) {
        const char *end = match(ms, s + n, ep + 1);
        if (end)
            return end;
    }
    return NULL;
}

/* x-: as few as possible, then one more at a time. */
static const char *shortest(struct lp_state *ms, const char *s, const char *p, const char *ep)
{
    for (;;) {
        const char *end = match(ms, s, ep + 1);
        if (end)
            return end;
        if (!single(ms, s, p, ep))
            return NULL;
        s++;
    }
}

static const char *open_capture(struct lp_state *ms, const char *s, const char *p, ptrdiff_t what)
{
    if (ms->level >= LP_MAX_CAPTURES)
        fail(ms, "too many captures");
    ms->capture[ms->level].init = s;
    ms->capture[ms->level].len = what;
    ms->level++;
    const char *end = match(ms, s, p);
    if (!end)
        ms->level--;
    return end;
}

static const char *close_capture(struct lp_state *ms, const char *s, const char *p)
{
    int l = ms->level - 1;
    while (l >= 0 && ms->capture[l].len != LP_CAP_UNFINISHED)
        l--;
    if (l < 0)
        fail(ms, "invalid pattern capture");
    ms->capture[l].len = s - ms->capture[l].init;
    const char *end = match(ms, s, p);
    if (!end)
        ms->capture[l].len = LP_CAP_UNFINISHED;
    return end;
}

/* %bxy at p (just past "%b"): from an x to its balancing y. */
static const char *balanced(struct lp_state *ms, const char *s, const char *p)
{
    if (p >= ms->p_end - 1)
        fail(ms, "malformed pattern (missing arguments to '%%b')");
    if (s >= ms->src_end || *s != p[0])
        return NULL;
    int open = 1;
    while (++s < ms->src_end) {
        spend(ms, 1);
        if (*s == p[1]) {
            if (--open == 0)
                return s + 1;
        } else if (*s == p[0]) {
            open++;
        }
    }
    return NULL;
}

/* %1-%9: the text of a closed capture again (a position capture never matches). */
static const char *backref(struct lp_state *ms, const char *s, int digit)
{
    int l = digit - '1';
    if (l < 0 || l >= ms->level || ms->capture[l].len == LP_CAP_UNFINISHED)
        fail(ms, "invalid capture index %%%d", l + 1);
    size_t len = (size_t)ms->capture[l].len;
    if ((size_t)(ms->src_end - s) >= len && memcmp(ms->capture[l].init, s, len) == 0)
        return s + len;
    return NULL;
}

/* The end of the match of pattern p at subject s, or NULL.  A step for the call
 * and one per item tried, counted as it returns. */
static const char *match(struct lp_state *ms, const char *s, const char *p)
{
    if (ms->depth-- == 0)
        fail(ms, "pattern too complex");
    size_t items = 0;
    while (s && p != ms->p_end) {
        const char *ep;
        items++;
        switch (*p) {
        case '(':
            s = p[1] == ')' ? open_capture(ms, s, p + 2, LP_CAP_POSITION)
                            : open_capture(ms, s, p + 1, LP_CAP_UNFINISHED);
            goto done;
        case ')':
            s = close_capture(ms, s, p + 1);
            goto done;
        case '$':
            if (p + 1 == ms->p_end) {
                s = s == ms->src_end ? s : NULL;
                goto done;
            }
            break;
        case ESC:
            if (p[1] == 'b') {
                s = balanced(ms, s, p + 2);
                p += 4;
                continue;
            }
            if (p[1] == 'f') {
                p += 2;
                if (*p != '[')
                    fail(ms, "missing '[' after '%%f' in pattern");
                ep = class_end(ms, p);
                int before = s == ms->src ? 0 : (unsigned char)s[-1];
                if (in_set(ms, before, p, ep - 1) || !in_set(ms, (unsigned char)*s, p, ep - 1))
                    s = NULL;
                p = ep;
                continue;
            }
            if (isdigit((unsigned char)p[1])) {
                s = backref(ms, s, (unsigned char)p[1]);
                p += 2;
                continue;
            }
            break;
        default:
            break;
        }
        /* A single character class, perhaps repeated. */
        ep = class_end(ms, p);
        if (!single(ms, s, p, ep)) {
            if (*ep == '*' || *ep == '?' || *ep == '-') {
                p = ep + 1; /* none is fine */
                continue;
            }
            s = NULL;
            goto done;
        }
        switch (*ep) {
        case '?': {
            const char *end = match(ms, s + 1, ep + 1);
            if (end) {
                s = end;
                goto done;
            }
            p = ep + 1;
            continue;
        }
        case '+':
            s = longest(ms, s + 1, p, ep);
            goto done;
        case '*':
            s = longest(ms, s, p, ep);
            goto done;
        case '-':
            s = shortest(ms, s, p, ep);
            goto done;
        default:
            s++;
            p = ep;
            continue;
        }
    }
done:
    spend(ms, 1 + items);
    ms->depth++;
    return s;
}

static int find_from(struct lp_state *ms, const char *s, const char *last, const char **start,
                     const char **end)
{
    do {
        ms->level = 0;
        ms->depth = LP_MAX_DEPTH;
        const char *e = match(ms, s, ms->p);
        if (e && e != last) {
            *start = s;
            *end = e;
            return 1;
        }
    } while (s++ < ms->src_end && !ms->anchor);
    return 0;
}

int lp_find(struct lp_state *ms, const char *from, const char *last, const char **start,
            const char **end)
{
    if (sigsetjmp(ms->fail, 0))
        return -1;
    return find_from(ms, from, last, start, end);
}

size_t lp_plain_prefix(const char *p, size_t lp)
{
    size_t i = 0;
    while (i < lp && !(p[i] && strchr("^$*+?.([%-", p[i])))
        i++;
    return i;
}

const char *lp_memfind(const char *s, size_t ls, const char *p, size_t lp)
{
    if (lp == 0)
        return s;
    return memmem(s, ls, p, lp);
}
