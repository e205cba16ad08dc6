/*
 * certkeeper.c - the webhook's own CA and serving certificate, kept in a
 * Secret and injected into its webhook configurations (certkeeper.h).
 */
#include "http/certkeeper.h"

#include "http/certs.h"
#include "http/tlscreds.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_CAS 8           /* CAs in ca.crt: one, two during a rotation */
#define LOST_RETRY_MS 200   /* after a 409: another replica wrote first */
#define START_RETRY_MS 1000 /* between failed rounds at start */
#define N_CONFIGS 2
/* The least time a new CA is in both webhook configurations before a serving certificate it
 * signed is issued: more than it takes a configuration change to reach every API server. */
#define CONFIRM_MIN_MS 5000
#define NAME_MAX_LEN 254

static const char *const config_kinds[N_CONFIGS] = {"validatingwebhookconfigurations",
                                                    "mutatingwebhookconfigurations"};
/* The Secret's keys, in the order of struct material's fields. */
static const char *const secret_keys[] = {"ca.crt", "ca.key", "tls.crt", "tls.key"};
#define N_KEYS (sizeof(secret_keys) / sizeof(secret_keys[0]))

struct certkeeper {
    struct kc_client *kc;
    char ns[64], secret[NAME_MAX_LEN], service[64], webhooks[NAME_MAX_LEN], policy[8];
    const char *cert_file; /* certificates from files: failurePolicy only (certkeeper.h) */
    int64_t ca_lifetime_s, cert_lifetime_s, check_ms;
    pthread_t thread;
    bool started;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    atomic_bool stop, serving;
    bool wake;               /* under lock: cut the wait short (certkeeper_serving) */
    char *loaded;            /* the tls.crt serving now */
    char *confirmed_ca;      /* the newest CA, as both webhook configurations carry it ... */
    int64_t confirmed_us;    /* ... since this time (CLOCK_MONOTONIC) */
    char last_problem[512];  /* logged once until it changes */
    bool absent[N_CONFIGS];  /* a webhook configuration found missing (logged once) */
    bool awaiting_endpoints; /* the wait for a ready endpoint is logged (once) */
    long last_status;        /* of the round's last request that failed */
};

/* The Secret's four PEM texts ("" when absent); [1] and [3] hold keys.  new_ca and leaf_why
 * say what a round's plan made (logged once the Secret is written). */
struct material {
    char *pem[N_KEYS];
    bool new_ca;
    const char *leaf_why;
};
enum { CA_CRT, CA_KEY, TLS_CRT, TLS_KEY };

static void material_clear(struct material *m)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        if (i == CA_KEY || i == TLS_KEY)
            certs_free_secret(m->pem[i]);
        else
            free(m->pem[i]);
        m->pem[i] = NULL;
    }
}

/* Replace one text (taking ownership of text). */
static void material_set(struct material *m, int i, char *text)
{
    if (i == CA_KEY || i == TLS_KEY)
        certs_free_secret(m->pem[i]);
    else
        free(m->pem[i]);
    m->pem[i] = text;
}

static struct kc_request request(struct certkeeper *k, const char *path, const char *what)
{
    return (struct kc_request){.path = path,
                               .what = what,
                               .timeout_ms = CK_REQUEST_MS,
                               .max_body = CK_MAX_BODY,
                               .cancel = &k->stop};
}

/* The Secret's data, decoded; a key that is absent or not base64 is "". */
static enum gg_status read_material(const json_t *secret, struct material *m, struct gg_err *err)
{
    const json_t *data = json_object_get(secret, "data");
    for (size_t i = 0; i < N_KEYS; i++) {
        const char *b64 = json_string_value(json_object_get(data, secret_keys[i]));
        size_t len = 0;
        unsigned char *raw = kc_base64_decode(b64 ? b64 : "", &len);
        if (!raw)
            raw = (unsigned char *)strdup("");
        if (!raw)
            return gg_fail(err, GG_ERR_NOMEM, "out of memory");
        m->pem[i] = (char *)raw;
    }
    return GG_OK;
}

