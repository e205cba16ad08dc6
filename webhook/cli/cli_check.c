/*
 * cli_check.c - `gpuguard check`: the webhook's decisions on manifests,
 * offline, for CI.
 *
 * Reads files, directories (recursively: .yaml, .yml, .json) and stdin,
 * finds every pod and pod template (manifest.c), puts each through the
 * mutating and then the validating webhook exactly as the API server would
 * (dryrun.c), and reports in text, JSON lines or JUnit XML.  With
 * --emit-mutated the manifests are written back, patched, as YAML.
 *
 * Exit codes: 0 everything allowed, 1 at least one denial, 2 a usage or
 * input error (which wins over denials: CI must not read a broken input as
 * a policy verdict).
 */
#include "engine/charger.h"
#include "util/clock.h"
#include "cli/cli.h"
#include "cli/cli_dra.h"
#include "cli/cli_files.h"
#include "cli/cli_pods.h"
#include "cli/engine_opts.h"
#include "engine/dryrun.h"
#include "util/gpuguard.h"
#include "kube/inventory.h"
#include "codec/jsonpatch.h"
#include "util/log.h"
#include "codec/manifest.h"
#include "engine/policy.h"
#include "kube/rsstore.h"
#include "engine/workloads.h"
#include "codec/yamldoc.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

enum out_format { OUT_TEXT, OUT_JSON, OUT_JUNIT };

struct check_opts {
    struct engine_opts engine;
    const char *namespace;
    const char *user;
    const char *cluster_state_path;
    const char *usage_path;
    enum out_format format;
    bool show_patch;
    bool emit_mutated;
};

struct check_run {
    struct check_opts o;
    struct engine *engine;
    size_t state_counts[MF_STATE_N]; /* --cluster-state: pods, claims, templates, others skipped */
    json_t *records;                 /* one object per template, skipped object or error */
    json_t *emitted;                 /* --emit-mutated: the documents, patched, in order */
    size_t checked, allowed, denied, warned, skipped, errors;
    size_t policy_errors; /* templates on which a policy raised or broke a budget */
    bool colour;
    FILE *report;
    /* The snapshot's pods and claims, for gpuguard.usage() in quota policies (ready only with
     * one), and the DRA objects of the snapshot and the inputs, for gpuguard.dra(). */
    struct inventory *inventory;
    struct charger *charger;
    /* Namespaces the input's Namespace documents label gpuguard.io/ignore=true, so far. */
    json_t *ignored;
};

/* The namespaces the shipped webhooks' namespaceSelector leaves out by name
 * (charts/gpuguard/templates/webhooks.yaml; test_cli_check.py holds the two to the same list). */
static const char *const unseen_namespaces[] = {"kube-system", "gpuguard-system"};

static void check_usage(FILE *out)
{
    fprintf(
        out,
        "usage: gpuguard check [flags] PATH...\n"
        "\n"
        "Run the webhook's policies on manifests, as the API server would on pod creation:\n"
        "every Pod and pod template (Deployment, StatefulSet, Job, CronJob, Kubeflow jobs and\n"
        "Notebook, KServe InferenceService, Ray, JobSet, LeaderWorkerSet, Volcano, List items,\n"
        "...), built as its operator builds the pod (with the operator's labels), goes through\n"
        "mutate, then validate on the mutated pod, as the webhook does at apply time; each\n"
        "workload itself goes first (queue routing: the queue it lands in is reported).\n"
        "PATH is a file, a directory (searched recursively for .yaml, .yml and .json files)\n"
        "or - for stdin; files may hold several YAML or JSON documents.\n"
        "\n"
        "flags:\n");
    eo_help_engine(out, EO_ENGINE | EO_NO_CONFIG, EO_HELP_WIDTH);
    fprintf(out,
            "  --namespace NS         namespace for manifests that name none [default]\n"
            "  --user NAME            userInfo.username of the requests [" DR_DEFAULT_USER "]\n"
            "  --cluster-state FILE   pods in use and quotas, for quota checks: the JSON of\n"
            "                         'kubectl get pods,resourceclaims,resourceclaimtemplates,\n"
            "                         deviceclasses,resourceslices,gpuquotas -A -o json'\n"
            "                         (other kinds are skipped and counted) [none]\n"
            "  --usage FILE           GPU memory history for rightsizing, as written by\n"
            "                         'gpuguard usage -o FILE' [none: no recommendations]\n"
            "  -o, --output FORMAT    text, json (one object per line) or junit [text]\n"
            "  --show-patch           print each JSON patch (text output)\n"
            "  --emit-mutated         write the manifests, patched, as YAML to stdout; the\n"
            "                         report then goes to stderr\n");
    eo_help_tail(out, EO_HELP_WIDTH, LOG_WARN);
    fprintf(out, "\n"
                 "Manifests are checked in a fixed order: PATHs as given, a directory depth\n"
                 "first with the entries of each in byte order of their names, the documents of\n"
                 "a file from first to last.  With --cluster-state, each pod admitted counts\n"
                 "against the quota for the manifests after it, as the cluster would admit them\n"
                 "in that order: the same inputs in the same order give the same results.\n"
                 "\n"
                 "Exit status: 0 all allowed, 1 at least one denied, 3 a policy failed (raised\n"
                 "or broke a budget) on at least one, 2 usage or input error; the first that\n"
                 "applies of 2, 3, 1, 0.\n"
                 "The last line is a summary: \"N checked, N denied, N warned, N skipped\".\n");
}

