/*
 * gg.c - the project-wide error enum's strings and the gg_err helper.
 */
#include "gpuguard.h"

#include <stdarg.h>
#include <stdio.h>

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

enum gg_status gg_fail(struct gg_err *err, enum gg_status status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return status;
}
