"""Queue routing through the running server over TLS, with the shipped policies and
configuration plus a `queues:` section: Kueue and KAI labels on the objects each reads,
default, class and namespace queues, allowed queues, owned pods left alone, existing labels
kept, no nodeSelector on `placement: kueue` pools, Kueue's own UPDATEs allowed, Kueue's gate
and labels kept; and `gpuguard check` reporting the queue."""

import base64
import copy
import json
import subprocess
import xml.etree.ElementTree as ET

import jsonpatch
import pytest
import yaml

from conftest import REPO, start_server
from test_workloads import (MEMORY_DENIAL, TOO_BIG, deployment, job, jobset, pytorchjob,
                            template, workload_review)

KUEUE = "kueue.x-k8s.io/queue-name"
KAI = "kai.scheduler/queue"
PRIORITY = "kueue.x-k8s.io/priority-class"
KUEUE_SA = "system:serviceaccount:kueue-system:kueue-controller-manager"

QUEUES = """
queues:
  system: {system}
  default: gpu-default
  classes:
    training: gpu-training
  namespaces:
    team-a:
      queue: team-a-queue
      classes: {{training: team-a-train}}
      allowed: [team-a-queue, team-a-train, gpu-default]
{namespaces}
  {extra}
"""
# Kueue only: priority classes a namespace may name.
TEAM_C = "    team-c:\n      allowed_priority_classes: [low]"


def config_text(system, extra="", namespaces=""):
    base = (REPO / "deploy" / "gpuguard.yaml").read_text()
    # The training pool is placed by Kueue's ResourceFlavors.
    base = base.replace("  - name: h100-train\n", "  - name: h100-train\n    placement: kueue\n")
    assert "placement: kueue" in base
    return base + QUEUES.format(system=system, extra=extra, namespaces=namespaces)


def serve(binary, certs, tmp, text):
    config = tmp / "gpuguard.yaml"
    config.write_text(text)
    srv = start_server(binary, certs, tmp, "--policies", str(REPO / "policies"),
                       "--lua", str(REPO / "lua"), "--config", str(config))
    srv.config = config
    return srv


@pytest.fixture(scope="module")
def kueue(binary, certs, tmp_path_factory):
    srv = serve(binary, certs, tmp_path_factory.mktemp("kueue"), config_text(
        "kueue", "priority_classes: {inference: high}\n  controller_accounts: [%s]" % KUEUE_SA,
        TEAM_C))
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def kai(binary, certs, tmp_path_factory):
    srv = serve(binary, certs, tmp_path_factory.mktemp("kai"), config_text("kai"))
    yield srv
    assert srv.stop() == 0


def call(srv, obj, namespace="team-a", path="/mutate", user=None, **kw):
    review = workload_review(obj, **kw)
    review["request"]["namespace"] = namespace
    if obj["kind"] == "Pod":
        review["request"]["kind"] = {"group": "", "version": "v1", "kind": "Pod"}
        review["request"]["resource"] = {"group": "", "version": "v1", "resource": "pods"}
    if user:
        review["request"]["userInfo"] = {"username": user}
    status, _, got = srv.connect().review(review, path=path)
    assert status == 200
    resp = got["response"]
    patch = json.loads(base64.b64decode(resp["patch"])) if "patch" in resp else []
    return resp, patch, jsonpatch.apply_patch(obj, patch)


def training():
    """A PyTorchJob whose every role asks for whole GPUs: class training (pool h100-train)."""
    obj = pytorchjob()
    obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"] = template(gpus=1)
    return obj


def in_ns(obj, namespace):
    obj = copy.deepcopy(obj)
    obj["metadata"]["namespace"] = namespace
    return obj


def labels(obj):
    return obj["metadata"].get("labels", {})


def pod(owner=None, lbls=None, gpus=1):
    p = {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "p", "namespace": "team-b",
                      "labels": dict({"team": "b"}, **(lbls or {}))},
         "spec": template(gpus=gpus)["spec"]}
    if owner:
        p["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": owner,
                                            "name": "j", "uid": "u-1", "controller": True}]
    return p


# ---- Kueue ---------------------------------------------------------------------------

def test_kueue_default_queue_on_the_job_not_its_pods(kueue):
    resp, patch, after = call(kueue, in_ns(job(), "team-b"), namespace="team-b")
    assert resp["allowed"] is True
    # An inference Job: the default queue, and the class's priority.
    assert {"op": "add", "path": "/metadata/labels",
            "value": {KUEUE: "gpu-default", PRIORITY: "high"}} in patch
    assert KUEUE not in after["spec"]["template"]["metadata"]["labels"]


