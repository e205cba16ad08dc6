/*
 * test_lb_call.c - where a policy's Lua error is placed (engine/lb_call.c):
 * the policy named by the path it was read from (a built-in one as a Lua
 * string), its own line first when a library module raised on its behalf,
 * a library's error with no policy file on the stack, a budget's kill and
 * an error object that is no string left as they were, and a placement that
 * cannot get the memory for its message leaving the message as Lua made it.
 * Each case loads policies (their top level and check(cfg)) and runs
 * validate over a pod.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/luabridge.h"
#include "util/clock.h"
#include "util/jsonfast.h"

#include <stdio.h>
#include <string.h>

/* lua/helpers.lua: refuse raises at its own line 4, blame_caller at its caller's. */
static char helpers_name[] = "helpers";
static char helpers_text[] = "local M = {}\n"
                             "local gg = require 'gpuguard'\n"
                             "function M.refuse(what)\n"
                             "  error('refused ' .. what)\n"
                             "end\n"
                             "function M.blame_caller(what)\n"
                             "  error('bad ' .. what, 2)\n"
                             "end\n"
                             "function M.each(list, fn)\n"
                             "  for _, v in ipairs(list) do fn(v) end\n"
                             "end\n"
                             "function M.spin() while true do end end\n"
                             "function M.throw_table() error({}) end\n"
                             "local _ = gg\n"
                             "return M\n";
/* lua/broken.lua: raises as it loads, line 2. */
static char broken_name[] = "broken";
static char broken_text[] = "-- fails to load\nerror('broken at load')\n";

static struct lb_source modules[] = {
    {helpers_name, helpers_text, sizeof(helpers_text) - 1},
    {broken_name, broken_text, sizeof(broken_text) - 1},
    {NULL, NULL, 0},
};

static struct lb_vm *new_vm(void)
{
    static const struct lb_limits limits = {
        .memory = 32u << 20, .instructions = 10000000, .load_time_us = 2000000};
    struct lb_vm *vm = NULL;
    struct gg_err err = {{0}};
    assert_int_equal(lb_vm_new(&limits, modules, 2, NULL, NULL, &vm, &err), GG_OK);
    return vm;
}

/* Load text as the policy file p.lua read from path (NULL: a built-in policy); err has why not. */
static enum gg_status load(struct lb_vm *vm, const char *path, const char *text, struct gg_err *err)
{
    static char name[] = "p.lua";
    struct lb_source src = {name, (char *)text, strlen(text)};
    struct lb_policy_info info;
    enum gg_status st = path ? lb_policy_load_file(vm, &src, path, &info, err)
                             : lb_policy_load(vm, &src, &info, err);
    lb_policy_info_clear(&info);
    return st;
}

/* The message of a load that must fail, in a fresh VM. */
static void assert_load_fails(const char *path, const char *text, const char *message)
{
    struct lb_vm *vm = new_vm();
    struct gg_err err = {{0}};
    assert_int_equal(load(vm, path, text, &err), GG_ERR_POLICY);
    assert_string_equal(err.msg, message);
    lb_vm_free(vm);
}

static void test_a_policy_is_named_by_the_path_it_was_read_from(void **state)
{
    (void)state;
    const char *text = "local x = 1\nerror('boom')\n";
    assert_load_fails("/etc/gpuguard/policies/p.lua", text,
                      "p.lua: /etc/gpuguard/policies/p.lua:2: boom");
    assert_load_fails("tests/x/p.lua", text, "p.lua: tests/x/p.lua:2: boom");
    /* Longer than Lua's LUA_IDSIZE: "..." and the end of the path, as Lua shows any file. */
    assert_load_fails("a-directory-whose-name-is-long/and-longer-still/policies/p.lua", text,
                      "p.lua: ...ctory-whose-name-is-long/and-longer-still/policies/p.lua:2: boom");
    /* A policy gpuguard builds in, with no file: Lua's name for a chunk from a string. */
    assert_load_fails(NULL, text, "p.lua: [string \"p.lua\"]:2: boom");
    assert_load_fails("dir/p.lua", "return {", "dir/p.lua:1: unexpected symbol near <eof>");
}

