"""Exact GPU quotas with several gpuguard replicas: the GPUQuota ledger against the real API
server (docs/inventory.md, "Exact quotas with any number of replicas").

A namespace with a GPUQuota of 8 GPU-equivalents takes a burst of 200 GPU pods of mixed charges
(whole H100s, 1g.10gb MIG slices of an A100 at 0.143, 0.25 shares of an L4) from 20 concurrent
clients: what is admitted sums to at most 8 and fills the namespace to within the smallest
charge, with every replica answering; the same while a replica is killed in the middle; and with
a validating webhook of the test's own that refuses every fifth pod after gpuguard admitted it,
the ledger returns to the true usage within its bound.  The same burst without the ledger
(--quota-ledger off) shows the overshoot it removes, and 1,000 sequential creations the latency
it adds; both go to build/e2e/figures.json for the closing notes and docs.

Needs the cluster with three gpuguard processes (make e2e starts it so)."""

import http.client
import json
import re
import ssl
import statistics
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from e2e_support import REPO, OwnWebhook, make_namespace, serve_test_webhook, wait_for

HARD = 8000  # milli-GPU
CLIENTS = 20
BURST = 200
BOUND_S = 30 + 2  # --quota-entry-bound's default, and one recount period
FIGURES = REPO / "build" / "e2e" / "figures.json"

# The three kinds of pod and their charges (milli-GPU) in the e2e fleet.
KINDS = [
    ("whole", 1000, {"gpuguard.io/workload-class": "training"}, {},
     {"nvidia.com/gpu": "1"}),
    ("mig", 143, {"gpuguard.io/workload-class": "inference"}, {},
     {"nvidia.com/mig-1g.10gb": "1"}),
    ("share", 250, {"gpuguard.io/workload-class": "interactive"},
     {"gpuguard.io/gpu-fraction": "0.25"}, {}),
]
SMALLEST = min(k[1] for k in KINDS)


def record(name, value):
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    figures = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    figures[name] = value
    FIGURES.write_text(json.dumps(figures, indent=2) + "\n")


def pod(i):
    kind, _, labels, annotations, limits = KINDS[i % len(KINDS)]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{kind}-{i}", "labels": {"team": "e2e", **labels},
                         "annotations": annotations},
            "spec": {"containers": [{"name": "main", "image": "registry.example/cuda:12",
                                     "resources": {"limits": limits}}]}}


class Api:
    """The API server over HTTPS with the admin's client certificate: one connection per thread,
    kept alive (kubectl would cost a process per pod)."""

    def __init__(self, cluster):
        pki = cluster.dir / "pki"
        self.port = cluster.state["ports"]["api"]
        self.ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self.local = threading.local()

    def request(self, method, path, body=None):
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPSConnection(
                "127.0.0.1", self.port, context=self.ctx, timeout=30)
        data = json.dumps(body).encode() if body is not None else None
        try:
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, json.loads(r.read() or b"{}")
        except (OSError, http.client.HTTPException):
            self.local.conn = None
            raise

    def create_pod(self, namespace, obj):
        return self.request("POST", f"/api/v1/namespaces/{namespace}/pods", obj)


def make_quota(kube, namespace):
    kube.run("apply", "-f", "-", input={
        "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "gpu", "namespace": namespace},
        "spec": {"hard": {"gpu": "8"}}})
    wait_for("the GPUQuota counted", lambda: quota_status(kube, namespace).get("used"))


def quota_status(kube, namespace):
    return kube.get("gpuquotas", "gpu", namespace).get("status", {})


def held(kube, namespace):
    """The charges (milli-GPU) of the pods that exist in namespace."""
    return [int(p["metadata"]["annotations"]["gpuguard.io/charge"])
            for p in kube.items("pods", namespace)]


def burst(api, namespace, count=BURST, during=None):
    """count pods from CLIENTS concurrent clients, kinds interleaved; during(i) runs before
    creation i (to kill a replica).  The HTTP statuses, in order of creation."""
    statuses = [None] * count

    def create(i):
        if during:
            during(i)
        try:
            statuses[i] = api.create_pod(namespace, pod(i))[0]
        except (OSError, http.client.HTTPException):
            statuses[i] = 0
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(create, range(count)))
    return statuses


def writes_by_replica(gpuguard, namespace):
    """The ledger writes each gpuguard process made for namespace (ok and conflict)."""
    out = []
    for port in gpuguard.cluster.state["ports"]["ops"]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        out.append(sum(float(v) for v in re.findall(
            rf'^gpuguard_quota_ledger_writes_total\{{namespace="{namespace}",result="(?:ok|conflict)"\}} (\S+)$',
            text, re.M)))
    return out


@pytest.fixture(scope="module")
def api(cluster):
    if cluster.state["replicas"] < 3:
        pytest.fail("the ledger is tested with three gpuguard processes: `make cluster-down`, "
                    "then `make e2e` (REPLICAS=3)")
    return Api(cluster)


def test_a_burst_from_twenty_clients_fills_the_quota_exactly(kube, gpuguard, api, namespace):
    make_quota(kube, namespace)
    statuses = burst(api, namespace)
    charges = held(kube, namespace)
    assert sum(charges) <= HARD, f"over the quota: {sum(charges)} of {HARD}"
    assert HARD - sum(charges) < SMALLEST, f"room left for another pod: {sum(charges)} of {HARD}"
    assert statuses.count(201) == len(charges)
    assert set(statuses) <= {201, 403}, statuses
    assert sum(1 for w in writes_by_replica(gpuguard, namespace) if w > 0) >= 2
    # The ledger agrees with what exists once the controller has seen the pods.
    wait_for("the ledger settled", lambda: quota_status(kube, namespace).get("entries") == []
             and quota_status(kube, namespace)["used"]["gpu"] == f"{sum(charges) / 1000:.3f}",
             timeout=BOUND_S + 30)
    record("ledger_burst", {"pods": BURST, "clients": CLIENTS, "admitted": len(charges),
                            "used_milli": sum(charges), "hard_milli": HARD})


