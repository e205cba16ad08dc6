/*
 * test_polreport.c - the policy reports the audit writes, built without the API server
 * (kube/polreport.c), and the label selector that scopes the audit (kube/labelsel.c).  The
 * writes themselves, against the CRDs on a real API server, are tests/e2e/test_audit.py's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kube/labelsel.h"
#include "kube/polreport.h"

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

static void assert_json(const json_t *got, const char *want_text)
{
    json_t *want = parse(want_text);
    if (!json_equal(got, want)) {
        char *g = json_dumps(got, JSON_SORT_KEYS), *w = json_dumps(want, JSON_SORT_KEYS);
        fail_msg("got  %s\nwant %s", g, w);
    }
    json_decref(want);
}

static const struct pr_resource pod = {"v1", "Pod", "ml", "chat-1", "u-1"};

static void test_a_pod_report_is_owned_by_the_pod_and_counts_its_results(void **state)
{
    (void)state;
    struct pr_finding fail = {.policy = "gpu-quota",
                              .result = "fail",
                              .message = "over",
                              .severity = "medium",
                              .category = "GPU",
                              .scored = true};
    struct pr_finding pass = {.policy = "gpu-guardrails", .result = "pass", .message = "ok"};
    json_t *results =
        json_pack("[o,o]", pr_result(&fail, &pod, 1700000000), pr_result(&pass, NULL, 1700000000));
    json_t *report = pr_report(PR_WGPOLICY, &pod, results);
    assert_json(report,
                "{\"apiVersion\":\"wgpolicyk8s.io/v1alpha2\",\"kind\":\"PolicyReport\","
                "\"metadata\":{\"name\":\"gpuguard-u-1\",\"namespace\":\"ml\","
                "\"labels\":{\"app.kubernetes.io/managed-by\":\"gpuguard\"},"
                "\"ownerReferences\":[{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"name\":\"chat-1\","
                "\"uid\":\"u-1\"}]},"
                "\"scope\":{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"name\":\"chat-1\","
                "\"namespace\":\"ml\",\"uid\":\"u-1\"},"
                "\"results\":[{\"policy\":\"gpu-quota\",\"rule\":\"gpu-quota\",\"result\":\"fail\","
                "\"message\":\"over\",\"severity\":\"medium\",\"category\":\"GPU\",\"scored\":true,"
                "\"source\":\"gpuguard\",\"timestamp\":{\"seconds\":1700000000,\"nanos\":0},"
                "\"resources\":[{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"name\":\"chat-1\","
                "\"namespace\":\"ml\",\"uid\":\"u-1\"}]},"
                "{\"policy\":\"gpu-guardrails\",\"rule\":\"gpu-guardrails\",\"result\":\"pass\","
                "\"message\":\"ok\",\"scored\":false,\"source\":\"gpuguard\","
                "\"timestamp\":{\"seconds\":1700000000,\"nanos\":0}}],"
                "\"summary\":{\"pass\":1,\"fail\":1,\"warn\":0,\"error\":0,\"skip\":0}}");
    json_decref(report);
}

static void test_the_cluster_report_in_openreports(void **state)
{
    (void)state;
    json_t *report = pr_report(PR_OPENREPORTS, NULL, json_array());
    assert_json(report, "{\"apiVersion\":\"openreports.io/v1alpha1\",\"kind\":\"ClusterReport\","
                        "\"metadata\":{\"name\":\"gpuguard-cluster\","
                        "\"labels\":{\"app.kubernetes.io/managed-by\":\"gpuguard\"}},"
                        "\"source\":\"gpuguard\",\"results\":[],"
                        "\"summary\":{\"pass\":0,\"fail\":0,\"warn\":0,\"error\":0,\"skip\":0}}");
    json_decref(report);
    struct pr_resource ns = {"v1", "Pod", "ml", "x", "u-2"};
    report = pr_report(PR_OPENREPORTS, &ns, json_array());
    assert_string_equal(json_string_value(json_object_get(report, "kind")), "Report");
    json_decref(report);
}

static void test_failures_come_first_and_past_the_bound_a_note_says_how_many_went(void **state)
{
    (void)state;
    json_t *results = json_array();
    struct pr_finding pass = {.policy = "p", .result = "pass", .message = "m"};
    struct pr_finding fail = {.policy = "f", .result = "fail", .message = "m"};
    struct pr_finding warn = {.policy = "w", .result = "warn", .message = "m"};
    for (int i = 0; i < PR_MAX_RESULTS; i++)
        json_array_append_new(results, pr_result(&pass, NULL, 1));
    for (int i = 0; i < 3; i++)
        json_array_append_new(results, pr_result(&fail, NULL, 1));
    json_array_append_new(results, pr_result(&warn, NULL, 1));
    json_t *report = pr_report(PR_WGPOLICY, &pod, results);
    const json_t *kept = json_object_get(report, "results");
    assert_int_equal(json_array_size(kept), PR_MAX_RESULTS);
    assert_string_equal(json_string_value(json_object_get(json_array_get(kept, 0), "policy")), "f");
    assert_string_equal(json_string_value(json_object_get(json_array_get(kept, 3), "policy")), "w");
    const json_t *note = json_array_get(kept, PR_MAX_RESULTS - 1);
    assert_string_equal(json_string_value(json_object_get(note, "message")),
                        "5 more results left out (at most 200 a report)");
    assert_json(json_object_get(report, "summary"),
                "{\"pass\":195,\"fail\":3,\"warn\":1,\"error\":0,\"skip\":1}");
    json_decref(report);
    /* At the bound, nothing is left out and no note is added. */
    results = json_array();
    for (int i = 0; i < PR_MAX_RESULTS; i++)
        json_array_append_new(results, pr_result(&pass, NULL, 1));
    report = pr_report(PR_WGPOLICY, &pod, results);
    assert_int_equal(json_array_size(json_object_get(report, "results")), PR_MAX_RESULTS);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(report, "summary"), "skip")), 0);
    json_decref(report);
}

