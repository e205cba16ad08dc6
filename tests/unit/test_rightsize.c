/*
 * test_rightsize.c - owner folding (ownerfold.c), the rightsizing:
 * settings, durations and queries, and Prometheus answers folded into
 * workloads (rightsize.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kube/ownerfold.h"
#include "kube/rightsize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static void test_pod_names_fold_into_their_workloads(void **state)
{
    (void)state;
    static const struct {
        const char *pod, *want;
    } cases[] = {
        {"chat-5d8f7c9b4-x2x7z", "chat"},            /* Deployment: <rs hash>-<suffix> */
        {"llm-serve-7c9b4d5f8b-q8k4w", "llm-serve"}, /* 10-character hash */
        {"nightly-29412345-bz2kq", "nightly"},       /* CronJob: <minute>-<suffix> */
        {"sweep-k7k7k", "sweep"},                    /* Job, DaemonSet or bare ReplicaSet */
        {"embed-0", "embed"},                        /* StatefulSet */
        {"db-primary-12", "db-primary"},
        {"chat-5d8f7c9b4-", "chat"}, /* a generateName */
        {"sweep-", "sweep"},
        {"load-test-x7kz2", "load-test"}, /* "test" has vowels: not a hash */
        {"run-bz-x7kz2", "run-bz"},       /* 2 characters: too short for a hash */
        {"solo", "solo"},                 /* a pod of its own */
        {"my-model", "my-model"},         /* "model" is no suffix */
        {"web-abcde", "web-abcde"},       /* vowels: no generated suffix */
        {"x-24567", "x"},                 /* safe characters and digits: a suffix */
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        char out[128];
        assert_true(of_from_pod_name(cases[i].pod, out, sizeof(out)));
        if (strcmp(out, cases[i].want) != 0)
            fail_msg("%s: got %s, want %s", cases[i].pod, out, cases[i].want);
    }
}

static void test_owners_fold_into_their_workloads(void **state)
{
    (void)state;
    static const struct {
        const char *kind, *name, *want;
    } cases[] = {
        {"ReplicaSet", "chat-5d8f7c9b4", "chat"},
        {"ReplicaSet", "frontend", "frontend"},
        {"Job", "nightly-29412345", "nightly"},
        {"Job", "train", "train"},
        {"StatefulSet", "embed", "embed"},
        {"Deployment", "chat", "chat"}, /* a workload under admission: itself */
        {"PyTorchJob", "bert-5d8f7c9b4", "bert-5d8f7c9b4"},
    };
    for (size_t i = 0; i < NELEM(cases); i++) {
        char out[128];
        assert_true(of_from_owner(cases[i].kind, cases[i].name, out, sizeof(out)));
        if (strcmp(out, cases[i].want) != 0)
            fail_msg("%s %s: got %s, want %s", cases[i].kind, cases[i].name, out, cases[i].want);
    }
    char small[4];
    assert_false(of_from_pod_name("embed-0", small, sizeof(small)));
    assert_false(of_from_owner("Job", "train", small, sizeof(small)));
}

static void test_durations(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int64_t seconds;
        const char *formatted;
    } ok[] = {{"7d", 604800, "7d"},
              {"5m", 300, "5m"},
              {"1h30m", 5400, "1h30m"},
              {"90s", 90, "1m30s"},
              {"2w1d", 1296000, "15d"}};
    for (size_t i = 0; i < NELEM(ok); i++) {
        int64_t s = 0;
        char out[32];
        assert_true(rs_parse_duration(ok[i].text, &s));
        assert_int_equal(s, ok[i].seconds);
        rs_format_duration(s, out, sizeof(out));
        assert_string_equal(out, ok[i].formatted);
    }
    static const char *const bad[] = {"",   "7",   "d",    "-1h",        "1y",
                                      "0s", "1h ", "1.5h", "9999999999d"};
    for (size_t i = 0; i < NELEM(bad); i++) {
        int64_t s = 42;
        if (rs_parse_duration(bad[i], &s))
            fail_msg("\"%s\" was read as %lld seconds", bad[i], (long long)s);
    }
}

static enum gg_status parse(const char *yaml_json, struct rs_settings *s, struct gg_err *err)
{
    json_t *cfg = json_loads(yaml_json, 0, NULL);
    assert_non_null(cfg);
    enum gg_status st = rs_settings_parse(cfg, s, err);
    json_decref(cfg);
    return st;
}

