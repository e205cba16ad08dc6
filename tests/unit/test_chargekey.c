/*
 * test_chargekey.c - gpuguard.charge_key (engine/lb_chargekey.c), the key
 * intent.charge remembers a pod's charge under: for every pod of
 * tests/data/charges/pods.json (each dialect, DRA claims) and of the
 * reviews in tests/data/reviews, read as stubs, as filled tables or through
 * validate's read-only views, the key's text holds the pod's charge spec:
 * the informer's scanner cuts from it the very spec it cuts from the pod (so
 * two pods with one key have one charge).  After an edit in mutate the key
 * is the edited pod's.  A pod naming DRA claims is answered from the memo
 * only while the DRA objects stay as they were.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "charging.h"
#include "engine/dryrun.h"
#include "kube/infscan.h"
#include "tmptree.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Audits the key's text (after the namespace and its NUL) as the pod stands: untouched, every
 * table filled, after an edit of a part the charge reads, and in validate. */
static const char key_policy[] =
    "local gg = require 'gpuguard'\n"
    "local function text(req, obj)\n"
    "  local key = gg.charge_key(obj, req.namespace)\n"
    "  return key and key:match('^' .. req.namespace .. '%z(.*)$') or 'no key'\n"
    "end\n"
    "local function fill(t)\n"
    "  for _, v in pairs(t) do if type(v) == 'table' then fill(v) end end\n"
    "end\n"
    "return { name = 'key', mutate = function(req, obj)\n"
    "    req:audit('stubs', text(req, obj))\n"
    "    fill(obj)\n"
    "    req:audit('filled', text(req, obj))\n"
    "    if type(obj.metadata.annotations) ~= 'table' then obj.metadata.annotations = gg.object() "
    "end\n"
    "    obj.metadata.annotations['gpuguard.io/charge'] = '123'\n"
    "    req:audit('edited', text(req, obj))\n"
    "  end,\n"
    "  validate = function(req, obj) req:audit('frozen', text(req, obj)) end }\n";

/* The charge spec the informer cuts from JSON text, as a JSON value (NULL: the scanner refuses
 * the text). */
static json_t *spec_of_text(const char *text, size_t len)
{
    struct inf_pod p;
    struct gg_err err = {{0}};
    inf_pod_init(&p);
    json_t *spec =
        inf_pod_of_text(text, len, &p, &err) ? json_loadb(p.spec, p.spec_len, 0, NULL) : NULL;
    inf_pod_free(&p);
    return spec;
}

static json_t *spec_of_pod(const json_t *pod)
{
    char *text = json_dumps(pod, JSON_COMPACT);
    assert_non_null(text);
    json_t *spec = spec_of_text(text, strlen(text));
    free(text);
    return spec;
}

/* The key texts the policy audited must agree, and hold the charge spec of pod (before the
 * edit) and of the pod edited; the failures are counted and printed. */
static size_t check_pod(struct engine *e, const char *name, json_t *pod)
{
    json_t *meta = json_object_get(pod, "metadata");
    if (!json_is_object(meta))
        json_object_set_new(pod, "metadata", meta = json_object());
    json_object_set_new(meta, "namespace", json_string("ns"));
    struct dr_options o = {.namespace = "ns"};
    struct dr_result res;
    struct gg_err err = {{0}};
    if (dr_evaluate(e, pod, &o, &res, &err) != GG_OK)
        fail_msg("%s: %s", name, err.msg);
    const char *seen[4];
    static const char *const stages[] = {"stubs", "filled", "edited", "frozen"};
    for (size_t i = 0; i < 4; i++) {
        char key[32];
        snprintf(key, sizeof(key), "key.%s", stages[i]);
        seen[i] = json_string_value(json_object_get(res.audit, key));
        if (!seen[i])
            fail_msg("%s: no %s key audited", name, stages[i]);
    }
    json_t *edited = json_deep_copy(pod);
    json_t *annotations = json_object_get(json_object_get(edited, "metadata"), "annotations");
    if (!json_is_object(annotations))
        json_object_set_new(json_object_get(edited, "metadata"), "annotations",
                            annotations = json_object());
    json_object_set_new(annotations, "gpuguard.io/charge", json_string("123"));
    /* Untouched and filled, the pod's spec; edited and in validate, the edited pod's.  (A
     * filled table writes its members in the order Lua keeps them, not the JSON's.) */
    json_t *want[2] = {spec_of_pod(pod), spec_of_pod(edited)};
    size_t failures = 0;
    for (size_t i = 0; i < 4; i++) {
        json_t *got = spec_of_text(seen[i], strlen(seen[i]));
        if (!want[i / 2] || !got || !json_equal(want[i / 2], got)) {
            char *text = want[i / 2] ? json_dumps(want[i / 2], JSON_COMPACT) : NULL;
            print_error("%s: the key %s (%s) does not hold the spec %s\n", name, seen[i], stages[i],
                        text ? text : "(none)");
            free(text);
            failures++;
        }
        json_decref(got);
    }
    json_decref(want[0]);
    json_decref(want[1]);
    json_decref(edited);
    dr_result_clear(&res);
    return failures;
}

