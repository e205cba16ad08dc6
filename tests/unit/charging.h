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

struct charging {
    struct engine *engine;
    struct charger *charger;
};

static inline void charging_start(struct charging *c, struct inventory *inv, const char *policies,
                                  const char *config)
{
    struct policy_paths paths = {.policies = policies, .lua = "lua", .config = config};
    struct gg_err err = {{0}};
    if (engine_new(&paths, &c->engine, &err) != GG_OK ||
        charger_new(c->engine, inv, &c->charger, &err) != GG_OK)
        fail_msg("the charge model does not load: %s", err.msg);
}

/* inv_charge of a jansson value, through its nodes, as the inventory charges what it reads. */
static inline int64_t charge_of(struct inventory *inv, const json_t *obj)
{
    struct jf_doc doc;
    if (jf_from_json(obj, &doc) != 0)
        fail_msg("out of memory");
    int64_t charge = inv_charge(inv, doc.root);
    jf_doc_free(&doc);
    return charge;
}

static inline void charging_stop(struct charging *c)
{
    charger_free(c->charger);
    engine_free(c->engine);
}

#endif
