/*
 * kubeclient.c - API server configuration (in-cluster, kubeconfig) and
 * requests on one reused libcurl handle: streamed GETs and bounded writes,
 * both through perform().
 */
#include "kube/kubeclient.h"
#include "util/clock.h"

#include "util/buf.h"
#include "codec/yamldoc.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct kc_client {
    char *server;
    char *ca_file;
    unsigned char *ca_data;
    size_t ca_len;
    bool insecure;
    char *cert_file, *key_file;
    unsigned char *cert_data, *key_data;
    size_t cert_len, key_len;
    char *token;      /* the bearer token in use (static, or the token file's) */
    char *token_file; /* re-read when it changes */
    struct stat token_stat;
    bool token_stale;
    const char *auth;
    CURL *curl;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

void kc_free(struct kc_client *c)
{
    if (!c)
        return;
    if (c->curl)
        curl_easy_cleanup(c->curl);
    free(c->server);
    free(c->ca_file);
    free(c->ca_data);
    free(c->cert_file);
    free(c->key_file);
    free(c->cert_data);
    free(c->key_data);
    if (c->token)
        memset(c->token, 0, strlen(c->token));
    free(c->token);
    free(c->token_file);
    free(c);
}

const char *kc_server(const struct kc_client *c)
{
    return c->server;
}

const char *kc_auth_kind(const struct kc_client *c)
{
    return c->auth;
}

void kc_token_invalidate(struct kc_client *c)
{
    c->token_stale = true;
}

/* ---- small helpers ------------------------------------------------------ */

static int b64_value(int ch)
{
    if (ch >= 'A' && ch <= 'Z')
        return ch - 'A';
    if (ch >= 'a' && ch <= 'z')
        return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9')
        return ch - '0' + 52;
    if (ch == '+')
        return 62;
    if (ch == '/')
        return 63;
    return -1;
}

unsigned char *kc_base64_decode(const char *in, size_t *out_len)
{
    size_t n = strlen(in);
    unsigned char *out = malloc(n / 4 * 3 + 4);
    if (!out)
        return NULL;
    uint32_t acc = 0;
    size_t len = 0, bits = 0, pad = 0;
    for (const char *p = in; *p; p++) {
        if (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')
            continue;
        if (*p == '=') {
            pad++;
            continue;
        }
        int v = b64_value((unsigned char)*p);
        if (v < 0 || pad) {
            explicit_bzero(out, len);
            free(out);
            return NULL;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[len++] = (unsigned char)(acc >> bits);
        }
    }
    if (pad > 2 || bits >= 6) {
        explicit_bzero(out, len);
        free(out);
        return NULL;
    }
    out[len] = '\0';
    *out_len = len;
    return out;
}

char *kc_base64_encode(const unsigned char *in, size_t len)
{
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < len)
            v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < len)
            v |= in[i + 2];
        *o++ = digits[v >> 18];
        *o++ = digits[(v >> 12) & 63];
        *o++ = i + 1 < len ? digits[(v >> 6) & 63] : '=';
        *o++ = i + 2 < len ? digits[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

bool kc_query_escape(const char *s, char *out, size_t size)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 0;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        bool plain = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
                     (ch >= '0' && ch <= '9') || ch == '-' || ch == '.' || ch == '_' || ch == '~';
        if (n + (plain ? 1 : 3) >= size)
            return false;
        if (plain) {
            out[n++] = (char)ch;
        } else {
            out[n++] = '%';
            out[n++] = hex[ch >> 4];
            out[n++] = hex[ch & 15];
        }
    }
    if (n >= size)
        return false;
    out[n] = '\0';
    return true;
}

