"""test_dialects_check.py - `gpuguard check` with the shipped policies and configuration on pods
in every GPU dialect (upstream-shaped manifests under tests/policies/gpu-dialects/manifests) and
a --cluster-state list that mixes pods, ResourceClaims, ResourceClaimTemplates and other kinds.
"""
import json

import yaml

from cli_policy import REPO, check_shipped as check, training_pod

DIALECTS = REPO / "tests" / "policies" / "gpu-dialects"
STATE = DIALECTS / "cluster-state-dra.json"


def records(out):
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    return [r for r in lines if r["type"] == "template"], lines[-1]


def test_nvidia_dra_quickstart_shapes_are_admitted_with_their_charge(binary):
    out = check(binary, "-o", "json", DIALECTS / "manifests" / "dra")
    assert out.returncode == 0, out.stdout + out.stderr
    pods, summary = records(out)
    got = {(p["namespace"], p["name"]): p["decision"] for p in pods}
    assert got == {
        ("default", "flexible"): "dra on pool a100-dra (passed through): 2 = pod 1 x "
                                 "ResourceClaimTemplate big-or-small (2 each)",
        ("gpu-test1", "pod1"): "dra on pool a100-dra (passed through): 1 = pod 1 x "
                               "ResourceClaimTemplate single-gpu (1 each)",
        ("gpu-test1", "pod2"): "dra on pool a100-dra (passed through): 1 = pod 1 x "
                               "ResourceClaimTemplate single-gpu (1 each)",
        ("gpu-test2", "pod"): "dra on pool a100-dra (passed through): 1 = pod 1 x "
                              "ResourceClaimTemplate single-gpu (1 each)",
        ("gpu-test3", "pod1"): "dra on pool a100-dra (passed through): 0 = pod 1 x "
                               "ResourceClaim single-gpu (0 each)",
        ("gpu-test3", "pod2"): "dra on pool a100-dra (passed through): 0 = pod 1 x "
                               "ResourceClaim single-gpu (0 each)",
        ("gpu-test4", "pod"): "dra on pool a100-dra (passed through): 1.001 = pod 1 x "
                              "ResourceClaimTemplate mig-devices (1.001 each)",
        ("gpu-test8", "pod"): "dra on pool a100-dra (passed through): 2 = pod 1 x "
                              "ResourceClaimTemplate two-gpus (2 each)",
    }
    assert all(p["allowed"] for p in pods)
    # the claims and templates themselves are not pods: skipped, each of them
    assert summary["checked"] == 8 and summary["skipped"] == 6 and summary["denied"] == 0


def test_a_pod_whose_template_is_in_no_input_is_denied_naming_it(binary, tmp_path):
    pod = tmp_path / "pod.yaml"
    pod.write_text((DIALECTS / "manifests" / "dra" / "gpu-test1.yaml").read_text()
                   .split("---\n", 1)[1])
    out = check(binary, "-o", "json", pod)
    assert out.returncode == 1
    pods, _ = records(out)
    assert [p["message"] for p in pods] == [
        "gpu-sharing: resourceClaims gpu names ResourceClaimTemplate gpu-test1/single-gpu, "
        "which does not exist; create it first"] * 2


def test_backend_dialects_are_passed_through(binary):
    out = check(binary, "--namespace", "team-a", "-o", "json", DIALECTS / "manifests",
                config=DIALECTS / "configs" / "backends.yaml")
    assert out.returncode == 1, out.stdout + out.stderr  # the DRA pods, below
    pods, _ = records(out)
    got = {p["file"].rsplit("/", 1)[1]: p["decision"] for p in pods if "/dra/" not in p["file"]}
    assert got == {
        "hami-default-use.yaml": "hami on pool hami-l40s (passed through): 0.3 = "
                                 "ubuntu-container 1 x nvidia.com/gpu (0.3 each)",
        "hami-memory-fraction.yaml": "hami on pool hami-l40s (passed through): 1 = "
                                     "ubuntu-container 2 x nvidia.com/gpu (0.5 each)",
        "kai-fraction.yaml": "kai on pool kai-l40s (passed through): 0.5 = pod 1 x "
                             "gpu-fraction (0.5 each)",
        "kai-memory.yaml": "kai on pool kai-l40s (passed through): 0.041 = pod 1 x "
                           "gpu-fraction (0.041 each)",
        "volcano-vgpu.yaml": "volcano on pool volcano-l40s (passed through): 0.5 = "
                             "cuda-container 1 x volcano.sh/vgpu-number (0.5 each)",
    }
    # No pool of this fleet runs DRA claims: those pods are denied, naming the pools.
    dra = {p["message"] for p in pods if "/dra/" in p["file"] and not p["allowed"]}
    assert len([p for p in pods if "/dra/" in p["file"]]) == 8
    pools = ("the pools are h100 (exclusive), kai-l40s (schedulerName kai-scheduler; kai), "
             "hami-l40s (schedulerName hami-scheduler; hami), volcano-l40s (schedulerName "
             "volcano); ask for a GPU in a form one of them accepts")
    assert dra == {f"gpu-sharing: no GPU pool runs DRA device classes {c}; {pools}"
                   for c in ["gpu.nvidia.com", "mig.nvidia.com", "gpu.nvidia.com, mig.nvidia.com"]}


