/*
 * workloads.c - a workload's pod templates through the pod policies, for
 * `gpuguard check` and the webhook.  See workloads.h.
 */
#include "engine/workloads.h"

#include "engine/config.h"
#include "engine/luabridge.h"
#include "engine/sanitize.h"
#include "codec/jsonpatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void wl_result_clear(struct wl_result *r)
{
    if (!r)
        return;
    dr_result_clear(&r->pod);
    json_decref(r->mapped);
    json_decref(r->dropped);
    r->mapped = r->dropped = NULL;
}

struct dr_options wl_options(const struct mf_entry *e, const struct dr_options *o)
{
    struct dr_options own = *o;
    own.template_path = mf_is_template(e) ? e->path : NULL;
    return own;
}

enum gg_status wl_template(struct engine *engine, const struct mf_entry *e, const json_t *doc,
                           const struct dr_options *o, struct wl_result *out, struct gg_err *err)
{
    struct wl_result r = {0};
    struct dr_options own = wl_options(e, o);
    enum gg_status st = dr_evaluate(engine, e->pod, &own, &r.pod, err);
    if (st != GG_OK)
        return st;
    if (r.pod.allowed && json_array_size(r.pod.patch))
        st = mf_map_patch(e, doc, r.pod.patch, &r.mapped, &r.dropped, err);
    if (st == GG_OK && !r.mapped)
        r.mapped = json_array();
    if (st == GG_OK && !r.dropped)
        r.dropped = json_array();
    if (st == GG_OK && (!r.mapped || !r.dropped))
        st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
    if (st != GG_OK) {
        wl_result_clear(&r);
        return st;
    }
    *out = r;
    return GG_OK;
}

/* Is the request for something other than a Pod that may hold pod templates? */
static bool maybe_workload(const struct adm_request *req)
{
    return req->object && !*req->sub_resource && (strcmp(req->kind, "Pod") != 0 || *req->group) &&
           (req->operation == ADM_CREATE || req->operation == ADM_UPDATE);
}

/*
 * The request's parts that manifests and the dry run read, as jansson
 * values (the review itself is nodes: codec/admission.h); owned.
 */
struct json_req {
    json_t *object, *old_object, *user_info;
};

static void json_req_clear(struct json_req *j)
{
    json_decref(j->object);
    json_decref(j->old_object);
    json_decref(j->user_info);
}

/* *out = node as a jansson value (none for none). */
static enum gg_status node_json(const struct jf_node *node, json_t **out, const char *what,
                                struct gg_err *err)
{
    if (node && !(*out = jf_to_json(node)))
        return gg_fail(err, GG_ERR_NOMEM, "out of memory reading %s", what);
    return GG_OK;
}

/* Does the UPDATE leave every template as it was? */
static bool templates_unchanged(const struct json_req *req, const struct mf_set *now)
{
    struct mf_set before = {0};
    struct gg_err err = {{0}};
    if (!req->old_object || mf_collect_object(req->old_object, "oldObject", &before, &err) != GG_OK)
        return false;
    bool same = before.count == now->count;
    for (size_t i = 0; same && i < now->count; i++) {
        const struct mf_entry *a = &before.entries[i], *b = &now->entries[i];
        same = a->type == b->type &&
               (a->type != MF_TEMPLATE ||
                (strcmp(a->template_ptr, b->template_ptr) == 0 && json_equal(a->pod, b->pod)));
    }
    mf_set_clear(&before);
    return same;
}

/* The label key's value on obj ("" when absent). */
static const char *label_of(const json_t *obj, const char *key)
{
    const json_t *labels = json_object_get(json_object_get(obj, "metadata"), "labels");
    const char *v = json_string_value(json_object_get(labels, key));
    return v ? v : "";
}

/*
 * Does the UPDATE move the workload to another queue or Kueue priority
 * class?  A label-only edit of a suspended Job is how a workload changes
 * queue: the object's policies judge it though its templates are unchanged.
 */
static bool queue_relabelled(const struct json_req *req)
{
    static const char *const keys[] = {GG_KEY_KUEUE_QUEUE, GG_KEY_KUEUE_PRIORITY, GG_KEY_KAI_QUEUE};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        if (strcmp(label_of(req->object, keys[i]), label_of(req->old_object, keys[i])) != 0)
            return true;
    return false;
}

