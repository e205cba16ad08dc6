/*
 * test_jsonwrite.c - the compact JSON writer: exact text for every type,
 * escapes, numbers at their limits, against jansson's json_dumps on fixed
 * and seeded random values, round trips through json_loads, and failures
 * (depth, cycles, the buf's limit).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "util/jsonwrite.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

/* jw_value's text for v, which must be written; free() it. */
static char *write_value(const json_t *v)
{
    struct buf b;
    buf_init(&b, (size_t)1 << 24);
    assert_int_equal(jw_value(&b, v), GG_OK);
    assert_int_equal(strlen(b.data), b.len);
    return buf_steal(&b, NULL);
}

static void assert_writes(json_t *v, const char *want)
{
    char *got = write_value(v);
    assert_string_equal(got, want);
    free(got);
    json_decref(v);
}

/* The writer's text equals json_dumps(v, JSON_COMPACT) and loads back equal. */
static void assert_as_jansson(const json_t *v)
{
    char *got = write_value(v);
    char *want = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    assert_non_null(want);
    assert_string_equal(got, want);
    json_t *back = json_loads(got, JSON_DECODE_ANY, NULL);
    assert_non_null(back);
    assert_true(json_equal(back, (json_t *)v));
    json_decref(back);
    free(want);
    free(got);
}

static void test_scalars(void **state)
{
    (void)state;
    assert_writes(json_null(), "null");
    assert_writes(json_true(), "true");
    assert_writes(json_false(), "false");
    assert_writes(json_integer(0), "0");
    assert_writes(json_integer(-7), "-7");
    assert_writes(json_integer(1234567890), "1234567890");
    assert_writes(json_integer(INT64_MAX), "9223372036854775807");
    assert_writes(json_integer(INT64_MIN), "-9223372036854775808");
    assert_writes(json_string(""), "\"\"");
    assert_writes(json_string("plain"), "\"plain\"");
    assert_writes(json_real(1.5), "1.5");
    static const json_int_t ints[] = {0, 1, -1, 9, 10, -10, INT64_MAX, INT64_MIN, INT64_MIN + 1};
    for (size_t i = 0; i < N_ELEMS(ints); i++) {
        json_t *v = json_integer(ints[i]);
        assert_as_jansson(v);
        json_decref(v);
    }
}

static void test_reals(void **state)
{
    (void)state;
    static const struct {
        double d;
        const char *text;
    } cases[] = {
        {0.1, "0.10000000000000001"},
        {1e300, "1.0000000000000001e300"},
        {-0.0, "-0.0"},
        {0.0, "0.0"},
        {1.0, "1.0"},
        {-2.0, "-2.0"},
        {123456789.125, "123456789.125"},
        {1e16, "10000000000000000.0"},
        {1e17, "1e17"},
        {1e21, "1e21"},
        {1e-5, "1.0000000000000001e-5"},
        {1.5e-300, "1.5000000000000001e-300"},
        {5e-324, "4.9406564584124654e-324"},
        {-1.7976931348623157e308, "-1.7976931348623157e308"},
    };
    for (size_t i = 0; i < N_ELEMS(cases); i++) {
        json_t *v = json_real(cases[i].d);
        char *got = write_value(v);
        assert_string_equal(got, cases[i].text);
        assert_as_jansson(v);
        /* Loads back to the same double, sign of zero included. */
        json_t *back = json_loads(got, JSON_DECODE_ANY, NULL);
        assert_true(json_is_real(back));
        double d = json_real_value(back);
        assert_memory_equal(&d, &cases[i].d, sizeof(d));
        json_decref(back);
        free(got);
        json_decref(v);
    }
}

