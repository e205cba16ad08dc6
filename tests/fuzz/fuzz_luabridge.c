/*
 * fuzz_luabridge.c - libFuzzer target for the JSON <-> Lua bridge
 * (engine/lb_lazy.c, lb_json.c and lb_diff.c, through luabridge.h).
 *
 * The input is a JSON object, the object of an admission request.  It goes
 * through lb_request_begin into one sandboxed VM per process, in which a
 * no-op policy (it reads every table of the object, so every lazily
 * converted table is filled, but changes nothing) runs its mutate.
 * An untouched object must give an empty patch from lb_request_patch.  A
 * broken invariant aborts.
 */
#include "engine/luabridge.h"
#include "util/clock.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char noop_name[] = "noop.lua";
/* Fills every lazily converted table (pairs, #, ipairs, next), changing nothing. */
static char noop_policy[] = "-- reads the whole object, changes nothing\n"
                            "local function walk(v, depth)\n"
                            "  if type(v) ~= 'table' or depth > 120 then return end\n"
                            "  local n = #v\n"
                            "  for _, x in ipairs(v) do walk(x, depth + 1) end\n"
                            "  for _, x in pairs(v) do walk(x, depth + 1) end\n"
                            "  return n, next(v)\n"
                            "end\n"
                            "return {\n"
                            "  name = 'noop',\n"
                            "  mutate = function(req, obj, cfg)\n"
                            "    local _ = obj.metadata, obj.spec, req.uid, cfg\n"
                            "    walk(obj, 0)\n"
                            "  end,\n"
                            "}\n";

static void check(int ok, const char *what, const struct gg_err *err)
{
    if (!ok) {
        fprintf(stderr, "fuzz_luabridge: %s%s%s\n", what, err ? ": " : "", err ? err->msg : "");
        abort();
    }
}

/* The process's VM with the policy loaded; a new one after a budget broke it. */
static struct lb_vm *vm_get(void)
{
    static struct lb_vm *vm;
    static const struct lb_limits limits = {
        .memory = 64u << 20, .instructions = 1000000, .load_time_us = 2000000};
    if (vm && !lb_vm_broken(vm))
        return vm;
    lb_vm_free(vm);
    vm = NULL;
    struct gg_err err = {{0}};
    check(lb_vm_new(&limits, NULL, 0, NULL, NULL, &vm, &err) == GG_OK, "lb_vm_new failed", &err);
    struct lb_source src = {.name = noop_name, .text = noop_policy, .len = sizeof(noop_policy) - 1};
    struct lb_policy_info info;
    check(lb_policy_load(vm, &src, &info, &err) == GG_OK, "the no-op policy does not load", &err);
    check(info.has_mutate, "the no-op policy has no mutate", NULL);
    lb_policy_info_clear(&info);
    return vm;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct jf_doc doc;
    size_t deepest;
    if (jf_parse((const char *)data, size, 0, &doc, &deepest, NULL) != 0 ||
        doc.root->type != JF_OBJECT) {
        jf_doc_free(&doc);
        return 0;
    }
    const struct jf_node *object = doc.root;
    struct lb_vm *vm = vm_get();
    struct adm_request req = {.api_version = "admission.k8s.io/v1",
                              .uid = "fuzz",
                              .operation = ADM_CREATE,
                              .kind = "Pod",
                              .group = "",
                              .namespace = "fuzz",
                              .name = "",
                              .sub_resource = "",
                              .object = object};
    struct gg_err err = {{0}};
    if (lb_request_begin(vm, &req, object, gg_now_us() + 2000000, &err) == GG_OK) {
        struct lb_report report;
        enum lb_outcome outcome = lb_policy_call(vm, 0, LB_MUTATE, &report, &err, NULL);
        lb_report_clear(&report);
        if (outcome == LB_DONE) {
            json_t *patch = NULL;
            check(lb_request_patch(vm, object, &patch, &err) == GG_OK,
                  "an untouched object does not convert back", &err);
            if (json_array_size(patch) != 0) {
                char *text = json_dumps(patch, JSON_COMPACT);
                fprintf(stderr, "fuzz_luabridge: patch %s\n", text ? text : "?");
                free(text);
            }
            check(json_is_array(patch) && json_array_size(patch) == 0,
                  "an untouched object gives a patch", NULL);
            json_decref(patch);
        } else {
            /* Only a budget may stop a no-op policy (a huge object, memory). */
            check(outcome != LB_RAISED || lb_vm_broken(vm), "the no-op policy raised", &err);
        }
        lb_request_end(vm);
    }
    jf_doc_free(&doc);
    return 0;
}
