"""`gpuguard check` through the real binary: exit codes, the three output
formats (JSON lines parsed with json, JUnit parsed with ElementTree),
--show-patch, --emit-mutated (read back with python3-yaml), stdin,
directories, every pod-bearing kind, bad input (malformed YAML, binary,
huge, deep, alias bombs) and the whole ../shared/corpus."""

import json
import os
import pty
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from cli_policy import GPUS_LUA, check_shipped, gpu_pod, training_pod
from conftest import procs

REPO = Path(__file__).resolve().parent.parent.parent
CORPUS = REPO.parent / "shared" / "corpus"
DATA = REPO / "tests" / "data"
SUMMARY = re.compile(r"^(\d+) checked, (\d+) denied, (\d+) warned, (\d+) skipped(, \d+ errors?)?$")

# A small policy set that only needs the engine's built-in `gpuguard` module:
# mutate adds a decision annotation and a GPU toleration (idempotently),
# validate denies more than 4 GPUs and warns about a missing team label.
GPU_POLICY = GPUS_LUA + r'''
return {
  name = "gpu-limit",
  mutate = function(req, pod)
    local n = gpus(pod)
    if n == 0 then return end
    local meta = pod.metadata
    if meta.annotations == nil then meta.annotations = gg.object() end
    meta.annotations["gpuguard.io/decision"] = "exclusive: " .. n .. " GPU"
    if pod.spec.tolerations == nil then pod.spec.tolerations = gg.array() end
    for _, t in ipairs(pod.spec.tolerations) do
      if t.key == "nvidia.com/gpu" then return end
    end
    local t = pod.spec.tolerations
    t[#t + 1] = gg.object({ key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" })
  end,
  validate = function(req, pod)
    local n = gpus(pod)
    if n > 4 then req:deny(("the pod asks for %d GPUs; at most 4 per pod"):format(n)) end
    if n > 0 and (pod.metadata.labels == nil or pod.metadata.labels.team == nil) then
      req:warn("no team label; add metadata.labels.team")
    end
    req:audit("gpus", tostring(n))
  end,
}
'''

# Reports what the request looked like, as warnings.
ECHO_POLICY = r'''
return {
  name = "echo",
  validate = function(req, pod)
    req:warn("ns=" .. req.namespace .. " obj-ns=" .. tostring(pod.metadata.namespace) ..
             " user=" .. req.user.username .. " op=" .. req.operation .. " name=" .. req.name ..
             " kind=" .. req.kind)
  end,
}
'''

MUTATE_DENY_POLICY = r'''
return {
  name = "early",
  mutate = function(req, pod)
    if pod.metadata.labels and pod.metadata.labels.deny == "mutate" then req:deny("no, in mutate") end
  end,
  validate = function(req, pod) req:warn("validate ran") end,
}
'''


def deployment(name="d", gpus=1, namespace=None):
    meta = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name, "team": "a"}},
                                  "spec": gpu_pod(gpus=gpus)["spec"]}}}


CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
             "data": {"on": "yes", "count": "1"}}


class Check:
    """gpuguard check with a policy directory under tmp_path."""

    def __init__(self, binary, tmp_path):
        self.binary = binary
        self.tmp = tmp_path
        self.policies = tmp_path / "policies"
        self.policies.mkdir()
        self.lua = tmp_path / "lua"
        self.lua.mkdir()

    def policy(self, filename, text):
        (self.policies / filename).write_text(text)
        return self

    def write(self, name, docs):
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(docs, (str, bytes)):
            (path.write_bytes if isinstance(docs, bytes) else path.write_text)(docs)
        else:
            path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        return Path(name)  # relative: the command runs in tmp_path

    def run(self, *args, input=None, policies=True, timeout=60):
        cmd = [self.binary, "check"]
        if policies:
            cmd += ["--policies", str(self.policies), "--lua", str(self.lua)]
        if "--config" not in args and "--no-config" not in args:
            cmd.append("--no-config")  # the small policy set reads no configuration
        cmd += [str(a) for a in args]
        return subprocess.run(cmd, capture_output=True, input=input, timeout=timeout,
                              cwd=self.tmp)

    def json(self, *args, expect_rc=None, **kw):
        out = self.run("-o", "json", *args, **kw)
        if expect_rc is not None:
            assert out.returncode == expect_rc, out.stderr.decode()
        records = [json.loads(line) for line in out.stdout.decode().splitlines()]
        assert records and records[-1]["type"] == "summary"
        return records, out


@pytest.fixture
def check(binary, tmp_path):
    return Check(binary, tmp_path)


def text(out):
    return out.stdout.decode(), out.stderr.decode()


# ---- help and usage ------------------------------------------------------------

def test_help_lists_every_flag_with_defaults(check):
    out = check.run("--help", policies=False)
    assert out.returncode == 0
    help_text = out.stdout.decode()
    for flag in ["--config FILE", "--policies DIR", "--lua DIR", "--namespace NS", "--user NAME",
                 "--cluster-state FILE", "-o, --output FORMAT", "--show-patch", "--emit-mutated",
                 "--log-level LEVEL", "-h, --help"]:
        assert flag in help_text
    for default in ["[./policies]", "[./lua]", "[default]", "[text]", "[none]"]:
        assert default in help_text
    assert "pods in use and quotas, for quota checks" in help_text
    top = subprocess.run([check.binary, "--help"], capture_output=True, text=True)
    assert re.search(r"^  check ", top.stdout, re.M) and re.search(r"^  test ", top.stdout, re.M)


@pytest.mark.parametrize("args,message", [
    ([], "no PATH given"),
    (["-o", "xml", "x.yaml"], "-o must be text, json or junit"),
    (["--bogus", "x.yaml"], "unknown flag"),
    (["--namespace"], "missing value"),
])
def test_usage_errors_exit_2(check, args, message):
    out = check.run(*args)
    assert out.returncode == 2
    assert message in out.stderr.decode()


def test_broken_policy_set_exits_2(check):
    check.policy("10-broken.lua", "return {")
    path = check.write("pod.yaml", [gpu_pod()])
    out = check.run(path)
    assert out.returncode == 2
    assert "cannot load the policies" in out.stderr.decode()


# ---- exit codes and text output -----------------------------------------------

def test_all_allowed_exits_0(check):
    check.policy("10-gpu.lua", GPU_POLICY)
    path = check.write("ok.yaml", [gpu_pod(labels={"team": "a"}), deployment(), CONFIGMAP])
    out = check.run(path)
    stdout, _ = text(out)
    assert out.returncode == 0, out.stderr
    lines = stdout.splitlines()
    assert lines[-1] == "2 checked, 0 denied, 0 warned, 1 skipped"
    assert lines[0].startswith("allowed ") and "ok.yaml:1" in lines[0] and "Pod default/p" in lines[0]
    assert any("Deployment default/d  spec.template" in line for line in lines)
    assert any(line.startswith("skipped ") and "ConfigMap cfg" in line for line in lines)
    assert "decision: exclusive: 1 GPU" in stdout
    assert "\033[" not in stdout  # no colour when stdout is not a terminal


