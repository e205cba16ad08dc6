/*
 * lb_request.c - one request in a VM: the req table policies get, calls of
 * their mutate and validate, what they report (within the LB_REPORT_
 * limits), the object rebuilt when a call's edits are dropped, and the
 * clean-up after.
 */
#include "engine/lb_internal.h"
#include "engine/sanitize.h"
#include "util/jsonfast.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char key_req_proxy;     /* req: one read-only proxy per VM */
static const char key_req_shadow_mt; /* its shadows' metatable: lazy fields */
static const char key_weak_values;   /* the frozen proxy caches' metatable */

#define FROZEN_CACHE_SIZE 64  /* at least: what the shipped policies read of a pod */
#define FROZEN_CACHE_MAX 4096 /* at most: a huge object must not size every later cache */

/*
 * req is one read-only proxy per VM that each request points at a new
 * shadow (see lb_ro_point).  user, old_object and options are converted
 * when a policy first reads them, by the shadow's __index: the shipped
 * policies never do, and building their read-only views every request was
 * a third of a request's set-up.
 */
static const struct {
    const char *key, *what;
    size_t offset;
} lazy_req_fields[] = {
    {"user", "userInfo", offsetof(struct adm_request, user_info)},
    {"old_object", "the old object", offsetof(struct adm_request, old_object)},
    {"options", "the options", offsetof(struct adm_request, options)},
};

static const struct jf_node *req_json(const struct adm_request *req, size_t i)
{
    return *(const struct jf_node *const *)((const char *)req + lazy_req_fields[i].offset);
}

/* The shadow's __index (shadow, key): convert a lazy field once. */
static int req_field(lua_State *L)
{
    const struct adm_request *req = lb_vm_of(L)->req;
    if (!req || lua_type(L, 2) != LUA_TSTRING)
        return 0;
    const char *key = lua_tostring(L, 2);
    for (size_t i = 0; i < sizeof(lazy_req_fields) / sizeof(lazy_req_fields[0]); i++) {
        if (strcmp(key, lazy_req_fields[i].key) != 0)
            continue;
        if (!req_json(req, i))
            return 0;
        lb_push_node_or_raise(L, req_json(req, i), lazy_req_fields[i].what);
        lb_push_readonly(L, -1);
        lua_pushvalue(L, 2);
        lua_pushvalue(L, -2);
        lua_rawset(L, 1);
        return 1;
    }
    return 0;
}

/* pairs(req) lists the lazy fields too. */
static int req_pairs(lua_State *L)
{
    for (size_t i = 0; i < sizeof(lazy_req_fields) / sizeof(lazy_req_fields[0]); i++) {
        lua_getfield(L, 1, lazy_req_fields[i].key);
        lua_pop(L, 1);
    }
    return lb_ro_pairs(L);
}

/* The req proxy, its shadows' metatable and the caches' metatable, made once per VM. */
void lb_request_open(lua_State *L)
{
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "v");
    lua_setfield(L, -2, "__mode");
    lua_rawsetp(L, LUA_REGISTRYINDEX, &key_weak_values);
    lua_newtable(L);
    lua_pushcfunction(L, req_field);
    lua_setfield(L, -2, "__index");
    lua_rawsetp(L, LUA_REGISTRYINDEX, &key_req_shadow_mt);
    lua_newtable(L); /* the proxy */
    lb_push_ro_metatable(L, req_pairs);
    lua_setmetatable(L, -2);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &key_req_proxy);
}

/* Point the req proxy at the shadow on the top of the stack (popped); push the proxy. */
static void push_req_proxy(lua_State *L)
{
    int shadow = lua_gettop(L);
    lb_push_registry(L, &key_req_shadow_mt);
    lua_setmetatable(L, shadow);
    lb_push_registry(L, &key_req_proxy);
    lb_ro_point(L, -1, shadow);
    lua_replace(L, shadow);
}

void lb_report_clear(struct lb_report *report)
{
    if (!report)
        return;
    json_decref(report->denials);
    json_decref(report->warnings);
    json_decref(report->audit);
    memset(report, 0, sizeof(*report));
}

/* The current call's report; a part that cannot be made stays NULL (appends then fail). */
static struct lb_report *current_report(lua_State *L)
{
    struct lb_report *r = &lb_vm_of(L)->report;
    if (!r->denials)
        r->denials = json_array();
    if (!r->warnings)
        r->warnings = json_array();
    if (!r->audit)
        r->audit = json_object();
    return r;
}

