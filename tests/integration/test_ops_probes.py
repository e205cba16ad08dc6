"""The kubelet's probes on the ops port against clients that take its connections (issue 35,
item 6).

Before: the ops port had 64 connections for everyone, and 200 clients reconnecting as fast as it
closed them kept all 64 busy, so the kubelet's /healthz found none free: liveness restarts, then
readiness drops every replica, and with failurePolicy: Fail pod creation stops.  Now the ops port
has a front door (webhook/http/opsdoor.c) that answers a complete /healthz or /readyz request at
once, without a connection slot, and caps the connections one address may hold waiting for their
request (--ops-max-per-peer): past the cap, that address's oldest waiting connection is closed.

The kubelet probes from the node's address.  A pod on that node has an address of its own
(the hog at 127.0.0.1, the probes from 127.0.0.2); a hostNetwork process on the node shares the
kubelet's address (hog and probes both from 127.0.0.1), so the cap must not refuse a probe
because its address is at the cap.

No timing assertion: every probe has a generous socket timeout (a loaded 2-core machine answers
in milliseconds; the old server left 13 of 20 unanswered after 10 s each), every loop is bounded
by a count and a deadline, and every wait polls."""

import http.client
import re
import socket
import subprocess
import threading
import time

import pytest

from conftest import start_server, wait_for
from test_server import check_envelope, review

HOG = "127.0.0.1"  # a pod on the node, or a hostNetwork process beside the kubelet
NODE = "127.0.0.2"  # the kubelet, from the node's address
OTHER = "127.0.0.3"  # Prometheus, from a pod of the monitoring namespace
PROBE_TIMEOUT = 10.0  # seconds per probe; the deployment's own are 2 s and 3 s
PROBES = 10  # of each of /healthz and /readyz
CHURNERS = 200  # the 200 clients
ROUNDS = 5000  # connections per churning client at most
GIVE_UP = 60.0  # seconds: a bounded wait that reaches this has failed


def loopback_alias_works():
    try:
        with socket.create_connection(("127.0.0.1", 1), timeout=1, source_address=(NODE, 0)):
            pass
    except ConnectionRefusedError:
        return True  # bound to NODE, refused by the closed port: the alias works
    except OSError:
        return False
    return True


pytestmark = pytest.mark.skipif(not loopback_alias_works(),
                                reason="cannot bind 127.0.0.2 as a source address")


def per_peer_cap(binary):
    """--ops-max-per-peer's default, from `gpuguard serve --help`."""
    text = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True).stdout
    found = re.search(r"--ops-max-per-peer N\s.*?\[(\d+)\]", text, re.S)
    assert found, "gpuguard serve --help lists no --ops-max-per-peer"
    return int(found.group(1))


class Hog:
    """Threads that each hold a connection to the ops port from one source address, sending
    nothing; with reconnect, each opens a new one as soon as the server closes its last."""

    def __init__(self, port, source, threads, reconnect):
        self.port, self.source, self.reconnect = port, source, reconnect
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.opened = self.closed = self.held = 0
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(threads)]
        for t in self.threads:
            t.start()

    def count(self, **delta):
        with self.lock:
            for key, d in delta.items():
                setattr(self, key, getattr(self, key) + d)

    def run(self):
        deadline = time.monotonic() + 3 * GIVE_UP
        for _ in range(ROUNDS if self.reconnect else 1):
            if self.stop.is_set() or time.monotonic() > deadline:
                return
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=5,
                                             source_address=(self.source, 0))
            except OSError:
                time.sleep(0.01)  # the backlog is full: try again, a bounded number of times
                continue
            self.count(opened=1, held=1)
            s.settimeout(0.2)
            try:
                while not self.stop.is_set() and time.monotonic() < deadline:
                    try:
                        if not s.recv(1):
                            break  # closed by the server
                    except socket.timeout:
                        continue
                    except OSError:
                        break  # reset by the server
                else:
                    return  # told to stop: the connection was never closed by the server
                self.count(closed=1, held=-1)
            finally:
                s.close()
        if not self.reconnect:
            self.stop.wait(3 * GIVE_UP)

    def end(self):
        self.stop.set()
        for t in self.threads:
            t.join(GIVE_UP)
        assert not any(t.is_alive() for t in self.threads)


