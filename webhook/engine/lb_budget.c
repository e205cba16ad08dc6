/*
 * lb_budget.c - a VM's budgets: instructions and wall clock through a count
 * hook, memory through Lua's allocator (and lb_budget_hold for what a call's
 * report keeps outside Lua).
 *
 * Budgets follow Redis: a count hook checks the budget every LB_HOOK_STEP
 * instructions; once a budget is broken the hook fires on every instruction
 * and raises again, so a policy that catches the error with pcall is
 * stopped at its next instruction.
 *
 * The hook is not set while a request is young: Lua 5.4 traps every
 * instruction while any count hook is set (about a fifth of a short
 * request's time).  A watchdog timer sets it LB_GRACE_US into the request
 * (or at the deadline, if sooner); instructions count from then on.
 *
 * Library functions that work in C (table.sort's comparisons, the pattern
 * matcher's steps, gsub's replacements) charge that work as instructions
 * through lb_budget_charge, which checks the budgets every LB_CHECK_STEPS
 * charged, hook or no hook.
 */
#include "engine/lb_internal.h"
#include "engine/watchdog.h"
#include "util/blockpool.h"
#include "util/clock.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define LB_HOOK_STEP 1000
/* Instructions' worth of C work charged between two checks of the budgets. */
#define LB_CHECK_STEPS 4096
/* Run time before the count hook is set (see the top of the file). */
#define LB_GRACE_US 1000
static _Atomic int64_t grace_us = LB_GRACE_US;

/* Tests only: decides whether an allocation fails (see lb_set_alloc_hook). */
static bool (*alloc_hook)(size_t size);

void lb_set_alloc_hook(bool (*fail)(size_t size))
{
    alloc_hook = fail;
}

const char *lb_kill_message(enum lb_outcome kill)
{
    switch (kill) {
    case LB_OUT_OF_BUDGET:
        return "instruction budget exhausted";
    case LB_OUT_OF_MEMORY:
        return "memory limit exceeded";
    case LB_OUT_OF_TIME:
        return "deadline exceeded";
    default:
        return "stopped";
    }
}

static void budget_hook(lua_State *L, lua_Debug *ar);

/* From now on the hook fires on every instruction and raises. */
static void arm_kill(struct lb_vm *vm, enum lb_outcome why)
{
    if (vm->kill == LB_DONE)
        vm->kill = why;
    vm->broken = true;
    lua_sethook(vm->L, budget_hook, LUA_MASKCOUNT, 1);
}

static void budget_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    struct lb_vm *vm = lb_vm_of(L);
    if (vm->kill == LB_DONE && !lb_budget_spend(vm, LB_HOOK_STEP))
        return;
    luaL_error(L, "%s", lb_kill_message(vm->kill));
}

/*
 * Count instructions against the budget and check the deadline; true when
 * a budget is broken (the kill is armed).
 */
bool lb_budget_spend(struct lb_vm *vm, int64_t instructions)
{
    vm->used += instructions;
    if (vm->used > vm->limits.instructions)
        arm_kill(vm, LB_OUT_OF_BUDGET);
    else if (vm->deadline_us && gg_now_us() > vm->deadline_us)
        arm_kill(vm, LB_OUT_OF_TIME);
    return vm->kill != LB_DONE;
}

/*
 * Charge steps of C work done by a library function inside a call as
 * instructions, checking the budgets once LB_CHECK_STEPS have built up;
 * true when a budget is broken (the caller raises lb_kill_message).
 */
bool lb_budget_charge(struct lb_vm *vm, int64_t steps)
{
    if (vm->kill == LB_DONE && vm->running && (vm->unchecked += steps) >= LB_CHECK_STEPS) {
        int64_t due = vm->unchecked;
        vm->unchecked = 0;
        lb_budget_spend(vm, due);
    }
    return vm->kill != LB_DONE;
}