static void test_a_long_message_is_cut_on_a_character_boundary(void **state)
{
    (void)state;
    char text[PR_MESSAGE_MAX + 8];
    memset(text, 'a', PR_MESSAGE_MAX - 1);
    strcpy(text + PR_MESSAGE_MAX - 1, "\xc3\xa9zzz"); /* é across the bound */
    struct pr_finding f = {.policy = "p", .result = "fail", .message = text};
    json_t *r = pr_result(&f, NULL, 1);
    assert_int_equal(strlen(json_string_value(json_object_get(r, "message"))), PR_MESSAGE_MAX - 1);
    json_decref(r);
}

static void test_the_digest_ignores_timestamps_and_nothing_else(void **state)
{
    (void)state;
    struct pr_finding f = {.policy = "p", .result = "fail", .message = "m"};
    json_t *a = json_pack("[o]", pr_result(&f, &pod, 1)),
           *b = json_pack("[o]", pr_result(&f, &pod, 99));
    f.message = "n";
    json_t *c = json_pack("[o]", pr_result(&f, &pod, 1));
    char da[65], db[65], dc[65];
    assert_true(pr_digest(a, da) && pr_digest(b, db) && pr_digest(c, dc));
    assert_string_equal(da, db);
    assert_string_not_equal(da, dc);
    json_decref(a);
    json_decref(b);
    json_decref(c);
}

static void test_report_apis_by_name(void **state)
{
    (void)state;
    enum pr_api api;
    assert_true(pr_api_parse("openreports.io/v1alpha1", &api) && api == PR_OPENREPORTS);
    assert_true(pr_api_parse("wgpolicyk8s.io/v1alpha2", &api) && api == PR_WGPOLICY);
    assert_false(pr_api_parse("wgpolicyk8s.io/v1beta1", &api));
    assert_false(pr_api_parse(NULL, &api));
}

static void test_label_selectors_as_the_api_server_matches_them(void **state)
{
    (void)state;
    json_t *labels = parse("{\"team\":\"ml\",\"kubernetes.io/metadata.name\":\"ml\"}");
    static const struct {
        const char *selector;
        bool matches;
    } cases[] = {
        {"{}", true},
        {"{\"matchLabels\":{\"team\":\"ml\"}}", true},
        {"{\"matchLabels\":{\"team\":\"ops\"}}", false},
        {"{\"matchExpressions\":[{\"key\":\"gpuguard.io/ignore\",\"operator\":\"NotIn\","
         "\"values\":[\"true\"]}]}",
         true},
        {"{\"matchExpressions\":[{\"key\":\"kubernetes.io/metadata.name\",\"operator\":\"NotIn\","
         "\"values\":[\"kube-system\",\"ml\"]}]}",
         false},
        {"{\"matchExpressions\":[{\"key\":\"team\",\"operator\":\"In\",\"values\":[\"ml\"]}]}",
         true},
        {"{\"matchExpressions\":[{\"key\":\"team\",\"operator\":\"In\",\"values\":[\"m*\"]}]}",
         false},
        {"{\"matchExpressions\":[{\"key\":\"team\",\"operator\":\"Exists\"}]}", true},
        {"{\"matchExpressions\":[{\"key\":\"team\",\"operator\":\"DoesNotExist\"}]}", false},
        {"{\"matchExpressions\":[{\"key\":\"team\",\"operator\":\"Gt\",\"values\":[\"1\"]}]}",
         false},
        {"{\"matchExpressions\":[{\"key\":\"team\",\"operator\":\"In\"}]}", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *sel = parse(cases[i].selector);
        if (ls_matches(sel, labels) != cases[i].matches)
            fail_msg("%s should %smatch", cases[i].selector, cases[i].matches ? "" : "not ");
        json_decref(sel);
    }
    json_t *sel = parse("{\"matchExpressions\":[{\"key\":\"a\",\"operator\":\"NotIn\","
                        "\"values\":[\"x\"]}]}");
    assert_true(ls_matches(sel, NULL)); /* no labels: NotIn holds */
    assert_true(ls_matches(NULL, NULL));
    json_decref(sel);
    json_decref(labels);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_pod_report_is_owned_by_the_pod_and_counts_its_results),
        cmocka_unit_test(test_the_cluster_report_in_openreports),
        cmocka_unit_test(test_failures_come_first_and_past_the_bound_a_note_says_how_many_went),
        cmocka_unit_test(test_a_long_message_is_cut_on_a_character_boundary),
        cmocka_unit_test(test_the_digest_ignores_timestamps_and_nothing_else),
        cmocka_unit_test(test_report_apis_by_name),
        cmocka_unit_test(test_label_selectors_as_the_api_server_matches_them),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
