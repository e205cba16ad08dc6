"""The audit's background review through engine_tool --phases audit (the core library, no
HTTP): what each validate policy makes of a stored object (policy_verdict.outcomes), what
req.background changes (the shipped guardrails leave the scheduler's spec.nodeName alone; a
pod's own charge is not counted twice against its quota), and a policy's severity."""

import copy
import json
import subprocess

import pytest

from test_engine import REPO, engine, pod, review, tool  # noqa: F401 (engine: a fixture)

CONFIG = REPO / "deploy" / "gpuguard.yaml"  # quotas.default: 4 GPUs


def shipped(tmp_path, rev, phases, cluster_state=None):
    path = tmp_path / "review.json"
    path.write_text(json.dumps(rev))
    cmd = [tool(), "--policies", str(REPO / "policies"), "--lua", str(REPO / "lua"),
           "--config", str(CONFIG), "--phases", phases, str(path)]
    if cluster_state is not None:
        state = tmp_path / "state.json"
        state.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster_state}))
        cmd[1:1] = ["--cluster-state", str(state)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def admitted_pod(tmp_path, name, gpus=1):
    """A GPU pod of namespace ml as gpuguard admitted it, then bound and running."""
    p = pod(name, labels={"team": "ml"},
            containers=[{"name": "c", "image": "busybox",
                         "resources": {"limits": {"nvidia.com/gpu": gpus}}}])
    p["metadata"]["namespace"] = "ml"
    mutated = shipped(tmp_path, review(p, namespace="ml"), "mutate")["mutated"]
    mutated["metadata"]["uid"] = f"uid-{name}"
    mutated["spec"]["nodeName"] = "gpu-node-0"
    mutated["status"] = {"phase": "Running"}
    return mutated


def results(verdict):
    return {o["policy"]: o["result"] for o in verdict["outcomes"]}


def test_a_running_pod_is_judged_without_the_scheduler_s_node_name(tmp_path):
    stored = admitted_pod(tmp_path, "a")
    audit = shipped(tmp_path, review(stored, namespace="ml"), "audit")
    assert results(audit)["gpu-guardrails"] == "pass"
    # The same pod sent by a user with spec.nodeName set is refused at admission.
    created = shipped(tmp_path, review(stored, namespace="ml"), "validate")
    assert not created["allowed"]
    assert "sets spec.nodeName gpu-node-0" in created["message"]


def test_a_running_pod_s_own_charge_is_not_counted_twice(tmp_path):
    pods = [admitted_pod(tmp_path, f"p{i}") for i in range(4)]  # 4 of the quota's 4 GPUs
    audit = shipped(tmp_path, review(pods[0], namespace="ml"), "audit", cluster_state=pods)
    assert results(audit)["gpu-quota"] == "pass", audit["outcomes"]
    # A fifth pod is over the quota: the running ones count, the new one on top.
    fifth = copy.deepcopy(pods[0])
    fifth["metadata"].update(name="p4", uid="uid-p4")
    over = shipped(tmp_path, review(fifth, namespace="ml"), "audit", cluster_state=pods)
    quota = next(o for o in over["outcomes"] if o["policy"] == "gpu-quota")
    assert quota["result"] == "fail"
    assert "namespace ml" in quota["message"]


def test_outcomes_say_pass_fail_warn_and_error_per_policy(engine):
    engine.policy("10-pass.lua", 'return { name = "quiet", description = "Says nothing.", '
                  'severity = "low", validate = function(req, obj) end }')
    engine.policy("20-fail.lua", 'return { name = "denier", mode = "audit", validate = '
                  'function(req, obj) req:deny("one"); req:deny("two") end }')
    engine.policy("30-warn.lua", 'return { name = "warner", validate = function(req, obj) '
                  'req:warn("careful") end }')
    engine.policy("40-error.lua", 'return { name = "broken", validate = function(req, obj) '
                  'error("boom") end }')
    engine.policy("50-bg.lua", 'return { name = "background", validate = function(req, obj) '
                  'if req.background and req.dry_run then req:warn("audited") end end }')
    got = engine.run(review(pod()), phases="audit")["outcomes"]
    assert got == [
        {"policy": "quiet", "result": "pass", "message": "Says nothing.", "severity": "low"},
        {"policy": "denier", "result": "fail", "message": "one\ntwo", "severity": "medium"},
        {"policy": "warner", "result": "warn", "message": "careful", "severity": "medium"},
        {"policy": "broken", "result": "error", "severity": "medium",
         "message": "policy error: policies/40-error.lua:1: boom"},
        {"policy": "background", "result": "warn", "message": "audited", "severity": "medium"},
    ]
    # Outside the audit: no outcomes, and req.background is false.
    plain = engine.run(review(pod()), phases="validate")
    assert plain["outcomes"] is None
    assert "background: audited" not in plain["warnings"]


@pytest.mark.parametrize("severity", ['"urgent"', "3", '""'])
def test_a_severity_reports_do_not_know_is_refused_at_load(engine, severity):
    engine.policy("10-x.lua", f'return {{ name = "x", severity = {severity}, '
                  'validate = function(req, obj) end }')
    err = engine.run(review(pod()), phases="audit", expect_rc=1)
    assert "policy x: severity must be critical, high, medium, low or info" in err