static void test_a_library_error_leads_with_the_policy_line(void **state)
{
    (void)state;
    /* At the top level of the policy, and from the library's own top level loading. */
    assert_load_fails("dir/p.lua", "local h = require 'helpers'\n\nh.refuse('at load')\n",
                      "p.lua: dir/p.lua:3: lua/helpers.lua:4: refused at load");
    assert_load_fails("dir/p.lua", "local x = 1\nlocal b = require 'broken'\n",
                      "p.lua: dir/p.lua:2: lua/broken.lua:2: broken at load");
    /* The innermost policy line: a callback of the policy's that the library calls. */
    assert_load_fails("dir/p.lua",
                      "local h = require 'helpers'\n"
                      "h.each({ 1 }, function(v)\n"
                      "  h.refuse('item ' .. v)\n"
                      "end)\n",
                      "p.lua: dir/p.lua:3: lua/helpers.lua:4: refused item 1");
    /* In check(cfg), which runs in a protected call of its own. */
    struct lb_vm *vm = new_vm();
    struct gg_err err = {{0}};
    assert_int_equal(load(vm, "dir/p.lua",
                          "local h = require 'helpers'\n"
                          "return { name = 'p', validate = function() end,\n"
                          "  check = function(cfg) h.refuse('the configuration') end }\n",
                          &err),
                     GG_ERR_POLICY);
    assert_string_equal(err.msg, "policy p: configuration check failed: dir/p.lua:3: "
                                 "lua/helpers.lua:4: refused the configuration");
    lb_vm_free(vm);
}

static void test_other_errors_are_left_as_they_were(void **state)
{
    (void)state;
    /* Raised in the policy, or placed at the policy's line by the library itself (level 2). */
    assert_load_fails("dir/p.lua", "local h = require 'helpers'\nh.blame_caller('argument')\n",
                      "p.lua: dir/p.lua:2: bad argument");
    /* No policy frame left: the policy's call was a tail call. */
    assert_load_fails("dir/p.lua", "local h = require 'helpers'\nreturn h.refuse('tail')\n",
                      "p.lua: lua/helpers.lua:4: refused tail");
    /* An error object that is no string; a budget's kill inside the library. */
    assert_load_fails("dir/p.lua", "local h = require 'helpers'\nh.throw_table()\n",
                      "p.lua: (error object is a table value)");
    assert_load_fails("dir/p.lua", "local h = require 'helpers'\nh.spin()\n",
                      "p.lua: instruction budget exhausted");
    /* A policy built into gpuguard (the charge model): the library's line is the one to read. */
    assert_load_fails(NULL, "local h = require 'helpers'\nh.refuse('built in')\n",
                      "p.lua: lua/helpers.lua:4: refused built in");
    /* A message that only looks like a library's position, from a module that is not one. */
    assert_load_fails("dir/p.lua", "local x = 1\nerror('lua/nothing.lua:3: made up', 0)\n",
                      "p.lua: lua/nothing.lua:3: made up");
}

/* validate of the policy loaded first, over a pod; its outcome, err the message. */
static enum lb_outcome validate(struct lb_vm *vm, struct gg_err *err)
{
    static const char pod[] = "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":"
                              "\"p\",\"namespace\":\"ns\"},\"spec\":{\"containers\":[]}}";
    struct jf_doc doc;
    size_t deepest;
    assert_int_equal(jf_parse(pod, sizeof(pod) - 1, 0, &doc, &deepest, NULL), 0);
    struct adm_request req = {.api_version = "admission.k8s.io/v1",
                              .uid = "u",
                              .operation = ADM_CREATE,
                              .kind = "Pod",
                              .group = "",
                              .namespace = "ns",
                              .name = "p",
                              .sub_resource = "",
                              .object = doc.root};
    assert_int_equal(lb_request_begin(vm, &req, doc.root, gg_now_us() + 2000000, err), GG_OK);
    struct lb_report report;
    char *traceback = NULL;
    enum lb_outcome outcome = lb_policy_call(vm, 0, LB_VALIDATE, &report, err, &traceback);
    /* The traceback begins with the same message. */
    if (outcome == LB_RAISED)
        assert_int_equal(strncmp(traceback, err->msg, strlen(err->msg)), 0);
    free(traceback);
    lb_report_clear(&report);
    lb_request_end(vm);
    jf_doc_free(&doc);
    return outcome;
}

