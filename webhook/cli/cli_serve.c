/*
 * cli_serve.c - `gpuguard serve`: flags, certificates, the server's life
 * cycle and signals.
 *
 * SIGTERM and SIGINT are blocked in every thread and taken by sigwait in
 * the main thread, which then drains the server: stop accepting, let the
 * requests in flight finish, exit 0.  A thread started with the drain ends
 * the process SHUTDOWN_MARGIN_MS past --shutdown-grace if it has not ended
 * by then: a review stuck in a C call that no budget reaches never returns,
 * and the drain would wait for its worker forever.  It logs the reviews it
 * abandons and exits EXIT_ABANDONED.
 *
 * With the inventory on (in a cluster, or with --kubeconfig), informer
 * threads keep the GPU usage of pods and ResourceClaims for gpuguard.usage()
 * and the claims and templates for gpuguard.dra(); /readyz says whether the
 * pods have synced, but readiness is about serving and stays 200.
 * With rightsizing on and a Prometheus URL configured, a thread keeps the
 * workloads' GPU memory history for gpuguard.rightsize(); /readyz says how
 * fresh it is, in a line of its own.
 */
#include "util/arena.h"
#include "engine/charger.h"
#include "cli/cli.h"
#include "cli/engine_opts.h"
#include "engine/config.h"
#include "engine/dirwatch.h"
#include "kube/informer.h"
#include "kube/inventory.h"
#include "kube/ledger.h"
#include "kube/quotactl.h"
#include "engine/audit.h"
#include "util/duration.h"
#include "kube/kubeclient.h"
#include "util/log.h"
#include "engine/policy.h"
#include "kube/promsource.h"
#include "engine/reload.h"
#include "kube/rsstore.h"
#include "util/metrics.h"
#include "http/clientauth.h"
#include "http/server.h"
#include "http/tlscreds.h"
#include "http/certkeeper.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

struct serve_opts {
    const char *listen;
    const char *ops_listen;
    const char *tls_cert;
    const char *tls_key;
    const char *tls_secret;     /* --tls-secret: certificates gpuguard keeps (certkeeper.h) */
    const char *tls_service;    /* --tls-service */
    const char *webhook_config; /* --webhook-configuration (gpuguard with --tls-secret) */
    bool secret_only;           /* a flag that only --tls-secret uses was given */
    const char *failure_policy; /* --webhook-failure-policy */
    int64_t cert_ms[3];         /* --ca-validity, --cert-validity, --cert-check */
    struct engine_opts engine;
    const char *client_ca;
    struct clientauth_names client_names; /* --client-cn, --client-san */
    unsigned threads;
    size_t max_body;
    unsigned max_connections;
    unsigned shutdown_grace_s;
    unsigned request_timeout_s;
    unsigned ops_per_peer;
    int inventory; /* -1: on when in a cluster or with --kubeconfig; 0: off; 1: on */
    const char *kubeconfig;
    bool quota_ledger; /* --quota-ledger (with the inventory) */
    const char *lease_namespace, *lease_name;
    int64_t lease_ms[3];    /* --lease-duration, --lease-renew-deadline, --lease-retry */
    int64_t entry_bound_ms; /* --quota-entry-bound */
};

#define SERVE_HELP_WIDTH 25 /* the flag column of --help */
/* After --shutdown-grace, the time the rest of the drain has before the process ends regardless. */
#define SHUTDOWN_MARGIN_MS 2000
/* The exit status then. */
#define EXIT_ABANDONED 1
/* How long the line naming the abandoned reviews may take to write (stderr may be stalled). */
#define ABANDON_LOG_S 1

