/*
 * test_verdictmemo.c - validate reports remembered by request
 * (engine/verdictmemo.h): a policy that declares `remember = true` judges a
 * request once, and its report answers every copy; a request that differs
 * in anything a policy can read (the object, the namespace, the user, the
 * operation, dryRun, the old object, what the mutate phase made of it) is
 * judged again; so is a call that read the cluster or failed, every call of
 * a policy that does not declare it, and everything after a reload.  The
 * policies count their calls in an upvalue and audit the count: a report
 * from the memo shows the count of the call that made it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "charging.h"
#include "kube/inventory.h"
#include "codec/admission.h"
#include "engine/dryrun.h"
#include "util/clock.h"
#include "tmptree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char policies_text[] =
    "local gg = require 'gpuguard'\n"
    "local counts = {}\n"
    "local function count(req, name)\n"
    "  counts[name] = (counts[name] or 0) + 1\n"
    "  req:audit(name, tostring(counts[name]))\n"
    "end\n"
    "return { name = 'judge', remember = { 'validate' },\n"
    "  mutate = function(req, pod)\n"
    "    local a = pod.metadata.annotations\n"
    "    if a and a.stamp then a.stamp = tostring(os_clock_stand_in()) end\n"
    "  end,\n"
    "  validate = function(req, pod)\n"
    "    local labels = pod.metadata.labels\n"
    "    count(req, 'n')\n"
    "    if labels and labels.cluster then gg.usage(req.namespace) end\n"
    "    if labels and labels.dra then gg.dra('ResourceClaimTemplate', req.namespace, 't') end\n"
    "    if labels and labels.boom then error('boom') end\n"
    "    if labels and labels.bad then req:deny('label bad: remove it') end\n"
    "  end }\n";

/* A mutating policy that remembers its edits: the label "copy" copied into an annotation, and
 * the calls counted; a pod labelled cluster reads the usage. */
static const char edit_text[] =
    "local gg = require 'gpuguard'\n"
    "local n = 0\n"
    "return { name = 'edit', remember = { 'mutate' }, mutate = function(req, pod)\n"
    "  n = n + 1\n"
    "  req:audit('n', tostring(n))\n"
    "  local labels = pod.metadata.labels\n"
    "  if labels and labels.cluster then gg.usage(req.namespace) end\n"
    "  if labels and labels.copy then\n"
    "    pod.metadata.annotations = pod.metadata.annotations or gg.object()\n"
    "    pod.metadata.annotations.copied = labels.copy\n"
    "  end\n"
    "end }\n";

/* A policy after judge that reads nothing of the cluster itself, remembered. */
static const char after_text[] = "local n = 0\n"
                                 "return { name = 'after', remember = { 'validate' },\n"
                                 "  validate = function(req)\n"
                                 "    n = n + 1\n"
                                 "    req:audit('n', tostring(n))\n"
                                 "  end }\n";

/* A second policy judging every request (no `remember`). */
static const char always_text[] = "local n = 0\n"
                                  "return { name = 'always', validate = function(req)\n"
                                  "  n = n + 1\n"
                                  "  req:audit('n', tostring(n))\n"
                                  "end }\n";

struct setup {
    char dir[32];
    struct engine *e;
};

/* Each test's engine on the policies, in a directory of their own; os_clock_stand_in counts
 * mutate calls, so that a pod with a stamp annotation comes out of mutate different every
 * time. */
static int setup(void **state)
{
    struct setup *s = calloc(1, sizeof(*s));
    assert_non_null(s);
    *state = s;
    char policies[64], file[128];
    snprintf(s->dir, sizeof(s->dir), "/tmp/gg-verdict-XXXXXX");
    char text[sizeof(policies_text) + 128];
    snprintf(text, sizeof(text),
             "local stamps = 0\nlocal function os_clock_stand_in() stamps = "
             "stamps + 1 return stamps end\n%s",
             policies_text);
    one_policy(s->dir, policies, text);
    static const struct {
        const char *name, *text;
    } more[] = {
        {"20-always.lua", always_text}, {"30-edit.lua", edit_text}, {"40-after.lua", after_text}};
    for (size_t i = 0; i < 3; i++) {
        snprintf(file, sizeof(file), "%s/%s", policies, more[i].name);
        FILE *f = fopen(file, "w");
        assert_non_null(f);
        fputs(more[i].text, f);
        fclose(f);
    }
    struct policy_paths paths = {.policies = policies, .lua = "lua", .config = NULL};
    struct gg_err err = {{0}};
    if (engine_new(&paths, &s->e, &err) != GG_OK)
        fail_msg("%s", err.msg);
    return 0;
}

