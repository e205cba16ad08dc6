/*
 * test_log.c - log lines: each is one JSON object on one line with ts,
 * level and msg first; fields keep their types (latency as milliseconds
 * with three decimals), text is escaped so a line never breaks, text that
 * is not UTF-8 is replaced, filtered levels write nothing.
 *
 * stderr is pointed at a temporary file for each test and read back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "util/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_LINES 8

struct captured {
    int saved_fd;
    FILE *file;
    json_t *lines[MAX_LINES];
    int n;
};

static int capture(void **state)
{
    struct captured *c = calloc(1, sizeof(*c));
    if (!c || !(c->file = tmpfile()))
        return -1;
    fflush(stderr);
    c->saved_fd = dup(fileno(stderr));
    dup2(fileno(c->file), fileno(stderr));
    log_set_level(LOG_INFO);
    *state = c;
    return 0;
}

static int release(void **state)
{
    struct captured *c = *state;
    fflush(stderr);
    dup2(c->saved_fd, fileno(stderr));
    close(c->saved_fd);
    fclose(c->file);
    for (int i = 0; i < c->n; i++)
        json_decref(c->lines[i]);
    free(c);
    return 0;
}

/* Parse what was written: every line must be one JSON object. */
static void read_lines(struct captured *c)
{
    fflush(stderr);
    rewind(c->file);
    char text[4096];
    while (fgets(text, sizeof(text), c->file)) {
        size_t len = strlen(text);
        assert_true(len > 0 && text[len - 1] == '\n');
        assert_true(c->n < MAX_LINES);
        json_error_t jerr;
        json_t *line = json_loadb(text, len - 1, 0, &jerr);
        if (!line)
            fail_msg("not JSON: %s (%s)", text, jerr.text);
        assert_true(json_is_object(line));
        c->lines[c->n++] = line;
    }
}

static const char *str(const json_t *line, const char *key)
{
    const char *v = json_string_value(json_object_get(line, key));
    if (!v)
        fail_msg("no string %s", key);
    return v;
}

static void test_built_line_keeps_types_and_order(void **state)
{
    struct captured *c = *state;
    json_t *policies = json_pack("[ss]", "gpu-sharing", "gpu-placement");
    struct log_line l;
    assert_true(log_begin(&l, LOG_INFO, "decision"));
    log_str(&l, "uid", "a\"b\\c\nd\te\x01");
    log_json(&l, "policies", policies);
    log_int(&l, "patch_ops", 7);
    log_millis(&l, "latency_ms", 1234567);
    log_millis(&l, "small_ms", 5);
    log_millis(&l, "negative_ms", -3);
    log_end(&l);
    json_decref(policies);
    read_lines(c);
    assert_int_equal(c->n, 1);
    json_t *line = c->lines[0];
    const char *keys[] = {"ts", "level", "msg", "uid", "policies", "patch_ops", "latency_ms"};
    const char *key;
    json_t *value;
    size_t i = 0;
    json_object_foreach(line, key, value)
    {
        if (i < sizeof(keys) / sizeof(keys[0]))
            assert_string_equal(key, keys[i]);
        i++;
    }
    assert_string_equal(str(line, "level"), "info");
    assert_string_equal(str(line, "msg"), "decision");
    assert_int_equal(strlen(str(line, "ts")), 24);
    assert_string_equal(str(line, "uid"), "a\"b\\c\nd\te\x01");
    assert_int_equal(json_array_size(json_object_get(line, "policies")), 2);
    assert_int_equal(json_integer_value(json_object_get(line, "patch_ops")), 7);
    assert_true(json_is_real(json_object_get(line, "latency_ms")));
    assert_float_equal(json_real_value(json_object_get(line, "latency_ms")), 1234.567, 1e-9);
    assert_float_equal(json_real_value(json_object_get(line, "small_ms")), 0.005, 1e-12);
    assert_float_equal(json_real_value(json_object_get(line, "negative_ms")), 0.0, 0.0);
}

static void test_text_not_utf8_is_replaced(void **state)
{
    struct captured *c = *state;
    log_fields(LOG_WARN, "bad \xff message", json_pack("{s:s}", "peer", "10.0.0.1:443"));
    struct log_line l;
    assert_true(log_begin(&l, LOG_ERROR, "ok"));
    log_str(&l, "overlong", "\xc0\xaf");
    log_str(&l, "surrogate", "\xed\xa0\x80");
    log_str(&l, "cut", "\xe2\x82");
    log_str(&l, "fine", "\xe2\x82\xac and \xf0\x9f\x98\x80");
    log_end(&l);
    read_lines(c);
    assert_int_equal(c->n, 2);
    assert_string_equal(str(c->lines[0], "msg"), "(not UTF-8)");
    assert_string_equal(str(c->lines[0], "level"), "warn");
    assert_string_equal(str(c->lines[0], "peer"), "10.0.0.1:443");
    assert_string_equal(str(c->lines[1], "overlong"), "(not UTF-8)");
    assert_string_equal(str(c->lines[1], "surrogate"), "(not UTF-8)");
    assert_string_equal(str(c->lines[1], "cut"), "(not UTF-8)");
    assert_string_equal(str(c->lines[1], "fine"), "\xe2\x82\xac and \xf0\x9f\x98\x80");
}

static void test_fields_cannot_replace_the_envelope(void **state)
{
    struct captured *c = *state;
    log_fields(
        LOG_INFO, "real",
        json_pack("{s:s,s:s,s:s,s:i}", "msg", "fake", "level", "error", "ts", "then", "n", 1));
    log_fields(LOG_INFO, "no fields", NULL);
    read_lines(c);
    assert_int_equal(c->n, 2);
    assert_string_equal(str(c->lines[0], "msg"), "real");
    assert_string_equal(str(c->lines[0], "level"), "info");
    assert_int_equal(json_object_size(c->lines[0]), 4);
    assert_int_equal(json_object_size(c->lines[1]), 3);
}

static void test_filtered_levels_write_nothing(void **state)
{
    struct captured *c = *state;
    log_set_level(LOG_WARN);
    struct log_line l;
    assert_false(log_begin(&l, LOG_INFO, "dropped"));
    log_fields(LOG_DEBUG, "dropped", json_pack("{s:i}", "n", 1));
    log_msg(LOG_INFO, "dropped %d", 2);
    log_msg(LOG_WARN, "kept %d", 3);
    read_lines(c);
    assert_int_equal(c->n, 1);
    assert_string_equal(str(c->lines[0], "msg"), "kept 3");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_built_line_keeps_types_and_order, capture, release),
        cmocka_unit_test_setup_teardown(test_text_not_utf8_is_replaced, capture, release),
        cmocka_unit_test_setup_teardown(test_fields_cannot_replace_the_envelope, capture, release),
        cmocka_unit_test_setup_teardown(test_filtered_levels_write_nothing, capture, release),
    };
    return cmocka_run_group_tests_name("log", tests, NULL, NULL);
}
