"""`make bench`'s server benchmark (tests/bench/bench_server.py) end to end, briefly
(BENCH_SECONDS=2, a few connections), to prove that it runs, reports and cleans up.
It asserts nothing about the figures: benchmarks are figures, not tests."""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO

SCRIPT = REPO / "tests" / "bench" / "bench_server.py"
SBIN_PATH = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"


@pytest.fixture
def tools():
    for name, package in (("wrk", "wrk"), ("nginx", "nginx-light")):
        if not shutil.which(name, path=SBIN_PATH):
            pytest.skip(f"{name} is not installed (Debian package {package}; `make deps` "
                        "installs it): the server benchmark cannot run")


def callgrind_n(binary):
    """A tiny callgrind difference when valgrind can run bench_engine (not a sanitized build)."""
    engine = Path(binary).parent / "bench" / "bench_engine"
    if not shutil.which("valgrind") or not engine.exists() or b"__asan_init" in \
            engine.read_bytes():
        return "off"
    return "2,4"


def bench_cmd(binary, tmp_path, *extra):
    return ["/usr/bin/python3", str(SCRIPT), "--bin", binary, "--connections", "4",
            "--idle-connections", "20", "--engine-n", "20", "--events", "2", "--rounds", "2",
            "--callgrind-n", callgrind_n(binary), "--report", str(tmp_path / "report.md"),
            *extra]


def temp_dir_of(output):
    for line in output.splitlines():
        if "temporary directory " in line:
            return line.rsplit("temporary directory ", 1)[1].strip()
    return None


def processes_mentioning(text):
    """PIDs whose command line contains text (the run's temporary directory)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids


def test_bench_server_runs_end_to_end(binary, tools, tmp_path):
    env = dict(os.environ, BENCH_SECONDS="2")
    out = subprocess.run(bench_cmd(binary, tmp_path), env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    report = (tmp_path / "report.md").read_text()
    headline = report.split("\n\n")[1]
    for row in ("| engine instructions per review (callgrind",
                "| webhook req/s as a share of nginx (wrk -t2 -c4, 2 interleaved rounds of 2 s) |",
                "| p99, one connection (wrk -t1 -c1, same rounds) |",
                "| RSS with 20 kept-alive TLS connections |"):
        assert row in headline, f"{row!r} missing from the headline figures:\n{headline}"
    if callgrind_n(binary) != "off":
        assert re.search(r"\| engine instructions per review [^|]*\| [\d,]+ K \|", headline)
    # The one-connection p99 twice: the bodies cycled, and one GPU pod alone.
    assert re.search(r"\| p99, one connection [^|]*\| \*\*[\d.-]+ ms\*\* \([^)]*the four bodies "
                     r"cycled\); the inference pod, gpu-fraction 0\.25 alone \*\*[\d.-]+ ms\*\*",
                     headline), headline
    for row in ("| machine |", "| load average", "gpuguard requests/s",
                "gpuguard latency p50 / p99 / p99.9 / max", "nginx ceiling requests/s",
                "gpuguard / nginx requests/s", "policy reload under load",
                "certificate rotation under load", "server RSS under load",
                "server RSS with 20 open idle TLS connections"):
        assert row in report, f"{row!r} missing from the report:\n{report}"
    # Each worker thread's share of the load (one per CPU by default), to see the balance.
    assert re.search(r"\| CPU of each worker thread during the run [^|]*\| \d+\.\d\d(, \d+\.\d\d)* \|",
                     report), report
    assert report.split("\n\n", 1)[1] in out.stdout  # the table, printed at the end
    tmp = temp_dir_of(out.stdout)
    assert tmp and not Path(tmp).exists()
    assert processes_mentioning(tmp) == []


def test_bench_server_stops_everything_on_ctrl_c(binary, tools, tmp_path):
    log = tmp_path / "bench.log"
    env = dict(os.environ, BENCH_SECONDS="30")
    with open(log, "wb") as f:
        # No callgrind: the run must reach its first wrk run within the wait below.
        proc = subprocess.Popen(bench_cmd(binary, tmp_path, "--callgrind-n", "off"), env=env,
                                stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "gpuguard steady" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        assert "gpuguard steady" in log.read_text()
        tmp = temp_dir_of(log.read_text())
        assert processes_mentioning(tmp), "wrk and gpuguard serve should be running"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # nginx's workers leave a moment after their master: wait for them, bounded.
    deadline = time.monotonic() + 20
    while processes_mentioning(tmp) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_mentioning(tmp) == []
    assert not Path(tmp).exists()


def test_policy_cost_splits_a_review(binary, tmp_path):
    # tests/bench/policy_cost.py (`make policy-cost`) briefly: it measures, and its driver
    # really runs the shipped policies on the plain copy (their decision lands in its audit).
    if callgrind_n(binary) == "off":
        pytest.skip("no valgrind, or a sanitized build: policy_cost.py cannot count")
    tools = os.environ.get("GPUGUARD_TOOLS")
    if not tools:
        pytest.skip("GPUGUARD_TOOLS is not set: run through 'make test'")
    engine = Path(binary).parent / "bench" / "bench_engine"
    review = REPO / "tests" / "data" / "reviews" / "bench-pod.json"
    work = tmp_path / "work"
    out = subprocess.run(["/usr/bin/python3", str(REPO / "tests" / "bench" / "policy_cost.py"),
                          "--bench-engine", str(engine), "--policies", str(REPO / "policies"),
                          "--lua", str(REPO / "lua"), "--config",
                          str(REPO / "deploy" / "gpuguard.yaml"), "--callgrind-n", "20,40",
                          "--work-dir", str(work), str(review)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # Twenty reviews apart: with fewer, one collection more or less in a run can outweigh the
    # policies (a negative floor was seen with 2 and 4).
    row = re.search(r"^\| bench-pod\.json \| (-?[\d,]+) \| (-?[\d,]+) \| (-?[\d,]+) \| (-?[\d,]+) \|$",
                    out.stdout, re.M)
    assert row, out.stdout
    shipped, floor = (int(row.group(i).replace(",", "")) for i in (1, 2))
    assert shipped > floor > 0, out.stdout

    def audit(policies, phases):
        got = subprocess.run([str(Path(tools) / "engine_tool"), "--policies", str(policies),
                              "--lua", str(work / "lua"), "--config",
                              str(REPO / "deploy" / "gpuguard.yaml"), "--phases", phases,
                              str(review)], capture_output=True, text=True, timeout=60)
        assert got.returncode == 0, got.stderr
        return json.loads(got.stdout)["audit"]

    decision = audit(work / "shipped", "both")["gpu-sharing.decision"]
    assert decision.startswith("mig on pool a100-mig for class inference")
    assert audit(work / "plain", "mutate")["driver.decision"] == decision
    assert "driver.decision" not in audit(work / "copy", "mutate")