enum {
    OPT_NAMESPACE = 256,
    OPT_USER,
    OPT_CLUSTER_STATE,
    OPT_USAGE,
    OPT_SHOW_PATCH,
    OPT_EMIT_MUTATED,
};

static const struct option long_options[] = {
    {"namespace", required_argument, NULL, OPT_NAMESPACE},
    {"user", required_argument, NULL, OPT_USER},
    {"cluster-state", required_argument, NULL, OPT_CLUSTER_STATE},
    {"usage", required_argument, NULL, OPT_USAGE},
    {"output", required_argument, NULL, 'o'},
    {"show-patch", no_argument, NULL, OPT_SHOW_PATCH},
    {"emit-mutated", no_argument, NULL, OPT_EMIT_MUTATED},
    {NULL, 0, NULL, 0},
};

/* One of check's own flags; -1 after saying what is wrong with its value. */
static int take_flag(void *ctx, int opt, const char *arg)
{
    struct check_opts *o = ctx;
    switch (opt) {
    case OPT_NAMESPACE:
        if (!*arg) {
            fprintf(stderr, "gpuguard check: --namespace must not be empty\n");
            return -1;
        }
        o->namespace = arg;
        return 0;
    case OPT_USER:
        o->user = arg;
        return 0;
    case OPT_CLUSTER_STATE:
        o->cluster_state_path = arg;
        return 0;
    case OPT_USAGE:
        o->usage_path = arg;
        return 0;
    case OPT_SHOW_PATCH:
        o->show_patch = true;
        return 0;
    case OPT_EMIT_MUTATED:
        o->emit_mutated = true;
        return 0;
    default: /* 'o' */
        if (strcmp(arg, "text") == 0)
            o->format = OUT_TEXT;
        else if (strcmp(arg, "json") == 0)
            o->format = OUT_JSON;
        else if (strcmp(arg, "junit") == 0)
            o->format = OUT_JUNIT;
        else {
            fprintf(stderr, "gpuguard check: -o must be text, json or junit, got \"%s\"\n", arg);
            return -1;
        }
        return 0;
    }
}

static const struct eo_command check_command = {
    .name = "gpuguard check",
    .shared = EO_ENGINE | EO_NO_CONFIG,
    .log_level = LOG_WARN,
    .options = long_options,
    .short_options = "o:",
    .take = take_flag,
    .help = check_usage,
    .missing_args = "no PATH given (a file, a directory or - for stdin)",
};

/* ---- inputs ------------------------------------------------------------- */

static const char *const manifest_suffixes[] = {".yaml", ".yml", ".json", NULL};

/* ---- records ------------------------------------------------------------ */

static void add_error(struct check_run *r, const char *file, const char *message)
{
    r->errors++;
    fprintf(stderr, "gpuguard check: %s\n", message);
    json_array_append_new(
        r->records, json_pack("{s:s,s:s,s:s}", "type", "error", "file", file, "message", message));
}

static json_t *owner_json(const struct mf_entry *e)
{
    if (!*e->owner_kind)
        return json_null();
    return json_pack("{s:s,s:s}", "kind", e->owner_kind, "name", e->owner_name);
}

static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

static void add_skipped(struct check_run *r, const char *file, const struct mf_entry *e,
                        const char *reason)
{
    r->skipped++;
    json_array_append_new(r->records,
                          json_pack("{s:s,s:s,s:I,s:I,s:s,s:s,s:s,s:o,s:s,s:s}", "type", "skipped",
                                    "file", file, "document", (json_int_t)e->doc_number, "line",
                                    (json_int_t)e->line, "apiVersion", e->api_version, "kind",
                                    e->kind, "name", e->name, "namespace",
                                    *e->namespace ? json_string(e->namespace) : json_null(),
                                    "pointer", e->object_ptr, "reason", reason));
}

/* milli as GPU-equivalents, exactly: "1.143". */
static json_t *gpus_text(long long milli)
{
    char text[32];
    snprintf(text, sizeof(text), "%lld.%03lld", milli / 1000, milli % 1000);
    return json_string(text);
}

