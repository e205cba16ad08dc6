/*
 * test_jsonpatch.c - unit tests for webhook/codec/jsonpatch.c: pointers, diff,
 * apply, the limits, every allocation failure, and table-driven runs of
 *   tests/data/json-patch-tests/{tests,spec_tests}.json  (public conformance
 *       suite: `expected` must be produced, `error` must fail),
 *   tests/data/jsonpatch/extra_tests.json  (ours, same format: RFC choices
 *       where the API server's v4 library differs, pointer edge cases),
 *   tests/data/jsonpatch/diff_cases.json   (ours: exact jp_diff output).
 *
 * The data directory is $GPUGUARD_TEST_DATA, else JP_TEST_DATA (default
 * "tests/data", right when run from the repository root as `make unit` does).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/gpuguard.h"
#include "codec/jsonpatch.h"
#include "util/jsonfast.h"
#include "testjson.h"

#ifndef JP_TEST_DATA
#define JP_TEST_DATA "tests/data"
#endif

/* ---- helpers ---------------------------------------------------------------- */

/* Fail with both documents printed unless got equals want (jansson equality). */
static void assert_json_equal(const json_t *got, const json_t *want)
{
    char *g, *w;

    if (json_equal(got, want))
        return;
    g = json_dumps(got, JSON_COMPACT | JSON_ENCODE_ANY | JSON_SORT_KEYS);
    w = json_dumps(want, JSON_COMPACT | JSON_ENCODE_ANY | JSON_SORT_KEYS);
    print_error("got:  %s\nwant: %s\n", g ? g : "(null)", w ? w : "(null)");
    free(g);
    free(w);
    fail();
}

static void assert_json_text(const json_t *got, const char *want_text)
{
    json_t *want = js(want_text);

    assert_json_equal(got, want);
    json_decref(want);
}

/* jp_diff must give want_patch exactly, and the patch must turn a into b. */
static void check_diff(const char *a_text, const char *b_text, const char *want_patch)
{
    json_t *a = js(a_text), *b = js(b_text), *patch = NULL, *out = NULL;
    struct gg_err err = {{0}};

    assert_int_equal(jp_diff(a, b, &patch, &err), GG_OK);
    assert_json_text(patch, want_patch);
    assert_int_equal(jp_apply_copy(a, patch, &out, &err), GG_OK);
    assert_json_equal(out, b);
    json_decref(out);
    json_decref(patch);
    json_decref(b);
    json_decref(a);
}

/* A pointer of n tokens "/a/a/...". */
static char *deep_pointer(size_t n)
{
    char *p = malloc(2 * n + 1);
    size_t i;

    assert_non_null(p);
    for (i = 0; i < n; i++)
        memcpy(p + 2 * i, "/a", 2);
    p[2 * n] = '\0';
    return p;
}

/* {"a": {"a": ... leaf ...}} with n levels of "a". */
static json_t *nested(size_t n, json_t *leaf)
{
    json_t *v = leaf;
    size_t i;

    for (i = 0; i < n; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "a", v);
        v = o;
    }
    return v;
}

/* ---- pointers ---------------------------------------------------------------- */

static void test_escape(void **state)
{
    char buf[32];

    (void)state;
    assert_int_equal(jp_escape("a/b~c", 5, buf, sizeof(buf)), 7);
    assert_string_equal(buf, "a~1b~0c");
    assert_int_equal(jp_escape("~1", 2, buf, sizeof(buf)), 3);
    assert_string_equal(buf, "~01");
    assert_int_equal(jp_escape("", 0, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "");
    /* Truncation keeps a NUL and still reports the full length. */
    assert_int_equal(jp_escape("//", 2, buf, 3), 4);
    assert_string_equal(buf, "~1");
    assert_int_equal(jp_escape("//", 2, NULL, 0), 4);
}

static void test_pointer_parse(void **state)
{
    struct {
        const char *pointer;
        const char *tokens;
    } ok[] = {
        {"", "[]"},
        {"/", "[\"\"]"},
        {"//", "[\"\", \"\"]"},
        {"/a~1b/~01", "[\"a/b\", \"~1\"]"},
        {"/m~0n/0/-", "[\"m~n\", \"0\", \"-\"]"},
        {"/ü/名前", "[\"ü\", \"名前\"]"},
    };
    const char *bad[] = {"a", "a/b", "/~", "/a~2", "/~a", "#/a"};
    struct gg_err err = {{0}};
    json_t *tokens;
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        assert_int_equal(jp_pointer_parse(ok[i].pointer, &tokens, &err), GG_OK);
        assert_json_text(tokens, ok[i].tokens);
        json_decref(tokens);
    }
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tokens = NULL;
        assert_int_equal(jp_pointer_parse(bad[i], &tokens, &err), GG_ERR_PARSE);
        assert_null(tokens);
    }
}

