/*
 * log.h - structured logging: one JSON object per line on stderr.
 *
 * Lines look like {"ts":"2026-11-21T20:57:37.123Z","level":"info","msg":"..."}
 * plus any extra fields the caller adds.  Safe to call from any thread.
 */
#ifndef GG_LOG_H
#define GG_LOG_H

#include <jansson.h>

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };

/* Lines below this level are dropped; default LOG_INFO. */
void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* "debug", "info", "warn", "error" -> level; returns -1 when unknown. */
int log_level_parse(const char *name);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Log msg with the members of fields (an object, stolen; may be NULL). */
void log_fields(enum log_level level, const char *msg, json_t *fields);

#endif
