/*
 * test_certs.c - cmocka tests for certs.c: generated CA and serving
 * certificates (key types, SANs, validity, CA flags, chain verification),
 * safe writing, and every certs_load_pair failure.  Each test that touches
 * files gets its own mkdtemp directory, removed in teardown.
 */
#include "http/certs.h"
#include "tmptree.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_SANS 8
#define DAY 86400
/* 2026-01-01T00:00:00Z: a fixed clock for exact validity checks. */
#define FIXED_NOW ((time_t)1767225600)

struct fixture {
    char dir[64];
};

static int setup(void **state)
{
    struct fixture *fx = calloc(1, sizeof(*fx));

    if (!fx)
        return -1;
    strcpy(fx->dir, "/tmp/test_certs.XXXXXX");
    if (!mkdtemp(fx->dir)) {
        free(fx);
        return -1;
    }
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *fx = *state;
    int rc = tmptree_remove(fx->dir);

    free(fx);
    return rc;
}

/* ---- helpers ---- */

static struct certs_opts make_opts(const char *service, const char *ns, enum certs_key_type type,
                                   bool dev)
{
    struct certs_opts opts;

    certs_opts_init(&opts);
    opts.service = service;
    opts.ns = ns;
    opts.key_type = type;
    opts.dev = dev;
    return opts;
}

static void generate(const struct certs_opts *opts, struct certs_bundle *b)
{
    struct gg_err err = {{0}};
    enum gg_status st = certs_generate(opts, b, &err);

    if (st != GG_OK)
        fail_msg("certs_generate: %s", err.msg);
}

static X509 *pem_cert(const char *pem)
{
    BIO *bio = BIO_new_mem_buf(pem, -1);
    X509 *cert = PEM_read_bio_X509(bio, NULL, NULL, NULL);

    BIO_free(bio);
    assert_non_null(cert);
    return cert;
}

static EVP_PKEY *pem_key(const char *pem)
{
    BIO *bio = BIO_new_mem_buf(pem, -1);
    EVP_PKEY *key = PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL);

    BIO_free(bio);
    assert_non_null(key);
    return key;
}

static void path_in(const struct fixture *fx, const char *name, char out[PATH_MAX])
{
    snprintf(out, PATH_MAX, "%s/%s", fx->dir, name);
}

