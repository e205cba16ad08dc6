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
#include "kube/rsstore.h"

#include <malloc.h>
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
    assert_int_equal(s.max_series, 200000);
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
    assert_int_equal(parse("{\"rightsizing\":{\"max_series\":1000000}}", &s, &err), GG_OK);
    assert_int_equal(s.max_series, 1000000);
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
        {"{\"rightsizing\":{\"max_series\":0}}",
         "rightsizing.max_series: must be a whole number from 1 to 1000000"},
        {"{\"rightsizing\":{\"max_series\":1000001}}",
         "rightsizing.max_series: must be a whole number from 1 to 1000000"},
        {"{\"rightsizing\":{\"max_series\":\"100\"}}",
         "rightsizing.max_series: must be a whole number from 1 to 1000000"},
        {"{\"rightsizing\":{\"max_series\":1.5}}",
         "rightsizing.max_series: must be a whole number from 1 to 1000000"},
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

/* Both answers (JSON values, as Prometheus would send them) folded into d. */
static enum gg_status fold_values(struct rs_data *d, const json_t *peak, const json_t *history,
                                  const json_t *owners, struct gg_err *err)
{
    char *p = json_dumps(peak, JSON_ENCODE_ANY), *h = json_dumps(history, JSON_ENCODE_ANY);
    assert_non_null(p);
    assert_non_null(h);
    struct rs_fold_opts o = {"namespace", "pod", owners, 0};
    enum gg_status st = rs_data_fold(d, p, strlen(p), h, strlen(h), &o, err);
    free(p);
    free(h);
    return st;
}

static void test_answers_fold_into_workloads(void **state)
{
    (void)state;
    static const char *const peaks[][4] = {
        {"ml", "chat-5d8f7c9b4-x2x7z", NULL, "7270"},
        {"ml", "chat-5d8f7c9b4-q8k4w", NULL, "6000"}, /* the restarted pod */
        {"ml", "embed-0", NULL, "15000.5"},
        {"ml", "owned-by-inventory", NULL, "2100"},
        {"other", "embed-0", NULL, "3000"},
        {NULL, "no-namespace", NULL, "5000"},
        {"ml", "nan-pod", NULL, "NaN"},
        {"ml", "minus-pod", NULL, "-5000"},
    };
    static const char *const edges[][4] = {
        {"ml", "chat-5d8f7c9b4-x2x7z", "first", "1000"},
        {"ml", "chat-5d8f7c9b4-x2x7z", "last", "5000"},
        {"ml", "chat-5d8f7c9b4-q8k4w", "first", "3000"},
        {"ml", "chat-5d8f7c9b4-q8k4w", "last", "9000"},
        {"ml", "gone-bcdfg", "first", "1"},
        {"ml", "embed-0", NULL, "1"},       /* no edge: nothing */
        {"ml", "embed-0", "middle", "1"},   /* not an edge */
        {"ml", "embed-0", "last", "1e300"}, /* not a time */
    };
    json_t *peak = answer(peaks, NELEM(peaks)), *history = answer(edges, NELEM(edges));
    json_t *owners = json_pack("{s:s}", "ml/owned-by-inventory", "StatefulSet/store");
    struct rs_data d = {0};
    struct gg_err err = {{0}};
    assert_int_equal(fold_values(&d, peak, history, owners, &err), GG_OK);
    struct rs_usage u;
    assert_true(rs_data_get(&d, "ml", "chat", &u));
    assert_true(u.peak_mib == 7270);
    assert_int_equal(u.first_s, 1000); /* the first pod's first sample */
    assert_int_equal(u.last_s, 9000);  /* the restarted pod's last */
    assert_int_equal(u.pods, 2);
    assert_true(rs_data_get(&d, "ml", "embed", &u));
    assert_true(u.peak_mib == 15000.5);
    assert_int_equal(u.first_s, 0); /* no history: acts on nothing */
    assert_int_equal(u.last_s, 0);
    assert_true(rs_data_get(&d, "ml", "store", &u));
    assert_false(rs_data_get(&d, "ml", "owned-by-inventory", &u));
    assert_true(rs_data_get(&d, "other", "embed", &u));
    assert_true(u.peak_mib == 3000);
    assert_false(rs_data_get(&d, "ml", "gone", &u)); /* history without a peak */
    assert_false(rs_data_get(&d, "ml", "nan-pod", &u));
    assert_false(rs_data_get(&d, "ml", "minus-pod", &u));
    assert_int_equal(d.n, 4);
    assert_int_equal(d.no_evidence, 0);
    assert_int_equal(d.peak_series, 8); /* of each answer, whether folded or not */
    assert_int_equal(d.history_series, 8);
    assert_int_equal(d.series, 5 + 4); /* folded: peaks, and edges that dated a workload */
    rs_data_clear(&d);
    json_decref(peak);
    json_decref(history);
    json_decref(owners);
}