def test_kueue_class_queue(kueue):
    _, _, after = call(kueue, in_ns(training(), "team-b"), namespace="team-b")
    assert labels(after) == {KUEUE: "gpu-training"}


def test_kueue_namespace_queue_and_namespace_class_queue(kueue):
    _, _, after = call(kueue, job())  # inference: the namespace's queue
    assert labels(after)[KUEUE] == "team-a-queue"
    _, _, after = call(kueue, training())  # training: the namespace's class queue
    assert labels(after)[KUEUE] == "team-a-train"


def test_kueue_priority_class_by_class(kueue):
    _, _, after = call(kueue, in_ns(jobset(), "team-b"), namespace="team-b")
    assert labels(after) == {KUEUE: "gpu-default", PRIORITY: "high"}  # inference templates


def test_existing_queue_is_kept(kueue):
    obj = job()
    obj["metadata"]["labels"] = {KUEUE: "gpu-default"}
    resp, patch, after = call(kueue, obj)
    assert resp["allowed"] is True
    assert labels(after) == {KUEUE: "gpu-default"}
    assert not [op for op in patch if op["path"].startswith("/metadata")]


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_a_queue_the_namespace_may_not_use_is_denied(kueue, path):
    obj = job()
    obj["metadata"]["labels"] = {KUEUE: "team-b-queue"}
    resp, _, _ = call(kueue, obj, path=path)
    assert resp["allowed"] is False
    assert resp["status"]["message"] == (
        'gpu-queues: queue "team-b-queue" may not be used in namespace team-a; use one of: '
        f"team-a-queue, team-a-train, gpu-default; set the label {KUEUE} to one of them or "
        "remove it")


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_a_priority_class_the_namespace_may_not_use_is_denied(kueue, path):
    obj = in_ns(job(), "team-c")
    obj["metadata"]["labels"] = {KUEUE: "gpu-default", PRIORITY: "high"}
    resp, _, _ = call(kueue, obj, namespace="team-c", path=path)
    assert resp["allowed"] is False
    assert resp["status"]["message"] == (
        'gpu-queues: priority class "high" may not be used in namespace team-c; use one of: low; '
        f"set the label {PRIORITY} to one of them or remove it")
    obj["metadata"]["labels"][PRIORITY] = "low"
    resp, _, _ = call(kueue, obj, namespace="team-c", path=path)
    assert resp["allowed"] is True


def test_a_pod_owned_by_what_kueue_does_not_manage_is_checked_as_its_own(kueue):
    """An ownerReference is whatever its writer put: a ConfigMap of the tenant's own makes the
    pod no part of a Kueue workload, so its queue is its own and checked."""
    p = in_ns(pod(lbls={KUEUE: "team-b-queue"}), "team-a")
    p["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "mine",
                                         "uid": "u-2", "controller": True}]
    resp, _, _ = call(kueue, p, path="/validate")
    assert resp["allowed"] is False
    assert resp["status"]["message"].startswith('gpu-queues: queue "team-b-queue" may not be used')
    resp, _, _ = call(kueue, in_ns(pod(owner="Job", lbls={KUEUE: "team-b-queue"}), "team-a"),
                      path="/validate")
    assert resp["allowed"] is True  # a Job's pod: the Job's queue is the one checked


def test_plain_pod_gets_the_queue_and_owned_pod_is_left_alone(kueue):
    _, _, after = call(kueue, pod(), namespace="team-b")
    assert labels(after)[KUEUE] == "gpu-default"
    resp, patch, after = call(kueue, pod(owner="Job"), namespace="team-b")
    assert resp["allowed"] is True and patch  # the sharing policies still ran
    assert KUEUE not in labels(after)


def test_workloads_without_gpus_are_left_alone(kueue):
    obj = job()
    obj["spec"]["template"] = {"metadata": {"labels": {"team": "a"}},
                               "spec": {"restartPolicy": "Never",
                                        "containers": [{"name": "c", "image": "busybox"}]}}
    _, patch, after = call(kueue, obj)
    assert KUEUE not in labels(after) and patch == []


def test_deployment_and_owned_jobs(kueue):
    _, _, after = call(kueue, deployment())
    assert labels(after)[KUEUE] == "team-a-queue"
    owned = job()
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "jobset.x-k8s.io/v1alpha2",
                                             "kind": "JobSet", "name": "js", "uid": "u",
                                             "controller": True}]
    _, _, after = call(kueue, owned)
    assert KUEUE not in labels(after)


