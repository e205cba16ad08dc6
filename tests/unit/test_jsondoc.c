/*
 * test_jsondoc.c - jf_parse's document of nodes: members in text order,
 * strings decoded and NUL-terminated in the document's copy (the text
 * untouched), repeated keys as jansson keeps them, errors placed on the
 * text, and the conversions to and from jansson values.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "util/jsonfast.h"

#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parse doc, which must be valid; the text is checked to be left as it was. */
static void parse(const char *doc, struct jf_doc *out)
{
    size_t len = strlen(doc), deepest;
    char *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    memcpy(copy, doc, len);
    struct jf_error err;
    if (jf_parse(copy, len, 0, out, &deepest, &err) != 0)
        fail_msg("%s: %s", doc, err.text);
    assert_memory_equal(copy, doc, len);
    free(copy);
}

static char *dump(const json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    assert_non_null(s);
    return s;
}

/* The document, turned into jansson and written, reads as jansson's own parse of doc. */
static void assert_as_jansson(const char *doc)
{
    struct jf_doc d;
    parse(doc, &d);
    json_t *mine = jf_to_json(d.root), *theirs = json_loads(doc, JSON_DECODE_ANY, NULL);
    assert_non_null(mine);
    assert_non_null(theirs);
    char *a = dump(mine), *b = dump(theirs);
    if (strcmp(a, b) != 0)
        fail_msg("%s: nodes give %s, jansson %s", doc, a, b);
    free(a);
    free(b);
    json_decref(mine);
    json_decref(theirs);
    jf_doc_free(&d);
}

static void test_members_in_text_order(void **state)
{
    (void)state;
    struct jf_doc d;
    parse("{\"a\":1,\"b\":[true,null,\"x\\u00e9\\n\"],\"c\":{\"d\":-2.5},\"e\":false}", &d);
    const struct jf_node *r = d.root;
    assert_int_equal(r->type, JF_OBJECT);
    assert_int_equal(r->n, 4);
    assert_null(r->key);
    static const char *const keys[] = {"a", "b", "c", "e"};
    for (uint32_t i = 0; i < r->n; i++) {
        assert_string_equal(r->u.items[i].key, keys[i]);
        assert_int_equal(r->u.items[i].key_len, 1);
    }
    assert_int_equal(r->u.items[0].type, JF_INTEGER);
    assert_int_equal(r->u.items[0].u.i, 1);
    const struct jf_node *b = jf_get_str(r, "b");
    assert_int_equal(b->type, JF_ARRAY);
    assert_int_equal(b->n, 3);
    assert_int_equal(b->u.items[0].type, JF_TRUE);
    assert_int_equal(b->u.items[1].type, JF_NULL);
    assert_null(b->u.items[2].key);
    /* Decoded in place, NUL-terminated, the length in bytes. */
    assert_int_equal(b->u.items[2].n, 4);
    assert_string_equal(jf_string(&b->u.items[2]), "x\xc3\xa9\n");
    const struct jf_node *d_ = jf_get_str(jf_get_str(r, "c"), "d");
    assert_int_equal(d_->type, JF_REAL);
    assert_true(d_->u.d == -2.5);
    assert_int_equal(jf_get_str(r, "e")->type, JF_FALSE);
    jf_doc_free(&d);
}

static void test_get(void **state)
{
    (void)state;
    struct jf_doc d;
    parse("{\"ab\":1,\"a\":2,\"\":3}", &d);
    assert_int_equal(jf_get(d.root, "a", 1)->u.i, 2);
    assert_int_equal(jf_get(d.root, "ab", 2)->u.i, 1);
    assert_int_equal(jf_get(d.root, "", 0)->u.i, 3);
    assert_null(jf_get(d.root, "abc", 3));
    assert_null(jf_get(d.root, "b", 1));
    assert_null(jf_get(jf_get(d.root, "a", 1), "a", 1)); /* not an object */
    assert_null(jf_get(NULL, "a", 1));
    assert_null(jf_string(jf_get(d.root, "a", 1)));
    jf_doc_free(&d);
}