/* Signal context: only set the hook (lua_sethook is safe there). */
void lb_watchdog_fired(void *arg)
{
    struct lb_vm *vm = arg;
    if (!lua_gethook(vm->L))
        lua_sethook(vm->L, budget_hook, LUA_MASKCOUNT, LB_HOOK_STEP);
}

/* Start a budget: a request's policy calls, or one load-time call. */
void lb_budget_open(struct lb_vm *vm, int64_t deadline_us)
{
    vm->used = 0;
    vm->unchecked = 0;
    vm->deadline_us = deadline_us;
    vm->kill = LB_DONE;
    int64_t delay = atomic_load_explicit(&grace_us, memory_order_relaxed),
            left = deadline_us ? deadline_us - gg_now_us() : delay;
    if (left < delay)
        delay = left;
    if (vm->watchdog && delay > 0 && watchdog_owned(vm->watchdog))
        watchdog_arm(vm->watchdog, delay, vm);
    else
        lua_sethook(vm->L, budget_hook, LUA_MASKCOUNT, LB_HOOK_STEP);
}

void lb_set_grace_us(int64_t us)
{
    atomic_store(&grace_us, us);
}

void lb_budget_close(struct lb_vm *vm)
{
    if (vm->watchdog)
        watchdog_disarm(vm->watchdog);
    lua_sethook(vm->L, NULL, 0, 0);
}

/*
 * Count bytes the VM holds outside Lua's heap (a call's report) against its
 * memory, as the allocator counts Lua's own; false, with the kill armed
 * inside a call, when they do not fit.
 */
bool lb_budget_hold(struct lb_vm *vm, size_t bytes)
{
    if (bytes > vm->limits.memory || vm->mem > vm->limits.memory - bytes) {
        if (vm->running)
            arm_kill(vm, LB_OUT_OF_MEMORY);
        return false;
    }
    vm->mem += bytes;
    if (vm->mem > vm->mem_peak)
        vm->mem_peak = vm->mem;
    return true;
}

void lb_budget_release(struct lb_vm *vm, size_t bytes)
{
    vm->mem -= bytes;
}

static void *new_block(struct lb_vm *vm, size_t size)
{
    void *p = vm->pool && size <= BLOCKPOOL_MAX ? blockpool_get(vm->pool, size) : NULL;
    return p ? p : malloc(size);
}

/*
 * Lua's allocator.  A pooled block that shrinks stays where it is (Lua
 * requires shrinking never to fail; the block is big enough for the smaller
 * class it is given back to later).
 */
void *lb_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    struct lb_vm *vm = ud;
    size_t old = ptr ? osize : 0;
    bool pooled = ptr && blockpool_owns(vm->pool, ptr);
    if (nsize == 0) {
        if (pooled)
            blockpool_put(vm->pool, ptr, osize);
        else
            free(ptr);
        vm->mem -= old;
        return NULL;
    }
    void *p = NULL;
    if ((nsize > old && vm->mem + (nsize - old) > vm->limits.memory) ||
        (alloc_hook && nsize > old && alloc_hook(nsize)))
        goto refused;
    if (!pooled) {
        p = ptr ? realloc(ptr, nsize) : new_block(vm, nsize);
        if (!p && nsize <= osize)
            p = ptr; /* a shrink must not fail: keep the larger block */
    } else if (nsize <= osize || (nsize <= BLOCKPOOL_MAX && blockpool_same_class(osize, nsize))) {
        p = ptr;
    } else if ((p = new_block(vm, nsize)) != NULL) {
        memcpy(p, ptr, osize);
        blockpool_put(vm->pool, ptr, osize);
    }
    if (!p)
        goto refused;
    vm->mem = vm->mem - old + nsize;
    if (vm->mem > vm->mem_peak)
        vm->mem_peak = vm->mem;
    return p;
refused:
    /* Lua raises a memory error, which a policy could catch with pcall:
     * the kill makes sure the call fails all the same. */
    if (vm->running)
        arm_kill(vm, LB_OUT_OF_MEMORY);
    return NULL;
}
