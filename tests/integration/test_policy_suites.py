"""The project's policy test suites (tests/policies) through the real binary.

1. `gpuguard test tests/policies` passes every case (exit 0, "0 failed").
2. Every pod of every case (the manifest files, and the inline objects written to a file) goes
   through `gpuguard check -o json --show-patch` with its suite's configuration, cluster state and
   namespace, and every patch the webhook generated applies with python3-jsonpatch to the Pod
   the check reports (the pod its controller would create from the template the record's
   `pointer` names) and gives the mutated pod that `gpuguard check --emit-mutated` writes back.
3. Checking the mutated manifests again changes nothing (idempotence through the CLI).

Debian packages only (python3-pytest, python3-yaml, python3-jsonpatch); GPUGUARD_BIN comes from
the environment (`make test` sets it) and the tests are skipped without it.
"""

import copy
import json
import os
import re
import subprocess
from pathlib import Path

import jsonpatch
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent.parent
SUITES_DIR = REPO / "tests" / "policies"
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def gpuguard_bin():
    path = os.environ.get("GPUGUARD_BIN")
    if not path:
        pytest.skip("GPUGUARD_BIN is not set: run through 'make test' "
                    "(or GPUGUARD_BIN=build/gpuguard python3 -m pytest ...)")
    return path


def suite_files():
    return sorted(SUITES_DIR.rglob("*.suite.yaml"))


class Input:
    """One manifest (or inline object) as a suite runs it: the file and the flags."""

    def __init__(self, suite_path, suite, case, index):
        here = suite_path.parent
        self.suite = suite_path
        self.case = case.get("name", f"case {index + 1}")
        self.manifest = here / case["manifest"] if "manifest" in case else None
        self.object = case.get("object")
        self.config = here / suite["config"] if suite.get("config") else None
        self.cluster_state = here / suite["cluster_state"] if suite.get("cluster_state") else None
        self.policies = here / suite["policies"] if suite.get("policies") else REPO / "policies"
        self.lua = here / suite["lua"] if suite.get("lua") else REPO / "lua"
        self.namespace = case.get("namespace") or suite.get("namespace")
        self.raw = case

    @property
    def id(self):
        return f"{self.suite.relative_to(SUITES_DIR)}::{self.case}"

    def flags(self):
        out = ["--policies", str(self.policies), "--lua", str(self.lua)]
        out += ["--config", str(self.config)] if self.config else ["--no-config"]
        if self.cluster_state:
            out += ["--cluster-state", str(self.cluster_state)]
        if self.namespace:
            out += ["--namespace", self.namespace]
        return out

    def path(self, tmp_path):
        if self.manifest:
            return self.manifest
        path = tmp_path / "object.json"
        path.write_text(json.dumps(self.object))
        return path


def collect_inputs():
    inputs = []
    for path in suite_files():
        suite = yaml.safe_load(path.read_text())
        for i, case in enumerate(suite.get("cases") or []):
            if "manifest" in case or "object" in case:
                inputs.append(Input(path, suite, case, i))
    return inputs


INPUTS = collect_inputs()


