"""test_chart.py - the Helm chart charts/gpuguard, rendered only (no cluster): helm lint and
helm template, and the files made from the chart held to it.

- helm lint passes in each certificate mode; the values schema refuses a value the chart does
  not know and a typo inside `config` (the configuration's own JSON Schema);
- deploy/install.yaml, the cert-manager overlay's objects, values.schema.json and the config
  defaults are what charts/generate.py makes now (`make chart-schema install-yaml`);
- each kustomize render of deploy/ equals `helm template` with the matching values, object for
  object: the default (certs.mode self), the cert-manager and provided-certs overlays, the
  network-policy component;
- what values do: extra policy sources, monitoring objects only where the Prometheus
  Operator's API is served, the release namespace, each certificate mode's rights;
- every certificate mode: the webhooks are Ignore until lookup finds the policy gpuguard
  writes (webhook.failurePolicy) in the cluster, then webhook.failurePolicy, in self mode with
  the live CA (on a copy of the chart whose lookup reads values instead);
- `helm uninstall` deletes the webhook configurations first (the pre-delete hooks);
- the policy report CRDs of config.audit.report_api (files/reports, symlinks to deploy/reports):
  rendered where lookup finds none or this release's own, never another tool's, kept at
  uninstall, left out with audit.reportCRDs=false (and of deploy/install.yaml); each a
  structural CRD whose schema takes a Kyverno-like report and refuses a malformed result; the
  ClusterRole's rights for the audit.

Skipped, saying why, without build/k8s/bin/helm (`make helm-bin`); the kustomize comparisons
also need kubectl.  The helpers of test_deploy.py render the kustomize side.
"""

import base64
import re
import shutil
import subprocess
import tarfile

import jsonschema
import pytest
import yaml

from test_deploy import (CHART, DEPLOY, KUBECTL, NAMESPACE, OVERLAYS, PLACEHOLDER, REPO,
                         WEBHOOK_KINDS, compose, container, find, kustomize, one, split_flags)

HELM = REPO / "build" / "k8s" / "bin" / "helm"
GENERATE = REPO / "charts" / "generate.py"
ALERTS = DEPLOY / "prometheus" / "gpuguard-alerts.yaml"
# A caBundle as `gpuguard certs` prints one (the base64 of a PEM file).
CA_BUNDLE = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n...\n").decode()
# What deploy/ leaves out of the default render (charts/generate.py, DEPLOY_ARGS; --no-hooks is
# template()'s own): the policy report CRDs.
AS_DEPLOY = ("--set", "audit.reportCRDs=false")

pytestmark = pytest.mark.skipif(
    not HELM.exists(), reason="build/k8s/bin/helm is missing: `make helm-bin` builds it")
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not installed: the kustomize renders are not checked")


def helm(*args, chart=CHART):
    """helm ARGS... CHART, its result (helm notes that it follows the alerts' symlink)."""
    return subprocess.run([str(HELM), *args, str(chart)], capture_output=True, text=True,
                          timeout=120)


def template(*args, namespace=NAMESPACE, chart=CHART):
    """`helm template` of the release gpuguard with the CRDs and without the uninstall
    hooks, as deploy/install.yaml is made: its documents."""
    res = helm("template", "gpuguard", "--namespace", namespace, "--include-crds", "--no-hooks",
               *args, chart=chart)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def refused(*args):
    """helm template's error for these arguments (it must fail)."""
    res = helm("template", "gpuguard", "--namespace", NAMESPACE, *args)
    assert res.returncode != 0, "rendered"
    return res.stderr


def objects(docs):
    """{(kind, namespace, name): object}, each object once."""
    out = {}
    for d in docs:
        key = (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
        assert key not in out, f"{key} twice"
        out[key] = d
    return out


def assert_same_objects(kustomized, helmed):
    """The kustomize render is the chart's, object for object, and the Namespace that the
    chart leaves to `helm install --create-namespace`."""
    got, want = objects(kustomized), objects(helmed)
    assert got.pop(("Namespace", "", NAMESPACE))["metadata"]["name"] == NAMESPACE
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key] == want[key], key


def values_file(tmp_path, values):
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


# ---------------------------------------------------------------- lint, schema, generated files


@pytest.mark.parametrize("mode", ["self", "cert-manager", "provided"])
def test_lint(mode):
    res = helm("lint", "--strict", "--set", f"certs.mode={mode}",
               *(["--set", f"certs.caBundle={CA_BUNDLE}"] if mode == "provided" else []))
    assert res.returncode == 0, res.stdout + res.stderr


