/*
 * polreport.c - the policy reports the audit writes: building them, listing gpuguard's,
 * writing those whose results changed, deleting those no audit kept (polreport.h).
 */
#include "kube/polreport.h"

#include "util/log.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIST_PAGE 500
#define MAX_LIST_BODY (32 << 20) /* a page of LIST_PAGE reports */
#define PATH_MAX_LEN 1024

static const struct {
    const char *version;         /* apiVersion */
    const char *kind, *plural;   /* namespaced */
    const char *ckind, *cplural; /* cluster-scoped */
} apis[PR_N_APIS] = {
    [PR_WGPOLICY] = {"wgpolicyk8s.io/v1alpha2", "PolicyReport", "policyreports",
                     "ClusterPolicyReport", "clusterpolicyreports"},
    [PR_OPENREPORTS] = {"openreports.io/v1alpha1", "Report", "reports", "ClusterReport",
                        "clusterreports"},
};

bool pr_api_parse(const char *s, enum pr_api *out)
{
    for (int i = 0; s && i < PR_N_APIS; i++)
        if (strcmp(s, apis[i].version) == 0) {
            *out = (enum pr_api)i;
            return true;
        }
    return false;
}

const char *pr_api_version(enum pr_api api)
{
    return apis[api].version;
}

static bool namespaced(const struct pr_resource *res)
{
    return res && res->ns && *res->ns;
}

static json_t *reference(const struct pr_resource *res)
{
    json_t *ref = json_pack("{s:s,s:s,s:s}", "apiVersion", res->api_version, "kind", res->kind,
                            "name", res->name);
    if (ref && namespaced(res))
        json_object_set_new(ref, "namespace", json_string(res->ns));
    if (ref && res->uid)
        json_object_set_new(ref, "uid", json_string(res->uid));
    return ref;
}

/* s cut to at most max bytes, not inside a UTF-8 sequence. */
static json_t *cut_string(const char *s, size_t max)
{
    size_t len = strlen(s);
    if (len <= max)
        return json_string(s);
    while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80)
        max--;
    return json_stringn(s, max);
}

json_t *pr_result(const struct pr_finding *f, const struct pr_resource *res, int64_t now_s)
{
    json_t *r =
        json_pack("{s:s,s:s,s:s,s:o,s:b,s:s,s:{s:I,s:i}}", "policy", f->policy, "rule",
                  f->rule ? f->rule : f->policy, "result", f->result, "message",
                  cut_string(f->message ? f->message : "", PR_MESSAGE_MAX), "scored", f->scored,
                  "source", PR_SOURCE, "timestamp", "seconds", (json_int_t)now_s, "nanos", 0);
    if (!r)
        return NULL;
    if (f->severity)
        json_object_set_new(r, "severity", json_string(f->severity));
    if (f->category)
        json_object_set_new(r, "category", json_string(f->category));
    if (f->properties && json_object_size(f->properties))
        json_object_set(r, "properties", f->properties);
    if (res)
        json_object_set_new(r, "resources", json_pack("[o]", reference(res)));
    return r;
}

/* Where a result goes in a report: failures first, then errors, warnings, the rest. */
static int rank(const json_t *r)
{
    static const char *const first[] = {"fail", "error", "warn"};
    const char *result = json_string_value(json_object_get(r, "result"));
    for (int k = 0; result && k < 3; k++)
        if (strcmp(result, first[k]) == 0)
            return k;
    return 3;
}

/* The results (taken over) in rank order, each rank as it came; past PR_MAX_RESULTS, the last
 * a skip that says how many were left out.  NULL when out of memory. */
static json_t *ordered(json_t *results)
{
    json_t *out = json_array(), *r;
    size_t i,
        left_out = 0,
        room = json_array_size(results) <= PR_MAX_RESULTS ? PR_MAX_RESULTS : PR_MAX_RESULTS - 1;
    for (int k = 0; out && k < 4; k++)
        json_array_foreach(results, i, r)
        {
            if (rank(r) != k)
                continue;
            if (json_array_size(out) < room)
                json_array_append(out, r);
            else
                left_out++;
        }
    json_t *ts = json_object_get(json_array_get(results, 0), "timestamp");
    json_t *note = NULL;
    if (out && left_out) {
        char text[100];
        snprintf(text, sizeof(text), "%zu more results left out (at most %d a report)", left_out,
                 PR_MAX_RESULTS);
        note = json_pack("{s:s,s:s,s:s,s:s,s:b,s:s,s:O?}", "policy", "audit", "rule", "audit",
                         "result", "skip", "message", text, "scored", 0, "source", PR_SOURCE,
                         "timestamp", ts);
        if (!note || json_array_append_new(out, note) != 0) {
            json_decref(out);
            out = NULL;
        }
    }
    json_decref(results);
    return out;
}

