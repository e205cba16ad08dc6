/*
 * chargememo.c - the charges of charge specs already seen (util/keymemo.h
 * keeps them), each with the version it holds for.
 */
#include "engine/chargememo.h"
#include "util/keymemo.h"

#include <stdlib.h>

struct charge_memo {
    struct key_memo *table; /* of struct charge */
};

struct charge {
    uint64_t version; /* of what the charge read beyond its key (cm_get) */
    int64_t milli;
};

struct charge_memo *cm_new(void)
{
    struct charge_memo *m = malloc(sizeof(*m));
    if (m && !(m->table = km_new(CM_MAX_ENTRIES, CM_MAX_BYTES, sizeof(struct charge), NULL))) {
        free(m);
        m = NULL;
    }
    return m;
}

void cm_clear(struct charge_memo *m)
{
    km_clear(m->table);
}

void cm_free(struct charge_memo *m)
{
    if (m)
        km_free(m->table);
    free(m);
}

size_t cm_entries(const struct charge_memo *m)
{
    return km_entries(m->table);
}

bool cm_get(const struct charge_memo *m, const char *key, size_t len, uint64_t version,
            int64_t *charge)
{
    const struct charge *c = km_get(m->table, key, len);
    if (!c || c->version != version)
        return false;
    *charge = c->milli;
    return true;
}

/* The same key under another version replaces it: that one is never asked for again. */
void cm_put(struct charge_memo *m, const char *key, size_t len, uint64_t version, int64_t charge)
{
    struct charge *c = km_put(m->table, key, len, 0);
    if (c)
        *c = (struct charge){version, charge};
}
