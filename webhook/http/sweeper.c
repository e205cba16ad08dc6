/*
 * sweeper.c - one thread that shuts down connections whose request is late.
 *
 * Each connection has a clock, the monotonic time its current request
 * began (0: none).  The worker that owns the connection starts and stops
 * it; the sweeper only reads it, under the list lock, and acts with
 * shutdown(2), which the owning worker then sees as the peer hanging up:
 * it closes the connection the ordinary way, on its own thread.  The socket
 * is never closed here, and sw_close unlinks a connection (under the same
 * lock) before libmicrohttpd closes its descriptor, so a descriptor number
 * reused by a new connection is never shut down by mistake.  Closing the
 * idlest connection for a new one (sw_close_idlest) works the same way, on
 * the accepting thread.
 */
#include "http/sweeper.h"
#include "util/clock.h"

#include "util/log.h"
#include "util/metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

struct sw_conn {
    struct sw_conn *prev, *next; /* in the sweeper's list, under its lock */
    struct sweeper *sw;
    int fd;
    bool shut;                     /* shut down by the sweeper (under the lock) */
    bool evicted;                  /* ... by sw_close_idlest, counted in closing */
    atomic_int_least64_t start_us; /* when the current request began; 0: none */
    atomic_int_least64_t idle_us;  /* when its last answer was sent, no byte since; 0: not idle */
};

struct sweeper {
    int64_t limit_us;
    pthread_t thread;
    pthread_mutex_t lock;
    atomic_bool stopping;
    struct sw_conn *head; /* under the lock */
    atomic_uint closing;  /* evicted connections not yet sw_close'd (changed under the lock) */
};

static void peer_of(int fd, char *out, size_t size)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    char host[INET6_ADDRSTRLEN] = "";
    unsigned port = 0;
    if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
            port = ntohs(a->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
            port = ntohs(a->sin6_port);
        }
    }
    if (*host)
        snprintf(out, size, "%s:%u", host, port);
    else
        snprintf(out, size, "unknown");
}

/* Shut down the late connections; called with the lock held. */
static void sweep(struct sweeper *sw)
{
    int64_t now = gg_now_us();
    for (struct sw_conn *c = sw->head; c; c = c->next) {
        int64_t start = atomic_load_explicit(&c->start_us, memory_order_relaxed);
        if (c->shut || start == 0 || now - start <= sw->limit_us)
            continue;
        char peer[INET6_ADDRSTRLEN + 8];
        peer_of(c->fd, peer, sizeof(peer));
        shutdown(c->fd, SHUT_RDWR);
        c->shut = true;
        metrics_http_error(408);
        log_fields(
            LOG_WARN, "request not received within the request timeout: connection closed",
            json_pack("{s:s,s:I}", "peer", peer, "timeout_ms", (json_int_t)(sw->limit_us / 1000)));
    }
}

static void *sweeper_main(void *arg)
{
    struct sweeper *sw = arg;
    const struct timespec tick = {0, SWEEPER_TICK_MS * 1000000L};
    while (!atomic_load(&sw->stopping)) {
        nanosleep(&tick, NULL);
        pthread_mutex_lock(&sw->lock);
        sweep(sw);
        pthread_mutex_unlock(&sw->lock);
    }
    return NULL;
}

enum gg_status sw_new(int64_t limit_ms, struct sweeper **out, struct gg_err *err)
{
    struct sweeper *sw = calloc(1, sizeof(*sw));
    if (!sw)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    sw->limit_us = limit_ms * 1000;
    pthread_mutex_init(&sw->lock, NULL);
    int rc = pthread_create(&sw->thread, NULL, sweeper_main, sw);
    if (rc != 0) {
        pthread_mutex_destroy(&sw->lock);
        free(sw);
        return gg_fail(err, GG_ERR_IO, "cannot start the request deadline thread: error %d", rc);
    }
    *out = sw;
    return GG_OK;
}

/* Stops within a tick: the thread sees the flag when it wakes. */
void sw_free(struct sweeper *sw)
{
    if (!sw)
        return;
    atomic_store(&sw->stopping, true);
    pthread_join(sw->thread, NULL);
    pthread_mutex_destroy(&sw->lock);
    free(sw);
}

struct sw_conn *sw_open(struct sweeper *sw, int fd)
{
    return sw_open_at(sw, fd, gg_now_us());
}

struct sw_conn *sw_open_at(struct sweeper *sw, int fd, int64_t start_us)
{
    struct sw_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->sw = sw;
    c->fd = fd;
    atomic_init(&c->start_us, start_us > 0 ? start_us : gg_now_us());
    pthread_mutex_lock(&sw->lock);
    c->next = sw->head;
    if (sw->head)
        sw->head->prev = c;
    sw->head = c;
    pthread_mutex_unlock(&sw->lock);
    return c;
}

