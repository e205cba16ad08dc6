"""test_deploy.py - the Kubernetes manifests (deploy/, rendered from charts/gpuguard) and
the container image recipe (deploy/Dockerfile) against the server they deploy.

Renders `kubectl kustomize deploy/` (deploy/install.yaml: the chart's defaults, gpuguard
managing its own certificate) and deploy/ with each certificate overlay (kustomize
Components: cert-manager, provided-certs), parses every document and checks the fields
README.md "Install in a cluster" relies on.  Ports, paths and flags are not restated here:
they come from `gpuguard serve --help` (GPUGUARD_BIN), and the rendered ConfigMap and
Deployment arguments of provided-certs (the certificate from files: self-management needs an
API server) are run through the real server on loopback, its API server a closed port.
test_chart.py holds these renders equal to `helm template`.
"""

import base64
import binascii
import fnmatch
import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from cel_subset import CelError, compile_cel, evaluate
from conftest import load_review, start_server, unreachable_cluster

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = DEPLOY / "overlays"
CHART = REPO / "charts" / "gpuguard"
# The project's kubectl (make k8s-bin), else one on PATH.
KUBECTL = next((str(k) for k in [REPO / "build" / "k8s" / "bin" / "kubectl"] if k.exists()),
               shutil.which("kubectl"))
BIN = os.environ.get("GPUGUARD_BIN")
# What deploy/Dockerfile copies into the image from the repository: the policies and the Lua
# library the Deployment's --policies and --lua name.
IMAGE_DIRS = {"/usr/share/gpuguard/policies": REPO / "policies",
              "/usr/share/gpuguard/lua": REPO / "lua"}

NAMESPACE = "gpuguard-system"
SERVICE = "gpuguard"
TLS_SECRET = "gpuguard-tls"
WEBHOOK_CONFIG = "gpuguard"
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
COMPONENT_LABEL, CONFIG_COMPONENT = "app.kubernetes.io/component", "webhook-configuration"
PLACEHOLDER = "REPLACE-ME--run-gpuguard-certs--kustomize-patch"
# Bytes the client-side `kubectl apply` can keep in its last-applied annotation.
ANNOTATION_LIMIT = 256 * 1024

needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not installed: the kustomize renders are not checked"
)
needs_bin = pytest.mark.skipif(
    not BIN, reason="GPUGUARD_BIN is not set: run through `make integration`"
)


# ---------------------------------------------------------------- helpers


def kustomize(path):
    res = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, f"kubectl kustomize {path}: {res.stderr}"
    docs = [d for d in yaml.safe_load_all(res.stdout) if d is not None]
    assert docs, f"kubectl kustomize {path} rendered nothing"
    return docs


def find(docs, kind, name=None):
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs, kind, name=None):
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def compose(where, deploy, *components):
    """Render deploy/ (the directory `deploy`) with kustomize Components, as a user's
    kustomization does: from a directory outside deploy/ (kustomize refuses a base that
    contains the kustomization)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(deploy, where)],
        "components": [os.path.relpath(c, where) for c in components]}))
    return kustomize(where)


# Flags a command line may repeat: split_flags gives each a list.
REPEATABLE = {"--policies"}


def flag_pairs(args):
    """["--a=1", "--b", "2", "--c"] -> [("--a", "1"), ("--b", "2"), ("--c", None)]."""
    pairs, i = [], 0
    while i < len(args):
        arg = args[i]
        assert arg.startswith("--"), f"unexpected argument {arg!r}"
        if "=" in arg:
            name, value = arg.split("=", 1)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            name, value = arg, args[i + 1]
            i += 1
        else:
            name, value = arg, None
        pairs.append((name, value))
        i += 1
    return pairs


def split_flags(args):
    """{"--a": "1", "--c": None, "--policies": [dir, ...]}: each flag once, but REPEATABLE."""
    flags = {}
    for name, value in flag_pairs(args):
        if name in REPEATABLE:
            flags.setdefault(name, []).append(value)
            continue
        assert name not in flags, f"{name} given twice"
        flags[name] = value
    return flags


def self_managed(docs):
    """Whether gpuguard keeps its certificate through the API (certs.mode self)."""
    return "--tls-secret" in split_flags(container(docs)["args"])


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


def container(docs):
    dep = one(docs, "Deployment", SERVICE)
    containers = dep["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def resolve_port(port, ctr):
    if isinstance(port, int):
        return port
    named = [p["containerPort"] for p in ctr.get("ports", []) if p.get("name") == port]
    assert named, f"no container port named {port}"
    return named[0]


def quantity(q):
    """Enough of resource.Quantity for requests and limits: m, Ki..Gi, plain."""
    q = str(q)
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9}
    for suffix, mult in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if q.endswith(suffix):
            return float(q[: -len(suffix)]) * mult
    return float(q)


# ---------------------------------------------------------------- server facts


@pytest.fixture(scope="module")
def serve_help():
    """What `gpuguard serve --help` says: flags, default ports, routes."""
    if not BIN:
        pytest.skip("GPUGUARD_BIN is not set: run through `make integration`")
    res = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    text = res.stdout
    flags = set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z-]*)", text, re.M))
    defaults = dict(re.findall(r"^\s+(--[a-z-]+) \S+\s.*\[([^\]]+)\]\s*$", text, re.M))
    return {
        "text": text,
        "flags": flags,
        "webhook_port": port_of(defaults["--listen"]),
        "ops_port": port_of(defaults["--ops-listen"]),
        "webhook_paths": set(re.findall(r"POST (/[a-z]+)", text)),
        "ops_paths": set(re.findall(r"(/[a-z]+z)\b", text)),
    }


def test_serve_help_is_parsed(serve_help):
    assert {"--listen", "--ops-listen", "--tls-cert", "--tls-key", "--config", "--policies",
            "--lua"} <= serve_help["flags"]
    assert serve_help["webhook_port"] == 8443
    assert serve_help["ops_port"] == 9090
    assert serve_help["webhook_paths"] == {"/mutate", "/validate"}
    assert serve_help["ops_paths"] == {"/healthz", "/readyz"}


# ---------------------------------------------------------------- renders


@pytest.fixture(scope="module")
def base():
    if KUBECTL is None:
        pytest.skip("kubectl is not installed: the kustomize renders are not checked")
    return kustomize(DEPLOY)


@pytest.fixture(scope="module")
def cert_manager(tmp_path_factory):
    if KUBECTL is None:
        pytest.skip("kubectl is not installed: the kustomize renders are not checked")
    return compose(tmp_path_factory.mktemp("cert-manager"), DEPLOY, OVERLAYS / "cert-manager")


@pytest.fixture(scope="module")
def provided_certs(tmp_path_factory):
    if KUBECTL is None:
        pytest.skip("kubectl is not installed: the kustomize renders are not checked")
    return compose(tmp_path_factory.mktemp("provided"), DEPLOY, OVERLAYS / "provided-certs")


@pytest.fixture(scope="module", params=["base", "cert-manager", "provided-certs"])
def render(request):
    """Each of the three renders: what holds for the base holds for both overlays."""
    return request.getfixturevalue(request.param.replace("-", "_"))


def test_base_render_is_install_yaml(base):
    """`kubectl kustomize deploy/` is deploy/install.yaml, object for object: gpuguard keeps
    its certificate in the Secret shipped empty, and the webhooks wait for its CA with
    failurePolicy Ignore (a first install never blocks pods)."""
    installed = [d for d in yaml.safe_load_all((DEPLOY / "install.yaml").read_text()) if d]

    def key(d):
        return d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]
    assert sorted(base, key=key) == sorted(installed, key=key)
    assert installed[0]["kind"] == "Namespace", "kubectl apply -f creates the namespace first"
    secret = one(base, "Secret", TLS_SECRET)
    assert secret["type"] == "Opaque" and "data" not in secret and "stringData" not in secret
    for kind in WEBHOOK_KINDS:
        for hook in one(base, kind, WEBHOOK_CONFIG)["webhooks"]:
            assert "caBundle" not in hook["clientConfig"]
            assert hook["failurePolicy"] == "Ignore"


def test_every_document_is_an_object(render):
    for doc in render:
        assert doc.get("apiVersion") and doc.get("kind"), doc
        assert doc["metadata"].get("name"), doc


def test_namespace_and_placement(render):
    one(render, "Namespace", NAMESPACE)
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                      *WEBHOOK_KINDS}
    for doc in render:
        if doc["kind"] in cluster_scoped:
            assert "namespace" not in doc["metadata"], doc["kind"]
        else:
            assert doc["metadata"].get("namespace") == NAMESPACE, (doc["kind"],
                                                                   doc["metadata"]["name"])


def rbac_rows(rules, where):
    """RBAC rules as (resource, resource names, verbs, where) rows: group-qualified resources,
    as `kubectl auth can-i --list` and README.md's table name them."""
    rows = set()
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                name, _, sub = resource.partition("/")
                full = name + ("." + group if group else "") + ("/" + sub if sub else "")
                rows.add((full, tuple(sorted(rule.get("resourceNames", []))),
                          tuple(sorted(rule["verbs"])), where))
    return rows


# What gpuguard's ServiceAccount is granted: the inventory's reads, the GPUQuota ledger (status
# only) everywhere, the quota controller's Lease in its own namespace, the two webhook
# configurations (their failurePolicy, and in self mode their caBundle) by name, no create; and
# the audit's: get on the workload kinds it resolves owners through, and its policy reports in
# either report API.
CLUSTER_WIDE = "cluster-wide"
AUDIT_OWNER_KINDS = {
    "apps": ["replicasets", "deployments", "statefulsets", "daemonsets"],
    "batch": ["jobs", "cronjobs"],
    "": ["replicationcontrollers"],
    "kubeflow.org": ["pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs", "paddlejobs", "jaxjobs",
                     "notebooks"],
    "ray.io": ["rayclusters", "rayjobs", "rayservices"],
    "jobset.x-k8s.io": ["jobsets"],
    "leaderworkerset.x-k8s.io": ["leaderworkersets"],
    "serving.kserve.io": ["inferenceservices"],
}
REPORT_KINDS = {"wgpolicyk8s.io": ["policyreports", "clusterpolicyreports"],
                "openreports.io": ["reports", "clusterreports"]}
