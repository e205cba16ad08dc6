/*
 * certs.c - webhook TLS material with the OpenSSL library: a private CA and a
 * serving certificate for a Service, safe writing of the PEM files, and the
 * loader/checker the server uses for its certificate and key.
 *
 * `gpuguard certs` keeps no CA key: the CA private key lives only in memory
 * while the serving certificate is signed, then is freed, so rotating means a
 * new CA and leaf together and a caBundle update, and no long-lived key that
 * could sign more certificates is left on disk.  The in-memory issuing that
 * serve --tls-secret uses (http/certkeeper.c) keeps its CA key in its Secret.
 * No argument parsing or printing here.
 */
#include "http/certs.h"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CA_COMMON_NAME "gpuguard webhook CA"
#define SERIAL_BYTES 16 /* 128-bit random serials */
#define CN_MAX 64       /* ub-common-name in RFC 5280 */
#define N_TARGETS 3

struct ext_spec {
    int nid;
    const char *value;
};

/* Fail with msg plus OpenSSL's last reason, leaving its error queue empty. */
static enum gg_status ossl_fail(struct gg_err *err, enum gg_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static enum gg_status ossl_fail(struct gg_err *err, enum gg_status status, const char *fmt, ...)
{
    char what[sizeof(err->msg)];
    unsigned long code = ERR_peek_last_error();
    const char *reason = code ? ERR_reason_error_string(code) : NULL;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    ERR_clear_error();
    if (reason)
        return gg_fail(err, status, "%s: %s", what, reason);
    return gg_fail(err, status, "%s", what);
}

/* Free a heap buffer that held key material, wiping it first. */
static void free_secret(char *buf, size_t len)
{
    if (buf) {
        OPENSSL_cleanse(buf, len);
        free(buf);
    }
}

void certs_opts_init(struct certs_opts *opts)
{
    memset(opts, 0, sizeof(*opts));
    opts->days = CERTS_DEFAULT_DAYS;
    opts->key_type = CERTS_KEY_ECDSA;
}

int certs_key_type_parse(const char *name)
{
    if (name && strcmp(name, "ecdsa") == 0)
        return CERTS_KEY_ECDSA;
    if (name && strcmp(name, "rsa") == 0)
        return CERTS_KEY_RSA;
    return -1;
}

const char *certs_key_type_name(enum certs_key_type type)
{
    switch (type) {
    case CERTS_KEY_ECDSA:
        return "ecdsa";
    case CERTS_KEY_RSA:
        return "rsa";
    }
    return "unknown";
}

/* A DNS-1123 label; DNS-1035 also wants a letter first. */
static bool is_label(const char *s, bool letter_first)
{
    return gg_dns_label(s) && (!letter_first || (s[0] >= 'a' && s[0] <= 'z'));
}

enum gg_status certs_check_service(const char *name, struct gg_err *err)
{
    if (!name || !is_label(name, true))
        return gg_fail(err, GG_ERR_INVALID,
                       "service name '%.64s' is not a DNS-1035 label (a-z, 0-9, '-', "
                       "starting with a letter, at most 63 characters)",
                       name ? name : "");
    return GG_OK;
}

enum gg_status certs_check_namespace(const char *name, struct gg_err *err)
{
    if (!name || !is_label(name, false))
        return gg_fail(err, GG_ERR_INVALID,
                       "namespace '%.64s' is not a DNS-1123 label (a-z, 0-9, '-', "
                       "at most 63 characters)",
                       name ? name : "");
    return GG_OK;
}

char *certs_format_time(time_t t, char buf[CERTS_TIME_LEN])
{
    struct tm tm;

    if (!gmtime_r(&t, &tm) || strftime(buf, CERTS_TIME_LEN, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        snprintf(buf, CERTS_TIME_LEN, "@%lld", (long long)t);
    return buf;
}

static bool asn1_to_time(const ASN1_TIME *t, time_t *out)
{
    struct tm tm;

    if (!t || ASN1_TIME_to_tm(t, &tm) != 1)
        return false;
    *out = timegm(&tm);
    return true;
}

static EVP_PKEY *new_key(enum certs_key_type type)
{
    if (type == CERTS_KEY_RSA)
        return EVP_RSA_gen(CERTS_RSA_BITS);
    return EVP_EC_gen("P-256");
}

static bool set_random_serial(X509 *cert)
{
    unsigned char raw[SERIAL_BYTES];
    BIGNUM *bn = NULL;
    bool ok = false;

    if (RAND_bytes(raw, sizeof(raw)) != 1)
        goto out;
    bn = BN_bin2bn(raw, sizeof(raw), NULL);
    /* Zero is not a valid serial; at odds of 2^-128 failing is fine. */
    if (!bn || BN_is_zero(bn))
        goto out;
    ok = BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert)) != NULL;
out:
    BN_free(bn);
    return ok;
}

/*
 * A v3 certificate for key with subject CN=cn, signed by signer as issuer
 * (issuer NULL: self-signed), valid from now - CERTS_BACKDATE_SECONDS to
 * now + lifetime_s.  NULL on failure, reason left in OpenSSL's error queue.
 */
static X509 *new_cert(const char *cn, EVP_PKEY *key, X509 *issuer, EVP_PKEY *signer, time_t now,
                      int64_t lifetime_s, const struct ext_spec *exts, size_t n_exts)
{
    X509 *cert = X509_new();
    X509 *ret = NULL;
    X509_NAME *name;
    X509V3_CTX ctx;

    if (!cert || !X509_set_version(cert, X509_VERSION_3) || !set_random_serial(cert))
        goto out;
    name = X509_get_subject_name(cert);
    if (!X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1, -1,
                                    0))
        goto out;
    if (!X509_set_issuer_name(cert, issuer ? X509_get_subject_name(issuer) : name))
        goto out;
    if (!X509_time_adj_ex(X509_getm_notBefore(cert), 0, -CERTS_BACKDATE_SECONDS, &now) ||
        !X509_time_adj_ex(X509_getm_notAfter(cert), 0, (long)lifetime_s, &now))
        goto out;
    if (!X509_set_pubkey(cert, key))
        goto out;
    X509V3_set_ctx(&ctx, issuer ? issuer : cert, cert, NULL, NULL, 0);
    for (size_t i = 0; i < n_exts; i++) {
        X509_EXTENSION *ext = X509V3_EXT_nconf_nid(NULL, &ctx, exts[i].nid, exts[i].value);
        int added = ext ? X509_add_ext(cert, ext, -1) : 0;
        X509_EXTENSION_free(ext);
        if (!added)
            goto out;
    }
    if (X509_sign(cert, signer, EVP_sha256()) <= 0)
        goto out;
    ret = cert;
    cert = NULL;
out:
    X509_free(cert);
    return ret;
}

