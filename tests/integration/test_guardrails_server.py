"""The shipped guardrails on the real server over TLS, for the reviews that only the API server
sends: a pod UPDATE with its oldObject and the requester's userInfo, and a
pods/ephemeralcontainers update (`kubectl debug`), to /validate as charts/gpuguard/templates/webhooks.yaml
registers them."""

import copy
import uuid

import pytest

from conftest import REPO, start_server
from test_server import check_envelope

NOTEBOOK = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {
        "name": "jupyter-kim", "namespace": "team-a", "uid": "0c7f6b2e-3d55-4c0e-9d1b-6a2f0f3e9c41",
        "labels": {"team": "vision", "gpuguard.io/workload-class": "interactive"},
        "annotations": {
            "gpuguard.io/gpu-fraction": "0.25",
            "gpuguard.io/decision": "time-slicing on pool l4-shared for class interactive "
                                    "(notebook): notebook gets 1 of 4 replicas of an L4",
            "gpuguard.io/pool": "l4-shared",
            "gpuguard.io/charge": "250",
        },
    },
    "spec": {
        "activeDeadlineSeconds": 28800,
        "nodeSelector": {"gpuguard.io/pool": "l4-shared"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "l4-shared",
                         "effect": "NoSchedule"}],
        "containers": [{"name": "notebook",
                        "image": "quay.io/jupyter/pytorch-notebook:cuda12-2024-10-07",
                        "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}],
    },
}
ALICE = {"username": "alice", "uid": "4b1d", "groups": ["team-a-devs", "system:authenticated"],
         "extra": {}}
KUEUE = {"username": "system:serviceaccount:kueue-system:kueue-controller-manager",
         "groups": ["system:serviceaccounts", "system:serviceaccounts:kueue-system",
                    "system:authenticated"]}


def update_review(old, new, user, sub_resource=None):
    """The AdmissionReview the API server sends for an update of a pod (or of a subresource)."""
    req = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": new["metadata"]["name"], "namespace": new["metadata"]["namespace"],
        "operation": "UPDATE", "userInfo": user, "object": new, "oldObject": old,
        "dryRun": False, "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"},
    }
    if sub_resource:
        req["subResource"] = req["requestSubResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


@pytest.fixture(scope="module")
def shipped(binary, certs, tmp_path_factory):
    """The server with the shipped policies and the example configuration."""
    srv = start_server(binary, certs, tmp_path_factory.mktemp("shipped"), "--policies",
                       str(REPO / "policies"), "--lua", str(REPO / "lua"), "--config",
                       str(REPO / "deploy" / "gpuguard.yaml"))
    yield srv
    if srv.proc.poll() is None:
        assert srv.stop() == 0


def validate(srv, sent):
    status, _, got = srv.connect().review(sent, path="/validate")
    assert status == 200
    return check_envelope(sent, got, "/validate")


def test_a_user_rewriting_gpuguard_annotations_is_denied(shipped):
    new = copy.deepcopy(NOTEBOOK)
    new["metadata"]["annotations"]["gpuguard.io/decision"] = "exclusive"
    del new["metadata"]["annotations"]["gpuguard.io/charge"]
    resp = validate(shipped, update_review(NOTEBOOK, new, ALICE))
    assert resp["allowed"] is False
    assert resp["status"]["code"] == 403
    assert resp["status"]["message"] == (
        "gpu-guardrails: the update changes the annotation gpuguard.io/charge, which gpuguard "
        "reads to place and charge the pod; leave gpuguard.io/ labels and annotations as they "
        "are\ngpu-guardrails: the update changes the annotation gpuguard.io/decision, which "
        "gpuguard reads to place and charge the pod; leave gpuguard.io/ labels and annotations "
        "as they are")


def test_kueue_may_change_them_and_others_may_edit_other_labels(shipped):
    new = copy.deepcopy(NOTEBOOK)
    del new["metadata"]["annotations"]["gpuguard.io/charge"]
    assert validate(shipped, update_review(NOTEBOOK, new, KUEUE))["allowed"] is True
    new = copy.deepcopy(NOTEBOOK)
    new["metadata"]["labels"]["owner"] = "alice"
    assert validate(shipped, update_review(NOTEBOOK, new, ALICE))["allowed"] is True


def test_kubectl_debug_with_every_gpu_on_a_shared_gpu_is_denied(shipped):
    new = copy.deepcopy(NOTEBOOK)
    new["spec"]["ephemeralContainers"] = [{
        "name": "debugger-x2k9p", "image": "nvcr.io/nvidia/cuda:12.6.2-base-ubuntu22.04",
        "targetContainerName": "notebook",
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        "securityContext": {"privileged": True}}]
    resp = validate(shipped, update_review(NOTEBOOK, new, ALICE, "ephemeralcontainers"))
    assert resp["allowed"] is False
    assert resp["status"]["message"] == (
        "gpu-guardrails: container debugger-x2k9p sets NVIDIA_VISIBLE_DEVICES; remove it: the "
        "device plugin sets which GPUs and driver features a container gets; GPU plumbing "
        "(drivers, device plugins, exporters) belongs in a namespace of "
        "placement.exempt_namespaces or runs as one of placement.exempt_service_accounts\n"
        "gpu-guardrails: container debugger-x2k9p is privileged on a shared GPU and would see "
        "every GPU of the node; drop privileged or use exclusive GPUs")


def test_a_plain_debug_container_is_allowed(shipped):
    new = copy.deepcopy(NOTEBOOK)
    new["spec"]["ephemeralContainers"] = [{"name": "debugger-k2v8", "image": "busybox:1.36",
                                           "targetContainerName": "notebook"}]
    resp = validate(shipped, update_review(NOTEBOOK, new, ALICE, "ephemeralcontainers"))
    assert resp["allowed"] is True
    assert "warnings" not in resp


def test_copies_of_a_request_get_the_same_answer_from_the_remembered_verdict(shipped):
    """30-gpu-guardrails remembers its verdict (`remember = true`): copies of a request (only
    the uid differs) are answered from what the first was judged, across other requests that
    reuse the server's per-request memory in between, on both worker threads."""
    denied = copy.deepcopy(NOTEBOOK)
    denied["metadata"]["annotations"]["gpuguard.io/decision"] = "exclusive"
    allowed = copy.deepcopy(NOTEBOOK)
    allowed["metadata"]["labels"]["owner"] = "alice"
    first = validate(shipped, update_review(NOTEBOOK, denied, ALICE))["status"]["message"]
    assert first.startswith("gpu-guardrails: the update changes the annotation "
                            "gpuguard.io/decision")
    for _ in range(20):
        resp = validate(shipped, update_review(NOTEBOOK, denied, ALICE))
        assert resp["allowed"] is False
        assert resp["status"]["message"] == first
        assert validate(shipped, update_review(NOTEBOOK, allowed, ALICE))["allowed"] is True