/*
 * A peak of zero, or below 1 GiB (the least rightsize.lua would name), is an
 * idle, broken or lying exporter, not a small workload: no usage at all, and
 * counted.
 */
static void test_a_peak_below_1_gib_is_no_evidence(void **state)
{
    (void)state;
    static const char *const peaks[][4] = {
        {"ml", "idle-5c6d7f8b9-m2m2m", NULL, "0"},
        {"ml", "idle-5c6d7f8b9-n4n4n", NULL, "0"},    /* the same workload: one counted */
        {"ml", "tiny-0", NULL, "1023.9"},             /* below 1 GiB */
        {"ml", "small-0", NULL, "1024"},              /* 1 GiB: evidence */
        {"ml", "woke-0", NULL, "0"},                  /* one pod idle ... */
        {"ml", "woke-1", NULL, "4096"},               /* ... another not: its peak counts */
        {"other", "idle-5c6d7f8b9-m2m2m", NULL, "0"}, /* another namespace's */
    };
    static const char *const edges[][4] = {
        {"ml", "idle-5c6d7f8b9-m2m2m", "first", "1000"},
        {"ml", "idle-5c6d7f8b9-m2m2m", "last", "900000"},
        {"ml", "small-0", "first", "1000"},
        {"ml", "small-0", "last", "900000"},
    };
    json_t *peak = answer(peaks, NELEM(peaks)), *history = answer(edges, NELEM(edges));
    struct rs_data d = {0};
    struct gg_err err = {{0}};
    assert_int_equal(fold_values(&d, peak, history, NULL, &err), GG_OK);
    struct rs_usage u;
    assert_false(rs_data_get(&d, "ml", "idle", &u));
    assert_false(rs_data_get(&d, "ml", "tiny", &u));
    assert_false(rs_data_get(&d, "other", "idle", &u));
    assert_true(rs_data_get(&d, "ml", "small", &u));
    assert_true(u.peak_mib == 1024);
    assert_int_equal(u.last_s - u.first_s, 899000);
    assert_true(rs_data_get(&d, "ml", "woke", &u));
    assert_true(u.peak_mib == 4096);
    assert_int_equal(u.pods, 2);
    assert_int_equal(d.n, 2);
    assert_int_equal(d.no_evidence, 3); /* ml/idle, ml/tiny, other/idle */
    rs_data_clear(&d);
    json_decref(peak);
    json_decref(history);
}

