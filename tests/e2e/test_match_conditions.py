"""The validating webhook's matchCondition as the API server evaluates it: each pod and claim
UPDATE below is made for real, and whether gpuguard was called is read from its request
counter.  The same cases as tests/integration/test_deploy.py, which evaluates the condition
without a cluster; here it is the API server's CEL, on the requests it really builds."""

import copy
import json

import pytest

from e2e_support import claim_pod, claim_template, settled_requests, wait_for

DECISION = {"gpuguard.io/decision": "mig 1g.10gb on pool a100-mig", "gpuguard.io/charge": "143"}
GPU_TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
GATE = [{"name": "example.com/hold"}]
POOL = {"gpuguard.io/pool": "h100-train"}
AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [
        {"key": "gpuguard.io/pool", "operator": "In", "values": ["a100-mig"]}]}]}}}


def meta(p, **kw):
    p["metadata"].update(kw)
    return p


def spec(p, **kw):
    p["spec"].update(kw)
    return p


def ungate(p):
    p["spec"].pop("schedulingGates", None)
    return p


# (what, the pod at creation: labels, annotations, spec extras; the change; sent to gpuguard)
POD_UPDATES = [
    ("a gpuguard.io/ annotation rewritten", {"annotations": DECISION},
     lambda p: meta(p, annotations={**DECISION, "gpuguard.io/decision": "exclusive"}), True),
    ("a gpuguard.io/ annotation removed", {"annotations": DECISION},
     lambda p: meta(p, annotations={"gpuguard.io/decision": DECISION["gpuguard.io/decision"]}), True),
    ("a gpuguard.io/ annotation added", {}, lambda p: meta(p, annotations=DECISION), True),
    ("a gpuguard.io/ label changed", {"labels": {"gpuguard.io/workload-class": "interactive"}},
     lambda p: meta(p, labels={"gpuguard.io/workload-class": "training"}), True),
    ("a gated pod gets a GPU toleration", {"gates": True},
     lambda p: spec(p, tolerations=p["spec"]["tolerations"] + GPU_TOLERATION), True),
    ("a gated pod's gate lifted with a pool nodeSelector", {"gates": True},
     lambda p: spec(ungate(p), nodeSelector=POOL), True),
    ("a gated pod gets node affinity", {"gates": True}, lambda p: spec(p, affinity=AFFINITY), True),
    ("a pod that is not gated gets a toleration", {},
     lambda p: spec(p, tolerations=p["spec"]["tolerations"] + [
         {"key": "example.com/maintenance", "operator": "Exists", "effect": "NoSchedule"}]), True),
    ("other labels and annotations edited", {"labels": {"team": "a"}, "annotations": DECISION},
     lambda p: meta(p, labels={"team": "b", "owner": "alice"}, annotations={**DECISION, "note": "x"}),
     False),
    ("labels added", {}, lambda p: meta(p, labels={"team": "a"}), False),
    ("a gate lifted and nothing else", {"gates": True}, ungate, False),
    ("an image changed", {},
     lambda p: p["spec"]["containers"][0].update(image="registry.example/app:2") or p, False),
]