/* The token of a token file: its text without surrounding whitespace. */
static enum gg_status read_token(struct kc_client *c, struct gg_err *err)
{
    struct stat sb;
    if (stat(c->token_file, &sb) != 0)
        return gg_fail(err, GG_ERR_IO, "token file %s: cannot stat it", c->token_file);
    if (c->token && !c->token_stale && sb.st_mtim.tv_sec == c->token_stat.st_mtim.tv_sec &&
        sb.st_mtim.tv_nsec == c->token_stat.st_mtim.tv_nsec && sb.st_ino == c->token_stat.st_ino &&
        sb.st_dev == c->token_stat.st_dev && sb.st_size == c->token_stat.st_size)
        return GG_OK;
    char *text = NULL;
    size_t len = 0;
    enum gg_status st = gg_read_file(c->token_file, KC_TOKEN_MAX, &text, &len, err);
    if (st != GG_OK)
        return st;
    size_t start = 0;
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ' ||
                   text[len - 1] == '\t'))
        text[--len] = '\0';
    while (start < len && (text[start] == ' ' || text[start] == '\t' || text[start] == '\n'))
        start++;
    if (start == len || strpbrk(text + start, "\r\n")) {
        free(text);
        return gg_fail(err, GG_ERR_INVALID, "token file %s: %s", c->token_file,
                       start == len ? "empty" : "holds more than one line");
    }
    memmove(text, text + start, len - start + 1);
    if (c->token)
        memset(c->token, 0, strlen(c->token));
    free(c->token);
    c->token = text;
    c->token_stat = sb;
    c->token_stale = false;
    return GG_OK;
}

static enum gg_status client_new(struct kc_client **out, struct gg_err *err)
{
    pthread_once(&curl_once, curl_init_once);
    struct kc_client *c = calloc(1, sizeof(*c));
    if (!c || !(c->curl = curl_easy_init())) {
        free(c);
        return gg_fail(err, GG_ERR_NOMEM, "cannot create an HTTP client");
    }
    c->auth = "none";
    *out = c;
    return GG_OK;
}

/* ---- in cluster --------------------------------------------------------- */

bool kc_in_cluster(const char *sa_dir)
{
    char path[4096];
    const char *host = getenv("KUBERNETES_SERVICE_HOST");
    const char *port = getenv("KUBERNETES_SERVICE_PORT");
    snprintf(path, sizeof(path), "%s/token", sa_dir);
    return host && *host && port && *port && access(path, R_OK) == 0;
}

enum gg_status kc_new_in_cluster(const char *sa_dir, struct kc_client **out, struct gg_err *err)
{
    const char *host = getenv("KUBERNETES_SERVICE_HOST");
    const char *port = getenv("KUBERNETES_SERVICE_PORT");
    if (!host || !*host || !port || !*port)
        return gg_fail(err, GG_ERR_INVALID,
                       "not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT "
                       "are not set (use --kubeconfig)");
    struct kc_client *c;
    enum gg_status st = client_new(&c, err);
    if (st != GG_OK)
        return st;
    char text[4096];
    bool v6 = strchr(host, ':') != NULL;
    snprintf(text, sizeof(text), "https://%s%s%s:%s", v6 ? "[" : "", host, v6 ? "]" : "", port);
    c->server = strdup(text);
    snprintf(text, sizeof(text), "%s/token", sa_dir);
    c->token_file = strdup(text);
    snprintf(text, sizeof(text), "%s/ca.crt", sa_dir);
    if (access(text, R_OK) == 0)
        c->ca_file = strdup(text);
    c->auth = "service account";
    if (!c->server || !c->token_file)
        st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
    else
        st = read_token(c, err);
    if (st != GG_OK) {
        kc_free(c);
        return st;
    }
    *out = c;
    return GG_OK;
}

/* ---- any endpoint ------------------------------------------------------- */

static char *dup_set(const char *s, bool *failed)
{
    char *d = s && *s ? strdup(s) : NULL;
    *failed |= s && *s && !d;
    return d;
}

