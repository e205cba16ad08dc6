/*
 * arena.h - a per-thread bump allocator for jansson during one request.
 *
 * Parsing a review and building the answer allocates hundreds of small
 * JSON nodes that all die together when the request ends.  Between
 * arena_begin() and arena_end() a thread's jansson allocations come from a
 * chunk it reuses request after request, and their frees cost nothing.
 *
 * Rule: every JSON value allocated inside the scope is released inside it.
 * Text that must outlive the scope is copied out with plain malloc (see
 * adm_encode).  Outside a scope, and on threads without one, allocations
 * go to malloc as usual.
 */
#ifndef GG_ARENA_H
#define GG_ARENA_H

#include <stdbool.h>

/* Route jansson's allocations through the arena; call once at start-up. */
void arena_install(void);

void arena_begin(void);
void arena_end(void);
/*
 * Between arena_pause() and arena_resume(its answer) allocations go to
 * malloc even inside a scope: for values that outlive the request (what the
 * inventory keeps).  Release nothing allocated in the scope meanwhile.
 */
bool arena_pause(void);
void arena_resume(bool active);

#endif
