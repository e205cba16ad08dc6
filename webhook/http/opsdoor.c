/*
 * opsdoor.c - the ops port's front door (opsdoor.h).
 *
 * One thread, one epoll set: the listening socket (level-triggered, accepted
 * in batches so that reading the waiting connections is never put off for
 * long) and each waiting connection (edge-triggered: the door only peeks at
 * a connection's bytes, so the socket stays readable, and an edge is a new
 * segment arriving).  A waiting connection is a slot; the slots of one
 * address are kept oldest first, for the cap.
 *
 * The slots belong to the door's thread.  The addresses' counts are shared
 * with the HTTP server's thread (door_accepted_at, door_closed), under the
 * lock.  A waiting connection's deadline is the sweeper's: it shuts the
 * socket down, which the door sees as a hang-up and closes.  The warnings
 * about closed connections are logged at most once every 10 s per reason,
 * so that a flood of connections is not a flood of lines.
 */
#include "http/opsdoor.h"
#include "http/acceptor.h"
#include "util/clock.h"
#include "util/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define ACCEPT_BATCH 64
#define EVENT_BATCH 128
#define BUCKETS 256 /* of the address table; a power of two */
#define NONE UINT32_MAX
#define EV_LISTEN UINT64_MAX
#define EV_WAKE (UINT64_MAX - 1)
/* Out of descriptors: wait this long before accepting again (a tight loop would spin). */
#define BACKOFF_MS 50
#define WARN_EVERY_US (10 * 1000000LL)
#define DEFER_ACCEPT_S 1

/* One address with connections here: waiting (its slots, oldest first) or handed over. */
struct peer {
    struct door_peer_key key;
    uint32_t next; /* in its bucket's chain, or in the free list */
    unsigned pending, handed;
    uint32_t oldest, newest;
};

/* A connection waiting for its request. */
struct slot {
    int fd;       /* -1: free */
    uint32_t gen; /* changes with each use: a stale epoll event is told apart */
    uint32_t peer;
    uint32_t older, newer; /* among its address's slots; next free slot when free */
    int64_t accepted_us;
    struct sw_conn *clock;
    struct sockaddr_storage addr;
    socklen_t addr_len;
};

/* A connection handed to the HTTP server (fd -1: a free entry). */
struct handed {
    int fd;
    uint32_t peer;
    int64_t accepted_us;
};

/* Connections closed for one reason since its last warning. */
struct tally {
    const char *msg;
    unsigned closed;
    unsigned limit;
    char peer[INET6_ADDRSTRLEN];
    int64_t next_us;
};

struct ops_door {
    struct door_config cfg;
    struct door_hooks hooks;
    int listen_fd, wake_fd, epoll_fd;
    pthread_t thread;
    bool running;

    /* The door's thread only. */
    struct slot *slots; /* pending_max + 1: one more while the newest evicts the oldest */
    uint32_t free_slot;
    struct tally capped, crowded, refused, busy;

    pthread_mutex_t lock; /* everything below */
    struct peer *peers;   /* pending_max + handed_max + 1 */
    uint32_t free_peer;
    uint32_t buckets[BUCKETS];
    unsigned pending; /* waiting, all addresses */
    struct handed *handed;
    unsigned n_handed;
};

/* ---- classifying a request ------------------------------------------------------- */

static bool starts(const char *p, size_t n, const char *lit)
{
    size_t k = strlen(lit);
    return n >= k && memcmp(p, lit, k) == 0;
}

static bool same(const char *p, size_t n, const char *lit)
{
    return n == strlen(lit) && memcmp(p, lit, n) == 0;
}

static bool same_nocase(const char *p, size_t n, const char *lit)
{
    return n == strlen(lit) && strncasecmp(p, lit, n) == 0;
}

/* A header line of a probe ("Name: value", without its CRLF): false if it needs the server. */
static bool plain_header(const char *p, size_t n)
{
    const char *colon = memchr(p, ':', n);
    if (!colon || colon == p || p[0] == ' ' || p[0] == '\t')
        return false; /* no name, or an obsolete continuation line */
    size_t name = (size_t)(colon - p);
    for (size_t i = 0; i < name; i++)
        if (p[i] == ' ' || p[i] == '\t')
            return false;
    const char *v = colon + 1, *end = p + n;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    if (same_nocase(p, name, "Transfer-Encoding") || same_nocase(p, name, "Expect"))
        return false;
    if (same_nocase(p, name, "Content-Length")) {
        if (v == end)
            return false;
        for (; v < end; v++)
            if (*v != '0')
                return false;
    }
    return true;
}