void sw_close(struct sw_conn *c)
{
    if (!c)
        return;
    struct sweeper *sw = c->sw;
    pthread_mutex_lock(&sw->lock);
    if (c->prev)
        c->prev->next = c->next;
    else
        sw->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->evicted)
        atomic_fetch_sub(&sw->closing, 1);
    pthread_mutex_unlock(&sw->lock);
    free(c);
}

void sw_request_begin(struct sw_conn *c)
{
    if (!c)
        return;
    int_least64_t none = 0;
    atomic_compare_exchange_strong_explicit(&c->start_us, &none, gg_now_us(), memory_order_relaxed,
                                            memory_order_relaxed);
    atomic_store_explicit(&c->idle_us, 0, memory_order_relaxed);
}

void sw_request_end(struct sw_conn *c)
{
    if (c)
        atomic_store_explicit(&c->start_us, 0, memory_order_relaxed);
}

void sw_request_done(struct sw_conn *c)
{
    if (c && atomic_load_explicit(&c->start_us, memory_order_relaxed) == 0)
        atomic_store_explicit(&c->idle_us, gg_now_us(), memory_order_relaxed);
}

/*
 * The connection idle the longest and not shut down yet, idle since *since;
 * NULL: none.  With the lock held.
 */
static struct sw_conn *idlest(const struct sweeper *sw, int_least64_t *since)
{
    struct sw_conn *best = NULL;
    for (struct sw_conn *c = sw->head; c; c = c->next) {
        int_least64_t t = atomic_load_explicit(&c->idle_us, memory_order_relaxed);
        if (!c->shut && t > 0 && (!best || t < *since)) {
            best = c;
            *since = t;
        }
    }
    return best;
}

/*
 * Take c, idle since since, for closing: false when it is not idle after
 * all, its next request having come meanwhile or waiting to be read (its
 * worker busy with another connection's review).
 */
static bool claim(struct sw_conn *c, int_least64_t since)
{
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    if (poll(&p, 1, 0) > 0) {
        atomic_store_explicit(&c->idle_us, 0, memory_order_relaxed);
        return false;
    }
    return atomic_compare_exchange_strong_explicit(&c->idle_us, &since, 0, memory_order_relaxed,
                                                   memory_order_relaxed);
}

bool sw_close_idlest(struct sweeper *sw, int64_t *idle_ms)
{
    struct sw_conn *c;
    int_least64_t since = 0;
    pthread_mutex_lock(&sw->lock);
    while ((c = idlest(sw, &since)) && !claim(c, since))
        ;
    if (c) {
        shutdown(c->fd, SHUT_RDWR);
        c->shut = c->evicted = true;
        atomic_fetch_add(&sw->closing, 1);
        *idle_ms = (gg_now_us() - since) / 1000;
    }
    pthread_mutex_unlock(&sw->lock);
    return c != NULL;
}

unsigned sw_closing(struct sweeper *sw)
{
    return atomic_load(&sw->closing);
}

/*
 * GnuTLS transport: plain socket calls, as GnuTLS's own, plus the clock.
 * MSG_NOSIGNAL: a peer gone away is an error return, never SIGPIPE.
 */
static ssize_t tls_pull(gnutls_transport_ptr_t ptr, void *data, size_t size)
{
    struct sw_conn *c = ptr;
    ssize_t n = recv(c->fd, data, size, 0);
    if (n > 0)
        sw_request_begin(c);
    return n;
}

static int tls_pull_timeout(gnutls_transport_ptr_t ptr, unsigned int ms)
{
    const struct sw_conn *c = ptr;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int rc;
    do
        rc = poll(&p, 1, ms == GNUTLS_INDEFINITE_TIMEOUT ? -1 : (int)ms);
    while (rc < 0 && errno == EINTR);
    return rc;
}

static ssize_t tls_push(gnutls_transport_ptr_t ptr, const void *data, size_t size)
{
    const struct sw_conn *c = ptr;
    return send(c->fd, data, size, MSG_NOSIGNAL);
}

static ssize_t tls_vec_push(gnutls_transport_ptr_t ptr, const giovec_t *iov, int iovcnt)
{
    const struct sw_conn *c = ptr;
    struct msghdr msg = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};
    return sendmsg(c->fd, &msg, MSG_NOSIGNAL);
}

void sw_attach_tls(struct sw_conn *c, gnutls_session_t session)
{
    gnutls_session_set_ptr(session, c);
    gnutls_transport_set_ptr(session, c);
    gnutls_transport_set_pull_function(session, tls_pull);
    gnutls_transport_set_pull_timeout_function(session, tls_pull_timeout);
    /* After the push function: setting that one clears the vector one. */
    gnutls_transport_set_push_function(session, tls_push);
    gnutls_transport_set_vec_push_function(session, tls_vec_push);
}

void sw_session_peer(gnutls_session_t session, char *out, size_t size)
{
    const struct sw_conn *c = gnutls_session_get_ptr(session);
    if (c)
        sw_peer(c, out, size);
    else
        snprintf(out, size, "unknown");
}

void sw_peer(const struct sw_conn *c, char *out, size_t size)
{
    peer_of(c->fd, out, size);
}
