/*
 * test_gpuquota.c - a GPUQuota read, charged and recounted: the rules of
 * the ledger without the API server (kube/gpuquota.c, kube/quotactl.c);
 * the writes themselves are tests/integration/test_quota_ledger.py's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "charging.h"
#include "kube/gpuquota.h"
#include "kube/inventory.h"
#include "kube/quotactl.h"
#include "util/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *parse(const char *text)
{
    json_error_t e;
    json_t *v = json_loads(text, 0, &e);
    if (!v)
        fail_msg("bad fixture: %s: %s", e.text, text);
    return v;
}

static json_t *quota(const char *status_json)
{
    char text[4096];
    snprintf(text, sizeof(text),
             "{\"apiVersion\":\"gpuguard.io/v1alpha1\",\"kind\":\"GPUQuota\","
             "\"metadata\":{\"name\":\"gpu\",\"namespace\":\"team-a\",\"resourceVersion\":\"7\","
             "\"generation\":1},"
             "\"spec\":{\"hard\":{\"gpu\":\"8\",\"pools\":{\"h100-train\":4}}},\"status\":%s}",
             status_json);
    return parse(text);
}

static void test_limits_and_usage_are_read_exactly(void **state)
{
    (void)state;
    struct gq_view v;
    struct gg_err err;
    json_t *q = quota("{\"used\":{\"gpu\":\"5.250\",\"pools\":{\"h100-train\":\"500m\"}}}");
    assert_int_equal(gq_read(q, &v, &err), GG_OK);
    assert_int_equal(v.hard, 8000);
    assert_true(v.counted);
    assert_int_equal(v.used, 5250);
    assert_int_equal(gq_hard_pool(&v, "h100-train"), 4000);
    assert_int_equal(gq_hard_pool(&v, "l4"), -1);
    assert_int_equal(gq_used_pool(&v, "h100-train"), 500);
    assert_string_equal(v.rv, "7");
    json_decref(q);
    q = parse("{\"metadata\":{\"name\":\"x\",\"namespace\":\"n\"},\"spec\":{\"hard\":{\"gpu\":"
              "\"eight\"}}}");
    assert_int_equal(gq_read(q, &v, &err), GG_ERR_INVALID);
    assert_string_equal(err.msg,
                        "GPUQuota n/x: spec.hard.gpu must be a quantity of GPU-equivalents");
    json_decref(q);
}

static void test_a_charge_fits_up_to_the_limit_exactly(void **state)
{
    (void)state;
    struct gq_view v;
    struct gg_err err;
    char why[512];
    json_t *q = quota("{\"used\":{\"gpu\":\"7\",\"pools\":{\"h100-train\":\"3\"}}}");
    assert_int_equal(gq_read(q, &v, &err), GG_OK);
    assert_true(gq_fits(&v, 1000, NULL, why, sizeof(why)));
    assert_string_equal(why, "");
    assert_false(gq_fits(&v, 1001, NULL, why, sizeof(why)));
    assert_string_equal(why, "namespace team-a would use 8.001 of the 8.000 GPU-equivalents of "
                             "GPUQuota gpu (in use 7.000, this pod 1.001); ask for fewer GPUs or "
                             "free GPUs");
    assert_true(gq_fits(&v, 1000, "h100-train", why, sizeof(why)));
    assert_true(gq_fits(&v, 1000, "l4", why, sizeof(why))); /* a pool without a limit */
    json_decref(q);
    q = quota("{\"used\":{\"gpu\":\"1\",\"pools\":{\"h100-train\":\"3.5\"}}}");
    assert_int_equal(gq_read(q, &v, &err), GG_OK);
    assert_false(gq_fits(&v, 1000, "h100-train", why, sizeof(why)));
    assert_string_equal(why, "namespace team-a would use 4.500 of the 4.000 GPU-equivalents "
                             "GPUQuota gpu allows on pool h100-train (in use 3.500, this pod "
                             "1.000); ask for fewer GPUs, another pool, or free GPUs");
    json_decref(q);
    /* Not counted yet: nothing is admitted, whatever it asks. */
    q = quota("{}");
    assert_int_equal(gq_read(q, &v, &err), GG_OK);
    assert_false(v.counted);
    assert_false(gq_fits(&v, 1, NULL, why, sizeof(why)));
    assert_non_null(strstr(why, "has not been counted yet"));
    json_decref(q);
}

static void test_a_charge_raises_used_and_adds_an_entry(void **state)
{
    (void)state;
    json_t *q = quota("{\"used\":{\"gpu\":\"2\",\"pools\":{\"h100-train\":\"1\"}},\"entries\":[]}");
    struct gq_charge c = {.uid = "u1",
                          .pod = "train-0",
                          .pool = "h100-train",
                          .charge = 1143,
                          .now_us = 1795000000000000LL};
    json_t *next = gq_charged(q, &c);
    assert_non_null(next);
    json_t *want = parse("{\"used\":{\"gpu\":\"3.143\",\"pools\":{\"h100-train\":\"2.143\"}},"
                         "\"entries\":[{\"uid\":\"u1\",\"pod\":\"train-0\",\"charge\":\"1.143\","
                         "\"admitted\":\"2026-11-18T11:06:40.000000Z\",\"pool\":"
                         "\"h100-train\"}]}");
    assert_true(json_equal(json_object_get(next, "status"), want));
    /* The precondition is the resourceVersion read. */
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(next, "metadata"), "resourceVersion")),
        "7");
    assert_true(gq_has_entry(next, "u1"));
    assert_false(gq_has_entry(q, "u1"));
    /* A pool without a limit is kept in the entry, not in used.pools. */
    c.pool = "l4";
    json_t *other = gq_charged(q, &c);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_object_get(other, "status"), "used"), "gpu")),
                        "3.143");
    assert_null(json_object_get(
        json_object_get(json_object_get(json_object_get(other, "status"), "used"), "pools"), "l4"));
    json_decref(want);
    json_decref(next);
    json_decref(other);
    json_decref(q);
}