def test_denial_exits_1_with_message_and_warnings(check):
    check.policy("10-gpu.lua", GPU_POLICY)
    path = check.write("big.yaml", [gpu_pod("small"), gpu_pod("big", gpus=8)])
    out = check.run(path)
    stdout, _ = text(out)
    assert out.returncode == 1
    assert "gpu-limit: the pod asks for 8 GPUs; at most 4 per pod" in stdout
    assert re.search(r"^denied\s+big\.yaml:\d+\s+Pod default/big", stdout, re.M)
    assert "warning: gpu-limit: no team label; add metadata.labels.team" in stdout
    assert stdout.splitlines()[-1] == "2 checked, 1 denied, 2 warned, 0 skipped"
    assert SUMMARY.match(stdout.splitlines()[-1])


def test_input_error_wins_over_denial(check):
    check.policy("10-gpu.lua", GPU_POLICY)
    big = check.write("big.yaml", [gpu_pod("big", gpus=8)])
    out = check.run(big, check.tmp / "missing.yaml")
    assert out.returncode == 2
    assert "missing.yaml: cannot open" in out.stderr.decode()
    assert out.stdout.decode().splitlines()[-1] == "1 checked, 1 denied, 1 warned, 0 skipped, 1 error"


# An operator's template names a placeholder namespace the API server would refuse: there is
# no verdict to give for it (evaluated there, it would be judged as in a namespace that cannot
# exist), so it is skipped with the reason; the valid pod beside it is checked as usual.
@pytest.mark.parametrize("namespace", ["FILLED BY THE OPERATOR", "Team-A", "-a", "a" * 64])
def test_a_namespace_the_api_server_refuses_is_skipped_with_the_reason(check, namespace):
    check.policy("10-gpu.lua", GPU_POLICY)
    pod = gpu_pod("big", gpus=8)
    pod["metadata"]["namespace"] = namespace
    path = check.write("placeholder.yaml", [gpu_pod("ok"), pod])
    records, out = check.json(path)
    assert out.returncode == 0, out.stderr.decode()
    assert [(r["type"], r["name"]) for r in records[:-1]] == [("template", "ok"), ("skipped", "big")]
    assert records[1]["namespace"] == namespace
    assert records[1]["reason"] == (
        "metadata.namespace is not a namespace name (a-z, 0-9 and '-', at most 63 characters), "
        "so the API server refuses it; set the namespace it runs in")
    assert records[-1]["checked"] == 1 and records[-1]["skipped"] == 1


def test_colour_only_on_a_terminal(check):
    check.policy("10-gpu.lua", GPU_POLICY)
    path = check.write("big.yaml", [gpu_pod("big", gpus=8)])
    controller, worker = pty.openpty()
    env = dict(os.environ, TERM="xterm")
    env.pop("NO_COLOR", None)
    proc = procs.spawn([check.binary, "check", "--policies", str(check.policies), "--lua",
                        str(check.lua), "--no-config", str(path)], stdout=worker, stderr=subprocess.PIPE,
                       env=env, cwd=check.tmp)
    os.close(worker)
    chunks = []
    while True:
        try:
            data = os.read(controller, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=procs.PATIENCE)
    os.close(controller)
    output = b"".join(chunks).decode()
    assert proc.returncode == 1
    assert "\033[1;31mdenied" in output


def test_namespace_and_user(check):
    check.policy("10-echo.lua", ECHO_POLICY)
    path = check.write("ns.yaml", [gpu_pod("a"), gpu_pod("b", namespace="ml"),
                                   deployment("d", namespace="team")])
    records, _ = check.json(path, expect_rc=0)
    warnings = [r["warnings"][0] for r in records if r["type"] == "template"]
    assert warnings[0] == "echo: ns=default obj-ns=default user=gpuguard-check op=CREATE name=a kind=Pod"
    assert warnings[1] == "echo: ns=ml obj-ns=ml user=gpuguard-check op=CREATE name=b kind=Pod"
    # Pods of controllers are created with generateName: request.name is empty.
    assert warnings[2] == "echo: ns=team obj-ns=team user=gpuguard-check op=CREATE name= kind=Pod"
    records, _ = check.json("--namespace", "flagged", "--user", "alice", path, expect_rc=0)
    warnings = [r["warnings"][0] for r in records if r["type"] == "template"]
    assert warnings[0].startswith("echo: ns=flagged obj-ns=flagged user=alice")
    assert warnings[1].startswith("echo: ns=ml obj-ns=ml user=alice")  # the manifest wins
    assert [r["namespace"] for r in records if r["type"] == "template"] == ["flagged", "ml", "team"]


def test_mutate_then_validate_on_the_mutated_pod(check):
    check.policy("10-label.lua", r'''
local gg = require "gpuguard"
return { name = "label", mutate = function(req, pod)
  if pod.metadata.labels == nil then pod.metadata.labels = gg.object() end
  pod.metadata.labels.team = "default-team"
end }
''')
    check.policy("20-need-team.lua", r'''
return { name = "need-team", validate = function(req, pod)
  if pod.metadata.labels == nil or pod.metadata.labels.team == nil then req:deny("no team") end
  req:warn("team=" .. pod.metadata.labels.team)
end }
''')
    check.policy("30-early.lua", MUTATE_DENY_POLICY)
    path = check.write("p.yaml", [gpu_pod("a"), gpu_pod("b", labels={"deny": "mutate"})])
    records, out = check.json(path, expect_rc=1)
    a, b = [r for r in records if r["type"] == "template"]
    assert a["allowed"] is True and a["denied_in"] is None
    assert a["warnings"] == ["need-team: team=default-team", "early: validate ran"]
    assert b["allowed"] is False and b["denied_in"] == "mutate"
    assert b["message"] == "early: no, in mutate"
    assert b["patch"] == []
    assert "early: validate ran" not in b["warnings"]  # the validating webhook is never called


# ---- JSON output -----------------------------------------------------------------

TEMPLATE_FIELDS = {"type", "file", "document", "line", "apiVersion", "kind", "name", "namespace",
                   "path", "pointer", "owner", "owners", "allowed", "message", "denied_in",
                   "warnings", "audit", "policies", "decision", "queue", "patch", "policy_error",
                   "pods", "admitted_pods", "charge", "charge_per_pod"}
SKIPPED_FIELDS = {"type", "file", "document", "line", "apiVersion", "kind", "name", "namespace",
                  "pointer", "reason"}
