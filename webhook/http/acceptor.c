/*
 * acceptor.c - the webhook's listening socket and its accepting thread
 * (acceptor.h).
 */
#include "http/acceptor.h"
#include "util/log.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Out of descriptors: wait this long before accepting again (a tight loop would spin). */
#define BACKOFF_MS 50

struct acceptor {
    int listen_fd;
    int wake_fd; /* an eventfd: acc_stop's signal to the thread */
    acc_handoff handoff;
    void *ctx;
    pthread_t thread;
};

int acc_listen(const struct sockaddr_storage *addr)
{
    int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    const int on = 1;
    socklen_t len =
        addr->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0 ||
        (addr->ss_family == AF_INET6 &&
         setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof(on)) != 0) ||
        bind(fd, (const struct sockaddr *)addr, len) != 0 || listen(fd, SOMAXCONN) != 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

/* Accept every connection waiting; false when the thread must back off. */
static bool accept_all(struct acceptor *a)
{
    for (;;) {
        struct sockaddr_storage peer;
        socklen_t len = sizeof(peer);
        int fd =
            accept4(a->listen_fd, (struct sockaddr *)&peer, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            a->handoff(a->ctx, fd, (struct sockaddr *)&peer, len);
            continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return true;
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        log_msg(LOG_ERROR, "accepting a webhook connection failed: %s", strerror(errno));
        return false; /* EMFILE, ENFILE, ENOBUFS, ENOMEM: the connection waits in the backlog */
    }
}

static void *accept_loop(void *arg)
{
    struct acceptor *a = arg;
    pthread_setname_np(pthread_self(), "webhook-accept");
    struct pollfd fds[2] = {{.fd = a->listen_fd, .events = POLLIN},
                            {.fd = a->wake_fd, .events = POLLIN}};
    for (;;) {
        if (poll(fds, 2, -1) < 0 && errno != EINTR)
            break;
        if (fds[1].revents)
            break;
        if (fds[0].revents && !accept_all(a))
            poll(NULL, 0, BACKOFF_MS);
    }
    return NULL;
}

enum gg_status acc_start(const struct sockaddr_storage *addr, const char *where,
                         acc_handoff handoff, void *ctx, uint16_t *port, struct acceptor **out,
                         struct gg_err *err)
{
    struct acceptor *a = calloc(1, sizeof(*a));
    if (!a)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    a->handoff = handoff;
    a->ctx = ctx;
    a->wake_fd = -1;
    struct sockaddr_storage bound;
    socklen_t len = sizeof(bound);
    a->listen_fd = acc_listen(addr);
    if (a->listen_fd < 0 || getsockname(a->listen_fd, (struct sockaddr *)&bound, &len) != 0) {
        int saved = errno;
        if (a->listen_fd >= 0)
            close(a->listen_fd);
        free(a);
        return gg_fail(err, GG_ERR_IO, "cannot listen on %s: %s", where, strerror(saved));
    }
    a->wake_fd = eventfd(0, EFD_CLOEXEC);
    if (a->wake_fd < 0 || pthread_create(&a->thread, NULL, accept_loop, a) != 0) {
        if (a->wake_fd >= 0)
            close(a->wake_fd);
        close(a->listen_fd);
        free(a);
        return gg_fail(err, GG_ERR_IO, "cannot start the thread accepting on %s", where);
    }
    *port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                              : ((struct sockaddr_in *)&bound)->sin_port);
    *out = a;
    return GG_OK;
}

void acc_stop(struct acceptor *a)
{
    if (!a)
        return;
    uint64_t one = 1;
    if (write(a->wake_fd, &one, sizeof(one)) != sizeof(one))
        pthread_cancel(a->thread); /* poll is a cancellation point */
    pthread_join(a->thread, NULL);
    close(a->wake_fd);
    close(a->listen_fd);
    free(a);
}
