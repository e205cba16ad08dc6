/*
 * test_inventory.c - pod charges, usage sums, reservations, snapshots.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "inventory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static json_t *pod(const char *uid, const char *ns, const char *name, const char *phase,
                   const char *limits_json, const char *annotations_json, const char *cls)
{
    char text[2048];
    snprintf(text, sizeof(text),
             "{\"metadata\":{\"uid\":\"%s\",\"namespace\":\"%s\",\"name\":\"%s\","
             "\"annotations\":%s,\"labels\":{\"gpuguard.io/workload-class\":\"%s\"}},"
             "\"spec\":{\"containers\":[{\"name\":\"c\",\"resources\":{\"limits\":%s}}]},"
             "\"status\":{\"phase\":\"%s\"}}",
             uid, ns, name, annotations_json, cls, limits_json, phase);
    json_error_t e;
    json_t *p = json_loads(text, 0, &e);
    if (!p)
        fail_msg("bad fixture: %s", e.text);
    return p;
}

static void test_charges(void **state)
{
    (void)state;
    static const struct {
        const char *limits, *annotations;
        int64_t charge;
    } cases[] = {
        {"{\"nvidia.com/gpu\":\"2\"}", "{}", 2000},
        {"{\"nvidia.com/gpu\":2}", "{}", 2000},
        {"{\"nvidia.com/mig-1g.10gb\":\"1\"}", "{}", 143},
        {"{\"nvidia.com/mig-3g.40gb\":\"2\"}", "{}", 858},
        {"{\"nvidia.com/mig-1g.6gb\":\"1\"}", "{}", 250}, /* A30: 4 slices */
        {"{\"nvidia.com/mig-4g.24gb\":\"1\"}", "{}", 1000},
        /* H100-94GB's 24 GB profiles have seven slices, not A30's four. */
        {"{\"nvidia.com/mig-1g.24gb\":\"1\"}", "{}", 143},
        {"{\"nvidia.com/mig-2g.24gb\":\"1\"}", "{}", 286},
        {"{\"nvidia.com/gpu.shared\":\"1\"}", "{}", 1000},
        {"{\"cpu\":\"4\",\"memory\":\"8Gi\"}", "{}", 0},
        {"{\"nvidia.com/gpu.shared\":\"1\"}", "{\"gpuguard.io/charge\":\"250\"}", 250},
        {"{\"nvidia.com/gpu\":\"1\"}", "{\"gpuguard.io/charge\":\"bogus\"}", 1000},
        {"{\"nvidia.com/gpu\":\"bogus\"}", "{}", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *p = pod("u", "ns", "n", "Running", cases[i].limits, cases[i].annotations, "");
        int64_t got = inv_pod_charge(p);
        if (got != cases[i].charge)
            fail_msg("case %zu (%s): charge %lld, want %lld", i, cases[i].limits, (long long)got,
                     (long long)cases[i].charge);
        json_decref(p);
    }
}

static void test_init_containers_count_their_maximum(void **state)
{
    (void)state;
    json_t *p = json_loads("{\"spec\":{\"containers\":[{\"resources\":{\"limits\":{\"nvidia.com/"
                           "gpu\":\"1\"}}}],\"initContainers\":[{\"resources\":{\"limits\":{"
                           "\"nvidia.com/gpu\":\"3\"}}},{\"resources\":{\"limits\":{\"nvidia.com/"
                           "gpu\":\"2\"}}}]}}",
                           0, NULL);
    assert_int_equal(inv_pod_charge(p), 3000);
    json_decref(p);
}

static void test_usage_sums_follow_upserts_and_deletes(void **state)
{
    (void)state;
    struct inventory *inv = inv_new();
    json_t *a = pod("a", "team-a", "a", "Running", "{\"nvidia.com/gpu\":\"1\"}", "{}", "training");
    json_t *b =
        pod("b", "team-a", "b", "Pending", "{}", "{\"gpuguard.io/charge\":\"250\"}", "inference");
    json_t *c = pod("c", "team-b", "c", "Running", "{\"nvidia.com/gpu\":\"4\"}", "{}", "");
    inv_upsert(inv, a);
    inv_upsert(inv, b);
    inv_upsert(inv, c);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 1250);
    assert_int_equal(inv_usage(inv, "team-a", "inference"), 250);
    assert_int_equal(inv_usage(inv, "team-b", NULL), 4000);
    assert_int_equal(inv_usage(inv, "nobody", NULL), 0);
    assert_int_equal(inv_pod_count(inv), 3);
    /* The same pod again (MODIFIED) replaces its record. */
    inv_upsert(inv, a);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 1250);
    /* Finished pods stop counting. */
    json_t *done = pod("a", "team-a", "a", "Succeeded", "{\"nvidia.com/gpu\":\"1\"}", "{}", "");
    inv_upsert(inv, done);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 250);
    assert_int_equal(inv_usage(inv, "team-a", "training"), 0);
    inv_delete(inv, b);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 0);
    assert_int_equal(inv_pod_count(inv), 1);
    json_decref(a);
    json_decref(b);
    json_decref(c);
    json_decref(done);
    inv_free(inv);
}