static void write_bytes(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");

    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void write_str(const char *path, const char *text)
{
    write_bytes(path, text, strlen(text));
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = calloc(1, 65536);
    size_t n;

    assert_non_null(f);
    assert_non_null(buf);
    n = fread(buf, 1, 65535, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static mode_t file_mode(const char *path)
{
    struct stat sb;

    assert_int_equal(stat(path, &sb), 0);
    return sb.st_mode & 07777;
}

/* SAN entries as "DNS:name" / "IP:a.b.c.d", in certificate order. */
static size_t get_sans(X509 *cert, char out[MAX_SANS][256])
{
    GENERAL_NAMES *names = X509_get_ext_d2i(cert, NID_subject_alt_name, NULL, NULL);
    size_t n = 0;

    assert_non_null(names);
    for (int i = 0; i < sk_GENERAL_NAME_num(names) && n < MAX_SANS; i++) {
        const GENERAL_NAME *gn = sk_GENERAL_NAME_value(names, i);
        if (gn->type == GEN_DNS) {
            snprintf(out[n++], 256, "DNS:%s", (const char *)ASN1_STRING_get0_data(gn->d.dNSName));
        } else if (gn->type == GEN_IPADD && ASN1_STRING_length(gn->d.iPAddress) == 4) {
            const unsigned char *ip = ASN1_STRING_get0_data(gn->d.iPAddress);
            snprintf(out[n++], 256, "IP:%u.%u.%u.%u", ip[0], ip[1], ip[2], ip[3]);
        } else {
            snprintf(out[n++], 256, "other:%d", gn->type);
        }
    }
    GENERAL_NAMES_free(names);
    return n;
}

static void assert_sans(X509 *cert, const char *const *want, size_t n_want)
{
    char got[MAX_SANS][256];
    size_t n = get_sans(cert, got);

    assert_int_equal(n, n_want);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(got[i], want[i]);
}

static void assert_cn(X509 *cert, const char *want)
{
    char cn[256];

    assert_true(
        X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn)) > 0);
    assert_string_equal(cn, want);
}

static int ext_critical(X509 *cert, int nid)
{
    int i = X509_get_ext_by_NID(cert, nid, -1);

    assert_true(i >= 0);
    return X509_EXTENSION_get_critical(X509_get_ext(cert, i));
}

/*
 * Verify leaf against ca as a TLS server certificate, optionally for a host
 * name or IP and at a given time; returns the X509_V_* result.
 */
static int verify_leaf(X509 *ca, X509 *leaf, const char *host, const char *ip, time_t at)
{
    X509_STORE *store = X509_STORE_new();
    X509_STORE_CTX *ctx = X509_STORE_CTX_new();
    X509_VERIFY_PARAM *param;
    int rc;

    assert_non_null(store);
    assert_non_null(ctx);
    assert_int_equal(X509_STORE_add_cert(store, ca), 1);
    assert_int_equal(X509_STORE_CTX_init(ctx, store, leaf, NULL), 1);
    assert_int_equal(X509_STORE_CTX_set_purpose(ctx, X509_PURPOSE_SSL_SERVER), 1);
    param = X509_STORE_CTX_get0_param(ctx);
    if (host)
        assert_int_equal(X509_VERIFY_PARAM_set1_host(param, host, 0), 1);
    if (ip)
        assert_int_equal(X509_VERIFY_PARAM_set1_ip_asc(param, ip), 1);
    if (at)
        X509_VERIFY_PARAM_set_time(param, at);
    rc = X509_verify_cert(ctx) == 1 ? X509_V_OK : X509_STORE_CTX_get_error(ctx);
    X509_STORE_CTX_free(ctx);
    X509_STORE_free(store);
    return rc;
}

/* ---- generation ---- */

static void test_generate_ecdsa(void **state)
{
    static const char *const want[] = {
        "DNS:gpuguard",
        "DNS:gpuguard.gpuguard-system",
        "DNS:gpuguard.gpuguard-system.svc",
        "DNS:gpuguard.gpuguard-system.svc.cluster.local",
    };
    struct certs_opts opts = make_opts("gpuguard", "gpuguard-system", CERTS_KEY_ECDSA, false);
    struct certs_bundle b = {0};
    X509 *leaf, *ca;
    EVP_PKEY *key;
    char group[64];
    BASIC_CONSTRAINTS *bc;
    (void)state;

    generate(&opts, &b);
    leaf = pem_cert(b.cert_pem);
    ca = pem_cert(b.ca_pem);
    key = pem_key(b.key_pem);

    assert_sans(leaf, want, sizeof(want) / sizeof(want[0]));
    assert_cn(leaf, "gpuguard.gpuguard-system.svc");
    assert_int_equal(EVP_PKEY_get_base_id(key), EVP_PKEY_EC);
    assert_int_equal(EVP_PKEY_get_group_name(key, group, sizeof(group), NULL), 1);
    assert_string_equal(group, "prime256v1");
    assert_int_equal(EVP_PKEY_get_base_id(X509_get0_pubkey(ca)), EVP_PKEY_EC);
    assert_int_equal(X509_get_signature_nid(leaf), NID_ecdsa_with_SHA256);
    assert_int_equal(X509_get_signature_nid(ca), NID_ecdsa_with_SHA256);
    assert_int_equal(X509_check_private_key(leaf, key), 1);
    assert_int_equal(X509_get_version(leaf), X509_VERSION_3);

    /* keyUsage: digitalSignature only for ECDSA; EKU serverAuth only. */
    assert_int_equal(X509_get_key_usage(leaf), KU_DIGITAL_SIGNATURE);
    assert_int_equal(ext_critical(leaf, NID_key_usage), 1);
    assert_int_equal(X509_get_extended_key_usage(leaf), XKU_SSL_SERVER);
    bc = X509_get_ext_d2i(leaf, NID_basic_constraints, NULL, NULL);
    assert_non_null(bc);
    assert_false(bc->ca);
    BASIC_CONSTRAINTS_free(bc);
    assert_int_equal(X509_check_ca(leaf), 0);
    assert_int_equal(verify_leaf(ca, leaf, NULL, "127.0.0.1", 0), X509_V_ERR_IP_ADDRESS_MISMATCH);

    EVP_PKEY_free(key);
    X509_free(ca);
    X509_free(leaf);
    certs_bundle_clear(&b);
}

static void test_generate_dev_sans(void **state)
{
    static const char *const want[] = {
        "DNS:gpuguard",         "DNS:gpuguard.dev",
        "DNS:gpuguard.dev.svc", "DNS:gpuguard.dev.svc.cluster.local",
        "DNS:localhost",        "IP:127.0.0.1",
    };
    struct certs_opts opts = make_opts("gpuguard", "dev", CERTS_KEY_ECDSA, true);
    struct certs_bundle b = {0};
    X509 *leaf, *ca;
    (void)state;

    generate(&opts, &b);
    leaf = pem_cert(b.cert_pem);
    ca = pem_cert(b.ca_pem);
    assert_sans(leaf, want, sizeof(want) / sizeof(want[0]));
    assert_int_equal(verify_leaf(ca, leaf, "localhost", NULL, 0), X509_V_OK);
    assert_int_equal(verify_leaf(ca, leaf, NULL, "127.0.0.1", 0), X509_V_OK);
    X509_free(ca);
    X509_free(leaf);
    certs_bundle_clear(&b);
}

static void test_generate_rsa(void **state)
{
    struct certs_opts opts = make_opts("hook", "kube-system", CERTS_KEY_RSA, false);
    struct certs_bundle b = {0};
    X509 *leaf, *ca;
    EVP_PKEY *key;
    (void)state;

    generate(&opts, &b);
    leaf = pem_cert(b.cert_pem);
    ca = pem_cert(b.ca_pem);
    key = pem_key(b.key_pem);
    assert_int_equal(EVP_PKEY_get_base_id(key), EVP_PKEY_RSA);
    assert_int_equal(EVP_PKEY_get_bits(key), CERTS_RSA_BITS);
    assert_int_equal(EVP_PKEY_get_base_id(X509_get0_pubkey(ca)), EVP_PKEY_RSA);
    assert_int_equal(X509_get_signature_nid(leaf), NID_sha256WithRSAEncryption);
    assert_int_equal(X509_get_signature_nid(ca), NID_sha256WithRSAEncryption);
    assert_int_equal(X509_get_key_usage(leaf), KU_DIGITAL_SIGNATURE | KU_KEY_ENCIPHERMENT);
    assert_int_equal(X509_get_extended_key_usage(leaf), XKU_SSL_SERVER);
    assert_int_equal(X509_check_private_key(leaf, key), 1);
    assert_int_equal(verify_leaf(ca, leaf, "hook.kube-system.svc", NULL, 0), X509_V_OK);
    EVP_PKEY_free(key);
    X509_free(ca);
    X509_free(leaf);
    certs_bundle_clear(&b);
}

static void test_ca_flags(void **state)
{
    struct certs_opts opts = make_opts("gpuguard", "gpuguard-system", CERTS_KEY_ECDSA, false);
    struct certs_bundle b = {0};
    BASIC_CONSTRAINTS *bc;
    X509 *ca;
    (void)state;

    generate(&opts, &b);
    ca = pem_cert(b.ca_pem);
    bc = X509_get_ext_d2i(ca, NID_basic_constraints, NULL, NULL);
    assert_non_null(bc);
    assert_true(bc->ca);
    BASIC_CONSTRAINTS_free(bc);
    assert_int_equal(ext_critical(ca, NID_basic_constraints), 1);
    assert_int_equal(ext_critical(ca, NID_key_usage), 1);
    assert_int_equal(X509_get_key_usage(ca), KU_KEY_CERT_SIGN | KU_CRL_SIGN);
    assert_int_equal(X509_check_ca(ca), 1);
    /* Self-signed: issuer is subject and its own key verifies it. */
    assert_int_equal(X509_check_issued(ca, ca), X509_V_OK);
    assert_int_equal(X509_verify(ca, X509_get0_pubkey(ca)), 1);
    assert_int_equal(X509_get_signature_nid(ca), NID_ecdsa_with_SHA256);
    X509_free(ca);
    certs_bundle_clear(&b);
}

static void test_verify_chain(void **state)
{
    static const char *const hosts[] = {
        "gpuguard",
        "gpuguard.gpuguard-system",
        "gpuguard.gpuguard-system.svc",
        "gpuguard.gpuguard-system.svc.cluster.local",
    };
    struct certs_opts opts = make_opts("gpuguard", "gpuguard-system", CERTS_KEY_ECDSA, false);
    struct certs_bundle b = {0}, other = {0};
    X509 *leaf, *ca, *other_ca;
    (void)state;

    generate(&opts, &b);
    generate(&opts, &other);
    leaf = pem_cert(b.cert_pem);
    ca = pem_cert(b.ca_pem);
    other_ca = pem_cert(other.ca_pem);

    for (size_t i = 0; i < sizeof(hosts) / sizeof(hosts[0]); i++)
        assert_int_equal(verify_leaf(ca, leaf, hosts[i], NULL, 0), X509_V_OK);
    assert_int_equal(verify_leaf(ca, leaf, "localhost", NULL, 0), X509_V_ERR_HOSTNAME_MISMATCH);
    assert_int_equal(verify_leaf(ca, leaf, "gpuguard.other.svc", NULL, 0),
                     X509_V_ERR_HOSTNAME_MISMATCH);
    /* Same subject name, different key: the other CA must not verify it. */
    assert_int_not_equal(verify_leaf(other_ca, leaf, NULL, NULL, 0), X509_V_OK);
    assert_int_equal(verify_leaf(ca, leaf, NULL, NULL, b.not_after + DAY),
                     X509_V_ERR_CERT_HAS_EXPIRED);
    assert_int_equal(verify_leaf(ca, leaf, NULL, NULL, b.not_before - DAY),
                     X509_V_ERR_CERT_NOT_YET_VALID);

    X509_free(other_ca);
    X509_free(ca);
    X509_free(leaf);
    certs_bundle_clear(&other);
    certs_bundle_clear(&b);
}

static void test_validity(void **state)
{
    static const int days[] = {1, 30, CERTS_DEFAULT_DAYS, CERTS_MAX_DAYS};
    (void)state;

    for (size_t i = 0; i < sizeof(days) / sizeof(days[0]); i++) {
        struct certs_opts opts = make_opts("gpuguard", "ns", CERTS_KEY_ECDSA, false);
        struct certs_bundle b = {0};
        X509 *leaf, *ca;
        int pday, psec;

        opts.days = days[i];
        opts.now = FIXED_NOW;
        generate(&opts, &b);
        assert_int_equal(b.not_before, FIXED_NOW - CERTS_BACKDATE_SECONDS);
        assert_int_equal(b.not_after, FIXED_NOW + (time_t)days[i] * DAY);
        leaf = pem_cert(b.cert_pem);
        ca = pem_cert(b.ca_pem);
        /* The CA covers exactly the leaf's period. */
        assert_int_equal(
            ASN1_TIME_diff(&pday, &psec, X509_get0_notBefore(ca), X509_get0_notBefore(leaf)), 1);
        assert_int_equal(pday + psec, 0);
        assert_int_equal(
            ASN1_TIME_diff(&pday, &psec, X509_get0_notAfter(ca), X509_get0_notAfter(leaf)), 1);
        assert_int_equal(pday + psec, 0);
        assert_int_equal(
            ASN1_TIME_diff(&pday, &psec, X509_get0_notBefore(leaf), X509_get0_notAfter(leaf)), 1);
        assert_int_equal(pday, days[i]);
        assert_int_equal(psec, CERTS_BACKDATE_SECONDS);
        X509_free(ca);
        X509_free(leaf);
        certs_bundle_clear(&b);
    }
}

static void test_default_clock_backdates(void **state)
{
    struct certs_opts opts = make_opts("gpuguard", "ns", CERTS_KEY_ECDSA, false);
    struct certs_bundle b = {0};
    time_t before = time(NULL), after;
    (void)state;

    generate(&opts, &b);
    after = time(NULL);
    assert_true(b.not_before >= before - CERTS_BACKDATE_SECONDS);
    assert_true(b.not_before <= after - CERTS_BACKDATE_SECONDS);
    assert_true(b.not_after >= before + CERTS_DEFAULT_DAYS * DAY);
    assert_true(b.not_after <= after + CERTS_DEFAULT_DAYS * DAY);
    certs_bundle_clear(&b);
}

static void test_random_serials(void **state)
{
    struct certs_opts opts = make_opts("gpuguard", "ns", CERTS_KEY_ECDSA, false);
    struct certs_bundle b1 = {0}, b2 = {0};
    X509 *certs[4];
    BIGNUM *serials[4];
    (void)state;

    generate(&opts, &b1);
    generate(&opts, &b2);
    certs[0] = pem_cert(b1.ca_pem);
    certs[1] = pem_cert(b1.cert_pem);
    certs[2] = pem_cert(b2.ca_pem);
    certs[3] = pem_cert(b2.cert_pem);
    for (int i = 0; i < 4; i++) {
        serials[i] = ASN1_INTEGER_to_BN(X509_get0_serialNumber(certs[i]), NULL);
        assert_non_null(serials[i]);
        assert_false(BN_is_negative(serials[i]));
        assert_true(BN_num_bits(serials[i]) <= 128);
        /* 2^-64 odds of a false failure: the serial is random, not a counter. */
        assert_true(BN_num_bits(serials[i]) > 64);
        for (int j = 0; j < i; j++)
            assert_int_not_equal(BN_cmp(serials[i], serials[j]), 0);
    }
    for (int i = 0; i < 4; i++) {
        BN_free(serials[i]);
        X509_free(certs[i]);
    }
    certs_bundle_clear(&b1);
    certs_bundle_clear(&b2);
}

static void test_long_names_cn_fallback(void **state)
{
    char service[64], ns[64], host[200], cn_host[140];
    struct certs_opts opts;
    struct certs_bundle b = {0};
    X509 *leaf, *ca;
    (void)state;

    memset(service, 's', 63);
    service[63] = '\0';
    memset(ns, 'n', 63);
    ns[63] = '\0';
    opts = make_opts(service, ns, CERTS_KEY_ECDSA, false);
    generate(&opts, &b);
    leaf = pem_cert(b.cert_pem);
    ca = pem_cert(b.ca_pem);
    /* NAME.NS.svc is 131 bytes, over the 64-byte CN limit: CN falls back to NAME. */
    assert_cn(leaf, service);
    snprintf(cn_host, sizeof(cn_host), "%s.%s.svc", service, ns);
    snprintf(host, sizeof(host), "%s.%s.svc.cluster.local", service, ns);
    assert_int_equal(verify_leaf(ca, leaf, cn_host, NULL, 0), X509_V_OK);
    assert_int_equal(verify_leaf(ca, leaf, host, NULL, 0), X509_V_OK);
    X509_free(ca);
    X509_free(leaf);
    certs_bundle_clear(&b);
}

static void test_generate_invalid(void **state)
{
    static const struct {
        const char *service, *ns;
        int days, key_type;
        const char *msg;
    } cases[] = {
        {NULL, "ns", 365, CERTS_KEY_ECDSA, "service name"},
        {"", "ns", 365, CERTS_KEY_ECDSA, "service name"},
        {"Gpuguard", "ns", 365, CERTS_KEY_ECDSA, "service name"},
        {"1guard", "ns", 365, CERTS_KEY_ECDSA, "DNS-1035"},
        {"gpu_guard", "ns", 365, CERTS_KEY_ECDSA, "service name"},
        {"gpuguard-", "ns", 365, CERTS_KEY_ECDSA, "service name"},
        {"a.b", "ns", 365, CERTS_KEY_ECDSA, "service name"},
        {"a,DNS:evil.com", "ns", 365, CERTS_KEY_ECDSA, "service name"},
        {"gpuguard", NULL, 365, CERTS_KEY_ECDSA, "namespace"},
        {"gpuguard", "", 365, CERTS_KEY_ECDSA, "namespace"},
        {"gpuguard", "-ns", 365, CERTS_KEY_ECDSA, "DNS-1123"},
        {"gpuguard", "Kube", 365, CERTS_KEY_ECDSA, "namespace"},
        {"gpuguard", "ns", 0, CERTS_KEY_ECDSA, "1..3650"},
        {"gpuguard", "ns", -5, CERTS_KEY_ECDSA, "1..3650"},
        {"gpuguard", "ns", CERTS_MAX_DAYS + 1, CERTS_KEY_ECDSA, "1..3650"},
        {"gpuguard", "ns", 365, 7, "key type"},
    };
    char long_label[65];
    (void)state;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct certs_opts opts = make_opts(cases[i].service, cases[i].ns, CERTS_KEY_ECDSA, false);
        struct certs_bundle b = {.ca_pem = (char *)"untouched"};
        struct gg_err err = {{0}};

        opts.days = cases[i].days;
        opts.key_type = (enum certs_key_type)cases[i].key_type;
        assert_int_equal(certs_generate(&opts, &b, &err), GG_ERR_INVALID);
        assert_non_null(strstr(err.msg, cases[i].msg));
        assert_string_equal(b.ca_pem, "untouched");
        assert_null(b.cert_pem);
    }
    /* 64 characters is one over the DNS label limit; 63 is fine. */
    memset(long_label, 'a', 64);
    long_label[64] = '\0';
    assert_int_equal(certs_check_service(long_label, NULL), GG_ERR_INVALID);
    assert_int_equal(certs_check_namespace(long_label, NULL), GG_ERR_INVALID);
    long_label[63] = '\0';
    assert_int_equal(certs_check_service(long_label, NULL), GG_OK);
    assert_int_equal(certs_check_namespace(long_label, NULL), GG_OK);
    assert_int_equal(certs_check_namespace("1ns", NULL), GG_OK);
    assert_int_equal(certs_check_service("1ns", NULL), GG_ERR_INVALID);
}

