/*
 * clientauth.c - the client certificate check of mutual TLS (clientauth.h).
 *
 * GnuTLS verifies the chain and the key purpose; the names are read here
 * from the leaf with GnuTLS's X.509 parser.
 */
#include "http/clientauth.h"
#include "http/sweeper.h"
#include "util/log.h"

#include <gnutls/x509.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Longest name compared; a longer one in a certificate is none of ours. */
#define NAME_MAX_LEN 512

static const struct clientauth_names *wanted;

void clientauth_set_names(const struct clientauth_names *names)
{
    wanted = names;
}

/*
 * The chain verified against the client CAs, its key purpose allowing TLS
 * clients; else false with the reason in out.  A client without a
 * certificate fails here too (the certificate is requested, not required,
 * so that its refusal is logged like the others).
 */
static bool chain_accepted(gnutls_session_t session, char *out, size_t size)
{
    gnutls_typed_vdata_st purpose = {.type = GNUTLS_DT_KEY_PURPOSE_OID,
                                     .data = (unsigned char *)GNUTLS_KP_TLS_WWW_CLIENT};
    unsigned status = 0;
    int rc = gnutls_certificate_verify_peers(session, &purpose, 1, &status);
    if (rc == GNUTLS_E_SUCCESS && status == 0)
        return true;
    if (rc == GNUTLS_E_NO_CERTIFICATE_FOUND)
        snprintf(out, size, "no client certificate");
    else if (rc != GNUTLS_E_SUCCESS)
        snprintf(out, size, "%s", gnutls_strerror(rc));
    else {
        gnutls_datum_t text = {NULL, 0};
        if (gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &text, 0) == 0)
            snprintf(out, size, "%s", (const char *)text.data);
        else
            snprintf(out, size, "verification status 0x%x", status);
        gnutls_free(text.data);
    }
    return false;
}

static bool listed(const char *const *names, size_t n, const char *name, bool any_case)
{
    for (size_t i = 0; i < n; i++)
        if ((any_case ? strcasecmp(names[i], name) : strcmp(names[i], name)) == 0)
            return true;
    return false;
}

/* The subject's common name in out (size NAME_MAX_LEN); false when it has none, or several. */
static bool common_name(gnutls_x509_crt_t crt, char *out)
{
    size_t n = NAME_MAX_LEN;
    if (gnutls_x509_crt_get_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, 0, out, &n) != 0 ||
        n != strlen(out))
        return false;
    char second[2];
    size_t m = sizeof(second);
    return gnutls_x509_crt_get_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 1, 0, second, &m) ==
           GNUTLS_E_REQUESTED_DATA_NOT_AVAILABLE;
}

/* One of the certificate's DNS or URI subject alternative names is one of the SANs wanted. */
static bool san_listed(gnutls_x509_crt_t crt)
{
    for (unsigned seq = 0;; seq++) {
        char name[NAME_MAX_LEN];
        size_t n = sizeof(name);
        int type = gnutls_x509_crt_get_subject_alt_name(crt, seq, name, &n, NULL);
        if (type == GNUTLS_E_SHORT_MEMORY_BUFFER)
            continue;
        if (type < 0)
            return false; /* GNUTLS_E_REQUESTED_DATA_NOT_AVAILABLE past the last one */
        if ((type == GNUTLS_SAN_DNSNAME || type == GNUTLS_SAN_URI) && n == strlen(name) &&
            listed(wanted->san, wanted->n_san, name, type == GNUTLS_SAN_DNSNAME))
            return true;
    }
}

/* The leaf names one of the names wanted (or none are); else false with the reason in out. */
static bool name_accepted(gnutls_session_t session, char *out, size_t size)
{
    if (!wanted || wanted->n_cn + wanted->n_san == 0)
        return true;
    unsigned count = 0;
    const gnutls_datum_t *chain = gnutls_certificate_get_peers(session, &count);
    gnutls_x509_crt_t crt;
    if (!chain || count == 0 || gnutls_x509_crt_init(&crt) != 0) {
        snprintf(out, size, "the client certificate's names cannot be read");
        return false;
    }
    char cn[NAME_MAX_LEN] = "";
    bool ok =
        gnutls_x509_crt_import(crt, &chain[0], GNUTLS_X509_FMT_DER) == 0 &&
        ((common_name(crt, cn) && listed(wanted->cn, wanted->n_cn, cn, false)) || san_listed(crt));
    gnutls_x509_crt_deinit(crt);
    if (!ok)
        snprintf(out, size,
                 "certificate of CN \"%.64s\" names none of the --client-cn and --client-san "
                 "names",
                 cn);
    return ok;
}

/* GnuTLS calls this during the handshake: 0 accepts the client, anything else refuses it. */
static int verify_client(gnutls_session_t session)
{
    char reason[256];
    if (chain_accepted(session, reason, sizeof(reason)) &&
        name_accepted(session, reason, sizeof(reason)))
        return 0;
    char peer[64];
    sw_session_peer(session, peer, sizeof(peer));
    log_fields(LOG_WARN, "TLS handshake refused: client certificate not accepted",
               json_pack("{s:s,s:s}", "peer", peer, "reason", reason));
    return GNUTLS_E_CERTIFICATE_ERROR;
}

void clientauth_require(gnutls_session_t session)
{
    gnutls_certificate_server_set_request(session, GNUTLS_CERT_REQUEST);
    gnutls_session_set_verify_function(session, verify_client);
}
