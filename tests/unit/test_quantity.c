/*
 * test_quantity.c - unit tests for quantity.c (resource.Quantity).
 *
 * Most tables are apimachinery's own vectors from
 * pkg/api/resource/quantity_test.go, kept in its order and notation:
 * decQuantity(m, e, format) becomes {m, e, format}, the value m * 10^e.
 * Each value is checked exactly (at its own scale, at nano, at milli) and
 * through the canonical string.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "codec/quantity.h"

#define DSI QTY_DECIMAL_SI
#define BIN QTY_BINARY_SI
#define EXP QTY_DECIMAL_EXPONENT
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

#define KI 1024LL
#define MI (KI * KI)
#define GI (MI * KI)
#define TI (GI * KI)
#define PI (TI * KI)
#define EI (PI * KI)

/* fail_msg() with the case; keeps table failures readable. */
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail_msg(__VA_ARGS__);                                                                 \
    } while (0)

/* ceil(m * 10^(e - scale)) when it fits in int64: the oracle for values. */
static bool ceil_scaled(int64_t m, int e, int scale, int64_t *out)
{
    int shift = e - scale;
    int64_t x = m;
    for (; shift > 0; shift--)
        if (__builtin_mul_overflow(x, 10, &x))
            return false;
    if (shift < -18) {
        *out = m > 0;
        return true;
    }
    if (shift < 0) {
        int64_t d = 1;
        for (; shift < 0; shift++)
            d *= 10;
        int64_t q = x / d;
        if (x % d > 0)
            q++; /* C truncates toward zero: only positives need the step */
        x = q;
    }
    *out = x;
    return true;
}

/* qty_canonical(in) must be want, and canonical strings must be fixed points. */
static void check_canonical(const char *in, const char *want)
{
    char got[QTY_STR_MAX], again[QTY_STR_MAX];
    struct gg_err err = {{0}};
    enum gg_status st = qty_canonical(in, got, sizeof(got), &err);
    EXPECT(st == GG_OK, "canonical(\"%s\"): status %d: %s", in, st, err.msg);
    EXPECT(strcmp(got, want) == 0, "canonical(\"%s\") = \"%s\", want \"%s\"", in, got, want);
    st = qty_canonical(got, again, sizeof(again), &err);
    EXPECT(st == GG_OK && strcmp(again, got) == 0, "canonical(\"%s\") = \"%s\", not a fixed point",
           got, again);
}

/* s must parse to exactly m * 10^e in format f. */
static void check_value(const char *s, int64_t m, int e, enum qty_format f)
{
    struct gg_err err = {{0}};
    enum qty_format got_f = (enum qty_format)99;
    int64_t v = 0, want;

    enum gg_status st = qty_parse_scaled(s, e, &v, &got_f, &err);
    EXPECT(st == GG_OK, "\"%s\" at scale %d: status %d: %s", s, e, st, err.msg);
    EXPECT(v == m, "\"%s\" at scale %d: %lld, want %lld", s, e, (long long)v, (long long)m);
    EXPECT(got_f == f, "\"%s\": format %s, want %s", s, qty_format_name(got_f), qty_format_name(f));

    static const int scales[] = {-9, -3, 0};
    for (size_t i = 0; i < NELEM(scales); i++) {
        bool fits = ceil_scaled(m, e, scales[i], &want);
        v = 0;
        if (scales[i] == -3)
            st = qty_parse(s, &v, NULL, &err);
        else
            st = qty_parse_scaled(s, scales[i], &v, NULL, &err);
        if (fits)
            EXPECT(st == GG_OK && v == want, "\"%s\" at scale %d: status %d, %lld, want %lld", s,
                   scales[i], st, (long long)v, (long long)want);
        else
            EXPECT(st == GG_ERR_TOOBIG, "\"%s\" at scale %d: status %d, want TOOBIG", s, scales[i],
                   st);
    }

    char canon[QTY_STR_MAX];
    st = qty_format_scaled(m, e, f, canon, sizeof(canon));
    EXPECT(st == GG_OK, "format(%lld, %d): status %d", (long long)m, e, st);
    check_canonical(s, canon);
}

/* ---- TestQuantityParse ------------------------------------------------- */

struct parse_case {
    const char *in;
    int64_t m;
    int e;
    enum qty_format format;
};

