/*
 * reload.h - hot reload: watch the policy directory, the Lua library and
 * the configuration file with inotify and reload the engine on change.
 *
 * Kubernetes updates ConfigMap volumes by renaming a `..data` symlink, so
 * directories are watched (not files), and a burst of events is folded
 * into one reload after a short quiet period.
 */
#ifndef GG_RELOAD_H
#define GG_RELOAD_H

#include "policy.h"

/* Quiet time after the last event before reloading. */
#define RELOAD_DEBOUNCE_MS 200

struct reloader;

enum gg_status reload_start(struct engine *engine, struct reloader **out, struct gg_err *err);
void reload_stop(struct reloader *r);

#endif
