/*
 * listener.h - the webhook's listening sockets: one per worker thread, all
 * bound to the same address with SO_REUSEPORT.
 *
 * With one listening socket polled by every worker, whichever worker wakes
 * first accepts, and a burst of new connections can land on one worker while
 * the others idle (seen under load: one worker at a full core, the other at
 * none).  With a socket per worker the kernel spreads new connections across
 * them by a hash of their addresses, as nginx's `reuseport` does.
 */
#ifndef GG_LISTENER_H
#define GG_LISTENER_H

#include "util/gpuguard.h"

#include <stdint.h>
#include <sys/socket.h>

/*
 * Open n listening sockets on addr (port 0: one free port, the same for
 * all) into fds; *port is the port bound.  where names the address in
 * errors.  On failure no socket is left open.
 */
enum gg_status listeners_open(const struct sockaddr_storage *addr, const char *where, unsigned n,
                              int *fds, uint16_t *port, struct gg_err *err);

#endif