static void test_pointer_depth(void **state)
{
    char *p = deep_pointer(JP_MAX_DEPTH);
    char *q = deep_pointer(JP_MAX_DEPTH + 1);
    struct gg_err err = {{0}};
    json_t *tokens = NULL;

    (void)state;
    assert_int_equal(jp_pointer_parse(p, &tokens, &err), GG_OK);
    assert_int_equal(json_array_size(tokens), JP_MAX_DEPTH);
    json_decref(tokens);
    tokens = NULL;
    assert_int_equal(jp_pointer_parse(q, &tokens, &err), GG_ERR_TOOBIG);
    assert_null(tokens);
    assert_non_null(strstr(err.msg, "reference tokens"));
    free(p);
    free(q);
}

static void test_pointer_get(void **state)
{
    json_t *doc = js("{\"a\": [10, {\"b/c\": null, \"~\": 2}], \"\": 3, \"0\": 4}");
    struct gg_err err = {{0}};
    json_t *v;

    (void)state;
    assert_int_equal(jp_pointer_get(doc, "", &v, &err), GG_OK);
    assert_ptr_equal(v, doc);
    assert_int_equal(jp_pointer_get(doc, "/a/0", &v, &err), GG_OK);
    assert_int_equal(json_integer_value(v), 10);
    assert_int_equal(jp_pointer_get(doc, "/a/1/b~1c", &v, &err), GG_OK);
    assert_true(json_is_null(v));
    assert_int_equal(jp_pointer_get(doc, "/a/1/~0", &v, &err), GG_OK);
    assert_int_equal(json_integer_value(v), 2);
    assert_int_equal(jp_pointer_get(doc, "/", &v, &err), GG_OK);
    assert_int_equal(json_integer_value(v), 3);
    assert_int_equal(jp_pointer_get(doc, "/0", &v, &err), GG_OK);
    assert_int_equal(json_integer_value(v), 4);
    assert_int_equal(jp_pointer_get(doc, "/a/2", &v, &err), GG_ERR_INVALID);
    assert_int_equal(jp_pointer_get(doc, "/a/-", &v, &err), GG_ERR_INVALID);
    assert_int_equal(jp_pointer_get(doc, "/a/00", &v, &err), GG_ERR_INVALID);
    assert_int_equal(jp_pointer_get(doc, "/a/0/x", &v, &err), GG_ERR_INVALID);
    assert_int_equal(jp_pointer_get(doc, "/missing", &v, &err), GG_ERR_INVALID);
    assert_non_null(strstr(err.msg, "/missing"));
    assert_int_equal(jp_pointer_get(doc, "a", &v, &err), GG_ERR_PARSE);
    json_decref(doc);
}

/* ---- equality ---------------------------------------------------------------- */

static void test_equal(void **state)
{
    struct {
        const char *a, *b;
        int equal;
    } cases[] = {
        {"1", "1.0", 1},
        {"-0.0", "0", 1},
        {"1e2", "100", 1},
        {"1.5", "1", 0},
        {"9007199254740993", "9007199254740992.0", 0},
        {"9223372036854775807", "9.3e18", 0},
        {"true", "1", 0},
        {"null", "false", 0},
        {"\"a\"", "\"\\u0061\"", 1},
        {"[1, 2]", "[2, 1]", 0},
        {"{\"a\": 1, \"b\": [1.0]}", "{\"b\": [1], \"a\": 1.0}", 1},
        {"{\"a\": 1}", "{\"a\": 1, \"b\": null}", 0},
        {"{}", "[]", 0},
    };
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *a = js(cases[i].a), *b = js(cases[i].b);
        if (jp_equal(a, b) != cases[i].equal || jp_equal(b, a) != cases[i].equal)
            fail_msg("jp_equal(%s, %s) should be %d", cases[i].a, cases[i].b, cases[i].equal);
        json_decref(a);
        json_decref(b);
    }
}

/* ---- diff ---------------------------------------------------------------------- */

static void test_diff_pod(void **state)
{
    (void)state;
    check_diff("{\"metadata\": {\"name\": \"p\"}, \"spec\": {\"containers\": [{\"name\": \"a\"}]}}",
               "{\"metadata\": {\"name\": \"p\", \"labels\": {\"gpuguard.io/class\": \"train\"}},"
               " \"spec\": {\"containers\": [{\"name\": \"a\", \"resources\": {\"limits\":"
               " {\"nvidia.com/gpu\": 1}}}], \"tolerations\": []}}",
               "[{\"op\": \"add\", \"path\": \"/metadata/labels\", \"value\":"
               " {\"gpuguard.io/class\": \"train\"}},"
               " {\"op\": \"add\", \"path\": \"/spec/containers/0/resources\", \"value\":"
               " {\"limits\": {\"nvidia.com/gpu\": 1}}},"
               " {\"op\": \"add\", \"path\": \"/spec/tolerations\", \"value\": []}]");
}

