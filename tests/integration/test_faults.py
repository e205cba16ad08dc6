"""Faults and bad input against the running server, over real TLS on
loopback: slow clients, connection limits and floods, oversized, truncated,
random and pathological bodies, a stuck policy, policy reloads, certificate
rotation and SIGTERM under load.

Every test is bounded in time and in connections.  After each fault the
server must answer a normal review correctly, and its resident memory,
measured after the same warm-up before and after the fault, must be back
near its baseline.  Time bounds are sanity checks for a shared machine, not
benchmarks: a hang shows up as a client timeout, far above them."""

import base64
import concurrent.futures
import http.client
import json
import os
import random
import re
import select
import signal
import socket
import ssl
import struct
import threading
import time

import pytest

from conftest import SNI, ApiServerConnection, procs, start_server, wait_for
from test_engine_server import LABEL_POLICY, write_atomically
from test_server import check_envelope, metric, review
from test_tls import SecretVolume, make_certs, openssl_serial


def sanitized():
    """Built with AddressSanitizer (make asan): it keeps freed memory in
    quarantine, so resident size says nothing (LeakSanitizer checks leaks
    at exit instead, failing the exit status), and it runs slower."""
    path = os.environ.get("GPUGUARD_BIN")
    if not path or not os.path.exists(path):
        return False
    with open(path, "rb") as f:
        return b"__asan_init" in f.read()


SANITIZED = sanitized()
SLOW = 3 if SANITIZED else 1  # time bounds scale with the build
WARMUP = 300                  # normal reviews before each memory reading
RSS_MARGIN_KB = 20 * 1024     # growth tolerated between the two readings
PROMPT = 2.0 * SLOW           # seconds: a normal review during a fault answers within this
HANG = 10.0 * SLOW            # client socket timeout: past it, the server is hung
CLOSED = (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected,
          http.client.BadStatusLine)  # the server closed the connection (not a timeout)


# ---- the server under test ---------------------------------------------------

@pytest.fixture
def serve(binary, certs, tmp_path):
    """Start `gpuguard serve` with the stamp policy (mutate adds label
    stamp=v1; validate spins forever on label stuck=yes), extra flags and
    an engine configuration; stopped (exit 0) at the end."""
    started = []

    def start(*extra, engine="timeout: 1s"):
        policies = tmp_path / "policies"
        policies.mkdir(exist_ok=True)
        (policies / "10-stamp.lua").write_text(LABEL_POLICY % "v1")
        lua = tmp_path / "lua"
        lua.mkdir(exist_ok=True)
        config = tmp_path / "gpuguard.yaml"
        config.write_text(f"engine:\n  {engine}\n")
        srv = start_server(binary, certs, tmp_path, "--policies", str(policies),
                           "--lua", str(lua), "--config", str(config), *extra)
        srv.policies = policies
        use_context(srv, client_context(srv.ca))
        started.append(srv)
        return srv

    yield start
    for srv in started:
        if srv.proc.poll() is None:
            assert srv.stop() == 0


def client_context(*cas):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    for ca in cas:
        ctx.load_verify_locations(cafile=str(ca))
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class Connection(ApiServerConnection):
    """The conftest client, with Nagle off as in the API server's (Go)
    client: http.client sends the headers and the body in two writes,
    and with Nagle on the body waits for the server's delayed ACK."""

    def connect(self):
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def use_context(srv, ctx):
    """Connect to srv with this client context from now on."""
    srv.ctx = ctx
    srv.connect = lambda timeout=HANG: Connection(srv.port, None, timeout=timeout, context=ctx)


def tls_socket(srv, timeout=HANG):
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)
    try:
        return srv.ctx.wrap_socket(sock, server_hostname=SNI)
    except BaseException:
        sock.close()
        raise


