/*
 * audit.c - the background audit: the thread, one audit's passes over the pods and their
 * workloads, the reports and figures it leaves (audit.h).
 */
#include "engine/audit.h"

#include "codec/manifest.h"
#include "engine/config.h"
#include "engine/dryrun.h"
#include "engine/waste.h"
#include "kube/labelsel.h"
#include "kube/polreport.h"
#include "kube/rsstore.h"
#include "util/clock.h"
#include "util/log.h"

#include <ctype.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define POLL_MS 1000 /* how often the thread looks at the lead, the generation, the clock */
#define CATEGORY "GPU"
#define WASTE_CATEGORY "GPU waste"
#define RIGHTSIZING_POLICY "rightsizing"

struct audit {
    struct audit_options o;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_bool stop;
};

/* ---- the figures of the process's audits ---------------------------------------------- */

static pthread_mutex_t stats_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    bool any;
    unsigned long long ok, failed, evaluations, written, deleted;
    double last_success_s, duration_s;
    long results[4]; /* of the last complete audit: pass, fail, warn, error */
    long resources;
    bool leading; /* results and resources are shown by the replica that leads alone */
} stats;

static const char *const result_names[] = {"pass", "fail", "warn", "error"};

enum gg_status audit_render_metrics(struct buf *out)
{
    pthread_mutex_lock(&stats_lock);
    if (!stats.any) {
        pthread_mutex_unlock(&stats_lock);
        return GG_OK;
    }
    enum gg_status st = buf_appendf(
        out,
        "# HELP gpuguard_audit_runs_total Background audits, by result (error: stopped by an "
        "API error; one that loses the lead is neither).\n"
        "# TYPE gpuguard_audit_runs_total counter\n"
        "gpuguard_audit_runs_total{result=\"ok\"} %llu\n"
        "gpuguard_audit_runs_total{result=\"error\"} %llu\n"
        "# HELP gpuguard_audit_evaluations_total Background reviews of running objects.\n"
        "# TYPE gpuguard_audit_evaluations_total counter\n"
        "gpuguard_audit_evaluations_total %llu\n"
        "# HELP gpuguard_audit_reports_written_total Policy reports created or replaced.\n"
        "# TYPE gpuguard_audit_reports_written_total counter\n"
        "gpuguard_audit_reports_written_total %llu\n"
        "# HELP gpuguard_audit_reports_deleted_total Policy reports of resources gone, deleted.\n"
        "# TYPE gpuguard_audit_reports_deleted_total counter\n"
        "gpuguard_audit_reports_deleted_total %llu\n"
        "# HELP gpuguard_audit_last_success_timestamp_seconds When the last complete audit "
        "ended.\n"
        "# TYPE gpuguard_audit_last_success_timestamp_seconds gauge\n"
        "gpuguard_audit_last_success_timestamp_seconds %.3f\n"
        "# HELP gpuguard_audit_duration_seconds How long the last complete audit took.\n"
        "# TYPE gpuguard_audit_duration_seconds gauge\n"
        "gpuguard_audit_duration_seconds %.3f\n",
        stats.ok, stats.failed, stats.evaluations, stats.written, stats.deleted,
        stats.last_success_s, stats.duration_s);
    /* Its last results are the cluster's while it leads: a sum over the replicas is theirs. */
    if (st == GG_OK && stats.leading)
        st = buf_appendf(out,
                         "# HELP gpuguard_audit_resources Resources the last complete audit "
                         "reported on.\n"
                         "# TYPE gpuguard_audit_resources gauge\n"
                         "gpuguard_audit_resources %ld\n"
                         "# HELP gpuguard_audit_results Results of the last complete audit, by "
                         "result.\n"
                         "# TYPE gpuguard_audit_results gauge\n",
                         stats.resources);
    for (size_t i = 0; i < 4 && st == GG_OK && stats.leading; i++)
        st = buf_appendf(out, "gpuguard_audit_results{result=\"%s\"} %ld\n", result_names[i],
                         stats.results[i]);
    pthread_mutex_unlock(&stats_lock);
    return st;
}

/* ---- one audit ------------------------------------------------------------------------- */

/* A report waiting for the rightsizing results: a workload's, or a bare pod's. */
struct pending {
    struct pr_resource res;
    char *strings; /* res's strings, one block */
    json_t *results;
};