def run(binary, *args, cwd=REPO):
    return subprocess.run([binary, *[str(a) for a in args]], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def check_records(binary, inp, path, *extra):
    """The template records of `gpuguard check -o json --show-patch`."""
    out = run(binary, "check", "-o", "json", "--show-patch", *inp.flags(), *extra, path)
    assert out.returncode in (0, 1, 3), out.stdout + out.stderr  # 3: a case expects an error
    records = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    errors = [r for r in records if r["type"] == "error"]
    assert not errors, errors
    return [r for r in records if r["type"] == "template"]


def emitted(binary, flags, path):
    """The documents `gpuguard check --emit-mutated` writes back (patches applied to templates)."""
    out = run(binary, "check", "--emit-mutated", "-o", "json", *flags, path)
    assert out.returncode in (0, 1, 3), out.stderr
    report = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
    errors = [r for r in report if r.get("type") == "error"]
    assert not errors, f"gpuguard could not apply its own patch: {errors}"
    return [d for d in yaml.safe_load_all(out.stdout)]


def pointer_get(doc, pointer):
    if pointer == "":
        return doc
    for token in pointer.lstrip("/").split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        doc = doc[int(token)] if isinstance(doc, list) else doc[token]
    return doc


# KServe component fields that are not a PodSpec's, and its model specs (each a container).
KSERVE_NOT_POD = {"minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "scaleMetricType",
                  "autoScaling", "containerConcurrency", "timeout", "canaryTrafficPercent",
                  "logger", "batcher", "labels", "annotations", "deploymentStrategy", "workerSpec"}
KSERVE_MODELS = ["model", "sklearn", "xgboost", "tensorflow", "pytorch", "triton", "onnx",
                 "huggingface", "pmml", "lightgbm", "paddle"]
KSERVE_NOT_CONTAINER = {"modelFormat", "runtime", "runtimeVersion", "protocolVersion",
                        "storageUri", "storage"}


def template_of(doc, record):
    """The template a record's pod is made from: the one at its pointer; for a Notebook with the
    Notebook's own labels and annotations; for a KServe component, assembled from its fields."""
    template = pointer_get(doc, record["pointer"])
    if record["kind"] == "Notebook":
        meta = doc.get("metadata") or {}
        return {"metadata": {k: meta[k] for k in ("labels", "annotations") if k in meta},
                "spec": template["spec"]}
    if record["kind"] != "InferenceService":
        return template
    spec = {k: v for k, v in template.items() if k not in KSERVE_NOT_POD and k not in KSERVE_MODELS}
    model = next((template[k] for k in KSERVE_MODELS if isinstance(template.get(k), dict)), None)
    if model is not None and "containers" not in spec:
        container = {k: v for k, v in model.items() if k not in KSERVE_NOT_CONTAINER}
        container.setdefault("name", "kserve-container")
        spec["containers"] = [container]
    meta = {}
    for key in ("labels", "annotations"):
        meta[key] = {**((doc.get("metadata") or {}).get(key) or {}), **(template.get(key) or {})}
    return {"metadata": meta, "spec": spec}


def build_pod(doc, record):
    """The Pod the webhook saw for a template record, as `gpuguard check` builds it: a Pod
    document itself, or a Pod from the template's labels, annotations and spec, in the request's
    namespace and owned by the record's owner."""
    template = template_of(doc, record)
    if record["owner"] is None and record["kind"] == "Pod" and record["pointer"] == "":
        pod = copy.deepcopy(template)
        pod.setdefault("metadata", {}).setdefault("namespace", record["namespace"])
        return pod
    meta = {}
    for key in ("labels", "annotations", "finalizers"):
        value = (template.get("metadata") or {}).get(key)
        if value is not None:
            meta[key] = copy.deepcopy(value)
    meta["namespace"] = record["namespace"]
    if record["owner"]:
        meta["generateName"] = record["owner"]["name"] + "-"
        meta["ownerReferences"] = [{"kind": record["owner"]["kind"],
                                    "name": record["owner"]["name"], "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": copy.deepcopy(template["spec"])}


def pod_view(pod_or_template, whole_pod):
    """What a patch on the Pod may change in the manifest: the whole Pod document, or the
    template's labels, annotations, finalizers and spec."""
    if whole_pod:
        out = copy.deepcopy(pod_or_template)
        out.get("metadata", {}).pop("namespace", None)
        return out
    meta = pod_or_template.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("labels", "annotations", "finalizers") if k in meta},
            "spec": pod_or_template.get("spec")}


@pytest.fixture(scope="module")
def binary():
    return gpuguard_bin()


@pytest.fixture(scope="module")
def no_policies(tmp_path_factory):
    return tmp_path_factory.mktemp("no-policies")


def test_there_are_suites_for_every_policy():
    for policy in ("gpu-sharing", "gpu-placement", "gpu-guardrails", "gpu-quota"):
        assert list((SUITES_DIR / policy).glob("*.suite.yaml")), f"no suite for {policy}"


