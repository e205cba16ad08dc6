"""`gpuguard test` through the real binary: passing and failing suites (with
the diff), broken suite files (file and line), idempotence checks, every
kind of expectation, directories, defaults from the flags, and the project's
own suites under tests/policies when there are any."""

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from cli_policy import GPUS_LUA, gpu_pod as pod

REPO = Path(__file__).resolve().parent.parent.parent

POLICY = GPUS_LUA + r'''
return {
  name = "gpu-limit",
  mutate = function(req, pod)
    if pod == nil then return end  -- DELETE
    local n = gpus(pod)
    if n == 0 then return end
    local meta = pod.metadata
    if meta.annotations == nil then meta.annotations = gg.object() end
    meta.annotations["gpuguard.io/decision"] = "exclusive: " .. n .. " GPU"
  end,
  validate = function(req, pod)
    req:audit("op", req.operation .. " " .. req.namespace .. " " .. req.user.username)
    if pod == nil then return end
    local n = gpus(pod)
    if n > 4 then req:deny(("the pod asks for %d GPUs; at most 4 per pod"):format(n)) end
    if n > 0 and (pod.metadata.labels == nil or pod.metadata.labels.team == nil) then
      req:warn("no team label")
    end
    req:audit("gpus", tostring(n))
  end,
}
'''

# Appends a toleration every time: not idempotent.
BLIND_APPEND = r'''
local gg = require "gpuguard"
return {
  name = "blind",
  mutate = function(req, pod)
    if pod.spec.tolerations == nil then pod.spec.tolerations = gg.array() end
    local t = pod.spec.tolerations
    t[#t + 1] = gg.object({ key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" })
  end,
}
'''


class Suites:
    def __init__(self, binary, tmp_path):
        self.binary = binary
        self.tmp = tmp_path
        (tmp_path / "policies").mkdir()
        (tmp_path / "lua").mkdir()
        (tmp_path / "policies" / "10-gpu.lua").write_text(POLICY)

    def write(self, name, content):
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str)
                        else yaml.safe_dump(content, sort_keys=False))
        return path

    def run(self, *args, cwd=None):
        config = [] if {"--config", "--no-config"} & {str(a) for a in args} else ["--no-config"]
        out = subprocess.run([self.binary, "test", *config, *[str(a) for a in args]],
                             capture_output=True, text=True, timeout=60, cwd=cwd or self.tmp)
        return out


@pytest.fixture
def suites(binary, tmp_path):
    return Suites(binary, tmp_path)


PASSING = {
    "name": "gpu limits",
    "policies": "policies",
    "lua": "lua",
    "namespace": "ml",
    "cases": [
        {"name": "one GPU is fine",
         "object": pod("small", labels={"team": "a"}),
         "expect": {"allowed": True, "warnings": [],
                    "patch": [{"op": "add", "path": "/metadata/annotations",
                               "value": {"gpuguard.io/decision": "exclusive: 1 GPU"}}],
                    "fields": {"/metadata/annotations/gpuguard.io~1decision": "exclusive: 1 GPU",
                               "/metadata/namespace": "ml", "/spec/nodeName": None},
                    "decision": "exclusive: 1 GPU",
                    "audit": {"gpu-limit.gpus": "1", "gpu-limit.op": "CREATE ml gpuguard-check"}}},
        {"name": "eight GPUs are denied",
         "object": pod("big", gpus=8),
         "namespace": "other",
         "user": "alice",
         "expect": {"allowed": False,
                    "message": "gpu-limit: the pod asks for 8 GPUs; at most 4 per pod",
                    "message_matches": "at most [0-9]+ per pod$",
                    "warnings_match": ["^gpu-limit: no team"],
                    "audit": {"gpu-limit.op": "CREATE other alice"}}},
        {"name": "a deployment and a pod from a file",
         "manifest": "manifests/two.yaml",
         "expect_each": [{"allowed": True, "decision": "exclusive: 2 GPU"},
                         {"allowed": True, "decision": None, "patch": []}]},
        {"name": "a config map has no pod",
         "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
         "expect": {"skipped": True}},
        {"name": "update sees the operation",
         "object": pod("u", gpus=0),
         "operation": "UPDATE",
         "expect": {"allowed": True, "audit": {"gpu-limit.op": "UPDATE ml gpuguard-check"}}},
    ],
}

TWO = [
    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
     "spec": {"template": {"metadata": {"labels": {"team": "x"}},
                           "spec": pod(gpus=2)["spec"]}}},
    pod("cpu", gpus=0),
]