enum gg_status kc_new_endpoint(const struct kc_endpoint *ep, struct kc_client **out,
                               struct gg_err *err)
{
    struct kc_client *c;
    enum gg_status st = client_new(&c, err);
    if (st != GG_OK)
        return st;
    bool failed = false;
    c->server = dup_set(ep->server, &failed);
    c->token_file = dup_set(ep->token_file, &failed);
    c->ca_file = dup_set(ep->ca_file, &failed);
    c->cert_file = dup_set(ep->cert_file, &failed);
    c->key_file = dup_set(ep->key_file, &failed);
    c->auth = c->token_file ? "token file" : c->cert_file ? "client certificate" : "none";
    if (failed || !c->server)
        st = gg_fail(err, failed ? GG_ERR_NOMEM : GG_ERR_INVALID,
                     failed ? "out of memory" : "no server URL");
    else if (c->token_file)
        st = read_token(c, err);
    if (st != GG_OK) {
        kc_free(c);
        return st;
    }
    *out = c;
    return GG_OK;
}

/* ---- a copy for another thread ------------------------------------------ */

static unsigned char *dup_bytes(const unsigned char *p, size_t len, bool *failed)
{
    unsigned char *d = p ? malloc(len + 1) : NULL;
    if (d) {
        memcpy(d, p, len);
        d[len] = '\0';
    }
    *failed |= p && !d;
    return d;
}

enum gg_status kc_clone(const struct kc_client *c, struct kc_client **out, struct gg_err *err)
{
    struct kc_client *d;
    enum gg_status st = client_new(&d, err);
    if (st != GG_OK)
        return st;
    bool failed = false;
    d->server = dup_set(c->server, &failed);
    d->ca_file = dup_set(c->ca_file, &failed);
    d->ca_data = dup_bytes(c->ca_data, c->ca_len, &failed);
    d->ca_len = c->ca_len;
    d->insecure = c->insecure;
    d->cert_file = dup_set(c->cert_file, &failed);
    d->key_file = dup_set(c->key_file, &failed);
    d->cert_data = dup_bytes(c->cert_data, c->cert_len, &failed);
    d->cert_len = c->cert_len;
    d->key_data = dup_bytes(c->key_data, c->key_len, &failed);
    d->key_len = c->key_len;
    d->auth = c->auth;
    /* A token file's token changes under its owner's requests: the copy reads the file. */
    d->token_file = dup_set(c->token_file, &failed);
    if (!c->token_file)
        d->token = dup_set(c->token, &failed);
    if (failed || !d->server)
        st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
    else if (d->token_file)
        st = read_token(d, err);
    if (st != GG_OK) {
        kc_free(d);
        return st;
    }
    *out = d;
    return GG_OK;
}

/* ---- kubeconfig --------------------------------------------------------- */

struct kcfg {
    const char *path;
    char dir[4096];
    struct gg_err *err;
};

/* The `field` of the element of list whose name is name. */
static const json_t *named(const json_t *list, const char *name, const char *field)
{
    size_t i;
    const json_t *e;
    json_array_foreach(list, i, e)
    {
        const char *n = json_string_value(json_object_get(e, "name"));
        if (n && strcmp(n, name) == 0)
            return json_object_get(e, field);
    }
    return NULL;
}

/* A path from the kubeconfig, relative to its directory. */
static char *resolve(const struct kcfg *k, const char *p)
{
    if (!p || !*p)
        return NULL;
    if (p[0] == '/' || strcmp(k->dir, ".") == 0)
        return strdup(p);
    size_t n = strlen(k->dir) + strlen(p) + 2;
    char *out = malloc(n);
    if (out)
        snprintf(out, n, "%s/%s", k->dir, p);
    return out;
}

static enum gg_status data_field(const struct kcfg *k, const json_t *obj, const char *key,
                                 unsigned char **out, size_t *len)
{
    const char *text = json_string_value(json_object_get(obj, key));
    if (!text || !*text)
        return GG_OK;
    if (!(*out = kc_base64_decode(text, len)))
        return gg_fail(k->err, GG_ERR_PARSE, "kubeconfig %s: %s is not base64", k->path, key);
    return GG_OK;
}

