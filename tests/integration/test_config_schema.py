"""The configuration's one schema (webhook/engine/cfgschema.c) and what is read from it.

- `gpuguard config schema` prints deploy/gpuguard.schema.json exactly, and that JSON Schema takes
  every configuration of the repository and refuses the typos the server refuses, so an editor
  says what the server would say.
- `gpuguard config check FILE` refuses a key nothing reads and a value a policy refuses (exit 1),
  and prints a good file with the defaults of the keys it leaves out.
- Those defaults are the readers' own: every policy suite of the repository passes with its
  configuration replaced by the effective one `config check` printed.
"""

import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent.parent
SHIPPED = REPO / "deploy" / "gpuguard.yaml"
SCHEMA = REPO / "deploy" / "gpuguard.schema.json"
SUITES = sorted((REPO / "tests" / "policies").rglob("*.suite.yaml"))
FILE_KEYS = ("config", "policies", "lua", "cluster_state", "usage")


def repo_configs():
    tests = REPO / "tests"
    return [SHIPPED, tests / "e2e" / "fleet.yaml",
            *sorted((tests / "policies").rglob("configs/*.yaml")),
            *sorted((tests / "policies").rglob("slots/*.yaml"))]


def config_check(binary, path, *flags):
    return subprocess.run([binary, "config", "check", "--policies", str(REPO / "policies"),
                           "--lua", str(REPO / "lua"), *flags, str(path)],
                          capture_output=True, text=True, timeout=60)


def with_line(tmp_path, line, replacement):
    text = SHIPPED.read_text()
    assert text.count("\n" + line + "\n") == 1, line
    path = tmp_path / "gpuguard.yaml"
    path.write_text(text.replace("\n" + line + "\n", "\n" + replacement + "\n"))
    return path