/*
 * The length of the head in buf[0..n) (request line, header lines, blank
 * line; LF or CRLF line ends), or 0 while it is not whole.
 */
static size_t head_length(const char *buf, size_t n)
{
    const char *p = memchr(buf, '\n', n);
    while (p) {
        const char *line = p + 1; /* the next line begins here */
        size_t left = (size_t)(buf + n - line);
        if (left >= 1 && line[0] == '\n')
            return (size_t)(line + 1 - buf);
        if (left >= 2 && line[0] == '\r' && line[1] == '\n')
            return (size_t)(line + 2 - buf);
        p = memchr(line, '\n', left);
    }
    return 0;
}

/* A whole head (head_len bytes): a probe request, or NULL. */
static const char *probe_path(const char *buf, size_t head_len, bool *head)
{
    const char *nl = memchr(buf, '\n', head_len);
    size_t len = (size_t)(nl - buf);
    if (len == 0 || buf[len - 1] != '\r')
        return NULL; /* a bare LF: the server's to judge */
    len--;
    size_t at;
    if (starts(buf, len, "GET "))
        *head = false, at = 4;
    else if (starts(buf, len, "HEAD "))
        *head = true, at = 5;
    else
        return NULL;
    const char *target = buf + at;
    const char *sp = memchr(target, ' ', len - at);
    if (!sp)
        return NULL;
    const char *q = memchr(target, '?', (size_t)(sp - target));
    size_t path_len = (size_t)((q ? q : sp) - target);
    const char *path = same(target, path_len, "/healthz")  ? "/healthz"
                       : same(target, path_len, "/readyz") ? "/readyz"
                                                           : NULL;
    size_t version = len - (size_t)(sp + 1 - buf);
    if (!path || (!same(sp + 1, version, "HTTP/1.1") && !same(sp + 1, version, "HTTP/1.0")))
        return NULL;
    for (const char *p = nl + 1;;) {
        const char *eol = memchr(p, '\n', (size_t)(buf + head_len - p));
        size_t line = (size_t)(eol - p);
        if (line == 0 || p[line - 1] != '\r')
            return NULL;
        if (line == 1) /* the blank line */
            return path;
        if (!plain_header(p, line - 1))
            return NULL;
        p = eol + 1;
    }
}

enum door_kind door_classify(const char *buf, size_t n, struct door_request *out)
{
    size_t head_len = head_length(buf, n);
    if (!head_len)
        return n >= DOOR_HEAD_MAX ? DOOR_OTHER : DOOR_MORE;
    bool head = false;
    const char *path = probe_path(buf, head_len, &head);
    if (!path)
        return DOOR_OTHER;
    *out = (struct door_request){.path = path, .head = head, .head_len = head_len};
    return DOOR_PROBE;
}

void door_peer_key(const struct sockaddr *addr, socklen_t len, struct door_peer_key *out)
{
    memset(out, 0, sizeof(*out));
    if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        out->family = 4;
        memcpy(out->addr, &((const struct sockaddr_in *)addr)->sin_addr, 4);
    } else if (addr && addr->sa_family == AF_INET6 &&
               len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)addr)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a6)) {
            out->family = 4;
            memcpy(out->addr, a6->s6_addr + 12, 4);
        } else {
            out->family = 6;
            memcpy(out->addr, a6->s6_addr, 16);
        }
    }
}

static void key_text(const struct door_peer_key *k, char *out, size_t size)
{
    if (k->family == 0 ||
        !inet_ntop(k->family == 4 ? AF_INET : AF_INET6, k->addr, out, (socklen_t)size))
        snprintf(out, size, "unknown");
}

/* ---- the address table (under the lock) ------------------------------------------- */

static uint32_t bucket_of(const struct door_peer_key *k)
{
    uint32_t h = 2166136261u ^ k->family;
    for (size_t i = 0; i < sizeof(k->addr); i++)
        h = (h ^ k->addr[i]) * 16777619u;
    return h & (BUCKETS - 1);
}

/* The address's entry, made if new; NONE when the table is full (cannot happen: see its size). */
static uint32_t peer_get(struct ops_door *d, const struct door_peer_key *k)
{
    uint32_t b = bucket_of(k);
    for (uint32_t i = d->buckets[b]; i != NONE; i = d->peers[i].next)
        if (memcmp(&d->peers[i].key, k, sizeof(*k)) == 0)
            return i;
    uint32_t i = d->free_peer;
    if (i == NONE)
        return NONE;
    struct peer *p = &d->peers[i];
    d->free_peer = p->next;
    *p = (struct peer){.key = *k, .next = d->buckets[b], .oldest = NONE, .newest = NONE};
    d->buckets[b] = i;
    return i;
}

