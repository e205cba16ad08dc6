/*
 * charger.c - the inventory's charges through lua/intent.lua, in a VM of
 * its own.
 *
 * The VM holds the library and configuration of the engine's live set and
 * one built-in policy whose mutate hands intent.usage_charge's answer back
 * as an audit value (mutate, not validate: a trimmed pod is given its kind,
 * and validate sees the object read-only): the engine's ordinary request
 * path, with no second way into Lua.  A reload (a new set generation) rebuilds the VM before the
 * next charge.
 */
#include "engine/charger.h"
#include "util/clock.h"

#include "codec/admission.h"
#include "kube/inventory.h"
#include "util/log.h"
#include "engine/luabridge.h"
#include "engine/policy.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHARGE_DEADLINE_US 1000000 /* per object; the model is a few table walks */

static const char charge_policy[] =
    "local intent = require 'intent'\n"
    "return { name = 'charge', description = 'what the inventory counts',\n"
    "  mutate = function(req, obj, cfg)\n"
    "    if obj.kind == nil then obj.kind, obj.apiVersion = 'Pod', 'v1' end -- a trimmed pod\n"
    "    req:audit('charge', tostring(intent.usage_charge(obj, cfg)))\n"
    "  end }\n";

struct charger {
    pthread_mutex_t lock;
    struct engine *engine;
    struct inventory *inv;
    uint64_t generation; /* of the set vm was built from; 0: none yet */
    struct lb_vm *vm;
};

/* A VM for the engine's live set, unless the one held is for it already. */
static enum gg_status refresh(struct charger *c, struct gg_err *err)
{
    uint64_t gen = engine_generation(c->engine);
    if (c->vm && gen == c->generation && !lb_vm_broken(c->vm))
        return GG_OK;
    struct policy_set *set = engine_live_set(c->engine);
    struct lb_vm *vm = NULL;
    enum gg_status st = policy_set_library_vm(set, c->inv, &vm, err);
    struct lb_source src = {"charge", (char *)charge_policy, sizeof(charge_policy) - 1};
    struct lb_policy_info info = {0};
    if (st == GG_OK)
        st = lb_policy_load(vm, &src, &info, err);
    lb_policy_info_clear(&info);
    policy_set_release(set);
    if (st != GG_OK) {
        lb_vm_free(vm);
        return st;
    }
    lb_vm_free(c->vm);
    c->vm = vm;
    c->generation = gen;
    return GG_OK;
}

enum gg_status charger_new(struct engine *engine, struct inventory *inv, struct charger **out,
                           struct gg_err *err)
{
    struct charger *c = calloc(1, sizeof(*c));
    if (!c)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&c->lock, NULL);
    c->engine = engine;
    c->inv = inv;
    enum gg_status st = refresh(c, err);
    if (st != GG_OK) {
        charger_free(c);
        return st;
    }
    inv_set_charger(inv, charger_charge, c);
    *out = c;
    return GG_OK;
}

void charger_free(struct charger *c)
{
    if (!c)
        return;
    inv_set_charger(c->inv, NULL, NULL);
    lb_vm_free(c->vm);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* One GPU per container that names a GPU-looking resource ("/" and "gpu"), at least one. */
static int64_t worst_case(const struct jf_node *obj)
{
    int64_t n = 0;
    static const char *const lists[] = {"containers", "initContainers"};
    static const char *const sections[] = {"limits", "requests"};
    const struct jf_node *spec = jf_get_str(obj, "spec");
    for (size_t l = 0; l < 2; l++) {
        const struct jf_node *list = jf_get_str(spec, lists[l]);
        for (uint32_t i = 0; list && list->type == JF_ARRAY && i < list->n; i++) {
            const struct jf_node *res = jf_get_str(&list->u.items[i], "resources");
            bool gpu = false;
            for (size_t s = 0; s < 2; s++) {
                const struct jf_node *names = jf_get_str(res, sections[s]);
                for (uint32_t k = 0; names && names->type == JF_OBJECT && k < names->n; k++)
                    gpu = gpu || (strchr(names->u.items[k].key, '/') &&
                                  strstr(names->u.items[k].key, "gpu"));
            }
            n += gpu;
        }
    }
    return (n ? n : 1) * 1000;
}

int64_t charger_charge(void *charger, const struct jf_node *obj)
{
    struct charger *c = charger;
    struct gg_err err = {{0}};
    const char *kind = jf_string(jf_get_str(obj, "kind"));
    struct adm_request req = {.api_version = "",
                              .uid = "",
                              .operation = ADM_CREATE,
                              .kind = kind ? kind : "Pod",
                              .group = "",
                              .namespace = "",
                              .name = "",
                              .sub_resource = "",
                              .object = obj};
    struct lb_report report = {0};
    int64_t charge = -1;
    pthread_mutex_lock(&c->lock);
    if (refresh(c, &err) == GG_OK &&
        lb_request_begin(c->vm, &req, obj, gg_now_us() + CHARGE_DEADLINE_US, &err) == GG_OK) {
        if (lb_policy_call(c->vm, 0, LB_MUTATE, &report, &err, NULL) == LB_DONE) {
            const char *text = json_string_value(json_object_get(report.audit, "charge"));
            char *end = NULL;
            long long v = text ? strtoll(text, &end, 10) : -1;
            charge = text && *text && !*end && v >= 0 ? v : -1;
        }
        lb_request_end(c->vm);
    }
    pthread_mutex_unlock(&c->lock);
    lb_report_clear(&report);
    if (charge >= 0)
        return charge;
    const char *name = jf_string(jf_get_str(jf_get_str(obj, "metadata"), "name"));
    log_fields(LOG_ERROR, "inventory: the charge model failed; counting whole GPUs",
               json_pack("{s:s,s:s}", "error", err.msg, "name", name ? name : ""));
    return worst_case(obj);
}