SUMMARY_FIELDS = {"type", "checked", "allowed", "denied", "warned", "skipped", "errors",
                  "exit_code", "config", "policy_errors", "usage"}


def test_json_output_fields(check):
    check.policy("10-gpu.lua", GPU_POLICY)
    path = check.write("mix.yaml", [gpu_pod("big", gpus=8), deployment(), CONFIGMAP])
    records, out = check.json(path, expect_rc=1)
    assert out.stderr.decode() == ""
    pod, dep, cm, summary = records
    assert set(pod) == TEMPLATE_FIELDS and set(dep) == TEMPLATE_FIELDS
    assert set(cm) == SKIPPED_FIELDS and set(summary) == SUMMARY_FIELDS
    assert pod == {
        "type": "template", "file": "mix.yaml", "document": 1, "line": 1, "apiVersion": "v1",
        "kind": "Pod", "name": "big", "namespace": "default", "path": "", "pointer": "",
        "owner": None, "owners": [], "allowed": False,
        "message": "gpu-limit: the pod asks for 8 GPUs; at most 4 per pod",
        "denied_in": "validate",
        "warnings": ["gpu-limit: no team label; add metadata.labels.team"],
        "audit": pod["audit"], "policies": ["gpu-limit"],
        "decision": "exclusive: 8 GPU", "queue": None, "policy_error": False,
        "pods": 1, "admitted_pods": 0, "charge": None, "charge_per_pod": None,
        "patch": [{"op": "add", "path": "/metadata/annotations",
                   "value": {"gpuguard.io/decision": "exclusive: 8 GPU"}},
                  {"op": "add", "path": "/spec/tolerations",
                   "value": [{"key": "nvidia.com/gpu", "operator": "Exists",
                              "effect": "NoSchedule"}]}]}
    assert pod["audit"]["gpu-limit.gpus"] == "8"  # the engine may add its own keys
    assert dep["document"] == 2 and dep["path"] == "spec.template"
    assert dep["pointer"] == "/spec/template" and dep["owner"]["kind"] == "ReplicaSet"
    assert dep["owner"]["name"].startswith("d-") and dep["allowed"] is True
    assert dep["owners"] == [{"kind": "Deployment", "name": "d"}, dep["owner"]]
    assert dep["warnings"] == [] and dep["message"] is None
    assert cm == {"type": "skipped", "file": "mix.yaml", "document": 3, "line": cm["line"],
                  "apiVersion": "v1", "kind": "ConfigMap", "name": "cfg", "namespace": None,
                  "pointer": "", "reason": "no pod template"}
    assert summary == {"type": "summary", "checked": 2, "allowed": 1, "denied": 1, "warned": 1,
                       "skipped": 1, "errors": 0, "exit_code": 1, "config": None,
                       "policy_errors": 0, "usage": "empty"}


def test_json_error_records(check):
    bad = check.write("bad.yaml", "a: [1, 2\nb: 3\n")
    records, out = check.json(bad, expect_rc=2)
    assert records[0]["type"] == "error" and records[0]["file"] == "bad.yaml"
    assert records[0]["message"].startswith("bad.yaml:2:")
    assert records[-1]["errors"] == 1 and records[-1]["exit_code"] == 2
    assert "bad.yaml:2:" in out.stderr.decode()


# ---- every kind ------------------------------------------------------------------

def tpl(spec_gpus=1):
    return {"spec": gpu_pod(gpus=spec_gpus)["spec"]}


KINDS = [
    ({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, **tpl()}, [("", None)]),
    ({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": tpl()},
     [("template", None)]),
    ({"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "rc"},
      "spec": {"template": tpl()}}, [("spec.template", "ReplicationController")]),
    ({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs"},
      "spec": {"template": tpl()}}, [("spec.template", "ReplicaSet")]),
    ({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s"},
      "spec": {"template": tpl()}}, [("spec.template", "StatefulSet")]),
    ({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "ds"},
      "spec": {"template": tpl()}}, [("spec.template", "DaemonSet")]),
    ({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
      "spec": {"template": tpl()}}, [("spec.template", "Job")]),
    ({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cj"},
      "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": tpl()}}}},
     [("spec.jobTemplate.spec.template", "Job")]),
    ({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pt"},
      "spec": {"pytorchReplicaSpecs": {"Worker": {"template": tpl()},
                                       "Master": {"template": tpl()}}}},
     [("spec.pytorchReplicaSpecs.Master.template", "PyTorchJob"),
      ("spec.pytorchReplicaSpecs.Worker.template", "PyTorchJob")]),
    ({"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "tf"},
      "spec": {"tfReplicaSpecs": {"Chief": {"template": tpl()}}}},
     [("spec.tfReplicaSpecs.Chief.template", "TFJob")]),
    ({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"},
      "spec": {"headGroupSpec": {"template": tpl()},
               "workerGroupSpecs": [{"groupName": "g", "template": tpl()}]}},
     [("spec.headGroupSpec.template", "RayCluster"),
      ("spec.workerGroupSpecs[0].template", "RayCluster")]),
    ({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rj"},
      "spec": {"rayClusterSpec": {"headGroupSpec": {"template": tpl()}}}},
     [("spec.rayClusterSpec.headGroupSpec.template", "RayCluster")]),
    ({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js"},
      "spec": {"replicatedJobs": [{"name": "w", "template": {"spec": {"template": tpl()}}}]}},
     [("spec.replicatedJobs[0].template.spec.template", "Job")]),
    ({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
      "metadata": {"name": "lws"},
      "spec": {"leaderWorkerTemplate": {"leaderTemplate": tpl(), "workerTemplate": tpl()}}},
     [("spec.leaderWorkerTemplate.leaderTemplate", "StatefulSet"),
      ("spec.leaderWorkerTemplate.workerTemplate", "StatefulSet")]),
    ({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "vj"},
      "spec": {"tasks": [{"name": "t", "template": tpl()}]}},
     [("spec.tasks[0].template", "Job")]),
    ({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}, **tpl()},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}]},
     [("items[0]", None)]),
]


@pytest.mark.parametrize("doc,want", KINDS, ids=[d["kind"] + str(i) for i, (d, _) in
                                                  enumerate(KINDS)])
def test_every_pod_bearing_kind(check, doc, want):
    check.policy("10-gpu.lua", GPU_POLICY)
    path = check.write("k.yaml", [doc])
    records, _ = check.json(path, expect_rc=0)
    templates = [r for r in records if r["type"] == "template"]
    assert [(t["path"], t["owner"]["kind"] if t["owner"] else None) for t in templates] == want
    assert all(t["decision"] == "exclusive: 1 GPU" for t in templates)


# ---- JUnit -------------------------------------------------------------------------