/* An engine on lua/ whose one policy is text, in dir (a mkdtemp template). */
static struct engine *engine_with(char *dir, const char *text)
{
    char policies[64];
    one_policy(dir, policies, text);
    struct policy_paths paths = {.policies = policies, .lua = "lua", .config = NULL};
    struct engine *e = NULL;
    struct gg_err err = {{0}};
    if (engine_new(&paths, &e, &err) != GG_OK)
        fail_msg("%s", err.msg);
    return e;
}

static void test_the_key_holds_the_charge_spec_however_the_pod_is_read(void **state)
{
    (void)state;
    char dir[] = "/tmp/gg-chargekey-XXXXXX";
    struct engine *e = engine_with(dir, key_policy);

    size_t failures = 0, pods = 0, i;
    json_error_t jerr;
    json_t *table = json_load_file("tests/data/charges/pods.json", 0, &jerr), *row;
    if (!table)
        fail_msg("pods.json: %s", jerr.text);
    json_array_foreach(json_object_get(table, "pods"), i, row)
    {
        failures += check_pod(e, json_string_value(json_object_get(row, "name")),
                              json_object_get(row, "pod"));
        pods++;
    }
    json_decref(table);
    DIR *d = opendir("tests/data/reviews");
    assert_non_null(d);
    for (struct dirent *de; (de = readdir(d));) {
        char path[512];
        if (!strstr(de->d_name, ".json"))
            continue;
        snprintf(path, sizeof(path), "tests/data/reviews/%s", de->d_name);
        json_t *review = json_load_file(path, 0, &jerr);
        json_t *obj = json_object_get(json_object_get(review, "request"), "object");
        const char *kind = json_string_value(json_object_get(obj, "kind"));
        if (kind && strcmp(kind, "Pod") == 0) {
            failures += check_pod(e, de->d_name, obj);
            pods++;
        }
        json_decref(review);
    }
    closedir(d);
    assert_int_equal(failures, 0);
    assert_true(pods >= 30);
    engine_free(e);
    assert_int_equal(tmptree_remove(dir), 0);
}

/* Audits 40-gpu-quota's charge, and whether its breakdown is the one of the call before. */
static const char charge_policy[] =
    "local intent = require 'intent'\n"
    "local last\n"
    "return { name = 'charge', validate = function(req, pod, cfg)\n"
    "  local total, breakdown = intent.charge(pod, cfg, { namespace = req.namespace })\n"
    "  req:audit('milli', tostring(total))\n"
    "  req:audit('remembered', tostring(rawequal(breakdown, last)))\n"
    "  last = breakdown\n"
    "end }\n";

