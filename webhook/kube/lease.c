/*
 * lease.c - the Lease leader elector (lease.h): one thread per elector,
 * acquire rounds, then renewals until the renew deadline passes without
 * one, the release on stop.  It keeps no other state than the Lease last
 * read or written and when its record was last seen to change.
 */
#include "kube/lease.h"

#include "util/clock.h"
#include "util/log.h"
#include "util/metrics.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define NS_PER_MS 1000000

/* How a round ended. */
enum round {
    ROUND_OK,      /* this candidate holds the Lease: written just now */
    ROUND_HELD,    /* another holder's Lease is still valid */
    ROUND_LOST,    /* a 409: another candidate wrote first */
    ROUND_FAILED,  /* an error, a timeout, an answer that is not a Lease */
    ROUND_STOPPED, /* lease_stop cancelled the request */
};

struct lease {
    struct kc_client *kc;
    char *ns, *name, *identity;
    char *path, *collection; /* .../leases/NAME and .../leases */
    struct lease_timing t;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    atomic_bool stop;
    atomic_bool leading;
    atomic_int_fast64_t renewed_ns; /* when the last successful write was sent (monotonic) */
    atomic_uint_fast64_t term;
    /* The thread's own. */
    json_t *cached;      /* the Lease as last written by this candidate, for the next renewal */
    char *observed;      /* the spec last seen, as compact JSON with sorted keys */
    int64_t observed_ns; /* when it was last seen to change (monotonic) */
    int64_t observed_duration_s;
    uint64_t rng;
    struct gg_err why; /* what the last round that failed said */
};

/* ---- pure helpers ------------------------------------------------------- */

enum gg_status lease_timing(const struct lease_config *cfg, struct lease_timing *out,
                            struct gg_err *err)
{
    struct lease_timing t = {
        .duration_ms = cfg->duration_ms ? cfg->duration_ms : LEASE_DEFAULT_DURATION_MS,
        .renew_deadline_ms =
            cfg->renew_deadline_ms ? cfg->renew_deadline_ms : LEASE_DEFAULT_RENEW_DEADLINE_MS,
        .retry_ms = cfg->retry_ms ? cfg->retry_ms : LEASE_DEFAULT_RETRY_MS};
    /* Seconds in leaseDurationSeconds are an int32; a day is far more than any use. */
    const int64_t most = 86400000;
    if (t.duration_ms < 0 || t.renew_deadline_ms < 0 || t.retry_ms < 0 || t.duration_ms > most)
        return gg_fail(err, GG_ERR_INVALID,
                       "lease timings: durations must be positive and at most a day (%lld, "
                       "%lld, %lld ms)",
                       (long long)t.duration_ms, (long long)t.renew_deadline_ms,
                       (long long)t.retry_ms);
    if (t.duration_ms <= t.renew_deadline_ms)
        return gg_fail(err, GG_ERR_INVALID,
                       "lease timings: the lease duration (%lld ms) must be longer than the "
                       "renew deadline (%lld ms)",
                       (long long)t.duration_ms, (long long)t.renew_deadline_ms);
    /* renew_deadline > 1.2 x retry, in integers */
    if (t.renew_deadline_ms * 5 <= t.retry_ms * 6)
        return gg_fail(err, GG_ERR_INVALID,
                       "lease timings: the renew deadline (%lld ms) must be longer than 1.2 x the "
                       "retry period (%lld ms)",
                       (long long)t.renew_deadline_ms, (long long)t.retry_ms);
    *out = t;
    return GG_OK;
}