static void test_a_library_error_in_validate_leads_with_the_policy_line(void **state)
{
    (void)state;
    struct lb_vm *vm = new_vm();
    struct gg_err err = {{0}};
    assert_int_equal(load(vm, "rules/p.lua",
                          "local h = require 'helpers'\n"
                          "return { name = 'p', validate = function(req, pod)\n"
                          "  local name = pod.metadata.name\n"
                          "  h.refuse(name)\n"
                          "end }\n",
                          &err),
                     GG_OK);
    assert_int_equal(validate(vm, &err), LB_RAISED);
    assert_string_equal(err.msg, "rules/p.lua:4: lua/helpers.lua:4: refused p");
    /* The VM is fine for the next request. */
    assert_false(lb_vm_broken(vm));
    assert_int_equal(validate(vm, &err), LB_RAISED);
    assert_string_equal(err.msg, "rules/p.lua:4: lua/helpers.lua:4: refused p");
    lb_vm_free(vm);
}

/*
 * The placed message's length: the hook below refuses strings of about that length (an odd
 * size: Lua's other objects are whole words), for every try of the allocator (Lua collects
 * and tries again).
 */
static size_t placed_len;

static bool refuse_placed(size_t size)
{
    return (size & 1) && size > placed_len && size <= placed_len + 48;
}

static void test_no_memory_for_the_placed_message_leaves_it_as_it_was(void **state)
{
    (void)state;
    static const char placed[] = "rules/p.lua:4: lua/helpers.lua:4: refused what the policy "
                                 "asked of it, at length enough to be a string of its own!";
    placed_len = strlen(placed);
    assert_int_equal(placed_len % 2, 0); /* so that the message before it has an even size */
    struct lb_vm *vm = new_vm();
    struct gg_err err = {{0}};
    assert_int_equal(load(vm, "rules/p.lua",
                          "local h = require 'helpers'\n"
                          "return { name = 'p', validate = function(req, pod)\n"
                          "  local what = 'what the policy asked of it, at length enough to be '\n"
                          "  h.refuse(what .. 'a string of its own!')\n"
                          "end }\n",
                          &err),
                     GG_OK);
    assert_int_equal(validate(vm, &err), LB_RAISED);
    assert_string_equal(err.msg, placed);
    lb_set_alloc_hook(refuse_placed);
    enum lb_outcome outcome = validate(vm, &err);
    lb_set_alloc_hook(NULL);
    /* Still the policy's error, not a memory kill, in the library's words. */
    assert_int_equal(outcome, LB_RAISED);
    assert_string_equal(err.msg, placed + strlen("rules/p.lua:4: "));
    assert_false(lb_vm_broken(vm));
    assert_int_equal(validate(vm, &err), LB_RAISED);
    assert_string_equal(err.msg, placed);
    lb_vm_free(vm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_policy_is_named_by_the_path_it_was_read_from),
        cmocka_unit_test(test_a_library_error_leads_with_the_policy_line),
        cmocka_unit_test(test_other_errors_are_left_as_they_were),
        cmocka_unit_test(test_a_library_error_in_validate_leads_with_the_policy_line),
        cmocka_unit_test(test_no_memory_for_the_placed_message_leaves_it_as_it_was),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
