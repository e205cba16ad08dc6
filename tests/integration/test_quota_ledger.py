"""The GPUQuota ledger's paths a real API server gives only by chance, against the stand-in
(fake_apiserver.py): a validating review of a GPU pod in a namespace with a GPUQuota is admitted
only once its charge is written with the resourceVersion precondition; a 409 is read again and
charged on top; writes that cannot be made before the review's deadline deny the pod (fail
closed); a dry run writes nothing; the controller, elected on the Lease, counts a new quota and
drops an entry once its pod (or claim) is seen.  The burst with real races is tests/e2e/test_quota_ledger.py.
"""

import json
import time
import uuid

import pytest
import yaml

from conftest import REPO, start_server, wait_for
from fake_apiserver import FakeApiServer, gpu_pod
from test_inventory_dra import claim, review_claim
from test_inventory_sync import no_proxy_env, write_kubeconfig

NS = "team-q"


def quota(hard="2", status=None):
    q = {"apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUQuota",
         "metadata": {"name": "gpu", "namespace": NS, "uid": "uid-gq", "generation": 1},
         "spec": {"hard": {"gpu": hard}}}
    if status is not None:
        q["status"] = status
    return q


def validate(server, name, dry_run=False, timeout="10s"):
    """The validating call for a 1-GPU training pod named name: (allowed, message)."""
    pod = gpu_pod(NS, name, cls="training")
    pod["metadata"]["labels"]["team"] = "a"
    pod["metadata"]["uid"] = str(uuid.uuid4())
    pod["metadata"].setdefault("annotations", {})["gpuguard.io/pool"] = "h100-train"
    pod["status"] = {}
    pod["spec"].pop("nodeName", None)  # a pod being created: the scheduler has not bound it
    req = {"uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
           "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": NS,
           "name": name, "operation": "CREATE", "dryRun": dry_run,
           "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
           "object": pod, "oldObject": None}
    conn = server.connect(timeout=15)
    status, _, got = conn.review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "request": req}, path="/validate", timeout=timeout)
    conn.close()
    assert status == 200, got
    resp = got["response"]
    return resp["allowed"], resp.get("status", {}).get("message")


@pytest.fixture
def ledger(binary, certs, tmp_path):
    """A server with the shipped policies, the inventory and the ledger on the stand-in, and a
    GPUQuota of 2 in team-q (counted: status.used 0)."""
    api = FakeApiServer().start()
    api.add_object(quota(status={"used": {"gpu": "0"}, "entries": []}))
    srv = start_server(binary, certs, tmp_path, "--policies", str(REPO / "policies"),
                       "--lua", str(REPO / "lua"), "--config", str(REPO / "deploy" / "gpuguard.yaml"),
                       "--kubeconfig", str(write_kubeconfig(tmp_path, api.url)),
                       "--lease-namespace", "gpuguard-system", env=no_proxy_env())
    try:
        assert wait_for(lambda: "inventory: ready" in srv.ops("/readyz")[1])
        assert wait_for(lambda: api.lease("gpuguard-quota", "gpuguard-system") is not None)
        # The controller's first recount (it adds the Ready condition); then only admissions.
        assert wait_for(lambda: api.quota(NS, "gpu")["status"].get("conditions"))
        api.quota_log.clear()
        yield api, srv
    finally:
        api.stop()
        assert srv.stop() == 0


def entries(api):
    return [e["pod"] for e in api.quota(NS, "gpu").get("status", {}).get("entries", [])]


def test_an_admitted_pod_is_charged_before_its_answer_and_a_full_quota_denies(ledger):
    api, srv = ledger
    assert validate(srv, "a") == (True, None)
    assert entries(api) == ["a"]
    assert api.quota(NS, "gpu")["status"]["used"]["gpu"] == "1.000"
    assert validate(srv, "b") == (True, None)
    allowed, message = validate(srv, "c")
    assert not allowed
    assert message == ("gpu-quota: namespace team-q (GPUQuota gpu) would use 3 of 2 GPUs "
                       "(in use 2, this pod 1); ask for fewer GPUs or free GPUs")
    assert [code for _, _, _, code in api.quota_log] == [200, 200]  # c wrote nothing


