"""The webhook's wire contract against the real server over real TLS on
loopback, with a client configured like the Kubernetes API server's."""

import base64
import collections
import json
import re
import socket
import ssl
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from conftest import (REPO, SNI, ApiServerConnection, load_review, procs, start_server,
                      unreachable_cluster, wait_for)


def review(version="v1", operation="CREATE", **request):
    req = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "default",
        "operation": operation,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"], "extra": {}},
        "object": {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "p", "namespace": "default"},
                   "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
        "oldObject": None,
        "dryRun": False,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    }
    req.update(request)
    return {"apiVersion": f"admission.k8s.io/{version}", "kind": "AdmissionReview",
            "request": req}


def check_envelope(sent, got, path):
    """What the API server checks on every answer."""
    assert got["apiVersion"] == sent["apiVersion"]
    assert got["kind"] == "AdmissionReview"
    resp = got["response"]
    assert resp["uid"] == sent["request"]["uid"]
    assert isinstance(resp["allowed"], bool)
    if path == "/validate":
        assert "patch" not in resp and "patchType" not in resp
    else:
        assert ("patch" in resp) == ("patchType" in resp)
        if "patch" in resp:
            assert resp["patchType"] == "JSONPatch"
            patch = json.loads(base64.b64decode(resp["patch"], validate=True))
            assert isinstance(patch, list)
    return resp


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_answers_in_the_version_received(server, version, path):
    conn = server.connect()
    sent = review(version)
    status, resp, got = conn.review(sent, path=path)
    assert status == 200
    assert resp.getheader("Content-Type") == "application/json"
    assert check_envelope(sent, got, path)["allowed"] is True
    assert conn.sock.selected_alpn_protocol() == "http/1.1"


@pytest.mark.parametrize("operation,fields", [
    ("CREATE", {"oldObject": None, "options": None}),
    ("CREATE", {"object": {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"generateName": "web-", "namespace": "default"}},
                "name": ""}),
    ("UPDATE", {"oldObject": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}},
                "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}}),
    ("UPDATE", {"subResource": "status", "name": "p"}),
    ("DELETE", {"object": None, "name": "p",
                "oldObject": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}},
                "options": {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1"}}),
    ("CONNECT", {"subResource": "attach", "name": "p", "options": None,
                 "object": {"kind": "PodAttachOptions", "apiVersion": "v1", "stdin": True,
                            "container": "c"}}),
    ("CREATE", {"dryRun": True}),
])
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_every_operation_and_nullable_field(server, operation, fields, path):
    sent = review(operation=operation, **fields)
    status, _, got = server.connect().review(sent, path=path)
    assert status == 200
    assert check_envelope(sent, got, path)["allowed"] is True


def test_sample_review_from_the_readme(server):
    sent = load_review("pod-create.json")
    status, _, got = server.connect().review(sent)
    assert status == 200
    check_envelope(sent, got, "/mutate")


def test_keep_alive_connection_serves_many_requests(server):
    conn = server.connect()
    conn.review(review())
    first_socket = conn.sock
    for i in range(200):
        path = "/mutate" if i % 2 else "/validate"
        sent = review()
        status, _, got = conn.review(sent, path=path)
        assert status == 200
        check_envelope(sent, got, path)
    assert conn.sock is first_socket, "the connection was not reused"
    status, text = server.ops("/metrics")
    assert re.search(r"^gpuguard_open_connections 1$", text, re.M)


def test_one_worker_thread_serves_without_library_warnings(binary, certs, tmp_path):
    srv = start_server(binary, certs, tmp_path, "--threads", "1")
    try:
        sent = review()
        status, _, got = srv.connect().review(sent)
        assert status == 200
        check_envelope(sent, got, "/mutate")
        serving = [r for r in srv.log_lines() if r.get("msg") == "serving"]
        assert serving[0]["threads"] == 1
        assert [r for r in srv.log_lines() if r.get("level") in ("warn", "error")] == []
    finally:
        assert srv.stop() == 0


