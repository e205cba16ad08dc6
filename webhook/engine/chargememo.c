/*
 * chargememo.c - the charges of charge specs already seen: a bounded table
 * of keys compared in full.
 */
#include "engine/chargememo.h"

#include <stdlib.h>
#include <string.h>

#define CM_SLOTS (2 * CM_MAX_ENTRIES) /* a power of two, half full at most */

struct entry {
    uint64_t hash;
    uint64_t version; /* of what the charge read beyond its key (cm_get) */
    int64_t charge;
    size_t len;
    char key[];
};

struct charge_memo {
    struct entry **slots; /* CM_SLOTS, allocated at the first put */
    size_t used, bytes;
};

struct charge_memo *cm_new(void)
{
    return calloc(1, sizeof(struct charge_memo));
}

void cm_clear(struct charge_memo *m)
{
    for (size_t i = 0; m->slots && m->used && i < CM_SLOTS; i++) {
        free(m->slots[i]);
        m->slots[i] = NULL;
    }
    m->used = m->bytes = 0;
}

void cm_free(struct charge_memo *m)
{
    if (!m)
        return;
    cm_clear(m);
    free(m->slots);
    free(m);
}

size_t cm_entries(const struct charge_memo *m)
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
static struct entry **slot_of(struct entry **slots, uint64_t hash, const char *key, size_t len)
{
    for (size_t i = hash & (CM_SLOTS - 1);; i = (i + 1) & (CM_SLOTS - 1)) {
        struct entry *e = slots[i];
        if (!e || (e->hash == hash && e->len == len && memcmp(e->key, key, len) == 0))
            return &slots[i];
    }
}

bool cm_get(const struct charge_memo *m, const char *key, size_t len, uint64_t version,
            int64_t *charge)
{
    if (!m->slots || !m->used)
        return false;
    struct entry *e = *slot_of(m->slots, hash_of(key, len), key, len);
    if (!e || e->version != version)
        return false;
    *charge = e->charge;
    return true;
}

void cm_put(struct charge_memo *m, const char *key, size_t len, uint64_t version, int64_t charge)
{
    size_t size = sizeof(struct entry) + len;
    if (!m->slots && !(m->slots = calloc(CM_SLOTS, sizeof(*m->slots))))
        return;
    uint64_t hash = hash_of(key, len);
    struct entry **s = slot_of(m->slots, hash, key, len);
    if (*s) { /* the same key under another version: that one is never asked for again */
        (*s)->version = version;
        (*s)->charge = charge;
        return;
    }
    if (m->used >= CM_MAX_ENTRIES || m->bytes + size > CM_MAX_BYTES) {
        cm_clear(m); /* bounded: a new start rather than an eviction order to keep */
        s = slot_of(m->slots, hash, key, len);
    }
    if (!(*s = malloc(size)))
        return;
    (*s)->hash = hash;
    (*s)->version = version;
    (*s)->charge = charge;
    (*s)->len = len;
    memcpy((*s)->key, key, len);
    m->used++;
    m->bytes += size;
}
