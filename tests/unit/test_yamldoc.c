/*
 * test_yamldoc.c - unit tests for webhook/codec/yamldoc.c: scalar resolution
 * (go-yaml v2 / sigs.k8s.io/yaml rules), keys, anchors and merge keys, the
 * limits (alias bombs, nesting, nodes, size), exact error positions, JSON
 * input, encodings, every allocation failure, and the manifests in
 *   tests/data/yaml/          (ours: a stream, a billion laughs, JSON)
 *   ../shared/corpus/         (public GPU manifests; skipped when absent)
 *
 * Paths are relative to the repository root, where `make unit` runs the
 * tests; $GPUGUARD_TEST_DATA and $GPUGUARD_CORPUS override them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/gpuguard.h"
#include "codec/yamldoc.h"
#include "testjson.h"

#ifndef YD_TEST_DATA
#define YD_TEST_DATA "tests/data"
#endif
#ifndef YD_CORPUS
#define YD_CORPUS "../shared/corpus"
#endif

/* ---- helpers ---------------------------------------------------------------- */

static void assert_json_eq(const json_t *got, const char *want_text, const char *input)
{
    json_t *want = js(want_text);

    if (!json_equal(got, want)) {
        char *g = json_dumps(got, JSON_COMPACT | JSON_ENCODE_ANY);
        print_error("input:\n%s\n", input);
        fail_msg("got %s, want %s", g ? g : "(null)", want_text);
    }
    json_decref(want);
}

/* yd_load_one() on a NUL-terminated text that must load. */
static json_t *load_ok(const char *text, const struct yd_limits *lim)
{
    struct gg_err err = {{0}};
    json_t *doc = NULL;
    enum gg_status st = yd_load_one(text, strlen(text), "t.yaml", lim, &doc, &err);

    if (st != GG_OK)
        fail_msg("load failed (%s): %s\ninput:\n%s", gg_strerror(st), err.msg, text);
    assert_non_null(doc);
    return doc;
}

/* A text (with its length, it may hold NULs) that must fail exactly so. */
static void expect_fail_n(const char *text, size_t len, const struct yd_limits *lim,
                          enum gg_status want_st, const char *want_msg)
{
    struct gg_err err = {{0}};
    json_t *docs = NULL;
    enum gg_status st = yd_load_all(text, len, "t.yaml", lim, &docs, &err);

    if (st == GG_OK) {
        char *d = json_dumps(docs, JSON_COMPACT);
        fail_msg("loaded, want \"%s\"; got %s\ninput:\n%s", want_msg, d, text);
    }
    assert_null(docs);
    if (st != want_st || strcmp(err.msg, want_msg) != 0)
        fail_msg("input:\n%s\ngot  %s: %s\nwant %s: %s", text, gg_strerror(st), err.msg,
                 gg_strerror(want_st), want_msg);
}

static void expect_fail_lim(const char *text, const struct yd_limits *lim, enum gg_status want_st,
                            const char *want_msg)
{
    expect_fail_n(text, strlen(text), lim, want_st, want_msg);
}

static void expect_fail(const char *text, enum gg_status want_st, const char *want_msg)
{
    expect_fail_n(text, strlen(text), NULL, want_st, want_msg);
}

static char *read_path(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long size;

    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        buf = malloc((size_t)size + 1);
        if (buf && fread(buf, 1, (size_t)size, f) != (size_t)size) {
            free(buf);
            buf = NULL;
        }
        if (buf) {
            buf[size] = '\0';
            *len = (size_t)size;
        }
    }
    fclose(f);
    return buf;
}

static char *read_data(const char *name, size_t *len, char *path, size_t path_size)
{
    const char *dir = getenv("GPUGUARD_TEST_DATA");
    char *text;

    snprintf(path, path_size, "%s/yaml/%s", dir && *dir ? dir : YD_TEST_DATA, name);
    text = read_path(path, len);
    if (!text)
        fail_msg("cannot read %s (run from the repository root or set GPUGUARD_TEST_DATA)", path);
    return text;
}

/* ---- scalars ---------------------------------------------------------------- */

struct ok_case {
    const char *yaml;
    const char *json;
};

static void run_ok_cases(const struct ok_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        json_t *doc = load_ok(cases[i].yaml, NULL);
        assert_json_eq(doc, cases[i].json, cases[i].yaml);
        json_decref(doc);
    }
}

