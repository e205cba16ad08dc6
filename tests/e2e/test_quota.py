"""Quota with the real watch: a namespace fills up, the next pod is denied with the quota
message, deleting a pod frees room; after etcd compaction and an API server restart the
inventory relists (410 Gone) and counts the same.  And DRA: the resourceclaim controller makes a
pod's claim from its template, the scheduler allocates it, and the inventory charges it once."""

import json
import re
import time

from e2e_support import REPO, claim_pod, claim_template, pod_running, wait_for

QUOTA_NS = "e2e-quota"  # quota 2 GPUs in tests/e2e/fleet.yaml
FIGURES = REPO / "build" / "e2e" / "figures.json"


def gpu_pod(name, gpus=1, **spec):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"team": "e2e", "gpuguard.io/workload-class": "training"}},
            "spec": {"containers": [{"name": "main", "image": "registry.example/cuda:12",
                                     "resources": {"limits": {"nvidia.com/gpu": gpus}}}], **spec}}


def usage(gpuguard, namespace):
    """The GPUs each gpuguard process's inventory counts in namespace, as a set."""
    return {float(v) for v in re.findall(
        rf'^gpuguard_inventory_usage_gpus\{{namespace="{re.escape(namespace)}"\}} (\S+)$',
        gpuguard.metrics(), re.M)}


def pod_counts(gpuguard):
    """The GPU pods each gpuguard process's inventory holds, in process order."""
    return [float(v) for v in re.findall(r"^gpuguard_inventory_pods (\S+)$", gpuguard.metrics(), re.M)]


def denial(kube, namespace, pod):
    r = kube.create(pod, namespace, check=False)
    assert not isinstance(r, dict), f"{pod['metadata']['name']} was admitted"
    return r.stderr.strip().split("denied the request: ", 1)[1]


def record(name, value):
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    figures = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    figures[name] = value
    FIGURES.write_text(json.dumps(figures, indent=2) + "\n")


def test_a_full_namespace_is_denied_frees_room_on_delete_and_counts_the_same_after_a_relist(
        kube, gpuguard, cluster):
    kube.run("delete", "namespace", QUOTA_NS, "--ignore-not-found", "--wait=true", "--timeout=120s")
    kube.run("create", "namespace", QUOTA_NS)
    wait_for("the default ServiceAccount", lambda: kube.run(
        "get", "serviceaccount", "default", "-n", QUOTA_NS, check=False).returncode == 0)
    try:
        for name in ("a", "b"):
            kube.create(gpu_pod(name), QUOTA_NS)
            wait_for(f"pod {name} running", lambda n=name: pod_running(kube, QUOTA_NS, n))
        full = ("gpu-quota: namespace e2e-quota would use 3 of 2 GPUs (in use 2, this pod 1); "
                "ask for fewer GPUs or free GPUs")
        assert denial(kube, QUOTA_NS, gpu_pod("c")) == full

        # Deleting a pod frees its GPU as soon as the watch shows it gone.
        kube.run("delete", "pod", "a", "-n", QUOTA_NS, "--wait=true", "--timeout=120s")
        deleted = time.monotonic()
        wait_for("pod c admitted after a was deleted",
                 lambda: isinstance(kube.create(gpu_pod("c"), QUOTA_NS, check=False), dict),
                 interval=0.05)
        record("quota_delete_to_admit_seconds", round(time.monotonic() - deleted, 3))
        assert denial(kube, QUOTA_NS, gpu_pod("d")) == full

        # Compact etcd past every resourceVersion gpuguard has seen and restart the API server:
        # the watches resume from an expired resourceVersion, get 410 and relist.
        expired, relists = len(expired_lines(gpuguard)), gpuguard.metric("gpuguard_inventory_relists_total")
        cluster.restart_apiserver(compact=True)
        # The 410 is logged before the relist; the counter moves once the relist is in place.
        wait_for("gpuguard's inventory relisting after 410 Gone",
                 lambda: gpuguard.metric("gpuguard_inventory_relists_total") > relists, timeout=300)
        assert len(expired_lines(gpuguard)) > expired
        assert denial(kube, QUOTA_NS, gpu_pod("d")) == full
    finally:
        kube.run("delete", "namespace", QUOTA_NS, "--wait=false", check=False)


def expired_lines(gpuguard):
    return [l for l in gpuguard.log_lines() if l.get("msg") == "inventory: resourceVersion expired, relisting"]


