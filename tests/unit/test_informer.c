/*
 * test_informer.c - the informer's pure pieces: pods read from text into
 * trimmed objects (infscan.c), watch event lines, and lists cut into items
 * whatever the read sizes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "charging.h"
#include "kube/informer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Pods as the API server could send them: noise, escapes, nulls, numbers. */
static const char *const pods[] = {
    ("{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"a\",\"namespace\":\"ns\","
     "\"uid\":\"u-1\",\"resourceVersion\":\"42\",\"labels\":{\"app\":\"x\",\"gpuguard.io/"
     "workload-class\":\"training\"},\"annotations\":{\"gpuguard.io/charge\":\"250\",\"other\":"
     "\"{\\\"json\\\": [1,2]}\"},\"managedFields\":[{\"fieldsV1\":{\"f:spec\":{}}}]},\"spec\":{"
     "\"nodeName\":\"n1\",\"containers\":[{\"name\":\"c\",\"env\":[{\"name\":\"E\",\"value\":"
     "\"\\u00e9\\n\\\"\"}],\"resources\":{\"limits\":{\"cpu\":\"2\",\"nvidia.com/gpu\":\"1\"},"
     "\"requests\":{\"memory\":\"1Gi\"}}}]},\"status\":{\"phase\":\"Running\",\"conditions\":[{"
     "\"type\":\"Ready\",\"status\":true,\"n\":-1.5e3}]}}"),
    /* limits without a GPU win over requests with one: the limits object stays, emptied. */
    ("{\"metadata\":{\"uid\":\"u-2\",\"namespace\":\"ns\",\"name\":\"b\"},\"spec\":{\"containers\":"
     "[{\"resources\":{\"limits\":{\"cpu\":1},\"requests\":{\"nvidia.com/gpu\":2}}},{}],"
     "\"initContainers\":[{\"resources\":{\"limits\":{\"nvidia.com/mig-3g.40gb\":3}}}]}}"),
    /* escaped keys, nulls where objects go, a generateName; a shared replica on no known pool,
     * whose charge the annotation sets, no lower than the fleet's smallest slot (250: the
     * 4 replicas of l4-shared). */
    ("{\"metadata\":{\"uid\":\"u-3\",\"namespace\":\"ns\",\"name\":\"web-x\",\"generateName\":"
     "\"web-\",\"labels\":null,\"annotations\":{\"gpuguard.io\\/charge\":\"125\"}},\"spec\":{"
     "\"nodeSelector\":null,\"containers\":[{\"name\":\"w\",\"restartPolicy\":null,\"resources\":{"
     "\"limits\":{\"nvidia.com/gpu.shared\":1}}}]},\"status\":null}"),
    ("{\"metadata\":{\"uid\":\"u-4\",\"namespace\":\"ns\"},\"spec\":{\"containers\":[{"
     "\"resources\":"
     "{\"limits\":{\"nvidia.com/gpu.shared\":\"1\"}}}]},\"status\":{\"phase\":\"Succeeded\"}}"),
    /* what the charge reads besides resources: claims and the ones made for the pod, the
     * selector, a sidecar, KAI keys. */
    ("{\"metadata\":{\"uid\":\"u-5\",\"namespace\":\"ns\",\"name\":\"k\",\"annotations\":{"
     "\"gpu-fraction\":\"0.5\",\"gpu-memory\":\"100\",\"gpu-fraction-num-devices\":\"2\","
     "\"x\":\"y\"}},\"spec\":{\"nodeSelector\":{\"gpuguard.io/pool\":\"l4-shared\"},"
     "\"resourceClaims\":[{\"name\":\"gpu\",\"resourceClaimTemplateName\":\"one\"}],"
     "\"initContainers\":[{\"name\":\"s\",\"restartPolicy\":\"Always\",\"image\":\"i\"}],"
     "\"containers\":[{\"name\":\"c\",\"resources\":{\"claims\":[{\"name\":\"gpu\"}]}}]},"
     "\"status\":{\"phase\":\"Running\",\"hostIP\":\"10.0.0.1\",\"resourceClaimStatuses\":[{"
     "\"name\":\"gpu\",\"resourceClaimName\":\"k-gpu-x7k2p\"}]}}"),
    "{}",
};

