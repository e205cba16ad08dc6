/*
 * server.c - libmicrohttpd front end: TLS webhook port and plain ops port.
 *
 * The only file that includes microhttpd.h.  The webhook runs one daemon
 * per worker thread, each a poll() loop without a listening socket of its
 * own; one thread accepts (acceptor.h) and hands each new connection to the
 * next worker in turn that is not running a review (MHD_add_connection),
 * so that a burst of connections spreads across the workers and none waits
 * behind a slow review while another worker idles.  Each request is handled
 * to the end on the worker that read it (policies are bounded by their own
 * budgets and the request deadline), so there is no hand-off between
 * threads after the accept.  Refusals that need
 * no body (404, 405, 415, 413 by Content-Length) are answered from the
 * headers, before a byte of the body is buffered.
 *
 * --max-connections is enforced by the accepting thread, before the
 * hand-off.  When every slot is taken, the connection idle the longest
 * (kept alive after its answer, no byte since) is closed to make room
 * (make_room): an API server's idle keep-alive connections would otherwise
 * hold the slots for the whole idle timeout.  A connection with a request
 * under way is never closed for this; when all are, the new connection is
 * accepted and closed at once, so its client sees the connection closed
 * instead of a hung handshake.  The library's own per-worker limit is set
 * above ours and must never be reached: in libmicrohttpd 0.9.75 a worker
 * that refuses a handed-over connection at that limit leaves a mutex of its
 * own locked, and hangs at its next close (a burst of 30 connects against
 * --max-connections 4 froze the workers while /healthz said 200).
 * A slot is held no longer than --request-timeout by a request that is
 * late (sweeper.h), however slowly its bytes trickle in.
 *
 * The ops port is a daemon of its own without a listening socket either:
 * its front door (opsdoor.h) accepts, answers the kubelet's probes itself
 * the moment their request is in, and hands the daemon the other requests
 * (/metrics), within a per-address cap (--ops-max-per-peer).
 */
#include "http/server.h"
#include "engine/audit.h"
#include "util/duration.h"
#include "util/clock.h"

#include "util/buf.h"
#include "util/log.h"
#include "util/metrics.h"
#include "http/acceptor.h"
#include "http/clientauth.h"
#include "http/opsdoor.h"
#include "http/review.h"
#include "http/sweeper.h"
#include "http/tlscreds.h"
#include "kube/informer.h"
#include "kube/rsstore.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

/* The API server's default webhook timeout, used when ?timeout= is absent. */
#define DEFAULT_TIMEOUT_MS 10000
/*
 * Blocks from this size up are mmapped, and so given back to the system
 * when freed.  glibc's default threshold rises to the largest block freed
 * (up to 32 MiB), after which a big review's buffers (a 10 MB annotation
 * is copied several times: body, JSON, Lua) land in the workers' heaps,
 * which then keep tens of MB each: the resident size would not return.
 */
#define MMAP_THRESHOLD (1 << 20)
/* On SIGTERM, how long kept-alive connections may stay open without a request. */
#define LINGER_MS 1000
/* The line about idle connections closed to make room: at most this often. */
#define IDLE_CLOSED_LOG_EVERY_US (10 * 1000000LL)
/*
 * TLS 1.2 and 1.3 only, AEAD ciphers only (no CBC: LUCKY13 and its kin),
 * forward-secret key exchange only in TLS 1.2 (ECDHE), and the server's
 * order of preference wins over the client's.
 */
#define TLS_PRIORITIES                                                                             \
    "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:-CIPHER-ALL:+AES-256-GCM:+CHACHA20-POLY1305:"      \
    "+AES-128-GCM:-MAC-ALL:+AEAD:-KX-ALL:+ECDHE-ECDSA:+ECDHE-RSA:%SERVER_PRECEDENCE"

struct srv {
    bool require_client_cert;
    struct sweeper *sweeper; /* the request deadline of the webhook's connections */
    struct acceptor *acceptor;
    struct worker *workers;
    unsigned n_workers;
    atomic_uint next_worker; /* where the acceptor's round starts */
    uint16_t port;
    struct MHD_Daemon *ops; /* answers what the door hands it (opsdoor.h) */
    struct ops_door *door;  /* the ops port: its socket, the probes, the per-peer cap */
    uint16_t ops_port;
    size_t max_body;
    unsigned max_connections;
    atomic_uint open_connections; /* handed to a worker and not yet closed */
    /* The accepting thread's: idle connections closed to make room since the last line. */
    unsigned idle_closed;
    int64_t idle_closed_log_us;
    struct engine *engine;
    void (*ready_note)(void *ctx, char *out, size_t size);
    void *ready_note_ctx;
    atomic_bool ready;
    pthread_mutex_t reason_lock;
    char not_ready_reason[256];
};