/* "milli/remembered" as the policy audited them for a pod naming ns/t. */
static void expect_charge(struct engine *e, const char *want)
{
    json_t *pod =
        json_pack("{s:s,s:s,s:{s:s,s:s},s:{s:[{s:s,s:s}],s:[{s:s}]}}", "apiVersion", "v1", "kind",
                  "Pod", "metadata", "name", "p", "namespace", "ns", "spec", "resourceClaims",
                  "name", "g", "resourceClaimTemplateName", "t", "containers", "name", "c");
    struct dr_options o = {.namespace = "ns"};
    struct dr_result res;
    struct gg_err err = {{0}};
    if (dr_evaluate(e, pod, &o, &res, &err) != GG_OK)
        fail_msg("%s", err.msg);
    char got[64];
    snprintf(got, sizeof(got), "%s/%s",
             json_string_value(json_object_get(res.audit, "charge.milli")),
             json_string_value(json_object_get(res.audit, "charge.remembered")));
    assert_string_equal(got, want);
    dr_result_clear(&res);
    json_decref(pod);
}

static void test_a_dra_pod_is_remembered_while_its_dra_objects_stay(void **state)
{
    (void)state;
    char dir[] = "/tmp/gg-chargekey-XXXXXX";
    struct engine *e = engine_with(dir, charge_policy);
    struct inventory *inv = inv_new();
    engine_set_inventory(e, inv);
    charging_template(inv, "ns", "t", 1);
    expect_charge(e, "1000/false");
    expect_charge(e, "1000/true");
    charging_template(inv, "ns", "t", 3); /* the template changed: worked out again */
    expect_charge(e, "3000/false");
    expect_charge(e, "3000/true");
    engine_set_inventory(e, NULL);
    engine_free(e);
    inv_free(inv);
    assert_int_equal(tmptree_remove(dir), 0);
}

/* A fetcher whose API server never answers; it counts the GETs. */
static int gets;

static json_t *unanswered(void *ctx, const char *kind, const char *ns, const char *name,
                          int64_t deadline_us, struct gg_err *err)
{
    (void)ctx, (void)kind, (void)ns, (void)name, (void)deadline_us;
    gets++;
    gg_fail(err, GG_ERR_IO, "the API server did not answer in time");
    return NULL;
}

/* Charges twice in one call: the second from what intent keeps of the claims for the request,
 * reading no DRA object itself. */
static const char twice_policy[] =
    "local intent = require 'intent'\n"
    "return { name = 'charge', validate = function(req, pod, cfg)\n"
    "  intent.charge(pod, cfg, { namespace = req.namespace })\n"
    "  local total, msg = intent.charge(pod, cfg, { namespace = req.namespace })\n"
    "  req:audit('milli', tostring(total) .. ' ' .. tostring(msg))\n"
    "end }\n";

static void test_a_charge_of_an_unknown_template_is_never_remembered(void **state)
{
    (void)state;
    char dir[] = "/tmp/gg-chargekey-XXXXXX";
    struct engine *e = engine_with(dir, twice_policy);
    struct inventory *inv = inv_new();
    engine_set_inventory(e, inv);
    inv_set_fetcher(inv, unanswered, NULL);
    gets = 0;
    json_t *pod =
        json_pack("{s:s,s:s,s:{s:s,s:s},s:{s:[{s:s,s:s}],s:[{s:s}]}}", "apiVersion", "v1", "kind",
                  "Pod", "metadata", "name", "p", "namespace", "ns", "spec", "resourceClaims",
                  "name", "g", "resourceClaimTemplateName", "gone", "containers", "name", "c");
    for (int i = 1; i <= 2; i++) {
        struct dr_options o = {.namespace = "ns"};
        struct dr_result res;
        struct gg_err err = {{0}};
        if (dr_evaluate(e, pod, &o, &res, &err) != GG_OK)
            fail_msg("%s", err.msg);
        const char *got = json_string_value(json_object_get(res.audit, "charge.milli"));
        assert_non_null(strstr(got, "did not answer"));
        dr_result_clear(&res);
        assert_int_equal(gets, i); /* asked again: the failure was not kept */
    }
    json_decref(pod);
    inv_set_fetcher(inv, NULL, NULL);
    engine_set_inventory(e, NULL);
    engine_free(e);
    inv_free(inv);
    assert_int_equal(tmptree_remove(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_key_holds_the_charge_spec_however_the_pod_is_read),
        cmocka_unit_test(test_a_dra_pod_is_remembered_while_its_dra_objects_stay),
        cmocka_unit_test(test_a_charge_of_an_unknown_template_is_never_remembered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
