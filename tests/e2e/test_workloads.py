"""Workloads through their controllers, for every class of the shipped configuration: the
workloads webhooks patch the template, the API server's validation accepts the patched object,
the controllers make pods, the pod webhooks see them and they run on the decided pool.

No operator runs here (and a CRD of the tests' own would validate nothing), so for the operator
kinds gpuguard admits, each template `gpuguard check --emit-mutated` patches is sent to the API
server with dryRun=All as the object its operator makes of it (a Notebook's and a
LeaderWorkerSet's as StatefulSets, a KServe InferenceService's as a Deployment, a PyTorchJob's
and a RayService's as Pods), in a namespace gpuguard leaves out: the API server's validation
alone judges gpuguard's patch."""

import copy
import json

import pytest
import yaml

from e2e_support import REPO, node_pool, wait_for

CLASSES = ["training", "inference", "interactive", "batch"]
CLASS = "gpuguard.io/workload-class"
IMAGE = "registry.example/cuda:12"


def template(name, cls, restart=None):
    spec = {"containers": [{"name": "main", "image": IMAGE,
                            "resources": {"limits": {"nvidia.com/gpu": 1}}}]}
    if restart:
        spec["restartPolicy"] = restart
    return {"metadata": {"labels": {"app": name, "team": "e2e", CLASS: cls}}, "spec": spec}


def controller(kind, name, cls):
    meta = {"name": name, "labels": {"team": "e2e"}}
    sel = {"matchLabels": {"app": name}}
    if kind == "Deployment":
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": meta,
                "spec": {"replicas": 1, "selector": sel, "template": template(name, cls)}}
    if kind == "ReplicaSet":
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": meta,
                "spec": {"replicas": 1, "selector": sel, "template": template(name, cls)}}
    if kind == "StatefulSet":
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": meta,
                "spec": {"replicas": 1, "serviceName": name, "selector": sel,
                         "template": template(name, cls)}}
    if kind == "DaemonSet":
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": meta,
                "spec": {"selector": sel, "template": template(name, cls)}}
    if kind == "Job":
        return {"apiVersion": "batch/v1", "kind": kind, "metadata": meta,
                "spec": {"template": template(name, cls, "Never")}}
    assert kind == "CronJob"
    return {"apiVersion": "batch/v1", "kind": kind, "metadata": meta,
            "spec": {"schedule": "0 0 1 1 *", "jobTemplate": {"spec": {
                "template": template(name, cls, "Never")}}}}


PLURAL = {"Deployment": "deployment", "ReplicaSet": "replicaset", "StatefulSet": "statefulset",
          "DaemonSet": "daemonset", "Job": "job", "CronJob": "cronjob"}


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("kind", list(PLURAL))
def test_controller_workload_is_patched_accepted_and_its_pods_run_on_the_pool(kind, cls, kube,
                                                                             gpuguard, namespace):
    name = f"{kind.lower()}-{cls}"
    obj = controller(kind, name, cls)
    r = kube.run("apply", "-n", namespace, "-f", "-", input=obj, check=False)
    assert r.returncode == 0, r.stderr  # the API server accepted gpuguard's patch of it

    stored = kube.get(PLURAL[kind], name, namespace)
    tpl = stored["spec"]["jobTemplate"]["spec"]["template"] if kind == "CronJob" else stored["spec"]["template"]
    pool = tpl["metadata"]["annotations"]["gpuguard.io/pool"]
    seen = {(d["endpoint"], d["operation"]) for d in gpuguard.decisions(namespace) if d.get("name") == name}
    assert {("mutate", "CREATE"), ("validate", "CREATE")} <= seen

    if kind == "CronJob":
        kube.run("create", "job", f"{name}-now", f"--from=cronjob/{name}", "-n", namespace)

    def pods_running():
        denied = [d["message"] for d in gpuguard.decisions(namespace) if d.get("verdict") == "denied"]
        assert not denied, f"{kind} {name}'s pods were denied: {denied[0]}"
        pods = kube.items("pods", namespace, f"app={name}")
        return pods if pods and all(p.get("status", {}).get("phase") in ("Running", "Succeeded")
                                    for p in pods) else None
    pods = wait_for(f"{kind} {name}'s pods running", pods_running)
    for p in pods:
        assert p["metadata"]["annotations"]["gpuguard.io/pool"] == pool
        assert node_pool(kube, p["spec"]["nodeName"]) == pool
    # The pod webhooks saw each pod: its own decision, at its creation.
    decided = {d["name"] for d in gpuguard.decisions(namespace)
               if d.get("endpoint") == "validate" and d.get("operation") == "CREATE"}
    assert {p["metadata"]["name"] for p in pods} <= decided