static void test_scalars(void **state)
{
    (void)state;
    static const struct ok_case cases[] = {
        /* bools: YAML 1.1 words, as go-yaml v2 */
        {"[true, True, TRUE, yes, Yes, YES, on, On, ON, y, Y]",
         "[true,true,true,true,true,true,true,true,true,true,true]"},
        {"[false, False, FALSE, no, No, NO, off, Off, OFF, n, N]",
         "[false,false,false,false,false,false,false,false,false,false,false]"},
        {"[tRUE, yES, oN, nO, Yes!, truex]", "[\"tRUE\",\"yES\",\"oN\",\"nO\",\"Yes!\",\"truex\"]"},
        /* nulls */
        {"a:\nb: ~\nc: null\nd: Null\ne: NULL\nf: nULL",
         "{\"a\":null,\"b\":null,\"c\":null,\"d\":null,\"e\":null,\"f\":\"nULL\"}"},
        {"- ~\n-\n- null", "[null,null,null]"},
        /* integers: Go's ParseInt(s, 0, 64) after removing '_' */
        {"[0, -0, 12, +12, -12, 1_000_000, 1__0, 1_]", "[0,0,12,12,-12,1000000,10,1]"},
        {"[0x1F, 0X1f, -0x10, +0x10, 0o17, 0O17, 0777, 010, 00, 0b101, 0B11, -0b11]",
         "[31,31,-16,16,15,15,511,8,0,5,3,-3]"},
        {"[9223372036854775807, -9223372036854775808, 0x7FFFFFFFFFFFFFFF]",
         "[9223372036854775807,-9223372036854775808,9223372036854775807]"},
        /* not octal, so Go reads them as floats: 8 and 9 */
        {"[08, 09, 019.5]", "[8,9,19.5]"},
        {"[0x, 0b2, 0o8, 0xg, _1, 1-2, 1.2.3, 12:30, 1e, e1, 0x1p3]",
         "[\"0x\",\"0b2\",\"0o8\",\"0xg\",\"_1\",\"1-2\",\"1.2.3\",\"12:30\",\"1e\",\"e1\","
         "\"0x1p3\"]"},
        /* floats; integral ones become integers, as after the JSON round trip */
        {"[1.5, -1.5, .5, -.5, +.5, 2.5e-1, 1_000.5, 6.02e23, 1.5E+3]",
         "[1.5,-1.5,0.5,-0.5,0.5,0.25,1000.5,6.02e23,1500]"},
        {"[1.0, 1., -0.0, 1e3, 1E-0, 100e-2, 1e-400]", "[1,1,0,1000,1,1,0]"},
        {"[9223372036854775807.0, 9.3e18, -9223372036854775808.0]",
         "[9.2233720368547758e18,9.3e18,-9223372036854775808]"},
        {"[.e1, ., .5_0, +, -.nan, .iNf]", "[\".e1\",\".\",\".5_0\",\"+\",\"-.nan\",\".iNf\"]"},
        /* strings: quoted is always a string; timestamps and quantities stay text */
        {"[\"12\", '12', \"true\", 'yes', \"null\", '~', \"\", '', \"0x10\", '1.0']",
         "[\"12\",\"12\",\"true\",\"yes\",\"null\",\"~\",\"\",\"\",\"0x10\",\"1.0\"]"},
        {"[2001-12-14, 2001-12-14T21:59:43.10Z, 1Gi, 500m, 10.0.0.1, v1.2, <<, =, a b]",
         "[\"2001-12-14\",\"2001-12-14T21:59:43.10Z\",\"1Gi\",\"500m\",\"10.0.0.1\",\"v1.2\","
         "\"<<\",\"=\",\"a b\"]"},
        {"v: plain\n  folded  \n  over lines", "{\"v\":\"plain folded over lines\"}"},
        {"v: \"\\u00e9\\t\\x41\\\\ \\\"q\\\" \\U0001F680\"",
         "{\"v\":\"\\u00e9\\tA\\\\ \\\"q\\\" \\ud83d\\ude80\"}"},
        {"v: 'it''s'", "{\"v\":\"it's\"}"},
        /* block scalars are strings, with their chomping */
        {"v: |\n  a\n   b\n\n", "{\"v\":\"a\\n b\\n\"}"},
        {"v: |-\n  12\n", "{\"v\":\"12\"}"},
        {"v: |+\n  a\n\n", "{\"v\":\"a\\n\\n\"}"},
        {"v: >\n  a\n  b\n\n  c\n", "{\"v\":\"a b\\nc\\n\"}"},
        {"v: >-\n  true\n", "{\"v\":\"true\"}"},
        {"v: |2\n    indented\n", "{\"v\":\"  indented\\n\"}"},
        /* tags */
        {"[!!str 12, !!str true, !!str ~]", "[\"12\",\"true\",\"~\"]"},
        {"[!!int \"12\", !!int 0x10, !!float 1, !!float '1.5', !!bool yes, !!null '']",
         "[12,16,1,1.5,true,null]"},
        {"[!custom 5, ! 12, !!timestamp 2001-12-14, !<tag:example.com,2000:x> 1]",
         "[\"5\",\"12\",\"2001-12-14\",\"1\"]"},
        /* a document that is just a scalar */
        {"--- 42\n", "42"},
        {"--- null\n", "null"},
        {"--- \"\"\n", "\"\""},
    };
    run_ok_cases(cases, N_ELEMS(cases));
}

static void test_scalar_errors(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        const char *msg;
    } cases[] = {
        {"v: .inf",
         "t.yaml:1:4: .inf is not a number JSON can hold; quote it to keep it as a string"},
        {"v: [1, -.Inf]",
         "t.yaml:1:8: -.Inf is not a number JSON can hold; quote it to keep it as a string"},
        {"v: .NaN",
         "t.yaml:1:4: .NaN is not a number JSON can hold; quote it to keep it as a string"},
        {"v: +.INF",
         "t.yaml:1:4: +.INF is not a number JSON can hold; quote it to keep it as a string"},
        {"v: 99999999999999999999",
         "t.yaml:1:4: integer 99999999999999999999 does not fit in 64 bits; quote it to keep it "
         "as a string"},
        {"v: 9223372036854775808",
         "t.yaml:1:4: integer 9223372036854775808 does not fit in 64 bits; quote it to keep it as "
         "a string"},
        {"v: -9223372036854775809",
         "t.yaml:1:4: integer -9223372036854775809 does not fit in 64 bits; quote it to keep it "
         "as a string"},
        {"v: 18446744073709551615",
         "t.yaml:1:4: integer 18446744073709551615 does not fit in 64 bits; quote it to keep it "
         "as a string"},
        {"v: 0x10000000000000000",
         "t.yaml:1:4: integer 0x10000000000000000 does not fit in 64 bits; quote it to keep it as "
         "a string"},
        {"v: 1e400", "t.yaml:1:4: number 1e400 is out of range; quote it to keep it as a string"},
        {"v: -1.5e999",
         "t.yaml:1:4: number -1.5e999 is out of range; quote it to keep it as a string"},
        {"v: !!int abc", "t.yaml:1:4: cannot read \"abc\" as !!int"},
        {"v: !!int 1.5", "t.yaml:1:4: cannot read \"1.5\" as !!int"},
        {"v: !!bool 1", "t.yaml:1:4: cannot read \"1\" as !!bool"},
        {"v: !!null x", "t.yaml:1:4: cannot read \"x\" as !!null"},
        {"v: !!float .inf",
         "t.yaml:1:4: .inf is not a number JSON can hold; quote it to keep it as a string"},
        {"v: !!binary aGVsbG8=",
         "t.yaml:1:4: !!binary is not supported; write the base64 text as a plain string"},
        {"v: \"a\\0b\"", "t.yaml:1:4: string contains a NUL character (a \\0 escape)"},
        {"a: 1\nb:\n  - x\n  - \"\\x00\"",
         "t.yaml:4:5: string contains a NUL character (a \\0 escape)"},
    };
    for (size_t i = 0; i < N_ELEMS(cases); i++)
        expect_fail(cases[i].yaml, GG_ERR_PARSE, cases[i].msg);
}

/* ---- keys ------------------------------------------------------------------- */