/* The template's pods into its record: how many, how many admitted, and what they all hold. */
static void add_pods(json_t *rec, const struct pods_fit *fit)
{
    json_object_set_new(rec, "pods", json_integer(fit->pods));
    json_object_set_new(rec, "admitted_pods", json_integer(fit->admitted));
    json_object_set_new(rec, "charge",
                        fit->charge ? gpus_text(fit->charge * fit->pods) : json_null());
    json_object_set_new(rec, "charge_per_pod", fit->charge ? gpus_text(fit->charge) : json_null());
}

/* "charge: 6.000 GPU-equivalents (6 pods x 1.000)" of a record, or "" when it holds no GPU. */
static void charge_line(const json_t *rec, char *out, size_t size)
{
    const char *total = json_string_value(json_object_get(rec, "charge"));
    long long pods = json_integer_value(json_object_get(rec, "pods"));
    if (!total)
        snprintf(out, size, "%s", "");
    else if (pods > 1)
        snprintf(out, size, "charge: %s GPU-equivalents (%lld pods x %s)", total, pods,
                 json_string_value(json_object_get(rec, "charge_per_pod")));
    else
        snprintf(out, size, "charge: %s GPU-equivalents", total);
}

/* Take the gpuguard.io/ignore label of each Namespace document of docs. */
static void note_ignored(struct check_run *r, const json_t *docs)
{
    size_t i;
    const json_t *doc;
    json_array_foreach(docs, i, doc)
    {
        const json_t *meta = json_object_get(doc, "metadata");
        const char *name = json_string_value(json_object_get(meta, "name"));
        const char *kind = json_string_value(json_object_get(doc, "kind"));
        if (!name || !kind || strcmp(kind, "Namespace") != 0)
            continue;
        const char *ignore =
            json_string_value(json_object_get(json_object_get(meta, "labels"), GG_KEY_IGNORE));
        if (ignore && strcmp(ignore, "true") == 0)
            json_object_set_new(r->ignored, name, json_true());
        else
            json_object_del(r->ignored, name);
    }
}

/* Why the webhooks never see a pod of e, into why; false when they do. */
static bool unseen(const struct check_run *r, const struct mf_entry *e, char *why, size_t size)
{
    const char *ns = *e->namespace ? e->namespace : r->o.namespace ? r->o.namespace : "default";
    for (size_t i = 0; i < sizeof(unseen_namespaces) / sizeof(unseen_namespaces[0]); i++)
        if (strcmp(ns, unseen_namespaces[i]) == 0) {
            snprintf(why, size, "namespace %s: the webhooks' namespaceSelector leaves it out", ns);
            return true;
        }
    if (!json_is_true(json_object_get(r->ignored, ns)))
        return false;
    snprintf(why, size, "namespace %s is labelled %s=true: the webhooks leave it out", ns,
             GG_KEY_IGNORE);
    return true;
}

/*
 * Put one template through the webhooks and record the result, with its
 * object's own (object: NULL for a Pod document): a denial of either
 * denies, and the queue is the object's, else the pod's.
 */
