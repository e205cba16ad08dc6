/*
 * config.c - read the configuration file and check the engine's sections.
 */
#include "engine/config.h"
#include "engine/cfgschema.h"
#include "util/duration.h"

#include "codec/admission.h"
#include "codec/quantity.h"
#include "codec/yamldoc.h"

#include <stdlib.h>
#include <string.h>

/* In the order of enum policy_mode and enum policy_failure. */
static const char *const mode_names[] = {"enforce", "warn", "audit"};
static const char *const failure_names[] = {"deny", "allow"};

static int find_name(const char *s, const char *const *names, int n)
{
    for (int i = 0; s && i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

int cfg_mode_parse(const char *s)
{
    return find_name(s, mode_names, 3);
}

const char *cfg_mode_name(enum policy_mode mode)
{
    return mode_names[mode];
}

int cfg_failure_parse(const char *s)
{
    return find_name(s, failure_names, 2);
}

enum gg_status cfg_load(const char *path, json_t **root, struct gg_err *err)
{
    if (!path) {
        *root = json_object();
        return GG_OK;
    }
    char *text = NULL;
    size_t len = 0;
    enum gg_status st = gg_read_file(path, CFG_MAX_FILE, &text, &len, err);
    if (st != GG_OK)
        return st;
    json_t *doc = NULL;
    st = yd_load_one(text, len, path, NULL, &doc, err);
    free(text);
    if (st != GG_OK)
        return st;
    if (!doc || json_is_null(doc)) {
        json_decref(doc);
        doc = json_object();
    }
    if (!json_is_object(doc)) {
        json_decref(doc);
        return gg_fail(err, GG_ERR_INVALID, "%s: the configuration must be a mapping", path);
    }
    /* Keys first, so that a misspelt key is said as such and not as the value it leaves out;
     * the top-level sections are checked once the policies have said which they read. */
    struct gg_err sub = {{0}};
    if ((st = cfgschema_check(doc, NULL, &sub)) != GG_OK) {
        json_decref(doc);
        return gg_fail(err, st, "%s: %s", path, sub.msg);
    }
    *root = doc;
    return GG_OK;
}

static enum gg_status limit_quantity(const json_t *engine, const char *key, size_t *out,
                                     struct gg_err *err)
{
    json_t *v = json_object_get(engine, key);
    if (!v)
        return GG_OK;
    int64_t milli;
    if (json_is_integer(v) && json_integer_value(v) > 0) {
        *out = (size_t)json_integer_value(v);
        return GG_OK;
    }
    if (!json_is_string(v) || qty_parse(json_string_value(v), &milli, NULL, NULL) != GG_OK ||
        milli < 1024 * 1000)
        return gg_fail(err, GG_ERR_INVALID, "engine.%s: must be a size such as 32Mi (at least 1Ki)",
                       key);
    *out = (size_t)(milli / 1000);
    return GG_OK;
}

enum gg_status cfg_limits(const json_t *root, struct cfg_limits *out, struct gg_err *err)
{
    *out =
        (struct cfg_limits){.memory = 32u << 20, .instructions = 10000000, .timeout_us = 2000000};
    json_t *engine = json_object_get(root, "engine");
    if (!engine)
        return GG_OK;
    if (!json_is_object(engine))
        return gg_fail(err, GG_ERR_INVALID, "engine: must be a mapping");
    json_t *v;
    enum gg_status st = limit_quantity(engine, "memory", &out->memory, err);
    if (st != GG_OK)
        return st;
    v = json_object_get(engine, "instructions");
    if (v) {
        if (!json_is_integer(v) || json_integer_value(v) < 1000)
            return gg_fail(err, GG_ERR_INVALID,
                           "engine.instructions: must be a whole number of at least 1000");
        out->instructions = json_integer_value(v);
    }
    v = json_object_get(engine, "timeout");
    if (v) {
        int64_t ms;
        if (!json_is_string(v) || duration_parse_ms(json_string_value(v), &ms) != GG_OK || ms <= 0)
            return gg_fail(err, GG_ERR_INVALID,
                           "engine.timeout: must be a duration such as 2s or 500ms");
        out->timeout_us = ms * 1000;
    }
    return GG_OK;
}

/* A {mode, failure, namespaces} mapping; `where` is its key path. */
static enum gg_status check_override(const json_t *o, const char *where, struct gg_err *err)
{
    if (!json_is_object(o))
        return gg_fail(err, GG_ERR_INVALID, "%s: must be a mapping", where);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v)
    {
        if (strcmp(key, "mode") == 0) {
            if (cfg_mode_parse(json_string_value(v)) < 0)
                return gg_fail(err, GG_ERR_INVALID, "%s.mode: must be enforce, warn or audit",
                               where);
        } else if (strcmp(key, "failure") == 0) {
            if (cfg_failure_parse(json_string_value(v)) < 0)
                return gg_fail(err, GG_ERR_INVALID, "%s.failure: must be deny or allow", where);
        } else if (strcmp(key, "namespaces") == 0) {
            const char *ns;
            json_t *m;
            if (!json_is_object(v))
                return gg_fail(err, GG_ERR_INVALID, "%s.namespaces: must map namespaces to modes",
                               where);
            json_object_foreach(v, ns, m)
            {
                if (cfg_mode_parse(json_string_value(m)) < 0)
                    return gg_fail(err, GG_ERR_INVALID,
                                   "%s.namespaces.%s: must be enforce, warn or audit", where, ns);
            }
        } /* policies: checked by the caller; other keys: by cfgschema_check */
    }
    return GG_OK;
}

enum gg_status cfg_check_enforcement(const json_t *root, struct gg_err *err)
{
    json_t *enf = json_object_get(root, "enforcement");
    if (!enf)
        return GG_OK;
    enum gg_status st = check_override(enf, "enforcement", err);
    if (st != GG_OK)
        return st;
    json_t *policies = json_object_get(enf, "policies");
    if (!policies)
        return GG_OK;
    if (!json_is_object(policies))
        return gg_fail(err, GG_ERR_INVALID, "enforcement.policies: must map policy names");
    const char *name;
    json_t *o;
    json_object_foreach(policies, name, o)
    {
        char where[160];
        snprintf(where, sizeof(where), "enforcement.policies.%s", name);
        if ((st = check_override(o, where, err)) != GG_OK)
            return st;
    }
    return GG_OK;
}

/* Apply one override level (checked at load, so values are valid). */
static void apply(const json_t *o, int *mode, int *failure)
{
    int m = cfg_mode_parse(json_string_value(json_object_get(o, "mode")));
    int f = cfg_failure_parse(json_string_value(json_object_get(o, "failure")));
    if (m >= 0)
        *mode = m;
    if (f >= 0)
        *failure = f;
}

void cfg_enforcement_for(const json_t *root, const char *policy, const char *ns, int *mode,
                         int *failure)
{
    json_t *enf = json_object_get(root, "enforcement");
    if (!enf)
        return;
    json_t *own = json_object_get(json_object_get(enf, "policies"), policy);
    apply(enf, mode, failure);
    apply(own, mode, failure);
    int m =
        cfg_mode_parse(json_string_value(json_object_get(json_object_get(enf, "namespaces"), ns)));
    if (m >= 0)
        *mode = m;
    m = cfg_mode_parse(json_string_value(json_object_get(json_object_get(own, "namespaces"), ns)));
    if (m >= 0)
        *mode = m;
}

enum gg_status cfg_audit(const json_t *root, struct cfg_audit *out, struct gg_err *err)
{
    const json_t *section = json_object_get(root, "audit");
    *out = (struct cfg_audit){.enabled = true,
                              .interval_ms = 600000,
                              .report_api = "wgpolicyk8s.io/v1alpha2",
                              .rate = 50};
    if (!section || json_is_null(section))
        return GG_OK;
    if (!json_is_object(section))
        return gg_fail(err, GG_ERR_INVALID, "audit: must be a mapping");
    const json_t *v;
    if ((v = json_object_get(section, "enabled"))) {
        if (!json_is_boolean(v))
            return gg_fail(err, GG_ERR_INVALID, "audit.enabled: must be true or false");
        out->enabled = json_is_true(v);
    }
    if ((v = json_object_get(section, "interval")) &&
        (!json_is_string(v) ||
         duration_parse_ms(json_string_value(v), &out->interval_ms) != GG_OK ||
         out->interval_ms < CFG_AUDIT_MIN_INTERVAL_MS))
        return gg_fail(err, GG_ERR_INVALID,
                       "audit.interval: must be a duration of at least 10s, such as 10m");
    if ((v = json_object_get(section, "report_api"))) {
        const char *api = json_string_value(v);
        if (!api || (strcmp(api, "wgpolicyk8s.io/v1alpha2") != 0 &&
                     strcmp(api, "openreports.io/v1alpha1") != 0))
            return gg_fail(err, GG_ERR_INVALID,
                           "audit.report_api: must be wgpolicyk8s.io/v1alpha2 or "
                           "openreports.io/v1alpha1");
        out->report_api = api;
    }
    if ((v = json_object_get(section, "rate")) &&
        (!json_is_integer(v) || json_integer_value(v) < CFG_AUDIT_MIN_RATE ||
         json_integer_value(v) > CFG_AUDIT_MAX_RATE))
        return gg_fail(err, GG_ERR_INVALID, "audit.rate: must be an integer from %d to %d",
                       CFG_AUDIT_MIN_RATE, CFG_AUDIT_MAX_RATE);
    if (v)
        out->rate = json_integer_value(v);
    return GG_OK;
}

enum gg_status cfg_workloads_mode(const json_t *root, enum cfg_workloads_mode *out,
                                  struct gg_err *err)
{
    json_t *section = json_object_get(root, "workloads");
    *out = CFG_WORKLOADS_MUTATE;
    if (!section || json_is_null(section))
        return GG_OK;
    if (!json_is_object(section))
        return gg_fail(err, GG_ERR_INVALID, "workloads: must be a mapping");
    json_t *mode = json_object_get(section, "mode");
    if (!mode)
        return GG_OK;
    const char *m = json_string_value(mode);
    if (m && strcmp(m, "validate") == 0)
        *out = CFG_WORKLOADS_VALIDATE;
    else if (!m || strcmp(m, "mutate") != 0)
        return gg_fail(err, GG_ERR_INVALID, "workloads.mode: must be mutate or validate");
    return GG_OK;
}