# Each worker thread has a Lua VM of its own: a table made when the policy loads names the VM,
# and so the worker, that answered.
WHICH_WORKER = """
local id = tostring({}):match("0x%x+") or tostring({})
return { name = "which-worker", mutate = function(req) req:warn("worker " .. id) end }
"""


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_burst_of_connections_spreads_across_the_workers(binary, certs, tmp_path, threads):
    """One thread accepts and hands the connections to the workers in turn.  With one listening
    socket polled by all the workers, a burst of connections (a client opening its pool) went
    to one worker: 48 of 48, or 45 and 3, leaving the other CPU idle under load.  (That a new
    connection skips a worker busy with a review: test_inventory_dra.py,
    test_a_template_get_ends_within_the_reviews_deadline.)"""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "10-which-worker.lua").write_text(WHICH_WORKER)
    srv = start_server(binary, certs, tmp_path, "--threads", str(threads), "--policies",
                       str(policies), "--lua", str(REPO / "lua"))
    try:
        # The TCP connections first, all waiting in the kernel; then TLS and a review on each.
        socks = [socket.create_connection(("127.0.0.1", srv.port), 10) for _ in range(48)]
        # All handed to the workers before the first review: a loaded machine's acceptor may
        # lag, and a connection it hands over while a worker runs a review skips that worker.
        assert wait_for(lambda: "gpuguard_open_connections 48\n" in srv.ops("/metrics")[1])
        seen = collections.Counter()
        for sock in socks:
            conn = srv.connect()
            conn.connect(sock)
            status, _, got = conn.review(review())
            conn.close()
            assert status == 200
            seen.update(got["response"]["warnings"])
        assert sorted(seen.values()) == [48 // threads] * threads, seen
        # Named for ps and top -H, and for the benchmark's per-worker CPU.
        tasks = Path(f"/proc/{srv.proc.pid}/task")
        names = [(t / "comm").read_text().strip() for t in tasks.iterdir()]
        assert names.count("webhook-worker") == threads, names
        serving = [r for r in srv.log_lines() if r.get("msg") == "serving"]
        assert serving[0]["threads"] == threads
    finally:
        assert srv.stop() == 0


def plain_request(conn, method, path, body=None, headers=None):
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    return resp.status, resp, resp.read().decode()


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_non_post_is_405(server, method):
    status, resp, text = plain_request(server.connect(), method, "/mutate?timeout=10s",
                                       headers={"Content-Type": "application/json"})
    assert status == 405
    assert resp.getheader("Allow") == "POST"
    assert text == f"method {method} not allowed on /mutate: use POST\n"


@pytest.mark.parametrize("path", ["/", "/mutate/", "/Mutate", "/healthz", "/validate-pods"])
def test_unknown_path_is_404(server, path):
    status, _, text = server.connect().review(review(), path=path)
    assert status == 404
    assert text == f"no such path {path}: use /mutate or /validate\n"


@pytest.mark.parametrize("ctype,shown", [("text/plain", "text/plain"),
                                         ("application/yaml", "application/yaml"),
                                         (None, "none")])
def test_wrong_content_type_is_415(server, ctype, shown):
    status, _, text = server.connect().review(review(), content_type=ctype)
    assert status == 415
    assert text == f"Content-Type must be application/json, got {shown}\n"


def test_json_content_type_with_charset_is_accepted(server):
    sent = review()
    status, _, got = server.connect().review(sent, content_type="application/json; charset=utf-8")
    assert status == 200
    check_envelope(sent, got, "/mutate")


@pytest.mark.parametrize("body,reason", [
    ("{", "malformed JSON at line 1 column 2: string or '}' expected near end of input"),
    ("", "malformed JSON at line 1 column 1: premature end of input"),
    ("[]", "not an AdmissionReview: the body is not a JSON object"),
    ('{"apiVersion":"v1","kind":"Pod"}',
     'unsupported apiVersion "v1": want admission.k8s.io/v1 or admission.k8s.io/v1beta1'),
    ('{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}',
     "not an AdmissionReview request: request is missing"),
    ('{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE"}}',
     "request.uid must be a non-empty string"),
])
def test_bad_review_is_400_with_one_line_reason(server, body, reason):
    status, _, text = server.connect().review(body)
    assert status == 400
    assert text == reason + "\n"
    logged = [r for r in server.log_lines() if r.get("status") == 400]
    assert logged and logged[-1]["msg"] == reason


def test_body_over_max_is_413_from_content_length(binary, certs, tmp_path):
    srv = start_server(binary, certs, tmp_path, "--max-body", "4096")
    try:
        conn = srv.connect()
        # Only the headers are sent: the answer must not wait for the body.
        conn.putrequest("POST", "/mutate?timeout=10s")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", "5000")
        conn.endheaders()
        resp = conn.getresponse()
        assert resp.status == 413
        assert resp.read().decode() == "body of 5000 bytes is over the limit of 4096 bytes\n"
        # Exactly at the limit is still read.
        body = json.dumps(review()).encode()
        body += b" " * (4096 - len(body))
        status, _, got = srv.connect().review(body)
        assert status == 200
    finally:
        assert srv.stop() == 0


def test_chunked_body_over_max_is_413(binary, certs, tmp_path):
    srv = start_server(binary, certs, tmp_path, "--max-body", "4096")
    try:
        conn = srv.connect()
        chunks = [b"x" * 1000] * 10
        conn.request("POST", "/mutate", body=iter(chunks),
                     headers={"Content-Type": "application/json",
                              "Transfer-Encoding": "chunked"}, encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413
        assert resp.read().decode() == "body is over the limit of 4096 bytes\n"
        status, text = srv.ops("/metrics")
        assert re.search(r'^gpuguard_http_errors_total\{code="413"\} 1$', text, re.M)
    finally:
        assert srv.stop() == 0


def test_answers_well_before_the_timeout(server):
    conn = server.connect()
    conn.review(review())
    for timeout in ("1s", "10s", "30s"):
        start = time.monotonic()
        status, _, _ = conn.review(review(), timeout=timeout)
        assert status == 200
        assert time.monotonic() - start < 1.0


def tls_context(ca, version):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(ca))
    ctx.minimum_version = version
    ctx.maximum_version = version
    return ctx


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_tls_12_and_13_are_served(server, version):
    conn = ApiServerConnection(server.port, server.ca, context=tls_context(server.ca, version))
    sent = review()
    status, _, got = conn.review(sent)
    assert status == 200
    assert conn.sock.version() == {ssl.TLSVersion.TLSv1_2: "TLSv1.2",
                                   ssl.TLSVersion.TLSv1_3: "TLSv1.3"}[version]


def test_tls_below_12_is_refused(server):
    """OpenSSL's default security level refuses to offer TLS 1.1, so offer it
    with the openssl CLI at level 0 and see the handshake fail."""
    proc = subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{server.port}", "-tls1_1",
         "-cipher", "DEFAULT@SECLEVEL=0", "-servername", SNI],
        input=b"", capture_output=True, timeout=10)
    assert proc.returncode != 0
    assert b"no peer certificate available" in proc.stdout


