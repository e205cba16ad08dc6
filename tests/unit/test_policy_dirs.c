/*
 * test_policy_dirs.c - the engine over several policy directories (policy_paths.more_policies):
 * the files of all of them in one name order, policies.disabled dropping a policy from the set,
 * a reload seeing a file added to a later directory, and the bound on the directories, which
 * the command line stops before the engine (engine_opts.c) but a caller of the API may not.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/policy.h"
#include "tmptree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A scratch tree: dirs a and b for policies, lua for the (empty) library. */
struct tree {
    char root[32], a[48], b[48], lua[48], config[64];
};

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A policy file named name that only warns. */
static void write_policy(const char *dir, const char *file, const char *name)
{
    char text[160];
    snprintf(text, sizeof(text),
             "return { name = '%s', validate = function(req, pod) req:warn('ran') end }\n", name);
    write_file(dir, file, text);
}

static int tree_setup(void **state)
{
    struct tree *t = calloc(1, sizeof(*t));
    if (!t)
        return -1;
    *state = t;
    snprintf(t->root, sizeof(t->root), "/tmp/gg-dirs-XXXXXX");
    if (!mkdtemp(t->root))
        return -1;
    snprintf(t->a, sizeof(t->a), "%s/a", t->root);
    snprintf(t->b, sizeof(t->b), "%s/b", t->root);
    snprintf(t->lua, sizeof(t->lua), "%s/lua", t->root);
    snprintf(t->config, sizeof(t->config), "%s/gpuguard.yaml", t->root);
    if (mkdir(t->a, 0700) || mkdir(t->b, 0700) || mkdir(t->lua, 0700))
        return -1;
    write_policy(t->a, "10-one.lua", "one");
    write_policy(t->a, "30-three.lua", "three");
    write_policy(t->b, "05-zero.lua", "zero");
    write_policy(t->b, "20-two.lua", "two");
    return 0;
}

static int tree_teardown(void **state)
{
    struct tree *t = *state;
    int rc = tmptree_remove(t->root);
    free(t);
    return rc;
}

/* The live set's policy names, joined with spaces, into out. */
static void live_names(struct engine *e, char *out, size_t size)
{
    struct policy_set *set = engine_live_set(e);
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < policy_set_count(set) && used < size; i++)
        used += (size_t)snprintf(out + used, size - used, "%s%s", i ? " " : "",
                                 policy_set_name(set, i));
    policy_set_release(set);
}

/* The engine of directories a and b, with config (NULL: none). */
static struct engine *engine_of(const struct tree *t, const char *config)
{
    const char *more[] = {t->b};
    struct policy_paths paths = {t->a, t->lua, config, more, 1};
    struct engine *e = NULL;
    struct gg_err err = {{0}};
    if (engine_new(&paths, &e, &err) != GG_OK)
        fail_msg("%s", err.msg);
    return e;
}

static void test_the_files_of_both_directories_run_in_one_name_order(void **state)
{
    struct tree *t = *state;
    struct engine *e = engine_of(t, NULL);
    char names[128];
    live_names(e, names, sizeof(names));
    assert_string_equal(names, "zero one two three");
    const char *dirs[POLICY_MAX_DIRS];
    assert_int_equal(policy_dirs(engine_paths(e), dirs), 2);
    assert_string_equal(dirs[0], t->a);
    assert_string_equal(dirs[1], t->b);
    engine_free(e);
}

static void test_a_disabled_policy_leaves_the_set(void **state)
{
    struct tree *t = *state;
    write_file(t->root, "gpuguard.yaml", "policies:\n  disabled: [two, zero]\n");
    struct engine *e = engine_of(t, t->config);
    char names[128];
    live_names(e, names, sizeof(names));
    assert_string_equal(names, "one three");
    engine_free(e);
}

static void test_a_reload_sees_a_file_added_to_the_second_directory(void **state)
{
    struct tree *t = *state;
    struct engine *e = engine_of(t, NULL);
    struct gg_err err = {{0}};
    write_policy(t->b, "25-late.lua", "late");
    assert_int_equal(engine_reload(e, &err), GG_OK);
    char names[128];
    live_names(e, names, sizeof(names));
    assert_string_equal(names, "zero one two late three");
    write_policy(t->b, "10-one.lua", "again"); /* a file name of the first directory */
    assert_int_equal(engine_reload(e, &err), GG_ERR_INVALID);
    char want[256];
    snprintf(want, sizeof(want),
             "%s/10-one.lua and %s/10-one.lua: the same file name in two policy directories; "
             "rename one",
             t->a, t->b);
    assert_string_equal(err.msg, want);
    assert_int_equal(engine_generation(e), 2); /* the last good set serves */
    engine_free(e);
}

static void test_more_than_16_directories_are_refused(void **state)
{
    struct tree *t = *state;
    const char *more[POLICY_MAX_DIRS];
    for (size_t i = 0; i < POLICY_MAX_DIRS; i++)
        more[i] = t->b;
    struct policy_paths paths = {t->a, t->lua, NULL, more, POLICY_MAX_DIRS};
    struct engine *e = NULL;
    struct gg_err err = {{0}};
    assert_int_equal(engine_new(&paths, &e, &err), GG_ERR_INVALID);
    assert_string_equal(err.msg, "17 policy directories: at most 16");
    assert_null(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_the_files_of_both_directories_run_in_one_name_order,
                                        tree_setup, tree_teardown),
        cmocka_unit_test_setup_teardown(test_a_disabled_policy_leaves_the_set, tree_setup,
                                        tree_teardown),
        cmocka_unit_test_setup_teardown(test_a_reload_sees_a_file_added_to_the_second_directory,
                                        tree_setup, tree_teardown),
        cmocka_unit_test_setup_teardown(test_more_than_16_directories_are_refused, tree_setup,
                                        tree_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
