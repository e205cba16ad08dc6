/*
 * gpuguard.h - project-wide definitions: version, the error enum, the
 * caller-owned error message buffer.
 *
 * Every module reports failure as an enum gg_status plus, when the caller
 * passes one, a human message in a struct gg_err.  Filling a gg_err never
 * allocates, so it is safe on every error path.
 */
#ifndef GPUGUARD_H
#define GPUGUARD_H

#include <stdbool.h>
#include <stddef.h>

#define GG_VERSION "0.1.0"

/* GG_ASAN: built with AddressSanitizer (gcc's macro, or clang's feature test). */
#if defined(__SANITIZE_ADDRESS__)
#define GG_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GG_ASAN 1
#endif
#endif

enum gg_status {
    GG_OK = 0,
    GG_ERR_NOMEM,   /* an allocation failed */
    GG_ERR_TOOBIG,  /* input over a configured bound */
    GG_ERR_PARSE,   /* malformed input (JSON, YAML, quantity, ...) */
    GG_ERR_INVALID, /* well-formed but not what was expected */
    GG_ERR_IO,      /* a file or socket operation failed */
    GG_ERR_TLS,     /* certificate or key problem */
    GG_ERR_POLICY,  /* a policy raised or broke its budget */
    GG_ERR_TIMEOUT, /* a deadline passed */
    GG_ERR_EXISTS,  /* refused to overwrite */
};

/* Human-readable message for a failure; caller owns the storage. */
struct gg_err {
    char msg[256];
};

const char *gg_strerror(enum gg_status status);

/*
 * Set err->msg with printf formatting (truncated to fit) and return status,
 * so call sites can write `return gg_fail(err, GG_ERR_PARSE, "...")`.
 * A NULL err is allowed.
 */
enum gg_status gg_fail(struct gg_err *err, enum gg_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * Read a whole regular file of at most max bytes into a NUL-terminated heap
 * buffer (*len excludes the NUL).  Messages name the path.
 */
enum gg_status gg_read_file(const char *path, size_t max, char **data, size_t *len,
                            struct gg_err *err);

/*
 * A DNS-1123 label, as Kubernetes wants namespace and many other names:
 * a-z, 0-9 and '-', not starting or ending with '-', 1 to 63 characters.
 */
bool gg_dns_label(const char *s);
/* A DNS-1123 subdomain (object names): lowercase alphanumerics, '-' and '.', at most 253,
 * alphanumeric at both ends. */
bool gg_dns_subdomain(const char *s);

/*
 * Length of the UTF-8 sequence a lead byte starts (1 for ASCII and for a
 * byte that starts none); no validation (jf_utf8_valid does that).
 */
static inline size_t gg_utf8_len(unsigned char lead)
{
    return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

/*
 * JSON text of v (jansson dump flags) in a NUL-terminated buffer from plain
 * malloc, whatever allocator jansson uses: free it with free().
 */
struct json_t;
enum gg_status gg_json_dump(const struct json_t *v, size_t flags, char **out, size_t *len);

#endif
