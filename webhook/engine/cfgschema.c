/*
 * cfgschema.c - the configuration's one table of keys, and the three things
 * read from it: the unknown-key check, the JSON Schema and the effective
 * configuration (cfgschema.h).
 *
 * Who reads each section: docs/gpu-policies.md, "Configuration keys".
 */
#include "engine/cfgschema.h"
#include "engine/cfgkeys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* clang-format off */
#define V(name, types, values, def, doc) {name, CS_VALUE, types, values, def, doc, NULL}
#define OBJ(name, doc, keys)             {name, CS_OBJECT, NULL, NULL, NULL, doc, keys}
#define MAP(name, doc, elem)             {name, CS_MAP, NULL, NULL, NULL, doc, elem}
#define LIST(name, doc, elem)            {name, CS_LIST, NULL, NULL, NULL, doc, elem}
#define STRINGS(name, def, doc)          {name, CS_LIST, NULL, NULL, def, doc, a_string}
/* clang-format on */

/* Elements of lists and maps. */
static const struct cfg_key a_string[] = {V("", "string", NULL, NULL, NULL)};
static const struct cfg_key a_gpus[] = {V("", "number string", NULL, NULL, "GPU-equivalents")};
static const struct cfg_key a_mode[] = {V("", "string", "enforce|warn|audit", NULL, NULL)};

static const struct cfg_key taint_keys[] = {
    V("key", "string", NULL, NULL, "the taint's key"),
    V("value", "string", NULL, NULL, "the taint's value"),
    V("effect", "string", "NoSchedule|PreferNoSchedule|NoExecute", NULL, "the taint's effect"),
    {0},
};
static const struct cfg_key a_taint[] = {OBJ("", NULL, taint_keys)};

static const struct cfg_key pool_keys[] = {
    V("name", "string", NULL, NULL, "the pool's name, a DNS label, unique"),
    V("model", "string", NULL, NULL,
      "its GPU model: a name, alias or GFD product of the catalog (lua/gpu.lua) or gpu_models"),
    V("sharing", "string", "exclusive|mig|mps|time-slicing|hami|kai|dra|volcano", NULL,
      "how its GPUs are shared; dra and volcano only run pods already written for them"),
    V("mig_strategy", "string", "mixed|single", NULL,
      "mig: mixed (nvidia.com/mig-<profile>, the default) or single (nvidia.com/gpu)"),
    V("mig_profile", "string", NULL, NULL,
      "mig single strategy: the profile every GPU of the pool is split into"),
    V("replicas", "integer", NULL, NULL, "mps, time-slicing: replicas per GPU (1 when left out)"),
    V("shared_resource", "string", NULL, NULL,
      "the resource name when the device plugin renames shared GPUs (nvidia.com/gpu.shared)"),
    V("mps_env", "boolean", NULL, NULL,
      "mps: set CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and _PINNED_DEVICE_MEM_LIMIT from the share"),
    V("scheduler_name", "string", NULL, NULL, "pods written for this scheduler run here"),
    STRINGS("device_classes", NULL, "dra: the DRA device classes whose claims run here"),
    MAP("node_selector", "the labels the pool's nodes carry; written into the pods placed here",
        a_string),
    LIST("taints", "the taints the pool's nodes carry; pods placed here tolerate them", a_taint),
    V("cost", "number", NULL, "1", "what a GPU here costs against the others, for right-sizing"),
    V("placement", "string", "kueue", NULL,
      "kueue: Kueue's ResourceFlavors place the pods, gpuguard writes no node selector"),
    {0},
};
static const struct cfg_key a_pool[] = {OBJ("", NULL, pool_keys)};

static const struct cfg_key class_keys[] = {
    STRINGS("sharing", NULL, "the sharing modes of the class, preferred first"),
    STRINGS("pools", NULL, "its pools, preferred first (left out: every pool of its modes)"),
    V("max_runtime", "string", NULL, NULL,
      "a duration such as 8h: the pods' activeDeadlineSeconds where the kind has one"),
    STRINGS("namespaces", NULL, "the namespaces that may use it (a trailing * matches a prefix)"),
    {0},
};
static const struct cfg_key a_class[] = {OBJ("", NULL, class_keys)};

