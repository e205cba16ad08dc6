/*
 * cli.h - the subcommands of the gpuguard binary.  Each takes the arguments
 * after its own name (argv[0] is the subcommand) and returns the exit code.
 */
#ifndef GG_CLI_H
#define GG_CLI_H

#include <stdbool.h>
#include <stdio.h>

int cli_serve(int argc, char **argv);
int cli_certs(int argc, char **argv);
int cli_check(int argc, char **argv);
int cli_test(int argc, char **argv);
int cli_usage(int argc, char **argv);
int cli_report(int argc, char **argv);
int cli_config(int argc, char **argv);

/* True when s is "-h" or "--help". */
int cli_is_help(const char *s);

/* True when text for f may be coloured: a terminal, NO_COLOR unset, TERM not "dumb". */
bool cli_use_colour(FILE *f);

#endif
