/*
 * test_charge_model.c - one charge model: every pod of tests/data/charges/pods.json (each
 * dialect, sidecars, init containers, forged annotations, DRA claims) is charged at admission
 * (intent.charge on the pod as the engine hands it to a policy, through the whole dry-run
 * review path) and by the inventory (the pod read from its JSON text as the informer trims it,
 * then charged by the charger), and both must equal the table's figure.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "charging.h"
#include "engine/dryrun.h"
#include "kube/informer.h"
#include "tmptree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DATA "tests/data/charges/"

/* The admission side: a policy that reports the charge 40-gpu-quota checks. */
static const char admission_policy[] =
    "local intent = require 'intent'\n"
    "return { name = 'charge', validate = function(req, pod, cfg)\n"
    "  local total, msg = intent.charge(pod, cfg, { namespace = req.namespace })\n"
    "  req:audit('milli', total and tostring(total) or 'error: ' .. msg)\n"
    "end }\n";

static void test_admission_and_inventory_charge_alike(void **state)
{
    (void)state;
    char dir[] = "/tmp/gg-charge-XXXXXX", policies[64];
    one_policy(dir, policies, admission_policy);

    json_error_t jerr;
    json_t *table = json_load_file(DATA "pods.json", 0, &jerr);
    if (!table)
        fail_msg("%s: %s", DATA "pods.json", jerr.text);
    struct inventory *inv = inv_new();
    struct charging model;
    charging_start(&model, inv, policies, DATA "config.yaml");
    engine_set_inventory(model.engine, inv);
    size_t i;
    json_t *obj;
    json_array_foreach(json_object_get(table, "objects"), i, obj)
    {
        json_object_set_new(json_object_get(obj, "metadata"), "namespace", json_string("ns"));
        inv_upsert(inv, obj);
    }
    json_t *row;
    size_t failures = 0;
    json_array_foreach(json_object_get(table, "pods"), i, row)
    {
        const char *name = json_string_value(json_object_get(row, "name"));
        json_int_t want = json_integer_value(json_object_get(row, "charge"));
        json_t *pod = json_object_get(row, "pod");
        json_object_set_new(json_object_get(pod, "metadata"), "namespace", json_string("ns"));

        struct dr_options o = {.namespace = "ns"};
        struct dr_result res;
        struct gg_err err = {{0}};
        if (dr_evaluate(model.engine, pod, &o, &res, &err) != GG_OK)
            fail_msg("%s: %s", name, err.msg);
        const char *admitted = json_string_value(json_object_get(res.audit, "charge.milli"));

        char *text = json_dumps(pod, JSON_COMPACT);
        json_t *trimmed = inf_read_pod(text, strlen(text), NULL, &err);
        free(text);
        if (!trimmed)
            fail_msg("%s: %s", name, err.msg);
        int64_t usage = charge_of(inv, trimmed);

        char want_text[32];
        snprintf(want_text, sizeof(want_text), "%lld", (long long)want);
        if (!admitted || strcmp(admitted, want_text) != 0 || usage != want) {
            print_error("%s: admission %s, inventory %lld, want %lld\n", name,
                        admitted ? admitted : "(none)", (long long)usage, (long long)want);
            failures++;
        }
        json_decref(trimmed);
        dr_result_clear(&res);
    }
    assert_int_equal(failures, 0);
    assert_true(json_array_size(json_object_get(table, "pods")) >= 25);
    charging_stop(&model);
    inv_free(inv);
    json_decref(table);
    assert_int_equal(tmptree_remove(dir), 0);
}

/*
 * When the model cannot answer (here its library raises), the charge is the worst case: one
 * GPU for each container naming a GPU-looking resource ("/" and "gpu"), at least one.
 */
static void test_a_failing_model_charges_the_worst_case(void **state)
{
    (void)state;
    char dir[] = "/tmp/gg-charge-XXXXXX", lua[64], policies[64], file[96];
    assert_non_null(mkdtemp(dir));
    snprintf(lua, sizeof(lua), "%s/lua", dir);
    snprintf(policies, sizeof(policies), "%s/policies", dir);
    assert_int_equal(mkdir(lua, 0700), 0);
    assert_int_equal(mkdir(policies, 0700), 0);
    snprintf(file, sizeof(file), "%s/intent.lua", lua);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs("return { usage_charge = function() error('the model is broken') end }\n", f);
    fclose(f);
    struct policy_paths paths = {.policies = policies, .lua = lua, .config = NULL};
    struct gg_err err = {{0}};
    struct engine *engine = NULL;
    struct charger *charger = NULL;
    struct inventory *inv = inv_new();
    if (engine_new(&paths, &engine, &err) != GG_OK ||
        charger_new(engine, inv, &charger, &err) != GG_OK)
        fail_msg("%s", err.msg);
    json_t *pod = json_loads(
        "{\"kind\":\"Pod\",\"metadata\":{\"name\":\"p\"},\"spec\":{\"containers\":["
        "{\"name\":\"a\",\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"2\"}}},"
        "{\"name\":\"b\",\"resources\":{\"requests\":{\"example.com/gpu-memory\":\"1\"}}},"
        "{\"name\":\"c\",\"resources\":{\"limits\":{\"cpu\":\"1\",\"gpu\":\"1\"}}},7],"
        "\"initContainers\":[{\"name\":\"i\",\"resources\":{\"requests\":"
        "{\"amd.com/gpu\":1}}}]}}",
        0, NULL);
    assert_non_null(pod);
    assert_int_equal(charge_of(inv, pod), 3000);
    json_t *plain =
        json_loads("{\"kind\":\"Pod\",\"spec\":{\"containers\":[{\"name\":\"x\"}]}}", 0, NULL);
    assert_int_equal(charge_of(inv, plain), 1000);
    json_decref(pod);
    json_decref(plain);
    charger_free(charger);
    engine_free(engine);
    inv_free(inv);
    remove(file);
    rmdir(lua);
    rmdir(policies);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admission_and_inventory_charge_alike),
        cmocka_unit_test(test_a_failing_model_charges_the_worst_case),
    };
    return cmocka_run_group_tests_name("charge model", tests, NULL, NULL);
}
