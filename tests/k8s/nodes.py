"""Fake GPU nodes for the pools of a gpuguard configuration: what a real node of the pool's model
carries once NVIDIA's device plugin and GPU Feature Discovery (GFD) have run on it, as kwok keeps
it (no kubelet, no GPU).  For every pool: its node_selector labels and taints, the GFD labels
(nvidia.com/gpu.product, .count, .memory, .sharing-strategy, .replicas, mig.strategy, ...) and the
pool's resources in the node's capacity: whole GPUs, MIG devices per profile, shared replicas,
HAMi's split devices.  A DRA pool gets no GPU resources but ResourceSlices of NVIDIA's DRA driver
(gpu.nvidia.com) and the driver's DeviceClasses.

A node without GPUs (cpu-0) takes the pods that ask for none.

The hardware below is the test fixture's own statement of what such nodes carry (GFD's product
names, memory in MiB, the MIG profiles of each model: NVIDIA's MIG user guide), independent of
gpuguard's catalog (lua/gpu.lua): a disagreement shows as a pod that no node can run."""

GPUS_PER_NODE = 8
NODES_PER_POOL = 2
FAKE = {"kwok.x-k8s.io/node": "fake"}  # the annotation kwok is told to manage

HARDWARE = {
    "A100-80GB": {"product": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "family": "ampere",
                  "mig": ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]},
    "A100-40GB": {"product": "NVIDIA-A100-SXM4-40GB", "memory": 40960, "family": "ampere",
                  "mig": ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]},
    "H100-80GB": {"product": "NVIDIA-H100-80GB-HBM3", "memory": 81559, "family": "hopper",
                  "mig": ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]},
    "L4": {"product": "NVIDIA-L4", "memory": 23034, "family": "ada-lovelace", "mig": []},
    "L40S": {"product": "NVIDIA-L40S", "memory": 46068, "family": "ada-lovelace", "mig": []},
}

HAMI_SPLIT = 10  # HAMi's default deviceSplitCount: vGPUs per GPU
DRA_DRIVER = "gpu.nvidia.com"


def hardware(pool):
    try:
        return HARDWARE[pool["model"]]
    except KeyError:
        raise SystemExit(f"nodes: pool {pool['name']}: no fake hardware for model "
                         f"{pool['model']!r} (tests/k8s/nodes.py HARDWARE)")


def _gpu_resources(pool, hw, labels):
    """The pool's resources in a node's capacity; sets the sharing labels GFD writes."""
    mode, n = pool.get("sharing", "exclusive"), GPUS_PER_NODE
    labels["nvidia.com/gpu.sharing-strategy"] = "none"
    labels["nvidia.com/gpu.replicas"] = "1"
    if mode == "mig":
        # Mixed strategy: a resource per profile; each GPU may be cut any way, so every profile is
        # offered as many times as a GPU holds its smallest slice.
        labels["nvidia.com/mig.strategy"] = pool.get("mig_strategy", "mixed")
        labels["nvidia.com/mig.capable"] = "true"
        res = {}
        for p in hw["mig"]:
            count = n * (7 // int(p.split("g.")[0]))
            res[f"nvidia.com/mig-{p}"] = str(count)
            labels[f"nvidia.com/mig-{p}.count"] = str(count)
        return res
    if mode in ("time-slicing", "mps"):
        replicas = int(pool.get("replicas", 4))
        labels["nvidia.com/gpu.sharing-strategy"] = mode
        labels["nvidia.com/gpu.replicas"] = str(replicas)
        resource = pool.get("shared_resource", "nvidia.com/gpu")
        if resource == "nvidia.com/gpu":
            labels["nvidia.com/gpu.product"] = hw["product"] + "-SHARED"
        return {resource: str(n * replicas)}
    if mode == "hami":
        return {"nvidia.com/gpu": str(n * HAMI_SPLIT), "nvidia.com/gpumem": str(n * hw["memory"]),
                "nvidia.com/gpucores": str(n * 100)}
    if mode == "dra":
        return {}
    return {"nvidia.com/gpu": str(n)}  # exclusive, kai (fractions share whole GPUs), volcano


def node(pool, index):
    hw = hardware(pool)
    name = f"{pool['name']}-{index}"
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "type": "kwok", "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": hw["product"], "nvidia.com/gpu.count": str(GPUS_PER_NODE),
        "nvidia.com/gpu.memory": str(hw["memory"]), "nvidia.com/gpu.family": hw["family"],
    }
    gpu = _gpu_resources(pool, hw, labels)
    labels.update(pool.get("node_selector") or {})
    capacity = {"cpu": "128", "memory": "1Ti", "pods": "110", "ephemeral-storage": "2Ti", **gpu}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": dict(FAKE)},
        "spec": {"taints": [dict(t) for t in pool.get("taints") or []]},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def device_classes():
    """The DeviceClasses of NVIDIA's DRA driver (its Helm chart): whole GPUs and MIG devices."""
    def dc(name, kind):
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression":
                         f"device.driver == '{DRA_DRIVER}' && "
                         f"device.attributes['{DRA_DRIVER}'].type == '{kind}'"}}]}}
    return [dc("gpu.nvidia.com", "gpu"), dc("mig.nvidia.com", "mig")]


def resource_slice(pool, node_name):
    """The ResourceSlice the DRA driver publishes for a node: its whole GPUs."""
    hw = hardware(pool)
    devices = [{
        "name": f"gpu-{i}",
        "attributes": {"type": {"string": "gpu"}, "productName": {"string": hw["product"]},
                       "index": {"int": i}, "uuid": {"string": f"GPU-{node_name}-{i}"}},
        "capacity": {"memory": {"value": f"{hw['memory']}Mi"}},
    } for i in range(GPUS_PER_NODE)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node_name}-{DRA_DRIVER}"},
            "spec": {"driver": DRA_DRIVER, "nodeName": node_name,
                     "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}}


def cpu_node():
    """A node without GPUs or taints, for the pods that ask for none."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "cpu-0", "annotations": dict(FAKE),
                         "labels": {"kubernetes.io/hostname": "cpu-0", "kubernetes.io/os": "linux",
                                    "kubernetes.io/arch": "amd64", "type": "kwok"}},
            "status": {"capacity": {"cpu": "64", "memory": "256Gi", "pods": "110"},
                       "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}}


def objects(config):
    """Every object the fleet of config needs, in creation order: a CPU node, then each pool's."""
    out, dra = [cpu_node()], False
    for pool in config.get("pools") or []:
        for i in range(NODES_PER_POOL):
            n = node(pool, i)
            out.append(n)
            if pool.get("sharing") == "dra":
                dra = True
                out.append(resource_slice(pool, n["metadata"]["name"]))
    if dra:
        out[:0] = device_classes()
    return out