static void serve_usage(FILE *out)
{
    fprintf(out, "usage: gpuguard serve (--tls-cert FILE --tls-key FILE | --tls-secret [NS/]NAME)\n"
                 "                      [flags]\n"
                 "\n"
                 "Serve the admission webhook over HTTPS (POST /mutate, POST /validate) and the\n"
                 "ops endpoints over plain HTTP (GET /healthz, /readyz, /metrics).\n"
                 "\n"
                 "flags:\n"
                 "  --listen ADDR:PORT        webhook address, HTTPS only [0.0.0.0:8443]\n"
                 "  --ops-listen ADDR:PORT    ops address, plain HTTP [0.0.0.0:9090]\n"
                 "  --tls-cert FILE           serving certificate (PEM, leaf first), reloaded\n"
                 "                            when the file changes\n"
                 "  --tls-key FILE            its private key (PEM)\n"
                 "  --tls-secret [NS/]NAME    instead of the two above: gpuguard makes its own\n"
                 "                            CA and serving certificate, keeps them in this\n"
                 "                            Secret (shipped empty; NS: POD_NAMESPACE, else the\n"
                 "                            service account's), renews them, and writes the CA\n"
                 "                            into its webhook configurations (docs/security.md)\n"
                 "  --tls-service NAME        the Service the certificate names [gpuguard]\n"
                 "  --webhook-configuration NAME\n"
                 "                            the Validating- and MutatingWebhookConfiguration\n"
                 "                            whose failurePolicy gpuguard writes once it serves\n"
                 "                            (the manifests ship them Ignore), and with\n"
                 "                            --tls-secret their caBundle; with --tls-cert, once\n"
                 "                            their caBundle trusts it [gpuguard with\n"
                 "                            --tls-secret, else none]\n"
                 "  --webhook-failure-policy Fail|Ignore\n"
                 "                            the failurePolicy written [Fail]\n"
                 "  --ca-validity D, --cert-validity D\n"
                 "                            lifetimes of the CA and the serving certificate;\n"
                 "                            each is renewed with a third left [87600h, 8760h]\n"
                 "  --cert-check D            how often the Secret and the webhook\n"
                 "                            configurations are checked [10s]\n"
                 "  --client-ca FILE          require client certificates signed by these CAs\n"
                 "                            (mutual TLS with the API server) [off]\n"
                 "  --client-cn NAME          with --client-ca, accept only certificates whose\n"
                 "                            subject CN is NAME (repeat the flag for more names;\n"
                 "                            with --client-san too, either kind of name will do)\n"
                 "                            [any certificate of the CAs]\n"
                 "  --client-san NAME         likewise for a DNS or URI subject alternative name\n"
                 "                            (repeatable) [any certificate of the CAs]\n");
    eo_help_engine(out, EO_ENGINE, SERVE_HELP_WIDTH);
    fprintf(out, "  --threads N               webhook worker threads; new connections go to\n"
                 "                            each in turn, skipping those busy with a review\n"
                 "                            [number of CPUs]\n"
                 "  --max-body BYTES          larger request bodies get 413 [16777216]\n"
                 "  --max-connections N       open connections on the webhook port; with all\n"
                 "                            taken, the one idle the longest makes room [4096]\n"
                 "  --request-timeout SECONDS time for a request's headers and body [10]\n"
                 "                            (a late request's connection is closed; between\n"
                 "                            requests, kept-alive connections wait 120 s)\n"
                 "  --ops-max-per-peer N      ops port connections one address may hold waiting\n"
                 "                            for its request (a new one closes its oldest),\n"
                 "                            and again being answered; probes are answered\n"
                 "                            as soon as they arrive, whatever the count [8]\n");
    fprintf(out,
            "  --shutdown-grace SECONDS  on SIGTERM, time for requests in flight; %d s after\n"
            "                            it the process exits %d whatever still runs [30]\n",
            SHUTDOWN_MARGIN_MS / 1000, EXIT_ABANDONED);
    fprintf(out, "  --inventory on|off        GPU usage per namespace from the API server's pods\n"
                 "                            (list + watch) for quota policies [on in a cluster\n"
                 "                            or with --kubeconfig, else off]\n"
                 "  --kubeconfig FILE         reach the API server with this kubeconfig's current\n"
                 "                            context instead of the pod's service account\n"
                 "  --quota-ledger on|off     GPUQuota limits held exactly with any number of\n"
                 "                            replicas: admitted GPU pods are charged in the\n"
                 "                            quota's status, and a controller elected on a\n"
                 "                            Lease recounts it (docs/quotas.md) [on with the\n"
                 "                            inventory]\n"
                 "  --lease-namespace NS      the Lease that elects the replica running the quota\n"
                 "                            controller and the audit [POD_NAMESPACE, else the\n"
                 "                            service account's namespace, else gpuguard-system]\n"
                 "  --lease-name NAME         [gpuguard-quota]\n"
                 "  --lease-duration D, --lease-renew-deadline D, --lease-retry D\n"
                 "                            leader election's timings [15s, 10s, 2s]\n"
                 "  --quota-entry-bound D     a ledger entry whose pod never appeared (refused\n"
                 "                            after gpuguard admitted it) goes after this [30s]\n");
    eo_help_tail(out, SERVE_HELP_WIDTH, LOG_INFO);
    fprintf(out,
            "\n"
            "Port 0 picks a free port; the ports in use are logged at start.  The certificate\n"
            "and key are reloaded when their files change (a bad pair is refused and the\n"
            "current one kept); policies, the Lua library and the config likewise.\n"
            "With the inventory on, the elected replica audits what runs (the config's audit:\n"
            "section, docs/audit.md): reports of the running GPU pods and their workloads.\n"
            "With the config's rightsizing: section on (mode and prometheus.url), GPU memory\n"
            "history is read from Prometheus every refresh (docs/rightsizing.md).\n");
}

/* Parse a positive integer flag value within [min, max]. */
static int parse_uint(const char *flag, const char *text, unsigned long long min,
                      unsigned long long max, unsigned long long *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-' || v < min || v > max) {
        fprintf(stderr, "gpuguard serve: %s must be a whole number from %llu to %llu, got \"%s\"\n",
                flag, min, max, text);
        return -1;
    }
    *out = v;
    return 0;
}

