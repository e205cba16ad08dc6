"""A sampled allocation-failure sweep against the real server over TLS: with
an LD_PRELOAD shim failing every N-th allocation of the whole process (TLS,
HTTP, decoding, the engine, encoding), a review the shipped policies must
deny is never answered "allowed".  An answer may be a denial, an HTTP error
or a dropped connection (the API server then applies failurePolicy: Fail).
Once the failures stop, the server answers exactly as before."""

import json
import os
import signal
import uuid
from pathlib import Path

import pytest

from conftest import REPO, start_server, wait_for
from test_faults import CLOSED, SANITIZED

DENY = json.loads((REPO / "tests" / "data" / "reviews" / "pod-deny.json").read_text())
DENIAL = ("gpu-guardrails: volume nvidia mounts /dev/nvidia0 from the host, which is or lies "
          "under the GPU device and driver path /dev/nvidia*; remove it and ask for a GPU through "
          "the device plugin; GPU plumbing (drivers, device plugins, exporters) belongs in a namespace "
          "of placement.exempt_namespaces or runs as one of placement.exempt_service_accounts")
# Co-prime strides, so the failures land at different points of each request.
STRIDES = (61, 97, 211)
REQUESTS = 60  # per stride


def shim():
    tools = os.environ.get("GPUGUARD_TOOLS")
    if not tools:
        pytest.skip("GPUGUARD_TOOLS is not set: run through 'make test'")
    if SANITIZED:
        pytest.skip("the sanitizers own malloc: no allocation shim under make asan")
    return str(Path(tools) / "failmalloc.so")


def ask(srv, path):
    body = json.loads(json.dumps(DENY))
    body["request"]["uid"] = str(uuid.uuid4())
    conn = srv.connect(timeout=10)
    try:
        status, _, got = conn.review(body, path=path)
    except CLOSED:
        return "closed", None
    finally:
        conn.close()
    if status != 200:
        return "error", None
    if isinstance(got, str):
        # Sent without its Content-Type header (the header could not be added):
        # the API server refuses such an answer, but it must not say "allowed".
        try:
            got = json.loads(got)
        except json.JSONDecodeError:
            return "error", None
    assert got["response"]["uid"] == body["request"]["uid"]
    return ("allowed" if got["response"]["allowed"] else "denied"), got["response"]


@pytest.mark.parametrize("every", STRIDES)
def test_failed_allocations_never_allow_a_must_deny_review(binary, certs, tmp_path, every):
    report = tmp_path / "failed"
    env = dict(os.environ, LD_PRELOAD=shim(), GG_FAILMALLOC_EVERY=str(every),
               GG_FAILMALLOC_REPORT=str(report))
    srv = start_server(binary, certs, tmp_path, "--policies", str(REPO / "policies"),
                       "--lua", str(REPO / "lua"), "--config",
                       str(REPO / "deploy" / "gpuguard.yaml"), env=env)
    try:
        verdict, resp = ask(srv, "/validate")
        assert verdict == "denied" and resp["status"]["message"] == DENIAL
        srv.proc.send_signal(signal.SIGUSR2)  # arm
        seen = {}
        for _ in range(REQUESTS):
            verdict, _ = ask(srv, "/validate")
            seen[verdict] = seen.get(verdict, 0) + 1
            assert verdict != "allowed", seen
            if srv.proc.poll() is not None:
                pytest.fail(f"server died ({srv.proc.returncode}) after {seen}")
        srv.proc.send_signal(signal.SIGUSR1)  # disarm; the shim writes its count
        assert wait_for(report.exists, step=0.02)
        assert int(report.read_text()) > 0, "no allocation failed: the sweep tested nothing"
        verdict, resp = ask(srv, "/validate")
        assert verdict == "denied" and resp["status"]["message"] == DENIAL
        assert srv.ops("/healthz")[0] == 200
    finally:
        if srv.proc.poll() is None:
            srv.stop()
