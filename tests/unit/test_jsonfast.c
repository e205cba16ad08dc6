/*
 * test_jsonfast.c - jf_loadb against tables of valid and invalid texts, and
 * differentially against jansson's json_loadb on every tests/data JSON file,
 * on seeded random documents and on random mutations of both.
 *
 * Every input is first copied to a heap block of exactly its length, so
 * AddressSanitizer catches any read at or past text[len].  jansson is run
 * with JSON_DECODE_ANY because jf_loadb accepts a top-level scalar.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "util/jsonfast.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

/*** helpers ***/

static json_t *jf(const char *doc, size_t len, size_t max_depth, struct jf_error *err)
{
    char *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    memcpy(copy, doc, len);
    json_t *v = jf_loadb(copy, len, max_depth, err);
    free(copy);
    return v;
}

static json_t *jansson(const char *doc, size_t len, json_error_t *err)
{
    char *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    memcpy(copy, doc, len);
    json_t *v = json_loadb(copy, len, JSON_DECODE_ANY, err);
    free(copy);
    return v;
}

static char *dump(const json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    assert_non_null(s);
    return s;
}

/* Same JSON types everywhere, integer and real included. */
static int same_types(json_t *a, json_t *b)
{
    if (!a || !b)
        return a == b;
    if (json_typeof(a) != json_typeof(b))
        return 0;
    if (json_is_object(a)) {
        const char *k;
        json_t *va;
        if (json_object_size(a) != json_object_size(b))
            return 0;
        json_object_foreach(a, k, va)
        {
            json_t *vb = json_object_get(b, k);
            if (!vb || !same_types(va, vb))
                return 0;
        }
    } else if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b))
            return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!same_types(json_array_get(a, i), json_array_get(b, i)))
                return 0;
    } else if (json_is_real(a)) {
        return signbit(json_real_value(a)) == signbit(json_real_value(b));
    }
    return 1;
}

/* The document as a C literal, cut at 240 bytes, for failure messages. */
static const char *show(const char *doc, size_t len)
{
    static char out[1100];
    size_t o = 0;
    for (size_t i = 0; i < len && i < 240; i++) {
        unsigned char c = (unsigned char)doc[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, sizeof(out) - o, "\\x%02x", c);
    }
    if (len > 240)
        o += (size_t)snprintf(out + o, sizeof(out) - o, "...(%zu bytes)", len);
    out[o] = '\0';
    return out;
}

/* An error jf_loadb reported is well-formed: printable ASCII, in range. */
static void check_error(const struct jf_error *e, size_t len)
{
    assert_true(e->text[0] != '\0');
    for (const char *c = e->text; *c; c++)
        assert_true(*c >= 0x20 && *c < 0x7f);
    assert_true(e->position <= len);
    assert_true(e->line >= 1);
    assert_true(e->column >= 1);
}

struct diff_stats {
    unsigned ok, failed, nul_quirk;
};

static void differential(const char *doc, size_t len, const char *label, struct diff_stats *st);

/*
 * jansson's lexer loses a NUL byte that directly follows a number or a
 * literal (it ungets the byte into a NUL-terminated lookahead buffer, which
 * then reads as empty), so it accepts "[1\0]" as [1].  jf_loadb refuses
 * the NUL; without that byte both must agree.
 */
static int jansson_nul_quirk(const char *doc, size_t len, const struct jf_error *e,
                             const char *label, struct diff_stats *st)
{
    size_t at = e->position;
    if (at == 0 || at >= len || doc[at] != '\0')
        return 0;
    unsigned char prev = (unsigned char)doc[at - 1];
    if (!((prev >= '0' && prev <= '9') || ((prev | 0x20) >= 'a' && (prev | 0x20) <= 'z')))
        return 0;
    char *without = malloc(len);
    assert_non_null(without);
    memcpy(without, doc, at);
    memcpy(without + at, doc + at + 1, len - at - 1);
    struct diff_stats sub = {0, 0, 0};
    differential(without, len - 1, label, &sub);
    free(without);
    if (sub.failed)
        fail_msg("%s: json_loadb accepts \"%s\" but not without the NUL", label, show(doc, len));
    st->nul_quirk++;
    return 1;
}

/* Both parsers succeed with equal values (same types, same dump), or both fail. */
static void differential(const char *doc, size_t len, const char *label, struct diff_stats *st)
{
    struct jf_error e;
    json_error_t je;
    json_t *a = jf(doc, len, 0, &e);
    json_t *b = jansson(doc, len, &je);
    if (!a && b && jansson_nul_quirk(doc, len, &e, label, st)) {
        json_decref(b);
        return;
    }
    if (!a != !b)
        fail_msg("%s: jf_loadb %s, json_loadb %s on \"%s\"", label, a ? "accepts" : e.text,
                 b ? "accepts" : je.text, show(doc, len));
    if (a) {
        char *da = dump(a), *db = dump(b);
        if (!json_equal(a, b) || !same_types(a, b) || strcmp(da, db) != 0)
            fail_msg("%s: values differ on \"%s\": jf %.200s jansson %.200s", label, show(doc, len),
                     da, db);
        free(da);
        free(db);
        st->ok++;
    } else {
        check_error(&e, len);
        st->failed++;
    }
    json_decref(a);
    json_decref(b);
}

/*** valid texts ***/

static const struct {
    const char *doc;
    const char *want; /* compact dump, NULL: only compare with jansson */
} valid_cases[] = {
    {"{}", "{}"},
    {"[]", "[]"},
    {" [ ] \n", "[]"},
    {"\t\r\n {\n} \r\n\t", "{}"},
    {"\"\"", "\"\""},
    {"\"abc\"\n", "\"abc\""},
    {"0", "0"},
    {"-0", "0"},
    {"7", "7"},
    {"-12", "-12"},
    {"1.0", "1.0"},
    {"-0.0", "-0.0"},
    {"1e2", "100.0"},
    {"1E+2", "100.0"},
    {"1e-2", "0.01"},
    {"0e0", "0.0"},
    {"-0e-0", "-0.0"},
    {"0.5", "0.5"},
    {"123.456e-7", NULL},
    {"9223372036854775807", "9223372036854775807"},
    {"-9223372036854775808", "-9223372036854775808"},
    {"true", "true"},
    {"false", "false"},
    {"null", "null"},
    {"[true,false,null]", "[true,false,null]"},
    {"{\"a\":1,\"a\":2}", "{\"a\":2}"},
    {"{\"b\":1,\"a\":2,\"b\":3}", "{\"b\":3,\"a\":2}"},
    {"{\"a\":{\"x\":1},\"a\":[2]}", "{\"a\":[2]}"},
    {"{\"z\":1,\"y\":2,\"x\":3,\"w\":4,\"v\":5,\"u\":6,\"t\":7,\"s\":8,\"r\":9,\"q\":10}",
     "{\"z\":1,\"y\":2,\"x\":3,\"w\":4,\"v\":5,\"u\":6,\"t\":7,\"s\":8,\"r\":9,\"q\":10}"},
    {"[[[]]]", "[[[]]]"},
    {"[{},[],{}]", "[{},[],{}]"},
    {"{\"a\":{\"b\":[1,{\"c\":null}]}}", "{\"a\":{\"b\":[1,{\"c\":null}]}}"},
    {" \t\r\n{ \"a\" : [ 1 , 2 ] , \"b\" :{ } } \n", "{\"a\":[1,2],\"b\":{}}"},
    {"[\"\\\"\",\"\\\\\",\"\\/\"]", "[\"\\\"\",\"\\\\\",\"/\"]"},
    {"{\"\":\"\"}", "{\"\":\"\"}"},
    {"[1,2.5,-3e3,\"x\",{\"k\":[]}]", "[1,2.5,-3000.0,\"x\",{\"k\":[]}]"},
    {"\"\x7f\"", NULL},
    {"\"<\\u003cb\\u003e>\"", "\"<<b>>\""},
    {"[1e-400]", "[0.0]"},
    {"[-1e-400]", "[-0.0]"},
};

