/*
 * cli_report.c - `gpuguard report`: the GPU a cluster holds and what its workloads' history
 * says they need, offline, from a cluster-state dump and a usage file (a first look at the
 * waste, without installing anything; docs/audit.md).
 *
 * Each running GPU pod of the dump is reviewed as gpuguard reviews a pod (the engine, the
 * policies and the configuration given, dry run), the pods of one controller once: the
 * rightsizing policy's finding for the workload (rsstore.h, rss_take_last) gives what a pod
 * holds and needs, in GPU-equivalents, and the allocation that would hold it.  A workload
 * the history does not cover counts as held, with nothing known of what it needs.
 *
 * Exit codes: 0 reported, 1 an input or the policies could not be loaded, 2 a usage error.
 */
#include "cli/cli.h"
#include "cli/engine_opts.h"
#include "codec/keys.h"
#include "engine/charger.h"
#include "engine/dryrun.h"
#include "kube/inventory.h"
#include "kube/rsstore.h"
#include "util/log.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REPORT_HELP_WIDTH 23 /* the flag column of --help */

struct report_opts {
    struct engine_opts engine;
    const char *state, *usage;
    bool json;
};

/* One workload: the pods of one controller (or one pod without). */
struct workload {
    const char *ns, *owner; /* the owner's kind/name, or the pod's name */
    const json_t *pod;      /* the one reviewed */
    long pods;
    bool known;         /* the rightsizing policy reported it */
    struct rss_last rs; /* what it reported: per pod */
    int64_t held_milli; /* per pod, when not known: the charge the review gave */
    const char *would_hold;
};

static void report_usage(FILE *out)
{
    fprintf(out,
            "usage: gpuguard report --cluster-state FILE --usage FILE [flags]\n"
            "\n"
            "The GPU-equivalents the running GPU pods of a cluster hold, what their memory\n"
            "history says they need (peak x headroom, at the allocation the fleet would give),\n"
            "and the difference: per workload, per namespace and for the cluster.  Offline:\n"
            "\n"
            "  kubectl get pods,resourceclaims,resourceclaimtemplates,deviceclasses -A -o json "
            "> state.json\n"
            "  gpuguard usage --config gpuguard.yaml -o usage.json\n"
            "  gpuguard report --config gpuguard.yaml --cluster-state state.json "
            "--usage usage.json\n"
            "\n"
            "flags:\n"
            "  --cluster-state FILE  the cluster's objects (kubectl get -o json) [required]\n"
            "  --usage FILE          GPU memory history, as 'gpuguard usage' writes it\n"
            "                        [required]\n");
    eo_help_engine(out, EO_ENGINE, REPORT_HELP_WIDTH);
    fprintf(out, "  -o, --output FORMAT   text or json [text]\n");
    eo_help_tail(out, REPORT_HELP_WIDTH, LOG_WARN);
    fprintf(out, "\n"
                 "A workload without history counts as held, its need unknown.  A GPU shared by\n"
                 "several pods is counted once per pod, at each pod's share.\n"
                 "Exit status: 0 reported, 1 an input could not be read, 2 usage error.\n");
}

enum { OPT_CLUSTER_STATE = 256, OPT_USAGE };

static const struct option long_options[] = {
    {"cluster-state", required_argument, NULL, OPT_CLUSTER_STATE},
    {"usage", required_argument, NULL, OPT_USAGE},
    {"output", required_argument, NULL, 'o'},
    {NULL, 0, NULL, 0},
};

static int take_flag(void *ctx, int opt, const char *arg)
{
    struct report_opts *o = ctx;
    if (opt == OPT_CLUSTER_STATE)
        o->state = arg;
    else if (opt == OPT_USAGE)
        o->usage = arg;
    else if (strcmp(arg, "text") == 0 || strcmp(arg, "json") == 0)
        o->json = strcmp(arg, "json") == 0;
    else {
        fprintf(stderr, "gpuguard report: -o must be text or json, got \"%s\"\n", arg);
        return -1;
    }
    return 0;
}

static const char *str(const json_t *obj, const char *a, const char *b)
{
    const json_t *v = json_object_get(obj, a);
    return json_string_value(b ? json_object_get(v, b) : v);
}

/* A pod that holds its GPU now: on a node, neither finished nor failed. */
static bool running(const json_t *pod)
{
    const char *phase = str(pod, "status", "phase");
    return str(pod, "spec", "nodeName") &&
           !(phase && (strcmp(phase, "Succeeded") == 0 || strcmp(phase, "Failed") == 0));
}

/* Its controller as "Kind/name", else NULL. */
static char *controller(const json_t *pod)
{
    size_t i;
    const json_t *ref;
    json_array_foreach(json_object_get(json_object_get(pod, "metadata"), "ownerReferences"), i, ref)
    {
        char *out = NULL;
        if (json_is_true(json_object_get(ref, "controller")) &&
            asprintf(&out, "%s/%s", str(ref, "kind", NULL), str(ref, "name", NULL)) > 0)
            return out;
    }
    return NULL;
}