static void test_many_pods_keep_exact_sums(void **state)
{
    (void)state;
    struct inventory *inv = inv_new();
    json_t *pods = json_array();
    for (int i = 0; i < 5000; i++) {
        char uid[32], ns[32];
        snprintf(uid, sizeof(uid), "uid-%d", i);
        snprintf(ns, sizeof(ns), "ns-%d", i % 10);
        json_array_append_new(pods,
                              pod(uid, ns, uid, "Running", "{\"nvidia.com/gpu\":\"1\"}", "{}", ""));
    }
    inv_replace(inv, pods);
    assert_int_equal(inv_pod_count(inv), 5000);
    assert_int_equal(inv_usage(inv, "ns-3", NULL), 500000);
    for (int i = 0; i < 5000; i += 2)
        inv_delete(inv, json_array_get(pods, (size_t)i));
    assert_int_equal(inv_pod_count(inv), 2500);
    assert_int_equal(inv_usage(inv, "ns-3", NULL), 500000); /* odd indexes only in ns-3 */
    assert_int_equal(inv_usage(inv, "ns-2", NULL), 0);
    json_decref(pods);
    inv_free(inv);
}

static void test_reservations_settle_and_expire(void **state)
{
    (void)state;
    struct inventory *inv = inv_new();
    inv_reserve(inv, "team-a", "web-", "inference", 250, 60000);
    inv_reserve(inv, "team-a", "train", "training", 1000, 60000);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 1250);
    assert_int_equal(inv_usage(inv, "team-a", "training"), 1000);
    /* The watch shows web-x7k2p (generateName web-): it replaces its reservation. */
    json_t *seen = pod("u1", "team-a", "web-x7k2p", "Pending", "{}",
                       "{\"gpuguard.io/charge\":\"250\"}", "inference");
    inv_upsert(inv, seen);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 1250);
    json_t *train =
        pod("u2", "team-a", "train", "Pending", "{\"nvidia.com/gpu\":\"1\"}", "{}", "training");
    inv_upsert(inv, train);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 1250);
    /* A pod never seen (denied by a later webhook) is released after its TTL. */
    inv_reserve(inv, "team-a", "ghost", "", 500, 1);
    usleep(5000);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 1250);
    json_decref(seen);
    json_decref(train);
    inv_free(inv);
}

static void test_snapshot_loading(void **state)
{
    (void)state;
    char path[] = "/tmp/gg-inv-XXXXXX";
    int fd = mkstemp(path);
    const char *text = "{\"apiVersion\":\"v1\",\"kind\":\"List\",\"items\":[{\"metadata\":{\"uid\":"
                       "\"x\",\"namespace\":\"a\"},\"spec\":{\"containers\":[{\"resources\":{"
                       "\"limits\":{\"nvidia.com/gpu\":\"8\"}}}]}}]}";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    struct inventory *inv = inv_new();
    struct gg_err err = {{0}};
    assert_false(inv_ready(inv));
    assert_int_equal(inv_load_snapshot(inv, path, &err), GG_OK);
    assert_true(inv_ready(inv));
    assert_int_equal(inv_usage(inv, "a", NULL), 8000);
    FILE *f = fopen(path, "w");
    fputs("{\"kind\":\"Pod\"}", f);
    fclose(f);
    assert_int_equal(inv_load_snapshot(inv, path, &err), GG_ERR_INVALID);
    assert_non_null(strstr(err.msg, "not a pod list"));
    f = fopen(path, "w");
    fputs("{\"items\": [", f);
    fclose(f);
    assert_int_equal(inv_load_snapshot(inv, path, &err), GG_ERR_PARSE);
    assert_non_null(strstr(err.msg, path));
    unlink(path);
    inv_free(inv);
}

static void collect_owner(void *ctx, const char *ns, const char *name, const char *owner)
{
    char line[512];
    snprintf(line, sizeof(line), "%s/%s=%s", ns, name, owner);
    json_array_append_new(ctx, json_string(line));
}

static void test_owners_of_gpu_pods(void **state)
{
    (void)state;
    struct inventory *inv = inv_new();
    json_t *owned = pod("u1", "ml", "chat-5d8f7c9b4-x2x7z", "Running", "{\"nvidia.com/gpu\":\"1\"}",
                        "{}", "inference");
    json_object_set_new(json_object_get(owned, "metadata"), "ownerReferences",
                        json_pack("[{s:s,s:s,s:b}]", "kind", "ReplicaSet", "name", "chat-5d8f7c9b4",
                                  "controller", 1));
    json_t *bare = pod("u2", "ml", "solo", "Running", "{\"nvidia.com/gpu\":\"1\"}", "{}", "batch");
    inv_upsert(inv, owned);
    inv_upsert(inv, bare);
    json_t *seen = json_array();
    inv_each_owner(inv, collect_owner, seen);
    assert_int_equal(json_array_size(seen), 1);
    assert_string_equal(json_string_value(json_array_get(seen, 0)),
                        "ml/chat-5d8f7c9b4-x2x7z=ReplicaSet/chat-5d8f7c9b4");
    json_decref(seen);
    json_decref(owned);
    json_decref(bare);
    inv_free(inv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_charges),
        cmocka_unit_test(test_init_containers_count_their_maximum),
        cmocka_unit_test(test_usage_sums_follow_upserts_and_deletes),
        cmocka_unit_test(test_many_pods_keep_exact_sums),
        cmocka_unit_test(test_reservations_settle_and_expire),
        cmocka_unit_test(test_snapshot_loading),
        cmocka_unit_test(test_owners_of_gpu_pods),
    };
    return cmocka_run_group_tests_name("inventory", tests, NULL, NULL);
}
