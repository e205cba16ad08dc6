"""The policy engine inside the running server: verdicts over HTTPS, a stuck
policy that cannot stop the server, and hot reload of policies and config."""

import base64
import json
import os
import re
import time
from pathlib import Path

import pytest

from conftest import start_policy_server, start_server, wait_for
from test_policy_error_locations import lua_name
from test_server import metric, review

LABEL_POLICY = """
local gg = require "gpuguard"
return {
  name = "stamp",
  match = { kinds = { "Pod" } },
  config = { "stamp" },
  mutate = function(req, pod, cfg)
    if pod.metadata.labels == nil then pod.metadata.labels = gg.object() end
    pod.metadata.labels.stamp = cfg.stamp or "%s"
  end,
  validate = function(req, pod)
    if (pod.metadata.labels or {}).stuck == "yes" then while true do end end
  end,
}
"""


def write_atomically(path, text):
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture
def policy_server(binary, certs, tmp_path):
    policies = tmp_path / "policies"
    policies.mkdir()
    lua = tmp_path / "lua"
    lua.mkdir()
    confdir = tmp_path / "config"
    confdir.mkdir()
    config = confdir / "gpuguard.yaml"
    config.write_text("engine:\n  timeout: 1s\n")
    (policies / "10-stamp.lua").write_text(LABEL_POLICY % "v1")
    srv = start_server(binary, certs, tmp_path, "--policies", str(policies), "--lua", str(lua),
                       "--config", str(config))
    srv.policies, srv.config = policies, config
    yield srv
    if srv.proc.poll() is None:
        assert srv.stop() == 0


def stamp_of(srv, conn=None):
    conn = conn or srv.connect()
    status, _, got = conn.review(review(), path="/mutate")
    assert status == 200
    patch = json.loads(base64.b64decode(got["response"]["patch"]))
    return patch[0]["value"]["stamp"]


def test_mutating_answer_carries_the_policy_patch(policy_server):
    status, _, got = policy_server.connect().review(review(), path="/mutate")
    resp = got["response"]
    assert resp["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(resp["patch"])) == [
        {"op": "add", "path": "/metadata/labels", "value": {"stamp": "v1"}}]
    status, _, got = policy_server.connect().review(review(), path="/validate")
    assert "patch" not in got["response"] and got["response"]["allowed"] is True


def test_stuck_policy_is_cut_off_and_the_server_keeps_serving(policy_server):
    conn = policy_server.connect()
    stuck = review()
    stuck["request"]["object"]["metadata"]["labels"] = {"stuck": "yes"}
    start = time.monotonic()
    status, _, got = conn.review(stuck, path="/validate", timeout="10s")
    assert time.monotonic() - start < 5
    assert status == 200
    assert got["response"]["allowed"] is False
    assert got["response"]["status"]["message"].startswith("stamp: policy stopped: ")
    logged = [r for r in policy_server.log_lines() if r.get("msg") == "policy failed"]
    assert logged and logged[-1]["policy"] == "stamp"
    for _ in range(5):
        status, _, got = conn.review(review(), path="/validate")
        assert status == 200 and got["response"]["allowed"] is True


def test_policy_edit_is_served_without_restart(policy_server):
    assert stamp_of(policy_server) == "v1"
    write_atomically(policy_server.policies / "10-stamp.lua", LABEL_POLICY % "v2")
    assert wait_for(lambda: stamp_of(policy_server) == "v2")
    status, text = policy_server.ops("/readyz")
    assert status == 200 and text == ("ready: policy generation 2, last reload: ok\n"
                                      "inventory: off\n")
    _, m = policy_server.ops("/metrics")
    assert metric(m, "gpuguard_policy_generation") == 2
    assert metric(m, "gpuguard_policy_reloads_total", result="ok") >= 1


def test_broken_policy_is_refused_and_the_last_good_set_serves(policy_server):
    write_atomically(policy_server.policies / "10-stamp.lua", "return { name = ")
    assert wait_for(lambda: any(r.get("msg", "").startswith("reload refused")
                                for r in policy_server.log_lines()))
    refused = [r for r in policy_server.log_lines() if r.get("msg", "").startswith("reload")]
    assert "10-stamp.lua" in refused[-1]["error"]
    assert stamp_of(policy_server) == "v1"
    status, text = policy_server.ops("/readyz")
    assert status == 200
    assert text.startswith("ready: policy generation 1, last reload: "
                           f"{lua_name(policy_server.policies / '10-stamp.lua')}:1:")
    _, m = policy_server.ops("/metrics")
    assert metric(m, "gpuguard_policy_last_reload_success") == 0
    assert metric(m, "gpuguard_policy_reloads_total", result="error") >= 1
    # Fixing the file brings reloads back.
    write_atomically(policy_server.policies / "10-stamp.lua", LABEL_POLICY % "v3")
    assert wait_for(lambda: stamp_of(policy_server) == "v3")


def test_config_change_is_reloaded(policy_server):
    write_atomically(policy_server.config, "stamp: from-config\n")
    assert wait_for(lambda: stamp_of(policy_server) == "from-config")


def test_bad_config_is_refused_with_the_key_path(policy_server):
    write_atomically(policy_server.config, "engine:\n  memory: lots\n")
    assert wait_for(lambda: "engine.memory" in policy_server.ops("/readyz")[1])
    assert stamp_of(policy_server) == "v1"