static void test_diff_roots(void **state)
{
    struct gg_err err = {{0}};
    json_t *patch = NULL, *obj = js("{}"), *arr = js("[]"), *one = js("1"), *two = js("2");

    (void)state;
    assert_int_equal(jp_diff(obj, arr, &patch, &err), GG_ERR_INVALID);
    assert_null(patch);
    assert_non_null(strstr(err.msg, "object"));
    assert_int_equal(jp_diff(one, two, &patch, &err), GG_ERR_INVALID);
    assert_int_equal(jp_diff(one, one, &patch, &err), GG_OK);
    assert_json_text(patch, "[]");
    json_decref(patch);
    assert_int_equal(jp_diff(NULL, obj, &patch, &err), GG_ERR_INVALID);
    json_decref(obj);
    json_decref(arr);
    json_decref(one);
    json_decref(two);
}

/* Two insertion orders give the same patch, in byte order of the raw keys. */
static void test_diff_deterministic(void **state)
{
    const char *keys[] = {"zeta", "alpha", "Mu", "a/b", "a~b", "", "é", "10", "9"};
    size_t n = sizeof(keys) / sizeof(keys[0]), i;
    json_t *a = json_object(), *b1 = json_object(), *b2 = json_object(), *p1, *p2;
    struct gg_err err = {{0}};
    char *s1, *s2;

    (void)state;
    for (i = 0; i < n; i++) {
        json_object_set_new(b1, keys[i], json_integer((json_int_t)i));
        json_object_set_new(b2, keys[n - 1 - i], json_integer((json_int_t)(n - 1 - i)));
    }
    assert_int_equal(jp_diff(a, b1, &p1, &err), GG_OK);
    assert_int_equal(jp_diff(a, b2, &p2, &err), GG_OK);
    s1 = json_dumps(p1, JSON_COMPACT);
    s2 = json_dumps(p2, JSON_COMPACT);
    assert_string_equal(s1, s2);
    assert_string_equal(s1, "[{\"op\":\"add\",\"path\":\"/\",\"value\":5},"
                            "{\"op\":\"add\",\"path\":\"/10\",\"value\":7},"
                            "{\"op\":\"add\",\"path\":\"/9\",\"value\":8},"
                            "{\"op\":\"add\",\"path\":\"/Mu\",\"value\":2},"
                            "{\"op\":\"add\",\"path\":\"/a~1b\",\"value\":3},"
                            "{\"op\":\"add\",\"path\":\"/alpha\",\"value\":1},"
                            "{\"op\":\"add\",\"path\":\"/a~0b\",\"value\":4},"
                            "{\"op\":\"add\",\"path\":\"/zeta\",\"value\":0},"
                            "{\"op\":\"add\",\"path\":\"/\xc3\xa9\",\"value\":6}]");
    free(s1);
    free(s2);
    json_decref(p1);
    json_decref(p2);
    json_decref(a);
    json_decref(b1);
    json_decref(b2);
}

/* The patch holds copies: changing the edited document later does not change it. */
/* Ops hold edited's own values (no copies), and keep them alive. */
static void test_diff_shares_values(void **state)
{
    json_t *a = js("{}"), *b = js("{\"x\": {\"y\": 1}}"), *patch;
    struct gg_err err = {{0}};

    (void)state;
    assert_int_equal(jp_diff(a, b, &patch, &err), GG_OK);
    assert_ptr_equal(json_object_get(json_array_get(patch, 0), "value"), json_object_get(b, "x"));
    json_decref(b);
    assert_json_text(patch, "[{\"op\": \"add\", \"path\": \"/x\", \"value\": {\"y\": 1}}]");
    json_decref(patch);
    json_decref(a);
}

/* Below JP_MAX_DEPTH the differing subtree is replaced whole. */
static void test_diff_depth_limit(void **state)
{
    json_t *a = nested(JP_MAX_DEPTH + 40, json_integer(1));
    json_t *b = nested(JP_MAX_DEPTH + 40, json_integer(2));
    json_t *patch, *out, *tokens;
    struct gg_err err = {{0}};
    const char *path;

    (void)state;
    assert_int_equal(jp_diff(a, b, &patch, &err), GG_OK);
    assert_int_equal(json_array_size(patch), 1);
    path = json_string_value(json_object_get(json_array_get(patch, 0), "path"));
    assert_string_equal(json_string_value(json_object_get(json_array_get(patch, 0), "op")),
                        "replace");
    assert_int_equal(jp_pointer_parse(path, &tokens, &err), GG_OK);
    assert_int_equal(json_array_size(tokens), JP_MAX_DEPTH);
    assert_int_equal(jp_apply_copy(a, patch, &out, &err), GG_OK);
    assert_json_equal(out, b);
    json_decref(out);
    json_decref(tokens);
    json_decref(patch);
    json_decref(a);
    json_decref(b);
}