/* The VM's memory a kept string of len bytes is counted as (jansson's value around it too). */
static size_t held_bytes(size_t len)
{
    return len + 64;
}

/* Messages must be valid UTF-8: they end up in JSON. */
static const char *checked_text(lua_State *L, int idx, const char *what, size_t *len)
{
    const char *s = luaL_checklstring(L, idx, len);
    if (!jf_utf8_valid(s, *len))
        luaL_error(L, "%s is not valid UTF-8", what);
    return s;
}

/*
 * s[0..len) cut to max bytes (SANITIZE_CUT_MARK), as a string the report
 * holds against the VM's memory; NULL when it does not fit or is out of
 * memory.
 */
static json_t *kept_string(struct lb_vm *vm, const char *s, size_t len, size_t max)
{
    size_t n = len;
    char *cut = len > max ? sanitize_cut(s, len, max, &n) : NULL;
    const char *text = len > max ? cut : s;
    json_t *v = NULL;
    if (text && lb_budget_hold(vm, held_bytes(n))) {
        v = json_stringn_nocheck(text, n);
        if (v)
            vm->report_held += held_bytes(n);
        else
            lb_budget_release(vm, held_bytes(n));
    }
    free(cut);
    return v;
}

/*
 * A denial that cannot be recorded fails the call even when pcall catches
 * the error.  Past LB_REPORT_DENIALS_MAX bytes (the first always fits) a
 * denial is counted instead: the review is denied all the same.
 */
static int l_req_deny(lua_State *L)
{
    struct lb_vm *vm = lb_vm_of(L);
    bool lost = vm->report_lost;
    vm->report_lost = true;
    size_t len;
    const char *s = checked_text(L, 2, "req:deny message", &len);
    struct lb_report *r = current_report(L);
    size_t n = len < LB_REPORT_TEXT_MAX ? len : LB_REPORT_TEXT_MAX;
    if (json_array_size(r->denials) > 0 && vm->report_denied + n > LB_REPORT_DENIALS_MAX) {
        r->denials_left_out++;
    } else {
        json_t *msg = kept_string(vm, s, len, LB_REPORT_TEXT_MAX);
        if (!msg || json_array_append_new(r->denials, msg) != 0)
            return luaL_error(L, "req:deny: out of memory recording the denial");
        vm->report_denied += json_string_length(msg);
    }
    vm->report_lost = lost;
    return 0;
}

static int l_req_warn(lua_State *L)
{
    size_t len;
    const char *s = checked_text(L, 2, "req:warn message", &len);
    struct lb_report *r = current_report(L);
    if (json_array_size(r->warnings) >= LB_REPORT_WARNINGS) {
        r->warnings_left_out++;
        return 0;
    }
    json_t *msg = kept_string(lb_vm_of(L), s, len, LB_REPORT_TEXT_MAX);
    if (!msg || json_array_append_new(r->warnings, msg) != 0)
        return luaL_error(L, "req:warn: not enough memory");
    return 0;
}

/* Only the start of a key can reach the annotation (sanitize_audit_key). */
static int l_req_audit(lua_State *L)
{
    struct lb_vm *vm = lb_vm_of(L);
    size_t klen, len;
    const char *key = luaL_checklstring(L, 2, &klen);
    const char *s = checked_text(L, 3, "req:audit value", &len);
    struct lb_report *r = current_report(L);
    char k[LB_REPORT_KEY_MAX + 1];
    snprintf(k, sizeof(k), "%.*s", (int)(klen < LB_REPORT_KEY_MAX ? klen : LB_REPORT_KEY_MAX), key);
    json_t *old = json_object_get(r->audit, k);
    if (!old && json_object_size(r->audit) >= LB_REPORT_AUDIT) {
        r->audit_left_out++;
        return 0;
    }
    json_t *value = kept_string(vm, s, len, LB_REPORT_TEXT_MAX);
    if (!value)
        return luaL_error(L, "req:audit: not enough memory");
    size_t replaced = old ? held_bytes(json_string_length(old)) : 0;
    if (json_object_set_new(r->audit, k, value) != 0)
        return luaL_error(L, "req:audit: not enough memory");
    lb_budget_release(vm, replaced);
    vm->report_held -= replaced;
    return 0;
}

/* The call's report leaves the VM: its bytes no longer count against the memory. */
static void report_handed_over(struct lb_vm *vm)
{
    lb_budget_release(vm, vm->report_held);
    vm->report_held = vm->report_denied = 0;
}

static void set_string(lua_State *L, const char *key, const char *value)
{
    lua_pushstring(L, value ? value : "");
    lua_setfield(L, -2, key);
}