static const struct parse_case parse_cases[] = {
    {"0", 0, 0, DSI},
    {"0n", 0, 0, DSI},
    {"0u", 0, 0, DSI},
    {"0m", 0, 0, DSI},
    {"0Ki", 0, 0, BIN},
    {"0k", 0, 0, DSI},
    {"0Mi", 0, 0, BIN},
    {"0M", 0, 0, DSI},
    {"0Gi", 0, 0, BIN},
    {"0G", 0, 0, DSI},
    {"0Ti", 0, 0, BIN},
    {"0T", 0, 0, DSI},

    /* Quantity less numbers are allowed */
    {"1", 1, 0, DSI},

    /* Binary suffixes */
    {"1Ki", KI, 0, BIN},
    {"8Ki", 8 * KI, 0, BIN},
    {"7Mi", 7 * MI, 0, BIN},
    {"6Gi", 6 * GI, 0, BIN},
    {"5Ti", 5 * TI, 0, BIN},
    {"4Pi", 4 * PI, 0, BIN},
    {"3Ei", 3 * EI, 0, BIN},
    {"10Ti", 10 * TI, 0, BIN},
    {"100Ti", 100 * TI, 0, BIN},

    /* Decimal suffixes */
    {"5n", 5, -9, DSI},
    {"4u", 4, -6, DSI},
    {"3m", 3, -3, DSI},
    {"9", 9, 0, DSI},
    {"8k", 8, 3, DSI},
    {"50k", 5, 4, DSI},
    {"7M", 7, 6, DSI},
    {"6G", 6, 9, DSI},
    {"5T", 5, 12, DSI},
    {"40T", 4, 13, DSI},
    {"300T", 3, 14, DSI},
    {"2P", 2, 15, DSI},
    {"1E", 1, 18, DSI},

    /* Decimal exponents */
    {"1E-3", 1, -3, EXP},
    {"1e3", 1, 3, EXP},
    {"1E6", 1, 6, EXP},
    {"1e9", 1, 9, EXP},
    {"1E12", 1, 12, EXP},
    {"1e15", 1, 15, EXP},
    {"1E18", 1, 18, EXP},

    /* Nonstandard but still parsable */
    {"1e14", 1, 14, EXP},
    {"1e13", 1, 13, EXP},
    {"1e3", 1, 3, EXP},
    {"100.035k", 100035, 0, DSI},

    /* Things that look like floating point */
    {"0.001", 1, -3, DSI},
    {"0.0005k", 5, -1, DSI},
    {"0.005", 5, -3, DSI},
    {"0.05", 5, -2, DSI},
    {"0.5", 5, -1, DSI},
    {"0.00050k", 5, -1, DSI},
    {"0.00500", 5, -3, DSI},
    {"0.05000", 5, -2, DSI},
    {"0.50000", 5, -1, DSI},
    {"0.5e0", 5, -1, EXP},
    {"0.5e-1", 5, -2, EXP},
    {"0.5e-2", 5, -3, EXP},
    {"0.5e0", 5, -1, EXP},
    {"10.035M", 10035, 3, DSI},

    {"1.2e3", 12, 2, EXP},
    {"1.3E+6", 13, 5, EXP},
    {"1.40e9", 14, 8, EXP},
    {"1.53E12", 153, 10, EXP},
    {"1.6e15", 16, 14, EXP},
    {"1.7E18", 17, 17, EXP},

    {"9.01", 901, -2, DSI},
    {"8.1k", 81, 2, DSI},
    {"7.123456M", 7123456, 0, DSI},
    {"6.987654321G", 6987654321, 0, DSI},
    {"5.444T", 5444, 9, DSI},
    {"40.1T", 401, 11, DSI},
    {"300.2T", 3002, 11, DSI},
    {"2.5P", 25, 14, DSI},
    {"1.01E", 101, 16, DSI},

    /* Things that saturate/round */
    {"3.001n", 4, -9, DSI},
    {"1.1E-9", 2, -9, EXP},
    {"0.0000000001", 1, -9, DSI},
    {"0.0000000005", 1, -9, DSI},
    {"0.00000000050", 1, -9, DSI},
    {"0.5e-9", 1, -9, EXP},
    {"0.9n", 1, -9, DSI},
    {"0.00000012345", 124, -9, DSI},
    {"0.00000012354", 124, -9, DSI},
    {"9Ei", INT64_MAX, 0, BIN},
    {"9223372036854775807Ki", INT64_MAX, 0, BIN},
    {"12E", 12, 18, DSI},

    /* We'll accept fractional binary stuff, too. */
    {"100.035Ki", 10243584, -2, BIN},
    {"0.5Mi", MI / 2, 0, BIN},
    {"0.05Gi", 536870912, -1, BIN},
    {"0.025Ti", 274877906944, -1, BIN},

    /* Things written by trolls */
    {"0.000000000001Ki", 2, -9, DSI}, /* rounds up, changes format */
    {".001", 1, -3, DSI},
    {".0001k", 100, -3, DSI},
    {"1.", 1, 0, DSI},
    {"1.G", 1, 9, DSI},
};

/* Every vector as written, negated and with an explicit '+'. */
static void test_parse_vectors(void **state)
{
    (void)state;
    char buf[64];
    for (size_t i = 0; i < NELEM(parse_cases); i++) {
        const struct parse_case *c = &parse_cases[i];
        check_value(c->in, c->m, c->e, c->format);
        snprintf(buf, sizeof(buf), "-%s", c->in);
        check_value(buf, -c->m, c->e, c->format);
        snprintf(buf, sizeof(buf), "+%s", c->in);
        check_value(buf, c->m, c->e, c->format);
    }
}

/* ---- TestParseQuantity: values around the int64 range ---------------- */

struct big_case {
    const char *in;
    const char *canonical; /* NULL: the input is canonical */
    bool fits;             /* ceil(value) fits in int64 */
    int64_t units;         /* ...and is this */
};