REPORT_VERBS = ("create", "delete", "get", "list", "update")
GRANTED = {
    *((r + ("." + g if g else ""), (), ("get",), CLUSTER_WIDE)
      for g, rs in AUDIT_OWNER_KINDS.items() for r in rs),
    *((f"{r}.{g}", (), REPORT_VERBS, CLUSTER_WIDE) for g, rs in REPORT_KINDS.items() for r in rs),
    ("pods", (), ("list", "watch"), CLUSTER_WIDE),
    ("namespaces", (), ("get",), CLUSTER_WIDE),
    ("resourceclaims.resource.k8s.io", (), ("list", "watch"), CLUSTER_WIDE),
    ("resourceclaimtemplates.resource.k8s.io", (), ("get", "list", "watch"), CLUSTER_WIDE),
    ("deviceclasses.resource.k8s.io", (), ("list", "watch"), CLUSTER_WIDE),
    ("resourceslices.resource.k8s.io", (), ("list", "watch"), CLUSTER_WIDE),
    ("gpuquotas.gpuguard.io", (), ("get", "list", "watch"), CLUSTER_WIDE),
    ("gpuquotas.gpuguard.io/status", (), ("update",), CLUSTER_WIDE),
    ("leases.coordination.k8s.io", ("gpuguard-quota",), ("get", "update"), NAMESPACE),
    ("leases.coordination.k8s.io", (), ("create",), NAMESPACE),
    ("endpointslices.discovery.k8s.io", (), ("list",), NAMESPACE),
    ("validatingwebhookconfigurations.admissionregistration.k8s.io", (WEBHOOK_CONFIG,),
     ("get", "update"), CLUSTER_WIDE),
    ("mutatingwebhookconfigurations.admissionregistration.k8s.io", (WEBHOOK_CONFIG,),
     ("get", "update"), CLUSTER_WIDE),
}
# And with a certificate of its own (certs.mode self), its Secret, by name; no create.
GRANTED_SELF = {
    ("secrets", (TLS_SECRET,), ("get", "update"), NAMESPACE),
}


def test_rbac_is_least_privilege(render):
    roles = find(render, "ClusterRole")
    assert len(roles) == 1, "one ClusterRole"
    for rule in roles[0]["rules"]:
        # no URLs; names only on the webhook configurations
        assert set(rule) <= {"apiGroups", "resources", "resourceNames", "verbs"}, rule
        assert ("resourceNames" in rule) == (rule["apiGroups"] == ["admissionregistration.k8s.io"])
    ns_roles = find(render, "Role")
    assert len(ns_roles) == 1, "one Role, for the Lease (and the certificate's Secret)"
    role = ns_roles[0]
    assert role["metadata"]["namespace"] == NAMESPACE
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "resourceNames", "verbs"}, rule
        # create and list cannot be limited by name (a new object has none yet when it is
        # authorized; a list names none); every other verb is
        assert ("resourceNames" in rule) == (rule["verbs"] not in (["create"], ["list"])), rule
    granted = rbac_rows(roles[0]["rules"], CLUSTER_WIDE) | rbac_rows(role["rules"], NAMESPACE)
    assert granted == GRANTED | (GRANTED_SELF if self_managed(render) else set())
    for verb in ("create", "update", "patch", "delete", "deletecollection", "*"):
        assert not [r for r in granted if r[0] == "gpuquotas.gpuguard.io" and verb in r[2]], verb

    sa = one(render, "ServiceAccount")
    binding = one(render, "ClusterRoleBinding")
    subjects = [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": roles[0]["metadata"]["name"]}
    assert binding["subjects"] == subjects
    role_binding = one(render, "RoleBinding")
    assert role_binding["metadata"]["namespace"] == NAMESPACE
    assert role_binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                       "name": role["metadata"]["name"]}
    assert role_binding["subjects"] == subjects
    dep = one(render, "Deployment", SERVICE)
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def readme_rbac_table():
    """The table under "What gpuguard's ServiceAccount may do" in README.md, as rbac_rows():
    `resource` (or `resource` named `name`) | `verb`, ... | cluster-wide or `namespace`."""
    text = (REPO / "README.md").read_text()
    section = text.split("What gpuguard's ServiceAccount may do", 1)[1]
    rows, header = set(), None
    for line in section.splitlines()[1:]:
        if not line.startswith("|"):
            if header:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            assert header == ["resource", "verbs", "where"], header
            continue
        if set(cells[0]) <= {"-"}:
            continue
        m = re.fullmatch(r"`([^`]+)`(?: named `([^`]+)`)?", cells[0])
        assert m, f"README.md RBAC row: {line}"
        verbs = re.findall(r"`([^`]+)`", cells[1])
        assert verbs and ", ".join(f"`{v}`" for v in verbs) == cells[1], line
        where = cells[2].strip("`")
        rows.add((m.group(1), (m.group(2),) if m.group(2) else (), tuple(sorted(verbs)), where))
    return rows


