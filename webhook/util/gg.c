/*
 * gg.c - the project-wide error enum's strings, the gg_err helper, the
 * bounded whole-file reader and JSON text in plain malloc'ed memory.
 */
#include "util/gpuguard.h"

#include <errno.h>
#include <jansson.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *gg_strerror(enum gg_status status)
{
    switch (status) {
    case GG_OK:
        return "ok";
    case GG_ERR_NOMEM:
        return "out of memory";
    case GG_ERR_TOOBIG:
        return "too large";
    case GG_ERR_PARSE:
        return "parse error";
    case GG_ERR_INVALID:
        return "invalid input";
    case GG_ERR_IO:
        return "I/O error";
    case GG_ERR_TLS:
        return "TLS error";
    case GG_ERR_POLICY:
        return "policy error";
    case GG_ERR_TIMEOUT:
        return "deadline exceeded";
    case GG_ERR_EXISTS:
        return "already exists";
    }
    return "unknown error";
}

/* Drop a UTF-8 sequence that truncation cut short at the end of s (n bytes). */
static void trim_cut_sequence(char *s, size_t n)
{
    size_t i = n;
    while (i > 0 && n - i < 3 && ((unsigned char)s[i - 1] & 0xc0) == 0x80)
        i--;
    if (i > 0 && n - (i - 1) < gg_utf8_len((unsigned char)s[i - 1]))
        s[i - 1] = '\0';
}

/* Messages end up in JSON answers: a cut one stays valid UTF-8 (if its parts were). */
enum gg_status gg_fail(struct gg_err *err, enum gg_status status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
        if (n >= (int)sizeof(err->msg))
            trim_cut_sequence(err->msg, sizeof(err->msg) - 1);
    }
    return status;
}

/*
 * Files are not opened with O_NOFOLLOW: mounted Kubernetes Secrets and
 * ConfigMaps are symlinks.  The buffer is wiped before it is freed on error,
 * since it may hold part of a private key.
 */
enum gg_status gg_read_file(const char *path, size_t max, char **data, size_t *len,
                            struct gg_err *err)
{
    enum gg_status st = GG_OK;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        st = gg_fail(err, GG_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto out;
    }
    if (fstat(fd, &sb) != 0) {
        st = gg_fail(err, GG_ERR_IO, "%s: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = gg_fail(err, GG_ERR_IO, "%s: not a regular file", path);
        goto out;
    }
    if ((size_t)sb.st_size > max) {
        st = gg_fail(err, GG_ERR_TOOBIG, "%s: larger than %zu bytes", path, max);
        goto out;
    }
    /* One byte spare: filling it means the file grew while being read. */
    cap = (size_t)sb.st_size + 1;
    buf = malloc(cap + 1);
    if (!buf) {
        st = gg_fail(err, GG_ERR_NOMEM, "%s: out of memory", path);
        goto out;
    }
    while (n < cap) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            st = gg_fail(err, GG_ERR_IO, "%s: read: %s", path, strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    if (n == cap) {
        st = gg_fail(err, GG_ERR_IO, "%s: changed while being read", path);
        goto out;
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    buf = NULL;
out:
    if (buf) {
        explicit_bzero(buf, cap + 1);
        free(buf);
    }
    if (fd >= 0)
        close(fd);
    return st;
}

enum gg_status gg_json_dump(const json_t *v, size_t flags, char **out, size_t *len)
{
    size_t size = 2048;
    for (int attempt = 0; attempt < 2; attempt++) {
        char *text = malloc(size + 1);
        if (!text)
            return GG_ERR_NOMEM;
        size_t need = json_dumpb(v, text, size, flags);
        if (need == 0) {
            free(text);
            return GG_ERR_INVALID;
        }
        if (need <= size) {
            text[need] = '\0';
            *out = text;
            *len = need;
            return GG_OK;
        }
        free(text);
        size = need;
    }
    return GG_ERR_NOMEM;
}

bool gg_dns_label(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 63 || s[0] == '-' || s[n - 1] == '-')
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return false;
    return true;
}

bool gg_dns_subdomain(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 253)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
        if (!alnum && ((ch != '-' && ch != '.') || i == 0 || i == n - 1))
            return false;
    }
    return true;
}