/* What each of pods is read into: only what the charge model reads. */
static const char *const trimmed[] = {
    ("{\"metadata\":{\"name\":\"a\",\"namespace\":\"ns\",\"uid\":\"u-1\",\"labels\":{"
     "\"gpuguard.io/workload-class\":\"training\"},\"annotations\":{\"gpuguard.io/charge\":"
     "\"250\"}},\"spec\":{\"nodeName\":\"n1\",\"containers\":[{\"name\":\"c\",\"resources\":{"
     "\"limits\":{\"nvidia.com/gpu\":\"1\"},\"requests\":{}}}]},\"status\":{\"phase\":"
     "\"Running\"}}"),
    ("{\"metadata\":{\"uid\":\"u-2\",\"namespace\":\"ns\",\"name\":\"b\"},\"spec\":{\"containers\":"
     "[{\"resources\":{\"limits\":{},\"requests\":{\"nvidia.com/gpu\":2}}},{}],\"initContainers\":"
     "[{\"resources\":{\"limits\":{\"nvidia.com/mig-3g.40gb\":3}}}]}}"),
    ("{\"metadata\":{\"uid\":\"u-3\",\"namespace\":\"ns\",\"name\":\"web-x\",\"generateName\":"
     "\"web-\",\"annotations\":{\"gpuguard.io/charge\":\"125\"}},\"spec\":{\"nodeSelector\":null,"
     "\"containers\":[{\"name\":\"w\",\"resources\":{\"limits\":{\"nvidia.com/"
     "gpu.shared\":1}}}]}}"),
    ("{\"metadata\":{\"uid\":\"u-4\",\"namespace\":\"ns\"},\"spec\":{\"containers\":[{"
     "\"resources\":{\"limits\":{\"nvidia.com/gpu.shared\":\"1\"}}}]},\"status\":{\"phase\":"
     "\"Succeeded\"}}"),
    ("{\"metadata\":{\"uid\":\"u-5\",\"namespace\":\"ns\",\"name\":\"k\",\"annotations\":{"
     "\"gpu-fraction\":\"0.5\",\"gpu-memory\":\"100\",\"gpu-fraction-num-devices\":\"2\"}},"
     "\"spec\":{\"nodeSelector\":{\"gpuguard.io/pool\":\"l4-shared\"},\"resourceClaims\":[{"
     "\"name\":\"gpu\",\"resourceClaimTemplateName\":\"one\"}],\"initContainers\":[{\"name\":"
     "\"s\",\"restartPolicy\":\"Always\"}],\"containers\":[{\"name\":\"c\",\"resources\":{}}]},"
     "\"status\":{\"phase\":\"Running\",\"resourceClaimStatuses\":[{\"name\":\"gpu\","
     "\"resourceClaimName\":\"k-gpu-x7k2p\"}]}}"),
    "{}",
};

/* ownerReferences: only the controller's kind and name are kept. */
static const char owned_pod[] =
    ("{\"metadata\":{\"uid\":\"u-5\",\"namespace\":\"ml\",\"name\":\"chat-5d8f7c9b4-x2x7z\","
     "\"ownerReferences\":[null,{\"kind\":\"Node\",\"name\":\"n1\",\"controller\":false},"
     "{\"apiVersion\":\"apps/v1\",\"kind\":\"ReplicaSet\",\"name\":\"chat-5d8f7c9b4\","
     "\"uid\":\"r-1\",\"controller\":true,\"blockOwnerDeletion\":true}]},\"spec\":{"
     "\"containers\":[{\"resources\":{\"limits\":{\"nvidia.com/gpu\":1}}}]}}");

static void test_read_pod_keeps_the_controller_owner(void **state)
{
    (void)state;
    json_t *read = inf_read_pod(owned_pod, strlen(owned_pod), NULL, NULL);
    json_t *want = json_loads(
        "{\"metadata\":{\"uid\":\"u-5\",\"namespace\":\"ml\",\"name\":\"chat-5d8f7c9b4-x2x7z\","
        "\"ownerReferences\":[{\"kind\":\"ReplicaSet\",\"name\":\"chat-5d8f7c9b4\","
        "\"controller\":true}]},\"spec\":{\"containers\":[{\"resources\":{\"limits\":{"
        "\"nvidia.com/gpu\":1}}}]}}",
        0, NULL);
    assert_true(json_equal(read, want));
    json_decref(read);
    json_decref(want);
}

static bool keep_pod(void *ctx, json_t *pod, const char *why)
{
    (void)why;
    *(json_t **)ctx = json_incref(pod);
    return true;
}

