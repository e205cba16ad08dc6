/*
 * main.c - the gpuguard binary's entry point: it dispatches to a subcommand
 * (and holds the two small helpers of cli.h the subcommands share).
 */
#include "cli/cli.h"
#include "util/gpuguard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int cmd_version(int argc, char **argv);

static const struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"serve", cli_serve, "run the TLS admission webhook and the ops port"},
    {"certs", cli_certs, "create a CA and a serving certificate for the webhook"},
    {"check", cli_check, "dry-run the policies on manifests (files, directories, stdin) for CI"},
    {"test", cli_test, "run policy test suites (*.suite.yaml)"},
    {"config", cli_config, "check a configuration file and show its defaults; its JSON Schema"},
    {"usage", cli_usage, "save workloads' GPU memory history from Prometheus for check --usage"},
    {"report", cli_report, "the GPU running workloads hold and need, from a dump and usage file"},
    {"version", cmd_version, "print the version"},
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

int cli_is_help(const char *s)
{
    return strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0;
}

bool cli_use_colour(FILE *f)
{
    const char *term = getenv("TERM");
    return isatty(fileno(f)) && !getenv("NO_COLOR") && !(term && strcmp(term, "dumb") == 0);
}

static void usage(FILE *out)
{
    fprintf(out,
            "gpuguard %s - admission webhook policy engine for GPU guardrails\n\n"
            "usage: gpuguard <command> [flags]\n\ncommands:\n",
            GG_VERSION);
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(out, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'gpuguard <command> --help' lists the flags of a command.\n");
}

static int cmd_version(int argc, char **argv)
{
    if (argc > 1 && cli_is_help(argv[1])) {
        printf("usage: gpuguard version\n\nPrint the version and exit.\n");
        return 0;
    }
    printf("gpuguard %s\n", GG_VERSION);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (cli_is_help(argv[1])) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0)
        return cmd_version(1, argv + 1);
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "gpuguard: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