static void test_valid(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ELEMS(valid_cases); i++) {
        const char *doc = valid_cases[i].doc;
        struct jf_error e;
        json_t *v = jf(doc, strlen(doc), 0, &e);
        if (!v)
            fail_msg("valid case %zu \"%s\" rejected: %s", i, show(doc, strlen(doc)), e.text);
        if (valid_cases[i].want) {
            char *d = dump(v);
            if (strcmp(d, valid_cases[i].want) != 0)
                fail_msg("valid case %zu \"%s\": got %s want %s", i, doc, d, valid_cases[i].want);
            free(d);
        }
        json_decref(v);
        struct diff_stats st = {0, 0, 0};
        differential(doc, strlen(doc), "valid", &st);
        assert_int_equal(st.ok, 1);
    }
}

/* The text need not be NUL-terminated and bytes past len are never looked at. */
static void test_length_bounds(void **state)
{
    (void)state;
    static const struct {
        const char *buf;
        size_t len;
        const char *want;
    } cases[] = {
        {"[1,2]garbage", 5, "[1,2]"}, {"12345", 3, "123"},  {"\"ab\"cd", 4, "\"ab\""},
        {"truely", 4, "true"},        {"1.5e10", 3, "1.5"}, {"{\"a\":1}\n\n\n", 8, "{\"a\":1}"},
        {"[1]\0[2]", 3, "[1]"},
    };
    for (size_t i = 0; i < N_ELEMS(cases); i++) {
        struct jf_error e;
        json_t *v = jf(cases[i].buf, cases[i].len, 0, &e);
        assert_non_null(v);
        char *d = dump(v);
        assert_string_equal(d, cases[i].want);
        free(d);
        json_decref(v);
    }
    /* NULL err is allowed; NULL text is an error */
    assert_null(jf_loadb("[", 1, 0, NULL));
    struct jf_error e;
    assert_null(jf_loadb(NULL, 3, 0, &e));
    assert_string_equal(e.text, "wrong arguments");
    /* err untouched on success */
    memset(&e, 0x5a, sizeof(e));
    json_t *v = jf_loadb("1", 1, 0, &e);
    assert_non_null(v);
    json_decref(v);
    assert_int_equal(e.line, 0x5a5a5a5a);
}

/* jansson skips a NUL right after a number or literal; jf_loadb refuses it. */
static void test_jansson_nul_quirk(void **state)
{
    (void)state;
    static const struct {
        const char *doc;
        size_t len;
    } cases[] = {{"[1\0]", 4}, {"true\0", 5}, {"[null\0,2.5\0]", 12}, {"{\"a\":-7\0}", 9}};
    struct diff_stats st = {0, 0, 0};
    for (size_t i = 0; i < N_ELEMS(cases); i++) {
        struct jf_error e;
        assert_null(jf(cases[i].doc, cases[i].len, 0, &e));
        differential(cases[i].doc, cases[i].len, "NUL quirk", &st);
    }
    assert_int_equal(st.nul_quirk, N_ELEMS(cases));
}

/*** invalid texts ***/

