/*
 * buf.c - bounded growable byte buffer.
 */
#include "util/buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void buf_init(struct buf *b, size_t max)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->max = max;
    b->failed = false;
}

void buf_clear(struct buf *b)
{
    if (!b)
        return;
    free(b->data);
    buf_init(b, b->max);
}

void buf_reset(struct buf *b)
{
    b->len = 0;
    b->failed = false;
    if (b->data)
        b->data[0] = '\0';
}

static enum gg_status reserve(struct buf *b, size_t extra)
{
    if (extra > b->max || b->len > b->max - extra) {
        b->failed = true;
        return GG_ERR_TOOBIG;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return GG_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *data = realloc(b->data, cap);
    if (!data) {
        b->failed = true;
        return GG_ERR_NOMEM;
    }
    b->data = data;
    b->cap = cap;
    return GG_OK;
}

enum gg_status buf_extend(struct buf *b, size_t len, char **at)
{
    enum gg_status st = reserve(b, len);
    if (st != GG_OK)
        return st;
    *at = b->data + b->len;
    b->len += len;
    b->data[b->len] = '\0';
    return GG_OK;
}

enum gg_status buf_append_grow(struct buf *b, const void *data, size_t len)
{
    char *at;
    enum gg_status st = buf_extend(b, len, &at);
    if (st == GG_OK && len)
        memcpy(at, data, len);
    return st;
}

enum gg_status buf_appendf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return GG_ERR_INVALID;
    enum gg_status st = reserve(b, (size_t)n);
    if (st != GG_OK)
        return st;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return GG_OK;
}

char *buf_steal(struct buf *b, size_t *len)
{
    char *data = b->data;
    if (len)
        *len = b->len;
    buf_init(b, b->max);
    return data;
}
