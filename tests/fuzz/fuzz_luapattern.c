/*
 * fuzz_luapattern.c - differential libFuzzer target: gpuguard's pattern
 * functions (luapattern.c, installed as string.find, match, gmatch and gsub
 * in the policy sandbox) against the stock Lua 5.4 string library.
 *
 * The input picks init, gsub's count and replacement, a pattern and a
 * subject (any bytes).  The same Lua function calls find (patterned and
 * plain), match, gmatch, gsub with a string, a function and a table, and
 * match through the string metatable, each straight from pcall (so no
 * message gets a chunk's position), and encodes every result and error
 * message; it runs in a sandboxed VM (the subject and pattern reach it hex
 * encoded in the request's object) and in a plain lua_State with the stock
 * library.  The two texts must be equal.  Inputs the sandbox stops with its
 * budget (catastrophic backtracking) are skipped: the stock library would
 * run them for hours.
 */
#include "engine/luabridge.h"
#include "util/clock.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_PATTERN 32
#define MAX_SUBJECT 64

/* run(s, p, repl, init, n): every pattern function's results, encoded. */
#define RUN_SRC                                                                                    \
    "local function enc(v)\n"                                                                      \
    "  local t = type(v)\n"                                                                        \
    "  if t == 'string' then\n"                                                                    \
    "    local h = {}\n"                                                                           \
    "    for i = 1, #v do h[i] = string.format('%02x', string.byte(v, i)) end\n"                   \
    "    return 's' .. table.concat(h)\n"                                                          \
    "  elseif t == 'table' then\n"                                                                 \
    "    local h = {}\n"                                                                           \
    "    for i = 1, #v do h[i] = enc(v[i]) end\n"                                                  \
    "    return '{' .. table.concat(h, ',') .. '}'\n"                                              \
    "  end\n"                                                                                      \
    "  return t .. tostring(v)\n"                                                                  \
    "end\n"                                                                                        \
    "local function all(...)\n"                                                                    \
    "  local h = {}\n"                                                                             \
    "  for i = 1, select('#', ...) do h[i] = enc((select(i, ...))) end\n"                          \
    "  return table.concat(h, ' ')\n"                                                              \
    "end\n"                                                                                        \
    "return function(s, p, r, init, n)\n"                                                          \
    "  local out = {}\n"                                                                           \
    "  out[1] = all(pcall(string.find, s, p, init))\n"                                             \
    "  out[2] = all(pcall(string.find, s, p, init, true))\n"                                       \
    "  out[3] = all(pcall(string.match, s, p, init))\n"                                            \
    "  out[4] = (function()\n"                                                                     \
    "    local ok, it = pcall(string.gmatch, s, p, init)\n"                                        \
    "    if not ok then return all(ok, it) end\n"                                                  \
    "    local h = {}\n"                                                                           \
    "    for k = 1, 65 do\n"                                                                       \
    "      h[k] = all(pcall(it))\n"                                                                \
    "      if h[k] == 'booleantrue' or string.sub(h[k], 1, 12) == 'booleanfalse' then break end\n" \
    "    end\n"                                                                                    \
    "    return table.concat(h, '|')\n"                                                            \
    "  end)()\n"                                                                                   \
    "  out[5] = all(pcall(string.gsub, s, p, r, n))\n"                                             \
    "  out[6] = all(pcall(string.gsub, s, p, function(...)\n"                                      \
    "    if select('#', ...) > 2 then return false end\n"                                          \
    "    return select('#', ...) .. enc((...))\n"                                                  \
    "  end))\n"                                                                                    \
    "  out[7] = all(pcall(string.gsub, s, p, { a = 'A', ['1'] = 'one', x = false }))\n"            \
    "  out[8] = all(pcall(s.match, s, p))\n"                                                       \
    "  return table.concat(out, '\\n')\n"                                                          \
    "end\n"

static char policy_name[] = "fuzz.lua";
static char policy_text[] =
    "local run = (function()\n" RUN_SRC "end)()\n"
    "local function unhex(h)\n"
    "  local t = {}\n"
    "  for i = 1, #h, 2 do\n"
    "    t[#t + 1] = string.char(tonumber(string.sub(h, i, i + 1), 16))\n"
    "  end\n"
    "  return table.concat(t)\n"
    "end\n"
    "return {\n"
    "  name = 'fuzz',\n"
    "  validate = function(req, obj)\n"
    "    req:warn(run(unhex(obj.s), unhex(obj.p), unhex(obj.r), obj.i, obj.n))\n"
    "  end,\n"
    "}\n";

/* gsub replacement strings, valid and not. */
static const char *const replacements[] = {"%0", "<%1>", "%2", "x%%",  "%",    "%z",
                                           "%9", "%1%2", "",   "[%0]", "%1%1", "-"};

static void check(int ok, const char *what, const struct gg_err *err)
{
    if (!ok) {
        fprintf(stderr, "fuzz_luapattern: %s%s%s\n", what, err ? ": " : "", err ? err->msg : "");
        abort();
    }
}

