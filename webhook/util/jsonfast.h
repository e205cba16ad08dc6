/*
 * jsonfast.h - a fast, strict JSON parser: into a read-only document of
 * nodes (jf_parse), or into jansson values (jf_loadb).
 *
 * jf_parse() builds a struct jf_doc: each value one 32-byte node, an
 * object's or array's members one contiguous run of nodes (an object's
 * member carries its key), strings NUL-terminated in a copy of the text.
 * No hashing and no allocation per value: the engine reads the review from
 * it (lookups by key are linear, objects in a review are small).
 * jf_loadb() is jf_parse() followed by jf_to_json().
 *
 * Both accept exactly what RFC 8259 accepts, minus what jansson's
 * json_loadb() refuses (integers outside int64, reals that overflow to
 * infinity, \u0000 in strings), and builds the same values jansson would:
 * integers without fraction or exponent become json_integer, every other
 * number json_real (strtod, correctly rounded), duplicate keys keep the
 * last value at the first key's position, objects keep the keys in text
 * order.  Unlike json_loadb(..., 0, ...) a scalar at the top level is
 * accepted (as with JSON_DECODE_ANY).
 *
 * It is a pure function: no I/O, no globals but a lazily created "C"
 * locale for strtod_l, never reads text[len] or beyond (the text need not
 * be NUL-terminated).  A document's copy of the text and its nodes come
 * from plain malloc (jf_doc_free releases them); so do the temporary
 * buffers for numbers longer than 63 characters that need strtod, nesting
 * deeper than 64 and the values of open containers past the first 128,
 * freed before returning.  jf_loadb's jansson values come from jansson's
 * allocator (so the request arena applies to them).
 *
 * Stricter than jansson in one place: jansson's lexer silently drops a NUL
 * byte that directly follows a number or a literal ("[1\0]" loads as [1]);
 * jf_loadb reports it.
 */
#ifndef GG_JSONFAST_H
#define GG_JSONFAST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* jansson's own nesting limit (JSON_PARSER_MAX_DEPTH). */
#define JF_DEFAULT_MAX_DEPTH 2048

/*
 * Where and why parsing failed.  line and column are 1-based (column counts
 * UTF-8 characters, as jansson does), position is the 0-based byte offset
 * of the offending byte (the opening quote of an unterminated string, len
 * when the input ended early elsewhere).  text is a
 * NUL-terminated message in printable ASCII, e.g. "invalid escape near
 * '\q'", safe to embed in a JSON answer.
 */
struct jf_error {
    int line;
    int column;
    size_t position;
    char text[160];
};

/*
 * Parse exactly one JSON value (object, array or scalar), optionally
 * surrounded by whitespace (space, tab, CR, LF), from text[0..len).
 *
 * Depth is counted as jansson counts it: the top-level value has depth 1
 * and every value inside a container one more than the container, so
 * [[1]] has depth 3.  A value deeper than max_depth is an error; 0 selects
 * JF_DEFAULT_MAX_DEPTH.
 *
 * Returns a new reference, or NULL with *err filled in (when err is not
 * NULL).  err is left untouched on success.  Allocation failures return
 * NULL with the text "out of memory".
 */
json_t *jf_loadb(const char *text, size_t len, size_t max_depth, struct jf_error *err);

enum jf_type { JF_NULL, JF_FALSE, JF_TRUE, JF_INTEGER, JF_REAL, JF_STRING, JF_ARRAY, JF_OBJECT };

/* One value.  Strings and keys are NUL-terminated (from jf_parse, they contain no NUL). */
struct jf_node {
    const char *key;  /* a member of an object: its key; NULL otherwise */
    uint32_t key_len; /* bytes of key */
    uint32_t n;       /* JF_STRING: bytes; JF_ARRAY, JF_OBJECT: members */
    uint8_t type;     /* enum jf_type */
    union {
        int64_t i;                   /* JF_INTEGER */
        double d;                    /* JF_REAL */
        const char *s;               /* JF_STRING */
        const struct jf_node *items; /* JF_ARRAY, JF_OBJECT: n nodes */
    } u;
};

struct jf_chunk;