def test_junit_is_valid_xml_with_one_testcase_per_template(check):
    check.policy("10-gpu.lua", GPU_POLICY)
    a = check.write("a.yaml", [gpu_pod("ok", labels={"team": "t"}), gpu_pod("big", gpus=8),
                               CONFIGMAP])
    b = check.write("b.yaml", [deployment("d & <x>")])
    bad = check.write("c.yaml", "kind: [\n")
    out = check.run("-o", "junit", a, b, bad)
    assert out.returncode == 2
    root = ET.fromstring(out.stdout)
    assert root.tag == "testsuites"
    assert root.get("tests") == "4" and root.get("failures") == "1" and root.get("errors") == "1"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["a.yaml", "b.yaml", "c.yaml"]
    cases = root.iter("testcase")
    cases = list(cases)
    assert len(cases) == 4
    failures = [c for c in cases if c.find("failure") is not None]
    assert len(failures) == 1
    assert failures[0].get("name") == "Pod default/big (line %s)" % failures[0].get("name").split(
        "line ")[1].rstrip(")")
    assert failures[0].find("failure").get("message") == \
        "gpu-limit: the pod asks for 8 GPUs; at most 4 per pod"
    assert "warning: gpu-limit: no team label" in failures[0].find("system-out").text
    dep = [c for c in cases if "Deployment" in c.get("name")][0]
    assert dep.get("name").startswith("Deployment default/d & <x> spec.template")
    errors = [c for c in cases if c.find("error") is not None]
    assert len(errors) == 1 and "c.yaml:" in errors[0].find("error").get("message")
    assert "skipped: ConfigMap cfg" in suites[0].find("system-out").text
    assert SUMMARY.match(out.stderr.decode().splitlines()[-1])


def test_junit_escapes_control_characters(check):
    check.policy("10-ctl.lua", r'''
return { name = "ctl", validate = function(req) req:deny("bad \1 char & \"quote\" <tag>\nline 2") end }
''')
    path = check.write("p.yaml", [gpu_pod()])
    out = check.run("-o", "junit", path)
    assert out.returncode == 1
    root = ET.fromstring(out.stdout)
    failure = root.find("testsuite/testcase/failure")
    assert failure.get("message") == 'ctl: bad \ufffd char & "quote" <tag>'
    assert failure.text.endswith("line 2")


# ---- patches and --emit-mutated ---------------------------------------------------

def test_show_patch(check):
    check.policy("10-gpu.lua", GPU_POLICY)
    path = check.write("p.yaml", [gpu_pod()])
    stdout, _ = text(check.run(path))
    assert '"op": "add"' not in stdout and '"op":"add"' not in stdout
    stdout, _ = text(check.run("--show-patch", path))
    assert "patch:" in stdout
    patch_lines = [json.loads(line.strip()) for line in stdout.splitlines()
                   if line.strip().startswith("{")]
    assert {"op": "add", "path": "/metadata/annotations",
            "value": {"gpuguard.io/decision": "exclusive: 1 GPU"}} in patch_lines


def test_emit_mutated_patches_templates_and_keeps_the_rest(check):
    check.policy("10-gpu.lua", GPU_POLICY)
    docs = [CONFIGMAP, deployment("train"), gpu_pod("big", gpus=8),
            {"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cj"},
                 "spec": {"schedule": "@daily",
                          "jobTemplate": {"spec": {"template": tpl()}}}},
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
                 "spec": {"ports": [{"port": 80}]}}]},
            gpu_pod("nogpu", gpus=0)]
    path = check.write("all.yaml", docs)
    out = check.run("--emit-mutated", path)
    assert out.returncode == 1  # the 8-GPU pod is denied
    report = out.stderr.decode()
    assert report.splitlines()[-1] == "4 checked, 1 denied, 2 warned, 2 skipped"
    back = list(yaml.safe_load_all(out.stdout))
    assert len(back) == len(docs)
    assert back[0] == CONFIGMAP
    tol = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    want_dep = json.loads(json.dumps(docs[1]))
    want_dep["spec"]["template"]["metadata"]["annotations"] = {
        "gpuguard.io/decision": "exclusive: 1 GPU"}
    want_dep["spec"]["template"]["spec"]["tolerations"] = tol
    assert back[1] == want_dep
    assert back[2] == docs[2]  # denied: unchanged
    cron_tpl = back[3]["items"][0]["spec"]["jobTemplate"]["spec"]["template"]
    assert cron_tpl["metadata"] == {"annotations": {"gpuguard.io/decision": "exclusive: 1 GPU"}}
    assert cron_tpl["spec"]["tolerations"] == tol
    assert back[3]["items"][1] == docs[3]["items"][1]
    assert back[4] == docs[4]


def test_emit_mutated_from_json_and_stdin_writes_yaml(check):
    check.policy("10-gpu.lua", GPU_POLICY)
    pod = gpu_pod("j", labels={"team": "a"})
    out = check.run("--emit-mutated", "-o", "json", "-", input=json.dumps(pod).encode())
    assert out.returncode == 0, out.stderr
    back = list(yaml.safe_load_all(out.stdout))
    assert back[0]["metadata"]["annotations"] == {"gpuguard.io/decision": "exclusive: 1 GPU"}
    records = [json.loads(line) for line in out.stderr.decode().splitlines()]
    assert records[0]["file"] == "<stdin>" and records[-1]["type"] == "summary"


# ---- inputs -----------------------------------------------------------------------

def test_stdin(check):
    check.policy("10-gpu.lua", GPU_POLICY)
    stream = yaml.safe_dump_all([gpu_pod("a"), gpu_pod("b", gpus=9)]).encode()
    records, _ = check.json("-", input=stream, expect_rc=1)
    assert [r["name"] for r in records[:-1]] == ["a", "b"]
    assert all(r["file"] == "<stdin>" for r in records[:-1])
    out = check.run("-", "-", input=b"")
    assert out.returncode == 2 and "given twice" in out.stderr.decode()


def test_directories_are_searched_recursively(check):
    check.policy("10-gpu.lua", GPU_POLICY)
    check.write("m/b.yaml", [gpu_pod("b")])
    check.write("m/a.yml", [gpu_pod("a")])
    check.write("m/sub/c.json", json.dumps(gpu_pod("c")))
    check.write("m/sub/notes.txt", "not: a manifest")
    check.write("m/.hidden/d.yaml", [gpu_pod("d")])
    check.write("m/e.yaml.bak", [gpu_pod("e")])
    records, _ = check.json("m", expect_rc=0)
    assert [(r["file"], r["name"]) for r in records[:-1]] == [
        ("m/a.yml", "a"), ("m/b.yaml", "b"), ("m/sub/c.json", "c")]


def test_json_streams_and_concatenated_json(check):
    check.policy("10-gpu.lua", GPU_POLICY)
    path = check.write("c.json", json.dumps(gpu_pod("x")) + "\n" + json.dumps(gpu_pod("y")))
    records, _ = check.json(path, expect_rc=0)
    assert [r["name"] for r in records[:-1]] == ["x", "y"]


