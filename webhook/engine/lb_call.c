/*
 * lb_call.c - running Lua under the budgets: a protected call whose
 * message handler places the error (the policy's line first) and adds the
 * traceback, loading a policy file under the name it was read by (its
 * declaration and configuration check), and running a Lua test file.
 */
#include "engine/lb_internal.h"
#include "engine/sanitize.h"
#include "util/clock.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Where an error is placed.  Lua begins a message with the chunk and line
 * that raised it.  When that is a library module's line (lua/k8s.lua, a
 * helper refusing what a policy asked of it), the message leads with the
 * policy's own line, the innermost on the stack, and keeps the library's
 * after it:
 *
 *     /etc/gpuguard/policies/20-team.lua:7: lua/k8s.lua:114: the object is read-only ...
 *
 * A file that is not a library module's counts as the policy's: a policy
 * file, a Lua test file.  A policy built into gpuguard (the charge model,
 * named [string "charge"]) does not: the library's line is the one to read
 * there.  A message is left as it is when it names no library line, when no
 * policy frame is on the stack (a library loaded on its own, a helper a
 * policy left through a tail call, `return k8s.f(...)`, or one more than
 * POLICY_FRAME_DEPTH frames down), for an error object that is not a string
 * and for a budget's kill.
 */

/* Library modules load as "@lua/<name>.lua" (lb_sandbox.c, l_require), whatever --lua names. */
#define LIBRARY_DIR "lua/"
#define LIBRARY_EXT ".lua"
/* Frames looked at for the policy's line (lua_getstack walks from the top for each level):
 * far more than a library helper's calls, far less than a runaway recursion's. */
#define POLICY_FRAME_DEPTH 512

/* Whether the n bytes at name are the name of one of the VM's library modules. */
static bool is_module(const struct lb_vm *vm, const char *name, size_t n)
{
    for (size_t i = 0; i < vm->n_modules; i++)
        if (strlen(vm->modules[i].name) == n && memcmp(vm->modules[i].name, name, n) == 0)
            return true;
    return false;
}

/* Whether a chunk name (without its '@') is a library module's, "lua/k8s.lua". */
static bool is_library_chunk(const struct lb_vm *vm, const char *chunk)
{
    size_t n = strlen(chunk), dir = strlen(LIBRARY_DIR), ext = strlen(LIBRARY_EXT);
    return n > dir + ext && strncmp(chunk, LIBRARY_DIR, dir) == 0 &&
           strcmp(chunk + n - ext, LIBRARY_EXT) == 0 && is_module(vm, chunk + dir, n - dir - ext);
}

/* Whether msg begins with a library module's position, "lua/k8s.lua:688: ". */
static bool names_library_line(const struct lb_vm *vm, const char *msg)
{
    static const char name_chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                     "0123456789_-";
    size_t dir = strlen(LIBRARY_DIR), ext = strlen(LIBRARY_EXT);
    if (strncmp(msg, LIBRARY_DIR, dir) != 0)
        return false;
    const char *name = msg + dir;
    size_t n = strspn(name, name_chars);
    const char *line = name + n + ext;
    if (!n || strncmp(name + n, LIBRARY_EXT ":", ext + 1) != 0 || !is_module(vm, name, n))
        return false;
    size_t digits = strspn(line + 1, "0123456789");
    return digits && strncmp(line + 1 + digits, ": ", 2) == 0;
}

/* The innermost frame on the stack that runs a file other than the library's; false if none. */
static bool policy_frame(lua_State *L, const struct lb_vm *vm, lua_Debug *ar)
{
    for (int level = 1; level <= POLICY_FRAME_DEPTH && lua_getstack(L, level, ar); level++)
        if (lua_getinfo(L, "Sl", ar) && ar->source[0] == '@' && ar->currentline > 0 &&
            !is_library_chunk(vm, ar->source + 1))
            return true;
    return false;
}

/* In protected mode: the position (light userdata, a C string) before the message. */
static int prepend_position(lua_State *L)
{
    lua_pushstring(L, lua_touserdata(L, 1));
    lua_insert(L, 2);
    lua_concat(L, 2);
    return 1;
}

