"""Where a policy's Lua error is placed, in `gpuguard check`, `gpuguard test` and the server: the
file as --policies names it (the directory as given, joined with the file name, not made
absolute) and the policy's own line first, also when a library module (--lua) raised on its
behalf, then the library's position as Lua gave it:

    rules/10-p.lua:5: lua/helpers.lua:4: refused it

A message names a file as Lua names any: a path longer than 59 bytes is "..." and its last 56
(lua_name below).  An error with no policy line on the stack (the policy left through a tail
call), one the library placed at the policy's line itself (error(msg, 2)) and a budget's kill
read as they did."""

import json
import subprocess
import uuid

import pytest
import yaml

from conftest import REPO, start_server

# lua/helpers.lua: each function raises at a known line of its own.
HELPERS = """-- helpers that refuse
local M = {}
function M.refuse(what)
    error("refused " .. what)
end
function M.blame_caller(what)
    error("bad " .. what, 2)
end
function M.each(list, fn)
    for _, v in ipairs(list) do fn(v) end
end
function M.index(t)
    return t.missing.field
end
function M.spin()
    while true do end
end
return M
"""
# The policy: what it does depends on the pod's name; each call on a line of its own.
POLICY = """local h = require "helpers"
return { name = "p",
  validate = function(req, pod)
    local n = pod.metadata.name
    if n == "refuse" then h.refuse("it") end
    if n == "blame" then h.blame_caller("argument") end
    if n == "each" then h.each({ 1 }, function(v)
        h.refuse("item " .. v)
      end) end
    if n == "index" then h.index({}) end
    if n == "spin" then h.spin() end
    if n == "tail" then return h.refuse("in a tail call") end
    if n == "boom" then error("boom") end
  end }
"""
# pod name -> the denial's text after "p: ", {} standing for the policy file's name
MESSAGES = {
    "refuse": "policy error: {}:5: lua/helpers.lua:4: refused it",
    "each": "policy error: {}:8: lua/helpers.lua:4: refused item 1",
    "index": "policy error: {}:10: lua/helpers.lua:13: attempt to index a nil value "
             "(field 'missing')",
    "boom": "policy error: {}:13: boom",
    # As before: placed at the policy's line by the library, no policy frame, a kill.
    "blame": "policy error: {}:6: bad argument",
    "tail": "policy error: lua/helpers.lua:4: refused in a tail call",
    "spin": "policy stopped: instruction budget exhausted",
}


def lua_name(path):
    """path as Lua names a file in its messages (LUA_IDSIZE 60 with the NUL): whole up to 59
    bytes, else "..." and the last 56."""
    path = str(path)
    return path if len(path) <= 59 else "..." + path[-56:]


def pod(name):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


@pytest.fixture
def workdir(tmp_path):
    """tmp_path with rules/team/10-p.lua and lua/helpers.lua, the pods of MESSAGES in pods.yaml."""
    (tmp_path / "rules" / "team").mkdir(parents=True)
    (tmp_path / "rules" / "team" / "10-p.lua").write_text(POLICY)
    (tmp_path / "lua").mkdir()
    (tmp_path / "lua" / "helpers.lua").write_text(HELPERS)
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump_all([pod(n) for n in MESSAGES]))
    return tmp_path


def check_json(binary, cwd, policies, *args, expect_rc=3):
    out = subprocess.run([binary, "check", "--no-config", "--policies", str(policies), "--lua",
                          "lua", "-o", "json", *args], capture_output=True, text=True,
                         timeout=60, cwd=cwd)
    assert out.returncode == expect_rc, out.stdout + out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()], out.stderr


@pytest.mark.parametrize("given", ["rules/team", "rules/team/", "./rules/team", "absolute"])
def test_check_names_the_policy_file_as_given_and_its_line_first(binary, workdir, given):
    policies = workdir / "rules" / "team" if given == "absolute" else given
    name = lua_name(f"{str(policies).rstrip('/')}/10-p.lua")
    records, _ = check_json(binary, workdir, policies, "pods.yaml")
    got = {r["name"]: r["message"] for r in records if r["type"] == "template"}
    assert got == {n: "p: " + m.format(name) for n, m in MESSAGES.items()}
    assert all(r["policy_error"] for r in records if r["type"] == "template")