/* A third of its lifetime left (as issued: notBefore is backdated by CERTS_BACKDATE_SECONDS). */
static bool due(const struct certs_info *c, time_t now)
{
    time_t issued = c->not_before + CERTS_BACKDATE_SECONDS;
    return now >= c->not_after - (c->not_after - issued) / 3;
}

/*
 * Whether the newest CA has been in both webhook configurations, as read
 * (not as this replica wrote them), for a check period and CONFIRM_MIN_MS.
 */
static bool confirmed(const struct certkeeper *k, const char *newest)
{
    int64_t wait_ms = k->check_ms > CONFIRM_MIN_MS ? k->check_ms : CONFIRM_MIN_MS;
    return k->confirmed_ca && strcmp(k->confirmed_ca, newest) == 0 &&
           gg_now_us() - k->confirmed_us >= wait_ms * 1000;
}

static struct certs_issue issue(const struct certkeeper *k, int64_t lifetime_s)
{
    return (struct certs_issue){.service = k->service,
                                .ns = k->ns,
                                .key_type = CERTS_KEY_ECDSA,
                                .now = time(NULL),
                                .lifetime_s = lifetime_s};
}

/*
 * ca.crt without its expired CAs, each block ending in a line break (Go's PEM
 * reader, the API server's, finds none in "-----END ...----------BEGIN");
 * *newest: the last one kept (a copy), NULL when none.  An unreadable ca.crt
 * is an error: replacing it would drop CAs the replicas' certificates need.
 */
static enum gg_status trusted_cas(const struct certkeeper *k, const char *ca_crt, time_t now,
                                  char **kept, char **newest, struct gg_err *err)
{
    struct certs_info cas[MAX_CAS];
    int n = certs_scan(ca_crt, cas, MAX_CAS);
    size_t len = 0;
    *newest = *kept = NULL;
    if (n < 0)
        return gg_fail(err, GG_ERR_PARSE,
                       "Secret %s/%s: ca.crt is not a PEM bundle of at most %d certificates; "
                       "repair it, or remove the Secret's data to start over",
                       k->ns, k->secret, MAX_CAS);
    if (!(*kept = calloc(1, strlen(ca_crt) + (size_t)n + 1)))
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        if (cas[i].not_after <= now)
            continue;
        memcpy(*kept + len, ca_crt + cas[i].start, cas[i].len);
        len += cas[i].len;
        if ((*kept)[len - 1] != '\n')
            (*kept)[len++] = '\n';
        free(*newest);
        if (!(*newest = strndup(ca_crt + cas[i].start, cas[i].len)))
            return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    return GG_OK;
}