static void test_settings(void **state)
{
    (void)state;
    struct rs_settings s;
    struct gg_err err = {{0}};
    assert_int_equal(parse("{}", &s, &err), GG_OK);
    assert_int_equal(s.mode, RS_OFF);
    assert_int_equal(s.window_s, 604800);
    assert_int_equal(s.refresh_s, 300);
    assert_string_equal(s.metric, "DCGM_FI_DEV_FB_USED");
    assert_int_equal(
        parse("{\"rightsizing\":{\"mode\":\"apply\",\"window\":\"2d\",\"refresh\":\"10s\","
              "\"prometheus\":{\"url\":\"https://prom:9090/\",\"token_file\":\"/t\"},"
              "\"labels\":{\"namespace\":\"exported_namespace\",\"pod\":\"exported_pod\"}}}",
              &s, &err),
        GG_OK);
    assert_int_equal(s.mode, RS_APPLY);
    assert_string_equal(s.url, "https://prom:9090");
    assert_string_equal(s.token_file, "/t");
    assert_string_equal(s.ns_label, "exported_namespace");
    assert_int_equal(s.window_s, 172800);
    assert_int_equal(s.refresh_s, 10);
    /* YAML 1.1 reads an unquoted off as false */
    assert_int_equal(parse("{\"rightsizing\":{\"mode\":false}}", &s, &err), GG_OK);
    assert_int_equal(s.mode, RS_OFF);
    static const struct {
        const char *cfg, *msg;
    } bad[] = {
        {"{\"rightsizing\":[]}", "rightsizing: must be a mapping"},
        {"{\"rightsizing\":{\"mode\":\"on\"}}",
         "rightsizing.mode: must be off, recommend or apply"},
        {"{\"rightsizing\":{\"window\":\"a week\"}}",
         "rightsizing.window: must be a duration such as 7d, 5m or 1h30m"},
        {"{\"rightsizing\":{\"prometheus\":{\"url\":\"prom:9090\"}}}",
         "rightsizing.prometheus.url: must start with http:// or https://"},
        {"{\"rightsizing\":{\"prometheus\":{\"url\":7}}}",
         "rightsizing.prometheus.url: must be a string of at most 1023 bytes"},
        {"{\"rightsizing\":{\"prometheus\":{\"cert_file\":\"/c\"}}}",
         "rightsizing.prometheus: cert_file and key_file go together"},
        {"{\"rightsizing\":{\"labels\":{\"pod\":\"pod\\\"}\"}}}",
         "rightsizing: metric and labels must be Prometheus names"},
    };
    for (size_t i = 0; i < NELEM(bad); i++) {
        assert_int_equal(parse(bad[i].cfg, &s, &err), GG_ERR_INVALID);
        assert_string_equal(err.msg, bad[i].msg);
    }
}

static void test_queries(void **state)
{
    (void)state;
    struct rs_settings s;
    assert_int_equal(parse("{\"rightsizing\":{\"window\":\"3d\",\"labels\":{\"namespace\":"
                           "\"exported_namespace\",\"pod\":\"exported_pod\"}}}",
                           &s, NULL),
                     GG_OK);
    char q[RS_QUERY_MAX];
    assert_true(rs_query(&s, RS_QUERY_PEAK, q, sizeof(q)));
    assert_string_equal(
        q, "max by (exported_namespace, exported_pod) (max_over_time((sum by "
           "(exported_namespace, exported_pod) (DCGM_FI_DEV_FB_USED{exported_pod!=\"\"} unless on "
           "(Hostname, UUID, GPU_I_ID) (count by (Hostname, UUID, GPU_I_ID) "
           "(DCGM_FI_DEV_FB_USED{exported_pod!=\"\"}) > 1)))[3d:1m]))");
    assert_true(rs_query(&s, RS_QUERY_HISTORY, q, sizeof(q)));
    assert_non_null(strstr(q, "label_replace(min_over_time(timestamp(max by (exported_namespace, "
                              "exported_pod) (DCGM_FI_DEV_FB_USED"));
    assert_non_null(strstr(q, "[3d:1m]), \"edge\", \"last\", \"\", \"\")"));
    char small[64];
    assert_false(rs_query(&s, RS_QUERY_PEAK, small, sizeof(small)));
}

/* A Prometheus answer whose samples are {namespace, pod, edge (NULL: none), value}. */
static json_t *answer(const char *const rows[][4], size_t n)
{
    json_t *result = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_object();
        if (rows[i][0])
            json_object_set_new(m, "namespace", json_string(rows[i][0]));
        json_object_set_new(m, "pod", json_string(rows[i][1]));
        if (rows[i][2])
            json_object_set_new(m, "edge", json_string(rows[i][2]));
        json_array_append_new(
            result, json_pack("{s:o,s:[f,s]}", "metric", m, "value", 1795526098.5, rows[i][3]));
    }
    return json_pack("{s:s,s:{s:s,s:o}}", "status", "success", "data", "resultType", "vector",
                     "result", result);
}

