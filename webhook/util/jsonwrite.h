/*
 * jsonwrite.h - compact JSON text of jansson values (and jsonfast's nodes),
 * appended to a buf.
 *
 * The writing half of jsonfast: json_dumpb() goes through a callback per
 * token and a loop check per container, which made the admission patch
 * the most expensive part of an answer.  The text is what
 * json_dumps(v, JSON_COMPACT) writes (keys in the object's order, reals as
 * "%.17g" with ".0" added when that reads as an integer and the exponent
 * without '+' or leading zeros, so they load back to the same double),
 * except for escapes: only '"', '\\' and control characters are escaped,
 * as \n, \r, \t or \u00xx (jansson writes \b and \f and upper-case hex);
 * everything else, DEL and non-ASCII UTF-8 included, is copied as is.
 *
 * On failure (GG_ERR_NOMEM; GG_ERR_TOOBIG past the buf's limit or nested
 * deeper than JW_MAX_DEPTH) the buf holds a partial text to discard.
 */
#ifndef GG_JSONWRITE_H
#define GG_JSONWRITE_H

#include "util/buf.h"

#include <jansson.h>
#include <stddef.h>

/*
 * Deepest nesting written: a patch holds a parsed document (at most
 * JF_DEFAULT_MAX_DEPTH deep) two levels down, so anything deeper is a
 * value built by hand, or a cycle, which would otherwise never end.
 */
#define JW_MAX_DEPTH 4096

/* Append v (NULL is GG_ERR_INVALID). */
enum gg_status jw_value(struct buf *b, const json_t *v);

/* Append s (len bytes of valid UTF-8, as jansson strings are) as a string literal. */
enum gg_status jw_string(struct buf *b, const char *s, size_t len);

/* Append the value of node n (a document's, jsonfast.h), as jw_value would write it. */
struct jf_node;
enum gg_status jw_node(struct buf *b, const struct jf_node *n);

/* Append v in decimal. */
enum gg_status jw_integer(struct buf *b, json_int_t v);

/* Append d (finite) as jansson writes a real: "%.17g", with ".0" when that reads as an integer. */
enum gg_status jw_real(struct buf *b, double d);

#endif