static enum gg_status check_template(struct check_run *r, const char *file, struct mf_entry *e,
                                     json_t *doc, const struct dr_result *object,
                                     struct gg_err *err)
{
    struct dr_options dopts = {.namespace = r->o.namespace, .user = r->o.user};
    struct wl_result wr;
    int64_t t0 = gg_now_ns();
    enum gg_status st = wl_template(r->engine, e, doc, &dopts, &wr, err);
    int64_t t1 = gg_now_ns();
    if (st != GG_OK)
        return st;
    struct dr_result *res = &wr.pod;
    double seconds = (double)(t1 - t0) / 1e9;
    if (json_array_size(wr.mapped) && r->emitted) {
        st = jp_apply(doc, wr.mapped, err);
        if (st != GG_OK) {
            char msg[512];
            snprintf(msg, sizeof(msg),
                     "%s:%zu: %s %s: the patch does not apply to the template: %s", file, e->line,
                     e->kind, e->path, err->msg);
            add_error(r, file, msg);
            st = GG_OK;
        }
    }
    wl_fold(res, object);
    struct pods_fit fit;
    if ((st = cli_fit_pods(r->engine, r->inventory, e, doc, &dopts, res, &fit, err)) != GG_OK) {
        wl_result_clear(&wr);
        return st;
    }
    bool allowed = res->allowed;
    const char *message = res->message;
    json_t *warnings = json_incref(res->warnings);
    if (fit.denial) {
        char text[4096];
        snprintf(text, sizeof(text),
                 "%lld of its %lld pods would be admitted: the API server admits the %s and "
                 "denies the other %lld, the first of them with: %s",
                 fit.admitted, fit.pods, e->kind, fit.pods - fit.admitted, fit.denial);
        json_array_append_new(warnings, json_string(text));
    }
    const char *queue = object ? wl_queue(object->mutated) : NULL;
    if (!queue)
        queue = wl_queue(res->mutated);
    bool policy_error = res->errors > 0;
    r->checked++;
    if (allowed)
        r->allowed++;
    else
        r->denied++;
    if (json_array_size(warnings))
        r->warned++;
    r->policy_errors += policy_error;
    json_t *rec = json_pack(
        "{s:s,s:s,s:I,s:I,s:s,s:s,s:s,s:s,s:s,s:s,s:o,s:O,s:b,s:o,s:o,s:O,s:O,s:O,s:o,s:O}", "type",
        "template", "file", file, "document", (json_int_t)e->doc_number, "line",
        (json_int_t)e->line, "apiVersion", e->api_version, "kind", e->kind, "name", e->name,
        "namespace", res->namespace, "path", e->path, "pointer", e->template_ptr, "owner",
        owner_json(e), "owners", e->owners, "allowed", allowed, "message", str_or_null(message),
        "denied_in", str_or_null(res->denied_by), "warnings", warnings, "audit", res->audit,
        "policies", res->fired, "decision", str_or_null(res->decision), "patch", res->patch);
    if (rec) {
        json_object_set_new(rec, "queue", str_or_null(queue));
        json_object_set_new(rec, "policy_error", json_boolean(policy_error));
        add_pods(rec, &fit);
    }
    if (rec && r->o.format == OUT_JUNIT) /* testcase time; not part of the JSON output */
        json_object_set_new(rec, "seconds", json_real(seconds));
    if (rec && r->emitted && json_array_size(wr.dropped))
        json_object_set(rec, "unmapped_patch", wr.dropped);
    json_array_append_new(r->records, rec);
    json_decref(warnings);
    pods_fit_clear(&fit);
    wl_result_clear(&wr);
    return st;
}

/* One input: read, parse, check every template; input errors are recorded. */
static enum gg_status check_input(struct check_run *r, const char *name, bool from_stdin)
{
    struct gg_err err = {{0}};
    struct yd_limits limits;
    struct yd_stream stream = {0};
    struct mf_set set = {0};
    char *text = NULL;
    size_t len = 0;
    enum gg_status st;
    const char *file = from_stdin ? "<stdin>" : name;
    mf_yd_limits(&limits);
    st = from_stdin ? cli_read_stdin(MF_MAX_FILE_BYTES, &text, &len, &err)
                    : gg_read_file(name, MF_MAX_FILE_BYTES, &text, &len, &err);
    if (st == GG_OK)
        st = yd_load_stream(text, len, file, &limits, &stream, &err);
    free(text);
    if (st == GG_OK)
        st = mf_collect(&stream, file, &set, &err);
    if (st != GG_OK) {
        if (st == GG_ERR_NOMEM) {
            yd_stream_clear(&stream);
            return st;
        }
        add_error(r, file, err.msg);
        yd_stream_clear(&stream);
        return GG_OK;
    }
    st = GG_OK;
    cli_keep_dra(r->inventory, &set, stream.docs, r->o.namespace);
    note_ignored(r, stream.docs);
    struct wl_walk walk = {0};
    struct dr_options dopts = {.namespace = r->o.namespace, .user = r->o.user};
    for (size_t i = 0; st == GG_OK && i < set.count; i++) {
        struct mf_entry *e = &set.entries[i];
        json_t *doc = json_array_get(stream.docs, e->doc);
        char why[512];
        if (e->type == MF_SKIPPED) {
            add_skipped(r, file, e, e->reason);
            continue;
        }
        if (unseen(r, e, why, sizeof(why))) {
            add_skipped(r, file, e, why);
            continue;
        }
        /* The workload itself first (queue routing), its patch onto the document with
         * --emit-mutated. */
        st = wl_walk_at(&walk, r->engine, &set, i, doc, &dopts, r->emitted != NULL, &err);
        if (st == GG_OK)
            st = check_template(r, file, e, doc, wl_walk_object(&walk), &err);
    }
    wl_walk_clear(&walk);
    if (st != GG_OK) {
        fprintf(stderr, "gpuguard check: %s: %s\n", file, err.msg);
        r->errors++;
    } else if (r->emitted) {
        json_array_extend(r->emitted, stream.docs);
    }
    mf_set_clear(&set);
    yd_stream_clear(&stream);
    return st == GG_ERR_NOMEM ? st : GG_OK;
}

/* ---- output ------------------------------------------------------------- */

#define C_RESET "\033[0m"
#define C_RED "\033[1;31m"
#define C_GREEN "\033[32m"
#define C_YELLOW "\033[33m"
#define C_DIM "\033[2m"