def test_cluster_state_mixes_kinds_and_counts_the_others(binary, tmp_path):
    pod = tmp_path / "one.yaml"
    pod.write_text(yaml.safe_dump(training_pod("one", "team-a", 1)))
    out = check(binary, "--cluster-state", STATE, pod)
    assert out.returncode == 1
    assert out.stdout.splitlines()[-1] == \
        "1 checked, 1 denied, 0 warned, 0 skipped, 2 cluster-state objects of other kinds skipped"
    assert "namespace team-a would use 9 of 8 GPUs (in use 8, this pod 1)" in out.stdout
    out = check(binary, "--cluster-state", STATE, "-o", "json", pod)
    _, summary = records(out)
    assert summary["cluster_state"] == {"pods": 4, "resourceclaims": 3,
                                        "resourceclaimtemplates": 2, "deviceclasses": 0, "resourceslices": 0,
                                        "gpuquotas": 0, "skipped": 2}


def test_a_forged_charge_annotation_frees_nothing(binary, tmp_path):
    # team-sandbox: a namespace the training class is for (team-*) with the default quota, 4.
    state = tmp_path / "state.json"
    running = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "big", "namespace": "team-sandbox", "uid": "u-1",
                            "annotations": {"gpuguard.io/charge": "0"}},
               "spec": {"containers": [{"name": "c", "resources": {
                   "limits": {"nvidia.com/gpu": "4"}}}]},
               "status": {"phase": "Running"}}
    state.write_text(json.dumps({"kind": "List", "items": [running]}))
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump(training_pod("p", "team-sandbox", 1)))
    out = check(binary, "--cluster-state", state, pod)
    assert out.returncode == 1
    assert ("gpu-quota: namespace team-sandbox would use 5 of 4 GPUs (in use 4, this pod 1); "
            "ask for fewer GPUs or free GPUs") in out.stdout


COMPUTE_DOMAIN = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
                  "metadata": {"name": "nvbandwidth-test-compute-domain"},
                  "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {
                      "name": "nvbandwidth-test-compute-domain-channel"}}}}
IMEX_POD = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "nvbandwidth-worker", "labels": {"team": "hpc"}},
            "spec": {"containers": [{"name": "worker", "image": "nvcr.io/nvidia/cuda:12.4.1",
                                     "resources": {"limits": {"nvidia.com/gpu": 2},
                                                   "claims": [{"name": "channel"}]}}],
                     "resourceClaims": [{"name": "channel", "resourceClaimTemplateName":
                                         "nvbandwidth-test-compute-domain-channel"}]}}


def test_a_compute_domain_provides_the_channel_template_its_controller_makes(binary, tmp_path):
    """NVIDIA's IMEX demo puts a ComputeDomain and the pods that name its channel template in
    one file; the ComputeDomain controller makes that template, so check reads it from the
    ComputeDomain (an IMEX channel, charged 0, no GPU) instead of denying it as missing."""
    both = tmp_path / "imex.yaml"
    both.write_text(yaml.safe_dump_all([COMPUTE_DOMAIN, IMEX_POD]))
    out = check(binary, "-o", "json", "--namespace", "team-a", both)
    assert out.returncode == 0, out.stdout + out.stderr
    [pod], summary = records(out)
    assert pod["allowed"] is True and summary["skipped"] == 1
    alone = tmp_path / "pod.yaml"
    alone.write_text(yaml.safe_dump(IMEX_POD))
    out = check(binary, "-o", "json", "--namespace", "team-a", alone)
    [pod], _ = records(out)
    assert "ResourceClaimTemplate team-a/nvbandwidth-test-compute-domain-channel, which does " \
           "not exist; create it first" in pod["message"]
