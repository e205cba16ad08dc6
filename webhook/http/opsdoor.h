/*
 * opsdoor.h - the ops port's listening socket and its front door: the
 * kubelet's probes answered without waiting behind other clients, and a
 * cap on the connections one address may hold.
 *
 * The ops port used to be one libmicrohttpd daemon with 64 connections for
 * everyone: 200 clients reconnecting as fast as it closed them kept all 64
 * busy, and the kubelet's probes found none free (liveness restarted every
 * replica, readiness dropped them, and with failurePolicy: Fail pod
 * creation stopped).  Now one thread accepts every connection itself and
 * looks at its first bytes (MSG_PEEK: nothing is taken from the socket)
 * before any slot is given:
 *
 *  - a complete GET or HEAD of /healthz or /readyz, without a body, is
 *    answered at once by this thread and the connection closed: a probe
 *    takes no slot and waits for nothing but its own bytes;
 *  - any other request, once its head is in, is handed to the HTTP server
 *    (libmicrohttpd, which reads it from the start): at most handed_max at
 *    once, and at most per_peer of them from one address; past either, the
 *    connection is closed;
 *  - until then the connection waits here, under the request deadline
 *    (the sweeper), and counts against its address: one address may have
 *    per_peer connections waiting, and a new one from an address at that
 *    cap closes that address's oldest waiting connection.  A new
 *    connection is never refused for its address's count: the kubelet
 *    probes from the node's address, which hostNetwork processes share,
 *    and a probe sends its request the moment it connects.  When
 *    pending_max connections wait in all, a new one closes the oldest
 *    waiting connection of the address that has the most.
 *
 * The probes' answers come from the server (door_hooks.probe), on this
 * thread: they must be quick and must not block.
 */
#ifndef GG_OPSDOOR_H
#define GG_OPSDOOR_H

#include "util/gpuguard.h"
#include "http/sweeper.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* Bytes of a request's head the door reads (peeks) at most; a longer probe goes to the server. */
#define DOOR_HEAD_MAX 4096

struct door_hooks {
    /*
     * The answer to a probe of path ("/healthz" or "/readyz"): its status
     * (200 or 503) and its text in out (NUL-terminated).  On the door's
     * thread; quick, never blocking.
     */
    unsigned (*probe)(void *ctx, const char *path, char *out, size_t size);
    /*
     * Give the connected socket fd to the HTTP server, which owns it from
     * then on, and tells the door of its start and its close
     * (door_accepted_at, door_closed); false when it could not take it
     * (fd closed, and no notice will come).
     */
    bool (*handoff)(void *ctx, int fd, const struct sockaddr *addr, socklen_t len);
    void *ctx;
};

struct door_config {
    unsigned per_peer;       /* connections one address may have waiting, and being answered */
    unsigned pending_max;    /* connections waiting for their request, all addresses */
    unsigned handed_max;     /* connections the HTTP server answers at once */
    struct sweeper *sweeper; /* the request deadline of a waiting connection */
};

struct ops_door;

/*
 * Listen on addr (port 0: any free port; *port is the port bound) and
 * start the door's thread.  where names the address in errors.
 */
enum gg_status door_start(const struct sockaddr_storage *addr, const char *where,
                          const struct door_config *cfg, const struct door_hooks *hooks,
                          uint16_t *port, struct ops_door **out, struct gg_err *err);

/* From the HTTP server, for a connection it was handed: when it was accepted (for its deadline). */
int64_t door_accepted_at(struct ops_door *d, int fd);
/* From the HTTP server: the connection handed to it is closing (before its socket is closed). */
void door_closed(struct ops_door *d, int fd);

/* Connections waiting for their request, and handed to the HTTP server, now. */
void door_counts(struct ops_door *d, unsigned *waiting, unsigned *handed);

/*
 * Stop the thread, close the listening socket and the waiting connections;
 * connections handed to the HTTP server stay counted until door_closed.
 */
void door_stop(struct ops_door *d);
/* Free, once the HTTP server has closed what it was handed; NULL is a no-op. */
void door_free(struct ops_door *d);

/* What the first bytes of a connection are (door_classify). */
enum door_kind {
    DOOR_MORE,  /* not enough yet to say */
    DOOR_PROBE, /* a complete probe request, answered by the door */
    DOOR_OTHER, /* anything else: for the HTTP server */
};

struct door_request {
    const char *path; /* DOOR_PROBE: "/healthz" or "/readyz" (static) */
    bool head;        /* DOOR_PROBE: HEAD, the answer has no body */
    size_t head_len;  /* DOOR_PROBE: bytes of the request, blank line included */
};

/*
 * Classify the first n bytes of a connection.  Nothing is said until the
 * request's head is whole (its blank line is in) or DOOR_HEAD_MAX bytes
 * have come without it: DOOR_MORE.  A probe is then exactly "GET" or
 * "HEAD", one space, "/healthz" or "/readyz" (a query allowed), one
 * space, "HTTP/1.1" or "HTTP/1.0", CRLF, header lines "Name: value" each
 * ended by CRLF, none of them Content-Length (but 0), Transfer-Encoding or
 * Expect, then CRLF: what the kubelet sends.  Anything else is
 * DOOR_OTHER, the HTTP server's to judge as before.
 */
enum door_kind door_classify(const char *buf, size_t n, struct door_request *out);

/* The peer address as the cap counts it: IPv4, IPv6, IPv4-mapped IPv6 as IPv4. */
struct door_peer_key {
    uint8_t family; /* 4 or 6; 0: unknown (all such share one count) */
    uint8_t addr[16];
};
void door_peer_key(const struct sockaddr *addr, socklen_t len, struct door_peer_key *out);

#endif
