/*
 * watchdog.c - POSIX timers aimed at one thread (SIGEV_THREAD_ID).
 *
 * Every watchdog shares one real-time signal; the handler finds its
 * watchdog in the signal's value.  Arming and disarming are one
 * timer_settime call each.  The argument is cleared before the timer is
 * disarmed, and a signal still pending for the thread is delivered at the
 * latest when that system call returns, so a late signal finds no argument
 * and does nothing.  timer_delete discards a pending signal, so none
 * reaches a freed watchdog.
 */
#include "watchdog.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct watchdog {
    timer_t timer;
    pid_t tid;
    void (*fire)(void *arg);
    _Atomic(void *) arg; /* NULL while disarmed */
};

static _Thread_local pid_t thread_id; /* gettid() is a system call: ask once per thread */

static pid_t current_tid(void)
{
    if (!thread_id)
        thread_id = gettid();
    return thread_id;
}

static int watchdog_signal(void)
{
    return SIGRTMIN + 3;
}

static void on_signal(int sig, siginfo_t *info, void *uctx)
{
    (void)sig;
    (void)uctx;
    struct watchdog *w = info->si_value.sival_ptr;
    if (info->si_code != SI_TIMER || !w)
        return;
    void *arg = atomic_exchange(&w->arg, NULL);
    if (arg)
        w->fire(arg);
}

static pthread_once_t handler_once = PTHREAD_ONCE_INIT;
static int handler_ok;

static void install_handler(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    handler_ok = sigaction(watchdog_signal(), &sa, NULL) == 0;
}

struct watchdog *watchdog_new(void (*fire)(void *arg))
{
    pthread_once(&handler_once, install_handler);
    if (!handler_ok)
        return NULL;
    struct watchdog *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->fire = fire;
    w->tid = current_tid();
    struct sigevent sev;
    memset(&sev, 0, sizeof(sev));
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = watchdog_signal();
    sev.sigev_value.sival_ptr = w;
    sev._sigev_un._tid = w->tid;
    if (timer_create(CLOCK_MONOTONIC, &sev, &w->timer) != 0) {
        free(w);
        return NULL;
    }
    return w;
}

void watchdog_arm(struct watchdog *w, int64_t delay_us, void *arg)
{
    if (delay_us < 1)
        delay_us = 1; /* zero would disarm */
    atomic_store(&w->arg, arg);
    struct itimerspec its = {{0, 0}, {delay_us / 1000000, (long)(delay_us % 1000000) * 1000}};
    timer_settime(w->timer, 0, &its, NULL);
}

void watchdog_disarm(struct watchdog *w)
{
    if (atomic_exchange(&w->arg, NULL) == NULL)
        return; /* fired already: the one-shot timer is idle */
    struct itimerspec off = {{0, 0}, {0, 0}};
    timer_settime(w->timer, 0, &off, NULL);
}

int watchdog_owned(const struct watchdog *w)
{
    return w->tid == current_tid();
}

void watchdog_free(struct watchdog *w)
{
    if (!w)
        return;
    timer_delete(w->timer);
    free(w);
}
