"""The webhook's transport against the real server over real TLS on loopback:
the request deadline (--request-timeout, on both ports), the connection
slots (--max-connections) idle connections give up to new ones, transfer
codings, and the TLS cipher suites it offers and in which order.

A cipher suite is refused when the handshake fails; accepted when a review
is answered over it.  TLS 1.2 suites are picked with Python's ssl module,
TLS 1.3 suites (which it cannot restrict) with `openssl s_client`."""

import http.client
import json
import re
import select
import socket
import ssl
import subprocess
import time

import pytest

from conftest import SNI, ApiServerConnection, start_server, wait_for
from test_faults import client_context, read_response, request_head
from test_server import check_envelope, metric, review
from test_tls import make_certs

# ---- the request deadline -------------------------------------------------------

TIMEOUT_S = 2  # --request-timeout in these tests
GIVE_UP_S = 30  # a trickling client still open after this was never closed


class Trickler:
    """A client that sends its request a byte a second, never finishing it."""

    def __init__(self, srv, kind):
        self.kind = kind
        if kind == "ops port":  # plain HTTP: the headers trickle
            self.sock = socket.create_connection(("127.0.0.1", srv.ops_port), timeout=GIVE_UP_S)
            self.sock.sendall(b"GET /metrics HTTP/1.1\r\n")
            self.rest = b"Host: gpuguard\r\n" * 64
            return
        raw = socket.create_connection(("127.0.0.1", srv.port), timeout=GIVE_UP_S)
        if kind == "handshake":  # TCP only: ClientHello never sent, then a byte now and then
            self.sock, self.rest = raw, b"\x16" * 64
            return
        self.sock = client_context(srv.ca).wrap_socket(raw, server_hostname=SNI)
        body = json.dumps(review()).encode()
        head = request_head(len(body))
        if kind == "second request":  # one review answered, then the next trickles
            self.sock.sendall(head + body)
            assert read_response(self.sock)[0] == 200
        if kind == "body":
            self.sock.sendall(head)
            self.rest = body
        else:
            self.sock.sendall(head[:20])
            self.rest = head[20:]

    def send_byte(self):
        """Send the next byte; False once the server has closed the connection."""
        if select.select([self.sock], [], [], 0)[0]:
            try:
                if not self.sock.recv(100):
                    return False
            except (ssl.SSLError, OSError):
                return False
        try:
            self.sock.sendall(self.rest[:1])
        except (ssl.SSLError, OSError):
            return False
        self.rest = self.rest[1:]
        return True


KINDS = ["handshake", "headers", "body", "second request"]
CLOSED_MSG = "request not received within the request timeout: connection closed"


def trickle_until_closed(tricklers):
    """A byte a second on each until the server has closed them all."""
    until = time.monotonic() + GIVE_UP_S
    while tricklers and time.monotonic() < until:
        tricklers = [t for t in tricklers if t.send_byte()]
        time.sleep(1)
    assert not tricklers, f"still open after {GIVE_UP_S} s: {[t.kind for t in tricklers]}"


def test_trickling_requests_are_closed_at_the_request_timeout(binary, certs, tmp_path):
    """With --max-connections 4 taken by clients sending half a request a
    byte a second (before the TLS handshake, in the headers, in the body, in
    the second request of a kept-alive connection), each is closed once
    --request-timeout has passed, and a normal review then succeeds."""
    srv = start_server(binary, certs, tmp_path, "--max-connections", str(len(KINDS)),
                       "--request-timeout", str(TIMEOUT_S))
    try:
        trickle_until_closed([Trickler(srv, kind) for kind in KINDS])
        sent = review()
        status, _, got = srv.connect().review(sent)
        assert status == 200
        assert check_envelope(sent, got, "/mutate")["allowed"] is True
        closed = [r for r in srv.log_lines() if r.get("msg") == CLOSED_MSG]
        assert len(closed) == len(KINDS)
        for rec in closed:
            assert rec["level"] == "warn" and rec["timeout_ms"] == TIMEOUT_S * 1000
            assert re.fullmatch(r"127\.0\.0\.1:\d+", rec["peer"])
        _, text = srv.ops("/metrics")
        assert metric(text, "gpuguard_http_errors_total", code="408") == len(KINDS)
    finally:
        assert srv.stop() == 0


OPS_LIMIT = 64  # trickling clients, all from 127.0.0.1: --ops-max-per-peer lets them all wait