def test_a_library_helper_refusing_a_write_in_validate_names_the_policy_line(binary, tmp_path):
    """The shipped library: k8s.set_label in validate, where the object is read-only."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "20-label.lua").write_text(
        'local k8s = require "k8s"\n'
        'return { name = "label",\n'
        '  validate = function(req, pod)\n'
        '    local team = "a"\n'
        '    k8s.set_label(pod, "team", team)\n'
        '  end }\n')
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(pod("labelled")))
    out = subprocess.run([binary, "check", "--no-config", "--policies", "rules", "--lua",
                          str(REPO / "lua"), "-o", "json", "pod.yaml"], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 3, out.stdout + out.stderr
    message = json.loads(out.stdout.splitlines()[0])["message"]
    prefix = "label: policy error: rules/20-label.lua:5: lua/k8s.lua:"
    assert message.startswith(prefix), message
    line, rest = message[len(prefix):].split(": ", 1)
    assert line.isdigit() and "read-only" in rest, message


def test_a_library_failing_as_a_policy_loads_it_names_the_require(binary, workdir):
    (workdir / "lua" / "broken.lua").write_text("-- fails to load\nerror('broken at load')\n")
    (workdir / "rules" / "team" / "10-p.lua").write_text(
        'local h = require "helpers"\nlocal b = require "broken"\n' + POLICY)
    out = subprocess.run([binary, "check", "--no-config", "--policies", "rules/team", "--lua",
                          "lua", "pods.yaml"], capture_output=True, text=True, timeout=60,
                         cwd=workdir)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr == ("gpuguard check: cannot load the policies: 10-p.lua: "
                          "rules/team/10-p.lua:2: lua/broken.lua:2: broken at load\n")


def test_gpuguard_test_reports_the_policy_line(binary, workdir):
    (workdir / "p.suite.yaml").write_text(yaml.safe_dump({"name": "locations", "cases": [
        {"name": "refused", "object": pod("refuse"), "expect": {"allowed": True}},
        {"name": "boom", "object": pod("boom"), "expect": {"allowed": False, "error": True}}]}))
    out = subprocess.run([binary, "test", "--no-config", "--policies", "rules/team", "--lua",
                          "lua", "p.suite.yaml"], capture_output=True, text=True, timeout=60,
                         cwd=workdir)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "FAIL locations: refused"
    assert ("    error: expected none, got a policy error: p: policy error: "
            "rules/team/10-p.lua:5: lua/helpers.lua:4: refused it") in lines
    assert "PASS locations: boom" in lines


def review(name):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "default", "operation": "CREATE", "name": name,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": dict(pod(name), metadata={"name": name, "namespace": "default"})}}


def test_the_server_answers_and_logs_the_policy_line(binary, certs, workdir):
    """The server runs from elsewhere: an absolute --policies is what names the file."""
    policies = workdir / "rules" / "team"
    name = lua_name(policies / "10-p.lua")
    srv = start_server(binary, certs, workdir, "--policies", str(policies), "--lua",
                       str(workdir / "lua"))
    try:
        conn = srv.connect()
        for pod_name in ("refuse", "boom"):
            status, _, got = conn.review(review(pod_name), path="/validate")
            assert status == 200
            assert got["response"]["allowed"] is False
            want = "p: " + MESSAGES[pod_name].format(name)
            assert got["response"]["status"]["message"] == want
            decisions = [r for r in srv.log_lines()
                         if r.get("msg") == "decision" and r.get("name") == pod_name]
            assert decisions and decisions[0]["message"] == want, decisions
        failed = [r for r in srv.log_lines()
                  if r.get("msg") == "policy failed" and r.get("name") == "refuse"]
        assert failed[0]["error"] == MESSAGES["refuse"].format(name)[len("policy error: "):]
        # The traceback leads with the same message, then the frames as Lua lists them.
        assert failed[0]["traceback"].startswith(failed[0]["error"] + "\nstack traceback:\n")
    finally:
        assert srv.stop() == 0