bool lease_microtime(const struct timespec *utc, char out[LEASE_MICROTIME_LEN])
{
    struct tm tm;
    if (utc->tv_nsec < 0 || utc->tv_nsec >= 1000000000 || !gmtime_r(&utc->tv_sec, &tm) ||
        tm.tm_year < -1900 || tm.tm_year > 9999 - 1900)
        return false;
    /* The fields are in range; the modulos tell the compiler so. */
    snprintf(out, LEASE_MICROTIME_LEN, "%04u-%02u-%02uT%02u:%02u:%02u.%06uZ",
             (unsigned)(tm.tm_year + 1900) % 10000u, (unsigned)(tm.tm_mon + 1) % 100u,
             (unsigned)tm.tm_mday % 100u, (unsigned)tm.tm_hour % 100u, (unsigned)tm.tm_min % 100u,
             (unsigned)tm.tm_sec % 100u, (unsigned)(utc->tv_nsec / 1000) % 1000000u);
    return true;
}

int64_t lease_jitter_ms(int64_t period_ms, double unit)
{
    if (!(unit >= 0) || unit >= 1)
        unit = 0;
    return period_ms + (int64_t)(unit * 1.2 * (double)period_ms);
}

int64_t lease_duration_seconds(int64_t duration_ms)
{
    int64_t s = (duration_ms + 999) / 1000;
    return s < 1 ? 1 : s;
}

/* ---- state -------------------------------------------------------------- */

static double next_unit(struct lease *l)
{
    uint64_t z = (l->rng += 0x9E3779B97F4A7C15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / (double)(1ull << 53);
}

static uint64_t random_seed(void)
{
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != (ssize_t)sizeof(seed))
        seed = (uint64_t)gg_now_ns() ^ ((uint64_t)getpid() << 32);
    return seed;
}

/* "<hostname>_<16 hex digits>", as kube-controller-manager names its candidates. */
static char *default_identity(uint64_t random)
{
    char host[256] = "";
    if (gethostname(host, sizeof(host) - 1) != 0 || !*host)
        snprintf(host, sizeof(host), "gpuguard");
    char *id = malloc(LEASE_IDENTITY_MAX);
    if (id)
        snprintf(id, LEASE_IDENTITY_MAX, "%.200s_%016llx", host, (unsigned long long)random);
    return id;
}

static void now_microtime(char out[LEASE_MICROTIME_LEN])
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (!lease_microtime(&ts, out))
        snprintf(out, LEASE_MICROTIME_LEN, "1970-01-01T00:00:00.000000Z");
}

static void log_change(const struct lease *l, enum log_level level, const char *msg,
                       const char *why)
{
    struct log_line line;
    if (!log_begin(&line, level, msg))
        return;
    log_str(&line, "namespace", l->ns);
    log_str(&line, "lease", l->name);
    log_str(&line, "identity", l->identity);
    log_int(&line, "term", (int64_t)atomic_load(&l->term));
    if (why)
        log_str(&line, "reason", why);
    log_end(&line);
}

/* ---- requests ----------------------------------------------------------- */

/*
 * One request of the elector, bounded by timeout_ms and cancelled by
 * lease_stop when cancellable.  The HTTP status (0: none came, l->why says
 * why); *obj the answer of a 2xx (a JSON object), else NULL.
 */