/* "<path>: <text>" as a new JSON string. */
static json_t *prefixed(const char *path, const char *text)
{
    char *s = NULL;
    if (asprintf(&s, "%s: %s", path, text) < 0)
        return NULL;
    json_t *v = json_string(s);
    free(s);
    return v;
}

/* One warning per op that workloads.mode: validate keeps off the object. */
static void warn_changes(json_t *warnings, const char *path, const char *what, const json_t *ops)
{
    size_t i;
    json_t *op;
    json_array_foreach(ops, i, op)
    {
        /* Warnings are cut to SANITIZE_WARNING_MAX: the start of the value is enough. */
        char value[SANITIZE_WARNING_MAX + 1] = "", text[2 * SANITIZE_WARNING_MAX + 512];
        json_t *v = json_object_get(op, "value");
        size_t n = v ? json_dumpb(v, value, sizeof(value) - 1, JSON_COMPACT | JSON_ENCODE_ANY) : 0;
        value[n < sizeof(value) ? n : sizeof(value) - 1] = '\0';
        snprintf(text, sizeof(text), "workloads.mode is validate, so %s: %s %.256s%s%s", what,
                 json_string_value(json_object_get(op, "op")),
                 json_string_value(json_object_get(op, "path")), v ? " " : "", value);
        json_array_append_new(warnings, prefixed(path, text));
    }
}

/* The verdict's pieces while the templates are gathered. */
struct gather {
    json_t *patch, *warnings, *audit, *fired;
    char *denials;
    size_t denials_left_out; /* past LB_REPORT_DENIALS_MAX bytes (the first always fits) */
    bool lost;        /* a denial could not be recorded: the verdict is a denial all the same */
    long long charge; /* milli-GPU-equivalents of all the pods, GG_KEY_CHARGE x count */
    char charges[WL_CHARGE_TEXT];
    unsigned errors; /* policy calls that raised or broke a budget */
};

/* What a template's changes become: the patch, warnings, or nothing (the
 * validating call, after the mutating one said it all). */
enum changes { CHANGES_PATCH, CHANGES_WARN, CHANGES_NONE };

/* A denial, after its template's path (none for the object's own). */
static void add_denial(struct gather *g, const char *path, const char *message)
{
    char *joined = NULL;
    if (g->denials && strlen(g->denials) + strlen(message) > LB_REPORT_DENIALS_MAX) {
        g->denials_left_out++;
        return;
    }
    if (asprintf(&joined, "%s%s%s%s%s", g->denials ? g->denials : "", g->denials ? "; " : "",
                 path ? path : "", path ? ": " : "", message) < 0) {
        g->lost = true;
        return;
    }
    free(g->denials);
    g->denials = joined;
}

/* How many denials were left out, after those kept. */
static void left_out_note(struct gather *g)
{
    char *joined = NULL;
    if (asprintf(&joined, "%s; gpuguard: %zu more denials left out", g->denials,
                 g->denials_left_out) < 0) {
        g->lost = true;
        return;
    }
    free(g->denials);
    g->denials = joined;
}

/* Ops for the answer's patch; ops that cannot be joined to it deny: never admit without them. */
static void add_patch(struct gather *g, json_t *ops)
{
    if (json_array_extend(g->patch, ops) != 0)
        g->lost = true;
}

/* An integer member of obj, or 1. */
static long long count_member(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_integer(v) && json_integer_value(v) >= 0 ? json_integer_value(v) : 1;
}

long long wl_pod_count(const json_t *obj, const char *template_ptr)
{
    long long n = 1;
    char prefix[1024];
    size_t len = strlen(template_ptr);
    if (len >= sizeof(prefix))
        return 1;
    /* Every ancestor of the template, each prefix ending where a reference token does. */
    for (size_t at = 1; at < len; at++) {
        if (template_ptr[at] != '/')
            continue;
        json_t *parent = NULL;
        memcpy(prefix, template_ptr, at);
        prefix[at] = '\0';
        enum gg_status got = jp_pointer_get(obj, prefix, &parent, NULL);
        if (got == GG_ERR_NOMEM) /* the most, not fewer: the count is charged */
            return WL_MAX_PODS;
        if (got != GG_OK || !json_is_object(parent))
            continue;
        n *= count_member(parent, "replicas") * count_member(parent, "parallelism");
        if (strcmp(template_ptr + at, "/workerTemplate") == 0) /* a LeaderWorkerSet group */
            n *= count_member(parent, "size") > 0 ? count_member(parent, "size") - 1 : 0;
        if (n > WL_MAX_PODS)
            return WL_MAX_PODS;
    }
    return n;
}