/* Copy a memory BIO's contents into a NUL-terminated heap string. */
static char *bio_to_string(BIO *bio)
{
    char *data = NULL;
    long n = BIO_get_mem_data(bio, &data);
    char *s;

    if (n < 0 || !data)
        return NULL;
    s = malloc((size_t)n + 1);
    if (s) {
        memcpy(s, data, (size_t)n);
        s[n] = '\0';
    }
    return s;
}

static char *cert_to_pem(X509 *cert)
{
    BIO *bio = BIO_new(BIO_s_mem());
    char *pem = NULL;

    if (bio && PEM_write_bio_X509(bio, cert))
        pem = bio_to_string(bio);
    BIO_free(bio);
    return pem;
}

static char *key_to_pem(EVP_PKEY *key)
{
    /* The secure-heap BIO wipes its buffer when freed. */
    BIO *bio = BIO_new(BIO_s_secmem());
    char *pem = NULL;

    if (bio && PEM_write_bio_PrivateKey(bio, key, NULL, NULL, 0, NULL, NULL))
        pem = bio_to_string(bio);
    BIO_free(bio);
    return pem;
}

static const struct ext_spec ca_exts[] = {
    {NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
    {NID_key_usage, "critical,keyCertSign,cRLSign"},
    {NID_subject_key_identifier, "hash"},
};

/* The CA certificate of ca_key, self-signed, valid for lifetime_s from now. */
static X509 *make_ca(EVP_PKEY *ca_key, time_t now, int64_t lifetime_s)
{
    return new_cert(CA_COMMON_NAME, ca_key, NULL, ca_key, now, lifetime_s, ca_exts,
                    sizeof(ca_exts) / sizeof(ca_exts[0]));
}

/* The serving certificate of key for service.ns, signed by ca with ca_key. */
static X509 *make_leaf(const char *service, const char *ns, bool dev, enum certs_key_type type,
                       EVP_PKEY *key, X509 *ca, EVP_PKEY *ca_key, time_t now, int64_t lifetime_s)
{
    char cn[CN_MAX + 1], san[1024];
    const struct ext_spec leaf_exts[] = {
        {NID_basic_constraints, "critical,CA:FALSE"},
        /* keyEncipherment only means something for RSA key transport. */
        {NID_key_usage, type == CERTS_KEY_RSA ? "critical,digitalSignature,keyEncipherment"
                                              : "critical,digitalSignature"},
        {NID_ext_key_usage, "serverAuth"},
        {NID_subject_alt_name, san},
        {NID_subject_key_identifier, "hash"},
        {NID_authority_key_identifier, "keyid:always"},
    };
    /* Two 63-character labels overflow the 64-byte CN; SANs carry the names anyway. */
    int n = snprintf(cn, sizeof(cn), "%s.%s.svc", service, ns);
    if (n < 0 || (size_t)n >= sizeof(cn))
        snprintf(cn, sizeof(cn), "%s", service);
    snprintf(san, sizeof(san), "DNS:%s,DNS:%s.%s,DNS:%s.%s.svc,DNS:%s.%s.svc.cluster.local%s",
             service, service, ns, service, ns, service, ns,
             dev ? ",DNS:localhost,IP:127.0.0.1" : "");
    return new_cert(cn, key, ca, ca_key, now, lifetime_s, leaf_exts,
                    sizeof(leaf_exts) / sizeof(leaf_exts[0]));
}

enum gg_status certs_generate(const struct certs_opts *opts, struct certs_bundle *out,
                              struct gg_err *err)
{
    enum gg_status st;
    struct certs_bundle b = {0};
    EVP_PKEY *ca_key = NULL, *key = NULL;
    X509 *ca = NULL, *leaf = NULL;
    time_t now;

    if ((st = certs_check_service(opts->service, err)) != GG_OK ||
        (st = certs_check_namespace(opts->ns, err)) != GG_OK)
        goto out;
    if (opts->days < 1 || opts->days > CERTS_MAX_DAYS) {
        st = gg_fail(err, GG_ERR_INVALID, "validity of %d days is outside 1..%d", opts->days,
                     CERTS_MAX_DAYS);
        goto out;
    }
    if (opts->key_type != CERTS_KEY_ECDSA && opts->key_type != CERTS_KEY_RSA) {
        st = gg_fail(err, GG_ERR_INVALID, "unknown key type %d", (int)opts->key_type);
        goto out;
    }
    now = opts->now ? opts->now : time(NULL);
    ca_key = new_key(opts->key_type);
    key = ca_key ? new_key(opts->key_type) : NULL;
    if (!key) {
        st = ossl_fail(err, GG_ERR_TLS, "generating a %s key", certs_key_type_name(opts->key_type));
        goto out;
    }
    int64_t lifetime_s = (int64_t)opts->days * 86400;
    if (!(ca = make_ca(ca_key, now, lifetime_s))) {
        st = ossl_fail(err, GG_ERR_TLS, "building the CA certificate");
        goto out;
    }
    leaf = make_leaf(opts->service, opts->ns, opts->dev, opts->key_type, key, ca, ca_key, now,
                     lifetime_s);
    if (!leaf) {
        st = ossl_fail(err, GG_ERR_TLS, "building the serving certificate");
        goto out;
    }
    b.ca_pem = cert_to_pem(ca);
    b.cert_pem = cert_to_pem(leaf);
    b.key_pem = key_to_pem(key);
    if (!b.ca_pem || !b.cert_pem || !b.key_pem) {
        st = ossl_fail(err, GG_ERR_NOMEM, "encoding PEM");
        goto out;
    }
    if (!asn1_to_time(X509_get0_notBefore(leaf), &b.not_before) ||
        !asn1_to_time(X509_get0_notAfter(leaf), &b.not_after)) {
        st = ossl_fail(err, GG_ERR_TLS, "reading back the validity period");
        goto out;
    }
    *out = b;
    memset(&b, 0, sizeof(b));
    st = GG_OK;
out:
    certs_bundle_clear(&b);
    X509_free(leaf);
    X509_free(ca);
    EVP_PKEY_free(key);
    EVP_PKEY_free(ca_key);
    return st;
}

void certs_bundle_clear(struct certs_bundle *bundle)
{
    if (!bundle)
        return;
    free(bundle->ca_pem);
    free(bundle->cert_pem);
    free_secret(bundle->key_pem, bundle->key_pem ? strlen(bundle->key_pem) : 0);
    memset(bundle, 0, sizeof(*bundle));
}

/* mkdir -p with mode 0755 (before umask); dir must end up a directory. */
static enum gg_status make_dirs(const char *dir, struct gg_err *err)
{
    char path[PATH_MAX];
    size_t len = strlen(dir);
    struct stat sb;

    if (len == 0)
        return gg_fail(err, GG_ERR_INVALID, "empty output directory");
    if (len >= sizeof(path))
        return gg_fail(err, GG_ERR_INVALID, "output directory path too long");
    memcpy(path, dir, len + 1);
    for (char *p = path + 1;; p++) {
        char c = *p;
        if (c != '/' && c != '\0')
            continue;
        *p = '\0';
        /* EEXIST or e.g. EACCES on an existing parent are fine if it is a directory. */
        if (mkdir(path, 0755) != 0 && errno != EEXIST &&
            !(stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)))
            return gg_fail(err, GG_ERR_IO, "cannot create directory %s: %s", path, strerror(errno));
        *p = c;
        if (c == '\0')
            break;
    }
    if (stat(dir, &sb) != 0)
        return gg_fail(err, GG_ERR_IO, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return gg_fail(err, GG_ERR_IO, "%s is not a directory", dir);
    return GG_OK;
}

/*
 * Write data to a new temporary file next to the target.  mkostemp opens
 * with O_EXCL and mode 0600, so a key is never readable by others, not even
 * briefly; certificates are widened to their final mode afterwards.  On
 * failure nothing is left behind and tmp is "".
 */
static enum gg_status write_temp(const char *dir, const char *name, const char *data, mode_t mode,
                                 char tmp[PATH_MAX], struct gg_err *err)
{
    enum gg_status st = GG_OK;
    size_t len = strlen(data), done = 0;
    int fd = -1, n;

    n = snprintf(tmp, PATH_MAX, "%s/.%s.XXXXXX", dir, name);
    if (n < 0 || n >= PATH_MAX) {
        tmp[0] = '\0';
        return gg_fail(err, GG_ERR_INVALID, "output path too long");
    }
    fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        st = gg_fail(err, GG_ERR_IO, "cannot create a file in %s: %s", dir, strerror(errno));
        tmp[0] = '\0';
        goto out;
    }
    if (fchmod(fd, mode) != 0) {
        st = gg_fail(err, GG_ERR_IO, "%s: chmod: %s", tmp, strerror(errno));
        goto out;
    }
    while (done < len) {
        ssize_t w = write(fd, data + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            st = gg_fail(err, GG_ERR_IO, "%s: write: %s", tmp, strerror(w < 0 ? errno : EIO));
            goto out;
        }
        done += (size_t)w;
    }
    if (fsync(fd) != 0) {
        st = gg_fail(err, GG_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
        goto out;
    }
    n = close(fd);
    fd = -1;
    if (n != 0)
        st = gg_fail(err, GG_ERR_IO, "%s: close: %s", tmp, strerror(errno));
out:
    if (fd >= 0)
        close(fd);
    if (st != GG_OK && tmp[0]) {
        unlink(tmp);
        tmp[0] = '\0';
    }
    return st;
}

enum gg_status certs_write(const struct certs_bundle *bundle, const char *dir, bool force,
                           struct gg_err *err)
{
    struct target {
        const char *name;
        const char *pem;
        mode_t mode;
    };
    /* The key goes in before the certificate that needs it. */
    const struct target targets[N_TARGETS] = {
        {CERTS_CA_FILE, bundle ? bundle->ca_pem : NULL, 0644},
        {CERTS_KEY_FILE, bundle ? bundle->key_pem : NULL, 0600},
        {CERTS_CERT_FILE, bundle ? bundle->cert_pem : NULL, 0644},
    };
    char final[N_TARGETS][PATH_MAX], tmp[N_TARGETS][PATH_MAX];
    bool linked[N_TARGETS] = {false};
    enum gg_status st;
    struct stat sb;
    int dfd;

    for (int i = 0; i < N_TARGETS; i++)
        tmp[i][0] = '\0';
    if (!bundle || !bundle->ca_pem || !bundle->cert_pem || !bundle->key_pem || !dir) {
        st = gg_fail(err, GG_ERR_INVALID, "nothing to write");
        goto out;
    }
    if ((st = make_dirs(dir, err)) != GG_OK)
        goto out;
    /* Check every target first so a refusal writes nothing. */
    for (int i = 0; i < N_TARGETS; i++) {
        int n = snprintf(final[i], PATH_MAX, "%s/%s", dir, targets[i].name);
        if (n < 0 || n >= PATH_MAX) {
            st = gg_fail(err, GG_ERR_INVALID, "output path too long");
            goto out;
        }
        if (lstat(final[i], &sb) == 0) {
            if (!force) {
                st = gg_fail(err, GG_ERR_EXISTS, "%s already exists", final[i]);
                goto out;
            }
        } else if (errno != ENOENT) {
            st = gg_fail(err, GG_ERR_IO, "%s: %s", final[i], strerror(errno));
            goto out;
        }
    }
    for (int i = 0; i < N_TARGETS; i++)
        if ((st = write_temp(dir, targets[i].name, targets[i].pem, targets[i].mode, tmp[i], err)) !=
            GG_OK)
            goto out;
    /*
     * rename() replaces atomically; link() refuses an existing name, which
     * closes the window between the check above and here.  Without force a
     * failure removes what was linked; with force the old files are gone
     * once renamed over, so a failure part-way (rare: every byte is already
     * on disk) can leave a mixed set that another --force run repairs.
     */
    for (int i = 0; i < N_TARGETS; i++) {
        if (force) {
            if (rename(tmp[i], final[i]) != 0) {
                st = gg_fail(err, GG_ERR_IO, "%s: %s", final[i], strerror(errno));
                goto out;
            }
        } else {
            if (link(tmp[i], final[i]) != 0) {
                int e = errno;
                st = gg_fail(err, e == EEXIST ? GG_ERR_EXISTS : GG_ERR_IO, "%s: %s", final[i],
                             strerror(e));
                goto out;
            }
            linked[i] = true;
            unlink(tmp[i]);
        }
        tmp[i][0] = '\0';
    }
    /* Make the new names durable; failing here loses nothing already written. */
    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    st = GG_OK;
out:
    for (int i = 0; i < N_TARGETS; i++) {
        if (tmp[i][0])
            unlink(tmp[i]);
        if (st != GG_OK && linked[i])
            unlink(final[i]);
    }
    return st;
}

enum gg_status certs_ca_bundle(const struct certs_bundle *bundle, char **out, struct gg_err *err)
{
    size_t len;
    char *b64;

    if (!bundle || !bundle->ca_pem)
        return gg_fail(err, GG_ERR_INVALID, "no CA certificate");
    len = strlen(bundle->ca_pem);
    if (len > CERTS_MAX_PEM_SIZE)
        return gg_fail(err, GG_ERR_TOOBIG, "CA certificate too large");
    b64 = malloc(4 * ((len + 2) / 3) + 1);
    if (!b64)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)bundle->ca_pem, (int)len);
    *out = b64;
    return GG_OK;
}

