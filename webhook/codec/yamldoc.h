/*
 * yamldoc.h - YAML (and JSON) text to jansson values, read the way
 * Kubernetes tooling reads manifests and config files: sigs.k8s.io/yaml,
 * that is go-yaml v2 (YAML 1.1 rules) followed by a trip through JSON.
 *
 * Pure: libc, libyaml and jansson only; no I/O, no globals, no Lua.  The
 * caller reads the file (gg_read_file) and passes the text and a source
 * name used in messages.  Every error message has the form
 *     <source>:<line>:<column>: <what was wrong>
 * with 1-based lines and columns counted in characters.
 *
 * Input
 *   - UTF-8 only (a leading BOM is allowed).  NUL bytes, invalid UTF-8 and
 *     UTF-16 input fail with GG_ERR_PARSE at the offending byte.
 *   - A stream of documents separated by `---`.  Documents that are empty
 *     or hold only comments are skipped; a document that is just `null` or
 *     `~` is kept (as JSON null).
 *   - Text that starts with `{` or `[` is first read as a stream of
 *     concatenated JSON values, as kubectl's YAMLOrJSONDecoder does (this
 *     also takes \ud83d\ude80-style surrogate pairs, which libyaml refuses).
 *     When the first value fails (or the text goes on with YAML), the whole
 *     text is read as YAML instead, so the messages point into the YAML
 *     reading; only a later value of a concatenated stream, which YAML
 *     cannot read, reports jansson's message and position.
 *
 * Scalars (plain, untagged; go-yaml v2's resolve table)
 *   - bool:  true True TRUE false False FALSE, and the YAML 1.1 words
 *            y Y yes Yes YES n N no No NO on On ON off Off OFF
 *            (so `on:`, and even `y:`, as a key becomes "true", as in
 *            Kubernetes).
 *   - null:  empty, ~, null, Null, NULL.
 *   - int:   Go's ParseInt with base prefixes after removing every `_`:
 *            decimal with optional sign, 0x.. hex, 0o.. and 0.. (leading
 *            zero) octal, 0b.. binary; so 0777 is 511 and 010 is 8.  A
 *            number like 08 or 09 (not octal) falls through to float, i.e. 8.
 *            Integers that do not fit in int64 are an error (Kubernetes
 *            would silently turn them into a lossy float).
 *   - float: [-+]?(.digits|digits[.digits])([eE][-+]?digits).  A float
 *            with an integral value in int64 range becomes a JSON integer
 *            (1.0 -> 1, 1e3 -> 1000), which is what the API server sees
 *            after sigs.k8s.io/yaml's JSON round trip.  .inf, -.inf, .nan
 *            (any spelling go-yaml accepts) and overflowing literals such as
 *            1e400 are errors: JSON has no such numbers.
 *   - everything else, timestamps included, is a string.
 *   - Quoted scalars and block scalars (| and >) are always strings.
 *   - Tags: !!str forces a string; !!int, !!float, !!bool, !!null must
 *     resolve to that type (!!float accepts an integer); !!binary is an
 *     error; any other tag (!!timestamp, !foo, !) leaves the text a string.
 *   - Strings with a NUL character (a "\0" escape) are an error: C code
 *     and Lua would see different strings.
 *
 * Mapping keys
 *   - Non-string keys become their text as sigs.k8s.io/yaml does: bools
 *     "true"/"false", integers in decimal (0x10 -> "16"), floats as Go's
 *     FormatFloat(f, 'g', -1, 32) (1.5 -> "1.5", 1e6 -> "1e+06").
 *   - null keys, and mappings or sequences used as keys, are errors.
 *   - Duplicate keys are an error naming the key path and the line of the
 *     second occurrence (Kubernetes strict decoding does the same), also
 *     when two keys only become equal as text (`1` and "1", yes and true).
 *
 * Anchors, aliases, merge keys
 *   - Anchors are per document; a later anchor with the same name wins.
 *     An alias is a deep copy of the anchored value (never shared), an
 *     unknown or recursive alias is an error.
 *   - Every alias adds the anchored value's full expanded size to the
 *     node count and to a separate alias budget (max_alias_nodes values,
 *     and max_bytes of keys and scalar text), checked before copying, so
 *     a "billion laughs" document fails after about 75,000 copied values,
 *     and a few aliases of one huge string cannot multiply memory either.
 *   - `<<` (plain, untagged) merges a mapping, or a sequence of mappings,
 *     into the mapping it is in (also spelled `!!merge <<`).  Keys written
 *     in the mapping win over merged keys wherever they are; among merged
 *     mappings the first one listed wins.  That is the merge-key spec and
 *     go-yaml v3; go-yaml v2 let a `<<` overwrite keys written before it.
 *     Two `<<` keys in one mapping are a duplicate key.  A quoted "<<" is
 *     an ordinary key, and `<<` as a value is the string "<<".
 *
 * Bounds: see struct yd_limits.  Over a bound is GG_ERR_TOOBIG; syntax
 * and content errors are GG_ERR_PARSE; allocation failure GG_ERR_NOMEM.
 */
