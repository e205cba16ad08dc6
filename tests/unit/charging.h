/*
 * charging.h - the real charge model for unit tests: an engine on the
 * repository's lua/ and policies/ with a configuration (run from the
 * repository's root, as make does), and its charger set on an inventory.
 */
#ifndef GG_TEST_CHARGING_H
#define GG_TEST_CHARGING_H

#include "engine/charger.h"
#include "kube/inventory.h"
#include "engine/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

struct charging {
    struct engine *engine;
    struct charger *charger;
};

/* dir (a mkdtemp template) made, holding policies/10-test.lua with text; policies (64 bytes)
 * gets that directory's path.  tmptree_remove(dir) removes it all. */
static inline void one_policy(char *dir, char *policies, const char *text)
{
    char file[96];
    assert_non_null(mkdtemp(dir));
    snprintf(policies, 64, "%s/policies", dir);
    snprintf(file, sizeof(file), "%s/10-test.lua", policies);
    assert_int_equal(mkdir(policies, 0700), 0);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* ns/name in inv: a ResourceClaimTemplate of count whole GPUs (gpu.nvidia.com). */
static inline void charging_template(struct inventory *inv, const char *ns, const char *name,
                                     json_int_t count)
{
    json_t *t = json_pack("{s:s,s:s,s:{s:s,s:s},s:{s:{s:{s:[{s:s,s:{s:s,s:s,s:I}}]}}}}",
                          "apiVersion", "resource.k8s.io/v1", "kind", "ResourceClaimTemplate",
                          "metadata", "name", name, "namespace", ns, "spec", "spec", "devices",
                          "requests", "name", "g", "exactly", "deviceClassName", "gpu.nvidia.com",
                          "allocationMode", "ExactCount", "count", count);
    inv_upsert(inv, t);
    json_decref(t);
}

static inline void charging_start(struct charging *c, struct inventory *inv, const char *policies,
                                  const char *config)
{
    struct policy_paths paths = {.policies = policies, .lua = "lua", .config = config};
    struct gg_err err = {{0}};
    if (engine_new(&paths, &c->engine, &err) != GG_OK ||
        charger_new(c->engine, inv, &c->charger, &err) != GG_OK)
        fail_msg("the charge model does not load: %s", err.msg);
}

/* The charge of a jansson value as admission's reservation takes it: a pod read as the
 * informer reads one (its charge spec), anything else (a claim, a pod the reader refuses) as
 * nodes for the model. */
static inline int64_t charge_of(struct inventory *inv, const json_t *obj)
{
    struct inf_pod pod;
    struct gg_err err = {{0}};
    const char *kind = json_string_value(json_object_get(obj, "kind"));
    inf_pod_init(&pod);
    int64_t charge = -1;
    if ((!kind || strcmp(kind, "Pod") == 0) && inf_pod_of_json(obj, &pod, &err)) {
        charge = inv_charge_pod(inv, &pod);
    } else {
        struct jf_doc doc;
        if (jf_from_json(obj, &doc) != 0)
            fail_msg("out of memory");
        charge = inv_charge(inv, doc.root);
        jf_doc_free(&doc);
    }
    inf_pod_free(&pod);
    return charge;
}

static inline void charging_stop(struct charging *c)
{
    charger_free(c->charger);
    engine_free(c->engine);
}

#endif