def test_a_replica_killed_in_the_burst_lets_nothing_over(kube, gpuguard, api, namespace, cluster):
    make_quota(kube, namespace)
    victim = cluster.gpuguard_names()[1]

    def kill_midway(i):
        if i == BURST // 3:
            cluster.kill(victim)
    try:
        statuses = burst(api, namespace, during=kill_midway)
        charges = held(kube, namespace)
        assert sum(charges) <= HARD, f"over the quota: {sum(charges)} of {HARD}"
        assert statuses.count(201) == len(charges)
    finally:
        cluster.restart_gpuguard()
    record("ledger_burst_replica_killed", {"admitted": len(charges), "used_milli": sum(charges),
                                           "failed_calls": sum(1 for s in statuses
                                                               if s not in (201, 403))})


class Refuser(OwnWebhook):
    """A validating webhook that refuses every fifth pod it is asked about."""
    seen = 0
    lock = threading.Lock()

    def answer(self, request):
        with Refuser.lock:
            Refuser.seen += 1
            refuse = Refuser.seen % 5 == 0
        if refuse:
            return {"allowed": False, "status": {"code": 403, "message": "every fifth"}}
        return {"allowed": True}


@pytest.fixture
def refuser(cluster, kube, namespace):
    """The refusing webhook, for namespace only."""
    server, client = serve_test_webhook(cluster, Refuser)
    name = f"refuse-every-fifth-{namespace}"
    kube.run("apply", "-f", "-", input={
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "refuse.e2e.gpuguard.io", "admissionReviewVersions": ["v1"],
            "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 5,
            "clientConfig": client,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}]})
    time.sleep(2)  # the API server's webhook configuration cache
    yield
    kube.run("delete", "validatingwebhookconfiguration", name, check=False)
    server.shutdown()


def test_pods_refused_after_gpuguard_admitted_them_leave_the_ledger_within_its_bound(
        kube, gpuguard, api, namespace, refuser):
    make_quota(kube, namespace)
    statuses = [api.create_pod(namespace, pod(3 * i))[0] for i in range(10)]  # whole GPUs
    assert statuses.count(403) >= 2  # the refuser's fifth and tenth
    charges = held(kube, namespace)
    t0 = time.monotonic()
    wait_for("the ledger back to the pods that exist",
             lambda: quota_status(kube, namespace).get("entries") == []
             and quota_status(kube, namespace)["used"]["gpu"] == f"{sum(charges) / 1000:.3f}",
             timeout=BOUND_S + 30)
    record("ledger_refused_settled_s", round(time.monotonic() - t0, 1))


def test_without_the_ledger_the_same_burst_goes_over(kube, api, namespace, cluster):
    """A figure, not a verdict: how far the replicas' own views let the burst over the quota
    when the ledger is off (the previous behaviour)."""
    cluster.restart_gpuguard(flags=["--quota-ledger", "off"])
    try:
        kube.run("apply", "-f", "-", input={
            "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUQuota",
            "metadata": {"name": "gpu", "namespace": namespace}, "spec": {"hard": {"gpu": "8"}}})
        statuses = burst(api, namespace)
        charges = held(kube, namespace)
        assert set(statuses) <= {201, 403}, statuses
        assert statuses.count(201) == len(charges)
    finally:
        cluster.restart_gpuguard(flags=[])
    record("no_ledger_burst", {"admitted": len(charges), "used_milli": sum(charges),
                               "hard_milli": HARD, "over_milli": max(0, sum(charges) - HARD)})


def creation_latencies(api, kube, namespace, count, ledger):
    kube.run("apply", "-f", "-", input={
        "apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "gpu", "namespace": namespace}, "spec": {"hard": {"gpu": "10000"}}})
    if ledger:  # without it no controller counts
        wait_for("the GPUQuota counted", lambda: quota_status(kube, namespace).get("used"))
    out = []
    for i in range(count):
        t0 = time.perf_counter()
        status, _ = api.create_pod(namespace, pod(3 * i + 1))  # MIG slices: charged, admitted
        out.append(time.perf_counter() - t0)
        assert status == 201
    return out


def test_the_latency_the_ledger_adds_to_a_gpu_pods_creation(kube, api, cluster):
    """1,000 sequential creations through the API server, with and without the ledger: p50 and
    p99 of the client's wall time (a figure; a loaded machine makes it noisy)."""
    figures = {}
    for mode in ("on", "off"):
        cluster.restart_gpuguard(flags=["--quota-ledger", mode])
        ns = make_namespace(kube, f"e2e-latency-{mode}")
        try:
            times = sorted(creation_latencies(api, kube, ns, 1000, mode == "on"))
        finally:
            kube.run("delete", "namespace", ns, "--wait=false", check=False)
        figures[f"ledger_{mode}"] = {"p50_ms": round(statistics.median(times) * 1000, 2),
                         "p99_ms": round(times[int(len(times) * 0.99) - 1] * 1000, 2)}
    cluster.restart_gpuguard(flags=[])
    record("ledger_latency", figures)
