/*
 * test_opsdoor.c - the ops port's front door (http/opsdoor.h): what it
 * takes for a probe, and a live door on loopback: probes answered at once,
 * other requests handed over within their caps, the per-peer cap closing
 * an address's oldest waiting connection and never the new one (a probe
 * from an address at its cap is answered), a full door closing the oldest
 * of the address holding the most, and the request deadline.
 *
 * Addresses: 127.0.0.1, .2 and .3 are three peers (Linux routes all of
 * 127/8 to loopback).  Waits are bounded polls, never timing assertions.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "http/opsdoor.h"
#include "http/sweeper.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WAIT_MS 15000 /* a bounded wait; a connection sending nothing is deferred ~1-3 s */
#define KUBELET                                                                                    \
    "GET /healthz HTTP/1.1\r\nHost: 10.0.0.7:9090\r\nUser-Agent: kube-probe/1.30\r\n"              \
    "Accept: */*\r\nConnection: close\r\n\r\n"

/* ---- classifying ----------------------------------------------------------------- */

static enum door_kind kind(const char *text, struct door_request *rq)
{
    return door_classify(text, strlen(text), rq);
}

static void test_probes(void **state)
{
    (void)state;
    struct door_request rq;
    assert_int_equal(kind(KUBELET, &rq), DOOR_PROBE);
    assert_string_equal(rq.path, "/healthz");
    assert_false(rq.head);
    assert_int_equal(rq.head_len, strlen(KUBELET));

    assert_int_equal(kind("HEAD /readyz HTTP/1.0\r\n\r\n", &rq), DOOR_PROBE);
    assert_string_equal(rq.path, "/readyz");
    assert_true(rq.head);
    assert_int_equal(kind("GET /healthz?verbose=1 HTTP/1.1\r\nHost: a\r\n\r\n", &rq), DOOR_PROBE);
    assert_int_equal(kind("GET /readyz HTTP/1.1\r\ncontent-length:  00 \r\n\r\n", &rq), DOOR_PROBE);
    /* A second request after the first: only the first is the probe's. */
    static const char two[] = "GET /healthz HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n";
    assert_int_equal(kind(two, &rq), DOOR_PROBE);
    assert_int_equal(rq.head_len, strlen("GET /healthz HTTP/1.1\r\n\r\n"));
}

static void test_incomplete_heads_wait(void **state)
{
    (void)state;
    struct door_request rq;
    static const char *const more[] = {
        "",
        "G",
        "GET /healthz",
        "GET /healthz HTTP/1.1\r\n",
        "GET /healthz HTTP/1.1\r\nHost: a\r\n",
        "GET /healthz HTTP/1.1\r\nHost: a\r\n\r",
        "GET /metrics HTTP/1.1\r\nHost: a\r\n", /* any request waits for its whole head */
    };
    for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++)
        assert_int_equal(kind(more[i], &rq), DOOR_MORE);
    /* A head that has not ended within DOOR_HEAD_MAX bytes is the server's. */
    static char big[DOOR_HEAD_MAX];
    memset(big, 'a', sizeof(big));
    assert_int_equal(door_classify(big, sizeof(big), &rq), DOOR_OTHER);
    static const char probe_start[] = "GET /healthz HTTP/1.1\r\nX: ";
    memcpy(big, probe_start, strlen(probe_start));
    assert_int_equal(door_classify(big, sizeof(big), &rq), DOOR_OTHER);
    assert_int_equal(door_classify(big, sizeof(big) - 1, &rq), DOOR_MORE);
}

static void test_others_go_to_the_server(void **state)
{
    (void)state;
    struct door_request rq;
    static const char *const others[] = {
        "GET /metrics HTTP/1.1\r\n\r\n",
        "POST /healthz HTTP/1.1\r\n\r\n",
        "get /healthz HTTP/1.1\r\n\r\n",
        "GET /healthzz HTTP/1.1\r\n\r\n",
        "GET /healthz/ HTTP/1.1\r\n\r\n",
        "GET  /healthz HTTP/1.1\r\n\r\n",
        "GET /healthz HTTP/2.0\r\n\r\n",
        "GET /healthz\r\n\r\n",
        "GET /healthz HTTP/1.1\n\n",              /* bare LF */
        "GET /healthz HTTP/1.1\r\nHost: a\n\r\n", /* bare LF */
        "GET /readyz HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
        "GET /readyz HTTP/1.1\r\nContent-Length:\r\n\r\n",
        "GET /readyz HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
        "GET /readyz HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
        "GET /readyz HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
        "GET /readyz HTTP/1.1\r\nno colon\r\n\r\n",
        "GET /readyz HTTP/1.1\r\n: no name\r\n\r\n",
        "GET /readyz HTTP/1.1\r\nBad Name: x\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
        if (kind(others[i], &rq) != DOOR_OTHER)
            fail_msg("not for the server: %s", others[i]);
    }
}