long long wl_pod_charge(const json_t *pod)
{
    const char *note = json_string_value(json_object_get(
        json_object_get(json_object_get(pod, "metadata"), "annotations"), GG_KEY_CHARGE));
    char *end = NULL;
    long long milli = note ? strtoll(note, &end, 10) : 0;
    return note && !*end && milli > 0 ? milli : 0;
}

/* The template's charge times its pods, into the workload's. */
static void add_charge(struct gather *g, const struct mf_entry *e, const json_t *doc,
                       const struct wl_result *r)
{
    long long milli = wl_pod_charge(r->pod.mutated);
    if (milli == 0)
        return;
    long long pods = wl_pod_count(doc, e->template_ptr);
    g->charge += milli * pods;
    size_t used = strlen(g->charges);
    snprintf(g->charges + used, sizeof(g->charges) - used, "%s%s %lld.%03lld x %lld",
             used ? ", " : "", e->path, milli / 1000, milli % 1000, pods);
}

static void add_template(struct gather *g, const struct mf_entry *e, const struct wl_result *r,
                         enum changes changes)
{
    size_t i;
    json_t *w;
    if (!r->pod.allowed)
        add_denial(g, e->path, r->pod.message ? r->pod.message : "denied");
    g->errors += r->pod.errors;
    json_array_foreach(r->pod.warnings, i, w)
        json_array_append_new(g->warnings, prefixed(e->path, json_string_value(w)));
    json_object_update(g->audit, r->pod.audit);
    dr_add_fired(g->fired, r->pod.fired);
    if (changes == CHANGES_PATCH)
        add_patch(g, r->mapped);
    else if (changes == CHANGES_WARN)
        warn_changes(g->warnings, e->path, "the pods get the change", r->mapped);
    json_array_foreach(changes == CHANGES_PATCH ? r->dropped : NULL, i, w)
    {
        char text[200];
        snprintf(text, sizeof(text), "the pods get %s %s when they are created",
                 json_string_value(json_object_get(w, "op")),
                 json_string_value(json_object_get(w, "path")));
        json_array_append_new(g->warnings, prefixed(e->path, text));
    }
}

/* The request's user as dr_options wants it. */
static void request_user(const struct json_req *req, struct dr_options *o)
{
    const char *user = json_string_value(json_object_get(req->user_info, "username"));
    json_t *groups = json_object_get(req->user_info, "groups");
    o->user = user ? user : "";
    o->groups = json_is_array(groups) ? groups : NULL;
}

/* What the configuration says about workloads and this request's user. */
struct settings {
    enum cfg_workloads_mode mode;
    bool controller; /* the user is one of queues.controller_accounts */
};

static enum gg_status read_settings(struct engine *engine, const struct json_req *req,
                                    struct settings *out, struct gg_err *err)
{
    struct policy_set *set = engine_live_set(engine);
    const json_t *config = set ? policy_set_config(set) : NULL;
    enum gg_status st = cfg_workloads_mode(config, &out->mode, err);
    const char *user = json_string_value(json_object_get(req->user_info, "username"));
    json_t *accounts =
        json_object_get(json_object_get(config, "queues"), WL_CONTROLLER_ACCOUNTS_KEY);
    size_t i;
    json_t *a;
    out->controller = false;
    json_array_foreach(accounts, i, a) out->controller =
        out->controller || (user && json_is_string(a) && strcmp(json_string_value(a), user) == 0);
    policy_set_release(set);
    return st;
}

enum gg_status wl_object(struct engine *engine, const json_t *obj, const struct dr_options *o,
                         struct dr_result *out, struct gg_err *err)
{
    return dr_evaluate(engine, obj, o, out, err);
}