static void test_bad_answers(void **state)
{
    (void)state;
    static const char ok[] = "{\"status\":\"success\",\"data\":{\"resultType\":\"vector\","
                             "\"result\":[]}}";
    static const char not_vector[] =
        "not a Prometheus answer with an instant vector (status success, "
        "data.resultType vector, data.result a list)";
    static const struct {
        const char *text;
        enum gg_status st;
        const char *msg; /* after "peak query: " */
    } bad[] = {
        {"{\"status\":\"error\",\"errorType\":\"bad_data\",\"error\":\"parse error\"}",
         GG_ERR_INVALID, "Prometheus answered an error: parse error"},
        {"{\"status\":\"error\"}", GG_ERR_INVALID, "Prometheus answered an error: (no message)"},
        {"{\"status\":\"success\",\"data\":{\"resultType\":\"matrix\",\"result\":[]}}",
         GG_ERR_INVALID, not_vector},
        {"{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":{}}}",
         GG_ERR_INVALID, not_vector},
        {"{\"status\":\"success\",\"data\":{\"resultType\":\"vector\"}}", GG_ERR_INVALID,
         not_vector},
        {"{\"status\":\"success\",\"data\":[],\"result\":[]}", GG_ERR_INVALID, not_vector},
        {"[]", GG_ERR_INVALID, not_vector},
        {"42", GG_ERR_INVALID, not_vector},
        {"\"success\"", GG_ERR_INVALID, not_vector},
        {"", GG_ERR_PARSE, "the answer is not JSON: it is empty"},
        {"   \n", GG_ERR_PARSE, "the answer is not JSON: it is empty"},
        {"{\"status\":\"success\"", GG_ERR_PARSE,
         "the answer is not JSON: it ends early, after 19 bytes"},
        {"{\"status\":\"succ", GG_ERR_PARSE,
         "the answer is not JSON: it ends early, after 15 bytes"},
        {"{\"status\" \"success\"}", GG_ERR_PARSE,
         "the answer is not JSON: unexpected '\"' at byte 10"},
        {"{\"a\":1,}", GG_ERR_PARSE, "the answer is not JSON: unexpected '}' at byte 7"},
        {"[1,]", GG_ERR_PARSE, "the answer is not JSON: unexpected ']' at byte 3"},
        {"[1 2]", GG_ERR_PARSE, "the answer is not JSON: unexpected '2' at byte 3"},
        {"{\"a\":[}", GG_ERR_PARSE, "the answer is not JSON: unexpected '}' at byte 6"},
        {"{} {}", GG_ERR_PARSE, "the answer is not JSON: more after the end at byte 3"},
        {"{\"a\":01}", GG_ERR_PARSE, "the answer is not JSON: unexpected '1' at byte 6"},
        {"{\"a\":1.}", GG_ERR_PARSE, "the answer is not JSON: a number cut short at byte 7"},
        {"{\"a\":-}", GG_ERR_PARSE, "the answer is not JSON: a number cut short at byte 6"},
        {"{\"a\":1e}", GG_ERR_PARSE, "the answer is not JSON: a number cut short at byte 7"},
        {"{\"a\":+1}", GG_ERR_PARSE, "the answer is not JSON: unexpected '+' at byte 5"},
        {"{\"a\":tru}", GG_ERR_PARSE, "the answer is not JSON: unexpected '}' at byte 8"},
        {"{\"a\":nul", GG_ERR_PARSE, "the answer is not JSON: it ends early, after 8 bytes"},
        {"{\"a\":\"\\x\"}", GG_ERR_PARSE,
         "the answer is not JSON: an invalid escape in a string at byte 7"},
        {"{\"a\":\"\\u12G4\"}", GG_ERR_PARSE,
         "the answer is not JSON: an invalid \\u escape in a string at byte 10"},
        {"{\"a\":\"\\u0000\"}", GG_ERR_PARSE,
         "the answer is not JSON: \\u0000 in a string at byte 11"},
        {"{\"a\":\"\\ud83d\"}", GG_ERR_PARSE,
         "the answer is not JSON: a lone UTF-16 surrogate in a string at byte 12"},
        {"{\"a\":\"\\ude00\"}", GG_ERR_PARSE,
         "the answer is not JSON: a lone UTF-16 surrogate in a string at byte 11"},
        {"{\"a\":\"\\ud83d\\u0041\"}", GG_ERR_PARSE,
         "the answer is not JSON: a lone UTF-16 surrogate in a string at byte 17"},
        {"{\"a\":\"tab\there\"}", GG_ERR_PARSE,
         "the answer is not JSON: a control character in a string at byte 9"},
        {"{\"a\":\"\xc3\"}", GG_ERR_PARSE,
         "the answer is not JSON: invalid UTF-8 in a string at byte 7"},
        {"{\"a\":\"\xc0\xaf\"}", GG_ERR_PARSE,
         "the answer is not JSON: invalid UTF-8 in a string at byte 6"},
        {"{\"a\":\"\xed\xa0\x80\"}", GG_ERR_PARSE,
         "the answer is not JSON: invalid UTF-8 in a string at byte 7"},
        {"{\"a\":\"\xf4\x90\x80\x80\"}", GG_ERR_PARSE,
         "the answer is not JSON: invalid UTF-8 in a string at byte 7"},
        {"{\"a\":\xff}", GG_ERR_PARSE, "the answer is not JSON: unexpected byte 0xff at byte 5"},
        {"{\"a\"=1}", GG_ERR_PARSE, "the answer is not JSON: unexpected '=' at byte 4"},
    };
    for (size_t i = 0; i < NELEM(bad); i++) {
        /* Whole, and cut at every byte: the same answer, the same error. */
        size_t len = strlen(bad[i].text);
        for (size_t cut = 0; cut <= len; cut++) {
            struct rs_data d = {0};
            struct gg_err err = {{0}};
            struct rs_fold_opts o = {"namespace", "pod", NULL, 0};
            struct rs_reader *r = rs_reader_new(&d, RS_QUERY_PEAK, &o);
            assert_non_null(r);
            enum gg_status st = rs_reader_feed(r, bad[i].text, cut, &err);
            if (st == GG_OK)
                st = rs_reader_feed(r, bad[i].text + cut, len - cut, &err);
            if (st == GG_OK)
                st = rs_reader_end(r, &err);
            char want[300];
            snprintf(want, sizeof(want), "peak query: %s", bad[i].msg);
            if (st != bad[i].st || strcmp(err.msg, want) != 0)
                fail_msg("%s cut at %zu: got %d \"%s\", want %d \"%s\"", bad[i].text, cut, st,
                         err.msg, bad[i].st, want);
            /* Once failed, it stays failed. */
            assert_int_equal(rs_reader_feed(r, "{}", 2, &err), bad[i].st);
            rs_reader_free(r);
            rs_data_clear(&d);
        }
    }
    /* The history answer's errors name it. */
    struct rs_data d = {0};
    struct gg_err err = {{0}};
    struct rs_fold_opts o = {"namespace", "pod", NULL, 0};
    assert_int_equal(rs_data_fold(&d, ok, strlen(ok), "[]", 2, &o, &err), GG_ERR_INVALID);
    assert_string_equal(err.msg, "history query: not a Prometheus answer with an instant vector "
                                 "(status success, data.resultType vector, data.result a list)");
    rs_data_clear(&d);
}