def test_plain_http_on_the_webhook_port_gets_no_answer(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        data = sock.recv(100)
    assert not data.startswith(b"HTTP/1.1 200")


def test_certificate_matches_the_service_name(server):
    conn = server.connect()
    conn.review(review())
    cert = conn.sock.getpeercert()
    names = {v for k, v in cert["subjectAltName"] if k == "DNS"}
    assert SNI in names


def test_ops_endpoints(server):
    assert server.ops("/healthz") == (200, "ok\n")
    assert server.ops("/readyz") == (200, "ready: policy generation 1, last reload: ok\n"
                                          "inventory: off\n")
    assert server.ops("/nope")[0] == 404


def metric(text, name, **labels):
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
                       if labels else "")
        if key == want:
            return float(value)
    return None


def test_metrics_count_requests_by_endpoint_and_verdict(server):
    conn = server.connect()
    for _ in range(3):
        conn.review(review(), path="/mutate")
    for _ in range(2):
        conn.review(review(), path="/validate")
    conn.review("{", path="/validate")
    _, text = server.ops("/metrics")
    assert metric(text, "gpuguard_admission_requests_total",
                  endpoint="mutate", operation="CREATE", verdict="allowed") == 3
    assert metric(text, "gpuguard_admission_requests_total",
                  endpoint="validate", operation="CREATE", verdict="allowed") == 2
    assert metric(text, "gpuguard_admission_requests_total",
                  endpoint="validate", operation="none", verdict="error") == 1
    assert metric(text, "gpuguard_admission_request_duration_seconds_count",
                  endpoint="mutate", verdict="allowed") == 3
    assert metric(text, "gpuguard_admission_request_duration_seconds_bucket",
                  endpoint="mutate", verdict="allowed", le="+Inf") == 3
    assert metric(text, "gpuguard_admission_request_duration_seconds_sum",
                  endpoint="mutate", verdict="allowed") > 0


