/*
 * test_workloads.c - unit tests for the pure parts of workloads.c and what
 * it reads: the pods a workload asks for per template (wl_pod_count), the
 * queue an object names (wl_queue), one object's templates
 * (mf_collect_object) and workloads.mode (cfg_workloads_mode).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "engine/config.h"
#include "codec/manifest.h"
#include "engine/workloads.h"

static json_t *parse(const char *text)
{
    json_error_t jerr;
    json_t *v = json_loads(text, 0, &jerr);
    if (!v)
        fail_msg("fixture: %s", jerr.text);
    return v;
}

/* wl_pod_count of the template at ptr in the object text. */
static long long count(const char *text, const char *ptr)
{
    json_t *obj = parse(text);
    long long n = wl_pod_count(obj, ptr);
    json_decref(obj);
    return n;
}

static void test_pod_count(void **state)
{
    (void)state;
    assert_int_equal(count("{\"spec\":{\"replicas\":3,\"template\":{}}}", "/spec/template"), 3);
    assert_int_equal(count("{\"spec\":{\"template\":{}}}", "/spec/template"), 1); /* DaemonSet */
    assert_int_equal(count("{\"spec\":{\"parallelism\":4,\"template\":{}}}", "/spec/template"), 4);
    assert_int_equal(count("{\"spec\":{\"replicas\":0,\"template\":{}}}", "/spec/template"), 0);
    assert_int_equal(count("{\"spec\":{\"jobTemplate\":{\"spec\":{\"parallelism\":2,"
                           "\"template\":{}}}}}",
                           "/spec/jobTemplate/spec/template"),
                     2);
    /* A JobSet: the replicated job's replicas times its Job's parallelism. */
    assert_int_equal(count("{\"spec\":{\"replicatedJobs\":[{\"replicas\":1},{\"replicas\":3,"
                           "\"template\":{\"spec\":{\"parallelism\":2,\"template\":{}}}}]}}",
                           "/spec/replicatedJobs/1/template/spec/template"),
                     6);
    /* Kubeflow roles and Ray groups. */
    assert_int_equal(count("{\"spec\":{\"pytorchReplicaSpecs\":{\"Worker\":{\"replicas\":5,"
                           "\"template\":{}}}}}",
                           "/spec/pytorchReplicaSpecs/Worker/template"),
                     5);
    assert_int_equal(count("{\"spec\":{\"headGroupSpec\":{\"template\":{}},\"workerGroupSpecs\":"
                           "[{\"replicas\":2,\"template\":{}}]}}",
                           "/spec/headGroupSpec/template"),
                     1);
    /* A LeaderWorkerSet: groups of size, one leader and size - 1 workers each. */
    const char *lws = "{\"spec\":{\"replicas\":2,\"leaderWorkerTemplate\":{\"size\":4,"
                      "\"leaderTemplate\":{},\"workerTemplate\":{}}}}";
    assert_int_equal(count(lws, "/spec/leaderWorkerTemplate/leaderTemplate"), 2);
    assert_int_equal(count(lws, "/spec/leaderWorkerTemplate/workerTemplate"), 6);
    /* Nonsense counts count one; huge ones are bounded. */
    assert_int_equal(count("{\"spec\":{\"replicas\":\"3\",\"template\":{}}}", "/spec/template"), 1);
    assert_int_equal(count("{\"spec\":{\"replicas\":-2,\"template\":{}}}", "/spec/template"), 1);
    assert_int_equal(count("{\"spec\":{\"replicas\":100000,\"parallelism\":100000,"
                           "\"template\":{}}}",
                           "/spec/template"),
                     WL_MAX_PODS);
}

static void test_queue(void **state)
{
    (void)state;
    json_t *kueue = parse("{\"metadata\":{\"labels\":{\"kueue.x-k8s.io/queue-name\":\"q\"}}}");
    json_t *kai = parse("{\"metadata\":{\"labels\":{\"kai.scheduler/queue\":\"k\"}}}");
    json_t *none = parse("{\"metadata\":{\"labels\":{\"team\":\"a\"}}}");
    assert_string_equal(wl_queue(kueue), "q");
    assert_string_equal(wl_queue(kai), "k");
    assert_null(wl_queue(none));
    assert_null(wl_queue(NULL));
    json_decref(kueue);
    json_decref(kai);
    json_decref(none);
}

static void test_collect_object(void **state)
{
    (void)state;
    struct mf_set set;
    struct gg_err err = {{0}};
    json_t *obj = parse("{\"apiVersion\":\"jobset.x-k8s.io/v1alpha2\",\"kind\":\"JobSet\","
                        "\"metadata\":{\"name\":\"js\"},\"spec\":{\"replicatedJobs\":["
                        "{\"name\":\"a\",\"template\":{\"spec\":{\"template\":{\"spec\":{}}}}},"
                        "{\"name\":\"b\",\"template\":{\"spec\":{\"template\":{\"spec\":{}}}}}]}}");
    assert_int_equal(mf_collect_object(obj, "object", &set, &err), GG_OK);
    assert_int_equal(set.templates, 2);
    assert_int_equal(set.entries[1].doc, 0);
    assert_int_equal(set.entries[1].doc_number, 1);
    assert_string_equal(set.entries[1].path, "spec.replicatedJobs[1].template.spec.template");
    assert_string_equal(set.entries[1].template_ptr,
                        "/spec/replicatedJobs/1/template/spec/template");
    mf_set_clear(&set);
    json_decref(obj);
    obj = parse("{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\"}");
    assert_int_equal(mf_collect_object(obj, "object", &set, &err), GG_OK);
    assert_int_equal(set.templates, 0);
    assert_int_equal(set.skipped, 1);
    mf_set_clear(&set);
    json_decref(obj);
}

static void test_workloads_mode(void **state)
{
    (void)state;
    static const struct {
        const char *config;
        enum gg_status st;
        enum cfg_workloads_mode mode;
    } cases[] = {
        {"{}", GG_OK, CFG_WORKLOADS_MUTATE},
        {"{\"workloads\":null}", GG_OK, CFG_WORKLOADS_MUTATE},
        {"{\"workloads\":{}}", GG_OK, CFG_WORKLOADS_MUTATE},
        {"{\"workloads\":{\"mode\":\"mutate\"}}", GG_OK, CFG_WORKLOADS_MUTATE},
        {"{\"workloads\":{\"mode\":\"validate\"}}", GG_OK, CFG_WORKLOADS_VALIDATE},
        {"{\"workloads\":{\"mode\":\"audit\"}}", GG_ERR_INVALID, CFG_WORKLOADS_MUTATE},
        {"{\"workloads\":{\"mode\":1}}", GG_ERR_INVALID, CFG_WORKLOADS_MUTATE},
        {"{\"workloads\":[]}", GG_ERR_INVALID, CFG_WORKLOADS_MUTATE},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct gg_err err = {{0}};
        enum cfg_workloads_mode mode = CFG_WORKLOADS_VALIDATE;
        json_t *root = parse(cases[i].config);
        assert_int_equal(cfg_workloads_mode(root, &mode, &err), cases[i].st);
        if (cases[i].st == GG_OK)
            assert_int_equal(mode, cases[i].mode);
        else
            assert_non_null(strstr(err.msg, "workloads"));
        json_decref(root);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pod_count),
        cmocka_unit_test(test_queue),
        cmocka_unit_test(test_collect_object),
        cmocka_unit_test(test_workloads_mode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