static const struct cfg_key profile_keys[] = {
    V("name", "string", NULL, NULL, "a MIG profile name such as 1g.12gb or 1g.12gb+me"),
    V("memory", "string", NULL, NULL, "its memory, a quantity (the name's when left out)"),
    V("slices", "integer", NULL, NULL, "its compute slices, as the name says"),
    V("max", "integer", NULL, NULL, "how many fit on one GPU"),
    V("me", "boolean", NULL, NULL, "whether it has a media engine"),
    V("usable", "string", NULL, NULL, "the memory a process can use, a quantity"),
    {0},
};
static const struct cfg_key a_profile[] = {OBJ("", NULL, profile_keys)};

static const struct cfg_key model_keys[] = {
    V("name", "string", NULL, NULL, "the model's name, such as B200-192GB"),
    V("memory", "string", NULL, NULL, "its memory, a quantity such as 192Gi"),
    V("slices", "integer", NULL, NULL, "its MIG compute slices (MIG models)"),
    LIST("profiles", "its MIG profiles", a_profile),
    STRINGS("aliases", NULL, "other names it goes by"),
    STRINGS("products", NULL, "the GFD nvidia.com/gpu.product values of its cards"),
    V("uncertain", "boolean", NULL, NULL, "its figures are estimates"),
    V("note", "string", NULL, NULL, "where its figures come from"),
    V("family", "string", NULL, NULL, "the model whose profile rules it follows"),
    {0},
};
static const struct cfg_key a_model[] = {OBJ("", NULL, model_keys)};

static const struct cfg_key spot_keys[] = {
    OBJ("taint", "the spot nodes' taint, tolerated by checkpointable pods", taint_keys),
    MAP("node_selector", "the spot nodes' labels, preferred by checkpointable pods", a_string),
    V("weight", "integer", NULL, "50", "the weight of the preference for spot nodes"),
    {0},
};

static const struct cfg_key placement_keys[] = {
    V("non_gpu_pods", "string", "deny|warn", "\"deny\"",
      "pods without a GPU that tolerate a GPU taint or select GPU nodes"),
    STRINGS("exempt_namespaces", NULL, "namespaces whose pods placement leaves alone"),
    STRINGS("exempt_service_accounts", NULL, "namespace/name of service accounts left alone"),
    OBJ("spot", "spot nodes for pods marked gpuguard.io/checkpointable", spot_keys),
    {0},
};

static const struct cfg_key env_map_keys[] = {
    V("env", "string",
      "NVIDIA_VISIBLE_DEVICES|NVIDIA_DRIVER_CAPABILITIES|NVIDIA_MIG_CONFIG_DEVICES", NULL,
      "the variable"),
    V("key", "string", NULL, NULL, "the ConfigMap key it must come from"),
    V("name_annotation", "string", NULL, NULL, "the pod annotation that names the ConfigMap"),
    V("scheduler_name", "string", NULL, NULL, "the scheduler of the pods it applies to"),
    {0},
};
static const struct cfg_key a_env_map[] = {OBJ("", NULL, env_map_keys)};

static const struct cfg_key requesters_keys[] = {
    STRINGS("users", NULL, "user names"),
    STRINGS("groups", NULL, "group names"),
    {0},
};

static const struct cfg_key guardrails_keys[] = {
    STRINGS("required_labels", NULL, "labels every GPU pod must carry"),
    STRINGS("host_paths", NULL, "host paths no pod may mount (a trailing * matches a prefix)"),
    LIST("gpu_env_config_maps", "NVIDIA_* variables from a ConfigMap that are let through",
         a_env_map),
    OBJ("bind_allowed", "who may set spec.nodeName (left out: group system:nodes)",
        requesters_keys),
    OBJ("update_allowed", "who may edit gpuguard.io/ metadata and place gated pods",
        requesters_keys),
    {0},
};