enum {
    OPT_LISTEN = 256,
    OPT_OPS_LISTEN,
    OPT_TLS_CERT,
    OPT_TLS_KEY,
    OPT_CLIENT_CA,
    OPT_CLIENT_CN,
    OPT_CLIENT_SAN,
    OPT_THREADS,
    OPT_MAX_BODY,
    OPT_MAX_CONN,
    OPT_GRACE,
    OPT_REQUEST_TIMEOUT,
    OPT_OPS_PER_PEER,
    OPT_INVENTORY,
    OPT_KUBECONFIG,
    OPT_QUOTA_LEDGER,
    OPT_LEASE_NAMESPACE,
    OPT_LEASE_NAME,
    OPT_LEASE_DURATION,
    OPT_LEASE_RENEW,
    OPT_LEASE_RETRY,
    OPT_ENTRY_BOUND,
    OPT_CA_VALIDITY, /* the three durations of cert_ms, in its order */
    OPT_CERT_VALIDITY,
    OPT_CERT_CHECK,
    OPT_TLS_SECRET,
    OPT_TLS_SERVICE,
    OPT_WEBHOOK_CONFIG,
    OPT_FAILURE_POLICY,
};

static const struct option long_options[] = {
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"ops-listen", required_argument, NULL, OPT_OPS_LISTEN},
    {"tls-cert", required_argument, NULL, OPT_TLS_CERT},
    {"tls-key", required_argument, NULL, OPT_TLS_KEY},
    {"tls-secret", required_argument, NULL, OPT_TLS_SECRET},
    {"tls-service", required_argument, NULL, OPT_TLS_SERVICE},
    {"webhook-configuration", required_argument, NULL, OPT_WEBHOOK_CONFIG},
    {"webhook-failure-policy", required_argument, NULL, OPT_FAILURE_POLICY},
    {"ca-validity", required_argument, NULL, OPT_CA_VALIDITY},
    {"cert-validity", required_argument, NULL, OPT_CERT_VALIDITY},
    {"cert-check", required_argument, NULL, OPT_CERT_CHECK},
    {"client-ca", required_argument, NULL, OPT_CLIENT_CA},
    {"client-cn", required_argument, NULL, OPT_CLIENT_CN},
    {"client-san", required_argument, NULL, OPT_CLIENT_SAN},
    {"threads", required_argument, NULL, OPT_THREADS},
    {"max-body", required_argument, NULL, OPT_MAX_BODY},
    {"max-connections", required_argument, NULL, OPT_MAX_CONN},
    {"shutdown-grace", required_argument, NULL, OPT_GRACE},
    {"request-timeout", required_argument, NULL, OPT_REQUEST_TIMEOUT},
    {"ops-max-per-peer", required_argument, NULL, OPT_OPS_PER_PEER},
    {"inventory", required_argument, NULL, OPT_INVENTORY},
    {"kubeconfig", required_argument, NULL, OPT_KUBECONFIG},
    {"quota-ledger", required_argument, NULL, OPT_QUOTA_LEDGER},
    {"lease-namespace", required_argument, NULL, OPT_LEASE_NAMESPACE},
    {"lease-name", required_argument, NULL, OPT_LEASE_NAME},
    {"lease-duration", required_argument, NULL, OPT_LEASE_DURATION},
    {"lease-renew-deadline", required_argument, NULL, OPT_LEASE_RENEW},
    {"lease-retry", required_argument, NULL, OPT_LEASE_RETRY},
    {"quota-entry-bound", required_argument, NULL, OPT_ENTRY_BOUND},
    {NULL, 0, NULL, 0},
};

static int parse_number_flag(int opt, const char *arg, struct serve_opts *o)
{
    unsigned long long v;
    switch (opt) {
    case OPT_THREADS:
        if (parse_uint("--threads", arg, 1, 256, &v))
            return -1;
        o->threads = (unsigned)v;
        return 0;
    case OPT_MAX_BODY:
        if (parse_uint("--max-body", arg, 1024, 1ULL << 30, &v))
            return -1;
        o->max_body = (size_t)v;
        return 0;
    case OPT_MAX_CONN:
        if (parse_uint("--max-connections", arg, 1, 1000000, &v))
            return -1;
        o->max_connections = (unsigned)v;
        return 0;
    case OPT_REQUEST_TIMEOUT:
        if (parse_uint("--request-timeout", arg, 1, 3600, &v))
            return -1;
        o->request_timeout_s = (unsigned)v;
        return 0;
    case OPT_OPS_PER_PEER:
        if (parse_uint("--ops-max-per-peer", arg, 1, OPS_ANSWERING, &v))
            return -1;
        o->ops_per_peer = (unsigned)v;
        return 0;
    default: /* OPT_GRACE */
        if (parse_uint("--shutdown-grace", arg, 0, 3600, &v))
            return -1;
        o->shutdown_grace_s = (unsigned)v;
        return 0;
    }
}

