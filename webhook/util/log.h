/*
 * log.h - structured logging: one JSON object per line on stderr.
 *
 * Lines look like {"ts":"2026-11-21T20:57:37.123Z","level":"info","msg":"..."}
 * plus any extra fields the caller adds.  Safe to call from any thread.
 * Text is written as UTF-8; quotes, backslashes and control characters are
 * escaped, so a line never breaks.
 */
#ifndef GG_LOG_H
#define GG_LOG_H

#include "util/buf.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };

/* Lines below this level are dropped; default LOG_INFO. */
void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* "debug", "info", "warn", "error" -> level; returns -1 when unknown. */
int log_level_parse(const char *name);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Log msg with the members of fields (an object, stolen; may be NULL). */
void log_fields(enum log_level level, const char *msg, json_t *fields);

/*
 * A line built field by field, for lines written on every request: no
 * jansson values, no printf.  log_begin returns false (and the line needs
 * no log_end) when level is filtered out.  Keys are C literals, written as
 * is; strings that are not UTF-8 are written as "(not UTF-8)".
 */
struct log_line {
    struct buf b;
    enum gg_status st; /* the first failure: the line is lost */
};
bool log_begin(struct log_line *l, enum log_level level, const char *msg);
void log_str(struct log_line *l, const char *key, const char *s);
void log_int(struct log_line *l, const char *key, int64_t v);
/* us microseconds (0 if negative) as milliseconds with three decimals (a JSON number). */
void log_millis(struct log_line *l, const char *key, int64_t us);
void log_json(struct log_line *l, const char *key, const json_t *v);
/* Write the line (one write), release it. */
void log_end(struct log_line *l);

#endif