static void test_diff_max_ops(void **state)
{
    json_t *a = json_object(), *b = json_object(), *patch = NULL;
    struct gg_err err = {{0}};
    char key[32];
    size_t i;

    (void)state;
    for (i = 0; i < JP_MAX_OPS; i++) {
        snprintf(key, sizeof(key), "k%06zu", i);
        json_object_set_new(b, key, json_true());
    }
    assert_int_equal(jp_diff(a, b, &patch, &err), GG_OK);
    assert_int_equal(json_array_size(patch), JP_MAX_OPS);
    json_decref(patch);
    patch = NULL;
    json_object_set_new(b, "one-more", json_true());
    assert_int_equal(jp_diff(a, b, &patch, &err), GG_ERR_TOOBIG);
    assert_null(patch);
    assert_non_null(strstr(err.msg, "operations"));
    json_decref(a);
    json_decref(b);
}

static void test_diff_nul_key(void **state)
{
    json_t *a = json_object(), *b = json_object(), *patch = NULL;
    struct gg_err err = {{0}};

    (void)state;
    json_object_setn_new(b, "a\0b", 3, json_true());
    assert_int_equal(jp_diff(a, b, &patch, &err), GG_ERR_INVALID);
    assert_null(patch);
    json_decref(a);
    json_decref(b);
}

/* ---- apply --------------------------------------------------------------------- */

static void test_apply_error_message(void **state)
{
    json_t *doc = js("{\"a\": {\"b\": 1}}");
    json_t *patch = js("[{\"op\": \"test\", \"path\": \"/a/b\", \"value\": 1},"
                       " {\"op\": \"add\", \"path\": \"/c\", \"value\": 2},"
                       " {\"op\": \"replace\", \"path\": \"/a/missing\", \"value\": 3}]");
    json_t *move = js("[{\"op\": \"move\", \"from\": \"/x\", \"path\": \"/y\"}]");
    struct gg_err err = {{0}};

    (void)state;
    assert_int_equal(jp_apply(doc, patch, &err), GG_ERR_INVALID);
    assert_non_null(strstr(err.msg, "patch op 2"));
    assert_non_null(strstr(err.msg, "replace"));
    assert_non_null(strstr(err.msg, "/a/missing"));
    assert_non_null(strstr(err.msg, "\"missing\" not found"));
    assert_int_equal(jp_apply(doc, move, &err), GG_ERR_INVALID);
    assert_string_equal(err.msg, "patch op 0 (move /y from /x): member \"x\" not found");
    json_decref(move);
    json_decref(patch);
    json_decref(doc);
}

/* A failing op leaves the document as it was, whatever the ops before it did. */
static void test_apply_atomic(void **state)
{
    json_t *doc = js("{\"a\": [1, 2], \"b\": {\"c\": 1}}");
    json_t *before = json_deep_copy(doc);
    json_t *patch = js("[{\"op\": \"remove\", \"path\": \"/a/0\"},"
                       " {\"op\": \"add\", \"path\": \"/b/d\", \"value\": 2},"
                       " {\"op\": \"move\", \"from\": \"/b\", \"path\": \"/e\"},"
                       " {\"op\": \"remove\", \"path\": \"/nope\"}]");
    struct gg_err err = {{0}};
    json_t *out = NULL;

    (void)state;
    assert_int_equal(jp_apply(doc, patch, &err), GG_ERR_INVALID);
    assert_json_equal(doc, before);
    assert_int_equal(jp_apply_copy(doc, patch, &out, &err), GG_ERR_INVALID);
    assert_null(out);
    assert_json_equal(doc, before);
    json_decref(patch);
    json_decref(before);
    json_decref(doc);
}