@pytest.mark.parametrize("name,content,message", [
    ("malformed.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: [x\n", "malformed.yaml:5:"),
    ("tabs.yaml", "a:\n\tb: 1\n", "tabs.yaml:2:"),
    ("dup.yaml", "kind: Pod\nkind: Pod\n", "dup.yaml:2:"),
    ("binary.yaml", bytes(range(256)) * 4, "binary.yaml:1:"),
    ("nul.yaml", b"kind: Pod\x00\n", "nul.yaml:1:"),
    ("utf16.yaml", "kind: Pod\n".encode("utf-16"), "utf16.yaml:1:"),
])
def test_bad_input_names_file_and_line(check, name, content, message):
    path = check.write(name, content)
    out = check.run(path)
    assert out.returncode == 2
    assert message in out.stderr.decode()
    assert out.stdout.decode().splitlines()[-1].endswith("1 error")


def test_huge_file_is_refused_before_reading(check):
    path = check.tmp / "huge.yaml"
    with open(path, "wb") as f:
        f.truncate(65 * 1024 * 1024)
    out = check.run(path, timeout=20)
    assert out.returncode == 2
    assert "huge.yaml: larger than 67108864 bytes" in out.stderr.decode()


def test_huge_stdin_is_refused(check):
    out = check.run("-", input=b"# " + b"x" * (65 * 1024 * 1024), timeout=60)
    assert out.returncode == 2
    assert "<stdin>: larger than 67108864 bytes" in out.stderr.decode()


def test_deep_nesting_is_refused(check):
    path = check.write("deep.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n")
    out = check.run(path, timeout=20)
    assert out.returncode == 2
    assert "deep.yaml:1:" in out.stderr.decode() and "nesting deeper than" in out.stderr.decode()
    path = check.write("deep.json", '{"a":' * 3000 + "1" + "}" * 3000)
    out = check.run(path, timeout=20)
    assert out.returncode == 2 and "deep.json:1:" in out.stderr.decode()


def test_billion_laughs_fails_fast(check):
    path = check.write("lol.yaml", (DATA / "yaml" / "billion-laughs.yaml").read_text())
    out = check.run(path, timeout=10)
    assert out.returncode == 2
    assert "lol.yaml:" in out.stderr.decode() and "alias" in out.stderr.decode()
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 12):
        bomb += f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 10) + "]\n"
    out = check.run(check.write("bomb.yaml", bomb), timeout=10)
    assert out.returncode == 2 and "alias" in out.stderr.decode()


def test_cluster_state_is_checked(check):
    check.policy("10-gpu.lua", GPU_POLICY)
    out = check.run("--cluster-state", check.write("empty.json", '{"kind": "List", "items": []}'),
                    check.write("p0.yaml", [gpu_pod(labels={"team": "a"})]))
    assert out.returncode == 2
    assert ('--cluster-state: cannot load the charge model: charge: [string "charge"]:1: '
            'require "intent": no such module') in out.stderr.decode()
    for module in (REPO / "lua").glob("*.lua"):  # usage is charged by the library's model
        (check.lua / module.name).write_text(module.read_text())
    pod = check.write("p.yaml", [gpu_pod(labels={"team": "a"})])
    good = check.write("state.json", json.dumps({
        "apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
        "items": [dict(gpu_pod("running", namespace="ml"), status={"phase": "Running"})]}))
    out = check.run("--cluster-state", good, pod)
    assert out.returncode == 0, out.stderr
    for content, message in [("not json", "not JSON"),
                             ('{"kind": "List", "items": [{"kind": "Service"}]}',
                              "items[0].metadata must be an object"),
                             ('{"kind": "Deployment"}', "want List or PodList")]:
        bad = check.write("bad-state.json", content)
        out = check.run("--cluster-state", bad, pod)
        assert out.returncode == 2
        assert "--cluster-state" in out.stderr.decode() and message in out.stderr.decode()
    out = check.run("--cluster-state", check.tmp / "none.json", pod)
    assert out.returncode == 2 and "none.json: cannot open" in out.stderr.decode()


# ---- the corpus ---------------------------------------------------------------------

def corpus_files():
    if not CORPUS.is_dir():
        return []
    return sorted(p for p in CORPUS.rglob("*") if p.is_file() and p.suffix != ".md")


@pytest.mark.parametrize("path", corpus_files() or [None],
                         ids=lambda p: p.name if p else "absent")
def test_corpus_file_with_no_policies(check, path):
    if path is None:
        pytest.skip("../shared/corpus is not present")
    records, out = check.json(path, timeout=60)
    assert out.returncode in (0, 1), out.stderr.decode()
    assert out.returncode == 0  # no policies: nothing can be denied
    reported = {r["document"] for r in records if r["type"] in ("template", "skipped")}
    docs = list(yaml.safe_load_all(path.read_text()))
    want = {i + 1 for i, d in enumerate(docs) if d is not None}
    assert reported == want
    for r in records[:-1]:
        assert r["type"] in ("template", "skipped")
        if r["type"] == "template":
            assert r["allowed"] is True and r["patch"] == []


def test_corpus_directory_in_one_run(check):
    if not CORPUS.is_dir():
        pytest.skip("../shared/corpus is not present")
    records, out = check.json(CORPUS, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    summary = records[-1]
    assert summary["checked"] > 0 and summary["errors"] == 0
    out = check.run("--emit-mutated", CORPUS, timeout=120)
    assert out.returncode == 0
    emitted = list(yaml.safe_load_all(out.stdout))
    originals = []
    for path in sorted(p for p in CORPUS.rglob("*") if p.suffix in (".yaml", ".yml", ".json")):
        originals += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert len(emitted) == len(originals)


def test_patch_on_controller_set_fields_is_not_written_to_the_template(check):
    check.policy("10-owner.lua", r'''
local gg = require "gpuguard"
return { name = "owner", mutate = function(req, pod)
  pod.metadata.labels = pod.metadata.labels or gg.object()
  pod.metadata.labels.seen = "yes"
  pod.metadata.generateName = "renamed-"
end }
''')
    path = check.write("d.yaml", [deployment("d")])
    out = check.run("--emit-mutated", "-o", "json", path)
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stderr.decode().splitlines()[0])
    assert record["unmapped_patch"] == [{"op": "replace", "path": "/metadata/generateName",
                                         "value": "renamed-"}]
    back = list(yaml.safe_load_all(out.stdout))[0]
    assert back["spec"]["template"]["metadata"]["labels"]["seen"] == "yes"
    assert "generateName" not in back["spec"]["template"]["metadata"]
    assert back["metadata"] == {"name": "d"}


# ---- workload classes with the shipped policies and example configuration ---------------