def test_ops_port_is_not_held_by_slow_clients(binary, certs, tmp_path):
    """The ops port answers one request per connection (Connection: close),
    so its connections are under the request deadline from accept to close:
    clients trickling their headers are closed, and the kubelet's next probe
    is answered.  (With the default --ops-max-per-peer, one address's extra
    connections are closed sooner: test_ops_probes.py.)"""
    srv = start_server(binary, certs, tmp_path, "--request-timeout", str(TIMEOUT_S),
                       "--ops-max-per-peer", str(OPS_LIMIT))
    try:
        trickle_until_closed([Trickler(srv, "ops port") for _ in range(OPS_LIMIT)])
        probe = http.client.HTTPConnection("127.0.0.1", srv.ops_port, timeout=10)
        probe.request("GET", "/healthz")
        resp = probe.getresponse()
        assert (resp.status, resp.read()) == (200, b"ok\n")
        assert resp.getheader("Connection") == "close"
        assert len([r for r in srv.log_lines() if r.get("msg") == CLOSED_MSG]) == OPS_LIMIT
    finally:
        assert srv.stop() == 0


def test_kept_alive_connections_wait_past_the_request_timeout(binary, certs, tmp_path):
    """The deadline is for a request, not for the idle time between two:
    a kept-alive connection still serves after --request-timeout of quiet."""
    srv = start_server(binary, certs, tmp_path, "--request-timeout", "1")
    try:
        conn = srv.connect()
        assert conn.review(review())[0] == 200
        first = conn.sock
        time.sleep(2.5)
        sent = review()
        status, _, got = conn.review(sent)
        assert status == 200 and conn.sock is first
        check_envelope(sent, got, "/mutate")
        assert not [r for r in srv.log_lines() if "request timeout" in r.get("msg", "")]
    finally:
        assert srv.stop() == 0


@pytest.mark.parametrize("value", ["0", "3601", "soon"])
def test_request_timeout_flag_is_checked(binary, value):
    out = subprocess.run([binary, "serve", "--tls-cert", "a", "--tls-key", "b",
                          "--request-timeout", value], capture_output=True, text=True)
    assert out.returncode == 2
    assert (f'--request-timeout must be a whole number from 1 to 3600, got "{value}"'
            in out.stderr)


# ---- connection slots ---------------------------------------------------------------

SLOTS = 4  # --max-connections in these tests
MADE_ROOM = ("webhook port: idle connections closed to make room, every --max-connections slot "
             "taken")


def kept_alive(srv, n):
    """n connections, each kept alive and idle after one review, the longest idle first."""
    conns = []
    for _ in range(n):
        conn = srv.connect()
        assert conn.review(review())[0] == 200
        conns.append(conn)
        time.sleep(0.02)  # idle since distinct times
    return conns


def closed_by_server(conn):
    """True once the server has closed conn (its end of file is waiting to be read)."""
    if not select.select([conn.sock], [], [], 0)[0]:
        return False
    try:
        return conn.sock.recv(1) == b""
    except (ssl.SSLError, OSError):
        return True


def test_idle_connections_make_room_for_new_ones(binary, certs, tmp_path):
    """Every --max-connections slot held by a connection kept alive after one
    review (an API server's pool, idle for up to 90 s): a new client's
    review is answered all the same, the connection idle the longest closed
    for it; the others still serve."""
    srv = start_server(binary, certs, tmp_path, "--max-connections", str(SLOTS))
    try:
        idle = kept_alive(srv, SLOTS)
        sent = review()
        status, _, got = srv.connect().review(sent)
        assert status == 200
        check_envelope(sent, got, "/mutate")
        assert wait_for(lambda: closed_by_server(idle[0]))
        for conn in idle[1:]:
            sock = conn.sock
            assert conn.review(review())[0] == 200 and conn.sock is sock
        (line,) = [r for r in srv.log_lines() if r.get("msg") == MADE_ROOM]
        assert line["level"] == "warn" and line["closed"] == 1 and line["limit"] == SLOTS
    finally:
        assert srv.stop() == 0


def test_a_request_under_way_keeps_its_connection(binary, certs, tmp_path):
    """The connection idle the longest has begun its next request (headers
    sent, body not yet) when every slot is taken: a new client takes the slot
    of the next idle one instead, and the request under way, finished, is
    answered on its connection."""
    srv = start_server(binary, certs, tmp_path, "--max-connections", str(SLOTS),
                       "--request-timeout", "60")
    try:
        busy, *idle = kept_alive(srv, SLOTS)
        body = json.dumps(review()).encode()
        busy.sock.sendall(request_head(len(body)))
        assert srv.connect().review(review())[0] == 200
        assert wait_for(lambda: closed_by_server(idle[0]))
        busy.sock.sendall(body)
        assert read_response(busy.sock)[0] == 200
    finally:
        assert srv.stop() == 0


# ---- transfer codings -------------------------------------------------------------