def test_readme_rbac_table_is_the_rbac(base):
    """README.md's table says what the default install (deploy/install.yaml, gpuguard keeping
    its own certificate) grants, row for row (`make e2e` checks the same table against what the
    API server says the account may do)."""
    sa = one(base, "ServiceAccount")
    granted = set()
    for kind, binding_kind, where in (("ClusterRole", "ClusterRoleBinding", CLUSTER_WIDE),
                                      ("Role", "RoleBinding", NAMESPACE)):
        for role in find(base, kind):
            bound = [b for b in find(base, binding_kind) if b["roleRef"]["kind"] == kind
                     and b["roleRef"]["name"] == role["metadata"]["name"]
                     and {"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                          "namespace": NAMESPACE} in b["subjects"]]
            if bound:
                granted |= rbac_rows(role["rules"], where)
    assert readme_rbac_table() == granted


# ---------------------------------------------------------------- Deployment


def test_deployment_availability(render):
    dep = one(render, "Deployment", SERVICE)
    spec = dep["spec"]
    pod = spec["template"]
    labels = pod["metadata"]["labels"]
    assert spec["replicas"] == 3
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
    # A rolling update never goes below the replica count.
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0

    spread = pod["spec"].get("topologySpreadConstraints", [])
    by_node = [c for c in spread if c["topologyKey"] == "kubernetes.io/hostname"]
    anti = (pod["spec"].get("affinity", {}).get("podAntiAffinity", {})
            .get("requiredDuringSchedulingIgnoredDuringExecution", []))
    assert by_node or any(t["topologyKey"] == "kubernetes.io/hostname" for t in anti), \
        "replicas must be spread across nodes"
    for c in by_node:
        assert c["maxSkew"] == 1
        assert c["whenUnsatisfiable"] == "DoNotSchedule"
        assert c["labelSelector"]["matchLabels"].items() <= labels.items()

    pdb = one(render, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert (pdb["spec"].get("maxUnavailable") == 1
            or pdb["spec"].get("minAvailable") == spec["replicas"] - 1)


def test_priority_class_is_admitted_outside_kube_system(render):
    quota = one(render, "ResourceQuota")
    scopes = quota["spec"]["scopeSelector"]["matchExpressions"]
    assert {"scopeName": "PriorityClass", "operator": "In",
            "values": ["system-cluster-critical"]} in scopes
    assert int(quota["spec"]["hard"]["pods"]) > 3 + 1  # replicas plus the surge


def test_security_context(render):
    dep = one(render, "Deployment", SERVICE)
    pod_sc = dep["spec"]["template"]["spec"]["securityContext"]
    ctr = container(render)
    sc = ctr["securityContext"]
    assert pod_sc["runAsNonRoot"] is True
    assert sc.get("runAsNonRoot", pod_sc["runAsNonRoot"]) is True
    assert sc.get("runAsUser", pod_sc.get("runAsUser", 0)) > 0
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc.get("privileged", False) is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    for ctx in (pod_sc, sc):
        assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostNetwork" not in dep["spec"]["template"]["spec"]


def test_resources(render):
    res = container(render)["resources"]
    for key in ("cpu", "memory"):
        assert key in res["requests"] and key in res["limits"], key
        assert quantity(res["requests"][key]) <= quantity(res["limits"][key]), key


def test_args_are_serve_flags(render, serve_help):
    ctr = container(render)
    assert "command" not in ctr, "the image's entrypoint is `gpuguard serve`"
    flags = split_flags(ctr["args"])
    unknown = set(flags) - serve_help["flags"]
    assert not unknown, f"not flags of `gpuguard serve`: {sorted(unknown)}"
    assert flags["--listen"] == f"0.0.0.0:{serve_help['webhook_port']}"
    assert flags["--ops-listen"] == f"0.0.0.0:{serve_help['ops_port']}"
    # Every mode: gpuguard writes the webhooks' failurePolicy once it is trusted.
    assert flags["--webhook-configuration"] == WEBHOOK_CONFIG
    assert flags["--webhook-failure-policy"] == "Fail"
    if self_managed(render):
        assert flags["--tls-secret"] == f"{NAMESPACE}/{TLS_SECRET}"
        assert flags["--tls-service"] == SERVICE
        assert "--tls-cert" not in flags and "--tls-key" not in flags
    else:
        assert flags.get("--tls-cert") and flags.get("--tls-key")
        assert not {"--tls-secret", "--tls-service"} & set(flags)
    for required in ("--config", "--policies", "--lua"):
        assert flags.get(required), required


def test_mounts_match_args(render):
    """Every file the arguments name comes read-only from the right volume, or is the image's
    own (the shipped policies and Lua library)."""
    dep = one(render, "Deployment", SERVICE)
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    ctr = container(render)
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    for m in mounts.values():
        assert m.get("readOnly") is True, m
        # The kubelet never updates a subPath mount: gpuguard would not see an edit.
        assert "subPath" not in m, m
    flags = split_flags(ctr["args"])

    def mount_for(path):
        best = [p for p in mounts if path == p or path.startswith(p.rstrip("/") + "/")]
        assert best, f"{path} is not on a mounted volume"
        m = mounts[max(best, key=len)]
        return m, volumes[m["name"]], os.path.relpath(path, m["mountPath"])

    if self_managed(render):
        assert not [v for v in volumes.values() if "secret" in v], "the Secret is read via the API"
    else:
        for flag, key in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key")):
            m, vol, rel = mount_for(flags[flag])
            assert vol["secret"]["secretName"] == TLS_SECRET
            assert rel == key, f"{flag} must name the Secret's {key}"
            # Readable by the non-root user through fsGroup, not world-readable.
            assert vol["secret"].get("defaultMode", 0o644) & 0o007 == 0
    m, vol, rel = mount_for(flags["--config"])
    assert rel == "gpuguard.yaml" and vol["configMap"]["name"] == "gpuguard-config"
    one(render, "ConfigMap", "gpuguard-config")
    assert flags["--lua"] == "/usr/share/gpuguard/lua"
    assert flags["--policies"] == ["/usr/share/gpuguard/policies"], "the image's, no others"
    for path in (flags["--lua"], *flags["--policies"]):
        assert path in IMAGE_DIRS and not [p for p in mounts if path.startswith(p)], path
    assert dep["spec"]["template"]["spec"]["securityContext"].get("fsGroup"), \
        "fsGroup makes the Secret's files readable by the non-root user"


def test_probes_on_the_ops_port(render, serve_help):
    ctr = container(render)
    ops_port = port_of(split_flags(ctr["args"])["--ops-listen"])
    assert ops_port == serve_help["ops_port"]
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = ctr[probe]["httpGet"]
        assert get["path"] == path, probe
        assert path in serve_help["ops_paths"]
        assert resolve_port(get["port"], ctr) == ops_port, probe
        assert get.get("scheme", "HTTP") == "HTTP", "the ops port is plain HTTP"
    ports = {p["containerPort"] for p in ctr["ports"]}
    assert {serve_help["webhook_port"], serve_help["ops_port"]} <= ports


def test_shutdown_fits_the_grace_period(render, serve_help):
    dep = one(render, "Deployment", SERVICE)
    ctr = container(render)
    grace = int(split_flags(ctr["args"]).get("--shutdown-grace") or 30)
    pause = 0
    cmd = ctr.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
    if cmd:
        assert cmd[0] == "/bin/sleep"
        pause = int(cmd[1])
    total = dep["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    assert pause + grace < total


def test_service_ports(render, serve_help):
    svc = one(render, "Service", SERVICE)
    dep = one(render, "Deployment", SERVICE)
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP"
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert ports["https"]["port"] == 443
    assert ports["https"]["targetPort"] == serve_help["webhook_port"] == 8443
    assert ports["metrics"]["port"] == ports["metrics"]["targetPort"] == serve_help["ops_port"]


def test_image(render, binary):
    ctr = container(render)
    version = subprocess.run([binary, "version"], capture_output=True, text=True).stdout
    assert re.search(r"\b(\d+\.\d+\.\d+)\b", version)
    tag = ctr["image"].rsplit(":", 1)[1]
    assert tag in version, "the image tag (the chart's appVersion) is gpuguard's version"
    assert ctr["imagePullPolicy"] == "IfNotPresent"


# ---------------------------------------------------------------- ConfigMaps


def test_the_configmap_is_the_repository_configuration(render):
    """What the cluster gets is what `make run` serves (else: make chart-schema install-yaml);
    the policies and the Lua library are the image's, in no ConfigMap."""
    [cfg] = find(render, "ConfigMap")
    assert cfg["metadata"]["name"] == "gpuguard-config" and set(cfg["data"]) == {"gpuguard.yaml"}
    assert yaml.safe_load(cfg["data"]["gpuguard.yaml"]) == \
        yaml.safe_load((DEPLOY / "gpuguard.yaml").read_text()), \
        "stale: run make chart-schema install-yaml"


def test_configmaps_fit_kubectl_apply(render):
    for cm in find(render, "ConfigMap"):
        size = len(json.dumps(cm).encode())
        assert size < ANNOTATION_LIMIT, (
            f"{cm['metadata']['name']} is {size} bytes: too big for the last-applied annotation"
            " of `kubectl apply`; use `kubectl apply --server-side`")


# ---------------------------------------------------------------- webhooks


@pytest.mark.parametrize("kind", WEBHOOK_KINDS)
def test_webhook_configuration(render, kind, serve_help):
    cfg = one(render, kind, WEBHOOK_CONFIG)
    svc = one(render, "Service", SERVICE)
    mutating = kind.startswith("Mutating")
    assert [h["name"] for h in cfg["webhooks"]] == [
        p + ("mutate" if mutating else "validate") + ".gpuguard.io" for p in ("", "workloads.")]
    hook = cfg["webhooks"][0]
    assert hook["name"] == ("mutate" if mutating else "validate") + ".gpuguard.io"
    assert hook["admissionReviewVersions"] == ["v1"]
    # The validating webhook charges what it admits to the GPUQuota ledger, never on a dry run.
    assert hook["sideEffects"] == ("None" if mutating else "NoneOnDryRun")
    assert hook["timeoutSeconds"] == 5
    # A first install must not block pods before gpuguard serves, trusted by the caBundle; it
    # then writes Fail itself.
    assert hook["failurePolicy"] == "Ignore"
    assert hook["matchPolicy"] == "Equivalent"
    if mutating:
        assert hook["reinvocationPolicy"] == "IfNeeded"
    else:
        assert "reinvocationPolicy" not in hook
    dra = {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1", "v1beta2", "v1beta1"],
           "scope": "Namespaced"}
    claims = [dict(dra, resources=["resourceclaims"], operations=["CREATE", "UPDATE"]),
              dict(dra, resources=["resourceclaimtemplates"], operations=["CREATE"])]
    if mutating:
        assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"],
                                  "resources": ["pods"], "operations": ["CREATE"],
                                  "scope": "Namespaced"}]
        assert "matchConditions" not in hook
    else:
        assert hook["rules"] == [
            {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
             "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"},
            {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/ephemeralcontainers"],
             "operations": ["UPDATE"], "scope": "Namespaced"},
            *claims]
    ref = hook["clientConfig"]["service"]
    assert "url" not in hook["clientConfig"]
    path = "/mutate" if mutating else "/validate"
    assert ref["path"] == path and path in serve_help["webhook_paths"]
    assert ref["name"] == svc["metadata"]["name"]
    assert ref["namespace"] == svc["metadata"]["namespace"] == NAMESPACE
    assert ref.get("port", 443) in {p["port"] for p in svc["spec"]["ports"]}


# The API server's rules for matchConditions (admissionregistration validation): at most 64,
# each a qualified name and a CEL expression over object, oldObject, request and authorizer.
MAX_MATCH_CONDITIONS = 64
QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                            r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
CEL_VARIABLES = {"object", "oldObject", "request", "authorizer"}


def match_conditions(render):
    hook = one(render, "ValidatingWebhookConfiguration", WEBHOOK_CONFIG)["webhooks"][0]
    return hook["matchConditions"]


def test_match_conditions_follow_the_api_server_rules(render):
    conditions = match_conditions(render)
    assert 0 < len(conditions) <= MAX_MATCH_CONDITIONS
    assert len({c["name"] for c in conditions}) == len(conditions)
    for c in conditions:
        assert set(c) == {"name", "expression"}
        assert QUALIFIED_NAME.match(c["name"]) and len(c["name"].split("/")[-1]) <= 63
        _, variables = compile_cel(c["expression"])
        assert variables <= CEL_VARIABLES, variables - CEL_VARIABLES


def pod(labels=None, annotations=None, gates=None, **spec):
    meta = {"name": "p", "namespace": "team-a"}
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    body = {"containers": [{"name": "c", "image": "busybox:1.36"}], **spec}
    if gates is not None:
        body["schedulingGates"] = [{"name": g} for g in gates]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


DECISION = {"gpuguard.io/decision": "mig 1g.10gb on pool a100-mig", "gpuguard.io/charge": "143"}
GPU_TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
GATE = ["kueue.x-k8s.io/admission"]
POOL = {"gpuguard.io/pool": "h100-train"}
AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [
        {"key": "gpuguard.io/pool", "operator": "In", "values": ["a100-mig"]}]}]}}}