/* A whole PEM file of 1..CERTS_MAX_PEM_SIZE bytes, NUL-terminated. */
static enum gg_status read_file(const char *path, char **data, size_t *len, struct gg_err *err)
{
    enum gg_status st = gg_read_file(path, CERTS_MAX_PEM_SIZE, data, len, err);
    if (st == GG_OK && *len == 0) {
        free(*data);
        *data = NULL;
        st = gg_fail(err, GG_ERR_PARSE, "%s: file is empty", path);
    }
    return st;
}

/* Never prompt on a terminal for a passphrase: encrypted keys are refused. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)u;
    return -1;
}

/*
 * Parse and check p (read from cert_label and key_label, as messages name
 * them): the key matches the first certificate, valid now.  On success *out
 * takes p's texts and p is emptied.
 */
static enum gg_status check_pair(const char *cert_label, const char *key_label,
                                 struct certs_pair *p, struct certs_pair *out, struct gg_err *err)
{
    enum gg_status st;
    BIO *bio = NULL;
    X509 *cert = NULL;
    EVP_PKEY *key = NULL;
    BIGNUM *serial = NULL;
    char *hex = NULL, when[CERTS_TIME_LEN];
    time_t now = time(NULL);

    bio = BIO_new_mem_buf(p->cert_pem, (int)p->cert_len);
    cert = bio ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
    if (!cert) {
        ERR_clear_error(); /* OpenSSL's reason ("no start line") adds nothing here */
        st = gg_fail(err, GG_ERR_PARSE, "%s: no PEM certificate found%s", cert_label,
                     strstr(p->cert_pem, "PRIVATE KEY") ? " (it holds a private key)" : "");
        goto out;
    }
    BIO_free(bio);
    bio = BIO_new_mem_buf(p->key_pem, (int)p->key_len);
    key = bio ? PEM_read_bio_PrivateKey(bio, NULL, no_passphrase, NULL) : NULL;
    if (!key) {
        ERR_clear_error();
        st = gg_fail(err, GG_ERR_PARSE, "%s: %s", key_label,
                     strstr(p->key_pem, "ENCRYPTED") ? "encrypted private keys are not supported"
                                                     : "no PEM private key found");
        goto out;
    }
    if (X509_check_private_key(cert, key) != 1) {
        ERR_clear_error();
        st = gg_fail(err, GG_ERR_TLS, "%s: private key does not match certificate %s", key_label,
                     cert_label);
        goto out;
    }
    if (!asn1_to_time(X509_get0_notBefore(cert), &p->not_before) ||
        !asn1_to_time(X509_get0_notAfter(cert), &p->not_after)) {
        st = ossl_fail(err, GG_ERR_TLS, "%s: unreadable validity period", cert_label);
        goto out;
    }
    if (now < p->not_before) {
        st = gg_fail(err, GG_ERR_TLS, "%s: not valid until %s", cert_label,
                     certs_format_time(p->not_before, when));
        goto out;
    }
    if (now > p->not_after) {
        st = gg_fail(err, GG_ERR_TLS, "%s: expired at %s", cert_label,
                     certs_format_time(p->not_after, when));
        goto out;
    }
    serial = ASN1_INTEGER_to_BN(X509_get0_serialNumber(cert), NULL);
    hex = serial ? BN_bn2hex(serial) : NULL;
    p->serial_hex = hex ? strdup(hex) : NULL;
    if (!p->serial_hex) {
        st = ossl_fail(err, GG_ERR_NOMEM, "%s: reading the serial number", cert_label);
        goto out;
    }
    *out = *p;
    memset(p, 0, sizeof(*p));
    st = GG_OK;
out:
    OPENSSL_free(hex);
    BN_free(serial);
    EVP_PKEY_free(key);
    X509_free(cert);
    BIO_free(bio);
    return st;
}

