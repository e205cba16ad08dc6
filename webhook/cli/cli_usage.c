/*
 * cli_usage.c - `gpuguard usage`: run the rightsizing queries against a
 * Prometheus once and save the answers, for `gpuguard check --usage FILE`
 * (so CI shows the recommendations the cluster would make).
 *
 * Exit codes: 0 saved, 1 Prometheus could not be queried, 2 a usage error.
 */
#include "cli/cli.h"
#include "cli/engine_opts.h"
#include "engine/config.h"
#include "util/log.h"
#include "kube/promsource.h"
#include "kube/rightsize.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define USAGE_HELP_WIDTH 19 /* the flag column of --help */

static void usage_usage(FILE *out)
{
    fprintf(out, "usage: gpuguard usage [--prometheus URL] -o FILE [flags]\n"
                 "\n"
                 "Query a Prometheus for the GPU memory each workload used (DCGM exporter's\n"
                 "framebuffer memory) and save both answers to FILE, for\n"
                 "'gpuguard check --usage FILE'.  The queries, the labels, the credentials\n"
                 "(token_file, ca_file, cert_file, key_file) and the window come from the\n"
                 "configuration's rightsizing: section; the flags override it.\n"
                 "\n"
                 "flags:\n"
                 "  --prometheus URL    the Prometheus HTTP API [rightsizing.prometheus.url]\n");
    eo_help_engine(out, EO_CONFIG, USAGE_HELP_WIDTH);
    fprintf(out, "  --window DURATION   history to look at, e.g. 7d [rightsizing.window, 7d]\n"
                 "  -o, --output FILE   where to write it; - for stdout [required]\n");
    eo_help_tail(out, USAGE_HELP_WIDTH, LOG_WARN);
    fprintf(out, "\n"
                 "Exit status: 0 saved, 1 Prometheus could not be queried, 2 usage error.\n");
}

struct usage_opts {
    struct engine_opts engine; /* only its configuration */
    const char *prometheus, *window, *output;
};

enum { OPT_PROMETHEUS = 256, OPT_WINDOW };

static const struct option long_options[] = {
    {"prometheus", required_argument, NULL, OPT_PROMETHEUS},
    {"window", required_argument, NULL, OPT_WINDOW},
    {"output", required_argument, NULL, 'o'},
    {NULL, 0, NULL, 0},
};

/* One of usage's own flags (their values are checked with the configuration's). */
static int take_flag(void *ctx, int opt, const char *arg)
{
    struct usage_opts *o = ctx;
    if (opt == OPT_PROMETHEUS)
        o->prometheus = arg;
    else if (opt == OPT_WINDOW)
        o->window = arg;
    else /* 'o' */
        o->output = arg;
    return 0;
}

/* True to run; false to exit with *exit_code (after --help or a usage error). */
static bool parse_flags(int argc, char **argv, struct usage_opts *o, int *exit_code)
{
    *o = (struct usage_opts){0};
    static const struct eo_command usage_command = {
        .name = "gpuguard usage",
        .shared = EO_CONFIG | EO_LOG_LEVEL,
        .log_level = LOG_WARN,
        .options = long_options,
        .short_options = "o:",
        .take = take_flag,
        .help = usage_usage,
    };
    if (!eo_parse(&usage_command, o, argc, argv, &o->engine, exit_code))
        return false;
    if (!o->output) {
        fprintf(stderr, "gpuguard usage: -o FILE is required\n"
                        "run 'gpuguard usage --help' for the flags\n");
        *exit_code = 2;
        return false;
    }
    return true;
}

/* The settings: the configuration's, then the flags.  -1 with a message when wrong. */
static int settings_of(const struct usage_opts *o, struct rs_settings *s)
{
    struct gg_err err = {{0}};
    json_t *root = NULL;
    enum gg_status st = cfg_load(o->engine.config, &root, &err);
    if (st == GG_OK)
        st = rs_settings_parse(root, s, &err);
    json_decref(root);
    if (st != GG_OK) {
        fprintf(stderr, "gpuguard usage: %s\n", err.msg);
        return -1;
    }
    if (o->window && !rs_parse_duration(o->window, &s->window_s)) {
        fprintf(stderr, "gpuguard usage: --window must be a duration such as 7d, got \"%s\"\n",
                o->window);
        return -1;
    }
    if (o->prometheus) {
        size_t n = strlen(o->prometheus);
        if (n >= sizeof(s->url) || (strncmp(o->prometheus, "http://", 7) != 0 &&
                                    strncmp(o->prometheus, "https://", 8) != 0)) {
            fprintf(stderr, "gpuguard usage: --prometheus must be an http:// or https:// URL\n");
            return -1;
        }
        memcpy(s->url, o->prometheus, n + 1);
        while (n && s->url[n - 1] == '/')
            s->url[--n] = '\0';
    }
    if (!*s->url) {
        fprintf(stderr, "gpuguard usage: --prometheus URL or rightsizing.prometheus.url "
                        "is required\n");
        return -1;
    }
    return 0;
}

static int write_file(const char *path, const json_t *doc)
{
    char *text = NULL;
    size_t len = 0;
    if (gg_json_dump(doc, JSON_INDENT(1) | JSON_SORT_KEYS, &text, &len) != GG_OK) {
        fprintf(stderr, "gpuguard usage: out of memory\n");
        return 1;
    }
    bool to_stdout = strcmp(path, "-") == 0;
    FILE *f = to_stdout ? stdout : fopen(path, "w");
    bool ok = f && fwrite(text, 1, len, f) == len && fputc('\n', f) != EOF;
    if (f && !to_stdout)
        ok = fclose(f) == 0 && ok;
    else if (f)
        ok = fflush(f) == 0 && ok;
    free(text);
    if (!ok) {
        fprintf(stderr, "gpuguard usage: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

int cli_usage(int argc, char **argv)
{
    struct usage_opts o;
    struct rs_settings s;
    int rc = 1;
    if (!parse_flags(argc, argv, &o, &rc))
        return rc;
    if (settings_of(&o, &s) != 0) {
        fprintf(stderr, "run 'gpuguard usage --help' for the flags\n");
        return 2;
    }
    struct gg_err err = {{0}};
    struct kc_client *client = NULL;
    json_t *peak = NULL, *history = NULL, *doc = NULL;
    int64_t now = (int64_t)time(NULL);
    if (ps_client_new(&s, &client, &err) != GG_OK ||
        ps_fetch(client, &s, NULL, &peak, &history, &err) != GG_OK) {
        fprintf(stderr, "gpuguard usage: %s: %s\n", s.url, err.msg);
        goto out;
    }
    /* Check the answers fold before saving them: check --usage must be able to read the file. */
    struct rs_data d = {0};
    enum gg_status st = rs_data_fold(&d, peak, history, s.ns_label, s.pod_label, NULL, &err);
    size_t workloads = json_object_size(d.workloads);
    rs_data_clear(&d);
    if (st != GG_OK) {
        fprintf(stderr, "gpuguard usage: %s: %s\n", s.url, err.msg);
        goto out;
    }
    if (!(doc = rs_file_new(&s, now, peak, history))) {
        fprintf(stderr, "gpuguard usage: out of memory\n");
        goto out;
    }
    rc = write_file(o.output, doc);
    if (rc == 0 && strcmp(o.output, "-") != 0)
        fprintf(stderr, "gpuguard usage: %zu workloads saved to %s\n", workloads, o.output);
out:
    kc_free(client);
    json_decref(peak);
    json_decref(history);
    json_decref(doc);
    return rc;
}