def test_gpuguard_test_passes_every_suite(binary):
    out = run(binary, "test", "tests/policies")
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    failures = "\n".join(line for line in out.stdout.splitlines()
                         if not line.startswith("PASS "))
    assert out.returncode == 0, failures + out.stderr
    assert re.fullmatch(r"\d+ passed, 0 failed", summary), summary


def test_every_manifest_is_used_by_a_suite():
    used = {inp.manifest.resolve() for inp in INPUTS if inp.manifest}
    manifests = [p.resolve() for p in SUITES_DIR.rglob("*")
                 if p.suffix in MANIFEST_SUFFIXES and p.parent.name == "manifests"]
    assert manifests
    unused = sorted(str(p.relative_to(SUITES_DIR)) for p in manifests if p not in used)
    assert not unused, f"manifests no suite runs: {unused}"


@pytest.mark.parametrize("inp", INPUTS, ids=[i.id for i in INPUTS])
def test_patches_apply_with_jsonpatch(binary, no_policies, inp, tmp_path):
    path = inp.path(tmp_path)
    records = check_records(binary, inp, path)
    assert records, "the manifest holds no pod"
    # The documents as gpuguard reads them (no policies: nothing changes), and as it admits them.
    original = emitted(binary, ["--policies", no_policies, "--lua", inp.lua, "--no-config"], path)
    mutated = emitted(binary, inp.flags(), path)
    assert len(original) == len(mutated)
    for record in records:
        where = f"{record['kind']}/{record['name']} {record['path'] or 'Pod'}"
        assert "unmapped_patch" not in record, f"{where}: {record['unmapped_patch']}"
        doc = original[record["document"] - 1]
        pod = build_pod(doc, record)
        try:
            patched = jsonpatch.apply_patch(pod, record["patch"])
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
            pytest.fail(f"{where}: the patch does not apply: {e}\n{json.dumps(record['patch'])}")
        if not record["allowed"]:
            continue  # denied: --emit-mutated leaves it as it was
        whole = record["owner"] is None and record["kind"] == "Pod" and record["pointer"] == ""
        want = pod_view(template_of(mutated[record["document"] - 1], record), whole)
        assert pod_view(patched, whole) == want, f"{where}: patched pod differs from the mutated one"


# What `gpuguard check` cannot say of a request: an UPDATE, a sub-resource, another user.
REQUEST_KEYS = {"operation", "old_object", "user", "groups", "sub_resource"}
CREATES = [i for i in INPUTS if not REQUEST_KEYS & set(i.raw)
           and not (i.raw.get("expect") or {}).get("skipped")]


@pytest.mark.parametrize("inp", CREATES, ids=[i.id for i in CREATES])
def test_check_gives_every_case_the_verdict_its_suite_expects(binary, inp, tmp_path):
    """One code path: `gpuguard check` (the workload through its policies, then each template's
    pod, as the server reviews them) gives every case the verdict `gpuguard test` checked."""
    records = check_records(binary, inp, inp.path(tmp_path))
    expects = inp.raw.get("expect_each") or [inp.raw.get("expect") or {}] * len(records)
    assert len(expects) == len(records)
    for record, expect in zip(records, expects):
        where = f"{record['kind']}/{record['name']} {record['path'] or 'Pod'}"
        if "allowed" in expect:
            assert record["allowed"] is expect["allowed"], f"{where}: {record['message']}"
        if "message" in expect:
            assert record["message"] == expect["message"], where
        assert record["policy_error"] is bool(expect.get("error")), f"{where}: {record['message']}"


@pytest.mark.parametrize("inp", INPUTS, ids=[i.id for i in INPUTS])
def test_mutated_pods_are_left_alone(binary, inp, tmp_path):
    path = inp.path(tmp_path)
    first = check_records(binary, inp, path)
    out = run(binary, "check", "--emit-mutated", "-o", "json", *inp.flags(), path)
    again = tmp_path / "mutated.yaml"
    again.write_text(out.stdout)
    second = check_records(binary, inp, again)
    assert len(first) == len(second)
    for a, b in zip(first, second):
        if a["allowed"] and a["patch"]:
            assert b["patch"] == [], f"{a['kind']}/{a['name']} {a['path']}: {json.dumps(b['patch'])}"
