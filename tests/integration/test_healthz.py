"""/healthz and gpuguard_deadline_overruns_total against an evaluation that really is stuck.

No Lua budget lets a policy outlive its request, and the one library call that waits on the
network (the ResourceClaimTemplate GET of gpuguard.dra) is bounded by the request's deadline
(test_inventory_dra.py).  What no budget can reach is a write that blocks in the kernel: the
server logs to stderr, and when whatever reads that pipe stalls (the container runtime's log
shim, here this test) a policy's gpuguard.log blocks in write(2) with no end.  That is the case
/healthz exists for: it answers 503 while the evaluation is stuck past its deadline, so the
kubelet restarts the pod, and 200 again once it is not.  The review itself ends in a denial.
The stuck period lasts as long as the test keeps the pipe full (seconds), and every check polls."""

import json
import signal
import subprocess
import threading
import time

from conftest import REPO, Server, procs, wait_for
from test_faults import HANG, SLOW
from test_server import check_envelope, metric, review

POLICY = """
local gg = require "gpuguard"
return { name = "chatty",
  validate = function(req)
    local line = string.rep("x", 4096)
    for i = 1, 1000 do gg.log("info", line) end  -- 4 MB: far more than a pipe holds
    req:deny("finished")
  end }
"""
STUCK = 4.0 * SLOW  # seconds the pipe stays full once /healthz says 503


class Drain(threading.Thread):
    """Copies the server's stderr to a file, and stops reading while told to."""

    def __init__(self, pipe, path):
        super().__init__(daemon=True)
        self.pipe, self.out = pipe, open(path, "wb")
        self.reading = threading.Event()
        self.reading.set()

    def run(self):
        while self.reading.wait():
            line = self.pipe.readline()
            if not line:
                break
            self.out.write(line)
            self.out.flush()
        self.out.close()


def test_healthz_says_stuck_while_an_evaluation_is_past_its_deadline(binary, certs, tmp_path):
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "10-chatty.lua").write_text(POLICY)
    log_path = tmp_path / "server.log"
    proc = procs.spawn(
        [binary, "serve", "--listen", "127.0.0.1:0", "--ops-listen", "127.0.0.1:0",
         "--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key"),
         "--threads", "2", "--policies", str(policies), "--lua", str(REPO / "lua"),
         "--inventory", "off", "--shutdown-grace", "5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    drain = Drain(proc.stderr, log_path)
    drain.start()
    try:
        serving = []
        assert wait_for(lambda: serving.extend(
            r for r in map(json.loads, log_path.read_text().splitlines())
            if r.get("msg") == "serving") or serving), log_path.read_text()
        server = Server(proc, log_path, serving[0]["port"], serving[0]["ops_port"],
                        certs / "ca.crt")
        assert wait_for(lambda: server.ops("/readyz")[0] == 200)
        assert server.ops("/healthz") == (200, "ok\n")

        drain.reading.clear()  # the log pipe stalls
        sent = review()
        answer = {}

        def ask():
            conn = server.connect(timeout=HANG + STUCK)
            try:
                answer["got"] = conn.review(json.dumps(sent), path="/validate", timeout="1s")
            finally:
                conn.close()

        client = threading.Thread(target=ask)
        client.start()
        # 2 s past the 1 s deadline the evaluation counts as stuck.
        stuck = (503, "stuck: 1 evaluations past their deadline\n")
        assert wait_for(lambda: server.ops("/healthz") == stuck, HANG)
        # It stays stuck while the pipe stays full; it has not ended, so nothing is counted yet.
        time.sleep(STUCK)
        assert server.ops("/healthz") == stuck
        assert metric(server.ops("/metrics")[1], "gpuguard_deadline_overruns_total") == 0
        assert client.is_alive()

        drain.reading.set()  # the pipe drains: the write returns, the budget stops the policy
        client.join(HANG)
        assert not client.is_alive(), "the review never ended"
        status, _, got = answer["got"]
        assert status == 200
        resp = check_envelope(sent, got, "/validate")
        assert resp["allowed"] is False
        assert resp["status"]["message"] == "chatty: policy stopped: out of time", resp
        assert wait_for(lambda: server.ops("/healthz") == (200, "ok\n"), HANG)
        assert metric(server.ops("/metrics")[1], "gpuguard_deadline_overruns_total") == 1
    finally:
        drain.reading.set()
        assert procs.stop(proc, signal.SIGTERM) == 0
        drain.join(HANG)
