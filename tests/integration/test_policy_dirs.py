"""Several policy directories (`--policies A --policies B`) and `policies.disabled`: the files
of every directory run in one name order, a file name or a policy name in two of them is
refused, a disabled policy is never evaluated, a user's file takes a disabled policy's name,
and the server reloads when any of the directories changes.  Through `gpuguard check`,
`gpuguard test` and `gpuguard serve`, which load policies with the same engine code."""

import base64
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from cli_policy import GPUS_LUA, gpu_pod
from conftest import start_server, wait_for
from test_engine_server import write_atomically
from test_server import review

REPO = Path(__file__).resolve().parent.parent.parent

# A policy that warns with its own name, so that the order the policies ran in shows.
WARN = """
return {
  name = "%s",
  validate = function(req, pod) req:warn("ran") end,
}
"""

DENY = """
return {
  name = "%s",
  validate = function(req, pod) req:deny("no pods today") end,
}
"""

# A pod that the shipped gpu-quota denies under deploy/gpuguard.yaml (max_per_pod: 8).
BIG = gpu_pod("big", gpus=16, namespace="team-a", labels={"team": "vision"})
QUOTA_DENIAL = "gpu-quota: the pod needs 16 GPUs, more than the 8 allowed per pod; ask for less"

# A user's gpu-quota in place of the shipped one.
MY_QUOTA = GPUS_LUA + r'''
return {
  name = "gpu-quota",
  validate = function(req, pod)
    if gpus(pod) > 8 then req:warn(("%d GPUs: tell the platform team"):format(gpus(pod))) end
  end,
}
'''


class Dirs:
    """Policy directories under tmp_path, and gpuguard check over them (run in tmp_path, so
    that messages name the directories as given: relative)."""

    def __init__(self, binary, tmp_path):
        self.binary = binary
        self.tmp = tmp_path
        (tmp_path / "lua").mkdir()
        (tmp_path / "pod.yaml").write_text(yaml.safe_dump(gpu_pod("p", gpus=0)))

    def policy(self, directory, filename, text):
        path = self.tmp / directory / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return self

    def configure(self, text):
        (self.tmp / "gpuguard.yaml").write_text(text)
        return ["--config", "gpuguard.yaml"]

    def check(self, *args, dirs=("a", "b"), lua="lua"):
        """gpuguard check -o json over dirs (made when missing); (records, completed process)."""
        for d in dirs:
            (self.tmp / d).mkdir(parents=True, exist_ok=True)
        flags = [f for d in dirs for f in ("--policies", str(d))] + ["--lua", str(lua)]
        if "--config" not in args:
            flags.append("--no-config")
        out = subprocess.run([self.binary, "check", "-o", "json", *flags, *map(str, args)],
                             capture_output=True, text=True, timeout=60, cwd=self.tmp)
        records = [json.loads(line) for line in out.stdout.splitlines()]
        return records, out


@pytest.fixture
def dirs(binary, tmp_path):
    return Dirs(binary, tmp_path)


def load_error(out):
    """The message of `gpuguard check: cannot load the policies: ...` (exit 2)."""
    assert out.returncode == 2, out.stderr
    prefix = "gpuguard check: cannot load the policies: "
    assert out.stderr.startswith(prefix) and out.stderr.endswith("\n"), out.stderr
    return out.stderr[len(prefix):-1]


def test_the_files_of_two_directories_run_in_one_name_order(dirs):
    dirs.policy("a", "10-one.lua", WARN % "one").policy("a", "30-three.lua", WARN % "three")
    dirs.policy("b", "05-zero.lua", WARN % "zero").policy("b", "20-two.lua", WARN % "two")
    records, out = dirs.check("pod.yaml")
    assert out.returncode == 0, out.stderr
    assert records[0]["policies"] == ["zero", "one", "two", "three"]
    assert records[0]["warnings"] == ["zero: ran", "one: ran", "two: ran", "three: ran"]


def test_the_same_file_name_in_two_directories_is_refused_naming_both(dirs):
    dirs.policy("a", "10-one.lua", WARN % "one").policy("b/", "10-one.lua", WARN % "other")
    _, out = dirs.check("pod.yaml", dirs=("a", "b/"))
    assert load_error(out) == ("a/10-one.lua and b/10-one.lua: the same file name in two policy "
                               "directories; rename one")


def test_the_same_policy_name_in_two_directories_is_refused_naming_both(dirs):
    dirs.policy("a", "10-one.lua", WARN % "one").policy("b", "20-again.lua", WARN % "one")
    _, out = dirs.check("pod.yaml")
    assert load_error(out) == ("a/10-one.lua and b/20-again.lua both name a policy one "
                               "(policies.disabled turns off the one of the earlier directory)")


def test_an_error_names_the_directory_the_file_is_in(dirs):
    dirs.policy("a", "20-bad.lua", "syntax error here").policy("b", "10-one.lua", WARN % "one")
    _, out = dirs.check("pod.yaml")
    assert load_error(out) == "a/20-bad.lua:1: syntax error near 'error'"


