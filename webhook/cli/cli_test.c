/*
 * cli_test.c - `gpuguard test`: policy test suites (*.suite.yaml, described
 * in docs/policy-tests.md).
 *
 * A suite is checked in full before any case runs, so a typo in an
 * expectation is a broken suite (exit 2, file and line) and never a test
 * that silently passes.  Each case builds its pods with manifest.c and
 * runs them through dryrun.c, the same path as `gpuguard check` and the
 * server, then compares with what the case expects and prints a diff.
 */
#include "engine/charger.h"
#include "cli/cli.h"
#include "cli/cli_dra.h"
#include "cli/cli_files.h"
#include "cli/engine_opts.h"
#include "engine/dryrun.h"
#include "util/buf.h"
#include "util/gpuguard.h"
#include "kube/inventory.h"
#include "kube/rsstore.h"
#include "codec/jsonpatch.h"
#include "util/log.h"
#include "codec/manifest.h"
#include "engine/policy.h"
#include "engine/workloads.h"
#include "codec/yamldoc.h"

#include <errno.h>
#include <libgen.h>
#include <regex.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TEST_MAX_SUITE_BYTES ((size_t)16 << 20)
#define TEST_MAX_DIFF_CELLS 4000000 /* LCS table cells; beyond, lines are listed whole */

/* One suite file, checked. */
struct suite {
    const char *file;
    char *dir;
    json_t *doc;
    json_t *lines; /* pointer -> line */
    char name[256];
    char *config, *lua, *cluster_state, *usage;
    char *policies; /* the suite's own policy directory; NULL: the flags' */
};

/* The engine of the previous suite, kept while the paths stay the same. */
struct engine_cache {
    struct engine *engine;
    char *key;
};

struct test_run {
    struct engine_opts o; /* for suites that name none; the paths */
    struct engine_cache cache;
    size_t passed, failed, broken;
    bool colour;
    /* Every engine reads usage from it: the suite's cluster_state, not ready without one. */
    struct inventory *inventory;
};

#define TEST_HELP_WIDTH 19 /* the flag column of --help */

static void test_usage(FILE *out)
{
    fprintf(out,
            "usage: gpuguard test [flags] PATH...\n"
            "\n"
            "Run policy test suites.  PATH is a suite file or a directory searched recursively\n"
            "for *.suite.yaml files.  Each case gives a manifest (a file or an inline object)\n"
            "and what the webhook must do with its pods: allowed, message, warnings, patch,\n"
            "fields of the mutated pod, audit annotations; mutation must be idempotent.\n"
            "A case may also be an UPDATE, with the old object, the requester (user, groups)\n"
            "and a sub-resource such as ephemeralcontainers (what kubectl debug sends).\n"
            "The format is described in docs/policy-tests.md.\n"
            "\n"
            "flags (a suite's own config, policies and lua win over them):\n");
    eo_help_engine(out, EO_ENGINE | EO_NO_CONFIG, TEST_HELP_WIDTH);
    eo_help_tail(out, TEST_HELP_WIDTH, LOG_ERROR);
    fprintf(out, "\n"
                 "Paths in a suite are relative to the suite file.  Prints PASS or FAIL per case,\n"
                 "with a diff of expected and actual on failure, then \"N passed, M failed\".\n"
                 "Exit status: 0 all passed, 1 a case failed, 2 usage error or a broken suite.\n");
}

static const struct eo_command test_command = {
    .name = "gpuguard test",
    .shared = EO_ENGINE | EO_NO_CONFIG,
    .log_level = LOG_ERROR,
    .help = test_usage,
    .missing_args = "no PATH given (a suite file or a directory)",
};

/* ---- checking a suite --------------------------------------------------- */

/* "/cases/2/expect/allowed" -> "cases[2].expect.allowed" */
static void pointer_to_path(const char *pointer, char *out, size_t size)
{
    size_t n = 0;
    out[0] = '\0';
    for (const char *p = pointer; *p == '/' && n < size;) {
        const char *tok = p + 1;
        size_t len = strcspn(tok, "/");
        bool index = len > 0 && strspn(tok, "0123456789") >= len;
        int w = index ? snprintf(out + n, size - n, "[%.*s]", (int)len, tok)
                      : snprintf(out + n, size - n, "%s%.*s", n ? "." : "", (int)len, tok);
        if (w < 0)
            break;
        n += (size_t)w;
        p = tok + len;
    }
}