static const char *col(const struct check_run *r, const char *code)
{
    return r->colour ? code : "";
}

/* Each line of text after prefix. */
static void print_lines(FILE *f, const char *prefix, const char *text)
{
    const char *p = text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        fprintf(f, "%s%.*s\n", prefix, (int)n, p);
        p += n + (nl ? 1 : 0);
    }
}

static void print_text_template(const struct check_run *r, const json_t *rec)
{
    FILE *f = r->report;
    bool allowed = json_is_true(json_object_get(rec, "allowed"));
    bool error = json_is_true(json_object_get(rec, "policy_error"));
    const char *path = json_string_value(json_object_get(rec, "path"));
    fprintf(f, "%s%-8s%s %s:%lld  %s %s/%s%s%s\n", col(r, allowed && !error ? C_GREEN : C_RED),
            error     ? "error"
            : allowed ? "allowed"
                      : "denied",
            col(r, C_RESET), json_string_value(json_object_get(rec, "file")),
            (long long)json_integer_value(json_object_get(rec, "line")),
            json_string_value(json_object_get(rec, "kind")),
            json_string_value(json_object_get(rec, "namespace")),
            json_string_value(json_object_get(rec, "name")), *path ? "  " : "", path);
    const char *message = json_string_value(json_object_get(rec, "message"));
    if (message)
        print_lines(f, "         ", message);
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(rec, "warnings"), i, w)
    {
        fprintf(f, "         %swarning:%s %s\n", col(r, C_YELLOW), col(r, C_RESET),
                json_string_value(w));
    }
    json_t *owners = json_object_get(rec, "owners");
    if (json_array_size(owners) > 1) { /* a chain, as the cluster has it: LWS > StatefulSet */
        fprintf(f, "         owners:");
        json_array_foreach(owners, i, w)
        {
            fprintf(f, "%s %s/%s", i ? " >" : "", json_string_value(json_object_get(w, "kind")),
                    json_string_value(json_object_get(w, "name")));
        }
        fprintf(f, "\n");
    }
    const char *decision = json_string_value(json_object_get(rec, "decision"));
    if (decision)
        fprintf(f, "         decision: %s\n", decision);
    char charge[128];
    charge_line(rec, charge, sizeof(charge));
    if (*charge)
        fprintf(f, "         %s\n", charge);
    const char *queue = json_string_value(json_object_get(rec, "queue"));
    if (queue)
        fprintf(f, "         queue: %s\n", queue);
    json_t *patch = json_object_get(rec, "patch");
    if (r->o.show_patch && json_array_size(patch)) {
        size_t k;
        json_t *op;
        fprintf(f, "         patch:\n");
        json_array_foreach(patch, k, op)
        {
            char *text = json_dumps(op, JSON_COMPACT);
            fprintf(f, "           %s\n", text ? text : "?");
            free(text);
        }
    }
    json_t *unmapped = json_object_get(rec, "unmapped_patch");
    if (json_array_size(unmapped)) {
        fprintf(f,
                "         note: %zu patch operation(s) touch fields the controller sets and "
                "were not written to the template\n",
                json_array_size(unmapped));
    }
}

static void print_text(const struct check_run *r)
{
    size_t i;
    json_t *rec;
    json_array_foreach(r->records, i, rec)
    {
        const char *type = json_string_value(json_object_get(rec, "type"));
        if (strcmp(type, "template") == 0) {
            print_text_template(r, rec);
        } else if (strcmp(type, "skipped") == 0) {
            const char *kind = json_string_value(json_object_get(rec, "kind"));
            const char *name = json_string_value(json_object_get(rec, "name"));
            char what[64];
            snprintf(what, sizeof(what), "document %lld",
                     (long long)json_integer_value(json_object_get(rec, "document")));
            fprintf(r->report, "%s%-8s %s:%lld  %s%s%s  (%s)%s\n", col(r, C_DIM), "skipped",
                    json_string_value(json_object_get(rec, "file")),
                    (long long)json_integer_value(json_object_get(rec, "line")),
                    *kind ? kind : what, *name ? " " : "", name,
                    json_string_value(json_object_get(rec, "reason")), col(r, C_RESET));
        }
        /* errors were printed on stderr as they happened */
    }
}