# (what, operation, subResource, old pod, new pod, whether the API server calls gpuguard)
REVIEWS = [
    ("a pod CREATE", "CREATE", "", None, pod(), True),
    ("kubectl debug", "UPDATE", "ephemeralcontainers", pod(), pod(), True),
    ("a gpuguard.io/ annotation rewritten", "UPDATE", "", pod(annotations=DECISION),
     pod(annotations={**DECISION, "gpuguard.io/decision": "exclusive"}), True),
    ("a gpuguard.io/ annotation removed", "UPDATE", "", pod(annotations=DECISION),
     pod(annotations={"gpuguard.io/decision": DECISION["gpuguard.io/decision"]}), True),
    ("every annotation removed", "UPDATE", "", pod(annotations=DECISION), pod(), True),
    ("a gpuguard.io/ annotation added", "UPDATE", "", pod(), pod(annotations=DECISION), True),
    ("a gpuguard.io/ label changed", "UPDATE", "",
     pod(labels={"gpuguard.io/workload-class": "interactive"}),
     pod(labels={"gpuguard.io/workload-class": "training"}), True),
    ("a gpuguard.io/ label removed with all labels", "UPDATE", "",
     pod(labels={"gpuguard.io/workload-class": "interactive"}), pod(), True),
    ("a gated pod gets a GPU toleration", "UPDATE", "", pod(gates=GATE),
     pod(gates=GATE, tolerations=GPU_TOLERATION), True),
    ("a gated pod's gate lifted with a pool nodeSelector", "UPDATE", "", pod(gates=GATE),
     pod(nodeSelector=POOL), True),
    ("a gated pod gets node affinity", "UPDATE", "", pod(gates=GATE),
     pod(gates=GATE, affinity=AFFINITY), True),
    ("a gated pod loses its tolerations", "UPDATE", "", pod(gates=GATE, tolerations=GPU_TOLERATION),
     pod(gates=GATE), True),
    ("other labels and annotations edited", "UPDATE", "",
     pod(labels={"team": "a"}, annotations=DECISION),
     pod(labels={"team": "b", "owner": "alice"}, annotations={**DECISION, "note": "x"}), False),
    ("labels added to a pod without any", "UPDATE", "", pod(), pod(labels={"team": "a"}), False),
    ("a gate lifted and nothing else", "UPDATE", "", pod(gates=GATE, tolerations=GPU_TOLERATION),
     pod(tolerations=GPU_TOLERATION), False),
    ("a scheduled pod gets a toleration", "UPDATE", "", pod(nodeName="n1"),
     pod(nodeName="n1", tolerations=GPU_TOLERATION), True),
    ("a pending pod gets a toleration", "UPDATE", "", pod(), pod(tolerations=GPU_TOLERATION), True),
    ("a pod's tolerations left as they are", "UPDATE", "", pod(tolerations=GPU_TOLERATION),
     pod(tolerations=GPU_TOLERATION, labels={"team": "a"}), False),
    ("finalizers removed", "UPDATE", "", {**pod(), "metadata": {**pod()["metadata"],
                                                                 "finalizers": ["kueue"]}},
     pod(), False),
    ("an image changed", "UPDATE", "", pod(), {**pod(), "spec": {"containers": [
        {"name": "c", "image": "busybox:1.37"}]}}, False),
]


def admission_request(operation, sub_resource):
    """The request as matchConditions see it: the API server leaves subResource out when there
    is none (AdmissionRequest's omitempty), and reading it then is an error."""
    req = {"operation": operation,
           "userInfo": {"username": "alice", "groups": ["system:authenticated"]}}
    if sub_resource:
        req["subResource"] = sub_resource
    return req


def condition_decides(render, operation, sub_resource, old, new):
    env = {"object": new, "oldObject": old, "request": admission_request(operation, sub_resource)}
    results = [evaluate(compile_cel(c["expression"])[0], env) for c in match_conditions(render)]
    for r in results:
        assert not isinstance(r, CelError), f"the condition fails, which rejects the request: {r}"
        assert isinstance(r, bool), r
    return all(results)


@pytest.mark.parametrize("what,operation,sub_resource,old,new,sent", REVIEWS,
                         ids=[r[0] for r in REVIEWS])
def test_match_conditions_send_only_what_the_rules_read(base, what, operation, sub_resource, old,
                                                       new, sent):
    assert condition_decides(base, operation, sub_resource, old, new) is sent, what


def claim(annotations=None, finalizers=None):
    meta = {"name": "gpus", "namespace": "team-a"}
    if annotations is not None:
        meta["annotations"] = annotations
    if finalizers is not None:
        meta["finalizers"] = finalizers
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "count": 8}}]}}}


MADE_FOR_A_POD = {"resource.kubernetes.io/pod-claim-name": "gpus"}
EXTENDED = {"resource.kubernetes.io/extended-resource-claim": "true"}

# A claim marked as made for a pod counts nothing in the inventory: 50-gpu-claims must see the
# UPDATE that marks it, and only that one (the scheduler's finalizer writes never wait).
CLAIM_UPDATES = [
    ("a claim marked as made for a pod", claim(), claim(annotations=MADE_FOR_A_POD), True),
    ("a claim marked as the scheduler's", claim(annotations={"note": "x"}),
     claim(annotations={"note": "x", **EXTENDED}), True),
    ("the mark changed", claim(annotations=MADE_FOR_A_POD),
     claim(annotations={"resource.kubernetes.io/pod-claim-name": "other"}), True),
    ("a marked claim gets a finalizer", claim(annotations=MADE_FOR_A_POD),
     claim(annotations=MADE_FOR_A_POD, finalizers=["resource.kubernetes.io/delete-protection"]),
     False),
    ("the mark removed", claim(annotations=MADE_FOR_A_POD), claim(), False),
    ("other annotations edited", claim(annotations={"a": "1"}), claim(annotations={"a": "2"}),
     False),
]


@pytest.mark.parametrize("what,old,new,sent", CLAIM_UPDATES, ids=[c[0] for c in CLAIM_UPDATES])
def test_match_conditions_send_a_claim_update_only_when_it_marks_the_claim(base, what, old, new,
                                                                          sent):
    assert condition_decides(base, "UPDATE", "", old, new) is sent, what