/* The pod a one-item list hands over, its item read in place (one chunk). */
static json_t *read_as_list_item(const char *pod)
{
    char text[4096];
    snprintf(text, sizeof(text), "{\"items\":[%s]}", pod);
    json_t *read = NULL;
    struct inf_list_reader *r = inf_list_reader_new(keep_pod, &read);
    struct gg_err err = {{0}};
    if (inf_list_feed(r, text, strlen(text), &err) != GG_OK)
        fail_msg("%s: %s", pod, err.msg);
    inf_list_reader_free(r);
    return read;
}

/* Read whole or as a list item, each pod is trimmed alike, and charged as the full pod. */
static void test_read_pod_trims_to_what_the_charge_reads(void **state)
{
    (void)state;
    assert_int_equal(sizeof(trimmed), sizeof(pods));
    struct inventory *inv = inv_new();
    struct charging model;
    charging_start(&model, inv, "policies", "deploy/gpuguard.yaml");
    for (size_t i = 0; i < sizeof(pods) / sizeof(pods[0]); i++) {
        json_error_t jerr;
        json_t *full = json_loads(pods[i], 0, &jerr), *want = json_loads(trimmed[i], 0, &jerr);
        if (!full || !want)
            fail_msg("pod %zu: bad fixture: %s", i, jerr.text);
        char rv[INF_RV_MAX];
        struct gg_err err = {{0}};
        json_t *read = inf_read_pod(pods[i], strlen(pods[i]), rv, &err);
        if (!read)
            fail_msg("pod %zu: %s", i, err.msg);
        json_t *item = read_as_list_item(pods[i]);
        if (!json_equal(want, read) || !json_equal(want, item)) {
            char *a = json_dumps(read, JSON_SORT_KEYS), *b = json_dumps(item, JSON_SORT_KEYS);
            fail_msg("pod %zu:\n want %s\n read %s\n item %s", i, trimmed[i], a, b);
        }
        assert_int_equal(charge_of(inv, read), charge_of(inv, full));
        json_decref(full);
        json_decref(want);
        json_decref(read);
        json_decref(item);
    }
    charging_stop(&model);
    inv_free(inv);
}

static void test_read_pod_keeps_only_what_accounting_needs(void **state)
{
    (void)state;
    struct inventory *inv = inv_new();
    struct charging model;
    charging_start(&model, inv, "policies", "deploy/gpuguard.yaml");
    char rv[INF_RV_MAX];
    json_t *p = inf_read_pod(pods[0], strlen(pods[0]), rv, NULL);
    assert_non_null(p);
    assert_string_equal(rv, "42");
    json_t *want = json_loads(trimmed[0], 0, NULL);
    assert_true(json_equal(p, want));
    /* A whole GPU is what the spec says, whatever the annotation claims. */
    assert_int_equal(charge_of(inv, p), 1000);
    json_decref(p);
    json_decref(want);
    p = inf_read_pod(pods[1], strlen(pods[1]), NULL, NULL);
    /* Two GPUs requested; the init container's 3 MIG 3g slices (3 x 0.429) are fewer. */
    assert_int_equal(charge_of(inv, p), 2000);
    json_decref(p);
    p = inf_read_pod(pods[4], strlen(pods[4]), NULL, NULL);
    want = json_loads(trimmed[4], 0, NULL);
    assert_true(json_equal(p, want));
    json_decref(p);
    json_decref(want);
    charging_stop(&model);
    inv_free(inv);
}

/*
 * A value of another type where a string goes (a cluster-state file's YAML leaves numbers
 * unquoted): a string of the pod's own is then absent, a value the charge reads is kept as it
 * is for the model to judge; a NUL the API server writes as \u0000 in a value it keeps is kept
 * as U+FFFD (the JSON parser refuses \u0000), and one in a value it skips changes nothing.
 */