/* A webhook worker: its daemon and whether its thread is running a review now. */
struct worker {
    struct srv *s;
    struct MHD_Daemon *daemon;
    atomic_bool reviewing;
};

/* The worker whose thread this is (set at its first connection). */
static _Thread_local struct worker *this_worker;

/* Per-request state, created on the first call for a request. */
struct request {
    int64_t start_us;
    int64_t deadline_us;
    enum adm_endpoint endpoint;
    bool too_big;
    bool answered;
    struct buf body;
};

/*
 * Set by srv_stop: from then on every answer says Connection: close, so a
 * client on a kept-alive connection takes its next request elsewhere instead
 * of sending it on a connection about to be cut.  Process-wide, like the
 * in-flight count srv_stop waits on: one server per process.
 */
static atomic_bool draining;

/*
 * The reviews being evaluated, for the line naming those a process exiting
 * now abandons (srv_log_abandoned).  Process-wide like `draining`, each
 * entry on the stack of its worker while the review runs: a review stuck in
 * a C call keeps its entry and its connection, whatever srv_stop has freed
 * around it meanwhile.
 */
struct running {
    struct running *prev, *next;
    const char *path;
    int64_t start_us;
    const struct sw_conn *clock; /* its connection's, for the peer's address */
};
static pthread_mutex_t running_lock = PTHREAD_MUTEX_INITIALIZER;
static struct running *running_head;

static void running_add(struct running *r)
{
    pthread_mutex_lock(&running_lock);
    r->prev = NULL;
    r->next = running_head;
    if (running_head)
        running_head->prev = r;
    running_head = r;
    pthread_mutex_unlock(&running_lock);
}

static void running_remove(struct running *r)
{
    pthread_mutex_lock(&running_lock);
    if (r->prev)
        r->prev->next = r->next;
    else
        running_head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    pthread_mutex_unlock(&running_lock);
}

/*
 * Answers on the ops port (the plain-HTTP one) always close the connection:
 * one request per connection puts a connection's whole life under the
 * request deadline (on_ops_connection).  Probes and scrapes open a new one
 * each time anyway.
 */
static bool closes_connection(struct MHD_Connection *c)
{
    return atomic_load(&draining) ||
           !MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
}

static enum MHD_Result queue_response(struct MHD_Connection *c, unsigned status,
                                      struct MHD_Response *r)
{
    if (closes_connection(c))
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *text)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "POST");
    return queue_response(c, status, r);
}

/* Refuse a request with a one-line reason, counted and logged. */
static enum MHD_Result refuse(struct MHD_Connection *c, struct request *rq, unsigned status,
                              const char *url, const char *reason)
{
    char line[384];
    snprintf(line, sizeof(line), "%s\n", reason);
    rq->answered = true;
    metrics_http_error((int)status);
    json_t *fields = json_pack("{s:i,s:s}", "status", (int)status, "path", url);
    log_fields(LOG_WARN, reason, fields);
    return send_text(c, status, line);
}

/* Content-Type must be application/json, parameters (charset) allowed. */
static bool is_json_type(const char *value)
{
    static const char want[] = "application/json";
    if (!value)
        return false;
    while (*value == ' ' || *value == '\t')
        value++;
    size_t n = sizeof(want) - 1;
    if (strncasecmp(value, want, n) != 0)
        return false;
    value += n;
    while (*value == ' ' || *value == '\t')
        value++;
    return *value == '\0' || *value == ';';
}

struct transfer_codings {
    unsigned count;
    const char *other; /* the first coding other than plain chunked */
};

static enum MHD_Result count_coding(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value)
{
    (void)kind;
    struct transfer_codings *tc = cls;
    if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        tc->count++;
        if (!tc->other && (!value || strcasecmp(value, "chunked") != 0))
            tc->other = value ? value : "";
    }
    return MHD_YES;
}