static enum gg_status load_cluster(struct kc_client *c, const struct kcfg *k, const json_t *doc,
                                   const char *name)
{
    const json_t *cl = named(json_object_get(doc, "clusters"), name, "cluster");
    if (!json_is_object(cl))
        return gg_fail(k->err, GG_ERR_INVALID, "kubeconfig %s: cluster \"%s\" not found", k->path,
                       name);
    const char *server = json_string_value(json_object_get(cl, "server"));
    if (!server || (strncmp(server, "https://", 8) != 0 && strncmp(server, "http://", 7) != 0))
        return gg_fail(k->err, GG_ERR_INVALID,
                       "kubeconfig %s: cluster \"%s\": server must be an https:// (or http://) URL",
                       k->path, name);
    size_t n = strlen(server);
    c->server = strdup(server);
    if (c->server && n && c->server[n - 1] == '/')
        c->server[n - 1] = '\0';
    c->ca_file = resolve(k, json_string_value(json_object_get(cl, "certificate-authority")));
    c->insecure = json_is_true(json_object_get(cl, "insecure-skip-tls-verify"));
    return data_field(k, cl, "certificate-authority-data", &c->ca_data, &c->ca_len);
}

static enum gg_status load_user(struct kc_client *c, const struct kcfg *k, const json_t *doc,
                                const char *name)
{
    const json_t *u = named(json_object_get(doc, "users"), name, "user");
    if (!u)
        return GG_OK; /* no credentials: anonymous */
    if (json_object_get(u, "exec") || json_object_get(u, "auth-provider") ||
        json_object_get(u, "username"))
        return gg_fail(k->err, GG_ERR_INVALID,
                       "kubeconfig %s: user \"%s\": exec plugins, auth providers and basic auth "
                       "are not supported; use a token, a tokenFile or a client certificate",
                       k->path, name);
    const char *token = json_string_value(json_object_get(u, "token"));
    const char *file = json_string_value(json_object_get(u, "tokenFile"));
    if (!file)
        file = json_string_value(json_object_get(u, "token-file"));
    enum gg_status st;
    if ((st = data_field(k, u, "client-certificate-data", &c->cert_data, &c->cert_len)) != GG_OK ||
        (st = data_field(k, u, "client-key-data", &c->key_data, &c->key_len)) != GG_OK)
        return st;
    c->cert_file = resolve(k, json_string_value(json_object_get(u, "client-certificate")));
    c->key_file = resolve(k, json_string_value(json_object_get(u, "client-key")));
    bool cert = c->cert_file || c->cert_data, key = c->key_file || c->key_data;
    if (cert != key)
        return gg_fail(k->err, GG_ERR_INVALID,
                       "kubeconfig %s: user \"%s\": a client certificate needs its key too",
                       k->path, name);
    if (token && strpbrk(token, "\r\n"))
        return gg_fail(k->err, GG_ERR_INVALID,
                       "kubeconfig %s: user \"%s\": the token has a line break", k->path, name);
    if (token && *token) {
        c->token = strdup(token);
        c->auth = "token";
    } else if (file && *file) {
        c->token_file = resolve(k, file);
        c->auth = "token file";
        if (c->token_file && (st = read_token(c, k->err)) != GG_OK)
            return st;
    } else if (cert) {
        c->auth = "client certificate";
    }
    return GG_OK;
}

enum gg_status kc_new_kubeconfig(const char *path, struct kc_client **out, struct gg_err *err)
{
    char *text = NULL;
    size_t len = 0;
    json_t *doc = NULL;
    struct kc_client *c = NULL;
    struct kcfg k = {.path = path, .err = err};
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(k.dir, sizeof(k.dir), ".");
    else
        snprintf(k.dir, sizeof(k.dir), "%.*s", (int)(slash == path ? 1 : slash - path), path);
    enum gg_status st = gg_read_file(path, KC_KUBECONFIG_MAX, &text, &len, err);
    if (st == GG_OK)
        st = yd_load_one(text, len, path, NULL, &doc, err);
    if (st != GG_OK)
        goto out;
    const char *ctx_name = json_string_value(json_object_get(doc, "current-context"));
    if (!ctx_name || !*ctx_name) {
        st = gg_fail(err, GG_ERR_INVALID, "kubeconfig %s: no current-context", path);
        goto out;
    }
    const json_t *ctx = named(json_object_get(doc, "contexts"), ctx_name, "context");
    const char *cluster = json_string_value(json_object_get(ctx, "cluster"));
    const char *user = json_string_value(json_object_get(ctx, "user"));
    if (!cluster) {
        st = gg_fail(err, GG_ERR_INVALID,
                     "kubeconfig %s: context \"%s\" not found or has no cluster", path, ctx_name);
        goto out;
    }
    if ((st = client_new(&c, err)) != GG_OK || (st = load_cluster(c, &k, doc, cluster)) != GG_OK ||
        (user && (st = load_user(c, &k, doc, user)) != GG_OK))
        goto out;
    if (!c->server)
        st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
out:
    if (st == GG_OK) {
        *out = c;
    } else {
        kc_free(c);
    }
    json_decref(doc);
    free(text);
    return st;
}

