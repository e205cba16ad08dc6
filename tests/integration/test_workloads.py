"""Workloads through the running server over TLS: Deployments, Jobs and
operators' custom resources are admitted by running the pod policies on each
template as the pod its controller would create; the patch, applied with
python3-jsonpatch, gives what `gpuguard check --emit-mutated` gives; denials
name the template; UPDATEs that leave the templates alone run nothing;
`workloads.mode: validate` only checks."""

import base64
import copy
import json
import subprocess
import uuid

import jsonpatch
import pytest
import yaml

from conftest import REPO, start_server

NS = "team-a"
USER = {"username": "alice", "groups": ["system:authenticated"]}


def template(memory="18Gi", gpus=None, labels=None, cls=None):
    """An inference pod asking for GPU memory, or a training pod asking for whole GPUs (or a
    pod of class cls)."""
    cls = cls or ("training" if gpus else "inference")
    meta = {"labels": dict({"team": "a", "gpuguard.io/workload-class": cls}, **(labels or {}))}
    container = {"name": "main", "image": "trainer"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    else:
        meta["annotations"] = {"gpuguard.io/gpu-memory": memory}
    return {"metadata": meta, "spec": {"restartPolicy": "Never", "containers": [container]}}


def deployment(memory="18Gi", replicas=2, cls=None):
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "infer", "namespace": NS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "infer"}},
                     "template": template(memory, labels={"app": "infer"}, cls=cls)}}


def job():
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": NS},
            "spec": {"parallelism": 2, "template": template()}}


def pytorchjob():
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "pt", "namespace": NS},
            "spec": {"pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": template()},
                "Worker": {"replicas": 3, "template": template(gpus=2)}}}}


def jobset(second_memory="18Gi", second_class=None):
    def rj(name, memory, cls=None):
        return {"name": name, "replicas": 2,
                "template": {"spec": {"parallelism": 1, "template": template(memory, cls=cls)}}}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "js", "namespace": NS},
            "spec": {"replicatedJobs": [rj("driver", "18Gi"),
                                        rj("workers", second_memory, second_class)]}}


def leaderworkerset():
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "lws", "namespace": NS},
            "spec": {"replicas": 2, "leaderWorkerTemplate": {
                "size": 4, "leaderTemplate": template(),
                "workerTemplate": template(gpus=1)}}}


WORKLOADS = {"Deployment": deployment, "Job": job, "PyTorchJob": pytorchjob, "JobSet": jobset,
             "LeaderWorkerSet": leaderworkerset}


def workload_review(obj, operation="CREATE", old=None):
    group, _, version = obj["apiVersion"].rpartition("/")
    gvk = {"group": group, "version": version, "kind": obj["kind"]}
    resource = {"group": group, "version": version, "resource": obj["kind"].lower() + "s"}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": str(uuid.uuid4()), "kind": gvk, "resource": resource,
                        "requestKind": gvk, "requestResource": resource,
                        "name": obj["metadata"]["name"], "namespace": NS,
                        "operation": operation, "userInfo": USER, "object": obj,
                        "oldObject": old, "dryRun": False}}


def answer(srv, obj, path="/mutate", **kw):
    status, _, got = srv.connect().review(workload_review(obj, **kw), path=path)
    assert status == 200
    resp = got["response"]
    patch = json.loads(base64.b64decode(resp["patch"])) if "patch" in resp else None
    return resp, patch


def write_config(tmp_path, mode="mutate"):
    text = (REPO / "deploy" / "gpuguard.yaml").read_text()
    assert "\nworkloads:\n  mode: mutate\n" in text
    text = text.replace("\nworkloads:\n  mode: mutate\n", f"\nworkloads:\n  mode: {mode}\n")
    path = tmp_path / "gpuguard.yaml"
    path.write_text(text)
    return path


def serve(binary, certs, tmp_path, config):
    return start_server(binary, certs, tmp_path, "--policies", str(REPO / "policies"),
                        "--lua", str(REPO / "lua"), "--config", str(config))


