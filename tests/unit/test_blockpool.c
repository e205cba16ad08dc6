/*
 * test_blockpool.c - size classes, reuse through the free lists, the end
 * of the region, and ownership.  (Under AddressSanitizer there is no pool:
 * the tests check that blockpool_new says so and stop.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "util/blockpool.h"

#include <stdlib.h>
#include <string.h>

static struct blockpool *pool_or_skip(size_t reserve)
{
    struct blockpool *p = blockpool_new(reserve);
    if (!p)
        skip(); /* built with AddressSanitizer */
    return p;
}

static void test_classes_are_16_bytes_wide(void **state)
{
    (void)state;
    assert_true(blockpool_same_class(1, 16));
    assert_false(blockpool_same_class(16, 17));
    assert_true(blockpool_same_class(241, 256));
    struct blockpool *p = pool_or_skip(1 << 16);
    char *a = blockpool_get(p, 1), *b = blockpool_get(p, 16), *c = blockpool_get(p, 17);
    assert_int_equal(b - a, 16); /* carved one after the other */
    assert_int_equal(c - b, 16);
    memset(c, 0xab, 32); /* a 17-byte request gets a 32-byte block */
    blockpool_free(p);
}

static void test_freed_blocks_come_back_in_their_class(void **state)
{
    (void)state;
    struct blockpool *p = pool_or_skip(1 << 16);
    void *a = blockpool_get(p, 56), *b = blockpool_get(p, 56);
    blockpool_put(p, a, 56);
    blockpool_put(p, b, 50); /* any size of the same class */
    assert_ptr_equal(blockpool_get(p, 64), b);
    assert_ptr_equal(blockpool_get(p, 49), a);
    void *other = blockpool_get(p, 100);
    assert_ptr_not_equal(other, a);
    assert_ptr_not_equal(other, b);
    blockpool_free(p);
}

static void test_region_end_and_ownership(void **state)
{
    (void)state;
    struct blockpool *p = pool_or_skip(4096);
    void *blocks[16];
    for (int i = 0; i < 16; i++) {
        blocks[i] = blockpool_get(p, BLOCKPOOL_MAX);
        assert_non_null(blocks[i]);
        assert_true(blockpool_owns(p, blocks[i]));
    }
    assert_null(blockpool_get(p, 1)); /* 16 x 256 bytes fill 4 KiB */
    blockpool_put(p, blocks[3], BLOCKPOOL_MAX);
    assert_ptr_equal(blockpool_get(p, 255), blocks[3]);
    void *heap = malloc(16);
    assert_false(blockpool_owns(p, heap));
    assert_false(blockpool_owns(NULL, heap));
    free(heap);
    blockpool_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_classes_are_16_bytes_wide),
        cmocka_unit_test(test_freed_blocks_come_back_in_their_class),
        cmocka_unit_test(test_region_end_and_ownership),
    };
    return cmocka_run_group_tests_name("blockpool", tests, NULL, NULL);
}