/* One more name of a repeatable flag, at most CLIENTAUTH_NAMES_MAX. */
static int add_name(const char *flag, const char *name, const char **names, size_t *n)
{
    if (!*name || *n == CLIENTAUTH_NAMES_MAX) {
        fprintf(stderr, "gpuguard serve: %s takes a name that is not empty, %d times at most\n",
                flag, CLIENTAUTH_NAMES_MAX);
        return -1;
    }
    names[(*n)++] = name;
    return 0;
}

/* One of serve's own flags; -1 after saying what is wrong with its value. */
static int take_flag(void *ctx, int opt, const char *arg)
{
    struct serve_opts *o = ctx;
    switch (opt) {
    case OPT_LISTEN:
        o->listen = arg;
        return 0;
    case OPT_OPS_LISTEN:
        o->ops_listen = arg;
        return 0;
    case OPT_TLS_CERT:
        o->tls_cert = arg;
        return 0;
    case OPT_TLS_KEY:
        o->tls_key = arg;
        return 0;
    case OPT_TLS_SECRET:
        o->tls_secret = arg;
        return 0;
    case OPT_TLS_SERVICE:
        o->tls_service = arg;
        o->secret_only = true;
        return 0;
    case OPT_WEBHOOK_CONFIG:
        o->webhook_config = arg;
        return 0;
    case OPT_FAILURE_POLICY:
        if (strcmp(arg, "Fail") != 0 && strcmp(arg, "Ignore") != 0) {
            fprintf(stderr, "gpuguard serve: --webhook-failure-policy must be Fail or Ignore\n");
            return -1;
        }
        o->failure_policy = arg;
        return 0;
    case OPT_CLIENT_CA:
        o->client_ca = arg;
        return 0;
    case OPT_CLIENT_CN:
        return add_name("--client-cn", arg, o->client_names.cn, &o->client_names.n_cn);
    case OPT_CLIENT_SAN:
        return add_name("--client-san", arg, o->client_names.san, &o->client_names.n_san);
    case OPT_INVENTORY:
        if (strcmp(arg, "on") != 0 && strcmp(arg, "off") != 0) {
            fprintf(stderr, "gpuguard serve: --inventory must be on or off\n");
            return -1;
        }
        o->inventory = strcmp(arg, "on") == 0;
        return 0;
    case OPT_KUBECONFIG:
        o->kubeconfig = arg;
        return 0;
    case OPT_QUOTA_LEDGER:
        if (strcmp(arg, "on") != 0 && strcmp(arg, "off") != 0) {
            fprintf(stderr, "gpuguard serve: --quota-ledger must be on or off\n");
            return -1;
        }
        o->quota_ledger = strcmp(arg, "on") == 0;
        return 0;
    case OPT_LEASE_NAMESPACE:
        o->lease_namespace = arg;
        return 0;
    case OPT_LEASE_NAME:
        o->lease_name = arg;
        return 0;
    case OPT_LEASE_DURATION:
    case OPT_LEASE_RENEW:
    case OPT_LEASE_RETRY:
    case OPT_ENTRY_BOUND:
    case OPT_CA_VALIDITY:
    case OPT_CERT_VALIDITY:
    case OPT_CERT_CHECK: {
        int64_t ms;
        if (duration_parse_ms(arg, &ms) != GG_OK || ms <= 0) {
            fprintf(stderr, "gpuguard serve: a duration such as 15s or 500ms, got \"%s\"\n", arg);
            return -1;
        }
        if (opt == OPT_ENTRY_BOUND)
            o->entry_bound_ms = ms;
        else if (opt >= OPT_CA_VALIDITY)
            o->cert_ms[opt - OPT_CA_VALIDITY] = ms;
        else
            o->lease_ms[opt - OPT_LEASE_DURATION] = ms;
        o->secret_only = o->secret_only || opt == OPT_CA_VALIDITY || opt == OPT_CERT_VALIDITY;
        return 0;
    }
    default:
        return parse_number_flag(opt, arg, o);
    }
}

