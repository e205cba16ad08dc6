/*
 * lease_tool.c - a Lease leader elector (kube/lease.h) and single API
 * requests (kc_send), for tests/integration/test_lease.py:
 *
 *   lease_tool --kubeconfig FILE --namespace NS --name N --identity ID
 *              [--duration-ms D --renew-ms R --retry-ms P] --for-ms T [--metrics]
 *       runs an elector and prints a line per change, "leader ID" or
 *       "follower ID", until T ms have passed or SIGTERM/SIGINT comes; then
 *       stops it (releasing a held Lease) and exits 0.  --metrics prints the
 *       gpuguard_leader* series at the end.  The elector's log is on stderr.
 *
 *   lease_tool --kubeconfig FILE --send METHOD PATH [--body TEXT] [--max-body N]
 *              [--timeout-ms T]
 *       one kc_send: prints "status N", then the body kept (if any) on the
 *       next line; exit 0, or 1 with "error <status name>: <message>".
 *
 * Exit 2 on a usage error.  Uses only the public API of the core library.
 */
#include "kube/kubeclient.h"
#include "kube/lease.h"
#include "util/buf.h"
#include "util/clock.h"
#include "util/metrics.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct args {
    const char *kubeconfig, *ns, *name, *identity;
    const char *send_method, *send_path, *body;
    long long duration_ms, renew_ms, retry_ms, for_ms, max_body, timeout_ms;
    bool metrics;
};

static int usage(void)
{
    fprintf(stderr, "usage: lease_tool --kubeconfig FILE --namespace NS --name N --identity ID\n"
                    "                  [--duration-ms D --renew-ms R --retry-ms P] --for-ms T "
                    "[--metrics]\n"
                    "       lease_tool --kubeconfig FILE --send METHOD PATH [--body TEXT] "
                    "[--max-body N] [--timeout-ms T]\n");
    return 2;
}

static bool number(const char *s, long long *out)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || v < 0)
        return false;
    *out = v;
    return true;
}

static bool parse(int argc, char **argv, struct args *a)
{
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(k, "--metrics") == 0) {
            a->metrics = true;
            continue;
        }
        if (!v)
            return false;
        i++;
        if (strcmp(k, "--kubeconfig") == 0)
            a->kubeconfig = v;
        else if (strcmp(k, "--namespace") == 0)
            a->ns = v;
        else if (strcmp(k, "--name") == 0)
            a->name = v;
        else if (strcmp(k, "--identity") == 0)
            a->identity = v;
        else if (strcmp(k, "--body") == 0)
            a->body = v;
        else if (strcmp(k, "--send") == 0 && i + 1 < argc) {
            a->send_method = v;
            a->send_path = argv[++i];
        } else if (!((strcmp(k, "--duration-ms") == 0 && number(v, &a->duration_ms)) ||
                     (strcmp(k, "--renew-ms") == 0 && number(v, &a->renew_ms)) ||
                     (strcmp(k, "--retry-ms") == 0 && number(v, &a->retry_ms)) ||
                     (strcmp(k, "--for-ms") == 0 && number(v, &a->for_ms)) ||
                     (strcmp(k, "--max-body") == 0 && number(v, &a->max_body)) ||
                     (strcmp(k, "--timeout-ms") == 0 && number(v, &a->timeout_ms))))
            return false;
    }
    return a->kubeconfig && (a->send_method || (a->ns && a->name && a->for_ms > 0));
}

static int send_one(struct kc_client *c, const struct args *a)
{
    struct kc_request rq = {.path = a->send_path,
                            .timeout_ms = a->timeout_ms ? (long)a->timeout_ms : 10000,
                            .max_body = (size_t)a->max_body};
    struct kc_write w = {
        .method = a->send_method, .body = a->body, .len = a->body ? strlen(a->body) : 0};
    struct kc_response resp;
    struct gg_err err = {{0}};
    enum gg_status st = kc_send(c, &rq, &w, &resp, &err);
    printf("status %ld\n", resp.status);
    if (resp.body)
        printf("%s\n", resp.body);
    if (st != GG_OK)
        printf("error %s: %s\n", gg_strerror(st), err.msg);
    kc_response_clear(&resp);
    return st == GG_OK ? 0 : 1;
}

static void say(const char *what, const char *id)
{
    printf("%s %s\n", what, id);
    fflush(stdout);
}

static void print_metrics(void)
{
    struct buf out;
    buf_init(&out, 1 << 20);
    if (metrics_render(&out) == GG_OK && out.data)
        for (char *line = strtok(out.data, "\n"); line; line = strtok(NULL, "\n"))
            if (strncmp(line, "gpuguard_leader", 15) == 0)
                printf("%s\n", line);
    buf_clear(&out);
}

static int elect(struct kc_client *c, const struct args *a, const sigset_t *signals)
{
    struct lease_config cfg = {.namespace = a->ns,
                               .name = a->name,
                               .identity = a->identity,
                               .duration_ms = a->duration_ms,
                               .renew_deadline_ms = a->renew_ms,
                               .retry_ms = a->retry_ms};
    struct lease *l = NULL;
    struct gg_err err = {{0}};
    if (lease_start(c, &cfg, &l, &err) != GG_OK) {
        fprintf(stderr, "lease_tool: %s\n", err.msg);
        return 1;
    }
    char id[LEASE_IDENTITY_MAX];
    snprintf(id, sizeof(id), "%s", lease_identity(l)); /* outlives l */
    bool leading = false;
    uint64_t term = 0;
    int64_t end = gg_now_ns() + (int64_t)a->for_ms * 1000000;
    struct timespec tick = {.tv_sec = 0, .tv_nsec = 20 * 1000000};
    while (gg_now_ns() < end && sigtimedwait(signals, NULL, &tick) < 0) {
        bool now = lease_is_leader(l);
        uint64_t t = lease_term(l);
        if (leading && (!now || t != term))
            say("follower", id);
        if (now && (!leading || t != term))
            say("leader", id);
        leading = now;
        term = t;
    }
    lease_stop(l);
    if (leading)
        say("follower", id);
    if (a->metrics)
        print_metrics();
    return 0;
}

int main(int argc, char **argv)
{
    struct args a = {0};
    if (!parse(argc, argv, &a))
        return usage();
    /* Every thread blocks these; the main loop takes them with sigtimedwait. */
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &signals, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct kc_client *c = NULL;
    struct gg_err err = {{0}};
    if (kc_new_kubeconfig(a.kubeconfig, &c, &err) != GG_OK) {
        fprintf(stderr, "lease_tool: %s\n", err.msg);
        return 1;
    }
    int rc = a.send_method ? send_one(c, &a) : elect(c, &a, &signals);
    kc_free(c);
    return rc;
}
