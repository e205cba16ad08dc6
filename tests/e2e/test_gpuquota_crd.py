"""The GPUQuota custom resource (charts/gpuguard/crds/gpuquota.yaml) as the real API server serves it:
installed with gpuguard's manifests, a quota with pools stored as written, bad quantities and a
missing total refused by the schema with its message, HARD and USED in `kubectl get gpuquotas
-A`, and the ledger's writes as gpuguard makes them, with its own ServiceAccount's token: a PUT
to /status needs the resourceVersion read (409 on a stale one, 422 without), and that account
may write the status and nothing else of a GPUQuota."""

import json
import re
import subprocess
from datetime import datetime, timezone

import yaml

from e2e_support import REPO, wait_for

CRD = "gpuquotas.gpuguard.io"
EXAMPLE = REPO / "deploy" / "examples" / "gpuquota.yaml"
SA = "system:serviceaccount:gpuguard-system:gpuguard"


def ledger(uid="0c4f3a0e-3f4e-4b8a-9d0e-5f7a4c2b1e6d", used="1.000"):
    """A ledger as the servers write it: one pod admitted just now, not yet seen, and the usage
    that entry makes (so that gpuguard's controller, which recounts every ledger, has little to
    correct; the tests never rely on it not writing)."""
    now = datetime.now(timezone.utc)
    return {"used": {"gpu": used, "pools": {"h100-train": used}},
            "entries": [{"uid": uid, "pod": "train-x7k2p", "charge": "1.000",
                         "pool": "h100-train",
                         "admitted": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled",
                            "message": "recounted",
                            "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ")}],
            "observedGeneration": 1}


def example(namespace):
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["metadata"]["namespace"] = namespace
    return obj


def quota(namespace, gpu, name="gpu", **hard):
    return {"apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUQuota",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"hard": {**({"gpu": gpu} if gpu is not None else {}), **hard}}}


def status_path(namespace, name="gpu"):
    return f"/apis/gpuguard.io/v1alpha1/namespaces/{namespace}/gpuquotas/{name}/status"


def as_gpuguard(cluster, *args, input=None):
    """kubectl with gpuguard's own credentials: the kubeconfig `gpuguard serve` runs with, whose
    tokenFile holds a TokenRequest token of its ServiceAccount (tests/k8s/cluster.py)."""
    kubeconfig = cluster.dir / "gpuguard" / "kubeconfig"
    cmd = [str(cluster.bin / "kubectl"), "--kubeconfig", str(kubeconfig), *map(str, args)]
    return subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=120)


def put_status(cluster, namespace, obj):
    """PUT the object to its /status as gpuguard, as the servers write the ledger."""
    return as_gpuguard(cluster, "replace", "--raw", status_path(namespace), "-f", "-",
                       input=json.dumps(obj))