static const struct cfg_key quotas_keys[] = {
    V("default", "number string", NULL, NULL, "GPU-equivalents of a namespace not listed"),
    MAP("namespaces", "GPU-equivalents per namespace", a_gpus),
    V("max_per_pod", "number string", NULL, NULL, "the most GPU-equivalents one pod may use"),
    MAP("per_class", "the most GPU-equivalents one pod of the class may use", a_gpus),
    V("inventory_not_ready", "string", "allow|deny", "\"allow\"",
      "until the usage is known: allow (with a warning) or deny"),
    {0},
};

static const struct cfg_key exclusive_keys[] = {
    V("fractions", "string", "round-up|deny", "\"round-up\"",
      "a fraction on an exclusive pool: round up to whole GPUs (with a warning) or deny"),
    {0},
};

static const struct cfg_key other_gpus_keys[] = {
    STRINGS("resources", "[\"amd.com/gpu\",\"gpu.intel.com/i915\",\"gpu.intel.com/xe\"]",
            "resources of other vendors' GPUs"),
    V("mode", "string", "charge|deny", "\"charge\"", "charge a whole GPU per device, or deny them"),
    {0},
};

static const struct cfg_key dra_keys[] = {
    MAP("classes", "GPU-equivalents per device of other GPU device classes", a_gpus),
    V("allocation_all", "string number", NULL, "\"deny\"",
      "a request for every device of a class: deny, or the GPUs to charge it"),
    STRINGS("gpu_drivers", NULL, "more DRA drivers whose devices are GPUs"),
    {0},
};

static const struct cfg_key prometheus_keys[] = {
    V("url", "string", NULL, NULL, "the Prometheus HTTP API's base URL"),
    V("token_file", "string", NULL, NULL, "a bearer token, re-read when it changes"),
    V("ca_file", "string", NULL, NULL, "the CA bundle for https"),
    V("cert_file", "string", NULL, NULL, "a client certificate (with key_file)"),
    V("key_file", "string", NULL, NULL, "the client certificate's key"),
    V("timeout", "string", NULL, "\"30s\"", "one query, connection included"),
    {0},
};

static const struct cfg_key rs_labels_keys[] = {
    V("namespace", "string", NULL, "\"namespace\"", "the series' namespace label"),
    V("pod", "string", NULL, "\"pod\"", "the series' pod label"),
    {0},
};

static const struct cfg_key rightsizing_keys[] = {
    V("mode", "string boolean", "off|recommend|apply", "\"off\"",
      "off, recommend (warn and annotate) or apply (also lower the request)"),
    V("headroom", "number", NULL, "1.25", "peak x headroom must fit"),
    V("min_history", "string", NULL, "\"1h\"", "at least this span of samples before acting"),
    STRINGS("classes", "[\"inference\",\"interactive\",\"batch\"]", "the classes right-sized"),
    V("max_series", "integer", NULL, "200000", "the most series one answer may have"),
    OBJ("prometheus", "where the GPU memory history is", prometheus_keys),
    V("metric", "string", NULL, "\"DCGM_FI_DEV_FB_USED\"", "the GPU memory metric"),
    OBJ("labels", "the labels that name a series' pod", rs_labels_keys),
    V("window", "string", NULL, "\"7d\"", "the history looked at"),
    V("refresh", "string", NULL, "\"5m\"", "how often the source queries"),
    {0},
};

static const struct cfg_key queue_ns_keys[] = {
    V("queue", "string", NULL, NULL, "the namespace's default queue"),
    MAP("classes", "the namespace's queue by class", a_string),
    STRINGS("allowed", NULL, "the queues this namespace may name"),
    STRINGS("allowed_priority_classes", NULL,
            "Kueue only: the kueue.x-k8s.io/priority-class values it may name"),
    {0},
};
static const struct cfg_key a_queue_ns[] = {OBJ("", NULL, queue_ns_keys)};

static const struct cfg_key queues_keys[] = {
    V("system", "string", "kueue|kai", NULL, "the queueing system"),
    V("default", "string", NULL, NULL, "the queue of GPU workloads that name none"),
    MAP("classes", "the queue by workload class", a_string),
    MAP("namespaces", "per namespace, over classes and default", a_queue_ns),
    MAP("priority_classes", "Kueue only: kueue.x-k8s.io/priority-class by class", a_string),
    STRINGS("controller_accounts", NULL,
            "users whose UPDATEs of workloads are allowed as they are"),
    {0},
};

