/*
 * duration.h - Go duration strings, as the API server sends in ?timeout= and
 * the configuration writes engine.timeout.
 */
#ifndef GG_DURATION_H
#define GG_DURATION_H

#include "util/gpuguard.h"

#include <stdint.h>

/*
 * Parse a Go duration ("10s", "1m30s", "500ms", "1.5s", "0").  Rounds to
 * milliseconds; GG_ERR_PARSE when malformed.
 */
enum gg_status duration_parse_ms(const char *text, int64_t *ms);

#endif