def test_a_section_no_policy_reads_is_refused_and_the_last_good_set_serves(policy_server):
    """A typo is no silent off switch: a section neither gpuguard nor a policy's config field
    knows refuses the reload, naming the nearest known one; the last good set keeps serving and
    /readyz stays 200 (a refused reload must not unready every replica at once)."""
    write_atomically(policy_server.config, "stamp: from-config\n")
    assert wait_for(lambda: stamp_of(policy_server) == "from-config")
    write_atomically(policy_server.config, "stamps: typo\n")
    want = f"{policy_server.config}: stamps: unknown key; did you mean stamp? (known: audit, classes, "
    assert wait_for(lambda: "stamps: unknown key; did you mean stamp?" in
                    policy_server.ops("/readyz")[1])
    status, _ = policy_server.ops("/readyz")
    assert status == 200
    assert stamp_of(policy_server) == "from-config"
    refused = [r for r in policy_server.log_lines() if r.get("msg", "").startswith("reload refused")]
    assert want in refused[-1]["error"]
    _, m = policy_server.ops("/metrics")
    assert metric(m, "gpuguard_policy_last_reload_success") == 0


def test_server_refuses_to_start_with_a_broken_policy(binary, certs, tmp_path):
    policies = tmp_path / "p"
    policies.mkdir()
    (policies / "10-x.lua").write_text("return 1")
    import subprocess
    out = subprocess.run([binary, "serve", "--listen", "127.0.0.1:0", "--ops-listen",
                          "127.0.0.1:0", "--tls-cert", str(certs / "tls.crt"), "--tls-key",
                          str(certs / "tls.key"), "--policies", str(policies), "--lua",
                          str(tmp_path)], capture_output=True, text=True, timeout=20)
    assert out.returncode == 1
    assert "10-x.lua: must return a table (got number)" in out.stderr


def test_wall_clock_budget_follows_the_api_server_timeout(binary, certs, tmp_path):
    """With the engine's own budgets far away, ?timeout=1s alone stops a stuck policy."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "10-stuck.lua").write_text(
        "return { name = 'stuck', validate = function() while true do end end }")
    config = tmp_path / "gpuguard.yaml"
    config.write_text("engine:\n  timeout: 60s\n  instructions: 1000000000000\n")
    srv = start_server(binary, certs, tmp_path, "--policies", str(policies), "--lua",
                       str(tmp_path), "--config", str(config))
    try:
        start = time.monotonic()
        status, _, got = srv.connect().review(review(), path="/validate", timeout="1s")
        elapsed = time.monotonic() - start
        assert status == 200
        assert got["response"]["status"]["message"] == "stuck: policy stopped: out of time"
        assert elapsed < 1.0
    finally:
        assert srv.stop() == 0


def test_one_lua_vm_per_worker_thread(binary, certs, tmp_path):
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "10-stamp.lua").write_text(LABEL_POLICY % "v1")
    srv = start_server(binary, certs, tmp_path, "--policies", str(policies), "--lua",
                       str(tmp_path), "--log-level", "debug")
    try:
        for _ in range(10):
            conn = srv.connect()
            for _ in range(5):
                assert conn.review(review(), path="/mutate")[0] == 200
        built = [r for r in srv.log_lines()
                 if r.get("msg") == "built a Lua VM for policy generation 1"]
        assert 1 <= len(built) <= 2  # --threads 2
    finally:
        assert srv.stop() == 0


# Keeps some 3 MB of tables, so that a review's garbage is a small part of the heap, and
# throws away two strings of over 100 bytes for each of the number in the label "strings".
GARBAGE_POLICY = """
local kept = {}
for i = 1, 40000 do kept[i] = { i } end
return {
  name = "garbage",
  validate = function(req, pod)
    local n, bytes = tonumber(pod.metadata.labels.strings), 0
    for i = 1, n do bytes = bytes + #(string.rep("x", 100) .. i) end
    if bytes <= 100 * n or #kept ~= 40000 then req:deny("lost memory") end
  end,
}
"""


def test_lua_garbage_is_collected_between_reviews(binary, certs, tmp_path):
    """A worker collects its VM's garbage once an answer is sent, when the collector's
    schedule calls for it, so that reviews rarely pause for it; a review that throws away
    more than the memory limit is still collected as it runs."""
    srv = start_policy_server(binary, certs, tmp_path, {"10-garbage.lua": GARBAGE_POLICY},
                              "memory: 8Mi\ninstructions: 100000000", "--log-level", "debug")
    try:
        conn = srv.connect()

        def validate(strings):
            obj = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "p", "namespace": "default",
                                "labels": {"strings": str(strings)}},
                   "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
            status, _, got = conn.review(review(object=obj), path="/validate")
            assert status == 200
            return got["response"]

        for _ in range(30):  # some 250 KB of garbage each: a fifth of the heap in three
            assert validate(1000)["allowed"] is True
        collected = [re.fullmatch(r"collected Lua garbage between reviews: (\d+) bytes before, "
                                  r"(\d+) after", r.get("msg", "")) for r in srv.log_lines()]
        collected = [(int(m[1]), int(m[2])) for m in collected if m]
        assert all(3_000_000 < after < before for before, after in collected), collected
        assert len([1 for before, after in collected if before - after > 500_000]) >= 5, collected
        # Some 70 MB of strings against the 8 MiB limit.
        assert validate(300000)["allowed"] is True
    finally:
        assert srv.stop() == 0
