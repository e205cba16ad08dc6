/*
 * reload.h - hot reload: watch every policy directory, the Lua library and
 * the configuration file's directory (dirwatch.h) and reload the engine on
 * change; a refused reload is logged and counted, and the last good policy
 * set keeps serving.
 */
#ifndef GG_RELOAD_H
#define GG_RELOAD_H

#include "engine/policy.h"

struct reloader;

enum gg_status reload_start(struct engine *engine, struct reloader **out, struct gg_err *err);
void reload_stop(struct reloader *r);

#endif