static const struct {
    const char *doc;
    size_t len;       /* 0: strlen(doc) */
    const char *text; /* exact error text; NULL: any */
    int line, column; /* 0: not checked */
} invalid_cases[] = {
    /* structure */
    {"", 0, "premature end of input", 1, 1},
    {"  \n ", 0, "premature end of input", 2, 2},
    {"[", 0, "premature end of input", 1, 2},
    {"[1", 0, "',' or ']' expected near end of input", 1, 3},
    {"{", 0, "string or '}' expected near end of input", 1, 2},
    {"{\"a\"", 0, "':' expected near end of input", 1, 5},
    {"{\"a\":", 0, "premature end of input", 1, 6},
    {"{\"a\":1", 0, "',' or '}' expected near end of input", 1, 7},
    {"[1,]", 0, "unexpected character near ']'", 1, 4},
    {"[,1]", 0, "unexpected character near ','", 1, 2},
    {"[1 2]", 0, "',' or ']' expected near '2'", 1, 4},
    {"[1,,2]", 0, "unexpected character near ','", 1, 4},
    {"{\"a\":1,}", 0, "string expected near '}'", 1, 8},
    {"{,}", 0, "string or '}' expected near ','", 1, 2},
    {"{\"a\" 1}", 0, "':' expected near '1'", 1, 6},
    {"{\"a\",1}", 0, "':' expected near ','", 1, 5},
    {"{\"a\"::1}", 0, "unexpected character near ':'", 1, 6},
    {"{\"a\":}", 0, "unexpected character near '}'", 1, 6},
    {"{a:1}", 0, "string or '}' expected near 'a'", 1, 2},
    {"{'a':1}", 0, "string or '}' expected near '''", 1, 2},
    {"{\"a\":1 \"b\":2}", 0, "',' or '}' expected near '\"'", 1, 8},
    {"{\"a\":1]", 0, "',' or '}' expected near ']'", 1, 7},
    {"[1}", 0, "',' or ']' expected near '}'", 1, 3},
    {"[1:2]", 0, "',' or ']' expected near ':'", 1, 3},
    {"[1]]", 0, "end of file expected after the value", 1, 4},
    {"[1] x", 0, "end of file expected after the value", 1, 5},
    {"{} {}", 0, "end of file expected after the value", 1, 4},
    {"1 2", 0, "end of file expected after the value", 1, 3},
    {"\"a\" \"b\"", 0, "end of file expected after the value", 1, 5},
    {"[1]\0", 4, "end of file expected after the value", 1, 4},
    {"\0", 1, "unexpected character near '\\x00'", 1, 1},
    {"[\x0c]", 0, "unexpected character near '\\x0c'", 1, 2},
    {"[\xc2\xa0 1]", 0, "unexpected character near '\\xc2\\xa0'", 1, 2},
    {"\xef\xbb\xbf{}", 0, "unexpected character near '\\xef\\xbb\\xbf'", 1, 1},
    {"[1] // c", 0, "end of file expected after the value", 1, 5},
    {"/* c */ [1]", 0, "unexpected character near '/'", 1, 1},
    {"[\"a\"\"b\"]", 0, "',' or ']' expected near '\"'", 1, 5},
    {"'single'", 0, "unexpected character near '''", 1, 1},
    {"(1)", 0, "unexpected character near '('", 1, 1},
    {"]", 0, "unexpected character near ']'", 1, 1},
    /* literals */
    {"tru", 0, "invalid literal near 'tru'", 1, 1},
    {"[tru]", 0, "invalid literal near 'tru'", 1, 2},
    {"nul", 0, "invalid literal near 'nul'", 1, 1},
    {"[nulx]", 0, "invalid literal near 'nulx'", 1, 2},
    {"True", 0, "invalid literal near 'True'", 1, 1},
    {"NaN", 0, "invalid literal near 'NaN'", 1, 1},
    {"Infinity", 0, "invalid literal near 'Infinity'", 1, 1},
    {"undefined", 0, "invalid literal near 'undefined'", 1, 1},
    {"nulll", 0, "end of file expected after the value", 1, 5},
    {"truefalse", 0, "end of file expected after the value", 1, 5},
    {"[true1]", 0, "',' or ']' expected near '1'", 1, 6},
    /* numbers */
    {"01", 0, "invalid number near '01'", 1, 1},
    {"[00]", 0, "invalid number near '00'", 1, 2},
    {"-01", 0, "invalid number near '-01'", 1, 1},
    {"-", 0, "invalid number near '-'", 1, 1},
    {"[-]", 0, "invalid number near '-'", 1, 2},
    {"--1", 0, "invalid number near '--1'", 1, 1},
    {"-Infinity", 0, "invalid number near '-'", 1, 1},
    {"1.", 0, "invalid number near '1.'", 1, 1},
    {"[1.]", 0, "invalid number near '1.'", 1, 2},
    {"1.e5", 0, "invalid number near '1.e5'", 1, 1},
    {"1e", 0, "invalid number near '1e'", 1, 1},
    {"1e+", 0, "invalid number near '1e+'", 1, 1},
    {"[1E-]", 0, "invalid number near '1E-'", 1, 2},
    {"-.5", 0, "invalid number near '-.5'", 1, 1},
    {".5", 0, "unexpected character near '.'", 1, 1},
    {"+1", 0, "unexpected character near '+'", 1, 1},
    {"0x10", 0, "end of file expected after the value", 1, 2},
    {"1.5e5.3", 0, "end of file expected after the value", 1, 6},
    {"[1.2.3]", 0, "',' or ']' expected near '.'", 1, 5},
    {"[1e1e1]", 0, "',' or ']' expected near 'e'", 1, 5},
    {"9223372036854775808", 0, "too big integer", 1, 1},
    {"-9223372036854775809", 0, "too big negative integer", 1, 1},
    {"[123456789012345678901234567890]", 0, "too big integer", 1, 2},
    {"{\"n\":-99999999999999999999}", 0, "too big negative integer", 1, 6},
    {"1e309", 0, "real number overflow", 1, 1},
    {"[-1e400]", 0, "real number overflow", 1, 2},
    {"1.7976931348623159e308", 0, "real number overflow", 1, 1},
    /* strings */
    {"\"abc", 0, "unterminated string", 1, 1},
    {"[\"abc]", 0, "unterminated string", 1, 2},
    {"\"\\", 0, "unterminated string", 1, 1},
    {"\"\\\"", 0, "unterminated string", 1, 1},
    {"\"\\x\"", 0, "invalid escape near '\\x'", 1, 2},
    {"\"\\a\"", 0, "invalid escape near '\\a'", 1, 2},
    {"\"\\U0041\"", 0, "invalid escape near '\\U'", 1, 2},
    {"\"ab\\'\"", 0, "invalid escape near '\\''", 1, 4},
    {"\"\\u12G4\"", 0, "invalid escape near '\\u12G4'", 1, 2},
    {"\"\\u12\"", 0, "invalid escape near '\\u12\"'", 1, 2},
    {"\"\\u", 0, "invalid escape near '\\u'", 1, 2},
    {"\"\\uD800\"", 0, "invalid Unicode '\\uD800'", 1, 2},
    {"\"\\ud800\"", 0, "invalid Unicode '\\uD800'", 1, 2},
    {"\"\\uDBFFx\"", 0, "invalid Unicode '\\uDBFF'", 1, 2},
    {"\"\\uDC00\"", 0, "invalid Unicode '\\uDC00'", 1, 2},
    {"\"a\\uDFFF\\uD800\"", 0, "invalid Unicode '\\uDFFF'", 1, 3},
    {"\"\\uD800\\u0041\"", 0, "invalid Unicode '\\uD800\\u0041'", 1, 2},
    {"\"\\uD800\\uD800\"", 0, "invalid Unicode '\\uD800\\uD800'", 1, 2},
    {"\"\\uD800\\n\"", 0, "invalid Unicode '\\uD800'", 1, 2},
    {"{\"\\uD800\":1}", 0, "invalid Unicode '\\uD800'", 1, 3},
    {"\"\\u0000\"", 0, "\\u0000 is not allowed in strings", 1, 2},
    {"\"a\\u0000b\"", 0, "\\u0000 is not allowed in strings", 1, 3},
    {"{\"\\u0000\":1}", 0, "\\u0000 is not allowed in strings", 1, 3},
    {"\"a\x01\"", 0, "control character 0x01 in string", 1, 3},
    {"\"a\nb\"", 0, "control character 0x0a in string", 1, 3},
    {"\"\t\"", 0, "control character 0x09 in string", 1, 2},
    {"\"\x1f\"", 0, "control character 0x1f in string", 1, 2},
    {"\"a\0b\"", 5, "control character 0x00 in string", 1, 3},
    {"{\"k\x02\":1}", 0, "control character 0x02 in string", 1, 4},
    {"\"\xc3\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\xc3", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\xc0\xaf\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\xc1\xbf\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\xe0\x80\xaf\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\xe0\x9f\xbf\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\xed\xa0\x80\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\xed\xbf\xbf\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\xf0\x80\x80\xaf\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\xf0\x8f\xbf\xbf\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\xf4\x90\x80\x80\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\xf5\x80\x80\x80\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\x80\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\xbf\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\xff\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\xfe\xff\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\xe2\x82\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"\xe2\x82\xac\xe2\x28\xa1\"", 0, "invalid UTF-8 in string", 1, 3},
    {"\"\xf0\x9f\x9a\"", 0, "invalid UTF-8 in string", 1, 2},
    {"\"abcdefghijklmnopqrstuvwxyz\xc3\x28\"", 0, "invalid UTF-8 in string", 1, 28},
    /* positions: lines, UTF-8 columns, byte offsets */
    {"{\n  \"a\": [1,\n  2,,]\n}", 0, "unexpected character near ','", 3, 5},
    {"[\"\xc3\xa9\xc3\xa9\", x]", 0, "invalid literal near 'x'", 1, 8},
    {"[\r\n\r\n  @]", 0, "unexpected character near '@'", 3, 3},
};