static void test_read_pod_keeps_a_pod_of_odd_values(void **state)
{
    (void)state;
    static const char text[] =
        "{\"metadata\":{\"uid\":\"u-9\",\"name\":5,\"namespace\":\"ns\",\"annotations\":{"
        "\"gpuguard.io/charge\":250,\"gpu-fraction\":\"0.5\\u0000\",\"note\":\"a\\u0000b\"}},"
        "\"spec\":{\"containers\":[{\"name\":\"c\",\"env\":[{\"name\":\"E\",\"value\":"
        "\"\\ud800\"}],\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"1\"}}}]}}";
    json_t *read = inf_read_pod(text, strlen(text), NULL, NULL);
    json_t *want = json_loads(
        "{\"metadata\":{\"uid\":\"u-9\",\"namespace\":\"ns\",\"annotations\":{"
        "\"gpuguard.io/charge\":250,\"gpu-fraction\":\"0.5\\ufffd\"}},\"spec\":{\"containers\":[{"
        "\"name\":\"c\",\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"1\"}}}]}}",
        0, NULL);
    assert_non_null(read);
    assert_true(json_equal(read, want));
    json_decref(read);
    json_decref(want);
}

static void test_read_pod_refuses_what_is_not_json(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",
        "[]",
        "{\"metadata\":{}",
        "{\"metadata\":{}} x",
        "{\"a\":tru}",
        "{\"a\":01}",
        "{\"a\":1.}",
        "{\"a\":\"\\x\"}",
        "{\"a\":\"\\u12g4\"}",
        "{\"a\":\"tab\there\"}",
        "{\"a\":[1,]}",
        "{\"a\":1,}",
        "{\"metadata\":{\"uid\":\"\xff\"}}",
        "{\"spec\":{\"containers\":{}}}",
        ("{\"metadata\":{\"resourceVersion\":"
         "\"12345678901234567890123456789012345678901234567890123456789012345\"}}"),
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct gg_err err = {{0}};
        json_t *p = inf_read_pod(bad[i], strlen(bad[i]), NULL, &err);
        if (p)
            fail_msg("case %zu (%s) was accepted", i, bad[i]);
        assert_non_null(strstr(err.msg, "byte "));
    }
    /* Deep nesting is refused, not recursed into without end. */
    size_t n = 100000;
    char *deep = malloc(n * 2 + 16);
    strcpy(deep, "{\"a\":");
    size_t k = strlen(deep);
    for (size_t i = 0; i < n; i++)
        deep[k++] = '[';
    for (size_t i = 0; i < n; i++)
        deep[k++] = ']';
    deep[k++] = '}';
    assert_null(inf_read_pod(deep, k, NULL, NULL));
    free(deep);
}

static void test_events(void **state)
{
    (void)state;
    struct inf_event ev;
    struct inf_pod pod;
    struct gg_err err = {{0}};
    char line[4096];
    inf_pod_init(&pod);
    snprintf(line, sizeof(line), "{\"type\":\"ADDED\",\"object\":%s}", pods[0]);
    assert_int_equal(inf_parse_event(line, strlen(line), &pod, &ev, &err), GG_OK);
    assert_int_equal(ev.type, INF_ADDED);
    assert_string_equal(ev.rv, "42");
    /* Read once, into the caller's pod: who it is and its charge spec. */
    assert_ptr_equal(ev.pod, &pod);
    assert_null(ev.obj);
    assert_string_equal(ev.pod->uid, "u-1");
    assert_true(ev.pod->spec_len > 0);
    inf_event_clear(&ev);
    /* The object may come first. */
    snprintf(line, sizeof(line), "{\"object\":%s, \"type\":\"DELETED\"}\r\n", pods[1]);
    assert_int_equal(inf_parse_event(line, strlen(line), &pod, &ev, &err), GG_OK);
    assert_int_equal(ev.type, INF_DELETED);
    assert_string_equal(ev.pod->uid, "u-2");
    inf_event_clear(&ev);
    const char *bookmark = "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"Pod\",\"apiVersion\":"
                           "\"v1\",\"metadata\":{\"resourceVersion\":\"12746\","
                           "\"creationTimestamp\":null},\"spec\":{\"containers\":null},"
                           "\"status\":{}}}";
    assert_int_equal(inf_parse_event(bookmark, strlen(bookmark), &pod, &ev, &err), GG_OK);
    assert_int_equal(ev.type, INF_BOOKMARK);
    assert_string_equal(ev.rv, "12746");
    assert_null(ev.pod);
    inf_event_clear(&ev);
    const char *gone = "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"status\":"
                       "\"Failure\",\"message\":\"too old resource version: 1 (5)\","
                       "\"reason\":\"Expired\",\"code\":410}}";
    assert_int_equal(inf_parse_event(gone, strlen(gone), &pod, &ev, &err), GG_OK);
    assert_int_equal(ev.type, INF_ERROR);
    assert_int_equal(ev.code, 410);
    assert_string_equal(ev.message, "too old resource version: 1 (5)");
    inf_event_clear(&ev);
    static const char *const bad[] = {
        "nope",
        "{\"type\":\"ADDED\"}",
        "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"x\"}}}",
        "{\"type\":\"MOVED\",\"object\":{}}",
        "{\"type\":\"ADDED\",\"object\":{\"metadata\":",
        "{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{}}}",
        "{\"type\":\"ADDED\",\"object\":[]}",
        "{\"type\":7,\"object\":{}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (inf_parse_event(bad[i], strlen(bad[i]), &pod, &ev, &err) == GG_OK)
            fail_msg("case %zu (%s) was accepted", i, bad[i]);
        assert_null(ev.pod);
    }
    inf_pod_free(&pod);
}

