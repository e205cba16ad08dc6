/*
 * jsonpatch.h - RFC 6901 JSON Pointers and RFC 6902 JSON Patch over jansson:
 * the patch that turns an original document into an edited one (jp_diff) and
 * the application of a patch (jp_apply).
 *
 * Pure: libc and jansson only, no I/O, no globals.  Allocations go through
 * jansson's allocator (json_set_alloc_funcs), so a memory cap or a failing
 * test allocator set there covers this module too.
 *
 * jp_diff writes patches for the API server's applier (evanphx/json-patch v4,
 * no options; see docs on divergences below): no root path, keys escaped, a
 * missing parent added whole, `-` to append, `replace` only on members that
 * exist, removals of array elements from the highest index down.
 *
 * jp_apply follows RFC 6902 strictly (it is our own checker, not a model of v4):
 * leading zeros and `-1` are not indices, `replace`/`remove`/`test` need an
 * existing target, add/replace/test need `value`, move/copy need `from`,
 * `test` compares numbers by value (1 == 1.0) and everything else
 * structurally.  Root paths ("") work in jp_apply_copy; `remove ""` leaves
 * null (RFC 6902 does not define it; the conformance suite expects null).
 *
 * Limits (each fails with GG_ERR_TOOBIG and a message, never aborts):
 *   JP_MAX_OPS         operations in a patch given to jp_apply, or produced
 *                      by jp_diff;
 *   JP_MAX_DEPTH       reference tokens in a pointer given to jp_apply; jp_diff
 *                      never emits deeper paths: below that depth it replaces
 *                      the whole differing subtree instead of recursing;
 *   JP_MAX_COPY_BYTES  total approximate compact-JSON size of the values that
 *                      the `copy` ops of one patch duplicate (the API server
 *                      caps the same thing at 3 MiB), so a short patch cannot
 *                      double the document again and again.
 */
#ifndef GG_JSONPATCH_H
#define GG_JSONPATCH_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "util/gpuguard.h"

#define JP_MAX_OPS 10000
#define JP_MAX_DEPTH 128
#define JP_MAX_COPY_BYTES (3u * 1024u * 1024u)

/*
 * Escape the key_len bytes at key as one RFC 6901 reference token
 * (`~` -> `~0`, `/` -> `~1`) into out, NUL-terminated and truncated to size
 * bytes (out may be NULL when size is 0).  Returns the length of the full
 * escaped token, as snprintf does.
 */
size_t jp_escape(const char *key, size_t key_len, char *out, size_t size);

/*
 * Parse a pointer into a new array of its unescaped reference tokens (strings):
 * "" gives [], "/" gives [""], "/a~1b/~01" gives ["a/b", "~1"].  Fails with
 * GG_ERR_PARSE (no leading '/', `~` not followed by 0 or 1) or GG_ERR_TOOBIG
 * (more than JP_MAX_DEPTH tokens).
 */
enum gg_status jp_pointer_parse(const char *pointer, json_t **tokens, struct gg_err *err);

/*
 * doc (empty on entry) made original with patch applied, sharing every node
 * of original that no op reaches: the containers on an op's path are
 * copied, so jf_same finds the untouched parts equal at once, by their
 * address.  paths holds each op's path parsed (jp_pointer_parse); the nodes
 * point into it and into patch's values, which must outlive doc, as
 * original must.  The ops are those gpuguard's differ writes: add, replace
 * and remove, below the root.  GG_ERR_INVALID when one does not apply.
 */
struct jf_node;
struct jf_doc;
enum gg_status jp_patched_nodes(const struct jf_node *original, const json_t *patch,
                                const json_t *paths, struct jf_doc *doc, struct gg_err *err);

/*
 * Resolve pointer in doc; *value is a borrowed reference into doc.  Array
 * indices follow RFC 6901 (no leading zeros, `-` names nothing).
 */
enum gg_status jp_pointer_get(const json_t *doc, const char *pointer, json_t **value,
                              struct gg_err *err);

