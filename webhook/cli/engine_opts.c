/*
 * engine_opts.c - the shared engine flags: one getopt table per command,
 * built from its own options and the shared ones.  See engine_opts.h.
 */
#include "cli/engine_opts.h"

#include "engine/charger.h"
#include "engine/policy.h"
#include "kube/inventory.h"

#include <string.h>

#define EO_MAX_OPTIONS 40 /* a command's own long options plus the shared ones */

static const struct option shared_options[] = {
    {"config", required_argument, NULL, EO_OPT_CONFIG},
    {"policies", required_argument, NULL, EO_OPT_POLICIES},
    {"lua", required_argument, NULL, EO_OPT_LUA},
    {"log-level", required_argument, NULL, EO_OPT_LOG_LEVEL},
    {"no-config", no_argument, NULL, EO_OPT_NO_CONFIG},
};

static unsigned shared_flag(int val)
{
    switch (val) {
    case EO_OPT_CONFIG:
        return EO_CONFIG;
    case EO_OPT_LOG_LEVEL:
        return EO_LOG_LEVEL;
    case EO_OPT_NO_CONFIG:
        return EO_NO_CONFIG;
    default:
        return EO_POLICIES;
    }
}

/* The command's options, then the shared ones it takes, then --help; false when too many. */
static bool build_options(const struct eo_command *c, struct option *out)
{
    size_t n = 0;
    /* Room is kept for --help and the terminating entry. */
    for (const struct option *p = c->options; p && p->name; p++) {
        if (n + 3 > EO_MAX_OPTIONS)
            return false;
        out[n++] = *p;
    }
    for (size_t i = 0; i < sizeof(shared_options) / sizeof(shared_options[0]); i++) {
        if (!(c->shared & shared_flag(shared_options[i].val)))
            continue;
        if (n + 3 > EO_MAX_OPTIONS)
            return false;
        out[n++] = shared_options[i];
    }
    out[n++] = (struct option){"help", no_argument, NULL, 'h'};
    out[n] = (struct option){NULL, 0, NULL, 0};
    return true;
}

/* 0 when taken, -1 after saying what is wrong. */
static int take_shared(const struct eo_command *c, int opt, const char *arg, struct engine_opts *o)
{
    switch (opt) {
    case EO_OPT_CONFIG:
        o->config = arg;
        return 0;
    case EO_OPT_POLICIES:
        if (o->n_policies == POLICY_MAX_DIRS) {
            fprintf(stderr, "%s: --policies: at most %d directories\n", c->name, POLICY_MAX_DIRS);
            return -1;
        }
        o->policies[o->n_policies++] = arg;
        return 0;
    case EO_OPT_LUA:
        o->lua = arg;
        return 0;
    case EO_OPT_NO_CONFIG:
        o->no_config = true;
        return 0;
    default: { /* EO_OPT_LOG_LEVEL */
        int level = log_level_parse(arg);
        if (level < 0) {
            fprintf(stderr, "%s: --log-level must be debug, info, warn or error\n", c->name);
            return -1;
        }
        log_set_level((enum log_level)level);
        return 0;
    }
    }
}

static void help(const struct eo_command *c)
{
    if (c->help) {
        c->help(stdout);
        return;
    }
    printf("usage: %s\n\nflags:\n", c->usage);
    eo_help_engine(stdout, c->shared, EO_HELP_WIDTH);
    fputs(c->own_flags ? c->own_flags : "", stdout);
    eo_help_tail(stdout, EO_HELP_WIDTH, c->log_level);
}