void wl_fold(struct dr_result *pod, const struct dr_result *object)
{
    if (!object)
        return;
    if (!object->allowed && pod->allowed) {
        pod->allowed = false;
        pod->denied_by = "object";
        free(pod->message);
        pod->message = object->message ? strdup(object->message) : NULL;
    }
    json_t *warnings = json_copy(object->warnings);
    if (warnings && !json_array_extend(warnings, pod->warnings)) {
        json_decref(pod->warnings);
        pod->warnings = warnings;
    } else {
        json_decref(warnings);
    }
    pod->errors += object->errors;
}

void wl_walk_clear(struct wl_walk *w)
{
    if (w->have)
        dr_result_clear(&w->object);
    w->have = false;
}

const struct dr_result *wl_walk_object(const struct wl_walk *w)
{
    return w->have ? &w->object : NULL;
}

enum gg_status wl_walk_at(struct wl_walk *w, struct engine *engine, const struct mf_set *set,
                          size_t i, json_t *doc, const struct dr_options *o, bool apply,
                          struct gg_err *err)
{
    const struct mf_entry *e = &set->entries[i];
    if (i > 0 && set->entries[i - 1].doc == e->doc &&
        strcmp(set->entries[i - 1].object_ptr, e->object_ptr) == 0)
        return GG_OK; /* the same workload as the entry before */
    wl_walk_clear(w);
    if (strcmp(e->template_ptr, e->object_ptr) == 0)
        return GG_OK; /* a Pod document: no workload */
    json_t *obj = NULL;
    if (jp_pointer_get(doc, e->object_ptr, &obj, NULL) != GG_OK)
        return gg_fail(err, GG_ERR_INVALID, "%s: no object", e->object_ptr);
    enum gg_status st = wl_object(engine, obj, o, &w->object, err);
    if (st != GG_OK)
        return st;
    w->have = true;
    if (apply && w->object.allowed && json_array_size(w->object.patch) &&
        (st = jp_apply(obj, w->object.patch, err)) != GG_OK)
        wl_walk_clear(w);
    return st;
}

/* What the review does with the policies' changes to the workload. */
static enum changes changes_of(enum adm_endpoint endpoint, const struct settings *cfg)
{
    if (endpoint != ADM_MUTATING)
        return CHANGES_NONE;
    return cfg->mode == CFG_WORKLOADS_MUTATE ? CHANGES_PATCH : CHANGES_WARN;
}

/* The object itself through the policies that match its kind (queue routing). */
static enum gg_status review_object(struct engine *engine, const struct adm_request *req,
                                    const struct json_req *j, const struct dr_options *o,
                                    enum changes changes, struct gather *g, json_t **patched,
                                    struct gg_err *err)
{
    struct dr_result r;
    struct dr_options own = *o;
    own.operation = adm_operation_name(req->operation);
    own.old_object = j->old_object;
    enum gg_status st = wl_object(engine, j->object, &own, &r, err);
    if (st != GG_OK)
        return st;
    if (!r.allowed)
        add_denial(g, NULL, r.message ? r.message : "denied");
    g->errors += r.errors;
    json_array_extend(g->warnings, r.warnings);
    json_object_update(g->audit, r.audit);
    dr_add_fired(g->fired, r.fired);
    if (changes == CHANGES_PATCH) {
        add_patch(g, r.patch);
        *patched = json_incref(r.mutated);
    } else if (changes == CHANGES_WARN) {
        warn_changes(g->warnings, req->kind, "it is not changed", r.patch);
    }
    dr_result_clear(&r);
    return GG_OK;
}

