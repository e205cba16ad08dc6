/*
 * replay.c - a main() for the fuzz targets, so each one also builds with
 * the normal toolchain as a corpus replayer: every regular file under the
 * given paths (directories are walked recursively, in name order) is fed
 * once to LLVMFuzzerTestOneInput.  A target reports a broken invariant by
 * aborting, so a replay that finishes is a pass; a crash names the input.
 *
 * Usage: replay_<target> [-q|-v] PATH...   (-q: no summary, -v: every name)
 */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Inputs larger than this are skipped: libFuzzer's own default -max_len
 * is far below it, and a corpus file that big is a mistake. */
#define REPLAY_MAX_INPUT ((size_t)16 << 20)

static size_t replayed;
static int verbose = 1;
static const char *current; /* the input being run, for the crash message */

#if defined(__SANITIZE_ADDRESS__)
#define REPLAY_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define REPLAY_SANITIZED 1
#endif
#endif

/* Name the input that crashed, then die of the same signal. */
static void on_crash(int sig)
{
    static const char prefix[] = "replay: crashed on input ";
    if (current) {
        ssize_t n = write(STDERR_FILENO, prefix, sizeof(prefix) - 1);
        n += write(STDERR_FILENO, current, strlen(current));
        n += write(STDERR_FILENO, "\n", 1);
        (void)n;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void catch_crashes(void)
{
    /* ASan reports SEGV itself and calls abort() (abort_on_error=1) after. */
    signal(SIGABRT, on_crash);
#ifndef REPLAY_SANITIZED
    signal(SIGSEGV, on_crash);
    signal(SIGBUS, on_crash);
    signal(SIGFPE, on_crash);
#endif
}

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    int rc = 0;
    uint8_t *data = NULL;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    if (size < 0 || (size_t)size > REPLAY_MAX_INPUT || fseek(f, 0, SEEK_SET) != 0) {
        fprintf(stderr, "replay: cannot read %s (or it is over %zu bytes)\n", path,
                (size_t)REPLAY_MAX_INPUT);
        rc = -1;
        goto out;
    }
    /* An exact-size heap copy: reads past the end are caught by ASan. */
    data = malloc(size ? (size_t)size : 1);
    if (!data || fread(data, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        rc = -1;
        goto out;
    }
    if (verbose > 1)
        fprintf(stderr, "replay: %s\n", path);
    current = path;
    LLVMFuzzerTestOneInput(data, (size_t)size);
    current = NULL;
    replayed++;
out:
    free(data);
    fclose(f);
    return rc;
}

static int name_order(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int replay_path(const char *path, int depth)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: cannot stat %s\n", path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode))
        return S_ISREG(st.st_mode) ? replay_file(path) : 0;
    if (depth > 16)
        return 0;
    struct dirent **names = NULL;
    int n = scandir(path, &names, NULL, name_order);
    if (n < 0) {
        fprintf(stderr, "replay: cannot list %s\n", path);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const char *name = names[i]->d_name;
        if (name[0] != '.') {
            size_t len = strlen(path) + strlen(name) + 2;
            char *child = malloc(len);
            if (!child)
                rc = -1;
            else {
                snprintf(child, len, "%s/%s", path, name);
                if (replay_path(child, depth + 1) != 0)
                    rc = -1;
                free(child);
            }
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    int rc = 0, first = 1;
    if (argc > 1 && strcmp(argv[1], "-q") == 0) {
        verbose = 0;
        first = 2;
    } else if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        verbose = 2;
        first = 2;
    }
    if (first >= argc) {
        fprintf(stderr, "usage: %s [-q|-v] PATH...\n", argv[0]);
        return 2;
    }
    catch_crashes();
    for (int i = first; i < argc; i++)
        if (replay_path(argv[i], 0) != 0)
            rc = 1;
    const char *name = strrchr(argv[0], '/');
    if (verbose)
        printf("%s: %zu inputs replayed%s\n", name ? name + 1 : argv[0], replayed,
               rc ? ", some unreadable" : "");
    return rc;
}