static void test_peer_keys(void **state)
{
    (void)state;
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons(1)};
    struct sockaddr_in6 mapped = {.sin6_family = AF_INET6, .sin6_port = htons(2)};
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6};
    inet_pton(AF_INET, "10.1.2.3", &a4.sin_addr);
    inet_pton(AF_INET6, "::ffff:10.1.2.3", &mapped.sin6_addr);
    inet_pton(AF_INET6, "fd00::1", &a6.sin6_addr);
    struct door_peer_key k4, km, k6, none;
    door_peer_key((struct sockaddr *)&a4, sizeof(a4), &k4);
    door_peer_key((struct sockaddr *)&mapped, sizeof(mapped), &km);
    door_peer_key((struct sockaddr *)&a6, sizeof(a6), &k6);
    door_peer_key(NULL, 0, &none);
    assert_int_equal(k4.family, 4);
    assert_memory_equal(&k4, &km, sizeof(k4)); /* ports aside, one address */
    assert_int_equal(k6.family, 6);
    assert_int_equal(none.family, 0);
}

/* ---- a live door ----------------------------------------------------------------- */

#define MAX_KEPT 8

struct live {
    struct sweeper *sw;
    struct ops_door *d;
    uint16_t port;
    bool keep; /* the "server" keeps what it is handed, else it closes it at once */
    atomic_int handoffs;
    int kept[MAX_KEPT];
    atomic_int n_kept;
};

static unsigned probe(void *ctx, const char *path, char *out, size_t size)
{
    (void)ctx;
    if (strcmp(path, "/healthz") == 0) {
        snprintf(out, size, "ok\n");
        return 200;
    }
    snprintf(out, size, "not ready: test\n");
    return 503;
}

static bool handoff(void *ctx, int fd, const struct sockaddr *addr, socklen_t len)
{
    (void)addr;
    (void)len;
    struct live *l = ctx;
    atomic_fetch_add(&l->handoffs, 1);
    int n = atomic_load(&l->n_kept);
    if (l->keep && n < MAX_KEPT) {
        l->kept[n] = fd;
        atomic_store(&l->n_kept, n + 1);
        return true;
    }
    close(fd);
    return false;
}

static void start(struct live *l, unsigned per_peer, unsigned pending_max, int64_t limit_ms)
{
    memset(l, 0, sizeof(*l));
    assert_int_equal(sw_new(limit_ms, &l->sw, NULL), GG_OK);
    struct sockaddr_storage addr = {0};
    struct sockaddr_in *a = (struct sockaddr_in *)&addr;
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct door_config cfg = {
        .per_peer = per_peer, .pending_max = pending_max, .handed_max = 4, .sweeper = l->sw};
    struct door_hooks hooks = {.probe = probe, .handoff = handoff, .ctx = l};
    struct gg_err err = {{0}};
    assert_int_equal(door_start(&addr, "127.0.0.1:0", &cfg, &hooks, &l->port, &l->d, &err), GG_OK);
}

static void stop(struct live *l)
{
    door_stop(l->d);
    for (int i = 0; i < atomic_load(&l->n_kept); i++) {
        door_closed(l->d, l->kept[i]);
        close(l->kept[i]);
    }
    door_free(l->d);
    sw_free(l->sw);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A connection to the door from source (127.0.0.x), having sent text (NULL: nothing). */
static int dial(const struct live *l, const char *source, const char *text)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in src = {.sin_family = AF_INET}, dst = {.sin_family = AF_INET};
    inet_pton(AF_INET, source, &src.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    dst.sin_port = htons(l->port);
    assert_int_equal(bind(fd, (struct sockaddr *)&src, sizeof(src)), 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&dst, sizeof(dst)), 0);
    if (text)
        assert_int_equal(send(fd, text, strlen(text), MSG_NOSIGNAL), (ssize_t)strlen(text));
    return fd;
}

/* True once the server has closed fd (end of file or reset), within wait_ms. */
static bool closed_within(int fd, int wait_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, wait_ms) != 1)
        return false;
    char byte;
    ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno == ECONNRESET);
}