static const struct cfg_key audit_keys[] = {
    V("enabled", "boolean", NULL, "true",
      "audit the running GPU pods and their workloads (serve, with the inventory on)"),
    V("interval", "string", NULL, "\"10m\"", "between audits; one also runs after each reload"),
    V("report_api", "string", "wgpolicyk8s.io/v1alpha2|openreports.io/v1alpha1",
      "\"wgpolicyk8s.io/v1alpha2\"", "the reports' API: PolicyReport or OpenReports' Report"),
    V("rate", "integer", NULL, "50", "evaluations per second at most (10 to 100000)"),
    {0},
};

static const struct cfg_key engine_keys[] = {
    V("memory", "string integer", NULL, "\"32Mi\"", "Lua memory per worker VM"),
    V("instructions", "integer", NULL, "10000000", "Lua instructions per policy call"),
    V("timeout", "string", NULL, "\"2s\"", "Lua wall clock per request"),
    {0},
};

static const struct cfg_key override_keys[] = {
    V("mode", "string", "enforce|warn|audit", NULL, "the policy's mode"),
    V("failure", "string", "deny|allow", NULL, "what a policy error does"),
    MAP("namespaces", "the mode per namespace", a_mode),
    {0},
};
static const struct cfg_key an_override[] = {OBJ("", NULL, override_keys)};

static const struct cfg_key enforcement_keys[] = {
    V("mode", "string", "enforce|warn|audit", NULL, "every policy's mode"),
    V("failure", "string", "deny|allow", NULL, "what a policy error does, for every policy"),
    MAP("namespaces", "the mode per namespace, for every policy", a_mode),
    MAP("policies", "per policy, over the settings above", an_override),
    {0},
};

static const struct cfg_key policies_keys[] = {
    STRINGS("disabled", NULL,
            "policies not loaded, named as they declare themselves (gpu-quota); a policy of a "
            "later policy directory may then declare the name in their place"),
    {0},
};

static const struct cfg_key workloads_keys[] = {
    V("mode", "string", "mutate|validate", "\"mutate\"",
      "mutate workload templates, or only judge them"),
    {0},
};

const struct cfg_key cfg_schema[] = {
    OBJ("audit", "the background audit of what runs, into policy reports", audit_keys),
    MAP("classes", "workload classes: their sharing modes, pools and namespaces", a_class),
    V("default_class", "string", NULL, NULL, "the class of a pod that names none"),
    OBJ("dra", "DRA claims of other GPU drivers and classes", dra_keys),
    OBJ("enforcement", "policy modes and failure policy, overall, per namespace, per policy",
        enforcement_keys),
    OBJ("engine", "the Lua engine's limits", engine_keys),
    OBJ("exclusive", "fractional requests on exclusive pools", exclusive_keys),
    LIST("gpu_models", "GPU models the catalog (lua/gpu.lua) lacks", a_model),
    OBJ("guardrails", "what no pod may do, and who may do the rest", guardrails_keys),
    OBJ("other_gpus", "other vendors' GPUs, which gpuguard neither places nor splits",
        other_gpus_keys),
    OBJ("placement", "pods without a GPU stay off GPU nodes; spot nodes", placement_keys),
    OBJ("policies", "policies of the policy directories turned off", policies_keys),
    LIST("pools", "GPU node pools, in order of preference", a_pool),
    OBJ("queues", "queue routing for Kueue or KAI Scheduler", queues_keys),
    OBJ("quotas", "namespace GPU quotas in GPU-equivalents", quotas_keys),
    OBJ("rightsizing", "requests right-sized from DCGM's GPU memory history", rightsizing_keys),
    OBJ("workloads", "workload objects (Deployments, Jobs, operators' kinds)", workloads_keys),
    {0},
};

#define PATH_MAX_LEN 256 /* a key path in messages; longer ones are cut */

static const struct cfg_key *find_key(const struct cfg_key *keys, const char *name)
{
    for (; keys->name; keys++)
        if (strcmp(keys->name, name) == 0)
            return keys;
    return NULL;
}