/* The message at the top of the stack, led by the policy's line when a library raised it. */
static void place_in_policy(lua_State *L)
{
    struct lb_vm *vm = lb_vm_of(L);
    const char *msg = lua_tostring(L, -1);
    lua_Debug ar;
    if (vm->kill != LB_DONE || !msg || !names_library_line(vm, msg) || !policy_frame(L, vm, &ar))
        return;
    char pos[LUA_IDSIZE + 24];
    snprintf(pos, sizeof(pos), "%s:%d: ", ar.short_src, ar.currentline);
    if (!lua_checkstack(L, 3))
        return;
    /* The new message is not the policy's to pay for: with the VM at its memory cap the
     * allocation fails without a kill, and the message stays as it was. */
    bool running = vm->running;
    vm->running = false;
    lua_pushcfunction(L, prepend_position);
    lua_pushlightuserdata(L, pos);
    lua_pushvalue(L, -3);
    if (lua_pcall(L, 2, 1, 0) == LUA_OK)
        lua_replace(L, -2);
    else
        lua_pop(L, 1);
    vm->running = running;
}

/* The error and where it was raised; an error of megabytes is cut, as a denial is. */
static int traceback_handler(lua_State *L)
{
    size_t len;
    lua_settop(L, 1);
    if (lua_type(L, 1) == LUA_TSTRING)
        place_in_policy(L);
    const char *msg = lua_tolstring(L, 1, &len);
    if (!msg) {
        msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    } else if (len > LB_REPORT_TEXT_MAX) {
        size_t keep = sanitize_prefix(msg, len, LB_REPORT_TEXT_MAX, SIZE_MAX);
        char mark[64];
        snprintf(mark, sizeof(mark), SANITIZE_CUT_MARK, len - keep);
        lua_pushlstring(L, msg, keep);
        lua_pushstring(L, mark);
        lua_concat(L, 2);
        msg = lua_tostring(L, -1);
    }
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/*
 * Call the function below nargs arguments under the budgets.  On failure
 * err gets the error's first line and *traceback the whole text.
 */
enum lb_outcome lb_protected_call(struct lb_vm *vm, int nargs, struct gg_err *err, char **traceback)
{
    lua_State *L = vm->L;
    int base = lua_gettop(L) - nargs;
    lua_pushcfunction(L, traceback_handler);
    lua_insert(L, base);
    vm->running = true;
    int st = lua_pcall(L, nargs, 0, base);
    vm->running = false;
    enum lb_outcome outcome = LB_DONE;
    /* A kill fails the call even when it returned: a policy ending in
     * `return pcall(f)` catches the kill's error in its own pcall and runs no
     * instruction after it for the hook to raise the error again. */
    if (st != LUA_OK || vm->kill != LB_DONE) {
        outcome = vm->kill != LB_DONE ? vm->kill : st == LUA_ERRMEM ? LB_OUT_OF_MEMORY : LB_RAISED;
        if (outcome == LB_OUT_OF_MEMORY)
            vm->broken = true;
        const char *text = st != LUA_OK ? lua_tostring(L, -1) : lb_kill_message(vm->kill);
        if (!text)
            text = "(no message)";
        if (traceback)
            *traceback = strdup(text);
        size_t first = strcspn(text, "\n");
        if (vm->kill != LB_DONE)
            gg_fail(err, GG_ERR_POLICY, "%s", lb_kill_message(vm->kill));
        else
            gg_fail(err, GG_ERR_POLICY, "%.*s", (int)first, text);
    }
    lua_settop(L, base - 1);
    return outcome;
}

/* The declarative fields of the policy table at the top of the stack. */
static enum gg_status read_decl(lua_State *L, const char *file, struct lb_policy_info *info,
                                struct gg_err *err)
{
    static const char *const fields[] = {"name",  "description", "mode",     "failure",
                                         "match", "config",      "severity", "remember"};
    int t = lua_gettop(L);
    json_t *decl = json_object();
    if (!decl)
        return gg_fail(err, GG_ERR_NOMEM, "%s: out of memory", file);
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (lua_getfield(L, t, fields[i]) != LUA_TNIL) {
            json_t *v = NULL;
            struct gg_err sub = {{0}};
            if (lua_istable(L, -1) && lb_infer_shape(L, lua_absindex(L, -1)) == -2 &&
                !lua_getmetatable(L, -1))
                v = json_object(); /* `match = {}`: nothing to restrict */
            else if (lb_lua_to_json(L, -1, &v, &sub) != GG_OK) {
                json_decref(decl);
                return gg_fail(err, GG_ERR_INVALID, "%s: field %s: %s", file, fields[i], sub.msg);
            }
            if (json_object_set_new(decl, fields[i], v) != 0) {
                json_decref(decl);
                return gg_fail(err, GG_ERR_NOMEM, "%s: out of memory", file);
            }
        }
        lua_pop(L, 1);
    }
    lua_getfield(L, t, "mutate");
    lua_getfield(L, t, "validate");
    info->has_mutate = lua_isfunction(L, -2);
    info->has_validate = lua_isfunction(L, -1);
    lua_pop(L, 2);
    info->decl = decl;
    return GG_OK;
}

