/*
 * keymemo.c - a bounded table of values by byte keys compared in full: open
 * addressing, at most half full.
 */
#include "util/keymemo.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    uint64_t hash;
    size_t len, bytes;
    char *key;           /* in the same block, after the value */
    max_align_t value[]; /* value_size bytes */
};

struct key_memo {
    struct entry **slots; /* 2 * max_entries, allocated at the first put */
    size_t max_entries, max_bytes, value_size;
    void (*release)(void *value);
    size_t used, bytes;
};

struct key_memo *km_new(size_t max_entries, size_t max_bytes, size_t value_size,
                        void (*release)(void *value))
{
    struct key_memo *m = calloc(1, sizeof(*m));
    if (m) {
        m->max_entries = max_entries;
        m->max_bytes = max_bytes;
        m->value_size = value_size;
        m->release = release;
    }
    return m;
}

static void drop(struct key_memo *m, struct entry *e)
{
    if (m->release)
        m->release(e->value);
    free(e);
}

void km_clear(struct key_memo *m)
{
    for (size_t i = 0; m->slots && m->used && i < 2 * m->max_entries; i++) {
        if (m->slots[i])
            drop(m, m->slots[i]);
        m->slots[i] = NULL;
    }
    m->used = m->bytes = 0;
}

void km_free(struct key_memo *m)
{
    if (!m)
        return;
    km_clear(m);
    free(m->slots);
    free(m);
}

size_t km_entries(const struct key_memo *m)
{
    return m->used;
}

static uint64_t hash_of(const char *p, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 29);
}

/* The slot of key: its entry, or the empty slot where it would go. */
static struct entry **slot_of(const struct key_memo *m, uint64_t hash, const char *key, size_t len)
{
    size_t mask = 2 * m->max_entries - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        struct entry *e = m->slots[i];
        if (!e || (e->hash == hash && e->len == len && memcmp(e->key, key, len) == 0))
            return &m->slots[i];
    }
}

void *km_get(const struct key_memo *m, const char *key, size_t len)
{
    if (!m->slots || !m->used)
        return NULL;
    struct entry *e = *slot_of(m, hash_of(key, len), key, len);
    return e ? e->value : NULL;
}

void *km_put(struct key_memo *m, const char *key, size_t len, size_t extra)
{
    if (!m->slots && !(m->slots = calloc(2 * m->max_entries, sizeof(*m->slots))))
        return NULL;
    uint64_t hash = hash_of(key, len);
    struct entry **s = slot_of(m, hash, key, len);
    size_t size = sizeof(struct entry) + m->value_size + len;
    if (*s) { /* the same key again: its value is refilled */
        if (m->release)
            m->release((*s)->value);
        m->bytes = m->bytes - (*s)->bytes + size + extra;
        (*s)->bytes = size + extra;
        memset((*s)->value, 0, m->value_size);
        return (*s)->value;
    }
    if (m->used >= m->max_entries || m->bytes + size + extra > m->max_bytes) {
        km_clear(m); /* bounded: a new start rather than an eviction order to keep */
        s = slot_of(m, hash, key, len);
    }
    struct entry *e = malloc(size);
    if (!e)
        return NULL;
    e->hash = hash;
    e->len = len;
    e->bytes = size + extra;
    e->key = (char *)e->value + m->value_size;
    memcpy(e->key, key, len);
    memset(e->value, 0, m->value_size);
    *s = e;
    m->used++;
    m->bytes += size + extra;
    return e->value;
}

void km_account(struct key_memo *m, size_t extra)
{
    m->bytes += extra;
}