static const struct big_case big_cases[] = {
    /* min/max 18 digits */
    {"-999999999999999999", NULL, true, -999999999999999999},
    {"999999999999999999", NULL, true, 999999999999999999},
    {"-999999999999999999.0", "-999999999999999999", true, -999999999999999999},
    {"999999999999999999.0", "999999999999999999", true, 999999999999999999},
    {"-999999999999999999.1", "-999999999999999999100m", true, -999999999999999999},
    {"999999999999999999.1", "999999999999999999100m", true, 1000000000000000000},

    /* min/max 19 digits */
    {"-9999999999999999999", NULL, false, 0},
    {"9999999999999999999", NULL, false, 0},
    {"-1E", NULL, true, -1000000000000000000},
    {"1E", NULL, true, 1000000000000000000},
    {"-1000000000000000000", "-1E", true, -1000000000000000000},
    {"1000000000000000000", "1E", true, 1000000000000000000},
    {"-9999999999999999999.0", "-9999999999999999999", false, 0},
    {"9999999999999999999.0", "9999999999999999999", false, 0},
    {"-1.0E", "-1E", true, -1000000000000000000},
    {"1.0E", "1E", true, 1000000000000000000},
    {"-1000000000000000000.0", "-1E", true, -1000000000000000000},
    {"1000000000000000000.0", "1E", true, 1000000000000000000},
    {"-9999999999999999999000m", "-9999999999999999999", false, 0},
    {"9999999999999999999000m", "9999999999999999999", false, 0},
    {"-9999999999999999999.1", "-9999999999999999999100m", false, 0},
    {"9999999999999999999.1", "9999999999999999999100m", false, 0},
    {"-1.0000000000000000001E", "-1000000000000000000100m", true, -1000000000000000000},
    {"1.0000000000000000001E", "1000000000000000000100m", true, 1000000000000000001},
    {"-1000000000000000000.1", "-1000000000000000000100m", true, -1000000000000000000},
    {"1000000000000000000.1", "1000000000000000000100m", true, 1000000000000000001},
    {"-1.000000000000000001E", "-1000000000000000001", true, -1000000000000000001},
    {"1.000000000000000001E", "1000000000000000001", true, 1000000000000000001},
    {"-1000000000000000001", NULL, true, -1000000000000000001},
    {"1000000000000000001", NULL, true, 1000000000000000001},

    /* min/max 20 digits */
    {"-10E", NULL, false, 0},
    {"10E", NULL, false, 0},
    {"-10000000000000000000", "-10E", false, 0},
    {"10000000000000000000", "10E", false, 0},
    {"-10.0E", "-10E", false, 0},
    {"10.0E", "10E", false, 0},
    {"-10000000000000000000.0", "-10E", false, 0},
    {"10000000000000000000.0", "10E", false, 0},
    {"-10000000000000000000000m", "-10E", false, 0},
    {"10000000000000000000000m", "10E", false, 0},
    {"-10.0000000000000000001E", "-10000000000000000000100m", false, 0},
    {"10.0000000000000000001E", "10000000000000000000100m", false, 0},
    {"-10000000000000000000.1", "-10000000000000000000100m", false, 0},
    {"10000000000000000000.1", "10000000000000000000100m", false, 0},
    {"-10.000000000000000001E", "-10000000000000000001", false, 0},
    {"10.000000000000000001E", "10000000000000000001", false, 0},
    {"-10000000000000000001", NULL, false, 0},
    {"10000000000000000001", NULL, false, 0},

    /* min/max int64 - 1 */
    {"-9223372036854775809", NULL, false, 0},
    {"9223372036854775806", NULL, true, 9223372036854775806},
    {"-9223372036854775809.0", "-9223372036854775809", false, 0},
    {"9223372036854775806.0", "9223372036854775806", true, 9223372036854775806},
    {"-9223372036854775809000m", "-9223372036854775809", false, 0},
    {"9223372036854775806000m", "9223372036854775806", true, 9223372036854775806},
    {"-9223372036854775809.1", "-9223372036854775809100m", false, 0},
    {"9223372036854775806.1", "9223372036854775806100m", true, INT64_MAX},

    /* min/max int64 */
    {"-9223372036854775808", NULL, true, INT64_MIN},
    {"9223372036854775807", NULL, true, INT64_MAX},
    {"-9223372036854775808.0", "-9223372036854775808", true, INT64_MIN},
    {"9223372036854775807.0", "9223372036854775807", true, INT64_MAX},
    {"-9223372036854775808000m", "-9223372036854775808", true, INT64_MIN},
    {"9223372036854775807000m", "9223372036854775807", true, INT64_MAX},
    {"-9223372036854775808.1", "-9223372036854775808100m", true, INT64_MIN},
    {"9223372036854775807.1", "9223372036854775807100m", false, 0},

    /* min/max int64 + 1 */
    {"-9223372036854775807", NULL, true, -INT64_MAX},
    {"9223372036854775808", NULL, false, 0},
    {"-9223372036854775807.0", "-9223372036854775807", true, -INT64_MAX},
    {"9223372036854775808.0", "9223372036854775808", false, 0},
    {"-9223372036854775807000m", "-9223372036854775807", true, -INT64_MAX},
    {"9223372036854775808000m", "9223372036854775808", false, 0},
    {"-9223372036854775807.1", "-9223372036854775807100m", true, -INT64_MAX},
    {"9223372036854775808.1", "9223372036854775808100m", false, 0},
};

static void test_parse_big(void **state)
{
    (void)state;
    for (size_t i = 0; i < NELEM(big_cases); i++) {
        const struct big_case *c = &big_cases[i];
        struct gg_err err = {{0}};
        enum qty_format f;
        int64_t v = 12345;

        check_canonical(c->in, c->canonical ? c->canonical : c->in);

        enum gg_status st = qty_parse_scaled(c->in, 0, &v, &f, &err);
        if (c->fits)
            EXPECT(st == GG_OK && v == c->units, "\"%s\": status %d, %lld, want %lld", c->in, st,
                   (long long)v, (long long)c->units);
        else
            EXPECT(st == GG_ERR_TOOBIG && v == 12345, "\"%s\": status %d, want TOOBIG", c->in, st);
        EXPECT(!c->fits || f == DSI, "\"%s\": format %s", c->in, qty_format_name(f));

        /* all of these are past int64 in milli-units */
        st = qty_parse(c->in, &v, NULL, &err);
        EXPECT(st == GG_ERR_TOOBIG, "\"%s\" milli: status %d, want TOOBIG", c->in, st);
        EXPECT(strstr(err.msg, c->in) && strstr(err.msg, "milli-units"), "\"%s\": message \"%s\"",
               c->in, err.msg);
    }
}

/* ---- TestQuantityString ------------------------------------------------ */

struct string_case {
    int64_t m;
    int e;
    enum qty_format format;
    const char *expect;
    const char *alternate; /* another spelling that canonicalises to expect */
};

