/*
 * jsonfast.h - a fast, strict JSON parser that builds jansson values.
 *
 * jf_loadb() accepts exactly what RFC 8259 accepts, minus what jansson's
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
 * be NUL-terminated).  Values are allocated with jansson's allocator (so
 * the request arena applies); the temporary buffers for escaped strings
 * longer than a few hundred bytes, numbers longer than 63 characters that
 * need strtod, and nesting deeper than 64 come from plain malloc and are
 * freed before returning.
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

/*
 * jf_loadb that also sets *deepest (on success) to a bound on the depth of
 * the deepest value: one more than the deepest container's depth.  Callers
 * that must refuse deep documents skip their own walk when it is small.
 */
json_t *jf_loadb_depth(const char *text, size_t len, size_t max_depth, size_t *deepest,
                       struct jf_error *err);

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