/*
 * Load src under chunkname and run it once under the load-time budgets (a
 * policy file, a test file).  On success its result is on the stack; on
 * failure err has the file name and the error's first line, and the stack
 * is as it was.
 */
static enum gg_status run_file(struct lb_vm *vm, const char *chunkname, const struct lb_source *src,
                               struct gg_err *err)
{
    lua_State *L = vm->L;
    int top = lua_gettop(L);
    if (lb_load_chunk(L, chunkname, src->text, src->len) != LUA_OK) {
        gg_fail(err, GG_ERR_POLICY, "%s", lua_tostring(L, -1));
        lua_settop(L, top);
        return GG_ERR_POLICY;
    }
    lua_pushcfunction(L, traceback_handler);
    lua_insert(L, -2);
    lb_budget_open(vm, gg_now_us() + vm->limits.load_time_us);
    vm->running = true;
    int st = lua_pcall(L, 0, 1, -2);
    vm->running = false;
    lb_budget_close(vm);
    if (st != LUA_OK || vm->kill != LB_DONE) { /* a kill fails it even if it returned */
        const char *text = vm->kill != LB_DONE ? lb_kill_message(vm->kill) : lua_tostring(L, -1);
        gg_fail(err, GG_ERR_POLICY, "%s: %.*s", src->name, (int)strcspn(text, "\n"), text);
        lua_settop(L, top);
        return GG_ERR_POLICY;
    }
    lua_remove(L, -2); /* the message handler */
    return GG_OK;
}

/* lb_policy_load's arguments and result, for load_protected. */
struct load_call {
    struct lb_vm *vm;
    const struct lb_source *src;
    const char *path;
    struct lb_policy_info *info;
    struct gg_err *err;
    enum gg_status st;
};

static enum gg_status policy_load(struct lb_vm *vm, const struct lb_source *src, const char *path,
                                  struct lb_policy_info *info, struct gg_err *err);

static int load_protected(lua_State *L)
{
    struct load_call *c = lua_touserdata(L, 1);
    lua_settop(L, 0);
    c->st = policy_load(c->vm, c->src, c->path, c->info, c->err);
    return 0;
}

/* Reading the declaration makes strings, which raise on a failed allocation:
 * the load runs under lua_pcall, and such a failure refuses the policy. */
enum gg_status lb_policy_load_file(struct lb_vm *vm, const struct lb_source *src, const char *path,
                                   struct lb_policy_info *info, struct gg_err *err)
{
    memset(info, 0, sizeof(*info));
    struct load_call c = {vm, src, path, NULL, err, GG_ERR_NOMEM};
    c.info = info;
    lua_pushcfunction(vm->L, load_protected);
    lua_pushlightuserdata(vm->L, &c);
    if (lua_pcall(vm->L, 1, 0, 0) != LUA_OK) {
        c.st = gg_fail(err, GG_ERR_NOMEM, "%s: %s", src->name,
                       lua_tostring(vm->L, -1) ? lua_tostring(vm->L, -1) : "out of memory");
        lua_pop(vm->L, 1);
        lb_policy_info_clear(info);
    }
    return c.st;
}

enum gg_status lb_policy_load(struct lb_vm *vm, const struct lb_source *src,
                              struct lb_policy_info *info, struct gg_err *err)
{
    return lb_policy_load_file(vm, src, NULL, info, err);
}