/* ---- requests ----------------------------------------------------------- */

struct xfer {
    struct kc_client *c;
    const struct kc_request *rq;
    struct kc_response *resp;
    bool keep;       /* keep a 2xx body (kc_send without on_body) */
    struct buf body; /* a non-2xx body, or the 2xx body kept */
};

static size_t on_write(char *data, size_t size, size_t nmemb, void *userdata)
{
    struct xfer *x = userdata;
    size_t n = size * nmemb;
    if (!x->resp->status) {
        curl_easy_getinfo(x->c->curl, CURLINFO_RESPONSE_CODE, &x->resp->status);
        if (x->keep && x->resp->status >= 200 && x->resp->status < 300)
            x->body.max = x->rq->max_body ? x->rq->max_body : KC_MAX_WRITE_BODY;
    }
    if (x->resp->status >= 200 && x->resp->status < 300 && !x->keep) {
        if (x->rq->on_body && !x->rq->on_body(x->rq->ctx, data, n)) {
            x->resp->aborted = true;
            return 0;
        }
        return n;
    }
    size_t room = x->body.max - x->body.len;
    if (x->keep && n > room && x->resp->status >= 200 && x->resp->status < 300) {
        x->resp->too_big = true;
        return 0;
    }
    buf_append(&x->body, data, n < room ? n : room);
    return n;
}

static int on_progress(void *userdata, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    (void)dltotal;
    (void)dlnow;
    (void)ultotal;
    (void)ulnow;
    struct xfer *x = userdata;
    if (x->rq->cancel && atomic_load(x->rq->cancel)) {
        x->resp->cancelled = true;
        return 1;
    }
    if (x->rq->keep_going && !x->rq->keep_going(x->rq->ctx)) {
        x->resp->aborted = true;
        return 1;
    }
    return 0;
}

