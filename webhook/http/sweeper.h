/*
 * sweeper.h - the request deadline of the server's connections.
 *
 * libmicrohttpd's connection timeout measures inactivity only: a client
 * that sends a byte now and then holds its connection, and one of the
 * --max-connections slots, for as long as it likes.  The sweeper gives
 * every request a total deadline instead: a clock starts at the first byte
 * of a request (for a new connection, at its accept, so the TLS handshake
 * counts) and stops when the whole request is in or answered; a thread that
 * looks over the clocks ten times a second shuts down the socket of any
 * that has run past the limit.  A kept-alive connection between requests
 * has no clock: its idle time is libmicrohttpd's timeout, a separate
 * setting.
 *
 * The first byte of a request is seen in the TLS transport: the sweeper
 * reads and writes the socket for GnuTLS (sw_attach_tls), so any byte that
 * arrives while no clock runs starts one.  Nothing here knows HTTP; the
 * server says when a request's headers are in (in case its first bytes came
 * with the previous request's) and when the request is in or answered.  A
 * connection whose clock is never stopped is under the deadline from accept
 * to close.
 *
 * The sweeper also knows which connections are idle: answered (the server
 * says when) and no byte since.  When every --max-connections slot is taken,
 * the server closes the one idle the longest to admit a new connection
 * (sw_close_idlest); a connection with a request under way is never picked.
 */
#ifndef GG_SWEEPER_H
#define GG_SWEEPER_H

#include "util/gpuguard.h"

#include <gnutls/gnutls.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How often the sweeper looks at the clocks: the deadline's precision. */
#define SWEEPER_TICK_MS 100

struct sweeper;
struct sw_conn;

/* A sweeper closing requests older than limit_ms, with its thread. */
enum gg_status sw_new(int64_t limit_ms, struct sweeper **out, struct gg_err *err);
/* Stop the thread and free; every connection must have been closed first. */
void sw_free(struct sweeper *sw);

/*
 * Track the connected socket fd, its clock started now; NULL when out of
 * memory (the caller then drops the connection: an untracked one has no
 * deadline).
 */
struct sw_conn *sw_open(struct sweeper *sw, int fd);
/* The same, its clock started at start_us (gg_now_us's clock): a connection accepted earlier. */
struct sw_conn *sw_open_at(struct sweeper *sw, int fd, int64_t start_us);
/* Stop tracking, before the socket is closed; NULL is a no-op. */
void sw_close(struct sw_conn *c);

/* Do the session's socket I/O through c, so that a byte arriving starts the clock. */
void sw_attach_tls(struct sw_conn *c, gnutls_session_t session);
/* The peer address of a session attached to a connection ("unknown" otherwise). */
void sw_session_peer(gnutls_session_t session, char *out, size_t size);
/* The peer address of a connection ("unknown" when its socket has none). */
void sw_peer(const struct sw_conn *c, char *out, size_t size);

/* A request's headers are in: start the clock if no byte started it (c NULL: no-op). */
void sw_request_begin(struct sw_conn *c);
/* The request is in, or answered: stop the clock until the next byte (c NULL: no-op). */
void sw_request_end(struct sw_conn *c);
/* The answer is sent: idle until the next byte, unless one came already (c NULL: no-op). */
void sw_request_done(struct sw_conn *c);

/*
 * Shut down the connection idle the longest, to make room for a new one;
 * true when there was one, with how long it had been idle in *idle_ms.  One
 * with bytes waiting to be read (its next request arriving) is not idle.
 * Its worker then closes it as if the client had left (sw_close).
 */
bool sw_close_idlest(struct sweeper *sw, int64_t *idle_ms);
/* Connections shut down by sw_close_idlest and not yet sw_close'd: their slots are being freed. */
unsigned sw_closing(struct sweeper *sw);

#endif
