/*
 * test_watchdog.c - the one-shot thread deadline: it fires once on the
 * owning thread, not at all once disarmed, never after it is freed, on
 * each of several threads at once, after the watchdog thread has parked,
 * and a watchdog made on another thread says it is not ours.
 *
 * Waits are bounded polls (at most 2 s each), never timing assertions.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/watchdog.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

struct probe {
    atomic_int fired;
    pthread_t thread; /* where the last call ran */
};

static void record(void *arg)
{
    struct probe *p = arg;
    p->thread = pthread_self();
    atomic_fetch_add(&p->fired, 1);
}

/* Sleep in 1 ms steps until p fired or 2 s passed. */
static void wait_for(struct probe *p)
{
    for (int i = 0; i < 2000 && atomic_load(&p->fired) == 0; i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
}

static void test_fires_once_on_owner(void **state)
{
    (void)state;
    struct watchdog *w = watchdog_new(record);
    assert_non_null(w);
    assert_true(watchdog_owned(w));
    struct probe p = {0};
    watchdog_arm(w, 1000, &p);
    wait_for(&p);
    assert_int_equal(atomic_load(&p.fired), 1);
    assert_true(pthread_equal(p.thread, pthread_self()));
    /* A disarm after the shot is harmless, and the timer can be rearmed. */
    watchdog_disarm(w);
    atomic_store(&p.fired, 0);
    watchdog_arm(w, 1, &p);
    wait_for(&p);
    assert_int_equal(atomic_load(&p.fired), 1);
    watchdog_free(w);
}

static void test_disarmed_never_fires(void **state)
{
    (void)state;
    struct watchdog *w = watchdog_new(record);
    assert_non_null(w);
    struct probe p = {0};
    watchdog_arm(w, 20000, &p);
    watchdog_disarm(w);
    struct timespec wait = {0, 100000000}; /* five times the delay */
    nanosleep(&wait, NULL);
    assert_int_equal(atomic_load(&p.fired), 0);
    watchdog_free(w);
}

static void test_freed_while_armed(void **state)
{
    (void)state;
    struct probe p = {0};
    for (int i = 0; i < 100; i++) {
        struct watchdog *w = watchdog_new(record);
        assert_non_null(w);
        watchdog_arm(w, 1 + i % 3, &p);
        watchdog_free(w);
    }
    /* Some fired before their free; none may fire after it. */
    int before = atomic_load(&p.fired);
    struct timespec wait = {0, 20000000};
    nanosleep(&wait, NULL);
    assert_int_equal(atomic_load(&p.fired), before);
}

/* Each thread arms its own watchdog; every one fires once, on its thread. */
static void *arm_and_wait(void *arg)
{
    struct probe *p = arg;
    struct watchdog *w = watchdog_new(record);
    if (!w)
        return NULL;
    for (int i = 0; i < 1000; i++) { /* requests that end within their grace */
        watchdog_arm(w, 50000, p);
        watchdog_disarm(w);
    }
    watchdog_arm(w, 500, p);
    wait_for(p);
    watchdog_free(w);
    return NULL;
}

static void test_threads_fire_on_their_own(void **state)
{
    (void)state;
    enum { N = 4 };
    struct probe p[N] = {0};
    pthread_t t[N];
    for (int i = 0; i < N; i++)
        assert_int_equal(pthread_create(&t[i], NULL, arm_and_wait, &p[i]), 0);
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(atomic_load(&p[i].fired), 1);
        assert_true(pthread_equal(p[i].thread, t[i]));
    }
}

static void test_fires_after_idle(void **state)
{
    (void)state;
    struct timespec idle = {0,
                            300000000}; /* longer than the watchdog thread waits before parking */
    nanosleep(&idle, NULL);
    struct watchdog *w = watchdog_new(record);
    assert_non_null(w);
    struct probe p = {0};
    watchdog_arm(w, 1, &p);
    wait_for(&p);
    assert_int_equal(atomic_load(&p.fired), 1);
    watchdog_free(w);
}

static void *make_watchdog(void *arg)
{
    *(struct watchdog **)arg = watchdog_new(record);
    return NULL;
}

static void test_owned_by_creator_only(void **state)
{
    (void)state;
    struct watchdog *w = NULL;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, make_watchdog, &w), 0);
    pthread_join(t, NULL);
    assert_non_null(w);
    assert_false(watchdog_owned(w));
    watchdog_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fires_once_on_owner),
        cmocka_unit_test(test_disarmed_never_fires),
        cmocka_unit_test(test_freed_while_armed),
        cmocka_unit_test(test_threads_fire_on_their_own),
        cmocka_unit_test(test_fires_after_idle),
        cmocka_unit_test(test_owned_by_creator_only),
    };
    return cmocka_run_group_tests_name("watchdog", tests, NULL, NULL);
}
