/*
 * test_charge_memo.c - one evaluation of the charge model per charge spec (engine/chargememo.h):
 * pods that differ only in one part the model reads are evaluated apart and charged apart;
 * pods that differ only in what it does not read share one evaluation, at admission and in a
 * relist alike; a pod naming DRA claims, whose charge reads cluster state, only while the DRA
 * objects stay as they are; a reload forgets every charge; the memo is bounded.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "charging.h"
#include "engine/chargememo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONFIG "tests/data/charges/config.yaml"

/* The parts of a pod as the API server has it: what the model reads, and what it does not. */
struct parts {
    const char *name, *ns, *uid, *labels, *annotations, *node, *scheduler, *selector, *image, *env,
        *resources, *init, *claims, *phase;
};

static const struct parts base = {
    .name = "train-0",
    .ns = "ns-a",
    .uid = "u-0",
    .labels = "\"app\":\"train\",\"gpuguard.io/workload-class\":\"training\"",
    .annotations = "\"gpuguard.io/pool\":\"h100\",\"gpuguard.io/decision\":\"exclusive\"",
    .node = "node-1",
    .scheduler = "default-scheduler",
    .selector = "{\"pool\":\"h100\"}",
    .image = "cuda:12",
    .env = "1",
    .resources = "{\"limits\":{\"cpu\":\"8\",\"nvidia.com/gpu\":\"1\"}}",
    .init = "[]",
    .claims = "[]",
    .phase = "Running",
};

static json_t *pod_of(const struct parts *p)
{
    char text[4096];
    snprintf(text, sizeof(text),
             "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"%s\","
             "\"generateName\":\"train-\",\"namespace\":\"%s\",\"uid\":\"%s\","
             "\"resourceVersion\":\"7\",\"labels\":{%s},\"annotations\":{%s},"
             "\"ownerReferences\":[{\"apiVersion\":\"batch/v1\",\"kind\":\"Job\",\"name\":"
             "\"train\",\"uid\":\"j-1\",\"controller\":true}]},\"spec\":{\"nodeName\":\"%s\","
             "\"schedulerName\":\"%s\",\"nodeSelector\":%s,\"tolerations\":[{\"key\":"
             "\"nvidia.com/gpu\",\"operator\":\"Exists\"}],\"containers\":[{\"name\":\"main\","
             "\"image\":\"%s\",\"env\":[{\"name\":\"E\",\"value\":\"%s\"}],\"resources\":%s}],"
             "\"initContainers\":%s,\"resourceClaims\":%s},\"status\":{\"phase\":\"%s\"}}",
             p->name, p->ns, p->uid, p->labels, p->annotations, p->node, p->scheduler, p->selector,
             p->image, p->env, p->resources, p->init, p->claims, p->phase);
    json_error_t jerr;
    json_t *pod = json_loads(text, 0, &jerr);
    if (!pod)
        fail_msg("bad fixture: %s: %s", jerr.text, text);
    return pod;
}

struct setup {
    struct inventory *inv;
    struct charging model;
};

/* DRA templates: ns-a/one and ns-b/t a GPU, ns-a/two and ns-a/t two. */
static void start(struct setup *s)
{
    static const char *const templates[][3] = {
        {"ns-a", "one", "1"}, {"ns-a", "two", "2"}, {"ns-a", "t", "2"}, {"ns-b", "t", "1"}};
    s->inv = inv_new();
    charging_start(&s->model, s->inv, "policies", CONFIG);
    for (size_t i = 0; i < sizeof(templates) / sizeof(*templates); i++)
        charging_template(s->inv, templates[i][0], templates[i][1], atoi(templates[i][2]));
}

static void stop(struct setup *s)
{
    charging_stop(&s->model);
    inv_free(s->inv);
}

static uint64_t evaluated(const struct setup *s)
{
    return charger_stats(s->model.charger).evaluated;
}

static int64_t charge_parts(struct setup *s, const struct parts *p)
{
    json_t *pod = pod_of(p);
    int64_t charge = charge_of(s->inv, pod);
    json_decref(pod);
    return charge;
}