static void test_invalid(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ELEMS(invalid_cases); i++) {
        const char *doc = invalid_cases[i].doc;
        size_t len = invalid_cases[i].len ? invalid_cases[i].len : strlen(doc);
        struct jf_error e;
        memset(&e, 0, sizeof(e));
        json_t *v = jf(doc, len, 0, &e);
        if (v)
            fail_msg("invalid case %zu \"%s\" accepted", i, show(doc, len));
        check_error(&e, len);
        if (invalid_cases[i].text && strcmp(e.text, invalid_cases[i].text) != 0)
            fail_msg("invalid case %zu \"%s\": got \"%s\" want \"%s\"", i, show(doc, len), e.text,
                     invalid_cases[i].text);
        if (invalid_cases[i].line &&
            (e.line != invalid_cases[i].line || e.column != invalid_cases[i].column))
            fail_msg("invalid case %zu \"%s\": at %d:%d want %d:%d", i, show(doc, len), e.line,
                     e.column, invalid_cases[i].line, invalid_cases[i].column);
        /* jansson refuses every one of them too */
        json_error_t je;
        json_t *j = jansson(doc, len, &je);
        if (j)
            fail_msg("invalid case %zu \"%s\": json_loadb accepts it", i, show(doc, len));
    }
}

/* Byte offsets of a few errors. */
static void test_error_position(void **state)
{
    (void)state;
    static const struct {
        const char *doc;
        size_t position;
    } cases[] = {
        {"", 0},
        {"[1,]", 3},
        {"[\"\xc3\xa9\xc3\xa9\", x]", 9},
        {"{\n  \"a\": [1,\n  2,,]\n}", 17},
        {"\"abc", 0},
        {"[1] x", 4},
    };
    for (size_t i = 0; i < N_ELEMS(cases); i++) {
        struct jf_error e;
        assert_null(jf(cases[i].doc, strlen(cases[i].doc), 0, &e));
        assert_int_equal(e.position, cases[i].position);
    }
}

/*** strings ***/

static void test_unicode_and_escapes(void **state)
{
    (void)state;
    static const struct {
        const char *doc;
        const char *want;
        size_t want_len;
    } cases[] = {
        {"\"\\u00e9\"", "\xc3\xa9", 2},
        {"\"\\u00E9\"", "\xc3\xa9", 2},
        {"\"\\u0041\\u0062\"", "Ab", 2},
        {"\"\\u0001\"", "\x01", 1},
        {"\"\\u007f\x7f\"", "\x7f\x7f", 2},
        {"\"\\u0080\"", "\xc2\x80", 2},
        {"\"\\u07FF\"", "\xdf\xbf", 2},
        {"\"\\u0800\"", "\xe0\xa0\x80", 3},
        {"\"\\u20AC\"", "\xe2\x82\xac", 3},
        {"\"\\uD7FF\"", "\xed\x9f\xbf", 3},
        {"\"\\uE000\"", "\xee\x80\x80", 3},
        {"\"\\uFEFF\"", "\xef\xbb\xbf", 3},
        {"\"\\uFFFF\"", "\xef\xbf\xbf", 3},
        {"\"\\uD800\\uDC00\"", "\xf0\x90\x80\x80", 4},
        {"\"\\uD83D\\uDE80\"", "\xf0\x9f\x9a\x80", 4},
        {"\"\\ud83d\\ude80\"", "\xf0\x9f\x9a\x80", 4},
        {"\"\\uDBFF\\uDFFF\"", "\xf4\x8f\xbf\xbf", 4},
        {"\"caf\xc3\xa9 \xf0\x9f\x9a\x80\"", "caf\xc3\xa9 \xf0\x9f\x9a\x80", 10},
        {"\"\xf4\x8f\xbf\xbf\"", "\xf4\x8f\xbf\xbf", 4},
        {"\"\xee\x80\x80\xef\xbf\xbf\"", "\xee\x80\x80\xef\xbf\xbf", 6},
        {"\"\\b\\f\\n\\r\\t\\/\\\\\\\"\"", "\b\f\n\r\t/\\\"", 8},
        {"\"\\u003cb\\u003e \\u0026\"", "<b> &", 5},
        {"\"a\\\\u0041\"", "a\\u0041", 7},
        {"\"\\\\\\\\\"", "\\\\", 2},
        {"\"0123456789abcdef0123456789abcdef\\n\"", "0123456789abcdef0123456789abcdef\n", 33},
        {"\"\xc3\xa9\\u00e9\xc3\xa9\"", "\xc3\xa9\xc3\xa9\xc3\xa9", 6},
    };
    for (size_t i = 0; i < N_ELEMS(cases); i++) {
        struct jf_error e;
        json_t *v = jf(cases[i].doc, strlen(cases[i].doc), 0, &e);
        if (!v)
            fail_msg("case %zu: %s", i, e.text);
        assert_true(json_is_string(v));
        assert_int_equal(json_string_length(v), cases[i].want_len);
        assert_memory_equal(json_string_value(v), cases[i].want, cases[i].want_len);
        json_decref(v);
        struct diff_stats st = {0, 0, 0};
        differential(cases[i].doc, strlen(cases[i].doc), "unicode", &st);
        /* the same text as an object key */
        size_t klen = strlen(cases[i].doc);
        char *obj = malloc(klen + 8);
        assert_non_null(obj);
        snprintf(obj, klen + 8, "{%s:1}", cases[i].doc);
        v = jf(obj, strlen(obj), 0, &e);
        assert_non_null(v);
        const char *k = json_object_iter_key(json_object_iter(v));
        assert_non_null(k);
        assert_int_equal(json_object_iter_key_len(json_object_iter(v)), cases[i].want_len);
        assert_memory_equal(k, cases[i].want, cases[i].want_len);
        json_decref(v);
        differential(obj, strlen(obj), "unicode key", &st);
        free(obj);
    }
}

/* Escaped strings and keys longer than the inline scratch buffers. */
static void test_long_strings(void **state)
{
    (void)state;
    static const char *const pieces[] = {
        "abc", "\\n", "\\u00e9", "\\\"", "\xe2\x82\xac", "\\uD83D\\uDE80", "xyz/", "\\/"};
    size_t sizes[] = {10, 300, 1100, 5000, 70000};
    for (size_t s = 0; s < N_ELEMS(sizes); s++) {
        size_t cap = sizes[s] * 16 + 64;
        char *doc = malloc(cap);
        assert_non_null(doc);
        size_t n = 0;
        doc[n++] = '{';
        for (int part = 0; part < 2; part++) {
            if (part)
                memcpy(doc + n, ":\"", 2), n += 2;
            else
                doc[n++] = '"';
            for (size_t i = 0; i < sizes[s]; i++) {
                const char *p = pieces[(i * 7 + part) % N_ELEMS(pieces)];
                memcpy(doc + n, p, strlen(p));
                n += strlen(p);
            }
            doc[n++] = '"';
        }
        doc[n++] = '}';
        struct diff_stats st = {0, 0, 0};
        differential(doc, n, "long strings", &st);
        assert_int_equal(st.ok, 1);
        /* the same without escapes: the direct path */
        n = 0;
        doc[n++] = '"';
        for (size_t i = 0; i < sizes[s] * 4; i++)
            doc[n++] = (char)('a' + i % 26);
        doc[n++] = '"';
        differential(doc, n, "long plain string", &st);
        assert_int_equal(st.ok, 2);
        free(doc);
    }
}