enum gg_status certs_load_pair(const char *cert_path, const char *key_path, struct certs_pair *out,
                               struct gg_err *err)
{
    struct certs_pair p = {0};
    enum gg_status st;
    if ((st = read_file(cert_path, &p.cert_pem, &p.cert_len, err)) == GG_OK &&
        (st = read_file(key_path, &p.key_pem, &p.key_len, err)) == GG_OK)
        st = check_pair(cert_path, key_path, &p, out, err);
    certs_pair_clear(&p);
    return st;
}

enum gg_status certs_check_pair(const char *cert_label, const char *key_label, const char *cert_pem,
                                const char *key_pem, struct certs_pair *out, struct gg_err *err)
{
    struct certs_pair p = {.cert_pem = strdup(cert_pem),
                           .cert_len = strlen(cert_pem),
                           .key_pem = strdup(key_pem),
                           .key_len = strlen(key_pem)};
    enum gg_status st = p.cert_pem && p.key_pem ? check_pair(cert_label, key_label, &p, out, err)
                                                : gg_fail(err, GG_ERR_NOMEM, "out of memory");
    certs_pair_clear(&p);
    return st;
}

void certs_pair_clear(struct certs_pair *pair)
{
    if (!pair)
        return;
    free(pair->cert_pem);
    free_secret(pair->key_pem, pair->key_len);
    free(pair->serial_hex);
    memset(pair, 0, sizeof(*pair));
}

