/*
 * reload.c - reload the policy engine when its inputs change.
 */
#include "engine/reload.h"

#include "engine/dirwatch.h"
#include "util/log.h"
#include "util/metrics.h"

#include <stdlib.h>

struct reloader {
    struct engine *engine;
    struct dirwatch *watch;
};

static void reload_now(void *ctx)
{
    struct reloader *r = ctx;
    struct gg_err err = {{0}};
    enum gg_status st = engine_reload(r->engine, &err);
    uint64_t generation = engine_generation(r->engine);
    metrics_reload(st == GG_OK, generation);
    if (st == GG_OK)
        log_fields(LOG_INFO, "policies reloaded", json_pack("{s:I}", "generation", generation));
    else
        log_fields(LOG_ERROR, "reload refused: the last good policy set keeps serving",
                   json_pack("{s:s,s:I}", "error", err.msg, "generation", generation));
}

enum gg_status reload_start(struct engine *engine, struct reloader **out, struct gg_err *err)
{
    const struct policy_paths *paths = engine_paths(engine);
    struct reloader *r = calloc(1, sizeof(*r));
    if (!r)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    r->engine = engine;
    char config_dir[4096];
    if (paths->config)
        dirwatch_dir_of(paths->config, config_dir, sizeof(config_dir));
    /* Every policy directory, then the library and the configuration's. */
    const char *dirs[POLICY_MAX_DIRS + 2];
    size_t n = policy_dirs(paths, dirs);
    dirs[n++] = paths->lua;
    dirs[n++] = paths->config ? config_dir : NULL;
    enum gg_status st = dirwatch_start(dirs, n, reload_now, r, &r->watch, err);
    if (st != GG_OK) {
        free(r);
        return st;
    }
    *out = r;
    return GG_OK;
}

void reload_stop(struct reloader *r)
{
    if (!r)
        return;
    dirwatch_stop(r->watch);
    free(r);
}
