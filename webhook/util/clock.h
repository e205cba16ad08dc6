/*
 * clock.h - the monotonic clock, the one time base of deadlines and
 * durations in gpuguard (wall-clock time is only for logs and the times
 * written into objects for people).
 */
#ifndef GG_CLOCK_H
#define GG_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds. */
static inline int64_t gg_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* CLOCK_MONOTONIC in microseconds. */
static inline int64_t gg_now_us(void)
{
    return gg_now_ns() / 1000;
}

/* CLOCK_REALTIME in microseconds: a time to show (an object's timestamps), never to measure by. */
static inline int64_t gg_wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The CLOCK_MONOTONIC time ms milliseconds from now, for timed waits. */
static inline struct timespec gg_timespec_in_ms(int64_t ms)
{
    int64_t ns = gg_now_ns() + ms * 1000000;
    return (struct timespec){.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
}

#endif