struct collected {
    json_t *uids;
    size_t stop_after;
};

static bool collect(void *ctx, json_t *pod, const char *why)
{
    struct collected *c = ctx;
    json_t *uid = json_object_get(json_object_get(pod, "metadata"), "uid");
    json_array_append_new(c->uids, uid ? json_copy(uid) : json_string(why ? "malformed" : "?"));
    return !c->stop_after || json_array_size(c->uids) < c->stop_after;
}

/* Feed text in pieces of step bytes. */
static enum gg_status feed(const char *text, size_t step, struct collected *c,
                           struct inf_list_meta *meta, struct gg_err *err)
{
    struct inf_list_reader *r = inf_list_reader_new(collect, c);
    size_t len = strlen(text);
    enum gg_status st = GG_OK;
    for (size_t off = 0; off < len && st == GG_OK; off += step)
        st = inf_list_feed(r, text + off, len - off < step ? len - off : step, err);
    if (st == GG_OK)
        st = inf_list_finish(r, meta, err);
    inf_list_reader_free(r);
    return st;
}

static void test_list_reader_any_read_size(void **state)
{
    (void)state;
    char text[8192];
    snprintf(text, sizeof(text),
             " {\"kind\":\"PodList\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":"
             "\"777\",\"continue\":\"eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6Nzc3fQ==\","
             "\"remainingItemCount\":3},\"items\":[%s,%s , %s,%s],\"x\":{\"items\":[1]}}\n",
             pods[0], pods[1], pods[2], pods[3]);
    for (size_t step = 1; step <= strlen(text); step += step < 40 ? 1 : 97) {
        struct collected c = {json_array(), 0};
        struct inf_list_meta meta;
        struct gg_err err = {{0}};
        if (feed(text, step, &c, &meta, &err) != GG_OK)
            fail_msg("step %zu: %s", step, err.msg);
        json_t *want = json_pack("[ssss]", "u-1", "u-2", "u-3", "u-4");
        if (!json_equal(c.uids, want))
            fail_msg("step %zu: %s", step, json_dumps(c.uids, 0));
        assert_string_equal(meta.resource_version, "777");
        assert_string_equal(meta.continue_token, "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6Nzc3fQ==");
        assert_int_equal(meta.items, 4);
        free(meta.continue_token);
        json_decref(want);
        json_decref(c.uids);
    }
}