static void test_key_type_names(void **state)
{
    (void)state;
    assert_int_equal(certs_key_type_parse("ecdsa"), CERTS_KEY_ECDSA);
    assert_int_equal(certs_key_type_parse("rsa"), CERTS_KEY_RSA);
    assert_int_equal(certs_key_type_parse("RSA"), -1);
    assert_int_equal(certs_key_type_parse("ed25519"), -1);
    assert_int_equal(certs_key_type_parse(NULL), -1);
    assert_string_equal(certs_key_type_name(CERTS_KEY_ECDSA), "ecdsa");
    assert_string_equal(certs_key_type_name(CERTS_KEY_RSA), "rsa");
}

static void test_ca_bundle(void **state)
{
    struct certs_opts opts = make_opts("gpuguard", "ns", CERTS_KEY_ECDSA, false);
    struct certs_bundle b = {0};
    struct gg_err err = {{0}};
    unsigned char *decoded;
    char *b64 = NULL;
    size_t len;
    int n;
    (void)state;

    generate(&opts, &b);
    assert_int_equal(certs_ca_bundle(&b, &b64, &err), GG_OK);
    assert_null(strchr(b64, '\n'));
    len = strlen(b64);
    decoded = calloc(1, len);
    assert_non_null(decoded);
    n = EVP_DecodeBlock(decoded, (const unsigned char *)b64, (int)len);
    /* EVP_DecodeBlock counts '=' padding as zero bytes. */
    assert_true(n >= (int)strlen(b.ca_pem));
    assert_memory_equal(decoded, b.ca_pem, strlen(b.ca_pem));
    free(decoded);
    free(b64);
    assert_int_equal(certs_ca_bundle(NULL, &b64, &err), GG_ERR_INVALID);
    certs_bundle_clear(&b);
}