@needs_bin
def test_updates_the_conditions_skip_are_ones_the_policies_allow(base, tmp_path):
    """Every pod UPDATE the API server does not send is one gpuguard would have allowed; every
    UPDATE a project suite expects to be denied is one it sends."""
    cases = [{"name": r[0], "operation": r[1], "sub_resource": r[2], "old_object": r[3],
              "object": r[4], "user": "alice", "expect": {"allowed": True}}
             for r in REVIEWS if not r[5]]
    suite = tmp_path / "skipped.suite.yaml"
    suite.write_text(yaml.safe_dump({"cases": cases}))
    res = subprocess.run([BIN, "test", "--policies", str(REPO / "policies"), "--lua",
                          str(REPO / "lua"), "--config", str(DEPLOY / "gpuguard.yaml"),
                          str(suite)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    denied = 0
    for path in sorted((REPO / "tests" / "policies").rglob("*.suite.yaml")):
        for case in yaml.safe_load(path.read_text())["cases"]:
            if case.get("operation") != "UPDATE" or case["expect"].get("allowed") is not False:
                continue
            new = case.get("object") or yaml.safe_load((path.parent / case["manifest"]).read_text())
            assert condition_decides(base, "UPDATE", case.get("sub_resource", ""),
                                     case["old_object"], new), f"{path.name}: {case['name']}"
            denied += 1
    assert denied >= 3
def workload_hook(render, kind):
    return one(render, kind, WEBHOOK_CONFIG)["webhooks"][1]


# The resources the workload rules name, with an object of each holding a template:
# (kind, the object's spec around the template T).  The server must treat each as a workload.
WORKLOAD_RESOURCES = {
    ("", "replicationcontrollers"): ("ReplicationController", lambda t: {"spec": {"template": t}}),
    ("", "podtemplates"): ("PodTemplate", lambda t: {"template": t}),
    **{("apps", r): (k, lambda t: {"spec": {"template": t}})
       for r, k in (("deployments", "Deployment"), ("replicasets", "ReplicaSet"),
                    ("statefulsets", "StatefulSet"), ("daemonsets", "DaemonSet"))},
    ("batch", "jobs"): ("Job", lambda t: {"spec": {"template": t}}),
    ("batch", "cronjobs"): ("CronJob",
                            lambda t: {"spec": {"jobTemplate": {"spec": {"template": t}}}}),
    **{("kubeflow.org", k.lower() + "s"): (k, lambda t, f=f: {
        "spec": {f + "ReplicaSpecs": {"Worker": {"replicas": 2, "template": t}}}})
       for k, f in (("PyTorchJob", "pytorch"), ("TFJob", "tf"), ("MPIJob", "mpi"),
                    ("XGBoostJob", "xgb"), ("PaddleJob", "paddle"), ("JAXJob", "jax"))},
    # The notebook controller's pods take the Notebook's own labels and annotations.
    ("kubeflow.org", "notebooks"): ("Notebook", lambda t: {
        "metadata": t["metadata"], "spec": {"template": {"spec": t["spec"]}}}),
    ("ray.io", "rayclusters"): ("RayCluster", lambda t: {"spec": {"headGroupSpec": {
        "template": t}}}),
    ("ray.io", "rayjobs"): ("RayJob", lambda t: {"spec": {"rayClusterSpec": {
        "headGroupSpec": {"template": t}}}}),
    ("ray.io", "rayservices"): ("RayService", lambda t: {"spec": {"rayClusterConfig": {
        "headGroupSpec": {"template": t}}}}),
    ("jobset.x-k8s.io", "jobsets"): ("JobSet", lambda t: {"spec": {"replicatedJobs": [
        {"name": "w", "template": {"spec": {"template": t}}}]}}),
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): ("LeaderWorkerSet", lambda t: {
        "spec": {"leaderWorkerTemplate": {"size": 2, "workerTemplate": t}}}),
    ("batch.volcano.sh", "jobs"): ("Job", lambda t: {"spec": {"tasks": [
        {"name": "w", "template": t}]}}),
    ("serving.kserve.io", "inferenceservices"): ("InferenceService", lambda t: {
        "spec": {"predictor": dict(t["metadata"], **t["spec"])}}),
}


def rule_resources(hook):
    return {(g, r) for rule in hook["rules"] for g in rule["apiGroups"] for r in rule["resources"]}


@pytest.mark.parametrize("kind", WEBHOOK_KINDS)
def test_workload_rules(render, kind):
    hook, pods = workload_hook(render, kind), one(render, kind, WEBHOOK_CONFIG)["webhooks"][0]
    for key in ("admissionReviewVersions", "timeoutSeconds", "failurePolicy",
                "matchPolicy", "clientConfig", "namespaceSelector"):  # caBundle included
        assert hook[key] == pods[key], key
    assert hook["sideEffects"] == "None", "templates are not charged: no ledger writes"
    assert hook.get("reinvocationPolicy") == pods.get("reinvocationPolicy")
    assert rule_resources(hook) == set(WORKLOAD_RESOURCES)
    for rule in hook["rules"]:
        assert rule["operations"] == ["CREATE", "UPDATE"] and rule["scope"] == "Namespaced"
        assert rule["apiVersions"] == (["v1"] if rule["apiGroups"][0] in ("", "apps", "batch")
                                       else ["*"])
    # UPDATEs reach gpuguard only when a template changed (and, to be validated, a queue or
    # priority label): the condition compares where each kind keeps its templates, never the
    # whole object (status, annotations, scaling).
    [cond] = hook["matchConditions"]
    expr = " ".join(cond["expression"].split())
    queues = ("['kueue.x-k8s.io/queue-name', 'kueue.x-k8s.io/priority-class', "
              "'kai.scheduler/queue'].exists(k, ")
    if kind == "ValidatingWebhookConfiguration":
        assert expr.startswith("request.operation == 'CREATE' || " + queues), expr
        expr = expr.replace(expr[:expr.index(")) || (") + 6], "")
    assert expr.startswith("request.operation == 'CREATE' || (") or expr.startswith("(")
    for part in ("object.spec.jobTemplate != oldObject.spec.jobTemplate",
                 "object.template != oldObject.template",
                 "object.spec.headGroupSpec != oldObject.spec.headGroupSpec",
                 "object.spec.workerGroupSpecs.map(g, g.template)",
                 "object.spec.template != oldObject.spec.template",
                 "object.spec != oldObject.spec"):
        assert part in expr, part
    assert "object != oldObject" not in expr and "metadata" not in expr
    assert expr.count("(") == expr.count(")")


def test_gpuguard_mutates_before_kueue(render):
    """The API server calls mutating webhooks in configuration-name order: gpuguard's must
    come before Kueue's so that its pool and sharing choices are in place when Kueue reads
    the workload, and IfNeeded runs it again after Kueue."""
    cfg = one(render, "MutatingWebhookConfiguration", WEBHOOK_CONFIG)
    assert sorted([cfg["metadata"]["name"], "kueue-mutating-webhook-configuration"])[0] == \
        cfg["metadata"]["name"]
    assert all(h["reinvocationPolicy"] == "IfNeeded" for h in cfg["webhooks"])


def test_webhook_configurations_have_a_component_of_their_own(render):
    """The webhook configurations, and nothing else, are component webhook-configuration: a
    label selector finds them apart from the pods' objects."""
    labelled = [d for d in render
                if d["metadata"].get("labels", {}).get(COMPONENT_LABEL) == CONFIG_COMPONENT]
    assert sorted(d["kind"] for d in labelled) == sorted(WEBHOOK_KINDS)


def label_selector_matches(selector, labels):
    """metav1.LabelSelector semantics (matchLabels and In/NotIn/Exists/DoesNotExist)."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


@pytest.mark.parametrize("kind", WEBHOOK_KINDS)
def test_namespace_selector(render, kind):
    hook = one(render, kind, WEBHOOK_CONFIG)["webhooks"][0]
    selector = hook["namespaceSelector"]
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["kube-system", "gpuguard-system"]} in selector["matchExpressions"]
    assert {"key": "gpuguard.io/ignore", "operator": "NotIn",
            "values": ["true"]} in selector["matchExpressions"]
    assert "objectSelector" not in hook, "users could opt their pods out with a label"

    def ns(name, **labels):
        return {"kubernetes.io/metadata.name": name, **labels}

    assert label_selector_matches(selector, ns("team-a"))
    assert label_selector_matches(selector, ns("default"))
    assert label_selector_matches(selector, ns("team-b", **{"gpuguard.io/ignore": "false"}))
    assert not label_selector_matches(selector, ns("kube-system"))
    assert not label_selector_matches(selector, ns(NAMESPACE))
    assert not label_selector_matches(selector, ns("legacy", **{"gpuguard.io/ignore": "true"}))


# ---------------------------------------------------------------- the GPUQuota CRD

CRD = "gpuquotas.gpuguard.io"
EXAMPLE = DEPLOY / "examples" / "gpuquota.yaml"
# Kubernetes quantities (resource.Quantity's grammar, without a minus sign) and what is not one.
QUANTITIES = ["8", "0", "0.5", "500m", "1.5", "0.143", ".5", "1.", "+2", "2k", "1Ki", "1e3",
              "1E-3", "100u", "5n", "1E"]
NOT_QUANTITIES = ["eight", "-1", "-0.5", "", " 8", "8 ", "1.1.1", "1e1.5", "8 GPUs", "0x10",
                  "1K", "mi", ".", "1mi", "½"]
# The shape the servers write (docs/quotas.md): the ledger of one admitted pod.
LEDGER = {"used": {"gpu": "5.250", "pools": {"h100-train": "4"}},
          "entries": [{"uid": "0c4f3a0e-3f4e-4b8a-9d0e-5f7a4c2b1e6d", "pod": "train-x7k2p",
                       "charge": "1.000", "pool": "h100-train",
                       "admitted": "2026-11-29T10:00:00.000000Z"}],
          "conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled",
                          "message": "recounted from 3 pods",
                          "lastTransitionTime": "2026-11-29T10:00:00Z"}],
          "observedGeneration": 1}


def crd_version(render):
    crd = one(render, "CustomResourceDefinition", CRD)
    [version] = crd["spec"]["versions"]
    return crd, version


def crd_schema(render):
    return crd_version(render)[1]["schema"]["openAPIV3Schema"]


def schema_nodes(node, path="."):
    """Every node of an OpenAPI schema with its path (.spec.hard.gpu, .status.entries[].uid)."""
    yield path, node
    sep = "" if path == "." else "."
    for key, sub in node.get("properties", {}).items():
        yield from schema_nodes(sub, path + sep + key)
    if "items" in node:
        yield from schema_nodes(node["items"], path + "[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_nodes(node["additionalProperties"], path + sep + "*")


def node_at(schema, path):
    return dict(schema_nodes(schema))[path]


def gpuquota(hard, status=None):
    obj = {"apiVersion": "gpuguard.io/v1alpha1", "kind": "GPUQuota",
           "metadata": {"name": "gpu", "namespace": "team-a"}, "spec": {"hard": hard}}
    if status is not None:
        obj["status"] = status
    return obj


def schema_errors(render, obj):
    """What the CRD's schema says of obj, checked as JSON Schema (the x-kubernetes- keywords
    aside, which the API server alone applies: the e2e test does)."""
    validator = jsonschema.Draft7Validator(crd_schema(render))
    return sorted(e.message for e in validator.iter_errors(obj))


def test_gpuquota_crd(render):
    crd, version = crd_version(render)
    spec = crd["spec"]
    assert spec["group"] == "gpuguard.io" and spec["scope"] == "Namespaced"
    assert spec["names"] == {"kind": "GPUQuota", "listKind": "GPUQuotaList", "plural": "gpuquotas",
                             "singular": "gpuquota", "shortNames": ["gq"],
                             "categories": ["gpuguard"]}
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    # The ledger is written through /status only: spec writes keep it, status writes keep spec.
    assert version["subresources"] == {"status": {}}
    # `kubectl get gpuquotas -A`: NAMESPACE NAME HARD USED AGE.
    assert [(c["name"], c["type"], c["jsonPath"]) for c in version["additionalPrinterColumns"]] == [
        ("Hard", "string", ".spec.hard.gpu"), ("Used", "string", ".status.used.gpu"),
        ("Age", "date", ".metadata.creationTimestamp")]
    assert not find(render, "GPUQuota"), "no GPUQuota ships: the CRD must be established first"


def test_the_crd_is_applied_before_the_webhooks(render):
    """kustomize writes CustomResourceDefinitions first; the webhook configurations come
    last."""
    kinds = [d["kind"] for d in render]
    first_crd = kinds.index("CustomResourceDefinition")
    assert first_crd < min(kinds.index(k) for k in WEBHOOK_KINDS)
    assert set(kinds[:first_crd]) <= {"Namespace", "ResourceQuota"}
    assert "webhook-configuration" not in one(render, "CustomResourceDefinition", CRD)[
        "metadata"].get("labels", {}).values()


def test_gpuquota_schema_is_structural_and_bounded(render):
    schema = crd_schema(render)
    int_or_string = []
    for path, node in schema_nodes(schema):
        if node.get("x-kubernetes-int-or-string"):
            int_or_string.append(path)
            assert "type" not in node and node["anyOf"] == [{"type": "integer"},
                                                            {"type": "string"}], path
            continue
        assert node.get("type") in ("object", "array", "string", "integer"), path
        assert not {"anyOf", "allOf", "oneOf", "not"} & set(node), path
        if path in (".apiVersion", ".kind"):
            continue
        if node["type"] == "string":
            assert "maxLength" in node or "enum" in node or node.get("format") == "date-time", path
        if node["type"] == "array":
            assert "maxItems" in node, path
        if isinstance(node.get("additionalProperties"), dict):
            assert "maxProperties" in node, path
    assert int_or_string == [".spec.hard.gpu", ".spec.hard.pools.*"]
    assert schema["required"] == ["spec"]
    assert node_at(schema, ".spec")["required"] == ["hard"]
    assert node_at(schema, ".spec.hard")["required"] == ["gpu"]
    entries = node_at(schema, ".status.entries")
    assert entries["x-kubernetes-list-type"] == "map"
    assert entries["x-kubernetes-list-map-keys"] == ["uid"]
    assert entries["items"]["required"] == ["uid"]
    assert 1000 <= entries["maxItems"] <= 5000, "a few thousand pods admitted and not yet seen"
    assert set(entries["items"]["properties"]) == {"uid", "pod", "charge", "pool", "admitted"}
    assert node_at(schema, ".status.conditions")["x-kubernetes-list-map-keys"] == ["type"]


@pytest.mark.parametrize("path", [".spec.hard.gpu", ".spec.hard.pools.*", ".status.used.gpu",
                                  ".status.used.pools.*", ".status.entries[].charge"])
def test_quantity_pattern(render, path):
    """The pattern takes what resource.Quantity parses (but negatives) and nothing else; Go's
    RE2 and Python's re read it alike."""
    node = node_at(crd_schema(render), path)
    pattern = re.compile(node["pattern"])
    for q in QUANTITIES:
        if path.startswith(".status") and q.startswith("+"):
            continue  # gpuguard writes no sign
        assert pattern.search(q), (path, q)
        assert len(q) <= node["maxLength"]
    for q in NOT_QUANTITIES:
        assert not pattern.search(q), (path, q)
    if path.startswith(".spec"):
        assert node["minimum"] == 0, "an integer is not matched by the pattern"


