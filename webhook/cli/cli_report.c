/*
 * cli_report.c - `gpuguard report`: the GPU a cluster holds and what its workloads' history
 * says they need, offline, from a cluster-state dump and a usage file (a first look at the
 * waste, without installing anything; docs/audit.md).
 *
 * The figures are engine/waste.h's, from the dump's running pods: the same as the audit's.
 *
 * Exit codes: 0 reported, 1 an input or the policies could not be loaded, 2 a usage error.
 */
#include "cli/cli.h"
#include "cli/engine_opts.h"
#include "codec/keys.h"
#include "engine/charger.h"
#include "engine/waste.h"
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

static json_t *gpus(int64_t milli)
{
    return json_real((double)milli / 1000.0);
}

static void print_json(const struct waste_workload *w, size_t n)
{
    json_t *list = json_array(), *by_ns = json_object();
    struct waste_totals all = {0};
    for (size_t i = 0; i < n; i++) {
        json_t *rec =
            json_pack("{s:s,s:s,s:I,s:o}", "namespace", w[i].ns, "workload", waste_name(&w[i]),
                      "pods", (json_int_t)w[i].pods, "held_gpus", gpus(waste_held(&w[i])));
        if (w[i].known) {
            json_object_set_new(rec, "needed_gpus", gpus(waste_needed(&w[i])));
            json_object_set_new(rec, "waste_gpus", gpus(waste_held(&w[i]) - waste_needed(&w[i])));
        }
        if (w[i].would_hold)
            json_object_set_new(rec, "would_hold", json_string(w[i].would_hold));
        json_array_append_new(list, rec);
        waste_add(&all, &w[i]);
    }
    for (size_t i = 0; i < n; i++) {
        if (json_object_get(by_ns, w[i].ns))
            continue;
        struct waste_totals t = {0};
        for (size_t j = i; j < n; j++)
            if (strcmp(w[j].ns, w[i].ns) == 0)
                waste_add(&t, &w[j]);
        json_object_set_new(by_ns, w[i].ns, waste_totals_json(&t));
    }
    json_t *doc = json_pack("{s:o,s:o,s:o}", "workloads", list, "namespaces", by_ns, "cluster",
                            waste_totals_json(&all));
    char *text = json_dumps(doc, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(12));
    if (text)
        printf("%s\n", text);
    free(text);
    json_decref(doc);
}

static void print_text(const struct waste_workload *w, size_t n)
{
    struct waste_totals all = {0};
    printf("%-20s %-36s %5s %8s %8s %8s\n", "NAMESPACE", "WORKLOAD", "PODS", "HELD", "NEEDED",
           "WASTE");
    for (size_t i = 0; i < n; i++) {
        char need[32] = "?", waste[32] = "?";
        if (w[i].known) {
            snprintf(need, sizeof(need), "%.3f", (double)waste_needed(&w[i]) / 1000.0);
            snprintf(waste, sizeof(waste), "%.3f",
                     (double)(waste_held(&w[i]) - waste_needed(&w[i])) / 1000.0);
        }
        printf("%-20s %-36s %5ld %8.3f %8s %8s\n", w[i].ns, waste_name(&w[i]), w[i].pods,
               (double)waste_held(&w[i]) / 1000.0, need, waste);
        if (w[i].would_hold)
            printf("%-20s   %s\n", "", w[i].would_hold);
        waste_add(&all, &w[i]);
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
    struct waste_set set = {0};
    size_t counts[MF_STATE_N];
    json_t *state = NULL;
    struct rs_data usage = {0};
    if (rs_file_load(o.usage, &usage, &err) != GG_OK) {
        fprintf(stderr, "gpuguard report: --usage: %s\n", err.msg);
        goto out;
    }
    rss_set_source("file");
    rss_publish(&usage, 0);
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
    size_t i;
    json_t *item;
    json_array_foreach(json_object_get(state, "items"), i, item)
    {
        const char *kind = json_string_value(json_object_get(item, "kind"));
        if (kind && strcmp(kind, "Pod") == 0 && waste_running(item) &&
            waste_add_pod(engine, &set, item, NULL, NULL, &err) != GG_OK) {
            fprintf(stderr, "gpuguard report: %s\n", err.msg);
            goto out;
        }
    }
    waste_finish(&set);
    if (o.json)
        print_json(set.w, set.n);
    else
        print_text(set.w, set.n);
    rc = fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
out:
    waste_set_clear(&set);
    json_decref(state);
    charger_free(charger);
    engine_free(engine);
    inv_free(inv);
    rss_reset();
    return rc;
}