def test_a_dra_pods_claim_is_made_allocated_and_charged_once(kube, namespace):
    kube.create(claim_template("two-a100", devices=2), namespace)
    kube.create(claim_pod("dra", "two-a100"), namespace)
    running = wait_for("the DRA pod running", lambda: pod_running(kube, namespace, "dra"))
    claim_name = running["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = kube.get("resourceclaim", claim_name, namespace)
    assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpus"
    devices = claim["status"]["allocation"]["devices"]["results"]
    assert len(devices) == 2 and {d["driver"] for d in devices} == {"gpu.nvidia.com"}
    # Quota 4 (the default): the pod and its claim are 2 GPUs, not 4.
    message = denial(kube, namespace, gpu_pod("three", 3))
    assert f"namespace {namespace} would use 5 of 4 GPUs (in use 2, this pod 3)" in message


def test_a_dra_pod_stays_charged_when_its_template_is_swapped(kube, gpuguard, namespace):
    """A pod is charged from the claim made for it (its status names it), never from its template
    looked up again by name: deleting the template and making it again under that name with a
    device that is no GPU, then any event of the pod, changes nothing of its charge."""
    kube.create(claim_template("swap", devices=2), namespace)
    kube.create(claim_pod("dra", "swap"), namespace)
    wait_for("the DRA pod running", lambda: pod_running(kube, namespace, "dra"))
    kube.run("delete", "resourceclaimtemplate", "swap", "-n", namespace)
    kube.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                 "metadata": {"name": "swap"},
                 "spec": {"spec": {"devices": {"requests": [
                     {"name": "gpus", "exactly": {"deviceClassName": "rdma.example.com"}}]}}}},
                namespace)
    wait_for("the pod charged 2 GPUs", lambda: usage(gpuguard, namespace) == {2.0})
    # The watch delivers events in order: once a GPU pod created after the label edit is in
    # every process's inventory, each has charged the edited pod again.  Pods of earlier tests'
    # namespaces must be gone first, or their deletion would hide the marker in the count.
    wait_for("no namespace terminating", lambda: not [
        n for n in kube.json("get", "namespaces")["items"] if n["status"].get("phase") == "Terminating"])
    before = pod_counts(gpuguard)
    kube.run("label", "pod", "dra", "-n", namespace, "touched=yes")
    kube.create(gpu_pod("marker", 1), namespace)
    wait_for("the marker pod in every inventory",
             lambda: pod_counts(gpuguard) == [n + 1 for n in before])
    assert usage(gpuguard, namespace) == {3.0}  # 2 for the DRA pod, 1 for the marker
    message = denial(kube, namespace, gpu_pod("three", 3))  # quota 4, the default
    assert f"namespace {namespace} would use 6 of 4 GPUs (in use 3, this pod 3)" in message


def test_a_replicaset_scaling_out_gets_exactly_its_room_and_its_pods_settle_reservations(
        kube, gpuguard, namespace):
    """The ReplicaSet controller creates pods in parallel, and the replicas of gpuguard answer
    them: with a GPUQuota of 4, exactly its room is admitted (the ledger), and once the watch
    shows the pods, each replica's reservations made under the uids the validating calls saw are
    settled: the usage a denial names is the pods', not the pods' and their reservations' (twice
    as much).  (A quota of the configuration alone is exact with one replica: docs/inventory.md.)"""
    kube.run("apply", "-f", "-", input={
        "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "gpu", "namespace": namespace}, "spec": {"hard": {"gpu": "4"}}})
    wait_for("the GPUQuota counted", lambda: kube.get("gpuquotas", "gpu", namespace)
             .get("status", {}).get("used"))
    labels = {**gpu_pod("x")["metadata"]["labels"], "app": "burst"}
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "burst"},
          "spec": {"replicas": 8, "selector": {"matchLabels": {"app": "burst"}},
                   "template": {"metadata": {"labels": labels}, "spec": gpu_pod("x")["spec"]}}}
    kube.create(rs, namespace)
    past = re.compile(r"would use 5(\.000)? of (the )?4")  # the policy's words, or the ledger's
    wait_for("the ReplicaSet's pods denied past the quota", lambda: any(
        past.search(e.get("message", ""))
        for e in kube.json("get", "events", "-n", namespace)["items"]))
    wait_for("the admitted pods in every replica's inventory",
             lambda: usage(gpuguard, namespace) == {4.0})
    pods = kube.json("get", "pods", "-n", namespace, "-l", "app=burst")["items"]
    assert len(pods) == 4, [p["metadata"]["name"] for p in pods]
    message = denial(kube, namespace, gpu_pod("extra", 1))
    assert (f"namespace {namespace} (GPUQuota gpu) would use 5 of 4 GPUs (in use 4, this pod 1)"
            in message), message


def test_a_clusters_own_gpu_device_class_is_charged(kube, gpuguard, namespace):
    """A DeviceClass the configuration does not name, whose selectors pick NVIDIA's GPUs, is a
    GPU class: a claim of 2 of its devices is charged 2 GPUs (quota 4, the default), read from
    the class gpuguard watches; a class for other devices is not."""
    classes = {"e2e-admin-gpu": 'device.driver == "gpu.nvidia.com"',
               "e2e-admin-nic": 'device.driver == "rdma.example.com"'}
    try:
        for name, expr in classes.items():
            kube.run("delete", "deviceclass", name, "--ignore-not-found")
            kube.create({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                         "metadata": {"name": name},
                         "spec": {"selectors": [{"cel": {"expression": expr}}]}})
        for name in classes:
            kube.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                         "metadata": {"name": name},
                         "spec": {"devices": {"requests": [{"name": "r", "exactly": {
                             "deviceClassName": name, "count": 2}}]}}}, namespace)
        wait_for("the claim of the GPU class charged", lambda: usage(gpuguard, namespace) == {2.0})
        message = denial(kube, namespace, gpu_pod("three", 3))
        assert f"namespace {namespace} would use 5 of 4 GPUs (in use 2, this pod 3)" in message
    finally:
        kube.run("delete", "deviceclass", *classes, "--ignore-not-found", check=False)
