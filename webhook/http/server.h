/*
 * server.h - the HTTPS webhook endpoint and the plain-HTTP ops endpoint.
 *
 * The webhook answers POST /mutate and POST /validate with AdmissionReviews;
 * the ops port serves /healthz, /readyz and /metrics (its socket, the probes
 * and the per-peer cap are opsdoor.h's).  HTTP status codes are
 * decided here and nowhere else.  The serving certificate comes from
 * tlscreds.h at every handshake: load it there before srv_start.
 */
#ifndef GG_SERVER_H
#define GG_SERVER_H

#include "util/gpuguard.h"
#include "engine/policy.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * The ops port (opsdoor.h): connections one address may hold waiting for
 * their request, and again being answered (--ops-max-per-peer's default);
 * connections waiting, all addresses; requests other than the probes
 * answered at once.  The probes need none of these: the door answers a
 * probe as soon as its request is in.
 */
#define OPS_PER_PEER 8
#define OPS_WAITING 512
#define OPS_ANSWERING 64
/* Descriptors the ops port may hold at most. */
#define OPS_MAX_FDS (OPS_WAITING + OPS_ANSWERING + 2)
/*
 * Descriptors the server may hold at most with --max-connections n: the
 * webhook port's connections, with as many again closing while new ones
 * take their slots (server.c, make_room), and the ops port's.
 */
#define SRV_MAX_FDS(n) (2 * (n) + OPS_MAX_FDS)

struct clientauth_names; /* clientauth.h */

struct srv_config {
    const char *listen;        /* "ADDR:PORT" or "[V6ADDR]:PORT"; port 0 picks one */
    const char *ops_listen;    /* same form, plain HTTP */
    const char *client_ca_pem; /* PEM CAs: client certificates required (mTLS); NULL: off */
    /* With client_ca_pem, the names a client certificate must carry one of; NULL: any. */
    const struct clientauth_names *client_names;
    unsigned threads; /* worker threads for the webhook port */
    size_t max_body;  /* larger bodies get 413 */
    unsigned max_connections;
    unsigned idle_timeout_s; /* keep-alive idle timeout, above the client's 90 s */
    /* A request's headers and body must arrive within this, else its connection is closed. */
    unsigned request_timeout_s;
    unsigned ops_per_peer; /* see OPS_PER_PEER; 0: that */
    struct engine *engine; /* evaluates the reviews; also reported by /readyz */
    /* Writes a second /readyz line (e.g. the inventory's state); NULL: none.  Called on the
     * ops port's threads (the door's, for the probes): it must be quick and must not block. */
    void (*ready_note)(void *ctx, char *out, size_t size);
    void *ready_note_ctx;
};

struct srv;

enum gg_status srv_start(const struct srv_config *cfg, struct srv **out, struct gg_err *err);

/* The ports actually bound (useful with port 0). */
uint16_t srv_port(const struct srv *s);
uint16_t srv_ops_port(const struct srv *s);

/* /readyz answers 200 when ready (with the policy generation), else 503 with the reason. */
void srv_set_ready(struct srv *s, bool ready, const char *reason);

/*
 * Stop accepting connections, wait up to grace_ms for requests in flight to
 * be answered, then close everything and free s.  A worker stuck in a review
 * (a policy in a C call no budget reaches) is waited for however long it
 * takes: the caller bounds the wait by ending the process.
 */
void srv_stop(struct srv *s, int64_t grace_ms);
/*
 * Log the reviews still being evaluated (path, peer, time running) and the
 * count of requests in flight: what a process ending now abandons.  From any
 * thread, before, during or after srv_stop.
 */
void srv_log_abandoned(void);

#endif