/*
 * libmicrohttpd decodes plain chunked bodies only; with any other transfer
 * coding ("gzip, chunked", or a second Transfer-Encoding header) it would
 * read the body until the client closes the connection.  True, with the
 * reason in out, for such a request.
 */
static bool refused_coding(struct MHD_Connection *c, char *out, size_t size)
{
    struct transfer_codings tc = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_coding, &tc);
    if (tc.count > 1)
        snprintf(out, size, "Transfer-Encoding given more than once: ");
    else if (tc.other)
        snprintf(out, size, "Transfer-Encoding %.64s is not supported: ", tc.other);
    else
        return false;
    size_t len = strlen(out);
    snprintf(out + len, size - len, "send the body with Content-Length or chunked");
    return true;
}

static int64_t request_timeout_ms(struct MHD_Connection *c)
{
    const char *text = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "timeout");
    int64_t ms;
    if (text && duration_parse_ms(text, &ms) == GG_OK && ms > 0)
        return ms;
    return DEFAULT_TIMEOUT_MS;
}

/* First call for a request: route and check the headers. */
static enum MHD_Result begin_request(struct srv *s, struct MHD_Connection *c, const char *url,
                                     const char *method, struct request *rq)
{
    char reason[256];
    if (strcmp(url, "/mutate") == 0)
        rq->endpoint = ADM_MUTATING;
    else if (strcmp(url, "/validate") == 0)
        rq->endpoint = ADM_VALIDATING;
    else {
        snprintf(reason, sizeof(reason), "no such path %.128s: use /mutate or /validate", url);
        return refuse(c, rq, MHD_HTTP_NOT_FOUND, url, reason);
    }
    if (strcmp(method, MHD_HTTP_METHOD_POST) != 0) {
        snprintf(reason, sizeof(reason), "method %.32s not allowed on %s: use POST", method, url);
        return refuse(c, rq, MHD_HTTP_METHOD_NOT_ALLOWED, url, reason);
    }
    if (refused_coding(c, reason, sizeof(reason)))
        return refuse(c, rq, MHD_HTTP_NOT_IMPLEMENTED, url, reason);
    const char *type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    if (!is_json_type(type)) {
        snprintf(reason, sizeof(reason), "Content-Type must be application/json, got %.64s",
                 type ? type : "none");
        return refuse(c, rq, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, url, reason);
    }
    const char *length = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (length && strtoull(length, NULL, 10) > s->max_body) {
        snprintf(reason, sizeof(reason), "body of %.20s bytes is over the limit of %zu bytes",
                 length, s->max_body);
        return refuse(c, rq, MHD_HTTP_CONTENT_TOO_LARGE, url, reason);
    }
    rq->deadline_us = rq->start_us + request_timeout_ms(c) * 1000;
    buf_init(&rq->body, s->max_body);
    return MHD_YES;
}

static enum MHD_Result answer_review(struct srv *s, struct MHD_Connection *c, struct request *rq,
                                     const char *url)
{
    struct review_result result = {0};
    struct gg_err err = {{0}};
    enum gg_status st = review_handle(s->engine, rq->body.data ? rq->body.data : "", rq->body.len,
                                      rq->endpoint, rq->deadline_us, &result, &err);
    enum metrics_endpoint ep = rq->endpoint == ADM_MUTATING ? MET_MUTATE : MET_VALIDATE;
    double seconds = (gg_now_us() - rq->start_us) / 1e6;
    if (st == GG_ERR_PARSE || st == GG_ERR_INVALID) {
        metrics_observe_admission(ep, MET_OP_NONE, MET_ERROR, seconds);
        return refuse(c, rq, MHD_HTTP_BAD_REQUEST, url, err.msg);
    }
    if (st != GG_OK) {
        metrics_observe_admission(ep, MET_OP_NONE, MET_ERROR, seconds);
        return refuse(c, rq, MHD_HTTP_INTERNAL_SERVER_ERROR, url, err.msg);
    }
    rq->answered = true;
    metrics_observe_admission(ep, result.operation, result.verdict, seconds);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(result.len, result.body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        review_result_clear(&result);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    return queue_response(c, MHD_HTTP_OK, r);
}

/* The request deadline's clock of a webhook connection (set up in on_connection). */
static struct sw_conn *clock_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info ? info->socket_context : NULL;
}

