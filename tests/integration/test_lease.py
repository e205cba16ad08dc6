"""Leader election on a coordination.k8s.io/v1 Lease (webhook/kube/lease.c) and the writes of
the API client (kc_send), against the stand-in API server (fake_apiserver.py): lease_tool
(tests/tools/lease_tool.c) runs an elector and prints "leader ID" / "follower ID" at each change,
or makes one request.

Candidates use a 3 s lease, a 2 s renew deadline and a 0.5 s retry period.  Every wait is a
bounded loop with a generous bound; the only times compared are causal ones (a takeover cannot
come before the holder's lease ran out after its last write, as the stand-in logged them)."""

import json
import os
import re
import signal
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

import procs  # tests/bench/procs.py, on the path through tests/conftest.py
from conftest import wait_for
from fake_apiserver import FakeApiServer
from test_inventory_sync import no_proxy_env, write_kubeconfig

NS, NAME = "gpuguard-system", "gpuguard-quota"
DURATION_MS, RENEW_MS, RETRY_MS = 3000, 2000, 500
WAIT = 30.0  # the bound of a wait for what takes a few seconds at most on an idle machine
MICROTIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"


def tool():
    tools = os.environ.get("GPUGUARD_TOOLS")
    if not tools:
        pytest.skip("GPUGUARD_TOOLS is not set: run through 'make test'")
    return str(Path(tools) / "lease_tool")


@pytest.fixture
def fake():
    srv = FakeApiServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def kubeconfig(fake, tmp_path):
    return write_kubeconfig(tmp_path, fake.url)


class Candidate:
    """A lease_tool elector; its stdout lines with the monotonic time each was read."""

    def __init__(self, kubeconfig, tmp_path, identity, duration_ms=DURATION_MS, extra=()):
        cmd = [tool(), "--kubeconfig", str(kubeconfig), "--namespace", NS, "--name", NAME,
               "--duration-ms", str(duration_ms), "--renew-ms", str(RENEW_MS),
               "--retry-ms", str(RETRY_MS), "--for-ms", "600000", *extra]
        if identity:
            cmd += ["--identity", identity]
        self.identity = identity
        self.log_path = tmp_path / f"{identity or 'default'}.log"
        self.lines = []  # (time.monotonic(), line)
        with open(self.log_path, "w") as log:
            self.proc = procs.spawn(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                                    env=no_proxy_env())
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def said(self, what):
        """The times of the lines starting with what ("leader", "follower")."""
        return [t for t, line in list(self.lines) if line.split(" ")[0] == what]

    def leading(self):
        """Whether its last change said leader."""
        changes = [line for _, line in list(self.lines) if line.split(" ")[0] in
                   ("leader", "follower")]
        return bool(changes) and changes[-1].startswith("leader ")

    def log(self):
        return [json.loads(line) for line in self.log_path.read_text().splitlines()
                if line.startswith("{")]

    def stop(self, sig=signal.SIGTERM):
        """Signal it; its exit status (-9 when it did not exit within WAIT), its lines read."""
        rc = procs.stop(self.proc, sig, WAIT)
        self.reader.join(WAIT)
        return rc


def writes(fake, code=None, holder=None):
    """The stand-in's logged Lease writes: (time, method, status, holderIdentity)."""
    with fake.lock:
        log = list(fake.lease_log)
    return [(t, m, c, h) for t, m, _, c, h in log if m in ("PUT", "POST")
            and (code is None or c == code) and (holder is None or h == holder)]


def ok_writes(fake, holder=None):
    return [w for w in writes(fake, holder=holder) if 200 <= w[2] < 300]


def spec(fake):
    lease = fake.lease(NAME, NS)
    return lease and lease["spec"]


def wait_leader(*candidates, timeout=WAIT):
    """The one candidate leading, once one does (None after timeout)."""
    return wait_for(lambda: next((c for c in candidates if c.leading()), None), timeout=timeout)


