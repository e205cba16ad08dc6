/*
 * test_duration.c - unit tests for webhook/util/duration.c: Go durations as
 * the API server writes them, and what must not parse.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "util/duration.h"

static void test_parse_duration(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int64_t ms;
    } good[] = {{"10s", 10000}, {"30s", 30000}, {"1m30s", 90000}, {"500ms", 500},
                {"1.5s", 1500}, {"0", 0},       {"2h", 7200000},  {"250000us", 250}};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        int64_t ms = -1;
        assert_int_equal(duration_parse_ms(good[i].text, &ms), GG_OK);
        assert_int_equal(ms, good[i].ms);
    }
    static const char *const bad[] = {"", "10", "s", "-1s", "10x", "1s2", "abc", "inf"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int64_t ms;
        if (duration_parse_ms(bad[i], &ms) != GG_ERR_PARSE)
            fail_msg("\"%s\" should not parse", bad[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_duration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
