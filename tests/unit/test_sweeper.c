/*
 * test_sweeper.c - the request deadline on a socket pair: a running clock
 * past the limit shuts the socket down (the peer reads end of file); a
 * stopped clock, or a connection no longer tracked, is left alone; a
 * clock stopped and started again runs from its new start.
 *
 * Waits are bounded polls (at most 5 s), never timing assertions: "left
 * alone" is checked over several times the limit.
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
    sw_close(NULL);
    sw_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_late_request_is_shut_down, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stopped_clock_is_left_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_closed_connection_is_forgotten, setup, teardown),
        cmocka_unit_test(test_null_is_a_no_op),
    };
    return cmocka_run_group_tests_name("sweeper", tests, NULL, NULL);
}