/* Forget the address once it has no connection here. */
static void peer_put(struct ops_door *d, uint32_t i)
{
    struct peer *p = &d->peers[i];
    if (p->pending || p->handed)
        return;
    uint32_t *link = &d->buckets[bucket_of(&p->key)];
    while (*link != i)
        link = &d->peers[*link].next;
    *link = p->next;
    p->next = d->free_peer;
    d->free_peer = i;
}

static void slot_unlink(struct ops_door *d, uint32_t s)
{
    struct slot *sl = &d->slots[s];
    struct peer *p = &d->peers[sl->peer];
    if (sl->older != NONE)
        d->slots[sl->older].newer = sl->newer;
    else
        p->oldest = sl->newer;
    if (sl->newer != NONE)
        d->slots[sl->newer].older = sl->older;
    else
        p->newest = sl->older;
    p->pending--;
    d->pending--;
}

/* The oldest waiting connection of the address with the most (ties: the older one). */
static uint32_t crowd_victim(const struct ops_door *d)
{
    uint32_t best = NONE;
    unsigned most = 0;
    size_t n = (size_t)d->cfg.pending_max + d->cfg.handed_max + 1;
    for (size_t i = 0; i < n; i++) {
        const struct peer *p = &d->peers[i];
        if (p->pending == 0)
            continue; /* free entries have none either */
        if (p->pending > most ||
            (p->pending == most &&
             d->slots[p->oldest].accepted_us < d->slots[d->peers[best].oldest].accepted_us)) {
            most = p->pending;
            best = (uint32_t)i;
        }
    }
    return best == NONE ? NONE : d->peers[best].oldest;
}

/* ---- warnings -------------------------------------------------------------------- */

static void tally(struct tally *t, const struct door_peer_key *k)
{
    t->closed++;
    key_text(k, t->peer, sizeof(t->peer));
    int64_t now = gg_now_us();
    if (now < t->next_us)
        return;
    t->next_us = now + WARN_EVERY_US;
    log_fields(LOG_WARN, t->msg,
               json_pack("{s:s,s:i,s:i}", "peer", t->peer, "closed", (int)t->closed, "limit",
                         (int)t->limit));
    t->closed = 0;
}

/* ---- connections ----------------------------------------------------------------- */

/* Close a waiting connection (the door's thread). */
static void drop(struct ops_door *d, uint32_t s)
{
    struct slot *sl = &d->slots[s];
    int fd = sl->fd;
    struct sw_conn *clock = sl->clock;
    pthread_mutex_lock(&d->lock);
    uint32_t p = sl->peer;
    slot_unlink(d, s);
    peer_put(d, p);
    pthread_mutex_unlock(&d->lock);
    sl->fd = -1;
    sl->clock = NULL;
    sl->older = d->free_slot;
    d->free_slot = s;
    sw_close(clock); /* before the close: the sweeper never shuts down a reused number */
    close(fd);
}

static const char *reason_phrase(unsigned status)
{
    switch (status) {
    case 200:
        return "OK";
    case 503:
        return "Service Unavailable";
    default:
        return "Internal Server Error";
    }
}