/* jansson keeps the last value at the first key's position; so do the nodes. */
static void test_repeated_keys(void **state)
{
    (void)state;
    static const char *const docs[] = {
        "{\"a\":1,\"b\":2,\"a\":3}",
        "{\"k\":1,\"k\":2,\"k\":3}",
        "{\"ab\":1,\"aab\":2,\"ab\":{\"x\":[1]},\"b\":4}",
        "{\"a\\\"b\":1,\"c\":0,\"a\\u0022b\":2}",
        "[{\"a\":1,\"a\":2},{\"a\":3}]",
    };
    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++)
        assert_as_jansson(docs[i]);
    struct jf_doc d;
    parse("{\"a\":1,\"b\":2,\"a\":3}", &d);
    assert_int_equal(d.root->n, 2);
    assert_string_equal(d.root->u.items[0].key, "a");
    assert_int_equal(d.root->u.items[0].u.i, 3);
    assert_string_equal(d.root->u.items[1].key, "b");
    jf_doc_free(&d);

    /* Past 16 members the keys are hashed. */
    char big[2048];
    size_t used = 0;
    used += (size_t)snprintf(big + used, sizeof(big) - used, "{");
    for (int k = 0; k < 40; k++)
        used += (size_t)snprintf(big + used, sizeof(big) - used, "\"k%d\":%d,", k, k);
    snprintf(big + used, sizeof(big) - used, "\"k5\":\"five\",\"k39\":[],\"k40\":40,\"k5\":55}");
    assert_as_jansson(big);
    parse(big, &d);
    assert_int_equal(d.root->n, 41);
    assert_string_equal(d.root->u.items[5].key, "k5");
    assert_int_equal(d.root->u.items[5].u.i, 55);
    assert_int_equal(d.root->u.items[39].type, JF_ARRAY);
    assert_string_equal(d.root->u.items[40].key, "k40");
    jf_doc_free(&d);
}

/* Errors count lines and columns on the text, not on the strings decoded into the copy. */
static void test_error_after_escapes(void **state)
{
    (void)state;
    static const char *const docs[] = {
        "[\"a\\nb\\u00e9\", x]",
        "{\"k\\n\":\"\\n\\n\", \"z\" 1}",
        "[\"\\u00e9\\u00e9\\u00e9\",\n \"\\t\", x]",
    };
    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
        struct jf_doc d;
        struct jf_error e;
        size_t deepest;
        json_error_t je;
        assert_int_equal(jf_parse(docs[i], strlen(docs[i]), 0, &d, &deepest, &e), -1);
        assert_null(d.root);
        assert_null(d.chunks);
        assert_null(d.text);
        assert_null(json_loads(docs[i], 0, &je));
        if (e.line != je.line || e.column != je.column)
            fail_msg("%s: line %d column %d, jansson %d %d", docs[i], e.line, e.column, je.line,
                     je.column);
        jf_doc_free(&d); /* after a failure too */
    }
}

static void test_from_json(void **state)
{
    (void)state;
    json_t *v = json_loads("{\"i\":7,\"r\":0.5,\"s\":\"t\",\"n\":null,\"a\":[1,{\"b\":true}],"
                           "\"o\":{},\"e\":[]}",
                           0, NULL);
    assert_non_null(v);
    struct jf_doc d;
    assert_int_equal(jf_from_json(v, &d), 0);
    assert_null(d.text);
    assert_int_equal(jf_get_str(d.root, "i")->type, JF_INTEGER);
    assert_int_equal(jf_get_str(d.root, "r")->type, JF_REAL);
    /* Strings point into the jansson value. */
    assert_ptr_equal(jf_string(jf_get_str(d.root, "s")),
                     json_string_value(json_object_get(v, "s")));
    json_t *back = jf_to_json(d.root);
    char *a = dump(v), *b = dump(back);
    assert_string_equal(a, b);
    free(a);
    free(b);
    json_decref(back);
    jf_doc_free(&d);
    json_decref(v);
}

