"""`make bench`'s server benchmark (tests/bench/bench_server.py) end to end, briefly
(BENCH_SECONDS=1, a few connections), to prove that it runs, reports and cleans up.
It asserts nothing about the figures: benchmarks are figures, not tests.

The two runs of the benchmark load both cores (wrk against a server as fast as they go):
they are marked whole_machine, and `make integration` runs them after the others, alone, so
that they do not slow down the tests that time a server."""

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, procs, wait_for
from bench_server import GO_SOURCE, find_go, go_env
from repeatable import per_review

SCRIPT = REPO / "tests" / "bench" / "bench_server.py"
SBIN_PATH = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"


@pytest.fixture
def tools():
    for name, package in (("wrk", "wrk"), ("nginx", "nginx-light")):
        if not shutil.which(name, path=SBIN_PATH):
            pytest.skip(f"{name} is not installed (Debian package {package}; `make deps` "
                        "installs it): the server benchmark cannot run")


def go_built(output):
    """Whether the benchmark's output says it built its Go webhook: without a go that builds
    it, the benchmark runs all the same, its Go rows saying why."""
    return "bench: Go webhook built with " in output


def callgrind_n(binary):
    """A tiny callgrind difference when valgrind can run bench_engine (not a sanitized build)."""
    engine = Path(binary).parent / "bench" / "bench_engine"
    if not shutil.which("valgrind") or not engine.exists() or b"__asan_init" in \
            engine.read_bytes():
        return "off"
    # Twenty reviews apart, as test_policy_cost_splits_a_review: a run's count varies by some
    # 700 K instructions from one run to the next (236.5 M to 237.2 M with -n 2), more than a
    # review costs, so that with "2,4" the difference per review once came out negative.
    return "20,40"


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


