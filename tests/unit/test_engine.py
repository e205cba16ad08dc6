"""The policy engine through engine_tool (the core library, no HTTP): the
Lua contract, JSON round trips, patches, modes, failures and the sandbox."""

import copy
import json
import os
import re
import subprocess
from pathlib import Path

import jsonpatch
import pytest

REPO = Path(__file__).resolve().parent.parent.parent
CORPUS = REPO.parent / "shared" / "corpus"


def tool():
    tools = os.environ.get("GPUGUARD_TOOLS")
    if not tools:
        pytest.skip("GPUGUARD_TOOLS is not set: run through 'make test'")
    return str(Path(tools) / "engine_tool")


def review(obj, operation="CREATE", namespace="default", **request):
    kind = (obj or {}).get("kind", "Pod")
    req = {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": kind},
           "namespace": namespace, "operation": operation, "object": obj,
           "oldObject": None, "dryRun": False, "options": None,
           "userInfo": {"username": "alice", "groups": ["dev"]}}
    req.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def pod(name="p", labels=None, annotations=None, containers=None):
    meta = {"name": name, "namespace": "default"}
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": containers or [{"name": "c", "image": "busybox"}]}}


class Engine:
    """A policy directory under tmp_path and a way to evaluate reviews with it."""

    def __init__(self, tmp_path):
        self.dir = tmp_path / "policies"
        self.dir.mkdir()
        self.lua = tmp_path / "lua"
        self.lua.mkdir()
        self.config = None
        self.tmp = tmp_path

    def policy(self, filename, text):
        (self.dir / filename).write_text(text)
        return self

    def module(self, name, text):
        (self.lua / f"{name}.lua").write_text(text)
        return self

    def configure(self, text):
        self.config = self.tmp / "gpuguard.yaml"
        self.config.write_text(text)
        return self

    def run(self, rev, phases="both", repeat=1, expect_rc=0):
        path = self.tmp / "review.json"
        path.write_text(json.dumps(rev))
        # The policy directory as a user in tmp_path names it: Lua's messages name files so.
        cmd = [tool(), "--policies", self.dir.name, "--lua", str(self.lua),
               "--phases", phases, "--repeat", str(repeat), str(path)]
        if self.config:
            cmd += ["--config", str(self.config)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=self.tmp)
        assert expect_rc is None or out.returncode == expect_rc, out.stderr
        self.stderr = out.stderr
        return json.loads(out.stdout) if out.returncode == 0 else out.stderr


@pytest.fixture
def engine(tmp_path):
    return Engine(tmp_path)


NOOP = """return { name = "noop", mutate = function(req, obj) local _ = obj end }"""

ADD_LABEL = """
local gg = require "gpuguard"
return {
  name = "add-label",
  match = { kinds = { "Pod" }, operations = { "CREATE" } },
  mutate = function(req, pod)
    local meta = pod.metadata
    if meta.labels == nil then meta.labels = gg.object() end
    meta.labels["gpuguard.io/checked"] = "yes"
  end,
}
"""


def apply(obj, patch):
    return jsonpatch.apply_patch(obj, patch)


# ---- round trips -----------------------------------------------------------

TRICKY = {
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tricky", "labels": {},
                                                    "annotations": {"a/b~c": "\u00e9\u4e2d\U0001f600"}},
    "spec": {"containers": [], "volumes": [{}], "nodeSelector": {},
             "x": {"int": 1, "float": 1.0, "neg": -0.5, "big": 9223372036854775807,
                   "small": -9223372036854775808, "exp": 1e300, "tiny": 5e-324,
                   "null": None, "t": True, "f": False, "empty_str": "",
                   "nested": [[[]], [{}], [None], [1, 2.5, "s"]],
                   "esc": "quote\" backslash\\ nl\n tab\t nul-free \u0001"}},
}


def deep(levels):
    v = {}
    for _ in range(levels):
        v = {"d": v}
    return v


def test_untouched_tricky_object_yields_no_patch(engine):
    engine.policy("10-noop.lua", NOOP)
    v = engine.run(review(TRICKY))
    assert v["allowed"] is True
    assert v["patch"] == []
    assert v["mutated"] == TRICKY


def test_reading_every_field_changes_nothing(engine):
    engine.policy("10-walk.lua", """
local function walk(v, n)
  if type(v) == "table" then for k, x in pairs(v) do n = walk(x, n + 1) end end
  return n
end
return { name = "walk", mutate = function(req, obj) walk(obj, 0) end }
""")
    v = engine.run(review(TRICKY))
    assert v["patch"] == []


def corpus_objects():
    yaml = pytest.importorskip("yaml")
    if not CORPUS.is_dir():
        return []
    objs = []
    for path in sorted(CORPUS.rglob("*")):
        if path.suffix in (".yaml", ".yml", ".json"):
            for doc in yaml.safe_load_all(path.read_text()):
                if isinstance(doc, dict):
                    objs.append((path.name, doc))
    return objs


def test_untouched_corpus_manifests_yield_no_patch(engine):
    objs = corpus_objects()
    if not objs:
        pytest.skip("../shared/corpus is not present")
    engine.policy("10-noop.lua", NOOP)
    for name, obj in objs:
        v = engine.run(review(obj))
        assert v["patch"] == [], name


def test_nesting_at_the_cap_converts_and_beyond_fails_cleanly(engine):
    engine.policy("10-noop.lua", NOOP)
    ok = pod()
    ok["spec"]["deep"] = deep(95)
    assert engine.run(review(ok))["patch"] == []
    bad = pod()
    bad["spec"]["deep"] = deep(150)
    v = engine.run(review(bad))
    assert v["allowed"] is False
    assert v["message"] == "gpuguard: the object nests deeper than 100 levels"


def test_nesting_limit_is_exact_at_one_hundred_levels(engine):
    # A value 100 levels below the object is fine, 101 is not, whatever the
    # decoder's own depth bookkeeping lets the engine skip.
    engine.policy("10-noop.lua", NOOP)
    for levels, allowed in ((100, True), (101, False)):
        obj = pod()
        inner = 1
        for _ in range(levels - 1):
            inner = {"a": inner}
        obj["spec"] = inner  # spec is one level below the object
        v = engine.run(review(obj))
        assert v["allowed"] is allowed, levels
        if not allowed:
            assert v["message"] == "gpuguard: the object nests deeper than 100 levels"


# ---- mutation and patches ---------------------------------------------------

def test_mutation_patch_is_exact_and_applies(engine):
    engine.policy("10-add-label.lua", ADD_LABEL)
    obj = pod()
    v = engine.run(review(obj), phases="mutate")
    assert v["patch"] == [{"op": "add", "path": "/metadata/labels",
                           "value": {"gpuguard.io/checked": "yes"}}]
    assert apply(obj, v["patch"]) == v["mutated"]
    obj2 = pod(labels={"app": "x"})
    v2 = engine.run(review(obj2), phases="mutate")
    assert v2["patch"] == [{"op": "add", "path": "/metadata/labels/gpuguard.io~1checked",
                            "value": "yes"}]
    assert apply(obj2, v2["patch"]) == v2["mutated"]


def test_mutation_is_idempotent(engine):
    engine.policy("10-add-label.lua", ADD_LABEL)
    obj = pod()
    v = engine.run(review(obj), phases="mutate")
    again = engine.run(review(apply(obj, v["patch"])), phases="mutate")
    assert again["patch"] == []


# ---- the patch of random edits is jp_diff's --------------------------------

def lua_string(s):
    """A Lua literal for s, bytes other than letters and digits as decimal escapes."""
    return '"' + "".join(chr(b) if chr(b).isalnum() else "\\%03d" % b
                         for b in s.encode()) + '"'


def lua_value(v):
    if v is None:
        return "gg.null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int) and v == -2**63:
        return "math.mininteger"  # the literal would read as a float
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return lua_string(v)
    if isinstance(v, list):
        return "{" + ", ".join(map(lua_value, v)) + "}" if v else "gg.array()"
    return ("{" + ", ".join(f"[{lua_string(k)}] = {lua_value(x)}" for k, x in v.items()) + "}"
            if v else "gg.object()")


def containers_in(v, path=()):
    if isinstance(v, (dict, list)):
        yield path, v
        for k, x in (v.items() if isinstance(v, dict) else enumerate(v)):
            yield from containers_in(x, path + (k,))


def random_edits(rng, doc, count):
    """Edits made to doc (in place) and the Lua that makes them, one at a time, so each
    edit sees the document as the previous ones left it.  Only the last may alias."""
    fresh = [7, 2.5, 1.0, -0.0, 0, True, False, "x", "", "a/b~c", None,
             {"k": "v", "n": [1, {"z": 0}]}, [1, "two"], {"t": {}}]
    lua = []
    for n in range(count):
        path, t = rng.choice(list(containers_in(doc)))
        at = "obj" + "".join(f"[{k + 1}]" if isinstance(k, int) else f"[{lua_string(k)}]"
                             for k in path)
        value = copy.deepcopy(rng.choice(fresh))
        if isinstance(t, dict):
            keys = list(t)
            key = rng.choice(keys) if keys and rng.random() < 0.7 else f"new/{n}~"
            action = rng.choice(["set", "delete", "touch", "same", "move"] if key in t
                                else ["set"])
            if action == "move" and n == count - 1 and len(keys) > 1:
                src = rng.choice([k for k in keys if k != key])
                t[key] = copy.deepcopy(t[src])
                lua.append(f"{at}[{lua_string(key)}] = {at}[{lua_string(src)}]")
            elif action == "delete":
                del t[key]
                lua.append(f"{at}[{lua_string(key)}] = nil")
            elif action == "touch":
                lua.append(f"do local _ = {at}[{lua_string(key)}] end")
            elif action == "same":  # a new table, or a scalar, equal to what is there
                lua.append(f"{at}[{lua_string(key)}] = {lua_value(t[key])}")
            else:
                t[key] = value
                lua.append(f"{at}[{lua_string(key)}] = {lua_value(value)}")
        else:
            action = rng.choice(["append", "pop", "set", "touch"] if t else ["append"])
            if action == "append":
                t.append(value)
                lua.append(f"{at}[#{at} + 1] = {lua_value(value)}")
            elif action == "pop":
                t.pop()
                lua.append(f"{at}[#{at}] = nil")
            else:
                i = rng.randrange(len(t))
                if action == "set":
                    t[i] = value
                    lua.append(f"{at}[{i + 1}] = {lua_value(value)}")
                else:
                    lua.append(f"do local _ = {at}[{i + 1}] end")
    return lua


