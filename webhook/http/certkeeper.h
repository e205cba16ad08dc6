/*
 * certkeeper.h - certificates gpuguard keeps itself (serve --tls-secret): a
 * CA and a serving certificate for its Service, made, stored and renewed in
 * one Secret the manifests ship empty, and the CA written into the caBundle
 * of its own webhook configurations together with their failurePolicy.
 *
 * The Secret (type Opaque) holds ca.crt (every CA still trusted, oldest
 * first), ca.key (the newest CA's key), tls.crt and tls.key.  Every replica
 * runs the same round every check period, and the Secret's resourceVersion
 * decides between them: a replica writes with the version it read, a 409
 * loses the round and the next one reads the winner's certificates.
 *
 * A round, in the order that keeps every review verifiable:
 *  1. CA: none or unusable -> a new one.  A third of its lifetime left -> a
 *     new one added after the old, which stays in ca.crt (and so in the
 *     caBundle) until it expires.
 *  2. Serving certificate: none or unusable -> issued by the newest CA at
 *     once (nothing else could serve).  A third of its lifetime left, or
 *     signed by an older CA -> reissued by the newest CA, but only once both
 *     webhook configurations have carried that CA for a whole check period:
 *     the API server trusts the new certificate before any replica serves it,
 *     and the old CA stays trusted for the replicas still serving the old one.
 *  3. Serve what the Secret holds (read from the API, not a mounted volume,
 *     so a change reaches every replica within one check period).
 *  4. Once this replica serves (certkeeper_serving): every webhook of both
 *     configurations gets caBundle = ca.crt and the failurePolicy asked for,
 *     written only when different.  The manifests ship the webhooks with
 *     failurePolicy Ignore and no caBundle, so a first install never refuses
 *     pods for want of a CA; from this write on they fail closed.
 *
 * With certificates from files instead (--tls-cert, cert_file here: the
 * cert-manager and provided modes) there is no Secret to keep, and step 4
 * writes failurePolicy only, and only once every webhook's caBundle trusts
 * the serving certificate: the manifests ship Ignore in every mode, so that
 * no install refuses pods before gpuguard answers.
 *
 * RBAC: secrets get, update (named; --tls-secret only);
 * validatingwebhookconfigurations and mutatingwebhookconfigurations get,
 * update (named).  Nothing is created.
 */
#ifndef GG_CERTKEEPER_H
#define GG_CERTKEEPER_H

#include "kube/kubeclient.h"
#include "util/gpuguard.h"

#include <stdint.h>

#define CK_DEFAULT_CA_LIFETIME_S (10 * 365 * 86400LL)
#define CK_DEFAULT_CERT_LIFETIME_S (365 * 86400LL)
#define CK_DEFAULT_CHECK_MS 10000
#define CK_MIN_LIFETIME_S 30 /* shorter ones leave no room for a round to renew */
#define CK_START_MS 60000    /* certkeeper_start tries this long for a certificate to serve */
#define CK_REQUEST_MS 10000  /* one request */
#define CK_MAX_BODY (1 << 20)

struct certkeeper_options {
    const char *cert_file;      /* set: certificates from files, failurePolicy only */
    const char *ns, *secret;    /* the Secret (cert_file NULL) */
    const char *service;        /* the Service whose DNS names the certificate carries */
    const char *webhooks;       /* the Validating- and MutatingWebhookConfiguration */
    const char *failure_policy; /* written with the caBundle: "Fail" or "Ignore" */
    int64_t ca_lifetime_s, cert_lifetime_s, check_ms;
};

struct certkeeper;

/*
 * With the Secret: run rounds until one leaves a valid certificate serving
 * (tls_creds), for up to CK_START_MS; then (at once with cert_file) go on in
 * a thread of its own with c (which it now owns).  The error names the last
 * failure: the Secret missing, RBAC, ...
 */
enum gg_status certkeeper_start(struct kc_client *c, const struct certkeeper_options *o,
                                struct certkeeper **out, struct gg_err *err);
/* The server answers now: the webhook configurations may point at it. */
void certkeeper_serving(struct certkeeper *k);
/* Stop the thread and free; NULL is a no-op. */
void certkeeper_stop(struct certkeeper *k);

#endif