static const struct string_case string_cases[] = {
    {GI, 0, BIN, "1Gi", "1024Mi"},
    {300 * MI, 0, BIN, "300Mi", "307200Ki"},
    {6 * KI, 0, BIN, "6Ki", ""},
    {1001 * GI, 0, BIN, "1001Gi", "1025024Mi"},
    {TI, 0, BIN, "1Ti", "1024Gi"},
    {5, 0, BIN, "5", "5000m"},
    {500, -3, BIN, "500m", "0.5"},
    {1, 9, DSI, "1G", "1000M"},
    {1000, 6, DSI, "1G", "0.001T"},
    {1000000, 3, DSI, "1G", ""},
    {1000000000, 0, DSI, "1G", ""},
    {1, -3, DSI, "1m", "1000u"},
    {80, -3, DSI, "80m", ""},
    {1080, -3, DSI, "1080m", "1.08"},
    {108, -2, DSI, "1080m", "1080000000n"},
    {10800, -4, DSI, "1080m", ""},
    {300, 6, DSI, "300M", ""},
    {1, 12, DSI, "1T", ""},
    /* DecimalSI has no suffix beyond "E": larger exponents use "e" */
    {1, 18, DSI, "1E", ""},
    {1, 21, DSI, "1e21", "1000E"},
    {5, 21, DSI, "5e21", "5000E"},
    {1, 24, DSI, "1e24", "1000000E"},
    {1234567, 6, DSI, "1234567M", ""},
    {1234567, -3, BIN, "1234567m", ""},
    {3, 3, DSI, "3k", ""},
    {1025, 0, BIN, "1025", ""},
    {0, 0, DSI, "0", ""},
    {0, 0, BIN, "0", ""},
    {1, 9, EXP, "1e9", ".001e12"},
    {1, -3, EXP, "1e-3", "0.001e0"},
    {1, -9, EXP, "1e-9", "1000e-12"},
    {80, -3, EXP, "80e-3", ""},
    {300, 6, EXP, "300e6", ""},
    {1, 12, EXP, "1e12", ""},
    {1, 3, EXP, "1e3", ""},
    {3, 3, EXP, "3e3", ""},
    {3, 3, DSI, "3k", ""},
    {0, 0, EXP, "0", "00"},
    {1, -9, DSI, "1n", ""},
    {80, -9, DSI, "80n", ""},
    {1080, -9, DSI, "1080n", ""},
    {108, -8, DSI, "1080n", ""},
    {10800, -10, DSI, "1080n", ""},
    {1, -6, DSI, "1u", ""},
    {80, -6, DSI, "80u", ""},
    {1080, -6, DSI, "1080u", ""},
};

static void test_string_vectors(void **state)
{
    (void)state;
    for (size_t i = 0; i < NELEM(string_cases); i++) {
        const struct string_case *c = &string_cases[i];
        char got[QTY_STR_MAX], neg[64], alt[64];

        enum gg_status st = qty_format_scaled(c->m, c->e, c->format, got, sizeof(got));
        EXPECT(st == GG_OK && strcmp(got, c->expect) == 0,
               "format(%lld, %d, %s) = \"%s\", want \"%s\"", (long long)c->m, c->e,
               qty_format_name(c->format), got, c->expect);
        check_canonical(c->expect, c->expect);
        if (c->alternate[0])
            check_canonical(c->alternate, c->expect);
        if (c->m == 0)
            continue; /* never "-0" */

        snprintf(neg, sizeof(neg), "-%s", c->expect);
        st = qty_format_scaled(-c->m, c->e, c->format, got, sizeof(got));
        EXPECT(st == GG_OK && strcmp(got, neg) == 0, "format(%lld, %d) = \"%s\", want \"%s\"",
               (long long)-c->m, c->e, got, neg);
        check_canonical(neg, neg);
        if (c->alternate[0]) {
            snprintf(alt, sizeof(alt), "-%s", c->alternate);
            check_canonical(alt, neg);
        }
    }
}

/* ---- TestQuantityParseEmit --------------------------------------------- */

static void test_parse_emit(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"1Ki", "1Ki"},
        {"1Mi", "1Mi"},
        {"1Gi", "1Gi"},
        {"1024Mi", "1Gi"},
        {"1000M", "1G"},
        {".001Ki", "1024m"},
        {".000001Ki", "1024u"},
        {".000000001Ki", "1024n"},
        {".000000000001Ki", "2n"},
    };
    char in[64], want[64];
    for (size_t i = 0; i < NELEM(cases); i++) {
        check_canonical(cases[i][0], cases[i][1]);
        snprintf(in, sizeof(in), "-%s", cases[i][0]);
        snprintf(want, sizeof(want), "-%s", cases[i][1]);
        check_canonical(in, want);
    }
}

/* ---- TestMilliNewSet, TestNewSet, TestNewScaledSet, TestScaledValue ----- */

static void test_milli_new_set(void **state)
{
    (void)state;
    static const struct {
        int64_t milli;
        enum qty_format format;
        const char *expect;
        bool exact; /* false: the format changes, BinarySI -> DecimalSI */
    } cases[] = {
        {1, DSI, "1m", true},
        {1000, DSI, "1", true},
        {1234000, DSI, "1234", true},
        {1024, BIN, "1024m", false},
        {1000000, EXP, "1e3", true}, /* Go: an invalid format defaults to this */
        {1024 * 1024, BIN, "1048576m", false},
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        char got[QTY_STR_MAX];
        int64_t milli = 0;
        enum qty_format f;
        enum gg_status st = qty_format_milli(cases[i].milli, cases[i].format, got, sizeof(got));
        EXPECT(st == GG_OK && strcmp(got, cases[i].expect) == 0, "milli %lld: \"%s\", want \"%s\"",
               (long long)cases[i].milli, got, cases[i].expect);
        st = qty_parse(got, &milli, &f, NULL);
        EXPECT(st == GG_OK && milli == cases[i].milli, "round trip of \"%s\": %lld", got,
               (long long)milli);
        EXPECT(!cases[i].exact || f == cases[i].format, "round trip of \"%s\": format %s", got,
               qty_format_name(f));
    }
}

static void test_new_set(void **state)
{
    (void)state;
    static const struct {
        int64_t value;
        enum qty_format format;
        const char *expect;
    } cases[] = {
        {1, DSI, "1"},      {1000, DSI, "1k"},     {1234000, DSI, "1234k"},
        {1024, BIN, "1Ki"}, {1000000, EXP, "1e6"}, {1024 * 1024, BIN, "1Mi"},
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        char got[QTY_STR_MAX];
        int64_t v = 0;
        enum gg_status st = qty_format_scaled(cases[i].value, 0, cases[i].format, got, sizeof(got));
        EXPECT(st == GG_OK && strcmp(got, cases[i].expect) == 0, "%lld: \"%s\", want \"%s\"",
               (long long)cases[i].value, got, cases[i].expect);
        st = qty_format_milli(cases[i].value * 1000, cases[i].format, got, sizeof(got));
        EXPECT(st == GG_OK && strcmp(got, cases[i].expect) == 0, "%lld000m: \"%s\", want \"%s\"",
               (long long)cases[i].value, got, cases[i].expect);
        st = qty_parse_scaled(got, 0, &v, NULL, NULL);
        EXPECT(st == GG_OK && v == cases[i].value, "round trip of \"%s\": %lld", got, (long long)v);
    }
}