static void test_keys(void **state)
{
    (void)state;
    static const struct ok_case cases[] = {
        /* non-string keys become text as sigs.k8s.io/yaml makes them */
        {"1: a\n0x10: b\n-7: c\n0777: d", "{\"1\":\"a\",\"16\":\"b\",\"-7\":\"c\",\"511\":\"d\"}"},
        {"1.5: a\n1e6: b\n1.0: c\n3.14159265: d\n0.0001: e\n0.00001: f\n-2.5: g\n123456.5: h\n"
         "1234567: i",
         "{\"1.5\":\"a\",\"1e+06\":\"b\",\"1\":\"c\",\"3.1415927\":\"d\",\"0.0001\":\"e\","
         "\"1e-05\":\"f\",\"-2.5\":\"g\",\"123456.5\":\"h\",\"1234567\":\"i\"}"},
        {"12345678: a\n.inf: b\n-.inf: c\n.nan: d",
         "{\"12345678\":\"a\",\".inf\":\"b\",\"-.inf\":\"c\",\".nan\":\"d\"}"},
        {"\"yes\": a\n'1': b\n!!str 2: c\n2001-12-14: d\n'<<': e\n\"\": f",
         "{\"yes\":\"a\",\"1\":\"b\",\"2\":\"c\",\"2001-12-14\":\"d\",\"<<\":\"e\",\"\":\"f\"}"},
        /* an alias as a key, and an anchored key */
        {"a: &k x\n*k : 2", "{\"a\":\"x\",\"x\":2}"},
        {"&k name: 1\nother: *k", "{\"name\":1,\"other\":\"name\"}"},
        {"a: &n 5\nb: &t yes\n*n : x\n*t : z", "{\"a\":5,\"b\":true,\"5\":\"x\",\"true\":\"z\"}"},
        {"{a: 1, \"b\": 2, 'c': 3, 4: 5}", "{\"a\":1,\"b\":2,\"c\":3,\"4\":5}"},
    };
    run_ok_cases(cases, N_ELEMS(cases));
    /* "yes", "on" and "y" are all true: one per mapping. */
    json_t *doc = load_ok("yes: a\nno: b", NULL);
    assert_json_eq(doc, "{\"true\":\"a\",\"false\":\"b\"}", "yes/no keys");
    json_decref(doc);
    doc = load_ok("on: push\nn: 1", NULL);
    assert_json_eq(doc, "{\"true\":\"push\",\"false\":1}", "on/n keys");
    json_decref(doc);
}

static void test_key_errors(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        const char *msg;
    } cases[] = {
        {"a: 1\nnull: 2",
         "t.yaml:2:1: null is not allowed as a mapping key (quote it if it is a name)"},
        {"~: 1", "t.yaml:1:1: null is not allowed as a mapping key (quote it if it is a name)"},
        {"a: 1\n? \n: 2",
         "t.yaml:2:2: null is not allowed as a mapping key (quote it if it is a name)"},
        {"[a]: 1",
         "t.yaml:1:1: a sequence cannot be a mapping key (complex keys are not supported)"},
        {"? {a: 1}\n: 2",
         "t.yaml:1:3: a mapping cannot be a mapping key (complex keys are not supported)"},
        {"x: &n ~\n*n : 1", "t.yaml:2:1: alias *n is null and cannot be a mapping key"},
        {"x: &m {a: 1}\ny:\n  *m : 1",
         "t.yaml:3:3: alias *m is a mapping and cannot be a mapping key"},
        {"99999999999999999999: a",
         "t.yaml:1:1: integer 99999999999999999999 does not fit in 64 bits; quote it to keep it "
         "as a string"},
    };
    for (size_t i = 0; i < N_ELEMS(cases); i++)
        expect_fail(cases[i].yaml, GG_ERR_PARSE, cases[i].msg);
}

static void test_duplicate_keys(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        const char *msg;
    } cases[] = {
        {"a: 1\na: 2", "t.yaml:2:1: duplicate key \"a\" at a"},
        {"spec:\n  containers:\n  - name: a\n    image: x\n  - name: b\n    image: y\n"
         "    name: c\n",
         "t.yaml:7:5: duplicate key \"name\" at spec.containers[1].name"},
        {"{a: 1, b: 2, a: 3}", "t.yaml:1:14: duplicate key \"a\" at a"},
        {"metadata:\n  labels:\n    app.kubernetes.io/name: a\n    app.kubernetes.io/name: b\n",
         "t.yaml:4:5: duplicate key \"app.kubernetes.io/name\" at "
         "metadata.labels[\"app.kubernetes.io/name\"]"},
        /* equal after the key becomes text */
        {"1: a\n\"1\": b", "t.yaml:2:1: duplicate key \"1\" at 1"},
        {"yes: a\ntrue: b", "t.yaml:2:1: duplicate key \"true\" at true"},
        {"0x10: a\n16: b", "t.yaml:2:1: duplicate key \"16\" at 16"},
        {"x:\n  <<: {a: 1}\n  <<: {b: 1}", "t.yaml:3:3: duplicate merge key << at x[\"<<\"]"},
        {"- [{a: 1}]\n- - {b: 2, b: 3}", "t.yaml:2:12: duplicate key \"b\" at [1][0].b"},
    };
    for (size_t i = 0; i < N_ELEMS(cases); i++)
        expect_fail(cases[i].yaml, GG_ERR_PARSE, cases[i].msg);
}

/* ---- streams ---------------------------------------------------------------- */

static void test_multi_document_stream(void **state)
{
    (void)state;
    char path[4096], expected_path[4096];
    size_t len = 0, elen = 0;
    char *text = read_data("stream.yaml", &len, path, sizeof(path));
    char *expected = read_data("stream.expected.json", &elen, expected_path, sizeof(path));
    struct gg_err err = {{0}};
    struct yd_stream s;
    json_t *docs = NULL, *one = NULL;
    static const size_t numbers[] = {3, 4, 5}, lines[] = {7, 15, 48};

    assert_int_equal(yd_load_stream(text, len, "stream.yaml", NULL, &s, &err), GG_OK);
    assert_int_equal(s.count, 3);
    assert_int_equal(json_array_size(s.docs), 3);
    assert_json_eq(s.docs, expected, "stream.yaml");
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(s.pos[i].number, numbers[i]);
        assert_int_equal(s.pos[i].line, lines[i]);
        assert_int_equal(s.pos[i].column, 1);
    }
    /* The anchored mapping was copied, not shared. */
    json_t *spec = json_object_get(json_array_get(s.docs, 2), "spec");
    json_t *sel = json_object_get(json_object_get(spec, "selector"), "matchLabels");
    json_t *tpl =
        json_object_get(json_object_get(json_object_get(spec, "template"), "metadata"), "labels");
    assert_ptr_not_equal(sel, tpl);
    assert_true(json_equal(sel, tpl));

    assert_int_equal(yd_load_all(text, len, "stream.yaml", NULL, &docs, &err), GG_OK);
    assert_true(json_equal(docs, s.docs));
    assert_int_equal(yd_load_one(text, len, "stream.yaml", NULL, &one, &err), GG_ERR_PARSE);
    assert_null(one);
    assert_string_equal(err.msg, "stream.yaml:15:1: expected one YAML document, found another one "
                                 "(document 4)");
    json_decref(docs);
    yd_stream_clear(&s);
    assert_null(s.docs);
    yd_stream_clear(&s); /* twice, and on NULL, is fine */
    yd_stream_clear(NULL);
    free(text);
    free(expected);
}

