"""Classes and the pool a pod asks for, against the real API server, scheduler and fake nodes of
every pool (tests/k8s/nodes.py labels them as GPU Feature Discovery would): each way of routing a
pod, by its class or by its own choice, ends with the pod running on a node of the pool its
gpuguard.io/decision names; a choice the class has no pool for is refused with the pools that
would, and nothing is stored."""

import pytest

from e2e_support import node_pool, pod_running, wait_for

CLASS = "gpuguard.io/workload-class"


def pod(name, cls, limits=None, annotations=None, **spec):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"team": "e2e", CLASS: cls},
                         "annotations": annotations or {}},
            "spec": {"containers": [{"name": "main", "image": "registry.example/cuda:12",
                                     "resources": {"limits": limits or {}}}], **spec}}


def required(key, operator, *values):
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": operator,
                                                     "values": list(values)}]}]}}}


MEMORY = {"gpuguard.io/gpu-memory": "10Gi"}

# Each way of routing under deploy/gpuguard.yaml (inference prefers a100-mig, l4-shared,
# l4-infer, whole GPUs on l4-infer; training h100-train; interactive l4-shared; l4-shared renames
# its replicas, so its nodes publish the plain product NVIDIA-L4): the pod, and the pool it must
# run on.
ROUTES = {
    "class training": (pod("train", "training", {"nvidia.com/gpu": 1}), "h100-train"),
    "class inference, whole GPU": (pod("serve", "inference", {"nvidia.com/gpu": 1}), "l4-infer"),
    "class inference, memory": (pod("embed", "inference", annotations=MEMORY), "a100-mig"),
    "class interactive": (pod("lab", "interactive", {"nvidia.com/gpu": 1}), "l4-shared"),
    "pool label": (pod("by-pool", "inference", annotations=MEMORY,
                       nodeSelector={"gpuguard.io/pool": "l4-shared"}), "l4-shared"),
    "GFD product": (pod("by-product", "inference", annotations=MEMORY,
                        nodeSelector={"nvidia.com/gpu.product": "NVIDIA-L4"}), "l4-shared"),
    "GFD memory in node affinity": (pod("by-memory", "inference", annotations=MEMORY,
                                        affinity=required("nvidia.com/gpu.memory", "Lt", "30000")),
                                    "l4-shared"),
    "GFD family in node affinity, a label gpuguard does not know beside it": (
        pod("by-family", "inference", {"nvidia.com/gpu": 1}, nodeSelector={"kubernetes.io/os": "linux"},
            affinity=required("nvidia.com/gpu.family", "In", "ampere")), "a100-mig"),
    "gpu-model annotation": (pod("by-model", "inference", {"nvidia.com/gpu": 1},
                                 annotations={"gpuguard.io/gpu-model": "A100"}), "a100-mig"),
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_the_pod_runs_on_the_pool_its_decision_names(route, kube, gpuguard, namespace):
    manifest, pool = ROUTES[route]
    stored = kube.create(manifest, namespace)
    annotations = stored["metadata"]["annotations"]
    assert annotations["gpuguard.io/pool"] == pool, annotations["gpuguard.io/decision"]
    assert f"on pool {pool} " in annotations["gpuguard.io/decision"]
    name = manifest["metadata"]["name"]
    running = wait_for(f"pod {name} Running", lambda: pod_running(kube, namespace, name))
    assert node_pool(kube, running["spec"]["nodeName"]) == pool


REFUSED = {
    "training on L4s": (
        pod("train-l4", "training", {"nvidia.com/gpu": 1},
            nodeSelector={"nvidia.com/gpu.product": "NVIDIA-L4"}),
        "gpu-sharing: the pod asks for nodeSelector nvidia.com/gpu.product=NVIDIA-L4, which no pool "
        "of class training (h100-train) has; pools that do: l4-shared, l4-infer; change the request "
        "or use a class that runs on them (batch, inference, interactive)"),
    "a MIG slice with an L4's family": (
        pod("mig-ada", "inference", {"nvidia.com/mig-1g.10gb": 1},
            nodeSelector={"nvidia.com/gpu.family": "ada-lovelace"}),
        "gpu-sharing: nvidia.com/mig-1g.10gb runs on pool a100-mig, and the pod asks for "
        "nodeSelector nvidia.com/gpu.family=ada-lovelace, which it does not have; pools that do: "
        "l4-shared, l4-infer, l40s-mps, kai-l40s, hami-l40s; ask for a GPU in a form one of them "
        "runs"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_choice_no_pool_of_the_class_has_is_refused(case, kube, gpuguard, namespace):
    manifest, message = REFUSED[case]
    r = kube.run("create", "-n", namespace, "-f", "-", input=manifest, check=False)
    assert r.returncode == 1
    assert r.stderr.strip() == (
        'Error from server (Forbidden): error when creating "STDIN": admission webhook '
        f'"mutate.gpuguard.io" denied the request: {message}')
    assert kube.run("get", "pod", manifest["metadata"]["name"], "-n", namespace,
                    check=False).returncode == 1
