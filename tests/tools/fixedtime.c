/*
 * fixedtime.c - an LD_PRELOAD shim that stops the wall clock's seconds, for instruction counts
 * that repeat: Lua seeds its string hashes from time(NULL) (luai_makeseed), and each seed lays
 * the policies' tables out differently, some 2 % of a review's instructions from one run to the
 * next.  With the clock's seconds fixed (and address randomisation off, setarch -R), two runs
 * of bench_engine under callgrind count the same to within 0.02 %.
 *
 *   GG_FIXED_TIME=SECONDS   what time() answers (default 1700000000)
 *
 * Only time() is replaced: the engine's deadlines read CLOCK_MONOTONIC and go on.  Built as a
 * shared object: see the Makefile; used by tests/bench/repeatable.py.
 */
#include <stdlib.h>
#include <time.h>

time_t time(time_t *out)
{
    const char *fixed = getenv("GG_FIXED_TIME");
    time_t t = fixed && *fixed ? (time_t)strtoll(fixed, NULL, 10) : (time_t)1700000000;
    if (out)
        *out = t;
    return t;
}