def test_no_node_selector_on_a_kueue_placed_pool(kueue):
    _, _, after = call(kueue, training())
    for role in ("Master", "Worker"):
        tpl = after["spec"]["pytorchReplicaSpecs"][role]["template"]
        assert tpl["metadata"]["annotations"]["gpuguard.io/pool"] == "h100-train"
        assert "nodeSelector" not in tpl["spec"] and "affinity" not in tpl["spec"]
        assert {"key": "nvidia.com/gpu", "operator": "Equal", "value": "h100-train",
                "effect": "NoSchedule"} in tpl["spec"]["tolerations"]


def test_a_label_only_move_to_another_queue_or_priority_is_judged(kueue):
    """A suspended Job relabelled to a queue or priority class its namespace may not use is
    denied though its template is unchanged (the validating webhook is sent such UPDATEs);
    a move to an allowed queue, and an edit of other labels, are allowed."""
    _, _, admitted = call(kueue, in_ns(job(), "team-c"), namespace="team-c")
    admitted["spec"]["suspend"] = True
    for key, value, message in (
            (KUEUE, "team-b-queue", None),
            (PRIORITY, "high", 'gpu-queues: priority class "high" may not be used in namespace '
             f"team-c; use one of: low; set the label {PRIORITY} to one of them or remove it")):
        moved = copy.deepcopy(admitted)
        moved["metadata"].setdefault("labels", {})[key] = value
        resp, _, _ = call(kueue, moved, namespace="team-c", path="/validate", operation="UPDATE",
                          old=admitted, user="alice")
        if message:
            assert resp["allowed"] is False and resp["status"]["message"] == message
        else:  # team-c names no allowed queues: any queue is fine
            assert resp["allowed"] is True
    moved = copy.deepcopy(admitted)
    moved["metadata"].setdefault("labels", {})[PRIORITY] = "low"
    resp, _, _ = call(kueue, moved, namespace="team-c", path="/validate", operation="UPDATE",
                      old=admitted, user="alice")
    assert resp["allowed"] is True
    _, _, admitted = call(kueue, job())
    moved = copy.deepcopy(admitted)
    moved["metadata"]["labels"][KUEUE] = "team-b-queue"
    resp, _, _ = call(kueue, moved, path="/validate", operation="UPDATE", old=admitted,
                      user="alice")
    assert resp["allowed"] is False and 'queue "team-b-queue" may not be used' in \
        resp["status"]["message"]


def test_kueues_updates_of_suspended_workloads_are_allowed(kueue):
    _, _, admitted = call(kueue, job())
    admitted["spec"]["suspend"] = True
    flavored = copy.deepcopy(admitted)
    # Kueue injects the flavor's node labels; the template here also asks for more GPU memory
    # than any pool of its class holds (TOO_BIG), which the pod policies would refuse.
    tpl = flavored["spec"]["template"]
    tpl["metadata"]["annotations"]["gpuguard.io/gpu-memory"] = TOO_BIG["memory"]
    tpl["metadata"]["labels"]["gpuguard.io/workload-class"] = TOO_BIG["cls"]
    tpl["spec"]["nodeSelector"] = {"cloud.example/flavor": "h100"}
    flavored["spec"]["suspend"] = False
    for path in ("/mutate", "/validate"):
        resp, patch, _ = call(kueue, flavored, path=path, operation="UPDATE", old=admitted,
                              user=KUEUE_SA)
        assert resp == {"uid": resp["uid"], "allowed": True} and patch == []
    resp, _, _ = call(kueue, flavored, operation="UPDATE", old=admitted, user="alice")
    assert resp["allowed"] is False
    assert resp["status"]["message"] == "spec.template: " + MEMORY_DENIAL


