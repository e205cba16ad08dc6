/*
 * kubeclient.h - a small Kubernetes API server client on libcurl: where the
 * API server is and how to authenticate to it (the pod's service account
 * in a cluster, or a kubeconfig file), GET requests whose 2xx bodies are
 * streamed to a callback, and writes (PUT, POST, PATCH, DELETE) with a body.
 *
 * Threads: a client is not for two threads at once.  It holds one libcurl
 * handle and the state of its token file, which every request uses and
 * changes, without a lock.  Each thread that makes requests has a client of
 * its own: kc_clone() makes one with the same credentials, and may be
 * called from any thread, even while the original's owner is in a request
 * (it reads only what never changes after the client is made).
 *
 * A client never logs credentials and never follows redirects.  kc_get
 * never buffers a 2xx body: the caller bounds what it keeps.  kc_send
 * keeps a 2xx body up to a bound the caller sets (KC_MAX_WRITE_BODY by
 * default) when it has no callback.  Non-2xx bodies (a Kubernetes Status)
 * are kept up to KC_ERROR_BODY_MAX bytes.  The bearer token of a token file
 * is re-read whenever the file changes (checked before every request), and
 * at once after kc_token_invalidate() (call it on a 401).
 *
 * kubeconfig support: current-context; the cluster's server,
 * certificate-authority(-data) and insecure-skip-tls-verify; the user's
 * token, tokenFile (token-file is also read), client-certificate(-data) and
 * client-key(-data).  Relative paths are relative to the kubeconfig's
 * directory, as kubectl reads them.  exec and auth-provider plugins and
 * basic auth are refused with a message.
 */
#ifndef GG_KUBECLIENT_H
#define GG_KUBECLIENT_H

#include "util/gpuguard.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where a pod's service account credentials are mounted. */
#define KC_SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"
#define KC_ERROR_BODY_MAX (64 * 1024)
/* The 2xx body kc_send keeps when the request sets no max_body. */
#define KC_MAX_WRITE_BODY (4 << 20)
#define KC_TOKEN_MAX (64 * 1024)
#define KC_KUBECONFIG_MAX (4 << 20)
#define KC_CONNECT_TIMEOUT_MS 10000

struct kc_client;

/*
 * True when running in a cluster: KUBERNETES_SERVICE_HOST and
 * KUBERNETES_SERVICE_PORT are set and sa_dir/token exists.
 */
bool kc_in_cluster(const char *sa_dir);

/* The service account of sa_dir (token, ca.crt) and the service's address. */
enum gg_status kc_new_in_cluster(const char *sa_dir, struct kc_client **out, struct gg_err *err);
/* The current context of a kubeconfig file. */
enum gg_status kc_new_kubeconfig(const char *path, struct kc_client **out, struct gg_err *err);
void kc_free(struct kc_client *c);
/*
 * A second client with c's server, TLS settings and credentials, for another
 * thread (see "Threads" above).  A token file is read again by the copy.
 */
enum gg_status kc_clone(const struct kc_client *c, struct kc_client **out, struct gg_err *err);

/*
 * Any HTTP(S) endpoint with the same options (e.g. a Prometheus): its base
 * URL, and optionally a bearer token file (re-read when it changes), a CA
 * bundle and a client certificate and key.  NULL or "" leaves one out.
 */
struct kc_endpoint {
    const char *server, *token_file, *ca_file, *cert_file, *key_file;
};
enum gg_status kc_new_endpoint(const struct kc_endpoint *ep, struct kc_client **out,
                               struct gg_err *err);

/* The API server's base URL, e.g. "https://10.96.0.1:443". */
const char *kc_server(const struct kc_client *c);
/* "service account", "token file", "token", "client certificate" or "none". */
const char *kc_auth_kind(const struct kc_client *c);

/* Read the token file again before the next request (after a 401). */
void kc_token_invalidate(struct kc_client *c);

