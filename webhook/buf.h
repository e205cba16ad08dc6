/*
 * buf.h - a growable byte buffer with a hard size limit fixed at init.
 *
 * Appending past the limit fails with GG_ERR_TOOBIG and leaves the buffer
 * as it was, so input sized by the network can never grow memory without
 * bound.  The data is always NUL-terminated (the NUL is not counted).
 */
#ifndef GG_BUF_H
#define GG_BUF_H

#include "gpuguard.h"

#include <stddef.h>

struct buf {
    char *data;
    size_t len;
    size_t cap;
    size_t max;
};

void buf_init(struct buf *b, size_t max);
void buf_clear(struct buf *b);
enum gg_status buf_append(struct buf *b, const void *data, size_t len);
enum gg_status buf_appendf(struct buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Take ownership of the data (NUL-terminated, may be NULL when empty); b is reset. */
char *buf_steal(struct buf *b, size_t *len);

#endif
