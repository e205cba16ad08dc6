"""The Helm chart against a real control plane, in the order a platform team lives it: install
(with gpuguard's own certificates, short-lived so that they rotate while the tests run, and a
second policy source from a ConfigMap of the team's), a GPU pod admitted through the webhooks
the chart registered, an upgrade that changes the configuration, a CA rotation under load, and
an uninstall after which pods are created as if gpuguard had never been there.

The policy report CRDs (audit.reportCRDs) along the way: installed with the release where
absent, kept by the upgrade and the uninstall, and another tool's left alone by a later install.

The tests share one release and run in file order; each states what it relies on."""

import base64
import json
import time

import pytest
import yaml

from chart_support import (NAMESPACE, RELEASE, REPO, Load, apply, gpu_pod, kubectl_json,
                           publish_ready_endpoint, unpublish_ready_endpoint, wait)
from podrun import Deployment

CHART = REPO / "charts" / "gpuguard"
# The CRDs of the default report API (config.audit.report_api wgpolicyk8s.io/v1alpha2).
WGPOLICY_CRDS = ("policyreports.wgpolicyk8s.io", "clusterpolicyreports.wgpolicyk8s.io")
# What the report CRD tests saw: {CRD name: uid}.
REPORT_CRD_UIDS = {}
TEAM_NS = "chart-team-a"
REPLICAS = 2
# Short lifetimes: the CA is renewed 60 s after it is made, the serving certificate every 30 s.
CERT_VALUES = {"certs.caValidity": "90s", "certs.certValidity": "45s",
               "certs.checkInterval": "1s"}

# The team's own policy, in a ConfigMap of theirs, next to the shipped ones.
TEAM_POLICY = """\
-- ML pods say which experiment they belong to.
local k8s = require "k8s"
return {
  name = "team-experiments",
  match = { namespaces = { include = { "chart-team-*" } } },
  validate = function(req, pod)
    if k8s.label(pod, "team") == "ml" and k8s.label(pod, "experiment") == nil then
      req:deny("ML pods need the label experiment; add metadata.labels.experiment")
    end
  end,
}
"""


def record(cluster, **figures):
    """Figures for the record (build/chart-cluster/figures.json), kept across the tests."""
    path = cluster.dir / "figures.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(figures)
    path.write_text(json.dumps(data, indent=2) + "\n")


def webhook_configs(cluster):
    out = {}
    for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
        r = cluster.kubectl("get", kind, RELEASE, "-o", "json", check=False)
        out[kind] = json.loads(r.stdout) if r.returncode == 0 else None
    return out


def secret_data(cluster):
    s = kubectl_json(cluster, "get", "secret", "gpuguard-tls", "-n", NAMESPACE)
    return {k: base64.b64decode(v).decode() for k, v in (s.get("data") or {}).items()}


def install_args(extra=()):
    args = ["--namespace", NAMESPACE, "--set", f"replicaCount={REPLICAS}",
            "--set", "policies.extraSources[0].name=team-a",
            "--set", "policies.extraSources[0].configMap=team-a-policies"]
    for k, v in CERT_VALUES.items():
        args += ["--set", f"{k}={v}"]
    return args + list(extra)


@pytest.fixture(scope="module")
def release(cluster, helm):
    """The chart installed and its Deployment's pods serving (podrun.Deployment)."""
    apply(cluster, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
          {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TEAM_NS}},
          {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "team-a-policies", "namespace": NAMESPACE},
           "data": {"70-team-experiments.lua": TEAM_POLICY}})
    helm.run("install", RELEASE, str(CHART), *install_args())
    publish_ready_endpoint(cluster)
    dep = Deployment(cluster, NAMESPACE, RELEASE)
    yield dep
    dep.stop()
    unpublish_ready_endpoint(cluster)


def test_first_install_never_blocks_pods(cluster, release, api):
    """Before gpuguard serves, the webhooks are Ignore without a caBundle: pods are created."""
    for kind, cfg in webhook_configs(cluster).items():
        assert cfg, kind
        for hook in cfg["webhooks"]:
            assert hook["failurePolicy"] == "Ignore", (kind, hook["name"])
            assert not hook["clientConfig"].get("caBundle"), (kind, hook["name"])
    status, body = api.create_pod(gpu_pod(TEAM_NS), dry_run=True)
    assert status == 201, body