/* Append a new CA to kept and make it the newest; its key replaces ca.key. */
static enum gg_status add_ca(const struct certkeeper *k, struct material *m, char **kept,
                             char **newest, struct gg_err *err)
{
    char *ca = NULL, *key = NULL;
    struct certs_issue is = issue(k, k->ca_lifetime_s);
    enum gg_status st = certs_new_ca(&is, &ca, &key, err);
    if (st != GG_OK)
        return st;
    char *joined = NULL;
    if (asprintf(&joined, "%s%s", *kept, ca) < 0) {
        free(ca);
        certs_free_secret(key);
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    free(*kept);
    *kept = joined;
    free(*newest);
    *newest = ca;
    material_set(m, CA_KEY, key);
    m->new_ca = true;
    return GG_OK;
}

/*
 * The serving certificate: usable now, for the Service's name, and signed by
 * a CA of kept; *by_newest, *renew.
 */
static bool leaf_usable(const struct certkeeper *k, const struct material *m, const char *kept,
                        const char *newest, time_t now, bool *by_newest, bool *renew)
{
    char host[sizeof(k->service) + sizeof(k->ns) + 8];
    snprintf(host, sizeof(host), "%s.%s.svc", k->service, k->ns);
    struct certs_pair pair = {0};
    struct gg_err ignored = {{0}};
    struct certs_info leaf;
    *by_newest = *renew = false;
    if (certs_check_pair("tls.crt", "tls.key", m->pem[TLS_CRT], m->pem[TLS_KEY], &pair, &ignored) !=
        GG_OK)
        return false;
    leaf = (struct certs_info){.not_before = pair.not_before, .not_after = pair.not_after};
    certs_pair_clear(&pair);
    if (!certs_names_host(m->pem[TLS_CRT], host))
        return false;
    *renew = due(&leaf, now);
    *by_newest = certs_signed_by(m->pem[TLS_CRT], newest);
    return certs_signed_by(m->pem[TLS_CRT], kept);
}

/*
 * Steps 1 and 2 of a round (certkeeper.h) on m; *changed when m must be
 * written back.
 */
static enum gg_status plan(const struct certkeeper *k, struct material *m, bool *changed,
                           struct gg_err *err)
{
    time_t now = time(NULL);
    char *kept = NULL, *newest = NULL;
    struct certs_info info;
    enum gg_status st = trusted_cas(k, m->pem[CA_CRT], now, &kept, &newest, err);
    *changed = false;
    if (st != GG_OK)
        goto out;
    bool usable = newest && certs_key_matches(newest, m->pem[CA_KEY]);
    if (!usable || (certs_scan(newest, &info, 1) == 1 && due(&info, now))) {
        if ((st = add_ca(k, m, &kept, &newest, err)) != GG_OK)
            goto out;
        *changed = true;
    }
    if (strcmp(kept, m->pem[CA_CRT]) != 0) {
        material_set(m, CA_CRT, kept);
        kept = NULL;
        *changed = true;
    }
    bool by_newest, renew;
    bool leaf_ok = leaf_usable(k, m, m->pem[CA_CRT], newest, now, &by_newest, &renew);
    if (!leaf_ok || ((renew || !by_newest) && confirmed(k, newest))) {
        char *cert = NULL, *key = NULL;
        struct certs_issue is = issue(k, k->cert_lifetime_s);
        if ((st = certs_new_leaf(&is, newest, m->pem[CA_KEY], &cert, &key, err)) != GG_OK)
            goto out;
        material_set(m, TLS_CRT, cert);
        material_set(m, TLS_KEY, key);
        *changed = true;
        m->leaf_why = !leaf_ok ? "none usable" : !by_newest ? "new CA" : "renewal";
    }
out:
    free(kept);
    free(newest);
    return st;
}

/* Wipe the base64 texts of a Secret's data (keys among them) before it is freed. */
static void wipe_data(json_t *secret)
{
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(secret, "data"), key, v)
    {
        if (json_is_string(v))
            explicit_bzero((char *)json_string_value(v), json_string_length(v));
    }
}

/*
 * PUT the Secret with m as its four keys (others it holds stay), with the
 * resourceVersion it was read with.
 */
static enum gg_status write_material(struct certkeeper *k, json_t *secret, const struct material *m,
                                     long *status, struct gg_err *err)
{
    json_t *data = json_object_get(secret, "data");
    if (!json_is_object(data) && json_object_set_new(secret, "data", data = json_object()) != 0)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < N_KEYS; i++) {
        size_t len = strlen(m->pem[i]);
        char *b64 = kc_base64_encode((const unsigned char *)m->pem[i], len);
        int failed = !b64 || json_object_set_new(data, secret_keys[i], json_string(b64)) != 0;
        if (b64)
            explicit_bzero(b64, strlen(b64));
        free(b64);
        if (failed)
            return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    char path[512], what[384];
    snprintf(path, sizeof(path), "/api/v1/namespaces/%s/secrets/%s", k->ns, k->secret);
    snprintf(what, sizeof(what), "Secret %s/%s", k->ns, k->secret);
    struct kc_request rq = request(k, path, what);
    json_t *written = NULL;
    enum gg_status st = kc_json(k->kc, &rq, "PUT", secret, &written, status, err);
    wipe_data(written);
    json_decref(written);
    return st;
}