/* RFC 9110's IMF-fixdate, in English whatever the locale. */
static void http_date(char *out, size_t size)
{
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t now = time(NULL);
    struct tm tm;
    if (!gmtime_r(&now, &tm)) {
        snprintf(out, size, "Thu, 01 Jan 1970 00:00:00 GMT");
        return;
    }
    snprintf(out, size, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday % 7], tm.tm_mday,
             months[tm.tm_mon % 12], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

/*
 * Answer a probe as the HTTP server would (same status line and headers),
 * and close.  The request is taken off the socket first, so that the close
 * is a FIN after the answer, not a reset that could lose it.  The answer
 * fits an empty socket buffer: one send that does not wait.
 */
static void answer(struct ops_door *d, uint32_t s, const struct door_request *rq)
{
    struct slot *sl = &d->slots[s];
    char sink[DOOR_HEAD_MAX];
    if (recv(sl->fd, sink, rq->head_len, MSG_DONTWAIT) != (ssize_t)rq->head_len) {
        drop(d, s);
        return;
    }
    char text[1536] = "", date[40], out[2048];
    unsigned status = d->hooks.probe(d->hooks.ctx, rq->path, text, sizeof(text));
    http_date(date, sizeof(date));
    size_t body = strlen(text);
    int n = snprintf(out, sizeof(out),
                     "HTTP/1.1 %u %s\r\nDate: %s\r\nConnection: close\r\n"
                     "Content-Type: text/plain; charset=utf-8\r\nContent-Length: %zu\r\n\r\n%s",
                     status, reason_phrase(status), date, body, rq->head ? "" : text);
    if (n > 0 && (size_t)n < sizeof(out))
        (void)send(sl->fd, out, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    drop(d, s);
}

static struct handed *handed_find(struct ops_door *d, int fd)
{
    for (unsigned i = 0; i < d->cfg.handed_max; i++)
        if (d->handed[i].fd == fd)
            return &d->handed[i];
    return NULL;
}

static void handed_release(struct ops_door *d, struct handed *h)
{
    struct peer *p = &d->peers[h->peer];
    p->handed--;
    d->n_handed--;
    h->fd = -1;
    peer_put(d, h->peer);
}

/*
 * Give a waiting connection whose request is not a probe to the HTTP
 * server, within its limits: per_peer from this address, handed_max in all.
 */
static void hand_over(struct ops_door *d, uint32_t s)
{
    struct slot *sl = &d->slots[s];
    pthread_mutex_lock(&d->lock);
    struct peer *p = &d->peers[sl->peer];
    struct tally *full = p->handed >= d->cfg.per_peer       ? &d->refused
                         : d->n_handed >= d->cfg.handed_max ? &d->busy
                                                            : NULL;
    bool room = !full;
    struct door_peer_key key = p->key;
    if (room) {
        /* A record left by a connection the server lost without a notice (it closed the
         * number, now reused) is stale: release it. */
        struct handed *h = handed_find(d, sl->fd);
        if (h)
            handed_release(d, h);
        h = handed_find(d, -1);
        *h = (struct handed){.fd = sl->fd, .peer = sl->peer, .accepted_us = sl->accepted_us};
        p->handed++;
        d->n_handed++;
        slot_unlink(d, s); /* p keeps a count: not freed */
    }
    pthread_mutex_unlock(&d->lock);
    if (!room) {
        tally(full, &key);
        drop(d, s);
        return;
    }
    int fd = sl->fd;
    epoll_ctl(d->epoll_fd, EPOLL_CTL_DEL, fd, NULL);
    sw_close(sl->clock); /* the server's own clock takes over, from the same accept */
    struct sockaddr_storage addr = sl->addr;
    socklen_t len = sl->addr_len;
    sl->fd = -1;
    sl->clock = NULL;
    sl->older = d->free_slot;
    d->free_slot = s;
    if (!d->hooks.handoff(d->hooks.ctx, fd, (struct sockaddr *)&addr, len))
        door_closed(d, fd);
}

/* Look at what a waiting connection has sent; events: epoll's, 0 right after the accept. */
static void examine(struct ops_door *d, uint32_t s, uint32_t events)
{
    char buf[DOOR_HEAD_MAX];
    ssize_t n = recv(d->slots[s].fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
    bool hung_up = events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        if (hung_up)
            drop(d, s);
        return;
    }
    if (n <= 0) { /* the client left, or the sweeper shut it down */
        drop(d, s);
        return;
    }
    struct door_request rq;
    switch (door_classify(buf, (size_t)n, &rq)) {
    case DOOR_PROBE:
        answer(d, s, &rq);
        return;
    case DOOR_OTHER:
        hand_over(d, s);
        return;
    default: /* DOOR_MORE: a request that will never be whole if the client has hung up */
        if (hung_up)
            drop(d, s);
        return;
    }
}

/*
 * A new connection waits in a slot.  Past its address's cap it closes that
 * address's oldest waiting connection, when all slots are taken the oldest
 * of the address with the most: never itself, whatever its address.
 */
static void admit(struct ops_door *d, int fd, const struct sockaddr_storage *addr, socklen_t len)
{
    struct door_peer_key key;
    door_peer_key((const struct sockaddr *)addr, len, &key);
    pthread_mutex_lock(&d->lock);
    uint32_t pi = peer_get(d, &key);
    uint32_t s = d->free_slot;
    if (pi == NONE || s == NONE) { /* cannot happen: both are sized for it */
        if (pi != NONE)
            peer_put(d, pi);
        pthread_mutex_unlock(&d->lock);
        close(fd);
        return;
    }
    struct slot *sl = &d->slots[s];
    d->free_slot = sl->older;
    struct peer *p = &d->peers[pi];
    *sl = (struct slot){.fd = fd,
                        .gen = sl->gen + 1,
                        .peer = pi,
                        .older = p->newest,
                        .newer = NONE,
                        .accepted_us = gg_now_us(),
                        .addr = *addr,
                        .addr_len = len};
    if (p->newest != NONE)
        d->slots[p->newest].newer = s;
    else
        p->oldest = s;
    p->newest = s;
    p->pending++;
    d->pending++;
    uint32_t victim = NONE;
    struct tally *why = NULL;
    if (p->pending > d->cfg.per_peer) {
        victim = p->oldest;
        why = &d->capped;
    } else if (d->pending > d->cfg.pending_max) {
        victim = crowd_victim(d);
        why = &d->crowded;
    }
    struct door_peer_key victim_key = victim != NONE ? d->peers[d->slots[victim].peer].key : key;
    pthread_mutex_unlock(&d->lock);
    if (victim != NONE) {
        tally(why, &victim_key);
        drop(d, victim);
        if (victim == s) /* only when every waiting one is as new: this one goes */
            return;
    }
    sl->clock = sw_open(d->cfg.sweeper, fd);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET,
                             .data.u64 = (uint64_t)sl->gen << 32 | s};
    if (!sl->clock || epoll_ctl(d->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        log_msg(LOG_ERROR, "ops connection dropped: out of memory for its deadline or its watch");
        drop(d, s);
        return;
    }
    examine(d, s, 0); /* a probe's request is usually in already */
}

/* Accept a batch; false when the thread must back off. */
static bool accept_some(struct ops_door *d)
{
    for (int k = 0; k < ACCEPT_BATCH; k++) {
        struct sockaddr_storage peer;
        socklen_t len = sizeof(peer);
        int fd =
            accept4(d->listen_fd, (struct sockaddr *)&peer, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            admit(d, fd, &peer, len);
            continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return true;
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        log_msg(LOG_ERROR, "accepting an ops connection failed: %s", strerror(errno));
        return false; /* EMFILE, ENFILE, ENOBUFS, ENOMEM: the connection waits in the backlog */
    }
    return true;
}

static void *door_main(void *arg)
{
    struct ops_door *d = arg;
    pthread_setname_np(pthread_self(), "ops-door");
    struct epoll_event ev[EVENT_BATCH];
    for (;;) {
        int n = epoll_wait(d->epoll_fd, ev, EVENT_BATCH, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            log_msg(LOG_ERROR, "ops port: epoll_wait failed: %s", strerror(errno));
            poll(NULL, 0, BACKOFF_MS);
            continue;
        }
        for (int i = 0; i < n; i++) {
            uint64_t u = ev[i].data.u64;
            if (u == EV_WAKE)
                return NULL;
            if (u == EV_LISTEN) {
                if (!accept_some(d))
                    poll(NULL, 0, BACKOFF_MS);
                continue;
            }
            uint32_t s = (uint32_t)u;
            if (s <= d->cfg.pending_max && d->slots[s].fd >= 0 &&
                d->slots[s].gen == (uint32_t)(u >> 32))
                examine(d, s, ev[i].events);
        }
    }
}

/* ---- life cycle ------------------------------------------------------------------ */

static void door_release(struct ops_door *d)
{
    if (d->epoll_fd >= 0)
        close(d->epoll_fd);
    if (d->wake_fd >= 0)
        close(d->wake_fd);
    if (d->listen_fd >= 0)
        close(d->listen_fd);
    d->epoll_fd = d->wake_fd = d->listen_fd = -1;
}

void door_free(struct ops_door *d)
{
    if (!d)
        return;
    door_release(d);
    pthread_mutex_destroy(&d->lock);
    free(d->slots);
    free(d->peers);
    free(d->handed);
    free(d);
}

static void defer_accept(int fd)
{
    const int seconds = DEFER_ACCEPT_S;
    if (setsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &seconds, sizeof(seconds)) != 0)
        log_msg(LOG_WARN,
                "ops port: TCP_DEFER_ACCEPT refused (%s): connections that send "
                "nothing reach the door at once",
                strerror(errno));
}

static bool watch(int epoll_fd, int fd, uint64_t tag)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag};
    return epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0;
}