def crd(cluster, name):
    """The CRD of that name in the cluster, or None."""
    r = cluster.kubectl("get", "crd", name, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def helm_owner(obj):
    annotations = obj["metadata"].get("annotations") or {}
    return (annotations.get("meta.helm.sh/release-name"),
            annotations.get("meta.helm.sh/release-namespace"))


def test_the_report_crds_are_installed_where_absent(cluster, release):
    """The release installed the report API's CRDs, established, owned by it and kept at
    uninstall (helm.sh/resource-policy keep)."""
    for name in WGPOLICY_CRDS:
        obj = crd(cluster, name)
        assert obj, name
        assert helm_owner(obj) == (RELEASE, NAMESPACE)
        assert obj["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert any(c["type"] == "Established" and c["status"] == "True"
                   for c in obj["status"]["conditions"]), name
        REPORT_CRD_UIDS[name] = obj["metadata"]["uid"]


def test_gpuguard_writes_its_bundle_and_then_fails_closed(cluster, release):
    release.start()
    data = secret_data(cluster)
    assert sorted(data) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]

    def written():
        cfgs = webhook_configs(cluster).values()
        return all(h["failurePolicy"] == "Fail" and h["clientConfig"].get("caBundle")
                   for cfg in cfgs for h in cfg["webhooks"])
    wait("both webhook configurations Fail with a caBundle", written)
    # The replicas started together; the first to write the Secret won, the other serves that.
    serials = set()
    for pod, _, _ in release.running:
        lines = (cluster.dir / "logs" / f"{pod}.log").read_text().splitlines()
        serials.add([json.loads(l)["serial"] for l in lines
                     if '"certificates: serving"' in l][-1])
    assert len(serials) == 1, serials
    ca = secret_data(cluster)["ca.crt"]
    for cfg in webhook_configs(cluster).values():
        for hook in cfg["webhooks"]:
            assert base64.b64decode(hook["clientConfig"]["caBundle"]).decode() == ca


def test_a_gpu_pod_is_admitted_through_the_chart(cluster, release, api):
    pod = gpu_pod(TEAM_NS, "trainer", labels={"experiment": "e1"})
    status, body = api.create_pod(pod)
    assert status == 201, body
    stored = kubectl_json(cluster, "get", "pod", "trainer", "-n", TEAM_NS)
    assert "gpuguard.io/decision" in stored["metadata"]["annotations"]
    assert stored["spec"]["nodeSelector"]["gpuguard.io/pool"]


def test_both_policy_sources_are_in_effect(release, api):
    # The team's policy, from its ConfigMap.
    status, body = api.create_pod(gpu_pod(TEAM_NS), dry_run=True)
    assert status == 403 and "team-experiments: ML pods need the label experiment" in \
        body["message"], body
    # A shipped one (gpu-guardrails: the team label), from the image.
    pod = gpu_pod(TEAM_NS, labels={"experiment": "e1"})
    del pod["metadata"]["labels"]["team"]
    status, body = api.create_pod(pod, dry_run=True)
    assert status == 403 and "gpu-guardrails: GPU pods need the label team" in body["message"], body


def test_an_upgrade_reloads_the_configuration_with_no_failed_review(cluster, helm, release, api):
    before = webhook_configs(cluster)
    with Load(api, TEAM_NS) as load:
        helm.run("upgrade", RELEASE, str(CHART), *install_args(
            ["--set", "config.guardrails.required_labels={team,cost-center}"]))
        release.sync()  # the kubelet's sync of the ConfigMap volume: gpuguard reloads

        def reloaded():
            status, body = api.create_pod(gpu_pod(TEAM_NS, labels={"experiment": "e1"}),
                                          dry_run=True)
            return status == 403 and "cost-center" in body["message"]
        wait("the new required label enforced", reloaded)
    record(cluster, upgrade_reviews=load.sent, upgrade_failed=len(load.failed))
    assert load.sent > 0
    assert load.failed == [], load.failed[:3]
    # The upgrade rendered the live bundle and Fail (lookup): it never reopened the webhooks.
    after = webhook_configs(cluster)
    for kind in after:
        for old, new in zip(before[kind]["webhooks"], after[kind]["webhooks"]):
            assert new["failurePolicy"] == "Fail"
            assert new["clientConfig"]["caBundle"] == old["clientConfig"]["caBundle"]


