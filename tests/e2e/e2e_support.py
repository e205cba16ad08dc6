"""What the end-to-end tests use to talk to the local control plane (tests/k8s/cluster.py): kubectl
(the one built here) on its admin kubeconfig, gpuguard's metrics, logs and `check` on the
configuration the cluster runs, and waits bounded for a loaded machine.  The fixtures are in
conftest.py; this module has a name of its own so that tests import it, not a conftest."""

import base64
import http.server
import json
import os
import re
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

import conftest  # tests/conftest.py, loaded by pytest before this package's: its wait_for

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "tests" / "k8s"))
FLEET = REPO / "tests" / "e2e" / "fleet.yaml"

WAIT = 120  # seconds for the cluster to do something (schedule, run, relist); a loaded machine


class KubectlError(AssertionError):
    """kubectl failed: a test fails with its message, and a wait tries again."""


def wait_for(what, check, timeout=WAIT, interval=0.25):
    """conftest.wait_for(check), failing the test naming what.  A kubectl that fails or times
    out meanwhile, or an object not there yet, is tried again; other errors end the wait."""
    last = []

    def attempt():
        try:
            return check()
        except (KubectlError, subprocess.TimeoutExpired, KeyError, ValueError) as e:
            last[:] = [e]
            return None
    got = conftest.wait_for(attempt, timeout, interval)
    if not got:
        pytest.fail(f"{what}: not after {timeout} s" + (f" (last: {last[0]})" if last else ""))
    return got


class Kube:
    """The cluster's kubectl (Cluster.kubectl): objects as input, failures as KubectlError."""

    def __init__(self, cluster):
        self.cluster = cluster

    def run(self, *args, input=None, check=True):
        if input is not None and not isinstance(input, str):
            input = yaml.safe_dump_all(input if isinstance(input, list) else [input],
                                       sort_keys=False)
        r = self.cluster.kubectl(*args, input=input, check=False)
        if check and r.returncode != 0:
            raise KubectlError(f"kubectl {' '.join(map(str, args))} exited {r.returncode}: "
                                 f"{r.stderr.strip()}")
        return r

    def json(self, *args):
        return json.loads(self.run(*args, "-o", "json").stdout)

    def get(self, kind, name, namespace=None):
        return self.json("get", kind, name, *(["-n", namespace] if namespace else []))

    def items(self, kind, namespace, selector=None):
        args = ["get", kind, "-n", namespace] + (["-l", selector] if selector else [])
        return self.json(*args)["items"]

    def create(self, obj, namespace=None, check=True):
        """kubectl create -o json: the object as the API server stored it at creation."""
        args = ["create", "-o", "json", "-f", "-"] + (["-n", namespace] if namespace else [])
        r = self.run(*args, input=obj, check=check)
        return json.loads(r.stdout) if r.returncode == 0 else r

    def post(self, path, body):
        """POST body to an API path (a subresource kubectl has no verb for); the answer."""
        return json.loads(self.run("create", "--raw", path, "-f", "-", input=json.dumps(body)).stdout)


class Gpuguard:
    """The gpuguard processes of the cluster: metrics, logs, the config they run."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.config = cluster.dir / "gpuguard" / "gpuguard.yaml"
        self.binary = os.environ.get("GPUGUARD_BIN", str(REPO / "build" / "gpuguard"))

    def metrics(self):
        text = ""
        for port in self.cluster.state["ports"]["ops"]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                text += r.read().decode()
        return text

    def metric(self, name):
        """A metric summed over every process and label set."""
        return sum(float(m) for m in re.findall(
            rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", self.metrics(), re.M))

    def requests(self):
        """Admission reviews answered, all processes and endpoints."""
        return self.metric("gpuguard_admission_requests_total")

    def log_lines(self):
        """Every JSON line of every gpuguard process's log, in time order."""
        out = []
        for name in self.cluster.gpuguard_names():
            for line in (self.cluster.dir / "logs" / f"{name}.log").read_text(
                    errors="replace").splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return sorted(out, key=lambda l: l.get("ts", ""))

    def decisions(self, namespace):
        return [l for l in self.log_lines()
                if l.get("msg") == "decision" and l.get("namespace") == namespace]

    def check(self, manifest_text, namespace, *flags):
        """gpuguard check on the same configuration as the server: (returncode, stdout, stderr)."""
        r = subprocess.run([self.binary, "check", "--config", str(self.config), "--policies",
                            str(REPO / "policies"), "--lua", str(REPO / "lua"),
                            "--namespace", namespace, *flags, "-"],
                           input=manifest_text, capture_output=True, text=True, timeout=60)
        return r


def make_namespace(kube, prefix, labels=None):
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kube.run("apply", "-f", "-", input={"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": name, "labels": labels or {}}})
    # Pods can be created once the service account controller has made the default account.
    wait_for(f"namespace {name}'s default ServiceAccount", lambda: kube.run(
        "get", "serviceaccount", "default", "-n", name, check=False).returncode == 0)
    return name


def claim_template(name, devices=1):
    """A ResourceClaimTemplate for whole GPUs of NVIDIA's DRA driver (the fleet's a100-dra)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": devices}}]}}}}


def claim_pod(name, template):
    """A pod whose one container holds the claim made from template."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"team": "e2e"}},
            "spec": {"containers": [{"name": "main", "image": "registry.example/cuda:12",
                                     "resources": {"claims": [{"name": "gpus"}]}}],
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}]}}


def pod_running(kube, namespace, name):
    pod = kube.get("pod", name, namespace)
    return pod if pod.get("status", {}).get("phase") in ("Running", "Succeeded") else None


def node_pool(kube, node_name):
    return kube.get("node", node_name)["metadata"]["labels"].get("gpuguard.io/pool")


def settled_requests(gpuguard, quiet=3):
    """gpuguard's request count once nothing has reached it for quiet seconds (the
    controllers' follow-up writes come within one)."""
    last = gpuguard.requests()
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = gpuguard.requests()
        if now == last:
            return now
        last = now
    pytest.fail(f"gpuguard kept getting requests for {WAIT} s")


class OwnWebhook(http.server.BaseHTTPRequestHandler):
    """An admission webhook of a test's own: answer(request) gives the response's fields beyond
    uid (allowed, patch, status)."""

    def answer(self, request):
        raise NotImplementedError

    def do_POST(self):
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        resp = {"uid": review["request"]["uid"], **self.answer(review["request"])}
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "response": resp}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve_test_webhook(cluster, handler):
    """handler (a OwnWebhook) on 127.0.0.1 over TLS with gpuguard's serving certificate: the
    server (shutdown() when done) and the clientConfig that reaches it."""
    certs = cluster.dir / "gpuguard"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs / "tls.crt", certs / "tls.key")
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = {"url": f"https://127.0.0.1:{server.server_address[1]}/",
              "caBundle": base64.b64encode((certs / "ca.crt").read_bytes()).decode()}
    return server, client