/*** numbers ***/

static void test_numbers(void **state)
{
    (void)state;
    static const struct {
        const char *doc;
        int is_int;
        json_int_t i;
    } cases[] = {
        {"0", 1, 0},
        {"-0", 1, 0},
        {"1", 1, 1},
        {"-1", 1, -1},
        {"1234567890", 1, 1234567890},
        {"9007199254740993", 1, 9007199254740993LL},
        {"999999999999999999", 1, 999999999999999999LL},
        {"9223372036854775807", 1, INT64_MAX},
        {"-9223372036854775807", 1, -INT64_MAX},
        {"-9223372036854775808", 1, INT64_MIN},
        {"1.0", 0, 0},
        {"-0.0", 0, 0},
        {"0.0", 0, 0},
        {"0e0", 0, 0},
        {"0.1", 0, 0},
        {"0.30000000000000004", 0, 0},
        {"1e308", 0, 0},
        {"1.7976931348623157e308", 0, 0},
        {"-1.7976931348623157e308", 0, 0},
        {"2.2250738585072014e-308", 0, 0},
        {"1e-320", 0, 0},
        {"4.9e-324", 0, 0},
        {"5e-324", 0, 0},
        {"2.4e-324", 0, 0},
        {"1e-400", 0, 0},
        {"1E22", 0, 0},
        {"1e23", 0, 0},
        {"8.589973e9", 0, 0},
        {"-1.5e-5", 0, 0},
        {"100e-2", 0, 0},
        {"1e+0", 0, 0},
        {"12345678901234567890.5", 0, 0},
        {"9007199254740993.0", 0, 0},
        {"9007199254740992.0", 0, 0},
        {"123456789012345678901234567890e-10", 0, 0},
        {"0.000000000000000000000000000000000000000000000000000000000000000000000000001", 0, 0},
        {"3.141592653589793238462643383279502884197169399375105820974944592307816406286", 0, 0},
        {"1000000000000000000000000000000000000000000000000000000000000000000000000000.0", 0, 0},
        {"0.1e1", 0, 0},
        {"7.0e-10", 0, 0},
        {"4503599627370496.5", 0, 0},
        {"2.2250738585072011e-308", 0, 0},
        {"1e-22", 0, 0},
        {"1e-23", 0, 0},
        {"123.456", 0, 0},
        {"0.0000000000000000000000000001e28", 0, 0},
        {"1e00000000000000000000000000000000000002", 0, 0},
        {"0e99999999999999999999", 0, 0},
        {"1e-99999999999999999999", 0, 0},
    };
    for (size_t i = 0; i < N_ELEMS(cases); i++) {
        const char *doc = cases[i].doc;
        struct jf_error e;
        json_t *v = jf(doc, strlen(doc), 0, &e);
        if (!v)
            fail_msg("number %s rejected: %s", doc, e.text);
        if (cases[i].is_int) {
            if (!json_is_integer(v))
                fail_msg("number %s is not an integer", doc);
            assert_true(json_integer_value(v) == cases[i].i);
        } else {
            if (!json_is_real(v))
                fail_msg("number %s is not a real", doc);
            double want = strtod(doc, NULL), got = json_real_value(v);
            if (memcmp(&want, &got, sizeof(double)) != 0)
                fail_msg("number %s: got %.17g want %.17g", doc, got, want);
        }
        json_decref(v);
        struct diff_stats st = {0, 0, 0};
        differential(doc, strlen(doc), "numbers", &st);
        assert_int_equal(st.ok, 1);
    }
    /* the sign of zero survives */
    json_t *v = jf("-0.0", 4, 0, NULL);
    assert_true(signbit(json_real_value(v)));
    json_decref(v);
    v = jf("[-0e5]", 6, 0, NULL);
    assert_true(signbit(json_real_value(json_array_get(v, 0))));
    json_decref(v);
}

/* Every 1- to 17-digit decimal with a spread of exponents equals strtod, bit for bit. */
static void test_reals_match_strtod(void **state)
{
    (void)state;
    uint64_t x = 88172645463325252ull;
    char doc[128];
    for (int i = 0; i < 20000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        int digits = 1 + (int)(x % 19);
        uint64_t mant = x >> 8;
        char m[32];
        snprintf(m, sizeof(m), "%llu", (unsigned long long)mant);
        m[digits < (int)strlen(m) ? digits : (int)strlen(m)] = '\0';
        int point = (int)((x >> 40) % (strlen(m) + 1));
        int exp = (int)((x >> 48) % 90) - 45;
        char intpart[32], frac[32];
        snprintf(intpart, sizeof(intpart), "%.*s", point, m);
        snprintf(frac, sizeof(frac), "%s", m + point);
        snprintf(doc, sizeof(doc), "%s%s.%se%d", (x & 1) ? "-" : "", intpart[0] ? intpart : "0",
                 frac[0] ? frac : "0", exp);
        double want = strtod(doc, NULL);
        json_t *v = jf(doc, strlen(doc), 0, NULL);
        if (!v)
            fail_msg("%s rejected", doc);
        double got = json_real_value(v);
        if (memcmp(&want, &got, sizeof(double)) != 0)
            fail_msg("%s: got %.17g want %.17g", doc, got, want);
        json_decref(v);
    }
}

/*** depth ***/

static char *nested(size_t n, const char *open, const char *inner, const char *close, size_t *len)
{
    size_t lo = strlen(open), li = strlen(inner), lc = strlen(close);
    char *s = malloc(n * (lo + lc) + li + 1);
    assert_non_null(s);
    size_t k = 0;
    for (size_t i = 0; i < n; i++, k += lo)
        memcpy(s + k, open, lo);
    memcpy(s + k, inner, li);
    k += li;
    for (size_t i = 0; i < n; i++, k += lc)
        memcpy(s + k, close, lc);
    s[k] = '\0';
    *len = k;
    return s;
}