static void set_tls(struct kc_client *c)
{
    CURL *h = c->curl;
    curl_easy_setopt(h, CURLOPT_SSLVERSION, (long)CURL_SSLVERSION_TLSv1_2);
    if (c->insecure) {
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    if (c->ca_data) {
        struct curl_blob blob = {c->ca_data, c->ca_len, CURL_BLOB_COPY};
        curl_easy_setopt(h, CURLOPT_CAINFO_BLOB, &blob);
    } else if (c->ca_file) {
        curl_easy_setopt(h, CURLOPT_CAINFO, c->ca_file);
    }
    if (c->cert_data) {
        struct curl_blob blob = {c->cert_data, c->cert_len, CURL_BLOB_COPY};
        curl_easy_setopt(h, CURLOPT_SSLCERT_BLOB, &blob);
    } else if (c->cert_file) {
        curl_easy_setopt(h, CURLOPT_SSLCERT, c->cert_file);
    }
    curl_easy_setopt(h, CURLOPT_SSLCERTTYPE, "PEM");
    if (c->key_data) {
        struct curl_blob blob = {c->key_data, c->key_len, CURL_BLOB_COPY};
        curl_easy_setopt(h, CURLOPT_SSLKEY_BLOB, &blob);
    } else if (c->key_file) {
        curl_easy_setopt(h, CURLOPT_SSLKEY, c->key_file);
    }
    curl_easy_setopt(h, CURLOPT_SSLKEYTYPE, "PEM");
}

static enum gg_status failure(CURLcode code, const struct xfer *x, const char *errbuf,
                              const char *method, const char *url, struct gg_err *err)
{
    const char *what = *errbuf ? errbuf : curl_easy_strerror(code);
    if (x->resp->cancelled)
        return gg_fail(err, GG_ERR_INVALID, "%s %s: cancelled", method, url);
    if (x->resp->aborted)
        return gg_fail(err, GG_ERR_INVALID, "%s %s: stopped reading the response", method, url);
    if (x->resp->too_big)
        return gg_fail(err, GG_ERR_TOOBIG, "%s %s: the response is larger than %zu bytes", method,
                       url, x->body.max);
    if (code == CURLE_OPERATION_TIMEDOUT)
        return gg_fail(err, GG_ERR_TIMEOUT, "%s %s: %s", method, url, what);
    return gg_fail(err, GG_ERR_IO, "%s %s: %s", method, url, what);
}

/* Whether the request sends a body: any write but a DELETE without one. */
static bool sends_body(const struct kc_write *w)
{
    return w && strcmp(w->method, "GET") != 0 && (w->body || strcmp(w->method, "DELETE") != 0);
}

/* The request's headers: what it accepts, its credentials, its body's type. */
static struct curl_slist *request_headers(const struct kc_client *c, const struct kc_write *w)
{
    struct curl_slist *headers = curl_slist_append(NULL, "Accept: application/json");
    if (c->token) {
        size_t hn = strlen(c->token) + 32;
        char *auth = malloc(hn);
        if (auth) {
            snprintf(auth, hn, "Authorization: Bearer %s", c->token);
            headers = curl_slist_append(headers, auth);
            memset(auth, 0, hn);
            free(auth);
        }
    }
    if (w && sends_body(w)) {
        char type[256];
        snprintf(type, sizeof(type), "Content-Type: %s",
                 w->content_type ? w->content_type : "application/json");
        headers = curl_slist_append(headers, type);
        /* The body goes at once: no round trip for "100 Continue" on large ones. */
        headers = curl_slist_append(headers, "Expect:");
    }
    return headers;
}

static bool write_method(const char *m)
{
    return m && (strcmp(m, "PUT") == 0 || strcmp(m, "POST") == 0 || strcmp(m, "PATCH") == 0 ||
                 strcmp(m, "DELETE") == 0 || strcmp(m, "GET") == 0);
}

/* One request: a GET when w is NULL; with w and no on_body, the 2xx body is kept (kc_send). */
static enum gg_status perform(struct kc_client *c, const struct kc_request *rq,
                              const struct kc_write *w, struct kc_response *resp,
                              struct gg_err *err)
{
    memset(resp, 0, sizeof(*resp));
    const char *method = w ? w->method : "GET";
    const char *what = rq->what ? rq->what : rq->path;
    if (w && !write_method(w->method))
        return gg_fail(err, GG_ERR_INVALID, "%.16s %s: not a method kc_send makes",
                       w->method ? w->method : "(none)", what);
    if (w && sends_body(w) && w->content_type &&
        (strpbrk(w->content_type, "\r\n") || strlen(w->content_type) > 200))
        return gg_fail(err, GG_ERR_INVALID, "%s %s: malformed content type", method, what);
    if (c->token_file) {
        enum gg_status st = read_token(c, err);
        if (st != GG_OK)
            return st;
    }
    size_t n = strlen(c->server) + strlen(rq->path) + 1;
    char *url = malloc(n);
    if (!url)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    snprintf(url, n, "%s%s", c->server, rq->path);
    struct curl_slist *headers = request_headers(c, w);
    struct xfer x = {.c = c, .rq = rq, .resp = resp, .keep = w && !rq->on_body};
    buf_init(&x.body, KC_ERROR_BODY_MAX);
    char errbuf[CURL_ERROR_SIZE] = "";
    CURL *h = c->curl;
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "gpuguard/" GG_VERSION);
    curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, "gzip");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)KC_CONNECT_TIMEOUT_MS);
    if (w && strcmp(w->method, "GET") != 0)
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, w->method);
    if (w && sends_body(w)) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(w->body ? w->len : 0));
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, w->body ? w->body : "");
    }
    if (rq->timeout_ms > 0)
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, rq->timeout_ms);
    else
        curl_easy_setopt(h, CURLOPT_TIMEOUT, rq->timeout_s);
    if (rq->stall_s > 0) {
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, rq->stall_s);
    }
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 30L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 15L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, &x);
    set_tls(c);
    CURLcode code = curl_easy_perform(h);
    /* The handle keeps pointers to these until the next reset. */
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, NULL);
    curl_slist_free_all(headers);
    if (!resp->status)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp->status);
    bool ok = resp->status >= 200 && resp->status < 300;
    enum gg_status st = GG_OK;
    if (code != CURLE_OK)
        st = failure(code, &x, errbuf, method, what, err);
    if (x.body.len || (resp->status && !ok))
        resp->body = buf_steal(&x.body, &n);
    else if (x.keep && ok && st == GG_OK && !(resp->body = strdup("")))
        st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
    if (resp->too_big) {
        free(resp->body);
        resp->body = NULL;
    }
    buf_clear(&x.body);
    free(url);
    return st;
}

