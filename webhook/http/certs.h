/*
 * certs.h - webhook TLS material with the OpenSSL library: create a private
 * CA plus a serving certificate for a Kubernetes Service, write them safely,
 * and load and check a certificate/key pair for the server.
 *
 * No argument parsing and no printing here (that is cli_certs.c); errors are
 * an enum gg_status plus a message in the caller's struct gg_err.
 */
#ifndef GG_CERTS_H
#define GG_CERTS_H

#include "util/gpuguard.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* File names inside the output directory. */
#define CERTS_CA_FILE "ca.crt"
#define CERTS_CERT_FILE "tls.crt"
#define CERTS_KEY_FILE "tls.key"

#define CERTS_DEFAULT_DAYS 365
#define CERTS_MAX_DAYS 3650
#define CERTS_RSA_BITS 3072
/* notBefore is backdated this many seconds to tolerate clock skew. */
#define CERTS_BACKDATE_SECONDS 300
/* Largest PEM file certs_load_pair reads. */
#define CERTS_MAX_PEM_SIZE (1024 * 1024)
/* Room for "YYYY-MM-DDTHH:MM:SSZ" plus NUL (and a wide year). */
#define CERTS_TIME_LEN 32

enum certs_key_type {
    CERTS_KEY_ECDSA, /* NIST P-256 (the default) */
    CERTS_KEY_RSA,   /* CERTS_RSA_BITS */
};

struct certs_opts {
    const char *service; /* Service name: a DNS-1035 label */
    const char *ns;      /* namespace: a DNS-1123 label */
    int days;            /* 1..CERTS_MAX_DAYS */
    enum certs_key_type key_type;
    bool dev;   /* also DNS:localhost and IP:127.0.0.1 */
    time_t now; /* reference time; 0 means time(NULL) (tests set it) */
};

/* Generated material: heap PEM texts, NUL-terminated. */
struct certs_bundle {
    char *ca_pem;   /* the CA certificate */
    char *cert_pem; /* the serving certificate */
    char *key_pem;  /* the serving key (PKCS#8); the CA key is never kept */
    time_t not_before;
    time_t not_after;
};

/* A loaded and checked certificate/key pair. */
struct certs_pair {
    char *cert_pem; /* whole certificate file (leaf first, maybe a chain) */
    size_t cert_len;
    char *key_pem; /* whole key file */
    size_t key_len;
    time_t not_before; /* of the leaf */
    time_t not_after;
    char *serial_hex; /* of the leaf, upper-case hex as `openssl x509 -serial` */
};

/* Defaults: days 365, ECDSA, no dev names, now 0; service and ns NULL. */
void certs_opts_init(struct certs_opts *opts);

/* "ecdsa"/"rsa" -> key type; -1 when unknown. */
int certs_key_type_parse(const char *name);
const char *certs_key_type_name(enum certs_key_type type);

/* GG_OK when name is a valid Service name (DNS-1035) / namespace (DNS-1123). */
enum gg_status certs_check_service(const char *name, struct gg_err *err);
enum gg_status certs_check_namespace(const char *name, struct gg_err *err);

/* Create a CA and a serving certificate signed by it (GG_ERR_INVALID on bad opts). */
enum gg_status certs_generate(const struct certs_opts *opts, struct certs_bundle *out,
                              struct gg_err *err);
void certs_bundle_clear(struct certs_bundle *bundle);

/*
 * Write CERTS_CA_FILE, CERTS_CERT_FILE and CERTS_KEY_FILE (mode 0600) into
 * dir, creating dir (and parents, mode 0755 before umask) when missing.
 * Without force, any existing target gives GG_ERR_EXISTS and nothing is
 * written.  Each file goes to a private temporary name first and is then
 * linked (or, with force, renamed) into place, so readers never see a
 * partial file.
 */
enum gg_status certs_write(const struct certs_bundle *bundle, const char *dir, bool force,
                           struct gg_err *err);

/* Base64 (one line) of the CA PEM: a webhook configuration's caBundle. Free with free(). */
enum gg_status certs_ca_bundle(const struct certs_bundle *bundle, char **out, struct gg_err *err);

/*
 * Read a PEM certificate file and a PEM private key file (each at most
 * CERTS_MAX_PEM_SIZE), check that the key matches the first certificate and
 * that it is valid now.  Fills out on success only.
 */
enum gg_status certs_load_pair(const char *cert_path, const char *key_path, struct certs_pair *out,
                               struct gg_err *err);
void certs_pair_clear(struct certs_pair *pair);

/*
 * certs_load_pair's checks on a pair held in memory (cert_label and
 * key_label name them in messages).  The texts are copied.
 */
enum gg_status certs_check_pair(const char *cert_label, const char *key_label, const char *cert_pem,
                                const char *key_pem, struct certs_pair *out, struct gg_err *err);

/* Issuing in memory, for certificates gpuguard keeps itself (http/certkeeper.c). */
struct certs_issue {
    const char *service, *ns; /* the serving certificate's names, as certs_generate's */
    enum certs_key_type key_type;
    time_t now;
    int64_t lifetime_s; /* from now; a serving certificate's is cut at its CA's notAfter */
};

/* A new CA: its certificate and private key, PEM (free the key with certs_free_secret). */
enum gg_status certs_new_ca(const struct certs_issue *is, char **ca_pem, char **ca_key_pem,
                            struct gg_err *err);
/* A serving certificate and its new key, signed by the CA pair given as PEM. */
enum gg_status certs_new_leaf(const struct certs_issue *is, const char *ca_pem,
                              const char *ca_key_pem, char **cert_pem, char **key_pem,
                              struct gg_err *err);

/* One certificate of a PEM text: where it is (its PEM block) and when it is valid. */
struct certs_info {
    size_t start, len;
    time_t not_before, not_after;
};
/* The certificates of pem in order, at most max; -1 when one is malformed or more than max. */
int certs_scan(const char *pem, struct certs_info *out, int max);
/* Whether cert_pem's first certificate carries a signature of the key of one of cas_pem's. */
bool certs_signed_by(const char *cert_pem, const char *cas_pem);
/* Whether cert_pem's first certificate is valid for the DNS name host. */
bool certs_names_host(const char *cert_pem, const char *host);
/* Whether key_pem is the private key of cert_pem's first certificate. */
bool certs_key_matches(const char *cert_pem, const char *key_pem);
/* Wipe and free a PEM text that holds a key. */
void certs_free_secret(char *pem);

/* t as "YYYY-MM-DDTHH:MM:SSZ" (UTC) into buf; returns buf. */
char *certs_format_time(time_t t, char buf[CERTS_TIME_LEN]);

#endif