@pytest.mark.parametrize("codings,reason", [
    (["gzip, chunked"], "Transfer-Encoding gzip, chunked is not supported"),
    (["gzip"], "Transfer-Encoding gzip is not supported"),
    (["identity"], "Transfer-Encoding identity is not supported"),
    (["chunked", "chunked"], "Transfer-Encoding given more than once"),
])
def test_transfer_codings_other_than_chunked_are_501_at_once(server, codings, reason):
    """The body is never finished: the answer must come from the headers."""
    conn = server.connect(timeout=5)
    conn.putrequest("POST", "/mutate?timeout=10s")
    conn.putheader("Content-Type", "application/json")
    for coding in codings:
        conn.putheader("Transfer-Encoding", coding)
    conn.endheaders()
    conn.send(b"a\r\n{\"apiVer\r\n")
    resp = conn.getresponse()
    assert resp.status == 501
    assert resp.read().decode() == reason + ": send the body with Content-Length or chunked\n"
    logged = [r for r in server.log_lines() if r.get("status") == 501]
    assert [r["msg"] for r in logged] == [reason + ": send the body with Content-Length or chunked"]
    _, text = server.ops("/metrics")
    assert metric(text, "gpuguard_http_errors_total", code="501") == 1
    # Plain chunked is still read.
    sent = review()
    conn = server.connect()
    conn.request("POST", "/mutate", body=iter([json.dumps(sent).encode()]),
                 headers={"Content-Type": "application/json"}, encode_chunked=True)
    resp = conn.getresponse()
    assert resp.status == 200
    check_envelope(sent, json.loads(resp.read()), "/mutate")


# ---- TLS cipher suites --------------------------------------------------------------

AEAD_12 = ["ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-CHACHA20-POLY1305",
           "ECDHE-ECDSA-AES128-GCM-SHA256"]  # the server's order of preference
CBC_12 = ["ECDHE-ECDSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA", "ECDHE-ECDSA-AES128-SHA256",
          "ECDHE-ECDSA-AES256-SHA384"]
AEAD_13 = ["TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256", "TLS_AES_128_GCM_SHA256"]


def tls12_connection(srv, ciphers):
    ctx = client_context(srv.ca)
    ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(":".join(ciphers))
    return ApiServerConnection(srv.port, None, context=ctx)


def test_cbc_suites_are_refused(server):
    conn = tls12_connection(server, CBC_12)
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        conn.review(review())
    assert any(r.get("msg", "").startswith("TLS handshake failed") for r in server.log_lines())


@pytest.mark.parametrize("suite", AEAD_12)
def test_each_aead_suite_is_accepted_in_tls_12(server, suite):
    conn = tls12_connection(server, [suite])
    assert conn.review(review())[0] == 200
    assert conn.sock.cipher()[0] == suite


def test_the_server_order_wins_in_tls_12(server):
    conn = tls12_connection(server, list(reversed(AEAD_12)))
    assert conn.review(review())[0] == 200
    assert conn.sock.cipher()[0] == AEAD_12[0]


def s_client_suite(srv, suites):
    """The TLS 1.3 suite `openssl s_client` agrees on when offering suites, in order."""
    out = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{srv.port}",
                          "-servername", SNI, "-tls1_3", "-ciphersuites", ":".join(suites),
                          "-CAfile", str(srv.ca)],
                         input=b"", capture_output=True, timeout=20)
    assert out.returncode == 0, out.stderr.decode()
    found = re.search(rb"^New, TLSv1\.3, Cipher is (\S+)$", out.stdout, re.M)
    assert found, out.stdout.decode()
    return found.group(1).decode()


@pytest.mark.parametrize("suite", AEAD_13)
def test_each_suite_is_accepted_in_tls_13(server, suite):
    assert s_client_suite(server, [suite]) == suite


def test_the_server_order_wins_in_tls_13(server):
    assert s_client_suite(server, list(reversed(AEAD_13))) == AEAD_13[0]


@pytest.fixture
def rsa_server(binary, tmp_path):
    srv = start_server(binary, make_certs(binary, tmp_path / "rsa", "--key-type", "rsa"), tmp_path)
    yield srv
    assert srv.stop() == 0


def test_an_rsa_certificate_gets_ecdhe_only(rsa_server):
    """ECDHE with an RSA certificate is served; the static RSA key exchange
    (no forward secrecy), AEAD or not, is refused."""
    conn = tls12_connection(rsa_server, ["AES256-GCM-SHA384", "AES128-GCM-SHA256"])
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        conn.review(review())
    conn = tls12_connection(rsa_server, ["ECDHE-RSA-AES128-GCM-SHA256",
                                         "ECDHE-RSA-AES256-GCM-SHA384"])
    assert conn.review(review())[0] == 200
    assert conn.sock.cipher()[0] == "ECDHE-RSA-AES256-GCM-SHA384"