def probe(port, path, source):
    """One probe as the kubelet sends it, from source; (status, body) or the error."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT,
                                      source_address=(source, 0))
    try:
        conn.request("GET", path, headers={"User-Agent": "kube-probe/1.30", "Accept": "*/*",
                                           "Connection": "close"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(), resp.getheader("Connection")
    except OSError as e:
        return None, repr(e), None
    finally:
        conn.close()


def check_probes(srv, source):
    """PROBES of each, one after the other, every one answered."""
    answers = [probe(srv.ops_port, path, source)
               for _ in range(PROBES) for path in ("/healthz", "/readyz")]
    failed = [a for a in answers if a[0] != 200]
    assert not failed, f"{len(failed)} of {len(answers)} probes not answered: {failed[:3]}"
    for (status, body, connection), path in zip(answers, ["/healthz", "/readyz"] * PROBES):
        assert connection == "close"
        if path == "/healthz":
            assert body == "ok\n"
        else:
            assert body.startswith("ready: policy generation 1, last reload: ok\n"), body


def test_probes_are_answered_while_a_pod_churns_the_ops_port(binary, certs, tmp_path):
    """The issue's case: 200 clients from one address reconnecting as fast as the ops port
    closes them.  Every probe is answered, from the node's address (the churn from a pod) and
    from the churning address itself (the churn from a hostNetwork process, beside the kubelet);
    /metrics from a third address too, and the webhook port still reviews."""
    srv = start_server(binary, certs, tmp_path, "--inventory", "off")
    hog = Hog(srv.ops_port, HOG, CHURNERS, reconnect=True)
    try:
        # Churning: every client has connected, and many have been closed and come back.
        assert wait_for(lambda: hog.opened >= 2 * CHURNERS, GIVE_UP), (hog.opened, hog.closed)
        closed = hog.closed
        check_probes(srv, NODE)
        check_probes(srv, HOG)
        assert hog.closed > closed  # the churn went on during the probes
        status, body, _ = probe(srv.ops_port, "/metrics", OTHER)
        assert status == 200 and "gpuguard_" in body, (status, body[:200])
        sent = review()
        code, _, got = srv.connect().review(sent)
        assert code == 200 and check_envelope(sent, got, "/mutate")["allowed"] is True
    finally:
        hog.end()
        assert srv.stop() == 0


def test_per_peer_cap_closes_the_extra_connections_and_never_the_probes(binary, certs, tmp_path):
    """One address opens many connections and holds them: the ops port keeps --ops-max-per-peer
    of them and closes the others within seconds (not after --request-timeout, set high here;
    connections that send nothing reach the door about 1 s after their connect), logging it; probes from that same address (the kubelet shares the node's address with hostNetwork
    processes) are still all answered, and the cap still holds after them."""
    cap = per_peer_cap(binary)
    held = cap + 40
    srv = start_server(binary, certs, tmp_path, "--inventory", "off", "--request-timeout", "300")
    hog = Hog(srv.ops_port, HOG, held, reconnect=False)
    try:
        assert wait_for(lambda: hog.opened == held and hog.closed >= held - cap, GIVE_UP), \
            f"opened {hog.opened}, closed {hog.closed}: the cap is {cap} per address"
        assert hog.held == cap
        check_probes(srv, HOG)
        assert cap - 1 <= hog.held <= cap  # the first probe took the place of the oldest
        capped = [r for r in srv.log_lines()
                  if r.get("msg") == "ops port: connections closed by the per-peer cap"]
        assert capped and capped[0]["peer"] == HOG and capped[0]["limit"] == cap, capped
        assert capped[0]["level"] == "warn"
    finally:
        hog.end()
        assert srv.stop() == 0