/* True to serve; false to exit with *exit_code (after --help or a usage error). */
static bool parse_flags(int argc, char **argv, struct serve_opts *o, int *exit_code)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    *o = (struct serve_opts){.listen = "0.0.0.0:8443",
                             .ops_listen = "0.0.0.0:9090",
                             .threads = cpus > 0 ? (unsigned)cpus : 1,
                             .max_body = 16 << 20,
                             .max_connections = 4096,
                             .shutdown_grace_s = 30,
                             .request_timeout_s = 10,
                             .ops_per_peer = OPS_PER_PEER,
                             .inventory = -1,
                             .quota_ledger = true,
                             .lease_name = "gpuguard-quota",
                             .tls_service = "gpuguard",
                             .failure_policy = "Fail",
                             .cert_ms = {CK_DEFAULT_CA_LIFETIME_S * 1000,
                                         CK_DEFAULT_CERT_LIFETIME_S * 1000, CK_DEFAULT_CHECK_MS}};
    static const struct eo_command serve_command = {
        .name = "gpuguard serve",
        .shared = EO_ENGINE,
        .log_level = LOG_INFO,
        .options = long_options,
        .take = take_flag,
        .help = serve_usage,
    };
    if (!eo_parse(&serve_command, o, argc, argv, &o->engine, exit_code))
        return false;
    const char *problem = NULL;
    if (o->tls_secret && (o->tls_cert || o->tls_key))
        problem = "--tls-secret keeps certificates itself: give it or --tls-cert and --tls-key, "
                  "not both";
    else if (!o->tls_secret && (!o->tls_cert || !o->tls_key))
        problem = "--tls-cert and --tls-key are required (or --tls-secret)";
    else if (!o->tls_secret && o->secret_only)
        problem = "--tls-service, --ca-validity and --cert-validity are for --tls-secret";
    else if (!o->client_ca && o->client_names.n_cn + o->client_names.n_san)
        problem = "--client-cn and --client-san need --client-ca (the CAs that sign the "
                  "client certificates they name)";
    if (problem) {
        fprintf(stderr, "gpuguard serve: %s\nrun 'gpuguard serve --help' for the flags\n", problem);
        *exit_code = 2;
        return false;
    }
    return true;
}

/* Every connection is a file descriptor: lift the soft limit to fit them (both ports'). */
static void raise_fd_limit(unsigned connections)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t want = (rlim_t)connections + 64;
    if (rl.rlim_cur < want) {
        rl.rlim_cur = rl.rlim_max < want ? rl.rlim_max : want;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < want)
        log_msg(LOG_WARN,
                "open file limit %llu is below the server's %u connections at most (twice "
                "--max-connections, plus the ops port's), plus headroom",
                (unsigned long long)rl.rlim_cur, connections);
}

static int wait_for_signal(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    int sig = 0;
    sigwait(&set, &sig);
    return sig;
}

static void *log_abandoned(void *arg)
{
    (void)arg;
    srv_log_abandoned();
    return NULL;
}

/* Sleep *arg, then end the process, after naming what it abandons (if stderr takes the line). */
static void *end_at_deadline(void *arg)
{
    struct timespec left = *(const struct timespec *)arg;
    while (nanosleep(&left, &left) != 0 && errno == EINTR)
        ;
    pthread_t logger;
    if (pthread_create(&logger, NULL, log_abandoned, NULL) == 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += ABANDON_LOG_S;
        pthread_timedjoin_np(logger, NULL, &until);
    }
    _exit(EXIT_ABANDONED);
}

/* The process ends grace_ms plus SHUTDOWN_MARGIN_MS from now at the latest. */
static void start_shutdown_deadline(int64_t grace_ms)
{
    static struct timespec delay;
    int64_t ms = grace_ms + SHUTDOWN_MARGIN_MS;
    delay = (struct timespec){.tv_sec = ms / 1000, .tv_nsec = ms % 1000 * 1000000};
    pthread_t thread;
    if (pthread_create(&thread, NULL, end_at_deadline, &delay) == 0)
        pthread_detach(thread);
    else
        log_msg(LOG_WARN, "shutdown: no deadline thread, a stuck review would hold the exit");
}

/* Reload the serving certificate when its files change; a bad pair keeps the old one. */
static void reload_certificate(void *ctx)
{
    const struct serve_opts *o = ctx;
    struct gg_err err = {{0}};
    enum gg_status st = tls_creds_load(o->tls_cert, o->tls_key, &err);
    metrics_tls(st == GG_OK, tls_creds_not_after());
    if (st == GG_OK) {
        char serial[80];
        tls_creds_serial(serial, sizeof(serial));
        log_fields(LOG_INFO, "certificate reloaded", json_pack("{s:s}", "serial", serial));
    } else {
        log_fields(LOG_ERROR, "certificate reload refused: the current certificate keeps serving",
                   json_pack("{s:s}", "error", err.msg));
    }
}

/* The namespace gpuguard runs in: POD_NAMESPACE (the downward API), else the service account's. */
static void own_namespace(char *out, size_t size)
{
    const char *env = getenv("POD_NAMESPACE");
    snprintf(out, size, "%s", env && *env ? env : "gpuguard-system");
    FILE *f = env && *env ? NULL : fopen(KC_SA_DIR "/namespace", "r");
    if (f && fgets(out, (int)size, f))
        out[strcspn(out, "\r\n")] = '\0';
    if (f)
        fclose(f);
}

