"""Right-sizing in the cluster, from a real Prometheus (Debian's, its history backfilled by
tests/integration/dcgm_prometheus.py: the chat Deployment of namespace ml peaked at 7,270 MiB on
a whole GPU over 26 hours).  gpuguard runs on the e2e fleet with a rightsizing: section pointing
at it, restarted for each mode (the usage source is read at start), and on its own configuration
again afterwards.

Under deploy/gpuguard.yaml the class inference gives a whole GPU as a whole L4 (l4-infer); 9 GiB
is cheapest as a 1g.10gb slice on a100-mig (0.143 x cost 2, against 0.375 of a shared L4):
recommend says so and leaves the pods on the L4s; apply patches the template as `gpuguard check
--usage FILE --emit-mutated` does, and the pods it makes run on the A100 MIG nodes."""

import json
import re
import subprocess
import sys
import urllib.request

import pytest
import yaml

from e2e_support import REPO, node_pool, wait_for

sys.path.insert(0, str(REPO / "tests" / "integration"))
from dcgm_prometheus import serving  # noqa: E402

NAMESPACE = "ml"  # the namespace of the backfilled history
CLASS = "gpuguard.io/workload-class"

CHAT = {
    "apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": "chat", "labels": {"team": "ml"}},
    "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "chat"}},
             "template": {"metadata": {"labels": {"app": "chat", "team": "ml", CLASS: "inference"}},
                          "spec": {"containers": [{"name": "server", "image": "vllm/vllm-openai:v0.6.3",
                                                   "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}},
}
RECOMMENDATION = ("used at most 7.1 GiB of 24 over 26 hours; mig-1g.10gb would hold it: set "
                  "gpuguard.io/gpu-memory: 9Gi")
APPLIED = ("applied gpuguard.io/gpu-memory: 9Gi: used at most 7.1 GiB of 24 over 26 hours, "
           "mig-1g.10gb holds it")


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("prometheus")) as p:
        yield p


@pytest.fixture(scope="module")
def ml(kube):
    """Namespace ml, which the history names; deleted after the module."""
    wait_for("namespace ml gone from an earlier run", lambda: kube.run(
        "get", "namespace", NAMESPACE, check=False).returncode != 0)
    kube.run("create", "namespace", NAMESPACE)
    wait_for("namespace ml's default ServiceAccount", lambda: kube.run(
        "get", "serviceaccount", "default", "-n", NAMESPACE, check=False).returncode == 0)
    yield NAMESPACE
    kube.run("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def readyz(cluster):
    texts = []
    for port in cluster.state["ports"]["ops"]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            texts.append(r.read().decode())
    return texts


@pytest.fixture(scope="module")
def rightsizing(cluster, gpuguard, prom):
    """A function that restarts gpuguard with rightsizing in a mode, once its data is in; the
    cluster's own configuration again after the module."""
    original = gpuguard.config.read_text()

    def run(mode):
        cfg = yaml.safe_load(original)
        cfg["rightsizing"].update(prometheus={"url": prom.url, "timeout": "2s"}, mode=mode,
                                  refresh="2s")
        cluster.restart_gpuguard(yaml.safe_dump(cfg, sort_keys=False))
        wait_for("gpuguard's rightsizing data", lambda: all(
            any(line.startswith("rightsizing: ok") for line in t.splitlines())
            for t in readyz(cluster)))
    yield run
    cluster.restart_gpuguard(original)


def template_warnings(stderr):
    """The rightsizing warnings kubectl printed for the Deployment's template."""
    prefix = "Warning: spec.template: "
    return [line[len(prefix):] for line in stderr.splitlines()
            if line.startswith(prefix + "rightsizing:")]


def shows(shown, full):
    """Is shown the message full, or full cut to the API server's length with an ellipsis?"""
    return shown == full or (shown.endswith("…") and full.startswith(shown[:-1]))


def pods_running_on(kube, pool):
    pods = kube.items("pods", NAMESPACE, "app=chat")
    if len(pods) != 2 or not all(p.get("status", {}).get("phase") == "Running" for p in pods):
        return None
    assert {node_pool(kube, p["spec"]["nodeName"]) for p in pods} == {pool}
    return pods


def test_recommend_then_apply_moves_the_deployment_onto_a100_slices(kube, gpuguard, ml, rightsizing,
                                                                   prom, tmp_path, ignored_namespace):
    # recommend: a warning on the Deployment and on each pod; the pods stay on whole L4s.
    rightsizing("recommend")
    saved = tmp_path / "usage.json"  # what check replays below, on the same configuration
    r = subprocess.run([gpuguard.binary, "usage", "--config", str(gpuguard.config), "-o", str(saved)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = kube.run("apply", "-n", ml, "-f", "-", input=CHAT)
    shown = template_warnings(r.stderr)
    assert len(shown) == 1 and shows(shown[0], "rightsizing: " + RECOMMENDATION), r.stderr
    pods = wait_for("chat's pods running on l4-infer", lambda: pods_running_on(kube, "l4-infer"))
    for p in pods:
        assert p["metadata"]["annotations"]["gpuguard.io/recommendation"] == RECOMMENDATION
        assert p["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    kube.run("delete", "deployment", "chat", "-n", ml, "--wait=true")
    wait_for("chat's pods gone", lambda: not kube.items("pods", ml, "app=chat"))

    # apply: the template as check --usage writes it, and pods on the A100 MIG nodes.
    rightsizing("apply")
    emitted = gpuguard.check(yaml.safe_dump(CHAT), NAMESPACE, "--usage", str(saved), "--emit-mutated")
    assert emitted.returncode == 0, emitted.stderr
    want = yaml.safe_load(emitted.stdout)
    assert want["spec"]["template"]["metadata"]["annotations"]["gpuguard.io/recommendation"] == APPLIED
    want["metadata"].pop("namespace", None)
    defaulted = kube.create(want, ignored_namespace)  # the API server's defaults of check's answer
    r = kube.run("apply", "-n", ml, "-f", "-", input=CHAT)
    shown = template_warnings(r.stderr)
    assert len(shown) == 1 and shows(shown[0], "rightsizing: " + APPLIED), r.stderr
    stored = kube.get("deployment", "chat", ml)
    assert stored["spec"]["template"] == defaulted["spec"]["template"]
    pods = wait_for("chat's pods running on a100-mig", lambda: pods_running_on(kube, "a100-mig"))
    for p in pods:
        assert p["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
        assert p["metadata"]["annotations"]["gpuguard.io/pool"] == "a100-mig"


def workload(kind, name, replicas, cls, limits, annotations=None):
    template = {"metadata": {"labels": {"app": name, "team": "ml", CLASS: cls},
                             "annotations": annotations or {}},
                "spec": {"containers": [{"name": "main", "image": "registry.example/serve:1",
                                         "resources": {"limits": limits}}]}}
    spec = {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template}
    if kind == "StatefulSet":
        spec["serviceName"] = name
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


# The running workloads of namespace ml against the backfilled history, by hand (charges in
# GPU-equivalents, peak x headroom 1.25, the cheapest allocation by pools[].cost):
#   chat   2 pods on whole L4s (2.000); peak 7,270 MiB -> 9,088: mig-1g.10gb, 0.143 a pod (0.286)
#   vec    1 pod on a whole L4 (1.000); peak 3,000 -> 3,750: a quarter of a time-sliced L4 (0.250,
#          cost 0.25) rather than mig-1g.10gb (0.143 x cost 2)
#   embed  1 pod asking for 19Gi: mig-1g.20gb (0.143); peak 15,000 -> 18,750: the same, right-sized
#   lab    2 pods on quarters of a time-sliced L4 (0.500): the device's memory is not a pod's,
#          no history
WASTE = {"requested": 3.143, "needed": 0.679, "waste": 2.464, "unknown": 0.5}
WORKLOADS = [workload("Deployment", "chat", 2, "inference", {"nvidia.com/gpu": 1}),
             workload("Deployment", "vec", 1, "inference", {"nvidia.com/gpu": 1}),
             workload("StatefulSet", "embed", 1, "inference", {},
                      {"gpuguard.io/gpu-memory": "19Gi"}),
             workload("Deployment", "lab", 2, "interactive", {},
                      {"gpuguard.io/gpu-fraction": "0.25"})]


def leader_waste(gpuguard):
    """The leader's gpuguard_rightsizing_*_gpus{namespace="ml"}, or None before its audit."""
    text = gpuguard.metrics()
    got = {}
    for figure in WASTE:
        values = re.findall(rf'^gpuguard_rightsizing_{figure}_gpus\{{namespace="ml"\}} (\S+)$',
                            text, re.M)
        got[figure] = float(values[0]) if len(values) == 1 else None
    return got if None not in got.values() else None


def test_the_waste_of_the_running_workloads_from_their_history(kube, gpuguard, ml, rightsizing,
                                                                prom, tmp_path, cluster):
    kube.run("delete", "deployments,statefulsets", "--all", "-n", ml, "--wait=true")
    wait_for("ml's pods gone", lambda: not kube.items("pods", ml))
    rightsizing("recommend")
    for w in WORKLOADS:
        kube.run("apply", "-n", ml, "-f", "-", input=w)
    wait_for("ml's 6 pods running", lambda: len([
        p for p in kube.items("pods", ml) if p.get("status", {}).get("phase") == "Running"]) == 6)
    # An audit now (a reload starts one), and the leader's figures.
    from cluster import write_atomic
    write_atomic(gpuguard.config, gpuguard.config.read_text() + "\n")
    # (An audit from before every pod ran may have published figures of its own: the one the
    # reload started, which saw them all, gives these.)
    def figures():
        shown = leader_waste(gpuguard)
        if shown != WASTE:
            raise ValueError(f"the leader shows {shown}")
        return True
    wait_for(f"the audit's figures for ml: {WASTE}", figures)
    # gpuguard report, offline, from a dump of the cluster and the saved history: the same.
    state, usage = tmp_path / "state.json", tmp_path / "usage.json"
    state.write_text(kube.run("get", "pods,resourceclaims,resourceclaimtemplates,deviceclasses",
                              "-A", "-o", "json").stdout)
    r = subprocess.run([gpuguard.binary, "usage", "--config", str(gpuguard.config), "-o", str(usage)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([gpuguard.binary, "report", "--config", str(gpuguard.config), "--policies",
                        str(REPO / "policies"), "--lua", str(REPO / "lua"), "--cluster-state",
                        str(state), "--usage", str(usage), "-o", "json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    ns = report["namespaces"]["ml"]
    assert (ns["held_gpus"], ns["needed_gpus"], ns["waste_gpus"], ns["without_history"]) == (
        3.643, WASTE["needed"], WASTE["waste"], 1)
    # The workloads' reports carry their rightsizing results.
    reports = {r["scope"]["name"]: r for r in kube.items("policyreports", ml)
               if r["scope"]["kind"] in ("Deployment", "StatefulSet")}
    chat = next(x for x in reports["chat"]["results"] if x["policy"] == "rightsizing")
    assert chat["result"] == "warn" and chat["properties"]["waste_gpus"] == "1.714"
    assert chat["message"].startswith("2 running pods hold 2.000 GPU-equivalents; their usage "
                                      "history needs 0.286: used at most 7.1 GiB")
    embed = next(x for x in reports["embed"]["results"] if x["policy"] == "rightsizing")
    assert embed["result"] == "pass" and embed["properties"]["waste_gpus"] == "0.000"
    lab = next(x for x in reports["lab"]["results"] if x["policy"] == "rightsizing")
    assert lab["result"] == "skip"
    # ml runs 3.643 of its 4 GPUs: a workload's template is not one more pod on top of its own.
    for name, report in reports.items():
        quota = [x["result"] for x in report["results"] if x["policy"] == "gpu-quota"]
        assert quota == ["pass"], (name, report["results"])