/* In place: the caller's reference stays valid and sees the result. */
static void test_apply_in_place(void **state)
{
    json_t *doc = js("{\"a\": 1, \"b\": 2}");
    json_t *arr = js("[1, 2, 3]");
    json_t *inner = json_object_get(doc, "a");
    json_t *patch = js("[{\"op\": \"remove\", \"path\": \"/b\"},"
                       " {\"op\": \"add\", \"path\": \"/c\", \"value\": [true]},"
                       " {\"op\": \"replace\", \"path\": \"/a\", \"value\": 5}]");
    json_t *root = js("[{\"op\": \"replace\", \"path\": \"\", \"value\": {\"z\": 0}}]");
    json_t *arr_patch = js("[{\"op\": \"remove\", \"path\": \"/0\"},"
                           " {\"op\": \"add\", \"path\": \"/-\", \"value\": 4}]");
    struct gg_err err = {{0}};

    (void)state;
    (void)inner;
    assert_int_equal(jp_apply(doc, patch, &err), GG_OK);
    assert_json_text(doc, "{\"a\": 5, \"c\": [true]}");
    assert_int_equal(jp_apply(doc, root, &err), GG_OK);
    assert_json_text(doc, "{\"z\": 0}");
    assert_int_equal(jp_apply(arr, arr_patch, &err), GG_OK);
    assert_json_text(arr, "[2, 3, 4]");
    json_decref(arr_patch);
    json_decref(root);
    json_decref(patch);
    json_decref(arr);
    json_decref(doc);
}

static void test_apply_root_type_change(void **state)
{
    json_t *doc = js("{\"a\": 1}");
    json_t *patch = js("[{\"op\": \"add\", \"path\": \"\", \"value\": [1]}]");
    struct gg_err err = {{0}};
    json_t *out = NULL;

    (void)state;
    assert_int_equal(jp_apply(doc, patch, &err), GG_ERR_INVALID);
    assert_non_null(strstr(err.msg, "jp_apply_copy"));
    assert_json_text(doc, "{\"a\": 1}");
    assert_int_equal(jp_apply_copy(doc, patch, &out, &err), GG_OK);
    assert_json_text(out, "[1]");
    json_decref(out);
    json_decref(patch);
    json_decref(doc);
}

static void test_apply_max_ops(void **state)
{
    json_t *doc = js("{\"a\": 1}"), *patch = json_array(), *out = NULL;
    struct gg_err err = {{0}};
    size_t i;

    (void)state;
    for (i = 0; i < JP_MAX_OPS; i++)
        json_array_append_new(patch, js("{\"op\": \"test\", \"path\": \"/a\", \"value\": 1}"));
    assert_int_equal(jp_apply_copy(doc, patch, &out, &err), GG_OK);
    json_decref(out);
    out = NULL;
    json_array_append_new(patch, js("{\"op\": \"test\", \"path\": \"/a\", \"value\": 1}"));
    assert_int_equal(jp_apply_copy(doc, patch, &out, &err), GG_ERR_TOOBIG);
    assert_null(out);
    assert_non_null(strstr(err.msg, "operations"));
    json_decref(patch);
    json_decref(doc);
}

static void test_apply_deep_pointer(void **state)
{
    char *ok_path = deep_pointer(JP_MAX_DEPTH), *bad_path = deep_pointer(JP_MAX_DEPTH + 1);
    json_t *doc = nested(JP_MAX_DEPTH, json_integer(1));
    json_t *ok = json_pack("[{s:s, s:s, s:i}]", "op", "test", "path", ok_path, "value", 1);
    json_t *bad = json_pack("[{s:s, s:s, s:i}]", "op", "add", "path", bad_path, "value", 1);
    struct gg_err err = {{0}};

    (void)state;
    assert_int_equal(jp_apply(doc, ok, &err), GG_OK);
    assert_int_equal(jp_apply(doc, bad, &err), GG_ERR_TOOBIG);
    assert_non_null(strstr(err.msg, "patch op 0 (add /a/a/a"));
    free(ok_path);
    free(bad_path);
    json_decref(ok);
    json_decref(bad);
    json_decref(doc);
}

/* copy ops share one byte budget, so a patch cannot inflate the document. */
static void test_apply_copy_budget(void **state)
{
    size_t len = 1000000;
    char *s = malloc(len + 1);
    json_t *doc, *patch, *out = NULL, *doubling = json_array();
    struct gg_err err = {{0}};
    size_t i;

    (void)state;
    memset(s, 'x', len);
    s[len] = '\0';
    doc = json_pack("{s:s}", "s", s);
    patch = js("[{\"op\": \"copy\", \"from\": \"/s\", \"path\": \"/c0\"},"
               " {\"op\": \"copy\", \"from\": \"/s\", \"path\": \"/c1\"},"
               " {\"op\": \"copy\", \"from\": \"/s\", \"path\": \"/c2\"},"
               " {\"op\": \"copy\", \"from\": \"/s\", \"path\": \"/c3\"}]");
    assert_int_equal(jp_apply_copy(doc, patch, &out, &err), GG_ERR_TOOBIG);
    assert_null(out);
    assert_non_null(strstr(err.msg, "patch op 3 (copy /c3 from /s)"));
    json_array_remove(patch, 3);
    assert_int_equal(jp_apply_copy(doc, patch, &out, &err), GG_OK);
    json_decref(out);
    out = NULL;

    /* Copying the root into itself doubles the document each time. */
    for (i = 0; i < JP_MAX_OPS; i++)
        json_array_append_new(doubling, js("{\"op\": \"copy\", \"from\": \"\", \"path\": \"/d\"}"));
    json_decref(doc);
    doc = js("{\"k\": \"v\"}");
    assert_int_equal(jp_apply_copy(doc, doubling, &out, &err), GG_ERR_TOOBIG);
    assert_null(out);
    json_decref(doubling);
    json_decref(patch);
    json_decref(doc);
    free(s);
}

