"""The chart with a certificate of the user's own (certs.mode provided, made by `gpuguard certs`):
the webhooks ship Ignore with the user's CA, and gpuguard sets them Fail once it serves a
certificate that CA signed and its Service has a ready endpoint, so that this install, too,
never refuses pods while gpuguard starts.  The Deployment is installed scaled to 0, so that the
Service has no endpoint until the test publishes one (chart_support.publish_ready_endpoint).
Runs after test_install.py, whose release is gone by then."""

import base64
import subprocess

import pytest

from chart_support import (NAMESPACE, RELEASE, REPO, apply, gpu_pod, kubectl_json,
                           publish_ready_endpoint, unpublish_ready_endpoint, wait)
from podrun import Deployment

CHART = REPO / "charts" / "gpuguard"
NS = "chart-provided"


def policies(cluster):
    cfg = kubectl_json(cluster, "get", "validatingwebhookconfiguration", RELEASE)
    return {h["failurePolicy"] for h in cfg["webhooks"]}, cfg


@pytest.fixture(scope="module")
def release(cluster, helm, tmp_path_factory):
    out = tmp_path_factory.mktemp("certs")
    subprocess.run([str(cluster.gpuguard), "certs", "--service", "gpuguard", "--namespace",
                    NAMESPACE, "--out", str(out)], check=True, capture_output=True)
    apply(cluster, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
          {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    cluster.kubectl("create", "secret", "tls", "gpuguard-tls", "-n", NAMESPACE,
                    "--cert", out / "tls.crt", "--key", out / "tls.key")
    ca = base64.b64encode((out / "ca.crt").read_bytes()).decode()
    helm.run("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "replicaCount=0",
             "--set", "certs.mode=provided", "--set", f"certs.caBundle={ca}")
    dep = Deployment(cluster, NAMESPACE, RELEASE)
    yield dep, ca
    dep.stop()
    helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
    cluster.kubectl("delete", "secret", "gpuguard-tls", "-n", NAMESPACE)
    unpublish_ready_endpoint(cluster)


def test_the_webhooks_wait_for_gpuguard_then_fail_closed(cluster, release, api):
    dep, ca = release
    got, cfg = policies(cluster)
    assert got == {"Ignore"}
    assert {h["clientConfig"]["caBundle"] for h in cfg["webhooks"]} == {ca}
    status, body = api.create_pod(gpu_pod(NS), dry_run=True)
    assert status == 201, body  # nothing answers yet: admitted unreviewed, not refused
    dep.start(replicas=1)  # serving, but no endpoint of the Service is ready
    log = cluster.dir / "logs" / f"{dep.running[0][0]}.log"
    wait("gpuguard waiting for an endpoint",
         lambda: "failurePolicy Fail waits for a ready endpoint" in log.read_text())
    assert policies(cluster)[0] == {"Ignore"}
    publish_ready_endpoint(cluster)
    wait("failurePolicy Fail once the Service has a ready endpoint",
         lambda: policies(cluster)[0] == {"Fail"})
    _, cfg = policies(cluster)
    assert {h["clientConfig"]["caBundle"] for h in cfg["webhooks"]} == {ca}, "the user's CA kept"
    status, body = api.create_pod(gpu_pod(NS, "trainer"))
    assert status == 201, body
    stored = kubectl_json(cluster, "get", "pod", "trainer", "-n", NS)
    assert "gpuguard.io/decision" in stored["metadata"]["annotations"]
