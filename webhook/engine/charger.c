/*
 * charger.c - the inventory's charges through lua/intent.lua, in a VM of
 * its own.
 *
 * The VM holds the library and configuration of the engine's live set and
 * one built-in policy whose mutate hands intent.usage_charge's answer back
 * as an audit value (mutate, not validate: a trimmed pod is given its kind,
 * and validate sees the object read-only): the engine's ordinary request
 * path, with no second way into Lua.  A reload (a new set generation)
 * rebuilds the VM before the next charge.
 *
 * A pod is charged from its charge spec (kube/infscan.h), parsed, never
 * from the pod itself, so its charge is a function of that text (and, for a
 * pod naming DRA claims, of the DRA objects it reads): the memo
 * (chargememo.h) remembers it under the text, with the DRA objects'
 * version, and forgets it all with the VM it came from.
 */
#include "engine/charger.h"
#include "engine/chargememo.h"
#include "util/clock.h"

#include "codec/admission.h"
#include "kube/informer.h"
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
    struct charge_memo *memo; /* of vm's model */
    struct charger_stats stats;
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
    cm_clear(c->memo);
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
    if (!(c->memo = cm_new())) {
        charger_free(c);
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
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
    cm_free(c->memo);
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

/* What an object the model could not charge counts: logged with its name (NULL: obj's), and
 * the worst case. */
static int64_t failed(const struct jf_node *obj, const char *name, const struct gg_err *err)
{
    if (!name)
        name = jf_string(jf_get_str(jf_get_str(obj, "metadata"), "name"));
    log_fields(LOG_ERROR, "inventory: the charge model failed; counting whole GPUs",
               json_pack("{s:s,s:s}", "error", err->msg, "name", name ? name : ""));
    return worst_case(obj);
}

/* The model's charge of obj (kind: "Pod" for a charge spec), -1 when it fails. */
static int64_t evaluate(struct charger *c, const char *kind, const struct jf_node *obj,
                        struct gg_err *err)
{
    struct adm_request req = {.api_version = "",
                              .uid = "",
                              .operation = ADM_CREATE,
                              .kind = kind,
                              .group = "",
                              .namespace = "",
                              .name = "",
                              .sub_resource = "",
                              .object = obj};
    struct lb_report report = {0};
    int64_t charge = -1;
    if (lb_request_begin(c->vm, &req, obj, gg_now_us() + CHARGE_DEADLINE_US, err) == GG_OK) {
        c->stats.evaluated++;
        if (lb_policy_call(c->vm, 0, LB_MUTATE, &report, err, NULL) == LB_DONE) {
            const char *text = json_string_value(json_object_get(report.audit, "charge"));
            char *end = NULL;
            long long v = text ? strtoll(text, &end, 10) : -1;
            charge = text && *text && !*end && v >= 0 ? v : -1;
        }
        lb_request_end(c->vm);
    }
    lb_report_clear(&report);
    return charge;
}

/* A pod's charge from its charge spec: remembered, or the model's (c->lock held; ready: the
 * model is there). */
static int64_t charge_pod(struct charger *c, const struct inf_pod *pod, bool ready,
                          struct gg_err *err)
{
    int64_t charge = -1;
    /* The version of the DRA objects a pod naming claims reads; 0 for the others. */
    uint64_t version = pod->claims ? inv_dra_version(c->inv) : 0;
    if (ready && cm_get(c->memo, pod->spec, pod->spec_len, version, &charge)) {
        c->stats.remembered++;
        return charge;
    }
    struct jf_doc spec;
    struct jf_error jerr;
    size_t deepest;
    if (jf_parse(pod->spec, pod->spec_len, 0, &spec, &deepest, &jerr) != 0) {
        jf_doc_free(&spec);
        log_fields(LOG_ERROR, "inventory: the charge model failed; counting whole GPUs",
                   json_pack("{s:s,s:s}", "error", jerr.text, "name", pod->name));
        return 1000; /* a spec that does not load: one GPU, as worst_case counts a pod without */
    }
    charge = ready ? evaluate(c, "Pod", spec.root, err) : -1;
    /* Kept unless the DRA objects moved meanwhile, or were asked of the API server. */
    if (ready && charge >= 0 && (!pod->claims || inv_dra_version(c->inv) == version))
        cm_put(c->memo, pod->spec, pod->spec_len, version, charge);
    if (charge < 0)
        charge = failed(spec.root, pod->name, err);
    jf_doc_free(&spec);
    return charge;
}

int64_t charger_charge(void *charger, const struct inf_pod *pod, const struct jf_node *obj)
{
    struct charger *c = charger;
    struct gg_err err = {{0}};
    int64_t charge = -1;
    pthread_mutex_lock(&c->lock);
    bool ready = refresh(c, &err) == GG_OK;
    if (pod) {
        charge = charge_pod(c, pod, ready, &err);
    } else { /* a claim, or a pod the informer's reader refuses: the model on it as it is */
        const char *kind = jf_string(jf_get_str(obj, "kind"));
        if ((charge = ready ? evaluate(c, kind ? kind : "Pod", obj, &err) : -1) < 0)
            charge = failed(obj, NULL, &err);
    }
    pthread_mutex_unlock(&c->lock);
    return charge;
}

struct charger_stats charger_stats(struct charger *c)
{
    pthread_mutex_lock(&c->lock);
    struct charger_stats s = c->stats;
    s.remembering = cm_entries(c->memo);
    pthread_mutex_unlock(&c->lock);
    return s;
}
