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
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

static bool save(void *ctx, const char *data, size_t len)
{
    return fwrite(data, 1, len, ctx) == len;
}

/* All of f to stdout; false when it cannot be written. */
static bool copy_out(FILE *f)
{
    char chunk[1 << 16];
    size_t n;
    rewind(f);
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        if (fwrite(chunk, 1, n, stdout) != n)
            return false;
    return !ferror(f) && fflush(stdout) == 0;
}

/*
 * Where the file is written as the answers arrive: a temporary file beside
 * it, renamed over it once whole (tmp), or for stdout one of tmpfile()
 * copied out once whole; so a failed query leaves no half file.
 */
static FILE *open_output(const char *path, char *tmp, size_t size)
{
    if (strcmp(path, "-") == 0)
        return tmpfile();
    if ((size_t)snprintf(tmp, size, "%s.XXXXXX", path) >= size) {
        errno = ENAMETOOLONG;
        return NULL;
    }
    int fd = mkstemp(tmp);
    if (fd < 0)
        return NULL;
    mode_t mask = umask(0);
    umask(mask);
    FILE *f = fchmod(fd, 0666 & ~mask) == 0 ? fdopen(fd, "w+") : NULL;
    if (!f) {
        close(fd);
        unlink(tmp);
    }
    return f;
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
    struct rs_data d = {0};
    char tmp[4096] = "";
    char *head = rs_file_head(&s, (int64_t)time(NULL));
    FILE *f = NULL;
    if (!head) {
        fprintf(stderr, "gpuguard usage: out of memory\n");
        goto out;
    }
    if (ps_client_new(&s, &client, &err) != GG_OK) {
        fprintf(stderr, "gpuguard usage: %s: %s\n", s.url, err.msg);
        goto out;
    }
    if (!(f = open_output(o.output, tmp, sizeof(tmp)))) {
        fprintf(stderr, "gpuguard usage: cannot write %s: %s\n", o.output, strerror(errno));
        goto out;
    }
    /* The answers as they arrive, each folded as it is saved: check --usage must read it. */
    struct ps_sink sink = {save, f};
    bool written = fputs(head, f) != EOF;
    enum gg_status st = ps_query(client, &s, RS_QUERY_PEAK, NULL, NULL, &sink, &d, NULL, &err);
    if (st == GG_OK) {
        written = written && fputs(RS_FILE_BETWEEN, f) != EOF;
        st = ps_query(client, &s, RS_QUERY_HISTORY, NULL, NULL, &sink, &d, NULL, &err);
    }
    if (st != GG_OK) {
        fprintf(stderr, "gpuguard usage: %s: %s\n", s.url, err.msg);
        goto out;
    }
    rs_data_finish(&d);
    written = written && fputs(RS_FILE_END, f) != EOF && fflush(f) == 0;
    if (*tmp) {
        written = fclose(f) == 0 && written;
        f = NULL;
        written = written && rename(tmp, o.output) == 0;
    } else {
        written = written && copy_out(f);
    }
    if (!written) {
        fprintf(stderr, "gpuguard usage: cannot write %s: %s\n", o.output, strerror(errno));
        goto out;
    }
    *tmp = '\0';
    rc = 0;
    if (strcmp(o.output, "-") != 0)
        fprintf(stderr, "gpuguard usage: %zu workloads saved to %s", d.n, o.output);
    else if (d.no_evidence)
        fprintf(stderr, "gpuguard usage: %zu workloads", d.n);
    if (d.no_evidence)
        fprintf(stderr, "; %zu more left out: a peak below 1 GiB is no evidence", d.no_evidence);
    if (strcmp(o.output, "-") != 0 || d.no_evidence)
        fputc('\n', stderr);
out:
    if (f)
        fclose(f);
    if (*tmp)
        unlink(tmp);
    free(head);
    rs_data_clear(&d);
    kc_free(client);
    return rc;
}