@pytest.fixture(scope="module")
def policy_server(binary, certs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("workloads")
    srv = serve(binary, certs, tmp, write_config(tmp))
    srv.config = tmp / "gpuguard.yaml"
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def validate_server(binary, certs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("workloads-validate")
    srv = serve(binary, certs, tmp, write_config(tmp, "validate"))
    yield srv
    assert srv.stop() == 0


def emit_mutated(binary, config, obj, tmp_path):
    path = tmp_path / "obj.yaml"
    path.write_text(yaml.safe_dump(obj))
    out = subprocess.run([binary, "check", "--policies", str(REPO / "policies"),
                          "--lua", str(REPO / "lua"), "--config", str(config),
                          "--emit-mutated", str(path)], capture_output=True, check=False)
    assert out.returncode == 0, out.stderr.decode()
    return next(yaml.safe_load_all(out.stdout))


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_patch_gives_what_check_emits_and_is_idempotent(policy_server, binary, tmp_path, kind):
    obj = WORKLOADS[kind]()
    resp, patch = answer(policy_server, obj)
    assert resp["allowed"] is True
    assert patch, resp
    mutated = jsonpatch.apply_patch(obj, patch)
    assert mutated == emit_mutated(binary, policy_server.config, obj, tmp_path)
    assert mutated != obj
    # The mutated workload sent again (reinvocation, a re-apply) gets no patch.
    resp, again = answer(policy_server, mutated)
    assert resp["allowed"] is True and again is None
    resp, none = answer(policy_server, mutated, path="/validate")
    assert resp["allowed"] is True and none is None


def test_deployment_patch_sets_the_template_not_the_object(policy_server):
    resp, patch = answer(policy_server, deployment())
    assert all(op["path"].startswith("/spec/template/") for op in patch), patch
    tpl = jsonpatch.apply_patch(deployment(), patch)["spec"]["template"]
    assert tpl["metadata"]["annotations"]["gpuguard.io/pool"] == "a100-mig"
    assert tpl["spec"]["nodeSelector"]["gpuguard.io/pool"] == "a100-mig"
    assert tpl["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.20gb": "1"}


# Too big for every pool: 90Gi is more than any GPU of the fleet has, asked in class interactive,
# whose one pool (l4-shared) gives a time-sliced share of one L4.  (Class inference would hold it:
# its pool l4-infer rounds it up to 4 whole L4s.)
TOO_BIG = {"memory": "90Gi", "cls": "interactive"}
MEMORY_DENIAL = ("gpu-sharing: container main: a time-slicing GPU is shared, one replica at most; "
                 "ask for at most 1 GPU, or use a class with exclusive GPUs (batch, inference, training)")


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_a_template_too_big_for_every_pool_is_denied_at_the_deployment(policy_server, path):
    resp, patch = answer(policy_server, deployment(**TOO_BIG), path=path)
    assert resp["allowed"] is False and patch is None
    assert resp["status"]["code"] == 403
    assert resp["status"]["message"] == "spec.template: " + MEMORY_DENIAL


def test_a_denial_names_the_template_path_of_the_jobset(policy_server):
    resp, _ = answer(policy_server,
                     jobset(second_memory=TOO_BIG["memory"], second_class=TOO_BIG["cls"]))
    assert resp["allowed"] is False
    message = resp["status"]["message"]
    assert message == "spec.replicatedJobs[1].template.spec.template: " + MEMORY_DENIAL


def test_update_that_leaves_the_templates_alone_runs_nothing(policy_server):
    # The old template would be denied: allowed anyway, as nothing a pod gets changed.
    old = deployment(replicas=2, **TOO_BIG)
    new = deployment(replicas=5, **TOO_BIG)
    assert answer(policy_server, old)[0]["allowed"] is False
    new["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "3"}
    for path in ("/mutate", "/validate"):
        resp, patch = answer(policy_server, new, path=path, operation="UPDATE", old=old)
        assert resp == {"uid": resp["uid"], "allowed": True}
        assert patch is None


def test_update_that_changes_a_template_is_reviewed(policy_server):
    old = deployment()
    new = deployment(**TOO_BIG)
    resp, _ = answer(policy_server, new, operation="UPDATE", old=old)
    assert resp["allowed"] is False
    assert resp["status"]["message"] == "spec.template: " + MEMORY_DENIAL
    resp, patch = answer(policy_server, deployment(), operation="UPDATE",
                         old=deployment(memory="20Gi"))
    assert resp["allowed"] is True and patch


def test_objects_without_templates_and_pods_are_left_to_the_policies(policy_server):
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": NS},
          "data": {"a": "b"}}
    resp, patch = answer(policy_server, cm)
    assert resp["allowed"] is True and patch is None


def test_validate_mode_checks_workloads_without_patching(validate_server):
    resp, patch = answer(validate_server, deployment())
    assert resp["allowed"] is True and patch is None
    changes = [w for w in resp["warnings"]
               if w.startswith("spec.template: workloads.mode is validate, so the pods get")]
    assert changes, resp["warnings"]
    assert any("/spec/template/spec/nodeSelector" in w for w in changes), changes
    resp, patch = answer(validate_server, deployment(**TOO_BIG))
    assert resp["allowed"] is False
    assert resp["status"]["message"] == "spec.template: " + MEMORY_DENIAL


def test_validate_mode_still_mutates_pods(validate_server):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NS,
                                                           "labels": {"team": "a"}},
           "spec": template(gpus=1)["spec"]}
    review = workload_review(pod)
    review["request"]["kind"] = {"group": "", "version": "v1", "kind": "Pod"}
    status, _, got = validate_server.connect().review(review, path="/mutate")
    assert status == 200 and got["response"]["allowed"] is True
    assert got["response"]["patchType"] == "JSONPatch"