enum gg_status kc_get(struct kc_client *c, const struct kc_request *rq, struct kc_response *resp,
                      struct gg_err *err)
{
    return perform(c, rq, NULL, resp, err);
}

enum gg_status kc_send(struct kc_client *c, const struct kc_request *rq, const struct kc_write *w,
                       struct kc_response *resp, struct gg_err *err)
{
    if (!w) {
        memset(resp, 0, sizeof(*resp));
        return gg_fail(err, GG_ERR_INVALID, "%s: kc_send without a method", rq->path);
    }
    return perform(c, rq, w, resp, err);
}

enum gg_status kc_json(struct kc_client *c, const struct kc_request *rq, const char *method,
                       const json_t *body, json_t **out, long *status, struct gg_err *err)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    const char *what = rq->what ? rq->what : rq->path;
    *out = NULL;
    *status = 0;
    if (body && !text)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    struct kc_write w = {.method = method, .body = text, .len = text ? strlen(text) : 0};
    struct kc_response resp = {0};
    enum gg_status st = kc_send(c, rq, &w, &resp, err);
    if (text) /* a Secret's keys may be in it, as in the answer */
        explicit_bzero(text, strlen(text));
    free(text);
    *status = st == GG_OK ? resp.status : 0; /* a transfer cut after the headers is no answer */
    if (st == GG_OK && resp.status / 100 == 2) {
        *out = json_loads(resp.body, 0, NULL);
        if (!json_is_object(*out)) {
            json_decref(*out);
            *out = NULL;
            st = gg_fail(err, GG_ERR_PARSE, "%s %s: the answer is not a JSON object", method, what);
        }
    } else if (st == GG_OK) {
        if (resp.status == 401)
            kc_token_invalidate(c);
        json_t *answer = resp.body ? json_loads(resp.body, 0, NULL) : NULL;
        const char *msg = json_string_value(json_object_get(answer, "message"));
        st = gg_fail(err, GG_ERR_IO, "%s %s: HTTP %ld: %.200s", method, what, resp.status,
                     msg         ? msg
                     : resp.body ? resp.body
                                 : "no body");
        json_decref(answer);
    }
    if (resp.body)
        explicit_bzero(resp.body, strlen(resp.body));
    kc_response_clear(&resp);
    return st;
}

void kc_response_clear(struct kc_response *resp)
{
    free(resp->body);
    memset(resp, 0, sizeof(*resp));
}

void kc_cond_init(pthread_cond_t *cond)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(cond, &attr);
    pthread_condattr_destroy(&attr);
}

bool kc_pause_ms(pthread_mutex_t *lock, pthread_cond_t *cond, const atomic_bool *stop, int64_t ms)
{
    struct timespec until = gg_timespec_in_ms(ms);
    pthread_mutex_lock(lock);
    while (!atomic_load(stop) && pthread_cond_timedwait(cond, lock, &until) == 0)
        ;
    pthread_mutex_unlock(lock);
    return !atomic_load(stop);
}