static int build_request(lua_State *L)
{
    const struct adm_request *req = lua_touserdata(L, 1);
    const struct jf_node *object = lua_touserdata(L, 2);
    lua_settop(L, 0);
    /* The object and the lazy fields sit at depth 3 of a review: no walk
     * when the decoder saw nothing deeper than the limit below them. */
    if (!req->depth || req->depth > LB_MAX_DEPTH + 3) {
        if (object && lb_too_deep(object, 0))
            luaL_error(L, "the object nests deeper than %d levels", LB_MAX_DEPTH);
        for (size_t i = 0; i < sizeof(lazy_req_fields) / sizeof(lazy_req_fields[0]); i++)
            if (lb_too_deep(req_json(req, i), 0))
                luaL_error(L, "%s nests deeper than %d levels", lazy_req_fields[i].what,
                           LB_MAX_DEPTH);
    }
    /* This request's frozen proxies (a proxy nobody holds may go), sized
     * for what policies read of the last request's object: growing it step
     * by step (a rehash at each power of two) cost more. */
    struct lb_vm *vm = lb_vm_of(L);
    int size =
        vm->frozen_cache_hint < FROZEN_CACHE_SIZE ? FROZEN_CACHE_SIZE : vm->frozen_cache_hint;
    lua_createtable(L, 0, size < FROZEN_CACHE_MAX ? size : FROZEN_CACHE_MAX);
    lb_push_registry(L, &key_weak_values);
    lua_setmetatable(L, -2);
    vm->frozen_cache_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    vm->frozen_made = 0;
    if (object)
        lb_push_lazy(L, object);
    else
        lua_pushnil(L);
    lua_pushvalue(L, -1);
    lb_freeze(L); /* what validate gets */
    static const luaL_Reg methods[] = {
        {"deny", l_req_deny}, {"warn", l_req_warn}, {"audit", l_req_audit}, {NULL, NULL}};
    lua_createtable(L, 0, 13);
    luaL_setfuncs(L, methods, 0);
    set_string(L, "uid", req->uid);
    set_string(L, "operation", adm_operation_name(req->operation));
    set_string(L, "namespace", req->namespace);
    set_string(L, "name", req->name);
    set_string(L, "kind", req->kind);
    set_string(L, "group", req->group);
    set_string(L, "sub_resource", req->sub_resource);
    lua_pushboolean(L, req->dry_run);
    lua_setfield(L, -2, "dry_run");
    lua_pushboolean(L, req->background);
    lua_setfield(L, -2, "background");
    if (req->template_path) { /* nil for a Pod under review */
        lua_pushstring(L, req->template_path);
        lua_setfield(L, -2, "template");
    }
    push_req_proxy(L);
    /* Here, in protected mode: luaL_ref allocates. */
    vm->req_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    vm->frozen_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    vm->obj_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

enum gg_status lb_request_begin(struct lb_vm *vm, const struct adm_request *req,
                                const struct jf_node *object, int64_t deadline_us,
                                struct gg_err *err)
{
    lua_State *L = vm->L;
    lb_request_end(vm);
    vm->req = req;
    vm->read_dra = vm->dra_unknown = false;
    lua_pushcfunction(L, build_request);
    lua_pushlightuserdata(L, (void *)req);
    lua_pushlightuserdata(L, (void *)object);
    if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
        enum gg_status st = gg_fail(err, GG_ERR_INVALID, "%s", lua_tostring(L, -1));
        lua_pop(L, 1);
        lb_request_end(vm); /* the stubs made so far go with the request */
        return st;
    }
    lb_budget_open(vm, deadline_us);
    return GG_OK;
}

enum lb_outcome lb_policy_call(struct lb_vm *vm, int index, enum lb_phase phase,
                               struct lb_report *report, struct gg_err *err, char **traceback)
{
    lua_State *L = vm->L;
    memset(report, 0, sizeof(*report));
    if (traceback)
        *traceback = NULL;
    vm->call_pure = true;
    if (vm->broken) {
        gg_fail(err, GG_ERR_POLICY, "the Lua VM was stopped earlier in this request");
        return LB_RAISED;
    }
    lb_push_registry(L, &lb_key_policies);
    lua_rawgeti(L, -1, index + 1);
    lua_getfield(L, -1, phase == LB_MUTATE ? "mutate" : "validate");
    lua_replace(L, -3);
    lua_pop(L, 1);
    if (!lua_isfunction(L, -1)) {
        lua_pop(L, 1);
        return LB_DONE;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, vm->req_ref);
    lua_rawgeti(L, LUA_REGISTRYINDEX, phase == LB_VALIDATE ? vm->frozen_ref : vm->obj_ref);
    lua_getfield(L, LUA_REGISTRYINDEX, "gpuguard.config");
    /* One budget for the whole request, opened by lb_request_begin. */
    vm->report_lost = false;
    enum lb_outcome outcome = lb_protected_call(vm, 3, err, traceback);
    if (outcome == LB_DONE && vm->report_lost) {
        outcome = LB_RAISED;
        gg_fail(err, GG_ERR_POLICY, "a req:deny call failed and the policy went on");
    }
    *report = vm->report;
    memset(&vm->report, 0, sizeof(vm->report));
    report_handed_over(vm);
    return outcome;
}

