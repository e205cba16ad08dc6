"""Denials as users see them: `kubectl apply`'s exit code and the message the API server relays,
which is the one `gpuguard check` prints for the same manifest (docs/local-cluster.md's examples are these)."""

import json

import pytest
import yaml

DENIED = {
    "too-many-gpus": {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "big", "labels": {"team": "e2e", "gpuguard.io/workload-class": "training"}},
        "spec": {"containers": [{"name": "main", "image": "registry.example/cuda:12",
                                 "resources": {"limits": {"nvidia.com/gpu": 9}}}]}},
    "gpu-env-without-gpu": {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "env", "labels": {"team": "e2e"}},
        "spec": {"containers": [{"name": "main", "image": "registry.example/cuda:12",
                                 "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}},
    "gpu-node-label-without-gpu": {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "scraper", "labels": {"team": "e2e"}},
        "spec": {"nodeSelector": {"nvidia.com/gpu.present": "true"},
                 "containers": [{"name": "main", "image": "registry.example/app:1"}]}},
    "no-team-label": {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nolabel"},
        "spec": {"containers": [{"name": "main", "image": "registry.example/cuda:12",
                                 "resources": {"limits": {"nvidia.com/gpu": 1}}}]}},
    "deployment-without-label": {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "serve"},
        "spec": {"selector": {"matchLabels": {"app": "serve"}},
                 "template": {"metadata": {"labels": {"app": "serve"}},
                              "spec": {"containers": [{"name": "main", "image": "registry.example/cuda:12",
                                                       "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}},
}

KIND_WORD = {"Pod": "pods", "Deployment": "deployments.apps"}


@pytest.mark.parametrize("case", list(DENIED))
def test_kubectl_apply_shows_gpuguards_message(case, kube, gpuguard, namespace):
    manifest = DENIED[case]
    text = yaml.safe_dump(manifest, sort_keys=False)
    checked = [json.loads(l) for l in gpuguard.check(text, namespace, "-o", "json").stdout.splitlines()]
    verdict = checked[0]
    assert verdict["allowed"] is False
    if manifest["kind"] == "Pod":
        webhook, message = verdict["denied_in"] + ".gpuguard.io", verdict["message"]
    else:  # the workloads webhook puts the template through both phases at once; says where
        webhook, message = "workloads.mutate.gpuguard.io", f'{verdict["path"]}: {verdict["message"]}'

    r = kube.run("apply", "-n", namespace, "-f", "-", input=text, check=False)
    assert r.returncode == 1
    assert r.stderr.strip() == (
        f'Error from server (Forbidden): error when creating "STDIN": admission webhook '
        f'"{webhook}" denied the request: {message}')
    assert kube.run("get", KIND_WORD[manifest["kind"]], manifest["metadata"]["name"], "-n",
                    namespace, check=False).returncode == 1  # nothing was stored
