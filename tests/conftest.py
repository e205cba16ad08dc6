"""Shared pytest fixtures: the gpuguard binary, generated certificates, and a
running server on loopback with ephemeral ports, driven over HTTPS the way the
Kubernetes API server drives a webhook.

Every long-lived child (a server, Prometheus, a benchmark) is started with
procs.spawn() (tests/bench/procs.py): in a process group of its own, known to a
watchdog that kills it if this process dies, and owned by the fixture or the test
that started it: the hooks below kill what a fixture or a test left running when
it ends, passed or failed.  Waits are bounded by procs.PATIENCE (wait_for), far
above what a loaded machine needs, so that only a real hang reaches the bound."""

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "bench"))
import procs  # noqa: E402  (tests/bench/procs.py, shared with the benchmarks)

DATA = REPO / "tests" / "data"
SERVICE = "gpuguard"
NAMESPACE = "gpuguard-system"
SNI = f"{SERVICE}.{NAMESPACE}.svc"


def wait_for(cond, timeout=procs.PATIENCE, step=0.05):
    """Polls cond() until it returns something true, which is returned; after timeout
    seconds, returns its last value (false)."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got or time.monotonic() >= deadline:
            return got
        time.sleep(step)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "whole_machine: loads every core (a benchmark run); `make integration` runs "
        "these after the others, alone, so that they cannot slow down a test that times a server")


# Children left running by their owner are killed when it ends, failed or not: a fixture's
# (started while it was set up) after its finalizers, a test's (started by its body, maybe
# through a factory fixture) after its teardown; the rest at the end of the session.  When
# this process itself is killed, the watchdog of tests/bench/procs.py kills them.
_children = {}  # fixture definition or test item -> [Popen]


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    with procs.owned() as mine:
        yield
    _children.setdefault(fixturedef, []).extend(mine)


def pytest_fixture_post_finalizer(fixturedef, request):
    for proc in _children.pop(fixturedef, []):
        procs.stop(proc, signal.SIGKILL)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with procs.owned() as mine:
        yield
    _children.setdefault(item, []).extend(mine)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    for proc in _children.pop(item, []):
        procs.stop(proc, signal.SIGKILL)


def pytest_sessionfinish(session):
    procs.shutdown()


def gpuguard_bin():
    path = os.environ.get("GPUGUARD_BIN")
    if not path:
        pytest.skip("GPUGUARD_BIN is not set: run through 'make test'")
    return path


@pytest.fixture(scope="session")
def binary():
    return gpuguard_bin()


@pytest.fixture(scope="session")
def certs(binary, tmp_path_factory):
    """A CA and a serving certificate for gpuguard.gpuguard-system.svc."""
    out = tmp_path_factory.mktemp("certs")
    subprocess.run([binary, "certs", "--service", SERVICE, "--namespace", NAMESPACE,
                    "--out", str(out), "--dev", "--force"], check=True,
                   stdout=subprocess.DEVNULL)
    return out


class ApiServerConnection(http.client.HTTPSConnection):
    """An HTTPS connection configured like the API server's webhook client:
    CA bundle, SNI <svc>.<ns>.svc, ALPN http/1.1, TLS 1.2 or later."""

    def __init__(self, port, ca, timeout=10, sni=SNI, context=None):
        if context is None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_verify_locations(cafile=str(ca))
            context.set_alpn_protocols(["http/1.1"])
        super().__init__("127.0.0.1", port, timeout=timeout, context=context)
        self._sni = sni

    def connect(self, sock=None):
        """TLS over a new TCP connection, or over sock (connected already, for bursts)."""
        if sock is None:
            sock = socket.create_connection((self.host, self.port), self.timeout)
        # As the API server's Go client does: without it, the body written after the headers
        # waits for the server's delayed ACK (40 ms a request).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self._context.wrap_socket(sock, server_hostname=self._sni)

    def review(self, body, path="/mutate", timeout="10s", content_type="application/json"):
        """POST an AdmissionReview; return (status, headers, decoded JSON or text)."""
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        url = f"{path}?timeout={timeout}" if timeout else path
        headers = {"Accept": "application/json, */*", "User-Agent": "kube-apiserver-admission"}
        if content_type:
            headers["Content-Type"] = content_type
        self.request("POST", url, body=body, headers=headers)
        resp = self.getresponse()
        data = resp.read()
        ctype = resp.getheader("Content-Type", "")
        if ctype.startswith("application/json"):
            return resp.status, resp, json.loads(data)
        return resp.status, resp, data.decode()


class Server:
    """A running `gpuguard serve`, its ports and its log."""

    def __init__(self, proc, log_path, port, ops_port, ca):
        self.proc = proc
        self.log_path = log_path
        self.port = port
        self.ops_port = ops_port
        self.ca = ca

    def connect(self, **kw):
        return ApiServerConnection(self.port, self.ca, **kw)

    def ops(self, path):
        """GET on the ops port; return (status, body text)."""
        try:  # a socket timeout for a hung server only: an answer takes milliseconds
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ops_port}{path}",
                                        timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def log_lines(self):
        lines = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                lines.append({"raw": line})
        return lines

    def stop(self, timeout=procs.PATIENCE):
        """SIGTERM, then its exit status (-9: it had not exited within timeout seconds)."""
        return procs.stop(self.proc, signal.SIGTERM, timeout)


def start_server(binary, certs, tmp_path, *extra, env=None, ready_timeout=procs.PATIENCE):
    log_path = tmp_path / "server.log"
    cmd = [binary, "serve", "--listen", "127.0.0.1:0", "--ops-listen", "127.0.0.1:0",
           "--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key"),
           "--threads", "2"]
    if "--policies" not in extra:
        # The wire contract is tested with no policies: every review is allowed as is.
        empty = tmp_path / "no-policies"
        empty.mkdir(exist_ok=True)
        cmd += ["--policies", str(empty), "--lua", str(REPO / "lua")]
    cmd += list(extra)
    return launch(cmd, log_path, certs / "ca.crt", env=env, ready_timeout=ready_timeout)


def start_policy_server(binary, certs, tmp_path, policies, engine, *extra):
    """A server of policies of the test's own ({file name: Lua source}), without the shipped
    library, with the configuration's engine: section (engine, YAML text of its keys)."""
    directory = tmp_path / "policies"
    directory.mkdir()
    for name, source in policies.items():
        (directory / name).write_text(source)
    config = tmp_path / "gpuguard.yaml"
    config.write_text("engine:\n" + "".join(f"  {line}\n" for line in engine.splitlines()))
    return start_server(binary, certs, tmp_path, "--policies", str(directory), "--lua",
                        str(tmp_path), "--config", str(config), *extra)


