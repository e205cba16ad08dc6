/*
 * buf.h - a growable byte buffer with a hard size limit fixed at init.
 *
 * Appending past the limit fails with GG_ERR_TOOBIG and leaves the buffer
 * as it was, so input sized by the network can never grow memory without
 * bound.  The data is always NUL-terminated (the NUL is not counted).
 */
#ifndef GG_BUF_H
#define GG_BUF_H

#include "util/gpuguard.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

struct buf {
    char *data;
    size_t len;
    size_t cap;
    size_t max;
    bool failed; /* an append failed: text written since then lacks a piece */
};

void buf_init(struct buf *b, size_t max);
void buf_clear(struct buf *b);
/* Empty again, keeping the memory for what is written next. */
void buf_reset(struct buf *b);
enum gg_status buf_append_grow(struct buf *b, const void *data, size_t len);
/* Inline while there is room, as most appends find: a scanner appends a few bytes at a time. */
static inline enum gg_status buf_append(struct buf *b, const void *data, size_t len)
{
    if (len >= b->cap - b->len || len > b->max - b->len)
        return buf_append_grow(b, data, len);
    if (len)
        memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
    return GG_OK;
}
/*
 * Grow the data by len bytes for the caller to fill in place: *at is where
 * they start.  Same limit as buf_append; the bytes are counted at once.
 */
enum gg_status buf_extend(struct buf *b, size_t len, char **at);
enum gg_status buf_appendf(struct buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* buf_append of a string literal, its length known at compile time. */
#define BUF_LITERAL(b, lit) buf_append((b), "" lit, sizeof(lit) - 1)
/* Take ownership of the data (NUL-terminated, may be NULL when empty); b is reset. */
char *buf_steal(struct buf *b, size_t *len);

#endif
