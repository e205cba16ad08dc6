"""
test_jsonpatch_python.py - cross-checks the C jsonpatch module (through
build/tests/tools/jp_tool) against python3-jsonpatch, an independent RFC 6902
implementation that, like the API server's library, refuses `replace` of a
missing member and `add` under a missing parent.

  * generated edits of realistic Pods: jp_diff's patch, applied by
    python3-jsonpatch to the original, gives exactly the edited object
    (types included: 1 and 1.0 differ), has no root path, names only targets
    that exist in the original, and diff(x, x) == [];
  * the manifest corpus (../shared/corpus from the repository root, when
    present): diff(doc, doc) == [] for every document, and a typical policy
    edit of each object round-trips;
  * the json-patch-tests suites through `jp_tool apply`.

Needs GPUGUARD_TOOLS (set by `make integration`); skipped without it.
Debian packages only: python3-pytest, python3-jsonpatch, python3-yaml.
"""

import copy
import json
import math
import os
import pathlib
import random
import re
import subprocess

import pytest

jsonpatch = pytest.importorskip("jsonpatch", reason="python3-jsonpatch is not installed")

TOOLS = os.environ.get("GPUGUARD_TOOLS")
REPO = pathlib.Path(__file__).resolve().parents[2]
CORPUS = REPO.parent / "shared" / "corpus"
SUITES = REPO / "tests" / "data" / "json-patch-tests"

pytestmark = pytest.mark.skipif(
    not TOOLS, reason="GPUGUARD_TOOLS is not set (run through `make integration`, which builds jp_tool)"
)


# ---- jp_tool ----------------------------------------------------------------


class ToolError(Exception):
    pass


class JpTool:
    """Runs jp_tool on documents written to a temporary directory."""

    def __init__(self, tmp_path):
        self.exe = pathlib.Path(TOOLS) / "jp_tool"
        self.dir = tmp_path
        if not self.exe.exists():
            pytest.fail(f"{self.exe} does not exist; `make integration` builds it")

    def run(self, command, first, second, ensure_ascii=False):
        paths = []
        for name, value in (("first.json", first), ("second.json", second)):
            path = self.dir / name
            path.write_text(json.dumps(value, ensure_ascii=ensure_ascii), encoding="utf-8")
            paths.append(str(path))
        proc = subprocess.run([str(self.exe), command, *paths], capture_output=True, timeout=60)
        if proc.returncode != 0:
            raise ToolError(proc.stderr.decode("utf-8", "replace").strip())
        return json.loads(proc.stdout.decode("utf-8"))

    def diff(self, original, edited, ensure_ascii=False):
        return self.run("diff", original, edited, ensure_ascii)

    def apply(self, doc, patch):
        return self.run("apply", doc, patch)


@pytest.fixture
def tool(tmp_path):
    return JpTool(tmp_path)


# ---- checks -------------------------------------------------------------------


def same(a, b):
    """Equality that, unlike ==, tells 1 from 1.0 and True from 1."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return a == b


INDEX = re.compile(r"0|[1-9][0-9]*")


def tokens(pointer):
    assert pointer.startswith("/"), pointer
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def resolve(doc, toks):
    """(True, value) when the RFC 6901 reference tokens name a value in doc."""
    cur = doc
    for tok in toks:
        if isinstance(cur, dict) and tok in cur:
            cur = cur[tok]
        elif isinstance(cur, list) and INDEX.fullmatch(tok) and int(tok) < len(cur):
            cur = cur[int(tok)]
        else:
            return False, None
    return True, cur


def check_shape(original, patch):
    """What the API server's v4 library needs from every op we emit."""
    assert isinstance(patch, list)
    for op in patch:
        assert op["op"] in ("add", "remove", "replace"), op
        assert op["path"] != "", f"root path: {op}"
        toks = tokens(op["path"])
        if op["op"] in ("replace", "remove"):
            assert resolve(original, toks)[0], f"{op['op']} of a target missing in the original: {op}"
        else:
            found, parent = resolve(original, toks[:-1])
            assert found, f"add under a parent missing in the original: {op}"
            if isinstance(parent, list):
                assert toks[-1] == "-", f"add into an array other than at '-': {op}"
            else:
                assert isinstance(parent, dict), op
                assert toks[-1] not in parent, f"add over an existing member: {op}"
        assert ("value" in op) == (op["op"] != "remove"), op