static void test_empty_documents(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        size_t count;
        const char *json;
        size_t first_number, first_line;
    } cases[] = {
        {"", 0, "[]", 0, 0},
        {"\n\n  \n", 0, "[]", 0, 0},
        {"# only a comment\n", 0, "[]", 0, 0},
        {"---\n", 0, "[]", 0, 0},
        {"---\n---\n...\n---\n# c\n...\n", 0, "[]", 0, 0},
        {"%YAML 1.1\n---\n", 0, "[]", 0, 0},
        {"\xEF\xBB\xBF# BOM and a comment\n", 0, "[]", 0, 0},
        {"null", 1, "[null]", 1, 1},
        {"--- ~\n", 1, "[null]", 1, 1},
        {"''", 1, "[\"\"]", 1, 1},
        {"---\n# c\n---\n\n\n  a: 1\n---\n", 1, "[{\"a\":1}]", 2, 6},
        {"a\n---\n\n---\nb\n", 2, "[\"a\",\"b\"]", 1, 1},
        {"- 1\n--- # c\n- 2\n...\n--- [3]\n", 3, "[[1],[2],[3]]", 1, 1},
    };
    for (size_t i = 0; i < N_ELEMS(cases); i++) {
        struct gg_err err = {{0}};
        struct yd_stream s;
        enum gg_status st =
            yd_load_stream(cases[i].yaml, strlen(cases[i].yaml), "t.yaml", NULL, &s, &err);
        if (st != GG_OK)
            fail_msg("case %zu: %s", i, err.msg);
        assert_int_equal(s.count, cases[i].count);
        assert_json_eq(s.docs, cases[i].json, cases[i].yaml);
        if (s.count) {
            assert_int_equal(s.pos[0].number, cases[i].first_number);
            assert_int_equal(s.pos[0].line, cases[i].first_line);
        }
        yd_stream_clear(&s);
    }
    /* The second kept document of "a / empty / b" is document 3 of the stream. */
    struct yd_stream s;
    assert_int_equal(yd_load_stream("a\n---\n\n---\nb\n", 12, NULL, NULL, &s, NULL), GG_OK);
    assert_int_equal(s.pos[1].number, 3);
    assert_int_equal(s.pos[1].line, 5);
    yd_stream_clear(&s);
}

static void test_load_one(void **state)
{
    (void)state;
    json_t *doc = load_ok("a: 1\n", NULL);
    assert_json_eq(doc, "{\"a\":1}", "a: 1");
    json_decref(doc);
    doc = load_ok("", NULL);
    assert_true(json_is_null(doc));
    doc = load_ok("# nothing\n---\n", NULL);
    assert_true(json_is_null(doc));
    doc = load_ok("---\na: 1\n---\n# trailing separator and comment\n", NULL);
    assert_json_eq(doc, "{\"a\":1}", "trailing");
    json_decref(doc);

    struct gg_err err = {{0}};
    doc = NULL;
    assert_int_equal(yd_load_one("a: 1\n---\nb: 2\n", 14, "cfg.yaml", NULL, &doc, &err),
                     GG_ERR_PARSE);
    assert_null(doc);
    assert_string_equal(err.msg,
                        "cfg.yaml:3:1: expected one YAML document, found another one (document 2)");
    /* No source name: "<input>". */
    assert_int_equal(yd_load_one("a: b: c", 7, NULL, NULL, &doc, &err), GG_ERR_PARSE);
    assert_string_equal(err.msg, "<input>:1:5: mapping values are not allowed in this context");
    /* A NULL text of length 0 is an empty text. */
    assert_int_equal(yd_load_one(NULL, 0, NULL, NULL, &doc, NULL), GG_OK);
    assert_true(json_is_null(doc));
}

/* ---- anchors and merge keys ------------------------------------------------- */

static void test_anchors_aliases(void **state)
{
    (void)state;
    static const struct ok_case cases[] = {
        {"a: &s hello\nb: *s", "{\"a\":\"hello\",\"b\":\"hello\"}"},
        {"base: &b {x: [1, 2], w: {z: true}}\ncopy: *b",
         "{\"base\":{\"x\":[1,2],\"w\":{\"z\":true}},\"copy\":{\"x\":[1,2],\"w\":{\"z\":true}}}"},
        /* a later anchor with the same name wins */
        {"a: &x 1\nb: *x\nc: &x 2\nd: *x", "{\"a\":1,\"b\":1,\"c\":2,\"d\":2}"},
        /* an alias inside an anchored node */
        {"a: &a [1]\nb: &b [*a, *a]\nc: [*b, *a]",
         "{\"a\":[1],\"b\":[[1],[1]],\"c\":[[[1],[1]],[1]]}"},
        {"--- &root\na: 1\n", "{\"a\":1}"},
        {"- &e\n- *e", "[null,null]"},
    };
    run_ok_cases(cases, N_ELEMS(cases));

    /* Copies are independent values. */
    json_t *doc = load_ok("base: &b {x: [1, 2]}\ncopy: *b", NULL);
    json_t *bx = json_object_get(json_object_get(doc, "base"), "x");
    json_t *cx = json_object_get(json_object_get(doc, "copy"), "x");
    assert_ptr_not_equal(bx, cx);
    json_array_append_new(cx, json_integer(3));
    assert_int_equal(json_array_size(bx), 2);
    json_decref(doc);

    expect_fail("a: &x 1\n---\nb: *x", GG_ERR_PARSE,
                "t.yaml:3:4: alias *x has no anchor &x before it in this document");
    expect_fail("a: *nope", GG_ERR_PARSE,
                "t.yaml:1:4: alias *nope has no anchor &nope before it in this document");
    expect_fail("a: &r [1, *r]", GG_ERR_PARSE,
                "t.yaml:1:11: alias *r refers to a node that contains it");
    expect_fail("a: &r\n  b:\n    c: *r", GG_ERR_PARSE,
                "t.yaml:3:8: alias *r refers to a node that contains it");
}