def test_the_crd_is_installed_with_gpuguards_manifests(kube):
    crd = kube.get("customresourcedefinition", CRD)
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"
    assert crd["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpuguard"
    shipped = yaml.safe_load((REPO / "charts" / "gpuguard" / "crds" / "gpuquota.yaml").read_text())["spec"]
    assert crd["spec"]["names"] == shipped["names"]
    assert crd["spec"]["versions"] == shipped["versions"], "the schema as shipped, nothing dropped"
    assert crd["status"]["acceptedNames"]["shortNames"] == ["gq"]


def test_a_gpuquota_with_pools_is_stored_as_written(kube, namespace):
    created = kube.create(example(namespace))
    assert created["spec"] == {"hard": {"gpu": "8", "pools": {"h100-train": "4"}}}
    assert created["metadata"]["generation"] == 1
    # An integer and a milli-quantity are quantities too; the short name and the category work.
    kube.create(quota(namespace, 8, name="whole"))
    kube.create(quota(namespace, "500m", name="half"))
    names = kube.run("get", "gq", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(names) == [f"gpuquota.gpuguard.io/{n}" for n in ("gpu", "half", "whole")]
    assert "gpuquota.gpuguard.io/gpu" in kube.run("get", "gpuguard", "-n", namespace,
                                                  "-o", "name").stdout.split()
    # Status sent with a create is dropped: the ledger is written through /status only.
    with_status = dict(quota(namespace, "2", name="sneaky"), status=ledger())
    assert "status" not in kube.create(with_status)


def test_bad_quotas_are_refused_by_the_schema(kube, namespace):
    """What the API server says, word for word, and nothing stored."""
    cases = [
        (quota(namespace, "eight"),
         r'The GPUQuota "gpu" is invalid: spec\.hard\.gpu: Invalid value: "eight": '
         r"spec\.hard\.gpu in body should match '\^.+\$'"),
        (quota(namespace, None, pools={"h100-train": "4"}),
         r'The GPUQuota "gpu" is invalid: spec\.hard\.gpu: Required value'),
        (quota(namespace, "-1"),
         r'The GPUQuota "gpu" is invalid: spec\.hard\.gpu: Invalid value: "-1": '
         r"spec\.hard\.gpu in body should match '\^.+\$'"),
        (quota(namespace, -1),
         r'The GPUQuota "gpu" is invalid: spec\.hard\.gpu: Invalid value: -1: '
         r"spec\.hard\.gpu in body should be greater than or equal to 0"),
        (quota(namespace, "8", pools={"h100-train": "four"}),
         r'The GPUQuota "gpu" is invalid: spec\.hard\.pools\.h100-train: Invalid value: "four": '
         r"spec\.hard\.pools\.h100-train in body should match '\^.+\$'"),
    ]
    for obj, message in cases:
        r = kube.create(obj, namespace, check=False)
        assert not isinstance(r, dict), f"stored: {obj['spec']}"
        assert r.returncode == 1
        assert re.fullmatch(message, r.stderr.strip()), r.stderr
    # An unquoted fraction is a JSON number, neither integer nor string.
    r = kube.create(quota(namespace, 0.5), namespace, check=False)
    assert not isinstance(r, dict) and "must be of type integer,string" in r.stderr, r
    assert kube.items("gpuquotas", namespace) == []


def write_ledger(cluster, namespace, status, **changes):
    """Read the GPUQuota and PUT it to /status with status, as gpuguard (the servers and its
    controller write the same way): (the object as read, as written), or None on a conflict
    (someone wrote in between: the caller tries again)."""
    obj = json.loads(as_gpuguard(cluster, "get", "gpuquota", "gpu", "-n", namespace,
                                 "-o", "json").stdout)
    r = put_status(cluster, namespace, dict(obj, status=status, **changes))
    if r.returncode != 0:
        assert "(Conflict)" in r.stderr, r.stderr
        return None
    return obj, json.loads(r.stdout)


def test_kubectl_get_shows_hard_and_used(kube, cluster, namespace):
    kube.create(example(namespace))
    header = kube.run("get", "gpuquotas", "-A").stdout.splitlines()[0]
    assert header.split() == ["NAMESPACE", "NAME", "HARD", "USED", "AGE"]
    wait_for("a ledger written", lambda: write_ledger(cluster, namespace, ledger()))

    def row():
        """The quota's row and status.used.gpu, read with nothing written in between (gpuguard's
        controller may rewrite the ledger at any time)."""
        before = kube.get("gpuquota", "gpu", namespace)
        lines = kube.run("get", "gpuquotas", "-A").stdout.splitlines()
        after = kube.get("gpuquota", "gpu", namespace)
        used = after.get("status", {}).get("used", {}).get("gpu")
        if not used or before["metadata"]["resourceVersion"] != after["metadata"][
                "resourceVersion"]:
            return None
        return [l.split() for l in lines if l.split()[:2] == [namespace, "gpu"]], used
    [cols], used = wait_for("the quota's row with its ledger", row)
    assert cols[:4] == [namespace, "gpu", "8", used]
    assert re.fullmatch(r"\d+\.\d{3}", used), used
    assert re.fullmatch(r"\d+[smhd]", cols[4]), cols


def test_ledger_writes_are_conditional_and_only_status(kube, cluster, namespace):
    kube.create(example(namespace))
    read = json.loads(as_gpuguard(cluster, "get", "gpuquota", "gpu", "-n", namespace,
                                  "-o", "json").stdout)

    # No resourceVersion: custom resources refuse unconditional updates.
    blind = {k: v for k, v in read.items() if k != "metadata"}
    blind["metadata"] = {"name": "gpu", "namespace": namespace}
    blind["status"] = ledger()
    r = put_status(cluster, namespace, blind)
    assert r.returncode == 1
    assert r.stderr.strip() == ('The gpuquotas "gpu" is invalid: metadata.resourceVersion: '
                                "Invalid value: 0: must be specified for an update"), r.stderr

    # With the resourceVersion read: written (again with a fresh read if gpuguard's controller
    # wrote in between), and only the status: the spec in the body is ignored.
    status = ledger()
    before, after = wait_for("a ledger write with the resourceVersion read", lambda: write_ledger(
        cluster, namespace, status, spec={"hard": {"gpu": "1000"}}))
    assert after["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]
    assert after["status"] == status
    assert after["spec"] == {"hard": {"gpu": "8", "pools": {"h100-train": "4"}}}
    assert after["metadata"]["generation"] == 1, "a status write is no new generation"

    # The resourceVersion read before that write is stale now: 409, and nothing written (an
    # entry of its own would stay until its pod is seen or a while has passed).
    r = put_status(cluster, namespace, dict(before, status=ledger(uid="e2e-stale-write")))
    assert r.returncode == 1
    assert r.stderr.strip() == (
        'Error from server (Conflict): Operation cannot be fulfilled on gpuquotas.gpuguard.io '
        '"gpu": the object has been modified; please apply your changes to the latest version '
        "and try again"), r.stderr
    entries = kube.get("gpuquota", "gpu", namespace).get("status", {}).get("entries", [])
    assert "e2e-stale-write" not in [e["uid"] for e in entries]


def test_gpuguard_may_write_the_ledger_and_nothing_else(kube, cluster, namespace):
    """gpuguard's own token: status updates only; never the spec, create, delete or patch; the
    Lease gpuguard-quota in gpuguard-system, and no other Lease."""
    kube.create(example(namespace))
    current = kube.get("gpuquota", "gpu", namespace)
    denied = [
        ("replace", "-f", "-", json.dumps(dict(current, spec={"hard": {"gpu": "1000"}}))),
        ("patch", "gpuquota", "gpu", "-n", namespace, "--type=merge", "-p",
         '{"spec":{"hard":{"gpu":"1000"}}}', None),
        ("patch", "gpuquota", "gpu", "-n", namespace, "--subresource=status", "--type=merge", "-p",
         '{"status":{"used":{"gpu":"0"}}}', None),
        ("delete", "gpuquota", "gpu", "-n", namespace, None),
        ("create", "-f", "-", json.dumps(quota(namespace, "100", name="mine"))),
    ]
    for *args, body in denied:
        r = as_gpuguard(cluster, *args, input=body)
        assert r.returncode == 1 and "Error from server (Forbidden)" in r.stderr, (args, r.stderr)
        assert f'User "{SA}" cannot' in r.stderr, r.stderr
    assert kube.get("gpuquota", "gpu", namespace)["spec"]["hard"]["gpu"] == "8"

    def can(verb, resource, ns, sub=None):
        args = ["auth", "can-i", verb, resource, "-n", ns] + (["--subresource", sub] if sub else [])
        out = as_gpuguard(cluster, *args).stdout.strip()
        assert out in ("yes", "no"), out
        return out == "yes"
    assert can("update", "gpuquotas.gpuguard.io", namespace, "status")
    assert can("get", "gpuquotas.gpuguard.io/gpu", namespace)
    assert can("watch", "gpuquotas.gpuguard.io", "default")
    for verb in ("patch", "delete"):
        assert not can(verb, "gpuquotas.gpuguard.io", namespace, "status"), verb
    for verb in ("create", "update", "patch", "delete", "deletecollection"):
        assert not can(verb, "gpuquotas.gpuguard.io", namespace), verb

    assert can("get", "leases.coordination.k8s.io/gpuguard-quota", "gpuguard-system")
    assert can("update", "leases.coordination.k8s.io/gpuguard-quota", "gpuguard-system")
    assert can("create", "leases.coordination.k8s.io", "gpuguard-system")
    assert not can("update", "leases.coordination.k8s.io/other", "gpuguard-system")
    assert not can("delete", "leases.coordination.k8s.io/gpuguard-quota", "gpuguard-system")
    assert not can("list", "leases.coordination.k8s.io", "gpuguard-system")
    assert not can("create", "leases.coordination.k8s.io", namespace)
    assert not can("get", "leases.coordination.k8s.io/gpuguard-quota", "kube-system")
    # The API server agrees when asked for real, without keeping anything (a dry run).
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "e2e-dry-run", "namespace": "gpuguard-system"},
             "spec": {"holderIdentity": "e2e"}}
    r = as_gpuguard(cluster, "create", "--dry-run=server", "-f", "-", input=json.dumps(lease))
    assert r.returncode == 0, r.stderr


def test_a_dry_run_is_judged_and_charges_nothing(kube, namespace):
    """The validating webhook that charges the ledger declares NoneOnDryRun, so the API server
    sends it dry runs (with sideEffects None it would not be told; with Some or Unknown every
    dry run would be refused): a dry-run GPU pod is decided by gpuguard and leaves no entry."""
    validating = kube.get("validatingwebhookconfiguration", "gpuguard")["webhooks"]
    mutating = kube.get("mutatingwebhookconfiguration", "gpuguard")["webhooks"]
    assert {w["name"]: w["sideEffects"] for w in validating + mutating} == {
        "validate.gpuguard.io": "NoneOnDryRun", "workloads.validate.gpuguard.io": "None",
        "mutate.gpuguard.io": "None", "workloads.mutate.gpuguard.io": "None"}
    kube.create(example(namespace))
    # Until the quota controller has counted the quota (its next round, 2 s at most), GPU pods
    # of the namespace are refused as not counted yet.
    wait_for("the quota counted", lambda: kube.get("gpuquota", "gpu", namespace)
             .get("status", {}).get("used"))
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "dry", "labels": {"team": "e2e",
                                                  "gpuguard.io/workload-class": "training"}},
           "spec": {"containers": [{"name": "main", "image": "registry.example/cuda:12",
                                    "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    r = kube.run("create", "--dry-run=server", "-o", "json", "-n", namespace, "-f", "-",
                 input=pod)
    decided = json.loads(r.stdout)
    assert "gpuguard.io/decision" in decided["metadata"]["annotations"]
    uid = decided["metadata"]["uid"]
    entries = kube.get("gpuquota", "gpu", namespace).get("status", {}).get("entries", [])
    assert not [e for e in entries if e["uid"] == uid or e.get("pod") == "dry"], entries
    assert kube.items("pods", namespace) == []