static void test_clear_null_safe(void **state)
{
    struct certs_bundle b = {0};
    struct certs_pair p = {0};
    (void)state;

    certs_bundle_clear(NULL);
    certs_pair_clear(NULL);
    certs_bundle_clear(&b);
    certs_pair_clear(&p);
    /* Clearing twice is fine: clear leaves the struct zeroed. */
    certs_bundle_clear(&b);
    certs_pair_clear(&p);
}

/* ---- writing and loading ---- */

static void test_write_and_load(void **state)
{
    struct fixture *fx = *state;
    struct certs_opts opts = make_opts("gpuguard", "gpuguard-system", CERTS_KEY_ECDSA, true);
    struct certs_bundle b = {0};
    struct certs_pair p = {0};
    struct gg_err err = {{0}};
    char dir[PATH_MAX], ca_path[PATH_MAX], cert_path[PATH_MAX], key_path[PATH_MAX];
    char *text;
    X509 *leaf;
    BIGNUM *serial;
    char *hex;
    mode_t mask = umask(022);

    generate(&opts, &b);
    /* Missing parents are created too. */
    path_in(fx, "a/b", dir);
    assert_int_equal(certs_write(&b, dir, false, &err), GG_OK);
    assert_int_equal(file_mode(dir), 0755);
    path_in(fx, "a/b/" CERTS_CA_FILE, ca_path);
    path_in(fx, "a/b/" CERTS_CERT_FILE, cert_path);
    path_in(fx, "a/b/" CERTS_KEY_FILE, key_path);
    assert_int_equal(file_mode(key_path), 0600);
    assert_int_equal(file_mode(cert_path), 0644);
    assert_int_equal(file_mode(ca_path), 0644);
    text = read_text(ca_path);
    assert_string_equal(text, b.ca_pem);
    free(text);

    assert_int_equal(certs_load_pair(cert_path, key_path, &p, &err), GG_OK);
    assert_string_equal(p.cert_pem, b.cert_pem);
    assert_string_equal(p.key_pem, b.key_pem);
    assert_int_equal(p.cert_len, strlen(b.cert_pem));
    assert_int_equal(p.key_len, strlen(b.key_pem));
    assert_int_equal(p.not_after, b.not_after);
    assert_int_equal(p.not_before, b.not_before);
    leaf = pem_cert(b.cert_pem);
    serial = ASN1_INTEGER_to_BN(X509_get0_serialNumber(leaf), NULL);
    hex = BN_bn2hex(serial);
    assert_string_equal(p.serial_hex, hex);
    OPENSSL_free(hex);
    BN_free(serial);
    X509_free(leaf);
    certs_pair_clear(&p);
    assert_null(p.cert_pem);
    assert_null(p.serial_hex);

    /* An RSA pair loads too. */
    certs_bundle_clear(&b);
    opts.key_type = CERTS_KEY_RSA;
    generate(&opts, &b);
    path_in(fx, "rsa", dir);
    assert_int_equal(certs_write(&b, dir, false, &err), GG_OK);
    path_in(fx, "rsa/" CERTS_CERT_FILE, cert_path);
    path_in(fx, "rsa/" CERTS_KEY_FILE, key_path);
    assert_int_equal(certs_load_pair(cert_path, key_path, &p, &err), GG_OK);
    certs_pair_clear(&p);
    certs_bundle_clear(&b);
    umask(mask);
}