static void test_merge_keys(void **state)
{
    (void)state;
    static const struct ok_case cases[] = {
        /* written keys win, before or after the merge */
        {"b: &b {a: 1, b: 2}\nm:\n  <<: *b\n  b: 3",
         "{\"b\":{\"a\":1,\"b\":2},\"m\":{\"a\":1,\"b\":3}}"},
        {"b: &b {a: 1, b: 2}\nm:\n  b: 3\n  <<: *b",
         "{\"b\":{\"a\":1,\"b\":2},\"m\":{\"a\":1,\"b\":3}}"},
        /* in a list, the first mapping listed wins */
        {"x: &x {a: 1}\nw: &w {a: 2, b: 2}\nm:\n  <<: [*x, *w]\n  c: 3",
         "{\"x\":{\"a\":1},\"w\":{\"a\":2,\"b\":2},\"m\":{\"a\":1,\"b\":2,\"c\":3}}"},
        {"m: {<<: {a: 1, c: 9}, c: 2}", "{\"m\":{\"a\":1,\"c\":2}}"},
        {"m: {<<: [{a: 1}, {a: 2, d: 4}]}", "{\"m\":{\"a\":1,\"d\":4}}"},
        {"m: {!!merge <<: {a: 1}}", "{\"m\":{\"a\":1}}"},
        {"m: {<<: {}, <: 1}", "{\"m\":{\"<\":1}}"},
        /* merges of merges */
        {"b1: &b1 {a: 1}\nb2: &b2 {<<: *b1, c: 3}\nm: {<<: *b2, d: 4}",
         "{\"b1\":{\"a\":1},\"b2\":{\"a\":1,\"c\":3},\"m\":{\"a\":1,\"c\":3,\"d\":4}}"},
        /* quoted or tagged as a string: an ordinary key; as a value: text */
        {"m: {'<<': {a: 1}, \"x\": <<}", "{\"m\":{\"<<\":{\"a\":1},\"x\":\"<<\"}}"},
        {"m: {!!str <<: 1}", "{\"m\":{\"<<\":1}}"},
        /* the Kubernetes use: shared container settings */
        {"x-res: &res\n  limits: {nvidia.com/gpu: 1}\ncontainers:\n- name: a\n  resources:\n"
         "    <<: *res\n    requests: {cpu: 1}\n",
         "{\"x-res\":{\"limits\":{\"nvidia.com/gpu\":1}},\"containers\":[{\"name\":\"a\","
         "\"resources\":{\"limits\":{\"nvidia.com/gpu\":1},\"requests\":{\"cpu\":1}}}]}"},
    };
    run_ok_cases(cases, N_ELEMS(cases));

    expect_fail("m: {<<: 1}", GG_ERR_PARSE,
                "t.yaml:1:9: the value of a merge key (<<) must be a mapping or a sequence of "
                "mappings");
    expect_fail("m:\n  <<:\n  a: 1", GG_ERR_PARSE,
                "t.yaml:2:6: the value of a merge key (<<) must be a mapping or a sequence of "
                "mappings");
    expect_fail("s: &s [1]\nm:\n  <<: *s", GG_ERR_PARSE,
                "t.yaml:3:7: item 0 of a merge key (<<) sequence is not a mapping");
    expect_fail("s: &s 1\nm:\n  <<: *s", GG_ERR_PARSE,
                "t.yaml:3:7: the value of a merge key (<<) must be a mapping or a sequence of "
                "mappings");
    expect_fail("m:\n  <<: [{a: 1}, 2]", GG_ERR_PARSE,
                "t.yaml:2:16: item 1 of a merge key (<<) sequence is not a mapping");
    expect_fail("m:\n  <<: [[{a: 1}]]", GG_ERR_PARSE,
                "t.yaml:2:8: item 0 of a merge key (<<) sequence is not a mapping");
}

/* ---- limits ----------------------------------------------------------------- */

static double now_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void test_alias_bomb(void **state)
{
    (void)state;
    char path[4096];
    size_t len = 0;
    char *text = read_data("billion-laughs.yaml", &len, path, sizeof(path));
    struct gg_err err = {{0}};
    struct yd_limits lim;
    json_t *docs = NULL;
    double t0 = now_seconds();

    /* Defaults: the alias budget stops it at the first *e of f (75k values copied). */
    assert_int_equal(yd_load_all(text, len, "bomb.yaml", NULL, &docs, &err), GG_ERR_TOOBIG);
    assert_null(docs);
    assert_string_equal(err.msg, "bomb.yaml:7:8: alias *e expands to 66430 values, over the "
                                 "alias limit of 100000 in all (an alias bomb?)");
    /* Without an alias budget the node limit stops it. */
    yd_limits_init(&lim);
    lim.max_alias_nodes = SIZE_MAX;
    lim.max_nodes = 50000;
    assert_int_equal(yd_load_all(text, len, "bomb.yaml", &lim, &docs, &err), GG_ERR_TOOBIG);
    assert_string_equal(err.msg, "bomb.yaml:6:23: alias *d expands past the limit of 50000 values");
    if (now_seconds() - t0 > 2.0)
        fail_msg("the alias bomb took %.2f s to fail", now_seconds() - t0);

    /* The same shape, three levels deep, is fine. */
    json_t *doc = load_ok("a: &a [x, x, x]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]", NULL);
    assert_int_equal(
        json_array_size(json_array_get(json_array_get(json_object_get(doc, "c"), 2), 2)), 3);
    json_decref(doc);

    /* A few aliases of one big string: limited by bytes, not values. */
    size_t big = 10000, n = 0;
    char *s = malloc(big + 200);
    assert_non_null(s);
    n += (size_t)sprintf(s, "a: &a ");
    memset(s + n, 'x', big);
    n += big;
    n += (size_t)sprintf(s + n, "\nb: [*a, *a, *a, *a, *a, *a, *a]\n");
    yd_limits_init(&lim);
    lim.max_bytes = 65536;
    expect_fail_n(s, n, &lim, GG_ERR_TOOBIG,
                  "t.yaml:2:29: alias *a copies 10000 bytes, over the alias limit of 65536 in all "
                  "(an alias bomb?)");
    lim.max_bytes = 0; /* the default */
    assert_int_equal(yd_load_all(s, n, "t.yaml", &lim, &docs, &err), GG_OK);
    json_decref(docs);
    free(s);
    free(text);
}

/* "[[[...]]]" or a block mapping nested depth levels. */
static char *nested(size_t depth, int block)
{
    char *s = malloc(depth * (depth + 8) + 16), *p = s;

    assert_non_null(s);
    for (size_t i = 0; i < depth; i++) {
        if (block) {
            memset(p, ' ', i);
            p += i;
            p += sprintf(p, "k:\n");
        } else {
            *p++ = '[';
        }
    }
    if (block) {
        memset(p, ' ', depth);
        p += depth;
        p += sprintf(p, "v\n");
    } else {
        memset(p, ']', depth);
        p += depth;
    }
    *p = '\0';
    return s;
}