/*
 * An answer with everything JSON allows around what is read: members in
 * another order, unknown members of every type and depth, escapes, UTF-8
 * and numbers in every form, samples of other shapes (skipped).
 */
static const char WELL_FORMED[] =
    "{\"data\" : {\"result\": [\n"
    "  {\"value\": [1795526098.47, \"7270\"], \"metric\": {\"__name__\": \"x\", \"pod\": "
    "\"chat-5d8f7c9b4-x2x7z\", \"namespace\": \"ml\", \"UUID\": "
    "\"GPU-\\u00e9\\ud83d\\ude00\\\"\\\\\\/\\b\\f\\n\\r\\t\", \"modelName\": \"NVIDIA "
    "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}},\n"
    "  {\"metric\": {\"namespace\": \"ml\", \"pod\": \"chat-5d8f7c9b4-q8k4w\"}, \"value\": [0, "
    "\"6000\"], \"extra\": [true, false, null, -0.5E-3, 1e5, 0, -0, 12.25e+2, {\"deep\": [[[]]]}, "
    "{}, []]},\n"
    "  {\"metric\": {\"namespace\": \"m\\u006c\", \"pod\": \"embed-\\u0030\"}, \"value\": [1, "
    "\"1.5e4\"]},\n"
    "  {\"metric\": {\"namespace\": \"ml\", \"pod\": \"short-value-0\"}, \"value\": [1]},\n"
    "  {\"metric\": {\"namespace\": \"ml\", \"pod\": \"long-value-0\"}, \"value\": [1, \"9000\", "
    "2]},\n"
    "  {\"metric\": {\"namespace\": \"ml\", \"pod\": \"number-value-0\"}, \"value\": [1, 9000]},\n"
    "  {\"metric\": {\"namespace\": \"ml\", \"pod\": 7}, \"value\": [1, \"9000\"]},\n"
    "  {\"metric\": [\"namespace\", \"ml\"], \"value\": [1, \"9000\"]},\n"
    "  \"not a sample\", 42, null, [],\n"
    "  {\"metric\": {\"namespace\": \"ml\", \"pod\": \"\"}, \"value\": [1, \"9000\"]},\n"
    "  {\"metric\": {\"namespace\": \"ml\", \"pod\": \"hex-0\"}, \"value\": [1, \"0x10\"]},\n"
    "  {\"metric\": {\"namespace\": \"ml\", \"pod\": \"junk-0\"}, \"value\": [1, \"12abc\"]}\n"
    "], \"resultType\": \"vector\", \"stats\": {\"timings\": {\"evalTotalTime\": 0.001}}},\n"
    "\"warnings\": [\"a \\\"quoted\\\" warning\"], \"status\": \"success\"}\r\n";