/* Step 3: serve the Secret's certificate when it is not the one serving. */
static enum gg_status serve(struct certkeeper *k, const struct material *m, struct gg_err *err)
{
    if (k->loaded && strcmp(k->loaded, m->pem[TLS_CRT]) == 0)
        return GG_OK;
    char cert_label[384], key_label[384];
    snprintf(cert_label, sizeof(cert_label), "Secret %s/%s tls.crt", k->ns, k->secret);
    snprintf(key_label, sizeof(key_label), "Secret %s/%s tls.key", k->ns, k->secret);
    enum gg_status st = tls_creds_use(cert_label, key_label, m->pem[TLS_CRT], m->pem[TLS_KEY], err);
    if (st != GG_OK)
        return st;
    char *copy = strdup(m->pem[TLS_CRT]);
    if (!copy)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    free(k->loaded);
    k->loaded = copy;
    char serial[80];
    tls_creds_serial(serial, sizeof(serial));
    metrics_tls(true, tls_creds_not_after());
    log_fields(LOG_INFO, "certificates: serving",
               json_pack("{s:s,s:s}", "secret", k->secret, "serial", serial));
    return GG_OK;
}

/* Whether every webhook of cfg carries bundle as its caBundle and policy as its failurePolicy. */
static const char *hook_bundle(const json_t *hook)
{
    return json_string_value(json_object_get(json_object_get(hook, "clientConfig"), "caBundle"));
}

/*
 * Whether every webhook of cfg has policy as its failurePolicy and, unless
 * bundle_b64 is NULL (certificates from files), bundle_b64 as its caBundle.
 */
static bool config_current(const json_t *cfg, const char *bundle_b64, const char *policy)
{
    size_t i;
    const json_t *hook;
    json_array_foreach(json_object_get(cfg, "webhooks"), i, hook)
    {
        const char *has = hook_bundle(hook);
        const char *fp = json_string_value(json_object_get(hook, "failurePolicy"));
        if ((bundle_b64 && (!has || strcmp(has, bundle_b64) != 0)) || !fp ||
            strcmp(fp, policy) != 0)
            return false;
    }
    return true;
}

static void set_config(json_t *cfg, const char *bundle_b64, const char *policy)
{
    size_t i;
    json_t *hook;
    json_array_foreach(json_object_get(cfg, "webhooks"), i, hook)
    {
        json_t *cc = json_object_get(hook, "clientConfig");
        if (!json_is_object(cc))
            json_object_set_new(hook, "clientConfig", cc = json_object());
        if (bundle_b64)
            json_object_set_new(cc, "caBundle", json_string(bundle_b64));
        json_object_set_new(hook, "failurePolicy", json_string(policy));
    }
}

/*
 * Certificates from files: whether every webhook's caBundle trusts the
 * serving certificate (one of its CAs signed it).  Until then failurePolicy
 * Fail would refuse every request the webhooks match.
 */
static bool bundles_trust(const json_t *cfg, const char *cert_pem)
{
    size_t i;
    const json_t *hook;
    bool all = json_array_size(json_object_get(cfg, "webhooks")) > 0;
    json_array_foreach(json_object_get(cfg, "webhooks"), i, hook)
    {
        size_t len;
        const char *b64 = hook_bundle(hook);
        char *pem = b64 ? (char *)kc_base64_decode(b64, &len) : NULL;
        all = all && pem && certs_signed_by(cert_pem, pem);
        free(pem);
    }
    return all;
}

/*
 * The notBefore of the newest certificate in a webhook's caBundle; 0 when it
 * has none readable.
 */
static time_t newest_in_bundle(const json_t *cfg)
{
    const char *b64 = hook_bundle(json_array_get(json_object_get(cfg, "webhooks"), 0));
    size_t len;
    char *pem = b64 ? (char *)kc_base64_decode(b64, &len) : NULL;
    struct certs_info cas[MAX_CAS];
    int n = pem ? certs_scan(pem, cas, MAX_CAS) : 0;
    time_t newest = 0;
    for (int i = 0; i < n; i++)
        if (cas[i].not_before > newest)
            newest = cas[i].not_before;
    free(pem);
    return newest;
}

/*
 * Whether the Services the webhooks of cfg name have a ready endpoint (an
 * EndpointSlice endpoint whose ready condition is true or unset, which the
 * API says to read as ready), so that failurePolicy Fail refuses nothing for
 * want of one.  Webhooks that name a URL are not asked about.  An answer that
 * cannot be had (RBAC without endpointslices list, an API server error) is
 * logged and taken as ready: the check narrows a window, it is no gate.
 */