def test_the_example_is_a_valid_gpuquota(render):
    example = yaml.safe_load(EXAMPLE.read_text())
    assert example["kind"] == "GPUQuota"
    assert example["apiVersion"] == "gpuguard.io/v1alpha1"
    assert schema_errors(render, example) == []
    assert example["metadata"] == {"name": "gpu", "namespace": "team-a"}
    assert example["spec"] == {"hard": {"gpu": "8", "pools": {"h100-train": "4"}}}
    # Its pools are pools of the shipped configuration, and it sets the limit that
    # quotas.namespaces gives team-a there (docs/quotas.md moves one to the other).
    config = yaml.safe_load((DEPLOY / "gpuguard.yaml").read_text())
    assert set(example["spec"]["hard"]["pools"]) <= {p["name"] for p in config["pools"]}
    assert quantity(example["spec"]["hard"]["gpu"]) == \
        config["quotas"]["namespaces"][example["metadata"]["namespace"]]
    # The ledger the servers write fits the schema.
    assert schema_errors(render, dict(example, status=LEDGER)) == []


@pytest.mark.parametrize("hard,refused", [
    ({"gpu": "eight"}, "does not match"),
    ({"pools": {"h100-train": "4"}}, "'gpu' is a required property"),
    ({"gpu": 0.5}, "is not valid under any of the given schemas"),   # quote fractions
    ({"gpu": -1}, "is less than the minimum of 0"),
    ({"gpu": "8", "pools": {"h100-train": "four"}}, "does not match"),
], ids=["eight", "no-gpu", "unquoted-fraction", "negative", "pool-four"])
def test_bad_gpuquotas_are_refused(render, hard, refused):
    errors = schema_errors(render, gpuquota(hard))
    assert any(refused in e for e in errors), errors


def test_good_gpuquotas_are_accepted(render):
    for gpu in (8, "8", "0.5", "500m", 0):
        assert schema_errors(render, gpuquota({"gpu": gpu, "pools": {"a100-mig": gpu}})) == [], gpu


# ---------------------------------------------------------------- overlays