static void test_new_scaled_set(void **state)
{
    (void)state;
    static const struct {
        int64_t value;
        int scale;
        const char *expect;
    } cases[] = {
        {1, -9, "1n"}, {1000, -9, "1u"}, {1, -6, "1u"}, {1000, -6, "1m"},
        {1, -3, "1m"}, {1000, -3, "1"},  {1, 0, "1"},   {0, -9, "0"},
        {0, -6, "0"},  {0, -3, "0"},     {0, 0, "0"},
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        char got[QTY_STR_MAX];
        int64_t v = -1;
        enum gg_status st =
            qty_format_scaled(cases[i].value, cases[i].scale, DSI, got, sizeof(got));
        EXPECT(st == GG_OK && strcmp(got, cases[i].expect) == 0, "(%lld, %d): \"%s\", want \"%s\"",
               (long long)cases[i].value, cases[i].scale, got, cases[i].expect);
        st = qty_parse_scaled(got, cases[i].scale, &v, NULL, NULL);
        EXPECT(st == GG_OK && v == cases[i].value, "round trip of \"%s\": %lld", got, (long long)v);
    }
}

static void test_scaled_value(void **state)
{
    (void)state;
    static const struct {
        int from, to;
        int64_t expect;
    } cases[] = {
        {-9, -9, 1}, {-9, -6, 1},        {-9, -3, 1},         {-9, 0, 1},        {-6, -9, 1000},
        {-6, -6, 1}, {-6, -3, 1},        {-6, 0, 1},          {-3, -9, 1000000}, {-3, -6, 1000},
        {-3, -3, 1}, {-3, 0, 1},         {0, -9, 1000000000}, {0, -6, 1000000},  {0, -3, 1000},
        {0, 0, 1},   {2, -2, 100 * 100},
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        char s[QTY_STR_MAX];
        int64_t v = 0;
        assert_int_equal(qty_format_scaled(1, cases[i].from, DSI, s, sizeof(s)), GG_OK);
        enum gg_status st = qty_parse_scaled(s, cases[i].to, &v, NULL, NULL);
        EXPECT(st == GG_OK && v == cases[i].expect, "1e%d at scale %d: %lld, want %lld",
               cases[i].from, cases[i].to, (long long)v, (long long)cases[i].expect);
    }
}

/* TestQuantityRoundUp, positive half: RoundUp(scale) is ScaledValue's ceiling.
 * (Its negative half rounds away from zero; qty_parse_scaled takes the
 * ceiling, as MilliValue is documented to.) */
static void test_round_up(void **state)
{
    (void)state;
    static const struct {
        int scale;
        int64_t expect;
    } cases[] = {{-3, 9010}, {-2, 901}, {-1, 91}, {0, 10}, {1, 1}, {2, 1}};
    for (size_t i = 0; i < NELEM(cases); i++) {
        int64_t v = 0;
        assert_int_equal(qty_parse_scaled("9.01", cases[i].scale, &v, NULL, NULL), GG_OK);
        EXPECT(v == cases[i].expect, "9.01 at scale %d: %lld, want %lld", cases[i].scale,
               (long long)v, (long long)cases[i].expect);
    }
}

/* ---- grammar oddities apimachinery accepts ----------------------------- */

static void test_oddities(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        int64_t milli;
        enum qty_format format;
        const char *canonical;
    } cases[] = {
        /* TestParseQuantityString */
        {"0.025Ti", 27487790694400, BIN, "27487790694400m"},
        {"1.025Ti", 1126999418470400, BIN, "1126999418470400m"},
        {"-1.025Ti", -1126999418470400, BIN, "-1126999418470400m"},
        {".", 0, DSI, "0"},
        {"-.", 0, DSI, "0"},
        {"1E-3", 1, EXP, "1e-3"},
        /* an empty number is zero, even with a suffix (apimachinery#165) */
        {"+.", 0, DSI, "0"},
        {"-", 0, DSI, "0"},
        {"+", 0, DSI, "0"},
        {"k", 0, DSI, "0"},
        {"E", 0, DSI, "0"},
        {"Ki", 0, BIN, "0"},
        {"-Mi", 0, BIN, "0"},
        {"e3", 0, EXP, "0"},
        {".Gi", 0, BIN, "0"},
        /* leading zeros, signs, dots */
        {"00", 0, DSI, "0"},
        {"-0", 0, DSI, "0"},
        {"007", 7000, DSI, "7"},
        {"-007.50", -7500, DSI, "-7500m"},
        {"0000.0000", 0, DSI, "0"},
        {".5", 500, DSI, "500m"},
        {"1.Ki", 1024000, BIN, "1Ki"},
        {"+1", 1000, DSI, "1"},
        {"0.0Ki", 0, BIN, "0"},
        {"0.5Ki", 512000, BIN, "512"},
        {"-0.5Ki", -512000, BIN, "-512"},
        {"0.0001Ki", 103, DSI, "102400u"},
        {"1.5Gi", 1610612736000, BIN, "1536Mi"},
        {"1.1Ki", 1126400, BIN, "1126400m"},
        /* exponents as Go's strconv.ParseInt reads them */
        {"1E+3", 1000000, EXP, "1e3"},
        {"1e03", 1000000, EXP, "1e3"},
        {"1e-0", 1000, EXP, "1"},
        {"1e+0", 1000, EXP, "1"},
        {"2e1", 20000, EXP, "20"},
        {"15e-1", 1500, EXP, "1500e-3"},
        /* apimachinery would echo these verbatim (cached input); we canonicalise */
        {"01", 1000, DSI, "1"},
        {"1.500", 1500, DSI, "1500m"},
        {"1E3", 1000000, EXP, "1e3"},
        {"5Ki", 5120000, BIN, "5Ki"},
        {"+5Ki", 5120000, BIN, "5Ki"},
        {"100.035k", 100035000, DSI, "100035"},
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        int64_t milli = 12345;
        enum qty_format f = (enum qty_format)99;
        struct gg_err err = {{0}};
        enum gg_status st = qty_parse(cases[i].in, &milli, &f, &err);
        EXPECT(st == GG_OK, "\"%s\": status %d: %s", cases[i].in, st, err.msg);
        EXPECT(milli == cases[i].milli, "\"%s\": %lld, want %lld", cases[i].in, (long long)milli,
               (long long)cases[i].milli);
        EXPECT(f == cases[i].format, "\"%s\": format %s", cases[i].in, qty_format_name(f));
        check_canonical(cases[i].in, cases[i].canonical);
    }
}