static bool endpoints_ready(struct certkeeper *k, const json_t *cfg)
{
    size_t i;
    const json_t *hook;
    json_array_foreach(json_object_get(cfg, "webhooks"), i, hook)
    {
        const json_t *svc = json_object_get(json_object_get(hook, "clientConfig"), "service");
        const char *ns = json_string_value(json_object_get(svc, "namespace"));
        const char *name = json_string_value(json_object_get(svc, "name"));
        if (!ns || !name || !gg_dns_label(ns) || !gg_dns_label(name))
            continue;
        char path[512], what[384];
        snprintf(path, sizeof(path),
                 "/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices"
                 "?labelSelector=kubernetes.io%%2Fservice-name%%3D%s",
                 ns, name);
        snprintf(what, sizeof(what), "the EndpointSlices of Service %s/%s", ns, name);
        struct kc_request rq = request(k, path, what);
        json_t *list = NULL;
        long status;
        struct gg_err err = {{0}};
        if (kc_json(k->kc, &rq, "GET", NULL, &list, &status, &err) != GG_OK) {
            log_fields(LOG_WARN, "certificates: endpoints not known, failurePolicy written anyway",
                       json_pack("{s:s}", "error", err.msg));
            return true;
        }
        bool ready = false;
        size_t s_i, e_i;
        const json_t *slice, *ep;
        json_array_foreach(json_object_get(list, "items"), s_i, slice)
        {
            json_array_foreach(json_object_get(slice, "endpoints"), e_i, ep)
            {
                const json_t *r = json_object_get(json_object_get(ep, "conditions"), "ready");
                ready = ready || !r || json_is_true(r);
            }
        }
        json_decref(list);
        if (!ready) {
            if (!k->awaiting_endpoints)
                log_fields(LOG_INFO,
                           "certificates: failurePolicy Fail waits for a ready endpoint of the "
                           "webhooks' Service",
                           json_pack("{s:s,s:s}", "namespace", ns, "service", name));
            k->awaiting_endpoints = true;
            return false;
        }
    }
    k->awaiting_endpoints = false;
    return true;
}

/*
 * Step 4 for one configuration.  *carries: it held the bundle when read (a
 * write of this round is not yet known to every API server); *absent: it
 * does not exist.  A configuration that holds a CA newer than this replica's
 * newest was written from a Secret newer than the one read here: it is left
 * alone (writing would drop that CA).  A 409 is GG_ERR_EXISTS: another
 * replica wrote it first.  Certificates from files (bundle_b64 NULL):
 * failurePolicy only, once the configuration's caBundle trusts cert_pem.
 */
static enum gg_status inject(struct certkeeper *k, int kind, const char *bundle_b64,
                             time_t newest_ca, const char *cert_pem, bool *carries,
                             struct gg_err *err)
{
    char path[512], what[384];
    snprintf(path, sizeof(path), "/apis/admissionregistration.k8s.io/v1/%s/%s", config_kinds[kind],
             k->webhooks);
    snprintf(what, sizeof(what), "%s %s", config_kinds[kind], k->webhooks);
    struct kc_request rq = request(k, path, what);
    json_t *cfg = NULL, *written = NULL;
    long status;
    enum gg_status st = kc_json(k->kc, &rq, "GET", NULL, &cfg, &status, err);
    *carries = false;
    if (status == 404) {
        if (!k->absent[kind])
            log_fields(LOG_WARN,
                       "certificates: no such webhook configuration: its webhooks get "
                       "no caBundle from gpuguard",
                       json_pack("{s:s,s:s}", "kind", config_kinds[kind], "name", k->webhooks));
        k->absent[kind] = true;
        return GG_OK;
    }
    k->absent[kind] = false;
    if (st == GG_OK && config_current(cfg, bundle_b64, k->policy)) {
        *carries = true;
    } else if (st == GG_OK && atomic_load(&k->serving) &&
               (bundle_b64 ? newest_in_bundle(cfg) <= newest_ca : bundles_trust(cfg, cert_pem)) &&
               (strcmp(k->policy, "Fail") != 0 || config_current(cfg, NULL, "Fail") ||
                endpoints_ready(k, cfg))) {
        set_config(cfg, bundle_b64, k->policy);
        st = kc_json(k->kc, &rq, "PUT", cfg, &written, &status, err);
        if (st == GG_OK)
            log_fields(LOG_INFO, "certificates: webhook configuration updated",
                       json_pack("{s:s,s:s,s:s}", "kind", config_kinds[kind], "name", k->webhooks,
                                 "failurePolicy", k->policy));
        else if (status == 409)
            st = GG_ERR_EXISTS;
    }
    json_decref(cfg);
    json_decref(written);
    return st;
}