/* "file:line: <path>: message" for the node at pointer. */
static enum gg_status bad(const struct suite *s, const char *pointer, struct gg_err *err,
                          const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static enum gg_status bad(const struct suite *s, const char *pointer, struct gg_err *err,
                          const char *fmt, ...)
{
    char what[200], path[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    pointer_to_path(pointer, path, sizeof(path));
    size_t line = mf_line_of(s->lines, pointer);
    if (*path)
        return gg_fail(err, GG_ERR_INVALID, "%s:%zu: %s: %s", s->file, line ? line : 1, path, what);
    return gg_fail(err, GG_ERR_INVALID, "%s:%zu: %s", s->file, line ? line : 1, what);
}

static bool key_allowed(const char *key, const char *const *keys)
{
    for (size_t i = 0; keys[i]; i++)
        if (strcmp(key, keys[i]) == 0)
            return true;
    return false;
}

static enum gg_status check_keys(const struct suite *s, const json_t *obj, const char *ptr,
                                 const char *const *keys, const char *list, struct gg_err *err)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v)
    {
        if (!key_allowed(key, keys)) {
            char *child = NULL;
            if (asprintf(&child, "%s/%s", ptr, key) < 0)
                return gg_fail(err, GG_ERR_NOMEM, "out of memory");
            enum gg_status st = bad(s, child, err, "unknown key (%s)", list);
            free(child);
            return st;
        }
    }
    return GG_OK;
}

enum vtype { V_STRING, V_BOOL, V_OBJECT, V_ARRAY, V_STRINGS, V_OBJECTS, V_ANY };

/* obj[key] has the given shape (or is absent). */
static enum gg_status check_type(const struct suite *s, const json_t *obj, const char *ptr,
                                 const char *key, enum vtype t, struct gg_err *err)
{
    static const char *const names[] = {
        "a string",          "a boolean (true or false)", "a mapping", "a list",
        "a list of strings", "a list of mappings",        "a value"};
    json_t *v = json_object_get(obj, key);
    bool ok = true;
    size_t i;
    json_t *item;
    if (!v)
        return GG_OK;
    switch (t) {
    case V_STRING:
        ok = json_is_string(v);
        break;
    case V_BOOL:
        ok = json_is_boolean(v);
        break;
    case V_OBJECT:
        ok = json_is_object(v);
        break;
    case V_ARRAY:
        ok = json_is_array(v);
        break;
    case V_STRINGS:
    case V_OBJECTS:
        ok = json_is_array(v);
        json_array_foreach(v, i, item) ok =
            ok && (t == V_STRINGS ? json_is_string(item) : json_is_object(item));
        break;
    default:
        break;
    }
    if (ok)
        return GG_OK;
    char *child = NULL;
    if (asprintf(&child, "%s/%s", ptr, key) < 0)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    enum gg_status st = bad(s, child, err, "must be %s", names[t]);
    free(child);
    return st;
}

static enum gg_status check_regex(const struct suite *s, const char *ptr, const char *re,
                                  struct gg_err *err)
{
    regex_t rx;
    int rc = regcomp(&rx, re, REG_EXTENDED | REG_NOSUB);
    if (rc != 0) {
        char msg[128];
        regerror(rc, &rx, msg, sizeof(msg));
        return bad(s, ptr, err, "not a POSIX extended regular expression: %s", msg);
    }
    regfree(&rx);
    return GG_OK;
}

static enum gg_status check_expect(const struct suite *s, const json_t *expect, const char *ptr,
                                   struct gg_err *err)
{
    static const char *const keys[] = {
        "allowed", "message",  "message_matches", "warnings", "warnings_match", "patch", "fields",
        "audit",   "decision", "idempotent",      "skipped",  "error",          NULL};
    static const struct {
        const char *key;
        enum vtype t;
    } types[] = {{"allowed", V_BOOL},
                 {"message", V_STRING},
                 {"message_matches", V_STRING},
                 {"warnings", V_STRINGS},
                 {"warnings_match", V_STRINGS},
                 {"patch", V_OBJECTS},
                 {"fields", V_OBJECT},
                 {"audit", V_OBJECT},
                 {"idempotent", V_BOOL},
                 {"skipped", V_BOOL},
                 {"error", V_BOOL}};
    enum gg_status st = check_keys(s, expect, ptr, keys,
                                   "allowed, message, message_matches, warnings, warnings_match, "
                                   "patch, fields, audit, decision, idempotent, skipped, error",
                                   err);
    for (size_t i = 0; st == GG_OK && i < sizeof(types) / sizeof(types[0]); i++)
        st = check_type(s, expect, ptr, types[i].key, types[i].t, err);
    if (st != GG_OK)
        return st;
    const json_t *d = json_object_get(expect, "decision");
    char child[256];
    if (d && !json_is_string(d) && !json_is_null(d)) {
        snprintf(child, sizeof(child), "%s/decision", ptr);
        return bad(s, child, err, "must be a string, or null for no decision annotation");
    }
    const char *re = json_string_value(json_object_get(expect, "message_matches"));
    snprintf(child, sizeof(child), "%s/message_matches", ptr);
    if (re && (st = check_regex(s, child, re, err)) != GG_OK)
        return st;
    size_t i;
    json_t *item;
    json_array_foreach(json_object_get(expect, "warnings_match"), i, item)
    {
        snprintf(child, sizeof(child), "%s/warnings_match/%zu", ptr, i);
        if ((st = check_regex(s, child, json_string_value(item), err)) != GG_OK)
            return st;
    }
    json_array_foreach(json_object_get(expect, "patch"), i, item)
    {
        snprintf(child, sizeof(child), "%s/patch/%zu", ptr, i);
        if (!json_is_string(json_object_get(item, "op")) ||
            !json_is_string(json_object_get(item, "path")))
            return bad(s, child, err, "a patch operation needs op and path");
    }
    const char *key;
    json_object_foreach(json_object_get(expect, "fields"), key, item)
    {
        json_t *tokens = NULL;
        struct gg_err perr = {{0}};
        snprintf(child, sizeof(child), "%s/fields", ptr);
        if (jp_pointer_parse(key, &tokens, &perr) != GG_OK || !*key)
            return bad(s, child, err, "\"%.60s\" is not a JSON pointer such as /spec/nodeName",
                       key);
        json_decref(tokens);
    }
    return GG_OK;
}