def test_a_directory_that_cannot_be_read_is_named(dirs):
    dirs.policy("a", "10-one.lua", WARN % "one")
    out = subprocess.run([dirs.binary, "check", "--no-config", "--policies", "nowhere",
                          "--policies", "a", "--lua", "lua", "pod.yaml"],
                         capture_output=True, text=True, timeout=60, cwd=dirs.tmp)
    assert load_error(out) == "nowhere: cannot read the directory"


def test_a_disabled_policy_is_not_evaluated(dirs):
    dirs.policy("a", "10-one.lua", WARN % "one").policy("b", "20-deny.lua", DENY % "deny-all")
    records, out = dirs.check("pod.yaml")
    assert out.returncode == 1 and records[0]["message"] == "deny-all: no pods today"
    config = dirs.configure("policies:\n  disabled: [deny-all]\n")
    records, out = dirs.check(*config, "pod.yaml")
    assert out.returncode == 0, out.stderr
    assert records[0]["allowed"] is True and records[0]["policies"] == ["one"]


def test_the_settings_of_a_disabled_policy_may_stay(dirs):
    """Turning a policy off takes one line: its own section is no unknown key."""
    dirs.policy("a", "10-teams.lua", """
return { name = "teams", config = { "teams" }, validate = function(req, pod) req:deny("no") end }
""")
    config = dirs.configure("teams: {team-a: vision}\npolicies:\n  disabled: [teams]\n")
    records, out = dirs.check(*config, "pod.yaml")
    assert out.returncode == 0, out.stderr
    assert records[0]["allowed"] is True and records[0]["policies"] == []


@pytest.mark.parametrize("disabled,message", [
    ("[one, deny-al]", 'policies.disabled[2]: unknown policy "deny-al"; did you mean deny-all? '
                       "(known: deny-all, one)"),
    ("[20-deny]", 'policies.disabled[1]: unknown policy "20-deny" (known: deny-all, one)'),
    ("[7]", "policies.disabled[1]: must be a policy name (its name field)"),
    ("deny-all", "policies.disabled: must be a list of policy names"),
])
def test_a_disabled_name_no_policy_declares_is_refused_with_the_key_path(dirs, disabled,
                                                                          message):
    dirs.policy("a", "10-one.lua", WARN % "one").policy("b", "20-deny.lua", DENY % "deny-all")
    config = dirs.configure(f"policies:\n  disabled: {disabled}\n")
    _, out = dirs.check(*config, "pod.yaml")
    assert load_error(out) == f"gpuguard.yaml: {message}"


def test_a_misspelt_key_of_the_policies_section_is_refused(dirs):
    dirs.policy("a", "10-one.lua", WARN % "one")
    config = dirs.configure("policies:\n  disable: [one]\n")
    _, out = dirs.check(*config, "pod.yaml")
    assert load_error(out) == ("gpuguard.yaml: policies.disable: unknown key; did you mean "
                               "disabled? (known: disabled)")


def test_a_disabled_name_turns_off_the_policy_of_the_earlier_directory(dirs):
    """The later directory's file takes the name, even when its file name sorts first."""
    dirs.policy("a", "20-deny.lua", DENY % "gate").policy("b", "10-mine.lua", WARN % "gate")
    config = dirs.configure("policies:\n  disabled: [gate]\n")
    records, out = dirs.check(*config, "pod.yaml")
    assert out.returncode == 0, out.stderr
    assert records[0]["warnings"] == ["gate: ran"]


def test_a_shipped_policy_is_replaced_by_disabling_it_and_declaring_its_name(dirs):
    (dirs.tmp / "big.yaml").write_text(yaml.safe_dump(BIG))
    (dirs.tmp / "shipped").symlink_to(REPO / "policies")  # short paths in the messages
    shipped = ["--config", REPO / "deploy" / "gpuguard.yaml"]
    records, out = dirs.check(*shipped, "big.yaml", dirs=("shipped",), lua=REPO / "lua")
    assert out.returncode == 1 and records[0]["message"] == QUOTA_DENIAL
    dirs.policy("mine", "45-my-quota.lua", MY_QUOTA)
    base = (REPO / "deploy" / "gpuguard.yaml").read_text()
    _, out = dirs.check(*shipped, "big.yaml", dirs=("shipped", "mine"), lua=REPO / "lua")
    assert load_error(out) == ("shipped/40-gpu-quota.lua and mine/45-my-quota.lua both name a "
                               "policy gpu-quota (policies.disabled turns off the one of the "
                               "earlier directory)")
    config = dirs.configure(base + "\npolicies:\n  disabled: [gpu-quota]\n")
    records, out = dirs.check(*config, "big.yaml", dirs=("shipped", "mine"), lua=REPO / "lua")
    assert out.returncode == 0, out.stderr
    assert records[0]["allowed"] is True
    assert "gpu-quota: 16 GPUs: tell the platform team" in records[0]["warnings"]
    assert QUOTA_DENIAL not in json.dumps(records)


