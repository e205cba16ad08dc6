/*
 * cli_files.h - input files for the CLI commands: a bounded list of paths,
 * a recursive directory search by file-name suffix, and stdin read under a
 * size bound.
 */
#ifndef GG_CLI_FILES_H
#define GG_CLI_FILES_H

#include "util/gpuguard.h"

#include <stdbool.h>
#include <stddef.h>

#define CLI_MAX_FILES 100000
#define CLI_MAX_DIR_DEPTH 32

struct cli_files {
    char **names;
    size_t count, cap;
};

void cli_files_clear(struct cli_files *l);
enum gg_status cli_files_add(struct cli_files *l, const char *name, struct gg_err *err);

/*
 * Add every regular file under dir whose name ends with one of suffixes,
 * depth first in byte order of the names; entries starting with '.' are
 * left out; symbolic links are followed up to CLI_MAX_DIR_DEPTH levels.
 */
enum gg_status cli_files_walk(const char *dir, const char *const *suffixes, struct cli_files *out,
                              struct gg_err *err);

/* All of stdin, NUL-terminated, at most max bytes (GG_ERR_TOOBIG beyond). */
enum gg_status cli_read_stdin(size_t max, char **data, size_t *len, struct gg_err *err);

#endif