def test_pods_of_an_admitted_template_get_no_second_patch(policy_server, binary, tmp_path):
    """The controller's pods go through the pod rules again and get the same answer."""
    mutated = jsonpatch.apply_patch(deployment(), answer(policy_server, deployment())[1])
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": dict(copy.deepcopy(mutated["spec"]["template"]["metadata"]),
                            generateName="infer-5d9c-", namespace=NS,
                            ownerReferences=[{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                              "name": "infer-5d9c", "uid": str(uuid.uuid4()),
                                              "controller": True}]),
           "spec": mutated["spec"]["template"]["spec"]}
    review = workload_review(dict(pod, metadata=dict(pod["metadata"], name="infer-5d9c-x")))
    review["request"]["kind"] = {"group": "", "version": "v1", "kind": "Pod"}
    status, _, got = policy_server.connect().review(review, path="/mutate")
    assert got["response"]["allowed"] is True
    assert "patch" not in got["response"], json.loads(base64.b64decode(got["response"]["patch"]))


@pytest.mark.parametrize("kind, charge", [
    ("Deployment", "0.286 GPU-equivalents: spec.template 0.143 x 2"),
    ("Job", "0.286 GPU-equivalents: spec.template 0.143 x 2"),
    ("PyTorchJob", "6.143 GPU-equivalents: spec.pytorchReplicaSpecs.Master.template 0.143 x 1, "
                   "spec.pytorchReplicaSpecs.Worker.template 2.000 x 3"),
    ("JobSet", "0.572 GPU-equivalents: spec.replicatedJobs[0].template.spec.template 0.143 x 2, "
               "spec.replicatedJobs[1].template.spec.template 0.143 x 2"),
    ("LeaderWorkerSet", "6.286 GPU-equivalents: "
                        "spec.leaderWorkerTemplate.leaderTemplate 0.143 x 2, "
                        "spec.leaderWorkerTemplate.workerTemplate 1.000 x 6"),
])
def test_the_workload_charge_is_in_the_decision(policy_server, kind, charge):
    """Template charge x replicas, parallelism and group sizes, as an audit annotation and in
    the decision log line; the live quota stays with the pods."""
    resp, _ = answer(policy_server, WORKLOADS[kind]())
    assert resp["auditAnnotations"]["workload-charge"] == charge
    lines = [r for r in policy_server.log_lines()
             if r.get("msg") == "decision" and r.get("uid") == resp["uid"]]
    assert [r["charge"] for r in lines] == [charge]