static void test_deep_nesting(void **state)
{
    (void)state;
    struct gg_err err = {{0}};
    struct yd_limits lim;
    json_t *docs = NULL;
    char *s;

    s = nested(128, 0);
    assert_int_equal(yd_load_all(s, strlen(s), "t.yaml", NULL, &docs, &err), GG_OK);
    json_decref(docs);
    free(s);
    s = nested(129, 0); /* read as JSON first, then as YAML for the position */
    expect_fail(s, GG_ERR_TOOBIG, "t.yaml:1:129: nesting deeper than 128 levels");
    free(s);
    s = nested(5000, 0); /* deeper than jansson's own limit */
    expect_fail(s, GG_ERR_TOOBIG, "t.yaml:1:129: nesting deeper than 128 levels");
    free(s);
    s = nested(128, 1);
    assert_int_equal(yd_load_all(s, strlen(s), "t.yaml", NULL, &docs, &err), GG_OK);
    json_decref(docs);
    free(s);
    s = nested(129, 1);
    expect_fail(s, GG_ERR_TOOBIG, "t.yaml:129:129: nesting deeper than 128 levels");
    free(s);

    yd_limits_init(&lim);
    lim.max_depth = 3;
    json_t *doc = load_ok("a: {b: {c: 1}}", &lim);
    json_decref(doc);
    expect_fail_lim("a: {b: {c: {}}}", &lim, GG_ERR_TOOBIG,
                    "t.yaml:1:12: nesting deeper than 3 levels");
    /* An alias brings its own levels: 1 (top) + 1 (y's list) + 2 (*x) = 4. */
    const char *alias = "x: &x {a: {b: 1}}\ny: [*x]";
    expect_fail_lim(alias, &lim, GG_ERR_TOOBIG, "t.yaml:2:5: alias *x nests deeper than 3 levels");
    const char *merge = "x: &x {a: {b: 1}}\ny: {<<: *x}";
    doc = load_ok(merge, &lim); /* a merge adds no level */
    json_decref(doc);
}

static void test_node_and_size_limits(void **state)
{
    (void)state;
    struct yd_limits lim;
    json_t *doc;

    yd_limits_init(&lim);
    lim.max_nodes = 10;
    doc = load_ok("[1, 2, 3, 4, 5, 6, 7, 8, 9]", &lim);
    json_decref(doc);
    expect_fail_lim("[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]", &lim, GG_ERR_TOOBIG,
                    "t.yaml:1:29: more than 10 values (the node limit)");
    expect_fail_lim("a: 1\nb: 2\nc: [3, 4, {d: 5, e: 6, f: 7}]\ng: 8\nh: 9\n", &lim, GG_ERR_TOOBIG,
                    "t.yaml:4:4: more than 10 values (the node limit)");
    /* The limit is for the whole stream. */
    expect_fail_lim("[1, 2, 3]\n---\n[4, 5, 6]\n---\n[7, 8, 9]", &lim, GG_ERR_TOOBIG,
                    "t.yaml:5:5: more than 10 values (the node limit)");
    /* A concatenated JSON stream: the second value fails at its start. */
    expect_fail_lim("[1, 2, 3]\n  [4, 5, 6, 7, 8, 9]", &lim, GG_ERR_TOOBIG,
                    "t.yaml:2:3: more than 10 values in this JSON document (the node limit)");

    yd_limits_init(&lim);
    lim.max_bytes = 16;
    doc = load_ok("a: 123456789012", &lim);
    json_decref(doc);
    expect_fail_lim("a: 1\nb: 234567890123", &lim, GG_ERR_TOOBIG,
                    "t.yaml:2:12: input is 20 bytes, over the limit of 16");

    yd_limits_init(&lim);
    assert_int_equal(lim.max_bytes, YD_DEFAULT_MAX_BYTES);
    assert_int_equal(lim.max_depth, YD_DEFAULT_MAX_DEPTH);
    assert_int_equal(lim.max_nodes, YD_DEFAULT_MAX_NODES);
    assert_int_equal(lim.max_alias_nodes, YD_DEFAULT_MAX_ALIAS_NODES);
    /* Zero fields are the defaults. */
    struct yd_limits zero = {0};
    char *s = nested(129, 0);
    expect_fail_lim(s, &zero, GG_ERR_TOOBIG, "t.yaml:1:129: nesting deeper than 128 levels");
    free(s);
}

/* ---- syntax errors ---------------------------------------------------------- */

static void test_syntax_errors(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        const char *msg;
    } cases[] = {
        {"a: b: c", "t.yaml:1:5: mapping values are not allowed in this context"},
        {"apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n  labels: a: b\n",
         "t.yaml:5:12: mapping values are not allowed in this context"},
        {"a:\n\tb: 1",
         "t.yaml:2:1: found character that cannot start any token (while scanning for the next "
         "token)"},
        {"a: 'unterminated\n",
         "t.yaml:2:1: found unexpected end of stream (while scanning a quoted scalar at line 1, "
         "column 4)"},
        {"a: [1, 2\nb: 3",
         "t.yaml:2:2: did not find expected ',' or ']' (while parsing a flow sequence at line 1, "
         "column 4)"},
        {"a:\n  b: 1\n c: 2",
         "t.yaml:3:2: did not find expected key (while parsing a block mapping at line 1, column "
         "1)"},
        {"- a\nb: c",
         "t.yaml:2:1: did not find expected '-' indicator (while parsing a block collection at "
         "line 1, column 1)"},
        {"key: value\n- item",
         "t.yaml:2:1: did not find expected key (while parsing a block mapping at line 1, column "
         "1)"},
        {"a: @x",
         "t.yaml:1:4: found character that cannot start any token (while scanning for the next "
         "token)"},
        {"a: 1\n---\nb: [\n",
         "t.yaml:4:1: did not find expected node content (while parsing a flow node)"},
        {"a: *", "t.yaml:1:5: did not find expected alphabetic or numeric character (while "
                 "scanning an alias at line 1, column 4)"},
        {"a: \"\\q\"",
         "t.yaml:1:5: found unknown escape character (while parsing a quoted scalar at line 1, "
         "column 4)"},
        {"{\"a\": 1,, \"b\": 2}",
         "t.yaml:1:9: did not find expected node content (while parsing a flow node)"},
        /* columns count characters, not bytes */
        {"caf\xC3\xA9: b: c", "t.yaml:1:8: mapping values are not allowed in this context"},
        {"\xE5\x90\x8D\xE5\x89\x8D: [\n  \xE5\x80\xA4: x: y]",
         "t.yaml:2:7: did not find expected ',' or ']' (while parsing a flow sequence at line 1, "
         "column 5)"},
    };
    for (size_t i = 0; i < N_ELEMS(cases); i++)
        expect_fail(cases[i].yaml, GG_ERR_PARSE, cases[i].msg);
}

