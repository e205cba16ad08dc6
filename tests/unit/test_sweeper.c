/*
 * test_sweeper.c - the request deadline on a socket pair: a running clock
 * past the limit shuts the socket down (the peer reads end of file); a
 * stopped clock, or a connection no longer tracked, is left alone; a
 * clock stopped and started again runs from its new start.
 *
 * Waits are bounded polls (at most 5 s), never timing assertions: "left
 * alone" is checked over several times the limit.
 *
 * Closing the idlest connection for a new one, on three pairs under a
 * deadline far away: the one answered the longest ago goes, one with a
 * request under way or bytes waiting never does, nor one never answered.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "http/sweeper.h"

#include <poll.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <unistd.h>

#define LIMIT_MS 50

struct pair {
    struct sweeper *sw;
    int ours, peer; /* ours is tracked; the peer sees what happens to it */
};

static int setup(void **state)
{
    static struct pair p;
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0)
        return -1;
    p.ours = fds[0];
    p.peer = fds[1];
    if (sw_new(LIMIT_MS, &p.sw, NULL) != GG_OK)
        return -1;
    *state = &p;
    return 0;
}

static int teardown(void **state)
{
    struct pair *p = *state;
    sw_free(p->sw);
    close(p->ours);
    close(p->peer);
    return 0;
}

/* True when the peer reads end of file within wait_ms: ours was shut down. */
static bool peer_sees_eof(const struct pair *p, int wait_ms)
{
    struct pollfd pfd = {.fd = p->peer, .events = POLLIN};
    if (poll(&pfd, 1, wait_ms) != 1)
        return false;
    char byte;
    return recv(p->peer, &byte, 1, MSG_DONTWAIT) == 0;
}

static void test_late_request_is_shut_down(void **state)
{
    struct pair *p = *state;
    struct sw_conn *c = sw_open(p->sw, p->ours);
    assert_non_null(c);
    assert_true(peer_sees_eof(p, 5000));
    sw_close(c);
}

static void test_stopped_clock_is_left_alone(void **state)
{
    struct pair *p = *state;
    struct sw_conn *c = sw_open(p->sw, p->ours);
    assert_non_null(c);
    sw_request_end(c);
    assert_false(peer_sees_eof(p, 6 * LIMIT_MS + 2 * SWEEPER_TICK_MS));
    /* The next request starts the clock again, and is late in its turn. */
    sw_request_begin(c);
    assert_true(peer_sees_eof(p, 5000));
    sw_close(c);
}

static void test_closed_connection_is_forgotten(void **state)
{
    struct pair *p = *state;
    sw_close(sw_open(p->sw, p->ours));
    assert_false(peer_sees_eof(p, 6 * LIMIT_MS + 2 * SWEEPER_TICK_MS));
}

static void test_null_is_a_no_op(void **state)
{
    (void)state;
    sw_request_begin(NULL);
    sw_request_end(NULL);
    sw_request_done(NULL);
    sw_close(NULL);
    sw_free(NULL);
}

/* ---- closing the idlest -------------------------------------------------------- */

#define CONNS 3

struct trio {
    struct sweeper *sw;
    struct pair pairs[CONNS]; /* .sw unused */
    struct sw_conn *conns[CONNS];
};

static int setup_trio(void **state)
{
    static struct trio t;
    if (sw_new(60000, &t.sw, NULL) != GG_OK)
        return -1;
    for (int i = 0; i < CONNS; i++) {
        int fds[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0)
            return -1;
        t.pairs[i] = (struct pair){.ours = fds[0], .peer = fds[1]};
        t.conns[i] = sw_open(t.sw, fds[0]);
    }
    *state = &t;
    return 0;
}

static int teardown_trio(void **state)
{
    struct trio *t = *state;
    for (int i = 0; i < CONNS; i++) {
        sw_close(t->conns[i]);
        close(t->pairs[i].ours);
        close(t->pairs[i].peer);
    }
    sw_free(t->sw);
    return 0;
}

/* Connection i's request answered: idle from now (a millisecond after the one before). */
static void answer(struct trio *t, int i)
{
    usleep(1000);
    sw_request_end(t->conns[i]);
    sw_request_done(t->conns[i]);
}

/* Only the connections whose bit is set in mask have been shut down. */
static void assert_shut(const struct trio *t, unsigned mask)
{
    for (int i = 0; i < CONNS; i++)
        assert_int_equal(peer_sees_eof(&t->pairs[i], 0), (mask >> i) & 1);
}

static void test_the_longest_idle_is_closed(void **state)
{
    struct trio *t = *state;
    answer(t, 1);
    answer(t, 0);
    answer(t, 2);
    int64_t idle_ms = -1;
    assert_true(sw_close_idlest(t->sw, &idle_ms));
    assert_true(idle_ms >= 0);
    assert_shut(t, 1u << 1);
    assert_int_equal(sw_closing(t->sw), 1);
    assert_true(sw_close_idlest(t->sw, &idle_ms));
    assert_shut(t, 1u << 1 | 1u << 0);
    assert_int_equal(sw_closing(t->sw), 2);
    /* Its worker closes it: its slot is no longer being freed. */
    sw_close(t->conns[1]);
    t->conns[1] = NULL;
    assert_int_equal(sw_closing(t->sw), 1);
}

static void test_a_request_under_way_is_never_closed(void **state)
{
    struct trio *t = *state;
    answer(t, 0);
    answer(t, 1);
    sw_request_begin(t->conns[0]); /* its next request's first byte */
    int64_t idle_ms;
    assert_true(sw_close_idlest(t->sw, &idle_ms));
    assert_shut(t, 1u << 1);
    /* 0 is busy and 2 was never answered: neither is idle. */
    assert_false(sw_close_idlest(t->sw, &idle_ms));
    assert_shut(t, 1u << 1);
}

static void test_bytes_waiting_are_a_request_under_way(void **state)
{
    struct trio *t = *state;
    answer(t, 0);
    answer(t, 1);
    /* 0's client sends its next request; its worker (busy elsewhere) has not read it. */
    assert_int_equal(send(t->pairs[0].peer, "P", 1, 0), 1);
    int64_t idle_ms;
    assert_true(sw_close_idlest(t->sw, &idle_ms));
    assert_shut(t, 1u << 1);
    assert_false(sw_close_idlest(t->sw, &idle_ms));
}

static void test_an_answer_after_the_next_byte_is_not_idle(void **state)
{
    struct trio *t = *state;
    sw_request_end(t->conns[0]);
    sw_request_begin(t->conns[0]); /* a pipelined request came before the answer went */
    sw_request_done(t->conns[0]);
    int64_t idle_ms;
    assert_false(sw_close_idlest(t->sw, &idle_ms));
    assert_shut(t, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_late_request_is_shut_down, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stopped_clock_is_left_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_closed_connection_is_forgotten, setup, teardown),
        cmocka_unit_test(test_null_is_a_no_op),
        cmocka_unit_test_setup_teardown(test_the_longest_idle_is_closed, setup_trio, teardown_trio),
        cmocka_unit_test_setup_teardown(test_a_request_under_way_is_never_closed, setup_trio,
                                        teardown_trio),
        cmocka_unit_test_setup_teardown(test_bytes_waiting_are_a_request_under_way, setup_trio,
                                        teardown_trio),
        cmocka_unit_test_setup_teardown(test_an_answer_after_the_next_byte_is_not_idle, setup_trio,
                                        teardown_trio),
    };
    return cmocka_run_group_tests_name("sweeper", tests, NULL, NULL);
}
