#!/usr/bin/python3
"""audit_cost.py - what the background audit costs, and what it does to admission.

    audit_cost.py --bin build/gpuguard [--pods 10000] [--per-workload 10] [--seconds 20]
                  [--rate 100000] [--report FILE]

One run on 127.0.0.1, in a temporary directory:

 1. a stand-in API server (tests/integration/fake_apiserver.py) holding --pods running GPU
    pods, --per-workload pods to a ReplicaSet, over 20 namespaces: the audit lists them, paged,
    as from the real one; the stand-in serves no ReplicaSets and no report API (404), so the
    figures are gpuguard's own work (the list, the evaluations, the reports it builds), not the
    API server's (the writes against the real one: tests/e2e/test_audit.py);
 2. `gpuguard serve` on the shipped policies and configuration, with the inventory on that
    stand-in, audit.rate --rate, leading its Lease;
 3. once the first audit is done, a second one started by a reload, timed from its log line,
    its CPU read from /proc for the thread named `audit`: evaluations per second and CPU
    per evaluation;
 4. admission latency: one keep-alive connection sending a GPU pod's review every 50 ms for
    --seconds while no audit runs, then as long while one does (the reload starts it): p50,
    p99 and max of both.

Figures, not pass/fail (a loaded 2-core machine moves the latencies; the CPU per evaluation
is what holds): the exit status is non-zero only when something could not be run.
"""

import argparse
import json
import os
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tests" / "integration"))
from fake_apiserver import FakeApiServer, gpu_pod  # noqa: E402
from bench_server import worker_seconds  # noqa: E402
import procs  # noqa: E402  tests/bench/procs.py: the server stopped whatever happens

import yaml  # noqa: E402

NAMESPACES = 20
PATIENCE = 600  # seconds for one audit of the largest run, throttled or not


def log(msg):
    print(f"audit_cost: {msg}", file=sys.stderr, flush=True)


def pods(total, per_workload):
    for i in range(total):
        owner = f"serve-{i // per_workload}"
        ns = f"team-{i // per_workload % NAMESPACES}"
        p = gpu_pod(ns, f"{owner}-{i:06d}", uid=f"uid-{i}", cls="inference")
        p["metadata"]["ownerReferences"] = [{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner,
            "uid": f"rs-{owner}", "controller": True}]
        yield p


class Serve:
    def __init__(self, binary, tmp, api_url, rate):
        certs = tmp / "certs"
        subprocess.run([binary, "certs", "--service", "gpuguard", "--namespace",
                        "gpuguard-system", "--out", str(certs), "--dev", "--force"],
                       check=True, stdout=subprocess.DEVNULL)
        cfg = yaml.safe_load((REPO / "deploy" / "gpuguard.yaml").read_text())
        cfg["quotas"]["default"] = 100000
        cfg["audit"] = {"rate": rate}
        self.config = tmp / "gpuguard.yaml"
        self.config.write_text(yaml.safe_dump(cfg))
        kubeconfig = tmp / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "clusters": [{"name": "fake", "cluster": {"server": api_url}}],
            "users": [{"name": "fake", "user": {}}]}))
        self.log_path = tmp / "serve.log"
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        with open(self.log_path, "wb") as log_file:
            self.proc = procs.spawn(
                [binary, "serve", "--listen", "127.0.0.1:0", "--ops-listen", "127.0.0.1:0",
                 "--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key"),
                 "--config", str(self.config), "--policies", str(REPO / "policies"),
                 "--lua", str(REPO / "lua"), "--kubeconfig", str(kubeconfig),
                 "--lease-namespace", "default", "--threads", "2"],
                stdout=subprocess.DEVNULL, stderr=log_file, env=env)
        self.ca = certs / "ca.crt"
        self.port = self.wait_for(lambda: next((r["port"] for r in self.lines()
                                                 if r.get("msg") == "serving"), None), "serving")

    def lines(self):
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def audits(self):
        return [r for r in self.lines() if r.get("msg") == "audit" and "outcome" in r]

    def wait_for(self, check, what, timeout=PATIENCE):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"audit_cost: gpuguard serve exited {self.proc.returncode}: "
                                 + self.log_path.read_text(errors="replace")[-2000:])
            got = check()
            if got:
                return got
            time.sleep(0.1)
        raise SystemExit(f"audit_cost: no {what} in {timeout} s")

    def reload(self):
        """A reload (a new configuration generation): the leader audits at once."""
        text = self.config.read_text()
        tmp = self.config.with_suffix(".tmp")
        tmp.write_text(text + f"# {time.time()}\n")
        os.replace(tmp, self.config)

    def stop(self):
        procs.stop(self.proc, signal.SIGTERM, 30)