@pytest.mark.parametrize("command", ["check", "test", "serve"])
def test_more_than_16_directories_are_a_usage_error(binary, tmp_path, command):
    flags = [f for i in range(17) for f in ("--policies", f"p{i}")]
    out = subprocess.run([binary, command, *flags, "x"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr == (f"gpuguard {command}: --policies: at most 16 directories\n"
                          f"run 'gpuguard {command} --help' for the flags\n")


@pytest.mark.parametrize("command", ["check", "test", "serve", "config check"])
def test_help_says_the_flag_repeats(binary, command):
    out = subprocess.run([binary, *command.split(), "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "--policies DIR" in out.stdout
    assert "policy directory, repeatable up to 16 times:" in out.stdout
    assert "their files run in one name order [./policies]" in out.stdout


def test_gpuguard_test_takes_several_directories_and_honours_disabled(dirs):
    dirs.policy("a", "10-one.lua", WARN % "one").policy("b", "20-deny.lua", DENY % "deny-all")
    suite = {"name": "dirs", "cases": [{"name": "the pod", "manifest": "pod.yaml",
                                        "expect": {"allowed": True, "warnings": ["one: ran"]}}]}
    (dirs.tmp / "dirs.suite.yaml").write_text(yaml.safe_dump(suite))
    cmd = [dirs.binary, "test", "--policies", "a", "--policies", "b", "--lua", "lua"]
    out = subprocess.run(cmd + ["--no-config", "dirs.suite.yaml"], capture_output=True,
                         text=True, timeout=60, cwd=dirs.tmp)
    assert out.returncode == 1 and "FAIL dirs: the pod" in out.stdout
    dirs.configure("policies:\n  disabled: [deny-all]\n")
    out = subprocess.run(cmd + ["--config", "gpuguard.yaml", "dirs.suite.yaml"],
                         capture_output=True, text=True, timeout=60, cwd=dirs.tmp)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == "PASS dirs: the pod\n1 passed, 0 failed\n"


# ---- the server -----------------------------------------------------------------------

STAMP = """
local gg = require "gpuguard"
return {
  name = "%s",
  mutate = function(req, pod)
    if pod.metadata.labels == nil then pod.metadata.labels = gg.object() end
    pod.metadata.labels["%s"] = "yes"
  end,
}
"""


@pytest.fixture
def two_dir_server(binary, certs, tmp_path):
    first, second, lua = tmp_path / "first", tmp_path / "second", tmp_path / "lua"
    for d in (first, second, lua):
        d.mkdir()
    (first / "10-first.lua").write_text(STAMP % ("first", "first"))
    (first / "20-closed.lua").write_text(DENY % "closed")
    config = tmp_path / "gpuguard.yaml"
    config.write_text("policies:\n  disabled: [closed]\n")
    srv = start_server(binary, certs, tmp_path, "--policies", str(first), "--policies",
                       str(second), "--lua", str(lua), "--config", str(config))
    srv.second = second
    yield srv
    if srv.proc.poll() is None:
        assert srv.stop() == 0


def answer(srv):
    status, _, got = srv.connect().review(review(), path="/mutate")
    assert status == 200
    resp = got["response"]
    patch = json.loads(base64.b64decode(resp["patch"])) if "patch" in resp else []
    return resp["allowed"], patch


def test_serve_lists_the_enabled_policies_of_every_directory(two_dir_server):
    serving = [r for r in two_dir_server.log_lines() if r.get("msg") == "serving"]
    assert serving[-1]["policies"] == ["first"]
    assert answer(two_dir_server) == (True, [
        {"op": "add", "path": "/metadata/labels", "value": {"first": "yes"}}])


def test_serve_reloads_when_a_file_is_added_to_the_second_directory(two_dir_server):
    write_atomically(two_dir_server.second / "05-second.lua", STAMP % ("second", "second"))
    want = (True, [{"op": "add", "path": "/metadata/labels",
                    "value": {"second": "yes", "first": "yes"}}])
    assert wait_for(lambda: answer(two_dir_server) == want)
    assert two_dir_server.ops("/readyz") == (200, "ready: policy generation 2, last reload: ok\n"
                                                  "inventory: off\n")
    # A file of the first directory's name in the second: refused, the last good set serves.
    write_atomically(two_dir_server.second / "10-first.lua", STAMP % ("other", "other"))
    assert wait_for(lambda: "same file name" in two_dir_server.ops("/readyz")[1])
    refused = [r for r in two_dir_server.log_lines()
               if r.get("msg", "").startswith("reload refused")]
    first = two_dir_server.second.parent / "first"
    want_error = (f"{first}/10-first.lua and {two_dir_server.second}/10-first.lua: the same "
                  "file name in two policy directories; rename one")
    assert refused[-1]["error"] == want_error[:255]  # a message is at most 255 bytes
    assert answer(two_dir_server) == want