static json_t *summary_json(const struct check_run *r, int exit_code)
{
    json_t *sum = json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:i,s:s?}", "type", "summary", "checked",
                            (json_int_t)r->checked, "allowed", (json_int_t)r->allowed, "denied",
                            (json_int_t)r->denied, "warned", (json_int_t)r->warned, "skipped",
                            (json_int_t)r->skipped, "errors", (json_int_t)r->errors, "exit_code",
                            exit_code, "config", r->o.engine.config);
    if (sum) {
        json_object_set_new(sum, "policy_errors", json_integer((json_int_t)r->policy_errors));
        json_object_set_new(sum, "usage",
                            json_string(r->o.cluster_state_path ? "cluster-state" : "empty"));
    }
    const size_t *c = r->state_counts;
    if (r->o.cluster_state_path)
        json_object_set_new(
            sum, "cluster_state",
            json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "pods", (json_int_t)c[MF_STATE_POD],
                      "resourceclaims", (json_int_t)c[MF_STATE_CLAIM], "resourceclaimtemplates",
                      (json_int_t)c[MF_STATE_TEMPLATE], "deviceclasses",
                      (json_int_t)c[MF_STATE_CLASS], "resourceslices",
                      (json_int_t)c[MF_STATE_SLICE], "gpuquotas", (json_int_t)c[MF_STATE_QUOTA],
                      "skipped", (json_int_t)c[MF_STATE_OTHER]));
    return sum;
}

static void print_summary_line(const struct check_run *r, FILE *f)
{
    if (!r->o.cluster_state_path)
        fprintf(f, "GPU usage taken as empty (no --cluster-state): quotas are checked against "
                   "each pod alone\n");
    fprintf(f, "%zu checked, %zu denied, %zu warned, %zu skipped", r->checked, r->denied, r->warned,
            r->skipped);
    if (r->state_counts[MF_STATE_OTHER])
        fprintf(f, ", %zu cluster-state object%s of other kinds skipped",
                r->state_counts[MF_STATE_OTHER], r->state_counts[MF_STATE_OTHER] == 1 ? "" : "s");
    if (r->errors)
        fprintf(f, ", %zu error%s", r->errors, r->errors == 1 ? "" : "s");
    if (r->policy_errors)
        fprintf(f, ", %zu policy error%s", r->policy_errors, r->policy_errors == 1 ? "" : "s");
    fputc('\n', f);
}

static void print_json(const struct check_run *r, int exit_code)
{
    size_t i;
    json_t *rec;
    json_array_foreach(r->records, i, rec)
    {
        char *line = json_dumps(rec, JSON_COMPACT);
        if (line)
            fprintf(r->report, "%s\n", line);
        free(line);
    }
    json_t *s = summary_json(r, exit_code);
    char *line = json_dumps(s, JSON_COMPACT);
    if (line)
        fprintf(r->report, "%s\n", line);
    free(line);
    json_decref(s);
}

/* text as XML character data or attribute value: escaped, invalid characters as U+FFFD. */
static void xml_text(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        if (c == '&')
            fputs("&amp;", f);
        else if (c == '<')
            fputs("&lt;", f);
        else if (c == '>')
            fputs("&gt;", f);
        else if (c == '"')
            fputs("&quot;", f);
        else if (c == '\'')
            fputs("&apos;", f);
        else if (c == '\n')
            fputs("&#10;", f);
        else if (c == '\t')
            fputs("&#9;", f);
        else if (c == '\r')
            fputs("&#13;", f);
        else if (c < 0x20)
            fputs("\xef\xbf\xbd", f);
        else if (c == 0xef && p[1] == 0xbf && (p[2] == 0xbe || p[2] == 0xbf)) {
            fputs("\xef\xbf\xbd", f); /* U+FFFE and U+FFFF are not XML characters */
            p += 2;
        } else
            fputc(c, f);
    }
}

/* The testcase name of a template record. */
static void junit_name(FILE *f, const json_t *rec)
{
    char name[1024];
    const char *path = json_string_value(json_object_get(rec, "path"));
    snprintf(name, sizeof(name), "%s %s/%s%s%s (line %lld)",
             json_string_value(json_object_get(rec, "kind")),
             json_string_value(json_object_get(rec, "namespace")),
             json_string_value(json_object_get(rec, "name")), *path ? " " : "", path,
             (long long)json_integer_value(json_object_get(rec, "line")));
    xml_text(f, name);
}