/* The diff's equality: exact types, the sign of zero, objects as sets of members. */
static void test_same(void **state)
{
    (void)state;
    static const struct {
        const char *a, *b;
        bool same;
    } cases[] = {
        {"1", "1", true},
        {"1", "1.0", false},
        {"0.0", "-0.0", false},
        {"\"a\"", "\"a\"", true},
        {"\"a\"", "\"ab\"", false},
        {"{\"a\":1,\"b\":[2]}", "{\"b\":[2],\"a\":1}", true},
        {"{\"a\":1}", "{\"a\":1,\"b\":2}", false},
        {"{\"a\":1,\"b\":2}", "{\"a\":1,\"c\":2}", false},
        {"[1,2]", "[2,1]", false},
        {"[]", "{}", false},
        {"null", "false", false},
        {"true", "true", true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct jf_doc a, b;
        parse(cases[i].a, &a);
        parse(cases[i].b, &b);
        if (jf_same(a.root, b.root) != cases[i].same)
            fail_msg("%s and %s: want %s", cases[i].a, cases[i].b,
                     cases[i].same ? "same" : "different");
        assert_true(jf_same(a.root, a.root));
        jf_doc_free(&a);
        jf_doc_free(&b);
    }
}

/* A document bigger than the first chunk: the members stay where they were put, long runs
 * where the parser left them. */
static void test_many_chunks(void **state)
{
    (void)state;
    size_t cap = 1 << 20, used = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    used += (size_t)snprintf(text, cap, "[");
    for (int i = 0; i < 20000; i++)
        used += (size_t)snprintf(text + used, cap - used, "%s{\"n\":%d,\"l\":[%d]}", i ? "," : "",
                                 i, i);
    snprintf(text + used, cap - used, "]");
    struct jf_doc d;
    parse(text, &d);
    assert_int_equal(d.root->n, 20000);
    for (uint32_t i = 0; i < 20000; i += 997) {
        const struct jf_node *o = &d.root->u.items[i];
        assert_int_equal(jf_get_str(o, "n")->u.i, i);
        assert_int_equal(jf_get_str(o, "l")->u.items[0].u.i, i);
    }
    jf_doc_free(&d);

    /* A long object inside an array, values after it: its run is handed over, not copied,
     * and its repeated key still merged; what was open around it survives the move. */
    used = (size_t)snprintf(text, cap, "[1,{");
    for (int i = 0; i < 5000; i++)
        used += (size_t)snprintf(text + used, cap - used, "\"k%d\":%d,", i, i);
    snprintf(text + used, cap - used, "\"k7\":\"seven\"},\"after\",[2]]");
    parse(text, &d);
    assert_int_equal(d.root->n, 4);
    assert_int_equal(d.root->u.items[0].u.i, 1);
    const struct jf_node *o = &d.root->u.items[1];
    assert_int_equal(o->n, 5000);
    assert_string_equal(jf_string(jf_get_str(o, "k7")), "seven");
    assert_ptr_equal(jf_get_str(o, "k7"), &o->u.items[7]);
    assert_int_equal(jf_get_str(o, "k4999")->u.i, 4999);
    assert_string_equal(jf_string(&d.root->u.items[2]), "after");
    assert_int_equal(d.root->u.items[3].u.items[0].u.i, 2);
    jf_doc_free(&d);
    free(text);
}

/* Heap in use, from malloc's own count (blocks from the heap and mmapped ones). */
static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/*
 * Many long runs closed while a long run of values is still open: handing each run's block
 * to the document would take the open values (and the block's spare room) along every time;
 * they are copied instead, and the document stays near the size of its nodes.
 */
static void test_long_runs_under_an_open_one(void **state)
{
    (void)state;
    size_t cap = 4 << 20, used = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    used += (size_t)snprintf(text, cap, "[");
    for (int i = 0; i < 200000; i++)
        used += (size_t)snprintf(text + used, cap - used, "0,");
    for (int a = 0; a < 40; a++) {
        used += (size_t)snprintf(text + used, cap - used, "%s[", a ? "," : "");
        for (int i = 0; i < 4096; i++)
            used += (size_t)snprintf(text + used, cap - used, "%s%d", i ? "," : "", a);
        used += (size_t)snprintf(text + used, cap - used, "]");
    }
    snprintf(text + used, cap - used, "]");
    size_t before = heap_in_use(), nodes = 200000 + 40 * 4096 + 41;
    struct jf_doc d;
    parse(text, &d);
    size_t doc = heap_in_use() - before;
    assert_int_equal(d.root->n, 200040);
    assert_int_equal(d.root->u.items[200039].u.items[4095].u.i, 39);
    /* Nodes, the copy of the text, and room to spare: not forty times the open run. */
    if (doc > 2 * nodes * sizeof(struct jf_node) + 2 * strlen(text))
        fail_msg("the document holds %zu bytes for %zu nodes", doc, nodes);
    jf_doc_free(&d);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_members_in_text_order),
        cmocka_unit_test(test_get),
        cmocka_unit_test(test_repeated_keys),
        cmocka_unit_test(test_error_after_escapes),
        cmocka_unit_test(test_from_json),
        cmocka_unit_test(test_same),
        cmocka_unit_test(test_many_chunks),
        cmocka_unit_test(test_long_runs_under_an_open_one),
    };
    return cmocka_run_group_tests_name("jsondoc", tests, NULL, NULL);
}