def test_sigterm_answers_requests_in_flight_and_exits_0(binary, certs, tmp_path):
    srv = start_server(binary, certs, tmp_path)
    idle = srv.connect()
    idle.review(review())
    conn = srv.connect()
    body = json.dumps(review()).encode()
    conn.putrequest("POST", "/mutate?timeout=10s")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders()
    conn.send(body[:10])  # the request is in flight: headers and part of the body
    time.sleep(0.2)
    srv.proc.send_signal(15)
    time.sleep(0.3)
    assert srv.proc.poll() is None, "exited with a request in flight"
    with pytest.raises(OSError):  # no new connections
        fresh = srv.connect(timeout=2)
        fresh.review(review())
    conn.send(body[10:])
    resp = conn.getresponse()
    assert resp.status == 200
    assert json.loads(resp.read())["response"]["allowed"] is True
    assert procs.stop(srv.proc, None) == 0  # SIGTERM sent above; waited for, bounded
    msgs = [r.get("msg") for r in srv.log_lines()]
    assert "Terminated received: draining requests in flight" in msgs
    assert msgs[-1] == "stopped"


def test_help_lists_every_flag(binary):
    out = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for flag in ("--listen ADDR:PORT", "[0.0.0.0:8443]", "--ops-listen", "[0.0.0.0:9090]",
                 "--tls-cert FILE", "--tls-key FILE", "--config FILE", "--policies DIR",
                 "[./policies]", "--lua DIR", "[./lua]", "--threads N", "[number of CPUs]",
                 "--max-body BYTES", "[16777216]", "--max-connections N", "[4096]",
                 "--client-ca FILE", "--client-cn NAME", "--client-san NAME",
                 "--shutdown-grace SECONDS", "--log-level LEVEL"):
        assert flag in out.stdout
    top = subprocess.run([binary, "--help"], capture_output=True, text=True)
    assert top.returncode == 0
    for cmd in ("serve", "certs", "version"):
        assert f"  {cmd} " in top.stdout


def test_version(binary):
    out = subprocess.run([binary, "version"], capture_output=True, text=True)
    assert out.returncode == 0
    assert re.fullmatch(r"gpuguard \d+\.\d+\.\d+\n", out.stdout)


