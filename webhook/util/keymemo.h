/*
 * keymemo.h - a bounded table of values by byte keys compared in full.
 *
 * The memos of the engine (engine/chargememo.h, engine/verdictmemo.h) key
 * what they remember by text a client controls (a pod's parts): a key is
 * found by its hash and then compared byte for byte, so a crafted key can
 * collide in the hash but never take another key's value.  Each value is
 * value_size bytes kept beside its key; release (may be NULL) lets go of
 * what a value holds when it is dropped.  Bounded in entries and in bytes
 * (keys, values and what the caller says a value holds besides): full, it
 * starts again empty, rather than keep an eviction order.  Not locked.
 */
#ifndef GG_KEYMEMO_H
#define GG_KEYMEMO_H

#include <stdbool.h>
#include <stddef.h>

struct key_memo;

/* A memo of at most max_entries (a power of two) and max_bytes; NULL when out of memory. */
struct key_memo *km_new(size_t max_entries, size_t max_bytes, size_t value_size,
                        void (*release)(void *value));
void km_free(struct key_memo *m);
void km_clear(struct key_memo *m);
size_t km_entries(const struct key_memo *m);

/* The value kept under key[0..len), or NULL. */
void *km_get(const struct key_memo *m, const char *key, size_t len);

/*
 * The value under key[0..len) for the caller to fill: the one kept (after
 * release), or a new one, zeroed, counted as holding extra bytes besides;
 * NULL when out of memory.
 */
void *km_put(struct key_memo *m, const char *key, size_t len, size_t extra);

/* Count extra bytes more against the bound for what a kept value came to hold; the next
 * km_put past the bound starts again empty. */
void km_account(struct key_memo *m, size_t extra);

#endif