/* 0 to run, 1 after --help, -1 on a usage error (said on stderr). */
static int parse(const struct eo_command *c, void *ctx, int argc, char **argv,
                 struct engine_opts *o)
{
    struct option options[EO_MAX_OPTIONS];
    char short_options[32];
    int opt;
    *o = (struct engine_opts){.lua = "./lua"};
    if (!build_options(c, options) ||
        snprintf(short_options, sizeof(short_options), "h%s",
                 c->short_options ? c->short_options : "") >= (int)sizeof(short_options)) {
        fprintf(stderr, "%s: too many flags\n", c->name);
        return -1;
    }
    log_set_level(c->log_level);
    opterr = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, short_options, options, NULL)) != -1) {
        if (opt == 'h') {
            help(c);
            return 1;
        }
        if (opt == '?') {
            fprintf(stderr, "%s: unknown flag or missing value: %s\n", c->name, argv[optind - 1]);
            return -1;
        }
        int bad = opt >= EO_OPT_CONFIG && opt <= EO_OPT_NO_CONFIG ? take_shared(c, opt, optarg, o)
                                                                  : c->take(ctx, opt, optarg);
        if (bad)
            return -1;
    }
    if (o->n_policies == 0)
        o->policies[o->n_policies++] = "./policies";
    if (o->config && o->no_config) {
        fprintf(stderr, "%s: --config and --no-config: give one\n", c->name);
        return -1;
    }
    if (c->missing_args && optind >= argc) {
        fprintf(stderr, "%s: %s\n", c->name, c->missing_args);
        return -1;
    }
    if (!c->missing_args && optind < argc) {
        fprintf(stderr, "%s: unexpected argument \"%s\"\n", c->name, argv[optind]);
        return -1;
    }
    o->args = argv + optind;
    o->n_args = argc - optind;
    return 0;
}

bool eo_parse(const struct eo_command *c, void *ctx, int argc, char **argv, struct engine_opts *o,
              int *exit_code)
{
    int p = parse(c, ctx, argc, argv, o);
    if (p < 0)
        fprintf(stderr, "run '%s --help' for the flags\n", c->name);
    if (p != 0)
        *exit_code = p > 0 ? 0 : 2;
    return p == 0;
}

void eo_help_engine(FILE *out, unsigned shared, int width)
{
    if (shared & EO_CONFIG)
        fprintf(out, "  %-*s gpuguard configuration (YAML) [none%s]\n", width, "--config FILE",
                shared & EO_NO_CONFIG ? ": refused unless --no-config" : "");
    if (shared & EO_NO_CONFIG)
        fprintf(out, "  %-*s run without a configuration: quotas, pools and guardrails off\n",
                width, "--no-config");
    if (shared & EO_POLICIES)
        fprintf(out,
                "  %-*s policy directory, repeatable up to %d times:\n"
                "  %-*s their files run in one name order [./policies]\n"
                "  %-*s Lua library directory [./lua]\n",
                width, "--policies DIR", POLICY_MAX_DIRS, width, "", width, "--lua DIR");
}

void eo_help_tail(FILE *out, int width, enum log_level log_default)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    fprintf(out,
            "  %-*s debug, info, warn or error [%s]\n"
            "  %-*s this help\n",
            width, "--log-level LEVEL", names[log_default], width, "-h, --help");
}

enum gg_status eo_engine_new(const struct engine_opts *o, struct engine **out, struct gg_err *err)
{
    struct policy_paths paths = {.policies = o->policies[0],
                                 .lua = o->lua,
                                 .config = o->config,
                                 .more_policies = o->policies + 1,
                                 .n_more_policies = o->n_policies - 1};
    return engine_new(&paths, out, err);
}

enum gg_status eo_load_snapshot(struct engine *e, struct inventory *inv, const char *path,
                                size_t counts[MF_STATE_N], struct charger **charger, json_t **keep,
                                struct gg_err *err)
{
    json_t *state = NULL;
    struct gg_err inner = {{0}};
    enum gg_status st = inv_read_snapshot(path, &state, counts, err);
    if (st != GG_OK)
        return st;
    st = charger_new(e, inv, charger, &inner);
    if (st == GG_OK) {
        inv_replace(inv, json_object_get(state, "items"));
        inv_set_ready(inv, true);
    } else {
        gg_fail(err, st, "cannot load the charge model: %s", inner.msg);
    }
    if (st == GG_OK && keep)
        *keep = json_incref(state);
    json_decref(state);
    return st;
}