static void test_list_reader_edges(void **state)
{
    (void)state;
    struct collected c = {json_array(), 0};
    struct inf_list_meta meta;
    struct gg_err err = {{0}};
    /* Metadata after the items, no continue, empty and null item lists. */
    assert_int_equal(
        feed("{\"items\":[],\"metadata\":{\"resourceVersion\":\"5\"}}", 3, &c, &meta, &err), GG_OK);
    assert_string_equal(meta.resource_version, "5");
    assert_null(meta.continue_token);
    assert_int_equal(feed("{\"items\":null,\"metadata\":{}}", 100, &c, &meta, &err), GG_OK);
    assert_int_equal(json_array_size(c.uids), 0);
    static const char *const bad[] = {
        "[1]",
        "{\"items\":[1]}",
        "{\"items\":\"x\"}",
        "{\"items\":[{}",
        "{\"items\":[]}}",
        "{\"items\":[]} {}",
        "{\"metadata\":{\"resourceVersion\":1,}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (feed(bad[i], 2, &c, &meta, &err) == GG_OK)
            fail_msg("case %zu (%s) was accepted", i, bad[i]);
    /* A malformed item is reported and the reading goes on. */
    for (size_t step = 1; step < 80; step += 7) {
        json_array_clear(c.uids);
        assert_int_equal(feed("{\"items\":[{\"metadata\":{\"uid\":\"a\"}},{\"metadata\":tru},"
                              "{\"metadata\":{\"uid\":\"b\"}}]}",
                              step, &c, &meta, &err),
                         GG_OK);
        json_t *want = json_pack("[sss]", "a", "malformed", "b");
        assert_true(json_equal(c.uids, want));
        json_decref(want);
    }
    /* on_pod can stop the reading. */
    json_array_clear(c.uids);
    c.stop_after = 1;
    assert_int_not_equal(feed("{\"items\":[{},{},{}]}", 1, &c, &meta, &err), GG_OK);
    assert_int_equal(json_array_size(c.uids), 1);
    json_decref(c.uids);
}

static void test_list_reader_skips_oversized_items(void **state)
{
    (void)state;
    size_t big = INF_MAX_LINE + 10;
    char *text = malloc(big + 200);
    int k = sprintf(text, "{\"items\":[{\"metadata\":{\"uid\":\"a\"}},{\"pad\":\"");
    memset(text + k, 'x', big);
    k += (int)big;
    k += sprintf(text + k, "\"},{\"metadata\":{\"uid\":\"b\"}}]}");
    for (size_t step = 4096; step <= (size_t)k; step *= 64) {
        struct collected c = {json_array(), 0};
        struct inf_list_meta meta;
        struct gg_err err = {{0}};
        assert_int_equal(feed(text, step, &c, &meta, &err), GG_OK);
        assert_int_equal(meta.items, 2);
        assert_int_equal(meta.oversized, 1);
        assert_string_equal(json_string_value(json_array_get(c.uids, 1)), "b");
        json_decref(c.uids);
    }
    free(text);
}

static void test_stage_swaps_in_and_settles_reservations(void **state)
{
    (void)state;
    struct inventory *inv = inv_new();
    struct charging model;
    charging_start(&model, inv, "policies", "deploy/gpuguard.yaml");
    inv_reserve(
        inv,
        &(struct inv_hold){.ns = "ns", .uid = "u-3", .name = "web-x", .cls = "", .charge = 125},
        60000);
    inv_reserve(inv,
                &(struct inv_hold){
                    .ns = "ns", .uid = "u-other", .name = "other", .cls = "", .charge = 1000},
                60000);
    struct inv_stage *stage = inv_stage_new(inv);
    for (size_t i = 0; i < sizeof(pods) / sizeof(pods[0]); i++) {
        json_t *p = inf_read_pod(pods[i], strlen(pods[i]), NULL, NULL);
        inv_stage_add(stage, p);
        json_decref(p);
    }
    /* The Succeeded pod does not count; k is illegal in KAI (a fraction and a memory), which
     * no admission let through: it counts as one GPU (fail closed). */
    assert_int_equal(inv_stage_pods(stage), 4);
    assert_int_equal(inv_usage(inv, "ns", NULL), 1125);
    inv_stage_commit(inv, stage);
    /* web-x (uid u-3) settled its reservation; "other" still counts. */
    assert_int_equal(inv_usage(inv, "ns", NULL), 1000 + 2000 + 250 + 1000 + 1000);
    assert_int_equal(inv_usage(inv, "ns", "training"), 1000);
    struct inv_ns_usage *list;
    assert_int_equal(inv_usage_by_namespace(inv, &list), 1);
    assert_string_equal(list[0].ns, "ns");
    assert_int_equal(list[0].milli, 1000 + 2000 + 250 + 1000);
    free(list);
    charging_stop(&model);
    inv_free(inv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_pod_trims_to_what_the_charge_reads),
        cmocka_unit_test(test_read_pod_keeps_the_controller_owner),
        cmocka_unit_test(test_read_pod_keeps_only_what_accounting_needs),
        cmocka_unit_test(test_read_pod_keeps_a_pod_of_odd_values),
        cmocka_unit_test(test_read_pod_refuses_what_is_not_json),
        cmocka_unit_test(test_events),
        cmocka_unit_test(test_list_reader_any_read_size),
        cmocka_unit_test(test_list_reader_edges),
        cmocka_unit_test(test_list_reader_skips_oversized_items),
        cmocka_unit_test(test_stage_swaps_in_and_settles_reservations),
    };
    return cmocka_run_group_tests_name("informer", tests, NULL, NULL);
}
