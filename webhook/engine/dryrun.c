/*
 * dryrun.c - a pod through the mutating and then the validating webhook,
 * as the API server would call them, for the CLI and workload templates.  See dryrun.h.
 */
#include "engine/dryrun.h"
#include "util/clock.h"

#include "codec/admission.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define DR_DEFAULT_TIMEOUT_MS 10000
#define DR_NAME_MAX 256 /* a group, version, kind or resource name */

/* A random version-4 UUID, as the API server uses for request uids. */
static void dr_uid(char out[37])
{
    unsigned char b[16];
    size_t got = 0;
    while (got < sizeof(b)) {
        ssize_t n = getrandom(b + got, sizeof(b) - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (got < sizeof(b)) { /* no entropy: still unique enough for one process */
        static unsigned long counter;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        unsigned long long seed = (unsigned long long)ts.tv_nsec ^ ++counter;
        for (size_t i = 0; i < sizeof(b); i++, seed = seed * 6364136223846793005ULL + 1)
            b[i] = (unsigned char)(seed >> 56);
    }
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

/* The namespace a request for pod gets: its own, else fallback, else "default". */
static const char *dr_namespace(const json_t *pod, const char *fallback)
{
    const char *ns =
        json_string_value(json_object_get(json_object_get(pod, "metadata"), "namespace"));
    if (ns && *ns)
        return ns;
    return fallback && *fallback ? fallback : "default";
}

static const char *operation_of(const struct dr_options *o)
{
    return o->operation && *o->operation ? o->operation : "CREATE";
}

/* The group, version, kind and plural resource of obj: a Pod when it says nothing. */
static void gvk_of(const json_t *obj, char *group, char *version, char *kind, char *resource)
{
    const char *av = json_string_value(json_object_get(obj, "apiVersion"));
    const char *k = json_string_value(json_object_get(obj, "kind"));
    const char *slash = av ? strrchr(av, '/') : NULL;
    snprintf(kind, DR_NAME_MAX, "%s", k && *k ? k : "Pod");
    snprintf(group, DR_NAME_MAX, "%.*s", slash ? (int)(slash - av) : 0, av ? av : "");
    snprintf(version, DR_NAME_MAX, "%s", slash ? slash + 1 : av && *av ? av : "v1");
    size_t i = 0;
    for (; kind[i] && i + 2 < DR_NAME_MAX; i++)
        resource[i] = (char)tolower((unsigned char)kind[i]);
    resource[i] = 's';
    resource[i + 1] = '\0';
}

/*
 * The AdmissionReview (admission.k8s.io/v1) the API server would send for
 * object (NULL on DELETE/CONNECT) in namespace ns: its kind and resource
 * from the object's apiVersion and kind (the resource is the kind in lower
 * case plus "s"), a Pod when it has no kind.  A new reference.
 */
static json_t *dr_review(const json_t *object, const json_t *old_object, const char *ns,
                         const struct dr_options *o, const char *uid)
{
    const char *op = operation_of(o);
    char group[DR_NAME_MAX], version[DR_NAME_MAX], kind[DR_NAME_MAX], resource[DR_NAME_MAX];
    gvk_of(object ? object : old_object, group, version, kind, resource);
    const char *name = json_string_value(
        json_object_get(json_object_get(object ? object : old_object, "metadata"), "name"));
    const char *options_kind = strcmp(op, "CREATE") == 0   ? "CreateOptions"
                               : strcmp(op, "UPDATE") == 0 ? "UpdateOptions"
                               : strcmp(op, "DELETE") == 0 ? "DeleteOptions"
                                                           : NULL;
    json_t *groups =
        o->groups ? json_deep_copy(o->groups) : json_pack("[s]", "system:authenticated");
    json_t *request = json_pack(
        "{s:s,s:{s:s,s:s,s:s},s:{s:s,s:s,s:s},s:{s:s,s:s,s:s},s:{s:s,s:s,s:s},s:s,s:s,s:s,"
        "s:{s:s,s:o},s:O?,s:O?,s:b}",
        "uid", uid, "kind", "group", group, "version", version, "kind", kind, "resource", "group",
        group, "version", version, "resource", resource, "requestKind", "group", group, "version",
        version, "kind", kind, "requestResource", "group", group, "version", version, "resource",
        resource, "name", name ? name : "", "namespace", ns, "operation", op, "userInfo",
        "username", o->user ? o->user : DR_DEFAULT_USER, "groups", groups, "object", object,
        "oldObject", old_object, "dryRun", o->dry_run || o->background);
    if (!request)
        return NULL;
    if (o->sub_resource && *o->sub_resource &&
        json_object_set_new(request, "subResource", json_string(o->sub_resource)) != 0) {
        json_decref(request);
        return NULL;
    }
    if (!json_object_get(request, "object"))
        json_object_set_new(request, "object", json_null());
    if (!json_object_get(request, "oldObject"))
        json_object_set_new(request, "oldObject", json_null());
    json_object_set_new(
        request, "options",
        options_kind ? json_pack("{s:s,s:s}", "apiVersion", "meta.k8s.io/v1", "kind", options_kind)
                     : json_null());
    return json_pack("{s:s,s:s,s:o}", "apiVersion", "admission.k8s.io/v1", "kind",
                     "AdmissionReview", "request", request);
}

/* One webhook call: the review for object through the given phase. */
static enum gg_status call(struct engine *e, const json_t *object, const json_t *old_object,
                           const char *ns, const struct dr_options *o, const char *uid,
                           unsigned phase, struct policy_verdict *v, struct gg_err *err)
{
    json_t *review = dr_review(object, old_object, ns, o, uid);
    if (!review)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory building the review");
    struct adm_request req;
    enum gg_status st = adm_decode_value(review, &req, err);
    if (st != GG_OK)
        return st;
    req.template_path = o->template_path;
    req.background = o->background;
    int64_t timeout = o->timeout_ms > 0 ? o->timeout_ms : DR_DEFAULT_TIMEOUT_MS;
    int64_t deadline = o->deadline_us > 0 ? o->deadline_us : gg_now_us() + timeout * 1000;
    st = engine_evaluate(e, &req, phase, deadline, v, err);
    adm_request_clear(&req);
    return st;
}

void dr_result_clear(struct dr_result *r)
{
    if (!r)
        return;
    free(r->message);
    free(r->decision);
    json_decref(r->patch);
    json_decref(r->mutated);
    json_decref(r->warnings);
    json_decref(r->audit);
    json_decref(r->fired);
    memset(r, 0, sizeof(*r));
}

void dr_add_fired(json_t *into, const json_t *names)
{
    size_t i, j;
    json_t *n, *m;
    json_array_foreach(names, i, n)
    {
        bool seen = false;
        json_array_foreach(into, j, m) seen = seen || json_equal(n, m);
        if (!seen)
            json_array_append(into, n);
    }
}

/*
 * The object as the API server would pass it: with the request's namespace.
 * Shares everything but the root and metadata objects with pod; nothing
 * here writes to it.
 */
static json_t *with_namespace(const json_t *pod, const char *ns)
{
    json_t *copy = json_copy((json_t *)pod);
    if (!json_is_object(copy))
        return copy;
    json_t *meta = json_object_get(copy, "metadata");
    /* json_copy drops a member it cannot copy: the sizes must match. */
    size_t members = json_object_size(meta);
    meta = json_is_object(meta) ? json_copy(meta) : json_object();
    if (json_object_size(copy) != json_object_size(pod) || json_object_size(meta) != members) {
        json_decref(meta);
        json_decref(copy);
        return NULL;
    }
    const char *have = json_string_value(json_object_get(meta, "namespace"));
    /* Without its namespace the object would escape namespaced rules: all or nothing. */
    if (json_object_set_new(copy, "metadata", meta) != 0 ||
        ((!have || !*have) && json_object_set_new(meta, "namespace", json_string(ns)) != 0)) {
        json_decref(copy);
        return NULL;
    }
    return copy;
}

enum gg_status dr_evaluate(struct engine *e, const json_t *pod, const struct dr_options *o,
                           struct dr_result *out, struct gg_err *err)
{
    struct dr_result r = {0};
    struct policy_verdict mv = {0}, vv = {0};
    const char *op = operation_of(o);
    bool has_object = strcmp(op, "DELETE") != 0 && strcmp(op, "CONNECT") != 0;
    char uid[37];
    enum gg_status st;
    snprintf(r.namespace, sizeof(r.namespace), "%s", dr_namespace(pod, o->namespace));
    json_t *object = with_namespace(pod, r.namespace), *old = NULL;
    if (!object)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    if (strcmp(op, "UPDATE") == 0)
        old = with_namespace(o->old_object ? o->old_object : pod, r.namespace);
    else if (strcmp(op, "DELETE") == 0)
        old = json_incref(object);
    if (strcmp(op, "UPDATE") == 0 && !old) {
        json_decref(object);
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    dr_uid(uid);
    /* The engine applies its patch to the object as the API server would (PHASE_KEEP_MUTATED). */
    st = call(e, has_object ? object : NULL, old, r.namespace, o, uid,
              PHASE_MUTATE | PHASE_KEEP_MUTATED, &mv, err);
    if (st != GG_OK)
        goto out;
    r.warnings = json_copy(mv.warnings);
    r.audit = json_copy(mv.audit);
    r.fired = json_copy(mv.fired);
    r.errors = mv.errors;
    r.patch = json_incref(mv.patch ? mv.patch : json_array());
    if (!mv.patch)
        json_decref(r.patch); /* json_array() above was a new reference */
    if (!mv.allowed) {
        r.allowed = false;
        r.denied_by = "mutate";
        r.message = mv.message;
        mv.message = NULL;
        json_decref(r.patch);
        r.patch = json_array();
        r.mutated = has_object ? json_incref(object) : NULL;
        goto done;
    }
    if (has_object) { /* no mutated object when no policy could mutate: the object itself */
        r.mutated = mv.mutated ? mv.mutated : json_incref(object);
        mv.mutated = NULL;
    }
    st = call(e, r.mutated, old, r.namespace, o, uid, PHASE_VALIDATE, &vv, err);
    if (st != GG_OK)
        goto out;
    json_array_extend(r.warnings, vv.warnings);
    json_object_update(r.audit, vv.audit);
    dr_add_fired(r.fired, vv.fired);
    r.errors += vv.errors;
    r.allowed = vv.allowed;
    if (!vv.allowed) {
        r.denied_by = "validate";
        r.message = vv.message;
        vv.message = NULL;
    }
done:
    if (r.mutated) {
        const char *d = json_string_value(
            json_object_get(json_object_get(json_object_get(r.mutated, "metadata"), "annotations"),
                            GG_KEY_DECISION));
        if (d)
            r.decision = strdup(d);
    }
    if (!r.warnings || !r.audit || !r.fired || !r.patch) {
        st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
        goto out;
    }
out:
    policy_verdict_clear(&mv);
    policy_verdict_clear(&vv);
    json_decref(object);
    json_decref(old);
    if (st != GG_OK) {
        dr_result_clear(&r);
        return st;
    }
    *out = r;
    return GG_OK;
}

/* One call of obj, in the request's namespace, through phases. */
static enum gg_status call_one(struct engine *e, const json_t *obj, const struct dr_options *o,
                               unsigned phases, struct policy_verdict *v, struct gg_err *err)
{
    const char *ns = dr_namespace(obj, o->namespace);
    json_t *object = with_namespace(obj, ns);
    char uid[37];
    dr_uid(uid);
    enum gg_status st = object ? call(e, object, NULL, ns, o, uid, phases, v, err)
                               : gg_fail(err, GG_ERR_NOMEM, "out of memory");
    json_decref(object);
    return st;
}

enum gg_status dr_validate(struct engine *e, const json_t *obj, const struct dr_options *o,
                           struct policy_verdict *out, struct gg_err *err)
{
    return call_one(e, obj, o, PHASE_VALIDATE | PHASE_OUTCOMES, out, err);
}

enum gg_status dr_mutate(struct engine *e, const json_t *pod, const struct dr_options *o,
                         json_t **patch, char **denial, struct gg_err *err)
{
    struct policy_verdict v = {0};
    enum gg_status st = call_one(e, pod, o, PHASE_MUTATE, &v, err);
    if (st != GG_OK)
        return st;
    *patch = v.patch ? json_incref(v.patch) : json_array();
    *denial = v.allowed ? NULL : v.message;
    if (!v.allowed)
        v.message = NULL;
    policy_verdict_clear(&v);
    return GG_OK;
}