/*
 * The patch (a new array of op objects) that turns original into edited.
 * Equal documents give [].  Both roots must be objects, unless they are
 * equal; anything else is GG_ERR_INVALID because it would need a root path.
 *
 * Equality here is strict, for round-tripping: an integer and a real are
 * different values (1 vs 1.0, also 0.0 vs -0.0), strings compare by bytes,
 * object key order is irrelevant.  Output is deterministic: object members
 * are visited in byte order of their keys.  Arrays are diffed element-wise
 * when lengths match, extended with `/-` adds when the edited array extends an
 * equal prefix, truncated with removes from the highest index down when it
 * is an equal prefix, and otherwise replaced whole.  Keys containing a NUL
 * byte are GG_ERR_INVALID.
 *
 * The ops' values are edited's own (new references, not copies): change
 * neither while the other is in use.  (jp_apply copies what it inserts.)
 */
enum gg_status jp_diff(const json_t *original, const json_t *edited, json_t **patch,
                       struct gg_err *err);

/*
 * A diff built step by step, for a caller that walks the edited document in
 * a representation of its own (the Lua bridge) and hands over only what
 * differs, as jansson values, at the path it has reached.  The ops come out
 * as jp_diff's would when the caller visits object members in jp_key_cmp
 * order and emits for a member only in edited "add" (whole), for one only in
 * the original "remove", and for a pair that may differ either recurses
 * (objects, and arrays of the same length, elements in index order) or hands
 * the pair to jp_differ_value (anything else, arrays whose length changed
 * included).  jp_diff refuses a NUL byte in any key of the objects it walks;
 * the differ refuses it in the keys entered, which is the same for an
 * original whose keys have none (jsonfast refuses \u0000).  Callers read and
 * reset path.len (to leave what they entered); the other fields are the
 * module's.
 */
struct jp_path {
    char *data; /* the pointer reached, not NUL-terminated */
    size_t len;
    size_t cap;
};

struct jp_differ {
    json_t *patch;
    struct jp_path path;
    struct gg_err *err;
};

/* An object key, for jp_key_cmp: byte order, a prefix first. */
struct jp_key {
    const char *s;
    size_t len;
};
int jp_key_cmp(const void *a, const void *b);

enum gg_status jp_differ_begin(struct jp_differ *d, struct gg_err *err);
/* The patch (with keep) or NULL; frees everything else. */
json_t *jp_differ_end(struct jp_differ *d, bool keep);
/* Enter a member or an element: the path grows; set d->path.len back to leave it.
 * A key containing a NUL byte is GG_ERR_INVALID, as in jp_diff. */
enum gg_status jp_differ_key(struct jp_differ *d, const char *key, size_t key_len);
enum gg_status jp_differ_index(struct jp_differ *d, size_t i);
/* One op at the current path; value (borrowed, may be NULL) is referenced, not copied. */
enum gg_status jp_differ_emit(struct jp_differ *d, const char *op, const json_t *value);
/* jp_diff's ops for original value a and edited value b at the current path, which
 * holds depth reference tokens. */
enum gg_status jp_differ_value(struct jp_differ *d, const json_t *a, const json_t *b, size_t depth);

/*
 * Apply patch to doc in place, all or nothing: the ops run on a deep copy
 * whose contents then replace doc's.  On error doc is unchanged and err says
 * which op failed, as "patch op <index> (<op> <path>): <reason>".
 *
 * In place, the root keeps its identity, so a patch that changes the root's
 * type (say `add ""` of an array to an object) is GG_ERR_INVALID here; use
 * jp_apply_copy.  The one exception to all-or-nothing is running out of
 * memory while moving the result into doc (GG_ERR_NOMEM): doc may then be
 * partly updated; callers that cannot accept that use jp_apply_copy.
 */
enum gg_status jp_apply(json_t *doc, const json_t *patch, struct gg_err *err);

/*
 * Apply patch to a deep copy of doc and return it in *out (a new reference);
 * doc is never modified and *out is written only on success.
 */
enum gg_status jp_apply_copy(const json_t *doc, const json_t *patch, json_t **out,
                             struct gg_err *err);

/*
 * The diff's equality: jp_diff emits nothing for a and b exactly when this
 * is 1 (an integer and a real differ, so do 0.0 and -0.0; identical
 * pointers are equal at once).
 */
int jp_same(const json_t *a, const json_t *b);

/*
 * RFC 6902 `test` equality: numbers by value (an integer equals a real with
 * the same value), strings by code points, arrays element-wise, objects by
 * the same set of members with equal values.  Returns 1 when equal.
 */
int jp_equal(const json_t *a, const json_t *b);

#endif