def test_cert_manager_overlay(cert_manager, base):
    dep = one(cert_manager, "Deployment", SERVICE)
    tls_volume = [v for v in dep["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert [v["secret"]["secretName"] for v in tls_volume] == [TLS_SECRET]
    assert not find(cert_manager, "Secret"), "cert-manager writes the Secret"

    certs = {c["metadata"]["name"]: c for c in find(cert_manager, "Certificate")}
    issuers = {i["metadata"]["name"]: i for i in find(cert_manager, "Issuer")}
    serving = [c for c in certs.values() if c["spec"]["secretName"] == TLS_SECRET]
    assert len(serving) == 1, "one Certificate writes the TLS Secret"
    serving = serving[0]
    assert f"{SERVICE}.{NAMESPACE}.svc" in serving["spec"]["dnsNames"]
    assert not serving["spec"].get("isCA", False)
    assert "server auth" in serving["spec"]["usages"]
    # The chain: serving <- CA Issuer <- CA Certificate <- self-signed Issuer.
    ca_issuer = issuers[serving["spec"]["issuerRef"]["name"]]
    assert serving["spec"]["issuerRef"].get("kind", "Issuer") == "Issuer"
    ca_cert = [c for c in certs.values()
               if c["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"]]
    assert len(ca_cert) == 1 and ca_cert[0]["spec"]["isCA"] is True
    root = issuers[ca_cert[0]["spec"]["issuerRef"]["name"]]
    assert root["spec"] == {"selfSigned": {}}
    # Renewal well before expiry; the CA outlives many serving certificates.
    hours = lambda d: float(d.rstrip("h"))  # noqa: E731
    assert hours(serving["spec"]["renewBefore"]) < hours(serving["spec"]["duration"])
    assert hours(ca_cert[0]["spec"]["duration"]) >= 10 * hours(serving["spec"]["duration"])

    for kind in WEBHOOK_KINDS:
        cfg = one(cert_manager, kind, WEBHOOK_CONFIG)
        assert cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == \
            f"{NAMESPACE}/{serving['metadata']['name']}"
        assert "caBundle" not in cfg["webhooks"][0]["clientConfig"], "the CA injector sets it"
        # Otherwise the base's configuration, Ignore until gpuguard is trusted.
        assert cfg["webhooks"] == one(base, kind, WEBHOOK_CONFIG)["webhooks"]


def test_provided_certs_overlay_placeholder(provided_certs):
    """The checked-in patch is a placeholder that the API server cannot decode."""
    assert not find(provided_certs, "Secret"), "the Secret is created with kubectl, not in git"
    assert not find(provided_certs, "Certificate")
    patch = (OVERLAYS / "provided-certs" / "webhook-cabundle.yaml").read_text()
    assert patch.count(PLACEHOLDER) == 4
    with pytest.raises(binascii.Error):
        base64.b64decode(PLACEHOLDER, validate=True)
    for kind in WEBHOOK_KINDS:
        hooks = one(provided_certs, kind, WEBHOOK_CONFIG)["webhooks"]
        assert len(hooks) == 2
        assert [h["clientConfig"]["caBundle"] for h in hooks] == [PLACEHOLDER] * 2


@pytest.fixture
def repo_copy(tmp_path):
    """deploy/ copied as gpuguard/deploy, so an overlay can be changed and rendered from a
    kustomization beside it (tmp_path/mine, as a user's: ../gpuguard/deploy)."""
    root = tmp_path / "gpuguard"
    shutil.copytree(DEPLOY, root / "deploy")
    return root


@needs_kubectl
def test_provided_certs_overlay_with_generated_patch(repo_copy, tmp_path, binary, base):
    overlay = repo_copy / "deploy" / "overlays" / "provided-certs"
    patch = overlay / "webhook-cabundle.yaml"
    out = tmp_path / "certs"
    args = [binary, "certs", "--service", SERVICE, "--namespace", NAMESPACE, "--out", str(out),
            "--kustomize-patch", str(patch)]
    # The placeholder is a file like any other: replacing it takes --force.
    res = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "--force" in res.stderr
    assert PLACEHOLDER in patch.read_text() and not out.exists()
    res = subprocess.run(args + ["--force"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr

    docs = compose(tmp_path / "mine", repo_copy / "deploy", overlay)
    ca = (out / "ca.crt").read_bytes()
    for kind in WEBHOOK_KINDS:
        cfg = one(docs, kind, WEBHOOK_CONFIG)
        want = one(base, kind, WEBHOOK_CONFIG)
        assert len(cfg["webhooks"]) == 2, "the patch merges into the webhooks by name"
        hooks = []
        for hook in cfg["webhooks"]:
            hook = dict(hook, clientConfig=dict(hook["clientConfig"]))
            bundle = hook["clientConfig"].pop("caBundle")
            assert base64.b64decode(bundle, validate=True) == ca
            hooks.append(hook)
        assert hooks == want["webhooks"], "only caBundle changes"
    if shutil.which("openssl"):
        bundle_file = tmp_path / "bundle.pem"
        bundle_file.write_bytes(base64.b64decode(bundle))
        res = subprocess.run(["openssl", "verify", "-purpose", "sslserver", "-verify_hostname",
                              f"{SERVICE}.{NAMESPACE}.svc", "-CAfile", str(bundle_file),
                              str(out / "tls.crt")], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr


# ---------------------------------------------------------------- the NetworkPolicy

NETPOL = DEPLOY / "components" / "network-policy"
MONITORING = {"kubernetes.io/metadata.name": "monitoring"}


def documented_lines(path):
    """The YAML a file's comment tells users to put in their overlay: its comment lines
    indented by three spaces."""
    lines = [l[4:] for l in path.read_text().splitlines() if l.startswith("#   ")]
    assert lines, f"{path} documents no overlay lines"
    return "\n".join(lines) + "\n"


def documented_netpol_overlay():
    """The overlay lines the component's kustomization.yaml tells users to add, with a
    control-plane CIDR filled in."""
    text = documented_lines(NETPOL / "kustomization.yaml")
    assert text.startswith("components:\n"), text
    return text


def ingress_ports(rule, ctr):
    return {resolve_port(p["port"], ctr) for p in rule["ports"]}


def check_network_policy(docs, serve_help):
    """The shipped NetworkPolicy: selects the webhook's pods, ingress only (egress stays open
    for the inventory), and exactly two rules, on the ports the Deployment's flags serve."""
    policy = one(docs, "NetworkPolicy", SERVICE)
    assert policy["metadata"]["namespace"] == NAMESPACE
    dep = one(docs, "Deployment", SERVICE)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]
    assert set(selector) == {"matchLabels"}
    assert selector["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"], "egress stays open: the inventory"
    ctr = container(docs)
    flags = split_flags(ctr["args"])
    webhook_port, ops_port = port_of(flags["--listen"]), port_of(flags["--ops-listen"])
    assert (webhook_port, ops_port) == (serve_help["webhook_port"], serve_help["ops_port"])
    rules = policy["spec"]["ingress"]
    assert [ingress_ports(r, ctr) for r in rules] == [{webhook_port}, {ops_port}]
    for rule in rules:
        assert all(p.get("protocol", "TCP") == "TCP" for p in rule["ports"])
    # Every port the pod serves, and every port the Service sends to, has a rule.
    served = {p["containerPort"] for p in ctr["ports"]}
    service = one(docs, "Service", SERVICE)
    targets = {resolve_port(p["targetPort"], ctr) for p in service["spec"]["ports"]}
    assert served | targets <= {webhook_port, ops_port}
    # The probes are on the ops port, which admits the node (always) and monitoring only.
    for probe in ("readinessProbe", "livenessProbe"):
        assert resolve_port(ctr[probe]["httpGet"]["port"], ctr) == ops_port
    return policy, rules


@needs_bin
def test_network_policy_is_shipped(render, serve_help):
    """Every render: the webhook port from anywhere (the API server's address is not
    known in general, and a policy that blocked it would stop pod creation cluster-wide: only
    the optional component narrows it), the ops port from the monitoring namespace only."""
    _, rules = check_network_policy(render, serve_help)
    assert "from" not in rules[0], "the webhook port must stay open to the API server"
    assert rules[1]["from"] == [{"namespaceSelector": {"matchLabels": MONITORING}}]


def user_kustomization(where, text):
    """Render a kustomization of the user's, tmp_path/mine beside the copy of deploy/
    (repo_copy): its resources are ../gpuguard/deploy, the rest is text."""
    where.mkdir()
    (where / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources:\n  - ../gpuguard/deploy\n" + text)
    return kustomize(where)


@needs_kubectl
@needs_bin
def test_network_policy_monitoring_selector_as_documented(repo_copy, tmp_path, serve_help):
    """The kustomize patch the chart's NetworkPolicy documents for Prometheus in another
    namespace changes the ops port's namespace selector, and nothing else."""
    docs = user_kustomization(tmp_path / "mine", documented_lines(
        CHART / "templates" / "networkpolicy.yaml"))
    without = kustomize(repo_copy / "deploy")
    assert [d for d in docs if d["kind"] != "NetworkPolicy"] == \
        [d for d in without if d["kind"] != "NetworkPolicy"]
    _, rules = check_network_policy(docs, serve_help)
    assert "from" not in rules[0]
    assert rules[1]["from"] == [{"namespaceSelector": {
        "matchLabels": {"kubernetes.io/metadata.name": "observability"}}}]


def test_network_policy_placeholder_is_refused():
    """As shipped, the component's CIDR is no CIDR: the API server refuses the
    NetworkPolicy instead of cutting the webhook off from the API server."""
    ops = yaml.safe_load((NETPOL / "webhook-from-control-plane.yaml").read_text())
    added = [op for op in ops if op["op"] == "add" and op["path"] == "/spec/ingress/0/from"]
    assert len(added) == 1
    cidr = added[0]["value"][0]["ipBlock"]["cidr"]
    with pytest.raises(ValueError):
        ipaddress.ip_network(cidr)


@needs_kubectl
@needs_bin
def test_network_policy_component(repo_copy, tmp_path, serve_help):
    """Added to a kustomization as documented, the component narrows the shipped
    NetworkPolicy's webhook rule to the control-plane CIDR, and leaves the ops
    port's rule and every other object as they were."""
    docs = user_kustomization(tmp_path / "mine", documented_netpol_overlay())
    without = kustomize(repo_copy / "deploy")
    assert [d for d in docs if d["kind"] != "NetworkPolicy"] == \
        [d for d in without if d["kind"] != "NetworkPolicy"]
    _, rules = check_network_policy(docs, serve_help)
    webhook_port = serve_help["webhook_port"]
    assert rules[0] == {"from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}],
                        "ports": [{"protocol": "TCP", "port": webhook_port}]}
    assert rules[1] == one(without, "NetworkPolicy", SERVICE)["spec"]["ingress"][1]


# ---------------------------------------------------------------- the pod, run for real


def materialize(docs, root, certs):
    """Lay out the Deployment's volumes under root as the kubelet would mount them;
    return the container's arguments with /-paths moved under root, or to the repository's
    copies of the image's directories (IMAGE_DIRS)."""
    dep = one(docs, "Deployment", SERVICE)
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    ctr = container(docs)
    for m in ctr["volumeMounts"]:
        vol = volumes[m["name"]]
        target = root / m["mountPath"].lstrip("/")
        if "secret" in vol:
            target.mkdir(parents=True)
            for name in ("tls.crt", "tls.key"):
                shutil.copy(certs / name, target / name)
            continue
        data = one(docs, "ConfigMap", vol["configMap"]["name"])["data"]
        target.mkdir(parents=True)
        for key, text in data.items():
            (target / key).write_text(text)
    args = []
    for name, value in flag_pairs(ctr["args"]):
        if name in ("--listen", "--ops-listen"):
            value = "127.0.0.1:0"
        elif value in IMAGE_DIRS:
            value = str(IMAGE_DIRS[value])
        elif value and value.startswith("/"):
            value = str(root / value.lstrip("/"))
        args += [name] + ([value] if value is not None else [])
    return args


# More GPU memory than any GPU of the fleet has, in class interactive, whose one pool (l4-shared)
# gives a time-sliced share of one L4: no pool of the class holds it.  (Class inference would: its
# pool l4-infer rounds it up to whole L4s.)
BIG_TEMPLATE = {"metadata": {"labels": {"team": "a", "gpuguard.io/workload-class": "interactive"},
                             "annotations": {"gpuguard.io/gpu-memory": "90Gi"}},
                "spec": {"containers": [{"name": "main", "image": "vllm"}]}}
BIG_DENIAL = ("gpu-sharing: container main: a time-slicing GPU is shared, one replica at most; "
              "ask for at most 1 GPU, or use a class with exclusive GPUs (batch, inference, training)")


@needs_kubectl
def test_rendered_pod_serves(provided_certs, binary, certs, tmp_path):
    """The rendered ConfigMap and arguments (provided-certs: the certificate from the Secret's
    files) start the real server, with the policies and Lua library the image holds: ready,
    both webhook paths answer a pod review, and every resource of the workload rules is reviewed
    as a workload (its template denied, the denial naming the template).  The API server, where
    --webhook-configuration writes the webhooks' failurePolicy, does not answer: gpuguard serves
    all the same."""
    args = materialize(provided_certs, tmp_path / "pod", certs)
    server = start_server(binary, certs, tmp_path, *args, *unreachable_cluster(tmp_path),
                          ready_timeout=30)
    try:
        ctr = container(provided_certs)
        for probe in ("readinessProbe", "livenessProbe"):
            status, body = server.ops(ctr[probe]["httpGet"]["path"])
            assert status == 200, (probe, body)
        review = load_review("pod-create.json")
        for kind in WEBHOOK_KINDS:
            hook = one(provided_certs, kind, WEBHOOK_CONFIG)["webhooks"][0]
            path = hook["clientConfig"]["service"]["path"]
            conn = server.connect()
            status, _, answer = conn.review(review, path=path, timeout="5s")
            conn.close()
            assert status == 200, answer
            assert answer["response"]["uid"] == review["request"]["uid"]
            assert ("patch" in answer["response"]) == (path == "/mutate"), answer
        for (group, resource), (kind, wrap) in sorted(WORKLOAD_RESOURCES.items()):
            obj = wrap(BIG_TEMPLATE)
            obj.update(kind=kind, apiVersion=f"{group}/v1" if group else "v1",
                       metadata=dict(obj.get("metadata", {}), name="w", namespace="team-a"))
            review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                      "request": {"uid": f"uid-{resource}", "operation": "CREATE",
                                  "kind": {"group": group, "version": "v1", "kind": kind},
                                  "resource": {"group": group, "version": "v1",
                                               "resource": resource},
                                  "namespace": "team-a", "name": "w", "object": obj,
                                  "userInfo": {"username": "alice"}}}
            for kind_ in WEBHOOK_KINDS:
                path = workload_hook(provided_certs, kind_)["clientConfig"]["service"]["path"]
                conn = server.connect()
                status, _, answer = conn.review(review, path=path, timeout="5s")
                conn.close()
                assert status == 200, answer
                msg = answer["response"].get("status", {}).get("message", str(answer))
                assert msg.endswith(": " + BIG_DENIAL) and not msg.startswith("gpu-sharing"), \
                    (resource, msg)
        log = server.log_lines()
        assert not [rec for rec in log if rec.get("level") == "error"], log
        # The shipped policies, all of them.
        serving = [rec for rec in log if rec.get("msg") == "serving"]
        loaded = serving[0].get("policies")
        if isinstance(loaded, list):
            assert len(loaded) == len(list((REPO / "policies").glob("*.lua"))), loaded
    finally:
        assert server.stop() == 0


# ---------------------------------------------------------------- Dockerfile


def dockerfile_stages():
    """[(FROM line, [instructions])], continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(
        line for line in (DEPLOY / "Dockerfile").read_text().splitlines()
        if not line.lstrip().startswith("#")))
    stages = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            stages.append((rest.strip(), []))
        else:
            assert stages, f"{op} before FROM"
            stages[-1][1].append((op, " ".join(rest.split())))
    return stages


def apt_packages(instructions):
    pkgs = []
    for op, rest in instructions:
        if op != "RUN":
            continue
        for cmd in re.split(r"&&|;", rest):
            words = shlex.split(cmd)
            if "apt-get" in words and "install" in words:
                pkgs += [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
    return pkgs


def makefile_var(name):
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    return re.search(r"^" + name + r"\s*:?=(.*)$", text, re.M).group(1).split()


# The -dev packages behind the Makefile's pkg-config modules (PKGS) on bookworm.
BUILD_DEV_PKGS = {"libmicrohttpd-dev", "libjansson-dev", "liblua5.4-dev", "libssl-dev",
                  "libyaml-dev", "libcurl4-openssl-dev", "libgnutls28-dev"}


# The final stage installs the packages of the binary's libraries (checked by
# test_runtime_packages_cover_the_binary) and these, for other reasons:
NOT_LINKED_PKGS = {"ca-certificates"}  # trust roots for libcurl, the inventory's API client
# Packages of the binary's libraries that the base image (bookworm-slim) has already.
BASE_IMAGE_PKGS = {"libc6"}


def test_dockerfile_stages():
    stages = dockerfile_stages()
    assert len(stages) == 2, "a build stage and a runtime stage"
    (build_from, _), (final_from, final) = stages
    assert re.fullmatch(r"debian:bookworm\S* AS build", build_from, re.I), build_from
    assert re.fullmatch(r"debian:bookworm-slim", final_from), final_from
    users = [rest for op, rest in final if op == "USER"]
    assert len(users) == 1 and re.fullmatch(r"[1-9]\d*(:\d+)?", users[0]), \
        "the final stage runs as a numeric non-root user (runAsNonRoot can check it)"


def test_dockerfile_build_stage():
    (_, build), _ = dockerfile_stages()
    pkgs = set(apt_packages(build))
    assert BUILD_DEV_PKGS <= set(makefile_var("DEB_PKGS")), "make deps installs them too"
    assert BUILD_DEV_PKGS <= pkgs, f"missing build packages: {sorted(BUILD_DEV_PKGS - pkgs)}"
    assert {"build-essential", "pkg-config"} <= pkgs
    assert any(op == "RUN" and re.search(r"\bmake\b", rest) for op, rest in build)


@pytest.mark.skipif(shutil.which("dpkg") is None or shutil.which("pkg-config") is None,
                    reason="dpkg and pkg-config are needed to map PKGS to Debian packages")
def test_build_packages_cover_the_makefile_modules():
    """Each pkg-config module the Makefile builds with (PKGS) comes from a -dev package
    in BUILD_DEV_PKGS, so a new module shows up here before the image build breaks."""
    for module in makefile_var("PKGS"):
        pc = subprocess.run(["pkg-config", "--path", module], capture_output=True, text=True)
        assert pc.returncode == 0, f"pkg-config does not know {module}"
        owner = subprocess.run(["dpkg", "-S", pc.stdout.strip()], capture_output=True, text=True)
        assert owner.returncode == 0, pc.stdout
        assert owner.stdout.split(":")[0] in BUILD_DEV_PKGS, (module, owner.stdout)


def test_dockerfile_final_stage():
    _, (_, final) = dockerfile_stages()
    pkgs = apt_packages(final)
    assert NOT_LINKED_PKGS <= set(pkgs), sorted(pkgs)
    assert not [p for p in pkgs if p.endswith("-dev") or p in ("build-essential", "pkg-config")]
    copies = [rest.split() for op, rest in final if op == "COPY"]
    sources = {tuple(c[:-1]): c[-1] for c in copies}
    # The configuration's default, where the chart mounts its ConfigMap over it.
    assert sources[("deploy/gpuguard.yaml",)] == "/etc/gpuguard/config/gpuguard.yaml"
    for path, src in IMAGE_DIRS.items():
        assert sources[(f"{src.name}/*.lua",)] == path + "/"
    binary = [c[-1] for c in copies if c[0] == "--from=build"]
    assert len(binary) == 1
    entry = [json.loads(rest) for op, rest in final if op == "ENTRYPOINT"]
    assert entry == [[binary[0], "serve"]]


def test_dockerfile_matches_deployment(provided_certs, serve_help):
    """The image's defaults and the manifests (with the certificate from a mounted Secret, as
    the image's CMD has it) agree: same user, same paths, same flags."""
    _, (_, final) = dockerfile_stages()
    uid = int([rest for op, rest in final if op == "USER"][0].split(":")[0])
    dep = one(provided_certs, "Deployment", SERVICE)
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid
    cmd = [json.loads(rest) for op, rest in final if op == "CMD"]
    assert len(cmd) == 1
    image_flags = split_flags(cmd[0])
    assert set(image_flags) <= serve_help["flags"]
    deploy_flags = split_flags(container(provided_certs)["args"])
    for name, value in image_flags.items():
        assert deploy_flags[name] == value, name
    exposed = [rest for op, rest in final if op == "EXPOSE"]
    assert exposed == [f"{serve_help['webhook_port']} {serve_help['ops_port']}"]


def test_dockerignore_keeps_what_the_build_copies():
    patterns = [l.strip() for l in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
                if l.strip() and not l.startswith("#")]
    assert patterns[0] == "*"
    allowed = [p[1:] for p in patterns if p.startswith("!")]
    stages = dockerfile_stages()
    for _, instructions in stages:
        for op, rest in instructions:
            if op != "COPY" or rest.startswith("--from"):
                continue
            for src in rest.split()[:-1]:
                src = src.rstrip("/")
                assert any(fnmatch.fnmatch(src, p) or src == p for p in allowed), src


@pytest.mark.skipif(shutil.which("dpkg") is None or shutil.which("readelf") is None,
                    reason="dpkg and readelf are needed to map the binary's libraries to packages")
def test_runtime_packages_cover_the_binary(binary):
    """Every library the binary links (ELF NEEDED) comes from a package the Dockerfile's
    final stage installs (or the base image has), so a new dependency cannot be left out
    of the image; and the final stage installs nothing else but NOT_LINKED_PKGS."""
    if b"__asan_init" in Path(binary).read_bytes():
        pytest.skip("a sanitizer build (make asan) also links the sanitizers' runtime needs")
    dynamic = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    assert needed, dynamic
    cache = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    owners = {}
    for lib in needed:
        paths = re.findall(r"^\s+" + re.escape(lib) + r" \(.*\) => (\S+)$", cache, re.M)
        assert paths, f"ldconfig does not know {lib}"
        for path in (paths[0], os.path.realpath(paths[0])):
            res = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
            if res.returncode == 0:
                owners[lib] = res.stdout.split(":")[0]
                break
        assert lib in owners, f"no package owns {lib} ({paths[0]})"
    _, (_, final) = dockerfile_stages()
    installed = set(apt_packages(final))
    missing = {lib: pkg for lib, pkg in owners.items() if pkg not in installed | BASE_IMAGE_PKGS}
    assert not missing, f"deploy/Dockerfile's final stage does not install {missing}"
    unused = installed - set(owners.values()) - NOT_LINKED_PKGS
    assert not unused, f"deploy/Dockerfile's final stage installs {sorted(unused)}, " \
                       "which the binary does not link (NOT_LINKED_PKGS says why others are there)"


def deployment(template_image="vllm:1", replicas=1, annotations=None, status=None, labels=None):
    obj = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "d", "namespace": "team-a", "annotations": annotations or {},
                        **({"labels": labels} if labels is not None else {})},
           "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "d"}},
                    "template": {"metadata": {"labels": {"app": "d"}},
                                 "spec": {"containers": [{"name": "c", "image": template_image}]}}}}
    if status is not None:
        obj["status"] = status
    return obj


def cronjob(image="train:1", schedule="0 * * * *", labels=None):
    return {"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "c", **({"labels": labels} if labels is not None else {})},
            "spec": {"schedule": schedule, "jobTemplate": {"spec": {"template": {
                "spec": {"containers": [{"name": "c", "image": image}]}}}}}}


def raycluster(worker_image="ray:1", replicas=1):
    tmpl = lambda image: {"spec": {"containers": [{"name": "ray", "image": image}]}}  # noqa: E731
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "r"},
            "spec": {"headGroupSpec": {"template": tmpl("ray:1")},
                     "workerGroupSpecs": [{"groupName": "g", "replicas": replicas,
                                           "template": tmpl(worker_image)}]}}