static int teardown(void **state)
{
    struct setup *s = *state;
    engine_free(s->e);
    assert_int_equal(tmptree_remove(s->dir), 0);
    free(s);
    return 0;
}

/* The pod: labels and annotations as JSON object text. */
static json_t *pod_with(const char *labels, const char *annotations)
{
    char text[512];
    snprintf(text, sizeof(text),
             "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"generateName\":\"p-\","
             "\"labels\":%s,\"annotations\":%s},\"spec\":{\"containers\":[{\"name\":\"c\"}]}}",
             labels, annotations);
    json_t *pod = json_loads(text, 0, NULL);
    assert_non_null(pod);
    return pod;
}

/* "judge's count/always' count[/denied]" after a dry run of pod with o. */
static void expect(struct setup *s, json_t *pod, const struct dr_options *o, const char *want)
{
    struct dr_result res;
    struct gg_err err = {{0}};
    if (dr_evaluate(s->e, pod, o, &res, &err) != GG_OK)
        fail_msg("%s", err.msg);
    char got[128];
    snprintf(got, sizeof(got), "%s/%s%s", json_string_value(json_object_get(res.audit, "judge.n")),
             json_string_value(json_object_get(res.audit, "always.n")),
             res.allowed ? "" : "/denied");
    assert_string_equal(got, want);
    dr_result_clear(&res);
}

static void test_a_copy_is_answered_from_the_memo(void **state)
{
    struct setup *s = *state;
    json_t *pod = pod_with("{\"app\":\"a\"}", "{}"), *bad = pod_with("{\"bad\":\"x\"}", "{}");
    struct dr_options o = {.namespace = "ns"};
    expect(s, pod, &o, "1/1");
    expect(s, pod, &o, "1/2"); /* remembered: the count of the call that judged it */
    expect(s, bad, &o, "2/3/denied");
    expect(s, bad, &o, "2/4/denied"); /* a denial is remembered as well */
    expect(s, pod, &o, "1/5");
    json_decref(pod);
    json_decref(bad);
}

static void test_anything_a_policy_reads_makes_another_request(void **state)
{
    struct setup *s = *state;
    json_t *pod = pod_with("{\"app\":\"a\"}", "{}");
    json_t *groups = json_pack("[s]", "team");
    struct dr_options o = {.namespace = "ns"};
    expect(s, pod, &o, "1/1");
    struct dr_options other_ns = {.namespace = "other"};
    expect(s, pod, &other_ns, "2/2");
    struct dr_options user = {.namespace = "ns", .user = "alice"};
    expect(s, pod, &user, "3/3");
    struct dr_options group = {.namespace = "ns", .groups = groups};
    expect(s, pod, &group, "4/4");
    struct dr_options dry = {.namespace = "ns", .dry_run = true};
    expect(s, pod, &dry, "5/5");
    struct dr_options update = {.namespace = "ns", .operation = "UPDATE"};
    expect(s, pod, &update, "6/6");
    json_t *old = pod_with("{\"app\":\"before\"}", "{}");
    struct dr_options update_old = {.namespace = "ns", .operation = "UPDATE", .old_object = old};
    expect(s, pod, &update_old, "7/7");
    json_t *relabelled = pod_with("{\"app\":\"b\"}", "{}");
    expect(s, relabelled, &o, "8/8");
    /* each of them again: remembered */
    expect(s, pod, &other_ns, "2/9");
    expect(s, pod, &update_old, "7/10");
    expect(s, relabelled, &o, "8/11");
    json_decref(pod);
    json_decref(old);
    json_decref(relabelled);
    json_decref(groups);
}

static void test_what_mutate_made_is_part_of_the_request(void **state)
{
    struct setup *s = *state;
    /* mutate writes a new stamp each time: validate sees another object each time */
    json_t *pod = pod_with("{\"app\":\"a\"}", "{\"stamp\":\"0\"}");
    struct dr_options o = {.namespace = "ns"};
    expect(s, pod, &o, "1/1");
    expect(s, pod, &o, "2/2");
    json_decref(pod);
}