static void test_string_escapes(void **state)
{
    (void)state;
    /* Quote, backslash, the short escapes, other control characters as
     * \u00xx (lower-case hex), DEL and UTF-8 as they are. */
    assert_writes(json_string("a\"b\\c/d"), "\"a\\\"b\\\\c/d\"");
    assert_writes(json_string("\n\r\t"), "\"\\n\\r\\t\"");
    assert_writes(json_string("\x01\b\f\x1f"), "\"\\u0001\\u0008\\u000c\\u001f\"");
    assert_writes(json_stringn("a\0b", 3), "\"a\\u0000b\"");
    assert_writes(json_string("\x7f"), "\"\x7f\"");
    assert_writes(json_string("caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80"),
                  "\"caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80\"");
    /* Longer than the 16-byte scan, escapes at the edges and inside. */
    assert_writes(json_string("\"0123456789abcdef\xc3\xa9"
                              "0123456789abcdef\\0123456789abcdef\n"),
                  "\"\\\"0123456789abcdef\xc3\xa9"
                  "0123456789abcdef\\\\0123456789abcdef\\n\"");
    /* Where jansson escapes the same way, the texts are the same. */
    json_t *v = json_string("q\"b\\n\nr\rt\t\x7f\xc3\xa9/");
    assert_as_jansson(v);
    json_decref(v);
    /* Keys go through the same escaping, with their full length. */
    json_t *obj = json_object();
    json_object_setn_new(obj, "k\0\"", 3, json_true());
    assert_writes(obj, "{\"k\\u0000\\\"\":true}");
    /* Every control character round-trips. */
    char all[32];
    for (int c = 0; c < 32; c++)
        all[c] = (char)c;
    json_t *ctl = json_stringn(all, sizeof(all));
    char *text = write_value(ctl);
    json_t *back = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    assert_non_null(back);
    assert_true(json_equal(back, ctl));
    json_decref(back);
    json_decref(ctl);
    free(text);
}

static void test_containers(void **state)
{
    (void)state;
    assert_writes(json_array(), "[]");
    assert_writes(json_object(), "{}");
    assert_writes(json_pack("[[],{},[[]],{s:{}}]", "a"), "[[],{},[[]],{\"a\":{}}]");
    /* Keys in insertion order, as jansson writes them without JSON_SORT_KEYS. */
    json_t *v = json_pack("{s:i,s:[i,s,n,b],s:{s:f,s:{}},s:[]}", "z", 1, "a", 2, "x", 0, "m", "k",
                          0.5, "e", "b");
    assert_as_jansson(v);
    char *text = write_value(v);
    assert_string_equal(text, "{\"z\":1,\"a\":[2,\"x\",null,false],\"m\":{\"k\":0.5,\"e\":{}},"
                              "\"b\":[]}");
    free(text);
    json_decref(v);
    /* A patch like the ones admission.c encodes. */
    v = json_loads("[{\"op\":\"add\",\"path\":\"/metadata/labels/a~1b\",\"value\":\"x\"},"
                   "{\"op\":\"replace\",\"path\":\"/spec/replicas\",\"value\":3},"
                   "{\"op\":\"add\",\"path\":\"/spec/tolerations/-\",\"value\":{\"key\":\"g\","
                   "\"operator\":\"Exists\",\"tolerationSeconds\":-1,\"weight\":1.25}},"
                   "{\"op\":\"remove\",\"path\":\"/metadata/annotations\"}]",
                   0, NULL);
    assert_non_null(v);
    assert_as_jansson(v);
    json_decref(v);
}

