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
- `helm uninstall` deletes the webhook configurations first (the pre-delete hooks).

Skipped, saying why, without build/k8s/bin/helm (`make helm-bin`); the kustomize comparisons
also need kubectl.  The helpers of test_deploy.py render the kustomize side.
"""

import base64
import shutil
import subprocess
import tarfile

import pytest
import yaml

from test_deploy import (CHART, DEPLOY, KUBECTL, NAMESPACE, OVERLAYS, PLACEHOLDER, REPO,
                         WEBHOOK_KINDS, compose, container, find, kustomize, one, split_flags)

HELM = REPO / "build" / "k8s" / "bin" / "helm"
GENERATE = REPO / "charts" / "generate.py"
ALERTS = DEPLOY / "prometheus" / "gpuguard-alerts.yaml"
# A caBundle as `gpuguard certs` prints one (the base64 of a PEM file).
CA_BUNDLE = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n...\n").decode()

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
    assert_same_objects(kustomize(DEPLOY), template())


@needs_kubectl
def test_cert_manager_overlay_is_the_chart_with_cert_manager(tmp_path):
    assert_same_objects(compose(tmp_path / "k", DEPLOY, OVERLAYS / "cert-manager"),
                        template("--set", "certs.mode=cert-manager"))


@needs_kubectl
def test_provided_certs_overlay_is_the_chart_with_provided_certs(tmp_path):
    """With the caBundle patch `gpuguard certs --kustomize-patch` writes (its placeholder
    replaced here) and the same CA as certs.caBundle."""
    deploy = tmp_path / "gpuguard" / "deploy"
    shutil.copytree(DEPLOY, deploy)
    patch = deploy / "overlays" / "provided-certs" / "webhook-cabundle.yaml"
    patch.write_text(patch.read_text().replace(PLACEHOLDER, CA_BUNDLE))
    assert_same_objects(compose(tmp_path / "k", deploy, deploy / "overlays" / "provided-certs"),
                        template("--set", "certs.mode=provided", "--set",
                                 f"certs.caBundle={CA_BUNDLE}"))


@needs_kubectl
def test_network_policy_component_is_the_chart_with_webhook_from(tmp_path):
    cidr = "REPLACE-ME--control-plane-CIDR"
    assert_same_objects(
        compose(tmp_path / "k", DEPLOY, OVERLAYS / "cert-manager",
                DEPLOY / "components" / "network-policy"),
        template("--set", "certs.mode=cert-manager",
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
    creates anything but the Lease."""
    docs = template("--set", f"certs.mode={mode}", "--set", f"certs.caBundle={CA_BUNDLE}")
    rules = one(docs, "ClusterRole", "gpuguard")["rules"] + one(docs, "Role", "gpuguard")["rules"]
    for rule in rules:
        assert "create" not in rule["verbs"] or rule["resources"] == ["leases"], rule
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