/* ---- JSON ------------------------------------------------------------------- */

static void test_json_input(void **state)
{
    (void)state;
    static const struct ok_case cases[] = {
        {"{\"a\": 1.0, \"b\": 2.5, \"c\": 1e2, \"d\": -0.0, \"e\": [true, false, null]}",
         "{\"a\":1,\"b\":2.5,\"c\":100,\"d\":0,\"e\":[true,false,null]}"},
        /* surrogate pairs: only the JSON reading can do them */
        {"{\"s\": \"\\ud83d\\ude80 caf\\u00e9 \\/\"}", "{\"s\":\"\\ud83d\\ude80 caf\\u00e9 /\"}"},
        {"\xEF\xBB\xBF{\"bom\": true}", "{\"bom\":true}"},
        {"  \n [1, \"yes\", \"0x10\"]", "[1,\"yes\",\"0x10\"]"},
        /* the YAML reading takes what JSON will not */
        {"{a: yes, \"b\": 0x10,}", "{\"a\":true,\"b\":16}"},
        {"{\"kind\": \"Pod\"} # a comment", "{\"kind\":\"Pod\"}"},
        {"{\"a\": 1} \n", "{\"a\":1}"},
        {"[1, 2]\n...\n", "[1,2]"},
    };
    run_ok_cases(cases, N_ELEMS(cases));

    /* A concatenated stream, as `jq -c` or a JSON List writer makes it. */
    char path[4096];
    size_t len = 0;
    char *text = read_data("concat.json", &len, path, sizeof(path));
    struct gg_err err = {{0}};
    struct yd_stream s;
    assert_int_equal(yd_load_stream(text, len, "concat.json", NULL, &s, &err), GG_OK);
    assert_int_equal(s.count, 3);
    assert_int_equal(s.pos[0].line, 1);
    assert_int_equal(s.pos[1].line, 4);
    assert_int_equal(s.pos[2].line, 6);
    assert_int_equal(s.pos[2].column, 3);
    assert_int_equal(s.pos[2].number, 3);
    assert_json_eq(json_array_get(s.docs, 2), "[1,2.5,true,null]", text);
    json_t *pod = json_array_get(s.docs, 0);
    assert_string_equal(
        json_string_value(json_object_get(
            json_object_get(json_object_get(pod, "metadata"), "annotations"), "note")),
        "caf\xC3\xA9 \xF0\x9F\x9A\x80");
    json_t *limits = json_object_get(
        json_object_get(
            json_array_get(json_object_get(json_object_get(pod, "spec"), "containers"), 0),
            "resources"),
        "limits");
    assert_true(json_is_integer(json_object_get(limits, "nvidia.com/gpu")));
    yd_stream_clear(&s);
    free(text);

    /* JSON followed by YAML documents: all read as YAML. */
    json_t *docs = NULL;
    const char *mixed = "{\"a\": 1}\n---\nb: 2\n";
    assert_int_equal(yd_load_all(mixed, strlen(mixed), "t.yaml", NULL, &docs, &err), GG_OK);
    assert_json_eq(docs, "[{\"a\":1},{\"b\":2}]", mixed);
    json_decref(docs);

    /* Errors in the first value come from the YAML reading, with its positions. */
    expect_fail("{\"a\": 1,\n \"a\": 2}", GG_ERR_PARSE, "t.yaml:2:2: duplicate key \"a\" at a");
    expect_fail("{\"n\": 123456789012345678901234567890}", GG_ERR_PARSE,
                "t.yaml:1:7: integer 123456789012345678901234567890 does not fit in 64 bits; "
                "quote it to keep it as a string");
    expect_fail("{\"n\": 1e999}", GG_ERR_PARSE,
                "t.yaml:1:7: number 1e999 is out of range; quote it to keep it as a string");
    expect_fail("{\"a\": [1, 2}", GG_ERR_PARSE,
                "t.yaml:1:12: did not find expected ',' or ']' (while parsing a flow sequence at "
                "line 1, column 7)");
    /* Errors in a later value of a concatenated stream are jansson's. */
    expect_fail("{\"a\": 1}\n{\"b\": 1,\n \"b\": 2}", GG_ERR_PARSE,
                "t.yaml:3:4: duplicate object key near '\"b\"'");
    expect_fail("{}\n  {]", GG_ERR_PARSE, "t.yaml:2:4: string or '}' expected near ']'");
    expect_fail("[]\n[\"\\u0000\"]", GG_ERR_PARSE,
                "t.yaml:2:9: \\u0000 is not allowed without JSON_ALLOW_NUL near '\"\\u0000\"'");
}

/* ---- encodings -------------------------------------------------------------- */

static void test_unicode(void **state)
{
    (void)state;
    static const struct ok_case cases[] = {
        {"\xE5\x90\x8D\xE5\x89\x8D: \xE5\x80\xA4", "{\"\\u540d\\u524d\":\"\\u5024\"}"},
        {"emoji: \xF0\x9F\x9A\x80\nrtl: \xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D",
         "{\"emoji\":\"\\ud83d\\ude80\",\"rtl\":\"\\u05e9\\u05dc\\u05d5\\u05dd\"}"},
        {"e: \"\\u00e9\\U0001F680\\N\\_\"", "{\"e\":\"\\u00e9\\ud83d\\ude80\\u0085\\u00a0\"}"},
        {"\xEF\xBB\xBF"
         "a: 1",
         "{\"a\":1}"},
        {"k\xC3\xA9y: [\xC3\xA9, \"\xC3\xA9\"]", "{\"k\\u00e9y\":[\"\\u00e9\",\"\\u00e9\"]}"},
    };
    run_ok_cases(cases, N_ELEMS(cases));
    /* The BOM is not a column. */
    expect_fail("\xEF\xBB\xBF"
                "a: b: c",
                GG_ERR_PARSE, "t.yaml:1:5: mapping values are not allowed in this context");
}