/* Appends after what the buf holds, and fails cleanly. */
static void test_buf_and_failures(void **state)
{
    (void)state;
    struct buf b;
    buf_init(&b, 64);
    assert_int_equal(buf_append(&b, "x=", 2), GG_OK);
    json_t *v = json_pack("[i,s]", 1, "y");
    assert_int_equal(jw_value(&b, v), GG_OK);
    assert_string_equal(b.data, "x=[1,\"y\"]");
    json_decref(v);
    assert_int_equal(jw_value(&b, NULL), GG_ERR_INVALID);
    /* Past the buf's limit. */
    json_t *big = json_string("0123456789012345678901234567890123456789012345678901234567890123");
    assert_int_equal(jw_value(&b, big), GG_ERR_TOOBIG);
    json_decref(big);
    buf_clear(&b);

    /* JW_MAX_DEPTH nested containers are written; one more is refused. */
    json_t *deep = json_array();
    for (int i = 1; i < JW_MAX_DEPTH; i++) {
        json_t *outer = i % 2 ? json_object() : json_array();
        if (json_is_object(outer))
            json_object_set_new(outer, "k", deep);
        else
            json_array_append_new(outer, deep);
        deep = outer;
    }
    buf_init(&b, (size_t)1 << 24);
    assert_int_equal(jw_value(&b, deep), GG_OK);
    buf_clear(&b);
    json_t *deeper = json_pack("[o]", deep);
    assert_int_equal(jw_value(&b, deeper), GG_ERR_TOOBIG);
    buf_clear(&b);
    json_decref(deeper);

    /* A cycle ends at the depth limit too. */
    json_t *a = json_array(), *c = json_array();
    json_array_append(a, c);
    json_array_append(c, a);
    assert_int_equal(jw_value(&b, a), GG_ERR_TOOBIG);
    buf_clear(&b);
    json_array_clear(c);
    json_decref(c);
    json_decref(a);
}

/*** seeded random values, differential against jansson ***/

static uint64_t rng_state;

static uint64_t rnd(void)
{
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Text that jansson escapes as the writer does: no control characters but \n, \r, \t. */
static json_t *random_string(void)
{
    static const char *const pieces[] = {"a",
                                         "Z",
                                         "0",
                                         " ",
                                         "/",
                                         "~",
                                         "\"",
                                         "\\",
                                         "\n",
                                         "\r",
                                         "\t",
                                         "\x7f",
                                         "\xc3\xa9",
                                         "\xe2\x82\xac",
                                         "\xf0\x9f\x98\x80",
                                         "0123456789abcdef"};
    char text[256];
    size_t len = 0, n = rnd() % 14; /* at most 13 pieces of 16 bytes */
    for (size_t i = 0; i < n; i++) {
        const char *p = pieces[rnd() % N_ELEMS(pieces)];
        size_t plen = strlen(p);
        memcpy(text + len, p, plen);
        len += plen;
    }
    return json_stringn(text, len);
}

static json_t *random_number(void)
{
    uint64_t bits = rnd();
    switch (rnd() % 4) {
    case 0:
        return json_integer((json_int_t)bits);
    case 1:
        return json_integer((json_int_t)(bits % 2001) - 1000);
    case 2: {
        double d;
        memcpy(&d, &bits, sizeof(d));
        return json_real(isfinite(d) ? d : 0.25);
    }
    default:
        return json_real((double)(int64_t)(bits % 200001 - 100000) / 64);
    }
}

static json_t *random_value(int depth)
{
    switch (rnd() % (depth > 5 ? 5 : 7)) {
    case 0:
        return json_null();
    case 1:
        return json_boolean(rnd() % 2);
    case 2:
    case 3:
        return random_number();
    case 4:
        return random_string();
    case 5: {
        json_t *a = json_array();
        for (size_t n = rnd() % 6; n > 0; n--)
            json_array_append_new(a, random_value(depth + 1));
        return a;
    }
    default: {
        json_t *o = json_object();
        for (size_t n = rnd() % 6; n > 0; n--) {
            json_t *key = random_string();
            json_object_setn_new(o, json_string_value(key), json_string_length(key),
                                 random_value(depth + 1));
            json_decref(key);
        }
        return o;
    }
    }
}

static void test_random_against_jansson(void **state)
{
    (void)state;
    rng_state = 20240611;
    for (int i = 0; i < 2000; i++) {
        json_t *v = random_value(0);
        assert_as_jansson(v);
        json_decref(v);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars),          cmocka_unit_test(test_reals),
        cmocka_unit_test(test_string_escapes),   cmocka_unit_test(test_containers),
        cmocka_unit_test(test_buf_and_failures), cmocka_unit_test(test_random_against_jansson),
    };
    return cmocka_run_group_tests_name("jsonwrite", tests, NULL, NULL);
}