/* The sandbox, a new one after a budget broke it. */
static struct lb_vm *sandbox(void)
{
    static struct lb_vm *vm;
    static const struct lb_limits limits = {
        .memory = 64u << 20, .instructions = 2000000, .load_time_us = 2000000};
    if (vm && !lb_vm_broken(vm))
        return vm;
    lb_vm_free(vm);
    vm = NULL;
    struct gg_err err = {{0}};
    check(lb_vm_new(&limits, NULL, 0, NULL, NULL, &vm, &err) == GG_OK, "lb_vm_new failed", &err);
    struct lb_source src = {.name = policy_name, .text = policy_text, .len = strlen(policy_text)};
    struct lb_policy_info info;
    check(lb_policy_load(vm, &src, &info, &err) == GG_OK, "the policy does not load", &err);
    lb_policy_info_clear(&info);
    return vm;
}

/* The stock library, with run() in the registry. */
static lua_State *stock(void)
{
    static lua_State *L;
    if (L)
        return L;
    L = luaL_newstate();
    luaL_openlibs(L);
    check(luaL_loadstring(L, RUN_SRC) == LUA_OK && lua_pcall(L, 0, 1, 0) == LUA_OK,
          "run() does not load in the stock library", NULL);
    lua_setfield(L, LUA_REGISTRYINDEX, "run");
    return L;
}

static json_t *hex(const uint8_t *p, size_t n)
{
    char text[2 * MAX_SUBJECT + 1];
    for (size_t i = 0; i < n; i++)
        snprintf(text + 2 * i, 3, "%02x", p[i]);
    text[2 * n] = '\0';
    return json_string(text);
}

/* What the sandbox says, or NULL when its budget stopped it. */
static json_t *run_sandbox(json_t *object)
{
    struct lb_vm *vm = sandbox();
    struct jf_doc doc;
    check(jf_from_json(object, &doc) == 0, "out of memory", NULL);
    struct adm_request req = {.api_version = "admission.k8s.io/v1",
                              .uid = "fuzz",
                              .operation = ADM_CREATE,
                              .kind = "Pod",
                              .group = "",
                              .namespace = "fuzz",
                              .name = "",
                              .sub_resource = "",
                              .object = doc.root};
    struct gg_err err = {{0}};
    check(lb_request_begin(vm, &req, doc.root, gg_now_us() + 5000000, &err) == GG_OK,
          "lb_request_begin failed", &err);
    struct lb_report report;
    enum lb_outcome outcome = lb_policy_call(vm, 0, LB_VALIDATE, &report, &err, NULL);
    json_t *said = NULL;
    if (outcome == LB_DONE)
        said = json_incref(json_array_get(report.warnings, 0));
    else
        check(outcome != LB_RAISED, "the sandbox raised", &err);
    lb_report_clear(&report);
    lb_request_end(vm);
    jf_doc_free(&doc);
    return said;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    int init = (int8_t)data[0] % 12;
    int n = data[1] & 0x80 ? -1 : data[1] & 7; /* -1: no count */
    const char *repl = replacements[data[2] % (sizeof(replacements) / sizeof(replacements[0]))];
    size_t rest = size - 4, lp = data[3] % (MAX_PATTERN + 1);
    if (lp > rest)
        lp = rest;
    const uint8_t *p = data + 4, *s = p + lp;
    size_t ls = rest - lp > MAX_SUBJECT ? MAX_SUBJECT : rest - lp;

    json_t *object = json_pack("{s:o,s:o,s:o,s:i}", "s", hex(s, ls), "p", hex(p, lp), "r",
                               hex((const uint8_t *)repl, strlen(repl)), "i", init);
    if (n >= 0)
        json_object_set_new(object, "n", json_integer(n));
    json_t *said = run_sandbox(object);
    json_decref(object);
    if (!said)
        return 0;

    lua_State *L = stock();
    lua_getfield(L, LUA_REGISTRYINDEX, "run");
    lua_pushlstring(L, (const char *)s, ls);
    lua_pushlstring(L, (const char *)p, lp);
    lua_pushstring(L, repl);
    lua_pushinteger(L, init);
    if (n >= 0)
        lua_pushinteger(L, n);
    else
        lua_pushnil(L);
    check(lua_pcall(L, 5, 1, 0) == LUA_OK, "run() failed in the stock library", NULL);
    const char *want = lua_tostring(L, -1);
    if (strcmp(want, json_string_value(said)) != 0) {
        fprintf(stderr, "fuzz_luapattern: pattern \"%.*s\" subject \"%.*s\" init %d\n", (int)lp,
                (const char *)p, (int)ls, (const char *)s, init);
        fprintf(stderr, "stock:\n%s\ngpuguard:\n%s\n", want, json_string_value(said));
        abort();
    }
    lua_pop(L, 1);
    json_decref(said);
    return 0;
}
