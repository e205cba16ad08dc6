/*
 * test_inventory.c - usage sums, reservations, snapshots, DRA objects.
 * What each pod is charged is test_charge_model.c's subject.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "charging.h"
#include "kube/inventory.h"

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

/* An inventory charged by the real model (lua/intent.lua) with the example configuration. */
static struct charging model;

static struct inventory *new_inventory(void)
{
    struct inventory *inv = inv_new();
    charging_start(&model, inv, "policies", "deploy/gpuguard.yaml");
    return inv;
}

static void free_inventory(struct inventory *inv)
{
    charging_stop(&model);
    inv_free(inv);
}

static void test_usage_sums_follow_upserts_and_deletes(void **state)
{
    (void)state;
    struct inventory *inv = new_inventory();
    json_t *a = pod("a", "team-a", "a", "Running", "{\"nvidia.com/gpu\":\"1\"}", "{}", "training");
    json_t *b = pod("b", "team-a", "b", "Pending", "{\"nvidia.com/gpu.shared\":\"1\"}",
                    "{\"gpuguard.io/charge\":\"250\"}", "inference");
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
    free_inventory(inv);
}

static void test_many_pods_keep_exact_sums(void **state)
{
    (void)state;
    struct inventory *inv = new_inventory();
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
    free_inventory(inv);
}

static uint64_t reserve(struct inventory *inv, const char *uid, const char *name, const char *cls,
                        int64_t charge, int64_t ttl_ms)
{
    struct inv_hold h = {.ns = "team-a", .uid = uid, .name = name, .cls = cls, .charge = charge};
    return inv_reserve(inv, &h, ttl_ms);
}

static void test_reservations_settle_and_expire(void **state)
{
    (void)state;
    struct inventory *inv = new_inventory();
    reserve(inv, "u1", "web-x7k2p", "inference", 250, 60000);
    reserve(inv, NULL, "train", "training", 1000, 60000);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 1250);
    assert_int_equal(inv_usage(inv, "team-a", "training"), 1000);
    /* The watch shows the pod of uid u1: it replaces its reservation. */
    json_t *seen = pod("u1", "team-a", "web-x7k2p", "Pending", "{\"nvidia.com/gpu.shared\":\"1\"}",
                       "{\"gpuguard.io/charge\":\"250\"}", "inference");
    inv_upsert(inv, seen);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 1250);
    /* A reservation made without a uid is settled by its exact name. */
    json_t *train =
        pod("u2", "team-a", "train", "Pending", "{\"nvidia.com/gpu\":\"1\"}", "{}", "training");
    inv_upsert(inv, train);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 1250);
    /* A pod never seen (denied by a later webhook) is released after its TTL. */
    reserve(inv, NULL, "ghost", "", 500, 1);
    usleep(5000);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 1250);
    json_decref(seen);
    json_decref(train);
    free_inventory(inv);
}

/* Another pod of the same ReplicaSet, or one whose name starts like a reservation's, settles
 * nothing: only the uid the review saw does. */
static void test_reservations_settle_by_uid_only(void **state)
{
    (void)state;
    struct inventory *inv = new_inventory();
    reserve(inv, "u-new", "train-abcde", "", 1000, 60000);
    reserve(inv, NULL, "train", "", 1000, 60000);
    json_t *older = pod("u-old", "team-a", "train-abcde", "Running", "{\"nvidia.com/gpu\":\"1\"}",
                        "{}", "training");
    json_t *cpu = pod("u-cpu", "team-a", "train-cpu", "Running", "{\"nvidia.com/gpu\":\"1\"}", "{}",
                      "training");
    inv_upsert(inv, older);
    inv_upsert(inv, cpu);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 4000);
    json_decref(older);
    json_decref(cpu);
    free_inventory(inv);
}

/* A review reads the reservations of the reviews that reserved before it, not its own nor
 * later ones; a denied review's reservation is dropped. */
static void test_reviews_read_earlier_reservations(void **state)
{
    (void)state;
    struct inventory *inv = new_inventory();
    uint64_t first = reserve(inv, "a", "a", "", 1000, 60000);
    uint64_t second = reserve(inv, "b", "b", "", 1000, 60000);
    assert_true(first && second > first);
    inv_read_before(first);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 0);
    inv_read_before(second);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 1000);
    inv_read_before(0);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 2000);
    inv_unreserve(inv, first);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 1000);
    free_inventory(inv);
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
    struct inventory *inv = new_inventory();
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
    free_inventory(inv);
}

