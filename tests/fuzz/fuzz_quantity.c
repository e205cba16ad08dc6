/*
 * fuzz_quantity.c - libFuzzer target for resource.Quantity parsing and
 * printing (quantity.c).
 *
 * The input (up to its first NUL) is a quantity string.  Its canonical form
 * must fit in QTY_STR_MAX, be its own canonical form, and parse to the same
 * value at every scale (or fail the same way); a parsed milli value printed
 * with qty_format_milli must parse back to itself.  The first ten bytes are
 * also read as (int64 value, format, scale) for qty_format_scaled, whose
 * output must parse back to the value at that scale (unless it is a BinarySI
 * magnitude over 2^63-1, which parsing caps, as documented).  A broken invariant
 * aborts.
 */
#include "codec/quantity.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_INPUT 512

static void check(int ok, const char *what, const char *input)
{
    if (!ok) {
        fprintf(stderr, "fuzz_quantity: %s (input \"%s\")\n", what, input);
        abort();
    }
}

static const int scales[] = {-9, -3, 0, 3, 9};

static void canonical(const char *s)
{
    char c1[1024], c2[1024];
    if (qty_canonical(s, c1, sizeof(c1), NULL) != GG_OK)
        return;
    check(strlen(c1) < QTY_STR_MAX, "canonical form longer than QTY_STR_MAX", s);
    check(qty_canonical(c1, c2, sizeof(c2), NULL) == GG_OK, "canonical form does not parse", s);
    check(strcmp(c1, c2) == 0, "canonical form is not its own canonical form", s);
    for (size_t i = 0; i < sizeof(scales) / sizeof(scales[0]); i++) {
        int64_t a = 0, b = 0;
        enum gg_status sa = qty_parse_scaled(s, scales[i], &a, NULL, NULL);
        enum gg_status sb = qty_parse_scaled(c1, scales[i], &b, NULL, NULL);
        check(sa == sb, "canonical form parses with another status", s);
        check(sa != GG_OK || a == b, "canonical form parses to another value", s);
    }
}

static void milli_round_trip(const char *s)
{
    int64_t milli = 0, back = 0;
    enum qty_format fmt;
    char out[QTY_STR_MAX];
    if (qty_parse(s, &milli, &fmt, NULL) != GG_OK)
        return;
    check(fmt == QTY_DECIMAL_SI || fmt == QTY_BINARY_SI || fmt == QTY_DECIMAL_EXPONENT,
          "unknown format", s);
    check(qty_format_milli(milli, fmt, out, sizeof(out)) == GG_OK, "milli value does not print", s);
    check(qty_parse(out, &back, NULL, NULL) == GG_OK && back == milli,
          "printed milli value does not parse back", s);
}

static void scaled_round_trip(const uint8_t *data, size_t size)
{
    if (size < 10)
        return;
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u = u << 8 | data[i];
    int64_t value = (int64_t)u;
    enum qty_format fmt = (enum qty_format)(data[8] % 4); /* 3 is not a format */
    int scale = (int8_t)data[9];
    char out[2048];
    enum gg_status st = qty_format_scaled(value, scale, fmt, out, sizeof(out));
    if (data[8] % 4 == 3) {
        check(st == GG_ERR_INVALID, "an unknown format printed", "(bytes)");
        return;
    }
    if (st != GG_OK || scale < -9 || scale > 18)
        return; /* finer than nano rounds; a long BinarySI may not fit */
    if (fmt == QTY_BINARY_SI) {
        /* Parsing caps a BinarySI magnitude at 2^63-1, as apimachinery does. */
        uint64_t mag = value < 0 ? 0 - (uint64_t)value : (uint64_t)value;
        for (int i = 0; i < scale; i++) {
            if (mag > (uint64_t)INT64_MAX / 10)
                return;
            mag *= 10;
        }
        if (mag > (uint64_t)INT64_MAX)
            return;
    }
    int64_t back = 0;
    check(qty_parse_scaled(out, scale, &back, NULL, NULL) == GG_OK && back == value,
          "a printed scaled value does not parse back", out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size copy, so ASan sees a read past the NUL. */
    size_t n = size < MAX_INPUT ? size : MAX_INPUT;
    char *s = malloc(n + 1);
    if (!s)
        return 0;
    memcpy(s, data, n);
    s[n] = '\0';
    canonical(s);
    milli_round_trip(s);
    scaled_round_trip(data, size);
    free(s);
    return 0;
}