static void junit_case(FILE *f, const json_t *rec)
{
    const char *file = json_string_value(json_object_get(rec, "file"));
    const char *type = json_string_value(json_object_get(rec, "type"));
    fputs("    <testcase classname=\"", f);
    xml_text(f, file);
    fputs("\" name=\"", f);
    if (strcmp(type, "error") == 0) {
        xml_text(f, file);
        fputs("\" time=\"0\">\n      <error type=\"input\" message=\"", f);
        xml_text(f, json_string_value(json_object_get(rec, "message")));
        fputs("\"/>\n    </testcase>\n", f);
        return;
    }
    junit_name(f, rec);
    fprintf(f, "\" time=\"%.6f\">\n", json_real_value(json_object_get(rec, "seconds")));
    const char *message = json_string_value(json_object_get(rec, "message"));
    bool error = json_is_true(json_object_get(rec, "policy_error"));
    if (error || !json_is_true(json_object_get(rec, "allowed"))) {
        const char *nl = strchr(message ? message : "", '\n');
        const char *text = message ? message : error ? "a policy failed" : "denied";
        char first[512];
        snprintf(first, sizeof(first), "%.*s", nl ? (int)(nl - message) : 500, text);
        fputs(error ? "      <error type=\"policy error\" message=\""
                    : "      <failure type=\"denied\" message=\"",
              f);
        xml_text(f, first);
        fputs("\">", f);
        xml_text(f, text);
        fputs(error ? "</error>\n" : "</failure>\n", f);
    }
    json_t *warnings = json_object_get(rec, "warnings");
    const char *decision = json_string_value(json_object_get(rec, "decision"));
    const char *queue = json_string_value(json_object_get(rec, "queue"));
    char charge[128];
    charge_line(rec, charge, sizeof(charge));
    if (json_array_size(warnings) || decision || queue || *charge) {
        size_t i;
        json_t *w;
        fputs("      <system-out>", f);
        json_array_foreach(warnings, i, w)
        {
            xml_text(f, "warning: ");
            xml_text(f, json_string_value(w));
            xml_text(f, "\n");
        }
        if (decision) {
            xml_text(f, "decision: ");
            xml_text(f, decision);
            xml_text(f, "\n");
        }
        if (queue) {
            xml_text(f, "queue: ");
            xml_text(f, queue);
            xml_text(f, "\n");
        }
        if (*charge) {
            xml_text(f, charge);
            xml_text(f, "\n");
        }
        fputs("</system-out>\n", f);
    }
    fputs("    </testcase>\n", f);
}

static void print_junit(const struct check_run *r)
{
    FILE *f = r->report;
    size_t i, j, n = json_array_size(r->records), denied_by_error = 0;
    json_t *one;
    json_array_foreach(r->records, i, one)
    {
        denied_by_error += json_is_true(json_object_get(one, "policy_error")) &&
                           !json_is_true(json_object_get(one, "allowed"));
    }
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<testsuites name=\"gpuguard check\" tests=\"%zu\" failures=\"%zu\" errors=\"%zu\">\n",
            r->checked + r->errors, r->denied - denied_by_error, r->errors + r->policy_errors);
    /* One testsuite per file, in input order. */
    for (i = 0; i < n;) {
        const char *file =
            json_string_value(json_object_get(json_array_get(r->records, i), "file"));
        size_t tests = 0, failures = 0, errors = 0;
        for (j = i; j < n; j++) {
            const json_t *rec = json_array_get(r->records, j);
            if (strcmp(json_string_value(json_object_get(rec, "file")), file) != 0)
                break;
            const char *type = json_string_value(json_object_get(rec, "type"));
            tests += strcmp(type, "skipped") != 0;
            bool error = json_is_true(json_object_get(rec, "policy_error"));
            errors += strcmp(type, "error") == 0 || error;
            failures += strcmp(type, "template") == 0 && !error &&
                        !json_is_true(json_object_get(rec, "allowed"));
        }
        fputs("  <testsuite name=\"", f);
        xml_text(f, file);
        fprintf(f, "\" tests=\"%zu\" failures=\"%zu\" errors=\"%zu\" skipped=\"0\">\n", tests,
                failures, errors);
        bool any_skipped = false;
        for (size_t k = i; k < j; k++) {
            const json_t *rec = json_array_get(r->records, k);
            if (strcmp(json_string_value(json_object_get(rec, "type")), "skipped") == 0)
                any_skipped = true;
            else
                junit_case(f, rec);
        }
        if (any_skipped) {
            fputs("    <system-out>", f);
            for (size_t k = i; k < j; k++) {
                const json_t *rec = json_array_get(r->records, k);
                if (strcmp(json_string_value(json_object_get(rec, "type")), "skipped") != 0)
                    continue;
                char line[1024];
                snprintf(line, sizeof(line), "skipped: %s %s (line %lld): %s\n",
                         json_string_value(json_object_get(rec, "kind")),
                         json_string_value(json_object_get(rec, "name")),
                         (long long)json_integer_value(json_object_get(rec, "line")),
                         json_string_value(json_object_get(rec, "reason")));
                xml_text(f, line);
            }
            fputs("</system-out>\n", f);
        }
        fputs("  </testsuite>\n", f);
        i = j;
    }
    fputs("</testsuites>\n", f);
}

/* ---- the command -------------------------------------------------------- */

