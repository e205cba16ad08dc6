"""Reports past their limits in the running server (issue 35, finding 13): a policy that
warns 100,000 times, or denies with 20 MB, gets a bounded answer that says what was left
out, a bounded log line, and the server's memory stays where it was."""

import json
from pathlib import Path

import pytest

from conftest import start_policy_server
from test_faults import SANITIZED
from test_server import review

FLOOD = """
return {
  name = "flood",
  validate = function(req, pod)
    local what = (pod.metadata.labels or {}).flood
    if what == "warnings" then
      for i = 1, 100000 do req:warn(("warning %06d"):format(i)) end
    elseif what == "denials" then
      for i = 1, 100000 do req:deny(("no %06d"):format(i)) end
    elseif what == "denial" then
      req:deny(string.rep("x", 20 * 1024 * 1024))
    elseif what == "audit" then
      for i = 1, 100000 do req:audit(("k%06d"):format(i), string.rep("v", 8192)) end
    end
  end,
}
"""


@pytest.fixture
def flood_server(binary, certs, tmp_path):
    # The time budget is not what is tested: 25 s (the reviews' own timeout is 30 s), so that a
    # sanitized build on a loaded machine still finishes 100,000 reports.
    srv = start_policy_server(binary, certs, tmp_path, {"10-flood.lua": FLOOD},
                              "memory: 64Mi\ninstructions: 100000000\ntimeout: 25s")
    yield srv
    if srv.proc.poll() is None:
        assert srv.stop() == 0


def flood(srv, what):
    rev = review()
    rev["request"]["object"]["metadata"]["labels"] = {"flood": what}
    status, _, got = srv.connect(timeout=60).review(rev, path="/validate", timeout="30s")
    assert status == 200
    return got["response"]


def peak_rss_kib(srv):
    status = Path(f"/proc/{srv.proc.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("VmHWM:")))


def decisions(srv):
    return [r for r in srv.log_lines() if r.get("msg") == "decision"]


def test_floods_of_reports_get_bounded_answers_and_the_server_stays_up(flood_server):
    srv = flood_server
    assert flood(srv, "none")["allowed"] is True
    before = peak_rss_kib(srv)

    resp = flood(srv, "warnings")
    assert resp["allowed"] is True
    assert resp["warnings"] == (["flood: warning %06d" % i for i in range(1, 101)] +
                                ["gpuguard: 99900 more warnings left out"])

    resp = flood(srv, "denial")
    assert resp["allowed"] is False
    assert resp["status"]["message"] == ("flood: " + "x" * 4096 +
                                         "\u2026 (20967424 more bytes)")

    resp = flood(srv, "denials")
    assert resp["allowed"] is False
    lines = resp["status"]["message"].split("\n")
    assert lines[:-1] == ["flood: no %06d" % i for i in range(1, 3856)]
    assert lines[-1] == "gpuguard: 96145 more denials left out"

    resp = flood(srv, "audit")
    assert resp["allowed"] is True
    audit = resp["auditAnnotations"]
    assert sorted(k for k in audit if k.startswith("flood.")) == [
        "flood.k%06d" % i for i in range(1, 33)]
    assert audit["flood.k000001"] == "v" * 4096 + "\u2026 (4096 more bytes)"
    assert audit["audit-left-out"] == "99968"

    # The log lines are as bounded as the answers.
    logged = decisions(srv)
    assert max(len(json.dumps(r)) for r in logged) < 70 * 1024
    assert logged[-3]["message"] == resp_denial_line(4096, 20967424)

    # The server serves on, and the reports no longer take its memory: the peak grows by the
    # policy's own Lua memory, the 20 MB string and string.rep's buffer for it (some 41 MB).
    # Before, the same floods took it from 12 MB to 116 MB, and then to 1.6 GB with the audit
    # values.
    assert flood(srv, "none")["allowed"] is True
    assert srv.ops("/healthz")[0] == 200
    grown = peak_rss_kib(srv) - before
    assert SANITIZED or grown < 64 * 1024, f"peak RSS grew by {grown} KiB"


def resp_denial_line(kept, left):
    return "flood: " + "x" * kept + "\u2026 (%d more bytes)" % left
