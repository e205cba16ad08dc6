/*
 * watchdog.h - a one-shot deadline that calls a function on the thread
 * that owns it, from a signal handler.  Arming and disarming make no
 * system call; one shared thread watches every deadline.
 *
 * The Lua bridge uses it to arm its instruction-count hook only when a
 * request runs long: Lua 5.4 traps every instruction while any count hook
 * is set, which costs a fifth of a short request's time.  The callback runs
 * in signal context, so it may only do async-signal-safe work (lua_sethook
 * is written to be called that way).
 */
#ifndef GG_WATCHDOG_H
#define GG_WATCHDOG_H

#include <stdint.h>

struct watchdog;

/* A watchdog for the calling thread; NULL when the watchdog thread cannot start. */
struct watchdog *watchdog_new(void (*fire)(void *arg));
/*
 * Call fire(arg) on the owning thread after delay_us (give or take the
 * scheduler), unless disarmed first.  Call on the owning thread only.
 */
void watchdog_arm(struct watchdog *w, int64_t delay_us, void *arg);
/* After this returns, fire is not called until the next arm. */
void watchdog_disarm(struct watchdog *w);
/* True when w was made by the calling thread. */
int watchdog_owned(const struct watchdog *w);
/* On the owning thread, or when w is disarmed. */
void watchdog_free(struct watchdog *w);

#endif
