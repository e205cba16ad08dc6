/*
 * cli.h - the subcommands of the gpuguard binary.  Each takes the arguments
 * after its own name (argv[0] is the subcommand) and returns the exit code.
 */
#ifndef GG_CLI_H
#define GG_CLI_H

int cli_serve(int argc, char **argv);
int cli_certs(int argc, char **argv);
int cli_check(int argc, char **argv);
int cli_test(int argc, char **argv);
int cli_usage(int argc, char **argv);

/* Set the log level from a --log-level value; -1 with a message naming the command if bad. */
int cli_set_log_level(const char *command, const char *value);

/* True when s is "-h" or "--help". */
int cli_is_help(const char *s);

#endif
