/*
 * acceptor.h - the webhook's listening socket, and the thread that accepts
 * its connections and hands each to a worker.
 *
 * Workers that all poll one listening socket race for each new connection,
 * and the one awake first takes it: a burst (a client opening its pool of
 * connections) all landed on one worker while the other idled, for a whole
 * benchmark run.  A socket per worker (SO_REUSEPORT) spreads connections by
 * a hash instead, blind to load: a new connection could wait behind a slow
 * review on one worker while another worker idled.  So one thread accepts,
 * and the server hands each connection to the worker it picks.
 */
#ifndef GG_ACCEPTOR_H
#define GG_ACCEPTOR_H

#include "util/gpuguard.h"

#include <stdint.h>
#include <sys/socket.h>

struct acceptor;

/*
 * Hand the accepted socket fd to a worker, which owns it from then on
 * (closes it on any failure).
 */
typedef void (*acc_handoff)(void *ctx, int fd, const struct sockaddr *addr, socklen_t len);

/*
 * Listen on addr (port 0: any free port; *port is the port bound) and
 * start the accepting thread.  where names the address in errors.
 */
enum gg_status acc_start(const struct sockaddr_storage *addr, const char *where,
                         acc_handoff handoff, void *ctx, uint16_t *port, struct acceptor **out,
                         struct gg_err *err);
/*
 * A listening socket on addr, non-blocking (SO_REUSEADDR, IPv6 only for an
 * IPv6 address, backlog SOMAXCONN); -1 with errno set when it cannot be had.
 * The ops port's door (opsdoor.h) listens through it too.
 */
int acc_listen(const struct sockaddr_storage *addr);
/* Stop accepting and close the listening socket; new connections are refused. */
void acc_stop(struct acceptor *a);

#endif
