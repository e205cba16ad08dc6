/*
 * lua_tests.c - run Lua test files (tests/lua/test_*.lua) in the real
 * policy sandbox, with `require` resolving in the Lua library directory
 * and then in a directory of test modules that does not ship.
 *
 *   lua_tests [--lua DIR] [--test-lib DIR] [--config FILE] FILE...
 *
 * Prints "ok - file: name" or "not ok - file: name: error" per test and a
 * closing "N passed, M failed"; exits 1 when any test failed or a file did
 * not load, 2 on bad usage or when the modules cannot be read.
 */
#include "engine/config.h"
#include "engine/luabridge.h"
#include "engine/policy.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char usage[] =
    "usage: lua_tests [--lua DIR] [--test-lib DIR] [--config FILE] FILE...\n"
    "\n"
    "Runs each Lua test FILE (a chunk returning a table of name -> function) in the\n"
    "policy sandbox, under the request budgets of the configuration; a test fails\n"
    "by raising an error.\n"
    "\n"
    "  --lua DIR       the Lua library directory: its *.lua files are the modules\n"
    "                  that require finds [lua]\n"
    "  --test-lib DIR  a directory of test modules (shared assertions and fixtures)\n"
    "                  that require finds after the library's; they load like library\n"
    "                  modules (text chunks, read-only, the same budgets).  A module\n"
    "                  name present in both directories, or named gpuguard, is refused:\n"
    "                  a test module never stands in for a library module [none]\n"
    "  --config FILE   the configuration file handed to the tests as gpuguard.config\n"
    "                  and whose limits are the budgets [none: defaults]\n"
    "  -h, --help      this text\n";

/* dir must be a directory: say which option named it and why not. */
static bool check_dir(const char *option, const char *dir)
{
    struct stat st;
    if (stat(dir, &st) != 0) {
        fprintf(stderr, "lua_tests: %s %s: %s\n", option, dir, strerror(errno));
        return false;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "lua_tests: %s %s: not a directory\n", option, dir);
        return false;
    }
    return true;
}

/*
 * The library's modules, then the test modules of test_dir (none when
 * NULL), in one array the caller frees with policy_free_sources.
 */
static bool read_modules(const char *lua_dir, const char *test_dir, struct lb_source **out,
                         size_t *n_out)
{
    struct gg_err err = {{0}};
    struct lb_source *lib = NULL, *test = NULL;
    size_t n_lib = 0, n_test = 0;
    if (policy_read_sources(lua_dir, true, &lib, &n_lib, &err) != GG_OK ||
        (test_dir && policy_read_sources(test_dir, true, &test, &n_test, &err) != GG_OK)) {
        fprintf(stderr, "lua_tests: %s\n", err.msg);
        policy_free_sources(lib, n_lib);
        return false;
    }
    for (size_t i = 0; i < n_test; i++) {
        const char *name = test[i].name;
        bool builtin = strcmp(name, "gpuguard") == 0, in_lib = false;
        for (size_t j = 0; j < n_lib; j++)
            in_lib = in_lib || strcmp(name, lib[j].name) == 0;
        if (builtin || in_lib) {
            if (builtin)
                fprintf(stderr,
                        "lua_tests: --test-lib %s: %s.lua has the name of the built-in "
                        "module gpuguard; rename it\n",
                        test_dir, name);
            else
                fprintf(stderr,
                        "lua_tests: --test-lib %s: %s.lua has the name of the library "
                        "module %s/%s.lua; a test module cannot stand in for it: rename it\n",
                        test_dir, name, lua_dir, name);
            policy_free_sources(lib, n_lib);
            policy_free_sources(test, n_test);
            return false;
        }
    }
    struct lb_source *all = n_test ? realloc(lib, (n_lib + n_test + 1) * sizeof(*all)) : lib;
    if (!all) {
        fprintf(stderr, "lua_tests: out of memory\n");
        policy_free_sources(lib, n_lib);
        policy_free_sources(test, n_test);
        return false;
    }
    if (n_test) {
        memcpy(all + n_lib, test, n_test * sizeof(*test));
        memset(all + n_lib + n_test, 0, sizeof(*all)); /* the closing empty entry */
    }
    free(test); /* its names and texts now belong to all */
    *out = all;
    *n_out = n_lib + n_test;
    return true;
}

int main(int argc, char **argv)
{
    static const struct option long_options[] = {
        {"lua", required_argument, NULL, 'l'},
        {"test-lib", required_argument, NULL, 't'},
        {"config", required_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *lua_dir = "lua", *test_dir = NULL, *config_path = NULL;
    int opt;
    while ((opt = getopt_long(argc, argv, "h", long_options, NULL)) != -1) {
        if (opt == 'l')
            lua_dir = optarg;
        else if (opt == 't')
            test_dir = optarg;
        else if (opt == 'c')
            config_path = optarg;
        else if (opt == 'h') {
            fputs(usage, stdout);
            return 0;
        } else {
            fprintf(stderr, "%.*s(lua_tests --help tells more)\n",
                    (int)(strchr(usage, '\n') - usage + 1), usage);
            return 2;
        }
    }
    if (!check_dir("--lua", lua_dir) || (test_dir && !check_dir("--test-lib", test_dir)))
        return 2;
    struct gg_err err = {{0}};
    json_t *config = NULL;
    struct cfg_limits limits;
    if (cfg_load(config_path, &config, &err) != GG_OK || cfg_limits(config, &limits, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        json_decref(config);
        return 2;
    }
    size_t n_modules = 0;
    struct lb_source *modules = NULL;
    if (!read_modules(lua_dir, test_dir, &modules, &n_modules)) {
        json_decref(config);
        return 2;
    }
    struct lb_limits lb = {limits.memory, limits.instructions, limits.timeout_us};
    int passed = 0, failed = 0;
    for (int i = optind; i < argc; i++) {
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