static long call(struct lease *l, const char *method, const char *path, const json_t *body,
                 int64_t timeout_ms, bool cancellable, json_t **obj)
{
    *obj = NULL;
    if (timeout_ms < 1) /* l->why keeps what the last request said */
        return 0;
    char *text = NULL;
    size_t len = 0;
    if (body && gg_json_dump(body, JSON_COMPACT, &text, &len) != GG_OK) {
        gg_fail(&l->why, GG_ERR_NOMEM, "out of memory");
        return 0;
    }
    char what[320];
    snprintf(what, sizeof(what), "lease %s/%s", l->ns, l->name);
    struct kc_request rq = {.path = path,
                            .what = what,
                            .timeout_ms = (long)timeout_ms,
                            .cancel = cancellable ? &l->stop : NULL,
                            .max_body = LEASE_MAX_BODY};
    struct kc_write w = {.method = method, .body = text, .len = len};
    struct kc_response resp;
    enum gg_status st = kc_send(l->kc, &rq, &w, &resp, &l->why);
    long status = st == GG_OK ? resp.status : 0;
    if (status == 401)
        kc_token_invalidate(l->kc);
    if (status >= 200 && status < 300) {
        json_error_t jerr;
        *obj = json_loads(resp.body, 0, &jerr);
        if (!json_is_object(*obj) || !json_string_value(json_object_get(
                                         json_object_get(*obj, "metadata"), "resourceVersion"))) {
            json_decref(*obj);
            *obj = NULL;
            gg_fail(&l->why, GG_ERR_PARSE, "%s %s: the answer is not a Lease", method, what);
            status = 0;
        }
    } else if (status) {
        /* The message of the Kubernetes Status the API server answers with, else the body. */
        json_t *answer = resp.body ? json_loads(resp.body, 0, NULL) : NULL;
        const char *msg = json_string_value(json_object_get(answer, "message"));
        if (!msg)
            msg = resp.body ? resp.body : "";
        gg_fail(&l->why, GG_ERR_INVALID, "%s %s: HTTP %ld: %.160s", method, what, status, msg);
        json_decref(answer);
    }
    if (resp.cancelled)
        status = -1;
    kc_response_clear(&resp);
    free(text);
    return status;
}

/* The time left until until_ns, in milliseconds (at most the renew deadline). */
static int64_t left_ms(const struct lease *l, int64_t until_ns)
{
    int64_t ms = (until_ns - gg_now_ns()) / NS_PER_MS;
    return ms > l->t.renew_deadline_ms ? l->t.renew_deadline_ms : ms;
}

/* Note a Lease this candidate read or wrote: its spec, when it changed, its duration. */
static void observe(struct lease *l, const json_t *lease, int64_t now)
{
    const json_t *spec = json_object_get(lease, "spec");
    char *text = NULL;
    size_t len;
    if (gg_json_dump(spec ? spec : json_null(), JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY,
                     &text, &len) != GG_OK)
        return;
    if (!l->observed || strcmp(text, l->observed) != 0) {
        free(l->observed);
        l->observed = text;
        l->observed_ns = now;
    } else {
        free(text);
    }
    l->observed_duration_s = json_integer_value(json_object_get(spec, "leaseDurationSeconds"));
}

/* A successful write: the Lease to renew next time, and when it was sent. */
static void wrote(struct lease *l, json_t *lease, int64_t sent_ns)
{
    observe(l, lease, gg_now_ns());
    json_decref(l->cached);
    l->cached = lease;
    atomic_store(&l->renewed_ns, sent_ns);
}

/* Set spec's fields: this candidate holding since acquired (NULL: keep), renewed now. */
static bool set_holder(json_t *spec, const char *holder, int64_t duration_s, const char *acquired,
                       const char *now, json_int_t transitions)
{
    return json_object_set_new(spec, "holderIdentity", json_string(holder)) == 0 &&
           json_object_set_new(spec, "leaseDurationSeconds", json_integer(duration_s)) == 0 &&
           (!acquired || json_object_set_new(spec, "acquireTime", json_string(acquired)) == 0) &&
           json_object_set_new(spec, "renewTime", json_string(now)) == 0 &&
           json_object_set_new(spec, "leaseTransitions", json_integer(transitions)) == 0;
}

/* POST or PUT lease; on success the answer becomes the cached Lease. */
static enum round write_lease(struct lease *l, const char *method, const json_t *lease,
                              int64_t until_ns)
{
    json_t *got = NULL;
    int64_t sent = gg_now_ns();
    long status = call(l, method, strcmp(method, "POST") == 0 ? l->collection : l->path, lease,
                       left_ms(l, until_ns), true, &got);
    if (status >= 200 && status < 300) {
        wrote(l, got, sent);
        return ROUND_OK;
    }
    json_decref(got);
    return status == -1 ? ROUND_STOPPED : status == 409 ? ROUND_LOST : ROUND_FAILED;
}