def request_head(length, path="/mutate?timeout=10s"):
    return (f"POST {path} HTTP/1.1\r\nHost: {SNI}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def read_response(sock):
    """(status, body bytes) of the next response on a raw socket."""
    resp = http.client.HTTPResponse(sock, method="POST")
    resp.begin()
    return resp.status, resp.read()


def rss_kb(srv):
    for line in open(f"/proc/{srv.proc.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def gauge(srv, name):
    return metric(srv.ops("/metrics")[1], name) or 0


def expect_normal(srv, conn=None, path="/mutate", stamps=("v1",), timeout="10s"):
    """A normal review, answered correctly; returns (seconds, stamp)."""
    conn = conn or srv.connect(timeout=HANG)
    sent = review()
    start = time.monotonic()
    status, _, got = conn.review(json.dumps(sent).encode(), path=path, timeout=timeout)
    elapsed = time.monotonic() - start
    assert status == 200, got
    resp = check_envelope(sent, got, path)
    assert resp["allowed"] is True, resp
    stamp = None
    if path == "/mutate":
        patch = json.loads(base64.b64decode(resp["patch"]))
        assert len(patch) == 1 and patch[0]["path"] == "/metadata/labels", patch
        stamp = patch[0]["value"]["stamp"]
        assert stamp in stamps
    return elapsed, stamp


def warm_up(srv, stamps=("v1",)):
    """WARMUP normal reviews (mutate and validate, kept and fresh
    connections), then the server's resident memory in kB."""
    conn = srv.connect(timeout=HANG)
    for i in range(WARMUP):
        if i % 50 == 49:
            conn.close()
            conn = srv.connect(timeout=HANG)
        expect_normal(srv, conn, path="/mutate" if i % 2 else "/validate", stamps=stamps)
    conn.close()
    wait_for(lambda: gauge(srv, "gpuguard_open_connections") == 0)
    return rss_kb(srv)


def assert_recovered(srv, baseline_kb, stamps=("v1",)):
    """The server is up, answers a normal review, holds no request or
    connection, and its memory after the warm-up is back near baseline."""
    assert srv.proc.poll() is None, f"the server died: {srv.log_path.read_text()[-2000:]}"
    expect_normal(srv, stamps=stamps)
    assert wait_for(lambda: gauge(srv, "gpuguard_inflight_requests") == 0)
    after = warm_up(srv, stamps)
    assert SANITIZED or after - baseline_kb <= RSS_MARGIN_KB, (
        f"RSS grew from {baseline_kb} kB to {after} kB across the fault")
    assert wait_for(lambda: gauge(srv, "gpuguard_open_connections") == 0)


class Prober(threading.Thread):
    """Normal reviews on another connection (kept, and a fresh one every
    fourth) while a fault goes on; records each latency."""

    def __init__(self, srv, stamps=("v1",)):
        super().__init__(daemon=True)
        self.srv, self.stamps = srv, stamps
        self.latencies, self.errors = [], []
        self.stop = threading.Event()

    def run(self):
        kept = self.srv.connect(timeout=HANG)
        i = 0
        while not self.stop.is_set():
            try:
                conn = kept if i % 4 else self.srv.connect(timeout=HANG)
                self.latencies.append(expect_normal(self.srv, conn, stamps=self.stamps)[0])
                if conn is not kept:
                    conn.close()
            except Exception as e:  # noqa: BLE001 - reported by check()
                self.errors.append(repr(e))
                kept = self.srv.connect(timeout=HANG)
            i += 1
            time.sleep(0.05)
        kept.close()

    def check(self):
        self.stop.set()
        self.join(timeout=HANG + 5)
        assert not self.errors, self.errors
        assert len(self.latencies) >= 5, "too few probes to tell"
        assert max(self.latencies) < PROMPT, sorted(self.latencies)[-5:]


# ---- slow clients --------------------------------------------------------------

def trickle(sock, data, piece, pause):
    for i in range(0, len(data), piece):
        sock.sendall(data[i:i + piece])
        time.sleep(pause)


@pytest.mark.parametrize("what", ["headers", "body"])
def test_slowloris_does_not_hold_up_other_clients(serve, what):
    """Eight connections trickle their request (the headers byte by byte, or
    the body after complete headers), for about two seconds; other clients
    are answered promptly all along, and each slow request is answered."""
    srv = serve()
    baseline = warm_up(srv)
    results = {}

    def slow(n):
        sent = review()
        body = json.dumps(sent).encode()
        head = request_head(len(body))
        sock = tls_socket(srv)
        try:
            if what == "headers":
                trickle(sock, head, 1, 2.0 / len(head))
                sock.sendall(body)
            else:
                sock.sendall(head)
                trickle(sock, body, 8, 2.0 * 8 / len(body))
            status, data = read_response(sock)
            results[n] = (status, sent, json.loads(data) if status == 200 else data)
        finally:
            sock.close()

    prober = Prober(srv)
    prober.start()
    slow_threads = [threading.Thread(target=slow, args=(n,), daemon=True) for n in range(8)]
    for t in slow_threads:
        t.start()
    for t in slow_threads:
        t.join(timeout=HANG + 5)
    prober.check()
    assert len(results) == 8, f"slow requests not answered: {results}"
    for status, sent, got in results.values():
        assert status == 200, got
        check_envelope(sent, got, "/mutate")
    assert_recovered(srv, baseline)


def test_stalled_requests_do_not_hold_up_other_clients(serve):
    """Connections that stop mid-headers or mid-body and sit there: the
    server keeps answering others, and frees them when the client leaves
    (before the request timeout, which test_transport.py covers)."""
    srv = serve("--request-timeout", "60")
    baseline = warm_up(srv)
    body = json.dumps(review()).encode()
    head = request_head(len(body))
    stalled = []
    for n in range(16):
        sock = tls_socket(srv)
        sock.sendall(head[:40] if n % 2 else head + body[:100])
        stalled.append(sock)
    assert wait_for(lambda: gauge(srv, "gpuguard_open_connections") == 16)
    prober = Prober(srv)
    prober.start()
    time.sleep(1.0)
    prober.check()
    # Not answered (the requests are not complete), not closed either: waiting.
    readable, _, _ = select.select(stalled, [], [], 0.2)
    assert readable == []
    for sock in stalled:
        sock.close()
    assert wait_for(lambda: gauge(srv, "gpuguard_open_connections") == 0)
    assert_recovered(srv, baseline)


# ---- connection limits -----------------------------------------------------------

def test_idle_connections_up_to_the_limit(serve):
    """32 quiet connections that cannot make room fill --max-connections 32;
    a 33rd is closed at once instead of hanging in the backlog; closing the
    quiet ones frees the server.  (A connection with no request yet is closed
    at the request timeout: a long one keeps them all here.  One kept alive
    with no request under way would be closed to make room:
    test_transport.py.)"""
    srv = serve("--max-connections", "32", "--request-timeout", "60")
    baseline = warm_up(srv)
    idle = []
    for n in range(32):
        if n % 2:  # handshake done, no request yet
            idle.append(tls_socket(srv))
        else:  # keep-alive after one request, the next one's headers sent
            conn = srv.connect(timeout=HANG)
            expect_normal(srv, conn)
            conn.sock.sendall(request_head(100))
            idle.append(conn)
    assert wait_for(lambda: gauge(srv, "gpuguard_open_connections") == 32)
    for _ in range(3):
        start = time.monotonic()
        with pytest.raises(CLOSED):
            expect_normal(srv, srv.connect(timeout=HANG))
        assert time.monotonic() - start < PROMPT, "the connection past the limit hung"
    assert srv.ops("/healthz") == (200, "ok\n")
    for conn in idle:
        conn.close()
    assert wait_for(lambda: gauge(srv, "gpuguard_open_connections") == 0)
    assert_recovered(srv, baseline)


def test_flood_of_connections_past_the_limit(serve):
    """200 connection attempts from 64 threads against --max-connections 32,
    each holding its connection a moment before its request (not idle, so
    not closed to make room): every attempt is answered or closed quickly,
    and the server stays up."""
    srv = serve("--max-connections", "32")
    baseline = warm_up(srv)

    def attempt(_):
        start = time.monotonic()
        conn = srv.connect(timeout=HANG)
        try:
            conn.connect()
            time.sleep(0.1)
            expect_normal(srv, conn)
            outcome = "answered"
        except (*CLOSED, ConnectionRefusedError):
            outcome = "refused"
        finally:
            conn.close()
        return outcome, time.monotonic() - start

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        results = list(pool.map(attempt, range(200)))
    outcomes = [o for o, _ in results]
    slowest = max(t for _, t in results)
    assert slowest < 5.0 * SLOW, f"an attempt took {slowest:.1f} s"
    assert outcomes.count("answered") >= 32, outcomes.count("answered")
    assert outcomes.count("refused") > 0, "the limit was never reached"
    assert_recovered(srv, baseline)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_burst_past_the_limit_while_every_worker_is_busy(serve, threads):
    """30 TCP connects at once, no TLS, against --max-connections 4 while
    every worker runs a stuck review: the accepting thread hands over only
    what fits and closes the rest at once.  Counted when a worker takes them
    instead, all 30 passed while the workers were busy and reached
    libmicrohttpd's own per-worker limit, whose refusal path (0.9.75) leaves
    a mutex locked: the workers hung for good, /healthz still said 200 and
    SIGTERM hung.  (Once answered, the stuck reviews' connections begin
    another request: idle, they would be closed to make room.)"""
    # A stuck review holds its worker until the engine's timeout (not its instruction budget).
    srv = serve("--threads", str(threads), "--max-connections", "4", "--request-timeout", "60",
                engine="timeout: 2s\n  instructions: 1000000000000")
    baseline = warm_up(srv)
    stuck = [srv.connect(timeout=HANG) for _ in range(threads)]
    answers = []
    clients = [threading.Thread(target=lambda c=conn: answers.append(
        c.review(json.dumps(stuck_review()).encode(), path="/validate", timeout="10s")[0]))
        for conn in stuck]
    for client in clients:
        client.start()
    assert wait_for(lambda: gauge(srv, "gpuguard_inflight_requests") == threads)
    burst = []
    for _ in range(30):
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.connect(("127.0.0.1", srv.port))
        except BlockingIOError:
            pass
        burst.append(sock)
    for client in clients:
        client.join(timeout=HANG)
    assert answers == [200] * threads  # the stuck reviews' failure verdicts
    for conn in stuck:
        conn.sock.sendall(request_head(100))
    assert wait_for(lambda: gauge(srv, "gpuguard_open_connections") == 4)
    with pytest.raises(CLOSED):
        expect_normal(srv, srv.connect(timeout=HANG))
    for sock in burst + [conn.sock for conn in stuck]:
        sock.close()
    assert wait_for(lambda: gauge(srv, "gpuguard_open_connections") == 0)
    assert_recovered(srv, baseline)
    assert not [r for r in srv.log_lines() if "connection limit" in r.get("msg", "")]


# ---- bad bodies -------------------------------------------------------------------

def test_oversized_bodies_get_413(serve):
    """Over --max-body: by Content-Length (the body sent or not), and
    chunked with no Content-Length; never a hang."""
    srv = serve("--max-body", "1048576")
    baseline = warm_up(srv)
    big = b'{"a":"' + b"x" * (3 << 20) + b'"}'
    # Content-Length over the limit, no body sent: answered from the headers.
    sock = tls_socket(srv)
    sock.sendall(request_head(len(big)))
    assert read_response(sock)[0] == 413
    sock.close()
    # Content-Length over the limit and the whole body pushed: 413, or the
    # connection closed under the sender once the answer is out.
    sock = tls_socket(srv)
    try:
        sock.sendall(request_head(len(big)) + big)
        status = read_response(sock)[0]
        assert status == 413
    except CLOSED:
        pass
    sock.close()
    # No Content-Length: chunked, several times the limit.
    for size in (1048577, 4 << 20):
        conn = srv.connect(timeout=HANG)
        chunks = (big[i:i + 65536] for i in range(0, size, 65536))
        conn.request("POST", "/mutate?timeout=10s", body=chunks, encode_chunked=True,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 413
        assert resp.read() == b"body is over the limit of 1048576 bytes\n"
        conn.close()
    assert_recovered(srv, baseline)


def test_truncated_bodies_are_dropped_when_the_client_leaves(serve):
    """Content-Length larger than what is sent, then close (gracefully or
    with a reset): nothing stays in flight or open."""
    srv = serve()
    baseline = warm_up(srv)
    body = json.dumps(review()).encode()
    for n, cut in enumerate((0, 1, len(body) // 2, len(body) - 1)):
        sock = tls_socket(srv)
        sock.sendall(request_head(len(body)) + body[:cut])
        time.sleep(0.05)
        if n % 2:  # abortive close: RST
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    # The whole body, but Content-Length says 100 bytes more; the client
    # gives up waiting for the answer after a second.
    sock = tls_socket(srv, timeout=1)
    sock.sendall(request_head(len(body) + 100) + body)
    with pytest.raises(TimeoutError):
        sock.recv(1)
    sock.close()
    assert wait_for(lambda: gauge(srv, "gpuguard_inflight_requests") == 0)
    assert wait_for(lambda: gauge(srv, "gpuguard_open_connections") == 0)
    assert_recovered(srv, baseline)


def jsonish(rng, n):
    tokens = ['{', '}', '[', ']', ',', ':', '"', '"apiVersion"', '"request"', '"uid"',
              '"admission.k8s.io/v1"', '"AdmissionReview"', 'true', 'false', 'null', '0',
              '-1.5e3', '"\\u00e9"', '"\\ud800"', ' ', '\n', '"kind"', '"object"', '1e999']
    return "".join(rng.choice(tokens) for _ in range(n)).encode()


def mutated_review(rng):
    text = bytearray(json.dumps(review()).encode())
    for _ in range(rng.randint(1, 5)):
        i = rng.randrange(len(text))
        op = rng.randrange(3)
        if op == 0:
            del text[i]
        elif op == 1:
            text.insert(i, rng.randrange(256))
        else:
            text[i] = rng.choice(b'{}[]",:\\0')
    return bytes(text)


def test_random_bodies_get_400_or_an_answer(serve):
    """Random bytes, random JSON-ish text and damaged reviews: each gets a
    one-line 400, or (a damaged review still valid) a correct answer."""
    srv = serve()
    baseline = warm_up(srv)
    rng = random.Random(20261121)
    bodies = [rng.randbytes(rng.randint(0, 4096)) for _ in range(60)]
    bodies += [jsonish(rng, rng.randint(1, 300)) for _ in range(60)]
    bodies += [mutated_review(rng) for _ in range(60)]
    conn = srv.connect(timeout=HANG)
    counts = {}
    for body in bodies:
        try:
            status, _, got = conn.review(body)
        except CLOSED:  # allowed, but the next request needs a new connection
            conn = srv.connect(timeout=HANG)
            counts["closed"] = counts.get("closed", 0) + 1
            continue
        counts[status] = counts.get(status, 0) + 1
        assert status in (200, 400), (status, body[:200])
        if status == 400:
            assert isinstance(got, str) and got.endswith("\n") and got.count("\n") == 1
        else:
            assert isinstance(got["response"]["allowed"], bool), got
    assert counts.get(400, 0) >= 150, counts
    conn.close()
    assert_recovered(srv, baseline)


def test_random_bytes_instead_of_http(serve):
    """Garbage where the HTTP request should be: a 400 or a close, quickly."""
    srv = serve()
    baseline = warm_up(srv)
    rng = random.Random(7)
    for n in range(20):
        sock = tls_socket(srv, timeout=HANG)
        garbage = rng.randbytes(rng.randint(1, 2048))
        if n % 2:
            garbage += b"\r\n\r\n"
        sock.sendall(garbage)
        start = time.monotonic()
        try:
            sock.settimeout(0.5 if not n % 2 else HANG)
            status, _ = read_response(sock)
            assert status in (400, 413, 414, 431, 501, 505), status
        except CLOSED:
            pass
        except TimeoutError:
            # Without an end of headers the server may well keep waiting for more.
            assert not n % 2
        assert time.monotonic() - start < HANG
        sock.close()
    assert_recovered(srv, baseline)


@pytest.mark.parametrize("shape", ["arrays", "objects", "bare"])
def test_deeply_nested_json_is_a_clean_400(serve, shape):
    srv = serve()
    baseline = warm_up(srv)
    depth = 100_000
    if shape == "arrays":
        deep = "[" * depth + "]" * depth
    elif shape == "objects":
        deep = '{"a":' * depth + "1" + "}" * depth
    if shape == "bare":
        body = ("[" * depth + "]" * depth).encode()
    else:
        sent = review()
        sent["request"]["object"]["spec"]["deep"] = "@DEEP@"
        body = json.dumps(sent).replace('"@DEEP@"', deep).encode()
    start = time.monotonic()
    status, _, text = srv.connect(timeout=HANG).review(body)
    assert time.monotonic() - start < PROMPT
    assert status == 400
    assert "nesting" in text and text.count("\n") == 1, text
    assert_recovered(srv, baseline)


@pytest.mark.parametrize("kind", ["ascii", "escaped"])
def test_huge_string_under_max_body_is_answered(serve, kind):
    """A 10 MB annotation (plain, or as \\u escapes) under --max-body 16 MiB:
    a correct answer (or a clean 400), and the memory given back."""
    srv = serve()
    baseline = warm_up(srv)
    sent = review()
    sent["request"]["object"]["metadata"]["annotations"] = {"big": "@BIG@"}
    huge = "x" * (10 << 20) if kind == "ascii" else "\\u00e9" * ((10 << 20) // 6)
    body = json.dumps(sent).replace("@BIG@", huge).encode()
    for _ in range(3):
        conn = srv.connect(timeout=30)
        status, _, got = conn.review(body)
        conn.close()
        if status == 400:
            assert isinstance(got, str) and got.count("\n") == 1
        else:
            assert status == 200
            resp = check_envelope(sent, got, "/mutate")
            assert resp["allowed"] is True, resp
            patch = json.loads(base64.b64decode(resp["patch"]))
            assert patch == [{"op": "add", "path": "/metadata/labels", "value": {"stamp": "v1"}}]
    assert_recovered(srv, baseline)


# ---- policies, certificates and signals under load ----------------------------

def stuck_review():
    sent = review()
    sent["request"]["object"]["metadata"]["labels"] = {"stuck": "yes"}
    return sent


STUCK_TIMEOUT = 3 * SLOW  # the stuck reviews' ?timeout=, in seconds


def test_stuck_policy_under_load(serve):
    """Three clients send reviews that make the policy spin, while three
    others send normal ones: the stuck ones get the failure verdict before
    their ?timeout=, the normal ones keep being answered."""
    srv = serve(engine="timeout: 300ms")
    baseline = warm_up(srv)
    stop = threading.Event()
    stuck_results, normal_latencies, errors = [], [], []

    def stuck_client():
        conn = srv.connect(timeout=HANG)
        while not stop.is_set():
            sent = stuck_review()
            start = time.monotonic()
            try:
                status, _, got = conn.review(json.dumps(sent).encode(), path="/validate",
                                             timeout=f"{STUCK_TIMEOUT}s")
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
                return
            stuck_results.append((time.monotonic() - start, status, sent, got))

    def normal_client():
        conn = srv.connect(timeout=HANG)
        while not stop.is_set():
            try:
                normal_latencies.append(expect_normal(srv, conn)[0])
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
                return

    threads = [threading.Thread(target=f, daemon=True)
               for f in [stuck_client] * 3 + [normal_client] * 3]
    for t in threads:
        t.start()
    time.sleep(3.0)
    stop.set()
    for t in threads:
        t.join(timeout=HANG + 5)
    assert not errors, errors
    assert len(stuck_results) >= 6, len(stuck_results)
    for elapsed, status, sent, got in stuck_results:
        assert status == 200
        resp = check_envelope(sent, got, "/validate")
        assert resp["allowed"] is False
        assert resp["status"]["message"].startswith("stamp: policy stopped: "), resp
        assert elapsed < STUCK_TIMEOUT, f"a stuck review answered after {elapsed:.2f} s"
    assert len(normal_latencies) >= 20, len(normal_latencies)
    assert max(normal_latencies) < STUCK_TIMEOUT, sorted(normal_latencies)[-5:]
    assert_recovered(srv, baseline)


class Load:
    """Threads sending normal reviews until stopped, over kept connections
    and fresh ones; records every outcome."""

    def __init__(self, srv, threads=4, stamps=("v1",)):
        self.srv, self.stamps = srv, stamps
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.sent = self.answered = 0
        self.errors = []
        self.per_connection = []  # stamps seen, in order, on each kept connection
        self.threads = [threading.Thread(target=self.run, args=(n % 2 == 0,), daemon=True)
                        for n in range(threads)]

    def connect(self):
        return self.srv.connect(timeout=HANG)

    def run(self, kept):
        conn = self.connect()
        seen = []
        if kept:
            self.per_connection.append((conn, seen))
        while not self.stop.is_set():
            if not kept:
                conn = self.connect()
            with self.lock:
                self.sent += 1
            try:
                _, stamp = expect_normal(self.srv, conn, stamps=self.stamps)
            except Exception as e:  # noqa: BLE001
                self.errors.append(repr(e))
                conn = self.connect()
                continue
            seen.append(stamp)
            with self.lock:
                self.answered += 1
            if not kept:
                conn.close()
        conn.close()

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=HANG + 5)

    def check(self, at_least=50):
        assert not self.errors, self.errors[:5]
        assert self.sent == self.answered
        assert self.answered >= at_least, self.answered


def test_policy_reload_under_load(serve):
    """The policy file is rewritten atomically five times while four threads
    send reviews: no errors, nothing dropped, every answer from one
    generation or the next, in order on each connection."""
    srv = serve()
    baseline = warm_up(srv)
    stamps = tuple(f"v{i}" for i in range(1, 7))
    with Load(srv, stamps=stamps) as load:
        for version in stamps[1:]:
            time.sleep(0.3)
            write_atomically(srv.policies / "10-stamp.lua", LABEL_POLICY % version)
            assert wait_for(lambda: expect_normal(srv, stamps=stamps)[1] == version)
        time.sleep(0.3)
    load.check()
    for _, seen in load.per_connection:
        order = [stamps.index(s) for s in seen]
        assert order == sorted(order), f"a connection went back a generation: {seen}"
    assert metric(srv.ops("/metrics")[1], "gpuguard_policy_reloads_total", result="error") in (
        None, 0)
    assert_recovered(srv, baseline, stamps=("v6",))


def test_certificate_rotation_under_load(serve, binary, tmp_path):
    """The serving pair is swapped three times through the Secret-volume
    symlink while threads send reviews over kept and fresh connections:
    no request fails, connections opened before keep their certificate,
    and new handshakes end up on the last pair."""
    a = make_certs(binary, tmp_path / "a")
    b = make_certs(binary, tmp_path / "b")
    vol = SecretVolume(tmp_path / "secret")
    vol.publish(a / "tls.crt", a / "tls.key")
    srv = serve("--tls-cert", str(vol.root / "tls.crt"), "--tls-key", str(vol.root / "tls.key"))
    ctx = client_context(a / "ca.crt", b / "ca.crt")
    use_context(srv, ctx)
    baseline = warm_up(srv)

    def serial():
        conn = srv.connect()
        expect_normal(srv, conn)
        value = conn.sock.getpeercert()["serialNumber"]
        conn.close()
        return value

    kept = srv.connect()
    expect_normal(srv, kept)
    first = kept.sock.getpeercert()["serialNumber"]
    with Load(srv, threads=4) as load:
        for pair in (b, a, b):
            before = serial()
            time.sleep(0.3)
            vol.publish(pair / "tls.crt", pair / "tls.key")
            assert wait_for(lambda: serial() != before)
            expect_normal(srv, kept)
        time.sleep(0.3)
    load.check()
    assert kept.sock.getpeercert()["serialNumber"] == first
    kept.close()
    assert serial().lstrip("0") == openssl_serial(b / "tls.crt").lstrip("0")
    _, text = srv.ops("/metrics")
    assert metric(text, "gpuguard_tls_certificate_loads_total", result="ok") == 4
    assert_recovered(srv, baseline)


def test_sigterm_under_load(serve):
    """SIGTERM with eight requests in flight (headers and half the body in)
    and four threads sending reviews over kept and fresh connections: every
    request sent is answered 200 (answers during the drain say Connection:
    close); only new connections are refused; the server exits 0 promptly."""
    srv = serve()
    warm_up(srv)
    pending = []
    for _ in range(8):
        sent = review()
        body = json.dumps(sent).encode()
        sock = tls_socket(srv)
        sock.sendall(request_head(len(body)) + body[:len(body) // 2])
        pending.append((sock, sent, body))
    stop = threading.Event()
    signalled = threading.Event()
    outcomes, bad = [], []

    def client(kept):
        conn = None
        while not stop.is_set():
            if conn is None or conn.sock is None:  # (re)connect: may be refused once draining
                try:
                    conn = srv.connect(timeout=HANG)
                    conn.connect()
                except (*CLOSED, OSError) as e:
                    if not signalled.is_set():
                        bad.append(f"connection refused before SIGTERM: {e!r}")
                    outcomes.append("refused")
                    conn = None
                    time.sleep(0.05)
                    continue
            try:
                expect_normal(srv, conn)
                outcomes.append("answered")
            except Exception as e:  # noqa: BLE001 - dropped, wrong, or hung
                bad.append(f"request sent, then {e!r}")
                conn = None
                continue
            if not kept:
                conn.close()

    threads = [threading.Thread(target=client, args=(n % 2 == 0,), daemon=True)
               for n in range(4)]
    for t in threads:
        t.start()
    assert wait_for(lambda: gauge(srv, "gpuguard_inflight_requests") >= 8)
    time.sleep(0.3)
    signalled.set()
    srv.proc.send_signal(15)
    time.sleep(0.3)
    try:
        assert srv.proc.poll() is None, "exited with requests in flight"
        for sock, sent, body in pending:
            sock.sendall(body[len(body) // 2:])
            resp = http.client.HTTPResponse(sock, method="POST")
            resp.begin()
            assert resp.status == 200
            assert "close" in resp.getheader("Connection", "").lower()
            check_envelope(sent, json.loads(resp.read()), "/mutate")
    finally:  # on a failure, let the server drain instead of waiting out the grace
        for sock, _, _ in pending:
            sock.close()
        stop.set()
    start = time.monotonic()
    assert procs.stop(srv.proc, None) == 0, srv.log_path.read_text()[-3000:]
    exited = time.monotonic() - start
    for t in threads:
        t.join(timeout=HANG + 5)
    assert not bad, bad[:5]
    assert outcomes.count("answered") > 0 and outcomes.count("refused") > 0
    assert exited < 5.0 * SLOW, f"took {exited:.1f} s to exit under load"
    assert srv.log_lines()[-1]["msg"] == "stopped"


def test_sigterm_ends_the_process_past_the_grace_with_a_review_stuck(serve):
    """A review that never returns does not hold the process after SIGTERM:
    --shutdown-grace and a 2 s margin later, it logs the review it abandons
    and exits 1.  In production the review would be stuck in a C call that
    no budget reaches; here the policy spins under budgets far above the
    test's length."""
    srv = serve("--shutdown-grace", "1",
                engine="timeout: 600s\n  instructions: 1000000000000000")
    conn = srv.connect()
    conn.request("POST", "/validate?timeout=600s", body=json.dumps(stuck_review()),
                 headers={"Content-Type": "application/json"})
    assert wait_for(lambda: gauge(srv, "gpuguard_inflight_requests") == 1)
    # Bounded: a server still running after 30 s is killed, and stop() says -9.
    assert procs.stop(srv.proc, signal.SIGTERM, timeout=30) == 1
    (line,) = [r for r in srv.log_lines() if r.get("msg", "").startswith("shutdown: the grace")]
    assert line["level"] == "error" and line["in_flight"] == 1
    (abandoned,) = line["abandoned"]
    assert abandoned["path"] == "/validate"
    assert re.fullmatch(r"127\.0\.0\.1:\d+", abandoned["peer"])
    assert abandoned["running_ms"] >= 1000
    conn.close()