/* Each part the model reads, changed alone: both pods evaluated, each charged its own. */
static void test_each_part_the_model_reads_is_charged_apart(void **state)
{
    (void)state;
    struct parts shared = base, kai = base, dra_one = base, dra_t = base;
    shared.selector = "{\"pool\":\"l4-shared\"}";
    shared.resources = "{\"limits\":{\"nvidia.com/gpu.shared\":\"1\"}}";
    kai.selector = "{\"pool\":\"kai\"}";
    kai.resources = "{}";
    dra_one.resources = dra_t.resources = "{}";
    dra_one.selector = dra_t.selector = "{}";
    dra_one.claims = "[{\"name\":\"g\",\"resourceClaimTemplateName\":\"one\"}]";
    dra_t.claims = "[{\"name\":\"g\",\"resourceClaimTemplateName\":\"t\"}]";
    struct {
        const char *part;
        struct parts a, b;
        int64_t charge_a, charge_b;
    } cases[] = {
        {"a container's limits", base, base, 1000, 2000},
        {"a container's requests", base, base, 1000, 2000},
        {"an init container", base, base, 1000, 3000},
        {"an init container's restartPolicy", base, base, 1000, 2000},
        {"gpuguard's charge annotation", shared, shared, 500, 750},
        {"KAI's fraction annotation", kai, kai, 500, 250},
        {"the pool its nodeSelector names", base, base, 1000, 500},
        {"the DRA template it names", dra_one, dra_one, 1000, 2000},
        {"the namespace its DRA template is read in", dra_t, dra_t, 2000, 1000},
    };
    cases[0].b.resources = "{\"limits\":{\"cpu\":\"8\",\"nvidia.com/gpu\":\"2\"}}";
    cases[1].a.resources = "{\"requests\":{\"nvidia.com/gpu\":\"1\"}}";
    cases[1].b.resources = "{\"requests\":{\"nvidia.com/gpu\":\"2\"}}";
    cases[2].b.init = "[{\"name\":\"i\",\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"3\"}}}]";
    cases[3].a.init = "[{\"name\":\"s\",\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"1\"}}}]";
    cases[3].b.init = "[{\"name\":\"s\",\"restartPolicy\":\"Always\",\"resources\":{\"limits\":"
                      "{\"nvidia.com/gpu\":\"1\"}}}]";
    cases[4].a.annotations = "\"gpuguard.io/charge\":\"500\"";
    cases[4].b.annotations = "\"gpuguard.io/charge\":\"750\"";
    cases[5].a.annotations = "\"gpu-fraction\":\"0.5\"";
    cases[5].b.annotations = "\"gpu-fraction\":\"0.25\"";
    cases[6].b.selector = "{\"pool\":\"l4-plain\"}";
    cases[7].b.claims = "[{\"name\":\"g\",\"resourceClaimTemplateName\":\"two\"}]";
    cases[8].b.ns = "ns-b";
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        struct setup s;
        start(&s);
        int64_t a = charge_parts(&s, &cases[i].a), b = charge_parts(&s, &cases[i].b);
        if (a != cases[i].charge_a || b != cases[i].charge_b)
            fail_msg("%s: charged %lld then %lld, not %lld then %lld", cases[i].part, (long long)a,
                     (long long)b, (long long)cases[i].charge_a, (long long)cases[i].charge_b);
        if (evaluated(&s) != 2)
            fail_msg("%s: %llu evaluations, not 2", cases[i].part,
                     (unsigned long long)evaluated(&s));
        stop(&s);
    }
}

/* What the model does not read, changed part after part: one evaluation for them all. */
static void test_what_the_model_does_not_read_shares_one_evaluation(void **state)
{
    (void)state;
    struct setup s;
    start(&s);
    int64_t charge = charge_parts(&s, &base);
    assert_int_equal(charge, 1000);
    struct parts v[11];
    for (size_t i = 0; i < 11; i++)
        v[i] = base;
    v[0].name = "train-1";
    v[1].uid = "u-1";
    v[2].labels = "\"app\":\"other\",\"gpuguard.io/workload-class\":\"batch\"";
    v[3].annotations = "\"gpuguard.io/pool\":\"l4-plain\",\"note\":\"{\\\"x\\\":1}\"";
    v[4].node = "node-2";
    v[5].scheduler = "kai-scheduler";
    v[6].image = "cuda:13";
    v[7].env = "2";
    v[8].phase = "Pending";
    v[9].resources = "{\"limits\":{\"cpu\":\"1\",\"memory\":\"1Gi\",\"nvidia.com/gpu\":\"1\"}}";
    v[10] = v[0]; /* and all of the above at once */
    v[10].uid = v[1].uid, v[10].labels = v[2].labels, v[10].annotations = v[3].annotations;
    v[10].node = v[4].node, v[10].scheduler = v[5].scheduler, v[10].image = v[6].image;
    v[10].env = v[7].env, v[10].phase = v[8].phase, v[10].resources = v[9].resources;
    for (size_t i = 0; i < 11; i++)
        assert_int_equal(charge_parts(&s, &v[i]), charge);
    assert_int_equal(evaluated(&s), 1);
    assert_int_equal(charger_stats(s.model.charger).remembered, 11);

    /* The relist reads a pod's text, admission hands the charger its nodes: one key. */
    json_t *pod = pod_of(&v[10]);
    struct inf_pod read;
    struct gg_err err = {{0}};
    inf_pod_init(&read);
    assert_true(inf_pod_of_json(pod, &read, &err));
    assert_int_equal(charger_charge(s.model.charger, &read, NULL), charge);
    assert_int_equal(evaluated(&s), 1);
    inf_pod_free(&read);
    json_decref(pod);
    stop(&s);
}

