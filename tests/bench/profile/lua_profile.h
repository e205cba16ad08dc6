/*
 * lua_profile.h - the Lua profiler of bench_engine_profile (lua_profile.c).
 */
#ifndef GG_LUA_PROFILE_H
#define GG_LUA_PROFILE_H

#include <stdio.h>

/* Count from now on (the warm-up before is left out). */
void lua_profile_start(void);
/* Stop counting and print the figures, divided by reviews. */
void lua_profile_report(FILE *out, long reviews);

#endif
