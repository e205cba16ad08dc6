"""GPU pods in every request form, created with kubectl against the real API server: the stored
pod carries exactly the patch `gpuguard check --emit-mutated` writes for the same manifest
(both compared after the API server's own defaulting), a second mutating webhook of the test's
own makes the API server call gpuguard again and the pod does not change, and the pod runs on a
node of the pool its gpuguard.io/decision names.

Pods written for a scheduler that does not run here (kai-scheduler, hami-scheduler) are bound
by the test itself, through pods/binding, to a node of the decided pool."""

import base64
import copy
import difflib
import json

import pytest
import yaml

from e2e_support import (OwnWebhook, claim_pod, claim_template, node_pool, pod_running,
                         serve_test_webhook, wait_for)

TEAM = {"team": "e2e"}


def pod(name, containers, labels=None, annotations=None, **spec):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {**TEAM, **(labels or {})},
                         "annotations": annotations or {}},
            "spec": {"containers": containers, **spec}}


def container(limits, name="main"):
    return {"name": name, "image": "registry.example/cuda:12", "resources": {"limits": limits}}


CLAIM_TEMPLATE = claim_template("one-a100")

FORMS = {
    "whole": pod("whole", [container({"nvidia.com/gpu": 2})],
                 labels={"gpuguard.io/workload-class": "training"}),
    "fraction": pod("fraction", [container({})], labels={"gpuguard.io/workload-class": "inference"},
                    annotations={"gpuguard.io/gpu-fraction": "0.5"}),
    "memory": pod("memory", [container({})], labels={"gpuguard.io/workload-class": "inference"},
                  annotations={"gpuguard.io/gpu-memory": "20Gi"}),
    "mig": pod("mig", [container({"nvidia.com/mig-1g.10gb": 1})]),
    "time-sliced": pod("time-sliced", [container({"nvidia.com/gpu": 1})],
                       labels={"gpuguard.io/workload-class": "interactive"}),
    "mps": pod("mps", [container({})], annotations={"gpuguard.io/gpu-fraction": "0.25"}),
    "dra-template": claim_pod("dra-template", "one-a100"),
    "kai": pod("kai", [container({})], annotations={"gpu-fraction": "0.5"},
               schedulerName="kai-scheduler"),
    "hami": pod("hami", [container({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000,
                                    "nvidia.com/gpucores": 30})], schedulerName="hami-scheduler"),
}

# The pool each form lands on under tests/e2e/fleet.yaml over deploy/gpuguard.yaml.
POOLS = {"whole": "h100-train", "fraction": "a100-mig", "memory": "a100-mig", "mig": "a100-mig",
         "time-sliced": "l4-shared", "mps": "l40s-mps", "dra-template": "a100-dra",
         "kai": "kai-l40s", "hami": "hami-l40s"}

REINVOKED = "e2e.gpuguard.io/reinvoked"


class Reinvoker(OwnWebhook):
    """A mutating webhook that adds one annotation: the API server then calls gpuguard again
    (its reinvocationPolicy is IfNeeded)."""

    def answer(self, req):
        annotations = req["object"]["metadata"].get("annotations")
        ops = [] if annotations and REINVOKED in annotations else (
            [{"op": "add", "path": "/metadata/annotations/" + REINVOKED.replace("/", "~1"),
              "value": "true"}] if annotations else
            [{"op": "add", "path": "/metadata/annotations", "value": {REINVOKED: "true"}}])
        if not ops:
            return {"allowed": True}
        return {"allowed": True, "patchType": "JSONPatch",
                "patch": base64.b64encode(json.dumps(ops).encode()).decode()}


@pytest.fixture(scope="module")
def reinvoking_webhook(kube, cluster):
    """The test's own webhook, after gpuguard's in name order, for pods of namespaces labelled
    e2e-reinvoke=true; removed after the module."""
    server, client = serve_test_webhook(cluster, Reinvoker)
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "zz-e2e-reinvoke"},
        "webhooks": [{
            "name": "reinvoke.e2e.gpuguard.io", "admissionReviewVersions": ["v1"],
            "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 5,
            "reinvocationPolicy": "Never",
            "clientConfig": client,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                       "operations": ["CREATE"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"e2e-reinvoke": "true"}},
        }],
    }
    kube.run("apply", "-f", "-", input=config)
    yield
    kube.run("delete", "mutatingwebhookconfiguration", "zz-e2e-reinvoke", check=False)
    server.shutdown()