def test_the_shipped_json_schema_is_the_one_the_binary_prints(binary):
    out = subprocess.run([binary, "config", "schema"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout == SCHEMA.read_text(), \
        "deploy/gpuguard.schema.json is stale: build/gpuguard config schema > " \
        "deploy/gpuguard.schema.json"
    jsonschema.Draft7Validator.check_schema(json.loads(out.stdout))


@pytest.mark.parametrize("path", repo_configs(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_configuration_of_the_repository_fits_the_schema(path):
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    errors = [f"{list(e.absolute_path)}: {e.message}"
              for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []


# One line of deploy/gpuguard.yaml changed: what `config check` says, exit 1, and that the
# JSON Schema refuses the same key (at the same path, lists counted from 0 there).
TYPOS = [
    ("quotas:                 # in GPU-equivalents: a MIG 1g slice of 7 is 0.143, a 0.25 share 0.25",
     "quota:", "quota: unknown key; did you mean quotas?", ["quota"]),
    ("    sharing: time-slicing", "    Sharing: time-slicing",
     "pools[3].Sharing: unknown key; did you mean sharing?", ["pools", 2, "Sharing"]),
    ("      - {key: nvidia.com/gpu, value: l4-infer, effect: NoSchedule}",
     "      - {key: nvidia.com/gpu, value: l4-infer, effects: NoSchedule}",
     "pools[4].taints[1].effects: unknown key; did you mean effect?",
     ["pools", 3, "taints", 0, "effects"]),
    ("  memory: 32Mi          # Lua memory per worker VM", "  memroy: 32Mi",
     "engine.memroy: unknown key; did you mean memory?", ["engine", "memroy"]),
    ("  inventory_not_ready: allow   # allow (with a warning) | deny",
     "  inventory_not_ready: allow\n  namespace: {x: 1}",
     "quotas.namespace: unknown key; did you mean namespaces?", ["quotas", "namespace"]),
    ("    groups: [system:nodes]", "    group: [system:nodes]",
     "guardrails.bind_allowed.group: unknown key; did you mean groups?",
     ["guardrails", "bind_allowed", "group"]),
    ("  mode: mutate", "  mode: mutate\nenforcement: {policies: {gpu-quota: {modes: warn}}}",
     "enforcement.policies.gpu-quota.modes: unknown key; did you mean mode?",
     ["enforcement", "policies", "gpu-quota", "modes"]),
    ("  mode: mutate", "  mode: mutate\ngpu_models: [{name: X-48GB, memory: 48Gi, memroy: 1}]",
     "gpu_models[1].memroy: unknown key; did you mean memory?", ["gpu_models", 0, "memroy"]),
    ("  mode: mutate",
     "  mode: mutate\nqueues: {system: kueue, namespaces: {a: {queues: [x]}}}",
     "queues.namespaces.a.queues: unknown key; did you mean queue?",
     ["queues", "namespaces", "a", "queues"]),
]


@pytest.mark.parametrize("line,typo,message,where", TYPOS, ids=[t[2].split(":")[0] for t in TYPOS])
def test_config_check_and_the_schema_refuse_a_typo(binary, tmp_path, line, typo, message, where):
    path = with_line(tmp_path, line, typo)
    out = config_check(binary, path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout == ""
    assert out.stderr.startswith(f"gpuguard config check: {path}: {message} (known: "), out.stderr
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    errors = list(validator.iter_errors(yaml.safe_load(path.read_text())))
    assert [list(e.absolute_path) for e in errors] == [where[:-1]], errors
    assert repr(where[-1]) in errors[0].message


def test_config_check_refuses_a_value_a_policy_refuses(binary, tmp_path):
    path = with_line(tmp_path, "  non_gpu_pods: deny    # pods without a GPU that tolerate a GPU "
                     "taint or select GPU nodes", "  non_gpu_pods: maybe")
    out = config_check(binary, path)
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == ("gpuguard config check: policy gpu-placement: configuration check "
                          "failed: placement.non_gpu_pods: must be deny or warn\n")


def test_config_check_prints_the_defaults_of_what_is_left_out(binary, tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text("pools:\n"
                    "  - {name: l4, model: L4, sharing: exclusive}\n"
                    "quotas: {default: 2}\n"
                    "placement: {spot: {taint: {key: spot}}}\n")
    out = config_check(binary, path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ("pools:\n"
                          "- name: l4\n"
                          "  model: L4\n"
                          "  sharing: exclusive\n"
                          "  cost: 1\n"
                          "quotas:\n"
                          "  default: 2\n"
                          "  inventory_not_ready: allow\n"
                          "placement:\n"
                          "  spot:\n"
                          "    taint:\n"
                          "      key: spot\n"
                          "    weight: 50\n"
                          "  non_gpu_pods: deny\n")
    out = config_check(binary, path, "-o", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["quotas"] == {"default": 2, "inventory_not_ready": "allow"}


def test_a_section_of_ones_own_policy_is_known_to_config_check(binary, tmp_path):
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "teams.lua").write_text(
        'return { name = "teams", config = { "teams" }, match = { kinds = { "Pod" } },\n'
        '         validate = function() end }\n')
    path = tmp_path / "c.yaml"
    path.write_text("teams: {a: 1}\n")
    run = ["config", "check", "--lua", str(REPO / "lua"), str(path)]
    out = subprocess.run([binary, *run, "--policies", str(policies)], capture_output=True,
                         text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, "teams:\n  a: 1\n"), out.stderr
    out = subprocess.run([binary, *run, "--policies", str(REPO / "policies")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert f"{path}: teams: unknown key (known: audit, classes, " in out.stderr


@pytest.mark.parametrize("args,message", [
    (["config"], "gpuguard config: no subcommand"),
    (["config", "lint"], "gpuguard config: unknown subcommand"),
    (["config", "check"], "no FILE given"),
    (["config", "check", "a.yaml", "b.yaml"], "gpuguard config check: one FILE, got 2"),
    (["config", "check", "-o", "xml", "a.yaml"], "-o must be yaml or json, got \"xml\""),
    (["config", "schema", "x"], "gpuguard config schema: takes no arguments"),
])
def test_config_usage_errors_exit_2(binary, args, message):
    out = subprocess.run([binary, *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert message in out.stderr


def test_config_check_of_a_missing_file_exits_1(binary, tmp_path):
    out = config_check(binary, tmp_path / "nowhere.yaml")
    assert out.returncode == 1
    assert f"{tmp_path / 'nowhere.yaml'}: cannot open" in out.stderr


def effective_suite(binary, suite_path, tmp_path):
    """The suite rewritten into tmp_path with its configuration replaced by the effective one."""
    suite = yaml.safe_load(suite_path.read_text())
    here = suite_path.parent
    for key in FILE_KEYS:
        if key in suite:
            suite[key] = str(here / suite[key])
    for case in suite["cases"]:
        if "manifest" in case:
            case["manifest"] = str(here / case["manifest"])
    if "config" in suite:
        out = config_check(binary, suite["config"])
        assert out.returncode == 0, out.stderr
        effective = tmp_path / "effective.yaml"
        effective.write_text(out.stdout)
        suite["config"] = str(effective)
    path = tmp_path / suite_path.name
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


@pytest.mark.parametrize("suite_path", SUITES, ids=lambda p: str(p.relative_to(REPO / "tests")))
def test_every_suite_passes_with_its_effective_configuration(binary, tmp_path, suite_path):
    if "config:" not in suite_path.read_text():
        pytest.skip("the suite has no configuration of its own")
    path = effective_suite(binary, suite_path, tmp_path)
    out = subprocess.run([binary, "test", "--policies", str(REPO / "policies"), "--lua",
                          str(REPO / "lua"), str(path)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr


@pytest.mark.parametrize("audit,message", [
    ("{interval: 5s}", "audit.interval: must be a duration of at least 10s, such as 10m"),
    ("{interval: soon}", "audit.interval: must be a duration of at least 10s, such as 10m"),
    ("{report_api: wgpolicyk8s.io/v1beta1}",
     "audit.report_api: must be wgpolicyk8s.io/v1alpha2 or openreports.io/v1alpha1"),
    ("{rate: 9}", "audit.rate: must be an integer from 10 to 100000"),
    ("{enabled: 'yes'}", "audit.enabled: must be true or false"),
    ("{intervall: 10m}", "audit.intervall: unknown key; did you mean interval?"),
])
def test_a_wrong_audit_section_is_refused_with_its_key(binary, tmp_path, audit, message):
    path = tmp_path / "c.yaml"
    path.write_text(f"audit: {audit}\n")
    out = config_check(binary, path)
    assert out.returncode == 1
    assert message in out.stderr, out.stderr


def test_the_audit_section_s_defaults(binary, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("audit: {rate: 200}\n")
    out = config_check(binary, path)
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["audit"] == {
        "enabled": True, "interval": "10m", "report_api": "wgpolicyk8s.io/v1alpha2", "rate": 200}