static bool still_open(int fd)
{
    return !closed_within(fd, 0);
}

/* All the server sends until it closes (bounded). */
static size_t read_all(int fd, char *out, size_t size)
{
    size_t got = 0;
    int64_t until = now_ms() + WAIT_MS;
    while (got + 1 < size && now_ms() < until) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) != 1)
            continue;
        ssize_t n = recv(fd, out + got, size - 1 - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    out[got] = '\0';
    return got;
}

static bool waiting_is(struct ops_door *d, unsigned want)
{
    int64_t until = now_ms() + WAIT_MS;
    for (;;) {
        unsigned waiting, handed;
        door_counts(d, &waiting, &handed);
        if (waiting == want)
            return true;
        if (now_ms() >= until)
            return false;
        poll(NULL, 0, 10);
    }
}

static void check_answer(const char *got, const char *status, const char *rest)
{
    size_t ls = strlen(status), lr = strlen(rest), lg = strlen(got);
    if (lg < ls + lr || strncmp(got, status, ls) != 0 || strcmp(got + lg - lr, rest) != 0)
        fail_msg("answer:\n%s", got);
    assert_non_null(strstr(got, "\r\nDate: "));
}

static void test_probes_are_answered_at_once(void **state)
{
    (void)state;
    struct live l;
    start(&l, 2, 16, 60000);
    char got[1024];
    int fd = dial(&l, "127.0.0.2", KUBELET);
    read_all(fd, got, sizeof(got));
    check_answer(got, "HTTP/1.1 200 OK\r\n",
                 "\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n"
                 "Content-Length: 3\r\n\r\nok\n");
    close(fd);
    fd = dial(&l, "127.0.0.2", "HEAD /readyz HTTP/1.1\r\nHost: a\r\n\r\n");
    read_all(fd, got, sizeof(got));
    check_answer(got, "HTTP/1.1 503 Service Unavailable\r\n",
                 "\r\nContent-Length: 16\r\n\r\n"); /* HEAD: no body */
    close(fd);
    assert_int_equal(atomic_load(&l.handoffs), 0);
    assert_true(waiting_is(l.d, 0));
    stop(&l);
}

static void test_other_requests_are_handed_over_within_their_cap(void **state)
{
    (void)state;
    struct live l;
    start(&l, 2, 16, 60000);
    l.keep = true;
    int fds[3];
    for (int i = 0; i < 3; i++) {
        fds[i] = dial(&l, "127.0.0.2", "GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n");
        int64_t until = now_ms() + WAIT_MS;
        while (i < 2 && atomic_load(&l.handoffs) < i + 1 && now_ms() < until)
            poll(NULL, 0, 10);
    }
    /* Two are handed over and kept; the third, past the address's cap, is closed. */
    assert_true(closed_within(fds[2], WAIT_MS));
    assert_int_equal(atomic_load(&l.handoffs), 2);
    assert_true(still_open(fds[0]) && still_open(fds[1]));
    unsigned waiting, handed;
    door_counts(l.d, &waiting, &handed);
    assert_int_equal(handed, 2);
    /* The "server" closes one: the address may have another. */
    door_closed(l.d, l.kept[0]);
    close(l.kept[0]);
    l.kept[0] = l.kept[1];
    atomic_store(&l.n_kept, 1);
    int again = dial(&l, "127.0.0.2", "GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n");
    int64_t until = now_ms() + WAIT_MS;
    while (atomic_load(&l.handoffs) < 3 && now_ms() < until)
        poll(NULL, 0, 10);
    assert_int_equal(atomic_load(&l.handoffs), 3);
    /* A probe from that address needs none of it. */
    int fd = dial(&l, "127.0.0.2", KUBELET);
    char got[1024];
    read_all(fd, got, sizeof(got));
    check_answer(got, "HTTP/1.1 200 OK\r\n", "\r\n\r\nok\n");
    close(fd);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    close(again);
    stop(&l);
}

