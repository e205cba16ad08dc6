"""Shared pytest fixtures: the gpuguard binary, generated certificates, and a
running server on loopback with ephemeral ports, driven over HTTPS the way the
Kubernetes API server drives a webhook."""

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
SERVICE = "gpuguard"
NAMESPACE = "gpuguard-system"
SNI = f"{SERVICE}.{NAMESPACE}.svc"


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
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ops_port}{path}",
                                        timeout=5) as r:
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

    def stop(self, timeout=15):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)


def start_server(binary, certs, tmp_path, *extra, env=None, ready_timeout=10):
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


def launch(cmd, log_path, ca, env=None, ready_timeout=10):
    """Run a `gpuguard serve` command line whose ports come from its log's `serving`
    line, logging to log_path; return the Server once /readyz answers 200."""
    logf = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=logf, cwd=REPO,
                            env=env)
    logf.close()
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
        proc.kill()
        raise RuntimeError(f"server did not start: {log_path.read_text()}")
    server = Server(proc, log_path, port, ops_port, ca)
    while time.monotonic() < deadline:
        if server.ops("/readyz")[0] == 200:
            return server
        time.sleep(0.02)
    server.proc.kill()
    raise RuntimeError(f"server never became ready: {log_path.read_text()}")


@pytest.fixture
def server(binary, certs, tmp_path):
    srv = start_server(binary, certs, tmp_path)
    yield srv
    if srv.proc.poll() is None:
        assert srv.stop() == 0


def load_review(name):
    return json.loads((DATA / "reviews" / name).read_text())