/* A client of the API server: the kubeconfig's, else the pod's service account. */
static enum gg_status new_client(const struct serve_opts *o, struct kc_client **client,
                                 struct gg_err *err)
{
    return o->kubeconfig ? kc_new_kubeconfig(o->kubeconfig, client, err)
                         : kc_new_in_cluster(KC_SA_DIR, client, err);
}

/* --tls-secret: the certificates gpuguard keeps itself in a Secret (certkeeper.h). */
static enum gg_status start_own_certificates(const struct serve_opts *o, struct certkeeper **keeper,
                                             struct gg_err *err)
{
    char ns[256];
    const char *slash = strchr(o->tls_secret, '/');
    if (slash)
        snprintf(ns, sizeof(ns), "%.*s", (int)(slash - o->tls_secret), o->tls_secret);
    else
        own_namespace(ns, sizeof(ns));
    struct certkeeper_options ko = {.ns = ns,
                                    .secret = slash ? slash + 1 : o->tls_secret,
                                    .service = o->tls_service,
                                    .webhooks = o->webhook_config ? o->webhook_config : "gpuguard",
                                    .failure_policy = o->failure_policy,
                                    .ca_lifetime_s = o->cert_ms[0] / 1000,
                                    .cert_lifetime_s = o->cert_ms[1] / 1000,
                                    .check_ms = o->cert_ms[2]};
    struct kc_client *client = NULL;
    enum gg_status st = new_client(o, &client, err);
    return st == GG_OK ? certkeeper_start(client, &ko, keeper, err) : st;
}

/*
 * The serving certificate: from files, reloaded when they change, or kept in
 * a Secret with --tls-secret.  And the client CAs of --client-ca.
 */
static enum gg_status start_certificates(const struct serve_opts *o, struct dirwatch **watch,
                                         struct certkeeper **keeper, char **client_ca,
                                         struct gg_err *err)
{
    enum gg_status st = o->tls_secret ? start_own_certificates(o, keeper, err)
                                      : tls_creds_load(o->tls_cert, o->tls_key, err);
    if (st != GG_OK)
        return st;
    metrics_tls(true, tls_creds_not_after());
    if (o->client_ca) {
        size_t len;
        if ((st = gg_read_file(o->client_ca, 1 << 20, client_ca, &len, err)) != GG_OK)
            return st;
        if (!strstr(*client_ca, "-----BEGIN CERTIFICATE-----"))
            return gg_fail(err, GG_ERR_TLS, "%s: no PEM certificate in the file", o->client_ca);
    }
    if (o->tls_secret)
        return GG_OK;
    if (o->webhook_config) {
        struct certkeeper_options ko = {.cert_file = o->tls_cert,
                                        .webhooks = o->webhook_config,
                                        .failure_policy = o->failure_policy,
                                        .check_ms = o->cert_ms[2]};
        struct kc_client *client = NULL;
        if ((st = new_client(o, &client, err)) != GG_OK ||
            (st = certkeeper_start(client, &ko, keeper, err)) != GG_OK)
            return st;
    }
    char cert_dir[4096], key_dir[4096];
    dirwatch_dir_of(o->tls_cert, cert_dir, sizeof(cert_dir));
    dirwatch_dir_of(o->tls_key, key_dir, sizeof(key_dir));
    const char *dirs[] = {cert_dir, strcmp(cert_dir, key_dir) ? key_dir : NULL};
    return dirwatch_start(dirs, 2, reload_certificate, (void *)o, watch, err);
}

/* What every charge depends on: the configuration, and the cluster's DeviceClasses. */
static uint64_t generation(void *engine)
{
    struct inventory *inv = engine_inventory(engine);
    return engine_generation(engine) + (inv ? inv_class_changes(inv) : 0);
}

/* The inventory's informers: pods, the DRA objects and GPUQuotas (see informer.h). */
#define N_INFORMERS 6

/*
 * The inventory, its charger and its informers when on: --inventory off,
 * else a kubeconfig, else the service account when in a cluster; on without
 * either is an error.  Set on the engine before the first evaluation.  Each
 * informer has a client of its own (a client belongs to one thread), and the
 * templates' one a second for the GET of a template not seen yet.
 */