def launch(cmd, log_path, ca, env=None, ready_timeout=procs.PATIENCE):
    """Run a `gpuguard serve` command line whose ports come from its log's `serving`
    line, logging to log_path; return the Server once /readyz answers 200."""
    with open(log_path, "wb") as logf:
        proc = procs.spawn(cmd, stdout=subprocess.DEVNULL, stderr=logf, cwd=REPO, env=env)
    deadline = time.monotonic() + ready_timeout
    port = ops_port = None
    while time.monotonic() < deadline and port is None:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}: {log_path.read_text()}")
        for line in log_path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("msg") == "serving":
                port, ops_port = rec["port"], rec["ops_port"]
        time.sleep(0.02)
    if port is None:
        procs.stop(proc, signal.SIGKILL)
        raise RuntimeError(f"server did not start: {log_path.read_text()}")
    server = Server(proc, log_path, port, ops_port, ca)
    while time.monotonic() < deadline:
        if server.ops("/readyz")[0] == 200:
            return server
        time.sleep(0.02)
    procs.stop(proc, signal.SIGKILL)
    raise RuntimeError(f"server never became ready: {log_path.read_text()}")


@pytest.fixture
def server(binary, certs, tmp_path):
    srv = start_server(binary, certs, tmp_path)
    yield srv
    if srv.proc.poll() is None:
        assert srv.stop() == 0


def unreachable_cluster(tmp_path):
    """The flags of a pod whose API server does not answer: a kubeconfig naming a closed port,
    and the inventory off (as outside a cluster, where it is off by default)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return ["--kubeconfig", str(kubeconfig), "--inventory", "off"]


def load_review(name):
    return json.loads((DATA / "reviews" / name).read_text())