struct run {
    struct audit *a;
    struct cfg_audit cfg; /* its report_api is read into api: the string goes with its set */
    enum pr_api api;
    int64_t start_us, now_s;
    int64_t next_us; /* when the next evaluation may start (pace) */
    unsigned long long evaluations, written;
    bool aborted; /* the lead was lost or the server stops: nothing is deleted */
    bool unread;  /* a GET failed: its report may be missing, so nothing is deleted */
    struct pr_existing existing;
    struct waste_set waste;
    json_t *owners;  /* "ns/Kind/name" of a controller -> its top workload's uid, or null */
    json_t *pending; /* uid -> index into pend */
    struct pending *pend;
    size_t n_pend, cap_pend;
    json_t *bare;     /* "ns\x1fpod name" of a pod without a controller -> its uid */
    json_t *errors;   /* messages of what could not be audited */
    json_t *selector; /* the pods webhook's namespaceSelector; NULL: every namespace */
    json_t *scoped;   /* namespace -> whether the selector takes it */
    long results[4];
    long resources;
};

static bool leading(struct run *r)
{
    if (atomic_load(&r->a->stop) || !lease_is_leader(r->a->o.lease))
        r->aborted = true;
    return !r->aborted;
}

/* leading() for kube/polreport.c, before each of its requests. */
static bool still_leading(void *ctx)
{
    return leading(ctx);
}

