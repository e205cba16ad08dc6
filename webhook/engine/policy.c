/*
 * policy.c - policy sets, per-thread VMs, matching and verdicts.
 *
 * A set holds everything a VM is built from, read into memory once, so a
 * worker that rebuilds its VM later sees exactly the files that were
 * checked, whatever has happened on disk since.
 */
#include "engine/policy.h"
#include "engine/verdictmemo.h"
#include "engine/sanitize.h"
#include "util/clock.h"

#include "util/buf.h"
#include "engine/cfgkeys.h"
#include "engine/cfgschema.h"
#include "engine/config.h"
#include "kube/inventory.h"
#include "kube/ledger.h"
#include "kube/gpuquota.h"
#include "codec/jsonpatch.h"
#include "codec/quantity.h"
#include "util/log.h"
#include "engine/luabridge.h"
#include "util/jsonfast.h"
#include "util/metrics.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SOURCE_FILE (1024 * 1024)
#define MAX_SOURCES 256
#define PATH_MAX_SOURCE 4096 /* a source file's path, directory and name */
/* Time kept back from the API server's deadline for encoding and sending. */
#define DEADLINE_MARGIN_US 100000

struct policy {
    const char *name; /* borrowed from decl */
    int mode;         /* the file's own; config overrides at request time */
    int failure;
    json_t *decl;
    json_t *match; /* borrowed from decl; NULL matches everything */
    bool has_mutate;
    bool has_validate;
    bool remember[2]; /* by enum lb_phase: its calls are remembered by request (verdictmemo.h) */
    int metric_slot;
};

/* Where a policy file of the set was read from. */
struct origin {
    char *path; /* its directory as given (not made absolute) and its name: its Lua chunk's name */
    size_t dir; /* which directory: 0 for policy_paths.policies, then more_policies in order */
};

struct policy_set {
    atomic_int refs;
    uint64_t generation;
    json_t *config;
    struct cfg_limits limits;
    struct lb_source *modules;
    size_t n_modules;
    struct lb_source *files; /* in name order across the directories */
    struct origin *origins;  /* one per file */
    struct policy *policies; /* one per file */
    size_t n;
};

struct engine {
    struct policy_paths paths;
    pthread_mutex_t lock;
    struct policy_set *live;
    char last_reload[256];
    pthread_key_t vm_key;
    struct inventory *inventory; /* borrowed; NULL without one */
    struct ledger *ledger;       /* borrowed; NULL: no GPUQuota ledger (check, test) */
};

/* A worker thread's VM, the set it was built from, and what its policies judged. */
struct thread_vm {
    struct lb_vm *vm;
    struct policy_set *set;
    struct verdict_memo *memo; /* NULL when out of memory: nothing remembered */
};

/* ---- sets ------------------------------------------------------------- */

void policy_free_sources(struct lb_source *src, size_t n)
{
    for (size_t i = 0; src && i < n; i++) {
        free(src[i].name);
        free(src[i].text);
    }
    free(src);
}

void policy_set_release(struct policy_set *set)
{
    if (!set || atomic_fetch_sub(&set->refs, 1) != 1)
        return;
    for (size_t i = 0; set->policies && i < set->n; i++)
        json_decref(set->policies[i].decl);
    free(set->policies);
    policy_free_sources(set->modules, set->n_modules);
    for (size_t i = 0; set->origins && i < set->n; i++)
        free(set->origins[i].path);
    free(set->origins);
    policy_free_sources(set->files, set->n);
    json_decref(set->config);
    free(set);
}

size_t policy_set_count(const struct policy_set *set)
{
    return set->n;
}

const json_t *policy_set_config(const struct policy_set *set)
{
    return set->config;
}

const char *policy_set_name(const struct policy_set *set, size_t i)
{
    return set->policies[i].name;
}

/* dir/name into out (PATH_MAX_SOURCE bytes), the directory as given: not made absolute. */
static void source_path(const char *dir, const char *name, char *out)
{
    size_t n = strlen(dir);
    snprintf(out, PATH_MAX_SOURCE, "%s%s%s", dir, n && dir[n - 1] == '/' ? "" : "/", name);
}

static int lua_file(const struct dirent *d)
{
    size_t n = strlen(d->d_name);
    return d->d_name[0] != '.' && n > 4 && strcmp(d->d_name + n - 4, ".lua") == 0;
}

enum gg_status policy_read_sources(const char *dir, bool strip_ext, struct lb_source **out,
                                   size_t *n_out, struct gg_err *err)
{
    struct dirent **names = NULL;
    int n = scandir(dir, &names, lua_file, alphasort);
    if (n < 0)
        return gg_fail(err, GG_ERR_IO, "%s: cannot read the directory", dir);
    enum gg_status st = GG_OK;
    struct lb_source *src = calloc((size_t)n + 1, sizeof(*src));
    if (!src)
        st = gg_fail(err, GG_ERR_NOMEM, "%s: out of memory", dir);
    else if (n > MAX_SOURCES)
        st = gg_fail(err, GG_ERR_TOOBIG, "%s: more than %d Lua files", dir, MAX_SOURCES);
    for (int i = 0; i < n; i++) {
        if (st == GG_OK) {
            char path[PATH_MAX_SOURCE];
            source_path(dir, names[i]->d_name, path);
            st = gg_read_file(path, MAX_SOURCE_FILE, &src[i].text, &src[i].len, err);
            src[i].name = strdup(names[i]->d_name);
            if (st == GG_OK && !src[i].name)
                st = gg_fail(err, GG_ERR_NOMEM, "%s: out of memory", path);
            if (st == GG_OK && strip_ext)
                src[i].name[strlen(src[i].name) - 4] = '\0';
        }
        free(names[i]);
    }
    free(names);
    if (st != GG_OK) {
        policy_free_sources(src, (size_t)n);
        return st;
    }
    *out = src;
    *n_out = (size_t)n;
    return GG_OK;
}

size_t policy_dirs(const struct policy_paths *paths, const char *out[POLICY_MAX_DIRS])
{
    size_t n = 0;
    out[n++] = paths->policies;
    for (size_t i = 0; i < paths->n_more_policies && n < POLICY_MAX_DIRS; i++)
        out[n++] = paths->more_policies[i];
    return n;
}

/* A policy file read, before the files of all the directories are put in one order. */
struct found {
    struct lb_source src;
    size_t dir;
};

static int found_by_name(const void *a, const void *b)
{
    const struct found *x = a, *y = b;
    int c = strcmp(x->src.name, y->src.name);
    return c ? c : (x->dir > y->dir) - (x->dir < y->dir);
}

/* The policy files of directory dir (number d) after the *n of *all. */
static enum gg_status find_files(const char *dir, size_t d, struct found **all, size_t *n,
                                 struct gg_err *err)
{
    struct lb_source *src = NULL;
    size_t k = 0;
    enum gg_status st = policy_read_sources(dir, false, &src, &k, err);
    if (st != GG_OK)
        return st;
    struct found *grown = realloc(*all, (*n + k + 1) * sizeof(*grown));
    if (!grown) {
        policy_free_sources(src, k);
        return gg_fail(err, GG_ERR_NOMEM, "%s: out of memory", dir);
    }
    for (size_t i = 0; i < k; i++)
        grown[*n + i] = (struct found){src[i], d};
    free(src); /* its names and texts are in *all now */
    *all = grown;
    *n += k;
    return GG_OK;
}

/*
 * all (n files, sorted) into the set as its files, with their paths.  Two files of the same
 * name would be one file in one directory: which runs where would be a guess, so they are
 * refused.
 */
static enum gg_status take_files(struct policy_set *set, struct found *all, size_t n,
                                 const char *const *dirs, struct gg_err *err)
{
    char path[PATH_MAX_SOURCE], other[PATH_MAX_SOURCE];
    for (size_t i = 1; i < n; i++) {
        if (strcmp(all[i - 1].src.name, all[i].src.name) == 0) {
            source_path(dirs[all[i - 1].dir], all[i - 1].src.name, other);
            source_path(dirs[all[i].dir], all[i].src.name, path);
            return gg_fail(err, GG_ERR_INVALID,
                           "%s and %s: the same file name in two policy directories; rename one",
                           other, path);
        }
    }
    set->files = calloc(n + 1, sizeof(*set->files));
    set->origins = calloc(n + 1, sizeof(*set->origins));
    if (!set->files || !set->origins)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory reading the policies");
    for (; set->n < n; set->n++) {
        const struct found *f = &all[set->n];
        source_path(dirs[f->dir], f->src.name, path);
        set->files[set->n] = f->src;
        set->origins[set->n] = (struct origin){strdup(path), f->dir};
        if (!set->origins[set->n].path) {
            set->n++; /* its source is the set's: freed with it */
            return gg_fail(err, GG_ERR_NOMEM, "%s: out of memory", path);
        }
    }
    return GG_OK;
}