json_t *pr_report(enum pr_api api, const struct pr_resource *res, json_t *results)
{
    static const char *const counted[] = {"pass", "fail", "warn", "error", "skip"};
    json_int_t counts[5] = {0};
    size_t i;
    json_t *r;
    if (!(results = ordered(results)))
        return NULL;
    json_array_foreach(results, i, r)
    {
        const char *result = json_string_value(json_object_get(r, "result"));
        for (size_t k = 0; result && k < 5; k++)
            if (strcmp(result, counted[k]) == 0)
                counts[k]++;
    }
    char name[300];
    snprintf(name, sizeof(name), "%s", res ? "" : PR_CLUSTER_NAME);
    if (res)
        snprintf(name, sizeof(name), PR_NAME_PREFIX "%s", res->uid);
    json_t *report = json_pack(
        "{s:s,s:s,s:{s:s,s:{s:s}},s:o,s:{s:I,s:I,s:I,s:I,s:I}}", "apiVersion", apis[api].version,
        "kind", namespaced(res) ? apis[api].kind : apis[api].ckind, "metadata", "name", name,
        "labels", PR_MANAGED_BY_LABEL, PR_SOURCE, "results", results, "summary", "pass", counts[0],
        "fail", counts[1], "warn", counts[2], "error", counts[3], "skip", counts[4]);
    if (!report)
        return NULL;
    if (api == PR_OPENREPORTS)
        json_object_set_new(report, "source", json_string(PR_SOURCE));
    if (res) {
        json_t *meta = json_object_get(report, "metadata");
        if (namespaced(res))
            json_object_set_new(meta, "namespace", json_string(res->ns));
        json_object_set_new(meta, "ownerReferences",
                            json_pack("[{s:s,s:s,s:s,s:s}]", "apiVersion", res->api_version, "kind",
                                      res->kind, "name", res->name, "uid", res->uid));
        json_object_set_new(report, "scope", reference(res));
    }
    return report;
}

/* A copy of results without their timestamps (what a change is judged on). */
static json_t *untimed(const json_t *results)
{
    json_t *copy = json_deep_copy(results), *r;
    size_t i;
    json_array_foreach(copy, i, r) json_object_del(r, "timestamp");
    return copy;
}