# (what, group, resource, operation, old, new, whether the API server calls gpuguard)
WORKLOAD_REVIEWS = [
    ("a Deployment CREATE", "apps", "deployments", "CREATE", None, deployment(), True),
    ("a Deployment scaled", "apps", "deployments", "UPDATE", deployment(), deployment(replicas=5),
     False),
    ("the Deployment controller's revision annotation and status", "apps", "deployments", "UPDATE",
     deployment(), deployment(annotations={"deployment.kubernetes.io/revision": "2"},
                              status={"replicas": 1}), False),
    ("a Deployment's template changed", "apps", "deployments", "UPDATE", deployment(),
     deployment(template_image="vllm:2"), True),
    ("a CronJob's schedule changed", "batch", "cronjobs", "UPDATE", cronjob(),
     cronjob(schedule="5 * * * *"), False),
    ("a CronJob's template changed", "batch", "cronjobs", "UPDATE", cronjob(), cronjob("train:2"),
     True),
    ("a RayCluster's workers scaled (the autoscaler)", "ray.io", "rayclusters", "UPDATE",
     raycluster(), raycluster(replicas=4), False),
    ("a RayCluster's worker template changed", "ray.io", "rayclusters", "UPDATE", raycluster(),
     raycluster("ray:2"), True),
    # A label-only move to another queue or priority: validated (gpu-queues), not mutated.
    ("a Deployment moved to another Kueue queue", "apps", "deployments", "UPDATE",
     deployment(labels={"kueue.x-k8s.io/queue-name": "a"}),
     deployment(labels={"kueue.x-k8s.io/queue-name": "b"}), "validate"),
    ("a CronJob given a Kueue priority class", "batch", "cronjobs", "UPDATE", cronjob(),
     cronjob(labels={"kueue.x-k8s.io/priority-class": "high"}), "validate"),
    ("a Deployment's KAI queue removed", "apps", "deployments", "UPDATE",
     deployment(labels={"kai.scheduler/queue": "a"}), deployment(labels={}), "validate"),
    ("a Deployment's other label changed", "apps", "deployments", "UPDATE",
     deployment(labels={"kueue.x-k8s.io/queue-name": "a", "team": "x"}),
     deployment(labels={"kueue.x-k8s.io/queue-name": "a", "team": "y"}), False),
]


@pytest.mark.parametrize("kind", WEBHOOK_KINDS)
@pytest.mark.parametrize("what,group,resource,operation,old,new,sent", WORKLOAD_REVIEWS,
                         ids=[r[0] for r in WORKLOAD_REVIEWS])
def test_workload_conditions_send_only_template_changes(base, kind, what, group, resource,
                                                        operation, old, new, sent):
    """The workload webhooks' condition, evaluated as the API server would: template changes
    are sent (queue and priority label changes to the validating webhook), the controllers' own
    writes are not, and no condition fails to evaluate (with failurePolicy Fail that would
    reject the request)."""
    env = {"object": new, "oldObject": old, "request": {
        **admission_request(operation, ""),
        "resource": {"group": group, "version": "v1", "resource": resource}}}
    results = [evaluate(compile_cel(c["expression"])[0], env)
               for c in workload_hook(base, kind)["matchConditions"]]
    for r in results:
        assert not isinstance(r, CelError), f"{what}: the condition fails: {r}"
    if sent == "validate":
        sent = kind == "ValidatingWebhookConfiguration"
    assert all(results) is sent, what