WORKLOADS = REPO / "tests" / "policies" / "workloads"
DECIDED = re.compile(r"^(?:\d+ whole GPUs?: )?(\S+) on pool (\S+) for class (\S+) \(([^)]*)\): ")


def shipped(binary, *args, config=REPO / "deploy" / "gpuguard.yaml"):
    """gpuguard check -o json with the shipped policies; the template records and the run."""
    out = subprocess.run([binary, "check", "--config", str(config), "--policies",
                          str(REPO / "policies"), "--lua", str(REPO / "lua"), "-o", "json",
                          *[str(a) for a in args]], capture_output=True, timeout=60)
    records = [json.loads(line) for line in out.stdout.decode().splitlines()]
    return [r for r in records if r["type"] == "template"], out


@pytest.mark.parametrize("manifest,index,pod,want", [
    ("lws-vllm.yaml", 1, "lws-vllm-worker.yaml",
     ("exclusive", "l4-infer", "inference", "LeaderWorkerSet")),
    ("rayservice-llm.yaml", 1, "rayservice-worker.yaml",
     ("exclusive", "l4-infer", "inference", "RayService")),
    ("kserve-isvc.yaml", 0, "kserve-predictor.yaml",
     ("exclusive", "l4-infer", "inference", "InferenceService")),
    ("pytorchjob-ddp.yaml", 1, "pytorchjob-worker.yaml",
     ("exclusive", "h100-train", "training", "PyTorchJob")),
    ("notebook.yaml", 0, "notebook-pod.yaml",
     ("time-slicing", "l4-shared", "interactive", "Kubeflow Notebook")),
    ("deployment-2gpu.yaml", 0, "deployment-pod.yaml",
     ("exclusive", "l4-infer", "batch", "default class")),
])
def test_check_and_the_cluster_pod_get_the_same_class(binary, manifest, index, pod, want):
    built, out = shipped(binary, WORKLOADS / "manifests" / manifest)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    cluster, out = shipped(binary, WORKLOADS / "cluster" / pod)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    assert DECIDED.match(built[index]["decision"]).groups() == want
    assert cluster[0]["decision"] == built[index]["decision"]


def test_owner_chain_is_the_clusters(binary):
    built, out = shipped(binary, WORKLOADS / "manifests" / "lws-vllm.yaml")
    assert [[(o["kind"], o["name"]) for o in r["owners"]] for r in built] == [
        [("LeaderWorkerSet", "vllm"), ("StatefulSet", "vllm")],
        [("LeaderWorkerSet", "vllm"), ("StatefulSet", "vllm"), ("Pod", "vllm-0"),
         ("StatefulSet", "vllm-0")]]
    assert [r["owner"] for r in built] == [{"kind": "StatefulSet", "name": "vllm"},
                                           {"kind": "StatefulSet", "name": "vllm-0"}]
    out = subprocess.run([binary, "check", "--config", str(REPO / "deploy" / "gpuguard.yaml"),
                          "--policies", str(REPO / "policies"), "--lua", str(REPO / "lua"),
                          str(WORKLOADS / "manifests" / "lws-vllm.yaml")], capture_output=True,
                         timeout=60)
    lines = [l.strip() for l in out.stdout.decode().splitlines() if "owners:" in l]
    assert lines == ["owners: LeaderWorkerSet/vllm > StatefulSet/vllm",
                     "owners: LeaderWorkerSet/vllm > StatefulSet/vllm > Pod/vllm-0 > "
                     "StatefulSet/vllm-0"]


@pytest.mark.parametrize("namespaces,message", [
    ("ml-train", "classes.training.namespaces: must be a list of namespaces "
                 "(a trailing * matches a prefix)"),
    ("[ml-train, '']", "classes.training.namespaces[2]: must be a namespace name or a prefix "
                       "ending in *"),
])
def test_class_namespaces_are_checked_at_load(binary, tmp_path, namespaces, message):
    config = tmp_path / "c.yaml"
    config.write_text("pools: [{name: p, model: H100-80GB, sharing: exclusive}]\n"
                      f"classes:\n  training: {{sharing: [exclusive], namespaces: {namespaces}}}\n")
    _, out = shipped(binary, WORKLOADS / "cluster" / "pytorchjob-worker.yaml", config=config)
    assert out.returncode == 2
    assert message in out.stderr.decode()


@pytest.mark.parametrize("pools,message", [
    ("[h100]", "classes.inference.pools[1]: h100 is not one of the pools"),
    ("[l4, a100]", "classes.inference.pools[2]: pool a100 runs mig, which the class does not list "
                   "in sharing (time-slicing, exclusive)"),
    ("l4", "classes.inference.pools: must list pool names, preferred first"),
])
def test_class_pools_are_checked_at_load(binary, tmp_path, pools, message):
    config = tmp_path / "c.yaml"
    config.write_text("pools: [{name: l4, model: L4, sharing: exclusive},\n"
                      "        {name: a100, model: A100-80GB, sharing: mig}]\n"
                      f"classes:\n  inference: {{sharing: [time-slicing, exclusive], pools: {pools}}}\n")
    _, out = shipped(binary, WORKLOADS / "cluster" / "pytorchjob-worker.yaml", config=config)
    assert out.returncode == 2
    assert message in out.stderr.decode()


# ---- the order of manifests with --cluster-state -----------------------------


def quota_verdicts(check, *paths):
    """[(pod name, allowed)] from the shipped policies, team-a's quota of 8 and no pods in use."""
    state = check.write("state.json", '{"apiVersion": "v1", "kind": "List", "items": []}')
    out = check_shipped(check.binary, "--cluster-state", state, "-o", "json", *paths,
                        cwd=check.tmp)
    assert out.returncode in (0, 1), out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    return [(r["name"], r["allowed"]) for r in records if r["type"] == "template"]


def test_cluster_state_charges_each_admitted_pod_to_the_manifests_after_it(check):
    # Pods of 5 GPUs in team-a (quota 8): whichever comes first is admitted and counts against
    # the quota for the other, as the cluster would admit them in that order.
    alpha, beta, gamma = (training_pod(n, "team-a", g)
                          for n, g in [("alpha", 5), ("beta", 5), ("gamma", 2)])
    first, second = check.write("a.yaml", [alpha]), check.write("b.yaml", [beta])
    assert quota_verdicts(check, first, second) == [("alpha", True), ("beta", False)]
    assert quota_verdicts(check, second, first) == [("beta", True), ("alpha", False)]
    # The same inputs always give the same results.
    assert quota_verdicts(check, second, first) == [("beta", True), ("alpha", False)]
    # Documents of a file in file order.
    both = check.write("both.yaml", [beta, alpha])
    assert quota_verdicts(check, both) == [("beta", True), ("alpha", False)]
    # A directory depth first, the entries of each in byte order of their names
    # ("B" < "a" < "b"), whatever order they were created in.
    check.write("tree/b/1.yaml", [beta])
    check.write("tree/a.yaml", [alpha])
    check.write("tree/B.yaml", [gamma])
    assert quota_verdicts(check, "tree") == [("gamma", True), ("alpha", True), ("beta", False)]
    assert quota_verdicts(check, "tree/b", "tree/a.yaml") == [("beta", True), ("alpha", False)]