def check_round_trip(tool, original, edited, ensure_ascii=False):
    patch = tool.diff(original, edited, ensure_ascii)
    check_shape(original, patch)
    result = jsonpatch.apply_patch(original, patch)
    assert same(result, edited), f"patch {patch} gave {result!r}"
    assert same(tool.apply(original, patch), edited)
    assert tool.diff(edited, edited) == []
    return patch


# ---- generated Pod edits ----------------------------------------------------------


def minimal_pod():
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


def training_pod():
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "trainer-0",
            "namespace": "ml",
            "labels": {"app.kubernetes.io/name": "trainer", "team": "vision"},
            "annotations": {"gpuguard.io/gpu-fraction": "0.5", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
            "creationTimestamp": None,
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "trainer", "uid": "1234",
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {"name": "train", "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                 "args": ["--epochs", "10", "--lr", "0.001"],
                 "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                 "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "4", "memory": "32Gi"},
                               "requests": {"cpu": "2", "memory": "16Gi"}},
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                {"name": "logger", "image": "fluent/fluent-bit:2.2", "resources": {}},
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            "securityContext": {"runAsNonRoot": True, "fsGroup": 1000},
        },
        "status": {},
    }


def inference_pod():
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "llm-", "labels": {}, "annotations": {}},
        "spec": {
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.4.0",
                            "ports": [{"containerPort": 8000, "protocol": "TCP"}],
                            "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}],
            "initContainers": [],
            "affinity": {},
            "priority": 0,
        },
    }


BASES = [minimal_pod, training_pod, inference_pod]

LABEL_KEYS = ["app", "gpuguard.io/workload-class", "app.kubernetes.io/name", "team", "a~b", "x/y~z",
              "~", "/", "~1", "-", "0", "", "ключ", "名前/😀"]
STRINGS = ["train", "inference", "", "0.25", "18Gi", "true", "名前", "ünïcødé", "😀 emoji", "\u05e9\u05dc\u05d5\u05dd",
           "e\u0301", "tab\tnew\nline", "quote\"back\\slash", "~0~1/"]
NUMBERS = [0, 1, -1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 0.0, -0.0, 0.1, 1.5, 1e-300, 1.7976931348623157e308,
           12345.678, 30.0]


def containers(pod):
    return pod.setdefault("spec", {}).setdefault("containers", [])


def pick_container(pod, rng):
    cs = containers(pod)
    if not cs:
        cs.append({"name": "c0", "image": "busybox"})
    return rng.choice(cs)


def meta_map(pod, name):
    return pod.setdefault("metadata", {}).setdefault(name, {})


def e_label_set(pod, rng):
    meta_map(pod, "labels")[rng.choice(LABEL_KEYS)] = rng.choice(STRINGS)


def e_label_remove(pod, rng):
    labels = meta_map(pod, "labels")
    if labels:
        del labels[rng.choice(sorted(labels))]
    elif rng.random() < 0.5:
        del pod["metadata"]["labels"]


def e_annotation_set(pod, rng):
    meta_map(pod, "annotations")[rng.choice(LABEL_KEYS + ["gpuguard.io/decision"])] = rng.choice(STRINGS)


def e_drop_map(pod, rng):
    pod.setdefault("metadata", {}).pop(rng.choice(["labels", "annotations"]), None)


def e_resources(pod, rng):
    c = pick_container(pod, rng)
    section = c.setdefault("resources", {}).setdefault(rng.choice(["limits", "requests"]), {})
    key = rng.choice(["nvidia.com/gpu", "cpu", "memory", "nvidia.com/mig-3g.40gb", "gpuguard.io/milli-gpu"])
    section[key] = rng.choice([1, 2, "500m", "18Gi", 1000, "1"])