/* Every input, in order; "-" once at most. */
static enum gg_status expand_paths(struct check_run *r, struct cli_files *inputs)
{
    struct gg_err err = {{0}};
    bool stdin_seen = false;
    for (int i = 0; i < r->o.engine.n_args; i++) {
        const char *p = r->o.engine.args[i];
        struct stat sb;
        enum gg_status st = GG_OK;
        if (strcmp(p, "-") == 0) {
            if (stdin_seen) {
                fprintf(stderr, "gpuguard check: - (stdin) given twice\n");
                return GG_ERR_INVALID;
            }
            stdin_seen = true;
            st = cli_files_add(inputs, p, &err);
        } else if (stat(p, &sb) != 0) {
            snprintf(err.msg, sizeof(err.msg), "%s: cannot open: %s", p, strerror(errno));
            add_error(r, p, err.msg);
        } else if (S_ISDIR(sb.st_mode)) {
            st = cli_files_walk(p, manifest_suffixes, inputs, &err);
            if (st != GG_OK && st != GG_ERR_NOMEM) {
                add_error(r, p, err.msg);
                st = GG_OK;
            }
        } else {
            st = cli_files_add(inputs, p, &err);
        }
        if (st != GG_OK) {
            fprintf(stderr, "gpuguard check: %s\n", err.msg);
            return st;
        }
    }
    return GG_OK;
}

int cli_check(int argc, char **argv)
{
    struct check_run r = {0};
    struct gg_err err = {{0}};
    struct cli_files inputs = {0};
    int rc = 2;
    r.o = (struct check_opts){.format = OUT_TEXT};
    if (!eo_parse(&check_command, &r.o, argc, argv, &r.o.engine, &rc))
        return rc;
    if (!r.o.engine.config && !r.o.engine.no_config) {
        fprintf(stderr, "gpuguard check: %s\nrun 'gpuguard check --help' for the flags\n",
                EO_NO_CONFIG_GIVEN);
        return 2;
    }
    r.records = json_array();
    r.emitted = r.o.emit_mutated ? json_array() : NULL;
    r.report = r.o.emit_mutated ? stderr : stdout;
    r.colour = r.o.format == OUT_TEXT && cli_use_colour(r.report);
    if (r.o.usage_path) { /* a saved snapshot never goes stale */
        struct rs_data usage = {0};
        if (rs_file_load(r.o.usage_path, &usage, &err) != GG_OK) {
            fprintf(stderr, "gpuguard check: --usage: %s\n", err.msg);
            goto out;
        }
        rss_set_source("file");
        rss_publish(&usage, 0);
    }
    if (eo_engine_new(&r.o.engine, &r.engine, &err) != GG_OK) {
        fprintf(stderr, "gpuguard check: cannot load the policies: %s\n", err.msg);
        goto out;
    }
    if (!(r.inventory = inv_new()) || !(r.ignored = json_object())) {
        fprintf(stderr, "gpuguard check: out of memory\n");
        goto out;
    }
    if (r.o.cluster_state_path) {
        if (eo_load_snapshot(r.engine, r.inventory, r.o.cluster_state_path, r.state_counts,
                             &r.charger, NULL, &err) != GG_OK) {
            fprintf(stderr, "gpuguard check: --cluster-state: %s\n", err.msg);
            goto out;
        }
    } else {
        inv_set_ready(r.inventory, true); /* no usage given: empty, said in the summary */
    }
    engine_set_inventory(r.engine, r.inventory);
    if (expand_paths(&r, &inputs) != GG_OK)
        goto out;
    for (size_t i = 0; i < inputs.count; i++) {
        bool from_stdin = strcmp(inputs.names[i], "-") == 0;
        if (check_input(&r, inputs.names[i], from_stdin) != GG_OK) {
            fprintf(stderr, "gpuguard check: out of memory\n");
            goto out;
        }
    }
    rc = r.errors ? 2 : r.policy_errors ? 3 : r.denied ? 1 : 0;
    if (r.o.format == OUT_JSON) {
        print_json(&r, rc);
    } else if (r.o.format == OUT_JUNIT) {
        print_junit(&r);
        print_summary_line(&r, stderr);
    } else {
        print_text(&r);
        print_summary_line(&r, r.report);
    }
    if (r.emitted) {
        char *yaml = NULL;
        size_t len = 0;
        if (mf_emit_yaml(r.emitted, &yaml, &len, &err) != GG_OK) {
            fprintf(stderr, "gpuguard check: --emit-mutated: %s\n", err.msg);
            rc = 2;
        } else {
            fwrite(yaml, 1, len, stdout);
        }
        free(yaml);
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "gpuguard check: cannot write the output: %s\n", strerror(errno));
        rc = 2;
    }
out:
    cli_files_clear(&inputs);
    charger_free(r.charger);
    engine_free(r.engine);
    inv_free(r.inventory);
    json_decref(r.ignored);
    json_decref(r.records);
    json_decref(r.emitted);
    rss_reset();
    return rc;
}