# A typo in the configuration is no silent off switch: every section and key is known or
# refused, naming the nearest known key (deploy/gpuguard.yaml with one line changed).
CONFIG_TYPOS = [
    ("quotas:", "quota:", "quota: unknown key; did you mean quotas?"),
    ("    sharing: time-slicing", "    Sharing: time-slicing",
     "pools[3].Sharing: unknown key; did you mean sharing?"),
    ("  max_per_pod: 8", "  max_per_pods: 8",
     "quotas.max_per_pods: unknown key; did you mean max_per_pod?"),
    ("  required_labels:", "  required_label:",
     "guardrails.required_label: unknown key; did you mean required_labels?"),
    ("  non_gpu_pods: deny", "  non-gpu-pods: deny",
     "placement.non-gpu-pods: unknown key; did you mean non_gpu_pods?"),
    ("  fractions: round-up", "  fraction: round-up",
     "exclusive.fraction: unknown key; did you mean fractions?"),
    ("  headroom: 1.25", "  head_room: 1.25",
     "rightsizing.head_room: unknown key; did you mean headroom?"),
    ("    url: https://prometheus", "    URL: https://prometheus",
     "rightsizing.prometheus.URL: unknown key; did you mean url?"),
    ("  mode: mutate", "  mod: mutate", "workloads.mod: unknown key; did you mean mode? (known: mode)"),
    ("  interactive: {sharing: [time-slicing], pools: [l4-shared], max_runtime: 8h}",
     "  interactive: {sharing: [time-slicing], pools: [l4-shared], maxRuntime: 8h}",
     "classes.interactive.maxRuntime: unknown key; did you mean max_runtime?"),
]


@pytest.mark.parametrize("line,typo,message", CONFIG_TYPOS, ids=[t[1].strip() for t in CONFIG_TYPOS])
def test_a_configuration_typo_is_an_error_naming_the_nearest_key(binary, tmp_path, line, typo,
                                                                message):
    text = (REPO / "deploy" / "gpuguard.yaml").read_text()
    assert text.count("\n" + line) == 1, line
    config = tmp_path / "gpuguard.yaml"
    config.write_text(text.replace("\n" + line, "\n" + typo))
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump(gpu_pod(gpus=8)))
    out = subprocess.run([binary, "check", "--config", str(config), "--policies",
                          str(REPO / "policies"), "--lua", str(REPO / "lua"), str(pod)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr, out.stderr


def test_check_refuses_to_run_without_a_configuration_unless_told(binary, tmp_path):
    """Without the cluster's configuration almost everything passes (pools, quotas, guardrails
    off): `check` says so and exits 2 unless --no-config says it is meant; the JSON summary
    names the configuration used."""
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump(gpu_pod(gpus=8)))
    base = [binary, "check", "--policies", str(REPO / "policies"), "--lua", str(REPO / "lua")]

    def run(*args):
        return subprocess.run(base + [*args, str(pod)], capture_output=True, text=True, timeout=60)
    out = run()
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == ("gpuguard check: no configuration: give --config FILE (the one the "
                          "cluster runs; without one quotas, pools and guardrails are off), or "
                          "--no-config to run the policies without one\n"
                          "run 'gpuguard check --help' for the flags\n")
    out = run("--no-config", "--config", str(REPO / "deploy" / "gpuguard.yaml"))
    assert out.returncode == 2 and "--config and --no-config: give one" in out.stderr
    out = run("--no-config", "-o", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1])["config"] is None
    config = str(REPO / "deploy" / "gpuguard.yaml")
    out = run("--config", config, "-o", "json")
    assert json.loads(out.stdout.splitlines()[-1])["config"] == config
    # Without a cluster state the usage is empty, said once in the summary, not as a
    # "not checked" warning on every GPU pod.
    out = run("--config", config)
    assert "not checked" not in out.stdout
    assert out.stdout.count("GPU usage taken as empty (no --cluster-state): quotas are checked "
                            "against each pod alone\n") == 1


CRASH_POLICY = """
return { name = "crash", validate = function(req, pod)
  if pod.metadata.name == "boom" then local x = nil; return x.y end
  if pod.metadata.name == "no" then req:deny("no pods named no") end
end }
"""