bool pr_digest(const json_t *results, char out[65])
{
    json_t *copy = untimed(results);
    char *text = copy ? json_dumps(copy, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(copy);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    bool ok = text && EVP_Digest(text, strlen(text), md, &len, EVP_sha256(), NULL) == 1;
    for (unsigned i = 0; ok && i < len && i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    free(text);
    return ok;
}

/* The collection (name NULL) or item path of a report of api in ns ("" or NULL: cluster). */
static void path_of(enum pr_api api, const char *ns, const char *name, char *out, size_t size)
{
    int n = ns && *ns ? snprintf(out, size, "/apis/%s/namespaces/%s/%s", apis[api].version, ns,
                                 apis[api].plural)
                      : snprintf(out, size, "/apis/%s/%s", apis[api].version, apis[api].cplural);
    if (name && n > 0 && (size_t)n < size)
        snprintf(out + n, size - (size_t)n, "/%s", name);
}

static void key_of(const char *ns, const char *name, char *out, size_t size)
{
    snprintf(out, size, "%s/%s", ns ? ns : "", name);
}

/* Note the reports of one listed page into ex; the next page's token, or NULL. */
static char *take_page(const json_t *list, struct pr_existing *ex)
{
    size_t i;
    json_t *item;
    json_array_foreach(json_object_get(list, "items"), i, item)
    {
        const json_t *meta = json_object_get(item, "metadata");
        const char *name = json_string_value(json_object_get(meta, "name"));
        const char *ns = json_string_value(json_object_get(meta, "namespace"));
        char key[600], digest[65] = "";
        if (!name)
            continue;
        key_of(ns, name, key, sizeof(key));
        pr_digest(json_object_get(item, "results"), digest);
        json_object_set_new(ex->reports, key, json_pack("[s,b]", digest, 0));
    }
    const char *cont =
        json_string_value(json_object_get(json_object_get(list, "metadata"), "continue"));
    return cont && *cont ? strdup(cont) : NULL;
}

/* One paged list of a collection path into ex. */
static enum gg_status list_all(struct kc_client *c, const char *collection, struct pr_existing *ex,
                               struct gg_err *err)
{
    char *cont = NULL;
    enum gg_status st = GG_OK;
    for (;;) {
        char token[2048] = "", path[PATH_MAX_LEN + 2100];
        if (cont && !kc_query_escape(cont, token, sizeof(token))) {
            st = gg_fail(err, GG_ERR_INVALID, "GET %s: a continue token too long", collection);
            break;
        }
        snprintf(path, sizeof(path), "%s?labelSelector=%s%%3D%s&limit=%d%s%s", collection,
                 PR_MANAGED_BY_LABEL, PR_SOURCE, LIST_PAGE, cont ? "&continue=" : "", token);
        free(cont);
        cont = NULL;
        struct kc_request rq = {.path = path,
                                .what = collection,
                                .timeout_ms = PR_TIMEOUT_MS,
                                .max_body = MAX_LIST_BODY};
        json_t *list = NULL;
        long status = 0;
        st = kc_json(c, &rq, "GET", NULL, &list, &status, err);
        if (status == 404) { /* the API is not served: no reports of it */
            ex->unserved = true;
            st = GG_OK;
            break;
        }
        if (st != GG_OK)
            break;
        cont = take_page(list, ex);
        json_decref(list);
        if (!cont)
            break;
    }
    free(cont);
    return st;
}

enum gg_status pr_list(struct kc_client *c, enum pr_api api, struct pr_existing *out,
                       struct gg_err *err)
{
    if (!out->reports && !(out->reports = json_object()))
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    char path[PATH_MAX_LEN];
    snprintf(path, sizeof(path), "/apis/%s/%s", apis[api].version, apis[api].plural);
    enum gg_status st = list_all(c, path, out, err);
    path_of(api, NULL, NULL, path, sizeof(path));
    return st == GG_OK ? list_all(c, path, out, err) : st;
}

/* Give each result of fresh that old holds unchanged the timestamp old gave it. */
static void keep_timestamps(json_t *fresh, const json_t *old)
{
    json_t *a = untimed(fresh), *b = untimed(old);
    size_t i, j;
    json_t *r, *o;
    json_array_foreach(a, i, r)
    {
        json_array_foreach(b, j, o)
        {
            const json_t *ts = json_object_get(json_array_get(old, j), "timestamp");
            if (ts && json_equal(r, o)) {
                json_object_set(json_array_get(fresh, i), "timestamp", (json_t *)ts);
                break;
            }
        }
    }
    json_decref(a);
    json_decref(b);
}

/* The answer to a create in a namespace that is going: nothing to write there. */
static bool namespace_going(struct kc_client *c, const char *ns, long status)
{
    if (status == 404)
        return true;
    if (status != 403 || !ns) /* 403: forbidden, or the namespace is terminating */
        return false;
    char path[400];
    snprintf(path, sizeof(path), "/api/v1/namespaces/%s", ns);
    struct kc_request rq = {.path = path, .timeout_ms = PR_TIMEOUT_MS};
    json_t *obj = NULL;
    long got = 0;
    struct gg_err err = {{0}};
    kc_json(c, &rq, "GET", NULL, &obj, &got, &err);
    bool going = got == 404 ||
                 json_object_get(json_object_get(obj, "metadata"), "deletionTimestamp") != NULL;
    json_decref(obj);
    return going;
}

enum gg_status pr_write(struct kc_client *c, enum pr_api api, struct pr_existing *ex,
                        json_t *report, pr_go_on_fn go_on, void *ctx, bool *wrote,
                        struct gg_err *err)
{
    const json_t *meta = json_object_get(report, "metadata");
    const char *name = json_string_value(json_object_get(meta, "name"));
    const char *ns = json_string_value(json_object_get(meta, "namespace"));
    json_t *results = json_object_get(report, "results");
    char key[600], digest[65], item[PATH_MAX_LEN], collection[PATH_MAX_LEN];
    *wrote = false;
    if (!ex->reports && !(ex->reports = json_object()))
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    if (!name || !pr_digest(results, digest))
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    key_of(ns, name, key, sizeof(key));
    json_t *known = json_object_get(ex->reports, key);
    if (known) /* kept, whatever comes of the write: a failure leaves the last report standing */
        json_array_set_new(known, 1, json_true());
    const char *was = json_string_value(json_array_get(known, 0));
    if (was && strcmp(was, digest) == 0)
        return GG_OK;
    path_of(api, ns, name, item, sizeof(item));
    path_of(api, ns, NULL, collection, sizeof(collection));
    bool exists = known != NULL;
    enum gg_status st = GG_OK;
    for (int tries = 0; tries < 3; tries++) {
        if (!go_on(ctx))
            return gg_fail(err, GG_ERR_INVALID, "%s: not written: stopped", item);
        struct kc_request rq = {.path = exists ? item : collection, .timeout_ms = PR_TIMEOUT_MS};
        json_t *answer = NULL;
        long status = 0;
        if (exists) {
            struct kc_request get = {.path = item, .timeout_ms = PR_TIMEOUT_MS};
            st = kc_json(c, &get, "GET", NULL, &answer, &status, err);
            if (status == 404) {
                exists = false;
                continue;
            }
            if (st != GG_OK)
                return st;
            const json_t *labels = json_object_get(json_object_get(answer, "metadata"), "labels");
            const char *by = json_string_value(json_object_get(labels, PR_MANAGED_BY_LABEL));
            if (!by || strcmp(by, PR_SOURCE) != 0) {
                json_decref(answer);
                return gg_fail(err, GG_ERR_INVALID,
                               "%s: a report of that name is not gpuguard's (no %s=%s label): "
                               "left alone",
                               item, PR_MANAGED_BY_LABEL, PR_SOURCE);
            }
            keep_timestamps(results, json_object_get(answer, "results"));
            json_object_set(
                json_object_get(report, "metadata"), "resourceVersion",
                json_object_get(json_object_get(answer, "metadata"), "resourceVersion"));
            json_decref(answer);
            answer = NULL;
        }
        st = kc_json(c, &rq, exists ? "PUT" : "POST", report, &answer, &status, err);
        json_decref(answer);
        if (status == 409) { /* written meanwhile (PUT) or already there (POST) */
            exists = true;
            continue;
        }
        if (!exists && namespace_going(c, ns, status))
            return GG_OK;
        if (st != GG_OK)
            return st;
        *wrote = true;
        json_object_set_new(ex->reports, key, json_pack("[s,b]", digest, 1));
        return GG_OK;
    }
    return st != GG_OK ? st : gg_fail(err, GG_ERR_IO, "%s: written by someone else 3 times", item);
}

enum gg_status pr_sweep(struct kc_client *c, enum pr_api api, struct pr_existing *ex,
                        pr_go_on_fn go_on, void *ctx, size_t *deleted, struct gg_err *err)
{
    const char *key;
    json_t *state;
    *deleted = 0;
    json_object_foreach(ex->reports, key, state)
    {
        if (json_is_true(json_array_get(state, 1)))
            continue;
        if (!go_on(ctx))
            return gg_fail(err, GG_ERR_INVALID, "reports not deleted: stopped");
        const char *slash = strchr(key, '/');
        char ns[256], path[PATH_MAX_LEN];
        snprintf(ns, sizeof(ns), "%.*s", slash ? (int)(slash - key) : 0, key);
        path_of(api, ns, slash ? slash + 1 : key, path, sizeof(path));
        struct kc_request rq = {.path = path, .timeout_ms = PR_TIMEOUT_MS};
        json_t *answer = NULL;
        long status = 0;
        enum gg_status st = kc_json(c, &rq, "DELETE", NULL, &answer, &status, err);
        json_decref(answer);
        if (st != GG_OK && status != 404)
            return st;
        (*deleted)++;
    }
    return GG_OK;
}

void pr_existing_clear(struct pr_existing *ex)
{
    json_decref(ex->reports);
    *ex = (struct pr_existing){0};
}