# A pod gpuguard denies (a GPU variable without a GPU): refused once the namespace is matched.
PROBE = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
         "spec": {"containers": [{"name": "c", "image": "registry.example/app:1",
                                  "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}


def new_pod(extra):
    m = {"name": "p"}
    for k in ("labels", "annotations"):
        if k in extra:
            m[k] = extra[k]
    s = {"containers": [{"name": "c", "image": "registry.example/app:1"}]}
    if extra.get("gates"):
        s["schedulingGates"] = GATE
    return {"apiVersion": "v1", "kind": "Pod", "metadata": m, "spec": s}


@pytest.mark.parametrize("what,extra,change,sent", POD_UPDATES, ids=[c[0] for c in POD_UPDATES])
def test_a_pod_update_reaches_gpuguard_only_when_it_touches_what_it_reads(what, extra, change, sent,
                                                                         kube, gpuguard,
                                                                         ignored_namespace,
                                                                         namespace):
    # gpuguard.io/ metadata on a new pod is gpuguard's to write: the pod is made where gpuguard
    # does not look, then the namespace is handed back to it by removing the label.
    ns = ignored_namespace if (extra.get("annotations") or extra.get("labels")) else namespace
    kube.create(new_pod(extra), ns)
    if ns == ignored_namespace:
        kube.run("label", "namespace", ns, "gpuguard.io/ignore-")
        wait_for("the namespace matched again", lambda: kube.run(
            "create", "--dry-run=server", "-n", ns, "-f", "-", input=PROBE, check=False).returncode != 0)
    before = settled_requests(gpuguard)
    for _ in range(5):  # the pod's status may move between the read and the write: read again
        updated = change(copy.deepcopy(kube.get("pod", "p", ns)))
        r = kube.run("replace", "-f", "-", input=json.dumps(updated), check=False)
        if "the object has been modified" not in r.stderr:
            break
    assert (settled_requests(gpuguard) > before) is sent, what
    if not sent:  # nothing of gpuguard's stood in the way: a condition that errors would have
        assert r.returncode == 0, r.stderr


def claim_template_pod(kube, namespace):
    """A pod whose claim the resourceclaim controller makes (marked as made for the pod)."""
    kube.create(claim_template("one"), namespace)
    kube.create(claim_pod("d", "one"), namespace)
    return wait_for("the pod's claim", lambda: kube.items("resourceclaims", namespace))[0]


def test_a_claim_update_reaches_gpuguard_only_when_it_marks_the_claim(kube, gpuguard, namespace):
    claim = claim_template_pod(kube, namespace)
    name = claim["metadata"]["name"]
    # The scheduler's own writes (finalizer, allocation) went through: the pod runs.
    wait_for("the DRA pod running", lambda: kube.get("pod", "d", namespace)["status"]["phase"] == "Running")
    for what, patch, sent in [
        ("other annotations edited", {"metadata": {"annotations": {"note": "x"}}}, False),
        ("the mark changed", {"metadata": {"annotations": {"resource.kubernetes.io/pod-claim-name": "other"}}},
         True),
    ]:
        before = settled_requests(gpuguard)
        r = kube.run("patch", "resourceclaim", name, "-n", namespace, "--type=merge", "-p",
                     json.dumps(patch), check=False)
        assert (settled_requests(gpuguard) > before) is sent, what
        if not sent:
            assert r.returncode == 0, r.stderr


def test_a_gpu_toleration_added_to_a_running_pod_without_a_gpu_is_refused(kube, gpuguard, namespace):
    kube.create(new_pod({}), namespace)
    running = wait_for("the pod running", lambda: (lambda p: p if p["status"].get("phase") == "Running" else None)(
        kube.get("pod", "p", namespace)))
    assert running["spec"]["nodeName"] == "cpu-0"
    toleration = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "h100-train", "effect": "NoSchedule"}
    patch = json.dumps({"spec": {"tolerations": running["spec"]["tolerations"] + [toleration]}})
    r = kube.run("patch", "pod", "p", "-n", namespace, "--type=merge", "-p", patch, check=False)
    assert r.returncode == 1
    assert r.stderr.strip() == (
        'Error from server (Forbidden): admission webhook "validate.gpuguard.io" denied the request: '
        "gpu-guardrails: the update adds a toleration of the GPU taint nvidia.com/gpu (pool h100-train) "
        "to a pod that asks for no GPU; remove it: a pod without a GPU stays off GPU nodes; GPU plumbing "
        "(drivers, device plugins, exporters) belongs in a namespace of placement.exempt_namespaces or "
        "runs as one of placement.exempt_service_accounts")
    assert toleration not in kube.get("pod", "p", namespace)["spec"]["tolerations"]


def test_a_suspended_jobs_queue_relabel_reaches_gpuguard_and_other_labels_do_not(
        kube, gpuguard, namespace):
    """Moving a suspended Job to another queue or priority class is a label-only UPDATE: the
    workloads' validating webhook is sent it (gpu-queues judges it); other label edits are not
    sent, nor are they to the mutating webhook (counted: one call per UPDATE sent)."""
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "held"},
           "spec": {"suspend": True, "template": {"metadata": {"labels": {"team": "e2e"}}, "spec": {
               "restartPolicy": "Never", "containers": [{
                   "name": "main", "image": "registry.example/cuda:12",
                   "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}
    kube.create(job, namespace)
    for what, label, calls in [("another label", "team=b", 0),
                               ("a Kueue queue", "kueue.x-k8s.io/queue-name=gpu-batch", 1),
                               ("a Kueue priority class", "kueue.x-k8s.io/priority-class=low", 1),
                               ("the queue removed", "kueue.x-k8s.io/queue-name-", 1)]:
        before = settled_requests(gpuguard)
        kube.run("label", "job", "held", "-n", namespace, label, "--overwrite")
        assert settled_requests(gpuguard) - before == calls, what