static void test_binary_input(void **state)
{
    (void)state;
    static const struct {
        const char *bytes;
        size_t len;
        const char *msg;
    } cases[] = {
        {"a: b\0c", 6, "t.yaml:1:5: NUL byte in the text (binary data is not YAML)"},
        {"a: 1\n\0", 6, "t.yaml:2:1: NUL byte in the text (binary data is not YAML)"},
        {"a: \xFF", 4, "t.yaml:1:4: invalid UTF-8 (byte 0xff); YAML text must be UTF-8"},
        {"a: \xC0\x80", 5, "t.yaml:1:4: invalid UTF-8 (byte 0xc0); YAML text must be UTF-8"},
        {"a: \xE0\x80\x80", 6, "t.yaml:1:4: invalid UTF-8 (byte 0xe0); YAML text must be UTF-8"},
        {"a: \xED\xA0\x80", 6, "t.yaml:1:4: invalid UTF-8 (byte 0xed); YAML text must be UTF-8"},
        {"a: \xF4\x90\x80\x80", 7,
         "t.yaml:1:4: invalid UTF-8 (byte 0xf4); YAML text must be UTF-8"},
        {"a: \xE2\x82", 5, "t.yaml:1:4: invalid UTF-8 (byte 0xe2); YAML text must be UTF-8"},
        {"\xC3\xA9\xC3\xA9: \x80", 7,
         "t.yaml:1:5: invalid UTF-8 (byte 0x80); YAML text must be UTF-8"},
        {"\x89PNG\r\n\x1A\n", 8, "t.yaml:1:1: invalid UTF-8 (byte 0x89); YAML text must be UTF-8"},
        {"\xFF\xFE"
         "a\0:\0",
         6, "t.yaml:1:1: UTF-16 text is not supported; convert the file to UTF-8"},
        {"\xFE\xFF\0a", 4, "t.yaml:1:1: UTF-16 text is not supported; convert the file to UTF-8"},
        /* valid UTF-8 that YAML does not allow: libyaml's reader, by offset */
        {"a: \x01", 4, "t.yaml:1:4: control characters are not allowed (U+0001)"},
        {"x: 1\ny: \x7F", 9, "t.yaml:2:4: control characters are not allowed (U+007F)"},
        {"x: \xC3\xA9\xC2\x80", 7, "t.yaml:1:5: control characters are not allowed (U+0080)"},
    };
    for (size_t i = 0; i < N_ELEMS(cases); i++)
        expect_fail_n(cases[i].bytes, cases[i].len, NULL, GG_ERR_PARSE, cases[i].msg);
}

/* ---- the public corpus ------------------------------------------------------ */

static void test_corpus(void **state)
{
    (void)state;
    const char *root = getenv("GPUGUARD_CORPUS");
    DIR *top;
    struct dirent *de;
    size_t files = 0, docs = 0;

    root = root && *root ? root : YD_CORPUS;
    top = opendir(root);
    if (!top) {
        print_message("no corpus at %s; skipped\n", root);
        skip();
    }
    while ((de = readdir(top))) {
        char dir_path[4096];
        DIR *sub;
        struct dirent *fe;

        if (de->d_name[0] == '.')
            continue;
        snprintf(dir_path, sizeof(dir_path), "%s/%s", root, de->d_name);
        sub = opendir(dir_path);
        if (!sub)
            continue; /* SOURCES.md and other files at the top */
        while ((fe = readdir(sub))) {
            char path[8192];
            size_t len = 0;
            char *text;
            struct gg_err err = {{0}};
            struct yd_stream s;

            if (fe->d_name[0] == '.' || strstr(fe->d_name, ".md"))
                continue;
            snprintf(path, sizeof(path), "%s/%s", dir_path, fe->d_name);
            text = read_path(path, &len);
            if (!text)
                continue; /* not a regular file */
            if (yd_load_stream(text, len, path, NULL, &s, &err) != GG_OK)
                fail_msg("%s", err.msg);
            if (s.count == 0)
                fail_msg("%s: no documents", path);
            for (size_t i = 0; i < s.count; i++)
                if (!json_is_object(json_array_get(s.docs, i)))
                    fail_msg("%s: document %zu (line %zu) is not a mapping", path, s.pos[i].number,
                             s.pos[i].line);
            files++;
            docs += s.count;
            yd_stream_clear(&s);
            free(text);
        }
        closedir(sub);
    }
    closedir(top);
    assert_true(files > 0);
    print_message("corpus: %zu files, %zu documents\n", files, docs);
}

/* ---- allocation failures ---------------------------------------------------- */

/* Fail the Nth jansson allocation (one-shot), as jansson's own tests do. */
struct chaos {
    long countdown;
    int failed;
};
static struct chaos chaos_state;

static void *chaos_malloc(size_t n)
{
    if (chaos_state.countdown >= 0 && chaos_state.countdown-- == 0) {
        chaos_state.failed = 1;
        return NULL;
    }
    return malloc(n);
}

static void test_alloc_failures(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int json; /* jansson reports some allocation failures as syntax errors */
    } inputs[] = {
        {"a: &a {x: [1, 2.5, yes, ~, \"s\"]}\nb: *a\nc:\n  <<: [*a, {w: 1}]\n  z: |\n    t\n"
         "---\n- 1\n- [2]\n",
         0},
        {"{\"a\": [1, 2.0, {\"b\": \"c\"}]}\n{\"d\": 1}", 1},
        {"&k key: *k\n*k : 1", 0}, /* fails anyway: a duplicate key */
    };
    for (size_t i = 0; i < N_ELEMS(inputs); i++) {
        struct gg_err err = {{0}};
        json_t *clean = NULL;
        enum gg_status want =
            yd_load_all(inputs[i].text, strlen(inputs[i].text), "t", NULL, &clean, &err);

        for (long nth = 0;; nth++) {
            json_t *docs = NULL;
            enum gg_status st;

            chaos_state = (struct chaos){nth, 0};
            json_set_alloc_funcs(chaos_malloc, free);
            st = yd_load_all(inputs[i].text, strlen(inputs[i].text), "t", NULL, &docs, &err);
            json_set_alloc_funcs(malloc, free);
            chaos_state.countdown = -1;
            if (!chaos_state.failed) {
                assert_int_equal(st, want);
                json_decref(docs);
                break;
            }
            /* A failed allocation is out of memory, or (in the JSON reading) retried as YAML. */
            if (st == GG_ERR_NOMEM)
                assert_non_null(strstr(err.msg, "out of memory"));
            else if (st == GG_OK)
                assert_true(json_equal(docs, clean));
            else if (st != want && !(inputs[i].json && st == GG_ERR_PARSE))
                fail_msg("input %zu, allocation %ld failed: %s", i, nth, err.msg);
            json_decref(docs);
        }
        json_decref(clean);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars),
        cmocka_unit_test(test_scalar_errors),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_key_errors),
        cmocka_unit_test(test_duplicate_keys),
        cmocka_unit_test(test_multi_document_stream),
        cmocka_unit_test(test_empty_documents),
        cmocka_unit_test(test_load_one),
        cmocka_unit_test(test_anchors_aliases),
        cmocka_unit_test(test_merge_keys),
        cmocka_unit_test(test_alias_bomb),
        cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_node_and_size_limits),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_json_input),
        cmocka_unit_test(test_unicode),
        cmocka_unit_test(test_binary_input),
        cmocka_unit_test(test_corpus),
        cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