/* The workloads of the dump's running pods, each pod counted in its controller's. */
static enum gg_status group(const json_t *items, struct workload **out, size_t *n,
                            struct gg_err *err)
{
    size_t i;
    const json_t *pod;
    *out = calloc(json_array_size(items) + 1, sizeof(**out));
    *n = 0;
    if (!*out)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    json_array_foreach(items, i, pod)
    {
        const char *kind = str(pod, "kind", NULL), *ns = str(pod, "metadata", "namespace");
        if (!kind || strcmp(kind, "Pod") != 0 || !ns || !running(pod))
            continue;
        char *owner = controller(pod);
        if (!owner &&
            !(owner = strdup(str(pod, "metadata", "name") ? str(pod, "metadata", "name") : "")))
            return gg_fail(err, GG_ERR_NOMEM, "out of memory");
        size_t w = 0;
        while (w < *n && !(strcmp((*out)[w].ns, ns) == 0 && strcmp((*out)[w].owner, owner) == 0))
            w++;
        if (w == *n)
            (*out)[(*n)++] = (struct workload){.ns = ns, .owner = owner, .pod = pod};
        else
            free(owner);
        (*out)[w].pods++;
    }
    return GG_OK;
}

/* Review one workload's pod; what the rightsizing policy found for it, else its charge. */
static enum gg_status review(struct engine *e, struct workload *w, struct gg_err *err)
{
    struct dr_options o = {.namespace = w->ns, .user = "gpuguard-report", .dry_run = true};
    struct dr_result res = {0};
    struct rss_last ignored;
    rss_take_last(&ignored);
    enum gg_status st = dr_evaluate(e, w->pod, &o, &res, err);
    if (st != GG_OK)
        return st;
    w->known = rss_take_last(&w->rs);
    /* The charge of the review, else (a pod the policies now refuse) the one it was admitted with.
     */
    const json_t *ann = json_object_get(json_object_get(res.mutated, "metadata"), "annotations");
    const json_t *stored = json_object_get(json_object_get(w->pod, "metadata"), "annotations");
    const char *charge = json_string_value(json_object_get(ann, GG_KEY_CHARGE));
    if (!charge)
        charge = json_string_value(json_object_get(stored, GG_KEY_CHARGE));
    w->held_milli = charge ? strtoll(charge, NULL, 10) : 0;
    const char *rec = json_string_value(json_object_get(ann, "gpuguard.io/recommendation"));
    w->would_hold = rec ? strdup(rec) : NULL;
    dr_result_clear(&res);
    return GG_OK;
}

static int64_t held(const struct workload *w)
{
    return (w->known ? w->rs.requested : w->held_milli) * w->pods;
}

static int64_t needed(const struct workload *w)
{
    return w->known ? w->rs.needed * w->pods : 0;
}

static json_t *gpus(int64_t milli)
{
    return json_real((double)milli / 1000.0);
}

/* Totals of a namespace or the cluster. */
struct totals {
    int64_t held, needed, held_known;
    long workloads, unknown;
};

static void add(struct totals *t, const struct workload *w)
{
    t->held += held(w);
    t->workloads++;
    if (w->known) {
        t->needed += needed(w);
        t->held_known += held(w);
    } else {
        t->unknown++;
    }
}

static json_t *totals_json(const struct totals *t)
{
    return json_pack("{s:o,s:o,s:o,s:I,s:I}", "held_gpus", gpus(t->held), "needed_gpus",
                     gpus(t->needed), "waste_gpus", gpus(t->held_known - t->needed), "workloads",
                     (json_int_t)t->workloads, "without_history", (json_int_t)t->unknown);
}

static void print_json(const struct workload *w, size_t n)
{
    json_t *list = json_array(), *by_ns = json_object();
    struct totals all = {0};
    for (size_t i = 0; i < n; i++) {
        json_t *rec = json_pack("{s:s,s:s,s:I,s:o}", "namespace", w[i].ns, "workload",
                                w[i].known ? w[i].rs.workload : w[i].owner, "pods",
                                (json_int_t)w[i].pods, "held_gpus", gpus(held(&w[i])));
        if (w[i].known) {
            json_object_set_new(rec, "needed_gpus", gpus(needed(&w[i])));
            json_object_set_new(rec, "waste_gpus", gpus(held(&w[i]) - needed(&w[i])));
        }
        if (w[i].would_hold)
            json_object_set_new(rec, "would_hold", json_string(w[i].would_hold));
        json_array_append_new(list, rec);
        add(&all, &w[i]);
    }
    for (size_t i = 0; i < n; i++) {
        if (json_object_get(by_ns, w[i].ns))
            continue;
        struct totals t = {0};
        for (size_t j = i; j < n; j++)
            if (strcmp(w[j].ns, w[i].ns) == 0)
                add(&t, &w[j]);
        json_object_set_new(by_ns, w[i].ns, totals_json(&t));
    }
    json_t *doc = json_pack("{s:o,s:o,s:o}", "workloads", list, "namespaces", by_ns, "cluster",
                            totals_json(&all));
    char *text = json_dumps(doc, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(12));
    if (text)
        printf("%s\n", text);
    free(text);
    json_decref(doc);
}