enum gg_status wl_review(struct engine *engine, const struct adm_request *req,
                         enum adm_endpoint endpoint, int64_t deadline_us, bool *handled,
                         struct policy_verdict *out, struct gg_err *err)
{
    struct mf_set set = {0};
    struct json_req j = {NULL, NULL, NULL};
    *handled = false;
    if (!maybe_workload(req))
        return GG_OK;
    /* The object first: oldObject and userInfo only for an object with pod templates. */
    enum gg_status st = node_json(req->object, &j.object, "the object", err);
    if (st == GG_OK)
        st = mf_collect_object(j.object, "object", &set, err);
    if (st != GG_OK || set.templates == 0) {
        mf_set_clear(&set);
        json_req_clear(&j);
        return st;
    }
    *handled = true;
    memset(out, 0, sizeof(*out));
    struct gather g = {
        json_array(), json_array(), json_object(), json_array(), NULL, 0, false, 0, "", 0};
    struct settings cfg;
    json_t *patched = NULL;
    if (!g.patch || !g.warnings || !g.audit || !g.fired) {
        st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((st = node_json(req->old_object, &j.old_object, "the old object", err)) != GG_OK ||
        (st = node_json(req->user_info, &j.user_info, "userInfo", err)) != GG_OK ||
        (st = read_settings(engine, &j, &cfg, err)) != GG_OK)
        goto out;
    if (req->operation == ADM_UPDATE && cfg.controller) {
        /* A queue controller's own edits (Kueue's flavor selectors and tolerations on a
         * suspended workload, and their removal): allowed as they are. */
    } else if (set.templates > WL_MAX_TEMPLATES) {
        char text[200];
        snprintf(text, sizeof(text), "gpuguard: the %.64s has %zu pod templates, more than %d",
                 req->kind, set.templates, WL_MAX_TEMPLATES);
        add_denial(&g, NULL, text);
    } else if (req->operation == ADM_CREATE || !templates_unchanged(&j, &set)) {
        /* dry_run: a template is no pod; its pods are reserved when they are created. */
        struct dr_options o = {
            .namespace = req->namespace, .deadline_us = deadline_us, .dry_run = true};
        request_user(&j, &o);
        enum changes changes = changes_of(endpoint, &cfg);
        st = review_object(engine, req, &j, &o, changes, &g, &patched, err);
        if (st == GG_OK && patched) {
            /* The templates as they are after the object's own changes. */
            mf_set_clear(&set);
            st = mf_collect_object(patched, "object", &set, err);
        }
        for (size_t i = 0; st == GG_OK && i < set.count; i++) {
            struct wl_result r;
            const struct mf_entry *e = &set.entries[i];
            if (e->type != MF_TEMPLATE)
                continue;
            if ((st = wl_template(engine, e, patched ? patched : j.object, &o, &r, err)) != GG_OK)
                break;
            add_template(&g, e, &r, changes);
            add_charge(&g, e, patched ? patched : j.object, &r);
            wl_result_clear(&r);
        }
    } else if (queue_relabelled(&j)) {
        struct dr_options o = {
            .namespace = req->namespace, .deadline_us = deadline_us, .dry_run = true};
        request_user(&j, &o);
        st = review_object(engine, req, &j, &o, changes_of(endpoint, &cfg), &g, &patched, err);
    }
    if (st != GG_OK)
        goto out;
    if (g.charge > 0) {
        char text[WL_CHARGE_TEXT + 64];
        snprintf(text, sizeof(text), "%lld.%03lld GPU-equivalents: %s", g.charge / 1000,
                 g.charge % 1000, g.charges);
        json_object_set_new(g.audit, WL_CHARGE_AUDIT_KEY, json_string(text));
    }
    if (g.lost)
        add_denial(&g, NULL, POLICY_LOST_DENIAL);
    if (g.denials_left_out)
        left_out_note(&g);
    out->allowed = g.denials == NULL && !g.lost;
    out->errors = g.errors;
    out->message = g.denials;
    g.denials = NULL;
    if (!out->allowed && !out->message) {
        st = gg_fail(err, GG_ERR_NOMEM, "out of memory writing a denial");
        goto out;
    }
    out->patch = g.patch;
    out->warnings = sanitize_warnings(g.warnings, 0);
    out->audit = g.audit;
    out->fired = g.fired;
    g.patch = g.audit = g.fired = NULL;
    if (!out->warnings)
        st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
out:
    json_decref(patched);
    json_decref(g.patch);
    json_decref(g.warnings);
    json_decref(g.audit);
    json_decref(g.fired);
    free(g.denials);
    mf_set_clear(&set);
    json_req_clear(&j);
    if (st != GG_OK && *handled)
        policy_verdict_clear(out);
    return st;
}

const char *wl_queue(const json_t *obj)
{
    static const char *const labels[] = {GG_KEY_KUEUE_QUEUE, GG_KEY_KAI_QUEUE};
    json_t *l = json_object_get(json_object_get(obj, "metadata"), "labels");
    for (size_t i = 0; i < sizeof(labels) / sizeof(labels[0]); i++) {
        const char *q = json_string_value(json_object_get(l, labels[i]));
        if (q)
            return q;
    }
    return NULL;
}