static enum gg_status policy_load(struct lb_vm *vm, const struct lb_source *src, const char *path,
                                  struct lb_policy_info *info, struct gg_err *err)
{
    lua_State *L = vm->L;
    int top = lua_gettop(L);
    /* "@path": Lua names the file as given; a bare name is shown as [string "name"]. */
    if (path)
        lua_pushfstring(L, "@%s", path);
    else
        lua_pushstring(L, src->name);
    int chunkname = lua_gettop(L);
    if (run_file(vm, lua_tostring(L, chunkname), src, err) != GG_OK) {
        lua_settop(L, top);
        return GG_ERR_POLICY;
    }
    lua_remove(L, chunkname);
    if (!lua_istable(L, -1)) {
        gg_fail(err, GG_ERR_POLICY, "%s: must return a table (got %s)", src->name,
                luaL_typename(L, -1));
        lua_settop(L, top);
        return GG_ERR_POLICY;
    }
    enum gg_status gst = read_decl(L, src->name, info, err);
    if (gst == GG_OK && lua_getfield(L, -1, "check") == LUA_TFUNCTION) {
        lua_getfield(L, LUA_REGISTRYINDEX, "gpuguard.config");
        struct gg_err sub = {{0}};
        lb_budget_open(vm, gg_now_us() + vm->limits.load_time_us);
        enum lb_outcome outcome = lb_protected_call(vm, 1, &sub, NULL);
        lb_budget_close(vm);
        if (outcome != LB_DONE) {
            const char *name = json_string_value(json_object_get(info->decl, "name"));
            gst = gg_fail(err, GG_ERR_POLICY, "policy %s: configuration check failed: %s",
                          name ? name : src->name, sub.msg);
        }
    } else if (gst == GG_OK) {
        lua_pop(L, 1);
    }
    if (gst != GG_OK) {
        lb_policy_info_clear(info);
        lua_settop(L, top);
        return gst;
    }
    lb_push_registry(L, &lb_key_policies);
    lua_pushvalue(L, -2);
    lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
    lua_settop(L, top);
    return GG_OK;
}

void lb_policy_info_clear(struct lb_policy_info *info)
{
    if (!info)
        return;
    json_decref(info->decl);
    memset(info, 0, sizeof(*info));
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(json_string_value(*(json_t *const *)a), json_string_value(*(json_t *const *)b));
}

enum gg_status lb_run_tests(struct lb_vm *vm, const struct lb_source *src, json_t **results,
                            struct gg_err *err)
{
    lua_State *L = vm->L;
    int top = lua_gettop(L);
    char chunkname[256];
    snprintf(chunkname, sizeof(chunkname), "@%s", src->name);
    struct gg_err sub = {{0}};
    if (run_file(vm, chunkname, src, err) != GG_OK)
        return GG_ERR_POLICY;
    if (!lua_istable(L, -1)) {
        gg_fail(err, GG_ERR_POLICY, "%s: must return a table of test functions", src->name);
        lua_settop(L, top);
        return GG_ERR_POLICY;
    }
    int tests = lua_gettop(L);
    json_t *names = json_array();
    lua_pushnil(L);
    while (lua_next(L, tests)) {
        if (lua_type(L, -2) == LUA_TSTRING && lua_isfunction(L, -1))
            json_array_append_new(names, json_string(lua_tostring(L, -2)));
        lua_pop(L, 1);
    }
    size_t n = json_array_size(names);
    json_t **sorted = calloc(n + 1, sizeof(*sorted));
    for (size_t i = 0; i < n; i++)
        sorted[i] = json_array_get(names, i);
    qsort(sorted, n, sizeof(*sorted), compare_names);
    json_t *out = json_array();
    for (size_t i = 0; i < n && !vm->broken; i++) {
        const char *name = json_string_value(sorted[i]);
        lua_getfield(L, tests, name);
        memset(&sub, 0, sizeof(sub));
        lb_budget_open(vm, gg_now_us() + vm->limits.load_time_us);
        enum lb_outcome o = lb_protected_call(vm, 0, &sub, NULL);
        lb_budget_close(vm);
        json_array_append_new(out, json_pack("{s:s,s:b,s:s?}", "name", name, "ok", o == LB_DONE,
                                             "error", o == LB_DONE ? NULL : sub.msg));
    }
    free(sorted);
    json_decref(names);
    lua_settop(L, top);
    *results = out;
    return GG_OK;
}
