/*
 * log.c - structured logging as JSON lines on stderr.
 *
 * Each line is built in full in a buf (jsonwrite.c writes the values) and
 * written with one fwrite under the stdio lock, so lines from concurrent
 * threads never interleave; stderr is unbuffered, so that is one write(2).
 */
#include "util/log.h"

#include "util/gpuguard.h"
#include "util/jsonwrite.h"

#include <stdarg.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static atomic_int min_level = LOG_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void log_set_level(enum log_level level)
{
    atomic_store(&min_level, (int)level);
}

enum log_level log_get_level(void)
{
    return (enum log_level)atomic_load(&min_level);
}

int log_level_parse(const char *name)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

/* Longest line: a debug decision line carries the whole object. */
#define LOG_LINE_MAX ((size_t)64 << 20)

/* "2026-11-21T20:57:37.123Z" into out (at least 25 bytes); the calendar part is cached per second.
 */
static size_t timestamp(char *out)
{
    static _Thread_local time_t cached_sec = -1;
    static _Thread_local char cached[24];
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (now.tv_sec != cached_sec) {
        struct tm tm;
        gmtime_r(&now.tv_sec, &tm);
        if (strftime(cached, sizeof(cached), "%Y-%m-%dT%H:%M:%S", &tm) != 19)
            memcpy(cached, "0000-00-00T00:00:00", 20);
        cached_sec = now.tv_sec;
    }
    memcpy(out, cached, 19);
    int ms = (int)(now.tv_nsec / 1000000);
    out[19] = '.';
    out[20] = (char)('0' + ms / 100);
    out[21] = (char)('0' + ms / 10 % 10);
    out[22] = (char)('0' + ms % 10);
    out[23] = 'Z';
    return 24;
}

/* Well-formed UTF-8 (RFC 3629: no overlongs, surrogates or code points past U+10FFFF). */
static bool utf8_valid(const unsigned char *s, size_t len)
{
    const unsigned char *end = s + len;
    while (s < end) {
        unsigned c = *s++;
        if (c < 0x80)
            continue;
        int more = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
        if (c < 0xC2 || c > 0xF4 || end - s < more)
            return false;
        unsigned cp = c & (0x3F >> more);
        for (int i = 0; i < more; i++, s++) {
            if ((*s & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (*s & 0x3F);
        }
        if ((more == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (more == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return false;
    }
    return true;
}

static void put(struct log_line *l, const char *data, size_t len)
{
    if (l->st == GG_OK)
        l->st = buf_append(&l->b, data, len);
}

static void put_text(struct log_line *l, const char *s, size_t len)
{
    if (!utf8_valid((const unsigned char *)s, len)) {
        s = "(not UTF-8)";
        len = strlen(s);
    }
    if (l->st == GG_OK)
        l->st = jw_string(&l->b, s, len);
}

/* ,"key": */
static void put_key(struct log_line *l, const char *key, size_t len)
{
    put(l, ",", 1);
    put_text(l, key, len);
    put(l, ":", 1);
}

bool log_begin(struct log_line *l, enum log_level level, const char *msg)
{
    if ((int)level < atomic_load(&min_level))
        return false;
    buf_init(&l->b, LOG_LINE_MAX);
    l->st = GG_OK;
    char ts[32];
    put(l, "{\"ts\":\"", 7);
    put(l, ts, timestamp(ts));
    put(l, "\",\"level\":\"", 11);
    put(l, level_names[level], strlen(level_names[level]));
    put(l, "\",\"msg\":", 8);
    put_text(l, msg, strlen(msg));
    return true;
}

void log_str(struct log_line *l, const char *key, const char *s)
{
    put_key(l, key, strlen(key));
    put_text(l, s, strlen(s));
}

void log_int(struct log_line *l, const char *key, int64_t v)
{
    put_key(l, key, strlen(key));
    if (l->st == GG_OK)
        l->st = jw_integer(&l->b, v);
}

void log_millis(struct log_line *l, const char *key, int64_t us)
{
    if (us < 0)
        us = 0;
    log_int(l, key, us / 1000);
    int frac = (int)(us % 1000);
    char dec[4] = {'.', (char)('0' + frac / 100), (char)('0' + frac / 10 % 10),
                   (char)('0' + frac % 10)};
    put(l, dec, sizeof(dec));
}

void log_json(struct log_line *l, const char *key, const json_t *v)
{
    put_key(l, key, strlen(key));
    if (l->st == GG_OK)
        l->st = jw_value(&l->b, v);
}

void log_end(struct log_line *l)
{
    put(l, "}\n", 2);
    flockfile(stderr);
    if (l->st == GG_OK)
        fwrite(l->b.data, 1, l->b.len, stderr);
    else
        fputs("{\"level\":\"error\",\"msg\":\"log line lost: too long or out of memory\"}\n",
              stderr);
    funlockfile(stderr);
    buf_clear(&l->b);
}

void log_fields(enum log_level level, const char *msg, json_t *fields)
{
    struct log_line l;
    if (log_begin(&l, level, msg)) {
        const char *key;
        size_t len;
        json_t *value;
        json_object_keylen_foreach(fields, key, len, value)
        {
            if (strcmp(key, "ts") != 0 && strcmp(key, "level") != 0 && strcmp(key, "msg") != 0) {
                put_key(&l, key, len);
                if (l.st == GG_OK)
                    l.st = jw_value(&l.b, value);
            }
        }
        log_end(&l);
    }
    json_decref(fields);
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    if ((int)level < atomic_load(&min_level))
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    log_fields(level, msg, NULL);
}