/* judge's count after both phases in one evaluation of a review of a pod with a stamp: the
 * object validate sees is the one the patch makes, never the review's own. */
static const char *both_phases(struct setup *s, char *out, size_t size)
{
    static const char review[] =
        "{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"request\":{"
        "\"uid\":\"u\",\"kind\":{\"group\":\"\",\"version\":\"v1\",\"kind\":\"Pod\"},"
        "\"resource\":{\"group\":\"\",\"version\":\"v1\",\"resource\":\"pods\"},"
        "\"namespace\":\"ns\",\"operation\":\"CREATE\",\"userInfo\":{\"username\":\"u\"},"
        "\"object\":{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"annotations\":"
        "{\"stamp\":\"0\"}},\"spec\":{\"containers\":[{\"name\":\"c\"}]}}}}";
    struct adm_request req;
    struct policy_verdict v;
    struct gg_err err = {{0}};
    if (adm_decode(review, sizeof(review) - 1, &req, &err) != GG_OK ||
        engine_evaluate(s->e, &req, PHASE_MUTATE | PHASE_VALIDATE, gg_now_us() + 10000000, &v,
                        &err) != GG_OK)
        fail_msg("%s", err.msg);
    snprintf(out, size, "%s", json_string_value(json_object_get(v.audit, "judge.n")));
    policy_verdict_clear(&v);
    adm_request_clear(&req);
    return out;
}

static void test_what_mutate_made_in_the_same_evaluation_is_part_of_the_request(void **state)
{
    struct setup *s = *state;
    char got[32];
    assert_string_equal(both_phases(s, got, sizeof(got)), "1");
    assert_string_equal(both_phases(s, got, sizeof(got)), "2");
}

static void test_a_call_that_reads_the_cluster_or_fails_is_not_remembered(void **state)
{
    struct setup *s = *state;
    json_t *cluster = pod_with("{\"cluster\":\"y\"}", "{}"),
           *boom = pod_with("{\"boom\":\"y\"}", "{}");
    struct dr_options o = {.namespace = "ns"};
    expect(s, cluster, &o, "1/1");
    expect(s, cluster, &o, "2/2");
    /* the call raised after its audit: the failure denies (failure: deny), every time */
    expect(s, boom, &o, "3/3/denied");
    expect(s, boom, &o, "4/4/denied");
    json_decref(cluster);
    json_decref(boom);
}

static void test_a_reload_forgets_what_was_judged(void **state)
{
    struct setup *s = *state;
    json_t *pod = pod_with("{\"app\":\"a\"}", "{}");
    struct dr_options o = {.namespace = "ns"};
    expect(s, pod, &o, "1/1");
    struct gg_err err = {{0}};
    assert_int_equal(engine_reload(s->e, &err), GG_OK);
    /* a new VM: the policies' counts start again, and nothing is remembered */
    expect(s, pod, &o, "1/1");
    expect(s, pod, &o, "1/2");
    json_decref(pod);
}

/* The message engine_new gives for a policy of text; NULL when it loads. */
static void expect_refused(const char *text, const char *want)
{
    char dir[] = "/tmp/gg-verdict-XXXXXX", policies[64];
    one_policy(dir, policies, text);
    struct policy_paths paths = {.policies = policies, .lua = "lua", .config = NULL};
    struct engine *e = NULL;
    struct gg_err err = {{0}};
    assert_int_not_equal(engine_new(&paths, &e, &err), GG_OK);
    if (!strstr(err.msg, want))
        fail_msg("got \"%s\", want \"%s\" in it", err.msg, want);
    assert_int_equal(tmptree_remove(dir), 0);
}

static void test_remember_lists_phases_the_policy_has(void **state)
{
    (void)state;
    expect_refused("return { name = 'p', remember = true, validate = function() end }",
                   "policy p: remember must be a list of phases, such as { \"validate\" }");
    expect_refused("return { name = 'p', remember = { 'admit' }, validate = function() end }",
                   "policy p: remember[1]: must be \"mutate\" or \"validate\"");
    expect_refused("return { name = 'p', remember = { 'validate', 'mutate' }, validate = "
                   "function() end }",
                   "policy p: remember[2]: it has no mutate");
}