/* Every policy file of the directories, in name order across all of them, into the set. */
static enum gg_status read_policy_files(struct policy_set *set, const struct policy_paths *paths,
                                        struct gg_err *err)
{
    const char *dirs[POLICY_MAX_DIRS];
    size_t n_dirs = policy_dirs(paths, dirs), n = 0, taken = 0;
    struct found *all = NULL;
    enum gg_status st = GG_OK;
    for (size_t d = 0; st == GG_OK && d < n_dirs; d++)
        st = find_files(dirs[d], d, &all, &n, err);
    if (st == GG_OK && n > MAX_SOURCES)
        st = gg_fail(err, GG_ERR_TOOBIG, "the policy directories hold more than %d Lua files",
                     MAX_SOURCES);
    if (st == GG_OK) {
        qsort(all, n, sizeof(*all), found_by_name);
        st = take_files(set, all, n, dirs, err);
        taken = set->n;
    }
    for (size_t i = taken; i < n; i++) {
        free(all[i].src.name);
        free(all[i].src.text);
    }
    free(all);
    return st;
}

static bool is_string_array(const json_t *v)
{
    size_t i;
    json_t *item;
    if (!json_is_array(v))
        return false;
    json_array_foreach(v, i, item) if (!json_is_string(item)) return false;
    return true;
}

static enum gg_status check_match(const json_t *match, const char *name, struct gg_err *err)
{
    if (!match)
        return GG_OK;
    if (!json_is_object(match))
        return gg_fail(err, GG_ERR_INVALID, "policy %s: match must be a table", name);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)match, key, v)
    {
        bool ok;
        if (strcmp(key, "kinds") == 0 || strcmp(key, "operations") == 0)
            ok = is_string_array(v);
        else if (strcmp(key, "namespaces") == 0)
            ok = json_is_object(v) &&
                 (!json_object_get(v, "include") ||
                  is_string_array(json_object_get(v, "include"))) &&
                 (!json_object_get(v, "exclude") || is_string_array(json_object_get(v, "exclude")));
        else if (strcmp(key, "labels") == 0)
            ok = json_is_object(v);
        else
            return gg_fail(err, GG_ERR_INVALID,
                           "policy %s: match.%s: unknown key (kinds, operations, namespaces, "
                           "labels)",
                           name, key);
        if (!ok)
            return gg_fail(err, GG_ERR_INVALID, "policy %s: match.%s: wrong type", name, key);
    }
    return GG_OK;
}

/* A policy's config field: the top-level configuration sections of its own it reads. */
static enum gg_status check_config_field(const json_t *config, const char *name, struct gg_err *err)
{
    size_t i;
    const json_t *v;
    if (config && !json_is_array(config) && !(json_is_object(config) && !json_object_size(config)))
        return gg_fail(err, GG_ERR_INVALID,
                       "policy %s: config must be a list of configuration section names", name);
    json_array_foreach(config, i, v)
    {
        if (!json_is_string(v) || !*json_string_value(v))
            return gg_fail(err, GG_ERR_INVALID,
                           "policy %s: config[%zu] must be a configuration section name", name,
                           i + 1);
    }
    return GG_OK;
}

/* The sections the policies' config fields name, all of them, for cfgschema_check. */
static json_t *declared_sections(const struct lb_policy_info *infos, size_t n)
{
    json_t *all = json_array();
    for (size_t i = 0; all && i < n; i++)
        json_array_extend(all, json_object_get(infos[i].decl, "config"));
    return all;
}

/* The severities of policy reports (wgpolicyk8s.io and openreports.io alike). */
static bool known_severity(const char *s)
{
    static const char *const known[] = {"critical", "high", "medium", "low", "info"};
    for (size_t i = 0; s && i < sizeof(known) / sizeof(known[0]); i++)
        if (strcmp(s, known[i]) == 0)
            return true;
    return false;
}

/* The phases a policy's remember lists ("mutate", "validate"), each a function it has. */
static enum gg_status remember_of(const json_t *list, const struct lb_policy_info *info,
                                  const char *name, bool remember[2], struct gg_err *err)
{
    size_t i;
    const json_t *v;
    remember[LB_MUTATE] = remember[LB_VALIDATE] = false;
    if (list && !json_is_array(list))
        return gg_fail(err, GG_ERR_INVALID,
                       "policy %s: remember must be a list of phases, such as { \"validate\" }",
                       name);
    json_array_foreach(list, i, v)
    {
        const char *phase = json_string_value(v);
        bool mutate = phase && strcmp(phase, "mutate") == 0;
        if (!mutate && !(phase && strcmp(phase, "validate") == 0))
            return gg_fail(err, GG_ERR_INVALID,
                           "policy %s: remember[%zu]: must be \"mutate\" or \"validate\"", name,
                           i + 1);
        if (mutate ? !info->has_mutate : !info->has_validate)
            return gg_fail(err, GG_ERR_INVALID, "policy %s: remember[%zu]: it has no %s", name,
                           i + 1, phase);
        remember[mutate ? LB_MUTATE : LB_VALIDATE] = true;
    }
    return GG_OK;
}

static enum gg_status policy_from_info(struct policy *p, struct lb_policy_info *info,
                                       const char *file, struct gg_err *err)
{
    json_t *decl = info->decl;
    const char *name = json_string_value(json_object_get(decl, "name"));
    if (!gg_dns_label(name)) /* it prefixes messages and audit keys */
        return gg_fail(err, GG_ERR_INVALID,
                       "%s: name must be lowercase letters, digits and '-' (at most 63), got "
                       "\"%.64s\"",
                       file, name ? name : "");
    json_t *mode = json_object_get(decl, "mode"), *failure = json_object_get(decl, "failure");
    p->mode = mode ? cfg_mode_parse(json_string_value(mode)) : 0;
    p->failure = failure ? cfg_failure_parse(json_string_value(failure)) : 0;
    if (p->mode < 0)
        return gg_fail(err, GG_ERR_INVALID, "policy %s: mode must be enforce, warn or audit", name);
    if (p->failure < 0)
        return gg_fail(err, GG_ERR_INVALID, "policy %s: failure must be deny or allow", name);
    if (json_object_get(decl, "severity") &&
        !known_severity(json_string_value(json_object_get(decl, "severity"))))
        return gg_fail(err, GG_ERR_INVALID,
                       "policy %s: severity must be critical, high, medium, low or info", name);
    if (!info->has_mutate && !info->has_validate)
        return gg_fail(err, GG_ERR_INVALID, "policy %s: has neither mutate nor validate", name);
    enum gg_status st =
        remember_of(json_object_get(decl, "remember"), info, name, p->remember, err);
    if (st != GG_OK)
        return st;
    if ((st = check_match(json_object_get(decl, "match"), name, err)) != GG_OK)
        return st;
    if ((st = check_config_field(json_object_get(decl, "config"), name, err)) != GG_OK)
        return st;
    p->name = name;
    p->match = json_object_get(decl, "match");
    p->has_mutate = info->has_mutate;
    p->has_validate = info->has_validate;
    p->metric_slot = metrics_policy_slot(name);
    p->decl = json_incref(decl);
    return GG_OK;
}

/* A VM with every policy of the set loaded; infos are filled when non-NULL. */
static enum gg_status build_vm(const struct policy_set *set, struct inventory *inventory,
                               struct lb_policy_info *infos, struct lb_vm **out, struct gg_err *err)
{
    struct lb_limits limits = {.memory = set->limits.memory,
                               .instructions = set->limits.instructions,
                               .load_time_us = set->limits.timeout_us};
    struct lb_vm *vm = NULL;
    enum gg_status st =
        lb_vm_new(&limits, set->modules, set->n_modules, set->config, inventory, &vm, err);
    for (size_t i = 0; st == GG_OK && i < set->n; i++) {
        struct lb_policy_info info;
        st = lb_policy_load_file(vm, &set->files[i], set->origins[i].path, &info, err);
        if (st == GG_OK && infos)
            infos[i] = info;
        else
            lb_policy_info_clear(&info);
    }
    if (st != GG_OK) {
        lb_vm_free(vm);
        return st;
    }
    *out = vm;
    return GG_OK;
}

enum gg_status policy_set_library_vm(const struct policy_set *set, struct inventory *inventory,
                                     struct lb_vm **out, struct gg_err *err)
{
    struct lb_limits limits = {.memory = set->limits.memory,
                               .instructions = set->limits.instructions,
                               .load_time_us = set->limits.timeout_us};
    return lb_vm_new(&limits, set->modules, set->n_modules, set->config, inventory, out, err);
}

/* The name a policy declares, or NULL (policy_from_info says what is wrong with it). */
static const char *declared_name(const struct lb_policy_info *info)
{
    return json_string_value(json_object_get(info->decl, "name"));
}

/* The first file that declares name, directories in the order given (n when none does). */
static size_t first_declaring(const struct policy_set *set, const struct lb_policy_info *infos,
                              const char *name)
{
    size_t first = set->n;
    for (size_t i = 0; i < set->n; i++) {
        const char *have = declared_name(&infos[i]);
        if (have && strcmp(have, name) == 0 &&
            (first == set->n || set->origins[i].dir < set->origins[first].dir))
            first = i;
    }
    return first;
}

