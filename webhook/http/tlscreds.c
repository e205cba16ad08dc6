/*
 * tlscreds.c - certificate generations for the TLS handshake callback.
 */
#include "http/tlscreds.h"

#include "http/certs.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CHAIN 8
/* A replaced generation is freed this long after the swap: handshakes are quick. */
#define RETIRE_SECONDS 300

struct generation {
    gnutls_pcert_st pcerts[MAX_CHAIN];
    unsigned int n;
    gnutls_privkey_t key;
    time_t not_after;
    char serial[80];
    time_t retired; /* 0 while current */
    struct generation *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct generation *current; /* head; older ones follow */

static void free_generation(struct generation *g)
{
    for (unsigned int i = 0; i < g->n; i++)
        gnutls_pcert_deinit(&g->pcerts[i]);
    if (g->key)
        gnutls_privkey_deinit(g->key);
    free(g);
}

static enum gg_status import(const struct certs_pair *pair, const char *cert_path,
                             struct generation *g, struct gg_err *err)
{
    gnutls_datum_t cert = {(unsigned char *)pair->cert_pem, (unsigned int)pair->cert_len};
    gnutls_datum_t key = {(unsigned char *)pair->key_pem, (unsigned int)pair->key_len};
    g->n = MAX_CHAIN;
    int rc = gnutls_pcert_list_import_x509_raw(g->pcerts, &g->n, &cert, GNUTLS_X509_FMT_PEM, 0);
    if (rc < 0) {
        g->n = 0;
        return gg_fail(err, GG_ERR_TLS, "%s: GnuTLS cannot use the chain: %s", cert_path,
                       gnutls_strerror(rc));
    }
    if ((rc = gnutls_privkey_init(&g->key)) < 0 ||
        (rc = gnutls_privkey_import_x509_raw(g->key, &key, GNUTLS_X509_FMT_PEM, NULL, 0)) < 0)
        return gg_fail(err, GG_ERR_TLS, "%s: GnuTLS cannot use the key: %s", cert_path,
                       gnutls_strerror(rc));
    g->not_after = pair->not_after;
    snprintf(g->serial, sizeof(g->serial), "%s", pair->serial_hex ? pair->serial_hex : "");
    return GG_OK;
}

/* Free generations retired long enough ago; called with the lock held. */
static void sweep(time_t now)
{
    struct generation **p = &current;
    while (*p) {
        struct generation *g = *p;
        if (g->retired && now - g->retired > RETIRE_SECONDS) {
            *p = g->next;
            free_generation(g);
        } else {
            p = &g->next;
        }
    }
}

/* Make a checked pair the current generation (pair is cleared either way). */
static enum gg_status install(struct certs_pair *pair, const char *label, struct gg_err *err)
{
    struct generation *g = calloc(1, sizeof(*g));
    enum gg_status st =
        g ? import(pair, label, g, err) : gg_fail(err, GG_ERR_NOMEM, "out of memory");
    certs_pair_clear(pair);
    if (st != GG_OK) {
        if (g)
            free_generation(g);
        return st;
    }
    time_t now = time(NULL);
    pthread_mutex_lock(&lock);
    if (current)
        current->retired = now;
    g->next = current;
    current = g;
    sweep(now);
    pthread_mutex_unlock(&lock);
    return GG_OK;
}

enum gg_status tls_creds_load(const char *cert_path, const char *key_path, struct gg_err *err)
{
    struct certs_pair pair = {0};
    enum gg_status st = certs_load_pair(cert_path, key_path, &pair, err);
    return st == GG_OK ? install(&pair, cert_path, err) : st;
}

enum gg_status tls_creds_use(const char *cert_label, const char *key_label, const char *cert_pem,
                             const char *key_pem, struct gg_err *err)
{
    struct certs_pair pair = {0};
    enum gg_status st = certs_check_pair(cert_label, key_label, cert_pem, key_pem, &pair, err);
    return st == GG_OK ? install(&pair, cert_label, err) : st;
}

time_t tls_creds_not_after(void)
{
    pthread_mutex_lock(&lock);
    time_t t = current ? current->not_after : 0;
    pthread_mutex_unlock(&lock);
    return t;
}

void tls_creds_serial(char *out, size_t size)
{
    pthread_mutex_lock(&lock);
    snprintf(out, size, "%s", current ? current->serial : "");
    pthread_mutex_unlock(&lock);
}

void tls_creds_clear(void)
{
    pthread_mutex_lock(&lock);
    while (current) {
        struct generation *g = current;
        current = g->next;
        free_generation(g);
    }
    pthread_mutex_unlock(&lock);
}

int tls_creds_retrieve(gnutls_session_t session, const gnutls_datum_t *req_ca_dn, int nreqs,
                       const gnutls_pk_algorithm_t *pk_algos, int pk_algos_length,
                       gnutls_pcert_st **pcert, unsigned int *pcert_length, gnutls_privkey_t *pkey)
{
    (void)session;
    (void)req_ca_dn;
    (void)nreqs;
    (void)pk_algos;
    (void)pk_algos_length;
    pthread_mutex_lock(&lock);
    struct generation *g = current;
    pthread_mutex_unlock(&lock);
    if (!g)
        return -1;
    *pcert = g->pcerts;
    *pcert_length = g->n;
    *pkey = g->key;
    return 0;
}