/* No Lease yet: create it, held by this candidate. */
static enum round create(struct lease *l, const char *now, int64_t until_ns)
{
    json_t *spec = json_object();
    json_t *lease =
        json_pack("{s:s, s:s, s:{s:s, s:s}, s:o}", "apiVersion", "coordination.k8s.io/v1", "kind",
                  "Lease", "metadata", "name", l->name, "namespace", l->ns, "spec", spec);
    enum round r = ROUND_FAILED;
    if (lease &&
        set_holder(spec, l->identity, lease_duration_seconds(l->t.duration_ms), now, now, 0))
        r = write_lease(l, "POST", lease, until_ns);
    else
        gg_fail(&l->why, GG_ERR_NOMEM, "out of memory");
    json_decref(lease);
    return r;
}

/* The renewal of the Lease this candidate wrote last: the fast path, no GET. */
static enum round renew_cached(struct lease *l, const char *now, int64_t until_ns)
{
    json_t *lease = json_deep_copy(l->cached);
    json_t *spec = json_object_get(lease, "spec");
    enum round r = ROUND_FAILED;
    if (json_is_object(spec) &&
        set_holder(spec, l->identity, lease_duration_seconds(l->t.duration_ms), NULL, now,
                   json_integer_value(json_object_get(spec, "leaseTransitions"))))
        r = write_lease(l, "PUT", lease, until_ns);
    json_decref(lease);
    return r;
}

/*
 * One try to acquire or renew (client-go's tryAcquireOrRenew), its requests
 * bounded by until_ns.
 */
static enum round try_acquire_or_renew(struct lease *l, int64_t until_ns)
{
    char now[LEASE_MICROTIME_LEN];
    now_microtime(now);
    /* 1. The leader renews what it wrote last while that is still valid. */
    if (atomic_load(&l->leading) && l->cached &&
        l->observed_ns + l->observed_duration_s * 1000 * NS_PER_MS > gg_now_ns()) {
        enum round r = renew_cached(l, now, until_ns);
        if (r == ROUND_OK || r == ROUND_STOPPED)
            return r;
    }
    /* 2. Read the Lease; create it when there is none. */
    json_t *lease = NULL;
    long status = call(l, "GET", l->path, NULL, left_ms(l, until_ns), true, &lease);
    if (status == 404)
        return create(l, now, until_ns);
    if (status != 200) {
        json_decref(lease);
        return status == -1 ? ROUND_STOPPED : ROUND_FAILED;
    }
    /* 3. Its record changed: the holder's time starts again now. */
    observe(l, lease, gg_now_ns());
    json_t *spec = json_object_get(lease, "spec");
    if (!json_is_object(spec)) {
        spec = json_object();
        json_object_set_new(lease, "spec", spec);
    }
    const char *holder = json_string_value(json_object_get(spec, "holderIdentity"));
    bool mine = holder && strcmp(holder, l->identity) == 0;
    /* 4. Another holder whose lease has not run out on this clock keeps it. */
    if (holder && *holder && !mine &&
        l->observed_ns + l->observed_duration_s * 1000 * NS_PER_MS > gg_now_ns()) {
        gg_fail(&l->why, GG_ERR_EXISTS, "held by %.200s", holder);
        json_decref(lease);
        return ROUND_HELD;
    }
    /* 5. Take it (a transition) or renew it, with the resourceVersion just read. */
    json_int_t transitions = json_integer_value(json_object_get(spec, "leaseTransitions"));
    bool keep_acquired = mine && json_string_value(json_object_get(spec, "acquireTime"));
    enum round r = ROUND_FAILED;
    if (set_holder(spec, l->identity, lease_duration_seconds(l->t.duration_ms),
                   keep_acquired ? NULL : now, now, mine ? transitions : transitions + 1))
        r = write_lease(l, "PUT", lease, until_ns);
    else
        gg_fail(&l->why, GG_ERR_NOMEM, "out of memory");
    json_decref(lease);
    return r;
}

/* ---- the thread --------------------------------------------------------- */