static enum gg_status check_case(const struct suite *s, const json_t *c, size_t index,
                                 struct gg_err *err)
{
    static const char *const keys[] = {
        "name",   "description",  "manifest",   "object", "namespace",   "operation", "user",
        "groups", "sub_resource", "old_object", "expect", "expect_each", NULL};
    static const struct {
        const char *key;
        enum vtype t;
    } types[] = {{"name", V_STRING},       {"description", V_STRING}, {"manifest", V_STRING},
                 {"object", V_ANY},        {"namespace", V_STRING},   {"operation", V_STRING},
                 {"user", V_STRING},       {"groups", V_STRINGS},     {"sub_resource", V_STRING},
                 {"old_object", V_OBJECT}, {"expect", V_OBJECT},      {"expect_each", V_OBJECTS}};
    char ptr[64], child[128];
    snprintf(ptr, sizeof(ptr), "/cases/%zu", index);
    if (!json_is_object(c))
        return bad(s, ptr, err, "a case must be a mapping");
    enum gg_status st = check_keys(s, c, ptr, keys,
                                   "name, description, manifest, object, namespace, operation, "
                                   "user, groups, sub_resource, old_object, expect, expect_each",
                                   err);
    for (size_t i = 0; st == GG_OK && i < sizeof(types) / sizeof(types[0]); i++)
        st = check_type(s, c, ptr, types[i].key, types[i].t, err);
    if (st != GG_OK)
        return st;
    if (!json_object_get(c, "name"))
        return bad(s, ptr, err, "a case needs a name");
    if (!json_object_get(c, "manifest") == !json_object_get(c, "object"))
        return bad(s, ptr, err, "a case needs exactly one of manifest (a file) and object");
    const char *op = json_string_value(json_object_get(c, "operation"));
    if (op && strcmp(op, "CREATE") && strcmp(op, "UPDATE") && strcmp(op, "DELETE") &&
        strcmp(op, "CONNECT")) {
        snprintf(child, sizeof(child), "%s/operation", ptr);
        return bad(s, child, err, "must be CREATE, UPDATE, DELETE or CONNECT");
    }
    const json_t *expect = json_object_get(c, "expect"), *each = json_object_get(c, "expect_each");
    if (!expect == !each)
        return bad(s, ptr, err, "a case needs exactly one of expect and expect_each");
    if (expect) {
        snprintf(child, sizeof(child), "%s/expect", ptr);
        return check_expect(s, expect, child, err);
    }
    size_t i;
    json_t *item;
    json_array_foreach(each, i, item)
    {
        snprintf(child, sizeof(child), "%s/expect_each/%zu", ptr, i);
        if ((st = check_expect(s, item, child, err)) != GG_OK)
            return st;
    }
    return GG_OK;
}

/* A path from the suite, relative to the suite's directory; malloc'ed. */
static char *suite_path(const struct suite *s, const char *p)
{
    char *out = NULL;
    if (p[0] == '/')
        return strdup(p);
    return asprintf(&out, "%s/%s", s->dir, p) < 0 ? NULL : out;
}

static void suite_clear(struct suite *s)
{
    free(s->dir);
    json_decref(s->doc);
    json_decref(s->lines);
    free(s->config);
    free(s->policies);
    free(s->lua);
    free(s->cluster_state);
    free(s->usage);
    memset(s, 0, sizeof(*s));
}