static enum MHD_Result on_webhook(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version;
    struct srv *s = cls;
    struct request *rq = *con_cls;
    if (!rq) {
        rq = calloc(1, sizeof(*rq));
        if (!rq)
            return MHD_NO;
        rq->start_us = gg_now_us();
        *con_cls = rq;
        metrics_inflight_add(1);
        sw_request_begin(clock_of(c));
        enum MHD_Result ret = begin_request(s, c, url, method, rq);
        if (rq->answered)
            sw_request_end(clock_of(c));
        return ret;
    }
    if (*upload_data_size) {
        /* Past the limit: keep reading (and dropping) so we can answer 413. */
        if (!rq->too_big && !rq->answered &&
            buf_append(&rq->body, upload_data, *upload_data_size) != GG_OK) {
            rq->too_big = true;
            buf_clear(&rq->body);
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    /* The whole request is in: from here on the review's own deadline applies. */
    sw_request_end(clock_of(c));
    if (rq->answered)
        return MHD_YES;
    if (rq->too_big) {
        char reason[128];
        snprintf(reason, sizeof(reason), "body is over the limit of %zu bytes", s->max_body);
        return refuse(c, rq, MHD_HTTP_CONTENT_TOO_LARGE, url, reason);
    }
    if (this_worker) /* the acceptor gives new connections to other workers meanwhile */
        atomic_store(&this_worker->reviewing, true);
    struct running r = {.path = rq->endpoint == ADM_MUTATING ? "/mutate" : "/validate",
                        .start_us = rq->start_us,
                        .clock = clock_of(c)};
    running_add(&r);
    enum MHD_Result ret = answer_review(s, c, rq, url);
    running_remove(&r);
    if (this_worker)
        atomic_store(&this_worker->reviewing, false);
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct srv *s = cls;
    struct request *rq = *con_cls;
    if (!rq)
        return;
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        sw_request_done(clock_of(c)); /* idle until its next request's first byte */
    buf_clear(&rq->body);
    free(rq);
    *con_cls = NULL;
    metrics_inflight_add(-1);
    /* The answer has been sent: the review's Lua garbage is collected now,
     * on the worker that made it, outside its latency. */
    engine_collect(s->engine);
}

/*
 * The answer to /healthz or /readyz: its status, its text in out; 0 for
 * another path.  The door (opsdoor.h) answers the probes the kubelet sends
 * with it, on its own thread; on_ops the requests it hands over.
 */
static unsigned probe_text(struct srv *s, const char *path, char *out, size_t size)
{
    if (strcmp(path, "/healthz") == 0) {
        int stuck = engine_overdue(); /* no budget reaches them: restart the process */
        if (!stuck) {
            snprintf(out, size, "ok\n");
            return MHD_HTTP_OK;
        }
        snprintf(out, size, "stuck: %d evaluations past their deadline\n", stuck);
        return MHD_HTTP_SERVICE_UNAVAILABLE;
    }
    if (strcmp(path, "/readyz") != 0)
        return 0;
    char note[700] = "";
    if (s->ready_note) /* a second line, e.g. "inventory: ready (12 pods)" */
        s->ready_note(s->ready_note_ctx, note, sizeof(note));
    if (atomic_load(&s->ready)) {
        char last[256];
        engine_last_reload(s->engine, last, sizeof(last));
        snprintf(out, size, "ready: policy generation %llu, last reload: %s\n%s%s",
                 (unsigned long long)engine_generation(s->engine), last, note, *note ? "\n" : "");
        return MHD_HTTP_OK;
    }
    pthread_mutex_lock(&s->reason_lock);
    snprintf(out, size, "not ready: %s\n%s%s", s->not_ready_reason, note, *note ? "\n" : "");
    pthread_mutex_unlock(&s->reason_lock);
    return MHD_HTTP_SERVICE_UNAVAILABLE;
}

static unsigned door_probe(void *ctx, const char *path, char *out, size_t size)
{
    return probe_text(ctx, path, out, size);
}

static enum MHD_Result on_ops(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_data_size, void **con_cls)
{
    (void)version;
    (void)upload_data;
    struct srv *s = cls;
    if (*con_cls == NULL) { /* headers only; ops requests carry no body */
        *con_cls = s;
        return MHD_YES;
    }
    *upload_data_size = 0;
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return send_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "use GET\n");
    char line[1200];
    unsigned status = probe_text(s, url, line, sizeof(line));
    if (status)
        return send_text(c, status, line);
    if (strcmp(url, "/metrics") == 0) {
        struct buf out;
        buf_init(&out, 16 << 20);
        /* The process metrics, then those of the layers above util that keep their own. */
        if (metrics_render(&out) != GG_OK || inf_render_metrics(&out) != GG_OK ||
            rss_render_metrics(&out) != GG_OK || audit_render_metrics(&out) != GG_OK ||
            engine_render_quotas(s->engine, &out) != GG_OK) {
            buf_clear(&out);
            return send_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "metrics unavailable\n");
        }
        size_t len;
        char *text = buf_steal(&out, &len);
        struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
        if (!r) {
            free(text);
            return MHD_NO;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                                "text/plain; version=0.0.4; charset=utf-8");
        return queue_response(c, MHD_HTTP_OK, r);
    }
    return send_text(c, MHD_HTTP_NOT_FOUND, "no such path: use /healthz, /readyz or /metrics\n");
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    /* 0.9.75 says this at every start even with the logger passed first. */
    if (strstr(msg, "MHD_OPTION_EXTERNAL_LOGGER is not the first option"))
        return;
    /* ... and this for every failed TLS handshake, whatever the cause. */
    if (strstr(msg, "received handshake message out of context"))
        snprintf(msg, sizeof(msg),
                 "TLS handshake failed: no TLS version or cipher suite in "
                 "common, a client certificate refused, or not TLS");
    log_fields(LOG_WARN, msg, json_pack("{s:s}", "source", "libmicrohttpd"));
}