static void test_answers_fold_into_workloads(void **state)
{
    (void)state;
    static const char *const peaks[][4] = {
        {"ml", "chat-5d8f7c9b4-x2x7z", NULL, "7270"},
        {"ml", "chat-5d8f7c9b4-q8k4w", NULL, "6000"}, /* the restarted pod */
        {"ml", "embed-0", NULL, "15000.5"},
        {"ml", "owned-by-inventory", NULL, "100"},
        {"other", "embed-0", NULL, "1"},
        {NULL, "no-namespace", NULL, "5"},
        {"ml", "nan-pod", NULL, "NaN"},
    };
    static const char *const edges[][4] = {
        {"ml", "chat-5d8f7c9b4-x2x7z", "first", "1000"},
        {"ml", "chat-5d8f7c9b4-x2x7z", "last", "5000"},
        {"ml", "chat-5d8f7c9b4-q8k4w", "first", "3000"},
        {"ml", "chat-5d8f7c9b4-q8k4w", "last", "9000"},
        {"ml", "gone-bcdfg", "first", "1"},
    };
    json_t *peak = answer(peaks, NELEM(peaks)), *history = answer(edges, NELEM(edges));
    json_t *owners = json_pack("{s:s}", "ml/owned-by-inventory", "StatefulSet/store");
    struct rs_data d = {0};
    struct gg_err err = {{0}};
    assert_int_equal(rs_data_fold(&d, peak, history, "namespace", "pod", owners, &err), GG_OK);
    struct rs_usage u;
    assert_true(rs_data_get(&d, "ml", "chat", &u));
    assert_true(u.peak_mib == 7270);
    assert_int_equal(u.first_s, 1000); /* the first pod's first sample */
    assert_int_equal(u.last_s, 9000);  /* the restarted pod's last */
    assert_int_equal(u.pods, 2);
    assert_true(rs_data_get(&d, "ml", "embed", &u));
    assert_true(u.peak_mib == 15000.5);
    assert_int_equal(u.first_s, 0); /* no history: acts on nothing */
    assert_true(rs_data_get(&d, "ml", "store", &u));
    assert_false(rs_data_get(&d, "ml", "owned-by-inventory", &u));
    assert_true(rs_data_get(&d, "other", "embed", &u));
    assert_true(u.peak_mib == 1);
    assert_false(rs_data_get(&d, "ml", "gone", &u)); /* history without a peak */
    assert_false(rs_data_get(&d, "ml", "nan-pod", &u));
    assert_int_equal(json_object_size(d.workloads), 4);
    rs_data_clear(&d);
    json_decref(peak);
    json_decref(history);
    json_decref(owners);
}

static void test_bad_answers(void **state)
{
    (void)state;
    json_t *ok = answer(NULL, 0);
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"{\"status\":\"error\",\"errorType\":\"bad_data\",\"error\":\"parse error\"}",
         "peak query: Prometheus answered an error: parse error"},
        {"{\"status\":\"success\",\"data\":{\"resultType\":\"matrix\",\"result\":[]}}",
         "peak query: not a Prometheus answer with an instant vector (status success, "
         "data.resultType vector, data.result a list)"},
        {"[]", "peak query: not a Prometheus answer with an instant vector (status success, "
               "data.resultType vector, data.result a list)"},
    };
    for (size_t i = 0; i < NELEM(bad); i++) {
        json_t *a = json_loads(bad[i].text, 0, NULL);
        struct rs_data d = {0};
        struct gg_err err = {{0}};
        assert_int_equal(rs_data_fold(&d, a, ok, "namespace", "pod", NULL, &err), GG_ERR_INVALID);
        assert_string_equal(err.msg, bad[i].msg);
        rs_data_clear(&d);
        json_decref(a);
    }
    json_decref(ok);
}

static void test_saved_file_round_trip(void **state)
{
    (void)state;
    struct rs_settings s;
    assert_int_equal(parse("{\"rightsizing\":{\"window\":\"2d\"}}", &s, NULL), GG_OK);
    static const char *const peaks[][4] = {{"ml", "embed-0", NULL, "2048"}};
    static const char *const edges[][4] = {{"ml", "embed-0", "first", "100"},
                                           {"ml", "embed-0", "last", "7300"}};
    json_t *peak = answer(peaks, 1), *history = answer(edges, 2);
    json_t *doc = rs_file_new(&s, 1795526098, peak, history);
    char path[] = "/tmp/test_rightsize_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(json_dump_file(doc, path, 0), 0);
    struct rs_data d = {0};
    struct gg_err err = {{0}};
    assert_int_equal(rs_file_load(path, &d, &err), GG_OK);
    assert_int_equal(d.window_s, 172800);
    assert_int_equal(d.time_s, 1795526098);
    struct rs_usage u;
    assert_true(rs_data_get(&d, "ml", "embed", &u));
    assert_int_equal(u.last_s - u.first_s, 7200);
    rs_data_clear(&d);
    /* Not a usage file: the message names it and what it needs. */
    FILE *f = fopen(path, "w");
    fputs("{\"peak\": {}}", f);
    fclose(f);
    assert_int_equal(rs_file_load(path, &d, &err), GG_ERR_INVALID);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "not a usage file"));
    unlink(path);
    json_decref(doc);
    json_decref(peak);
    json_decref(history);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pod_names_fold_into_their_workloads),
        cmocka_unit_test(test_owners_fold_into_their_workloads),
        cmocka_unit_test(test_durations),
        cmocka_unit_test(test_settings),
        cmocka_unit_test(test_queries),
        cmocka_unit_test(test_answers_fold_into_workloads),
        cmocka_unit_test(test_bad_answers),
        cmocka_unit_test(test_saved_file_round_trip),
    };
    return cmocka_run_group_tests_name("rightsize", tests, NULL, NULL);
}