def check_microtimes(s):
    for key in ("acquireTime", "renewTime"):
        assert MICROTIME.fullmatch(s[key]), s
        when = datetime.strptime(s[key], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
        assert abs((datetime.now(timezone.utc) - when).total_seconds()) < 300, s  # UTC


def test_one_leads_and_the_other_takes_over_after_a_kill(fake, kubeconfig, tmp_path):
    a = Candidate(kubeconfig, tmp_path, "a")
    b = Candidate(kubeconfig, tmp_path, "b")
    first = wait_leader(a, b)
    assert first, (a.lines, b.lines)
    other = b if first is a else a
    # A few renewals later the other still follows, and the Lease names the leader.
    assert wait_for(lambda: len(ok_writes(fake, first.identity)) >= 4, timeout=WAIT)
    assert not other.said("leader") and first.leading()
    s = spec(fake)
    assert s["holderIdentity"] == first.identity
    assert s["leaseDurationSeconds"] == 3 and s["leaseTransitions"] == 0
    check_microtimes(s)
    assert len(writes(fake, code=201)) == 1  # one POST made it; a second would be a 409
    renewed, acquired = s["renewTime"], s["acquireTime"]
    assert wait_for(lambda: spec(fake)["renewTime"] != renewed, timeout=WAIT)
    assert spec(fake)["acquireTime"] == acquired  # renewals keep it

    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    last = ok_writes(fake, first.identity)[-1][0]
    assert wait_for(other.leading, timeout=WAIT), other.lines
    taken = ok_writes(fake, other.identity)[0][0]
    # Not before the dead leader's lease ran out, timed from its last write.
    assert taken - last >= DURATION_MS / 1000 - 0.05, (taken - last)
    s = spec(fake)
    assert s["holderIdentity"] == other.identity and s["leaseTransitions"] == 1
    assert s["acquireTime"] != acquired
    check_microtimes(s)
    assert other.stop() == 0


def test_sigterm_releases_and_hands_over_promptly(fake, kubeconfig, tmp_path):
    # A lease of 60 s: without the release the follower would wait a minute.
    a = Candidate(kubeconfig, tmp_path, "a", duration_ms=60000, extra=["--metrics"])
    assert wait_for(a.leading, timeout=WAIT), a.lines
    b = Candidate(kubeconfig, tmp_path, "b", duration_ms=60000)
    time.sleep(3 * RETRY_MS / 1000)  # b tries a few times and follows
    assert not b.said("leader")
    assert a.stop() == 0  # exited within the bound, status 0
    out = [line for _, line in a.lines]
    assert out[0] == "leader a" and out[1] == "follower a", out
    assert "gpuguard_leader 0" in out and "gpuguard_leader_changes_total 1" in out, out
    released = writes(fake, code=200, holder="")
    assert len(released) == 1, writes(fake)
    assert wait_for(b.leading, timeout=WAIT), b.lines
    s = spec(fake)
    assert s["holderIdentity"] == "b" and s["leaseTransitions"] == 1
    assert s["leaseDurationSeconds"] == 60
    check_microtimes(s)
    msgs = [r["msg"] for r in a.log()]
    assert msgs[:2] == ["lease: candidate", "lease: leading"] and "lease: released" in msgs, msgs
    lead = next(r for r in a.log() if r["msg"] == "lease: leading")
    assert lead["identity"] == "a" and lead["lease"] == NAME and lead["term"] == 1
    assert b.stop() == 0


def test_refused_writes_make_the_leader_step_down(fake, kubeconfig, tmp_path):
    a = Candidate(kubeconfig, tmp_path, "a", extra=["--metrics"])
    assert wait_for(a.leading, timeout=WAIT), a.lines
    fake.refuse_writes(3600)
    refused = time.monotonic()
    # Renewals fail: a follows again once the renew deadline has passed since the last one.
    assert wait_for(lambda: a.said("follower"), timeout=RENEW_MS / 1000 + WAIT), a.lines
    assert not ok_writes(fake) or ok_writes(fake)[-1][0] <= refused
    stepped = wait_for(lambda: next((r for r in a.log() if r["msg"] == "lease: stopped leading"),
                                    None), timeout=WAIT)
    assert "renew deadline" in stepped["reason"] and "503" in stepped["reason"], stepped
    # Writes come back: it leads again (it was the holder), a second term.
    fake.refuse_writes(0)
    assert wait_for(lambda: len(a.said("leader")) == 2 and a.leading(), timeout=WAIT), a.lines
    assert spec(fake)["leaseTransitions"] == 0  # the same holder all along
    assert a.stop() == 0
    assert "gpuguard_leader_changes_total 2" in [line for _, line in a.lines], a.lines


def test_slow_answers_end_leadership_and_do_not_hold_up_stop(fake, kubeconfig, tmp_path):
    a = Candidate(kubeconfig, tmp_path, "a")
    assert wait_for(a.leading, timeout=WAIT), a.lines
    fake.lease_delay = 120.0  # every answer comes long after any request's timeout
    assert wait_for(lambda: a.said("follower"), timeout=RENEW_MS / 1000 + WAIT), a.lines
    # A request in flight is cut short by stop: it exits well before the answer would come.
    started = time.monotonic()
    assert a.stop() == 0
    assert time.monotonic() - started < WAIT


def test_a_conflict_on_put_is_a_lost_round(fake, kubeconfig, tmp_path):
    fake.put_lease({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": NAME, "namespace": NS},
                    "spec": {"holderIdentity": "", "leaseDurationSeconds": 1,
                             "acquireTime": "2024-01-01T00:00:00.000000Z",
                             "renewTime": "2024-01-01T00:00:00.000000Z",
                             "leaseTransitions": 4}})
    fake.put_conflicts = 3  # the first three PUTs lose to another writer
    c = Candidate(kubeconfig, tmp_path, "c")
    assert wait_for(c.leading, timeout=WAIT), c.lines
    puts = writes(fake)
    assert [w[2] for w in puts][:4] == [409, 409, 409, 200], puts
    # It said leader only once its write had gone through.
    assert c.said("leader")[0] >= puts[3][0]
    assert len(c.said("leader")) == 1 and not c.said("follower")
    s = spec(fake)
    assert s["holderIdentity"] == "c" and s["leaseTransitions"] == 5
    check_microtimes(s)
    assert c.stop() == 0


def test_default_identity_is_host_and_random(fake, kubeconfig, tmp_path):
    c = Candidate(kubeconfig, tmp_path, None)
    assert wait_for(c.leading, timeout=WAIT), c.lines
    line = c.lines[0][1]
    assert re.fullmatch(r"leader \S+_[0-9a-f]{16}", line), line
    assert spec(fake)["holderIdentity"] == line.split(" ", 1)[1]
    assert c.stop() == 0


# --- kc_send --------------------------------------------------------------------------------

def send(kubeconfig, method, path, body=None, max_body=None):
    """(exit status, "status N" value, the body line or None, the error line or None)."""
    cmd = [tool(), "--kubeconfig", str(kubeconfig), "--send", method, path]
    if body is not None:
        cmd += ["--body", json.dumps(body) if not isinstance(body, str) else body]
    if max_body is not None:
        cmd += ["--max-body", str(max_body)]
    got = procs.run(cmd, capture_output=True, env=no_proxy_env(), timeout=WAIT)
    lines = got.stdout.decode().splitlines()
    assert lines and lines[0].startswith("status "), (lines, got.stderr)
    rest = lines[1:]
    error = next((line for line in rest if line.startswith("error ")), None)
    text = next((line for line in rest if not line.startswith("error ")), None)
    return got.returncode, int(lines[0].split()[1]), text, error


def lease_body(holder, rv=None):
    meta = {"name": NAME, "namespace": NS}
    if rv:
        meta["resourceVersion"] = rv
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                     "acquireTime": "2026-01-02T03:04:05.000000Z",
                     "renewTime": "2026-01-02T03:04:05.000000Z", "leaseTransitions": 0}}


