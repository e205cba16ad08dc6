"""The background audit against the real API server: a pod admitted while gpuguard was out of
its namespace's path and a pod that a configuration change makes break a policy both show up
as `fail` in their PolicyReports within one audit after the reload; fixing one and deleting the
other takes the results away; the reports are stored by the API server under the CRDs gpuguard
ships (deploy/reports, installed by tests/k8s/cluster.py), so they validate against them; and
with audit.report_api set to OpenReports the same results come out in that API.

The configuration is changed by rewriting the cluster's gpuguard.yaml: every replica reloads
it, and the leader audits at once (audit.interval is left at its default: every audit here is
the one a reload starts)."""

import json
import re

import pytest
import yaml

from e2e_support import make_namespace, wait_for

MISSING = "GPU pods need the label {} for cost attribution; add metadata.labels.{}"


def gpu_pod(name, labels):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "registry.example/cuda:12",
                                     "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}


@pytest.fixture
def reconfigure(cluster, gpuguard):
    """A function that rewrites the configuration (a change to the original's audit: and
    guardrails: sections); the original again after the test."""
    from cluster import write_atomic
    original = gpuguard.config.read_text()

    def change(audit=None, required_labels=None):
        cfg = yaml.safe_load(original)
        if audit:
            cfg["audit"] = audit
        if required_labels:
            cfg["guardrails"]["required_labels"] = required_labels
        write_atomic(gpuguard.config, yaml.safe_dump(cfg, sort_keys=False))
    yield change
    write_atomic(gpuguard.config, original)


def results(kube, kind, namespace, pod_name):
    """{policy: (result, message)} of gpuguard's report on the pod, or None when it has none."""
    for report in kube.items(kind, namespace):
        scope = report.get("scope", {})
        if scope.get("kind") == "Pod" and scope.get("name") == pod_name:
            assert report["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpuguard"
            assert report["metadata"]["ownerReferences"][0]["uid"] == scope["uid"]
            counted = {k: sum(r["result"] == k for r in report["results"])
                       for k in ("pass", "fail", "warn", "error", "skip")}
            assert report["summary"] == counted
            return {r["policy"]: (r["result"], r["message"]) for r in report["results"]}
    return None


def test_running_pods_that_break_the_policies_fail_until_fixed_or_deleted(
        kube, gpuguard, reconfigure):
    # Before: a pod in a namespace gpuguard's webhooks leave out, admitted by the API server
    # alone; a pod admitted by gpuguard under the configuration of the cluster.
    before = make_namespace(kube, "e2e-audit-before", {"gpuguard.io/ignore": "true"})
    after = make_namespace(kube, "e2e-audit")
    try:
        kube.create(gpu_pod("rogue", {}), before)
        kube.create(gpu_pod("tidy", {"team": "e2e"}), after)
        kube.run("label", "namespace", before, "gpuguard.io/ignore-")
        reconfigure(required_labels=["team", "cost-center"])

        rogue = wait_for("the rogue pod's report", lambda: results(
            kube, "policyreports", before, "rogue"))
        assert rogue["gpu-guardrails"] == ("fail", MISSING.format("team", "team") + "\n" +
                                           MISSING.format("cost-center", "cost-center"))
        tidy = wait_for("the tidy pod's failure", lambda: (r := results(
            kube, "policyreports", after, "tidy")) and r["gpu-guardrails"][0] == "fail" and r)
        assert tidy["gpu-guardrails"][1] == MISSING.format("cost-center", "cost-center")
        assert tidy["gpu-quota"][0] == "pass"
        # kubectl shows them through the CRD's printer columns: namespace, name, kind, name,
        # pass, fail, ...
        listed = kube.run("get", "policyreports", "-A").stdout
        assert re.search(rf"^{before}\s+gpuguard-\S+\s+Pod\s+rogue\s+\d+\s+1\s", listed, re.M), listed

        # Fixed and deleted: the failure goes with the next audit.
        kube.run("label", "pod", "tidy", "cost-center=ml", "-n", after)
        kube.run("delete", "pod", "rogue", "-n", before, "--wait=true")
        reconfigure(required_labels=["team", "cost-center"], audit={"rate": 100})
        wait_for("the tidy pod's report passing", lambda: (r := results(
            kube, "policyreports", after, "tidy")) and r["gpu-guardrails"][0] == "pass")
        wait_for("the rogue pod's report gone", lambda: results(
            kube, "policyreports", before, "rogue") is None)

        # OpenReports: the same results in that API, and the PolicyReports gone.
        reconfigure(required_labels=["team", "cost-center"],
                    audit={"report_api": "openreports.io/v1alpha1"})
        wait_for("the tidy pod's Report", lambda: results(kube, "reports", after, "tidy"))
        wait_for("the tidy pod's PolicyReport gone", lambda: results(
            kube, "policyreports", after, "tidy") is None)
        assert {p: r for p, (r, _) in results(kube, "reports", after, "tidy").items()} == {
            p: r for p, (r, _) in tidy.items() if p != "gpu-guardrails"} | {
            "gpu-guardrails": "pass"}
        cluster_report = json.loads(kube.run("get", "clusterreports", "gpuguard-cluster",
                                             "-o", "json").stdout)
        assert cluster_report["source"] == "gpuguard"
        oks = re.findall(r'^gpuguard_audit_runs_total\{result="ok"\} (\S+)$', gpuguard.metrics(),
                         re.M)
        assert sum(float(v) for v in oks) >= 3  # the audits of the three reloads above
        assert gpuguard.metric("gpuguard_audit_resources") >= 1
    finally:
        for ns in (before, after):
            kube.run("delete", "namespace", ns, "--wait=false", check=False)
