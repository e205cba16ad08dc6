"""Metrics scraped from the running server and parsed with the Prometheus
client's own parser, decision logs parsed as JSON, audit annotation keys
checked against the API server's rules."""

import re

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO, start_server, wait_for
from test_policy_error_locations import lua_name
from test_server import review

QUALIFIED = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def gpu_review(namespace="team-a", fraction="0.25", labels=None):
    rev = review(namespace=namespace)
    pod = rev["request"]["object"]
    pod["metadata"]["namespace"] = namespace
    pod["metadata"]["labels"] = labels or {"gpuguard.io/workload-class": "interactive",
                                           "team": "vision"}
    pod["metadata"]["annotations"] = {"gpuguard.io/gpu-fraction": fraction}
    return rev


@pytest.fixture
def shipped(binary, certs, tmp_path):
    """The server with the shipped policies and the example configuration."""
    srv = start_server(binary, certs, tmp_path, "--policies", str(REPO / "policies"), "--lua",
                       str(REPO / "lua"), "--config", str(REPO / "deploy" / "gpuguard.yaml"))
    yield srv
    if srv.proc.poll() is None:
        assert srv.stop() == 0


def scrape(srv):
    status, text = srv.ops("/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return families


def sample(families, family, name=None, **labels):
    for s in families[family].samples:
        if (name is None or s.name == name) and all(s.labels.get(k) == v
                                                    for k, v in labels.items()):
            return s.value
    return None


def test_metrics_parse_and_move_with_traffic(shipped):
    before = scrape(shipped)
    info = before["gpuguard_build_info"].samples[0]
    assert info.value == 1 and re.fullmatch(r"\d+\.\d+\.\d+", info.labels["version"])
    conn = shipped.connect()
    for _ in range(3):
        assert conn.review(gpu_review(), path="/mutate")[0] == 200
    assert conn.review(gpu_review(fraction="1.5"), path="/mutate")[0] == 200  # denied
    assert conn.review(review(), path="/validate")[0] == 200
    after = scrape(shipped)
    req = "gpuguard_admission_requests"
    assert sample(after, req, endpoint="mutate", operation="CREATE", verdict="patched") == 3
    assert sample(after, req, endpoint="mutate", operation="CREATE", verdict="denied") == 1
    assert sample(after, req, endpoint="validate", operation="CREATE", verdict="allowed") == 1
    hist = "gpuguard_admission_request_duration_seconds"
    assert sample(after, hist, name=hist + "_count", endpoint="mutate", verdict="patched") == 3
    assert sample(after, hist, name=hist + "_bucket", endpoint="mutate", verdict="patched",
                  le="5") == 3
    evals = "gpuguard_policy_evaluations"
    assert sample(after, evals, policy="gpu-sharing", result="ok") == 3
    assert sample(after, evals, policy="gpu-sharing", result="denied") == 1
    pol = "gpuguard_policy_duration_seconds"
    assert sample(after, pol, name=pol + "_count", policy="gpu-sharing") == 4
    assert sample(after, "gpuguard_lua_memory_peak_bytes") > 0
    assert sample(after, "gpuguard_policy_generation") == 1
    assert sample(after, "gpuguard_tls_certificate_expiry_timestamp_seconds") > 1.7e9
    assert sample(after, "gpuguard_open_connections") == 1
    # The answer is on the wire a moment before the request's bookkeeping ends.
    assert wait_for(lambda: sample(scrape(shipped), "gpuguard_inflight_requests") == 0, step=0.02)


def test_quota_gauges_show_the_configured_amounts_exactly(binary, certs, tmp_path):
    settings = yaml.safe_load((REPO / "deploy" / "gpuguard.yaml").read_text())
    settings["quotas"]["namespaces"] = {"team-a": 8, "team-b": "0.25", "ml": 1.5,
                                        'bad"name': 2}
    settings["quotas"]["default"] = "0.125"
    config = tmp_path / "quotas.yaml"
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    srv = start_server(binary, certs, tmp_path, "--policies", str(REPO / "policies"), "--lua",
                       str(REPO / "lua"), "--config", str(config))
    try:
        status, text = srv.ops("/metrics")
        assert status == 200
        lines = [line for line in text.splitlines() if line.startswith("gpuguard_quota")]
        assert lines == ['gpuguard_quota_gpus{namespace="team-a"} 8',
                         'gpuguard_quota_gpus{namespace="team-b"} 0.25',
                         'gpuguard_quota_gpus{namespace="ml"} 1.5',
                         "gpuguard_quota_default_gpus 0.125",
                         "gpuguard_quota_enforced 0"]  # no inventory here
        # That is said once, at start, not as a warning on every review.
        starts = [r for r in srv.log_lines() if r.get("msg", "").startswith("inventory: off")]
        assert len(starts) == 1
        _, _, got = srv.connect().review(gpu_review(), path="/validate")
        assert not [w for w in got["response"].get("warnings", []) if "not checked" in w]
    finally:
        assert srv.stop() == 0


def test_policy_failures_are_counted_by_kind(binary, certs, tmp_path):
    policies = tmp_path / "p"
    policies.mkdir()
    (policies / "10-loop.lua").write_text(
        "return { name = 'loop', validate = function(req, pod)\n"
        "  if pod.metadata.name == 'spin' then while true do end end\n"
        "  if pod.metadata.name == 'boom' or pod.metadata.generateName then error('boom') end\n"
        "  if pod.metadata.name == 'big' then local t = {} for i = 1, 1e9 do t[i] = i end end\n"
        "end }")
    srv = start_server(binary, certs, tmp_path, "--policies", str(policies), "--lua",
                       str(tmp_path))
    try:
        conn = srv.connect()
        for name in ("spin", "boom", "big", "fine"):
            rev = review()
            rev["request"]["object"]["metadata"]["name"] = rev["request"]["name"] = name
            assert conn.review(rev, path="/validate")[0] == 200
        rev = review()  # a pod named by the API server: the logs name its generateName
        rev["request"]["object"]["metadata"] = {"generateName": "job-x-", "namespace": "default"}
        assert conn.review(rev, path="/validate")[0] == 200
        got = scrape(srv)
        evals = "gpuguard_policy_evaluations"
        assert sample(got, evals, policy="loop", result="budget") == 1
        assert sample(got, evals, policy="loop", result="error") == 2
        assert sample(got, evals, policy="loop", result="memory") == 1
        assert sample(got, evals, policy="loop", result="ok") == 1
        # The review a policy failed on is denied (fail closed) and logged as an error, not as
        # a denial, with what and who; the reviews metric counts it as an error too.
        failed = [r for r in srv.log_lines() if r.get("msg") == "decision" and r["name"] == "boom"]
        assert failed[0]["verdict"] == "error" and failed[0]["policy_errors"] == 1
        assert failed[0]["kind"] == "Pod" and failed[0]["user"] == "alice"
        assert failed[0]["message"] == (f"loop: policy error: {lua_name(policies / '10-loop.lua')}"
                                        ":3: boom")
        fine = [r for r in srv.log_lines() if r.get("msg") == "decision" and r["name"] == "fine"]
        assert fine[0]["verdict"] == "allowed" and "policy_errors" not in fine[0]
        failing = [r for r in srv.log_lines() if r.get("msg") == "policy failed"]
        assert {r["name"] for r in failing} == {"spin", "boom", "big", "job-x-"}
    finally:
        assert srv.stop() == 0


def test_one_json_decision_line_per_review(shipped):
    conn = shipped.connect()
    sent = gpu_review()
    sent["request"]["object"]["metadata"] = {
        "generateName": "notebook-", "namespace": "team-a",
        "labels": {"gpuguard.io/workload-class": "interactive", "team": "vision"},
        "annotations": {"gpuguard.io/gpu-fraction": "0.25"}}
    sent["request"]["name"] = ""
    conn.review(sent, path="/mutate")
    denied = gpu_review(fraction="1.5")
    conn.review(denied, path="/mutate")
    lines = [r for r in shipped.log_lines() if r.get("msg") == "decision"]
    assert len(lines) == 2
    first, second = lines
    assert first["uid"] == sent["request"]["uid"]
    assert first["namespace"] == "team-a"
    assert first["name"] == "notebook-"
    assert first["operation"] == "CREATE" and first["endpoint"] == "mutate"
    assert (first["kind"], first["resource"], first["user"]) == ("Pod", "pods", "alice")
    assert first["verdict"] == "patched"
    assert first["policies"] == ["gpu-sharing", "gpu-placement", "gpu-guardrails"]
    assert first["patch_ops"] >= 4
    assert isinstance(first["latency_ms"], float)
    assert "object" not in first  # no full objects unless debug
    assert second["verdict"] == "denied"
    assert second["message"].startswith("gpu-sharing: container c: a time-slicing GPU is shared")


def test_a_workloads_decision_line_says_what_and_who(shipped):
    # A Job and a Pod of one name in one namespace are told apart by kind and resource.
    pod = review()["request"]["object"]
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "p", "namespace": "team-a", "labels": {"team": "vision"}},
           "spec": {"template": {"metadata": {"labels": {"team": "vision"}},
                                 "spec": dict(pod["spec"], restartPolicy="Never")}}}
    shipped.connect().review(review(
        kind={"group": "batch", "version": "v1", "kind": "Job"},
        resource={"group": "batch", "version": "v1", "resource": "jobs"}, namespace="team-a",
        name="p", userInfo={"username": "ci-bot", "groups": ["system:authenticated"]},
        object=job), path="/validate")
    line = [r for r in shipped.log_lines() if r.get("msg") == "decision"][-1]
    assert {k: line[k] for k in ("kind", "resource", "namespace", "name", "user", "endpoint",
                                 "verdict")} == {
        "kind": "Job", "resource": "jobs.batch", "namespace": "team-a", "name": "p",
        "user": "ci-bot", "endpoint": "validate", "verdict": "allowed"}