static void test_apply_bad_args(void **state)
{
    json_t *doc = js("{}"), *obj = js("{}"), *out = NULL;
    struct gg_err err = {{0}};

    (void)state;
    assert_int_equal(jp_apply(doc, obj, &err), GG_ERR_PARSE);
    assert_int_equal(jp_apply(doc, NULL, &err), GG_ERR_PARSE);
    assert_int_equal(jp_apply_copy(NULL, obj, &out, &err), GG_ERR_INVALID);
    assert_int_equal(jp_apply(doc, obj, NULL), GG_ERR_PARSE); /* err may be NULL */
    json_decref(obj);
    json_decref(doc);
}

/* ---- allocation failures ---------------------------------------------------------- */

/* Fail exactly the Nth allocation after arming; test-only global state. */
static size_t chaos_countdown;
static int chaos_armed, chaos_fired;

static void *chaos_malloc(size_t size)
{
    if (chaos_armed && chaos_countdown-- == 0) {
        chaos_armed = 0;
        chaos_fired = 1;
        return NULL;
    }
    return malloc(size);
}

static void chaos_arm(size_t n)
{
    chaos_countdown = n;
    chaos_fired = 0;
    chaos_armed = 1;
}

/*
 * call(x, y, &out, &err) with its Nth allocation failing, for N = 0, 1, ...
 * until none fails: each failure is GG_ERR_NOMEM with no output and x left
 * alone, the last call succeeds.  The number of failures.
 */
static size_t under_chaos(enum gg_status (*call)(const json_t *, const json_t *, json_t **,
                                                 struct gg_err *),
                          const json_t *x, const json_t *y)
{
    json_t *before = json_deep_copy(x), *out;
    struct gg_err err = {{0}};
    enum gg_status st;
    size_t n, failures = 0;

    for (n = 0;; n++) {
        out = NULL;
        chaos_arm(n);
        st = call(x, y, &out, &err);
        chaos_armed = 0;
        if (!chaos_fired)
            break;
        failures++;
        assert_int_equal(st, GG_ERR_NOMEM);
        assert_null(out);
        assert_json_equal(x, before);
    }
    assert_int_equal(st, GG_OK);
    json_decref(out);
    json_decref(before);
    return failures;
}

/* Every allocation failure is reported as GG_ERR_NOMEM, leaks nothing, and
 * leaves the input alone. */
static void test_nomem(void **state)
{
    json_t *a =
        js("{\"metadata\": {\"labels\": {\"x\": \"1\"}, \"name\": \"p\"},"
           " \"spec\": {\"containers\": [{\"name\": \"a\"}], \"t\": [1, 2, 3], \"u\": [1]}}");
    json_t *b = js("{\"metadata\": {\"labels\": {\"x\": \"2\", \"a/b\": \"y\"}},"
                   " \"spec\": {\"containers\": [{\"name\": \"b\", \"env\": []}], \"t\": [1],"
                   " \"u\": [1, {\"k\": [true]}], \"new\": {\"deep\": {}}}}");
    json_t *patch = js("[{\"op\": \"add\", \"path\": \"/spec/x\", \"value\": {\"y\": [1, 2]}},"
                       " {\"op\": \"remove\", \"path\": \"/spec/t/0\"},"
                       " {\"op\": \"replace\", \"path\": \"/metadata/name\", \"value\": \"q\"},"
                       " {\"op\": \"move\", \"from\": \"/spec/u\", \"path\": \"/spec/v\"},"
                       " {\"op\": \"copy\", \"from\": \"/metadata\", \"path\": \"/spec/m\"},"
                       " {\"op\": \"test\", \"path\": \"/spec/m/name\", \"value\": \"q\"},"
                       " {\"op\": \"add\", \"path\": \"/spec/t/-\", \"value\": \"end\"}]");
    size_t failures;

    (void)state;
    json_set_alloc_funcs(chaos_malloc, free);
    failures = under_chaos(jp_diff, a, b) + under_chaos(jp_apply_copy, a, patch);
    json_set_alloc_funcs(malloc, free);
    assert_true(failures > 20);
    json_decref(patch);
    json_decref(b);
    json_decref(a);
}

/* ---- data-driven suites ------------------------------------------------------------ */

struct data_case {
    const json_t *rec;
};