static enum gg_status start_inventory(const struct serve_opts *o, struct engine *engine,
                                      struct inventory **inv, struct charger **charger,
                                      struct informer *inf[N_INFORMERS], struct gg_err *err)
{
    bool in_cluster = kc_in_cluster(KC_SA_DIR);
    if (o->inventory == 0 || (o->inventory < 0 && !o->kubeconfig && !in_cluster)) {
        log_msg(LOG_INFO, "inventory: off (quota policies see no usage)");
        return GG_OK;
    }
    if (!o->kubeconfig && !in_cluster)
        return gg_fail(err, GG_ERR_INVALID,
                       "--inventory on needs --kubeconfig FILE or a pod's service account "
                       "(KUBERNETES_SERVICE_HOST and " KC_SA_DIR "/token)");
    if (!(*inv = inv_new()))
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    enum gg_status st = charger_new(engine, *inv, charger, err);
    if (st != GG_OK)
        return st;
    engine_set_inventory(engine, *inv);
    /* Classes, slices and templates first: the charges of claims and pods read them. */
    static const enum inf_kind kinds[N_INFORMERS] = {INF_CLASSES, INF_SLICES, INF_TEMPLATES,
                                                     INF_CLAIMS,  INF_QUOTAS, INF_PODS};
    for (size_t i = 0; st == GG_OK && i < N_INFORMERS; i++) {
        struct inf_options opts = {
            .kind = kinds[i], .generation = generation, .generation_ctx = engine};
        struct kc_client *client = NULL;
        st = new_client(o, &client, err);
        if (st == GG_OK && kinds[i] == INF_TEMPLATES &&
            (st = new_client(o, &opts.fetch_client, err)) != GG_OK)
            kc_free(client);
        if (st == GG_OK)
            st = inf_start(client, *inv, &opts, &inf[i], err);
    }
    return st;
}

/* Whether the live configuration gives ns a quota of its own (quotas.namespaces.<ns>). */
static bool configured_quota(void *ctx, const char *ns)
{
    struct policy_set *set = engine_live_set(ctx);
    const json_t *q = json_object_get(policy_set_config(set), "quotas");
    bool has = json_object_get(json_object_get(q, "namespaces"), ns) != NULL;
    policy_set_release(set);
    return has;
}

/*
 * With the inventory on: the election of the replica that does what one replica does at a
 * time, the quota controller's recounts and the audit (one Lease, --lease-name).
 */
static enum gg_status start_election(const struct serve_opts *o, struct inventory *inv,
                                     struct lease **lease, struct gg_err *err)
{
    if (!inv)
        return GG_OK;
    char ns[256];
    if (o->lease_namespace)
        snprintf(ns, sizeof(ns), "%s", o->lease_namespace);
    else
        own_namespace(ns, sizeof(ns));
    const char *pod = getenv("POD_NAME");
    struct lease_config lc = {.namespace = ns,
                              .name = o->lease_name,
                              .identity = pod && *pod ? pod : NULL,
                              .duration_ms = o->lease_ms[0],
                              .renew_deadline_ms = o->lease_ms[1],
                              .retry_ms = o->lease_ms[2]};
    struct kc_client *c = NULL;
    enum gg_status st = new_client(o, &c, err);
    if (st == GG_OK)
        st = lease_start(c, &lc, lease, err); /* it elects with a clone of c */
    kc_free(c);
    return st;
}

/*
 * With the inventory on and --quota-ledger on: the GPUQuota ledger admission
 * charges, and the controller that keeps it true (while this replica leads).
 */
static enum gg_status start_quota(const struct serve_opts *o, struct engine *engine,
                                  struct inventory *inv, struct lease *lease,
                                  struct ledger **ledger, struct quotactl **ctl, struct gg_err *err)
{
    if (!inv || !o->quota_ledger)
        return GG_OK;
    struct kc_client *writes = NULL, *control = NULL;
    enum gg_status st = new_client(o, &writes, err);
    if (st == GG_OK && (st = ledger_new(writes, inv, ledger, err)) == GG_OK)
        engine_set_ledger(engine, *ledger);
    struct quotactl_options qo = {.entry_bound_ms = o->entry_bound_ms,
                                  .lease = lease,
                                  .configured = configured_quota,
                                  .configured_ctx = engine};
    if (st == GG_OK && (st = new_client(o, &control, err)) == GG_OK)
        st = quotactl_start(control, inv, &qo, ctl, err);
    return st;
}

/* With the inventory on: the background audit (it works while this replica leads and the
 * configuration's audit.enabled is true). */
static enum gg_status start_audit(const struct serve_opts *o, struct engine *engine,
                                  struct inventory *inv, struct lease *lease, struct audit **out,
                                  struct gg_err *err)
{
    if (!inv)
        return GG_OK;
    struct kc_client *c = NULL;
    enum gg_status st = new_client(o, &c, err);
    struct audit_options ao = {.client = c,
                               .engine = engine,
                               .inv = inv,
                               .lease = lease,
                               .webhook_config = o->webhook_config};
    return st == GG_OK ? audit_start(&ao, out, err) : st;
}

/*
 * The rightsizing source when the configuration turns it on (mode
 * recommend or apply and a prometheus.url).  Its settings are read once,
 * here: a change to them needs a restart.
 */
