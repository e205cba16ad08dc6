"""Library calls that used to loop in C for hours, against the real server
over TLS: each review ends in a clean denial naming its policy within the
request's deadline, two of them at once do not wedge a two-thread server,
/healthz stays 200, no evaluation overruns its deadline, and SIGTERM exits
within the shutdown grace while they run.  Library calls whose C work
grows with what they are given (table.sort's comparisons, a pattern's
items and sets, gsub's replacement) charge that work to the instruction
budget, which stops them as it stops a loop."""

import concurrent.futures
import json
import signal
import time

import pytest

from conftest import start_policy_server, start_server
from test_faults import HANG, SLOW
from test_policy_error_locations import lua_name
from test_server import check_envelope, metric, review

SLOW_SUBJECT = "string.rep('a', 60000)"
# case label -> (expression, the denial's text after "<case>: "; {file}: the policy's file)
CASES = {
    "find": (f"string.find({SLOW_SUBJECT}, '.-.-.-.-.-.-b')", "policy stopped: out of time"),
    "dash": (f"({SLOW_SUBJECT}):find('.-b')", "policy stopped: out of time"),
    "move": ("table.move({}, 1, 2^62, 1)",
             "policy error: {file}:3: table.move: 4611686018427387904 elements "
             "cannot fit in the memory limit"),
    "rep": ("#string.rep('', 2^62)", "finished 0"),
    # The stock sort ran this for 42-77 s, past any deadline: each comparison reads 4 MiB.
    "sort": ("(function() local s, t = string.rep('a', 4 << 20), {} "
             "for i = 1, 20000 do t[i] = s end table.sort(t) end)()", "policy stopped: out of time"),
}
POLICY = """
return { name = "%s", match = { labels = { matchLabels = { case = "%s" } } },
  validate = function(req) local r = %s
    req:deny("finished " .. tostring(r)) end }
"""
TIMEOUT = 3 * SLOW  # each review's ?timeout=, in seconds


@pytest.fixture
def srv(binary, certs, tmp_path):
    policies = tmp_path / "policies"
    policies.mkdir()
    for i, (case, (expr, _)) in enumerate(sorted(CASES.items())):  # 10-dash ... 14-sort
        (policies / f"{10 + i}-{case}.lua").write_text(POLICY % (case, case, expr))
    config = tmp_path / "gpuguard.yaml"
    config.write_text("engine:\n  timeout: 500ms\n  instructions: 1000000000000\n")
    server = start_server(binary, certs, tmp_path, "--policies", str(policies), "--lua",
                          str(tmp_path), "--config", str(config), "--shutdown-grace", "5")
    server.policies = policies
    yield server
    if server.proc.poll() is None:
        server.stop(timeout=5 * SLOW)  # the old sort held a worker past SIGTERM


# Calls whose C work is far beyond an instruction budget of a million, though each is
# one call (the stock sort counted none of it, the old matcher a step per start).
HUGE_SUBJECT = "string.rep('a', 65536)"
WORK = {
    "sort": CASES["sort"][0],
    "optional-items": f"string.find({HUGE_SUBJECT}, string.rep('x?', 512 * 1024) .. 'y')",
    "set": f"string.find({HUGE_SUBJECT}, '[' .. string.rep('b', 1 << 20) .. ']')",
    "replacement": f"string.gsub({HUGE_SUBJECT}, '', string.rep('%0', 512 * 1024))",
}


@pytest.fixture
def work_srv(binary, certs, tmp_path):
    server = start_policy_server(
        binary, certs, tmp_path,
        {f"{10 + i}-{case}.lua": POLICY % (case, case, expr)
         for i, (case, expr) in enumerate(sorted(WORK.items()))},
        "timeout: 2s\ninstructions: 1000000")
    yield server
    if server.proc.poll() is None:
        server.stop(timeout=5 * SLOW)  # the old sort held a worker past SIGTERM


def ask(server, case):
    sent = review()
    sent["request"]["object"]["metadata"]["labels"] = {"case": case}
    conn = server.connect(timeout=HANG)
    try:
        status, _, got = conn.review(json.dumps(sent), path="/validate", timeout=f"{TIMEOUT}s")
    finally:
        conn.close()
    assert status == 200
    return check_envelope(sent, got, "/validate")


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_call_ends_in_a_denial_naming_its_policy(srv, case):
    resp = ask(srv, case)
    assert resp["allowed"] is False
    file = lua_name(srv.policies / f"{10 + sorted(CASES).index(case)}-{case}.lua")
    assert resp["status"]["message"] == f"{case}: " + CASES[case][1].format(file=file)
    assert srv.ops("/healthz") == (200, "ok\n")


@pytest.mark.parametrize("case", sorted(WORK))
def test_c_work_counts_against_the_instruction_budget(work_srv, case):
    resp = ask(work_srv, case)
    assert resp["allowed"] is False
    assert resp["status"]["message"] == f"{case}: policy stopped: instruction budget exhausted"
    assert work_srv.ops("/healthz") == (200, "ok\n")
    for _ in range(2):  # each worker: a review the policies do not match is allowed
        assert ask(work_srv, "none")["allowed"] is True


def test_two_at_once_do_not_wedge_the_server_and_sigterm_still_exits(srv):
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        slow = [pool.submit(ask, srv, case) for case in ("find", "dash")]
        for f in slow:
            assert f.result(timeout=HANG)["allowed"] is False
        # Both workers are free again: a review without the label is allowed.
        assert ask(srv, "none")["allowed"] is True
        assert srv.ops("/healthz") == (200, "ok\n")
        assert metric(srv.ops("/metrics")[1], "gpuguard_deadline_overruns_total") == 0
        # SIGTERM while two slow reviews run: both are answered, then the process exits.
        slow = [pool.submit(ask, srv, case) for case in ("find", "dash")]
        time.sleep(0.2)
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=5 * SLOW + 5) == 0
        for f in slow:
            try:
                assert f.result(timeout=HANG)["allowed"] is False
            except (ConnectionError, OSError):
                pass  # not yet accepted when the listener closed
