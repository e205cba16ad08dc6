"""repeatable.py - the prefix and environment of a callgrind run whose count repeats: address
randomisation off (setarch -R) and time() stopped (the LD_PRELOAD shim tests/tools/fixedtime.c,
built beside the benchmarks as build/tests/tools/fixedtime.so): Lua seeds its string hashes from
time(NULL), and each seed lays the policies' tables out differently.  Without them two identical
runs differ by some 2 % of a review; with them, by some 0.02 % (docs/performance.md)."""

import os
import shutil
from pathlib import Path


def shim_of(bench_engine):
    """The fixedtime shim built with bench_engine (build/bench/ -> build/tests/tools/)."""
    return Path(bench_engine).resolve().parent.parent / "tests" / "tools" / "fixedtime.so"


def callgrind_run(bench_engine):
    """(prefix, env) for running bench_engine under valgrind; a missing shim is an error, so
    that a count never silently varies."""
    shim = shim_of(bench_engine)
    if not shim.exists():
        raise FileNotFoundError(f"{shim} is missing: `make policy-cost` (or `make bench`) "
                                "builds it beside bench_engine")
    prefix = ["setarch", "-R"] if shutil.which("setarch") else []
    env = dict(os.environ, LD_PRELOAD=str(shim))
    return prefix, env