/* The unknown-key message for key at path ("pools[2]."), known: keys plus extra (may be NULL). */
static enum gg_status refuse(const char *path, const char *key, const struct cfg_key *keys,
                             const json_t *extra, struct gg_err *err)
{
    size_t n = json_array_size(extra);
    for (const struct cfg_key *k = keys; k->name; k++)
        n++;
    const char **known = malloc((n + 1) * sizeof(*known));
    if (!known)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory checking the configuration");
    size_t i = 0;
    for (const struct cfg_key *k = keys; k->name; k++)
        known[i++] = k->name;
    for (size_t j = 0; j < json_array_size(extra); j++)
        if (json_is_string(json_array_get(extra, j)))
            known[i++] = json_string_value(json_array_get(extra, j));
    char msg[sizeof(err->msg)];
    cfgkeys_unknown(msg, sizeof(msg), path, key, known, i);
    free(known);
    return gg_fail(err, GG_ERR_INVALID, "%s", msg);
}

static enum gg_status check_value(const json_t *v, const struct cfg_key *k, char *path,
                                  struct gg_err *err);

/* path + "." + key, or path + "[i]": the child's path, cut to PATH_MAX_LEN. */
static void child_path(char *out, const char *path, const char *key, size_t index)
{
    if (key)
        snprintf(out, PATH_MAX_LEN, "%s%s%s", path, *path ? "." : "", key);
    else
        snprintf(out, PATH_MAX_LEN, "%s[%zu]", path, index + 1);
}

static enum gg_status check_object(const json_t *v, const struct cfg_key *keys, const char *path,
                                   struct gg_err *err)
{
    const char *key;
    const json_t *item;
    json_object_foreach((json_t *)v, key, item)
    {
        const struct cfg_key *k = find_key(keys, key);
        char at[PATH_MAX_LEN];
        if (!k) {
            snprintf(at, sizeof(at), "%s.", path);
            return refuse(at, key, keys, NULL, err);
        }
        child_path(at, path, key, 0);
        enum gg_status st = check_value(item, k, at, err);
        if (st != GG_OK)
            return st;
    }
    return GG_OK;
}

static enum gg_status check_value(const json_t *v, const struct cfg_key *k, char *path,
                                  struct gg_err *err)
{
    char at[PATH_MAX_LEN];
    enum gg_status st = GG_OK;
    if (k->shape == CS_OBJECT && json_is_object(v))
        return check_object(v, k->sub, path, err);
    if (k->shape == CS_MAP && json_is_object(v)) {
        const char *key;
        const json_t *item;
        json_object_foreach((json_t *)v, key, item)
        {
            child_path(at, path, key, 0);
            if ((st = check_value(item, k->sub, at, err)) != GG_OK)
                return st;
        }
    } else if (k->shape == CS_LIST && json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            child_path(at, path, NULL, i);
            if ((st = check_value(json_array_get(v, i), k->sub, at, err)) != GG_OK)
                return st;
        }
    }
    return st;
}

static bool is_declared(const json_t *declared, const char *name)
{
    for (size_t i = 0; i < json_array_size(declared); i++)
        if (json_is_string(json_array_get(declared, i)) &&
            strcmp(json_string_value(json_array_get(declared, i)), name) == 0)
            return true;
    return false;
}

enum gg_status cfgschema_check(const json_t *root, const json_t *declared, struct gg_err *err)
{
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)root, key, v)
    {
        const struct cfg_key *k = find_key(cfg_schema, key);
        if (!k && declared && !is_declared(declared, key))
            return refuse("", key, cfg_schema, declared, err);
        char at[PATH_MAX_LEN];
        snprintf(at, sizeof(at), "%s", key);
        enum gg_status st = k ? check_value(v, k, at, err) : GG_OK;
        if (st != GG_OK)
            return st;
    }
    return GG_OK;
}