/* The first certificate of a PEM text; NULL (and OpenSSL's queue empty) when there is none. */
static X509 *read_cert(const char *pem)
{
    BIO *bio = BIO_new_mem_buf(pem, -1);
    X509 *cert = bio ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
    BIO_free(bio);
    ERR_clear_error();
    return cert;
}

static EVP_PKEY *read_key(const char *pem)
{
    BIO *bio = BIO_new_mem_buf(pem, -1);
    EVP_PKEY *key = bio ? PEM_read_bio_PrivateKey(bio, NULL, no_passphrase, NULL) : NULL;
    BIO_free(bio);
    ERR_clear_error();
    return key;
}

enum gg_status certs_new_ca(const struct certs_issue *is, char **ca_pem, char **ca_key_pem,
                            struct gg_err *err)
{
    EVP_PKEY *key = new_key(is->key_type);
    X509 *ca = key ? make_ca(key, is->now, is->lifetime_s) : NULL;
    enum gg_status st = GG_OK;
    *ca_pem = ca ? cert_to_pem(ca) : NULL;
    *ca_key_pem = *ca_pem ? key_to_pem(key) : NULL;
    if (!*ca_key_pem) {
        st = ossl_fail(err, GG_ERR_TLS, "making a CA");
        free(*ca_pem);
        *ca_pem = NULL;
    }
    X509_free(ca);
    EVP_PKEY_free(key);
    return st;
}