def test_a_conflict_is_read_again_and_charged_on_top(ledger):
    api, srv = ledger
    api.quota_conflicts = 2  # another replica wrote twice between our reads and writes
    assert validate(srv, "a") == (True, None)
    assert [code for _, _, _, code in api.quota_log] == [409, 409, 200]
    assert api.quota(NS, "gpu")["status"]["used"]["gpu"] == "1.000"
    writes = srv.ops("/metrics")[1]
    assert 'gpuguard_quota_ledger_writes_total{namespace="team-q",result="conflict"} 2' in writes
    assert 'gpuguard_quota_ledger_writes_total{namespace="team-q",result="ok"} 1' in writes


def test_a_ledger_that_cannot_be_written_by_the_deadline_denies(ledger):
    api, srv = ledger
    api.quota_refuse_until = time.monotonic() + 60
    t0 = time.monotonic()
    allowed, message = validate(srv, "a", timeout="3s")
    assert not allowed
    assert message == ("gpu-quota: the GPU quota ledger (GPUQuota team-q/gpu) could not be "
                       "written before the review's deadline: PUT /apis/gpuguard.io/v1alpha1/"
                       "namespaces/team-q/gpuquotas/gpu/status: HTTP 503: etcdserver: request "
                       "timed out; the pod is refused until it can be, try again")
    assert time.monotonic() - t0 < 3 + 2  # answered within the API server's timeout, and then some
    assert entries(api) == []
    assert 'reason="unavailable"} 1' in srv.ops("/metrics")[1]
    api.quota_refuse_until = 0
    assert validate(srv, "b") == (True, None)


def test_a_dry_run_is_judged_and_writes_nothing(ledger):
    api, srv = ledger
    assert validate(srv, "a", dry_run=True) == (True, None)
    assert api.quota_log == [] and entries(api) == []


def test_the_controller_counts_a_new_quota_and_settles_entries_once_their_pods_are_seen(ledger):
    api, srv = ledger
    api.add_object(dict(quota("4"), metadata={"name": "fresh", "namespace": "team-r",
                                              "uid": "uid-fresh", "generation": 1}))
    assert wait_for(lambda: (api.quota("team-r", "fresh") or {}).get("status", {})
                    .get("used") == {"gpu": "0.000"})
    assert validate(srv, "a") == (True, None)
    uid = api.quota(NS, "gpu")["status"]["entries"][0]["uid"]
    pod = gpu_pod(NS, "a", uid=uid, cls="training")
    pod["metadata"].setdefault("annotations", {})["gpuguard.io/pool"] = "h100-train"
    api.add(pod)  # the watch shows the pod: counted from the pod, its entry goes
    assert wait_for(lambda: entries(api) == [], timeout=30)
    assert api.quota(NS, "gpu")["status"]["used"]["gpu"] == "1.000"


def test_a_resourceclaim_charged_on_its_own_is_charged_in_the_ledger(ledger):
    api, srv = ledger
    obj = claim("weights", count=1, ns=NS)
    obj["metadata"]["uid"] = str(uuid.uuid4())
    del obj["status"]  # being created: not allocated yet
    assert review_claim(srv, obj, dry_run=False) == (True, None)
    assert entries(api) == ["weights"]
    assert api.quota(NS, "gpu")["status"]["used"]["gpu"] == "1.000"
    api.add_object(dict(obj, status={}))  # the claims' watch shows it: counted from the claim
    assert wait_for(lambda: entries(api) == [], timeout=30)
    assert api.quota(NS, "gpu")["status"]["used"]["gpu"] == "1.000"