def test_help(suites):
    out = suites.run("--help")
    assert out.returncode == 0
    for flag in ["--config FILE", "--policies DIR", "--lua DIR", "--log-level LEVEL",
                 "-h, --help", "[./policies]", "[./lua]", "[none: refused unless --no-config]",
                 "--no-config"]:
        assert flag in out.stdout


def test_passing_suite(suites):
    suites.write("manifests/two.yaml", yaml.safe_dump_all(TWO))
    path = suites.write("gpu.suite.yaml", PASSING)
    out = suites.run(path)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[:5] == ["PASS gpu limits: one GPU is fine",
                         "PASS gpu limits: eight GPUs are denied",
                         "PASS gpu limits: a deployment and a pod from a file",
                         "PASS gpu limits: a config map has no pod",
                         "PASS gpu limits: update sees the operation"]
    assert lines[-1] == "5 passed, 0 failed"


def test_failing_suite_shows_a_diff(suites):
    suite = {
        "name": "wrong",
        "policies": "policies",
        "lua": "lua",
        "cases": [
            {"name": "expects the wrong things", "object": pod("big", gpus=8),
             "expect": {"allowed": True,
                        "message": "gpu-limit: the pod asks for 9 GPUs; at most 4 per pod",
                        "warnings": ["gpu-limit: no team label", "another"],
                        "patch": [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}],
                        "fields": {"/metadata/labels/a": "b", "/spec/containers/0/name": None},
                        "audit": {"gpu-limit.gpus": "9"}}},
            {"name": "passes", "object": pod("ok"), "expect": {"allowed": True}},
            {"name": "wrong count", "manifest": "two.yaml",
             "expect_each": [{"allowed": True}]},
        ],
    }
    suites.write("two.yaml", yaml.safe_dump_all(TWO))
    path = suites.write("wrong.suite.yaml", suite)
    out = suites.run(path)
    assert out.returncode == 1
    text = out.stdout
    assert "FAIL wrong: expects the wrong things" in text
    assert "PASS wrong: passes" in text
    assert "FAIL wrong: wrong count" in text
    assert "expect_each has 1 entries but the manifest has 2" in text
    assert ("allowed: expected true, got false: gpu-limit: the pod asks for 8 GPUs; "
            "at most 4 per pod") in text
    assert "message: (- expected, + actual)" in text
    assert "- gpu-limit: the pod asks for 9 GPUs; at most 4 per pod" in text
    assert "+ gpu-limit: the pod asks for 8 GPUs; at most 4 per pod" in text
    assert re.search(r'^\s+  "gpu-limit: no team label"$', text, re.M)
    assert re.search(r'^\s+- "another"$', text, re.M)
    assert re.search(r'^\s+- \{"op":"add","path":"/metadata/labels","value":\{"a":"b"\}\}$',
                     text, re.M)
    assert re.search(r'^\s+\+ \{"op":"add","path":"/metadata/annotations",', text, re.M)
    assert 'fields /metadata/labels/a: expected "b", got (absent)' in text
    assert 'fields /spec/containers/0/name: expected (absent), got "c"' in text
    assert 'audit gpu-limit.gpus: expected "9", got "8"' in text
    assert out.stdout.splitlines()[-1] == "1 passed, 2 failed"


def test_idempotence_failure_is_detected(suites):
    (suites.tmp / "blind").mkdir()
    (suites.tmp / "blind" / "10-blind.lua").write_text(BLIND_APPEND)
    suite = {"name": "blind", "policies": "blind", "lua": "lua", "cases": [
        {"name": "appends twice", "object": pod(), "expect": {"allowed": True}},
        {"name": "not checked", "object": pod(),
         "expect": {"allowed": True, "idempotent": False}},
    ]}
    out = suites.run(suites.write("blind.suite.yaml", suite))
    assert out.returncode == 1
    assert "FAIL blind: appends twice" in out.stdout
    assert "idempotent: mutating the mutated pod again gives a patch (+), want none" in out.stdout
    assert re.search(r'^\s+\+ \{"op":"add","path":"/spec/tolerations/-",', out.stdout, re.M)
    assert "PASS blind: not checked" in out.stdout
    assert out.stdout.splitlines()[-1] == "1 passed, 1 failed"


