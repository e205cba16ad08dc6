/*
 * cli_files.c - the inputs of the CLI commands: paths, directory search,
 * stdin.  See cli_files.h.
 */
#include "cli/cli_files.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void cli_files_clear(struct cli_files *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->count; i++)
        free(l->names[i]);
    free(l->names);
    memset(l, 0, sizeof(*l));
}

enum gg_status cli_files_add(struct cli_files *l, const char *name, struct gg_err *err)
{
    if (l->count >= CLI_MAX_FILES)
        return gg_fail(err, GG_ERR_TOOBIG, "more than %d input files", CLI_MAX_FILES);
    if (l->count == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        char **grown = realloc(l->names, cap * sizeof(*grown));
        if (!grown)
            return gg_fail(err, GG_ERR_NOMEM, "out of memory");
        l->names = grown;
        l->cap = cap;
    }
    if (!(l->names[l->count] = strdup(name)))
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    l->count++;
    return GG_OK;
}

/* True when name ends with one of the NULL-terminated suffixes. */
static bool has_suffix(const char *name, const char *const *suffixes)
{
    size_t n = strlen(name);
    for (size_t i = 0; suffixes[i]; i++) {
        size_t m = strlen(suffixes[i]);
        if (n > m && strcmp(name + n - m, suffixes[i]) == 0)
            return true;
    }
    return false;
}

static int not_hidden(const struct dirent *d)
{
    return d->d_name[0] != '.';
}

static enum gg_status walk(const char *dir, int depth, const char *const *suffixes,
                           struct cli_files *out, struct gg_err *err)
{
    struct dirent **entries = NULL;
    enum gg_status st = GG_OK;
    if (depth > CLI_MAX_DIR_DEPTH)
        return gg_fail(err, GG_ERR_TOOBIG, "%s: directories nested deeper than %d", dir,
                       CLI_MAX_DIR_DEPTH);
    int n = scandir(dir, &entries, not_hidden, alphasort);
    if (n < 0)
        return gg_fail(err, GG_ERR_IO, "%s: cannot read the directory: %s", dir, strerror(errno));
    for (int i = 0; i < n; i++) {
        char *path = NULL;
        struct stat sb;
        if (st == GG_OK && asprintf(&path, "%s/%s", dir, entries[i]->d_name) < 0) {
            path = NULL;
            st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
        }
        if (st == GG_OK && stat(path, &sb) == 0) {
            if (S_ISDIR(sb.st_mode))
                st = walk(path, depth + 1, suffixes, out, err);
            else if (S_ISREG(sb.st_mode) && has_suffix(entries[i]->d_name, suffixes))
                st = cli_files_add(out, path, err);
        }
        free(path);
        free(entries[i]);
    }
    free(entries);
    return st;
}

enum gg_status cli_files_walk(const char *dir, const char *const *suffixes, struct cli_files *out,
                              struct gg_err *err)
{
    return walk(dir, 0, suffixes, out, err);
}

enum gg_status cli_read_stdin(size_t max, char **data, size_t *len, struct gg_err *err)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf)
        return gg_fail(err, GG_ERR_NOMEM, "<stdin>: out of memory");
    for (;;) {
        if (n == cap) {
            if (cap > max) {
                free(buf);
                return gg_fail(err, GG_ERR_TOOBIG, "<stdin>: larger than %zu bytes", max);
            }
            char *grown = realloc(buf, cap * 2 + 1);
            if (!grown) {
                free(buf);
                return gg_fail(err, GG_ERR_NOMEM, "<stdin>: out of memory");
            }
            buf = grown;
            cap *= 2;
        }
        ssize_t r = read(STDIN_FILENO, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            free(buf);
            return gg_fail(err, GG_ERR_IO, "<stdin>: read: %s", strerror(errno));
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    if (n > max) {
        free(buf);
        return gg_fail(err, GG_ERR_TOOBIG, "<stdin>: larger than %zu bytes", max);
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return GG_OK;
}
