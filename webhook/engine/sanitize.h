/*
 * sanitize.h - policy text made acceptable to the API server.
 */
#ifndef GG_SANITIZE_H
#define GG_SANITIZE_H

#include <jansson.h>
#include <stddef.h>

/* Warnings as the API server keeps them: no control characters, at most
 * SANITIZE_WARNING_MAX characters each, under SANITIZE_WARNINGS_TOTAL in all,
 * duplicates once.  Those that do not fit, and left_out more that never got
 * here, are named in a last warning "gpuguard: N more warnings left out". */
#define SANITIZE_WARNING_MAX 120
#define SANITIZE_WARNINGS_TOTAL 4000
json_t *sanitize_warnings(const json_t *warnings, size_t left_out);

/* The bytes of the longest start of s[0..len) of at most max_bytes bytes and max_chars
 * UTF-8 characters (a byte that starts none counts as one). */
size_t sanitize_prefix(const char *s, size_t len, size_t max_bytes, size_t max_chars);

/* Text past max bytes cut where a character ends and marked "… (N more bytes)". */
#define SANITIZE_CUT_MARK "\xe2\x80\xa6 (%zu more bytes)"
/* s[0..len) (NUL bytes and all), cut as SANITIZE_CUT_MARK says when longer than max, in a
 * NUL-terminated malloc'ed copy of *out_len bytes; NULL when out of memory. */
char *sanitize_cut(const char *s, size_t len, size_t max, size_t *out_len);
/* An audit annotation key made valid: [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?, <= 63. */
void sanitize_audit_key(const char *in, char *out, size_t size);

#endif