/* The store keeps a namespace's one object, and says when it has several. */
static void test_the_store_by_namespace(void **state)
{
    (void)state;
    struct gq_store *s = gq_store_new();
    json_t *a = quota("{}"), *b = quota("{}");
    json_object_set_new(json_object_get(b, "metadata"), "name", json_string("second"));
    size_t count = 9;
    assert_null(gq_store_get(s, "team-a", &count));
    assert_int_equal(count, 0);
    gq_store_put(s, a, 0);
    json_t *got = gq_store_get(s, "team-a", &count);
    assert_int_equal(count, 1);
    assert_true(json_equal(got, a));
    json_decref(got);
    gq_store_put(s, b, 0);
    assert_null(gq_store_get(s, "team-a", &count));
    assert_int_equal(count, 2);
    /* A relist that shows only a forgets b. */
    gq_store_put(s, a, 5);
    gq_store_relist_end(s, 5);
    got = gq_store_get(s, "team-a", &count);
    assert_int_equal(count, 1);
    json_decref(got);
    gq_store_delete(s, a);
    assert_null(gq_store_get(s, "team-a", &count));
    assert_int_equal(count, 0);
    json_decref(a);
    json_decref(b);
    gq_store_free(s);
}

static json_t *gpu_pod(const char *uid, const char *phase, const char *pool)
{
    char text[1024];
    snprintf(text, sizeof(text),
             "{\"metadata\":{\"uid\":\"%s\",\"namespace\":\"team-a\",\"name\":\"%s\","
             "\"annotations\":{\"gpuguard.io/pool\":\"%s\"},\"labels\":{}},"
             "\"spec\":{\"containers\":[{\"name\":\"c\",\"resources\":{\"limits\":"
             "{\"nvidia.com/gpu\":\"1\"}}}]},\"status\":{\"phase\":\"%s\"}}",
             uid, uid, pool, phase);
    return parse(text);
}

/* The controller's recount: an entry goes when its pod is seen (then counted from the pod) or
 * after the bound; a charge in flight (an entry not seen, young) is never erased. */
static void test_the_recount_keeps_charges_in_flight(void **state)
{
    (void)state;
    struct charging model;
    struct inventory *inv = inv_new();
    charging_start(&model, inv, "policies", "deploy/gpuguard.yaml");
    inv_set_ready(inv, true);
    int64_t now = 1795000000000000LL; /* 2026-11-18T11:06:40Z */
    json_t *q =
        quota("{\"used\":{\"gpu\":\"3\",\"pools\":{\"h100-train\":\"3\"}},\"entries\":["
              "{\"uid\":\"seen\",\"pod\":\"a\",\"charge\":\"1.000\",\"pool\":\"h100-train\","
              "\"admitted\":\"2026-11-18T11:06:39.000000Z\"},"
              "{\"uid\":\"young\",\"pod\":\"b\",\"charge\":\"1.000\",\"pool\":\"h100-train\","
              "\"admitted\":\"2026-11-18T11:06:39.500000Z\"},"
              "{\"uid\":\"refused\",\"pod\":\"c\",\"charge\":\"1.000\",\"pool\":"
              "\"h100-train\",\"admitted\":\"2026-11-18T11:05:20.000000Z\"}]}");
    json_t *seen = gpu_pod("seen", "Running", "h100-train");
    inv_upsert(inv, seen);
    unsigned corrections = 0;
    json_t *next = quotactl_recount(q, inv, now, 30000, &corrections);
    assert_non_null(next);
    json_t *status = json_object_get(next, "status");
    /* seen: from the pod; young: its entry; refused: past the bound, gone. */
    assert_string_equal(json_string_value(json_object_get(json_object_get(status, "used"), "gpu")),
                        "2.000");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(json_object_get(status, "used"), "pools"),
                                          "h100-train")),
        "2.000");
    json_t *entries = json_object_get(status, "entries");
    assert_int_equal(json_array_size(entries), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(entries, 0), "uid")),
                        "young");
    assert_int_equal(corrections, 2); /* the refused entry, and the usage it held */
    /* Counted again, the same: nothing to write. */
    assert_null(quotactl_recount(next, inv, now, 30000, &corrections));
    assert_int_equal(corrections, 0);
    /* The pod finishes: its charge goes; so does a young entry's when its pod is seen gone. */
    json_t *done = gpu_pod("seen", "Succeeded", "h100-train");
    json_t *young_done = gpu_pod("young", "Failed", "h100-train");
    inv_upsert(inv, done);
    inv_upsert(inv, young_done);
    json_t *after = quotactl_recount(next, inv, now, 30000, &corrections);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_object_get(after, "status"), "used"), "gpu")),
                        "0.000");
    assert_int_equal(json_array_size(json_object_get(json_object_get(after, "status"), "entries")),
                     0);
    json_decref(after);
    json_decref(done);
    json_decref(young_done);
    json_decref(next);
    json_decref(seen);
    json_decref(q);
    charging_stop(&model);
    inv_free(inv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limits_and_usage_are_read_exactly),
        cmocka_unit_test(test_a_charge_fits_up_to_the_limit_exactly),
        cmocka_unit_test(test_a_charge_raises_used_and_adds_an_entry),
        cmocka_unit_test(test_the_store_by_namespace),
        cmocka_unit_test(test_the_recount_keeps_charges_in_flight),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