def e_resources_drop(pod, rng):
    pick_container(pod, rng).pop("resources", None)


def e_container_append(pod, rng):
    for _ in range(rng.randint(1, 3)):
        containers(pod).append({"name": f"sidecar-{rng.randint(0, 999)}", "image": "envoyproxy/envoy:v1.29",
                                "env": [], "resources": {"limits": {"cpu": "100m"}}})


def e_container_remove(pod, rng):
    cs = containers(pod)
    if cs:
        cs.pop(rng.choice([0, -1]))


def e_container_reorder(pod, rng):
    cs = containers(pod)
    if rng.random() < 0.5:
        cs.reverse()
    else:
        rng.shuffle(cs)


def e_env(pod, rng):
    c = pick_container(pod, rng)
    env = c.setdefault("env", [])
    env.append({"name": rng.choice(["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "GPU_UUID"]),
                "value": rng.choice(STRINGS)})
    if rng.random() < 0.3:
        env.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})


def e_env_truncate(pod, rng):
    c = pick_container(pod, rng)
    if c.get("env"):
        del c["env"][rng.randint(0, len(c["env"]) - 1):]


def e_nested_parents(pod, rng):
    spec = pod.setdefault("spec", {})
    choice = rng.randint(0, 2)
    if choice == 0:
        terms = (spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
                 .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
                 .setdefault("nodeSelectorTerms", []))
        terms.append({"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                            "values": ["NVIDIA-H100-80GB-HBM3"]}]})
    elif choice == 1:
        spec.setdefault("securityContext", {}).setdefault("seccompProfile", {})["type"] = "RuntimeDefault"
    else:
        pick_container(pod, rng).setdefault("securityContext", {}).setdefault("capabilities", {})["drop"] = ["ALL"]


def e_node_selector(pod, rng):
    pod.setdefault("spec", {}).setdefault("nodeSelector", {})[rng.choice(LABEL_KEYS)] = rng.choice(STRINGS)


def e_tolerations(pod, rng):
    tol = pod.setdefault("spec", {}).setdefault("tolerations", [])
    if tol and rng.random() < 0.4:
        del tol[rng.randint(0, len(tol) - 1):]
    else:
        tol.append({"key": rng.choice(["nvidia.com/gpu", "gpuguard.io/pool"]), "operator": "Exists"})


def e_numbers(pod, rng):
    spec = pod.setdefault("spec", {})
    spec[rng.choice(["activeDeadlineSeconds", "priority", "x-gpuguard-number"])] = rng.choice(NUMBERS)


def e_int_real_swap(pod, rng):
    """1 becomes 1.0 (or back): the same number, a different document."""
    spec = pod.setdefault("spec", {})
    value = spec.get("terminationGracePeriodSeconds", 30)
    spec["terminationGracePeriodSeconds"] = float(value) if isinstance(value, int) else int(value)


def e_null(pod, rng):
    target = pod.setdefault("metadata", {})
    key = rng.choice(["creationTimestamp", "deletionTimestamp", "x"])
    if key in target and target[key] is None and rng.random() < 0.5:
        target[key] = "2026-01-01T00:00:00Z"
    elif key in target and target[key] is None:
        del target[key]
    else:
        target[key] = None


def e_empty(pod, rng):
    spec = pod.setdefault("spec", {})
    key = rng.choice(["volumes", "nodeSelector", "initContainers", "affinity", "tolerations"])
    current = spec.get(key)
    if isinstance(current, list) and rng.random() < 0.3:
        spec[key] = {}
    elif isinstance(current, dict) and rng.random() < 0.3:
        spec[key] = []
    else:
        spec[key] = [] if key in ("volumes", "initContainers", "tolerations") else {}


def e_bool(pod, rng):
    spec = pod.setdefault("spec", {})
    spec["hostNetwork"] = not spec.get("hostNetwork", False)


def e_image(pod, rng):
    pick_container(pod, rng)["image"] = rng.choice(["busybox:1.36", "nvcr.io/nvidia/cuda:12.3.1-base", "img@sha256:ab"])


def e_unicode(pod, rng):
    meta_map(pod, "annotations")[rng.choice(["gpuguard.io/note", "注釈", "ملاحظة"])] = "".join(
        rng.choice("aé名😀\u0301\u200b\U0010fffd \"\\/~") for _ in range(rng.randint(0, 12)))


def e_type_change(pod, rng):
    meta = pod.setdefault("metadata", {})
    meta["name"] = rng.choice([{"nested": "object"}, ["list"], 7, None, "back-to-string"])


def e_status(pod, rng):
    if "status" in pod:
        del pod["status"]
    else:
        pod["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]}


def e_remove_spec_key(pod, rng):
    spec = pod.setdefault("spec", {})
    if spec:
        del spec[rng.choice(sorted(spec))]


EDITS = [e_label_set, e_label_remove, e_annotation_set, e_drop_map, e_resources, e_resources_drop,
         e_container_append, e_container_remove, e_container_reorder, e_env, e_env_truncate, e_nested_parents,
         e_node_selector, e_tolerations, e_numbers, e_int_real_swap, e_null, e_empty, e_bool, e_image, e_unicode,
         e_type_change, e_status, e_remove_spec_key]


SEEDS = range(400)


def generated_pair(seed):
    """(original, edited, ensure_ascii, names of the edits made) for one seed."""
    rng = random.Random(seed)
    used = []

    def edit(doc):
        e = rng.choice(EDITS)
        used.append(e.__name__)
        e(doc, rng)

    original = rng.choice(BASES)()
    for _ in range(rng.randint(0, 2)):  # vary the originals too
        edit(original)
    edited = copy.deepcopy(original)
    for _ in range(rng.randint(1, 5)):
        edit(edited)
    return original, edited, rng.random() < 0.5, used


@pytest.mark.parametrize("seed", SEEDS)
def test_generated_pod_edits(tool, seed):
    original, edited, ensure_ascii, _ = generated_pair(seed)
    check_round_trip(tool, original, edited, ensure_ascii)
    assert tool.diff(original, original) == []


def test_generator_covers_every_edit():
    """Guards against a generator that silently stops reaching some edits."""
    used = set()
    for seed in SEEDS:
        used.update(generated_pair(seed)[3])
    assert used == {e.__name__ for e in EDITS}


NAMED_CASES = {
    "labels absent": ({"metadata": {}}, {"metadata": {"labels": {"a/b": "c"}}}),
    "escaped keys": ({"m": {"a~/b": 1, "~": 2}}, {"m": {"a~/b": 3, "/": 4}}),
    "deep missing parents": ({"spec": {}}, {"spec": {"a": {"b": {"c": [{"d": {}}]}}}}),
    "append": ({"a": [1]}, {"a": [1, {"x": []}, None]}),
    "truncate": ({"a": [1, 2, 3, 4, 5]}, {"a": [1]}),
    "reorder": ({"a": [{"n": 1}, {"n": 2}]}, {"a": [{"n": 2}, {"n": 1}]}),
    "prepend": ({"a": [1, 2]}, {"a": [0, 1, 2]}),
    "1 vs 1.0": ({"a": 1, "b": [2]}, {"a": 1.0, "b": [2.0]}),
    "-0.0 vs 0.0": ({"a": 0.0}, {"a": -0.0}),
    "bool vs int": ({"a": True, "b": 0}, {"a": 1, "b": False}),
    "large ints": ({"a": 2**63 - 1, "b": -(2**63)}, {"a": 2**63 - 2, "b": -(2**63) + 1}),
    "floats": ({"a": 0.1}, {"a": 0.30000000000000004, "b": 1e-300, "c": 1.7976931348623157e308}),
    "null": ({"a": None, "b": 1}, {"a": 1, "b": None}),
    "empties": ({"a": [], "b": {}, "c": [[]], "d": [{}]}, {"a": {}, "b": [], "c": [[], []], "d": [{"x": {}}]}),
    "unicode": ({"ü": "😀"}, {"ü": "😀!", "名前": {"ключ": "e\u0301"}}),
    "index-like keys": ({"m": {"0": 1}}, {"m": {"0": 2, "-": 3, "01": 4}}),
    "empty key": ({"": {"": 1}}, {"": {"": 2, " ": 3}}),
}


@pytest.mark.parametrize("name", sorted(NAMED_CASES))
def test_named_cases(tool, name):
    original, edited = NAMED_CASES[name]
    for ensure_ascii in (False, True):
        check_round_trip(tool, original, edited, ensure_ascii)


def test_root_must_be_object(tool):
    with pytest.raises(ToolError, match="objects"):
        tool.diff({"a": 1}, [1])
    assert tool.diff([1, {"a": None}], [1, {"a": None}]) == []
    assert tool.diff(None, None) == []


# ---- the manifest corpus ------------------------------------------------------------


def corpus_files():
    if not CORPUS.is_dir():
        return []
    return sorted(p for p in CORPUS.rglob("*") if p.is_file() and p.suffix in (".yaml", ".yml", ".json"))


def corpus_docs(path):
    yaml = pytest.importorskip("yaml", reason="python3-yaml is not installed")
    with open(path, encoding="utf-8") as f:
        docs = list(yaml.safe_load_all(f))
    # Through JSON, as the API server would send them (timestamps become strings).
    return [json.loads(json.dumps(d, default=str)) for d in docs]


def policy_edit(doc):
    """What a typical mutating policy does to an object and its pod template."""
    edited = copy.deepcopy(doc)
    meta = edited.setdefault("metadata", {})
    meta.setdefault("annotations", {})["gpuguard.io/decision"] = "pool=a100 mode=exclusive"
    meta.setdefault("labels", {})["gpuguard.io/workload-class"] = "training"
    spec = edited.get("spec")
    pod_spec = None
    if isinstance(spec, dict):
        template = spec.get("template")
        pod_spec = template.get("spec") if isinstance(template, dict) else spec
    if isinstance(pod_spec, dict) and isinstance(pod_spec.get("containers"), list) and pod_spec["containers"]:
        first = pod_spec["containers"][0]
        first.setdefault("resources", {}).setdefault("limits", {})["nvidia.com/gpu"] = 1
        first.setdefault("env", []).append({"name": "GPUGUARD", "value": "1"})
        pod_spec.setdefault("tolerations", []).append(
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    return edited


CORPUS_FILES = corpus_files()


@pytest.mark.skipif(not CORPUS_FILES, reason=f"no manifest corpus at {CORPUS}")
@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: str(p.relative_to(CORPUS)) if CORPUS_FILES else "")
def test_corpus(tool, path):
    docs = corpus_docs(path)
    assert docs, f"{path}: no documents"
    for doc in docs:
        assert tool.diff(doc, doc) == [], f"{path}: diff(doc, doc) is not []"
        if isinstance(doc, dict):
            check_round_trip(tool, doc, policy_edit(doc))


# ---- the json-patch-tests suites through jp_tool apply ----------------------------------


def suite_cases():
    cases = []
    for name in ("tests.json", "spec_tests.json"):
        path = SUITES / name
        if not path.exists():
            continue
        for i, rec in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            if "patch" in rec and not rec.get("disabled"):
                cases.append(pytest.param(rec, id=f"{name}#{i}"))
    return cases


SUITE_CASES = suite_cases()


@pytest.mark.skipif(not SUITE_CASES, reason=f"no json-patch-tests data under {SUITES}")
@pytest.mark.parametrize("rec", SUITE_CASES)
def test_suite_through_tool(tool, rec):
    if "error" in rec:
        with pytest.raises(ToolError, match="patch"):
            tool.apply(rec["doc"], rec["patch"])
    else:
        result = tool.apply(rec["doc"], rec["patch"])
        if "expected" in rec:
            assert result == rec["expected"]