static void test_per_peer_cap_closes_the_oldest_never_the_probe(void **state)
{
    (void)state;
    struct live l;
    start(&l, 4, 16, 60000);
    int hog[6];
    for (int i = 0; i < 4; i++) {
        hog[i] = dial(&l, "127.0.0.1", "GET /x"); /* a head that never ends */
        assert_true(waiting_is(l.d, (unsigned)i + 1));
    }
    hog[4] = dial(&l, "127.0.0.1", "GET /y");
    assert_true(closed_within(hog[0], WAIT_MS)); /* the oldest made room */
    assert_true(waiting_is(l.d, 4));
    for (int i = 1; i <= 4; i++)
        assert_true(still_open(hog[i]));
    /* The kubelet shares the address: its probe is answered, at the cost of the oldest. */
    char got[1024];
    for (int k = 0; k < 3; k++) {
        int fd = dial(&l, "127.0.0.1", KUBELET);
        read_all(fd, got, sizeof(got));
        check_answer(got, "HTTP/1.1 200 OK\r\n", "\r\n\r\nok\n");
        close(fd);
    }
    assert_true(closed_within(hog[1], WAIT_MS));
    assert_true(waiting_is(l.d, 3));
    /* Another address is not counted with it. */
    hog[5] = dial(&l, "127.0.0.2", "GET /z");
    assert_true(waiting_is(l.d, 4));
    for (int i = 2; i <= 5; i++)
        assert_true(still_open(hog[i]));
    for (int i = 0; i < 6; i++)
        close(hog[i]);
    assert_true(waiting_is(l.d, 0));
    stop(&l);
}

static void test_connections_sending_nothing_are_capped_too(void **state)
{
    (void)state;
    struct live l;
    start(&l, 2, 16, 60000);
    int idle[5];
    for (int i = 0; i < 5; i++)
        idle[i] = dial(&l, "127.0.0.1", NULL);
    /* They reach the door late (TCP_DEFER_ACCEPT), then all but two are closed. */
    int closed = 0;
    int64_t until = now_ms() + WAIT_MS;
    while (closed < 3 && now_ms() < until) {
        closed = 0;
        for (int i = 0; i < 5; i++)
            closed += !still_open(idle[i]);
        poll(NULL, 0, 20);
    }
    assert_int_equal(closed, 3);
    assert_true(waiting_is(l.d, 2));
    for (int i = 0; i < 5; i++)
        close(idle[i]);
    stop(&l);
}

static void test_full_door_closes_the_oldest_of_the_biggest(void **state)
{
    (void)state;
    struct live l;
    start(&l, 3, 4, 60000);
    int a[3], b[2], c;
    for (int i = 0; i < 3; i++) {
        a[i] = dial(&l, "127.0.0.1", "GET /x");
        assert_true(waiting_is(l.d, (unsigned)i + 1));
    }
    b[0] = dial(&l, "127.0.0.2", "GET /x");
    assert_true(waiting_is(l.d, 4));
    b[1] = dial(&l, "127.0.0.2", "GET /x"); /* five: one goes, A's oldest (A has the most) */
    assert_true(closed_within(a[0], WAIT_MS));
    assert_true(waiting_is(l.d, 4));
    assert_true(still_open(b[0]) && still_open(b[1]) && still_open(a[1]) && still_open(a[2]));
    c = dial(&l, "127.0.0.3", "GET /x"); /* A and B have two each: the older one, A's */
    assert_true(closed_within(a[1], WAIT_MS));
    assert_true(waiting_is(l.d, 4));
    assert_true(still_open(c) && still_open(b[0]) && still_open(b[1]) && still_open(a[2]));
    for (int i = 0; i < 3; i++)
        close(a[i]);
    close(b[0]);
    close(b[1]);
    close(c);
    stop(&l);
}

static void test_late_waiting_connection_is_closed(void **state)
{
    (void)state;
    struct live l;
    start(&l, 2, 16, 100);
    int fd = dial(&l, "127.0.0.1", "GET /healthz HTTP/1.1\r\nHost: a\r\n"); /* never ends */
    assert_true(closed_within(fd, WAIT_MS));
    assert_true(waiting_is(l.d, 0));
    close(fd);
    stop(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probes),
        cmocka_unit_test(test_incomplete_heads_wait),
        cmocka_unit_test(test_others_go_to_the_server),
        cmocka_unit_test(test_peer_keys),
        cmocka_unit_test(test_probes_are_answered_at_once),
        cmocka_unit_test(test_other_requests_are_handed_over_within_their_cap),
        cmocka_unit_test(test_per_peer_cap_closes_the_oldest_never_the_probe),
        cmocka_unit_test(test_connections_sending_nothing_are_capped_too),
        cmocka_unit_test(test_full_door_closes_the_oldest_of_the_biggest),
        cmocka_unit_test(test_late_waiting_connection_is_closed),
    };
    return cmocka_run_group_tests_name("opsdoor", tests, NULL, NULL);
}
