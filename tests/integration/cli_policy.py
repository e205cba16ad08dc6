"""Policy text, pods and the shipped-policy `gpuguard check` run shared by the tests of
`gpuguard check` and `gpuguard test`."""

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent

# The head of a policy file: the engine's built-in `gpuguard` module as gg and
# gpus(pod), the nvidia.com/gpu limits of the pod's containers summed.
GPUS_LUA = r'''
local gg = require "gpuguard"
local function gpus(pod)
  local n = 0
  for _, c in ipairs(pod.spec.containers or {}) do
    local l = c.resources and c.resources.limits
    local v = l and l["nvidia.com/gpu"]
    if v then n = n + tonumber(v) end
  end
  return n
end
'''


def gpu_pod(name="p", gpus=1, namespace=None, labels=None):
    """A Pod with one container asking for gpus whole GPUs."""
    meta = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "c", "image": "cuda",
                                     "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}}


def training_pod(name, namespace, gpus):
    """A training Pod of team a, as the shipped quota policy charges it."""
    pod = gpu_pod(name, gpus=gpus, namespace=namespace,
                  labels={"team": "a", "gpuguard.io/workload-class": "training"})
    pod["spec"]["containers"][0]["image"] = "pytorch/pytorch:2.3.0"
    return pod


def check_shipped(binary, *args, config=REPO / "deploy" / "gpuguard.yaml", cwd=REPO):
    """`gpuguard check` with the shipped policies and Lua library, and config (text output)."""
    cmd = [binary, "check", "--policies", str(REPO / "policies"), "--lua", str(REPO / "lua"),
           "--config", str(config)]
    return subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True,
                          cwd=cwd, timeout=60)
