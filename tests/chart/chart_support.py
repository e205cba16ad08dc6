"""What the chart's tests (`make chart-test`) use: the helm built here (`make helm-bin`), POSTs
to the API server, GPU pods, and a steady stream of them to count failed reviews.  The fixtures
are in conftest.py; this module has a name of its own so that tests import it, not a conftest."""

import json
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent.parent
sys.path[:0] = [str(REPO / "tests" / "k8s")]

NAMESPACE = "gpuguard-system"
PAUSE = 0.01  # seconds between Load's requests
RELEASE = "gpuguard"

def wait(what, check, timeout=120, interval=0.25):
    """check() until it is truthy (its value), at most timeout seconds, else the test fails."""
    end = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > end:
            pytest.fail(f"{what}: not after {timeout} s")
        time.sleep(interval)


class Helm:
    def __init__(self, cluster):
        self.cluster = cluster
        self.bin = cluster.bin / "helm"

    def run(self, *args, check=True):
        r = subprocess.run([str(self.bin), "--kubeconfig", str(self.cluster.kubeconfig), *args],
                           capture_output=True, text=True, timeout=300)
        if check and r.returncode:
            pytest.fail(f"helm {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
        return r


class Api:
    """POSTs to the API server as the admin, for many requests without a kubectl each: the
    answer's status and body."""

    def __init__(self, cluster):
        pk = cluster.dir / "pki"
        self.base = f"https://127.0.0.1:{cluster.state['ports']['api']}"
        self.ctx = ssl.create_default_context(cafile=str(pk / "ca.crt"))
        self.ctx.load_cert_chain(str(pk / "admin.crt"), str(pk / "admin.key"))

    def post(self, path, body):
        rq = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                    headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(rq, context=self.ctx, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def create_pod(self, pod, dry_run=False):
        ns = pod["metadata"]["namespace"]
        return self.post(f"/api/v1/namespaces/{ns}/pods" + ("?dryRun=All" if dry_run else ""),
                         pod)


def gpu_pod(namespace, name=None, labels=None, gpus=1):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name or f"p-{uuid.uuid4().hex[:8]}", "namespace": namespace,
                         "labels": {"team": "ml", **(labels or {})}},
            "spec": {"containers": [{"name": "c", "image": "cuda",
                                     "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}}


class Load:
    """Dry-run GPU pods sent through the API server, one after another on a thread, while a test
    changes something: every answer is counted, and any but a decision (201 admitted, 403 denied
    by a webhook) is kept as a failure.  The webhooks are Fail: a review that fails is a 500.
    A pause between requests leaves the 2-core machine's kwok its node heartbeats (nodes that
    miss them go NotReady, and their pods with them)."""

    def __init__(self, api, namespace):
        self.api, self.ns = api, namespace
        self.stop_flag = threading.Event()
        self.sent, self.failed = 0, []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop_flag.is_set():
            status, body = self.api.create_pod(gpu_pod(self.ns), dry_run=True)
            self.sent += 1
            message = body.get("message", "")
            if status != 201 and not (status == 403 and "denied the request" in message):
                self.failed.append((status, message or body))
            self.stop_flag.wait(PAUSE)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_flag.set()
        self.thread.join(60)


def kubectl_json(cluster, *args):
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


def apply(cluster, *objs):
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objs, sort_keys=False))


def publish_ready_endpoint(cluster):
    """A ready endpoint for gpuguard's Service, as the endpointslice controller publishes one
    for a ready pod; gpuguard waits for it before it sets its webhooks to Fail.  (Not a pod run
    by kwok: this control plane's kwok nodes miss a heartbeat for a few seconds every minute,
    and the node controller then marks their pods not ready for good.)"""
    apply(cluster, {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "gpuguard-ready", "namespace": NAMESPACE,
                     "labels": {"kubernetes.io/service-name": RELEASE,
                                "endpointslice.kubernetes.io/managed-by": "chart-test"}},
        "addressType": "IPv4", "ports": [{"name": "https", "port": 8443, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.244.0.9"], "conditions": {"ready": True}}]})


def unpublish_ready_endpoint(cluster):
    cluster.kubectl("delete", "endpointslice", "gpuguard-ready", "-n", NAMESPACE,
                    "--ignore-not-found")
