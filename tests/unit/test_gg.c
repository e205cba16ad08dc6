/*
 * test_gg.c - gg_fail's messages: formatted, cut to the buffer, and never cut
 * inside a UTF-8 character (they end up in JSON answers).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "util/gpuguard.h"
#include "util/jsonfast.h"

static void test_a_message_is_formatted_whole(void **state)
{
    (void)state;
    struct gg_err err;
    assert_int_equal(gg_fail(&err, GG_ERR_INVALID, "bad %s at %d", "key", 7), GG_ERR_INVALID);
    assert_string_equal(err.msg, "bad key at 7");
}

/* A long message of n-byte characters after a prefix that shifts where the cut falls. */
static void cut_at_every_offset(size_t n, const char *ch)
{
    char text[600];
    for (size_t prefix = 0; prefix < 4; prefix++) {
        memset(text, 'a', prefix);
        size_t len = prefix;
        while (len + n < sizeof(text) - 1) {
            memcpy(text + len, ch, n);
            len += n;
        }
        text[len] = '\0';
        struct gg_err err;
        gg_fail(&err, GG_ERR_INVALID, "%s", text);
        size_t got = strlen(err.msg), full = prefix + (sizeof(err.msg) - 1 - prefix) / n * n;
        assert_true(jf_utf8_valid(err.msg, got));
        assert_int_equal(got, full); /* only the character cut short is dropped */
        assert_memory_equal(err.msg, text, got);
    }
}

static void test_a_cut_message_stays_utf8(void **state)
{
    (void)state;
    cut_at_every_offset(2, "\xc3\xa9");         /* é */
    cut_at_every_offset(3, "\xe2\x82\xac");     /* € */
    cut_at_every_offset(4, "\xf0\x9f\x98\x80"); /* 😀 */
    cut_at_every_offset(1, "a");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_message_is_formatted_whole),
        cmocka_unit_test(test_a_cut_message_stays_utf8),
    };
    return cmocka_run_group_tests_name("gg", tests, NULL, NULL);
}