/* Names in dir that start with '.', other than . and .. (leftover temporaries). */
static int count_hidden(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;

    assert_non_null(d);
    while ((e = readdir(d)))
        if (e->d_name[0] == '.' && strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

static void test_write_refuses_existing(void **state)
{
    struct fixture *fx = *state;
    struct certs_opts opts = make_opts("gpuguard", "ns", CERTS_KEY_ECDSA, false);
    struct certs_bundle b = {0};
    struct gg_err err = {{0}};
    char ca_path[PATH_MAX], cert_path[PATH_MAX], key_path[PATH_MAX];
    char *text;

    generate(&opts, &b);
    path_in(fx, CERTS_CA_FILE, ca_path);
    path_in(fx, CERTS_CERT_FILE, cert_path);
    path_in(fx, CERTS_KEY_FILE, key_path);
    write_str(key_path, "keep me\n");
    assert_int_equal(chmod(key_path, 0644), 0);

    assert_int_equal(certs_write(&b, fx->dir, false, &err), GG_ERR_EXISTS);
    assert_non_null(strstr(err.msg, key_path));
    assert_int_equal(access(ca_path, F_OK), -1);
    assert_int_equal(access(cert_path, F_OK), -1);
    text = read_text(key_path);
    assert_string_equal(text, "keep me\n");
    free(text);
    assert_int_equal(count_hidden(fx->dir), 0);

    /* A dangling symlink is an existing name too. */
    assert_int_equal(symlink("/nonexistent/target", cert_path), 0);
    assert_int_equal(unlink(key_path), 0);
    assert_int_equal(certs_write(&b, fx->dir, false, &err), GG_ERR_EXISTS);
    assert_non_null(strstr(err.msg, cert_path));
    assert_int_equal(access(key_path, F_OK), -1);
    write_str(key_path, "keep me\n");
    assert_int_equal(chmod(key_path, 0644), 0);

    /* --force replaces everything, and the key ends up 0600 again. */
    assert_int_equal(certs_write(&b, fx->dir, true, &err), GG_OK);
    text = read_text(key_path);
    assert_string_equal(text, b.key_pem);
    free(text);
    text = read_text(cert_path);
    assert_string_equal(text, b.cert_pem);
    free(text);
    assert_int_equal(file_mode(key_path), 0600);
    assert_int_equal(count_hidden(fx->dir), 0);
    certs_bundle_clear(&b);
}

static void test_write_failure_cleans_up(void **state)
{
    struct fixture *fx = *state;
    struct certs_opts opts = make_opts("gpuguard", "ns", CERTS_KEY_ECDSA, false);
    struct certs_bundle b = {0};
    struct gg_err err = {{0}};
    char path[PATH_MAX];

    generate(&opts, &b);
    /* tls.crt is a non-empty directory: the final rename fails. */
    path_in(fx, CERTS_CERT_FILE, path);
    assert_int_equal(mkdir(path, 0755), 0);
    path_in(fx, "tls.crt/x", path);
    write_bytes(path, "x", 1);
    assert_int_equal(certs_write(&b, fx->dir, true, &err), GG_ERR_IO);
    assert_non_null(strstr(err.msg, CERTS_CERT_FILE));
    assert_int_equal(count_hidden(fx->dir), 0);

    /* The output path is a regular file. */
    path_in(fx, "file", path);
    write_bytes(path, "x", 1);
    assert_int_equal(certs_write(&b, path, false, &err), GG_ERR_IO);
    assert_non_null(strstr(err.msg, "not a directory"));
    assert_int_equal(certs_write(NULL, fx->dir, false, &err), GG_ERR_INVALID);
    certs_bundle_clear(&b);
}

/* certs_load_pair failures. */

enum load_case {
    LC_MISSING_CERT,
    LC_MISSING_KEY,
    LC_EMPTY_CERT,
    LC_EMPTY_KEY,
    LC_GARBAGE_CERT,
    LC_GARBAGE_KEY,
    LC_SWAPPED,
    LC_MISMATCH,
    LC_EXPIRED,
    LC_NOT_YET_VALID,
    LC_TOO_BIG,
    LC_DIRECTORY,
    LC_ENCRYPTED_KEY,
};

static const struct {
    enum load_case id;
    const char *name;
    enum gg_status status;
    const char *msg;
    bool names_key; /* the message names the key file (else the cert file) */
} load_cases[] = {
    {LC_MISSING_CERT, "missing cert", GG_ERR_IO, "cannot open", false},
    {LC_MISSING_KEY, "missing key", GG_ERR_IO, "cannot open", true},
    {LC_EMPTY_CERT, "empty cert", GG_ERR_PARSE, "empty", false},
    {LC_EMPTY_KEY, "empty key", GG_ERR_PARSE, "empty", true},
    {LC_GARBAGE_CERT, "garbage cert", GG_ERR_PARSE, "no PEM certificate", false},
    {LC_GARBAGE_KEY, "garbage key", GG_ERR_PARSE, "no PEM private key", true},
    {LC_SWAPPED, "swapped files", GG_ERR_PARSE, "holds a private key", false},
    {LC_MISMATCH, "mismatched key", GG_ERR_TLS, "does not match", true},
    {LC_EXPIRED, "expired", GG_ERR_TLS, "expired at 2025-", false},
    {LC_NOT_YET_VALID, "not yet valid", GG_ERR_TLS, "not valid until", false},
    {LC_TOO_BIG, "too big", GG_ERR_TOOBIG, "larger than", false},
    {LC_DIRECTORY, "directory", GG_ERR_IO, "not a regular file", true},
    {LC_ENCRYPTED_KEY, "encrypted key", GG_ERR_PARSE, "encrypted", true},
};

/* Write a bundle's cert and key to <dir>/<tag>.crt and <dir>/<tag>.key. */
static void write_pair(const struct fixture *fx, const char *tag, const struct certs_bundle *b,
                       char cert[PATH_MAX], char key[PATH_MAX])
{
    char name[64];

    snprintf(name, sizeof(name), "%s.crt", tag);
    path_in(fx, name, cert);
    snprintf(name, sizeof(name), "%s.key", tag);
    path_in(fx, name, key);
    write_str(cert, b->cert_pem);
    write_str(key, b->key_pem);
}

static void test_load_failures(void **state)
{
    struct fixture *fx = *state;
    struct certs_opts opts = make_opts("gpuguard", "ns", CERTS_KEY_ECDSA, false);
    struct certs_bundle good = {0}, other = {0}, old = {0}, future = {0};
    char cert[PATH_MAX], key[PATH_MAX], path[PATH_MAX];
    const time_t now = time(NULL);

    generate(&opts, &good);
    generate(&opts, &other);
    /* A certificate that expired in 2025 and one that starts in ten days. */
    opts.now = (time_t)1735689600; /* 2025-01-01 */
    opts.days = 30;
    generate(&opts, &old);
    opts.now = now + 10 * DAY;
    generate(&opts, &future);

    for (size_t i = 0; i < sizeof(load_cases) / sizeof(load_cases[0]); i++) {
        struct certs_pair p = {.cert_pem = (char *)"untouched"};
        struct gg_err err = {{0}};
        char *big;
        EVP_PKEY *pkey;
        BIO *bio;
        enum gg_status st;

        write_pair(fx, "good", &good, cert, key);
        switch (load_cases[i].id) {
        case LC_MISSING_CERT:
            path_in(fx, "missing.crt", cert);
            break;
        case LC_MISSING_KEY:
            path_in(fx, "missing.key", key);
            break;
        case LC_EMPTY_CERT:
            write_bytes(cert, "", 0);
            break;
        case LC_EMPTY_KEY:
            write_bytes(key, "", 0);
            break;
        case LC_GARBAGE_CERT:
            write_str(cert, "\x01\x02 not a certificate\n");
            break;
        case LC_GARBAGE_KEY:
            write_str(key, "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n");
            break;
        case LC_SWAPPED:
            path_in(fx, "good.key", cert);
            path_in(fx, "good.crt", key);
            break;
        case LC_MISMATCH:
            write_str(key, other.key_pem);
            break;
        case LC_EXPIRED:
            write_pair(fx, "old", &old, cert, key);
            break;
        case LC_NOT_YET_VALID:
            write_pair(fx, "future", &future, cert, key);
            break;
        case LC_TOO_BIG:
            big = malloc(CERTS_MAX_PEM_SIZE + 1);
            assert_non_null(big);
            memset(big, '\n', CERTS_MAX_PEM_SIZE + 1);
            memcpy(big, good.cert_pem, strlen(good.cert_pem));
            write_bytes(cert, big, CERTS_MAX_PEM_SIZE + 1);
            free(big);
            break;
        case LC_DIRECTORY:
            path_in(fx, "a-directory", key);
            assert_int_equal(mkdir(key, 0755), 0);
            break;
        case LC_ENCRYPTED_KEY:
            pkey = pem_key(good.key_pem);
            bio = BIO_new_file(key, "w");
            assert_non_null(bio);
            assert_int_equal(PEM_write_bio_PrivateKey(bio, pkey, EVP_aes_256_cbc(),
                                                      (unsigned char *)"secret", 6, NULL, NULL),
                             1);
            BIO_free(bio);
            EVP_PKEY_free(pkey);
            break;
        }
        st = certs_load_pair(cert, key, &p, &err);
        if (st != load_cases[i].status || !strstr(err.msg, load_cases[i].msg) ||
            !strstr(err.msg, load_cases[i].names_key ? key : cert))
            fail_msg("case '%s': status %d, message '%s'", load_cases[i].name, (int)st, err.msg);
        /* Out-params are written only on success. */
        assert_string_equal(p.cert_pem, "untouched");
        assert_null(p.key_pem);
        assert_null(p.serial_hex);
        if (load_cases[i].id == LC_DIRECTORY)
            assert_int_equal(rmdir(key), 0);
    }
    /* The size bound is inclusive: a file of exactly the limit is read. */
    write_pair(fx, "good", &good, path, key);
    {
        char *buf = malloc(CERTS_MAX_PEM_SIZE);
        struct certs_pair p = {0};
        struct gg_err err = {{0}};

        assert_non_null(buf);
        memset(buf, '\n', CERTS_MAX_PEM_SIZE);
        memcpy(buf, good.cert_pem, strlen(good.cert_pem));
        write_bytes(path, buf, CERTS_MAX_PEM_SIZE);
        free(buf);
        assert_int_equal(certs_load_pair(path, key, &p, &err), GG_OK);
        assert_int_equal(p.cert_len, CERTS_MAX_PEM_SIZE);
        certs_pair_clear(&p);
    }
    certs_bundle_clear(&future);
    certs_bundle_clear(&old);
    certs_bundle_clear(&other);
    certs_bundle_clear(&good);
}

/* ---- issuing in memory (serve --tls-secret) ---- */

static void test_issue_in_memory(void **state)
{
    (void)state;
    struct gg_err err = {{0}};
    time_t now = time(NULL);
    struct certs_issue ca_is = {.key_type = CERTS_KEY_ECDSA, .now = now, .lifetime_s = 3600};
    struct certs_issue leaf_is = {.service = "gpuguard",
                                  .ns = "gpuguard-system",
                                  .key_type = CERTS_KEY_ECDSA,
                                  .now = now,
                                  .lifetime_s = 86400};
    char *ca = NULL, *ca_key = NULL, *cert = NULL, *key = NULL, *other = NULL, *other_key = NULL;

    assert_int_equal(certs_new_ca(&ca_is, &ca, &ca_key, &err), GG_OK);
    assert_int_equal(certs_new_leaf(&leaf_is, ca, ca_key, &cert, &key, &err), GG_OK);
    assert_true(certs_signed_by(cert, ca));
    assert_true(certs_key_matches(cert, key));
    assert_false(certs_key_matches(cert, ca_key));
    assert_true(certs_names_host(cert, "gpuguard.gpuguard-system.svc"));
    assert_false(certs_names_host(cert, "gpuguard.other.svc"));

    /* A serving certificate never outlives its CA: a day asked, the CA's hour given. */
    struct certs_info ca_info, leaf_info;
    assert_int_equal(certs_scan(ca, &ca_info, 1), 1);
    assert_int_equal(certs_scan(cert, &leaf_info, 1), 1);
    assert_int_equal(leaf_info.not_after, ca_info.not_after);
    assert_int_equal(ca_info.not_after, now + 3600);
    assert_int_equal(ca_info.not_before, now - CERTS_BACKDATE_SECONDS);

    /* Another CA's key signs nothing that verifies against this one. */
    assert_int_equal(certs_new_ca(&ca_is, &other, &other_key, &err), GG_OK);
    assert_false(certs_signed_by(cert, other));
    char *both = NULL;
    assert_true(asprintf(&both, "%s%s", other, ca) > 0);
    assert_true(certs_signed_by(cert, both)); /* its CA second in a bundle */
    free(both);
    char *bad_cert = NULL, *bad_key = NULL;
    assert_int_equal(certs_new_leaf(&leaf_is, ca, other_key, &bad_cert, &bad_key, &err),
                     GG_ERR_TLS);
    assert_string_equal(err.msg, "the CA certificate and key do not make a pair");
    assert_null(bad_cert);

    /* In-memory pairs are checked as files are. */
    struct certs_pair pair = {0};
    assert_int_equal(certs_check_pair("tls.crt", "tls.key", cert, key, &pair, &err), GG_OK);
    certs_pair_clear(&pair);
    assert_int_equal(certs_check_pair("tls.crt", "tls.key", cert, other_key, &pair, &err),
                     GG_ERR_TLS);
    assert_string_equal(err.msg, "tls.key: private key does not match certificate tls.crt");

    free(ca);
    free(cert);
    free(other);
    certs_free_secret(ca_key);
    certs_free_secret(key);
    certs_free_secret(other_key);
}

static void test_scan_bundles(void **state)
{
    (void)state;
    struct gg_err err = {{0}};
    struct certs_issue is = {.key_type = CERTS_KEY_ECDSA, .now = time(NULL), .lifetime_s = 60};
    char *a = NULL, *a_key = NULL, *b = NULL, *b_key = NULL, *two = NULL;
    assert_int_equal(certs_new_ca(&is, &a, &a_key, &err), GG_OK);
    assert_int_equal(certs_new_ca(&is, &b, &b_key, &err), GG_OK);
    assert_true(asprintf(&two, "%s%s", a, b) > 0);

    struct certs_info info[2];
    assert_int_equal(certs_scan(two, info, 2), 2);
    assert_int_equal(info[0].start, 0);
    assert_int_equal(info[0].len, strlen(a));
    assert_int_equal(info[1].start, strlen(a));
    assert_int_equal(info[1].len, strlen(b));
    assert_int_equal(certs_scan(two, info, 1), -1); /* more than max */
    assert_int_equal(certs_scan("", info, 2), 0);
    assert_int_equal(
        certs_scan("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", info, 2), -1);
    assert_int_equal(certs_scan("-----BEGIN CERTIFICATE-----\nno end", info, 2), -1);

    free(a);
    free(b);
    free(two);
    certs_free_secret(a_key);
    certs_free_secret(b_key);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_ecdsa),
        cmocka_unit_test(test_generate_dev_sans),
        cmocka_unit_test(test_generate_rsa),
        cmocka_unit_test(test_ca_flags),
        cmocka_unit_test(test_verify_chain),
        cmocka_unit_test(test_validity),
        cmocka_unit_test(test_default_clock_backdates),
        cmocka_unit_test(test_random_serials),
        cmocka_unit_test(test_long_names_cn_fallback),
        cmocka_unit_test(test_generate_invalid),
        cmocka_unit_test(test_key_type_names),
        cmocka_unit_test(test_ca_bundle),
        cmocka_unit_test(test_clear_null_safe),
        cmocka_unit_test_setup_teardown(test_write_and_load, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_refuses_existing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_failure_cleans_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_failures, setup, teardown),
        cmocka_unit_test(test_issue_in_memory),
        cmocka_unit_test(test_scan_bundles),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