static void test_depth(void **state)
{
    (void)state;
    static const struct {
        size_t n;
        const char *open, *inner, *close;
        size_t max_depth; /* 0: the default */
        int ok;
    } cases[] = {
        {2048, "[", "", "]", 0, 1},
        {2049, "[", "", "]", 0, 0},
        {2047, "[", "1", "]", 0, 1},
        {2048, "[", "1", "]", 0, 0},
        {2048, "[", "", "]", 2048, 1},
        {2049, "[", "", "]", 2048, 0},
        {2048, "{\"a\":", "{}", "}", 0, 0},
        {2047, "{\"a\":", "{}", "}", 0, 1},
        {2047, "{\"a\":", "\"s\"", "}", 0, 1},
        {2048, "{\"a\":", "\"s\"", "}", 0, 0},
        {2047, "[{\"k\":", "[]", "}]", 0, 0},
        {1023, "[{\"k\":", "[]", "}]", 0, 1},
        {1024, "[{\"k\":", "", "}]", 0, 0},
    };
    for (size_t i = 0; i < N_ELEMS(cases); i++) {
        size_t len;
        char *doc = nested(cases[i].n, cases[i].open, cases[i].inner, cases[i].close, &len);
        struct jf_error e;
        json_t *v = jf(doc, len, cases[i].max_depth, &e);
        if (!!v != cases[i].ok)
            fail_msg("depth case %zu: %s", i, v ? "accepted" : e.text);
        if (!v && strcmp(e.text, "maximum nesting depth 2048 exceeded") != 0 && cases[i].inner[0])
            fail_msg("depth case %zu: %s", i, e.text);
        json_decref(v);
        /* jansson draws the line at the same place */
        struct diff_stats st = {0, 0, 0};
        differential(doc, len, "depth", &st);
        free(doc);
    }
    /* the error points at the first value too deep */
    size_t len;
    char *doc = nested(2049, "[", "", "]", &len);
    struct jf_error e;
    assert_null(jf(doc, len, 0, &e));
    assert_string_equal(e.text, "maximum nesting depth 2048 exceeded");
    assert_int_equal(e.position, 2048);
    assert_int_equal(e.column, 2049);
    free(doc);

    /* small limits: the top-level value has depth 1 */
    static const struct {
        const char *doc;
        size_t max_depth;
        int ok;
    } small[] = {
        {"1", 1, 1},          {"[]", 1, 1},           {"{}", 1, 1},
        {"[1]", 1, 0},        {"[1]", 2, 1},          {"[[1]]", 2, 0},
        {"[[1]]", 3, 1},      {"{\"a\":{}}", 2, 1},   {"{\"a\":{\"b\":1}}", 2, 0},
        {"[[],[],[]]", 2, 1}, {"[[],[[]],[]]", 2, 0},
    };
    for (size_t i = 0; i < N_ELEMS(small); i++) {
        json_t *v = jf(small[i].doc, strlen(small[i].doc), small[i].max_depth, &e);
        if (!!v != small[i].ok)
            fail_msg("%s at max_depth %zu: %s", small[i].doc, small[i].max_depth,
                     v ? "accepted" : e.text);
        if (!v) {
            char want[64];
            snprintf(want, sizeof(want), "maximum nesting depth %zu exceeded", small[i].max_depth);
            assert_string_equal(e.text, want);
        }
        json_decref(v);
    }

    /* deeper than the inline stack, with a generous limit, and far too deep */
    doc = nested(10000, "[", "\"x\"", "]", &len);
    json_t *v = jf(doc, len, 20000, &e);
    assert_non_null(v);
    json_decref(v);
    assert_null(jf(doc, len, 9999, &e));
    assert_null(jf(doc, len - 1, SIZE_MAX, &e));
    assert_string_equal(e.text, "',' or ']' expected near end of input");
    free(doc);
}

/*** out of memory ***/

static long alloc_left;

static void *failing_malloc(size_t n)
{
    if (alloc_left-- <= 0)
        return NULL;
    return malloc(n);
}

static void test_out_of_memory(void **state)
{
    (void)state;
    static const char doc[] =
        "{\"a\":[1,2.5,\"x\\n\",{\"b\":null,\"c\":[true,false]}],\"k\\u00e9\":\"v\",\"d\":{},"
        "\"e\":[],\"f\":\"plain\",\"g\":{\"h\":{\"i\":-7}},\"j\":1,\"k\":2,\"l\":3,\"m\":4,"
        "\"n\":5,\"o\":6,\"p\":7,\"q\":8,\"r\":9}";
    json_t *ref = json_loadb(doc, strlen(doc), 0, NULL);
    assert_non_null(ref);
    long budget;
    for (budget = 0; budget < 10000; budget++) {
        struct jf_error e;
        alloc_left = budget;
        json_set_alloc_funcs(failing_malloc, free);
        json_t *v = jf_loadb(doc, strlen(doc), 0, &e);
        json_set_alloc_funcs(malloc, free);
        if (v) {
            assert_true(json_equal(v, ref));
            json_decref(v);
            break;
        }
        assert_string_equal(e.text, "out of memory");
    }
    assert_true(budget > 20);
    json_decref(ref);
}

/*** differential: data files ***/

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger)
                free(buf);
            buf = bigger;
        }
    }
    fclose(f);
    *len = n;
    return buf;
}

struct corpus {
    char **docs;
    size_t *lens;
    size_t n, cap;
};

static void corpus_add(struct corpus *c, const char *doc, size_t len)
{
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 64;
        c->docs = realloc(c->docs, c->cap * sizeof(*c->docs));
        c->lens = realloc(c->lens, c->cap * sizeof(*c->lens));
        assert_non_null(c->docs);
        assert_non_null(c->lens);
    }
    c->docs[c->n] = malloc(len ? len : 1);
    assert_non_null(c->docs[c->n]);
    memcpy(c->docs[c->n], doc, len);
    c->lens[c->n++] = len;
}

static void corpus_clear(struct corpus *c)
{
    for (size_t i = 0; i < c->n; i++)
        free(c->docs[i]);
    free(c->docs);
    free(c->lens);
    memset(c, 0, sizeof(*c));
}

static void collect_json_files(const char *dir, struct corpus *c)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (ent->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, ent->d_name);
        struct stat st;
        if (stat(path, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            collect_json_files(path, c);
        } else if (strlen(ent->d_name) > 5 &&
                   strcmp(ent->d_name + strlen(ent->d_name) - 5, ".json") == 0) {
            size_t len = 0;
            char *doc = read_all(path, &len);
            assert_non_null(doc);
            corpus_add(c, doc, len);
            free(doc);
        }
    }
    closedir(d);
}

static const char *data_dir(void)
{
    const char *dir = getenv("GG_TEST_DATA");
    return dir ? dir : "tests/data";
}

static void test_differential_data_files(void **state)
{
    (void)state;
    struct corpus c = {0};
    collect_json_files(data_dir(), &c);
    if (c.n == 0)
        fail_msg("no *.json under %s (run from the repository root or set GG_TEST_DATA)",
                 data_dir());
    struct diff_stats st = {0, 0, 0};
    for (size_t i = 0; i < c.n; i++) {
        differential(c.docs[i], c.lens[i], "data file", &st);
        /* and pretty-printed by jansson, and each top-level member alone */
        json_t *v = json_loadb(c.docs[i], c.lens[i], JSON_DECODE_ANY, NULL);
        if (!v)
            continue;
        char *pretty = json_dumps(v, JSON_INDENT(3) | JSON_ENCODE_ANY);
        differential(pretty, strlen(pretty), "data file, indented", &st);
        free(pretty);
        json_decref(v);
    }
    print_message("%zu files under %s: %u parsed, %u refused by both\n", c.n, data_dir(), st.ok,
                  st.failed);
    assert_true(st.ok >= c.n);
    corpus_clear(&c);
}

/*** differential: generated documents ***/

struct rng {
    uint64_t s;
};

static uint64_t rnd(struct rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 2685821657736338717ull;
}

static unsigned below(struct rng *r, unsigned n)
{
    return (unsigned)(rnd(r) % n);
}