static enum gg_status parse_addr(const char *text, struct sockaddr_storage *ss, struct gg_err *err)
{
    char host[128];
    const char *colon = strrchr(text, ':');
    if (!colon || (size_t)(colon - text) >= sizeof(host))
        return gg_fail(err, GG_ERR_INVALID, "address \"%s\" is not ADDR:PORT", text);
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (colon[1] == '\0' || *end || port < 0 || port > 65535)
        return gg_fail(err, GG_ERR_INVALID, "address \"%s\": port must be 0..65535", text);
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = '\0';
    memset(ss, 0, sizeof(*ss));
    size_t hl = strlen(host);
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
        host[hl - 1] = '\0';
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, host + 1, &a6->sin6_addr) == 1)
            return GG_OK;
    } else {
        struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        if (inet_pton(AF_INET, host, &a4->sin_addr) == 1)
            return GG_OK;
    }
    return gg_fail(err, GG_ERR_INVALID, "address \"%s\": \"%s\" is not an IP address", text, host);
}

/*
 * Every webhook connection gets a request deadline clock, kept as its
 * socket context; one that cannot is dropped at once (fail closed: no
 * connection without a deadline).
 */
static void open_connection(struct srv *s, struct MHD_Connection *c, void **socket_context)
{
    const union MHD_ConnectionInfo *fd =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *tls =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (!fd) /* cannot happen: every connection has its socket */
        return;
    struct sw_conn *clock = tls && tls->tls_session ? sw_open(s->sweeper, fd->connect_fd) : NULL;
    if (!clock) {
        log_msg(LOG_ERROR, "connection dropped: no request deadline could be set up for it");
        shutdown(fd->connect_fd, SHUT_RDWR);
        return;
    }
    *socket_context = clock;
    gnutls_session_t session = (gnutls_session_t)tls->tls_session;
    sw_attach_tls(clock, session);
    if (s->require_client_cert)
        clientauth_require(session);
}

/* The worker threads' name in ps and top -H (libmicrohttpd calls them all MHD-single). */
#define WORKER_THREAD_NAME "webhook-worker"

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct worker *w = cls;
    struct srv *s = w->s;
    bool started = toe == MHD_CONNECTION_NOTIFY_STARTED;
    if (!this_worker) { /* runs on the worker: its first connection names it */
        pthread_setname_np(pthread_self(), WORKER_THREAD_NAME);
        this_worker = w;
    }
    if (started) {
        open_connection(s, c, socket_context);
    } else {
        sw_close(*socket_context);
        *socket_context = NULL;
        atomic_fetch_sub(&s->open_connections, 1); /* counted by hand_to_worker */
    }
    metrics_connections_add(started ? 1 : -1);
}

