/*
 * tlscreds.h - the serving certificate as GnuTLS sees it, swappable while
 * the server runs.
 *
 * The server hands tls_creds_retrieve to libmicrohttpd as its certificate
 * callback; every handshake takes the current generation.  tls_creds_load
 * checks a new pair (certs_load_pair: readable, key matches, valid now)
 * before it becomes current, so a bad pair is refused and the old one keeps
 * serving.  Replaced generations are kept for a while, since GnuTLS uses the
 * callback's structures without copying them.  One set of credentials per
 * process (the callback has no context argument).
 */
#ifndef GG_TLSCREDS_H
#define GG_TLSCREDS_H

#include "util/gpuguard.h"

#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <time.h>

/* Load and check the pair; on success it serves new handshakes. */
enum gg_status tls_creds_load(const char *cert_path, const char *key_path, struct gg_err *err);

/* The same for a pair held in memory (labels name its parts in messages). */
enum gg_status tls_creds_use(const char *cert_label, const char *key_label, const char *cert_pem,
                             const char *key_pem, struct gg_err *err);

/* notAfter and serial (hex) of the current certificate; 0 / "" before the first load. */
time_t tls_creds_not_after(void);
void tls_creds_serial(char *out, size_t size);

/* Free every generation (after the server has stopped). */
void tls_creds_clear(void);

/* The gnutls_certificate_retrieve_function2 given to libmicrohttpd. */
int tls_creds_retrieve(gnutls_session_t session, const gnutls_datum_t *req_ca_dn, int nreqs,
                       const gnutls_pk_algorithm_t *pk_algos, int pk_algos_length,
                       gnutls_pcert_st **pcert, unsigned int *pcert_length, gnutls_privkey_t *pkey);

#endif