/* ---- rounding up to nano, and to milli -------------------------------- */

/* head, then count copies of c, then tail, into buf. */
static const char *build(char *buf, size_t size, const char *head, char c, int count,
                         const char *tail)
{
    size_t n = strlen(head);
    assert_true(n + (size_t)count + strlen(tail) < size);
    memcpy(buf, head, n);
    memset(buf + n, c, (size_t)count);
    strcpy(buf + n + (size_t)count, tail);
    return buf;
}

static void check_round(const char *in, int64_t nano, int64_t milli)
{
    int64_t v = 0;
    struct gg_err err = {{0}};
    enum gg_status st = qty_parse_scaled(in, -9, &v, NULL, &err);
    EXPECT(st == GG_OK && v == nano, "\"%s\" nano: status %d (%s), %lld, want %lld", in, st,
           err.msg, (long long)v, (long long)nano);
    st = qty_parse(in, &v, NULL, &err);
    EXPECT(st == GG_OK && v == milli, "\"%s\" milli: status %d (%s), %lld, want %lld", in, st,
           err.msg, (long long)v, (long long)milli);
}

static void test_round_up_to_nano(void **state)
{
    (void)state;
    char a[512], b[512];

    check_round("0.9n", 1, 1);
    check_round("3.001n", 4, 1);
    check_round("1n", 1, 1);
    check_round("-1n", -1, 0); /* ceiling in milli: -0.000001m -> 0 */
    check_round("-0.9n", -1, 0);
    check_round("1.5m", 1500000, 2);
    check_round("-1.5m", -1500000, -1);
    check_round("999m", 999000000, 999);
    check_round("1.0001m", 1000100, 2);
    check_round("0.0000000001", 1, 1);
    check_round("0.000000000001Ki", 2, 1);
    check_round("0.000000001Ki", 1024, 1);
    check_round("1e-2147483648", 1, 1);

    /* 9765625e-19 Ki is exactly 1n; anything more is 2n, anything less 1n,
     * however far past the digits kept exactly the difference lies. */
    check_round("0.0000000000009765625Ki", 1, 1);
    check_round(build(a, sizeof(a), "0.0000000000009765625", '0', 200, "1Ki"), 2, 1);
    check_round(build(a, sizeof(a), "0.0000000000009765624", '9', 200, "Ki"), 1, 1);
    check_round(build(a, sizeof(a), "-0.0000000000009765625", '0', 200, "1Ki"), -2, 0);
    /* 1n / 2^60, exactly and give or take 1e-30 before the scaling: the digits
     * that decide it lie far below nano */
    check_round("0.000000000000000000000000000867361737988403547205962240695953369140625Ei", 1, 1);
    check_round("0.000000000000000000000000000867361737988403547206829602433941772687830962240695"
                "953369140625Ei",
                2, 1);
    check_round("0.000000000000000000000000000867361737988403547205094878957964965593419037759304"
                "046630859375Ei",
                1, 1);
    /* a remainder hundreds of digits down still rounds up */
    check_round(build(a, sizeof(a), "1.", '0', 300, "1"), 1000000001, 1001);
    check_round(build(a, sizeof(a), "0.", '0', 300, "1"), 1, 1);
    check_round(build(a, sizeof(a), "0.", '0', 300, ""), 0, 0);
    check_round(build(a, sizeof(a), "1", '0', 300, "e-300"), 1000000000, 1000);
    /* long but exact: 400 zeros then 5e-9 in the fraction position */
    snprintf(b, sizeof(b), "%se392", build(a, sizeof(a), "0.", '0', 400, "5"));
    check_round(b, 5, 1);
}

/* ---- errors ------------------------------------------------------------ */