/* One worker: a daemon with its own poll thread, given connections by the acceptor. */
static struct MHD_Daemon *start_worker(struct worker *w, const struct srv_config *cfg)
{
    unsigned flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_TLS | MHD_USE_ERROR_LOG | MHD_USE_ITC |
                     MHD_USE_NO_LISTEN_SOCKET;
    /* MHD_OPTION_HTTPS_MEM_TRUST must not be passed at all without client CAs. */
    struct MHD_OptionItem extra[2] = {{MHD_OPTION_END, 0, NULL}, {MHD_OPTION_END, 0, NULL}};
    if (cfg->client_ca_pem)
        extra[0] =
            (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_TRUST, 0, (void *)cfg->client_ca_pem};
    /* Never reached (see the top of this file): a worker holds at most the
     * connections handed to it and not yet closed, and make_room keeps all
     * of those within twice max_connections.  The library counts a
     * connection from the moment its worker takes it off the hand-off queue
     * until after the CLOSED notice, both on the worker's own thread. */
    struct srv *s = w->s;
    return MHD_start_daemon(
        flags, 0, NULL, NULL, on_webhook, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
        MHD_OPTION_CONNECTION_LIMIT, 2 * cfg->max_connections + 1, MHD_OPTION_CONNECTION_TIMEOUT,
        cfg->idle_timeout_s, MHD_OPTION_HTTPS_CERT_CALLBACK, tls_creds_retrieve,
        MHD_OPTION_HTTPS_PRIORITIES, TLS_PRIORITIES, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, w, MHD_OPTION_ARRAY, extra, MHD_OPTION_END);
}

/* Count an idle connection closed to make room; a line at most every 10 s. */
static void note_idle_closed(struct srv *s, int64_t idle_ms)
{
    s->idle_closed++;
    int64_t now = gg_now_us();
    if (now < s->idle_closed_log_us)
        return;
    s->idle_closed_log_us = now + IDLE_CLOSED_LOG_EVERY_US;
    log_fields(LOG_WARN,
               "webhook port: idle connections closed to make room, every --max-connections slot "
               "taken",
               json_pack("{s:i,s:i,s:I}", "closed", (int)s->idle_closed, "limit",
                         (int)s->max_connections, "idle_ms", (json_int_t)idle_ms));
    s->idle_closed = 0;
}

/*
 * A slot for a new connection (on the accepting thread): one is free
 * (those being closed to make room count as free), or the connection idle
 * the longest is closed for it.  A closed connection keeps its count until
 * its worker's CLOSED notice, so up to twice max_connections may be open
 * for a moment; no more are closed past that.
 */
static bool make_room(struct srv *s)
{
    unsigned open = atomic_load(&s->open_connections);
    if (open - sw_closing(s->sweeper) < s->max_connections)
        return true;
    int64_t idle_ms;
    if (open >= 2 * s->max_connections || !sw_close_idlest(s->sweeper, &idle_ms))
        return false;
    note_idle_closed(s, idle_ms);
    return true;
}

/*
 * On the accepting thread: without a slot (make_room) the socket is closed
 * at once; else it is counted (until its worker's CLOSED notice) and given
 * to the next worker in turn that is not running a review, or the next in
 * turn when all are.  The worker owns the socket from here on:
 * libmicrohttpd closes it on any failure, and a failure after the worker
 * took it is followed by the CLOSED notice.  (One that fails before: out of
 * memory for the connection's pool, keeps its count: a slot lost, never an
 * extra one.)
 */
static void hand_to_worker(void *ctx, int fd, const struct sockaddr *addr, socklen_t len)
{
    struct srv *s = ctx;
    if (!make_room(s)) {
        close(fd);
        log_msg(LOG_DEBUG, "connection refused: all %u slots busy, none idle to close",
                s->max_connections);
        return;
    }
    atomic_fetch_add(&s->open_connections, 1);
    unsigned first = atomic_fetch_add(&s->next_worker, 1) % s->n_workers;
    struct worker *w = &s->workers[first];
    for (unsigned k = 0; k < s->n_workers; k++) {
        struct worker *candidate = &s->workers[(first + k) % s->n_workers];
        if (!atomic_load(&candidate->reviewing)) {
            w = candidate;
            break;
        }
    }
    if (MHD_add_connection(w->daemon, fd, addr, len) != MHD_YES)
        atomic_fetch_sub(&s->open_connections, 1); /* closed, never queued */
}

