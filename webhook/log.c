/*
 * log.c - structured logging as JSON lines on stderr.
 *
 * Each line is built in full and written with one fwrite under the stdio
 * lock, so lines from concurrent threads never interleave.
 */
#include "log.h"

#include "gpuguard.h"

#include <stdarg.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
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

static void timestamp(char *out, size_t size)
{
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    size_t n = strftime(out, size, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, size - n, ".%03dZ", (int)(tv.tv_usec / 1000));
}

void log_fields(enum log_level level, const char *msg, json_t *fields)
{
    if ((int)level < atomic_load(&min_level)) {
        json_decref(fields);
        return;
    }
    char ts[40];
    timestamp(ts, sizeof(ts));
    json_t *line = json_object();
    json_object_set_new(line, "ts", json_string(ts));
    json_object_set_new(line, "level", json_string(level_names[level]));
    json_t *text_msg = json_string(msg);
    json_object_set_new(line, "msg", text_msg ? text_msg : json_string("(message not UTF-8)"));
    if (fields)
        json_object_update_missing(line, fields);
    json_decref(fields);
    char *text = NULL;
    size_t len = 0;
    enum gg_status st = gg_json_dump(line, JSON_COMPACT | JSON_ENSURE_ASCII, &text, &len);
    json_decref(line);
    if (st != GG_OK) {
        fprintf(stderr, "{\"level\":\"error\",\"msg\":\"log line lost: out of memory\"}\n");
        return;
    }
    flockfile(stderr);
    fwrite(text, 1, len, stderr);
    fputc('\n', stderr);
    funlockfile(stderr);
    free(text);
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
