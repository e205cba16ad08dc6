/*
 * testjson.h - JSON helpers for unit tests: the values a test writes as
 * literals, parsed or the test fails.
 */
#ifndef GG_TEST_TESTJSON_H
#define GG_TEST_TESTJSON_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

/* The JSON value (any type) of text written in the test itself. */
static inline json_t *js(const char *text)
{
    json_error_t jerr;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &jerr);
    if (!v)
        fail_msg("bad JSON in the test itself: %s: %s", jerr.text, text);
    return v;
}

#endif