/* Step 4 for both, and the confirmation of the newest CA that step 2 waits for. */
static enum gg_status inject_all(struct certkeeper *k, const struct material *m, struct gg_err *err)
{
    struct certs_info cas[MAX_CAS];
    int n = certs_scan(m->pem[CA_CRT], cas, MAX_CAS);
    if (n < 1)
        return gg_fail(err, GG_ERR_PARSE, "Secret %s/%s: no CA in ca.crt", k->ns, k->secret);
    char *b64 = kc_base64_encode((const unsigned char *)m->pem[CA_CRT], strlen(m->pem[CA_CRT]));
    if (!b64)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    bool all = true, any = false;
    enum gg_status st = GG_OK;
    for (int i = 0; st == GG_OK && i < N_CONFIGS; i++) {
        bool carries;
        st = inject(k, i, b64, cas[n - 1].not_before, NULL, &carries, err);
        all = all && (carries || k->absent[i]);
        any = any || carries;
    }
    free(b64);
    char *newest = strndup(m->pem[CA_CRT] + cas[n - 1].start, cas[n - 1].len);
    if (st == GG_OK && all && any && newest) {
        if (!k->confirmed_ca || strcmp(k->confirmed_ca, newest) != 0) {
            free(k->confirmed_ca);
            k->confirmed_ca = newest;
            k->confirmed_us = gg_now_us();
            newest = NULL;
        }
    } else {
        free(k->confirmed_ca);
        k->confirmed_ca = NULL;
    }
    free(newest);
    return st;
}

enum round { ROUND_DONE, ROUND_LOST, ROUND_FAILED };

/* What a round's plan made, once the Secret holds it. */
static void log_made(const struct certkeeper *k, const struct material *m)
{
    if (m->new_ca)
        log_fields(LOG_INFO, "certificates: new CA", json_pack("{s:s}", "secret", k->secret));
    if (m->leaf_why)
        log_fields(LOG_INFO, "certificates: new serving certificate",
                   json_pack("{s:s,s:s}", "secret", k->secret, "why", m->leaf_why));
}

static enum round run_round(struct certkeeper *k, struct gg_err *err)
{
    char path[512], what[384];
    snprintf(path, sizeof(path), "/api/v1/namespaces/%s/secrets/%s", k->ns, k->secret);
    snprintf(what, sizeof(what), "Secret %s/%s", k->ns, k->secret);
    struct kc_request rq = request(k, path, what);
    struct material m = {.new_ca = false};
    json_t *secret = NULL;
    long status;
    bool changed = false;
    enum gg_status st = kc_json(k->kc, &rq, "GET", NULL, &secret, &status, err);
    if (status == 404)
        gg_fail(err, GG_ERR_INVALID,
                "Secret %s/%s not found: the manifests ship it empty, and gpuguard does not "
                "create Secrets",
                k->ns, k->secret);
    if (st == GG_OK && (st = read_material(secret, &m, err)) == GG_OK &&
        (st = plan(k, &m, &changed, err)) == GG_OK && changed &&
        (st = write_material(k, secret, &m, &status, err)) == GG_OK)
        log_made(k, &m);
    enum round r = st == GG_OK ? ROUND_DONE : status == 409 ? ROUND_LOST : ROUND_FAILED;
    k->last_status = status;
    if (r == ROUND_DONE && serve(k, &m, err) != GG_OK)
        r = ROUND_FAILED;
    if (r == ROUND_DONE && (st = inject_all(k, &m, err)) != GG_OK)
        r = st == GG_ERR_EXISTS ? ROUND_LOST : ROUND_FAILED;
    material_clear(&m);
    wipe_data(secret);
    json_decref(secret);
    return r;
}