/* The unknown-name message for policies.disabled[item], with the names the files declare. */
static enum gg_status unknown_policy(const struct policy_set *set,
                                     const struct lb_policy_info *infos, size_t item,
                                     const char *name, struct gg_err *err)
{
    const char **known = calloc(set->n + 1, sizeof(*known));
    if (!known)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory checking policies.disabled");
    size_t n = 0;
    for (size_t i = 0; i < set->n; i++)
        if (declared_name(&infos[i]))
            known[n++] = declared_name(&infos[i]);
    char path[48], msg[sizeof(err->msg)];
    snprintf(path, sizeof(path), "policies.disabled[%zu]", item + 1);
    cfgkeys_unknown_name(msg, sizeof(msg), path, "policy", name, known, n);
    free(known);
    return gg_fail(err, GG_ERR_INVALID, "%s", msg);
}

/*
 * Mark off[i] the policies the configuration's policies.disabled names: each name turns off
 * the first file that declares it, directories in the order given, so that a file of a later
 * directory may declare the name again and take its place.  A name no file declares is
 * refused: it turns nothing off.
 */
static enum gg_status mark_disabled(const struct policy_set *set,
                                    const struct lb_policy_info *infos, bool *off,
                                    struct gg_err *err)
{
    const json_t *section = json_object_get(set->config, "policies");
    const json_t *list = json_object_get(section, "disabled");
    if (section && !json_is_null(section) && !json_is_object(section))
        return gg_fail(err, GG_ERR_INVALID, "policies: must be a mapping");
    if (list && !json_is_null(list) && !json_is_array(list))
        return gg_fail(err, GG_ERR_INVALID, "policies.disabled: must be a list of policy names");
    size_t i;
    const json_t *name;
    json_array_foreach(list, i, name)
    {
        if (!json_is_string(name))
            return gg_fail(err, GG_ERR_INVALID,
                           "policies.disabled[%zu]: must be a policy name (its name field)", i + 1);
        size_t first = first_declaring(set, infos, json_string_value(name));
        if (first == set->n)
            return unknown_policy(set, infos, i, json_string_value(name), err);
        off[first] = true;
    }
    return GG_OK;
}

/* Take the policies marked off out of the set, with their infos: they are never loaded again. */
static void drop_disabled(struct policy_set *set, struct lb_policy_info *infos, const bool *off)
{
    size_t kept = 0;
    for (size_t i = 0; i < set->n; i++) {
        if (off[i]) {
            free(set->files[i].name);
            free(set->files[i].text);
            free(set->origins[i].path);
            lb_policy_info_clear(&infos[i]);
            continue;
        }
        set->files[kept] = set->files[i];
        set->origins[kept] = set->origins[i];
        infos[kept++] = infos[i];
    }
    set->n = kept;
}

/*
 * Load every policy of the set (their names are known only once their files have run), drop
 * those the configuration disables, then check the others and the configuration's sections
 * (config_path names the configuration in messages; NULL: none was given).  The sections a
 * disabled policy declares stay known: turning a policy off takes no edit of its settings.
 */
static enum gg_status check_policies(struct policy_set *set, const char *config_path,
                                     struct gg_err *err)
{
    struct lb_policy_info *infos = calloc(set->n + 1, sizeof(*infos));
    bool *off = calloc(set->n + 1, sizeof(*off));
    struct lb_vm *vm = NULL;
    json_t *declared = NULL;
    struct gg_err sub = {{0}};
    enum gg_status st = infos && off ? build_vm(set, NULL, infos, &vm, err)
                                     : gg_fail(err, GG_ERR_NOMEM, "out of memory");
    if (st == GG_OK && !(declared = declared_sections(infos, set->n)))
        st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
    if (st == GG_OK && (st = mark_disabled(set, infos, off, &sub)) != GG_OK)
        gg_fail(err, st, "%s: %s", config_path ? config_path : "configuration", sub.msg);
    if (st == GG_OK) {
        drop_disabled(set, infos, off);
        if (!(set->policies = calloc(set->n + 1, sizeof(*set->policies))))
            st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; st == GG_OK && i < set->n; i++) {
        st = policy_from_info(&set->policies[i], &infos[i], set->files[i].name, err);
        for (size_t j = 0; st == GG_OK && j < i; j++)
            if (strcmp(set->policies[j].name, set->policies[i].name) == 0)
                st = gg_fail(err, GG_ERR_INVALID,
                             "%s and %s both name a policy %s (policies.disabled turns off the "
                             "one of the earlier directory)",
                             set->origins[j].path, set->origins[i].path, set->policies[i].name);
    }
    if (st == GG_OK && (st = cfgschema_check(set->config, declared, &sub)) != GG_OK)
        gg_fail(err, st, "%s: %s", config_path ? config_path : "configuration", sub.msg);
    for (size_t i = 0; infos && i < set->n; i++)
        lb_policy_info_clear(&infos[i]);
    free(infos);
    free(off);
    json_decref(declared);
    lb_vm_free(vm);
    return st;
}

/* Read and check everything; on failure err names the file and the problem. */
static enum gg_status policy_set_load(const struct policy_paths *paths, uint64_t generation,
                                      struct policy_set **out, struct gg_err *err)
{
    struct policy_set *set = calloc(1, sizeof(*set));
    if (!set)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    atomic_init(&set->refs, 1);
    set->generation = generation;
    struct gg_err sub = {{0}};
    enum gg_status st = cfg_load(paths->config, &set->config, err);
    enum cfg_workloads_mode wmode;
    struct cfg_audit audit;
    if (st == GG_OK && ((st = cfg_limits(set->config, &set->limits, &sub)) != GG_OK ||
                        (st = cfg_check_enforcement(set->config, &sub)) != GG_OK ||
                        (st = cfg_audit(set->config, &audit, &sub)) != GG_OK ||
                        (st = cfg_workloads_mode(set->config, &wmode, &sub)) != GG_OK))
        gg_fail(err, st, "%s: %s", paths->config, sub.msg);
    if (st == GG_OK)
        st = policy_read_sources(paths->lua, true, &set->modules, &set->n_modules, err);
    if (st == GG_OK)
        st = read_policy_files(set, paths, err);
    if (st == GG_OK)
        st = check_policies(set, paths->config, err);
    if (st != GG_OK) {
        policy_set_release(set);
        return st;
    }
    *out = set;
    return GG_OK;
}

/* ---- the engine ------------------------------------------------------- */