static enum gg_status start_rightsizing(const struct serve_opts *o, struct inventory *inv,
                                        struct ps_source **out, struct gg_err *err)
{
    json_t *root = NULL;
    struct rs_settings s = {.mode = RS_OFF};
    enum gg_status st = cfg_load(o->engine.config, &root, err);
    if (st == GG_OK)
        st = rs_settings_parse(root, &s, err);
    json_decref(root);
    if (st != GG_OK || s.mode == RS_OFF || !*s.url) {
        if (st == GG_OK)
            log_msg(LOG_INFO, "rightsizing: off (%s)",
                    s.mode == RS_OFF ? "rightsizing.mode" : "no rightsizing.prometheus.url");
        return st;
    }
    return ps_start(&s, inv, out, err);
}

/* The /readyz lines after the first: the inventory's state, the rightsizing source's when on. */
static void inventory_note(void *ctx, char *out, size_t size)
{
    struct informer *inf = ctx;
    char state[256] = "off", rs[320];
    if (inf)
        inf_describe(inf, state, sizeof(state));
    rss_describe(rs, sizeof(rs));
    snprintf(out, size, "inventory: %s%s%s", state, *rs ? "\n" : "", rs);
}

static void log_serving(const struct serve_opts *o, struct srv *server, struct engine *engine)
{
    json_t *names = json_array();
    struct policy_set *set = engine_live_set(engine);
    for (size_t i = 0; i < policy_set_count(set); i++)
        json_array_append_new(names, json_string(policy_set_name(set, i)));
    policy_set_release(set);
    log_fields(LOG_INFO, "serving",
               json_pack("{s:s,s:i,s:i,s:i,s:o,s:b}", "version", GG_VERSION, "port",
                         srv_port(server), "ops_port", srv_ops_port(server), "threads",
                         (int)o->threads, "policies", names, "mtls", o->client_ca != NULL));
}

int cli_serve(int argc, char **argv)
{
    struct serve_opts o;
    int rc = 1;
    if (!parse_flags(argc, argv, &o, &rc))
        return rc;
    arena_install();
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit(SRV_MAX_FDS(o.max_connections));

    struct gg_err err = {{0}};
    struct engine *engine = NULL;
    struct reloader *reloader = NULL;
    struct dirwatch *cert_watch = NULL;
    struct certkeeper *keeper = NULL;
    struct srv *server = NULL;
    struct inventory *inventory = NULL;
    struct charger *charger = NULL;
    struct informer *informers[N_INFORMERS] = {NULL};
    struct ps_source *rightsizing = NULL;
    struct ledger *ledger = NULL;
    struct quotactl *quotactl = NULL;
    struct lease *lease = NULL;
    struct audit *audit = NULL;
    char *client_ca = NULL;
    if (start_certificates(&o, &cert_watch, &keeper, &client_ca, &err) != GG_OK ||
        eo_engine_new(&o.engine, &engine, &err) != GG_OK ||
        start_inventory(&o, engine, &inventory, &charger, informers, &err) != GG_OK ||
        start_election(&o, inventory, &lease, &err) != GG_OK ||
        start_quota(&o, engine, inventory, lease, &ledger, &quotactl, &err) != GG_OK ||
        start_audit(&o, engine, inventory, lease, &audit, &err) != GG_OK ||
        start_rightsizing(&o, inventory, &rightsizing, &err) != GG_OK ||
        reload_start(engine, &reloader, &err) != GG_OK)
        goto out;
    struct srv_config cfg = {.listen = o.listen,
                             .ops_listen = o.ops_listen,
                             .client_ca_pem = client_ca,
                             .client_names = &o.client_names,
                             .threads = o.threads,
                             .max_body = o.max_body,
                             .max_connections = o.max_connections,
                             .idle_timeout_s = 120,
                             .request_timeout_s = o.request_timeout_s,
                             .ops_per_peer = o.ops_per_peer,
                             .engine = engine,
                             .ready_note = inventory_note,
                             .ready_note_ctx = informers[N_INFORMERS - 1]}; /* pods' */
    if (srv_start(&cfg, &server, &err) != GG_OK)
        goto out;
    srv_set_ready(server, true, NULL);
    log_serving(&o, server, engine);
    certkeeper_serving(keeper);
    int sig = wait_for_signal();
    log_msg(LOG_INFO, "%s received: draining requests in flight", strsignal(sig));
    start_shutdown_deadline((int64_t)o.shutdown_grace_s * 1000);
    srv_stop(server, (int64_t)o.shutdown_grace_s * 1000);
    log_msg(LOG_INFO, "stopped");
    rc = 0;
out:
    if (rc)
        log_msg(LOG_ERROR, "%s", err.msg);
    dirwatch_stop(cert_watch);
    certkeeper_stop(keeper);
    reload_stop(reloader);
    ps_stop(rightsizing);
    audit_stop(audit);
    quotactl_stop(quotactl);
    lease_stop(lease); /* after the work it elects for: released when leading */
    for (size_t i = 0; i < N_INFORMERS; i++)
        inf_stop(informers[i]);
    ledger_free(ledger);
    charger_free(charger);
    engine_free(engine);
    inv_free(inventory);
    tls_creds_clear();
    free(client_ca);
    return rc;
}