struct kc_request {
    const char *path; /* with its query, e.g. "/api/v1/pods?limit=500" */
    const char *what; /* the request in messages, "GET <what>: ..."; NULL: the path */
    long timeout_s;   /* the whole transfer; 0: no limit */
    long timeout_ms;  /* the whole transfer in milliseconds, when > 0 (instead of timeout_s) */
    long stall_s;     /* abort when no byte comes for this long; 0: no limit */
    /* A 2xx body as it arrives; return false to abort the transfer. */
    bool (*on_body)(void *ctx, const char *data, size_t len);
    /* Asked about once a second, data or not; return false to abort the transfer (as on_body
     * does).  NULL: never. */
    bool (*keep_going)(void *ctx);
    void *ctx;
    const atomic_bool *cancel; /* abort when it turns true (looked at about once a second) */
    size_t max_body; /* kc_send without on_body: the 2xx body kept; 0: KC_MAX_WRITE_BODY */
};

struct kc_response {
    long status; /* HTTP status; 0 when no response came */
    /* A non-2xx body, NUL-terminated, at most KC_ERROR_BODY_MAX; with kc_send and no on_body, the
     * 2xx body (at most max_body); else NULL. */
    char *body;
    bool aborted;   /* on_body or keep_going returned false */
    bool cancelled; /* *cancel turned true */
    bool too_big;   /* kc_send: the 2xx body went past max_body (the transfer was cut) */
};

/*
 * GET path.  GG_OK when a whole response came, whatever its status;
 * GG_ERR_IO (connection, TLS, dropped connection, unreadable token file),
 * GG_ERR_TIMEOUT, or GG_ERR_INVALID when aborted or cancelled, with err
 * saying what happened.  *resp is filled in every case; clear it with
 * kc_response_clear().
 */
enum gg_status kc_get(struct kc_client *c, const struct kc_request *rq, struct kc_response *resp,
                      struct gg_err *err);
void kc_response_clear(struct kc_response *resp);

/* A request's method and body, for kc_send. */
struct kc_write {
    const char *method;       /* "PUT", "POST", "PATCH" or "DELETE" ("GET": a GET, body kept) */
    const char *content_type; /* "application/json" when NULL */
    const char *body;         /* NULL: no body */
    size_t len;
};

/*
 * kc_get with a method and a body: same results and errors.  With
 * rq->on_body NULL, a 2xx body is kept in resp->body (NUL-terminated),
 * refused past rq->max_body bytes (0: KC_MAX_WRITE_BODY): GG_ERR_TOOBIG,
 * resp->too_big set and resp->body NULL.  Another method, or a content type
 * with a line break, is GG_ERR_INVALID before anything is sent.  A POST,
 * PUT or PATCH without a body sends an empty one (Content-Length: 0); a GET
 * sends none (its body and content type are ignored).
 */
enum gg_status kc_send(struct kc_client *c, const struct kc_request *rq, const struct kc_write *w,
                       struct kc_response *resp, struct gg_err *err);

/*
 * A request with a JSON body (NULL: none) whose 2xx answer is a JSON object,
 * parsed into *out (the caller's reference).  *status is the HTTP status (0
 * when no whole answer came: a transfer cut after the headers is none).  A
 * non-2xx answer is GG_ERR_IO with the message of the Kubernetes Status it
 * carries, "METHOD WHAT: HTTP 409: ..."; a 401 also has the token file read
 * again before the next request.
 */
enum gg_status kc_json(struct kc_client *c, const struct kc_request *rq, const char *method,
                       const json_t *body, json_t **out, long *status, struct gg_err *err);

/* Percent-encode s for a query value into out; false when it does not fit. */
bool kc_query_escape(const char *s, char *out, size_t size);

/* Standard base64 (padding optional, whitespace skipped); NULL when malformed. */
unsigned char *kc_base64_decode(const char *in, size_t *out_len);
/* Standard base64 with padding, NUL-terminated; NULL when out of memory. */
char *kc_base64_encode(const unsigned char *in, size_t len);

/*
 * The wait of a client thread between requests (backoff, refresh): up to ms
 * on cond under lock, cut short when *stop is set and cond signalled.  False
 * when stopped.  cond must come from kc_cond_init (its deadline is on
 * CLOCK_MONOTONIC; a condition variable on the default clock would take it
 * as long past and never wait).
 */
void kc_cond_init(pthread_cond_t *cond);
bool kc_pause_ms(pthread_mutex_t *lock, pthread_cond_t *cond, const atomic_bool *stop, int64_t ms);

#endif
