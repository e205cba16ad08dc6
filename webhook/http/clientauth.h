/*
 * clientauth.h - mutual TLS on the webhook port: which client certificates
 * may connect.
 *
 * With client CAs (--client-ca), a client must present a certificate that
 * chains to one of them and that, when it lists its uses (extended key
 * usage), is meant for TLS clients (clientAuth).  With names (--client-cn,
 * --client-san), the certificate must also name one of them: its subject's
 * common name (its only one) is one of the CNs, exactly, or one of its DNS
 * subject alternative names (in any case) or URI ones (exactly) is one of
 * the SANs.  The check runs during the handshake, so a refused client never
 * reaches HTTP; each refusal is logged with the peer and the reason.
 */
#ifndef GG_CLIENTAUTH_H
#define GG_CLIENTAUTH_H

#include <gnutls/gnutls.h>
#include <stddef.h>

/* Names each flag may list at most. */
#define CLIENTAUTH_NAMES_MAX 16

struct clientauth_names {
    const char *cn[CLIENTAUTH_NAMES_MAX]; /* subject common names accepted */
    size_t n_cn;
    const char *san[CLIENTAUTH_NAMES_MAX]; /* DNS or URI subject alternative names accepted */
    size_t n_san;
};

/*
 * The names a client certificate must carry one of (none: any certificate
 * of the CAs), kept (not copied) until the next call.  One set per process
 * (GnuTLS's verify function has no context): set it before the first
 * handshake.
 */
void clientauth_set_names(const struct clientauth_names *names);
/* Ask the session's client for its certificate and check it during the handshake. */
void clientauth_require(gnutls_session_t session);

#endif