/* A round with certificates from files: failurePolicy only, once the bundles trust them. */
static enum round policy_round(struct certkeeper *k, struct gg_err *err)
{
    char *pem = NULL;
    size_t len;
    enum gg_status st = gg_read_file(k->cert_file, CERTS_MAX_PEM_SIZE, &pem, &len, err);
    for (int i = 0; st == GG_OK && i < N_CONFIGS; i++) {
        bool carries;
        st = inject(k, i, NULL, 0, pem, &carries, err);
    }
    free(pem);
    return st == GG_OK ? ROUND_DONE : st == GG_ERR_EXISTS ? ROUND_LOST : ROUND_FAILED;
}

/* A failed round is logged when its message differs from the last one's. */
static void note_problem(struct certkeeper *k, enum round r, const struct gg_err *err)
{
    if (r == ROUND_FAILED && strcmp(k->last_problem, err->msg) != 0) {
        log_fields(LOG_WARN,
                   "certificates: round failed; the certificate serving, if any, keeps serving",
                   json_pack("{s:s}", "error", err->msg));
        snprintf(k->last_problem, sizeof(k->last_problem), "%s", err->msg);
    } else if (r == ROUND_DONE) {
        k->last_problem[0] = '\0';
    }
}

/* Wait up to ms, less when woken; false when stopping. */
static bool pause_ms(struct certkeeper *k, int64_t ms)
{
    struct timespec until = gg_timespec_in_ms(ms);
    pthread_mutex_lock(&k->lock);
    while (!atomic_load(&k->stop) && !k->wake &&
           pthread_cond_timedwait(&k->cond, &k->lock, &until) == 0)
        ;
    k->wake = false;
    pthread_mutex_unlock(&k->lock);
    return !atomic_load(&k->stop);
}

static void *keeper_main(void *arg)
{
    struct certkeeper *k = arg;
    int64_t wait_ms = k->check_ms;
    while (pause_ms(k, wait_ms)) {
        struct gg_err err = {{0}};
        enum round r = k->cert_file ? policy_round(k, &err) : run_round(k, &err);
        note_problem(k, r, &err);
        wait_ms = r == ROUND_LOST ? LOST_RETRY_MS : k->check_ms;
    }
    return NULL;
}

static enum gg_status check_options(const struct certkeeper_options *o, struct gg_err *err)
{
    enum gg_status st;
    if (!o->webhooks || !gg_dns_subdomain(o->webhooks))
        return gg_fail(err, GG_ERR_INVALID, "--webhook-configuration: '%s' is not an object name",
                       o->webhooks ? o->webhooks : "");
    if (strcmp(o->failure_policy, "Fail") != 0 && strcmp(o->failure_policy, "Ignore") != 0)
        return gg_fail(err, GG_ERR_INVALID, "--webhook-failure-policy: Fail or Ignore, not '%s'",
                       o->failure_policy);
    if (o->cert_file)
        return o->check_ms >= 100
                   ? GG_OK
                   : gg_fail(err, GG_ERR_INVALID, "--cert-check must be at least 100ms");
    if ((st = certs_check_namespace(o->ns, err)) != GG_OK ||
        (st = certs_check_service(o->service, err)) != GG_OK)
        return st;
    if (!o->secret || !gg_dns_subdomain(o->secret))
        return gg_fail(err, GG_ERR_INVALID, "--tls-secret: '%s' is not a Secret name",
                       o->secret ? o->secret : "");
    if (o->ca_lifetime_s < CK_MIN_LIFETIME_S || o->cert_lifetime_s < CK_MIN_LIFETIME_S)
        return gg_fail(err, GG_ERR_INVALID, "certificate lifetimes must be at least %d s",
                       CK_MIN_LIFETIME_S);
    /* A renewal takes a few rounds and the confirmation's wait within the last third. */
    int64_t shorter_s =
        o->ca_lifetime_s < o->cert_lifetime_s ? o->ca_lifetime_s : o->cert_lifetime_s;
    if (o->check_ms < 100 || o->check_ms * 12 > shorter_s * 1000)
        return gg_fail(err, GG_ERR_INVALID,
                       "--cert-check must be at least 100ms and at most a twelfth of the shorter "
                       "of --ca-validity and --cert-validity (a renewal needs several rounds)");
    return GG_OK;
}