def normalised(p):
    """What gpuguard and the user decide of a stored pod: its labels, annotations and spec, less
    what differs between two creations (the service account token volume's random name, the
    node it is bound to later, the order of tolerations)."""
    spec = copy.deepcopy(p["spec"])
    spec.pop("nodeName", None)
    # The DefaultTolerationSeconds plugin adds its tolerations before the webhooks run and after
    # them for a pod created without: the same set, in another order.
    spec["tolerations"] = sorted(spec.get("tolerations", []), key=lambda t: json.dumps(t, sort_keys=True))
    token = [v["name"] for v in spec.get("volumes", []) if v["name"].startswith("kube-api-access-")]
    spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] not in token]
    for c in spec["containers"] + spec.get("initContainers", []):
        c["volumeMounts"] = [m for m in c.get("volumeMounts", []) if m["name"] not in token]
    meta = p["metadata"]
    return {"labels": meta.get("labels", {}), "annotations": meta.get("annotations", {}), "spec": spec}


def assert_same(got, want):
    a, b = (json.dumps(x, indent=1, sort_keys=True).splitlines() for x in (got, want))
    assert a == b, "stored pod (-) against check's (+):\n" + "\n".join(
        difflib.unified_diff(a, b, lineterm="", n=2))


def bind(kube, namespace, name, pool):
    """Bind the pod to the first node of pool, as its own scheduler would."""
    node = f"{pool}-0"
    kube.post(f"/api/v1/namespaces/{namespace}/pods/{name}/binding", {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}})


@pytest.mark.parametrize("form", list(FORMS))
def test_pod_is_stored_as_check_patches_it_and_runs_on_its_pool(form, kube, gpuguard, namespace,
                                                                 ignored_namespace,
                                                                 reinvoking_webhook):
    manifest = FORMS[form]
    kube.run("label", "namespace", namespace, "e2e-reinvoke=true")
    # The API server sees the label once its informer has: until the test's webhook answers.
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "labels": TEAM},
             "spec": {"containers": [container({})]}}
    wait_for("the reinvoking webhook called in the namespace", lambda: REINVOKED in json.loads(
        kube.run("create", "--dry-run=server", "-o", "json", "-n", namespace, "-f", "-",
                 input=probe).stdout)["metadata"].get("annotations", {}))
    if form == "dra-template":
        for ns in (namespace, ignored_namespace):
            kube.create(CLAIM_TEMPLATE, ns)
    # check reads the claim template from the same stream, as the cluster has it.
    text = yaml.safe_dump_all(([CLAIM_TEMPLATE] if form == "dra-template" else []) + [manifest],
                              sort_keys=False)

    # What gpuguard check writes for the manifest, plus the test webhook's annotation, created
    # where gpuguard does not look: the API server's defaulting of the expected pod.
    checked = gpuguard.check(text, namespace, "--emit-mutated")
    assert checked.returncode == 0, checked.stderr
    expected = list(yaml.safe_load_all(checked.stdout))[-1]
    expected["metadata"].setdefault("annotations", {})[REINVOKED] = "true"
    expected["metadata"].pop("namespace", None)
    want = kube.create(expected, ignored_namespace)

    stored = kube.create(manifest, namespace)
    assert_same(normalised(stored), normalised(want))

    # The API server called gpuguard's mutating webhook twice (the test's webhook changed the
    # pod after it): the second call changed nothing.
    mutates = [d for d in gpuguard.decisions(namespace)
               if d.get("endpoint") == "mutate" and d.get("name") == manifest["metadata"]["name"]]
    assert len(mutates) == 2 and mutates[1]["patch_ops"] == 0, mutates

    pool = stored["metadata"]["annotations"]["gpuguard.io/pool"]
    assert pool == POOLS[form]
    assert f"pool {pool}" in stored["metadata"]["annotations"]["gpuguard.io/decision"]
    name = manifest["metadata"]["name"]
    if manifest["spec"].get("schedulerName") in ("kai-scheduler", "hami-scheduler"):
        bind(kube, namespace, name, pool)
    running = wait_for(f"pod {name} Running", lambda: pod_running(kube, namespace, name))
    assert node_pool(kube, running["spec"]["nodeName"]) == pool