/* The expected failure must also leave an in-place target untouched. */
static void check_failure(const json_t *doc, const json_t *patch)
{
    struct gg_err err = {{0}};
    json_t *out = NULL, *copy = json_deep_copy(doc);
    enum gg_status st = jp_apply_copy(doc, patch, &out, &err);

    if (st == GG_OK) {
        char *s = json_dumps(out, JSON_COMPACT | JSON_ENCODE_ANY);
        fail_msg("expected an error, got %s", s ? s : "?");
    }
    assert_null(out);
    assert_true(strncmp(err.msg, "patch", 5) == 0);
    assert_int_not_equal(jp_apply(copy, patch, &err), GG_OK);
    assert_json_equal(copy, doc);
    json_decref(copy);
}

static void check_success(const json_t *doc, const json_t *patch, const json_t *expected)
{
    struct gg_err err = {{0}};
    json_t *out = NULL, *copy = json_deep_copy(doc);

    if (jp_apply_copy(doc, patch, &out, &err) != GG_OK)
        fail_msg("unexpected error: %s", err.msg);
    if (expected)
        assert_json_equal(out, expected);
    /* In place works whenever the root keeps its type, and fails cleanly otherwise. */
    if (json_typeof(out) == json_typeof(doc)) {
        if (jp_apply(copy, patch, &err) != GG_OK)
            fail_msg("in place: unexpected error: %s", err.msg);
        assert_json_equal(copy, out);
    } else {
        assert_int_equal(jp_apply(copy, patch, &err), GG_ERR_INVALID);
        assert_json_equal(copy, doc);
    }
    json_decref(copy);
    json_decref(out);
}

static void conformance_case(void **state)
{
    const struct data_case *c = *state;
    const json_t *doc = json_object_get(c->rec, "doc");
    const json_t *patch = json_object_get(c->rec, "patch");

    assert_non_null(doc);
    if (json_object_get(c->rec, "error"))
        check_failure(doc, patch);
    else
        check_success(doc, patch, json_object_get(c->rec, "expected"));
}

/*
 * jp_patched_nodes on a's nodes gives want (when it is given; NULL: it must refuse), for a
 * patch of add, replace and remove ops below the root (what gpuguard's differ writes); false
 * when patch has another op, which it is not for.
 */
static bool check_patched_nodes(const json_t *a, const json_t *patch, const json_t *want)
{
    size_t i;
    const json_t *op;
    json_t *paths = json_array();
    struct gg_err err = {{0}};
    assert_non_null(paths);
    json_array_foreach(patch, i, op)
    {
        const char *name = json_string_value(json_object_get(op, "op"));
        const char *path = json_string_value(json_object_get(op, "path"));
        json_t *tokens = NULL;
        if (!name || !path || !*path ||
            (strcmp(name, "add") && strcmp(name, "replace") && strcmp(name, "remove")) ||
            jp_pointer_parse(path, &tokens, &err) != GG_OK) {
            json_decref(paths);
            return false;
        }
        json_array_append_new(paths, tokens);
    }
    struct jf_doc original, patched;
    assert_int_equal(jf_from_json(a, &original), 0);
    enum gg_status st = jp_patched_nodes(original.root, patch, paths, &patched, &err);
    if (want) {
        if (st != GG_OK)
            fail_msg("jp_patched_nodes: %s", err.msg);
        json_t *got = jf_to_json(patched.root);
        assert_json_equal(got, want);
        json_decref(got);
        jf_doc_free(&patched);
    } else {
        assert_int_not_equal(st, GG_OK);
    }
    jf_doc_free(&original);
    json_decref(paths);
    return true;
}

static void patched_nodes_case(void **state)
{
    const struct data_case *c = *state;
    const json_t *doc = json_object_get(c->rec, "doc");
    const json_t *want =
        json_object_get(c->rec, "error") ? NULL : json_object_get(c->rec, "expected");
    if (!json_is_object(doc) || (!want && !json_object_get(c->rec, "error")))
        skip();
    if (!check_patched_nodes(doc, json_object_get(c->rec, "patch"), want))
        skip();
}

static void diff_case(void **state)
{
    const struct data_case *c = *state;
    const json_t *a = json_object_get(c->rec, "original");
    const json_t *b = json_object_get(c->rec, "edited");
    json_t *patch = NULL, *out = NULL, *empty = NULL;
    struct gg_err err = {{0}};

    assert_non_null(a);
    assert_non_null(b);
    if (json_object_get(c->rec, "error")) {
        assert_int_equal(jp_diff(a, b, &patch, &err), GG_ERR_INVALID);
        assert_null(patch);
        return;
    }
    if (jp_diff(a, b, &patch, &err) != GG_OK)
        fail_msg("unexpected error: %s", err.msg);
    assert_json_equal(patch, json_object_get(c->rec, "patch"));
    if (jp_apply_copy(a, patch, &out, &err) != GG_OK)
        fail_msg("the patch does not apply: %s", err.msg);
    assert_json_equal(out, b);
    if (json_is_object(a) && json_is_object(b))
        assert_true(check_patched_nodes(a, patch, b)); /* the differ's ops, all of them */
    assert_int_equal(jp_diff(b, b, &empty, &err), GG_OK);
    assert_int_equal(json_array_size(empty), 0);
    json_decref(empty);
    json_decref(out);
    json_decref(patch);
}

