/*
 * listener.c - the webhook's listening sockets, one per worker (listener.h).
 */
#include "http/listener.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <string.h>
#include <unistd.h>

/* One socket bound to addr and listening; -1 and errno on failure. */
static int open_one(const struct sockaddr_storage *addr, bool shared)
{
    int family = addr->ss_family;
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    const int on = 1;
    socklen_t len = family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0 ||
        (shared && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof(on)) != 0) ||
        (family == AF_INET6 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof(on)) != 0) ||
        bind(fd, (const struct sockaddr *)addr, len) != 0 || listen(fd, SOMAXCONN) != 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

static uint16_t port_of(const struct sockaddr_storage *a)
{
    return ntohs(a->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)a)->sin6_port
                                          : ((const struct sockaddr_in *)a)->sin_port);
}

static enum gg_status fail_errno(const char *where, int fd, struct gg_err *err)
{
    int saved = errno;
    if (fd >= 0)
        close(fd);
    return gg_fail(err, GG_ERR_IO, "cannot listen on %s: %s", where, strerror(saved));
}

/*
 * SO_REUSEPORT would let our sockets join those of another process on the
 * port (a gpuguard of the same user left running) and share its
 * connections.  A socket bound without it finds the port taken, as a
 * single listener would; it also picks the port when addr asks for any.
 */
static enum gg_status claim_port(struct sockaddr_storage *addr, const char *where,
                                 struct gg_err *err)
{
    int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int on = 1;
    socklen_t len = sizeof(*addr);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0 ||
        (addr->ss_family == AF_INET6 &&
         setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof(on)) != 0) ||
        bind(fd, (const struct sockaddr *)addr,
             addr->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                         : sizeof(struct sockaddr_in)) != 0 ||
        getsockname(fd, (struct sockaddr *)addr, &len) != 0)
        return fail_errno(where, fd, err);
    close(fd);
    return GG_OK;
}

enum gg_status listeners_open(const struct sockaddr_storage *addr, const char *where, unsigned n,
                              int *fds, uint16_t *port, struct gg_err *err)
{
    struct sockaddr_storage bound = *addr;
    enum gg_status st = n > 1 ? claim_port(&bound, where, err) : GG_OK;
    if (st != GG_OK)
        return st;
    for (unsigned i = 0; i < n; i++) {
        fds[i] = open_one(&bound, n > 1);
        socklen_t len = sizeof(bound);
        if (fds[i] < 0 || (i == 0 && getsockname(fds[0], (struct sockaddr *)&bound, &len) != 0)) {
            st = fail_errno(where, fds[i], err); /* port 0 with one worker: the port it got */
            for (unsigned k = 0; k < i; k++)
                close(fds[k]);
            return st;
        }
    }
    *port = port_of(&bound);
    return GG_OK;
}
