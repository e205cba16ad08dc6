/*
 * engine_opts.h - the flags every engine-running command and tool shares, and the engine they
 * build.
 *
 * --config, --policies, --lua and --log-level are parsed, checked, given
 * their defaults and described in --help here only; a command adds its own
 * flags through struct eo_command.  Not named cli_*.c: it is part of the
 * core library, so the test tools and benchmarks set the engine up the same
 * way as `gpuguard serve`, `check` and `test`.
 */
#ifndef GG_ENGINE_OPTS_H
#define GG_ENGINE_OPTS_H

#include "codec/manifest.h"
#include "engine/policy.h"
#include "util/gpuguard.h"
#include "util/log.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>

struct engine;
struct inventory;
struct charger;

/* The shared flags a command takes. */
enum {
    EO_CONFIG = 1,    /* --config FILE */
    EO_POLICIES = 2,  /* --policies DIR (repeatable) and --lua DIR */
    EO_LOG_LEVEL = 4, /* --log-level LEVEL */
    EO_ENGINE = EO_CONFIG | EO_POLICIES | EO_LOG_LEVEL,
    /* --no-config: the command judges manifests, and judging them without the configuration
     * the cluster runs allows almost anything, so it runs without one only when told. */
    EO_NO_CONFIG = 8,
};

/* getopt values of the shared flags; a command's own start at 256 and stay below. */
enum { EO_OPT_CONFIG = 0x1000, EO_OPT_POLICIES, EO_OPT_LUA, EO_OPT_LOG_LEVEL, EO_OPT_NO_CONFIG };

/* What a command taking --no-config says when it has neither that nor --config. */
#define EO_NO_CONFIG_GIVEN                                                                         \
    "no configuration: give --config FILE (the one the cluster runs; without one quotas, pools "   \
    "and guardrails are off), or --no-config to run the policies without one"

struct engine_opts {
    const char *config; /* YAML configuration; NULL for none */
    /* The policy directories, one a --policies flag in the order given ("./policies" unless
     * given; eo_engine_new wants one at least).  Their files run in one name order across
     * all of them (policy_paths). */
    const char *policies[POLICY_MAX_DIRS];
    size_t n_policies;
    const char *lua; /* "./lua" unless given */
    bool no_config;  /* --no-config */
    char **args;     /* the arguments after the flags (eo_parse) */
    int n_args;
};

/* A command's flags: its own, plus the shared ones it takes. */
struct eo_command {
    const char *name;         /* "gpuguard check": the start of every message */
    unsigned shared;          /* EO_* */
    enum log_level log_level; /* the level before --log-level */
    /* Its own long options, NULL-terminated (may be NULL), and short ones ("o:"; -h is added). */
    const struct option *options;
    const char *short_options;
    /* Take one of its own flags into ctx (eo_parse's); -1 after printing why the value is wrong. */
    int (*take)(void *ctx, int opt, const char *arg);
    /* --help: help(), else "usage: <usage>", the flags (the shared ones, then own_flags:
     * "  --flag VALUE  what it does [default]\n" lines, the flag column EO_HELP_WIDTH wide). */
    void (*help)(FILE *out);
    const char *usage, *own_flags;
    /* What to say when no argument follows the flags ("no PATH given (...)"); NULL: the
     * command takes none. */
    const char *missing_args;
};

/*
 * Parse argv: the shared flags and the arguments after the flags into o
 * (defaults first), the command's own flags into ctx.  True to run; false
 * to exit with *exit_code (only then written): 0 after --help, 2 after a
 * usage error (said on stderr, with a pointer to --help).
 */
bool eo_parse(const struct eo_command *c, void *ctx, int argc, char **argv, struct engine_opts *o,
              int *exit_code);

#define EO_HELP_WIDTH 22 /* the flag column of the generic --help */

/* The --help lines of --config, --policies and --lua (those in shared), flags `width` wide. */
void eo_help_engine(FILE *out, unsigned shared, int width);
/* The --help lines of --log-level (its default: log_default) and -h, --help. */
void eo_help_tail(FILE *out, int width, enum log_level log_default);

/* The engine of o's configuration, policies and Lua library. */
enum gg_status eo_engine_new(const struct engine_opts *o, struct engine **out, struct gg_err *err);

/*
 * Make the snapshot at path inv's contents (counts: its items per kind),
 * charged by the engine's own charge model: the snapshot is read and
 * checked first, then *charger is made inv's charger, then the snapshot's
 * objects are charged into inv, which is marked ready.  Nothing is kept on
 * failure.  With keep, *keep is the snapshot as read (the caller's reference).
 */
enum gg_status eo_load_snapshot(struct engine *e, struct inventory *inv, const char *path,
                                size_t counts[MF_STATE_N], struct charger **charger, json_t **keep,
                                struct gg_err *err);

#endif