/* "a b" -> ["a", "b"], split at sep; NULL when out of memory. */
static json_t *split(const char *s, char sep)
{
    json_t *out = json_array();
    while (out && s && *s) {
        const char *end = strchr(s, sep);
        size_t n = end ? (size_t)(end - s) : strlen(s);
        if (json_array_append_new(out, json_stringn(s, n)))
            return json_decref(out), NULL;
        s = end ? end + 1 : NULL;
    }
    return out;
}

static json_t *schema_of(const struct cfg_key *k)
{
    json_t *s = json_object();
    if (!s)
        return NULL;
    int bad = 0;
    if (k->doc)
        bad |= json_object_set_new(s, "description", json_string(k->doc));
    if (k->def)
        bad |= json_object_set_new(s, "default", json_loads(k->def, JSON_DECODE_ANY, NULL));
    switch (k->shape) {
    case CS_VALUE: {
        json_t *types = split(k->types, ' ');
        bad |=
            json_object_set_new(s, "type",
                                json_array_size(types) == 1 ? json_incref(json_array_get(types, 0))
                                                            : json_incref(types));
        json_decref(types);
        if (k->values) {
            json_t *values = split(k->values, '|');
            /* YAML 1.1 reads an unquoted off as false, and the readers take it so. */
            if (strstr(k->types, "boolean") && json_array_append_new(values, json_false()))
                bad = 1;
            bad |= json_object_set_new(s, "enum", values);
        }
        break;
    }
    case CS_OBJECT: {
        json_t *props = json_object();
        for (const struct cfg_key *c = k->sub; props && c->name; c++)
            bad |= json_object_set_new(props, c->name, schema_of(c));
        bad |= json_object_set_new(s, "type", json_string("object"));
        bad |= json_object_set_new(s, "properties", props);
        bad |= json_object_set_new(s, "additionalProperties", json_false());
        break;
    }
    case CS_MAP:
        bad |= json_object_set_new(s, "type", json_string("object"));
        bad |= json_object_set_new(s, "additionalProperties", schema_of(k->sub));
        break;
    case CS_LIST:
        bad |= json_object_set_new(s, "type", json_string("array"));
        bad |= json_object_set_new(s, "items", schema_of(k->sub));
        break;
    }
    if (bad)
        return json_decref(s), NULL;
    return s;
}

json_t *cfgschema_json_schema(void)
{
    const struct cfg_key top = {"", CS_OBJECT, NULL, NULL, NULL, NULL, cfg_schema};
    json_t *body = schema_of(&top);
    json_t *s = json_pack(
        "{s:s,s:s,s:s}", "$schema", "http://json-schema.org/draft-07/schema#", "title",
        "gpuguard configuration", "description",
        "gpuguard.yaml (docs/gpu-policies.md describes every key). A policy of your own that "
        "reads sections of its own: add them to properties in your copy.");
    if (!body || !s || json_object_update(s, body) != 0)
        json_decref(s), s = NULL;
    json_decref(body);
    return s;
}

/* Fill in the defaults of v's keys (v a copy: written in place); false when out of memory. */
static bool fill(json_t *v, const struct cfg_key *k)
{
    if (k->shape == CS_OBJECT && json_is_object(v)) {
        for (const struct cfg_key *c = k->sub; c->name; c++) {
            json_t *have = json_object_get(v, c->name);
            if (have) {
                if (!fill(have, c))
                    return false;
            } else if (c->def && json_object_set_new(
                                     v, c->name, json_loads(c->def, JSON_DECODE_ANY, NULL)) != 0) {
                return false;
            }
        }
    } else if (k->shape == CS_MAP && json_is_object(v)) {
        const char *key;
        json_t *item;
        json_object_foreach(v, key, item)
        {
            if (!fill(item, k->sub))
                return false;
        }
    } else if (k->shape == CS_LIST && json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if (!fill(json_array_get(v, i), k->sub))
                return false;
    }
    return true;
}

json_t *cfgschema_effective(const json_t *root)
{
    json_t *out = json_deep_copy(root);
    const char *key;
    json_t *v;
    json_object_foreach(out, key, v)
    {
        const struct cfg_key *k = find_key(cfg_schema, key);
        if (k && !fill(v, k))
            return json_decref(out), NULL;
    }
    return out;
}