static enum gg_status suite_load(const struct test_run *r, const char *file, struct suite *s,
                                 struct gg_err *err)
{
    static const char *const keys[] = {
        "name",          "description", "config",    "policies", "lua",
        "cluster_state", "usage",       "namespace", "cases",    NULL};
    struct yd_limits limits;
    char *text = NULL, *copy = NULL;
    size_t len = 0;
    json_t *all = NULL;
    enum gg_status st;
    memset(s, 0, sizeof(*s));
    s->file = file;
    mf_yd_limits(&limits);
    if ((st = gg_read_file(file, TEST_MAX_SUITE_BYTES, &text, &len, err)) != GG_OK)
        return st;
    st = yd_load_one(text, len, file, &limits, &s->doc, err);
    if (st == GG_OK && mf_node_lines(text, len, 1000000, &all, err) == GG_OK)
        s->lines = json_incref(json_array_get(all, 0));
    json_decref(all);
    free(text);
    if (st != GG_OK)
        return st;
    if (!s->lines)
        s->lines = json_object();
    if ((copy = strdup(file)) == NULL || (s->dir = strdup(dirname(copy))) == NULL) {
        free(copy);
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    free(copy);
    if (!json_is_object(s->doc))
        return bad(s, "", err, "a suite must be a mapping with name and cases");
    static const char *const strings[] = {"name", "description",   "config", "policies",
                                          "lua",  "cluster_state", "usage",  "namespace"};
    st = check_keys(s, s->doc, "", keys,
                    "name, description, config, policies, lua, cluster_state, usage, namespace, "
                    "cases",
                    err);
    for (size_t i = 0; st == GG_OK && i < sizeof(strings) / sizeof(strings[0]); i++)
        st = check_type(s, s->doc, "", strings[i], V_STRING, err);
    if (st == GG_OK)
        st = check_type(s, s->doc, "", "cases", V_ARRAY, err);
    if (st != GG_OK)
        return st;
    const json_t *cases = json_object_get(s->doc, "cases");
    if (json_array_size(cases) == 0)
        return bad(s, json_is_array(cases) ? "/cases" : "", err, "a suite needs a list of cases");
    for (size_t i = 0; st == GG_OK && i < json_array_size(cases); i++)
        st = check_case(s, json_array_get(cases, i), i, err);
    if (st != GG_OK)
        return st;
    const char *name = json_string_value(json_object_get(s->doc, "name"));
    if (name) {
        snprintf(s->name, sizeof(s->name), "%s", name);
    } else {
        const char *base = strrchr(file, '/');
        snprintf(s->name, sizeof(s->name), "%s", base ? base + 1 : file);
        char *dot = strstr(s->name, ".suite.yaml");
        if (dot)
            *dot = '\0';
    }
    /* Paths: the suite's own, else the flags, else ./policies and ./lua. */
    const char *config = json_string_value(json_object_get(s->doc, "config"));
    const char *policies = json_string_value(json_object_get(s->doc, "policies"));
    const char *lua = json_string_value(json_object_get(s->doc, "lua"));
    const char *state = json_string_value(json_object_get(s->doc, "cluster_state"));
    const char *usage = json_string_value(json_object_get(s->doc, "usage"));
    s->config = config ? suite_path(s, config) : r->o.config ? strdup(r->o.config) : NULL;
    s->policies = policies ? suite_path(s, policies) : NULL;
    s->lua = lua ? suite_path(s, lua) : strdup(r->o.lua);
    s->cluster_state = state ? suite_path(s, state) : NULL;
    s->usage = usage ? suite_path(s, usage) : NULL;
    if ((config && !s->config) || (r->o.config && !s->config) || (policies && !s->policies) ||
        !s->lua || (state && !s->cluster_state) || (usage && !s->usage))
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    if (!s->config && !r->o.no_config)
        return bad(s, "", err,
                   "no configuration: give the suite a config: key or --config FILE (without one "
                   "quotas, pools and guardrails are off), or --no-config");
    return GG_OK;
}

/* ---- diffs -------------------------------------------------------------- */

struct lines {
    char **v;
    size_t n;
};

static void lines_clear(struct lines *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof(*l));
}

static void lines_add(struct lines *l, const char *s, size_t n)
{
    char **grown = realloc(l->v, (l->n + 1) * sizeof(*grown));
    if (!grown)
        return;
    l->v = grown;
    if ((l->v[l->n] = strndup(s, n)) != NULL)
        l->n++;
}

static void lines_split(struct lines *l, const char *text)
{
    const char *p = text;
    do {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        lines_add(l, p, n);
        p = nl ? nl + 1 : NULL;
    } while (p && *p);
}

