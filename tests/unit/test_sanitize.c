/*
 * test_sanitize.c - unit tests for webhook/engine/sanitize.c: reports cut
 * where a character ends, and the note of the warnings left out.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/sanitize.h"

static void test_prefix_ends_where_a_character_does(void **state)
{
    (void)state;
    static const char text[] = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80z"; /* a é € 😀 z */
    static const struct {
        size_t max_bytes, max_chars, want;
    } cases[] = {
        {SIZE_MAX, SIZE_MAX, 11}, {0, SIZE_MAX, 0}, {1, SIZE_MAX, 1}, {2, SIZE_MAX, 1},
        {3, SIZE_MAX, 3},         {5, SIZE_MAX, 3}, {6, SIZE_MAX, 6}, {9, SIZE_MAX, 6},
        {10, SIZE_MAX, 10},       {SIZE_MAX, 0, 0}, {SIZE_MAX, 2, 3}, {SIZE_MAX, 4, 10},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t got =
            sanitize_prefix(text, sizeof(text) - 1, cases[i].max_bytes, cases[i].max_chars);
        if (got != cases[i].want)
            fail_msg("case %zu: %zu bytes, want %zu", i, got, cases[i].want);
    }
    /* A lead byte whose sequence the text cuts short is left out; a stray byte counts one. */
    assert_int_equal(sanitize_prefix("ab\xe2\x82", 4, 100, 100), 2);
    assert_int_equal(sanitize_prefix("\x80\x80", 2, 100, 100), 2);
}

static void test_cut_marks_what_it_left_out(void **state)
{
    (void)state;
    size_t n;
    char *out = sanitize_cut("short", 5, 5, &n);
    assert_non_null(out);
    assert_string_equal(out, "short");
    assert_int_equal(n, 5);
    free(out);
    out = sanitize_cut("x\xe2\x82\xac\xe2\x82\xac", 7, 5, &n);
    assert_string_equal(out, "x\xe2\x82\xac\xe2\x80\xa6 (3 more bytes)");
    assert_int_equal(n, strlen(out));
    free(out);
    /* NUL bytes are kept as they are. */
    out = sanitize_cut("a\0b\0c", 5, 3, &n);
    assert_int_equal(n, 3 + strlen("\xe2\x80\xa6 (2 more bytes)"));
    assert_memory_equal(out, "a\0b\xe2\x80\xa6 (2 more bytes)", n);
    free(out);
}

static void test_warnings_left_out_are_counted_in_the_note(void **state)
{
    (void)state;
    json_t *in = json_pack("[s,s,s]", "p: one", "p: one", "p: two");
    json_t *out = sanitize_warnings(in, 7);
    assert_int_equal(json_array_size(out), 3);
    assert_string_equal(json_string_value(json_array_get(out, 1)), "p: two");
    assert_string_equal(json_string_value(json_array_get(out, 2)),
                        "gpuguard: 7 more warnings left out");
    json_decref(out);
    out = sanitize_warnings(in, 0);
    assert_int_equal(json_array_size(out), 2);
    json_decref(out);
    json_decref(in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_ends_where_a_character_does),
        cmocka_unit_test(test_cut_marks_what_it_left_out),
        cmocka_unit_test(test_warnings_left_out_are_counted_in_the_note),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