static void become_leader(struct lease *l)
{
    atomic_fetch_add(&l->term, 1);
    atomic_store(&l->leading, true);
    metrics_leader(true);
    log_change(l, LOG_INFO, "lease: leading", NULL);
}

static void step_down(struct lease *l, const char *why)
{
    atomic_store(&l->leading, false);
    metrics_leader(false);
    log_change(l, LOG_WARN, "lease: stopped leading", why);
}

static bool pause_ms(struct lease *l, int64_t ms)
{
    return kc_pause_ms(&l->lock, &l->cond, &l->stop, ms < 1 ? 1 : ms);
}

/* Candidate: a round every retry period, jittered, until one succeeds.  False when stopped. */
static bool acquire(struct lease *l)
{
    while (!atomic_load(&l->stop)) {
        enum round r = try_acquire_or_renew(l, gg_now_ns() + l->t.renew_deadline_ms * NS_PER_MS);
        if (r == ROUND_OK) {
            become_leader(l);
            return true;
        }
        if (r == ROUND_FAILED) {
            struct log_line line;
            if (log_begin(&line, LOG_DEBUG, "lease: try failed")) {
                log_str(&line, "lease", l->name);
                log_str(&line, "error", l->why.msg);
                log_end(&line);
            }
        }
        if (r == ROUND_STOPPED || !pause_ms(l, lease_jitter_ms(l->t.retry_ms, next_unit(l))))
            break;
    }
    return false;
}

/* Leader: a renewal every retry period; tries again (every retry period) until the renew deadline
 * after the last success.  Returns when leadership is lost (stepped down) or on stop. */
static void renew(struct lease *l)
{
    while (pause_ms(l, l->t.retry_ms)) {
        for (;;) {
            int64_t until = atomic_load(&l->renewed_ns) + l->t.renew_deadline_ms * NS_PER_MS;
            if (gg_now_ns() >= until) {
                char why[300];
                snprintf(why, sizeof(why), "no renewal within the renew deadline: %s", l->why.msg);
                step_down(l, why);
                return;
            }
            enum round r = try_acquire_or_renew(l, until);
            if (r == ROUND_OK)
                break;
            if (r == ROUND_STOPPED)
                return;
            if (r == ROUND_HELD) {
                step_down(l, l->why.msg);
                return;
            }
            int64_t wait = (until - gg_now_ns()) / NS_PER_MS;
            if (!pause_ms(l, wait < l->t.retry_ms ? wait : l->t.retry_ms))
                return;
        }
    }
}

/* Give the Lease up: empty holder, a 1 s duration (client-go's ReleaseOnCancel). */
static void release(struct lease *l)
{
    int64_t until = atomic_load(&l->renewed_ns) + l->t.renew_deadline_ms * NS_PER_MS;
    bool held = lease_is_leader(l) && l->cached;
    atomic_store(&l->leading, false);
    metrics_leader(false);
    if (!held)
        return;
    char now[LEASE_MICROTIME_LEN];
    now_microtime(now);
    json_t *lease = json_deep_copy(l->cached);
    json_t *spec = json_object_get(lease, "spec");
    json_t *got = NULL;
    long status = 0;
    int64_t ms = left_ms(l, until);
    if (json_is_object(spec) &&
        set_holder(spec, "", 1, now, now,
                   json_integer_value(json_object_get(spec, "leaseTransitions"))))
        status = call(l, "PUT", l->path, lease,
                      ms < LEASE_RELEASE_MAX_MS ? ms : LEASE_RELEASE_MAX_MS, false, &got);
    json_decref(got);
    json_decref(lease);
    log_change(l, status >= 200 && status < 300 ? LOG_INFO : LOG_WARN,
               status >= 200 && status < 300 ? "lease: released" : "lease: release failed",
               status >= 200 && status < 300 ? NULL : l->why.msg);
}

static void *run(void *arg)
{
    struct lease *l = arg;
    while (acquire(l)) {
        renew(l);
        if (atomic_load(&l->stop))
            break;
    }
    if (atomic_load(&l->leading))
        release(l);
    return NULL;
}