def test_kc_send_writes_and_their_answers(fake, kubeconfig):
    rc, status, text, _ = send(kubeconfig, "POST", LEASE_PATH, lease_body("x"))
    assert (rc, status) == (0, 201)
    created = json.loads(text)  # the 2xx body, whole
    assert created["spec"]["holderIdentity"] == "x"
    rv = created["metadata"]["resourceVersion"]
    # A second POST: 409 AlreadyExists, the Status in the body, and no error.
    rc, status, text, error = send(kubeconfig, "POST", LEASE_PATH, lease_body("y"))
    assert (rc, status, error) == (0, 409, None)
    assert json.loads(text)["reason"] == "AlreadyExists"
    # PUT with the version read: 200 and the new object; with that old version again: 409.
    rc, status, text, _ = send(kubeconfig, "PUT", f"{LEASE_PATH}/{NAME}", lease_body("y", rv))
    assert (rc, status) == (0, 200)
    assert json.loads(text)["metadata"]["resourceVersion"] != rv
    rc, status, text, error = send(kubeconfig, "PUT", f"{LEASE_PATH}/{NAME}", lease_body("z", rv))
    assert (rc, status, error) == (0, 409, None)
    conflict = json.loads(text)
    assert conflict["reason"] == "Conflict" and "has been modified" in conflict["message"]
    assert spec(fake)["holderIdentity"] == "y"
    # A PUT without a resourceVersion: 422, as the real registry answers.
    rc, status, text, _ = send(kubeconfig, "PUT", f"{LEASE_PATH}/{NAME}", lease_body("z"))
    assert (rc, status, json.loads(text)["reason"]) == (0, 422, "Invalid")


def test_kc_send_bounds_the_body_it_keeps(fake, kubeconfig):
    fake.put_lease(lease_body("x"))
    size = len(json.dumps(fake.lease(NAME, NS)))
    rc, status, text, _ = send(kubeconfig, "GET", f"{LEASE_PATH}/{NAME}", max_body=size + 64)
    assert (rc, status) == (0, 200) and json.loads(text)["spec"]["holderIdentity"] == "x"
    rc, status, text, error = send(kubeconfig, "GET", f"{LEASE_PATH}/{NAME}", max_body=100)
    assert rc == 1 and status == 200 and text is None, (text, error)
    assert error.startswith("error ") and "larger than 100 bytes" in error, error
    seen = len(fake.requests)
    rc, _, _, error = send(kubeconfig, "BREW", f"{LEASE_PATH}/{NAME}")
    assert rc == 1 and "not a method" in error, error
    assert len(fake.requests) == seen  # refused before anything was sent
