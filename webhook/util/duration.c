/*
 * duration.c - Go duration strings ("1m30s", "500ms") in milliseconds.
 */
#include "util/duration.h"

#include <stdlib.h>
#include <string.h>

/* One "<number><unit>" group of a Go duration, in milliseconds. */
static int unit_ms(const char **p, double *scale)
{
    static const struct {
        const char *name;
        double ms;
    } units[] = {{"ns", 1e-6}, {"us", 1e-3}, {"\xc2\xb5s", 1e-3}, {"ms", 1},
                 {"s", 1000},  {"m", 60000}, {"h", 3600000}};
    /* Longest match first matters only for "ms" against "m": try it before "m". */
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        size_t n = strlen(units[i].name);
        if (strncmp(*p, units[i].name, n) == 0 &&
            !(units[i].name[0] == 'm' && n == 1 && (*p)[1] == 's')) {
            *p += n;
            *scale = units[i].ms;
            return 1;
        }
    }
    return 0;
}

enum gg_status duration_parse_ms(const char *text, int64_t *ms)
{
    const char *p = text;
    double total = 0;
    if (!p || !*p)
        return GG_ERR_PARSE;
    if (strcmp(p, "0") == 0) {
        *ms = 0;
        return GG_OK;
    }
    while (*p) {
        char *end;
        if (!((*p >= '0' && *p <= '9') || *p == '.'))
            return GG_ERR_PARSE;
        double value = strtod(p, &end);
        double scale;
        if (end == p)
            return GG_ERR_PARSE;
        p = end;
        if (!unit_ms(&p, &scale))
            return GG_ERR_PARSE;
        total += value * scale;
        if (total > 1e12)
            return GG_ERR_PARSE;
    }
    *ms = (int64_t)(total + 0.5);
    return GG_OK;
}
