/*
 * dirwatch.c - the inotify watch thread.
 */
#include "engine/dirwatch.h"

#include "util/log.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#define WATCH_EVENTS                                                                               \
    (IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_ATTRIB |            \
     IN_DELETE_SELF | IN_MOVE_SELF)

struct dirwatch {
    int inotify_fd;
    int stop_pipe[2];
    pthread_t thread;
    void (*on_change)(void *ctx);
    void *ctx;
};

void dirwatch_dir_of(const char *path, char *out, size_t size)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(out, size, ".");
    else if (slash == path)
        snprintf(out, size, "/");
    else
        snprintf(out, size, "%.*s", (int)(slash - path), path);
}

static void drain(int fd)
{
    char buf[4096];
    while (read(fd, buf, sizeof(buf)) > 0)
        ;
}

static void *watch_loop(void *arg)
{
    struct dirwatch *w = arg;
    bool pending = false;
    for (;;) {
        struct pollfd fds[2] = {{w->inotify_fd, POLLIN, 0}, {w->stop_pipe[0], POLLIN, 0}};
        int n = poll(fds, 2, pending ? DIRWATCH_DEBOUNCE_MS : -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (fds[1].revents)
            break;
        if (n > 0 && fds[0].revents) {
            drain(w->inotify_fd);
            pending = true;
        } else if (n == 0 && pending) {
            pending = false;
            w->on_change(w->ctx);
        }
    }
    return NULL;
}

static void close_all(struct dirwatch *w)
{
    if (w->inotify_fd >= 0)
        close(w->inotify_fd);
    for (int i = 0; i < 2; i++)
        if (w->stop_pipe[i] >= 0)
            close(w->stop_pipe[i]);
}

enum gg_status dirwatch_start(const char *const *dirs, size_t n, void (*on_change)(void *ctx),
                              void *ctx, struct dirwatch **out, struct gg_err *err)
{
    struct dirwatch *w = calloc(1, sizeof(*w));
    if (!w)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    w->on_change = on_change;
    w->ctx = ctx;
    w->stop_pipe[0] = w->stop_pipe[1] = -1;
    w->inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    enum gg_status st = GG_OK;
    if (w->inotify_fd < 0 || pipe(w->stop_pipe) != 0)
        st = gg_fail(err, GG_ERR_IO, "cannot start a file watch: %s", strerror(errno));
    for (size_t i = 0; st == GG_OK && i < n; i++)
        if (dirs[i] && inotify_add_watch(w->inotify_fd, dirs[i], WATCH_EVENTS) < 0)
            st = gg_fail(err, GG_ERR_IO, "cannot watch %s: %s", dirs[i], strerror(errno));
    if (st == GG_OK && pthread_create(&w->thread, NULL, watch_loop, w) != 0)
        st = gg_fail(err, GG_ERR_IO, "cannot start the file watch thread");
    if (st != GG_OK) {
        close_all(w);
        free(w);
        return st;
    }
    *out = w;
    return GG_OK;
}

void dirwatch_stop(struct dirwatch *w)
{
    if (!w)
        return;
    if (write(w->stop_pipe[1], "x", 1) < 0)
        log_msg(LOG_WARN, "file watch: cannot signal stop: %s", strerror(errno));
    pthread_join(w->thread, NULL);
    close_all(w);
    free(w);
}