enum gg_status door_start(const struct sockaddr_storage *addr, const char *where,
                          const struct door_config *cfg, const struct door_hooks *hooks,
                          uint16_t *port, struct ops_door **out, struct gg_err *err)
{
    if (cfg->per_peer == 0 || cfg->pending_max == 0 || cfg->handed_max == 0)
        return gg_fail(err, GG_ERR_INVALID, "ops port limits must be at least 1");
    struct ops_door *d = calloc(1, sizeof(*d));
    if (!d)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    d->cfg = *cfg;
    d->hooks = *hooks;
    d->listen_fd = d->wake_fd = d->epoll_fd = -1;
    pthread_mutex_init(&d->lock, NULL);
    size_t n_slots = (size_t)cfg->pending_max + 1;
    size_t n_peers = (size_t)cfg->pending_max + cfg->handed_max + 1;
    d->slots = calloc(n_slots, sizeof(*d->slots));
    d->peers = calloc(n_peers, sizeof(*d->peers));
    d->handed = calloc(cfg->handed_max, sizeof(*d->handed));
    if (!d->slots || !d->peers || !d->handed) {
        door_free(d);
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n_slots; i++)
        d->slots[i] = (struct slot){.fd = -1, .older = i + 1 < n_slots ? (uint32_t)i + 1 : NONE};
    for (size_t i = 0; i < n_peers; i++)
        d->peers[i].next = i + 1 < n_peers ? (uint32_t)i + 1 : NONE;
    for (unsigned i = 0; i < cfg->handed_max; i++)
        d->handed[i].fd = -1;
    for (size_t i = 0; i < BUCKETS; i++)
        d->buckets[i] = NONE;
    d->capped = (struct tally){.msg = "ops port: connections closed by the per-peer cap",
                               .limit = cfg->per_peer};
    d->crowded = (struct tally){.msg = "ops port: connections closed, too many waiting",
                                .limit = cfg->pending_max};
    d->refused = (struct tally){
        .msg = "ops port: connections refused by the per-peer cap on requests being answered",
        .limit = cfg->per_peer};
    d->busy =
        (struct tally){.msg = "ops port: connections refused, too many requests being answered",
                       .limit = cfg->handed_max};

    struct sockaddr_storage bound;
    socklen_t len = sizeof(bound);
    d->listen_fd = acc_listen(addr);
    if (d->listen_fd >= 0)
        defer_accept(d->listen_fd);
    if (d->listen_fd < 0 || getsockname(d->listen_fd, (struct sockaddr *)&bound, &len) != 0) {
        int saved = errno;
        door_free(d);
        return gg_fail(err, GG_ERR_IO, "cannot listen on %s: %s", where, strerror(saved));
    }
    d->wake_fd = eventfd(0, EFD_CLOEXEC);
    d->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (d->wake_fd < 0 || d->epoll_fd < 0 || !watch(d->epoll_fd, d->listen_fd, EV_LISTEN) ||
        !watch(d->epoll_fd, d->wake_fd, EV_WAKE) ||
        pthread_create(&d->thread, NULL, door_main, d) != 0) {
        door_free(d);
        return gg_fail(err, GG_ERR_IO, "cannot start the thread accepting on %s", where);
    }
    d->running = true;
    *port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                              : ((struct sockaddr_in *)&bound)->sin_port);
    *out = d;
    return GG_OK;
}