def review_body(i):
    p = gpu_pod("team-0", f"probe-{i}", cls="inference")
    p["metadata"].pop("uid", None)
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": f"probe-{i}", "kind": {"group": "", "version": "v1",
                                                                   "kind": "Pod"},
                                   "resource": {"group": "", "version": "v1", "resource": "pods"},
                                   "namespace": "team-0", "operation": "CREATE",
                                   "userInfo": {"username": "bench"}, "object": p,
                                   "dryRun": True}}).encode()


def latencies(serve, seconds):
    """Reviews every 50 ms on one keep-alive connection for seconds: their latencies in ms."""
    import http.client
    ctx = ssl.create_default_context(cafile=str(serve.ca))
    ctx.check_hostname = False
    conn = http.client.HTTPSConnection("127.0.0.1", serve.port, context=ctx, timeout=30)
    out, i, end = [], 0, time.monotonic() + seconds
    while time.monotonic() < end:
        body = review_body(i)
        t0 = time.monotonic()
        conn.request("POST", "/validate?timeout=10s", body,
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            raise SystemExit(f"audit_cost: a review answered {r.status}")
        out.append((time.monotonic() - t0) * 1000)
        i += 1
        time.sleep(max(0, 0.05 - (time.monotonic() - t0)))
    conn.close()
    return out


def summary(ms):
    ms = sorted(ms)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"p50 {statistics.median(ms):.2f} ms, p99 {p99:.2f} ms, max {ms[-1]:.2f} ms ({len(ms)} reviews)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(REPO / "build" / "gpuguard"))
    ap.add_argument("--pods", type=int, default=10000)
    ap.add_argument("--per-workload", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rate", type=int, default=100000)
    ap.add_argument("--report")
    a = ap.parse_args()
    api = FakeApiServer(page_size=500).start()
    with tempfile.TemporaryDirectory(prefix="audit-cost-") as d:
        tmp = Path(d)
        for p in pods(a.pods, a.per_workload):
            api.add(p)
        serve = Serve(a.bin, tmp, api.url, a.rate)
        try:
            log(f"{a.pods} pods: waiting for the first audit")
            serve.wait_for(lambda: serve.audits(), "first audit")
            idle = latencies(serve, a.seconds)
            before, cpu0 = len(serve.audits()), sum(worker_seconds(serve.proc.pid, "audit").values())
            serve.reload()
            during = latencies(serve, a.seconds)
            done = serve.wait_for(lambda: serve.audits()[before:], "second audit")[0]
            cpu = sum(worker_seconds(serve.proc.pid, "audit").values()) - cpu0
            evals = done["evaluations"]
            rows = [
                f"pods {a.pods} ({a.per_workload} a ReplicaSet), audit.rate {a.rate}",
                f"audit: {evals} evaluations in {done['seconds']:.2f} s: "
                f"{evals / done['seconds']:,.0f} evaluations/s; "
                f"CPU of the audit thread {cpu:.2f} s, {cpu / evals * 1e6:,.0f} µs an evaluation; "
                f"{done['resources']} reports built",
                f"admission, no audit:        {summary(idle)}",
                f"admission, audit under way: {summary(during)}"
                + ("" if done["seconds"] >= a.seconds else
                   f" (the audit ended after {done['seconds']:.1f} s of the {a.seconds:.0f})"),
            ]
            text = "\n".join(rows)
            print(text)
            if a.report:
                Path(a.report).write_text(text + "\n")
        finally:
            serve.stop()
            api.stop()


if __name__ == "__main__":
    main()