def descendants(pid):
    """{pid: start time} of every process under pid (children, theirs, ...)."""
    found, todo = {}, [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                kids = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except OSError:
                continue
            for kid in map(int, kids):
                st = procs.stat(kid)
                if st and kid not in found:
                    found[kid] = st[2]
                    todo.append(kid)
    return found


def alive(processes):
    """Those of {pid: start time} still running: the same process (not a new one that took
    the pid), not a zombie (gone, only not yet reaped by its new parent)."""
    left = {}
    for pid, start in processes.items():
        st = procs.stat(pid)
        if st and st[2] == start and st[0] != "Z":
            try:
                left[pid] = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
            except OSError:
                pass  # gone meanwhile
    return left


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


@pytest.mark.whole_machine
def test_bench_server_runs_end_to_end(binary, tools, tmp_path):
    env = dict(os.environ, BENCH_SECONDS="1")
    # A bound no run reaches (it takes some 20 s): the test is about the run's end, not its time.
    out = procs.run(bench_cmd(binary, tmp_path), env=env, capture_output=True, text=True,
                    timeout=10 * procs.PATIENCE)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    report = (tmp_path / "report.md").read_text()
    headline = report.split("\n\n")[1]
    for row in ("| engine instructions per review (callgrind",
                "| webhook req/s as a share of nginx (wrk -t2 -c4, 2 interleaved rounds of 1 s) |",
                "| p99, one connection (wrk -t1 -c1, same rounds) |",
                "| RSS with 20 kept-alive TLS connections |"):
        assert row in headline, f"{row!r} missing from the headline figures:\n{headline}"
    if callgrind_n(binary) != "off":
        assert re.search(r"\| engine instructions per review [^|]*\| [\d,]+ K \|", headline)
    # The minimal Go webhook, built and run in the same rounds when go is there.
    if go_built(out.stdout):
        assert re.search(r"^\| gpuguard req/s as a share of a minimal Go webhook [^|]*\| "
                         r"\*\*[\d-]+ %\*\* \(Go webhook [\d,-]+ req/s\) \|", headline, re.M), \
            headline
        assert re.search(r"; Go webhook [\d.-]+ ms \([\d,-]+ req/s\) \| ≤ 0\.25 ms \|$",
                         headline, re.M), headline
        for row in ("| Go webhook requests/s |", "| **gpuguard / Go webhook requests/s** |",
                    "| requests/s per round, wrk -c4: gpuguard / nginx / Go webhook | 1: ",
                    "| requests/s per round, wrk -c1: gpuguard / nginx / Go webhook | 1: "):
            assert row in report, f"{row!r} missing from the report:\n{report}"
    else:
        assert "| gpuguard req/s as a share of a minimal Go webhook | not measured: " in headline

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


@pytest.mark.whole_machine
def test_bench_server_stops_everything_on_ctrl_c(binary, tools, tmp_path):
    log = tmp_path / "bench.log"
    # Steady runs of 30 s, so that the signal comes in the middle of one; warm-ups of 1 s and no
    # callgrind, to get there soon.
    env = dict(os.environ, BENCH_SECONDS="30")
    with open(log, "wb") as f:
        bench = procs.spawn(bench_cmd(binary, tmp_path, "--callgrind-n", "off", "--warm-up", "1"),
                            env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
        # The bench logs each wrk's pid once it has started it.
        steady = re.compile(r"^bench: gpuguard steady, round 1: wrk pid (\d+)$", re.M)
        assert wait_for(lambda: steady.search(log.read_text()) or bench.poll() is not None), \
            log.read_text()
        assert bench.poll() is None, log.read_text()
        wrk = int(steady.search(log.read_text()).group(1))
        started = descendants(bench.pid)
        running = alive(started)
        assert wrk in running, (wrk, running)
        whats = ["gpuguard serve", "nginx: master process", "nginx: worker process"]
        if go_built(log.read_text()):
            whats.append("gowebhook --listen")
        for what in whats:
            assert any(cmd.startswith(what) or f"/{what}" in cmd for cmd in running.values()), \
                (what, running)
        tmp = temp_dir_of(log.read_text())
        assert tmp and Path(tmp).is_dir()
        bench.send_signal(signal.SIGINT)
        # Waited for without a signal of its own; SIGKILL to its group only past the bound.
        assert procs.stop(bench, None) == 130, log.read_text()
    finally:
        procs.stop(bench, signal.SIGKILL)
    assert "bench: interrupted; stopping everything" in log.read_text()
    # The bench waits for each child's process group to be empty before it exits: nothing it
    # started may be left, not even for a moment.
    assert alive(started) == {}
    assert not Path(tmp).exists()


def test_policy_cost_splits_a_review(binary, tmp_path):
    # `make cost COST_FLAGS=--split` (tests/bench/cost.py through policy_cost.py) briefly: it
    # measures, and its
    # driver really runs the shipped policies on the plain copy (their decision lands in its
    # audit).
    if callgrind_n(binary) == "off":
        pytest.skip("no valgrind, or a sanitized build: policy_cost.py cannot count")
    tools = os.environ.get("GPUGUARD_TOOLS")
    if not tools:
        pytest.skip("GPUGUARD_TOOLS is not set: run through 'make test'")
    engine = Path(binary).parent / "bench" / "bench_engine"
    review = REPO / "tests" / "data" / "reviews" / "bench-pod.json"
    work = tmp_path / "work"
    out = procs.run(["/usr/bin/python3", str(REPO / "tests" / "bench" / "cost.py"),
                     "--bench-engine", str(engine), "--split", "--reviews", review.name,
                     "--callgrind-n", "20,40", "--work-dir", str(work)],
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


def test_audit_cost_runs_and_reports(binary, tmp_path):
    """tests/bench/audit_cost.py, briefly (200 pods, 2 s of reviews each way): it runs, audits
    every pod and reports the figures docs/audit.md quotes."""
    report = tmp_path / "audit.txt"
    r = subprocess.run(["/usr/bin/python3", str(REPO / "tests" / "bench" / "audit_cost.py"),
                        "--bin", binary, "--pods", "200", "--seconds", "2", "--report",
                        str(report)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    text = report.read_text()
    assert text == r.stdout
    assert re.search(r"^audit: 220 evaluations in \S+ s: [\d,]+ evaluations/s; CPU of the audit "
                     r"thread \S+ s, [\d,]+ µs an evaluation; 201 reports built$", text, re.M), text
    assert len(re.findall(r"^admission, [^:]*:\s+p50 \S+ ms, p99 \S+ ms, max \S+ ms \(\d+ reviews\)",
                          text, re.M)) == 2


def test_two_counts_of_a_review_agree(binary, tmp_path):
    """bench_engine under callgrind as the cost figures run it (tests/bench/repeatable.py:
    setarch -R, time() stopped): two runs count a review alike.  Without the stopped clock,
    Lua's string-hash seed moves some 2 % of a review's instructions from run to run."""
    if callgrind_n(binary) == "off":
        pytest.skip("no valgrind, or a sanitized build: nothing to count")
    engine = Path(binary).parent / "bench" / "bench_engine"
    flags = ["--policies", REPO / "policies", "--lua", REPO / "lua", "--config",
             REPO / "deploy" / "gpuguard.yaml"]
    review = REPO / "tests" / "data" / "reviews" / "bench-pod.json"
    runs = [per_review(engine, flags, (20, 60), review, tmp_path)[0] for _ in range(2)]
    assert abs(runs[0] - runs[1]) <= 0.002 * runs[0], runs


def test_the_go_webhook_passes_its_own_tests(tmp_path):
    """tests/bench/gowebhook's go test (its answers, patches and refusals), built as the
    benchmark builds it: offline, with the toolchain at hand."""
    go, why = find_go(os.environ.get("BENCH_GO", ""))
    if not go:
        pytest.skip(f"no Go webhook to test: {why}")
    r = procs.run([go, "test", "./..."], cwd=GO_SOURCE, env=go_env(tmp_path), capture_output=True,
                  text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"^ok\s+\S+/gowebhook\s", r.stdout, re.M), r.stdout