enum gg_status certs_new_leaf(const struct certs_issue *is, const char *ca_pem,
                              const char *ca_key_pem, char **cert_pem, char **key_pem,
                              struct gg_err *err)
{
    enum gg_status st = GG_OK;
    X509 *ca = read_cert(ca_pem), *leaf = NULL;
    EVP_PKEY *ca_key = read_key(ca_key_pem), *key = NULL;
    time_t ca_end;
    *cert_pem = *key_pem = NULL;
    if (!ca || !ca_key || X509_check_private_key(ca, ca_key) != 1 ||
        !asn1_to_time(X509_get0_notAfter(ca), &ca_end)) {
        ERR_clear_error();
        st = gg_fail(err, GG_ERR_TLS, "the CA certificate and key do not make a pair");
        goto out;
    }
    /* A certificate outliving its CA would stop verifying before it says it expires. */
    int64_t lifetime_s = is->lifetime_s;
    if (is->now + lifetime_s > ca_end)
        lifetime_s = ca_end - is->now;
    if (lifetime_s <= 0) {
        st = gg_fail(err, GG_ERR_TLS, "the CA has expired");
        goto out;
    }
    key = new_key(is->key_type);
    leaf = key ? make_leaf(is->service, is->ns, false, is->key_type, key, ca, ca_key, is->now,
                           lifetime_s)
               : NULL;
    *cert_pem = leaf ? cert_to_pem(leaf) : NULL;
    *key_pem = *cert_pem ? key_to_pem(key) : NULL;
    if (!*key_pem) {
        st = ossl_fail(err, GG_ERR_TLS, "making a serving certificate");
        free(*cert_pem);
        *cert_pem = NULL;
    }
out:
    X509_free(leaf);
    X509_free(ca);
    EVP_PKEY_free(key);
    EVP_PKEY_free(ca_key);
    return st;
}