@pytest.mark.parametrize("content,where,message", [
    ("name: x\ncases:\n  - name: a\n    object: {kind: Pod}\n    expect:\n      allowd: true\n",
     ":6:", "cases[0].expect.allowd: unknown key"),
    ("name: x\ncases:\n  - name: a\n    object: {kind: Pod}\n    expect:\n      allowed: maybe\n",
     ":6:", "cases[0].expect.allowed: must be a boolean"),
    ("name: x\ncases:\n  - name: a\n    expect: {allowed: true}\n",
     ":3:", "cases[0]: a case needs exactly one of manifest"),
    ("name: x\ncases:\n  - name: a\n    object: {kind: Pod}\n",
     ":3:", "a case needs exactly one of expect and expect_each"),
    ("name: x\ncases:\n- name: a\n  object: {kind: Pod}\n  expect: {message_matches: \"(\"}\n",
     ":5:", "not a POSIX extended regular expression"),
    ("name: x\ncases:\n- name: a\n  object: {kind: Pod}\n  operation: PATCH\n"
     "  expect: {allowed: true}\n", ":5:", "must be CREATE, UPDATE, DELETE or CONNECT"),
    ("name: x\ncases:\n- name: a\n  object: {kind: Pod}\n  sub_resource: [status]\n"
     "  expect: {allowed: true}\n", ":5:", "cases[0].sub_resource: must be a string"),
    ("name: x\ncases: []\n", ":2:", "a suite needs a list of cases"),
    ("name: x\ncases:\n  - name: [unclosed\n", ":4:", ""),
    ("name: x\ncases:\n- name: a\n  manifest: missing.yaml\n  expect: {allowed: true}\n",
     ":4:", "missing.yaml: cannot open"),
    ("name: x\ncluster_state: state.json\ncases:\n- name: a\n  object: {kind: Pod}\n"
     "  expect: {allowed: true}\n", ":2:", "want List or PodList"),
    ("name: x\npolicies: nowhere\ncases:\n- name: a\n  object: {kind: Pod}\n"
     "  expect: {allowed: true}\n", "", "cannot load the policies"),
    ("name: x\nusage: state.json\ncases:\n- name: a\n  object: {kind: Pod}\n"
     "  expect: {allowed: true}\n", ":2:", "state.json: not a usage file"),
    ("name: x\nusage: [usage.json]\ncases:\n- name: a\n  object: {kind: Pod}\n"
     "  expect: {allowed: true}\n", ":2:", "usage: must be a string"),
])
def test_broken_suite_exits_2_with_file_and_line(suites, content, where, message):
    suites.write("state.json", '{"kind": "Deployment"}')
    path = suites.write("broken.suite.yaml", content)
    out = suites.run("--policies", "policies", "--lua", "lua", path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"broken.suite.yaml{where}" in out.stderr
    assert message in out.stderr


def test_directories_and_defaults_from_flags(suites):
    simple = {"cases": [{"name": "ok", "object": pod(), "expect": {"allowed": True}}]}
    suites.write("suites/a.suite.yaml", simple)
    suites.write("suites/deeper/b.suite.yaml", dict(simple, name="bee"))
    suites.write("suites/deeper/c.yaml", simple)  # not a suite file name
    out = suites.run("--policies", "policies", "--lua", "lua", "suites")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == ["PASS a: ok", "PASS bee: ok", "2 passed, 0 failed"]
    # Without flags: ./policies and ./lua of the working directory.
    out = suites.run("suites", cwd=suites.tmp)
    assert out.returncode == 0
    empty = suites.tmp / "empty"
    empty.mkdir()
    out = suites.run(empty)
    assert out.returncode == 2 and "no *.suite.yaml files" in out.stderr


def test_delete_and_groups(suites):
    suite = {"policies": "policies", "lua": "lua", "cases": [
        {"name": "delete", "object": pod(), "operation": "DELETE", "groups": ["admins"],
         "expect": {"allowed": True, "patch": []}}]}
    out = suites.run(suites.write("del.suite.yaml", suite))
    assert out.returncode == 0, out.stdout + out.stderr


# Reports what of the request it was given, as audit annotations.
REQUEST_ECHO = r'''
return {
  name = "echo",
  validate = function(req, pod)
    local old = req.old_object
    local sub = req.sub_resource ~= "" and req.sub_resource or "-"  -- "" without one
    req:audit("request", table.concat({ req.operation, sub, req.user.username,
      table.concat(req.user.groups, ","), old and old.metadata.labels.rev or "-",
      pod.metadata.labels.rev }, " "))
  end,
}
'''


def test_update_with_old_object_user_groups_and_sub_resource(suites):
    (suites.tmp / "echo").mkdir()
    (suites.tmp / "echo" / "10-echo.lua").write_text(REQUEST_ECHO)
    new, old = pod("u", labels={"rev": "2"}), pod("u", labels={"rev": "1"})
    suite = {"policies": "echo", "lua": "lua", "cases": [
        {"name": "ephemeral containers", "object": new, "old_object": old, "operation": "UPDATE",
         "sub_resource": "ephemeralcontainers", "user": "bob", "groups": ["dev", "ops"],
         "expect": {"allowed": True, "audit": {
             "echo.request": "UPDATE ephemeralcontainers bob dev,ops 1 2"}}},
        {"name": "no sub-resource, the pod itself as the old object", "object": new,
         "operation": "UPDATE", "user": "bob",
         "expect": {"allowed": True, "audit": {
             "echo.request": "UPDATE - bob system:authenticated 2 2"}}}]}
    out = suites.run(suites.write("echo.suite.yaml", suite))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == "2 passed, 0 failed"


def test_project_policy_suites(binary):
    root = REPO / "tests" / "policies"
    if not root.is_dir() or not list(root.rglob("*.suite.yaml")):
        pytest.skip("no *.suite.yaml under tests/policies yet")
    args = [binary, "test", "--policies", "policies", "--lua", "lua"]
    if (REPO / "deploy" / "gpuguard.yaml").exists():
        args += ["--config", "deploy/gpuguard.yaml"]
    out = subprocess.run(args + ["tests/policies"], capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_suite_without_a_configuration_is_refused_unless_told(suites):
    """A suite with no config: key run without --config is refused (its denials could pass for
    the wrong reason: no pools, quotas or guardrails), unless --no-config says it is meant."""
    path = suites.write("bare.suite.yaml", {"name": "bare", "cases": [
        {"name": "a pod", "object": pod("p", gpus=0), "expect": {"allowed": True}}]})
    out = subprocess.run([suites.binary, "test", "--policies", "policies", "--lua", "lua",
                          str(path)], capture_output=True, text=True, timeout=60, cwd=suites.tmp)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.endswith(
        "bare.suite.yaml:1: no configuration: give the suite a config: key or --config FILE "
        "(without one quotas, pools and guardrails are off), or --no-config\n"), out.stderr
    out = suites.run("--policies", "policies", "--lua", "lua", "--no-config", path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_case_passes_on_a_policy_error_only_when_it_expects_one(suites):
    """A crashing policy denies, so a case expecting a denial (or a message pattern) would pass
    while the policy is broken: a policy error fails every case that does not say error: true."""
    suites.write("policies/20-crash.lua", 'return { name = "crash", validate = function(req, pod) '
                 'if pod.metadata.name == "boom" then error("broken") end end }')
    boom = pod("boom", gpus=0)
    path = suites.write("crash.suite.yaml", {"name": "crash", "cases": [
        {"name": "expects a denial", "object": boom,
         "expect": {"allowed": False, "message_matches": "^crash: "}},
        {"name": "expects the error", "object": boom, "expect": {"allowed": False, "error": True}},
        {"name": "expects an error that is not there", "object": pod("fine", gpus=0),
         "expect": {"error": True}}]})
    out = suites.run("--policies", "policies", "--lua", "lua", path)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "FAIL crash: expects a denial"
    assert lines[1] == ("    error: expected none, got a policy error: crash: policy error: "
                        "policies/20-crash.lua:1: broken")
    assert "PASS crash: expects the error" in lines
    assert "FAIL crash: expects an error that is not there" in lines
    assert "    error: expected a policy error, got none" in lines
    assert lines[-1] == "1 passed, 2 failed"


def test_a_workload_goes_through_its_own_policies_as_in_check(suites):
    """test runs a case as check and the server do: the workload object through the policies
    that match its kind, then each template's pod; a Job policy's denial is the case's."""
    suites.write("policies/20-jobs.lua", 'return { name = "jobs", match = { kinds = { "Job" } }, '
                 'validate = function(req, job) req:deny("no Jobs here") end }')
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
           "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
               {"name": "c", "image": "x"}]}}}}
    path = suites.write("jobs.suite.yaml", {"name": "jobs", "cases": [
        {"name": "the Job's own denial", "object": job,
         "expect": {"allowed": False, "message": "jobs: no Jobs here"}},
        {"name": "not allowed", "object": job, "expect": {"allowed": True}}]})
    out = suites.run("--policies", "policies", "--lua", "lua", path)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "PASS jobs: the Job's own denial"
    assert lines[1] == "FAIL jobs: not allowed"
    assert lines[-1] == "1 passed, 1 failed"