def test_generated_files_are_current():
    """values.schema.json, the config defaults in values.yaml, deploy/install.yaml and the
    cert-manager overlay's objects are what the chart and deploy/gpuguard.yaml make now."""
    res = subprocess.run(["/usr/bin/python3", str(GENERATE), "--check", "--helm", str(HELM),
                          "schema", "values", "install"], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr


def test_the_schema_refuses_values_the_chart_does_not_know():
    assert "additional properties 'replicas' not allowed" in refused("--set", "replicas=5")
    assert "certs/mode" in refused("--set", "certs.mode=vault")
    assert "certs/caBundle" in refused("--set", "certs.mode=provided", "--set",
                                       "certs.caBundle=-----BEGIN CERTIFICATE-----")


def typo_values():
    """The default config with the first pool's `sharing` misspelled."""
    config = yaml.safe_load((CHART / "values.yaml").read_text())["config"]
    pools = [dict(p) for p in config["pools"]]
    pools[0]["sharng"] = pools[0].pop("sharing")
    return {"config": {"pools": pools}}


def test_a_config_typo_is_refused(tmp_path):
    """config is checked against the configuration's own schema: `helm install` (as helm
    template and lint here) names the key, before anything reaches the cluster."""
    values = values_file(tmp_path, typo_values())
    assert "at '/config/pools/0': additional properties 'sharng' not allowed" in \
        refused("-f", values)
    res = helm("lint", "-f", values)
    assert res.returncode != 0 and "'sharng' not allowed" in res.stdout, res.stdout


def test_sections_of_your_own_policies_are_allowed():
    """The configuration's top level takes sections the shipped policies do not read (a
    policy of yours declares its own), and they reach the ConfigMap."""
    docs = template("--set", "config.team_limits.team-a=3")
    config = yaml.safe_load(one(docs, "ConfigMap", "gpuguard-config")["data"]["gpuguard.yaml"])
    assert config["team_limits"] == {"team-a": 3}
    assert config["pools"], "merged into the defaults"


def test_the_chart_renders_no_namespace():
    """Helm's convention (--create-namespace); deploy/install.yaml starts with one."""
    assert not find(template(), "Namespace")
    first = next(d for d in yaml.safe_load_all((DEPLOY / "install.yaml").read_text()) if d)
    assert (first["kind"], first["metadata"]["name"]) == ("Namespace", NAMESPACE)


def test_the_packaged_chart_holds_the_alerts(tmp_path):
    """files/gpuguard-alerts.yaml is a symlink to deploy/prometheus (the rules' one home):
    `helm package` stores the file it points to."""
    res = subprocess.run([str(HELM), "package", str(CHART), "--destination", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    [tgz] = tmp_path.glob("gpuguard-*.tgz")
    with tarfile.open(tgz) as tar:
        member = tar.getmember("gpuguard/files/gpuguard-alerts.yaml")
        assert member.isfile()
        assert tar.extractfile(member).read() == ALERTS.read_bytes()
        assert "gpuguard/values.schema.base.json" not in tar.getnames()


# ---------------------------------------------------------------- kustomize = helm template


@needs_kubectl
def test_deploy_is_the_default_render():
    assert_same_objects(kustomize(DEPLOY), template(*AS_DEPLOY))


@needs_kubectl
def test_cert_manager_overlay_is_the_chart_with_cert_manager(tmp_path):
    assert_same_objects(compose(tmp_path / "k", DEPLOY, OVERLAYS / "cert-manager"),
                        template(*AS_DEPLOY, "--set", "certs.mode=cert-manager"))


@needs_kubectl
def test_provided_certs_overlay_is_the_chart_with_provided_certs(tmp_path):
    """With the caBundle patch `gpuguard certs --kustomize-patch` writes (its placeholder
    replaced here) and the same CA as certs.caBundle."""
    deploy = tmp_path / "gpuguard" / "deploy"
    shutil.copytree(DEPLOY, deploy)
    patch = deploy / "overlays" / "provided-certs" / "webhook-cabundle.yaml"
    patch.write_text(patch.read_text().replace(PLACEHOLDER, CA_BUNDLE))
    assert_same_objects(compose(tmp_path / "k", deploy, deploy / "overlays" / "provided-certs"),
                        template(*AS_DEPLOY, "--set", "certs.mode=provided", "--set",
                                 f"certs.caBundle={CA_BUNDLE}"))


@needs_kubectl
def test_network_policy_component_is_the_chart_with_webhook_from(tmp_path):
    cidr = "REPLACE-ME--control-plane-CIDR"
    assert_same_objects(
        compose(tmp_path / "k", DEPLOY, OVERLAYS / "cert-manager",
                DEPLOY / "components" / "network-policy"),
        template(*AS_DEPLOY, "--set", "certs.mode=cert-manager",
                 "--set", f"networkPolicy.webhookFrom[0].ipBlock.cidr={cidr}"))


def test_network_policy_can_be_left_out():
    assert not find(template("--set", "networkPolicy.enabled=false"), "NetworkPolicy")


# ---------------------------------------------------------------- what values do


def test_extra_policy_sources(tmp_path):
    """Each source is a ConfigMap mounted read-only as a directory of its own, and another
    --policies after the image's; self mode or not."""
    sources = [{"name": "team-a", "configMap": "team-a-policies"},
               {"name": "platform", "configMap": "platform-gpu-rules"}]
    for mode in ("self", "cert-manager"):
        docs = template("-f", values_file(tmp_path, {"policies": {"extraSources": sources}}),
                        "--set", f"certs.mode={mode}")
        ctr = container(docs)
        assert split_flags(ctr["args"])["--policies"] == [
            "/usr/share/gpuguard/policies", "/etc/gpuguard/policies/team-a",
            "/etc/gpuguard/policies/platform"]
        mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
        volumes = {v["name"]: v for v in
                   one(docs, "Deployment", "gpuguard")["spec"]["template"]["spec"]["volumes"]}
        for src in sources:
            m = mounts[f"/etc/gpuguard/policies/{src['name']}"]
            assert m["readOnly"] is True and "subPath" not in m
            assert volumes[m["name"]] == {"name": m["name"],
                                          "configMap": {"name": src["configMap"]}}
    assert "extraSources/0/name" in refused("--set", "policies.extraSources[0].name=Team_A",
                                            "--set", "policies.extraSources[0].configMap=x")


def test_monitoring_only_with_the_operator_api():
    """Without monitoring.coreos.com/v1 in the cluster (and so in deploy/install.yaml) the
    chart renders neither object; with it, both, the rule's spec being
    deploy/prometheus/gpuguard-alerts.yaml's."""
    kinds = ("ServiceMonitor", "PrometheusRule")
    assert not [d for d in template() if d["kind"] in kinds]
    api = ("--api-versions", "monitoring.coreos.com/v1")
    docs = template(*api, "--set", "monitoring.rules.labels.release=kube-prometheus-stack")
    rule = one(docs, "PrometheusRule", "gpuguard")
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())["spec"]
    monitor = one(docs, "ServiceMonitor", "gpuguard")
    service = one(docs, "Service", "gpuguard")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == \
        [p["name"] for p in service["spec"]["ports"] if p["port"] == 9090]
    off = template(*api, "--set", "monitoring.rules.enabled=false",
                   "--set", "monitoring.serviceMonitor.enabled=false")
    assert not [d for d in off if d["kind"] in kinds]


def test_the_release_namespace_is_used_throughout():
    ns = "gpu-admission"
    for mode in ("self", "cert-manager"):
        docs = template("--set", f"certs.mode={mode}", namespace=ns)
        cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                          *WEBHOOK_KINDS}
        for d in docs:
            assert d["metadata"].get("namespace") == (None if d["kind"] in cluster_scoped else ns)
        for kind in WEBHOOK_KINDS:
            for hook in one(docs, kind, "gpuguard")["webhooks"]:
                assert hook["clientConfig"]["service"]["namespace"] == ns
                excluded = {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                            "values": ["kube-system", ns]}
                assert excluded in hook["namespaceSelector"]["matchExpressions"]
        flags = split_flags(container(docs)["args"])
        if mode == "self":
            assert flags["--tls-secret"] == f"{ns}/gpuguard-tls"
        else:
            serving = one(docs, "Certificate", "gpuguard-serving")
            assert f"gpuguard.{ns}.svc" in serving["spec"]["dnsNames"]


@pytest.mark.parametrize("mode", ["self", "cert-manager", "provided"])
def test_certificate_rights_and_secret_by_mode(mode):
    """Every mode may read and update the two webhook configurations by name (gpuguard writes
    their failurePolicy); only a self-managed gpuguard its Secret (shipped empty); no mode
    creates anything but the Lease and the audit's policy reports."""
    docs = template("--set", f"certs.mode={mode}", "--set", f"certs.caBundle={CA_BUNDLE}")
    rules = one(docs, "ClusterRole", "gpuguard")["rules"] + one(docs, "Role", "gpuguard")["rules"]
    for rule in rules:
        assert "create" not in rule["verbs"] or rule["resources"] == ["leases"] or \
            rule["apiGroups"] in (["wgpolicyk8s.io"], ["openreports.io"]), rule
    mine = [(r["resources"], r["resourceNames"], r["verbs"]) for r in rules
            if {"secrets", "validatingwebhookconfigurations",
                "mutatingwebhookconfigurations"} & set(r["resources"])]
    webhooks = (["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
                ["gpuguard"], ["get", "update"])
    secrets = find(docs, "Secret")
    if mode == "self":
        assert mine == [webhooks, (["secrets"], ["gpuguard-tls"], ["get", "update"])]
        [secret] = secrets
        assert secret["metadata"]["name"] == "gpuguard-tls" and set(secret) == {
            "apiVersion", "kind", "metadata", "type"}
    else:
        assert mine == [webhooks]
        assert not secrets, "the Secret is cert-manager's or yours"


def test_provided_certs_need_the_ca_bundle():
    assert "certs.caBundle" in refused("--set", "certs.mode=provided")


# ---------------------------------------------------------------- first install, upgrade

# Each mode's values, and the caBundle its manifest carries (cert-manager: none, the
# injector's; self: gpuguard's, from the cluster only).
MODES = {"self": ((), None),
         "cert-manager": (("--set", "certs.mode=cert-manager"), None),
         "provided": (("--set", "certs.mode=provided", "--set", f"certs.caBundle={CA_BUNDLE}"),
                      CA_BUNDLE)}


def webhooks(docs):
    return [hook for kind in WEBHOOK_KINDS for hook in one(docs, kind, "gpuguard")["webhooks"]]


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_ships_ignore_without_a_cluster(mode):
    """`helm template` (lookup finds nothing): failurePolicy Ignore, whatever the mode, and the
    policy gpuguard writes into both configurations once it is trusted is
    webhook.failurePolicy."""
    args, bundle = MODES[mode]
    for policy in ("Fail", "Ignore"):
        docs = template(*args, "--set", f"webhook.failurePolicy={policy}")
        for hook in webhooks(docs):
            assert hook["failurePolicy"] == "Ignore"
            assert hook["clientConfig"].get("caBundle") == bundle
        flags = split_flags(container(docs)["args"])
        assert (flags["--webhook-configuration"], flags["--webhook-failure-policy"]) == \
            ("gpuguard", policy)
        assert ("--tls-secret" in flags) == (mode == "self")


@pytest.fixture(scope="module")
def looking_chart(tmp_path_factory):
    """A copy of the chart whose lookups of the two webhook configurations read the values
    live.validating and live.mutating (and with no values schema, which refuses them)."""
    chart = tmp_path_factory.mktemp("chart") / "gpuguard"
    shutil.copytree(CHART, chart)  # the alerts' symlink copied as the file
    (chart / "values.schema.json").unlink()
    path = chart / "templates" / "webhooks.yaml"
    text = path.read_text()
    for kind in ("Validating", "Mutating"):
        lookup = (f'(lookup "admissionregistration.k8s.io/v1" "{kind}WebhookConfiguration" '
                  '"" "gpuguard")')
        assert text.count(lookup) == 1, lookup
        text = text.replace(lookup, f"(.Values.live.{kind.lower()} | default dict)")
    path.write_text(text)
    return chart


def live_configurations(policy, validating_bundles, mutating_bundles):
    """live values: the configurations with failurePolicy policy and these caBundles per
    webhook (None: none)."""
    def hooks(names, bundles):
        return {"webhooks": [{"name": n, "failurePolicy": policy,
                              "clientConfig": {} if b is None else {"caBundle": b}}
                             for n, b in zip(names, bundles)]}
    return {"live": {
        "validating": hooks(["validate.gpuguard.io", "workloads.validate.gpuguard.io"],
                            validating_bundles),
        "mutating": hooks(["mutate.gpuguard.io", "workloads.mutate.gpuguard.io"],
                          mutating_bundles)}}


@pytest.mark.parametrize("mode", MODES)
def test_an_upgrade_keeps_the_failure_policy_gpuguard_wrote(looking_chart, tmp_path, mode):
    """Once gpuguard has written webhook.failurePolicy (on the validating configuration's first
    webhook), an upgrade renders every webhook with it: the upgrade never reopens them.  In self
    mode each webhook keeps its live caBundle (a webhook without one gets the first's); the
    other modes' caBundle is their own (certs.caBundle, or none: the injector's)."""
    args, bundle = MODES[mode]
    for policy in ("Fail", "Ignore"):
        values = values_file(tmp_path, live_configurations(policy, ["Q0E=", "Q0E="],
                                                           ["Q0E=", None]))
        docs = template("-f", values, *args, "--set", f"webhook.failurePolicy={policy}",
                        chart=looking_chart)
        for hook in webhooks(docs):
            assert hook["failurePolicy"] == policy
            assert hook["clientConfig"].get("caBundle") == ("Q0E=" if mode == "self" else bundle)


@pytest.mark.parametrize("mode", MODES)
def test_an_install_before_gpuguard_wrote_its_policy_stays_open(looking_chart, tmp_path, mode):
    """Configurations in the cluster whose first validating webhook is not webhook.failurePolicy
    (an earlier install whose gpuguard has not served yet, or webhook.failurePolicy changed
    since) are no reason to close the webhooks, nor a live CA one to trust (self mode)."""
    args, bundle = MODES[mode]
    for live, policy in (("Ignore", "Fail"), ("Fail", "Ignore")):
        values = values_file(tmp_path, live_configurations(live, ["Q0E=", "Q0E="],
                                                           ["Q0E=", "Q0E="]))
        docs = template("-f", values, *args, "--set", f"webhook.failurePolicy={policy}",
                        chart=looking_chart)
        for hook in webhooks(docs):
            assert hook["failurePolicy"] == "Ignore"
            assert hook["clientConfig"].get("caBundle") == bundle


# ---------------------------------------------------------------- uninstall


def test_uninstall_deletes_the_webhook_configurations_first():
    """helm uninstall deletes webhook configuration kinds after every kind it knows (the
    Service, the Deployment): the chart's pre-delete hooks, objects of the same kinds and
    name whose delete policy before-hook-creation makes Helm delete the live configurations
    first, intercept nothing themselves and are deleted once created
    (templates/uninstall-webhooks.yaml says why)."""
    res = helm("template", "gpuguard", "--namespace", NAMESPACE)
    assert res.returncode == 0, res.stderr
    hooks = [d for d in yaml.safe_load_all(res.stdout)
             if d and "helm.sh/hook" in d["metadata"].get("annotations", {})]
    assert sorted(d["kind"] for d in hooks) == sorted(WEBHOOK_KINDS)
    for hook in hooks:
        assert hook["metadata"]["name"] == "gpuguard"
        annotations = hook["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete"
        policies = annotations["helm.sh/hook-delete-policy"].split(",")
        assert {"before-hook-creation", "hook-succeeded"} <= set(policies)
        assert hook["webhooks"] == []
    assert "helm.sh/hook" not in (DEPLOY / "install.yaml").read_text(), "kubectl has no hooks"


# ---------------------------------------------------------------- policy report CRDs

REPORTS = DEPLOY / "reports"
# The CRDs of each report API (config.audit.report_api), as the upstream Go types name them:
# {CRD name: (kind, short name, scope)}.
REPORT_CRDS = {
    "wgpolicyk8s.io/v1alpha2": {
        "policyreports.wgpolicyk8s.io": ("PolicyReport", "polr", "Namespaced"),
        "clusterpolicyreports.wgpolicyk8s.io": ("ClusterPolicyReport", "cpolr", "Cluster")},
    "openreports.io/v1alpha1": {
        "reports.openreports.io": ("Report", "reps", "Namespaced"),
        "clusterreports.openreports.io": ("ClusterReport", "creps", "Cluster")},
}
RESULTS = ["pass", "fail", "warn", "error", "skip"]
OBJECT_REFERENCE = {"apiVersion", "kind", "namespace", "name", "uid", "resourceVersion",
                    "fieldPath"}
LABEL_SELECTOR = {"matchLabels", "matchExpressions"}
# The fields of the upstream types (policyreport_types.go, report_types.go): what each schema
# must have, no more, so that a cluster with upstream's CRD and one with ours prune and accept
# alike.
RESULT_FIELDS = {"source", "policy", "rule", "category", "severity", "timestamp", "result",
                 "scored", "resources", "resourceSelector", "message", "properties"}
TOP_FIELDS = {"apiVersion", "kind", "metadata", "scope", "scopeSelector", "summary", "results"}
OPENREPORTS_TOP_FIELDS = {"source", "configuration"}


def report_crds(docs):
    return {d["metadata"]["name"]: d for d in find(docs, "CustomResourceDefinition")
            if d["spec"]["group"] in ("wgpolicyk8s.io", "openreports.io")}


def report_files():
    """{CRD name: the CRD as deploy/reports holds it}, both APIs."""
    out = {}
    for path in sorted(REPORTS.glob("*.yaml")):
        for d in yaml.safe_load_all(path.read_text()):
            if d:
                out[d["metadata"]["name"]] = d
    return out


def report_schema(name):
    [version] = report_files()[name]["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("api", [None, *REPORT_CRDS])
def test_the_report_crds_of_the_configured_api_render(api):
    """audit.reportCRDs (on): the two CRDs of config.audit.report_api (default wgpolicyk8s.io),
    as deploy/reports holds them, with the chart's labels and helm.sh/resource-policy keep;
    none of the other API."""
    args = ("--set", f"config.audit.report_api={api}") if api else ()
    crds = report_crds(template(*args))
    files = report_files()
    assert set(crds) == set(REPORT_CRDS[api or "wgpolicyk8s.io/v1alpha2"])
    for name, crd in crds.items():
        assert crd["spec"] == files[name]["spec"], name
        meta = crd["metadata"]
        assert meta["annotations"] == {"helm.sh/resource-policy": "keep"}, name
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert meta["labels"]["app.kubernetes.io/instance"] == "gpuguard"
        assert "namespace" not in meta


def test_report_crds_off():
    for api in REPORT_CRDS:
        assert not report_crds(template("--set", "audit.reportCRDs=false",
                                        "--set", f"config.audit.report_api={api}"))


def test_deploy_install_yaml_leaves_the_report_crds_out():
    """kubectl apply would take over another tool's CRDs (kubectl create -f deploy/reports/...
    instead): install.yaml holds the GPUQuota CRD alone."""
    docs = [d for d in yaml.safe_load_all((DEPLOY / "install.yaml").read_text()) if d]
    assert [d["metadata"]["name"] for d in find(docs, "CustomResourceDefinition")] == [
        "gpuquotas.gpuguard.io"]


def test_the_chart_reads_the_report_crds_from_deploy(tmp_path):
    """files/reports/*.yaml are symlinks to deploy/reports (the CRDs' one home, as the alerts'),
    and `helm package` stores the files they point to."""
    links = sorted((CHART / "files" / "reports").iterdir())
    assert [p.name for p in links] == ["openreports.io.yaml", "wgpolicyk8s.io.yaml"]
    for link in links:
        assert link.is_symlink() and link.resolve() == (REPORTS / link.name).resolve()
    res = subprocess.run([str(HELM), "package", str(CHART), "--destination", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    [tgz] = tmp_path.glob("gpuguard-*.tgz")
    with tarfile.open(tgz) as tar:
        for link in links:
            member = tar.getmember(f"gpuguard/files/reports/{link.name}")
            assert member.isfile()
            assert tar.extractfile(member).read() == (REPORTS / link.name).read_bytes()


@pytest.fixture(scope="module")
def crd_looking_chart(tmp_path_factory):
    """A copy of the chart whose lookup of a report CRD reads the value live.crds.<name>."""
    chart = tmp_path_factory.mktemp("chart") / "gpuguard"
    shutil.copytree(CHART, chart)
    (chart / "values.schema.json").unlink()
    path = chart / "templates" / "report-crds.yaml"
    text = path.read_text()
    lookup = 'lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" $crd.metadata.name'
    assert text.count(lookup) == 1, lookup
    path.write_text(text.replace(
        lookup, "(get ($.Values.live.crds | default dict) $crd.metadata.name)"))
    return chart


def live_crd(release=None, namespace=NAMESPACE):
    """A CRD in the cluster: Helm's (its ownership annotations) or another tool's (None)."""
    meta = {"labels": {"app.kubernetes.io/managed-by": "kyverno"}}
    if release:
        meta = {"labels": {"app.kubernetes.io/managed-by": "Helm"}, "annotations": {
            "meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace}}
    return {"metadata": meta}


@pytest.mark.parametrize("live,rendered", [
    ({}, {"policyreports.wgpolicyk8s.io", "clusterpolicyreports.wgpolicyk8s.io"}),
    # this release's own (an upgrade, or a release installed again after an uninstall): kept
    ({"policyreports.wgpolicyk8s.io": live_crd("gpuguard"),
      "clusterpolicyreports.wgpolicyk8s.io": live_crd("gpuguard")},
     {"policyreports.wgpolicyk8s.io", "clusterpolicyreports.wgpolicyk8s.io"}),
    # another tool's (kubectl create, Kyverno's chart, a release of another name or namespace)
    ({"policyreports.wgpolicyk8s.io": live_crd(),
      "clusterpolicyreports.wgpolicyk8s.io": live_crd("kyverno", "kyverno")}, set()),
    ({"clusterpolicyreports.wgpolicyk8s.io": live_crd("gpuguard", "elsewhere")},
     {"policyreports.wgpolicyk8s.io"}),
], ids=["absent", "this-release", "other-tools", "other-namespace"])
def test_report_crds_render_only_where_absent_or_ours(crd_looking_chart, tmp_path, live,
                                                      rendered):
    """Helm refuses to install over an object it does not own: a CRD another tool installed is
    not rendered (left as it is, and the install goes on); this release's is (kept)."""
    values = values_file(tmp_path, {"live": {"crds": live}})
    assert set(report_crds(template("-f", values, chart=crd_looking_chart))) == rendered


def schema_problems(node, path="."):
    """What makes an OpenAPI schema not structural (a type on every node, no logic keywords
    but under x-kubernetes-int-or-string, nothing kept unknown) or looser than upstream's."""
    problems = []
    if "type" not in node:
        problems.append(f"{path}: no type")
    for key in ("anyOf", "allOf", "oneOf", "not", "x-kubernetes-preserve-unknown-fields",
                "x-kubernetes-int-or-string", "nullable", "default"):
        if key in node:
            problems.append(f"{path}: {key}")
    for key, sub in node.get("properties", {}).items():
        problems += schema_problems(sub, f"{path}.{key}".replace("..", "."))
    if "items" in node:
        problems += schema_problems(node["items"], path + "[]")
    if isinstance(node.get("additionalProperties"), dict):
        problems += schema_problems(node["additionalProperties"], path + ".*")
    return problems


@pytest.mark.parametrize("name", [n for crds in REPORT_CRDS.values() for n in crds])
def test_each_report_crd_is_structural_and_upstreams_shape(name):
    crd = report_files()[name]
    spec = crd["spec"]
    kind, short, scope = next(c[name] for c in REPORT_CRDS.values() if name in c)
    plural, group = name.split(".", 1)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert (spec["group"], spec["scope"]) == (group, scope)
    assert spec["names"] == {"kind": kind, "listKind": kind + "List", "plural": plural,
                             "singular": plural[:-1], "shortNames": [short]}
    [version] = spec["versions"]
    assert version["name"] == ("v1alpha2" if group == "wgpolicyk8s.io" else "v1alpha1")
    assert version["served"] and version["storage"]
    assert [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]] == [
        ("Kind", ".scope.kind"), ("Name", ".scope.name"),
        *[(r.capitalize(), f".summary.{r}") for r in RESULTS],
        ("Age", ".metadata.creationTimestamp")]
    schema = version["schema"]["openAPIV3Schema"]
    assert schema_problems(schema) == []
    props = schema["properties"]
    openreports = group == "openreports.io"
    assert set(props) == TOP_FIELDS | (OPENREPORTS_TOP_FIELDS if openreports else set())
    assert "required" not in schema
    assert set(props["scope"]["properties"]) == OBJECT_REFERENCE
    assert set(props["scopeSelector"]["properties"]) == LABEL_SELECTOR
    assert set(props["summary"]["properties"]) == set(RESULTS)
    result = props["results"]["items"]
    assert set(result["properties"]) == RESULT_FIELDS
    assert result["required"] == ["policy"]
    assert result["properties"]["result"]["enum"] == RESULTS
    assert sorted(result["properties"]["severity"]["enum"]) == sorted(
        ["critical", "high", "medium", "low", "info"])
    stamp = result["properties"]["timestamp"]
    assert (stamp["type"], sorted(stamp["required"])) == ("object", ["nanos", "seconds"])
    assert set(result["properties"]["resources"]["items"]["properties"]) == OBJECT_REFERENCE
    if openreports:
        conf = props["configuration"]
        assert conf["required"] == ["limits"]
        assert set(conf["properties"]["limits"]["properties"]) == {"maxResults", "statusFilter"}
    # No bound upstream lacks: what upstream's CRD takes, ours takes.
    text = yaml.safe_dump(schema)
    for bound in ("maxLength", "maxItems", "maxProperties", "pattern", "minimum", "maximum"):
        assert bound not in text, bound


def kyverno_like_report(api="wgpolicyk8s.io/v1alpha2", kind="PolicyReport"):
    """A per-resource report as Kyverno's reports controller writes one (and Policy Reporter
    reads): scope, summary, results with every field."""
    uid = "0c4f3a0e-3f4e-4b8a-9d0e-5f7a4c2b1e6d"
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat", "namespace": "ml",
           "uid": uid}
    return {
        "apiVersion": api, "kind": kind,
        "metadata": {"name": uid, "namespace": "ml",
                     "labels": {"app.kubernetes.io/managed-by": "kyverno"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                          "name": "chat", "uid": uid}]},
        "scope": ref,
        "summary": {"pass": 1, "fail": 1, "warn": 0, "error": 0, "skip": 0},
        "results": [
            {"source": "kyverno", "policy": "require-labels", "rule": "check-team",
             "result": "pass", "scored": True, "severity": "medium", "category": "Best Practices",
             "message": "validation rule 'check-team' passed.",
             "timestamp": {"seconds": 1764403200, "nanos": 0},
             "properties": {"process": "background scan"}},
            {"source": "kyverno", "policy": "disallow-latest-tag", "rule": "validate-image-tag",
             "result": "fail", "scored": True, "severity": "high",
             "resources": [ref],
             "resourceSelector": {"matchLabels": {"app": "chat"}, "matchExpressions": [
                 {"key": "tier", "operator": "In", "values": ["gpu"]}]},
             "timestamp": {"seconds": 1764403200, "nanos": 512}},
        ]}


def report_errors(name, obj):
    return sorted(e.message for e in jsonschema.Draft7Validator(report_schema(name))
                  .iter_errors(obj))


@pytest.mark.parametrize("name", [n for crds in REPORT_CRDS.values() for n in crds])
def test_a_kyverno_like_report_validates(name):
    kind = next(c[name][0] for c in REPORT_CRDS.values() if name in c)
    api = next(a for a, c in REPORT_CRDS.items() if name in c)
    report = kyverno_like_report(api, kind)
    if kind.startswith("Cluster"):
        del report["metadata"]["namespace"]
    if api.startswith("openreports.io"):
        report["source"] = "kyverno"
        report["configuration"] = {"limits": {"maxResults": 100, "statusFilter": ["fail"]}}
    assert report_errors(name, report) == []
    # gpuguard's own: a result without resources is about the scope.
    report["results"] = [{"policy": "gpu-rightsizing", "result": "warn", "source": "gpuguard",
                          "timestamp": {"seconds": 1764403200, "nanos": 0}}]
    assert report_errors(name, report) == []


@pytest.mark.parametrize("name", [n for crds in REPORT_CRDS.values() for n in crds])
@pytest.mark.parametrize("breaks,refused", [
    (lambda r: r.pop("policy"), "'policy' is a required property"),
    (lambda r: r.update(timestamp="2026-11-29T10:00:00Z"), "is not of type 'object'"),
    (lambda r: r["timestamp"].pop("nanos"), "'nanos' is a required property"),
    (lambda r: r.update(result="passed"), "is not one of"),
    (lambda r: r.update(severity="urgent"), "is not one of"),
    (lambda r: r.update(resources={"kind": "Pod"}), "is not of type 'array'"),
], ids=["no-policy", "timestamp-string", "no-nanos", "result", "severity", "resources"])
def test_a_malformed_result_is_refused(name, breaks, refused):
    report = kyverno_like_report()
    breaks(report["results"][0])
    errors = report_errors(name, report)
    assert any(refused in e for e in errors), errors


def test_the_cluster_role_lets_the_audit_read_owners_and_write_reports():
    """In every certificate mode: get on each workload kind the audit resolves owners through,
    and get, list, create, update, delete on both report APIs' reports (no patch, no watch)."""
    from test_deploy import AUDIT_OWNER_KINDS, CLUSTER_WIDE, REPORT_KINDS, REPORT_VERBS, rbac_rows
    for args, _ in MODES.values():
        rows = rbac_rows(one(template(*args), "ClusterRole", "gpuguard")["rules"], CLUSTER_WIDE)
        for group, resources in AUDIT_OWNER_KINDS.items():
            for r in resources:
                full = r + ("." + group if group else "")
                assert [row for row in rows if row[0] == full] == [
                    (full, (), ("get",), CLUSTER_WIDE)], full
        for group, resources in REPORT_KINDS.items():
            for r in resources:
                assert [row for row in rows if row[0] == f"{r}.{group}"] == [
                    (f"{r}.{group}", (), REPORT_VERBS, CLUSTER_WIDE)]
    assert re.search(r"# The audit", (CHART / "templates" / "rbac.yaml").read_text())