bool lb_call_was_pure(const struct lb_vm *vm)
{
    return vm->call_pure && !vm->dra_unknown;
}

bool lb_call_read_dra(const struct lb_vm *vm)
{
    return vm->read_dra;
}

/* lb_request_rewind's work, in protected mode (the stub and the view allocate). */
static int rewind_object(lua_State *L)
{
    struct lb_vm *vm = lb_vm_of(L);
    const struct jf_node *object = lua_touserdata(L, 1);
    lua_settop(L, 0);
    lb_push_lazy(L, object);
    lua_pushvalue(L, -1);
    lb_freeze(L);
    lua_rawseti(L, LUA_REGISTRYINDEX, vm->frozen_ref);
    lua_rawseti(L, LUA_REGISTRYINDEX, vm->obj_ref);
    return 0;
}

/*
 * A new table, not the old one refilled: what a library remembers of the
 * old one by its view (workload.lua's answers) may come from the dropped
 * edits, and is worked out afresh.
 */
enum gg_status lb_request_rewind(struct lb_vm *vm, const struct jf_node *object, struct gg_err *err)
{
    lua_State *L = vm->L;
    lua_pushcfunction(L, rewind_object);
    lua_pushlightuserdata(L, (void *)object);
    if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        enum gg_status st = gg_fail(err, GG_ERR_NOMEM, "%s", msg ? msg : "out of memory");
        lua_pop(L, 1);
        return st;
    }
    return GG_OK;
}

/* Growth past twice the settled size plus this triggers a full collection. */
#define GC_SLACK (4u << 20)

/* A full collection: what is left is the settled size, and the base of the next minor step. */
static void collect_all(struct lb_vm *vm)
{
    lua_gc(vm->L, LUA_GCCOLLECT);
    vm->mem_settled = vm->mem_collected = vm->mem;
}

void lb_request_end(struct lb_vm *vm)
{
    lb_budget_close(vm);
    vm->req = NULL;
    lb_stubs_end(vm); /* stubs kept past the request must not reach its JSON */
    luaL_unref(vm->L, LUA_REGISTRYINDEX, vm->obj_ref);
    luaL_unref(vm->L, LUA_REGISTRYINDEX, vm->req_ref);
    luaL_unref(vm->L, LUA_REGISTRYINDEX, vm->frozen_ref);
    luaL_unref(vm->L, LUA_REGISTRYINDEX, vm->frozen_cache_ref);
    vm->obj_ref = vm->req_ref = vm->frozen_ref = vm->frozen_cache_ref = LUA_NOREF;
    if (vm->frozen_made)
        vm->frozen_cache_hint = vm->frozen_made;
    vm->frozen_made = 0;
    lb_report_clear(&vm->report);
    report_handed_over(vm);
    /* A big object (a 10 MB annotation) is copied into the VM, and once the
     * generational collector has aged the copy only a major collection frees
     * it, which may not come for thousands of requests: each worker's VM
     * would keep its largest request's garbage.  Collect it now instead. */
    if (vm->mem > 2 * vm->mem_settled + GC_SLACK)
        collect_all(vm);
}

bool lb_vm_collect(struct lb_vm *vm)
{
    /* The generational collector's schedule at Lua's default multipliers: a
     * major collection once the heap has doubled since the last one, a
     * minor one once it has grown by a fifth since the last collection.  On
     * its own the collector waits for twice that growth (lb_vm_new), so a
     * request that stays under a fifth of the heap is rarely paused. */
    if (vm->mem > 2 * vm->mem_settled) {
        collect_all(vm);
    } else if (vm->mem > vm->mem_collected + vm->mem_collected / 5) {
        lua_gc(vm->L, LUA_GCSTEP, 0);
        vm->mem_collected = vm->mem;
    } else {
        return false;
    }
    return true;
}