def test_a_policy_error_is_an_error_not_a_denial(binary, tmp_path):
    """A policy that raises denies (fail closed) but check says it is an error: exit 3 (after 2
    for input errors, before 1 for denials), "error" in text, policy_error in JSON and its
    count in the summary, a JUnit <error> instead of a <failure>."""
    (tmp_path / "p").mkdir()
    (tmp_path / "l").mkdir()
    (tmp_path / "p" / "10-crash.lua").write_text(CRASH_POLICY)
    for name in ("boom", "no", "ok"):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(gpu_pod(name=name, gpus=0)))

    def run(*args):
        return subprocess.run([binary, "check", "--no-config", "--policies", "p", "--lua", "l",
                               *args], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    out = run("boom.yaml", "no.yaml", "ok.yaml")
    assert out.returncode == 3, out.stdout + out.stderr
    assert out.stdout.splitlines()[0].startswith("error    boom.yaml:1  Pod default/boom")
    assert out.stdout.splitlines()[-1] == "3 checked, 2 denied, 0 warned, 0 skipped, 1 policy error"
    assert run("no.yaml", "ok.yaml").returncode == 1
    (tmp_path / "broken.yaml").write_text("a: [")
    assert run("boom.yaml", "broken.yaml").returncode == 2
    records = [json.loads(line) for line in run("-o", "json", "boom.yaml", "no.yaml").stdout.splitlines()]
    assert [r["policy_error"] for r in records[:2]] == [True, False]
    assert records[2]["policy_errors"] == 1 and records[2]["exit_code"] == 3
    suite = ET.fromstring(run("-o", "junit", "boom.yaml", "no.yaml").stdout)
    assert (suite.get("failures"), suite.get("errors")) == ("1", "1")
    boom = suite.find("./testsuite[@name='boom.yaml']/testcase")
    assert boom.find("failure") is None
    assert boom.find("error").get("message").startswith(
        "crash: policy error: p/10-crash.lua:3: attempt to index a nil value")


# ---- a workload's pods against the quota ---------------------------------------

def inference_deployment(name, namespace, replicas, gpus=1):
    pod = gpu_pod(gpus=gpus, labels={"app": name, "team": "a",
                                     "gpuguard.io/workload-class": "inference"})
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": pod["metadata"], "spec": pod["spec"]}}}


def state_with(check, *pods):
    """A cluster state of running pods."""
    items = []
    for i, pod in enumerate(pods):
        pod = json.loads(json.dumps(pod))
        pod["metadata"]["uid"] = f"uid-{i}"
        pod["spec"]["nodeName"] = "n1"
        pod["status"] = {"phase": "Running"}
        items.append(pod)
    return check.write("state.json", json.dumps({"apiVersion": "v1", "kind": "List",
                                                 "items": items}))


def test_check_counts_a_workloads_pods_against_the_quota_as_the_cluster_admits_them(check):
    # Quota 4 (the shipped default), 3 in use: of 6 replicas of 1 GPU, 1 is admitted and the
    # API server denies the other 5 one by one; the workload itself is admitted.
    state = state_with(check, training_pod("old", "team-x", 3))
    deployment = check.write("d.yaml", [inference_deployment("infer", "team-x", 6),
                                        training_pod("after", "team-x", 1)])
    out = check_shipped(check.binary, "--cluster-state", state, "-o", "json", deployment,
                        cwd=check.tmp)
    assert out.returncode == 1, out.stderr
    rec, after, summary = [json.loads(line) for line in out.stdout.splitlines()]
    assert (rec["allowed"], rec["pods"], rec["admitted_pods"]) == (True, 6, 1)
    assert (rec["charge"], rec["charge_per_pod"]) == ("6.000", "1.000")
    assert rec["warnings"] == [
        "1 of its 6 pods would be admitted: the API server admits the Deployment and denies the "
        "other 5, the first of them with: gpu-quota: namespace team-x would use 5 of 4 GPUs "
        "(in use 4, this pod 1); ask for fewer GPUs or free GPUs"]
    # The admitted replica counts for the documents after the workload.
    assert after["allowed"] is False
    assert "in use 4, this pod 1" in after["message"]
    assert (summary["warned"], summary["denied"]) == (1, 1)
    # The text and JUnit reports say the total charge too.
    out = check_shipped(check.binary, "--cluster-state", state, deployment, cwd=check.tmp)
    assert "         charge: 6.000 GPU-equivalents (6 pods x 1.000)\n" in out.stdout
    assert "         warning: 1 of its 6 pods would be admitted" in out.stdout
    out = check_shipped(check.binary, "--cluster-state", state, "-o", "junit", deployment,
                        cwd=check.tmp)
    system_out = ET.fromstring(out.stdout).find(".//testcase/system-out").text
    assert "charge: 6.000 GPU-equivalents (6 pods x 1.000)\n" in system_out


def test_check_admits_every_pod_that_fits_and_charges_them_all(check):
    # team-a's quota is 8: 4 replicas of 2 GPUs fit exactly, so a pod after them does not.
    state = state_with(check)
    docs = check.write("d.yaml", [inference_deployment("infer", "team-a", 4, gpus=2),
                                  training_pod("after", "team-a", 1)])
    out = check_shipped(check.binary, "--cluster-state", state, "-o", "json", docs,
                        cwd=check.tmp)
    rec, after, _ = [json.loads(line) for line in out.stdout.splitlines()]
    assert (rec["allowed"], rec["pods"], rec["admitted_pods"], rec["charge"]) == (True, 4, 4,
                                                                                   "8.000")
    assert rec["warnings"] == []
    assert after["allowed"] is False
    assert "in use 8, this pod 1" in after["message"]


def test_every_replica_of_a_namespace_without_a_gpu_limit_is_admitted(check, tmp_path):
    # No quota for the namespace: all 100000 replicas are admitted and charged.
    config = tmp_path / "c.yaml"
    config.write_text((REPO / "deploy" / "gpuguard.yaml").read_text()
                      .replace("  default: 4\n", ""))
    docs = check.write("d.yaml", [inference_deployment("infer", "team-x", 100000)])
    out = check_shipped(check.binary, "--cluster-state", state_with(check), "-o", "json", docs,
                        config=config, cwd=check.tmp)
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout.splitlines()[0])
    assert (rec["pods"], rec["admitted_pods"], rec["charge"]) == (100000, 100000, "100000.000")


# ---- namespaces the webhooks never see -----------------------------------------

def webhook_namespace_selectors():
    docs = yaml.safe_load_all((REPO / "deploy" / "install.yaml").read_text())
    return [w["namespaceSelector"]["matchExpressions"] for d in docs
            if d and d["kind"].endswith("WebhookConfiguration") for w in d["webhooks"]]


def privileged_pod(name, namespace):
    pod = gpu_pod(name, gpus=0, namespace=namespace)
    pod["spec"]["containers"][0]["resources"] = {}
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    return pod


def test_check_skips_the_namespaces_the_webhooks_leave_out_by_name(check):
    names = set()
    for expressions in webhook_namespace_selectors():
        by_name = [x for x in expressions if x["key"] == "kubernetes.io/metadata.name"]
        assert [x["operator"] for x in by_name] == ["NotIn"]
        names.update(by_name[0]["values"])
    assert names == {"kube-system", "gpuguard-system"}
    pods = [privileged_pod(f"agent-{ns}", ns) for ns in sorted(names)]
    path = check.write("agents.yaml", pods + [privileged_pod("agent", "monitoring")])
    out = check_shipped(check.binary, "-o", "json", path, cwd=check.tmp)
    assert out.returncode == 1, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["type"], r.get("reason")) for r in records[:2]] == [
        ("skipped", "namespace gpuguard-system: the webhooks' namespaceSelector leaves it out"),
        ("skipped", "namespace kube-system: the webhooks' namespaceSelector leaves it out")]
    assert (records[2]["type"], records[2]["allowed"]) == ("template", False)
    assert (records[3]["skipped"], records[3]["denied"]) == (2, 1)


def test_check_skips_a_namespace_its_input_labels_ignored(check):
    for expressions in webhook_namespace_selectors():
        assert {"key": "gpuguard.io/ignore", "operator": "NotIn", "values": ["true"]} in expressions
    ignored = {"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "node-agents", "labels": {"gpuguard.io/ignore": "true"}}}
    kept = {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "monitoring", "labels": {"gpuguard.io/ignore": "false"}}}
    path = check.write("agents.yaml", [ignored, kept, privileged_pod("a", "node-agents"),
                                       privileged_pod("b", "monitoring")])
    out = check_shipped(check.binary, path, cwd=check.tmp)
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    assert re.fullmatch(r"skipped  agents\.yaml:\d+  Pod a  \(namespace node-agents is labelled "
                        r"gpuguard\.io/ignore=true: the webhooks leave it out\)", lines[2])
    assert re.fullmatch(r"denied   agents\.yaml:\d+  Pod monitoring/b", lines[3])