/*
 * A pod naming DRA claims reads what they resolve to: its charge is remembered while the DRA
 * objects stay as they are, and worked out again once one of them changes, in place of the
 * charge remembered before (one entry, however often they change).
 */
static void test_a_pod_naming_claims_is_remembered_while_its_dra_objects_stay(void **state)
{
    (void)state;
    struct setup s;
    start(&s);
    struct parts dra = base;
    dra.resources = "{}";
    dra.selector = "{}";
    dra.claims = "[{\"name\":\"g\",\"resourceClaimTemplateName\":\"two\"}]";
    assert_int_equal(charge_parts(&s, &dra), 2000);
    assert_int_equal(charge_parts(&s, &dra), 2000);
    assert_int_equal(evaluated(&s), 1);
    charging_template(s.inv, "ns-a", "two", 3);
    assert_int_equal(charge_parts(&s, &dra), 3000);
    assert_int_equal(evaluated(&s), 2);
    assert_int_equal(charger_stats(s.model.charger).remembering, 1);
    assert_int_equal(charge_parts(&s, &dra), 3000);
    assert_int_equal(evaluated(&s), 2);
    stop(&s);
}

/* A reload may change the model: every charge remembered before it is forgotten. */
static void test_a_reload_forgets_every_charge(void **state)
{
    (void)state;
    struct setup s;
    start(&s);
    assert_int_equal(charge_parts(&s, &base), 1000);
    assert_int_equal(charge_parts(&s, &base), 1000);
    assert_int_equal(evaluated(&s), 1);
    struct gg_err err = {{0}};
    assert_int_equal(engine_reload(s.model.engine, &err), GG_OK);
    assert_int_equal(charge_parts(&s, &base), 1000);
    assert_int_equal(evaluated(&s), 2);
    assert_int_equal(charger_stats(s.model.charger).remembering, 1);
    stop(&s);
}

/* Full, the memo starts again empty: never more than its bound, never a wrong answer. */
static void test_the_memo_is_bounded(void **state)
{
    (void)state;
    struct charge_memo *m = cm_new();
    char key[32];
    int64_t got = -1;
    for (int i = 0; i <= CM_MAX_ENTRIES; i++) {
        int n = snprintf(key, sizeof(key), "spec-%d", i);
        cm_put(m, key, (size_t)n, 0, i);
        assert_true(cm_entries(m) <= CM_MAX_ENTRIES);
    }
    assert_int_equal(cm_entries(m), 1); /* the last one, after a new start */
    assert_false(cm_get(m, "spec-0", 6, 0, &got));
    int n = snprintf(key, sizeof(key), "spec-%d", CM_MAX_ENTRIES);
    assert_true(cm_get(m, key, (size_t)n, 0, &got));
    assert_int_equal(got, CM_MAX_ENTRIES);
    assert_false(cm_get(m, key, (size_t)n - 1, 0, &got)); /* a prefix is another key */
    /* Another version: not given; put, it takes the entry's place. */
    assert_false(cm_get(m, key, (size_t)n, 1, &got));
    cm_put(m, key, (size_t)n, 1, 7);
    assert_int_equal(cm_entries(m), 1);
    assert_true(cm_get(m, key, (size_t)n, 1, &got));
    assert_int_equal(got, 7);
    assert_false(cm_get(m, key, (size_t)n, 0, &got));
    cm_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_part_the_model_reads_is_charged_apart),
        cmocka_unit_test(test_what_the_model_does_not_read_shares_one_evaluation),
        cmocka_unit_test(test_a_pod_naming_claims_is_remembered_while_its_dra_objects_stay),
        cmocka_unit_test(test_a_reload_forgets_every_charge),
        cmocka_unit_test(test_the_memo_is_bounded),
    };
    return cmocka_run_group_tests_name("charge memo", tests, NULL, NULL);
}
