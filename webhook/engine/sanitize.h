/*
 * sanitize.h - policy text made acceptable to the API server.
 */
#ifndef GG_SANITIZE_H
#define GG_SANITIZE_H

#include <jansson.h>
#include <stddef.h>

/* Warnings as the API server keeps them: no control characters, at most
 * SANITIZE_WARNING_MAX characters each, under SANITIZE_WARNINGS_TOTAL in all. */
#define SANITIZE_WARNING_MAX 120
#define SANITIZE_WARNINGS_TOTAL 4000
json_t *sanitize_warnings(const json_t *warnings);
/* An audit annotation key made valid: [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?, <= 63. */
void sanitize_audit_key(const char *in, char *out, size_t size);

#endif