/* A JSON value as lines: one compact element per line for arrays. */
static void lines_json(struct lines *l, const json_t *v)
{
    if (json_is_array(v) && json_array_size(v)) {
        size_t i;
        json_t *item;
        json_array_foreach(v, i, item)
        {
            char *text = json_dumps(item, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
            if (text)
                lines_add(l, text, strlen(text));
            free(text);
        }
        return;
    }
    char *text = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    lines_add(l, text ? text : "?", text ? strlen(text) : 1);
    free(text);
}

/* A line diff (longest common subsequence): "- " expected only, "+ " actual only. */
static void print_diff(FILE *f, const char *indent, const struct lines *a, const struct lines *b)
{
    size_t n = a->n, m = b->n;
    if ((n + 1) * (m + 1) > TEST_MAX_DIFF_CELLS) {
        for (size_t i = 0; i < n; i++)
            fprintf(f, "%s- %s\n", indent, a->v[i]);
        for (size_t j = 0; j < m; j++)
            fprintf(f, "%s+ %s\n", indent, b->v[j]);
        return;
    }
    unsigned *t = calloc((n + 1) * (m + 1), sizeof(*t));
    if (!t)
        return;
#define T(i, j) t[(i) * (m + 1) + (j)]
    for (size_t i = n; i-- > 0;)
        for (size_t j = m; j-- > 0;)
            T(i, j) = strcmp(a->v[i], b->v[j]) == 0
                          ? T(i + 1, j + 1) + 1
                          : (T(i + 1, j) >= T(i, j + 1) ? T(i + 1, j) : T(i, j + 1));
    size_t i = 0, j = 0;
    while (i < n || j < m) {
        if (i < n && j < m && strcmp(a->v[i], b->v[j]) == 0) {
            fprintf(f, "%s  %s\n", indent, a->v[i]);
            i++;
            j++;
        } else if (i < n && (j == m || T(i + 1, j) >= T(i, j + 1))) {
            fprintf(f, "%s- %s\n", indent, a->v[i++]);
        } else {
            fprintf(f, "%s+ %s\n", indent, b->v[j++]);
        }
    }
#undef T
    free(t);
}

/* Where failure details go while a case runs. */
struct report {
    FILE *f; /* an open_memstream */
    char *text;
    size_t len;
    size_t failures;
    const char *header; /* printed before the first failure of a template */
    bool header_done;
};

static void fail_line(struct report *rp, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void fail_line(struct report *rp, const char *fmt, ...)
{
    va_list ap;
    if (rp->header && !rp->header_done) {
        fprintf(rp->f, "    %s\n", rp->header);
        rp->header_done = true;
    }
    rp->failures++;
    fputs(rp->header ? "      " : "    ", rp->f);
    va_start(ap, fmt);
    vfprintf(rp->f, fmt, ap);
    va_end(ap);
    fputc('\n', rp->f);
}

static const char *diff_indent(const struct report *rp)
{
    return rp->header ? "        " : "      ";
}

static void fail_json(struct report *rp, const char *what, const json_t *expected,
                      const json_t *actual)
{
    struct lines a = {0}, b = {0};
    fail_line(rp, "%s: (- expected, + actual)", what);
    lines_json(&a, expected);
    lines_json(&b, actual);
    print_diff(rp->f, diff_indent(rp), &a, &b);
    lines_clear(&a);
    lines_clear(&b);
}

static void fail_text(struct report *rp, const char *what, const char *expected, const char *actual)
{
    struct lines a = {0}, b = {0};
    fail_line(rp, "%s: (- expected, + actual)", what);
    if (expected)
        lines_split(&a, expected);
    if (actual)
        lines_split(&b, actual);
    else
        lines_add(&b, "(none)", 6);
    print_diff(rp->f, diff_indent(rp), &a, &b);
    lines_clear(&a);
    lines_clear(&b);
}

static bool matches(const char *re, const char *text)
{
    regex_t rx;
    if (regcomp(&rx, re, REG_EXTENDED | REG_NOSUB) != 0)
        return false;
    bool ok = regexec(&rx, text, 0, NULL, 0) == 0;
    regfree(&rx);
    return ok;
}

static char *compact(const json_t *v)
{
    return json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
}

/* ---- running cases ------------------------------------------------------ */

static void compare(struct report *rp, const json_t *expect, const struct dr_result *res,
                    struct engine *engine, const struct dr_options *dopts)
{
    const json_t *v;
    /* A policy that failed is an error, never what a case expected unless it says so: a
     * denial by a crash would pass a case expecting a denial. */
    bool want_error = json_is_true(json_object_get(expect, "error"));
    if (want_error != (res->errors > 0))
        fail_line(rp, "error: expected %s, got %s%s%s", want_error ? "a policy error" : "none",
                  res->errors ? "a policy error" : "none", res->message ? ": " : "",
                  res->message ? res->message : "");
    if ((v = json_object_get(expect, "allowed")) && json_is_true(v) != res->allowed)
        fail_line(rp, "allowed: expected %s, got %s%s%s", json_is_true(v) ? "true" : "false",
                  res->allowed ? "true" : "false", res->message ? ": " : "",
                  res->message ? res->message : "");
    const char *message = json_string_value(json_object_get(expect, "message"));
    if (message && (!res->message || strcmp(message, res->message) != 0))
        fail_text(rp, "message", message, res->message);
    const char *re = json_string_value(json_object_get(expect, "message_matches"));
    if (re && (!res->message || !matches(re, res->message)))
        fail_line(rp, "message_matches: /%s/ does not match %s%s%s", re, res->message ? "\"" : "",
                  res->message ? res->message : "(no message: allowed)", res->message ? "\"" : "");
    if ((v = json_object_get(expect, "warnings")) && !json_equal(v, res->warnings))
        fail_json(rp, "warnings", v, res->warnings);
    if ((v = json_object_get(expect, "warnings_match"))) {
        bool ok = json_array_size(v) == json_array_size(res->warnings);
        for (size_t i = 0; ok && i < json_array_size(v); i++)
            ok = matches(json_string_value(json_array_get(v, i)),
                         json_string_value(json_array_get(res->warnings, i)));
        if (!ok) {
            struct lines a = {0}, b = {0};
            fail_line(rp, "warnings_match: one pattern per warning, in order (- patterns, + "
                          "warnings)");
            for (size_t i = 0; i < json_array_size(v); i++) {
                char *line = NULL;
                if (asprintf(&line, "/%s/", json_string_value(json_array_get(v, i))) >= 0)
                    lines_add(&a, line, strlen(line));
                free(line);
            }
            for (size_t i = 0; i < json_array_size(res->warnings); i++)
                lines_add(&b, json_string_value(json_array_get(res->warnings, i)),
                          json_string_length(json_array_get(res->warnings, i)));
            print_diff(rp->f, diff_indent(rp), &a, &b);
            lines_clear(&a);
            lines_clear(&b);
        }
    }
    if ((v = json_object_get(expect, "patch")) && !json_equal(v, res->patch))
        fail_json(rp, "patch", v, res->patch);
    const char *key;
    json_t *want;
    json_object_foreach(json_object_get(expect, "fields"), key, want)
    {
        json_t *got = NULL;
        if (!res->mutated || jp_pointer_get(res->mutated, key, &got, NULL) != GG_OK)
            got = NULL;
        bool absent = !got || json_is_null(got);
        if (json_is_null(want) ? absent : (got && json_equal(want, got)))
            continue;
        char *w = compact(want), *g = got ? compact(got) : NULL;
        fail_line(rp, "fields %s: expected %s, got %s", key, json_is_null(want) ? "(absent)" : w,
                  g ? g : "(absent)");
        free(w);
        free(g);
    }
    json_object_foreach(json_object_get(expect, "audit"), key, want)
    {
        json_t *got = json_object_get(res->audit, key);
        if (got && json_equal(want, got))
            continue;
        char *w = compact(want), *g = got ? compact(got) : NULL;
        fail_line(rp, "audit %s: expected %s, got %s", key, w, g ? g : "(absent)");
        free(w);
        free(g);
    }
    if ((v = json_object_get(expect, "decision"))) {
        const char *d = json_string_value(v);
        if (d ? !res->decision || strcmp(d, res->decision) != 0 : res->decision != NULL)
            fail_text(rp, "decision", d ? d : "(no decision annotation)", res->decision);
    }
    v = json_object_get(expect, "idempotent");
    if ((!v || json_is_true(v)) && res->allowed && json_array_size(res->patch) && res->mutated) {
        json_t *again = NULL;
        char *denial = NULL;
        struct gg_err err = {{0}};
        if (dr_mutate(engine, res->mutated, dopts, &again, &denial, &err) != GG_OK) {
            fail_line(rp, "idempotent: the second mutate call failed: %s", err.msg);
        } else if (denial) {
            fail_line(rp, "idempotent: mutating the mutated pod again denies it: %s", denial);
        } else if (json_array_size(again)) {
            struct lines a = {0}, b = {0};
            fail_line(rp, "idempotent: mutating the mutated pod again gives a patch (+), "
                          "want none");
            lines_json(&b, again);
            print_diff(rp->f, diff_indent(rp), &a, &b);
            lines_clear(&b);
        }
        json_decref(again);
        free(denial);
    }
}

/* The stream of a case: its manifest file, or its inline object. */
static enum gg_status case_stream(const struct suite *s, const json_t *c, size_t index,
                                  struct yd_stream *stream, char **source, struct gg_err *err)
{
    const char *manifest = json_string_value(json_object_get(c, "manifest"));
    struct yd_limits limits;
    mf_yd_limits(&limits);
    if (manifest) {
        char *path = suite_path(s, manifest), *text = NULL;
        size_t len = 0;
        if (!path)
            return gg_fail(err, GG_ERR_NOMEM, "out of memory");
        enum gg_status st = gg_read_file(path, MF_MAX_FILE_BYTES, &text, &len, err);
        if (st == GG_OK)
            st = yd_load_stream(text, len, path, &limits, stream, err);
        free(text);
        if (st != GG_OK) {
            char ptr[64];
            struct gg_err inner = *err;
            snprintf(ptr, sizeof(ptr), "/cases/%zu/manifest", index);
            free(path);
            return bad(s, ptr, err, "%s", inner.msg);
        }
        *source = path;
        return GG_OK;
    }
    char ptr[64];
    snprintf(ptr, sizeof(ptr), "/cases/%zu/object", index);
    stream->docs = json_pack("[O]", json_object_get(c, "object"));
    stream->pos = malloc(sizeof(*stream->pos));
    *source = strdup(s->file);
    if (!stream->docs || !stream->pos || !*source) {
        yd_stream_clear(stream);
        free(*source);
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    stream->count = 1;
    stream->pos[0] = (struct yd_doc){1, mf_line_of(s->lines, ptr), 1};
    return GG_OK;
}

/* Run one case; false when it failed.  *broken on a manifest that cannot be read. */
static bool run_case(struct test_run *r, const struct suite *s, struct engine *engine,
                     const json_t *c, size_t index, bool *broken)
{
    const char *case_name = json_string_value(json_object_get(c, "name"));
    struct report rp = {0};
    struct yd_stream stream = {0};
    struct mf_set set = {0};
    struct gg_err err = {{0}};
    char *source = NULL;
    rp.f = open_memstream(&rp.text, &rp.len);
    if (!rp.f)
        return false;
    const json_t *expect = json_object_get(c, "expect");
    const json_t *each = json_object_get(c, "expect_each");
    struct dr_options dopts = {
        .namespace = json_string_value(json_object_get(c, "namespace")),
        .operation = json_string_value(json_object_get(c, "operation")),
        .user = json_string_value(json_object_get(c, "user")),
        .groups = json_object_get(c, "groups"),
        .sub_resource = json_string_value(json_object_get(c, "sub_resource")),
        .old_object = json_object_get(c, "old_object"),
    };
    if (!dopts.namespace)
        dopts.namespace = json_string_value(json_object_get(s->doc, "namespace"));
    if (case_stream(s, c, index, &stream, &source, &err) != GG_OK ||
        mf_collect(&stream, source, &set, &err) != GG_OK) {
        *broken = true;
        fprintf(stderr, "gpuguard test: %s\n", err.msg);
        fail_line(&rp, "%s", err.msg);
        goto done;
    }
    cli_keep_dra(r->inventory, &set, stream.docs, dopts.namespace);
    if (expect && json_is_true(json_object_get(expect, "skipped"))) {
        if (set.templates)
            fail_line(&rp, "skipped: expected no pod or pod template, found %zu", set.templates);
        goto done;
    }
    if (set.templates == 0) {
        const char *reason = set.count ? set.entries[0].reason : "no document";
        fail_line(&rp, "the manifest has no pod or pod template (%s)", reason);
        goto done;
    }
    if (each && json_array_size(each) != set.templates) {
        fail_line(&rp, "expect_each has %zu entries but the manifest has %zu pods or templates",
                  json_array_size(each), set.templates);
        goto done;
    }
    size_t t = 0;
    struct wl_walk walk = {0};
    for (size_t i = 0; i < set.count; i++) {
        const struct mf_entry *e = &set.entries[i];
        if (e->type != MF_TEMPLATE)
            continue;
        /* The workload itself first, as check and the server review it. */
        if (wl_walk_at(&walk, engine, &set, i, json_array_get(stream.docs, e->doc), &dopts, false,
                       &err) != GG_OK) {
            fail_line(&rp, "the engine could not run the %s itself: %s", e->kind, err.msg);
            t++;
            continue;
        }
        char header[512];
        snprintf(header, sizeof(header), "%s/%s%s%s (document %zu):", e->kind, e->name,
                 *e->path ? " " : "", e->path, e->doc_number);
        rp.header = set.templates > 1 ? header : NULL;
        rp.header_done = false;
        struct dr_result res;
        struct dr_options own = wl_options(e, &dopts); /* a template's Pod says so */
        if (dr_evaluate(engine, e->pod, &own, &res, &err) != GG_OK) {
            fail_line(&rp, "the engine could not run: %s", err.msg);
        } else {
            wl_fold(&res, wl_walk_object(&walk));
            compare(&rp, each ? json_array_get(each, t) : expect, &res, engine, &own);
            dr_result_clear(&res);
        }
        t++;
    }
    wl_walk_clear(&walk);
done:
    fclose(rp.f);
    bool ok = rp.failures == 0;
    if (ok)
        printf("%sPASS%s %s: %s\n", r->colour ? "\033[32m" : "", r->colour ? "\033[0m" : "",
               s->name, case_name);
    else
        printf("%sFAIL%s %s: %s\n%s", r->colour ? "\033[1;31m" : "", r->colour ? "\033[0m" : "",
               s->name, case_name, rp.text ? rp.text : "");
    free(rp.text);
    free(source);
    mf_set_clear(&set);
    yd_stream_clear(&stream);
    return ok;
}

/* The engine flags of a suite: its own paths, else the command's. */
static void suite_opts(const struct test_run *r, const struct suite *s, struct engine_opts *o)
{
    *o = (struct engine_opts){.config = s->config, .lua = s->lua};
    if (s->policies) {
        o->policies[o->n_policies++] = s->policies;
        return;
    }
    memcpy(o->policies, r->o.policies, sizeof(o->policies));
    o->n_policies = r->o.n_policies;
}

/* What tells one suite's engine from another's: its paths, one a line; NULL when out of memory. */
static char *engine_key(const struct engine_opts *o)
{
    struct buf key;
    buf_init(&key, SIZE_MAX);
    for (size_t i = 0; i < o->n_policies; i++)
        buf_appendf(&key, "%s\n", o->policies[i]);
    buf_appendf(&key, "\n%s\n%s", o->lua, o->config ? o->config : "");
    if (key.failed) {
        buf_clear(&key);
        return NULL;
    }
    return buf_steal(&key, NULL);
}

/* The engine for a suite's paths, reused from the previous suite when they match. */
static enum gg_status suite_engine(struct test_run *r, const struct suite *s, struct engine **out,
                                   struct gg_err *err)
{
    struct engine_opts opts;
    suite_opts(r, s, &opts);
    char *key = engine_key(&opts);
    if (!key)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    if (r->cache.key && strcmp(r->cache.key, key) == 0) {
        free(key);
        *out = r->cache.engine;
        return GG_OK;
    }
    engine_free(r->cache.engine);
    free(r->cache.key);
    r->cache.engine = NULL;
    r->cache.key = NULL;
    enum gg_status st = eo_engine_new(&opts, &r->cache.engine, err);
    if (st != GG_OK) {
        free(key);
        return st;
    }
    engine_set_inventory(r->cache.engine, r->inventory);
    r->cache.key = key;
    *out = r->cache.engine;
    return GG_OK;
}

/*
 * The suite's cluster state into the shared inventory, charged by the suite's own model;
 * without one, usage is taken as empty (as `gpuguard check` takes it).  *charger is the
 * suite's.  Errors point at cluster_state.
 */
static enum gg_status suite_state(struct test_run *r, const struct suite *s, struct engine *engine,
                                  struct charger **charger, struct gg_err *err)
{
    if (!s->cluster_state) {
        json_t *none = json_array();
        inv_replace(r->inventory, none);
        inv_set_ready(r->inventory, true);
        json_decref(none);
        return none ? GG_OK : gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    size_t counts[MF_STATE_N];
    if (eo_load_snapshot(engine, r->inventory, s->cluster_state, counts, charger, NULL, err) ==
        GG_OK)
        return GG_OK;
    struct gg_err inner = *err;
    return bad(s, "/cluster_state", err, "%s", inner.msg);
}

/*
 * The suite's usage history (a file `gpuguard usage -o` wrote) for the rightsizing policy, as
 * `gpuguard check --usage` reads it; without one, rightsizing has no data.  Errors point at usage.
 */
static enum gg_status suite_usage(const struct suite *s, struct gg_err *err)
{
    rss_reset();
    if (!s->usage)
        return GG_OK;
    struct rs_data usage = {0};
    if (rs_file_load(s->usage, &usage, err) != GG_OK) {
        struct gg_err inner = *err;
        return bad(s, "/usage", err, "%s", inner.msg);
    }
    rss_set_source("file");
    rss_publish(&usage, 0); /* a saved snapshot never goes stale */
    return GG_OK;
}

static void run_suite(struct test_run *r, const char *file)
{
    struct suite s;
    struct gg_err err = {{0}};
    struct engine *engine = NULL;
    struct charger *charger = NULL;
    if (suite_load(r, file, &s, &err) != GG_OK) {
        fprintf(stderr, "gpuguard test: %s\n", err.msg);
        r->broken++;
        suite_clear(&s);
        return;
    }
    if (suite_engine(r, &s, &engine, &err) != GG_OK) {
        fprintf(stderr, "gpuguard test: %s: cannot load the policies: %s\n", s.file, err.msg);
        r->broken++;
        suite_clear(&s);
        return;
    }
    if (suite_state(r, &s, engine, &charger, &err) != GG_OK || suite_usage(&s, &err) != GG_OK) {
        fprintf(stderr, "gpuguard test: %s\n", err.msg);
        r->broken++;
        suite_clear(&s);
        return;
    }
    const json_t *cases = json_object_get(s.doc, "cases");
    bool broken = false;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        inv_clear_reservations(r->inventory); /* cases are independent */
        if (run_case(r, &s, engine, json_array_get(cases, i), i, &broken))
            r->passed++;
        else
            r->failed++;
    }
    if (broken)
        r->broken++;
    charger_free(charger);
    suite_clear(&s);
}

int cli_test(int argc, char **argv)
{
    static const char *const suffixes[] = {".suite.yaml", NULL};
    struct test_run r = {0};
    struct cli_files files = {0};
    struct gg_err err = {{0}};
    int rc;
    if (!eo_parse(&test_command, NULL, argc, argv, &r.o, &rc))
        return rc;
    if (!(r.inventory = inv_new())) {
        fprintf(stderr, "gpuguard test: out of memory\n");
        return 2;
    }
    r.colour = cli_use_colour(stdout);
    for (int i = 0; i < r.o.n_args; i++) {
        const char *path = r.o.args[i];
        size_t before = files.count;
        struct stat sb;
        enum gg_status st;
        if (stat(path, &sb) != 0) {
            fprintf(stderr, "gpuguard test: %s: cannot open: %s\n", path, strerror(errno));
            r.broken++;
            continue;
        }
        if (S_ISDIR(sb.st_mode))
            st = cli_files_walk(path, suffixes, &files, &err);
        else
            st = cli_files_add(&files, path, &err);
        if (st != GG_OK) {
            fprintf(stderr, "gpuguard test: %s\n", err.msg);
            r.broken++;
        } else if (files.count == before) {
            fprintf(stderr, "gpuguard test: %s: no *.suite.yaml files\n", path);
            r.broken++;
        }
    }
    for (size_t i = 0; i < files.count; i++)
        run_suite(&r, files.names[i]);
    printf("%zu passed, %zu failed", r.passed, r.failed);
    if (r.broken)
        printf(", %zu broken suite%s", r.broken, r.broken == 1 ? "" : "s");
    printf("\n");
    fflush(stdout);
    engine_free(r.cache.engine);
    inv_free(r.inventory);
    rss_reset();
    free(r.cache.key);
    cli_files_clear(&files);
    return r.broken ? 2 : r.failed ? 1 : 0;
}