/* The workers, then the acceptor; a worker that fails to start stops the ones before it. */
static enum gg_status start_webhook(struct srv *s, const struct srv_config *cfg,
                                    const struct sockaddr_storage *addr, struct gg_err *err)
{
    unsigned n = cfg->threads > 1 ? cfg->threads : 1;
    s->workers = calloc(n, sizeof(*s->workers));
    if (!s->workers)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    for (unsigned i = 0; i < n; i++) {
        s->workers[i].s = s;
        s->workers[i].daemon = start_worker(&s->workers[i], cfg);
        if (!s->workers[i].daemon)
            return gg_fail(err, GG_ERR_IO,
                           "cannot serve HTTPS on %s (certificate or key rejected?)", cfg->listen);
        s->n_workers++;
    }
    return acc_start(addr, cfg->listen, hand_to_worker, s, &s->port, &s->acceptor, err);
}

static void stop_workers(struct srv *s)
{
    for (unsigned i = 0; i < s->n_workers; i++)
        MHD_stop_daemon(s->workers[i].daemon);
    free(s->workers);
}

/*
 * An ops connection's clock runs from its accept (by the door) to its close
 * (one request per connection, see closes_connection): a slow client cannot
 * hold the connections this daemon answers past the request deadline.  The
 * door counts the connection against its address until the CLOSED notice,
 * which comes before the socket is closed.
 */
static void on_ops_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                              enum MHD_ConnectionNotificationCode toe)
{
    struct srv *s = cls;
    const union MHD_ConnectionInfo *fd =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (toe != MHD_CONNECTION_NOTIFY_STARTED) {
        sw_close(*socket_context);
        *socket_context = NULL;
        if (fd)
            door_closed(s->door, fd->connect_fd);
        return;
    }
    if (!fd) /* cannot happen: every connection has its socket */
        return;
    *socket_context =
        sw_open_at(s->sweeper, fd->connect_fd, door_accepted_at(s->door, fd->connect_fd));
    if (!*socket_context)
        shutdown(fd->connect_fd, SHUT_RDWR); /* no deadline, no connection */
}

/* On the door's thread: a request that is not a probe, for the ops daemon. */
static bool hand_to_ops(void *ctx, int fd, const struct sockaddr *addr, socklen_t len)
{
    struct srv *s = ctx;
    return MHD_add_connection(s->ops, fd, addr, len) == MHD_YES;
}

/*
 * The ops daemon has no socket of its own: the door accepts, answers the
 * probes and hands it the rest, at most OPS_ANSWERING at once (the door's
 * count; the library's limit is above it, never reached: see the top of
 * this file).
 */
static struct MHD_Daemon *start_ops(struct srv *s)
{
    unsigned flags =
        MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ERROR_LOG;
    return MHD_start_daemon(flags, 0, NULL, NULL, on_ops, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                            MHD_OPTION_CONNECTION_LIMIT, OPS_ANSWERING + 1,
                            MHD_OPTION_CONNECTION_TIMEOUT, 30, MHD_OPTION_NOTIFY_CONNECTION,
                            on_ops_connection, s, MHD_OPTION_END);
}

/* The ops daemon, then the door that feeds it. */
static enum gg_status start_ops_port(struct srv *s, const struct srv_config *cfg,
                                     const struct sockaddr_storage *addr, struct gg_err *err)
{
    s->ops = start_ops(s);
    if (!s->ops)
        return gg_fail(err, GG_ERR_IO, "cannot start the ops port's HTTP server");
    struct door_config dc = {.per_peer = cfg->ops_per_peer ? cfg->ops_per_peer : OPS_PER_PEER,
                             .pending_max = OPS_WAITING,
                             .handed_max = OPS_ANSWERING,
                             .sweeper = s->sweeper};
    struct door_hooks hooks = {.probe = door_probe, .handoff = hand_to_ops, .ctx = s};
    return door_start(addr, cfg->ops_listen, &dc, &hooks, &s->ops_port, &s->door, err);
}