static void free_thread_vm(void *p)
{
    struct thread_vm *tv = p;
    if (!tv)
        return;
    lb_vm_free(tv->vm);
    policy_set_release(tv->set);
    verdict_memo_free(tv->memo);
    free(tv);
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* The engine's own copy of paths' strings (freed by paths_clear). */
static void paths_clear(struct policy_paths *p)
{
    free((char *)p->policies);
    free((char *)p->lua);
    free((char *)p->config);
    for (size_t i = 0; p->more_policies && i < p->n_more_policies; i++)
        free((char *)p->more_policies[i]);
    free((void *)p->more_policies);
    memset(p, 0, sizeof(*p));
}

/* A copy of from's strings into to; false when out of memory (to is then cleared). */
static bool paths_copy(const struct policy_paths *from, struct policy_paths *to)
{
    char **more = calloc(from->n_more_policies + 1, sizeof(*more));
    *to = (struct policy_paths){.policies = dup_or_null(from->policies),
                                .lua = dup_or_null(from->lua),
                                .config = dup_or_null(from->config),
                                .more_policies = (const char *const *)more,
                                .n_more_policies = more ? from->n_more_policies : 0};
    bool ok = more && to->policies && to->lua && (!from->config || to->config);
    for (size_t i = 0; ok && i < from->n_more_policies; i++)
        ok = (more[i] = strdup(from->more_policies[i])) != NULL;
    if (!ok)
        paths_clear(to);
    return ok;
}

enum gg_status engine_new(const struct policy_paths *paths, struct engine **out, struct gg_err *err)
{
    if (paths->n_more_policies >= POLICY_MAX_DIRS)
        return gg_fail(err, GG_ERR_INVALID, "%zu policy directories: at most %d",
                       paths->n_more_policies + 1, POLICY_MAX_DIRS);
    struct policy_set *set;
    enum gg_status st = policy_set_load(paths, 1, &set, err);
    if (st != GG_OK)
        return st;
    struct engine *e = calloc(1, sizeof(*e));
    if (!e || !paths_copy(paths, &e->paths)) {
        free(e);
        policy_set_release(set);
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&e->lock, NULL);
    pthread_key_create(&e->vm_key, free_thread_vm);
    e->live = set;
    snprintf(e->last_reload, sizeof(e->last_reload), "ok");
    *out = e;
    return GG_OK;
}

void engine_free(struct engine *e)
{
    if (!e)
        return;
    free_thread_vm(pthread_getspecific(e->vm_key));
    pthread_key_delete(e->vm_key);
    policy_set_release(e->live);
    pthread_mutex_destroy(&e->lock);
    paths_clear(&e->paths);
    free(e);
}

void engine_set_inventory(struct engine *e, struct inventory *inventory)
{
    e->inventory = inventory;
}

void engine_set_ledger(struct engine *e, struct ledger *ledger)
{
    e->ledger = ledger;
}

struct inventory *engine_inventory(struct engine *e)
{
    return e->inventory;
}

void engine_collect(struct engine *e)
{
    struct thread_vm *tv = pthread_getspecific(e->vm_key);
    if (!tv || !tv->vm)
        return;
    size_t before = lb_vm_memory(tv->vm);
    if (lb_vm_collect(tv->vm))
        log_msg(LOG_DEBUG, "collected Lua garbage between reviews: %zu bytes before, %zu after",
                before, lb_vm_memory(tv->vm));
}

const struct policy_paths *engine_paths(const struct engine *e)
{
    return &e->paths;
}

static struct policy_set *acquire(struct engine *e)
{
    pthread_mutex_lock(&e->lock);
    struct policy_set *set = e->live;
    atomic_fetch_add(&set->refs, 1);
    pthread_mutex_unlock(&e->lock);
    return set;
}

struct policy_set *engine_live_set(struct engine *e)
{
    return acquire(e);
}

/*
 * A quota of the configuration in milli-GPU.  When the set loaded,
 * policies/40-gpu-quota.lua checked every quota with quota.parse_fraction (a
 * plain decimal with at most three decimals, numbers read as their "%.14g"
 * text), a subset of the quantity grammar: the quantity parser reads the
 * same amount, so the gauge shows what the policy enforces.
 */
static bool quota_milli(const json_t *v, int64_t *out)
{
    char text[48];
    const char *s = json_string_value(v);
    if (json_is_integer(v))
        snprintf(text, sizeof(text), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    else if (json_is_real(v))
        snprintf(text, sizeof(text), "%.14g", json_real_value(v));
    if (!s && json_is_number(v))
        s = text;
    return s && qty_parse(s, out, NULL, NULL) == GG_OK;
}

/* One gauge sample in GPU-equivalents: milli-GPU written exactly ("8", "0.25"). */
static enum gg_status append_gpus(struct buf *out, const char *series, int64_t milli)
{
    if (milli % 1000 == 0)
        return buf_appendf(out, "%s %lld\n", series, (long long)(milli / 1000));
    char frac[8];
    snprintf(frac, sizeof(frac), "%03lld", (long long)(llabs(milli) % 1000));
    for (size_t n = strlen(frac); n > 1 && frac[n - 1] == '0'; n--)
        frac[n - 1] = '\0';
    return buf_appendf(out, "%s %s%lld.%s\n", series, milli < 0 ? "-" : "",
                       (long long)(llabs(milli) / 1000), frac);
}

enum gg_status engine_render_quotas(struct engine *e, struct buf *out)
{
    struct policy_set *set = acquire(e);
    json_t *quotas = json_object_get(set->config, "quotas");
    int64_t milli;
    char series[320];
    enum gg_status st = buf_appendf(
        out, "# HELP gpuguard_quota_gpus GPU quota per namespace from the configuration, in "
             "GPU-equivalents.\n"
             "# TYPE gpuguard_quota_gpus gauge\n");
    const char *ns;
    json_t *v;
    json_object_foreach(json_object_get(quotas, "namespaces"), ns, v)
    {
        /* Namespace names are DNS labels: nothing to escape in the label value. */
        if (st == GG_OK && gg_dns_label(ns) && quota_milli(v, &milli)) {
            snprintf(series, sizeof(series), "gpuguard_quota_gpus{namespace=\"%.256s\"}", ns);
            st = append_gpus(out, series, milli);
        }
    }
    if (st == GG_OK && quota_milli(json_object_get(quotas, "default"), &milli)) {
        st = buf_appendf(out, "# HELP gpuguard_quota_default_gpus GPU quota of namespaces not "
                              "listed.\n"
                              "# TYPE gpuguard_quota_default_gpus gauge\n");
        if (st == GG_OK)
            st = append_gpus(out, "gpuguard_quota_default_gpus", milli);
    }
    if (st == GG_OK && json_is_object(quotas))
        st = buf_appendf(out,
                         "# HELP gpuguard_quota_enforced Whether the quotas are checked against "
                         "the cluster's usage (0: --inventory off, or the first list not in).\n"
                         "# TYPE gpuguard_quota_enforced gauge\n"
                         "gpuguard_quota_enforced %d\n",
                         e->inventory && inv_ready(e->inventory));
    policy_set_release(set);
    return st;
}

enum gg_status engine_reload(struct engine *e, struct gg_err *err)
{
    struct policy_set *set;
    uint64_t next = engine_generation(e) + 1;
    enum gg_status st = policy_set_load(&e->paths, next, &set, err);
    pthread_mutex_lock(&e->lock);
    struct policy_set *old = NULL;
    if (st == GG_OK) {
        old = e->live;
        e->live = set;
        snprintf(e->last_reload, sizeof(e->last_reload), "ok");
    } else {
        snprintf(e->last_reload, sizeof(e->last_reload), "%s", err->msg);
    }
    pthread_mutex_unlock(&e->lock);
    policy_set_release(old);
    return st;
}

uint64_t engine_generation(struct engine *e)
{
    pthread_mutex_lock(&e->lock);
    uint64_t g = e->live->generation;
    pthread_mutex_unlock(&e->lock);
    return g;
}

void engine_last_reload(struct engine *e, char *out, size_t size)
{
    pthread_mutex_lock(&e->lock);
    snprintf(out, size, "%s", e->last_reload);
    pthread_mutex_unlock(&e->lock);
}

/* This thread's VM for set, rebuilt when the set changed or the VM broke. */
static enum gg_status thread_vm(struct engine *e, struct policy_set *set, struct lb_vm **out,
                                struct verdict_memo **memo, struct gg_err *err)
{
    struct thread_vm *tv = pthread_getspecific(e->vm_key);
    if (!tv) {
        tv = calloc(1, sizeof(*tv));
        if (!tv)
            return gg_fail(err, GG_ERR_NOMEM, "out of memory");
        pthread_setspecific(e->vm_key, tv);
    }
    if (tv->vm && tv->set == set && !lb_vm_broken(tv->vm)) {
        *out = tv->vm;
        *memo = tv->memo;
        return GG_OK;
    }
    lb_vm_free(tv->vm);
    policy_set_release(tv->set);
    verdict_memo_free(tv->memo); /* what the VM's policies judged goes with it */
    tv->vm = NULL;
    tv->set = NULL;
    tv->memo = verdict_memo_new(set->n);
    enum gg_status st = build_vm(set, e->inventory, NULL, &tv->vm, err);
    if (st != GG_OK)
        return st;
    log_msg(LOG_DEBUG, "built a Lua VM for policy generation %llu",
            (unsigned long long)set->generation);
    atomic_fetch_add(&set->refs, 1);
    tv->set = set;
    *out = tv->vm;
    *memo = tv->memo;
    return GG_OK;
}

/* ---- matching --------------------------------------------------------- */

static bool glob_match(const char *pattern, const char *s)
{
    size_t n = strlen(pattern);
    if (n && pattern[n - 1] == '*')
        return strncmp(pattern, s, n - 1) == 0;
    return strcmp(pattern, s) == 0;
}

static bool in_list(const json_t *list, const char *s)
{
    size_t i;
    json_t *item;
    json_array_foreach(list, i, item) if (glob_match(json_string_value(item), s)) return true;
    return false;
}

static bool expression_matches(const json_t *expr, const struct jf_node *labels)
{
    const char *key = json_string_value(json_object_get(expr, "key"));
    const char *op = json_string_value(json_object_get(expr, "operator"));
    json_t *values = json_object_get(expr, "values");
    const char *value = jf_string(jf_get_str(labels, key ? key : ""));
    if (!key || !op)
        return false;
    if (strcmp(op, "Exists") == 0)
        return value != NULL;
    if (strcmp(op, "DoesNotExist") == 0)
        return value == NULL;
    bool listed = value && is_string_array(values) && in_list(values, value);
    if (strcmp(op, "In") == 0)
        return listed;
    if (strcmp(op, "NotIn") == 0)
        return !listed;
    return false;
}

/* A label selector {matchLabels, matchExpressions} against the object's labels. */
static bool labels_match(const json_t *selector, const struct jf_node *object)
{
    const struct jf_node *labels = jf_get_str(jf_get_str(object, "metadata"), "labels");
    const char *key;
    json_t *want;
    json_object_foreach(json_object_get(selector, "matchLabels"), key, want)
    {
        const char *have = jf_string(jf_get_str(labels, key));
        if (!have || !json_is_string(want) || strcmp(have, json_string_value(want)) != 0)
            return false;
    }
    size_t i;
    json_t *expr;
    json_array_foreach(json_object_get(selector, "matchExpressions"), i, expr)
    {
        if (!expression_matches(expr, labels))
            return false;
    }
    return true;
}

static bool policy_matches(const struct policy *p, const struct adm_request *req)
{
    const json_t *m = p->match;
    json_t *v = json_object_get(m, "kinds");
    /* Without kinds, Pods only: workloads come to the webhook too, and a policy written for
     * pods sees their templates as pods (workloads.h). */
    if (v ? !in_list(v, req->kind) : strcmp(req->kind, "Pod") != 0)
        return false;
    if (!m)
        return true;
    if ((v = json_object_get(m, "operations")) && !in_list(v, adm_operation_name(req->operation)))
        return false;
    if ((v = json_object_get(m, "namespaces"))) {
        json_t *inc = json_object_get(v, "include"), *exc = json_object_get(v, "exclude");
        if ((inc && !in_list(inc, req->namespace)) || (exc && in_list(exc, req->namespace)))
            return false;
    }
    if ((v = json_object_get(m, "labels")))
        return labels_match(v, req->object ? req->object : req->old_object);
    return true;
}

/* ---- evaluations in flight ------------------------------------------- */

/* Each worker thread's evaluation in flight: its deadline, 0 when idle. */
#define MAX_TRACKED_THREADS 256
static _Atomic int64_t in_flight[MAX_TRACKED_THREADS];
static atomic_int n_tracked;
static _Thread_local int tracked = -1;

/* This thread's slot; NULL past MAX_TRACKED_THREADS threads (never seen stuck). */
static _Atomic int64_t *flight_slot(void)
{
    if (tracked < 0)
        tracked = atomic_fetch_add(&n_tracked, 1);
    return tracked < MAX_TRACKED_THREADS ? &in_flight[tracked] : NULL;
}

int engine_overdue(void)
{
    int64_t now = gg_now_us();
    int n = atomic_load(&n_tracked), stuck = 0;
    for (int i = 0; i < n && i < MAX_TRACKED_THREADS; i++) {
        int64_t deadline = atomic_load_explicit(&in_flight[i], memory_order_relaxed);
        stuck += deadline && now > deadline + ENGINE_STUCK_GRACE_US;
    }
    return stuck;
}

/* ---- verdicts --------------------------------------------------------- */

/* An object rebuilt after a failed call's edits were dropped: alive until the request ends. */
struct rebuilt {
    json_t *json;
    struct jf_doc doc; /* its nodes, pointing into json */
};

/* What the evaluation has gathered so far. */
struct gather {
    json_t *denials, *warnings, *audit, *fired;
    json_t *modes;    /* fired policy -> the mode it ran in */
    json_t *outcomes; /* PHASE_OUTCOMES: each validate call's (policy_verdict.outcomes); or NULL */
    size_t denied;    /* bytes of the denials */
    size_t denials_left_out, warnings_left_out, audit_left_out; /* past the LB_REPORT_ limits */
    json_t *checkpoint;         /* the patch before the last mutate call that may fail open */
    char checkpoint_error[256]; /* why there is none (its edits are not JSON) */
    json_t *stopped;            /* the patch once a call that failed open stopped the VM */
    struct rebuilt *rebuilt;
    size_t n_rebuilt;
    bool failed_mutation; /* a mutate call failed closed, or an edit is not JSON: no edits */
    bool lost;            /* a denial could not be recorded: the verdict is a denial */
    unsigned errors;      /* policy calls that raised or broke a budget */
    /* What remembering policies judged before (NULL: nothing is remembered, verdictmemo.h);
     * the key of this request (made at the first such call; key_state 0: not yet, 1: made,
     * -1: none), of key_request bytes before a call's patch; validate's entry (looked up
     * once), and the patch validate sees the object through (NULL: the object as it came);
     * the objects mutate calls left that this request replays, held until it ends. */
    struct verdict_memo *memo;
    struct buf key;
    size_t key_request;
    int key_state;
    struct verdict_entry *validated;
    bool validated_looked;
    const json_t *seen_patch;
    struct replayed *replayed;
    size_t n_replayed;
    struct inventory *inventory; /* whose DRA version a call that read DRA objects holds for */
};

/*
 * Record an enforced denial; a failure to record it is itself a denial.
 * Past LB_REPORT_DENIALS_MAX bytes it is only counted (the first always fits).
 */
static void deny(struct gather *g, const char *text)
{
    size_t len = strlen(text) + 1;
    if (json_array_size(g->denials) > 0 && g->denied + len > LB_REPORT_DENIALS_MAX) {
        g->denials_left_out++;
        return;
    }
    if (json_array_append_new(g->denials, json_string(text)) != 0)
        g->lost = true;
    else
        g->denied += len;
}

/* A warning, kept as far as the API server shows it (sanitize_warnings marks the cut). */
static void add_warning(struct gather *g, const char *policy, const char *msg, const char *suffix)
{
    if (json_array_size(g->warnings) >= LB_REPORT_WARNINGS) {
        g->warnings_left_out++;
        return;
    }
    char *text = NULL;
    int shown = (int)sanitize_prefix(msg, strlen(msg), SIZE_MAX, SANITIZE_WARNING_MAX);
    if (asprintf(&text, "%s: %.*s%s", policy, shown, msg, suffix) >= 0)
        json_array_append_new(g->warnings, json_string(text));
    free(text);
}

static void add_fired(struct gather *g, const char *name, int mode)
{
    if (in_list(g->fired, name))
        return;
    json_array_append_new(g->fired, json_string(name));
    json_object_set_new(g->modes, name, json_string(cfg_mode_name(mode)));
}

static void add_audit(struct gather *g, const char *policy, const char *key, json_t *value)
{
    char full[160], valid[64];
    snprintf(full, sizeof(full), "%s.%s", policy, key);
    sanitize_audit_key(full, valid, sizeof(valid));
    if (json_object_size(g->audit) >= LB_REPORT_AUDIT && !json_object_get(g->audit, valid))
        g->audit_left_out++;
    else
        json_object_set(g->audit, valid, value);
}

/* A denial, as the mode says: deny, warn, or only an audit annotation. */
static void add_denial(struct gather *g, const char *policy, int mode, const char *msg)
{
    if (mode == POLICY_ENFORCE) {
        char *text = NULL;
        if (asprintf(&text, "%s: %s", policy, msg) < 0)
            g->lost = true;
        else
            deny(g, text);
        free(text);
    } else if (mode == POLICY_WARN) {
        add_warning(g, policy, msg, "");
    } else {
        json_t *value = json_string(msg); /* add_audit takes its own reference */
        add_audit(g, policy, "would-deny", value);
        json_decref(value);
    }
    add_fired(g, policy, mode);
}

static void take_report(struct gather *g, const struct policy *p, int mode,
                        const struct lb_report *r)
{
    size_t i;
    json_t *item;
    const char *key;
    json_array_foreach(r->denials, i, item) add_denial(g, p->name, mode, json_string_value(item));
    json_array_foreach(r->warnings, i, item) add_warning(g, p->name, json_string_value(item), "");
    json_object_foreach(r->audit, key, item) add_audit(g, p->name, key, item);
    /* A denial left out in warn mode is a warning left out; in audit mode, would-deny is one
     * annotation however many there were. */
    if (mode == POLICY_ENFORCE)
        g->denials_left_out += r->denials_left_out;
    else if (mode == POLICY_WARN)
        g->warnings_left_out += r->denials_left_out;
    g->warnings_left_out += r->warnings_left_out;
    g->audit_left_out += r->audit_left_out;
    if (json_array_size(r->warnings) || json_object_size(r->audit) || r->warnings_left_out ||
        r->audit_left_out)
        add_fired(g, p->name, mode);
}

static const char *kill_reason(enum lb_outcome o)
{
    switch (o) {
    case LB_OUT_OF_BUDGET:
        return "instruction budget exhausted";
    case LB_OUT_OF_MEMORY:
        return "memory limit exceeded";
    default:
        return "out of time";
    }
}

static void take_failure(struct gather *g, const struct policy *p, int mode, int failure,
                         enum lb_outcome outcome, const char *msg, char *traceback,
                         const struct adm_request *req)
{
    char text[512];
    if (outcome == LB_RAISED)
        snprintf(text, sizeof(text), "policy error: %s", msg);
    else
        snprintf(text, sizeof(text), "policy stopped: %s", kill_reason(outcome));
    g->errors++;
    log_fields(LOG_ERROR, "policy failed",
               json_pack("{s:s,s:s,s:s,s:s,s:s,s:s?}", "policy", p->name, "uid", req->uid, "name",
                         adm_object_name(req), "failure",
                         failure == POLICY_FAIL_DENY ? "deny" : "allow", "error", msg, "traceback",
                         traceback));
    if (failure == POLICY_FAIL_DENY) {
        add_denial(g, p->name, mode, text);
    } else {
        add_warning(g, p->name, text, " (ignored: failure allow)");
        add_fired(g, p->name, mode);
    }
}

static enum metrics_policy_result policy_result(enum lb_outcome outcome, int mode,
                                                const struct lb_report *r)
{
    switch (outcome) {
    case LB_DONE:
        if (json_array_size(r->denials) == 0 && r->denials_left_out == 0)
            return MET_POLICY_OK;
        return mode == POLICY_ENFORCE ? MET_POLICY_DENIED : MET_POLICY_WARNED;
    case LB_OUT_OF_BUDGET:
        return MET_POLICY_BUDGET;
    case LB_OUT_OF_MEMORY:
        return MET_POLICY_MEMORY;
    case LB_OUT_OF_TIME:
        return MET_POLICY_TIMEOUT;
    default:
        return MET_POLICY_ERROR;
    }
}

/* Whether a failure of the policy lets the request through: its verdict is no enforced denial. */
static bool fails_open(int mode, int failure)
{
    return failure == POLICY_FAIL_ALLOW || mode != POLICY_ENFORCE;
}

/*
 * Before a mutate call that may fail open: the patch of the edits so far,
 * which stay if the call fails (drop_edits).  A checkpoint costs a diff of
 * what the policies touched; calls that fail closed need none.
 */
static void take_checkpoint(struct lb_vm *vm, const struct adm_request *req, struct gather *g)
{
    struct gg_err err = {{0}};
    json_decref(g->checkpoint);
    g->checkpoint = NULL;
    if (lb_request_patch(vm, req->object, &g->checkpoint, &err) != GG_OK)
        snprintf(g->checkpoint_error, sizeof(g->checkpoint_error), "%s", err.msg);
}

/* The request's object with the checkpoint's edits, as the policies' object from now on. */
static enum gg_status rebuild(struct lb_vm *vm, const struct adm_request *req, struct gather *g,
                              struct gg_err *err)
{
    struct rebuilt *more = realloc(g->rebuilt, (g->n_rebuilt + 1) * sizeof(*more));
    if (!more)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    g->rebuilt = more;
    struct rebuilt *r = &more[g->n_rebuilt];
    memset(r, 0, sizeof(*r));
    json_t *original = jf_to_json(req->object);
    enum gg_status st = original ? jp_apply_copy(original, g->checkpoint, &r->json, err)
                                 : gg_fail(err, GG_ERR_NOMEM, "out of memory");
    json_decref(original);
    if (st == GG_OK && jf_from_json(r->json, &r->doc) != 0)
        st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
    g->n_rebuilt++; /* freed with the request, whatever happened */
    return st == GG_OK ? lb_request_rewind(vm, r->doc.root, err) : st;
}

static void free_rebuilt(struct gather *g)
{
    for (size_t i = 0; i < g->n_rebuilt; i++) {
        jf_doc_free(&g->rebuilt[i].doc);
        json_decref(g->rebuilt[i].json);
    }
    free(g->rebuilt);
    g->rebuilt = NULL;
    g->n_rebuilt = 0;
}

/*
 * A mutate call failed open: its edits go, those before it (the checkpoint)
 * stay, and the policies after it edit on from there.  A VM the call
 * stopped runs nothing more: the checkpoint is the patch.  Edits that
 * cannot be kept apart deny, as edits that are not JSON do at the end.
 */
static void drop_edits(struct lb_vm *vm, const struct adm_request *req, const struct policy *p,
                       struct gather *g)
{
    struct gg_err err = {{0}};
    if (!g->checkpoint) {
        deny(g, g->checkpoint_error);
    } else if (lb_vm_broken(vm)) {
        json_decref(g->stopped);
        g->stopped = json_incref(g->checkpoint);
        return;
    } else if (rebuild(vm, req, g, &err) != GG_OK) {
        char text[400];
        snprintf(text, sizeof(text), "gpuguard: the edits of %s cannot be dropped: %s", p->name,
                 err.msg);
        deny(g, text);
    } else {
        return;
    }
    g->failed_mutation = true;
}

static char *join_lines(const json_t *list)
{
    size_t i, len = 1;
    json_t *item;
    json_array_foreach(list, i, item) len += json_string_length(item) + 1;
    char *out = malloc(len), *p = out;
    if (!out)
        return NULL;
    json_array_foreach(list, i, item)
    {
        if (i)
            *p++ = '\n';
        memcpy(p, json_string_value(item), json_string_length(item));
        p += json_string_length(item);
    }
    *p = '\0';
    return out;
}

/* What a validate call made of the object, for the reports of an audit (policy_verdict.outcomes).
 */
static void add_outcome(struct gather *g, const struct policy *p, enum lb_outcome outcome,
                        const struct lb_report *r, const char *error)
{
    const char *result = "pass";
    char *joined = NULL, text[512];
    const char *message = json_string_value(json_object_get(p->decl, "description"));
    if (outcome != LB_DONE) {
        result = "error";
        snprintf(text, sizeof(text), "%s: %s",
                 outcome == LB_RAISED ? "policy error" : "policy stopped",
                 outcome == LB_RAISED ? error : kill_reason(outcome));
        message = text;
    } else if (json_array_size(r->denials) || r->denials_left_out) {
        result = "fail";
        message = joined = join_lines(r->denials);
    } else if (json_array_size(r->warnings)) {
        result = "warn";
        message = joined = join_lines(r->warnings);
    }
    const char *severity = json_string_value(json_object_get(p->decl, "severity"));
    json_t *o = json_pack("{s:s,s:s,s:s,s:s}", "policy", p->name, "result", result, "message",
                          message ? message : "", "severity",
                          severity ? severity : POLICY_DEFAULT_SEVERITY);
    if (!o || json_array_append_new(g->outcomes, o) != 0)
        g->lost = true; /* a result missing from a report would read as no finding */
    free(joined);
}

/* A mutate call replayed in this request: what it left, and the object made of it. */
struct replayed {
    struct verdict_object *object;
    struct jf_doc doc;
};

/* The key of the request with patch, the patch from its object to the one a call gets (NULL:
 * the object as it came); false when there is none. */
static bool call_key(const struct adm_request *req, const json_t *patch, struct gather *g)
{
    if (g->key_state == 0) {
        buf_init(&g->key, VERDICT_KEY_MAX);
        g->key_state = verdict_key(&g->key, req) ? 1 : -1;
        g->key_request = g->key.len;
    }
    return g->key_state > 0 && verdict_key_patch(&g->key, g->key_request, patch);
}

/*
 * The entry of what the call of p in phase judged before on a request like
 * this one: for validate, the request's with the patch validate sees it
 * through (looked up once); for mutate, with the patch the call's object
 * has so far.  NULL: it is not remembered.
 */
static struct verdict_entry *remembered(struct lb_vm *vm, const struct policy *p,
                                        enum lb_phase phase, const struct adm_request *req,
                                        struct gather *g)
{
    if (!p->remember[phase] || !g->memo || lb_vm_broken(vm) || !req->object)
        return NULL;
    if (phase == LB_VALIDATE) {
        if (!g->validated_looked && call_key(req, g->seen_patch, g))
            g->validated = verdict_memo_entry(g->memo, g->key.data, g->key.len);
        g->validated_looked = true;
        return g->validated;
    }
    json_t *before = NULL;
    struct gg_err err = {{0}};
    struct verdict_entry *e = NULL;
    if (lb_request_patch(vm, req->object, &before, &err) == GG_OK && call_key(req, before, g))
        e = verdict_memo_entry(g->memo, g->key.data, g->key.len);
    json_decref(before);
    return e;
}

/* A mutate call's edits replayed: the request's object is from now on the one the call left
 * on a request like this, the review's object with its patch (the nodes held until the
 * request ends); false when that cannot be. */
static bool replay_object(struct lb_vm *vm, const struct adm_request *req, struct verdict_object *o,
                          struct gather *g)
{
    struct gg_err err = {{0}};
    struct replayed *held = realloc(g->replayed, (g->n_replayed + 1) * sizeof(*held));
    if (held)
        g->replayed = held;
    struct replayed r = {o, {NULL, NULL, NULL}};
    if (!held || verdict_object_apply(o, req->object, &r.doc, &err) != GG_OK ||
        lb_request_rewind(vm, r.doc.root, &err) != GG_OK) {
        jf_doc_free(&r.doc);
        verdict_object_release(o);
        return false;
    }
    g->replayed[g->n_replayed++] = r;
    return true;
}

/* What a mutate call left: the patch from the review's object to it; NULL when it cannot be
 * made. */
static json_t *edits_made(struct lb_vm *vm, const struct adm_request *req)
{
    json_t *patch = NULL;
    struct gg_err err = {{0}};
    return lb_request_patch(vm, req->object, &patch, &err) == GG_OK ? patch : NULL;
}

/*
 * The call of a policy, or what it reported (and for mutate, the object it
 * left) on a request like this one before: a call that read nothing of the
 * cluster and returned is kept for the next.
 */
static enum lb_outcome call_or_replay(struct lb_vm *vm, const struct policy *p, size_t i,
                                      const struct adm_request *req, enum lb_phase phase,
                                      struct gather *g, struct lb_report *report,
                                      struct gg_err *err, char **traceback)
{
    struct verdict_entry *e = remembered(vm, p, phase, req, g);
    struct verdict_object *left = NULL;
    uint64_t version = g->inventory ? inv_dra_version(g->inventory) : 0;
    if (e && verdict_entry_get(e, phase, i, version, report, &left)) {
        if (!left || replay_object(vm, req, left, g))
            return LB_DONE;
        lb_report_clear(report);
    }
    enum lb_outcome outcome = lb_policy_call(vm, (int)i, phase, report, err, traceback);
    /* Kept unless it read the cluster, or DRA objects that moved meanwhile (one was asked
     * of the API server). */
    bool read_dra = lb_call_read_dra(vm);
    if (e && outcome == LB_DONE && lb_call_was_pure(vm) &&
        (!read_dra || version == (g->inventory ? inv_dra_version(g->inventory) : 0))) {
        json_t *edits = phase == LB_MUTATE ? edits_made(vm, req) : NULL;
        if (phase == LB_VALIDATE || edits)
            verdict_entry_put(g->memo, e, phase, i, report, edits, read_dra, version);
        json_decref(edits);
    }
    return outcome;
}

/* One policy's call in a phase, its report and its failure verdict. */
static void run_policy(struct lb_vm *vm, const struct policy_set *set, size_t i,
                       const struct adm_request *req, enum lb_phase phase, struct gather *g)
{
    const struct policy *p = &set->policies[i];
    int mode = p->mode, failure = p->failure;
    cfg_enforcement_for(set->config, p->name, req->namespace, &mode, &failure);
    /* A call on a stopped VM, or without an object, fails at once: no edits to keep apart. */
    bool apart =
        phase == LB_MUTATE && fails_open(mode, failure) && req->object && !lb_vm_broken(vm);
    if (apart)
        take_checkpoint(vm, req, g);
    struct lb_report report;
    struct gg_err err = {{0}};
    char *traceback = NULL;
    int64_t start = gg_now_ns();
    enum lb_outcome outcome = call_or_replay(vm, p, i, req, phase, g, &report, &err, &traceback);
    if (!req->background) /* the policy metrics are admission's; the audit counts its own */
        metrics_policy_observe(p->metric_slot, policy_result(outcome, mode, &report),
                               (gg_now_ns() - start) / 1e9);
    take_report(g, p, mode, &report);
    if (g->outcomes && phase == LB_VALIDATE)
        add_outcome(g, p, outcome, &report, err.msg);
    lb_report_clear(&report);
    if (outcome != LB_DONE) {
        take_failure(g, p, mode, failure, outcome, err.msg, traceback, req);
        if (apart)
            drop_edits(vm, req, p, g);
        else if (phase == LB_MUTATE && !fails_open(mode, failure))
            g->failed_mutation = true;
    }
    free(traceback);
}

/*
 * Run one phase over the matching policies; false when the VM broke.  The
 * policies after a break still get their turn: each fails at once and its
 * failure verdict counts, so a break never skips a policy that would deny.
 */
static bool run_phase(struct lb_vm *vm, const struct policy_set *set, const struct adm_request *req,
                      enum lb_phase phase, struct gather *g)
{
    for (size_t i = 0; i < set->n; i++) {
        const struct policy *p = &set->policies[i];
        if ((phase == LB_MUTATE ? p->has_mutate : p->has_validate) && policy_matches(p, req))
            run_policy(vm, set, i, req, phase, g);
    }
    return !lb_vm_broken(vm);
}

/*
 * The patch of the mutate phase (and with PHASE_KEEP_MUTATED the object it
 * makes).  On a VM that broke (alive false) it is the checkpoint kept when
 * a call that failed open stopped it; a call that failed closed denies.
 */
static enum gg_status finish_mutation(struct lb_vm *vm, const struct adm_request *req,
                                      unsigned phases, bool alive, struct gather *g,
                                      struct policy_verdict *out, struct gg_err *err)
{
    if (g->failed_mutation || !req->object || (!alive && !g->stopped)) {
        out->patch = json_array();
        return GG_OK;
    }
    if (!alive) {
        out->patch = json_incref(g->stopped);
    } else if (lb_request_patch(vm, req->object, &out->patch, err) != GG_OK) {
        /* A policy built something that is not JSON: its edit is refused. */
        deny(g, err->msg);
        g->failed_mutation = true;
        out->patch = json_array();
        return GG_OK;
    }
    if (!(phases & PHASE_KEEP_MUTATED))
        return GG_OK;
    json_t *original = jf_to_json(req->object);
    enum gg_status st = original ? jp_apply_copy(original, out->patch, &out->mutated, err)
                                 : gg_fail(err, GG_ERR_NOMEM, "out of memory applying the patch");
    json_decref(original);
    /* A patch that does not apply to its own source is a bug: GG_ERR_INVALID. */
    return st == GG_OK || st == GG_ERR_NOMEM ? st : GG_ERR_INVALID;
}

/* The denials one a line, and how many were left out (LB_REPORT_DENIALS_MAX). */
static char *denial_message(const struct gather *g)
{
    if (json_array_size(g->denials) == 0)
        return strdup(POLICY_LOST_DENIAL);
    char *joined = join_lines(g->denials), *out = NULL;
    if (!joined || g->denials_left_out == 0)
        return joined;
    if (asprintf(&out, "%s\ngpuguard: %zu more denials left out", joined, g->denials_left_out) < 0)
        out = NULL;
    free(joined);
    return out;
}

/*
 * Audit annotations for a decision that changed or denied something: the
 * verdict and which policies acted, in which mode.  (The API server prefixes
 * each key with the webhook's name.)
 */
static void audit_summary(struct gather *g, const struct policy_verdict *out)
{
    bool patched = json_array_size(out->patch) > 0;
    if (out->allowed && !patched && json_array_size(g->fired) == 0)
        return;
    json_object_set_new(g->audit, "verdict",
                        json_string(!out->allowed ? "denied"
                                    : patched     ? "patched"
                                                  : "allowed"));
    char list[512] = "";
    size_t used = 0, i;
    json_t *name;
    json_array_foreach(g->fired, i, name)
    {
        int n = snprintf(list + used, sizeof(list) - used, "%s%s (%s)", i ? ", " : "",
                         json_string_value(name),
                         json_string_value(json_object_get(g->modes, json_string_value(name))));
        if (n < 0 || (size_t)n >= sizeof(list) - used)
            break;
        used += (size_t)n;
    }
    if (used)
        json_object_set_new(g->audit, "policies", json_string(list));
    if (g->audit_left_out)
        json_object_set_new(g->audit, "audit-left-out", json_sprintf("%zu", g->audit_left_out));
}

/*
 * Validate sees the object as mutate left it, read-only: the object the
 * patch makes (a call that failed open took its edits with it, drop_edits).
 * When all the edits were dropped (a mutate call failed closed, or an edit
 * is not JSON: a denial), it starts again from the object as it came.
 * An object the policies may not see is a denial, as at the start, and
 * *validate is cleared.
 */
static void begin_validate(struct lb_vm *vm, const struct adm_request *req, int64_t deadline_us,
                           struct gather *g, bool *validate, struct gg_err *err)
{
    if (lb_request_begin(vm, req, req->object, deadline_us, err) != GG_OK) {
        char text[300];
        snprintf(text, sizeof(text), "gpuguard: %s", err->msg);
        deny(g, text);
        *validate = false;
    }
}

/* What a GPU pod or claim under validation holds: its charge and where (the ledger's too). */
struct held {
    int64_t charge; /* milli-GPU; 0: nothing (or not a pod or claim being created) */
    char uid[128], pool[GQ_NAME_MAX];
};

/*
 * A GPU pod or DRA claim under validation counts against its namespace
 * before the policies read the usage, and stays counted if admitted (see
 * inventory.h): the reservation's number, or 0 when none was made (a dry
 * run reserves nothing).  *h says what it holds.
 */
static uint64_t reserve(struct engine *e, const struct adm_request *req,
                        const struct policy_verdict *v, struct held *h)
{
    memset(h, 0, sizeof(*h));
    if (!e->inventory || (!v->mutated && !req->object) || req->operation != ADM_CREATE ||
        (strcmp(req->kind, "Pod") != 0 && strcmp(req->kind, "ResourceClaim") != 0))
        return 0;
    /* A pod read once, as the informer reads one; a claim, or a pod the reader refuses, as
     * nodes for the model. */
    struct inf_pod pod;
    struct gg_err err = {{0}};
    inf_pod_init(&pod);
    bool read =
        strcmp(req->kind, "Pod") == 0 && (v->mutated ? inf_pod_of_json(v->mutated, &pod, &err)
                                                     : inf_pod_of_nodes(req->object, &pod, &err));
    struct jf_doc mutated = {NULL, NULL, NULL};
    if (!read && v->mutated && jf_from_json(v->mutated, &mutated) != 0) {
        inf_pod_free(&pod);
        return 0; /* out of memory: the reservation is a head start, the informer counts it */
    }
    const struct jf_node *obj = v->mutated ? mutated.root : req->object;
    const struct jf_node *meta = jf_get_str(obj, "metadata");
    struct inv_hold hold = {
        .ns = req->namespace,
        .uid = read ? pod.uid : jf_string(jf_get_str(meta, "uid")),
        .name = req->name,
        .cls = read ? pod.cls
                    : jf_string(jf_get_str(jf_get_str(meta, "labels"), GG_KEY_WORKLOAD_CLASS)),
        .pool =
            read ? pod.pool : jf_string(jf_get_str(jf_get_str(meta, "annotations"), GG_KEY_POOL)),
        .charge = read ? inv_charge_pod(e->inventory, &pod) : inv_charge(e->inventory, obj),
    };
    h->charge = hold.charge;
    snprintf(h->uid, sizeof(h->uid), "%s", hold.uid ? hold.uid : "");
    snprintf(h->pool, sizeof(h->pool), "%s", hold.pool ? hold.pool : "");
    uint64_t seq = hold.charge > 0 && !req->dry_run
                       ? inv_reserve(e->inventory, &hold, INV_RESERVATION_TTL_MS)
                       : 0;
    jf_doc_free(&mutated);
    inf_pod_free(&pod);
    return seq;
}

/*
 * A pod (or a ResourceClaim charged on its own) the policies admit, in a
 * namespace with a GPUQuota, is admitted only once its charge is in the
 * quota's ledger (ledger.h); a denial of the ledger is the review's.
 */
static void charge_ledger(struct engine *e, const struct adm_request *req, const struct held *h,
                          int64_t deadline_us, struct gather *g)
{
    if (!e->ledger || h->charge <= 0 ||
        (strcmp(req->kind, "Pod") != 0 && strcmp(req->kind, "ResourceClaim") != 0))
        return;
    char why[1024];
    struct ledger_charge c = {.ns = req->namespace,
                              .uid = h->uid,
                              .pod = adm_object_name(req),
                              .pool = h->pool,
                              .charge = h->charge,
                              .dry_run = req->dry_run,
                              .deadline_us = deadline_us};
    enum ledger_verdict v = ledger_charge(e->ledger, &c, why, sizeof(why));
    if (v == LEDGER_OVER || v == LEDGER_UNAVAILABLE) {
        char text[1100];
        snprintf(text, sizeof(text), "gpu-quota: %s", why);
        deny(g, text);
    }
}

static enum gg_status evaluate(struct engine *e, const struct adm_request *req, unsigned phases,
                               int64_t deadline_us, struct policy_verdict *out, struct gg_err *err);

enum gg_status engine_evaluate(struct engine *e, const struct adm_request *req, unsigned phases,
                               int64_t deadline_us, struct policy_verdict *out, struct gg_err *err)
{
    memset(out, 0, sizeof(*out));
    _Atomic int64_t *flight = flight_slot();
    if (flight)
        atomic_store_explicit(flight, deadline_us, memory_order_relaxed);
    enum gg_status st = evaluate(e, req, phases, deadline_us, out, err);
    if (flight)
        atomic_store_explicit(flight, 0, memory_order_relaxed);
    if (gg_now_us() > deadline_us && !req->background)
        metrics_deadline_overrun();
    return st;
}

static enum gg_status evaluate(struct engine *e, const struct adm_request *req, unsigned phases,
                               int64_t deadline_us, struct policy_verdict *out, struct gg_err *err)
{
    struct policy_set *set = acquire(e);
    struct lb_vm *vm = NULL;
    struct verdict_memo *memo = NULL;
    enum gg_status st = thread_vm(e, set, &vm, &memo, err);
    if (st != GG_OK) {
        policy_set_release(set);
        return st;
    }
    int64_t t0 = gg_now_ns(), t1;
    int64_t lua_deadline = t0 / 1000 + set->limits.timeout_us;
    if (lua_deadline > deadline_us - DEADLINE_MARGIN_US)
        lua_deadline = deadline_us - DEADLINE_MARGIN_US;
    struct gather g = {.denials = json_array(),
                       .warnings = json_array(),
                       .audit = json_object(),
                       .fired = json_array(),
                       .modes = json_object(),
                       .memo = memo,
                       .inventory = e->inventory};
    g.lost = !g.denials || !g.warnings || !g.audit || !g.fired || !g.modes;
    if ((phases & PHASE_OUTCOMES) && !(g.outcomes = json_array()))
        g.lost = true;
    uint64_t reserved = 0;
    if (lb_request_begin(vm, req, req->object, lua_deadline, err) != GG_OK) {
        /* The object itself is beyond what policies may see (too deep, too big). */
        char text[300];
        snprintf(text, sizeof(text), "gpuguard: %s", err->msg);
        deny(&g, text);
        out->patch = json_array();
    } else {
        bool alive = true;
        t1 = gg_now_ns();
        out->timing.to_lua = t1 - t0;
        if (phases & PHASE_MUTATE) {
            alive = run_phase(vm, set, req, LB_MUTATE, &g);
            t0 = gg_now_ns();
            out->timing.mutate = t0 - t1;
            st = finish_mutation(vm, req, phases, alive, &g, out, err);
            t1 = gg_now_ns();
            out->timing.diff = t1 - t0;
        }
        bool validate = (phases & PHASE_VALIDATE) != 0;
        if (st == GG_OK && alive && validate && g.failed_mutation)
            begin_validate(vm, req, lua_deadline, &g, &validate, err);
        else if (phases & PHASE_MUTATE)
            g.seen_patch = out->patch; /* validate sees the object the patch makes */
        if (st == GG_OK && validate) {
            /* Not for a pod the mutating phase already denied: its charge is work for nothing. */
            struct held h = {0};
            if (!g.lost && json_array_size(g.denials) == 0)
                reserved = reserve(e, req, out, &h);
            inv_read_before(reserved);
            /* A stored object's own charge is in the usage already: not counted twice. */
            const struct jf_node *uid = req->background && req->object
                                            ? jf_get_str(jf_get_str(req->object, "metadata"), "uid")
                                            : NULL;
            inv_read_without(uid ? jf_string(uid) : NULL);
            run_phase(vm, set, req, LB_VALIDATE, &g);
            inv_read_without(NULL);
            inv_read_before(0);
            if (!g.lost && json_array_size(g.denials) == 0 && g.denials_left_out == 0)
                charge_ledger(e, req, &h, deadline_us, &g);
            out->timing.validate = gg_now_ns() - t1;
        }
        lb_request_end(vm);
        free_rebuilt(&g);                           /* after the end: no stub reads them any more */
        for (size_t i = 0; i < g.n_replayed; i++) { /* nor the objects replayed */
            jf_doc_free(&g.replayed[i].doc);
            verdict_object_release(g.replayed[i].object);
        }
        metrics_lua_memory(lb_vm_memory_peak(vm));
    }
    if (st == GG_OK && (phases & PHASE_MUTATE) && !out->patch)
        g.lost = true; /* the mutations are lost: never admit without them */
    if (st == GG_OK && g.lost)
        deny(&g, POLICY_LOST_DENIAL);
    if (st == GG_OK) {
        out->allowed = !g.lost && json_array_size(g.denials) == 0 && g.denials_left_out == 0;
        if (!out->allowed) {
            out->message = denial_message(&g);
            if (!out->message)
                st = gg_fail(err, GG_ERR_NOMEM, "out of memory writing a denial");
        }
    }
    if (st == GG_OK) {
        if (!out->allowed || g.failed_mutation) {
            json_decref(out->patch);
            out->patch = json_array();
        }
        audit_summary(&g, out);
        out->warnings = sanitize_warnings(g.warnings, g.warnings_left_out);
        out->audit = json_incref(g.audit);
        out->fired = json_incref(g.fired);
        out->outcomes = json_incref(g.outcomes);
        out->errors = g.errors;
    }
    if (reserved && (st != GG_OK || !out->allowed))
        inv_unreserve(e->inventory, reserved);
    json_decref(g.denials);
    json_decref(g.warnings);
    json_decref(g.audit);
    json_decref(g.fired);
    json_decref(g.modes);
    json_decref(g.outcomes);
    json_decref(g.checkpoint);
    json_decref(g.stopped);
    free(g.replayed);
    if (g.key_state)
        buf_clear(&g.key);
    policy_set_release(set);
    if (st != GG_OK)
        policy_verdict_clear(out);
    return st;
}

void policy_verdict_clear(struct policy_verdict *v)
{
    if (!v)
        return;
    free(v->message);
    json_decref(v->patch);
    json_decref(v->mutated);
    json_decref(v->warnings);
    json_decref(v->audit);
    json_decref(v->fired);
    json_decref(v->outcomes);
    memset(v, 0, sizeof(*v));
}