def assert_patch_is_jp_diff(engine, tmp_path, original, edited, lua):
    """The policy's edits (Lua lines) give jp_diff's patch from original to edited."""
    engine.policy("10-edit.lua", 'local gg = require "gpuguard"\n'
                  'return { name = "edit", mutate = function(req, obj)\n  '
                  + "\n  ".join(lua) + "\nend }\n")
    v = engine.run(review(original), phases="mutate")
    assert v["allowed"], (lua, v)
    (tmp_path / "a.json").write_text(json.dumps(original))
    (tmp_path / "b.json").write_text(json.dumps(edited))
    jp = str(Path(tool()).parent / "jp_tool")
    out = subprocess.run([jp, "diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    # As text: 1 and 1.0, 0.0 and -0.0 are different values here, equal to Python.
    assert json.dumps(v["patch"], sort_keys=True) == \
        json.dumps(json.loads(out.stdout), sort_keys=True), lua
    assert apply(original, v["patch"]) == edited, lua
    return v["patch"]


def test_the_patch_of_random_edits_is_jp_diff_of_the_documents(engine, tmp_path):
    """The engine compares the Lua object with the original where it stands and converts
    only what differs; its patch must be the one jp_diff writes for the whole documents,
    op for op, and turn the original into the edited document."""
    import random
    rng = random.Random(20261127)
    docs = [TRICKY, pod(labels={"app": "x"}, containers=[
        {"name": "c", "image": "i", "env": [{"name": "A", "value": "1"}],
         "resources": {"limits": {"nvidia.com/gpu": "1"}}}])]
    for case in range(60):
        original = copy.deepcopy(docs[case % len(docs)])
        edited = copy.deepcopy(original)
        lua = random_edits(rng, edited, 1 + case % 6)
        assert_patch_is_jp_diff(engine, tmp_path, original, edited, lua)


def test_the_patch_of_an_edit_deep_in_nested_arrays_is_jp_diff(engine, tmp_path):
    """Ninety arrays in one another, each as long as before: the walk goes down all of
    them (one Lua stack slot a level) to the one element that changed."""
    nested = 1
    for _ in range(90):
        nested = [nested]
    original = pod()
    original["metadata"]["x"] = nested
    edited = copy.deepcopy(original)
    inner = edited["metadata"]["x"]
    for _ in range(89):
        inner = inner[0]
    inner[0] = 2
    patch = assert_patch_is_jp_diff(engine, tmp_path, original, edited,
                                    ["obj.metadata.x" + "[1]" * 90 + " = 2"])
    assert patch == [{"op": "replace", "path": "/metadata/x" + "/0" * 90, "value": 2}]


def test_a_moved_table_that_differs_only_in_the_sign_of_zero_is_patched(engine, tmp_path):
    """0.0 and -0.0 are different JSON: a table moved over another is compared as jp_diff
    compares, not as jansson's json_equal does."""
    original = pod()
    original["metadata"]["a"] = {"x": 0.0}
    original["metadata"]["b"] = {"x": -0.0}
    edited = copy.deepcopy(original)
    edited["metadata"]["a"] = {"x": -0.0}
    patch = assert_patch_is_jp_diff(engine, tmp_path, original, edited,
                                    ["obj.metadata.a = obj.metadata.b"])
    assert json.dumps(patch) == '[{"op": "replace", "path": "/metadata/a/x", "value": -0.0}]'


def test_a_key_with_a_nul_byte_is_not_taken_for_the_key_before_it(engine):
    """An element of a list that grew is compared with the original by key and length:
    {"k\\0x": 1} is not {"k": 1}, and a NUL byte in a key is refused, as jp_diff refuses it."""
    obj = pod()
    obj["metadata"]["list"] = [{"k": 1}, 2]
    engine.policy("10-edit.lua", "return { name = 'edit', mutate = function(req, obj)\n"
                  "  local e = obj.metadata.list[1]; e.k = nil; e['k\\0x'] = 1\n"
                  "  obj.metadata.list[3] = 5\nend }")
    v = engine.run(review(obj), phases="mutate")
    assert not v["allowed"]
    assert v["message"] == ("the edited object cannot be JSON: an object key contains a NUL byte"
                            " at /metadata/list/0/k")
    assert v["patch"] == []


def test_the_patch_of_many_edits_in_one_object_is_jp_diff(engine, tmp_path):
    """More differing members in one object than the walk keeps on its stack (16)."""
    labels = {f"l{i:02d}": str(i) for i in range(30)}
    original = pod(labels=labels)
    edited = copy.deepcopy(original)
    new = edited["metadata"]["labels"]
    lua = []
    for i in range(0, 30, 3):
        del new[f"l{i:02d}"]
        lua.append(f'obj.metadata.labels["l{i:02d}"] = nil')
    for i in range(1, 30, 3):
        new[f"l{i:02d}"] = "changed"
        lua.append(f'obj.metadata.labels["l{i:02d}"] = "changed"')
    for i in range(30, 50):
        new[f"l{i:02d}"] = "added"
        lua.append(f'obj.metadata.labels["l{i:02d}"] = "added"')
    patch = assert_patch_is_jp_diff(engine, tmp_path, original, edited, lua)
    assert len(patch) == 40


@pytest.mark.parametrize("edit,where", [
    (r'obj.metadata.labels = {x = "\255"}', "a string is not valid UTF-8 at /metadata/labels/x"),
    (r'obj.metadata.labels = {["\255"] = "v"}',
     r"an object key is not valid UTF-8 at /metadata/labels/\xff"),
    (r'obj.metadata["a\0b"] = "v"', "diff: an object key contains a NUL byte"),
    (r'obj.spec.containers[1]["\192\128"] = 1',
     r"an object key is not valid UTF-8 at /spec/containers/0/\xc0\x80"),
    (r'obj.metadata.labels = {["\226\130\172\n"] = "\255"}',
     "a string is not valid UTF-8 at /metadata/labels/\u20ac\\x0a"),
    (r'obj.metadata.labels = {[string.rep("\226\130\172", 60)] = "\255"}',
     "a string is not valid UTF-8 at /metadata/labels/" + "\u20ac" * 47),
])
def test_an_edit_that_is_not_json_is_refused_with_a_message_that_is(engine, edit, where):
    """Keys and strings must be UTF-8; the denial names where, with the bad bytes escaped
    and a long path cut between characters, so the message itself is valid JSON text."""
    engine.policy("10-edit.lua", f"return {{ name = 'edit', mutate = function(req, obj) {edit} end }}")
    v = engine.run(review(pod()), phases="mutate")
    assert not v["allowed"]
    assert v["message"] == "the edited object cannot be JSON: " + where
    assert v["patch"] == []


def test_later_policies_see_earlier_edits(engine):
    engine.policy("10-add-label.lua", ADD_LABEL)
    engine.policy("20-check.lua", """
return { name = "check", mutate = function(req, pod)
  pod.metadata.annotations = require("gpuguard").object({seen = pod.metadata.labels["gpuguard.io/checked"]})
end }
""")
    v = engine.run(review(pod()), phases="mutate")
    assert v["mutated"]["metadata"]["annotations"] == {"seen": "yes"}


# ---- lazy conversion: tables a policy has not touched yet ---------------------

def test_untouched_tables_behave_like_tables(engine):
    # Each of these reaches a table no policy has read: it must see the JSON.
    engine.policy("10-probe.lua", """
local gg = require "gpuguard"
return { name = "probe", mutate = function(req, pod)
  local x, out = pod.spec.x, {}
  out[#out + 1] = "next:" .. tostring(next(x.nested[2]) ~= nil)
  out[#out + 1] = "rawget:" .. tostring(rawget(x, "int"))
  out[#out + 1] = "rawlen:" .. rawlen(x.nested)
  out[#out + 1] = "len:" .. #x.nested[4]
  local keys = {}
  for k in pairs(pod.metadata.annotations) do keys[#keys + 1] = k end
  out[#out + 1] = "pairs:" .. table.concat(keys, ",")
  local n = 0
  for _, v in ipairs(x.nested[4]) do n = n + 1 end
  out[#out + 1] = "ipairs:" .. n
  out[#out + 1] = "concat:" .. table.concat(x.nested[4], "|", 1, 2)
  out[#out + 1] = "unpack:" .. select("#", table.unpack(x.nested[4]))
  out[#out + 1] = "shape:" .. tostring(gg.is_array(pod.spec.volumes)) .. tostring(gg.is_object(pod.spec.nodeSelector))
  out[#out + 1] = "mt:" .. getmetatable(pod.spec.volumes) .. "," .. getmetatable(pod.metadata.labels)
  out[#out + 1] = "protected:" .. tostring(pcall(setmetatable, pod.spec.containers, {}))
  pod.metadata.annotations.probe = table.concat(out, " ")
end }
""")
    v = engine.run(review(TRICKY), phases="mutate")
    assert v["patch"] == [{"op": "add", "path": "/metadata/annotations/probe", "value": (
        "next:true rawget:1 rawlen:4 len:3 pairs:a/b~c ipairs:3 concat:1|2.5 unpack:3 "
        "shape:truetrue mt:array,object protected:false")}]


def test_untouched_tables_moved_copied_and_deleted(engine):
    engine.policy("10-move.lua", """
local gg = require "gpuguard"
return { name = "move", mutate = function(req, pod)
  local spec = pod.spec
  spec.copy = spec.x.nested          -- an untouched array, now in two places
  spec.volumes, spec.nodeSelector = spec.nodeSelector, spec.volumes
  spec.containers = nil              -- deleted without being read
  table.insert(spec.x.nested[4], "t")  -- appended to through a stub
  pod.metadata.annotations = gg.object({ kept = pod.metadata.annotations })
end }
""")
    obj = copy.deepcopy(TRICKY)
    v = engine.run(review(obj), phases="mutate")
    want = copy.deepcopy(TRICKY)
    spec = want["spec"]
    spec["x"]["nested"][3].append("t")
    spec["copy"] = copy.deepcopy(spec["x"]["nested"])
    spec["volumes"], spec["nodeSelector"] = spec["nodeSelector"], spec["volumes"]
    del spec["containers"]
    want["metadata"]["annotations"] = {"kept": TRICKY["metadata"]["annotations"]}
    assert v["mutated"] == want
    assert apply(obj, v["patch"]) == want


def test_untouched_table_kept_past_its_request_is_empty(engine):
    # A stub a policy keeps in an upvalue must not reach a finished request's JSON.
    engine.policy("10-keep.lua", """
local kept
return { name = "keep", mutate = function(req, pod)
  if kept then
    pod.metadata.annotations.kept = tostring(next(kept)) .. "/" .. #kept
  end
  kept = pod.spec.containers
end }
""")
    obj = pod(annotations={})
    v = engine.run(review(obj), phases="mutate", repeat=3)
    assert v["patch"] == [{"op": "add", "path": "/metadata/annotations/kept", "value": "nil/0"}]


def test_thousands_of_untouched_tables_fill_from_their_own_json(engine):
    # 2,000 containers make some 14,000 stubs: the request's stub map grows many times over and
    # is freed at the end (it is kept only up to 1,024 slots). Each container must fill from its
    # own JSON, in both requests; a stub kept from the big request fills as empty in the next.
    engine.policy("10-walk.lua", """
local gg = require "gpuguard"
local kept
return { name = "walk", mutate = function(req, pod)
  local sum, names = 0, {}
  for i, c in ipairs(pod.spec.containers) do
    sum = sum + c.resources.limits.cpu * i
    if c.env[1].value ~= "v" .. i then error("container " .. i .. " reads " .. c.env[1].value) end
    names[#names + 1] = c.name
  end
  pod.metadata.annotations.sum = tostring(sum)
  pod.metadata.annotations.last = names[#names]
  pod.metadata.annotations.kept = kept and (tostring(next(kept)) .. "/" .. #kept) or "none"
  kept = pod.spec.containers[1].ports
end }
""")
    n = 2000
    containers = [{"name": f"c{i}", "image": "busybox", "ports": [{"containerPort": i}],
                   "env": [{"name": "K", "value": f"v{i}"}],
                   "resources": {"limits": {"cpu": i % 7}}} for i in range(1, n + 1)]
    obj = pod(annotations={}, containers=containers)
    want = sum((i % 7) * i for i in range(1, n + 1))
    first = engine.run(review(obj), phases="mutate")
    assert first["patch"] == [
        {"op": "add", "path": "/metadata/annotations/kept", "value": "none"},
        {"op": "add", "path": "/metadata/annotations/last", "value": f"c{n}"},
        {"op": "add", "path": "/metadata/annotations/sum", "value": str(want)}]
    again = engine.run(review(obj), phases="mutate", repeat=2)
    assert again["patch"] == [
        {"op": "add", "path": "/metadata/annotations/kept", "value": "nil/0"},
        {"op": "add", "path": "/metadata/annotations/last", "value": f"c{n}"},
        {"op": "add", "path": "/metadata/annotations/sum", "value": str(want)}]


def test_new_tables_must_be_unambiguous(engine):
    engine.policy("10-bad.lua", """
return { name = "bad", mutate = function(req, pod) pod.spec.tolerations = {} end }
""")
    v = engine.run(review(pod()), phases="mutate")
    assert v["allowed"] is False
    assert v["message"] == ("the edited object cannot be JSON: an empty table is ambiguous: use "
                            "gpuguard.array() or gpuguard.object() at /spec/tolerations")


def test_plain_tables_infer_arrays_and_objects(engine):
    engine.policy("10-infer.lua", """
return { name = "infer", mutate = function(req, pod)
  pod.spec.tolerations = { { key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" } }
end }
""")
    obj = pod()
    v = engine.run(review(obj), phases="mutate")
    assert v["patch"] == [{"op": "add", "path": "/spec/tolerations", "value": [
        {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]}]


# ---- verdicts, modes, failures ---------------------------------------------

DENY_GPU = """
return {
  name = "no-gpu",
  mode = "%s",
  validate = function(req, pod)
    req:deny("pod asks for a GPU; remove nvidia.com/gpu")
    req:warn("a warning")
    req:audit("reason", "asked for a GPU")
  end,
}
"""


@pytest.mark.parametrize("mode", ["enforce", "warn", "audit"])
def test_modes(engine, mode):
    engine.policy("10-deny.lua", DENY_GPU % mode)
    v = engine.run(review(pod()), phases="validate")
    msg = "no-gpu: pod asks for a GPU; remove nvidia.com/gpu"
    if mode == "enforce":
        assert v["allowed"] is False and v["message"] == msg
        assert v["warnings"] == ["no-gpu: a warning"]
    elif mode == "warn":
        assert v["allowed"] is True and "message" not in v
        assert v["warnings"] == ["no-gpu: pod asks for a GPU; remove nvidia.com/gpu",
                                 "no-gpu: a warning"]
    else:
        assert v["allowed"] is True
        assert v["audit"] == {"no-gpu.reason": "asked for a GPU",
                              "no-gpu.would-deny": "pod asks for a GPU; remove nvidia.com/gpu",
                              "policies": "no-gpu (audit)", "verdict": "allowed"}
    assert v["fired"] == ["no-gpu"]


def test_config_overrides_modes_globally_and_per_namespace(engine):
    engine.policy("10-deny.lua", DENY_GPU % "enforce")
    engine.configure("""
enforcement:
  mode: warn
  namespaces:
    sandbox: audit
  policies:
    no-gpu:
      namespaces:
        prod: enforce
""")
    assert engine.run(review(pod()), phases="validate")["allowed"] is True
    assert "no-gpu: pod asks" in engine.run(review(pod()), phases="validate")["warnings"][0]
    v = engine.run(review(pod(), namespace="sandbox"), phases="validate")
    assert v["allowed"] is True and "no-gpu.would-deny" in v["audit"]
    assert engine.run(review(pod(), namespace="prod"), phases="validate")["allowed"] is False


def test_match_filters_kinds_operations_namespaces_labels(engine):
    engine.policy("10-deny.lua", """
return { name = "picky",
  match = { kinds = { "Pod" }, operations = { "CREATE" },
            namespaces = { include = { "team-*" }, exclude = { "team-x" } },
            labels = { matchLabels = { gpu = "yes" },
                       matchExpressions = { { key = "tier", operator = "NotIn", values = { "free" } } } } },
  validate = function(req) req:deny("matched") end }
""")
    hit = review(pod(labels={"gpu": "yes"}), namespace="team-a")
    assert engine.run(hit)["allowed"] is False
    for miss in (review(pod(labels={"gpu": "yes"}), namespace="default"),
                 review(pod(labels={"gpu": "yes"}), namespace="team-x"),
                 review(pod(labels={"gpu": "no"}), namespace="team-a"),
                 review(pod(labels={"gpu": "yes", "tier": "free"}), namespace="team-a"),
                 review(pod(labels={"gpu": "yes"}), namespace="team-a", operation="UPDATE",
                        oldObject=pod())):
        assert engine.run(miss)["allowed"] is True


def test_request_fields_reach_lua(engine):
    engine.policy("10-req.lua", """
return { name = "req", validate = function(req, obj)
  req:warn(table.concat({ req.uid, req.operation, req.namespace, req.kind,
    tostring(req.dry_run), req.user.username, req.sub_resource, tostring(req.old_object) }, ","))
end }
""")
    v = engine.run(review(pod(), dryRun=True, subResource="status"), phases="validate")
    assert v["warnings"] == ["req: u-1,CREATE,default,Pod,true,alice,status,nil"]


def test_request_user_options_and_old_object_are_read_only_and_listed(engine):
    engine.policy("10-req.lua", """
return { name = "req", validate = function(req, obj)
  local keys = {}
  for k in pairs(req) do keys[#keys + 1] = k end
  table.sort(keys)
  local ok, err = pcall(function() req.user.groups[1] = "admin" end)
  req:warn(table.concat(keys, ","))
  req:warn(req.user.groups[1] .. "," .. req.options.fieldManager .. "," ..
           req.old_object.metadata.name .. "," .. tostring(ok) .. "," .. err:match("attempt to modify a read%-only table"))
end }
""")
    old = pod(name="before")
    v = engine.run(review(pod(), operation="UPDATE", oldObject=old,
                          options={"fieldManager": "kubectl"}), phases="validate")
    assert v["warnings"] == [
        "req: audit,background,deny,dry_run,group,kind,name,namespace,old_object,operation,options,"
        "sub_resource,uid,user,warn",
        "req: dev,kubectl,before,false,attempt to modify a read-only table"]


def test_delete_with_null_object_runs(engine):
    engine.policy("10-del.lua", """
return { name = "del", validate = function(req, obj)
  if obj == nil then req:warn("deleting " .. req.old_object.metadata.name) end
end }
""")
    v = engine.run(review(None, operation="DELETE", oldObject=pod(name="gone"),
                          kind={"group": "", "version": "v1", "kind": "Pod"}))
    assert v["warnings"] == ["del: deleting gone"]


def test_policy_error_denies_by_default_and_allow_is_per_policy(engine):
    engine.policy("10-boom.lua", """
return { name = "boom", validate = function() error("kaboom") end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["allowed"] is False
    assert v["message"] == "boom: policy error: policies/10-boom.lua:2: kaboom"
    assert "stack traceback" in engine.stderr and "10-boom.lua:2" in engine.stderr
    engine.configure("enforcement:\n  policies:\n    boom:\n      failure: allow\n")
    v = engine.run(review(pod()), phases="validate")
    assert v["allowed"] is True
    assert v["warnings"] == ["boom: policy error: policies/10-boom.lua:2: kaboom (ignored: "
                             "failure allow)"]


def test_a_stopped_vm_still_gives_every_later_policy_its_failure_verdict(engine):
    """A policy that may fail open and stops the VM must not skip the policies
    after it: each fails in turn with its own failure verdict."""
    engine.policy("10-spin.lua", """
return { name = "spin", failure = "allow", validate = function() while true do end end }
""")
    engine.policy("20-deny.lua", """
return { name = "deny", validate = function(req) req:deny("no") end }
""")
    engine.configure("engine:\n  instructions: 100000\n")
    v = engine.run(review(pod()), phases="validate")
    assert v["allowed"] is False
    assert v["message"] == ("deny: policy error: the Lua VM was stopped earlier in this "
                            "request")
    assert v["warnings"] == ["spin: policy stopped: instruction budget exhausted (ignored: "
                             "failure allow)"]
    v = engine.run(review(pod()), phases="both")
    assert v["allowed"] is False


def test_a_denial_caught_by_pcall_still_counts(engine):
    engine.policy("10-deny.lua", """
return { name = "deny", validate = function(req)
  local ok = pcall(req.deny, req, "first")
  assert(ok)
  pcall(req.deny, req, nil)  -- a failed denial fails the call even when caught
end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["allowed"] is False
    assert v["message"] == ("deny: first\ndeny: policy error: a req:deny call failed and the "
                            "policy went on")


FROZEN_EDIT = "the object is read-only in validate (edit it in mutate)"


@pytest.mark.parametrize("edit, where", [
    ("pod.metadata.labels = { x = 'y' }", "policies/10-edit.lua:2: "),
    ("pod.spec.containers[1].image = 'evil'", "policies/10-edit.lua:2: "),
    ("pod.spec.containers[2] = { name = 'extra' }", "policies/10-edit.lua:2: "),
    ("table.insert(pod.spec.containers, { name = 'extra' })", ""),
    ("table.remove(pod.spec.containers)", ""),
    ("pod.spec.containers[1].resources = nil", "policies/10-edit.lua:2: "),
    ("for k, v in pairs(pod.spec) do v[1].x = 1 end", "policies/10-edit.lua:2: "),
    ("local k, v = next(pod.spec); v[1].image = 'evil'", "policies/10-edit.lua:2: "),
    ("rawget(pod.spec, 'containers')[1].image = 'evil'", "policies/10-edit.lua:2: "),
    ("require('gpuguard').object(pod.spec).containers[1].image = 'evil'",
     "policies/10-edit.lua:2: "),
])
def test_validate_sees_the_object_read_only(engine, edit, where):
    engine.policy("10-edit.lua", """
return { name = "edit", validate = function(req, pod) %s end }
""" % edit)
    engine.policy("20-look.lua", """
local gg = require "gpuguard"
return { name = "look", validate = function(req, pod)
  local c = pod.spec.containers
  local keys = {}
  for k in pairs(pod.metadata) do keys[#keys + 1] = k end
  table.sort(keys)
  req:warn(string.format("%s %d %s %s %s %s %s %s", tostring(pod.metadata.labels), #c,
    c[1].image, tostring(c[1].resources ~= nil), table.concat(keys, ","),
    tostring(gg.is_array(c) and gg.is_object(c[1])), rawlen(c), next(c[1]) and "next" or "none"))
end }
""")
    obj = pod(containers=[{"name": "c", "image": "busybox", "resources": {}}])
    for phases in ("validate", "both"):
        v = engine.run(review(obj), phases=phases)
        assert v["allowed"] is False
        assert v["message"] == "edit: policy error: " + where + FROZEN_EDIT
        assert v["warnings"] == ["look: nil 1 busybox true name,namespace true 1 next"]


# A frozen proxy reads differently once its table is filled (by its first
# read, or by mutate before validate): the same refusals either way.
@pytest.mark.parametrize("touch", ["", "for _, c in ipairs(pod.spec.containers) do "
                                       "local _ = c.resources and c.resources.limits end"])
def test_frozen_tables_stay_read_only_after_reads(engine, touch):
    engine.policy("05-touch.lua", """
return { name = "touch", mutate = function(req, pod) %s end }
""" % touch)
    engine.policy("10-edit.lua", """
local gg = require "gpuguard"
return { name = "edit", validate = function(req, pod)
  local c = pod.spec.containers
  local first = c[1]
  assert(c[1] == first and rawget(c, 1) == first and pod.spec.containers == c)
  assert(first.resources == first.resources and next(c) == 1 and select(2, next(c)) == first)
  local out = {}
  for _, try in ipairs({
    function() first.image = "evil" end,
    function() first.name = nil end,
    function() c[3] = {} end,
    function() table.insert(c, {}) end,
    function() table.remove(c) end,
    function() table.sort(c, function(a, b) return a.name > b.name end) end,
    function() table.move(c, 1, 1, 2) end,
    function() setmetatable(first, nil) end,
    function() first.resources.limits.cpu = "64" end,
  }) do
    local ok, err = pcall(try)
    err = not ok and tostring(err):gsub("^[^:]*:%d+: ", "")
    out[#out + 1] = ok and "ok" or err == "FROZEN_EDIT" and "frozen" or err
  end
  req:warn(table.concat(out, "|"))
  local keys = {}
  for k in pairs(first) do keys[#keys + 1] = k end
  table.sort(keys)
  req:warn(string.format("%s %s %s %d %d %s %s %s %s", c[1].image, c[2].name,
    first.resources.limits.cpu, #c, rawlen(c), getmetatable(first), table.concat(keys, ","),
    tostring(gg.is_array(c) and gg.is_object(first)), tostring(first.missing)))
end }
""".replace("FROZEN_EDIT", FROZEN_EDIT))
    obj = pod(containers=[{"name": "a", "image": "busybox", "resources": {"limits": {"cpu": "1"}}},
                          {"name": "b", "image": "nginx"}])
    v = engine.run(review(obj), phases="both", repeat=2)
    assert v["warnings"] == [
        "edit: " + "|".join(["frozen"] * 7 + ["cannot change a protected metatable", "frozen"]),
        "edit: busybox b 1 2 2 read-only image,name,resources true nil"]
    assert v["allowed"] is True


def test_frozen_table_kept_past_its_request_stays_read_only(engine):
    engine.policy("10-keep.lua", """
local kept
return { name = "keep", validate = function(req, pod)
  if kept then
    local ok, err = pcall(function() kept.spec.containers[1].image = "evil" end)
    req:warn(string.format("%s %s %d %s", kept.metadata.name, kept.spec.containers[1].image,
      #kept.spec.containers, tostring(err):gsub("^[^:]*:%d+: ", "")))
    local n = 0
    for _ in pairs(kept.spec) do n = n + 1 end
    req:warn("pairs " .. n .. " " .. tostring(kept.metadata.labels))
  end
  local _ = pod.metadata.name, pod.spec.containers[1].image
  kept = pod
end }
""")
    v = engine.run(review(pod()), phases="validate", repeat=3)
    assert v["allowed"] is True
    assert v["warnings"] == ["keep: p busybox 1 " + FROZEN_EDIT, "keep: pairs 1 nil"]


def test_validate_after_mutate_sees_the_edits_read_only(engine):
    engine.policy("10-add-label.lua", ADD_LABEL)
    engine.policy("20-look.lua", """
local gg = require "gpuguard"
return { name = "look", validate = function(req, pod)
  local copy = gg.object(pod.metadata.labels)
  copy.mine = "yes"
  req:warn(pod.metadata.labels["gpuguard.io/checked"] .. " " .. tostring(pod.metadata.labels.mine))
  pod.metadata.labels.mine = "no"
end }
""")
    v = engine.run(review(pod()), phases="both")
    assert v["allowed"] is False
    assert v["warnings"] == ["look: yes nil"]
    assert v["message"] == "look: policy error: policies/20-look.lua:7: " + FROZEN_EDIT


# gpuguard.peek and gpuguard.fields answer as reads and pairs would, without filling the
# tables they pass under a stub: the same answers on untouched, filled, edited and read-only
# tables.
PEEK_POLICY = """
local gg = require "gpuguard"
local function look(req, c, when)
  local f = gg.fields(c, "resources", "limits")
  table.sort(f)
  req:warn(string.format("%s: %s %s %s %s %s %s [%s] [%s] %d %d %s %s", when,
    tostring(gg.peek(c, "name")), tostring(gg.peek(c, "resources", "limits", "cpu")),
    tostring(gg.peek(c, "resources", "limits", "nope")), tostring(gg.peek(c, "name", "len")),
    tostring(gg.peek(c, "args", 2)), tostring(gg.peek(c, "args", 2.0)), table.concat(f, ","),
    table.concat(gg.fields(c, "args"), ","), #gg.fields(c, "image"), #gg.fields(c, "nope", "x"),
    tostring(gg.peek(nil, "a")), tostring(gg.peek(c, "resources") == c.resources)))
end
return { name = "peek",
  mutate = function(req, pod)
    local c = pod.spec.containers
    look(req, c[1], "untouched")
    local d = c[2]
    d.resources.limits.cpu = "2"
    d.resources.limits.memory = nil
    d.args = { "x" }
    look(req, d, "edited")
  end,
  validate = function(req, pod)
    local c = pod.spec.containers
    look(req, c[1], "read-only")
    look(req, c[2], "read-only edited")
    for i = 1, 2 do -- a table peek returns is read-only, whether filled or not
      local ok, err = pcall(function() gg.peek(c[i], "resources", "limits").cpu = "9" end)
      req:warn(i .. ": " .. tostring(err):gsub("^[^:]*:%d+: ", ""))
    end
  end }
"""


def test_peek_and_fields_read_as_reads_do_without_filling(engine):
    engine.policy("10-peek.lua", PEEK_POLICY)
    container = {"image": "busybox", "args": ["a", "b"],
                 "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}
    obj = pod(containers=[dict(container, name="c"), dict(container, name="d")])
    v = engine.run(review(obj), phases="both")
    assert v["allowed"] is True
    assert v["warnings"] == [
        "peek: untouched: c 1 nil nil b b [cpu,memory] [1,2] 0 0 nil true",
        "peek: edited: d 2 nil nil nil nil [cpu] [1] 0 0 nil true",
        "peek: read-only: c 1 nil nil b b [cpu,memory] [1,2] 0 0 nil true",
        "peek: read-only edited: d 2 nil nil nil nil [cpu] [1] 0 0 nil true",
        "peek: 1: " + FROZEN_EDIT, "peek: 2: " + FROZEN_EDIT]


def test_peek_reads_each_step_once(engine):
    """A table peek reaches through the usual reads is the one those reads gave: its path is
    not read again, so an __index on the way runs once (and a table it makes is the one
    returned)."""
    engine.policy("10-once.lua", """
local gg = require "gpuguard"
return { name = "once",
  mutate = function(req, pod)
    local calls, made = 0, nil
    local t = setmetatable({}, { __index = function(_, k)
      calls = calls + 1
      made = { k = k }
      return made
    end })
    local got = gg.peek(t, "sub")
    req:warn(string.format("%d %s", calls, tostring(got == made)))
  end }
""")
    v = engine.run(review(pod()), phases="mutate")
    assert v["allowed"] is True, v
    assert v["warnings"] == ["once: 1 true"]


def test_peek_in_validate_runs_no_metamethod_a_mutate_left_in_the_object(engine):
    """Views read the tables they show with rawget, and so do peek and fields past a view:
    an __index a mutate call set on a table of the object never gets that (writable) table
    in validate."""
    engine.policy("10-meta.lua", """
local gg = require "gpuguard"
return { name = "meta",
  mutate = function(req, pod)
    pod.metadata.annotations = setmetatable({ a = "b" }, { __index = function(t, k)
      if k == "poke" then t.written = "yes" end
      return k == "hidden" and "seen" or nil
    end })
  end,
  validate = function(req, pod)
    local peeked = gg.peek(pod, "metadata", "annotations", "poke")
    local hidden = gg.peek(pod, "metadata", "annotations", "hidden")
    local keys = gg.fields(pod, "metadata", "annotations")
    req:warn(string.format("%s %s %s %s %d", tostring(peeked), tostring(hidden),
      tostring(pod.metadata.annotations.hidden), tostring(pod.metadata.annotations.written), #keys))
  end }
""")
    v = engine.run(review(pod()), phases="both")
    assert v["allowed"] is True, v
    assert v["warnings"] == ["meta: nil nil nil nil 1"]


def test_frozen_is_the_view_validate_gets_all_request_long(engine):
    engine.policy("10-remember.lua", """
local gg = require "gpuguard"
local seen = setmetatable({}, { __mode = "k" })
return { name = "remember",
  mutate = function(req, pod)
    local view = gg.frozen(pod)
    seen[view] = pod.metadata.name
    local ok, err = pcall(function() view.metadata.name = "x" end)
    req:warn(string.format("%s %s %s", tostring(rawequal(view, gg.frozen(pod))), tostring(ok),
      tostring(err):gsub("^[^:]*:%d+: ", "")))
    pod.metadata.name = "edited"
    req:warn(view.metadata.name .. " " .. tostring(gg.frozen(7)) .. " " .. tostring(gg.frozen(nil)))
  end,
  validate = function(req, pod)
    req:warn(string.format("%s %s %s", tostring(seen[pod]), tostring(rawequal(gg.frozen(pod), pod)),
      tostring(rawequal(gg.frozen(pod.metadata), pod.metadata))))
  end }
""")
    v = engine.run(review(pod()), phases="both")
    assert v["allowed"] is True, v
    assert v["warnings"] == ["remember: true false " + FROZEN_EDIT, "remember: edited 7 nil",
                             "remember: p true true"]


def test_workload_answers_hold_for_the_whole_request(engine):
    # workload.lua remembers a pod's class by its read-only view: validate gets mutate's answer,
    # as every later mutate policy does, although the label changed in between.
    engine.lua = REPO / "lua"
    engine.policy("10-relabel.lua", """
local workload = require "workload"
return { name = "relabel",
  mutate = function(req, pod)
    req:warn("mutate " .. workload.class(pod))
    pod.metadata.labels[workload.CLASS_LABEL] = "training"
  end,
  validate = function(req, pod)
    req:warn("validate " .. workload.class(pod) .. " " .. pod.metadata.labels[workload.CLASS_LABEL])
  end }
""")
    v = engine.run(review(pod(labels={"gpuguard.io/workload-class": "inference"})), phases="both")
    assert v["warnings"] == ["relabel: mutate inference", "relabel: validate inference training"]


def test_workload_answers_of_a_failed_mutation_are_not_kept(engine):
    # A failed mutate call drops its edits, and with them what was worked out from them:
    # validate starts from the object as it came, and so does the memo.
    engine.lua = REPO / "lua"
    engine.policy("10-half.lua", """
local workload = require "workload"
return { name = "half", failure = "allow",
  mutate = function(req, pod)
    pod.metadata.labels[workload.CLASS_LABEL] = "training"
    req:warn("mutate " .. workload.class(pod))
    error("then fails")
  end,
  validate = function(req, pod)
    req:warn("validate " .. workload.class(pod))
  end }
""")
    v = engine.run(review(pod(labels={"gpuguard.io/workload-class": "inference"})), phases="both")
    assert v["patch"] == []
    assert [w for w in v["warnings"] if "ignored" not in w] == ["half: mutate training",
                                                                 "half: validate inference"]


def test_validate_after_a_failed_mutation_sees_the_object_as_it_came(engine):
    engine.policy("10-half.lua", """
return { name = "half", failure = "allow", mutate = function(req, pod)
  pod.metadata.labels = require("gpuguard").object({ added = "yes" })
  error("then fails")
end }
""")
    engine.policy("20-look.lua", """
return { name = "look", validate = function(req, pod)
  req:warn("labels " .. tostring(pod.metadata.labels))
end }
""")
    v = engine.run(review(pod()), phases="both")
    assert v["allowed"] is True
    assert v["patch"] == []
    assert v["warnings"][1] == "look: labels nil"


# Three mutate policies around one that may fail open: A scrubs a forged annotation and labels
# the pod, B (failure as given) edits and then fails as given, C labels the pod and reports what
# validate sees.
SCRUB_A = """
local gg = require "gpuguard"
return { name = "a", mutate = function(req, pod)
  pod.metadata.annotations["gpuguard.io/charge"] = nil
  pod.metadata.labels = gg.object({ a = "yes" })
end }
"""

HALF_B = """
return { name = "b", failure = "%s", mutate = function(req, pod)
  pod.metadata.labels.b = "yes"
  pod.metadata.annotations["gpuguard.io/charge"] = "4"
  pod.spec.containers[1].image = "evil"
  %s
end }
"""

LABEL_C = """
local gg = require "gpuguard"
return { name = "c", failure = "%s",
  mutate = function(req, pod) pod.metadata.labels.c = "yes" end,
  validate = function(req, pod)
    local labels = {}
    for k in pairs(pod.metadata.labels or {}) do labels[#labels + 1] = k end
    table.sort(labels)
    req:warn(("labels %%s, charge %%s, image %%s"):format(table.concat(labels, ","),
      tostring(pod.metadata.annotations["gpuguard.io/charge"]), pod.spec.containers[1].image))
  end }
"""

FORGED = pod(annotations={"gpuguard.io/charge": "4", "keep": "x"})
A_AND_C = [{"op": "remove", "path": "/metadata/annotations/gpuguard.io~1charge"},
           {"op": "add", "path": "/metadata/labels", "value": {"a": "yes", "c": "yes"}}]


def three_policies(engine, b_failure, b_end, c_failure="deny"):
    engine.policy("10-a.lua", SCRUB_A)
    engine.policy("20-b.lua", HALF_B % (b_failure, b_end))
    engine.policy("30-c.lua", LABEL_C % c_failure)


def test_an_allowed_failure_drops_only_its_own_edits(engine):
    """B's edits go; A's scrub before it and C's label after it stay, and validate sees the
    object the patch makes (issue 35, finding 12: a forged charge passed the quota)."""
    three_policies(engine, "allow", 'error("b broke", 0)')
    for phases in ("mutate", "both"):
        v = engine.run(review(FORGED), phases=phases)
        assert v["allowed"] is True
        assert v["patch"] == A_AND_C
        assert v["mutated"] == apply(FORGED, A_AND_C)
        assert v["warnings"][0] == "b: policy error: b broke (ignored: failure allow)"
    assert v["warnings"][1:] == ["c: labels a,c, charge nil, image busybox"]


def test_an_allowed_failure_in_the_first_policy_and_the_last(engine):
    engine.policy("05-b.lua", """
return { name = "b0", failure = "allow", mutate = function(req, pod)
  pod.metadata.annotations.keep = "changed"; pod.spec.containers[1].image = "evil"; error("first", 0)
end }
""")
    three_policies(engine, "allow", 'error("b broke", 0)')
    engine.policy("40-b.lua", HALF_B.replace('"b"', '"b2"') % ("allow", "error('last', 0)"))
    v = engine.run(review(FORGED), phases="both")
    assert v["allowed"] is True and v["patch"] == A_AND_C
    assert v["warnings"] == ["b0: policy error: first (ignored: failure allow)",
                             "b: policy error: b broke (ignored: failure allow)",
                             "b2: policy error: last (ignored: failure allow)",
                             "c: labels a,c, charge nil, image busybox"]


def test_a_failure_in_warn_mode_drops_only_its_own_edits(engine):
    three_policies(engine, "deny", 'error("b broke", 0)')
    engine.configure("enforcement:\n  policies:\n    b:\n      mode: warn\n")
    v = engine.run(review(FORGED), phases="both")
    assert v["allowed"] is True and v["patch"] == A_AND_C
    assert v["warnings"] == ["b: policy error: b broke",
                             "c: labels a,c, charge nil, image busybox"]


def test_a_denied_failure_stays_a_denial_without_edits(engine):
    three_policies(engine, "deny", 'error("b broke", 0)')
    v = engine.run(review(FORGED), phases="both")
    assert v["allowed"] is False and v["patch"] == []
    assert v["message"] == "b: policy error: b broke"
    # Validate starts again from the object as it came.
    assert v["warnings"] == ["c: labels , charge 4, image busybox"]


def test_an_allowed_failure_that_stops_the_vm_keeps_the_edits_before_it(engine):
    """No Lua runs after the stop: the patch is what the policies before it left, and the
    policies after it fail at once with their own verdicts."""
    engine.configure("engine:\n  instructions: 200000\n")
    three_policies(engine, "allow", "while true do end", c_failure="allow")
    v = engine.run(review(FORGED), phases="both")
    assert v["allowed"] is True
    scrubbed = [{"op": "remove", "path": "/metadata/annotations/gpuguard.io~1charge"},
                {"op": "add", "path": "/metadata/labels", "value": {"a": "yes"}}]
    assert v["patch"] == scrubbed and v["mutated"] == apply(FORGED, scrubbed)
    stopped = "c: policy error: the Lua VM was stopped earlier in this request (ignored: failure allow)"
    assert v["warnings"] == [
        "b: policy stopped: instruction budget exhausted (ignored: failure allow)", stopped]
    three_policies(engine, "allow", "while true do end", c_failure="deny")
    v = engine.run(review(FORGED), phases="mutate")
    assert v["allowed"] is False and v["patch"] == []


def test_an_allowed_failure_after_edits_that_are_not_json_denies(engine):
    engine.policy("10-a.lua", """
return { name = "a", mutate = function(req, pod) pod.spec.tolerations = {} end }
""")
    engine.policy("20-b.lua", HALF_B % ("allow", 'error("b broke", 0)'))
    v = engine.run(review(FORGED), phases="both")
    assert v["allowed"] is False and v["patch"] == []
    assert v["message"] == ("the edited object cannot be JSON: an empty table is ambiguous: use "
                            "gpuguard.array() or gpuguard.object() at /spec/tolerations")


def test_two_allowed_failures_on_a_reused_vm(engine):
    three_policies(engine, "allow", 'error("b broke", 0)')
    engine.policy("40-again.lua", """
return { name = "again", failure = "allow", mutate = function(req, pod)
  pod.metadata.labels.again = "yes"; pod.metadata.labels.a = nil; error("again", 0)
end }
""")
    v = engine.run(review(FORGED), phases="both", repeat=3)
    assert v["patch"] == A_AND_C
    assert v["warnings"][-1] == "c: labels a,c, charge nil, image busybox"


def test_an_allowed_failure_of_a_shipped_set_keeps_the_scrub_of_a_forged_charge(engine):
    """The shipped policies with one more that fails open after gpu-sharing: gpu-sharing's
    charge, pool and selector stay, and validate (gpu-quota) reads them."""
    for f in (REPO / "policies").glob("*.lua"):
        engine.policy(f.name, f.read_text())
    engine.policy("15-flaky.lua", """
return { name = "flaky", failure = "allow",
  mutate = function(req, pod) pod.metadata.annotations["gpuguard.io/charge"] = "1"; error("flaky", 0) end,
  validate = function(req, pod) req:warn("charge " .. pod.metadata.annotations["gpuguard.io/charge"]) end }
""")
    engine.lua = REPO / "lua"
    engine.config = REPO / "deploy" / "gpuguard.yaml"
    sneaky = pod(name="sneaky", labels={"team": "vision"},
                 annotations={"gpuguard.io/charge": "1", "gpuguard.io/pool": "h100-train"},
                 containers=[{"name": "main", "image": "vllm/vllm-openai:v0.6.3",
                              "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"},
                                            "requests": {"nvidia.com/mig-3g.40gb": "1"}}}])
    v = engine.run(review(sneaky, namespace="team-a"), phases="both")
    assert "flaky: policy error: flaky (ignored: failure allow)" in v["warnings"]
    assert "flaky: charge 429" in v["warnings"]
    annotations = v["mutated"]["metadata"]["annotations"]
    assert annotations["gpuguard.io/charge"] == "429"
    assert annotations["gpuguard.io/pool"] == "a100-mig"
    assert v["mutated"]["spec"]["nodeSelector"] == {"gpuguard.io/pool": "a100-mig"}
    assert v["mutated"] == apply(sneaky, v["patch"])


# ---- garbage ---------------------------------------------------------------

# Makes the number of small tables in the label "tables" and throws them away.
GARBAGE = """
return {
  name = "garbage",
  validate = function(req, pod)
    local n, sum = tonumber(pod.metadata.labels.tables), 0
    for i = 1, n do
      local t = { i, i + 1, tostring(i) }
      sum = sum + #t
    end
    if sum ~= 3 * n then req:deny("lost tables") end
  end,
}
"""


def test_garbage_past_the_memory_limit_is_collected_within_the_review(engine):
    """The memory limit bounds what a policy keeps, not what it throws away: 300,000
    tables (some 30 MB, nearly four times the limit) are collected as the review runs.  The
    instruction budget bounds it; the wall clock is set far off, since a machine under load (or
    ASan) may take seconds and this test is about memory."""
    engine.configure("engine:\n  memory: 8Mi\n  instructions: 100000000\n  timeout: 30s\n")
    engine.policy("10-garbage.lua", GARBAGE)
    v = engine.run(review(pod(labels={"tables": "300000"})), phases="validate", repeat=3)
    assert v["allowed"] is True, v


# ---- the sandbox -----------------------------------------------------------

SANDBOX_ESCAPES = {
    "infinite loop": ("while true do end", "boom: policy stopped: instruction budget exhausted"),
    "busy loop inside pcall": ("while true do pcall(function() while true do end end) end",
                               "boom: policy stopped: instruction budget exhausted"),
    "pcall swallowing the kill": (
        "for i = 1, 100 do pcall(function() while true do end end) end; req:deny('escaped')",
        "boom: policy stopped: instruction budget exhausted"),
    # pcall as the last thing the policy does (a tail call): no instruction of the policy runs
    # after it catches the kill, so no hook can raise it again; the call must fail all the same.
    "pcall returned from the policy": ("return pcall(function() while true do end end)",
                                       "boom: policy stopped: instruction budget exhausted"),
    "pcall returned from the policy, memory": (
        "return pcall(function() local t = {} for i = 1, 1e9 do t[i] = {i} end end)",
        "boom: policy stopped: memory limit exceeded"),
    # Lua calls xpcall's handler where the error is raised, and a kill is raised from the count
    # hook, where hooks are off: a handler that loops there must not run (it would never stop).
    "xpcall handler looping after the kill": (
        "xpcall(function() while true do end end, function() while true do end end)",
        "boom: policy stopped: instruction budget exhausted"),
    "xpcall handler looping on an error": (
        "xpcall(error, function() local n = 0 while true do n = n + 1 end end)",
        "boom: policy stopped: instruction budget exhausted"),
    "xpcall handler looping after a memory kill": (
        "xpcall(function() local t = {} for i = 1, 1e9 do t[i] = {i} end end, "
        "function() while true do end end)",
        "boom: policy stopped: memory limit exceeded"),
    "string.rep bomb": ("local s = string.rep('x', 1 << 30)",
                        "boom: policy error: policies/10-boom.lua:1: string.rep: the result "
                        "would exceed the memory limit"),
    "table bomb": ("local t = {} for i = 1, 1e9 do t[i] = {i} end",
                   "boom: policy stopped: memory limit exceeded"),
    "string growth in pcall": (
        "local s = 'x' while true do pcall(function() s = s .. s end) end",
        "boom: policy stopped: memory limit exceeded"),
    "deep recursion": ("local function f(n) return f(n + 1) + 1 end f(1)",
                       "boom: policy stopped: memory limit exceeded"),
    "load is gone": ("load('return 1')()",
                     "boom: policy error: policies/10-boom.lua:1: attempt to call a nil value "
                     "(global 'load')"),
    "bytecode through string.dump": ("local f = string.dump(function() end)",
                                     "boom: policy error: policies/10-boom.lua:1: attempt to "
                                     "call a nil value (field 'dump')"),
    "io": ("io.open('/etc/passwd')",
           "boom: policy error: policies/10-boom.lua:1: attempt to index a nil value "
           "(global 'io')"),
    "os": ("os.execute('true')",
           "boom: policy error: policies/10-boom.lua:1: attempt to index a nil value "
           "(global 'os')"),
    "debug": ("debug.sethook()",
              "boom: policy error: policies/10-boom.lua:1: attempt to index a nil value "
              "(global 'debug')"),
    "package": ("package.loadlib('x', 'y')",
                "boom: policy error: policies/10-boom.lua:1: attempt to index a nil value "
                "(global 'package')"),
    "dofile": ("dofile('/etc/passwd')",
               "boom: policy error: policies/10-boom.lua:1: attempt to call a nil value "
               "(global 'dofile')"),
    "collectgarbage": ("collectgarbage('stop')",
                       "boom: policy error: policies/10-boom.lua:1: attempt to call a nil value "
                       "(global 'collectgarbage')"),
    "rawset on a shared table": ("rawset(string, 'upper', nil)",
                                 "boom: policy error: policies/10-boom.lua:1: attempt to call a "
                                 "nil value (global 'rawset')"),
    "writing a nested shared table": (
        "require('gpuguard_test_util').nested.x = 1",
        "boom: policy error: policies/10-boom.lua:1: attempt to modify a read-only table "
        "(shared configuration or library): copy what you need into a table of your own"),
    "the string metatable": ("getmetatable('').__index.upper = nil",
                             "boom: policy error: policies/10-boom.lua:1: attempt to index a "
                             "nil value (field '__index')"),
    "a finalizer": ("setmetatable({}, { __gc = function() while true do end end })",
                    "boom: policy error: policies/10-boom.lua:1: __gc metamethods are not "
                    "allowed in policies"),
    "require outside lua/": ("require('os')",
                             "boom: policy error: policies/10-boom.lua:1: require \"os\": no such "
                             "module in the Lua library directory"),
    "require with a path": ("require('../policies/10-boom')",
                            "boom: policy error: policies/10-boom.lua:1: require "
                            "\"../policies/10-boom\": no such module in the Lua library "
                            "directory"),
    "huge pattern subject": ("string.find(string.rep('a', 70000), '.-b')",
                             "boom: policy error: policies/10-boom.lua:1: pattern matching on a "
                             "string of 70000 bytes (the limit is 65536)"),
}


# Library calls that looped in C for hours: each now ends within the request.
SLOW = "string.rep('a', 60000)"
C_LOOPS = {
    "find .-.-.-.-.-.-b": ("string.find(%s, '.-.-.-.-.-.-b')" % SLOW, "stopped: out of time"),
    "find .-b": ("string.find(%s, '.-b')" % SLOW, "stopped: out of time"),
    "method find": ("(%s):find('.-.-b')" % SLOW, "stopped: out of time"),
    "match": ("string.match(%s, '(.-)%%1b')" % SLOW, "stopped: out of time"),
    "gmatch": ("(function() for m in string.gmatch(%s, '.-.-b') do end end)()" % SLOW, "stopped: out of time"),
    "gsub": ("string.gsub(%s, 'a-a-a-b', 'x')" % SLOW, "stopped: out of time"),
    "table.move": ("table.move({}, 1, 2^62, 1)",
                   "error: policies/10-slow.lua:3: table.move: 4611686018427387904 elements "
                   "cannot fit in the memory limit"),
    "table.concat": ("table.concat({}, '', 1, 2^62)",
                     "error: policies/10-slow.lua:3: table.concat: 4611686018427387904 "
                     "elements cannot fit in the memory limit"),
    "table.concat __len": ("table.concat(setmetatable({}, { __len = function() return 2^62 end "
                           "}))", "error: policies/10-slow.lua:3: table.concat: "
                                  "4611686018427387904 elements cannot fit in the memory limit"),
    "table.unpack": ("table.unpack({}, 1, 2^62)",
                     "error: policies/10-slow.lua:3: table.unpack: 4611686018427387904 "
                     "elements cannot fit in the memory limit"),
    "string.rep": ("string.rep('ab', 2^40, ',')",
                   "error: policies/10-slow.lua:3: string.rep: the result would exceed the "
                   "memory limit"),
}


@pytest.mark.parametrize("name", sorted(C_LOOPS))
def test_library_calls_end_within_the_request(engine, name):
    body, outcome = C_LOOPS[name]
    engine.configure("engine:\n  timeout: 300ms\n  instructions: 1000000000000\n")
    engine.policy("10-slow.lua", """
return { name = "slow", validate = function(req)
  local r = %s
  req:warn("finished")
end }
""" % body)
    v = engine.run(review(pod()), phases="validate")
    assert v["allowed"] is False
    assert v["message"] == "slow: policy " + outcome


# C work that one call does, each far beyond a budget of a million instructions once
# counted: matching calls, pattern items, bytes of sets and plain patterns scanned, a
# replacement's escapes, bytes of strings compared by table.sort.  (The stock sort counted
# none of it, the old matcher only its calls and repeated characters: all but the first
# ran to their end.)
SHORT = "string.rep('a', 2048)"
SET = "'[' .. string.rep('b', 65535)"
C_WORK = {
    "backtracking": "string.find(%s, '.-.-b')" % SLOW,
    "optional items": "string.find(%s, string.rep('x?', 65536) .. 'y')" % SHORT,
    "a set": "string.find(%s, %s .. 'b]')" % (SHORT, SET),
    "a repeated set": "string.match(%s, %s .. 'a]*$')" % (SHORT, SET),
    "a lazy set": "string.match(%s, %s .. 'a]-$')" % (SHORT, SET),
    "a frontier": "string.find(%s, '%%f' .. %s .. 'b]')" % (SHORT, SET),
    "a replacement": "string.gsub(%s, '', string.rep('%%0', 65536))" % SHORT,
    "a plain pattern": "local p = string.rep('b', 1 << 20) "
                       "for i = 1, 10 do string.find('a', p) end",
    "table.sort": "local s, t = string.rep('a', 1 << 20), {} "
                  "for i = 1, 1000 do t[i] = s end table.sort(t)",
}


@pytest.mark.parametrize("name", sorted(C_WORK))
def test_c_work_counts_against_the_instruction_budget(engine, name):
    engine.configure("engine:\n  timeout: 10s\n  instructions: 1000000\n")
    engine.policy("10-slow.lua", """
return { name = "slow", validate = function(req) %s end }
""" % C_WORK[name])
    v = engine.run(review(pod()), phases="validate")
    assert v["message"] == "slow: policy stopped: instruction budget exhausted"


# table.sort is gpuguard's own merge sort (lb_stdlib.c): the stock function's results and
# errors, and beyond them a list left as it was when a comparison raises and a permutation
# from an order function that contradicts itself.
def test_table_sort_semantics(engine):
    engine.module("util", "return { sorted = { 'a', 'b' }, unsorted = { 'b', 'a' } }")
    engine.policy("10-sort.lua", r"""
local util = require "util"
local function sorted(t, comp) table.sort(t, comp) return table.concat(t, ",") end
local function err(f, ...)
  local ok, e = pcall(f, ...)
  return ok and "ok" or (string.gsub(e, "^[^:]*:%d+: ", ""))
end
-- n values in a pseudo-random order with ties; sorted by comp: in order, none lost
local function shuffled(n)
  local t, x = {}, 7
  for i = 1, n do x = x * 1103515245 % 2147483648 + 12345; t[i] = x % 97 end
  return t
end
local function check(n, comp)
  local t, count, before = shuffled(n), {}, comp or function(a, b) return a < b end
  for _, v in ipairs(t) do count[v] = (count[v] or 0) + 1 end
  table.sort(t, comp)
  for i = 1, n do
    count[t[i]] = count[t[i]] - 1
    if i > 1 and before(t[i], t[i - 1]) then return "unordered" end
  end
  for _, c in pairs(count) do if c ~= 0 then return "not a permutation" end end
  return "ok"
end
local by_v = { __lt = function(a, b) return a.v < b.v end }
local function node(v) return setmetatable({ v = v }, by_v) end
return { name = "sort", validate = function(req)
  local backing = { 3, 1, 2 }
  local proxy = setmetatable({}, { __index = backing, __newindex = backing,
                                   __len = function() return #backing end })
  local nodes = { node(2), node(3), node(1) }
  local broken = { 3, 2, "x", 1 }
  local chaos = { 5, 4, 3, 2, 1 }
  table.sort(chaos, function() return true end)
  table.sort(chaos)
  table.sort(proxy)
  table.sort(nodes)
  req:deny(table.concat({
    sorted({ 5, 3, 9, 1, 1, 7, 2, 8, 0, 4, 6 }),
    sorted({ "b", "a", "ab", "", "B" }),
    sorted({ 3, 1, 2 }, function(a, b) return a > b end),
    sorted({}), sorted({ 1 }), sorted({ 2.5, -1, 2 }),
    check(1000), check(1001, function(a, b) return a > b end), check(3), check(64),
    table.concat(chaos, ","), table.concat(backing, ","), nodes[1].v .. nodes[2].v .. nodes[3].v,
    err(table.sort, { 1, "x" }), err(table.sort, broken):match("^attempt to compare"),
    table.concat(broken, ","),
    err(table.sort, { 1, 2 }, 3), err(table.sort, "x"), err(table.sort, { nil, 1 }),
    err(table.sort, setmetatable({}, { __len = function() return 2^40 end })),
    err(table.sort, setmetatable({}, { __len = function() return 100000000 end })),
    err(table.sort, setmetatable({}, { __len = function() return 1000000 end })),
    err(table.sort, { 2, 1 }, function() error("no order") end),
    err(table.sort, util.sorted), err(table.sort, util.unsorted),
  }, "\n"))
end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["message"].split("\n") == [
        "sort: 0,1,1,2,3,4,5,6,7,8,9", ",B,a,ab,b", "3,2,1", "", "1", "-1,2,2.5",
        "ok", "ok", "ok", "ok",
        "1,2,3,4,5", "1,2,3", "123",
        "attempt to compare string with number", "attempt to compare", "3,2,x,1",
        "bad argument #2 to 'table.sort' (function expected, got number)",
        "bad argument #1 to 'table.sort' (table expected, got string)",
        "attempt to compare number with nil",
        "bad argument #1 to 'table.sort' (array too big)",
        "table.sort: 100000000 elements cannot fit in the memory limit",
        "stack overflow (too many elements to sort)",
        "no order",
        "ok",
        "attempt to modify a read-only table (shared configuration or library): copy what "
        "you need into a table of your own"]


def test_empty_repeats_return_at_once(engine):
    engine.policy("10-rep.lua", """
return { name = "rep", validate = function(req)
  req:deny(string.format("[%s] [%s] %d", string.rep("", 2^62), string.rep("", 2^62, ""),
                         select("#", utf8.char(65, 66))))
end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["message"] == "rep: [] [] 1"


def test_type_names_every_kind_of_value(engine):
    # The sandbox's type() answers with names made once; it must say what Lua's says.
    engine.policy("10-types.lua", """
local gg = require "gpuguard"
return { name = "types", validate = function(req, pod)
  local values = { nil, false, 0, 1.5, "s", {}, print, gg.null, pod, pod.metadata.name,
                   pod.spec.containers }
  local out = {}
  for i = 1, 11 do out[i] = type(values[i]) end
  local ok, err = pcall(function() return type() end)
  local _, direct = pcall(type) -- named from the loaded modules, as Lua names its own
  type = function() return "mine" end -- a chunk's own global: no other chunk sees it
  req:deny(table.concat(out, " ") .. " | " .. tostring(ok) .. " " .. err:gsub("^.-:%d+: ", "")
           .. " | " .. direct)
end }
""")
    engine.policy("20-after.lua", """
return { name = "after", validate = function(req, pod) req:deny(type(pod)) end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["message"] == (
        "types: nil boolean number number string table function userdata table string table | "
        "false bad argument #1 to 'type' (value expected) | bad argument #1 to 'type' (value "
        "expected)\nafter: table")


@pytest.mark.parametrize("name", sorted(SANDBOX_ESCAPES))
def test_sandbox_escape_ends_in_a_clean_failure(engine, name):
    body, message = SANDBOX_ESCAPES[name]
    engine.module("gpuguard_test_util", "return { nested = { x = 0 } }")
    engine.policy("10-boom.lua",
                  "return { name = 'boom', validate = function(req, pod) " + body + " end }")
    engine.policy("20-fine.lua", """
return { name = "fine", validate = function(req) req:warn("still running") end }
""")
    # Twice on one engine: the second request runs on a rebuilt VM.
    v = engine.run(review(pod()), phases="validate", repeat=2)
    assert v["allowed"] is False
    if message.startswith("boom: policy stopped:"):
        # A stopped VM fails the policies after it too, each with its own verdict.
        message += "\nfine: policy error: the Lua VM was stopped earlier in this request"
    assert v["message"] == message


def test_xpcall_calls_its_handler_and_passes_the_arguments(engine):
    # The sandbox's xpcall guards its handler against kills; otherwise it is Lua's.
    engine.policy("10-x.lua", """
return { name = "x", validate = function(req, pod)
  local a = { xpcall(function(x, y) return x + y, "two" end, print, 1, 2) }
  local b = { xpcall(function() error({ code = 7 }) end, function(e) return "handled " .. e.code end) }
  local c = { pcall(xpcall, print) }
  local d = { xpcall(function() error("deep") end, function(e) error("again") end) }
  req:deny(string.format("%s %s %s | %s %s | %s %s | %s %s", tostring(a[1]), a[2], a[3],
    tostring(b[1]), b[2], tostring(c[1]), (c[2]:gsub("^.-:%d+: ", "")), tostring(d[1]),
    tostring(d[2])))
end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["message"] == ("x: true 3 two | false handled 7 | false bad argument #2 to 'xpcall' "
                            "(function expected, got no value) | false error in error handling")


def test_a_load_that_loops_in_an_xpcall_handler_is_stopped(engine):
    engine.policy("10-spin.lua",
                  "xpcall(function() while true do end end, function() while true do end end)")
    assert engine.run(review(pod()), expect_rc=1).strip().endswith(
        "10-spin.lua: instruction budget exhausted")


def test_a_load_that_returns_the_pcall_of_a_runaway_is_stopped(engine):
    # The load budget's kill, caught by the file's own pcall in a tail call, still fails it.
    engine.policy("10-spin.lua", "return pcall(function() while true do end end)")
    assert engine.run(review(pod()), expect_rc=1).strip().endswith(
        "10-spin.lua: instruction budget exhausted")


def test_bytecode_chunks_are_refused(engine, tmp_path):
    binary = subprocess.run(["luac5.4", "-o", "-", "-"], input=b"return {}",
                            capture_output=True).stdout
    (engine.dir / "10-bytecode.lua").write_bytes(binary)
    path = tmp_path / "r.json"
    out = engine.run(review(pod()), expect_rc=1)
    assert "attempt to load a binary chunk (mode is 't')" in out


def test_one_policy_cannot_change_another_environment(engine):
    engine.module("util", "local M = {} M.n = 1 function M.twice(x) return 2 * x end return M")
    engine.policy("10-evil.lua", """
x = "evil"
_G.shared = "evil"
string.upper = function() return "evil" end
local util = require "util"
util.n = 2
util.twice = function() return "evil" end
return { name = "evil", validate = function(req) y = "evil" end }
""")
    engine.policy("20-victim.lua", """
local util = require "util"
return { name = "victim", validate = function(req)
  req:warn(table.concat({ tostring(x), tostring(shared), tostring(y), string.upper("ok"),
    ("ok"):upper(), util.n, util.twice(21) }, ","))
end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["warnings"] == ["victim: nil,nil,nil,OK,OK,1,42"]


def test_config_is_read_only_to_policies(engine):
    engine.configure("pools:\n  - name: a100\n")
    engine.policy("10-cfg.lua", """
return { name = "cfg", validate = function(req, pod, cfg)
  req:warn(cfg.pools[1].name .. " " .. #cfg.pools)
  cfg.pools[1].name = "changed"
end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["warnings"] == ["cfg: a100 1"]
    assert v["message"] == ("cfg: policy error: policies/10-cfg.lua:4: attempt to modify a "
                            "read-only table (shared configuration or library): copy what you "
                            "need into a table of your own")


# Every C function of the sandbox that takes a table, applied to read-only
# tables: the configuration, the request's user and a library module.
TABLE_FUNCTIONS = {
    "gpuguard.array": "gg.array(t)",
    "gpuguard.object": "gg.object(t)",
    "gpuguard.is_array": "gg.is_array(t)",
    "gpuguard.is_object": "gg.is_object(t)",
    "setmetatable": "setmetatable(t, nil)",
    "getmetatable": "getmetatable(t).__index = nil",
    "next": "next(t)",
    "rawget": "rawget(t, 1)",
    "rawlen": "rawlen(t)",
    "rawequal": "rawequal(t, t)",
    "pairs": "for k in pairs(t) do end",
    "ipairs": "for i in ipairs(t) do end",
    "table.insert": "table.insert(t, 'system:masters')",
    "table.remove": "table.remove(t)",
    "table.sort": "table.sort(t)",
    "table.concat": "table.concat(t)",
    "table.unpack": "table.unpack(t)",
    "table.move within": "table.move(t, 1, 1, 2)",
    "table.move into": "table.move({ 'system:masters' }, 1, 1, 1, t)",
}


@pytest.mark.parametrize("name", sorted(TABLE_FUNCTIONS))
def test_no_table_function_changes_a_read_only_table(engine, name):
    engine.configure("quotas:\n  default: 4\n")
    engine.module("util", "return { nested = { 'x' } }")
    engine.policy("10-poke.lua", """
local gg = require "gpuguard"
return { name = "poke", validate = function(req, pod, cfg)
  for _, t in ipairs({ cfg.quotas, req.user.groups, require("util").nested }) do
    pcall(function() %s end)
  end
end }
""" % TABLE_FUNCTIONS[name])
    engine.policy("20-check.lua", """
return { name = "check", validate = function(req, pod, cfg)
  local groups, nested = req.user.groups, require("util").nested
  req:warn(string.format("%s %d %s %s %s %s", tostring(cfg.quotas.default), #groups,
    tostring(groups[1]), tostring(nested[1]), getmetatable(cfg.quotas), getmetatable(groups)))
end }
""")
    v = engine.run(review(pod()), phases="validate", repeat=2)
    assert v["allowed"] is True
    assert v["warnings"] == ["check: 4 1 dev x read-only read-only"]


def test_marking_a_read_only_table_returns_a_marked_copy(engine):
    engine.configure("pools:\n  - name: a100\n    node_selector: {pool: a100}\n")
    engine.policy("10-place.lua", """
local gg = require "gpuguard"
return { name = "place", mutate = function(req, pod, cfg)
  local sel = gg.object(cfg.pools[1].node_selector)
  assert(gg.is_object(sel) and sel ~= cfg.pools[1].node_selector)
  sel.extra = "mine"
  pod.spec.nodeSelector = sel
  req:warn("pool " .. tostring(cfg.pools[1].node_selector.pool) .. " "
           .. tostring(cfg.pools[1].node_selector.extra))
end }
""")
    v = engine.run(review(pod()), phases="mutate", repeat=3)
    assert v["warnings"] == ["place: pool a100 nil"]
    assert v["patch"] == [{"op": "add", "path": "/spec/nodeSelector",
                           "value": {"pool": "a100", "extra": "mine"}}]


def test_marking_an_untouched_object_table_keeps_its_members(engine):
    engine.policy("10-mark.lua", """
local gg = require "gpuguard"
return { name = "mark", mutate = function(req, pod)
  local spec = gg.object(pod.spec)
  local n = 0
  for k in pairs(spec) do n = n + 1 end
  req:warn("members " .. n .. " " .. type(spec.containers))
end }
""")
    v = engine.run(review(pod()), phases="mutate")
    assert v["allowed"] is True
    assert v["warnings"] == ["mark: members 1 table"]
    assert v["patch"] == []


def test_marking_a_table_with_a_protected_metatable_is_refused(engine):
    engine.policy("10-mark.lua", """
local gg = require "gpuguard"
return { name = "mark", validate = function(req)
  gg.object(setmetatable({}, { __metatable = "mine" }))
end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["message"] == ("mark: policy error: policies/10-mark.lua:4: cannot mark a table "
                            "whose metatable is protected")


def test_module_tables_below_the_top_are_read_only(engine):
    engine.module("util", "local M = {} M.limits = { gpus = 4 } return M")
    engine.policy("10-use.lua", """
local util = require "util"
return { name = "use", validate = function(req)
  req:warn(util.limits.gpus .. "")
  util.limits.gpus = 8
end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["warnings"] == ["use: 4"]
    assert "attempt to modify a read-only table" in v["message"]


def test_readonly_views_of_what_a_library_keeps_across_requests(engine):
    # What a library keeps for every request of the VM (fleet.per_config) is handed out through
    # gpuguard.readonly: a write raises the configuration's error, every request reads what was
    # built, and a view placed in the object is encoded like any table.
    engine.module("keep", """
local gg = require "gpuguard"
local M = {}
local kept
function M.get()
  kept = kept or gg.readonly({ n = 1, sel = gg.object({ pool = "a100" }), list = gg.array({ 1, 2 }) })
  return kept
end
return M
""")
    engine.policy("10-keep.lua", """
local gg = require "gpuguard"
local keep = require "keep"
local seen = 0
return { name = "keep", mutate = function(req, pod)
  seen = seen + 1
  local k = keep.get()
  local ok, err = pcall(function() k.sel.pool = "mine" .. seen end)
  req:warn(tostring(ok) .. " " .. (err:match("^(.-) %(shared configuration or library%)") or err))
  ok = pcall(table.insert, k.list, 3)
  req:warn(string.format("%s %d %s %d %s %s %s", tostring(ok), k.n, k.sel.pool, #k.list,
    tostring(gg.is_object(k.sel)), tostring(rawequal(gg.readonly(k), k)), tostring(gg.readonly(7))))
  pod.spec.nodeSelector = k.sel
  local labels = gg.readonly(pod.metadata.labels)
  req:warn(tostring(labels.app) .. " " .. tostring(pcall(function() labels.app = "y" end)))
end }
""")
    v = engine.run(review(pod(labels={"app": "x"})), phases="mutate", repeat=3)
    assert v["warnings"] == [
        "keep: false policies/10-keep.lua:8: attempt to modify a read-only table",
        "keep: false 1 a100 2 true true 7",
        "keep: x false"]
    assert v["patch"] == [{"op": "add", "path": "/spec/nodeSelector", "value": {"pool": "a100"}}]


WALK_CONFIG = """
pools:
  - name: a100
    taints: [{key: gpu, value: a100}, {key: spot, value: "yes"}]
  - name: h100
    taints: []
guardrails:
  required_labels: [team, cost-center]
quotas:
  default: 4
  max_per_pod: 16
"""


def test_policies_walk_shared_configuration_with_ipairs_len_pairs_and_next(engine):
    engine.configure(WALK_CONFIG)
    engine.module("util", "return { sizes = { 1, 2, 4 }, named = { small = 1, big = 8 } }")
    engine.policy("10-walk.lua", """
local util = require "util"
local function sorted_pairs(t)
  local keys = {}
  for k, v in pairs(t) do keys[#keys + 1] = k .. "=" .. tostring(v) end
  table.sort(keys)
  return table.concat(keys, ",")
end
return { name = "walk", validate = function(req, pod, cfg)
  local out = {}
  for i, pool in ipairs(cfg.pools) do
    local taints = {}
    for j, t in ipairs(pool.taints) do taints[j] = t.key .. ":" .. t.value end
    out[#out + 1] = i .. " " .. pool.name .. " #" .. #pool.taints .. " " .. table.concat(taints, ",")
  end
  out[#out + 1] = "#pools " .. #cfg.pools .. " labels " .. #cfg.guardrails.required_labels
    .. " " .. table.concat(cfg.guardrails.required_labels, ",")
  out[#out + 1] = "quotas " .. sorted_pairs(cfg.quotas)
  local keys, k = {}, next(cfg)
  while k ~= nil do keys[#keys + 1] = k; k = next(cfg, k) end
  table.sort(keys)
  out[#out + 1] = "next " .. table.concat(keys, ",") .. " " .. tostring(next(cfg.pools[2].taints))
  local total = 0
  for _, n in ipairs(util.sizes) do total = total + n end
  out[#out + 1] = "util #" .. #util.sizes .. " sum " .. total .. " " .. sorted_pairs(util.named)
  local it, state, first = pairs(cfg.quotas)
  out[#out + 1] = "state " .. tostring(state == cfg.quotas) .. " " .. tostring(first)
    .. " " .. select("#", it(state, nil))
  for _, line in ipairs(out) do req:warn(line) end
end }
""")
    v = engine.run(review(pod()), phases="validate", repeat=2)
    assert v["allowed"] is True
    assert v["warnings"] == ["walk: " + w for w in [
        "1 a100 #2 gpu:a100,spot:yes", "2 h100 #0 ", "#pools 2 labels 2 team,cost-center",
        "quotas default=4,max_per_pod=16", "next guardrails,pools,quotas nil",
        "util #3 sum 7 big=8,small=1", "state true nil 2"]]


READ_ONLY = ("attempt to modify a read-only table (shared configuration or library): copy "
             "what you need into a table of your own")
AT = "policies/10-write.lua:3: "  # a write in Lua code is placed; one inside a C function is not

# Every way of writing into a shared table, and the error each one ends in.
SHARED_WRITES = {
    "new key": ("cfg.extra = 1", AT + READ_ONLY),
    "existing key": ("cfg.quotas = {}", AT + READ_ONLY),
    "nested existing key": ("cfg.pools[1].name = 'changed'", AT + READ_ONLY),
    "nested new key": ("cfg.pools[1].extra = 'x'", AT + READ_ONLY),
    "nested list element": ("cfg.pools[1].taints[1] = 'x'", AT + READ_ONLY),
    "library module nested": ("require('util').limits.gpus = 8", AT + READ_ONLY),
    "rawset": ("rawset(cfg, 'pools', nil)", AT + "attempt to call a nil value (global 'rawset')"),
    "table.insert": ("table.insert(cfg.pools, {})", READ_ONLY),
    "table.insert at": ("table.insert(cfg.guardrails.required_labels, 1, 'x')", READ_ONLY),
    "table.remove": ("table.remove(cfg.pools)", READ_ONLY),
    "table.remove first": ("table.remove(cfg.guardrails.required_labels, 1)", READ_ONLY),
    "table.sort": ("table.sort(cfg.guardrails.required_labels)", READ_ONLY),
    "setmetatable": ("setmetatable(cfg.pools, nil)", "cannot change a protected metatable"),
    "setmetatable nested": ("setmetatable(cfg.pools[1], {})", "cannot change a protected metatable"),
}


@pytest.mark.parametrize("name", sorted(SHARED_WRITES))
def test_each_way_of_writing_shared_configuration_fails(engine, name):
    code, message = SHARED_WRITES[name]
    engine.configure(WALK_CONFIG)
    engine.module("util", "return { limits = { gpus = 4 } }")
    engine.policy("10-write.lua", """
return { name = "write", validate = function(req, pod, cfg)
  %s
end }
""" % code)
    engine.policy("20-check.lua", """
return { name = "check", validate = function(req, pod, cfg)
  req:warn(table.concat({ cfg.pools[1].name, #cfg.pools, #cfg.pools[1].taints,
    table.concat(cfg.guardrails.required_labels, ","), tostring(cfg.extra),
    require("util").limits.gpus }, " "))
end }
""")
    v = engine.run(review(pod()), phases="validate", repeat=2)
    assert v["allowed"] is False
    assert v["message"] == "write: policy error: " + message
    assert v["warnings"] == ["check: a100 2 2 team,cost-center nil 4"]


def test_config_check_fails_the_load_with_the_key_path(engine):
    engine.configure("pools:\n  - name: a100\n    model: A200\n")
    engine.policy("10-check.lua", """
return { name = "pools", check = function(cfg)
  for i, p in ipairs(cfg.pools) do
    if p.model ~= "A100-80GB" then error(("pools[%d].model: unknown GPU model %q"):format(i, p.model), 0) end
  end
end, validate = function() end }
""")
    out = engine.run(review(pod()), expect_rc=1)
    assert out.strip() == ('policy pools: configuration check failed: pools[1].model: unknown '
                           'GPU model "A200"')


@pytest.mark.parametrize("text,message", [
    ("return 42", "10-p.lua: must return a table (got number)"),
    ("return {}", "10-p.lua: name must be lowercase letters, digits and '-' (at most 63), got \"\""),
    ("return { name = 'Bad_Name', validate = function() end }",
     "10-p.lua: name must be lowercase letters, digits and '-' (at most 63), got \"Bad_Name\""),
    ("return { name = 'p' }", "policy p: has neither mutate nor validate"),
    ("return { name = 'p', mode = 'loud', validate = function() end }",
     "policy p: mode must be enforce, warn or audit"),
    ("return { name = 'p', match = { kind = { 'Pod' } }, validate = function() end }",
     "policy p: match.kind: unknown key (kinds, operations, namespaces, labels)"),
    ("syntax error here", "policies/10-p.lua:1: syntax error near 'error'"),
])
def test_bad_policy_files_are_refused_with_a_clear_message(engine, text, message):
    engine.policy("10-p.lua", text)
    assert engine.run(review(pod()), expect_rc=1).strip() == message


@pytest.mark.parametrize("yaml_text,message", [
    ("engine:\n  memory: lots\n", "engine.memory: must be a size such as 32Mi (at least 1Ki)"),
    ("engine:\n  timeout: 5\n", "engine.timeout: must be a duration such as 2s or 500ms"),
    ("engine:\n  speed: 1\n", "engine.speed: unknown key (known: instructions, memory, timeout)"),
    ("enforcement:\n  mode: loud\n", "enforcement.mode: must be enforce, warn or audit"),
    ("enforcement:\n  policies:\n    x:\n      failure: maybe\n",
     "enforcement.policies.x.failure: must be deny or allow"),
    ("[1, 2]\n", "the configuration must be a mapping"),
    ("a: [\n", "did not find expected node content"),
])
def test_bad_config_is_refused_with_the_key_path(engine, yaml_text, message):
    engine.policy("10-noop.lua", NOOP)
    engine.configure(yaml_text)
    out = engine.run(review(pod()), expect_rc=1)
    assert message in out and str(engine.config) in out


# ---- messages for the API server --------------------------------------------

def test_warnings_are_sanitized_to_api_server_limits(engine):
    engine.policy("10-warn.lua", """
return { name = "w", validate = function(req)
  req:warn("line one\\nline two\\tand a bell\\a")
  req:warn(string.rep("x", 300))
  req:warn("dup") req:warn("dup")
  for i = 1, 100 do req:warn(("filler %03d "):format(i) .. string.rep("y", 90)) end
end }
""")
    w = engine.run(review(pod()), phases="validate")["warnings"]
    assert w[0] == "w: line one line two and a bell "
    assert w[1] == "w: " + "x" * 116 + "\u2026" and len(w[1]) == 120
    assert w.count("w: dup") == 1
    assert all(len(x) <= 120 and not any(ord(c) < 32 for c in x) for x in w)
    assert sum(len(x.encode()) for x in w) < 4096
    assert re.fullmatch(r"gpuguard: \d+ more warnings left out", w[-1])


# ---- reports past their limits (issue 35, finding 13) ---------------------

def test_a_hundred_thousand_warnings_keep_a_hundred_and_say_how_many_more(engine):
    engine.policy("10-many.lua", """
return { name = "many", validate = function(req)
  for i = 1, 100000 do req:warn(("warning %06d"):format(i)) end
end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["allowed"] is True
    assert v["warnings"] == (["many: warning %06d" % i for i in range(1, 101)] +
                             ["gpuguard: 99900 more warnings left out"])
    assert v["fired"] == ["many"]


def test_a_long_warning_is_cut_to_what_the_api_server_shows(engine):
    engine.policy("10-long.lua", """
return { name = "long", validate = function(req)
  req:warn(string.rep("\\u{e9}", 1024 * 1024))
end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["warnings"] == ["long: " + "\u00e9" * 113 + "\u2026"]


def test_a_twenty_megabyte_denial_is_cut_with_a_note(engine):
    engine.configure("engine:\n  memory: 64Mi\n")
    engine.policy("10-big.lua", """
return { name = "big", validate = function(req)
  req:deny(string.rep("x", 20 * 1024 * 1024))
end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["allowed"] is False
    assert v["message"] == "big: " + "x" * 4096 + "\u2026 (20967424 more bytes)"


def test_an_error_of_twenty_megabytes_is_cut_in_the_log_too(engine):
    engine.configure("engine:\n  memory: 64Mi\n")
    engine.policy("10-big.lua", """
return { name = "big", validate = function(req) error(string.rep("x", 20 * 1024 * 1024), 0) end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["message"] == "big: policy error: " + "x" * 255
    failed = [json.loads(line) for line in engine.stderr.splitlines()
              if '"policy failed"' in line]
    assert failed[0]["traceback"].startswith("x" * 4096 + "\u2026 (20967424 more bytes)\n"
                                             "stack traceback:\n")
    assert len(failed[0]["traceback"]) < 8192


def test_a_denial_is_cut_where_a_character_ends(engine):
    engine.policy("10-big.lua", """
return { name = "big", validate = function(req) req:deny("xx" .. string.rep("\\u{20ac}", 2000)) end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["message"] == "big: xx" + "\u20ac" * 1364 + "\u2026 (1908 more bytes)"


def test_a_hundred_thousand_denials_keep_64_kib_and_say_how_many_more(engine):
    engine.policy("10-many.lua", """
return { name = "many", validate = function(req)
  for i = 1, 100000 do req:deny(("no %06d"):format(i)) end
end }
""")
    engine.policy("20-more.lua", """
return { name = "more", validate = function(req) req:deny("and me") end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["allowed"] is False
    lines = v["message"].split("\n")
    assert lines[:-1] == ["many: no %06d" % i for i in range(1, 4097)]
    assert lines[-1] == "gpuguard: 95905 more denials left out"
    assert len(v["message"].encode()) < 64 * 1024 + 64


def test_denials_left_out_in_warn_mode_are_warnings_left_out(engine):
    engine.policy("10-many.lua", """
return { name = "many", mode = "warn", validate = function(req)
  for i = 1, 100000 do req:deny(("no %06d"):format(i)) end
end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["allowed"] is True
    assert v["warnings"] == (["many: no %06d" % i for i in range(1, 101)] +
                             ["gpuguard: 99900 more warnings left out"])


def test_a_hundred_thousand_audit_annotations_keep_32_and_say_how_many_more(engine):
    engine.policy("10-many.lua", """
return { name = "many", validate = function(req)
  for i = 1, 100000 do req:audit(("k%06d"):format(i), "v") end
  req:audit("k000001", string.rep("y", 1024 * 1024))
  req:audit(string.rep("z", 1024 * 1024), "long key")
end }
""")
    v = engine.run(review(pod()), phases="validate")
    audit = v["audit"]
    kept = {"many.k%06d" % i: "v" for i in range(1, 33)}
    kept["many.k000001"] = "y" * 4096 + "\u2026 (1044480 more bytes)"
    assert {k: audit[k] for k in audit if k.startswith("many.")} == kept
    assert audit["audit-left-out"] == "99969"
    assert audit["verdict"] == "allowed" and audit["policies"] == "many (enforce)"


def test_reports_past_the_limits_of_mutate_and_validate_add_up(engine):
    engine.policy("10-both.lua", """
return { name = "both",
  mutate = function(req) for i = 1, 80 do req:warn(("m%03d"):format(i)) end end,
  validate = function(req) for i = 1, 80 do req:warn(("v%03d"):format(i)) end end }
""")
    w = engine.run(review(pod()), phases="both")["warnings"]
    assert w == (["both: m%03d" % i for i in range(1, 81)] +
                 ["both: v%03d" % i for i in range(1, 21)] +
                 ["gpuguard: 60 more warnings left out"])


def test_what_a_call_reports_counts_against_the_memory_budget(engine):
    """32 audit values of 4 KiB hold some 130 KiB while the call runs: a VM with 64 KiB to
    spare for the same call without them is stopped by them."""
    engine.policy("10-r.lua", """
return { name = "r", validate = function(req)
  local v = string.rep("y", 4096)
  for i = 1, 32 do
    local k = ("k%02d"):format(i)
    if req.namespace == "report" then req:audit(k, v) end
  end
  req:warn("done")
end }
""")

    def run(memory, namespace):
        engine.configure(f"engine:\n  memory: {memory}\n")
        return engine.run(review(pod(), namespace=namespace), phases="validate", expect_rc=None)

    def fits(memory):
        v = run(memory, "quiet")
        return isinstance(v, dict) and v["warnings"] == ["r: done"]

    low, high = 1024, 4 << 20  # the least memory the call needs without reports, to 1 KiB
    assert fits(high)
    while high - low > 1024:
        mid = (low + high) // 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    assert fits(high + 65536)
    v = run(high + 65536, "report")
    assert v["allowed"] is False
    assert v["message"] == "r: policy stopped: memory limit exceeded"
    assert run(high + 262144, "report")["warnings"] == ["r: done"]


def test_audit_keys_are_valid_qualified_names(engine):
    engine.policy("10-audit.lua", """
return { name = "a", validate = function(req)
  req:audit("sharing mode", "mig")
  req:audit("_x_", "1")
  req:audit(string.rep("k", 100), "long")
end }
""")
    audit = engine.run(review(pod()), phases="validate")["audit"]
    import re
    for key in audit:
        assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", key) and len(key) <= 63
    assert audit["a.sharing-mode"] == "mig"
    assert audit["a._x"] == "1"


def test_quantity_and_constructors_from_lua(engine):
    engine.policy("10-q.lua", """
local gg = require "gpuguard"
return { name = "q", validate = function(req)
  local m = gg.quantity("18Gi")
  local bad, msg = gg.quantity("1.1.M")
  req:warn(table.concat({ m, gg.format_quantity(1536 * 1024 * 1024 * 1000, "BinarySI"),
    gg.format_quantity(1500), tostring(bad), msg,
    tostring(gg.is_array(gg.array())), tostring(gg.is_object(gg.object())) }, " | "))
end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["warnings"] == ['q: 19327352832000 | 1536Mi | 1500m | nil | invalid quantity '
                             '"1.1.M": unexpected \'.\' at offset 3 | true | true']


def test_gpuguard_keys_are_the_c_code_keys_and_read_only(engine):
    engine.policy("10-keys.lua", """
local gg = require "gpuguard"
return { name = "keys", validate = function(req)
  local names = {}
  for name, key in pairs(gg.keys) do
    names[#names + 1] = name .. "=" .. key
  end
  table.sort(names)
  for _, line in ipairs(names) do
    req:warn(line)
  end
  gg.keys.charge = "mine"
end }
""")
    v = engine.run(review(pod()), phases="validate")
    assert v["warnings"] == ["keys: charge=gpuguard.io/charge", "keys: decision=gpuguard.io/decision",
                             "keys: kai_queue=kai.scheduler/queue",
                             "keys: kueue_priority=kueue.x-k8s.io/priority-class",
                             "keys: kueue_queue=kueue.x-k8s.io/queue-name",
                             "keys: pool=gpuguard.io/pool",
                             "keys: workload_class=gpuguard.io/workload-class"]
    assert "attempt to modify a read-only table" in v["message"]


def test_print_logs_its_arguments_tab_separated(engine):
    engine.policy("10-print.lua", """
return { name = "p", validate = function(req) print("pod", 1, nil, true) end }
""")
    engine.run(review(pod()), phases="validate")
    lines = [json.loads(line) for line in engine.stderr.splitlines() if line.startswith("{")]
    assert [line["msg"] for line in lines if line["level"] == "info"] == ["pod\t1\tnil\ttrue"]