/* ---- API ---------------------------------------------------------------- */

static void lease_free(struct lease *l)
{
    kc_free(l->kc);
    json_decref(l->cached);
    free(l->observed);
    free(l->ns);
    free(l->name);
    free(l->identity);
    free(l->path);
    free(l->collection);
    pthread_mutex_destroy(&l->lock);
    pthread_cond_destroy(&l->cond);
    free(l);
}

static char *path_of(const char *ns, const char *name)
{
    char text[600];
    int n = snprintf(text, sizeof(text), "/apis/coordination.k8s.io/v1/namespaces/%s/leases%s%s",
                     ns, name ? "/" : "", name ? name : "");
    return n > 0 && (size_t)n < sizeof(text) ? strdup(text) : NULL;
}

static enum gg_status check_config(const struct lease_config *cfg, struct gg_err *err)
{
    if (!cfg->namespace || !gg_dns_label(cfg->namespace))
        return gg_fail(err, GG_ERR_INVALID, "lease: namespace \"%.80s\" is not a DNS label",
                       cfg->namespace ? cfg->namespace : "");
    if (!gg_dns_subdomain(cfg->name))
        return gg_fail(err, GG_ERR_INVALID,
                       "lease: name \"%.80s\" is not a DNS subdomain (lowercase letters, digits, "
                       "'-' and '.')",
                       cfg->name ? cfg->name : "");
    if (cfg->identity) {
        json_t *probe = json_string(cfg->identity);
        bool ok = probe && *cfg->identity && strlen(cfg->identity) < LEASE_IDENTITY_MAX;
        json_decref(probe);
        if (!ok)
            return gg_fail(err, GG_ERR_INVALID,
                           "lease: the identity must be UTF-8 text of 1 to %d bytes",
                           LEASE_IDENTITY_MAX - 1);
    }
    return GG_OK;
}

enum gg_status lease_start(struct kc_client *c, const struct lease_config *cfg, struct lease **out,
                           struct gg_err *err)
{
    struct lease_timing t;
    enum gg_status st = check_config(cfg, err);
    if (st == GG_OK)
        st = lease_timing(cfg, &t, err);
    if (st != GG_OK)
        return st;
    struct lease *l = calloc(1, sizeof(*l));
    if (!l)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&l->lock, NULL);
    kc_cond_init(&l->cond);
    l->t = t;
    l->rng = random_seed();
    l->ns = strdup(cfg->namespace);
    l->name = strdup(cfg->name);
    l->identity = cfg->identity ? strdup(cfg->identity) : default_identity(random_seed());
    l->path = path_of(cfg->namespace, cfg->name);
    l->collection = path_of(cfg->namespace, NULL);
    if (!l->ns || !l->name || !l->identity || !l->path || !l->collection)
        st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
    else
        st = kc_clone(c, &l->kc, err);
    if (st == GG_OK) {
        metrics_leader(false);
        log_change(l, LOG_INFO, "lease: candidate", NULL);
        if (pthread_create(&l->thread, NULL, run, l) != 0)
            st = gg_fail(err, GG_ERR_NOMEM, "lease: cannot start its thread");
    }
    if (st != GG_OK) {
        lease_free(l);
        return st;
    }
    *out = l;
    return GG_OK;
}

bool lease_is_leader(const struct lease *l)
{
    if (!l || !atomic_load(&l->leading))
        return false;
    return gg_now_ns() - atomic_load(&l->renewed_ns) < l->t.renew_deadline_ms * NS_PER_MS;
}

uint64_t lease_term(const struct lease *l)
{
    return l ? atomic_load(&l->term) : 0;
}

const char *lease_identity(const struct lease *l)
{
    return l->identity;
}

void lease_stop(struct lease *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->lock);
    atomic_store(&l->stop, true);
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->lock);
    pthread_join(l->thread, NULL);
    lease_free(l);
}