/* "edit's count patch" after a dry run of pod. */
static void expect_edit(struct setup *s, json_t *pod, const char *want)
{
    struct dr_options o = {.namespace = "ns"};
    struct dr_result res;
    struct gg_err err = {{0}};
    if (dr_evaluate(s->e, pod, &o, &res, &err) != GG_OK)
        fail_msg("%s", err.msg);
    char *patch = json_dumps(res.patch, JSON_COMPACT);
    char got[512];
    snprintf(got, sizeof(got), "%s %s", json_string_value(json_object_get(res.audit, "edit.n")),
             patch);
    free(patch);
    assert_string_equal(got, want);
    dr_result_clear(&res);
}

static void test_a_mutate_call_is_replayed_with_its_edits(void **state)
{
    struct setup *s = *state;
    json_t *a = pod_with("{\"copy\":\"a\"}", "{}"), *b = pod_with("{\"copy\":\"b\"}", "{}");
    json_t *cluster = pod_with("{\"copy\":\"c\",\"cluster\":\"y\"}", "{}");
    static const char add_a[] = "[{\"op\":\"add\",\"path\":\"/metadata/annotations/copied\","
                                "\"value\":\"a\"}]";
    char want[256];
    snprintf(want, sizeof(want), "1 %s", add_a);
    expect_edit(s, a, want);
    expect_edit(s, a, want); /* replayed: the first call's count and the same patch */
    expect_edit(s, b,
                "2 [{\"op\":\"add\",\"path\":\"/metadata/annotations/copied\",\"value\":\"b\"}]");
    expect_edit(s, a, want);
    /* a call that read the usage is made every time */
    static const char add_c[] = "[{\"op\":\"add\",\"path\":\"/metadata/annotations/copied\","
                                "\"value\":\"c\"}]";
    snprintf(want, sizeof(want), "3 %s", add_c);
    expect_edit(s, cluster, want);
    snprintf(want, sizeof(want), "4 %s", add_c);
    expect_edit(s, cluster, want);
    json_decref(a);
    json_decref(b);
    json_decref(cluster);
}

/* after's count for a dry run of pod. */
static const char *after_count(struct setup *s, json_t *pod)
{
    static char got[32];
    struct dr_options o = {.namespace = "ns"};
    struct dr_result res;
    struct gg_err err = {{0}};
    if (dr_evaluate(s->e, pod, &o, &res, &err) != GG_OK)
        fail_msg("%s", err.msg);
    snprintf(got, sizeof(got), "%s", json_string_value(json_object_get(res.audit, "after.n")));
    dr_result_clear(&res);
    return got;
}

static void test_a_call_that_read_dra_objects_holds_while_they_stay(void **state)
{
    struct setup *s = *state;
    struct inventory *inv = inv_new();
    engine_set_inventory(s->e, inv);
    charging_template(inv, "ns", "t", 1);
    json_t *pod = pod_with("{\"dra\":\"y\"}", "{}");
    struct dr_options o = {.namespace = "ns"};
    expect(s, pod, &o, "1/1");
    expect(s, pod, &o, "1/2");
    charging_template(inv, "ns", "t", 2); /* the DRA objects moved: judged again */
    expect(s, pod, &o, "2/3");
    expect(s, pod, &o, "2/4");
    /* and so is a call after one of the same request that read them: it may answer from what
     * the library kept of them for the request */
    assert_string_equal(after_count(s, pod), "2");
    charging_template(inv, "ns", "t", 3);
    assert_string_equal(after_count(s, pod), "3");
    assert_string_equal(after_count(s, pod), "3");
    json_decref(pod);
    engine_set_inventory(s->e, NULL);
    inv_free(inv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_a_copy_is_answered_from_the_memo, setup, teardown),
        cmocka_unit_test_setup_teardown(test_anything_a_policy_reads_makes_another_request, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_what_mutate_made_is_part_of_the_request, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_what_mutate_made_in_the_same_evaluation_is_part_of_the_request, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_call_that_reads_the_cluster_or_fails_is_not_remembered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_reload_forgets_what_was_judged, setup, teardown),
        cmocka_unit_test(test_remember_lists_phases_the_policy_has),
        cmocka_unit_test_setup_teardown(test_a_mutate_call_is_replayed_with_its_edits, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_call_that_read_dra_objects_holds_while_they_stay,
                                        setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
