/*
 * reload.c - the inotify watcher thread.
 */
#include "reload.h"

#include "log.h"
#include "metrics.h"

#include <errno.h>
#include <libgen.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#define WATCH_EVENTS                                                                               \
    (IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_ATTRIB |            \
     IN_DELETE_SELF | IN_MOVE_SELF)

struct reloader {
    struct engine *engine;
    int inotify_fd;
    int stop_pipe[2];
    pthread_t thread;
};

static enum gg_status watch(struct reloader *r, const char *dir, struct gg_err *err)
{
    if (inotify_add_watch(r->inotify_fd, dir, WATCH_EVENTS) < 0)
        return gg_fail(err, GG_ERR_IO, "cannot watch %s: %s", dir, strerror(errno));
    return GG_OK;
}

static void drain(int fd)
{
    char buf[4096];
    while (read(fd, buf, sizeof(buf)) > 0)
        ;
}

static void reload_now(struct reloader *r)
{
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

static void *watch_loop(void *arg)
{
    struct reloader *r = arg;
    bool pending = false;
    for (;;) {
        struct pollfd fds[2] = {{r->inotify_fd, POLLIN, 0}, {r->stop_pipe[0], POLLIN, 0}};
        int n = poll(fds, 2, pending ? RELOAD_DEBOUNCE_MS : -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (fds[1].revents)
            break;
        if (n > 0 && fds[0].revents) {
            drain(r->inotify_fd);
            pending = true;
        } else if (n == 0 && pending) {
            pending = false;
            reload_now(r);
        }
    }
    return NULL;
}

enum gg_status reload_start(struct engine *engine, struct reloader **out, struct gg_err *err)
{
    const struct policy_paths *paths = engine_paths(engine);
    struct reloader *r = calloc(1, sizeof(*r));
    if (!r)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    r->engine = engine;
    r->stop_pipe[0] = r->stop_pipe[1] = -1;
    r->inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    enum gg_status st = GG_OK;
    if (r->inotify_fd < 0 || pipe(r->stop_pipe) != 0)
        st = gg_fail(err, GG_ERR_IO, "cannot start the reload watcher: %s", strerror(errno));
    if (st == GG_OK)
        st = watch(r, paths->policies, err);
    if (st == GG_OK)
        st = watch(r, paths->lua, err);
    if (st == GG_OK && paths->config) {
        char *copy = strdup(paths->config);
        st = watch(r, dirname(copy), err);
        free(copy);
    }
    if (st == GG_OK && pthread_create(&r->thread, NULL, watch_loop, r) != 0)
        st = gg_fail(err, GG_ERR_IO, "cannot start the reload watcher thread");
    if (st != GG_OK) {
        if (r->inotify_fd >= 0)
            close(r->inotify_fd);
        for (int i = 0; i < 2; i++)
            if (r->stop_pipe[i] >= 0)
                close(r->stop_pipe[i]);
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
    if (write(r->stop_pipe[1], "x", 1) < 0)
        log_msg(LOG_WARN, "reload watcher: cannot signal stop: %s", strerror(errno));
    pthread_join(r->thread, NULL);
    close(r->inotify_fd);
    close(r->stop_pipe[0]);
    close(r->stop_pipe[1]);
    free(r);
}