struct sbuf {
    char *d;
    size_t len, cap;
};

static void put(struct sbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->d = realloc(b->d, b->cap);
        assert_non_null(b->d);
    }
    memcpy(b->d + b->len, s, n);
    b->len += n;
}

static void puts_(struct sbuf *b, const char *s)
{
    put(b, s, strlen(s));
}

static void putf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(struct sbuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    put(b, tmp, (size_t)n);
}

static void put_utf8(struct sbuf *b, unsigned cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp, n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xc0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3f)), n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xe0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f)), n = 3;
    } else {
        u[0] = (char)(0xf0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), u[3] = (char)(0x80 | (cp & 0x3f)), n = 4;
    }
    put(b, u, n);
}

static unsigned random_cp(struct rng *r)
{
    for (;;) {
        unsigned cp;
        switch (below(r, 4)) {
        case 0:
            cp = 0x80 + below(r, 0x800 - 0x80);
            break;
        case 1:
            cp = 0x800 + below(r, 0x10000 - 0x800);
            break;
        case 2:
            cp = 0x10000 + below(r, 0x110000 - 0x10000);
            break;
        default:
            cp = 0x20 + below(r, 0x60);
            break;
        }
        if (cp - 0xd800 >= 0x800 && cp != '"' && cp != '\\')
            return cp;
    }
}

static void gen_ws(struct rng *r, struct sbuf *b)
{
    if (below(r, 4) == 0) {
        unsigned n = 1 + below(r, 4);
        for (unsigned i = 0; i < n; i++)
            put(b, &" \t\r\n"[below(r, 4)], 1);
    }
}