def test_kueues_gate_and_labels_are_kept_on_reinvocation(kueue):
    """IfNeeded: gpuguard runs again after Kueue's pod webhook gated and labelled the pod."""
    gated = pod(lbls={KUEUE: "gpu-default", "kueue.x-k8s.io/managed": "true"})
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    resp, patch, after = call(kueue, gated, namespace="team-b")
    assert resp["allowed"] is True
    assert after["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
    assert labels(after)[KUEUE] == "gpu-default"
    assert labels(after)["kueue.x-k8s.io/managed"] == "true"
    assert not [op for op in patch if "schedulingGates" in op["path"] or "kueue" in op["path"]]


# ---- KAI -----------------------------------------------------------------------------

def test_kai_labels_the_object_and_its_pods(kai):
    _, _, after = call(kai, deployment())
    assert labels(after)[KAI] == "team-a-queue"
    # The template too, so the pods the controller creates carry it and get no second patch.
    assert after["spec"]["template"]["metadata"]["labels"][KAI] == "team-a-queue"
    assert PRIORITY not in labels(after) and KUEUE not in labels(after)
    _, _, after = call(kai, pod(owner="Job"), namespace="team-b")
    assert labels(after)[KAI] == "gpu-default"


def test_kai_class_queue(kai):
    _, _, after = call(kai, in_ns(training(), "team-b"), namespace="team-b")
    assert labels(after)[KAI] == "gpu-training"


# ---- configuration and check -----------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    ("system: slurm", "queues.system: must be kueue or kai"),
    ("system: kai\n  priority_classes: {training: high}",
     "queues.priority_classes: Kueue's WorkloadPriorityClass; only with system: kueue"),
    ("system: kueue\n  default: Not_A_Name", "queues.default: must be a queue name"),
    ("system: kueue\n  colour: blue", "queues.colour: unknown key"),
    ("system: kueue\n  namespaces: {a: {allowed: [ok, BAD]}}",
     "queues.namespaces.a.allowed[2]: must be a queue name"),
    ("system: kai\n  namespaces: {a: {allowed_priority_classes: [low]}}",
     "queues.namespaces.a.allowed_priority_classes: Kueue's WorkloadPriorityClass; only with system: kueue"),
])
def test_bad_queue_configuration_is_refused(binary, tmp_path, extra, message):
    config = tmp_path / "c.yaml"
    config.write_text((REPO / "deploy" / "gpuguard.yaml").read_text() + "\nqueues:\n  " + extra
                      + "\n")
    (tmp_path / "j.yaml").write_text(yaml.safe_dump(job()))
    out = subprocess.run([binary, "check", "--policies", str(REPO / "policies"), "--lua",
                          str(REPO / "lua"), "--config", str(config), str(tmp_path / "j.yaml")],
                         capture_output=True, text=True)
    assert out.returncode == 2 or out.returncode == 1, out
    assert message in out.stderr, out.stderr


def run_check(binary, config, docs, tmp_path, *args):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return subprocess.run([binary, "check", "--policies", str(REPO / "policies"), "--lua",
                           str(REPO / "lua"), "--config", str(config), *args, str(path)],
                          capture_output=True, text=True)


def test_check_reports_the_queue(kueue, binary, tmp_path):
    docs = [job(), training(), in_ns(pod(), "team-b"), in_ns(pod(owner="Job"), "team-b")]
    out = run_check(binary, kueue.config, docs, tmp_path, "-o", "json")
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    queues = [(r["kind"], r["path"], r["queue"]) for r in records if r["type"] == "template"]
    assert queues == [("Job", "spec.template", "team-a-queue"),
                      ("PyTorchJob", "spec.pytorchReplicaSpecs.Master.template", "team-a-train"),
                      ("PyTorchJob", "spec.pytorchReplicaSpecs.Worker.template", "team-a-train"),
                      ("Pod", "", "gpu-default"), ("Pod", "", None)]
    text = run_check(binary, kueue.config, docs[:1], tmp_path)
    assert "         queue: team-a-queue\n" in text.stdout
    junit = run_check(binary, kueue.config, docs[:1], tmp_path, "-o", "junit")
    out_text = ET.fromstring(junit.stdout).find(".//testcase/system-out").text
    assert "queue: team-a-queue\n" in out_text
    emitted = run_check(binary, kueue.config, docs[:1], tmp_path, "--emit-mutated")
    assert labels(next(yaml.safe_load_all(emitted.stdout)))[KUEUE] == "team-a-queue"


def test_check_reports_a_refused_queue(kueue, binary, tmp_path):
    obj = job()
    obj["metadata"]["labels"] = {KUEUE: "elsewhere"}
    out = run_check(binary, kueue.config, [obj], tmp_path, "-o", "json")
    assert out.returncode == 1
    [rec] = [json.loads(l) for l in out.stdout.splitlines() if '"template"' in l]
    assert rec["allowed"] is False and rec["denied_in"] == "object"
    assert rec["message"].startswith('gpu-queues: queue "elsewhere" may not be used')