static void test_invalid(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        /* TestQuantityParse's invalid list */
        {"1.1.M", "invalid quantity \"1.1.M\": unexpected '.' at offset 3"},
        {"1+1.0M", "invalid quantity \"1+1.0M\": unexpected '.' at offset 3"},
        {"0.1mi", "unknown suffix \"mi\""},
        {"0.1am", "unexpected 'a' at offset 3"},
        {"aoeu", "invalid quantity \"aoeu\": unexpected 'a' at offset 0"},
        {".5i", "unknown suffix \"i\""},
        {"1i", "unknown suffix \"i\""},
        {"-3.01i", "unknown suffix \"i\""},
        {"-3.01e-", "invalid quantity \"-3.01e-\": invalid exponent \"e-\""},
        {" 1", "unexpected whitespace at offset 0 (leading or trailing whitespace"},
        {"1 ", "unexpected whitespace at offset 1"},
        {"", "invalid quantity \"\": empty string"},
        /* more */
        {"1K", "invalid quantity \"1K\": unknown suffix \"K\""},
        {"mi", "unknown suffix \"mi\""},
        {"i", "unknown suffix \"i\""},
        {"K", "unknown suffix \"K\""},
        {"1e", "unknown suffix \"e\""},
        {"1e+", "invalid exponent \"e+\""},
        {"1ee3", "invalid exponent \"ee3\""},
        {"1Ee3", "invalid exponent \"Ee3\""},
        {"1e99999999999999999999", "invalid exponent"},
        {"1e9223372036854775808", "invalid exponent"},
        {"1e-9223372036854775809", "invalid exponent"},
        {"1KiB", "unexpected 'B' at offset 3"},
        {"1Kii", "unknown suffix \"Kii\""},
        {"1iK", "unknown suffix \"iK\""},
        {"--1", "unknown suffix \"-1\""},
        {"+-1", "unknown suffix \"-1\""},
        {"1..", "unexpected '.' at offset 2"},
        {"1.5.", "unexpected '.' at offset 3"},
        {"..5", "unexpected '.' at offset 1"},
        {"1 Ki", "unexpected whitespace at offset 1"},
        {"1 1", "unexpected whitespace at offset 1"},
        {"1\t", "invalid quantity \"1\\x09\": unexpected whitespace at offset 1"},
        {"\n1", "unexpected whitespace at offset 0"},
        {"0x10", "unexpected 'x' at offset 1"},
        {"1e3.5", "unexpected '.' at offset 3"},
        {"1e3e", "unexpected 'e' at offset 3"},
        {"1M3", "unknown suffix \"M3\""},
        {"1Ki3", "unknown suffix \"Ki3\""},
        {"1m-3", "unknown suffix \"m-3\""},
        {"Mi5", "unknown suffix \"Mi5\""},
        {"1E3i", "unexpected 'i' at offset 3"},
        {"1,5", "unexpected ',' at offset 1"},
        {"1_000", "unexpected '_' at offset 1"},
        {"1\xc2\xb5", "invalid quantity \"1\\xc2\\xb5\": unexpected byte 0xc2 at offset 1"},
        {"\"1\"", "invalid quantity \"\\\"1\\\"\": unexpected '\"' at offset 0"},
        {"1Gi ", "unexpected whitespace at offset 3"},
        {"NaN", "unexpected 'N' at offset 0"},
        {"Inf", "unexpected 'I' at offset 0"},
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        const char *in = cases[i][0], *want = cases[i][1];
        int64_t milli = 12345;
        enum qty_format f = (enum qty_format)99;
        struct gg_err err = {{0}};
        enum gg_status st = qty_parse(in, &milli, &f, &err);
        EXPECT(st == GG_ERR_PARSE, "\"%s\": status %d, want PARSE", in, st);
        EXPECT(milli == 12345 && f == (enum qty_format)99, "\"%s\": out-params written", in);
        EXPECT(strstr(err.msg, want) != NULL, "\"%s\": message \"%s\", want \"%s\"", in, err.msg,
               want);

        char out[QTY_STR_MAX] = "untouched";
        st = qty_canonical(in, out, sizeof(out), NULL);
        EXPECT(st == GG_ERR_PARSE && strcmp(out, "untouched") == 0, "canonical(\"%s\"): %d", in,
               st);
    }
}

static void test_too_big(void **state)
{
    (void)state;
    char a[1100], b[300];
    /* value past int64 milli-units; the canonical form still exists */
    static const char *const milli_cases[][2] = {
        {"12E", "12E"},
        {"8Ei", "9223372036854775807"},
        {"9Ei", "9223372036854775807"},
        {"-9Ei", "-9223372036854775807"},
        {"9Pi", "9Pi"},
        {"9223372036854775808m", "9223372036854775808m"},
        {"-9223372036854775809m", "-9223372036854775809m"},
        {"9223372036854775.8071", "9223372036854775807100u"},
        {"1e2147483647", "10e2147483646"},
        {"1000E", "1e21"},
    };
    for (size_t i = 0; i < NELEM(milli_cases); i++) {
        int64_t milli = 12345;
        struct gg_err err = {{0}};
        enum gg_status st = qty_parse(milli_cases[i][0], &milli, NULL, &err);
        EXPECT(st == GG_ERR_TOOBIG && milli == 12345, "\"%s\": status %d", milli_cases[i][0], st);
        EXPECT(strstr(err.msg, "does not fit in int64"), "\"%s\": message \"%s\"",
               milli_cases[i][0], err.msg);
        check_canonical(milli_cases[i][0], milli_cases[i][1]);
    }

    /* the edges that do fit */
    static const struct {
        const char *in;
        int64_t milli;
    } fits[] = {
        {"9223372036854775807m", INT64_MAX},   {"-9223372036854775808m", INT64_MIN},
        {"9223372036854775.807", INT64_MAX},   {"-9223372036854775.808", INT64_MIN},
        {"-9223372036854775.8081", INT64_MIN}, /* ceiling */
        {"8Pi", 9007199254740992000},          {"8191.99Ti", 9007188259624714240},
    };
    for (size_t i = 0; i < NELEM(fits); i++) {
        int64_t milli = 0;
        struct gg_err err = {{0}};
        enum gg_status st = qty_parse(fits[i].in, &milli, NULL, &err);
        EXPECT(st == GG_OK && milli == fits[i].milli, "\"%s\": status %d (%s), %lld", fits[i].in,
               st, err.msg, (long long)milli);
    }

    /* limits of this implementation (apimachinery has none) */
    const char *const limits[] = {
        "1e2147483648",
        "1e-2147483649",
        "1e-9223372036854775808",
        "1e9223372036854775807",
        build(a, sizeof(a), "1", '1', QTY_MAX_DIGITS, ""),
        /* found by fuzzing: the canonical forms would not parse back */
        "1000e2147483647", /* "10e2147483649" */
        build(b, sizeof(b), "1", '1', QTY_MAX_DIGITS - 9,
              ".00000000000000000000000000000000000000000000000000000000000000000000001"),
    };
    for (size_t i = 0; i < NELEM(limits); i++) {
        int64_t milli = 12345;
        char out[QTY_STR_MAX] = "untouched";
        struct gg_err err = {{0}};
        enum gg_status st = qty_parse(limits[i], &milli, NULL, &err);
        EXPECT(st == GG_ERR_TOOBIG && milli == 12345, "\"%.20s\": status %d", limits[i], st);
        EXPECT(strstr(err.msg, "exponent out of range") || strstr(err.msg, "significant digits"),
               "\"%.20s\": message \"%s\"", limits[i], err.msg);
        st = qty_canonical(limits[i], out, sizeof(out), &err);
        EXPECT(st == GG_ERR_TOOBIG && strcmp(out, "untouched") == 0, "canonical(\"%.20s\"): %d",
               limits[i], st);
    }

    /* at the digit limit: long, exact, with no rounding */
    build(a, sizeof(a), "1", '1', QTY_MAX_DIGITS - 1, "");
    check_canonical(a, a);
    build(a, sizeof(a), "1", '0', 1000, "");
    check_canonical(a, "10e999");
    /* a long message is cut, not overflowed */
    struct gg_err err = {{0}};
    int64_t milli;
    build(a, sizeof(a), "1", '1', 300, "x");
    assert_int_equal(qty_parse(a, &milli, NULL, &err), GG_ERR_PARSE);
    assert_non_null(strstr(err.msg, "...\": unexpected 'x' at offset 301"));
}