/* A parsed document: the nodes and the text they point into, owned. */
struct jf_doc {
    const struct jf_node *root;
    char *text; /* jf_parse's copy of the text; NULL for jf_from_json */
    struct jf_chunk *chunks;
};

/*
 * Parse text[0..len) into doc (the same grammar, limits and errors as
 * jf_loadb; duplicate keys keep the last value at the first key's
 * position).  *deepest is set (on success) to a bound on the depth of the
 * deepest value: one more than the deepest container's depth, so callers
 * that must refuse deep documents skip their own walk when it is small.  Returns 0, or -1
 * with *err filled (when err is not NULL) and doc empty.  Release doc with
 * jf_doc_free, also after a failure.
 */
int jf_parse(const char *text, size_t len, size_t max_depth, struct jf_doc *doc, size_t *deepest,
             struct jf_error *err);

/*
 * A document of v's values, for readers of jf_node: strings and keys point
 * into v, which must outlive doc.  Returns 0, or -1 when out of memory.
 */
int jf_from_json(const json_t *v, struct jf_doc *doc);
/* Fill node (its key is the caller's) from v, its members in doc; 0, or -1 when out of memory. */
int jf_node_of_json(const json_t *v, struct jf_node *node, struct jf_doc *doc);

void jf_doc_free(struct jf_doc *doc);

/* For the builders: a chunk with room for n more nodes; n nodes that stay
 * where they are until jf_doc_free.  false and NULL when out of memory. */
bool jf_doc_reserve(struct jf_doc *doc, size_t n);
struct jf_node *jf_doc_nodes(struct jf_doc *doc, size_t n);
/* For the parser's scratch stack: a run of n nodes, grown, freed, or taken over by doc (which
 * then frees it with itself and takes no more nodes from it). */
struct jf_node *jf_run_alloc(size_t n);
struct jf_node *jf_run_realloc(struct jf_node *run, size_t n);
void jf_run_free(struct jf_node *run);
void jf_doc_adopt(struct jf_doc *doc, struct jf_node *run);

/* The jansson value of node (a new reference), NULL when out of memory. */
json_t *jf_to_json(const struct jf_node *node);

/* The member of object o with key key[0..len), NULL when o is no object or has none. */
const struct jf_node *jf_get(const struct jf_node *o, const char *key, size_t len);

/* o's member key (a C string), NULL as jf_get. */
const struct jf_node *jf_get_str(const struct jf_node *o, const char *key);

/*
 * Exact equality, as the diff's jp_same judges jansson values: an integer
 * and a real differ, so do 0.0 and -0.0; objects by their set of members.
 */
bool jf_same(const struct jf_node *a, const struct jf_node *b);

/*
 * Append to b a binary encoding of n, for keys that must be compared in
 * full: each value its type, then an integer's or a real's 8 bytes, or a
 * string's length and bytes, or a container's count and members (an
 * object's keys, length and bytes, in their order).  Two values have the
 * same encoding only when they are the same to the byte and in member
 * order; it is no JSON, and is about ten times cheaper to write.  False
 * when b refuses to grow.
 */
struct buf;
bool jf_key(struct buf *b, const struct jf_node *n);

/* The string of node, NULL when it is no string. */
static inline const char *jf_string(const struct jf_node *node)
{
    return node && node->type == JF_STRING ? node->u.s : NULL;
}

static inline bool jf_is_container(const struct jf_node *node)
{
    return node && (node->type == JF_OBJECT || node->type == JF_ARRAY);
}

/* The members of an object or array; 0 for anything else, NULL included. */
static inline uint32_t jf_size(const struct jf_node *node)
{
    return jf_is_container(node) ? node->n : 0;
}

/*
 * The first byte in [p, end) that is '"', '\\', below 0x20 or above 0x7f,
 * or end if none: the string scan of the parser, for jsonwrite's escaping.
 */
const char *jf_scan_plain(const char *p, const char *end);

/*
 * Whether s[0..len) is valid UTF-8 as jansson judges it (NUL and other
 * ASCII bytes allowed; no overlong forms, surrogates or code points above
 * U+10FFFF), at a fraction of json_stringn's per-byte cost: callers check
 * with it and then use jansson's _nocheck constructors.
 */
bool jf_utf8_valid(const char *s, size_t len);

#endif