enum gg_status certkeeper_start(struct kc_client *c, const struct certkeeper_options *o,
                                struct certkeeper **out, struct gg_err *err)
{
    enum gg_status st = check_options(o, err);
    struct certkeeper *k = st == GG_OK ? calloc(1, sizeof(*k)) : NULL;
    if (st != GG_OK) {
        kc_free(c);
        return st;
    }
    if (!k) {
        kc_free(c);
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    k->kc = c;
    k->cert_file = o->cert_file;
    snprintf(k->ns, sizeof(k->ns), "%s", o->ns ? o->ns : "");
    snprintf(k->secret, sizeof(k->secret), "%s", o->secret ? o->secret : "");
    snprintf(k->service, sizeof(k->service), "%s", o->service ? o->service : "");
    snprintf(k->webhooks, sizeof(k->webhooks), "%s", o->webhooks);
    snprintf(k->policy, sizeof(k->policy), "%s", o->failure_policy);
    k->ca_lifetime_s = o->ca_lifetime_s;
    k->cert_lifetime_s = o->cert_lifetime_s;
    k->check_ms = o->check_ms;
    pthread_mutex_init(&k->lock, NULL);
    kc_cond_init(&k->cond);
    int64_t deadline = gg_now_us() + (int64_t)CK_START_MS * 1000;
    enum round r = ROUND_FAILED;
    while (!k->cert_file && !k->loaded && gg_now_us() < deadline) {
        r = run_round(k, err);
        note_problem(k, r, err);
        /* No Secret, or no right to it: waiting will not help (an API server starting will). */
        if (r == ROUND_FAILED && (k->last_status == 403 || k->last_status == 404))
            break;
        if (!k->loaded)
            pause_ms(k, r == ROUND_LOST ? LOST_RETRY_MS : START_RETRY_MS);
    }
    if (!k->cert_file && !k->loaded) {
        certkeeper_stop(k);
        if (r == ROUND_FAILED && (k->last_status == 403 || k->last_status == 404))
            return GG_ERR_INVALID;
        char last[sizeof(err->msg)];
        snprintf(last, sizeof(last), "%s", err->msg[0] ? err->msg : "no answer");
        return gg_fail(err, GG_ERR_TIMEOUT, "no certificate to serve after %d s; last: %.300s",
                       CK_START_MS / 1000, last);
    }
    if (pthread_create(&k->thread, NULL, keeper_main, k) != 0) {
        certkeeper_stop(k);
        return gg_fail(err, GG_ERR_NOMEM, "cannot start the certificate thread");
    }
    k->started = true;
    *out = k;
    return GG_OK;
}

void certkeeper_serving(struct certkeeper *k)
{
    if (!k)
        return;
    atomic_store(&k->serving, true);
    pthread_mutex_lock(&k->lock);
    k->wake = true; /* write the webhook configurations now, not a period later */
    pthread_cond_signal(&k->cond);
    pthread_mutex_unlock(&k->lock);
}

void certkeeper_stop(struct certkeeper *k)
{
    if (!k)
        return;
    atomic_store(&k->stop, true);
    pthread_mutex_lock(&k->lock);
    pthread_cond_broadcast(&k->cond);
    pthread_mutex_unlock(&k->lock);
    if (k->started)
        pthread_join(k->thread, NULL);
    kc_free(k->kc);
    free(k->loaded);
    free(k->confirmed_ca);
    pthread_cond_destroy(&k->cond);
    pthread_mutex_destroy(&k->lock);
    free(k);
}