static const char WELL_FORMED_HISTORY[] =
    "{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":["
    "{\"metric\":{\"edge\":\"first\",\"namespace\":\"ml\",\"pod\":\"chat-5d8f7c9b4-x2x7z\"},"
    "\"value\":[1,\"1000\"]},"
    "{\"metric\":{\"namespace\":\"ml\",\"edge\":\"last\",\"pod\":\"chat-5d8f7c9b4-q8k4w\"},"
    "\"value\":[1,\"9000.9\"]}]}}";

/* The answers fed in pieces: step bytes at a time, or (step 0) cut once at cut. */
static enum gg_status fold_pieces(struct rs_data *d, size_t step, size_t cut, struct gg_err *err)
{
    const char *text[2] = {WELL_FORMED, WELL_FORMED_HISTORY};
    struct rs_fold_opts o = {"namespace", "pod", NULL, 0};
    for (int q = 0; q < 2; q++) {
        size_t len = strlen(text[q]);
        struct rs_reader *r = rs_reader_new(d, q ? RS_QUERY_HISTORY : RS_QUERY_PEAK, &o);
        enum gg_status st = GG_OK;
        if (step)
            for (size_t at = 0; at < len && st == GG_OK; at += step)
                st = rs_reader_feed(r, text[q] + at, len - at < step ? len - at : step, err);
        else if ((st = rs_reader_feed(r, text[q], cut < len ? cut : len, err)) == GG_OK &&
                 cut < len)
            st = rs_reader_feed(r, text[q] + cut, len - cut, err);
        if (st == GG_OK)
            st = rs_reader_end(r, err);
        rs_reader_free(r);
        if (st != GG_OK)
            return st;
    }
    rs_data_finish(d);
    return GG_OK;
}

static void assert_well_formed_folded(const struct rs_data *d, const char *how)
{
    struct rs_usage u;
    if (!rs_data_get(d, "ml", "chat", &u) || u.peak_mib != 7270 || u.pods != 2 ||
        u.first_s != 1000 || u.last_s != 9000)
        fail_msg("%s: chat not folded", how);
    if (!rs_data_get(d, "ml", "embed", &u) || u.peak_mib != 15000 || u.pods != 1)
        fail_msg("%s: embed (escaped names) not folded", how);
    /* hex-0: strtod reads "0x10" as 16 MiB, no evidence; the other shapes are skipped. */
    if (d->n != 2 || d->no_evidence != 1 || d->peak_series != 15 || d->history_series != 2)
        fail_msg("%s: %zu workloads, %zu without evidence, %zu + %zu series", how, d->n,
                 d->no_evidence, d->peak_series, d->history_series);
}

static void test_answers_read_in_any_pieces(void **state)
{
    (void)state;
    /* The well-formed answer is JSON as jansson reads it. */
    json_error_t je;
    json_t *check = json_loads(WELL_FORMED, 0, &je);
    if (!check)
        fail_msg("not JSON: %s at %d", je.text, je.position);
    json_decref(check);
    size_t len = strlen(WELL_FORMED);
    for (size_t cut = 0; cut <= len; cut++) {
        struct rs_data d = {0};
        struct gg_err err = {{0}};
        char how[64];
        snprintf(how, sizeof(how), "cut at %zu", cut);
        if (fold_pieces(&d, 0, cut, &err) != GG_OK)
            fail_msg("%s: %s", how, err.msg);
        assert_well_formed_folded(&d, how);
        rs_data_clear(&d);
    }
    static const size_t steps[] = {1, 2, 3, 7, 64, 4096};
    for (size_t i = 0; i < NELEM(steps); i++) {
        struct rs_data d = {0};
        struct gg_err err = {{0}};
        char how[64];
        snprintf(how, sizeof(how), "%zu bytes at a time", steps[i]);
        if (fold_pieces(&d, steps[i], 0, &err) != GG_OK)
            fail_msg("%s: %s", how, err.msg);
        assert_well_formed_folded(&d, how);
        rs_data_clear(&d);
    }
}

/* Bytes the heap holds now. */
static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* Feed text to a peak reader over d with max_series (0: the files' bound). */
static enum gg_status read_peak(struct rs_data *d, const char *text, size_t len, size_t max_series,
                                struct gg_err *err)
{
    struct rs_fold_opts o = {"namespace", "pod", NULL, max_series};
    struct rs_reader *r = rs_reader_new(d, RS_QUERY_PEAK, &o);
    assert_non_null(r);
    enum gg_status st = rs_reader_feed(r, text, len, err);
    if (st == GG_OK)
        st = rs_reader_end(r, err);
    rs_reader_free(r);
    return st;
}

static void test_hostile_answers_hold_nothing_more(void **state)
{
    (void)state;
    struct rs_data d = {0};
    struct gg_err err = {{0}};
    /* Nested deeper than the reader goes: refused at once, whatever follows. */
    size_t deep = 100000;
    char *text = malloc(2 * deep + 64);
    assert_non_null(text);
    size_t n = (size_t)sprintf(text, "{\"status\":\"success\",\"x\":");
    memset(text + n, '[', deep);
    n += deep;
    memset(text + n, ']', deep);
    n += deep;
    text[n++] = '}';
    assert_int_equal(read_peak(&d, text, n, 0, &err), GG_ERR_PARSE);
    assert_string_equal(err.msg, "peak query: the answer nests deeper than 32 levels at byte 55");
    free(text);
    /* 32 levels are read. */
    char ok32[160];
    n = (size_t)sprintf(ok32, "{\"status\":\"success\",\"x\":");
    memset(ok32 + n, '[', 31);
    memset(ok32 + n + 31, ']', 31);
    strcpy(ok32 + n + 62, ",\"data\":{\"resultType\":\"vector\",\"result\":[]}}");
    assert_int_equal(read_peak(&d, ok32, strlen(ok32), 0, &err), GG_OK);

    /* A 24 MiB string where no name is kept, and one in a label: read through, not held. */
    static const char pattern[] = "abc\xc3\xa9\\n"; /* 7 bytes, an escape and UTF-8 */
    size_t huge = ((size_t)24 << 20) / 7 * 7;
    text = malloc(huge + 512);
    assert_non_null(text);
    static const char *const where[] = {
        "\"help\":\"", "\"metric\":{\"namespace\":\"ml\",\"pod\":\"big-0\",\"other\":\""};
    for (size_t w = 0; w < NELEM(where); w++) {
        n = (size_t)sprintf(text,
                            "{\"status\":\"success\",\"data\":{\"resultType\":\"vector\","
                            "\"result\":[{\"value\":[1,\"4096\"],%s",
                            where[w]);
        for (size_t i = 0; i < huge; i++)
            text[n + i] = pattern[i % 7];
        n += huge;
        n += (size_t)sprintf(text + n, "\"%s}]}}",
                             w == 1 ? "}" : ",\"metric\":{\"namespace\":\"ml\",\"pod\":\"big-0\"}");
        rs_data_clear(&d);
        size_t before = heap_in_use();
        struct rs_fold_opts o = {"namespace", "pod", NULL, 0};
        struct rs_reader *r = rs_reader_new(&d, RS_QUERY_PEAK, &o);
        size_t most = 0;
        enum gg_status st = GG_OK;
        for (size_t at = 0; at < n && st == GG_OK; at += 65536) {
            st = rs_reader_feed(r, text + at, n - at < 65536 ? n - at : 65536, &err);
            size_t now = heap_in_use();
            most = now > most ? now : most;
        }
        if (st == GG_OK)
            st = rs_reader_end(r, &err);
        if (st != GG_OK)
            fail_msg("huge string %zu: %s", w, err.msg);
        rs_reader_free(r);
        if (most > before && most - before > 64 * 1024)
            fail_msg("huge string %zu: the heap grew by %zu bytes", w, most - before);
        struct rs_usage u;
        assert_true(rs_data_get(&d, "ml", "big", &u));
    }
    free(text);
    rs_data_clear(&d);

    /* A label longer than a Kubernetes name: its sample is skipped. */
    char pod[300], ns[80], answer_text[1024];
    memset(pod, 'p', sizeof(pod));
    memset(ns, 'n', sizeof(ns));
    static const struct {
        int ns_len, pod_len;
        bool kept;
    } names[] = {{63, 253, true}, {64, 10, false}, {2, 254, false}, {2, 299, false}};
    for (size_t i = 0; i < NELEM(names); i++) {
        snprintf(answer_text, sizeof(answer_text),
                 "{\"status\":\"success\",\"data\":{\"resultType\":\"vector\",\"result\":["
                 "{\"metric\":{\"namespace\":\"%.*s\",\"pod\":\"%.*s\"},\"value\":[1,\"4096\"]}]}}",
                 names[i].ns_len, ns, names[i].pod_len, pod);
        rs_data_clear(&d);
        assert_int_equal(read_peak(&d, answer_text, strlen(answer_text), 0, &err), GG_OK);
        if ((d.n == 1) != names[i].kept)
            fail_msg("namespace of %d, pod of %d: %zu workloads", names[i].ns_len, names[i].pod_len,
                     d.n);
    }
    rs_data_clear(&d);
}

/* An answer of n series, pods w<i> of namespace ml (each a workload), peaks 2048 + i. */
static char *many(size_t n, size_t *len)
{
    size_t cap = n * 96 + 128;
    char *p = malloc(cap);
    assert_non_null(p);
    size_t at = (size_t)sprintf(p, "{\"status\":\"success\",\"data\":{\"resultType\":\"vector\","
                                   "\"result\":[");
    for (size_t i = 0; i < n; i++)
        at += (size_t)sprintf(p + at,
                              "%s{\"metric\":{\"namespace\":\"ml\",\"pod\":\"w%zu\"},"
                              "\"value\":[1,\"%zu\"]}",
                              i ? "," : "", i, 2048 + i);
    at += (size_t)sprintf(p + at, "]}}");
    *len = at;
    return p;
}

static void test_series_past_the_bound_are_refused(void **state)
{
    (void)state;
    struct rs_data d = {0};
    struct gg_err err = {{0}};
    size_t len;
    char *text = many(11, &len);
    assert_int_equal(read_peak(&d, text, len, 11, &err), GG_OK);
    assert_int_equal(d.n, 11);
    rs_data_clear(&d);
    assert_int_equal(read_peak(&d, text, len, 10, &err), GG_ERR_TOOBIG);
    assert_string_equal(err.msg,
                        "peak query: more than 10 series (rightsizing.max_series): refused");
    assert_true(d.n <= 10); /* what was folded before: the caller drops it */
    rs_data_clear(&d);
    free(text);
    /* Without a setting (a saved file), the bound is a million; many workloads fold. */
    text = many(20000, &len);
    assert_int_equal(read_peak(&d, text, len, 0, &err), GG_OK);
    assert_int_equal(d.n, 20000);
    struct rs_usage u;
    assert_true(rs_data_get(&d, "ml", "w19999", &u));
    assert_true(u.peak_mib == 2048 + 19999);
    rs_data_clear(&d);
    free(text);
}

/* Past the bound, the refresh is refused and policies keep the last data until it is stale. */
static void test_a_refused_refresh_keeps_the_last_data(void **state)
{
    (void)state;
    rss_reset();
    rss_set_source("prometheus");
    rss_set_max_series(10);
    size_t len;
    char *text = many(3, &len);
    struct rs_data d = {.window_s = 86400};
    struct gg_err err = {{0}};
    struct rs_fold_opts o = {"namespace", "pod", NULL, 10};
    static const char history[] = "{\"status\":\"success\",\"data\":{\"resultType\":\"vector\","
                                  "\"result\":[]}}";
    assert_int_equal(rs_data_fold(&d, text, len, history, strlen(history), &o, &err), GG_OK);
    free(text);
    rss_publish(&d, 3600);
    rss_source_result(RSS_REFRESH_OK, "");
    /* The next answer has 11 series. */
    text = many(11, &len);
    struct rs_data next = {.window_s = 86400};
    assert_int_equal(rs_data_fold(&next, text, len, history, strlen(history), &o, &err),
                     GG_ERR_TOOBIG);
    rs_data_clear(&next);
    free(text);
    rss_source_result(RSS_REFRESH_OVER_SERIES, err.msg);
    struct rs_usage u;
    int64_t window_s, age_s;
    assert_int_equal(rss_lookup("ml", "w2", &u, &window_s, &age_s), RSS_FOUND);
    assert_true(u.peak_mib == 2050);
    char line[512];
    rss_describe(line, sizeof(line));
    assert_non_null(
        strstr(line, "rightsizing: failing, policies see the last data (3 workloads, "));
    assert_non_null(
        strstr(line, "peak query: more than 10 series (rightsizing.max_series): refused"));
    struct buf m;
    buf_init(&m, 1 << 20);
    assert_int_equal(rss_render_metrics(&m), GG_OK);
    static const char *const lines[] = {
        "gpuguard_rightsizing_source_up 1\n",
        "gpuguard_rightsizing_refreshes_total{result=\"ok\"} 1\n",
        "gpuguard_rightsizing_refreshes_total{result=\"error\"} 1\n",
        "gpuguard_rightsizing_refused_total{limit=\"series\"} 1\n",
        "gpuguard_rightsizing_refused_total{limit=\"bytes\"} 0\n",
        "gpuguard_rightsizing_workloads 3\n",
        "gpuguard_rightsizing_no_evidence_workloads 0\n",
        "gpuguard_rightsizing_series{query=\"peak\"} 3\n",
        "gpuguard_rightsizing_series{query=\"history\"} 0\n",
        "gpuguard_rightsizing_max_series 10\n",
    };
    for (size_t i = 0; i < NELEM(lines); i++)
        if (!strstr(m.data, lines[i]))
            fail_msg("no %s in\n%s", lines[i], m.data);
    buf_clear(&m);
    rss_reset();
}

static void test_no_evidence_is_counted_in_the_metrics(void **state)
{
    (void)state;
    rss_reset();
    rss_set_source("prometheus");
    static const char *const peaks[][4] = {{"ml", "idle-0", NULL, "0"},
                                           {"ml", "idle-1", NULL, "0"},
                                           {"ml", "busy-0", NULL, "9000"},
                                           {"ml", "quiet-0", NULL, "512"}};
    json_t *peak = answer(peaks, NELEM(peaks)), *history = answer(NULL, 0);
    struct rs_data d = {0};
    struct gg_err err = {{0}};
    assert_int_equal(fold_values(&d, peak, history, NULL, &err), GG_OK);
    rss_publish(&d, 0);
    struct rs_usage u;
    int64_t window_s, age_s;
    assert_int_equal(rss_lookup("ml", "idle", &u, &window_s, &age_s), RSS_UNKNOWN);
    assert_int_equal(rss_lookup("ml", "quiet", &u, &window_s, &age_s), RSS_UNKNOWN);
    assert_int_equal(rss_lookup("ml", "busy", &u, &window_s, &age_s), RSS_FOUND);
    struct buf m;
    buf_init(&m, 1 << 20);
    assert_int_equal(rss_render_metrics(&m), GG_OK);
    assert_non_null(strstr(m.data, "gpuguard_rightsizing_workloads 1\n"));
    assert_non_null(strstr(m.data, "gpuguard_rightsizing_no_evidence_workloads 2\n"));
    buf_clear(&m);
    rss_reset();
    json_decref(peak);
    json_decref(history);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

static void test_saved_file_round_trip(void **state)
{
    (void)state;
    struct rs_settings s;
    assert_int_equal(parse("{\"rightsizing\":{\"window\":\"2d\"}}", &s, NULL), GG_OK);
    static const char *const peaks[][4] = {{"ml", "embed-0", NULL, "2048"},
                                           {"ml", "idle-0", NULL, "0"}};
    static const char *const edges[][4] = {{"ml", "embed-0", "first", "100"},
                                           {"ml", "embed-0", "last", "7300"}};
    json_t *peak = answer(peaks, 2), *history = answer(edges, 2);
    char *p = json_dumps(peak, 0), *h = json_dumps(history, 0);
    /* As gpuguard usage writes it: the head, then the answers as they arrived. */
    char *head = rs_file_head(&s, 1795526098);
    assert_non_null(head);
    size_t len = strlen(head) + strlen(p) + strlen(h) + 64;
    char *text = malloc(len);
    assert_non_null(text);
    snprintf(text, len, "%s%s" RS_FILE_BETWEEN "%s" RS_FILE_END, head, p, h);
    json_error_t je;
    json_t *doc = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!doc)
        fail_msg("the file is not JSON: %s", je.text);
    assert_int_equal(json_integer_value(json_object_get(doc, "version")), 1);
    assert_string_equal(json_string_value(json_object_get(doc, "window")), "2d");
    assert_true(json_equal(json_object_get(doc, "peak"), peak));
    char path[] = "/tmp/test_rightsize_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file(path, text);
    struct rs_data d = {0};
    struct gg_err err = {{0}};
    assert_int_equal(rs_file_load(path, &d, &err), GG_OK);
    assert_int_equal(d.window_s, 172800);
    assert_int_equal(d.time_s, 1795526098);
    struct rs_usage u;
    assert_true(rs_data_get(&d, "ml", "embed", &u));
    assert_int_equal(u.last_s - u.first_s, 7200);
    assert_false(rs_data_get(&d, "ml", "idle", &u)); /* no evidence, as from Prometheus */
    assert_int_equal(d.no_evidence, 1);
    rs_data_clear(&d);
    /*
     * As earlier versions wrote it, indented and sorted: history comes before labels and
     * peak.  Members are found wherever they sit.
     */
    char *sorted = json_dumps(doc, JSON_INDENT(1) | JSON_SORT_KEYS);
    assert_true(strstr(sorted, "\"history\"") < strstr(sorted, "\"labels\""));
    write_file(path, sorted);
    assert_int_equal(rs_file_load(path, &d, &err), GG_OK);
    assert_true(rs_data_get(&d, "ml", "embed", &u));
    assert_int_equal(u.last_s - u.first_s, 7200);
    rs_data_clear(&d);
    /* Not a usage file: the message names it and what it needs. */
    static const char *const not_usage[] = {
        "{\"peak\": {}}",
        "{\"version\": 2, \"window\": \"2d\", \"time\": 1, \"labels\": {\"namespace\": \"n\", "
        "\"pod\": \"p\"}}",
        "{\"version\": 1, \"window\": \"2d\", \"time\": 1.5, \"labels\": {\"namespace\": \"n\", "
        "\"pod\": \"p\"}}",
        "{\"version\": 1, \"window\": \"2 days\", \"time\": 1, \"labels\": {\"namespace\": "
        "\"n\", \"pod\": \"p\"}}",
        "{\"version\": 1, \"window\": \"2d\", \"time\": 1, \"labels\": {\"namespace\": \"n\"}}",
    };
    for (size_t i = 0; i < NELEM(not_usage); i++) {
        write_file(path, not_usage[i]);
        assert_int_equal(rs_file_load(path, &d, &err), GG_ERR_INVALID);
        assert_non_null(strstr(err.msg, path));
        if (!strstr(err.msg, "not a usage file"))
            fail_msg("%s: %s", not_usage[i], err.msg);
        rs_data_clear(&d);
    }
    /* Its answers are checked as Prometheus' are. */
    snprintf(text, len, "%s{\"status\": \"success\"}" RS_FILE_BETWEEN "%s" RS_FILE_END, head, h);
    write_file(path, text);
    assert_int_equal(rs_file_load(path, &d, &err), GG_ERR_INVALID);
    char want[512];
    snprintf(want, sizeof(want),
             "%s: peak query: not a Prometheus answer with an instant vector (status success, "
             "data.resultType vector, data.result a list)",
             path);
    assert_string_equal(err.msg, want);
    rs_data_clear(&d);
    /* Not JSON: where. */
    write_file(path, "kind: Deployment\n");
    assert_int_equal(rs_file_load(path, &d, &err), GG_ERR_PARSE);
    snprintf(want, sizeof(want), "%s: the answer is not JSON: unexpected 'k' at byte 0", path);
    assert_string_equal(err.msg, want);
    unlink(path);
    free(sorted);
    free(text);
    free(head);
    free(p);
    free(h);
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
        cmocka_unit_test(test_a_peak_below_1_gib_is_no_evidence),
        cmocka_unit_test(test_bad_answers),
        cmocka_unit_test(test_answers_read_in_any_pieces),
        cmocka_unit_test(test_hostile_answers_hold_nothing_more),
        cmocka_unit_test(test_series_past_the_bound_are_refused),
        cmocka_unit_test(test_a_refused_refresh_keeps_the_last_data),
        cmocka_unit_test(test_no_evidence_is_counted_in_the_metrics),
        cmocka_unit_test(test_saved_file_round_trip),
    };
    return cmocka_run_group_tests_name("rightsize", tests, NULL, NULL);
}