/* ---- qty_format_* edges ------------------------------------------------- */

static void test_format_edges(void **state)
{
    (void)state;
    static const struct {
        int64_t value;
        int scale;
        enum qty_format format;
        const char *expect;
    } cases[] = {
        {1500, -3, DSI, "1500m"},
        {1000000, -3, DSI, "1k"},
        {1536 * MI * 1000, -3, BIN, "1536Mi"},
        {0, -3, BIN, "0"},
        {1500, -3, EXP, "1500e-3"},
        {1024000, -3, BIN, "1Ki"},
        {-1024000, -3, BIN, "-1Ki"},
        {1023000, -3, BIN, "1023"},
        {1024500, -3, BIN, "1024500m"},
        {INT64_MIN, -3, BIN, "-9223372036854775808m"},
        {INT64_MAX, -3, EXP, "9223372036854775807e-3"},
        {INT64_MAX, 0, BIN, "9223372036854775807"},
        {INT64_MIN, 0, BIN, "-8Ei"},
        {1, 30, BIN, "931322574615478515625Gi"},
        /* past Ei the rest stays in the number (apimachinery drops the suffix) */
        {4611686018427387904, 9, BIN, "4000000000Ei"},
        {1, -12, DSI, "1e-12"},
        {1, -12, EXP, "1e-12"},
        {12, 18, DSI, "12E"},
        {120, 18, DSI, "120E"},
        {1200, 18, DSI, "1200E"},
        {12000, 18, DSI, "12e21"},
        {1, INT_MAX, EXP, "10e2147483646"},
        {1, INT_MIN, DSI, "10e-2147483649"},
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        char got[QTY_STR_MAX];
        enum gg_status st =
            qty_format_scaled(cases[i].value, cases[i].scale, cases[i].format, got, sizeof(got));
        EXPECT(st == GG_OK && strcmp(got, cases[i].expect) == 0,
               "format(%lld, %d, %s): status %d \"%s\", want \"%s\"", (long long)cases[i].value,
               cases[i].scale, qty_format_name(cases[i].format), st, got, cases[i].expect);
    }

    /* the buffer must hold the string and its NUL; out is untouched otherwise */
    char small[8] = "abcdefg";
    assert_int_equal(qty_format_milli(1500, DSI, small, 5), GG_ERR_TOOBIG);
    assert_string_equal(small, "abcdefg");
    assert_int_equal(qty_format_milli(1500, DSI, small, 0), GG_ERR_TOOBIG);
    assert_int_equal(qty_format_milli(1500, DSI, small, 6), GG_OK);
    assert_string_equal(small, "1500m");
    assert_int_equal(qty_format_milli(1, (enum qty_format)7, small, sizeof(small)), GG_ERR_INVALID);
    assert_int_equal(qty_format_milli(1, DSI, NULL, 8), GG_ERR_INVALID);

    struct gg_err err = {{0}};
    strcpy(small, "abcdefg");
    assert_int_equal(qty_canonical("1.5", small, 5, &err), GG_ERR_TOOBIG);
    assert_string_equal(small, "abcdefg");
    assert_non_null(strstr(err.msg, "does not fit in 5 bytes"));
    assert_int_equal(qty_canonical("1.5", NULL, 5, &err), GG_ERR_INVALID);

    int64_t v;
    assert_int_equal(qty_parse(NULL, &v, NULL, &err), GG_ERR_INVALID);
    assert_int_equal(qty_parse("1", NULL, NULL, &err), GG_ERR_INVALID);
    assert_int_equal(qty_parse("1", &v, NULL, NULL), GG_OK); /* format and err optional */
    assert_int_equal(v, 1000);

    assert_string_equal(qty_format_name(DSI), "DecimalSI");
    assert_string_equal(qty_format_name(BIN), "BinarySI");
    assert_string_equal(qty_format_name(EXP), "DecimalExponent");
    assert_string_equal(qty_format_name((enum qty_format)7), "unknown");
}

/* Every int64 milli value at the edges round-trips through its string. */
static void test_milli_round_trip(void **state)
{
    (void)state;
    static const int64_t values[] = {
        0,
        1,
        -1,
        999,
        1000,
        1001,
        1024,
        1536,
        1024000,
        1048576000,
        123456789,
        INT64_MAX,
        INT64_MIN,
        INT64_MAX - 1,
        -1000,
        -1024000,
        1000000000000,
        1099511627776000,
        1152921504606846976,
        9007199254740992000,
    };
    static const enum qty_format formats[] = {DSI, BIN, EXP};
    for (size_t i = 0; i < NELEM(values); i++) {
        for (size_t j = 0; j < NELEM(formats); j++) {
            char s[QTY_STR_MAX];
            int64_t back = 0;
            assert_int_equal(qty_format_milli(values[i], formats[j], s, sizeof(s)), GG_OK);
            enum gg_status st = qty_parse(s, &back, NULL, NULL);
            EXPECT(st == GG_OK && back == values[i], "%lld (%s) -> \"%s\" -> %lld",
                   (long long)values[i], qty_format_name(formats[j]), s, (long long)back);
            /* a BinarySI string without a suffix reads back as DecimalSI */
            if (formats[j] != BIN)
                check_canonical(s, s);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_vectors),    cmocka_unit_test(test_parse_big),
        cmocka_unit_test(test_string_vectors),   cmocka_unit_test(test_parse_emit),
        cmocka_unit_test(test_milli_new_set),    cmocka_unit_test(test_new_set),
        cmocka_unit_test(test_new_scaled_set),   cmocka_unit_test(test_scaled_value),
        cmocka_unit_test(test_round_up),         cmocka_unit_test(test_oddities),
        cmocka_unit_test(test_round_up_to_nano), cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_too_big),          cmocka_unit_test(test_format_edges),
        cmocka_unit_test(test_milli_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
