/*
 * cli_config.c - `gpuguard config check FILE`: check a configuration the way
 * `gpuguard serve` loads it (every key known, every policy's own check) and
 * print it with the defaults of the keys left out; `gpuguard config schema`:
 * the configuration's JSON Schema (deploy/gpuguard.schema.json), for editors.
 *
 * Exit codes: 0 the configuration is good, 1 it is refused, 2 a usage error.
 */
#include "cli/cli.h"
#include "cli/engine_opts.h"
#include "codec/manifest.h"
#include "engine/cfgschema.h"
#include "engine/config.h"
#include "engine/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONFIG_HELP_WIDTH 22 /* the flag column of --help, as eo_parse's generic one */

static void config_usage(FILE *out)
{
    fprintf(out,
            "usage: gpuguard config check [flags] FILE\n"
            "       gpuguard config schema\n"
            "\n"
            "check: load FILE as 'gpuguard serve' would, with the policies and the Lua\n"
            "library: a key no one reads, a value a policy refuses or a policy that does\n"
            "not load is an error naming its path.  A good configuration is printed with\n"
            "the defaults of the keys it leaves out (in the sections it has; a section\n"
            "left out stays off).\n"
            "\n"
            "schema: print the configuration's JSON Schema, the one deploy/gpuguard.schema.json\n"
            "holds, for editors with a YAML language server.\n"
            "\n"
            "flags of check:\n");
    eo_help_engine(out, EO_POLICIES, CONFIG_HELP_WIDTH);
    fprintf(out, "  -o, --output FORMAT   yaml or json [yaml]\n");
    eo_help_tail(out, CONFIG_HELP_WIDTH, LOG_WARN);
    fprintf(out, "\nExit status: 0 the configuration is good, 1 it is refused, 2 usage error.\n");
}

struct config_opts {
    struct engine_opts engine;
    bool json;
};

static const struct option long_options[] = {
    {"output", required_argument, NULL, 'o'},
    {NULL, 0, NULL, 0},
};

static int take_flag(void *ctx, int opt, const char *arg)
{
    struct config_opts *o = ctx;
    (void)opt; /* 'o', the only one */
    if (strcmp(arg, "json") != 0 && strcmp(arg, "yaml") != 0) {
        fprintf(stderr, "gpuguard config check: -o must be yaml or json, got \"%s\"\n", arg);
        return -1;
    }
    o->json = strcmp(arg, "json") == 0;
    return 0;
}

/* The effective configuration of path (checked) on stdout; false after saying why not. */
static bool print_effective(const char *path, bool json)
{
    struct gg_err err = {{0}};
    json_t *root = NULL, *effective = NULL;
    char *text = NULL;
    size_t len = 0;
    enum gg_status st = cfg_load(path, &root, &err);
    if (st == GG_OK && !(effective = cfgschema_effective(root)))
        st = gg_fail(&err, GG_ERR_NOMEM, "out of memory");
    if (st == GG_OK && json) {
        text = json_dumps(effective, JSON_INDENT(2));
        len = text ? strlen(text) : 0;
        st = text ? GG_OK : gg_fail(&err, GG_ERR_NOMEM, "out of memory");
    } else if (st == GG_OK) {
        json_t *docs = json_pack("[O]", effective);
        st = docs ? mf_emit_yaml(docs, &text, &len, &err)
                  : gg_fail(&err, GG_ERR_NOMEM, "out of memory");
        json_decref(docs);
    }
    bool ok = st == GG_OK && fwrite(text, 1, len, stdout) == len &&
              (!json || fputc('\n', stdout) != EOF) && fflush(stdout) == 0;
    if (st != GG_OK)
        fprintf(stderr, "gpuguard config check: %s\n", err.msg);
    else if (!ok)
        fprintf(stderr, "gpuguard config check: cannot write to stdout\n");
    free(text);
    json_decref(effective);
    json_decref(root);
    return ok;
}

static int config_check(int argc, char **argv)
{
    struct config_opts o = {0};
    static const struct eo_command check_command = {
        .name = "gpuguard config check",
        .shared = EO_POLICIES | EO_LOG_LEVEL,
        .log_level = LOG_WARN,
        .options = long_options,
        .short_options = "o:",
        .take = take_flag,
        .help = config_usage,
        .missing_args = "no FILE given (the configuration to check)",
    };
    int exit_code;
    if (!eo_parse(&check_command, &o, argc, argv, &o.engine, &exit_code))
        return exit_code;
    if (o.engine.n_args != 1) {
        fprintf(stderr,
                "gpuguard config check: one FILE, got %d\n"
                "run 'gpuguard config --help' for the flags\n",
                o.engine.n_args);
        return 2;
    }
    o.engine.config = o.engine.args[0];
    struct engine *engine = NULL;
    struct gg_err err = {{0}};
    if (eo_engine_new(&o.engine, &engine, &err) != GG_OK) {
        fprintf(stderr, "gpuguard config check: %s\n", err.msg);
        return 1;
    }
    engine_free(engine);
    return print_effective(o.engine.config, o.json) ? 0 : 1;
}

static int config_schema(int argc, char **argv)
{
    if (argc > 1 && cli_is_help(argv[1])) {
        config_usage(stdout);
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "gpuguard config schema: takes no arguments\n");
        return 2;
    }
    json_t *schema = cfgschema_json_schema();
    char *text = schema ? json_dumps(schema, JSON_INDENT(2)) : NULL;
    json_decref(schema);
    if (!text) {
        fprintf(stderr, "gpuguard config schema: out of memory\n");
        return 1;
    }
    bool ok = puts(text) != EOF && fflush(stdout) == 0;
    free(text);
    if (!ok)
        fprintf(stderr, "gpuguard config schema: cannot write to stdout\n");
    return ok ? 0 : 1;
}

int cli_config(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "check") == 0)
        return config_check(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "schema") == 0)
        return config_schema(argc - 1, argv + 1);
    if (argc > 1 && cli_is_help(argv[1])) {
        config_usage(stdout);
        return 0;
    }
    fprintf(stderr, "gpuguard config: %s\n\n", argc > 1 ? "unknown subcommand" : "no subcommand");
    config_usage(stderr);
    return 2;
}