void door_stop(struct ops_door *d)
{
    if (!d || !d->running)
        return;
    uint64_t one = 1;
    if (write(d->wake_fd, &one, sizeof(one)) != sizeof(one))
        pthread_cancel(d->thread); /* epoll_wait is a cancellation point */
    pthread_join(d->thread, NULL);
    d->running = false;
    for (uint32_t s = 0; s <= d->cfg.pending_max; s++)
        if (d->slots[s].fd >= 0)
            drop(d, s);
    door_release(d);
}

int64_t door_accepted_at(struct ops_door *d, int fd)
{
    int64_t at = 0;
    pthread_mutex_lock(&d->lock);
    struct handed *h = handed_find(d, fd);
    if (h)
        at = h->accepted_us;
    pthread_mutex_unlock(&d->lock);
    return at ? at : gg_now_us();
}

void door_closed(struct ops_door *d, int fd)
{
    pthread_mutex_lock(&d->lock);
    struct handed *h = handed_find(d, fd);
    if (h)
        handed_release(d, h);
    pthread_mutex_unlock(&d->lock);
}

void door_counts(struct ops_door *d, unsigned *waiting, unsigned *handed)
{
    pthread_mutex_lock(&d->lock);
    *waiting = d->pending;
    *handed = d->n_handed;
    pthread_mutex_unlock(&d->lock);
}