static void gen_string(struct rng *r, struct sbuf *b, int bad)
{
    static const char *const simple[] = {"\\\"", "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t"};
    static const char *const broken[] = {"\\u0000", "\\uD800", "\\uDC00x",
                                         "\x01",    "\xc3",    "\xed\xa0\x80",
                                         "\\x",     "\xff",    "\\uD83D\\u0041"};
    put(b, "\"", 1);
    unsigned n = below(r, 20) == 0 ? below(r, 400) : below(r, 14);
    for (unsigned i = 0; i < n; i++) {
        switch (below(r, 12)) {
        case 0:
        case 1:
        case 2:
        case 3:
        case 4: {
            char c = (char)(0x20 + below(r, 0x5f));
            if (c == '"' || c == '\\')
                c = 'q';
            put(b, &c, 1);
            break;
        }
        case 5:
            puts_(b, simple[below(r, N_ELEMS(simple))]);
            break;
        case 6: {
            unsigned cp;
            do
                cp = 1 + below(r, 0xffff);
            while (cp - 0xd800 < 0x800);
            putf(b, below(r, 2) ? "\\u%04x" : "\\u%04X", cp);
            break;
        }
        case 7: {
            unsigned cp = 0x10000 + below(r, 0x100000);
            cp -= 0x10000;
            putf(b, "\\u%04X\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
            break;
        }
        case 8:
        case 9:
            put_utf8(b, random_cp(r));
            break;
        case 10:
            puts_(b, "\\u003c");
            break;
        default:
            if (bad && below(r, 8) == 0)
                puts_(b, broken[below(r, N_ELEMS(broken))]);
            else
                put(b, "k", 1);
            break;
        }
    }
    put(b, "\"", 1);
}

static void gen_number(struct rng *r, struct sbuf *b, int bad)
{
    switch (below(r, 9)) {
    case 0:
        putf(b, "%d", (int)below(r, 201) - 100);
        break;
    case 1:
        putf(b, "%lld", (long long)rnd(r));
        break;
    case 2: {
        static const char *const edge[] = {"0",
                                           "-0",
                                           "9223372036854775807",
                                           "-9223372036854775808",
                                           "9007199254740993",
                                           "-1",
                                           "1.0",
                                           "-0.0",
                                           "1e308",
                                           "1e-320",
                                           "4.9e-324",
                                           "1.7976931348623157e308"};
        puts_(b, edge[below(r, N_ELEMS(edge))]);
        break;
    }
    case 3:
        putf(b, "%s%u.%0*u", below(r, 2) ? "-" : "", below(r, 100000), (int)(1 + below(r, 6)),
             below(r, 1000000));
        break;
    case 4:
        putf(b, "%s%u%s%c%s%u", below(r, 2) ? "-" : "", below(r, 1000),
             (const char *[]){"", ".25", ".0", ".", ""}[below(r, bad ? 5 : 3)],
             below(r, 2) ? 'e' : 'E', (const char *[]){"", "+", "-"}[below(r, 3)],
             below(r, bad ? 400 : 300));
        break;
    case 5: {
        double d;
        uint64_t bits;
        do {
            bits = rnd(r);
            memcpy(&d, &bits, sizeof(d));
        } while (!isfinite(d));
        putf(b, "%.17g", d);
        break;
    }
    case 6:
        putf(b, "%.*g", (int)(1 + below(r, 17)), (double)rnd(r) / (double)(1 + rnd(r) % 1000000));
        break;
    case 7:
        if (bad) {
            putf(b, "%llu%llu", (unsigned long long)rnd(r), (unsigned long long)rnd(r));
            break;
        }
        /* fall through */
    default:
        putf(b, "%u", below(r, 100000));
        break;
    }
}

static void gen_value(struct rng *r, struct sbuf *b, int depth, int bad)
{
    static const char *const pool[] = {"\"a\"", "\"b\"", "\"apiVersion\"", "\"k\\u00e9y\"", "\"\""};
    unsigned kind = depth >= 7 ? below(r, 4) : below(r, 8);
    switch (kind) {
    case 0:
        gen_string(r, b, bad);
        break;
    case 1:
    case 3:
        gen_number(r, b, bad);
        break;
    case 2:
        puts_(b, (const char *[]){"true", "false", "null"}[below(r, 3)]);
        break;
    case 4:
    case 5: {
        put(b, "[", 1);
        gen_ws(r, b);
        unsigned n = below(r, 7);
        for (unsigned i = 0; i < n; i++) {
            if (i) {
                put(b, ",", 1);
                gen_ws(r, b);
            }
            gen_value(r, b, depth + 1, bad);
            gen_ws(r, b);
        }
        put(b, "]", 1);
        break;
    }
    default: {
        put(b, "{", 1);
        gen_ws(r, b);
        unsigned n = below(r, 8);
        for (unsigned i = 0; i < n; i++) {
            if (i) {
                put(b, ",", 1);
                gen_ws(r, b);
            }
            if (below(r, 3) == 0)
                puts_(b, pool[below(r, N_ELEMS(pool))]);
            else
                gen_string(r, b, bad);
            gen_ws(r, b);
            put(b, ":", 1);
            gen_ws(r, b);
            gen_value(r, b, depth + 1, bad);
            gen_ws(r, b);
        }
        put(b, "}", 1);
        break;
    }
    }
}

#define RANDOM_DOCS 4000
#define MUTATIONS_PER_DOC 12

static void generate_corpus(struct corpus *c)
{
    struct rng r = {0x9e3779b97f4a7c15ull};
    struct sbuf b = {NULL, 0, 0};
    for (int i = 0; i < RANDOM_DOCS; i++) {
        b.len = 0;
        int bad = below(&r, 10) == 0;
        gen_ws(&r, &b);
        gen_value(&r, &b, 0, bad);
        gen_ws(&r, &b);
        if (below(&r, 2))
            put(&b, "\n", 1);
        corpus_add(c, b.d, b.len);
    }
    free(b.d);
}

static void test_differential_random(void **state)
{
    (void)state;
    struct corpus c = {0};
    generate_corpus(&c);
    struct diff_stats st = {0, 0, 0};
    for (size_t i = 0; i < c.n; i++)
        differential(c.docs[i], c.lens[i], "random document", &st);
    print_message("%zu random documents: %u parsed, %u refused by both\n", c.n, st.ok, st.failed);
    assert_true(st.ok > c.n * 3 / 4);
    assert_true(st.failed > 0);
    corpus_clear(&c);
}

/*** differential: mutations ***/

static void mutate(struct rng *r, struct sbuf *b)
{
    static const char interesting[] = "\"\\{}[]:,0-+.eE \n\tu\x80\xbf\xc3\xed\xf4\xff/atfn19\x01";
    unsigned ops = 1 + below(r, 3);
    for (unsigned k = 0; k < ops; k++) {
        size_t at = b->len ? below(r, (unsigned)b->len) : 0;
        char c = below(r, 2) ? interesting[below(r, sizeof(interesting))] : (char)below(r, 256);
        switch (below(r, 6)) {
        case 0: /* overwrite */
            if (b->len)
                b->d[at] = c;
            break;
        case 1: /* insert */
            put(b, "", 1);
            memmove(b->d + at + 1, b->d + at, b->len - 1 - at);
            b->d[at] = c;
            break;
        case 2: /* delete */
            if (b->len) {
                memmove(b->d + at, b->d + at + 1, b->len - at - 1);
                b->len--;
            }
            break;
        case 3: /* truncate */
            b->len = at;
            break;
        case 4: { /* duplicate a slice */
            size_t n = b->len - at < 16 ? b->len - at : 16;
            char tmp[16];
            memcpy(tmp, b->d + at, n);
            put(b, tmp, n);
            break;
        }
        default: /* swap two bytes */
            if (b->len) {
                size_t other = below(r, (unsigned)b->len);
                char t = b->d[at];
                b->d[at] = b->d[other];
                b->d[other] = t;
            }
            break;
        }
    }
}

static void test_differential_mutations(void **state)
{
    (void)state;
    struct corpus c = {0};
    collect_json_files(data_dir(), &c);
    size_t files = c.n;
    generate_corpus(&c);
    struct rng r = {0x2545f4914f6cdd1dull};
    struct sbuf b = {NULL, 0, 0};
    struct diff_stats st = {0, 0, 0};
    size_t runs = 0;
    for (size_t i = 0; i < c.n; i++) {
        /* data files get many more mutations: they are the realistic input */
        int n = i < files ? 400 : (i % 4 == 0 ? MUTATIONS_PER_DOC : 0);
        for (int m = 0; m < n; m++) {
            b.len = 0;
            put(&b, c.docs[i], c.lens[i]);
            mutate(&r, &b);
            differential(b.d, b.len, "mutation", &st);
            runs++;
        }
    }
    print_message("%zu mutations: %u parsed, %u refused by both, %u NUL bytes only jansson "
                  "skips\n",
                  runs, st.ok, st.failed, st.nul_quirk);
    assert_true(st.ok > 0 && st.failed > 0);
    free(b.d);
    corpus_clear(&c);
}

/* jf_parse's depth bound: one more than the deepest container (jansson's counting). */
static void test_depth_bound(void **state)
{
    (void)state;
    static const struct {
        const char *doc;
        size_t deepest;
    } cases[] = {{"1", 1}, {"[]", 2}, {"[[1]]", 3}, {"{\"a\":[{}]}", 4}, {"[1,[2],{}]", 3}};
    for (size_t i = 0; i < N_ELEMS(cases); i++) {
        size_t deepest = 0;
        struct jf_doc doc;
        assert_int_equal(jf_parse(cases[i].doc, strlen(cases[i].doc), 0, &doc, &deepest, NULL), 0);
        assert_int_equal(deepest, cases[i].deepest);
        jf_doc_free(&doc);
    }
}

/* jansson's own verdict: json_stringn checks UTF-8 and nothing else. */
static bool jansson_utf8(const unsigned char *s, size_t len)
{
    json_t *v = json_stringn((const char *)s, len);
    json_decref(v);
    return v != NULL;
}

/*
 * jf_utf8_valid agrees with jansson on every one- and two-byte string,
 * every three-byte one from a lead byte 0xc0 up, a stride of the others, and on each of those
 * placed after and inside an ASCII run long enough for the 8-byte step.
 */
static void test_utf8_valid_matches_jansson(void **state)
{
    (void)state;
    unsigned char buf[32];
    memset(buf, 'a', sizeof(buf));
    assert_true(jf_utf8_valid("", 0));
    for (uint32_t x = 0; x < (1u << 24); x++) {
        unsigned char b[4] = {(unsigned char)(x >> 16), (unsigned char)(x >> 8), (unsigned char)x,
                              (unsigned char)(x * 7 + 0x80)};
        for (size_t len = 1; len <= 4; len++) {
            if ((len == 1 && x > 0xff) || (len == 2 && x > 0xffff) || (len == 4 && x % 61) ||
                (len == 3 && b[0] < 0xc0 && x % 61)) /* ASCII or stray lead: a sample */
                continue;
            const unsigned char *s = len == 1 ? b + 2 : len == 2 ? b + 1 : b;
            bool want = jansson_utf8(s, len);
            if (jf_utf8_valid((const char *)s, len) != want)
                fail_msg("%zu bytes %02x %02x %02x %02x: jansson says %d", len, s[0],
                         len > 1 ? s[1] : 0, len > 2 ? s[2] : 0, len > 3 ? s[3] : 0, want);
            if (x % 257 == 0) {
                memcpy(buf + 9, s, len); /* after an 8-byte ASCII step, before another */
                assert_int_equal(jf_utf8_valid((const char *)buf, 9 + len + 9), want);
                memset(buf + 9, 'a', len);
            }
        }
    }
    assert_true(jf_utf8_valid("a\0b", 3)); /* NUL is ASCII for jansson too */
    assert_true(jansson_utf8((const unsigned char *)"a\0b", 3));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_length_bounds),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_jansson_nul_quirk),
        cmocka_unit_test(test_error_position),
        cmocka_unit_test(test_unicode_and_escapes),
        cmocka_unit_test(test_long_strings),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_reals_match_strtod),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_depth_bound),
        cmocka_unit_test(test_utf8_valid_matches_jansson),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_differential_data_files),
        cmocka_unit_test(test_differential_random),
        cmocka_unit_test(test_differential_mutations),
    };
    return cmocka_run_group_tests_name("jsonfast", tests, NULL, NULL);
}
