"""repeatable.py - the prefix and environment of a callgrind run whose count repeats: address
randomisation off (setarch -R) and time() stopped (the LD_PRELOAD shim tests/tools/fixedtime.c,
built beside the benchmarks as build/tests/tools/fixedtime.so): Lua seeds its string hashes from
time(NULL), and each seed lays the policies' tables out differently.  Without them two identical
runs differ by some 2 % of a review; with them, by some 0.02 % (docs/performance.md).

Also the one count that `make cost` (tests/bench/cost.py) and the split of policy_cost.py take:
instructions per review of bench_engine, the difference of two -n values divided by theirs."""

import os
import re
import shutil
import subprocess
from pathlib import Path

GRACE_US = "1000000000"  # the count hook's grace: never reached, as in a native run


class CountError(Exception):
    """A callgrind run that failed or printed no count; the message says which and why."""


def shim_of(bench_engine):
    """The fixedtime shim built with bench_engine (build/bench/ -> build/tests/tools/)."""
    return Path(bench_engine).resolve().parent.parent / "tests" / "tools" / "fixedtime.so"


def callgrind_run(bench_engine):
    """(prefix, env) for running bench_engine under valgrind; a missing shim is an error, so
    that a count never silently varies."""
    shim = shim_of(bench_engine)
    if not shim.exists():
        raise FileNotFoundError(f"{shim} is missing: `make cost` (or `make bench`) "
                                "builds it beside bench_engine")
    prefix = ["setarch", "-R"] if shutil.which("setarch") else []
    env = dict(os.environ, LD_PRELOAD=str(shim))
    return prefix, env


def count(bench_engine, flags, n, review, work, run=subprocess.run):
    """(instructions, stdout) of one callgrind run of bench_engine -n n on review, with flags
    (--policies, --lua, --config, --phases, --cluster-state ...) and --grace-us GRACE_US.  work:
    a directory for callgrind's output file, removed after.  run: subprocess.run, or a
    function that takes its arguments (bench_server.py's procs.run, which stops the run with
    the script)."""
    try:
        prefix, env = callgrind_run(bench_engine)
    except FileNotFoundError as e:
        raise CountError(str(e)) from None
    out_file = Path(work) / f"callgrind.{os.getpid()}.{Path(review).stem}.{n}.out"
    cmd = prefix + ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}",
                    str(bench_engine), *map(str, flags), "--grace-us", GRACE_US, "-n", str(n),
                    str(review)]
    out = run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    out_file.unlink(missing_ok=True)
    m = re.search(r"Collected : ([\d,]+)", out.stderr)
    if out.returncode != 0 or not m:
        raise CountError(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return int(m.group(1).replace(",", "")), out.stdout


def per_review(bench_engine, flags, counts, review, work, run=subprocess.run):
    """(instructions per review, stdout of the larger run): runs of counts = (lo, hi) reviews,
    their difference divided by hi - lo (review_share), so that start-up, loading and the
    warm-up cancel out.  run: as for count."""
    lo, hi = counts
    a, _ = count(bench_engine, flags, lo, review, work, run)
    b, out = count(bench_engine, flags, hi, review, work, run)
    return review_share(a, b, counts), out


def review_share(a, b, counts):
    """Instructions per review from the totals a and b of runs of counts = (lo, hi) reviews."""
    return (b - a) // (counts[1] - counts[0])