static void note_error(struct run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_error(struct run *r, const char *fmt, ...)
{
    char text[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    log_fields(LOG_WARN, "audit", json_pack("{s:s}", "error", text));
    if (json_array_size(r->errors) < AUDIT_MAX_ERRORS)
        json_array_append_new(r->errors, json_string(text));
}

/*
 * At most cfg.rate evaluations a second: wait for the next one's turn.  Time lost waiting on
 * the API server is credit for at most a second's evaluations, never for a burst.
 */
static void pace(struct run *r)
{
    int64_t now = gg_now_us();
    if (r->next_us < now - 1000000)
        r->next_us = now - 1000000;
    if (r->next_us > now)
        kc_pause_ms(&r->a->lock, &r->a->wake, &r->a->stop, (r->next_us - now + 999) / 1000);
    r->next_us += 1000000 / r->cfg.rate;
    r->evaluations++;
}

static void paced(void *ctx)
{
    pace(ctx);
}

static const char *str(const json_t *obj, const char *a, const char *b)
{
    const json_t *v = json_object_get(obj, a);
    return json_string_value(b ? json_object_get(v, b) : v);
}

/* obj's identity as a report names it; false when it lacks one. */
static bool resource_of(const json_t *obj, struct pr_resource *res)
{
    *res = (struct pr_resource){.api_version = str(obj, "apiVersion", NULL),
                                .kind = str(obj, "kind", NULL),
                                .ns = str(obj, "metadata", "namespace"),
                                .name = str(obj, "metadata", "name"),
                                .uid = str(obj, "metadata", "uid")};
    return res->api_version && res->kind && res->ns && res->name && res->uid;
}

/*
 * The validate policies' outcomes for obj, as results on res; where: the template's path
 * (its messages say so), NULL for the object itself.  Identical results are kept once.
 */
static void judge(struct run *r, const json_t *obj, const struct dr_options *o,
                  const struct pr_resource *res, json_t *results)
{
    struct policy_verdict v = {0};
    struct gg_err err = {{0}};
    pace(r);
    if (dr_validate(r->a->o.engine, obj, o, &v, &err) != GG_OK) {
        struct pr_finding f = {.policy = "audit",
                               .result = "error",
                               .message = err.msg,
                               .category = CATEGORY,
                               .scored = true};
        json_array_append_new(results, pr_result(&f, res, r->now_s));
        return;
    }
    size_t i, j;
    json_t *out, *have;
    /* A denial no outcome explains (one lost for want of memory) is an error, never a pass. */
    bool explained = v.allowed;
    json_array_foreach(v.outcomes, i, out)
    {
        const char *result = str(out, "result", NULL), *msg = str(out, "message", NULL);
        explained = explained || strcmp(result, "fail") == 0 || strcmp(result, "error") == 0;
        char *text = NULL;
        if (o->template_path && strcmp(result, "pass") != 0 &&
            asprintf(&text, "%s: %s", o->template_path, msg) < 0)
            text = NULL;
        struct pr_finding f = {.policy = str(out, "policy", NULL),
                               .result = result,
                               .message = text ? text : msg,
                               .severity = str(out, "severity", NULL),
                               .category = CATEGORY,
                               .scored = true};
        json_t *one = pr_result(&f, res, r->now_s);
        free(text);
        bool seen = false;
        json_array_foreach(results, j, have) seen = seen || json_equal(have, one);
        if (one && !seen)
            json_array_append(results, one);
        json_decref(one);
    }
    if (!explained) {
        struct pr_finding f = {.policy = "audit",
                               .result = "error",
                               .message = v.message ? v.message : "denied without a reason",
                               .category = CATEGORY,
                               .scored = true};
        json_array_append_new(results, pr_result(&f, res, r->now_s));
    }
    policy_verdict_clear(&v);
}

/* Write a report of res (NULL: the cluster's) with its results (taken over). */
static void write_report(struct run *r, const struct pr_resource *res, json_t *results)
{
    if (json_array_size(results) == 0) { /* nothing judged it: no report (an old one goes) */
        json_decref(results);
        return;
    }
    r->resources++;
    json_t *report = pr_report(r->api, res, results);
    const json_t *summary = json_object_get(report, "summary");
    for (size_t i = 0; i < 4; i++) /* what the report holds, past its bound */
        r->results[i] += json_integer_value(json_object_get(summary, result_names[i]));
    struct gg_err err = {{0}};
    bool wrote = false;
    if (!report)
        note_error(r, "out of memory building a report");
    else if (!r->existing.unserved /* noted once */ && leading(r) &&
             pr_write(r->a->o.client, r->api, &r->existing, report, still_leading, r, &wrote,
                      &err) != GG_OK)
        note_error(r, "%s", err.msg);
    r->written += wrote;
    json_decref(report);
}

/* ---- scope ----------------------------------------------------------------------------- */

/* GET path into *out; false when it cannot be read: noted, and unread set, but for a 404 when
 * quiet_404. */
static bool get_json(struct run *r, const char *path, bool quiet_404, json_t **out)
{
    struct kc_request rq = {.path = path, .timeout_ms = AUDIT_REQUEST_TIMEOUT_MS};
    long status = 0;
    struct gg_err err = {{0}};
    if (kc_json(r->a->o.client, &rq, "GET", NULL, out, &status, &err) == GG_OK)
        return true;
    if (quiet_404 && status == 404)
        return false;
    note_error(r, "%s", err.msg);
    r->unread = true;
    return false;
}

/* Whether a webhook's rules send pods to it. */
static bool takes_pods(const json_t *webhook)
{
    size_t i, j;
    const json_t *rule, *res;
    json_array_foreach(json_object_get(webhook, "rules"), i, rule)
        json_array_foreach(json_object_get(rule, "resources"), j, res)
    {
        const char *s = json_string_value(res);
        if (s && (strcmp(s, "pods") == 0 || strcmp(s, "*") == 0))
            return true;
    }
    return false;
}

/* The namespaceSelector of the validating webhook that takes pods. */
static void read_scope(struct run *r)
{
    char path[600];
    const char *name = r->a->o.webhook_config ? r->a->o.webhook_config : "gpuguard";
    snprintf(path, sizeof(path),
             "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/%s", name);
    json_t *cfg = NULL;
    bool unread = r->unread; /* an unknown scope audits more; it need not keep reports */
    bool got = get_json(r, path, false, &cfg);
    r->unread = unread;
    if (!got) {
        note_error(r, "the audit covers every namespace: the webhooks' namespaceSelector is "
                      "unknown");
        return;
    }
    size_t i;
    const json_t *hook;
    json_array_foreach(json_object_get(cfg, "webhooks"), i, hook)
    {
        if (takes_pods(hook)) {
            r->selector = json_incref(json_object_get(hook, "namespaceSelector"));
            break;
        }
    }
    json_decref(cfg);
}

/* Whether to audit ns: admission sees it (its labels against the selector) and it is not going
 * away; one that cannot be read is audited. */
static bool in_scope(struct run *r, const char *ns)
{
    const json_t *known = json_object_get(r->scoped, ns);
    if (known)
        return json_is_true(known);
    char path[400];
    snprintf(path, sizeof(path), "/api/v1/namespaces/%s", ns);
    json_t *obj = NULL;
    bool in = true; /* unreadable: audited */
    if (get_json(r, path, true, &obj)) {
        const json_t *meta = json_object_get(obj, "metadata");
        in = !json_object_get(meta, "deletionTimestamp") && /* going: nothing to write there */
             (!r->selector || ls_matches(r->selector, json_object_get(meta, "labels")));
    }
    json_decref(obj);
    json_object_set_new(r->scoped, ns, json_boolean(in));
    return in;
}

/* ---- workloads ------------------------------------------------------------------------- */

/* Where ref's object is read in ns, into path; false for a kind (or an apiVersion for it)
 * gpuguard does not read workloads of. */
static bool owner_path(const json_t *ref, const char *ns, char *path, size_t size)
{
    const char *api = str(ref, "apiVersion", NULL), *kind = str(ref, "kind", NULL);
    const char *name = str(ref, "name", NULL), *slash = api ? strrchr(api, '/') : NULL;
    const char *version = slash ? slash + 1 : api;
    /* The workload kinds gpuguard reads templates of (RBAC: get on each), in their own group:
     * an ownerReference's apiVersion is whatever its writer put.  Pods own nothing. */
    const char *group = mf_kind_group(kind);
    size_t group_len = slash ? (size_t)(slash - api) : 0;
    if (!api || !group || strcmp(kind, "Pod") == 0 || strcmp(kind, "PodTemplate") == 0 || !name ||
        !gg_dns_subdomain(name) || !*version || strlen(group) != group_len ||
        strncmp(api, group, group_len) != 0 ||
        strspn(version, "abcdefghijklmnopqrstuvwxyz0123456789") != strlen(version))
        return false;
    char plural[64]; /* every such kind's resource: its name in lower case, and an s */
    size_t n = 0;
    for (; kind[n] && n + 2 < sizeof(plural); n++)
        plural[n] = (char)tolower((unsigned char)kind[n]);
    snprintf(plural + n, sizeof(plural) - n, "s");
    snprintf(path, size, "%s%s%s%s/namespaces/%s/%s/%s", *group ? "/apis/" : "/api/", group,
             *group ? "/" : "", version, ns, plural, name);
    return true;
}

/* GET the object ref names in ns; NULL when it cannot be read (noted but for a 404). */
static json_t *fetch_owner(struct run *r, const char *ns, const json_t *ref)
{
    char path[1024];
    json_t *obj = NULL;
    if (!owner_path(ref, ns, path, sizeof(path)))
        return NULL;
    return get_json(r, path, true, &obj) ? obj : NULL; /* a 404: gone meanwhile */
}

/* A pending report for res, made once: its index. */
static struct pending *pending_for(struct run *r, const struct pr_resource *res)
{
    const json_t *at = json_object_get(r->pending, res->uid);
    if (at)
        return &r->pend[json_integer_value(at)];
    if (r->n_pend == r->cap_pend) {
        size_t cap = r->cap_pend ? 2 * r->cap_pend : 64;
        struct pending *more = realloc(r->pend, cap * sizeof(*more));
        if (!more)
            return NULL;
        r->pend = more;
        r->cap_pend = cap;
    }
    struct pending *p = &r->pend[r->n_pend];
    const char *parts[] = {res->api_version, res->kind, res->ns, res->name, res->uid};
    size_t len = 0;
    for (size_t i = 0; i < 5; i++)
        len += strlen(parts[i]) + 1;
    if (!(p->strings = malloc(len)) || !(p->results = json_array())) {
        free(p->strings);
        return NULL;
    }
    const char *copies[5];
    char *w = p->strings;
    for (size_t i = 0; i < 5; i++) {
        copies[i] = w;
        w = stpcpy(w, parts[i]) + 1;
    }
    p->res = (struct pr_resource){copies[0], copies[1], copies[2], copies[3], copies[4]};
    json_object_set_new(r->pending, res->uid, json_integer((json_int_t)r->n_pend));
    r->n_pend++;
    return p;
}

/* Judge a workload object: its pod templates and itself, into its pending report. */
static void judge_workload(struct run *r, const json_t *obj, const struct pr_resource *res)
{
    struct pending *p = pending_for(r, res);
    if (!p) {
        note_error(r, "out of memory");
        return;
    }
    struct dr_options o = {.namespace = res->ns, .user = DR_BACKGROUND_USER, .background = true};
    struct mf_set set = {0};
    struct gg_err err = {{0}};
    if (mf_collect_object(obj, "audit", &set, &err) == GG_OK) {
        for (size_t i = 0; i < set.count && leading(r); i++) {
            const struct mf_entry *e = &set.entries[i];
            if (e->type != MF_TEMPLATE || !e->pod)
                continue;
            struct dr_options own = o;
            own.template_path = mf_is_template(e) ? e->path : NULL;
            judge(r, e->pod, &own, &p->res, p->results);
        }
        mf_set_clear(&set);
    }
    if (leading(r))
        judge(r, obj, &o, &p->res, p->results);
}

/*
 * The uid of the top workload a pod's controller ref belongs to, judged the first time it is
 * seen; NULL when none can be read (a kind gpuguard does not know, no RBAC, gone).
 */
static const char *top_workload(struct run *r, const char *ns, const json_t *ref)
{
    char key[1024];
    snprintf(key, sizeof(key), "%s/%s/%s", ns, str(ref, "kind", NULL), str(ref, "name", NULL));
    const json_t *known = json_object_get(r->owners, key);
    if (known)
        return json_string_value(known);
    json_t *top = NULL;
    const json_t *next = ref;
    for (int depth = 0; next && depth < AUDIT_OWNER_DEPTH; depth++) {
        json_t *obj = fetch_owner(r, ns, next);
        if (!obj)
            break;
        json_decref(top);
        top = obj;
        next = inv_controller_ref(top);
    }
    struct pr_resource res;
    const char *uid = NULL;
    if (top && resource_of(top, &res) && leading(r)) {
        judge_workload(r, top, &res);
        uid = res.uid;
    }
    json_object_set_new(r->owners, key, uid ? json_string(uid) : json_null());
    json_decref(top);
    return json_string_value(json_object_get(r->owners, key));
}

/* ---- pods ------------------------------------------------------------------------------ */

static void audit_pod(struct run *r, json_t *pod)
{
    struct pr_resource res;
    if (!resource_of(pod, &res) || !inv_pod_holding(r->a->o.inv, res.uid) || !in_scope(r, res.ns))
        return;
    struct dr_options o = {.namespace = res.ns, .user = DR_BACKGROUND_USER, .background = true};
    const json_t *ref = inv_controller_ref(pod);
    struct gg_err err = {{0}};
    if (waste_running(pod) &&
        waste_add_pod(r->a->o.engine, &r->waste, pod, paced, r, &err) != GG_OK)
        note_error(r, "%s", err.msg);
    if (ref) {
        json_t *results = json_array();
        judge(r, pod, &o, &res, results);
        write_report(r, &res, results);
        top_workload(r, res.ns, ref);
        return;
    }
    /* A bare pod: its report waits for its rightsizing result. */
    struct pending *p = pending_for(r, &res);
    char key[600];
    snprintf(key, sizeof(key), "%s\x1f%s", res.ns, res.name);
    if (p) {
        judge(r, pod, &o, &p->res, p->results);
        json_object_set_new(r->bare, key, json_string(res.uid));
    }
}

/* The items of the list items, with their kind and apiVersion (a list leaves them out). */
static void audit_page(struct run *r, json_t *list)
{
    size_t i;
    json_t *pod;
    json_array_foreach(json_object_get(list, "items"), i, pod)
    {
        if (!leading(r))
            return;
        json_object_set_new(pod, "apiVersion", json_string("v1"));
        json_object_set_new(pod, "kind", json_string("Pod"));
        audit_pod(r, pod);
    }
}

/* Every pod, paged; false when the list failed (nothing may be deleted then). */
static bool audit_pods(struct run *r)
{
    char *cont = NULL;
    bool ok = true;
    while (leading(r)) {
        char token[2048] = "", path[2200];
        if (cont && !kc_query_escape(cont, token, sizeof(token))) {
            note_error(r, "listing pods: a continue token too long");
            ok = false;
            break;
        }
        snprintf(path, sizeof(path), "/api/v1/pods?limit=%d%s%s", AUDIT_POD_PAGE,
                 cont ? "&continue=" : "", token);
        free(cont);
        cont = NULL;
        struct kc_request rq = {.path = path,
                                .what = "/api/v1/pods",
                                .timeout_ms = AUDIT_REQUEST_TIMEOUT_MS,
                                .max_body = AUDIT_MAX_PAGE_BODY};
        json_t *list = NULL;
        long status = 0;
        struct gg_err err = {{0}};
        if (kc_json(r->a->o.client, &rq, "GET", NULL, &list, &status, &err) != GG_OK) {
            note_error(r, "%s", err.msg);
            ok = false;
            break;
        }
        audit_page(r, list);
        const char *next = str(json_object_get(list, "metadata"), "continue", NULL);
        cont = next && *next ? strdup(next) : NULL;
        json_decref(list);
        if (!cont)
            break;
    }
    free(cont);
    return ok && !r->aborted;
}

/* ---- rightsizing ----------------------------------------------------------------------- */

static void gpus_text(int64_t milli, char *out, size_t size)
{
    snprintf(out, size, "%.3f", (double)milli / 1000.0);
}

/* The rightsizing result of a workload (or bare pod). */
static json_t *rightsizing_result(struct run *r, const struct waste_workload *w,
                                  const struct pr_resource *res)
{
    char held[32], needed[32], waste[32], pods[32], text[PR_MESSAGE_MAX];
    int64_t h = waste_held(w), n = waste_needed(w);
    gpus_text(h, held, sizeof(held));
    gpus_text(n, needed, sizeof(needed));
    gpus_text(h - n, waste, sizeof(waste));
    snprintf(pods, sizeof(pods), "%ld", w->pods);
    const char *result;
    if (!w->known) {
        result = "skip";
        snprintf(text, sizeof(text),
                 "%ld running pod%s hold%s %s GPU-equivalents; what they need is unknown: no "
                 "usage history",
                 w->pods, w->pods == 1 ? "" : "s", w->pods == 1 ? "s" : "", held);
    } else {
        result = h > n ? "warn" : "pass";
        snprintf(text, sizeof(text),
                 "%ld running pod%s hold%s %s GPU-equivalents; their usage history needs %s%s%s",
                 w->pods, w->pods == 1 ? "" : "s", w->pods == 1 ? "s" : "", held, needed,
                 w->would_hold ? ": " : "", w->would_hold ? w->would_hold : "");
    }
    json_t *props =
        json_pack("{s:s,s:s,s:s}", "held_gpus", held, "pods", pods, "workload", waste_name(w));
    if (w->known) {
        json_object_set_new(props, "needed_gpus", json_string(needed));
        json_object_set_new(props, "waste_gpus", json_string(waste));
    }
    struct pr_finding f = {.policy = RIGHTSIZING_POLICY,
                           .rule = RIGHTSIZING_POLICY,
                           .result = result,
                           .message = text,
                           .severity = "low",
                           .category = WASTE_CATEGORY,
                           .properties = props};
    json_t *out = pr_result(&f, res, r->now_s);
    json_decref(props);
    return out;
}

/* Where a workload's rightsizing result goes: its top workload's report, or the bare pod's. */
static struct pending *home_of(struct run *r, const struct waste_workload *w)
{
    char key[1024];
    const char *uid;
    if (strchr(w->owner, '/')) {
        snprintf(key, sizeof(key), "%s/%s", w->ns, w->owner);
        uid = json_string_value(json_object_get(r->owners, key));
    } else {
        snprintf(key, sizeof(key), "%s\x1f%s", w->ns, w->owner);
        uid = json_string_value(json_object_get(r->bare, key));
    }
    const json_t *at = uid ? json_object_get(r->pending, uid) : NULL;
    return at ? &r->pend[json_integer_value(at)] : NULL;
}

/* Namespace by namespace, the waste of the cluster: the cluster report's results. */
static void namespace_results(struct run *r, const json_t *by_ns, json_t *results)
{
    const char *ns;
    json_t *f;
    json_object_foreach((json_t *)by_ns, ns, f)
    {
        int64_t held = json_integer_value(json_array_get(f, 0)),
                needed = json_integer_value(json_array_get(f, 1)),
                unknown = json_integer_value(json_array_get(f, 3));
        char h[32], n[32], u[32], w[32], text[512];
        gpus_text(held, h, sizeof(h));
        gpus_text(needed, n, sizeof(n));
        gpus_text(unknown, u, sizeof(u));
        gpus_text(held - needed, w, sizeof(w));
        snprintf(text, sizeof(text),
                 "namespace %s: running workloads with usage history hold %s GPU-equivalents "
                 "and need %s (%s idle); those without history hold %s",
                 ns, h, n, w, u);
        json_t *props = json_pack("{s:s,s:s,s:s,s:s}", "held_gpus", h, "needed_gpus", n,
                                  "waste_gpus", w, "unknown_gpus", u);
        struct pr_resource res = {.api_version = "v1", .kind = "Namespace", .name = ns};
        struct pr_finding fd = {.policy = RIGHTSIZING_POLICY,
                                .rule = RIGHTSIZING_POLICY,
                                .result = held > needed ? "warn" : "pass",
                                .message = text,
                                .severity = "low",
                                .category = WASTE_CATEGORY,
                                .properties = props};
        json_array_append_new(results, pr_result(&fd, &res, r->now_s));
        json_decref(props);
    }
}

/* The rightsizing findings into their workloads' reports (and bare pods'), and those written. */
static void finish(struct run *r)
{
    waste_finish(&r->waste);
    for (size_t i = 0; i < r->waste.n; i++) {
        struct pending *p = home_of(r, &r->waste.w[i]);
        if (p)
            json_array_append_new(p->results, rightsizing_result(r, &r->waste.w[i], &p->res));
    }
    for (size_t i = 0; i < r->n_pend && leading(r); i++) {
        write_report(r, &r->pend[i].res, r->pend[i].results);
        r->pend[i].results = NULL;
    }
}

/* The cluster's report: the waste per namespace, and what the audit could not do. */
static void cluster_report(struct run *r, const json_t *by_ns)
{
    json_t *cluster = json_array();
    namespace_results(r, by_ns, cluster);
    size_t i;
    json_t *msg;
    json_array_foreach(r->errors, i, msg)
    {
        struct pr_finding f = {.policy = "audit",
                               .result = "error",
                               .message = json_string_value(msg),
                               .category = CATEGORY};
        json_array_append_new(cluster, pr_result(&f, NULL, r->now_s));
    }
    if (leading(r))
        write_report(r, NULL, cluster);
    else
        json_decref(cluster);
}

/* Delete the reports of resources gone, in the API in use and the other one (a switch). */
static size_t sweep(struct run *r)
{
    size_t deleted = 0, n = 0;
    struct gg_err err = {{0}};
    if (pr_sweep(r->a->o.client, r->api, &r->existing, still_leading, r, &n, &err) != GG_OK)
        note_error(r, "deleting reports: %s", err.msg);
    deleted += n;
    enum pr_api other = r->api == PR_WGPOLICY ? PR_OPENREPORTS : PR_WGPOLICY;
    struct pr_existing old = {0};
    if (pr_list(r->a->o.client, other, &old, &err) == GG_OK &&
        pr_sweep(r->a->o.client, other, &old, still_leading, r, &n, &err) == GG_OK)
        deleted += n;
    pr_existing_clear(&old);
    return deleted;
}

static void run_clear(struct run *r)
{
    pr_existing_clear(&r->existing);
    waste_set_clear(&r->waste);
    for (size_t i = 0; i < r->n_pend; i++) {
        free(r->pend[i].strings);
        json_decref(r->pend[i].results);
    }
    free(r->pend);
    json_decref(r->owners);
    json_decref(r->pending);
    json_decref(r->bare);
    json_decref(r->errors);
    json_decref(r->selector);
    json_decref(r->scoped);
}

static void audit_once(struct audit *a, const struct cfg_audit *cfg, enum pr_api api)
{
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    struct run r = {.a = a,
                    .cfg = *cfg,
                    .start_us = gg_now_us(),
                    .now_s = wall.tv_sec,
                    .owners = json_object(),
                    .pending = json_object(),
                    .bare = json_object(),
                    .errors = json_array(),
                    .scoped = json_object()};
    r.api = api;
    struct gg_err err = {{0}};
    rss_record_last(); /* this thread's rightsizing findings are the audit's, not admissions' */
    bool listed = pr_list(a->o.client, r.api, &r.existing, &err) == GG_OK;
    if (!listed)
        note_error(&r, "listing gpuguard's reports: %s", err.msg);
    else if (r.existing.unserved) /* said once: every write would fail alike */
        note_error(&r,
                   "the API %s is not served (its CRDs are not installed: "
                   "deploy/reports/%.*s.yaml): no reports",
                   pr_api_version(r.api), (int)strcspn(pr_api_version(r.api), "/"),
                   pr_api_version(r.api));
    read_scope(&r);
    bool seen_all = audit_pods(&r);
    /* A whole audit: every pod seen, every report it owes written or kept as it was. */
    bool complete = seen_all && listed && !r.existing.unserved && !r.unread;
    size_t deleted = 0;
    if (!r.aborted) {
        finish(&r);
        if (complete && !r.aborted)
            deleted = sweep(&r);
        json_t *by_ns = waste_by_namespace(&r.waste);
        cluster_report(&r, by_ns);
        if (seen_all && leading(&r)) /* a part of the pods would read as their namespaces' */
            rss_publish_audit(by_ns);
        else
            json_decref(by_ns);
    }
    double took = (double)(gg_now_us() - r.start_us) / 1e6;
    pthread_mutex_lock(&stats_lock);
    stats.any = true;
    stats.evaluations += r.evaluations;
    stats.written += r.written;
    stats.deleted += deleted;
    if (!r.aborted && complete) {
        stats.ok++;
        stats.last_success_s = (double)wall.tv_sec + took;
        stats.duration_s = took;
        memcpy(stats.results, r.results, sizeof(stats.results));
        stats.resources = r.resources;
    } else if (!r.aborted) {
        stats.failed++;
    }
    pthread_mutex_unlock(&stats_lock);
    log_fields(LOG_INFO, "audit",
               json_pack("{s:s,s:f,s:I,s:i,s:i,s:i,s:I,s:I}", "outcome",
                         r.aborted  ? "stopped"
                         : complete ? "done"
                                    : "failed",
                         "seconds", took, "evaluations", (json_int_t)r.evaluations, "resources",
                         (int)r.resources, "fail", (int)r.results[1], "error", (int)r.results[3],
                         "written", (json_int_t)r.written, "deleted", (json_int_t)deleted));
    run_clear(&r);
}

/* ---- the thread ------------------------------------------------------------------------ */

/* The live configuration's audit: section (checked when it was loaded); its report_api as
 * *api, read while the set is held (the string is the set's). */
static void settings(struct audit *a, struct cfg_audit *out, enum pr_api *api)
{
    struct policy_set *set = engine_live_set(a->o.engine);
    struct gg_err err = {{0}};
    cfg_audit(policy_set_config(set), out, &err);
    if (!pr_api_parse(out->report_api, api))
        *api = PR_WGPOLICY;
    out->report_api = NULL;
    policy_set_release(set);
}

static void *run(void *arg)
{
    struct audit *a = arg;
    pthread_setname_np(pthread_self(), "audit"); /* its CPU apart in top -H and /proc */
    uint64_t term = 0, generation = 0;
    int64_t next_us = 0;
    int shown = -1; /* the figures: 0 the reviews' (audit off), 1 the leader's (none here) */
    while (!atomic_load(&a->stop)) {
        struct cfg_audit cfg;
        enum pr_api api;
        settings(a, &cfg, &api);
        bool leads = cfg.enabled && lease_is_leader(a->o.lease);
        pthread_mutex_lock(&stats_lock);
        stats.leading = leads;
        pthread_mutex_unlock(&stats_lock);
        if (!leads && shown != !!cfg.enabled) {
            /* The per-namespace figures are the leader's alone: a sum over the replicas is the
             * cluster's.  With the audit off, each replica shows its own reviews', as before. */
            rss_publish_audit(cfg.enabled ? json_object() : NULL);
            shown = cfg.enabled;
        }
        if (!leads) {
            term = 0;
        } else if (inv_ready(a->o.inv) &&
                   (lease_term(a->o.lease) != term ||
                    engine_generation(a->o.engine) != generation || gg_now_us() >= next_us)) {
            term = lease_term(a->o.lease);
            generation = engine_generation(a->o.engine);
            audit_once(a, &cfg, api);
            next_us = gg_now_us() + cfg.interval_ms * 1000;
            shown = -1; /* its figures are up: the next loss of the lead takes them down */
        }
        kc_pause_ms(&a->lock, &a->wake, &a->stop, POLL_MS);
    }
    return NULL;
}

enum gg_status audit_start(const struct audit_options *o, struct audit **out, struct gg_err *err)
{
    struct audit *a = calloc(1, sizeof(*a));
    if (!a) {
        kc_free(o->client);
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    a->o = *o;
    pthread_mutex_init(&a->lock, NULL);
    kc_cond_init(&a->wake);
    if (pthread_create(&a->thread, NULL, run, a) != 0) {
        kc_free(o->client);
        pthread_cond_destroy(&a->wake);
        pthread_mutex_destroy(&a->lock);
        free(a);
        return gg_fail(err, GG_ERR_NOMEM, "cannot start the audit's thread");
    }
    *out = a;
    return GG_OK;
}

void audit_stop(struct audit *a)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->lock);
    atomic_store(&a->stop, true);
    pthread_cond_broadcast(&a->wake);
    pthread_mutex_unlock(&a->lock);
    pthread_join(a->thread, NULL);
    kc_free(a->o.client);
    pthread_cond_destroy(&a->wake);
    pthread_mutex_destroy(&a->lock);
    free(a);
}