# The operator kinds: a manifest, and the kind its operator makes of each template.
OPERATORS = {
    "notebook.yaml": "StatefulSet",
    "lws-vllm.yaml": "StatefulSet",
    "kserve-isvc.yaml": "Deployment",
    "pytorchjob-ddp.yaml": "Pod",
    "rayservice-llm.yaml": "Pod",
}
# The interactive class (time-slicing, one replica at most) refuses these multi-GPU workloads
# (a template of each is denied, so the API server never gets the object).
DENIED = {("lws-vllm.yaml", "interactive"), ("pytorchjob-ddp.yaml", "interactive"),
          ("rayservice-llm.yaml", "interactive")}
MANIFESTS = REPO / "tests" / "policies" / "workloads" / "manifests"


def at_pointer(doc, pointer):
    for part in pointer.lstrip("/").split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


# KServe's component fields that are not a PodSpec's, its model specs (each becomes the container
# kserve-container) and a model spec's fields that are not a container's (KServe's API types).
KSERVE_NOT_POD = {"minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "scaleMetricType",
                  "autoScaling", "containerConcurrency", "timeout", "canaryTrafficPercent", "logger",
                  "batcher", "labels", "annotations", "deploymentStrategy", "workerSpec"}
KSERVE_MODELS = ["model", "sklearn", "xgboost", "tensorflow", "pytorch", "triton", "onnx",
                 "huggingface", "pmml", "lightgbm", "paddle"]
KSERVE_NOT_CONTAINER = {"modelFormat", "runtime", "runtimeVersion", "protocolVersion", "storageUri",
                        "storage"}


def kserve_template(isvc, component):
    """The pod template KServe's raw deployment mode makes of a component (spec.predictor)."""
    spec = {k: v for k, v in component.items() if k not in KSERVE_NOT_POD and k not in KSERVE_MODELS}
    model = next((component[m] for m in KSERVE_MODELS if isinstance(component.get(m), dict)), None)
    if model is not None and "containers" not in spec:
        # The serving runtime's container, which gives the image, with the model spec merged in.
        spec["containers"] = [{"name": "kserve-container", "image": "registry.example/runtime:1",
                               **{k: v for k, v in model.items() if k not in KSERVE_NOT_CONTAINER}}]
    meta = {m: {**isvc["metadata"].get(m, {}), **component.get(m, {})} for m in ("labels", "annotations")}
    return {"metadata": meta, "spec": spec}


def generated(kind, tpl, name):
    """The object an operator makes of a pod template."""
    tpl = copy.deepcopy(tpl)
    labels = tpl.setdefault("metadata", {}).setdefault("labels", {})
    labels["e2e-generated"] = name
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {**tpl["metadata"], "name": name},
                "spec": tpl["spec"]}
    spec = {"replicas": 1, "selector": {"matchLabels": {"e2e-generated": name}}, "template": tpl}
    if kind == "StatefulSet":
        spec["serviceName"] = name
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def with_class(doc, cls, pointers):
    doc = copy.deepcopy(doc)
    for p in pointers:
        tpl = at_pointer(doc, p)
        labels = tpl if doc["kind"] == "InferenceService" else tpl.setdefault("metadata", {})
        labels.setdefault("labels", {})[CLASS] = cls  # a KServe component has its own labels
    return doc


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("manifest", list(OPERATORS))
def test_operator_templates_as_patched_pass_the_api_servers_validation(manifest, cls, kube,
                                                                       gpuguard, ignored_namespace):
    original = yaml.safe_load((MANIFESTS / manifest).read_text())
    namespace = original["metadata"].get("namespace", "default")
    first = [json.loads(l) for l in gpuguard.check(yaml.safe_dump(original), namespace,
                                                  "-o", "json").stdout.splitlines()]
    pointers = [v["pointer"] for v in first if v.get("type") == "template"]
    assert pointers, first
    doc = with_class(original, cls, pointers)
    text = yaml.safe_dump(doc, sort_keys=False)
    verdicts = [json.loads(l) for l in gpuguard.check(text, namespace, "-o", "json").stdout.splitlines()
                if json.loads(l).get("type") == "template"]
    emitted = gpuguard.check(text, namespace, "--emit-mutated")
    if (manifest, cls) in DENIED:  # nothing patched to judge: the API server never sees it
        denied = [v["message"] for v in verdicts if not v["allowed"]]
        assert denied and all(f"class {cls} shares GPUs" in m for m in denied), verdicts
        return
    assert all(v["allowed"] for v in verdicts), verdicts
    mutated = yaml.safe_load(emitted.stdout)
    assert mutated != doc  # gpuguard patched the templates
    for i, p in enumerate(pointers):
        tpl = at_pointer(mutated, p)
        if mutated["kind"] == "InferenceService":
            tpl = kserve_template(mutated, tpl)
        obj = generated(OPERATORS[manifest], tpl, f"gen-{i}")
        r = kube.run("create", "--dry-run=server", "-n", ignored_namespace, "-f", "-", input=obj,
                     check=False)
        assert r.returncode == 0, f"{manifest} {p} as a {OPERATORS[manifest]}: {r.stderr}"
