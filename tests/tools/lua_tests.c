/*
 * lua_tests.c - run Lua test files (tests/lua/test_*.lua) in the real
 * policy sandbox, with `require` resolving in the Lua library directory.
 *
 *   lua_tests --lua DIR [--config FILE] FILE...
 *
 * Prints "ok - file: name" or "not ok - file: name: error" per test and a
 * closing "N passed, M failed"; exits 1 when any test failed or a file did
 * not load.
 */
#include "engine/config.h"
#include "engine/luabridge.h"
#include "engine/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    const char *lua_dir = "lua", *config_path = NULL;
    int first = 1;
    for (; first + 1 < argc && argv[first][0] == '-'; first += 2) {
        if (strcmp(argv[first], "--lua") == 0)
            lua_dir = argv[first + 1];
        else if (strcmp(argv[first], "--config") == 0)
            config_path = argv[first + 1];
    }
    struct gg_err err = {{0}};
    json_t *config = NULL;
    struct cfg_limits limits;
    if (cfg_load(config_path, &config, &err) != GG_OK || cfg_limits(config, &limits, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    size_t n_modules = 0;
    struct lb_source *modules = NULL;
    if (policy_read_sources(lua_dir, true, &modules, &n_modules, &err) != GG_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    struct lb_limits lb = {limits.memory, limits.instructions, limits.timeout_us};
    int passed = 0, failed = 0;
    for (int i = first; i < argc; i++) {
        struct lb_source src = {.name = argv[i]};
        struct lb_vm *vm = NULL;
        json_t *results = NULL;
        if (gg_read_file(argv[i], 1 << 20, &src.text, &src.len, &err) != GG_OK ||
            lb_vm_new(&lb, modules, n_modules, config, NULL, &vm, &err) != GG_OK ||
            lb_run_tests(vm, &src, &results, &err) != GG_OK) {
            printf("not ok - %s: %s\n", argv[i], err.msg);
            failed++;
        }
        size_t j;
        json_t *r;
        json_array_foreach(results, j, r)
        {
            const char *name = json_string_value(json_object_get(r, "name"));
            if (json_is_true(json_object_get(r, "ok"))) {
                printf("ok - %s: %s\n", argv[i], name);
                passed++;
            } else {
                printf("not ok - %s: %s: %s\n", argv[i], name,
                       json_string_value(json_object_get(r, "error")));
                failed++;
            }
        }
        json_decref(results);
        lb_vm_free(vm);
        free(src.text);
    }
    printf("%d passed, %d failed\n", passed, failed);
    policy_free_sources(modules, n_modules);
    json_decref(config);
    return failed ? 1 : 0;
}