#define PEM_BEGIN "-----BEGIN CERTIFICATE-----"
#define PEM_END "-----END CERTIFICATE-----"

int certs_scan(const char *pem, struct certs_info *out, int max)
{
    int n = 0;
    for (const char *p = pem ? strstr(pem, PEM_BEGIN) : NULL; p; p = strstr(p, PEM_BEGIN)) {
        const char *end = strstr(p, PEM_END);
        if (!end || n == max)
            return -1;
        end += strlen(PEM_END);
        if (*end == '\n')
            end++;
        struct certs_info *c = &out[n];
        c->start = (size_t)(p - pem);
        c->len = (size_t)(end - p);
        char *one = strndup(p, c->len);
        X509 *cert = one ? read_cert(one) : NULL;
        free(one);
        bool ok = cert && asn1_to_time(X509_get0_notBefore(cert), &c->not_before) &&
                  asn1_to_time(X509_get0_notAfter(cert), &c->not_after);
        X509_free(cert);
        if (!ok)
            return -1;
        n++;
        p = end;
    }
    return n;
}

bool certs_signed_by(const char *cert_pem, const char *cas_pem)
{
    X509 *cert = read_cert(cert_pem), *ca = NULL;
    BIO *bio = cert ? BIO_new_mem_buf(cas_pem, -1) : NULL;
    bool yes = false;
    while (!yes && bio && (ca = PEM_read_bio_X509(bio, NULL, NULL, NULL))) {
        EVP_PKEY *ca_key = X509_get0_pubkey(ca);
        yes = ca_key && X509_verify(cert, ca_key) == 1;
        X509_free(ca);
    }
    ERR_clear_error();
    BIO_free(bio);
    X509_free(cert);
    return yes;
}

bool certs_names_host(const char *cert_pem, const char *host)
{
    X509 *cert = read_cert(cert_pem);
    bool yes = cert && X509_check_host(cert, host, 0, 0, NULL) == 1;
    ERR_clear_error();
    X509_free(cert);
    return yes;
}

bool certs_key_matches(const char *cert_pem, const char *key_pem)
{
    X509 *cert = read_cert(cert_pem);
    EVP_PKEY *key = cert ? read_key(key_pem) : NULL;
    bool yes = key && X509_check_private_key(cert, key) == 1;
    ERR_clear_error();
    EVP_PKEY_free(key);
    X509_free(cert);
    return yes;
}

void certs_free_secret(char *pem)
{
    free_secret(pem, pem ? strlen(pem) : 0);
}