def test_the_ca_rotates_under_load_with_no_failed_review(cluster, release, api):
    """The CA lives 90 s and is renewed with a third left: the Secret and the caBundle change,
    and the old CA stays in the bundle until the new serving certificate serves everywhere."""
    first_ca = secret_data(cluster)["ca.crt"]
    bundles = set()
    with Load(api, TEAM_NS) as load:
        def rotated():
            for cfg in webhook_configs(cluster).values():
                bundles.add(cfg["webhooks"][0]["clientConfig"]["caBundle"])
            data = secret_data(cluster)
            return data["ca.crt"] != first_ca and first_ca not in data["ca.crt"]
        wait("a new CA, and the old one dropped after it expired", rotated, timeout=240,
             interval=1)
        time.sleep(5)  # reviews with the new certificate alone
    record(cluster, rotation_reviews=load.sent, rotation_failed=len(load.failed),
           rotation_bundles_seen=len(bundles))
    assert len(bundles) >= 2
    assert load.sent > 0
    assert load.failed == [], (len(load.failed), load.failed[:3])


def test_uninstall_leaves_no_webhook_and_pods_are_created(cluster, helm, release, api):
    helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
    assert webhook_configs(cluster) == {"validatingwebhookconfigurations": None,
                                        "mutatingwebhookconfigurations": None}
    release.stop()
    pod = gpu_pod(TEAM_NS)
    status, body = api.create_pod(pod)
    assert status == 201, body
    assert "gpuguard.io/decision" not in (body["metadata"].get("annotations") or {})
    # The GPUQuota CRD is kept (crds/): users' quotas outlive the release.
    assert cluster.kubectl("get", "crd", "gpuquotas.gpuguard.io", check=False).returncode == 0


def test_report_crds_outlive_the_release_and_another_tools_are_left_alone(cluster, helm):
    """After the uninstall: the report CRDs are still there, the very objects the release
    installed (an upgrade kept them too: same uid).  Then, with the openreports.io API's
    ClusterReport CRD created by another tool (kubectl create, no Helm annotations), an install
    with report_api openreports.io neither fails nor takes it over, and installs the Report CRD
    it lacks; an upgrade back to wgpolicyk8s.io takes the release's kept CRDs back and keeps
    the Report CRD it no longer renders; its uninstall leaves all four."""
    assert set(REPORT_CRD_UIDS) == set(WGPOLICY_CRDS), "the install's test ran"
    for name, uid in REPORT_CRD_UIDS.items():
        obj = crd(cluster, name)
        assert obj and obj["metadata"]["uid"] == uid, name

    files = [d for d in yaml.safe_load_all(
        (REPO / "deploy" / "reports" / "openreports.io.yaml").read_text()) if d]
    [foreign] = [d for d in files if d["metadata"]["name"] == "clusterreports.openreports.io"]
    foreign["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "another-tool"}
    cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(foreign))
    foreign_uid = crd(cluster, "clusterreports.openreports.io")["metadata"]["uid"]

    args = ["--namespace", NAMESPACE, "--set", "replicaCount=0"]
    helm.run("install", RELEASE, str(CHART), *args,
             "--set", "config.audit.report_api=openreports.io/v1alpha1")
    theirs = crd(cluster, "clusterreports.openreports.io")
    assert theirs["metadata"]["uid"] == foreign_uid
    assert helm_owner(theirs) == (None, None)
    assert theirs["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "another-tool"}
    ours = crd(cluster, "reports.openreports.io")
    assert ours and helm_owner(ours) == (RELEASE, NAMESPACE)

    helm.run("upgrade", RELEASE, str(CHART), *args)
    for name, uid in REPORT_CRD_UIDS.items():
        obj = crd(cluster, name)
        assert obj["metadata"]["uid"] == uid and helm_owner(obj) == (RELEASE, NAMESPACE), name
    assert crd(cluster, "reports.openreports.io")["metadata"]["uid"] == \
        ours["metadata"]["uid"], "kept though no longer rendered"

    helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
    for name in (*WGPOLICY_CRDS, "reports.openreports.io", "clusterreports.openreports.io"):
        assert crd(cluster, name), name