@pytest.mark.parametrize("args,message", [
    (["--bogus"], "unknown flag or missing value: --bogus"),
    (["--threads", "0", "--tls-cert", "a", "--tls-key", "b"],
     '--threads must be a whole number from 1 to 256, got "0"'),
    (["--max-body", "lots", "--tls-cert", "a", "--tls-key", "b"],
     '--max-body must be a whole number from 1024 to 1073741824, got "lots"'),
    ([], "--tls-cert and --tls-key are required (or --tls-secret)"),
    (["--tls-secret", "gpuguard-tls", "--tls-cert", "a", "--tls-key", "b"],
     "--tls-secret keeps certificates itself: give it or --tls-cert and --tls-key, not both"),
    (["--tls-secret", "gpuguard-tls", "--webhook-failure-policy", "fail"],
     "--webhook-failure-policy must be Fail or Ignore"),
    (["--tls-secret", "gpuguard-tls", "--cert-check", "soon"],
     'a duration such as 15s or 500ms, got "soon"'),
    (["--tls-cert", "a", "--tls-key", "b", "--ca-validity", "1h"],
     "--tls-service, --ca-validity and --cert-validity are for --tls-secret"),
    (["--tls-cert", "a", "--tls-key", "b", "--client-san", "kube-apiserver"],
     "--client-cn and --client-san need --client-ca"),
    (["--tls-cert", "a", "--tls-key", "b", "--client-ca", "c", "--client-cn", ""],
     "--client-cn takes a name that is not empty, 16 times at most"),
])
def test_usage_errors_exit_2(binary, args, message):
    out = subprocess.run([binary, "serve", *args], capture_output=True, text=True)
    assert out.returncode == 2
    assert message in out.stderr


@pytest.mark.parametrize("args,message", [
    (["--tls-secret", "gpuguard-system/gpuguard-tls", "--cert-validity", "10s"],
     "certificate lifetimes must be at least 30 s"),
    (["--tls-secret", "gpuguard-system/gpuguard-tls", "--cert-check", "1h",
      "--cert-validity", "2h"],
     "--cert-check must be at least 100ms and at most a twelfth of the shorter of --ca-validity"),
    (["--tls-secret", "Bad_NS/gpuguard-tls"], "namespace 'Bad_NS' is not a DNS-1123 label"),
    (["--tls-secret", "gpuguard-system/gpuguard-tls", "--webhook-configuration", "a b"],
     "--webhook-configuration: 'a b' is not an object name"),
])
def test_own_certificate_settings_are_checked_before_any_request(binary, tmp_path, args, message):
    """--tls-secret's settings are refused at start (exit 1), before the API server is asked:
    the kubeconfig's server is a closed port."""
    out = subprocess.run([binary, "serve", "--listen", "127.0.0.1:0", "--ops-listen",
                          "127.0.0.1:0", *unreachable_cluster(tmp_path), *args],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert message in out.stderr


def test_unreadable_certificate_exits_1(binary, tmp_path):
    out = subprocess.run([binary, "serve", "--tls-cert", str(tmp_path / "nope.crt"),
                          "--tls-key", str(tmp_path / "nope.key")],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 1
    assert "nope.crt" in out.stderr


def test_bad_listen_address_exits_1(binary, certs):
    out = subprocess.run([binary, "serve", "--listen", "nowhere", "--tls-cert",
                          str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key")],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 1
    assert 'address \\"nowhere\\" is not ADDR:PORT' in out.stderr


@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_port_in_use_exits_1_even_by_another_gpuguard(binary, certs, tmp_path, threads):
    """A second gpuguard on the port must not share it (as SO_REUSEPORT would let it)."""
    srv = start_server(binary, certs, tmp_path)
    try:
        out = subprocess.run([binary, "serve", "--listen", f"127.0.0.1:{srv.port}",
                              "--ops-listen", "127.0.0.1:0", "--threads", threads,
                              "--tls-cert", str(certs / "tls.crt"),
                              "--tls-key", str(certs / "tls.key")],
                             capture_output=True, text=True, timeout=10)
        assert out.returncode == 1
        assert f"cannot listen on 127.0.0.1:{srv.port}: Address already in use" in out.stderr
        assert srv.connect().review(review())[0] == 200
    finally:
        assert srv.stop() == 0
