/*
 * dirwatch.h - call a function when files in some directories change.
 *
 * One thread per watch, on inotify.  Directories are watched rather than
 * files because Kubernetes updates ConfigMap and Secret volumes by renaming
 * a `..data` symlink; a burst of events is folded into one call after
 * DIRWATCH_DEBOUNCE_MS of quiet.
 */
#ifndef GG_DIRWATCH_H
#define GG_DIRWATCH_H

#include "util/gpuguard.h"

#include <stddef.h>

#define DIRWATCH_DEBOUNCE_MS 200

struct dirwatch;

/* Watch dirs[0..n) (NULL entries are skipped); on_change(ctx) runs on the watch thread. */
enum gg_status dirwatch_start(const char *const *dirs, size_t n, void (*on_change)(void *ctx),
                              void *ctx, struct dirwatch **out, struct gg_err *err);
void dirwatch_stop(struct dirwatch *w);

/* The directory part of a file path, into out ("." for a bare name). */
void dirwatch_dir_of(const char *path, char *out, size_t size);

#endif