def test_debug_logs_carry_the_object(binary, certs, tmp_path):
    srv = start_server(binary, certs, tmp_path, "--log-level", "debug")
    try:
        srv.connect().review(review(), path="/mutate")
        lines = [r for r in srv.log_lines() if r.get("msg") == "decision"]
        assert lines and lines[-1]["object"]["kind"] == "Pod"
    finally:
        assert srv.stop() == 0


def test_audit_annotations_name_policy_mode_pool_and_profile(shipped):
    conn = shipped.connect()
    rev = gpu_review(labels={"gpuguard.io/workload-class": "inference", "team": "vision"})
    rev["request"]["object"]["metadata"]["annotations"] = {"gpuguard.io/gpu-memory": "18Gi"}
    _, _, got = conn.review(rev, path="/mutate")
    audit = got["response"]["auditAnnotations"]
    for key in audit:
        assert QUALIFIED.fullmatch(key) and len(key) <= 63, key
    assert audit["verdict"] == "patched"
    assert audit["policies"] == "gpu-sharing (enforce), gpu-placement (enforce)"
    assert audit["gpu-placement.pool"] == "a100-mig"
    assert "pool a100-mig" in audit["gpu-sharing.decision"]
    assert "1g.20gb" in audit["gpu-sharing.decision"]
    _, _, got = conn.review(gpu_review(fraction="1.5"), path="/mutate")
    audit = got["response"]["auditAnnotations"]
    assert audit["verdict"] == "denied"
    assert audit["policies"] == "gpu-sharing (enforce), gpu-guardrails (enforce)"
    # Nothing changed, nothing denied: no annotations.
    _, _, got = conn.review(review(), path="/mutate")
    assert "auditAnnotations" not in got["response"]
