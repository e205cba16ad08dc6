/*
 * watchdog.c - one-shot deadlines for many threads, kept by one thread.
 *
 * Arming and disarming write the watchdog's deadline and cost no system
 * call: a request that ends within its grace never involves the kernel.
 * The watchdog thread sleeps until the earliest deadline it knows of (or
 * one tick while watchdogs are in use, so that a new deadline rarely needs
 * to wake it; it parks after WD_PARK_US without any).  A deadline earlier
 * than the thread's next wake-up signals its condition variable.  When a
 * deadline passes, the thread sends the owner a real-time signal (tgkill);
 * the handler runs fire(arg) for the watchdog armed on that thread.
 *
 * Races: the handler takes the argument with an atomic exchange and
 * disarming clears it first, so a signal that arrives after the disarm, or
 * after the watchdog is freed, finds nothing to do.  The handler finds the
 * watchdog through a thread-local pointer that disarm and free clear, never
 * through the signal's payload, so a late signal reaches no freed memory.
 * The thread scans the list under its mutex and free unlinks under it.
 */
#include "engine/watchdog.h"
#include "util/clock.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* The watchdog thread's sleep while watchdogs are in use, and its idle time before parking. */
#define WD_TICK_US 1000
#define WD_PARK_US 100000
#define WD_NEVER INT64_MAX

struct watchdog {
    pid_t tid;
    void (*fire)(void *arg);
    _Atomic(void *) arg;         /* NULL while disarmed */
    _Atomic int64_t deadline_us; /* 0 while disarmed or once signalled */
    struct watchdog *prev, *next;
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    struct watchdog *list;
    _Atomic int64_t wake_at; /* when the thread looks next; WD_NEVER while parked */
    bool ok;
} wd = {.lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local pid_t thread_id; /* gettid() is a system call: ask once per thread */
static _Thread_local struct watchdog *_Atomic armed_here;

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
    struct watchdog *w = atomic_load(&armed_here);
    if (info->si_code != SI_TKILL || info->si_pid != getpid() || !w)
        return;
    void *arg = atomic_exchange(&w->arg, NULL);
    if (arg)
        w->fire(arg);
}

/* Signal the owners of passed deadlines; the earliest deadline still to come, or WD_NEVER. */
static int64_t scan(int64_t now, bool *in_use)
{
    int64_t next = WD_NEVER;
    for (struct watchdog *w = wd.list; w; w = w->next) {
        int64_t d = atomic_load(&w->deadline_us);
        if (!d)
            continue;
        *in_use = true;
        if (d > now) {
            if (d < next)
                next = d;
        } else if (atomic_compare_exchange_strong(&w->deadline_us, &d, 0)) {
            syscall(SYS_tgkill, getpid(), w->tid, watchdog_signal());
        }
    }
    return next;
}

static void *watch(void *unused)
{
    (void)unused;
    int64_t last_use = 0;
    pthread_mutex_lock(&wd.lock);
    for (;;) {
        /* Published before the scan: an arm the scan misses sees it and signals. */
        atomic_store(&wd.wake_at, WD_NEVER);
        int64_t now = gg_now_us();
        bool in_use = false;
        int64_t next = scan(now, &in_use);
        if (in_use)
            last_use = now;
        if (next == WD_NEVER && now - last_use < WD_PARK_US)
            next = now + WD_TICK_US;
        atomic_store(&wd.wake_at, next);
        if (next == WD_NEVER) {
            pthread_cond_wait(&wd.wake, &wd.lock);
        } else {
            struct timespec until = {next / 1000000, (long)(next % 1000000) * 1000};
            pthread_cond_timedwait(&wd.wake, &wd.lock, &until);
        }
    }
    return NULL;
}

static pthread_once_t start_once = PTHREAD_ONCE_INIT;

static void start(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(watchdog_signal(), &sa, NULL) != 0)
        return;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&wd.wake, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0)
        return;
    /* The thread takes no process signals: they stay with the threads that expect them. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    pthread_attr_t ta;
    pthread_attr_init(&ta);
    pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
    wd.ok = pthread_create(&t, &ta, watch, NULL) == 0;
    pthread_attr_destroy(&ta);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

struct watchdog *watchdog_new(void (*fire)(void *arg))
{
    pthread_once(&start_once, start);
    if (!wd.ok)
        return NULL;
    struct watchdog *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->fire = fire;
    w->tid = current_tid();
    pthread_mutex_lock(&wd.lock);
    w->next = wd.list;
    if (wd.list)
        wd.list->prev = w;
    wd.list = w;
    pthread_mutex_unlock(&wd.lock);
    return w;
}

void watchdog_arm(struct watchdog *w, int64_t delay_us, void *arg)
{
    if (delay_us < 1)
        delay_us = 1;
    atomic_store(&w->arg, arg);
    atomic_store(&armed_here, w);
    int64_t deadline = gg_now_us() + delay_us;
    atomic_store(&w->deadline_us, deadline);
    if (deadline < atomic_load(&wd.wake_at)) {
        pthread_mutex_lock(&wd.lock);
        pthread_cond_signal(&wd.wake);
        pthread_mutex_unlock(&wd.lock);
    }
}

void watchdog_disarm(struct watchdog *w)
{
    atomic_store(&w->deadline_us, 0);
    atomic_store(&w->arg, NULL);
    if (atomic_load(&armed_here) == w)
        atomic_store(&armed_here, NULL);
}

int watchdog_owned(const struct watchdog *w)
{
    return w->tid == current_tid();
}

void watchdog_free(struct watchdog *w)
{
    if (!w)
        return;
    watchdog_disarm(w);
    pthread_mutex_lock(&wd.lock);
    if (w->prev)
        w->prev->next = w->next;
    else
        wd.list = w->next;
    if (w->next)
        w->next->prev = w->prev;
    pthread_mutex_unlock(&wd.lock);
    free(w);
}