static void stop_ops_port(struct srv *s)
{
    door_stop(s->door); /* no more hand-offs */
    if (s->ops)
        MHD_stop_daemon(s->ops); /* its CLOSED notices reach the door */
    door_free(s->door);
}

enum gg_status srv_start(const struct srv_config *cfg, struct srv **out, struct gg_err *err)
{
    struct sockaddr_storage hook_addr, ops_addr;
    enum gg_status st;
    if ((st = parse_addr(cfg->listen, &hook_addr, err)) != GG_OK ||
        (st = parse_addr(cfg->ops_listen, &ops_addr, err)) != GG_OK)
        return st;
    struct srv *s = calloc(1, sizeof(*s));
    if (!s)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    s->max_body = cfg->max_body;
    s->max_connections = cfg->max_connections;
    s->engine = cfg->engine;
    s->ready_note = cfg->ready_note;
    s->ready_note_ctx = cfg->ready_note_ctx;
    s->require_client_cert = cfg->client_ca_pem != NULL;
    clientauth_set_names(cfg->client_names);
    pthread_mutex_init(&s->reason_lock, NULL);
    snprintf(s->not_ready_reason, sizeof(s->not_ready_reason), "starting");
    if ((st = sw_new((int64_t)cfg->request_timeout_s * 1000, &s->sweeper, err)) != GG_OK)
        goto fail;
    if ((st = start_webhook(s, cfg, &hook_addr, err)) != GG_OK ||
        (st = start_ops_port(s, cfg, &ops_addr, err)) != GG_OK)
        goto fail;
    *out = s;
    return GG_OK;
fail:
    acc_stop(s->acceptor);
    stop_ops_port(s);
    stop_workers(s);
    sw_free(s->sweeper);
    pthread_mutex_destroy(&s->reason_lock);
    free(s);
    return st;
}

uint16_t srv_port(const struct srv *s)
{
    return s->port;
}

uint16_t srv_ops_port(const struct srv *s)
{
    return s->ops_port;
}

void srv_set_ready(struct srv *s, bool ready, const char *reason)
{
    pthread_mutex_lock(&s->reason_lock);
    snprintf(s->not_ready_reason, sizeof(s->not_ready_reason), "%s", reason ? reason : "");
    pthread_mutex_unlock(&s->reason_lock);
    atomic_store(&s->ready, ready);
}

void srv_stop(struct srv *s, int64_t grace_ms)
{
    if (!s)
        return;
    srv_set_ready(s, false, "shutting down");
    atomic_store(&draining, true);
    acc_stop(s->acceptor);
    /* Wait for the requests in flight and, for a moment, for the kept-alive
     * connections to send their next request and be answered with
     * Connection: close; only the idle ones are left for the stop to cut. */
    int64_t now = gg_now_us(), until = now + grace_ms * 1000;
    int64_t linger = now + (LINGER_MS < grace_ms ? LINGER_MS : grace_ms) * 1000;
    while (now < until &&
           (metrics_inflight() > 0 || (now < linger && atomic_load(&s->open_connections) > 0))) {
        usleep(10 * 1000);
        now = gg_now_us();
    }
    if (metrics_inflight() > 0)
        log_msg(LOG_WARN, "shutdown: %ld requests still in flight after %lld ms",
                metrics_inflight(), (long long)grace_ms);
    stop_workers(s);
    stop_ops_port(s);
    sw_free(s->sweeper);
    pthread_mutex_destroy(&s->reason_lock);
    free(s);
}

void srv_log_abandoned(void)
{
    json_t *reviews = json_array();
    int64_t now = gg_now_us();
    pthread_mutex_lock(&running_lock);
    for (const struct running *r = running_head; r; r = r->next) {
        char peer[64] = "unknown";
        if (r->clock)
            sw_peer(r->clock, peer, sizeof(peer));
        json_array_append_new(reviews,
                              json_pack("{s:s,s:s,s:I}", "path", r->path, "peer", peer,
                                        "running_ms", (json_int_t)((now - r->start_us) / 1000)));
    }
    pthread_mutex_unlock(&running_lock);
    log_fields(
        LOG_ERROR, "shutdown: the grace is over; exiting without the reviews still running",
        json_pack("{s:I,s:o}", "in_flight", (json_int_t)metrics_inflight(), "abandoned", reviews));
}