static void print_text(const struct workload *w, size_t n)
{
    struct totals all = {0};
    printf("%-20s %-36s %5s %8s %8s %8s\n", "NAMESPACE", "WORKLOAD", "PODS", "HELD", "NEEDED",
           "WASTE");
    for (size_t i = 0; i < n; i++) {
        char need[32] = "?", waste[32] = "?";
        if (w[i].known) {
            snprintf(need, sizeof(need), "%.3f", (double)needed(&w[i]) / 1000.0);
            snprintf(waste, sizeof(waste), "%.3f", (double)(held(&w[i]) - needed(&w[i])) / 1000.0);
        }
        printf("%-20s %-36s %5ld %8.3f %8s %8s\n", w[i].ns,
               w[i].known ? w[i].rs.workload : w[i].owner, w[i].pods, (double)held(&w[i]) / 1000.0,
               need, waste);
        if (w[i].would_hold)
            printf("%-20s   %s\n", "", w[i].would_hold);
        add(&all, &w[i]);
    }
    printf("\ncluster: %ld workloads hold %.3f GPU-equivalents; those with history (%ld) hold "
           "%.3f and need %.3f: %.3f idle%s\n",
           all.workloads, (double)all.held / 1000.0, all.workloads - all.unknown,
           (double)all.held_known / 1000.0, (double)all.needed / 1000.0,
           (double)(all.held_known - all.needed) / 1000.0,
           all.unknown ? " (the others' need is unknown: no history)" : "");
}

int cli_report(int argc, char **argv)
{
    struct report_opts o = {0};
    struct gg_err err = {{0}};
    static const struct eo_command command = {
        .name = "gpuguard report",
        .shared = EO_ENGINE | EO_NO_CONFIG,
        .log_level = LOG_WARN,
        .options = long_options,
        .short_options = "o:",
        .take = take_flag,
        .help = report_usage,
    };
    int rc = 2;
    if (!eo_parse(&command, &o, argc, argv, &o.engine, &rc))
        return rc;
    const char *missing = !o.state   ? "--cluster-state FILE is required"
                          : !o.usage ? "--usage FILE is required"
                          : !o.engine.config && !o.engine.no_config ? EO_NO_CONFIG_GIVEN
                                                                    : NULL;
    if (missing) {
        fprintf(stderr, "gpuguard report: %s\nrun 'gpuguard report --help' for the flags\n",
                missing);
        return 2;
    }
    rc = 1;
    struct engine *engine = NULL;
    struct inventory *inv = NULL;
    struct charger *charger = NULL;
    struct workload *w = NULL;
    size_t n = 0, counts[MF_STATE_N];
    json_t *state = NULL;
    struct rs_data usage = {0};
    if (rs_file_load(o.usage, &usage, &err) != GG_OK) {
        fprintf(stderr, "gpuguard report: --usage: %s\n", err.msg);
        goto out;
    }
    rss_set_source("file");
    rss_publish(&usage, 0);
    rss_record_last();
    if (eo_engine_new(&o.engine, &engine, &err) != GG_OK) {
        fprintf(stderr, "gpuguard report: cannot load the policies: %s\n", err.msg);
        goto out;
    }
    if (!(inv = inv_new()) ||
        eo_load_snapshot(engine, inv, o.state, counts, &charger, &state, &err) != GG_OK) {
        fprintf(stderr, "gpuguard report: --cluster-state: %s\n",
                err.msg[0] ? err.msg : "out of memory");
        goto out;
    }
    engine_set_inventory(engine, inv);
    if (group(json_object_get(state, "items"), &w, &n, &err) != GG_OK)
        goto out;
    size_t gpu = 0; /* the workloads that hold a GPU, moved to the front */
    for (size_t i = 0; i < n; i++) {
        if (review(engine, &w[i], &err) != GG_OK) {
            fprintf(stderr, "gpuguard report: %s/%s: %s\n", w[i].ns, w[i].owner, err.msg);
            goto out;
        }
        struct workload t = w[gpu];
        if (held(&w[i]) > 0 || w[i].known) {
            w[gpu] = w[i];
            w[i] = t;
            gpu++;
        }
    }
    if (o.json)
        print_json(w, gpu);
    else
        print_text(w, gpu);
    rc = fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
out:
    for (size_t i = 0; w && i < n; i++) {
        free((char *)w[i].owner);
        free((char *)w[i].would_hold);
    }
    free(w);
    json_decref(state);
    charger_free(charger);
    engine_free(engine);
    inv_free(inv);
    rss_reset();
    return rc;
}