static char *case_name(const char *file, size_t i, const json_t *rec)
{
    const char *comment = json_string_value(json_object_get(rec, "comment"));
    int n = snprintf(NULL, 0, "%s #%zu: %s", file, i, comment ? comment : "");
    char *s = malloc((size_t)n + 1);

    if (s)
        snprintf(s, (size_t)n + 1, "%s #%zu: %s", file, i, comment ? comment : "");
    return s;
}

/*
 * Run one data file as its own cmocka group, one test per record.  Records
 * without the field `need` (comment-only) and disabled ones are skipped.
 * cmocka_run_group_tests() needs a static array; the function behind it takes
 * a pointer and a count.
 */
static int run_suite(const char *file, const char *need, CMUnitTestFunction fn)
{
    const char *dir = getenv("GPUGUARD_TEST_DATA");
    char path[4096];
    json_error_t jerr;
    json_t *recs;
    struct CMUnitTest *tests;
    struct data_case *cases;
    size_t i, n, count = 0;
    int failed;

    snprintf(path, sizeof(path), "%s/%s", dir && *dir ? dir : JP_TEST_DATA, file);
    recs = json_load_file(path, 0, &jerr);
    if (!json_is_array(recs)) {
        print_error("cannot load %s: %s (run from the repository root or set "
                    "GPUGUARD_TEST_DATA)\n",
                    path, recs ? "not an array" : jerr.text);
        json_decref(recs);
        return 1;
    }
    n = json_array_size(recs);
    tests = calloc(n ? n : 1, sizeof(*tests));
    cases = calloc(n ? n : 1, sizeof(*cases));
    assert_non_null(tests);
    assert_non_null(cases);
    for (i = 0; i < n; i++) {
        const json_t *rec = json_array_get(recs, i);
        if (!json_object_get(rec, need) || json_is_true(json_object_get(rec, "disabled")))
            continue;
        cases[count].rec = rec;
        tests[count].name = case_name(file, i, rec);
        tests[count].test_func = fn;
        tests[count].initial_state = &cases[count];
        count++;
    }
    if (count == 0) {
        print_error("%s: no cases\n", path);
        failed = 1;
    } else {
        failed = _cmocka_run_group_tests(file, tests, count, NULL, NULL);
    }
    for (i = 0; i < count; i++)
        free((char *)tests[i].name);
    free(tests);
    free(cases);
    json_decref(recs);
    return failed;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escape),
        cmocka_unit_test(test_pointer_parse),
        cmocka_unit_test(test_pointer_depth),
        cmocka_unit_test(test_pointer_get),
        cmocka_unit_test(test_equal),
        cmocka_unit_test(test_diff_pod),
        cmocka_unit_test(test_diff_roots),
        cmocka_unit_test(test_diff_deterministic),
        cmocka_unit_test(test_diff_shares_values),
        cmocka_unit_test(test_diff_depth_limit),
        cmocka_unit_test(test_diff_max_ops),
        cmocka_unit_test(test_diff_nul_key),
        cmocka_unit_test(test_apply_error_message),
        cmocka_unit_test(test_apply_atomic),
        cmocka_unit_test(test_apply_in_place),
        cmocka_unit_test(test_apply_root_type_change),
        cmocka_unit_test(test_apply_max_ops),
        cmocka_unit_test(test_apply_deep_pointer),
        cmocka_unit_test(test_apply_copy_budget),
        cmocka_unit_test(test_apply_bad_args),
        cmocka_unit_test(test_nomem),
    };
    int failed = cmocka_run_group_tests_name("jsonpatch", tests, NULL, NULL);

    failed += run_suite("json-patch-tests/tests.json", "patch", conformance_case);
    failed += run_suite("json-patch-tests/spec_tests.json", "patch", conformance_case);
    failed += run_suite("jsonpatch/extra_tests.json", "patch", conformance_case);
    failed += run_suite("jsonpatch/diff_cases.json", "original", diff_case);
    failed += run_suite("json-patch-tests/tests.json", "patch", patched_nodes_case);
    failed += run_suite("json-patch-tests/spec_tests.json", "patch", patched_nodes_case);
    return failed ? 1 : 0;
}