#ifndef GG_YAMLDOC_H
#define GG_YAMLDOC_H

#include "util/gpuguard.h"

#include <jansson.h>
#include <stddef.h>

#define YD_DEFAULT_MAX_BYTES ((size_t)8 << 20) /* 8 MiB of text */
#define YD_DEFAULT_MAX_DEPTH 128               /* nested mappings/sequences */
#define YD_DEFAULT_MAX_NODES 1000000           /* JSON values built, whole stream */
#define YD_DEFAULT_MAX_ALIAS_NODES 100000      /* of those, made by expanding aliases */

/* Bounds for one call.  A zero field means its default. */
struct yd_limits {
    size_t max_bytes;       /* length of the text; also the text aliases may copy, in all */
    size_t max_depth;       /* collection nesting, a top-level mapping is 1 */
    size_t max_nodes;       /* values built (scalars and collections), aliases expanded */
    size_t max_alias_nodes; /* of those, values built by expanding aliases */
};

/* Where a kept document starts. */
struct yd_doc {
    size_t number; /* 1-based position in the stream, skipped empty documents included */
    size_t line;   /* 1-based line of the document's first value */
    size_t column; /* 1-based column of that value */
};

/* A loaded stream: docs[i] (a JSON array element) starts at pos[i]. */
struct yd_stream {
    json_t *docs;       /* array, one element per non-empty document */
    struct yd_doc *pos; /* count entries */
    size_t count;
};

/* Fill *limits with the defaults above. */
void yd_limits_init(struct yd_limits *limits);

/*
 * Read every document of text[0..len) (no NUL terminator needed).
 * source_name is used in messages ("<input>" when NULL); limits may be
 * NULL for the defaults.  *out is written only on success; release it with
 * yd_stream_clear().
 */
enum gg_status yd_load_stream(const char *text, size_t len, const char *source_name,
                              const struct yd_limits *limits, struct yd_stream *out,
                              struct gg_err *err);

/* Free what yd_load_stream() filled in and zero *s; a zeroed *s is fine. */
void yd_stream_clear(struct yd_stream *s);

/* yd_load_stream() without the positions: *docs is a new JSON array. */
enum gg_status yd_load_all(const char *text, size_t len, const char *source_name,
                           const struct yd_limits *limits, json_t **docs, struct gg_err *err);

/*
 * A file that must hold at most one document (a config file).  *doc is a
 * new reference: the document, or JSON null when the text has none.  A
 * second non-empty document is GG_ERR_PARSE pointing at its first line.
 */
enum gg_status yd_load_one(const char *text, size_t len, const char *source_name,
                           const struct yd_limits *limits, json_t **doc, struct gg_err *err);

#endif