static json_t *dra(const char *kind, const char *uid, const char *name, int count,
                   const char *annotations)
{
    char text[1024];
    snprintf(text, sizeof(text),
             "{\"apiVersion\":\"resource.k8s.io/v1\",\"kind\":\"%s\",\"metadata\":{\"uid\":"
             "\"%s\",\"namespace\":\"team-a\",\"name\":\"%s\",\"annotations\":%s,"
             "\"managedFields\":[{}]},\"spec\":{%s\"devices\":{\"requests\":[{\"name\":\"g\","
             "\"exactly\":{\"deviceClassName\":\"gpu.nvidia.com\",\"count\":%d}}]}%s},"
             "\"status\":{\"allocation\":{}}}",
             kind, uid, name, annotations, strcmp(kind, "ResourceClaim") ? "\"spec\":{" : "", count,
             strcmp(kind, "ResourceClaim") ? "}" : "");
    json_t *o = json_loads(text, 0, NULL);
    if (!o)
        fail_msg("bad fixture %s", text);
    return o;
}

static void test_claims_and_templates(void **state)
{
    (void)state;
    struct inventory *inv = new_inventory();
    json_t *tmpl = dra("ResourceClaimTemplate", "t1", "two", 2, "{}");
    json_t *shared = dra("ResourceClaim", "c1", "shared", 3, "{}");
    json_t *generated =
        dra("ResourceClaim", "c2", "p-g-x", 2, "{\"resource.kubernetes.io/pod-claim-name\":\"g\"}");
    json_t *extended = dra("ResourceClaim", "c3", "e", 1,
                           "{\"resource.kubernetes.io/extended-resource-claim\":\"true\"}");
    json_t *user = json_loads(
        "{\"metadata\":{\"uid\":\"p1\",\"namespace\":\"team-a\",\"name\":\"p\"},\"spec\":{"
        "\"containers\":[{\"name\":\"c\"}],\"resourceClaims\":[{\"name\":\"g\","
        "\"resourceClaimTemplateName\":\"two\"}]}}",
        0, NULL);
    /* The pod first: its template is not known yet, so it counts as one GPU (fail closed). */
    inv_upsert(inv, user);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 1000);
    inv_upsert(inv, tmpl);
    inv_upsert(inv, user);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 2000);
    /* A shared claim is charged on its own; generated and extended-resource claims are not. */
    inv_upsert(inv, shared);
    inv_upsert(inv, generated);
    inv_upsert(inv, extended);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 5000);
    assert_int_equal(inv_dra_count(inv), 4);
    json_t *got = inv_dra_get(inv, "ResourceClaimTemplate", "team-a", "two", 0, NULL);
    assert_non_null(got);
    assert_null(json_object_get(got, "status"));
    assert_null(json_object_get(json_object_get(got, "metadata"), "managedFields"));
    assert_true(json_equal(json_object_get(got, "spec"), json_object_get(tmpl, "spec")));
    json_decref(got);
    assert_null(inv_dra_get(inv, "ResourceClaimTemplate", "team-b", "two", 0, NULL));
    inv_delete(inv, shared);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 2000);
    assert_null(inv_dra_get(inv, "ResourceClaim", "team-a", "shared", 0, NULL));
    /* A relist keeps what it shows and forgets the rest. */
    json_t *items = json_pack("[OO]", tmpl, user);
    inv_replace(inv, items);
    assert_int_equal(inv_dra_count(inv), 1);
    assert_int_equal(inv_usage(inv, "team-a", NULL), 2000);
    json_decref(items);
    json_decref(tmpl);
    json_decref(shared);
    json_decref(generated);
    json_decref(extended);
    json_decref(user);
    free_inventory(inv);
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
    struct inventory *inv = new_inventory();
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

    /* One rule for the controller, the relist's (infscan.c) and the audit's (inv_controller):
     * the first controller reference whose kind and name are both there and not empty. */
    json_object_set_new(json_object_get(owned, "metadata"), "ownerReferences",
                        json_pack("[{s:s,s:s,s:b},{s:s,s:s,s:b}]", "kind", "", "name", "n1",
                                  "controller", 1, "kind", "Job", "name", "train", "controller",
                                  1));
    inv_upsert(inv, owned);
    char *controller = inv_controller(owned);
    assert_string_equal(controller, "Job/train");
    free(controller);
    seen = json_array();
    inv_each_owner(inv, collect_owner, seen);
    assert_string_equal(json_string_value(json_array_get(seen, 0)),
                        "ml/chat-5d8f7c9b4-x2x7z=Job/train");
    json_decref(seen);
    json_decref(owned);
    json_decref(bare);
    free_inventory(inv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage_sums_follow_upserts_and_deletes),
        cmocka_unit_test(test_many_pods_keep_exact_sums),
        cmocka_unit_test(test_reservations_settle_and_expire),
        cmocka_unit_test(test_reservations_settle_by_uid_only),
        cmocka_unit_test(test_reviews_read_earlier_reservations),
        cmocka_unit_test(test_snapshot_loading),
        cmocka_unit_test(test_owners_of_gpu_pods),
        cmocka_unit_test(test_claims_and_templates),
    };
    return cmocka_run_group_tests_name("inventory", tests, NULL, NULL);
}
