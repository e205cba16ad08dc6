"""The allocation-failure sweep (tests/tools/alloc_sweep.c) over the shipped
policies: with the K-th allocation failing, for every K of one review (in
the engine and in the CLI's dry run) and of one policy load, in libc's
malloc family, jansson and the Lua allocator, a review that must be denied
is never allowed and nothing crashes."""

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
DENY = REPO / "tests" / "data" / "reviews" / "pod-deny.json"
# The same pod as a Deployment's template: denied through the workload path (templates found,
# each dry-run, the denials joined), where a lost allocation must not read as "no template".
DENY_WORKLOAD = REPO / "tests" / "data" / "reviews" / "deployment-deny.json"
# Loading runs 10,000 allocations, each sweep run a whole load: every 13th
# keeps it to seconds (--stride 1 is the full sweep).
LOAD_STRIDE = 13


def sweep(*args, review=DENY, policies=REPO / "policies"):
    tools = os.environ.get("GPUGUARD_TOOLS")
    if not tools:
        pytest.skip("GPUGUARD_TOOLS is not set: run through 'make test'")
    cmd = [str(Path(tools) / "alloc_sweep"), "--policies", str(policies),
           "--lua", str(REPO / "lua"), "--config", str(REPO / "deploy" / "gpuguard.yaml"),
           *args, str(review)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


LINE = re.compile(r"^(\w+) (\w+): (\d+) allocations, (\d+) runs: (\d+) denied, "
                  r"(\d+) engine errors, (\d+) allowed$")


def tallies(stdout):
    rows = {}
    for line in stdout.splitlines():
        m = LINE.match(line)
        assert m, line
        rows[(m[1], m[2])] = [int(x) for x in m.groups()[2:]]
    return rows


def layers():
    """libc is left out under AddressSanitizer, which owns malloc."""
    path = os.environ.get("GPUGUARD_BIN", "")
    asan = path and os.path.exists(path) and b"__asan_init" in open(path, "rb").read()
    return ["jansson", "lua"] if asan else ["libc", "jansson", "lua"]


@pytest.mark.parametrize("path", [[], ["--dryrun"]], ids=["engine", "dry run"])
def test_no_failed_allocation_in_a_review_allows_it(path):
    """The engine as the server calls it, and the dry run of `gpuguard check`
    (which also gives the object its namespace back)."""
    rows = tallies(sweep(*path))
    assert sorted(layer for _, layer in rows) == sorted(layers())
    for (what, layer), (n, runs, denied, errors, allowed) in rows.items():
        assert what == "review"
        assert n > 50, (layer, n)           # the review really allocates in this layer
        assert runs == n                    # every K from 1 to n
        assert allowed == 0 and denied + errors == runs


def forgetful(tmp_path):
    """The shipped policies without `remember`: every call is made, none answered from the memo
    (the sweep's runs after the first answer remembered calls from it, with fewer allocations)."""
    out = tmp_path / "policies"
    out.mkdir()
    for f in (REPO / "policies").glob("*.lua"):
        (out / f.name).write_text(re.sub(r"(?m)^    remember = .*\n", "", f.read_text()))
    return out


@pytest.mark.parametrize("remembering", [True, False], ids=["remembered", "judged"])
def test_no_failed_allocation_in_a_workload_review_allows_it(remembering, tmp_path):
    policies = REPO / "policies" if remembering else forgetful(tmp_path)
    rows = tallies(sweep(review=DENY_WORKLOAD, policies=policies))
    assert sorted(layer for _, layer in rows) == sorted(layers())
    for (what, layer), (n, runs, denied, errors, allowed) in rows.items():
        assert n > (100 if remembering else 200), (layer, n)
        assert allowed == 0 and denied + errors == runs == n


def test_no_failed_allocation_in_a_load_or_reload_allows_or_loses_the_set():
    rows = tallies(sweep("--load", "--stride", str(LOAD_STRIDE)))
    assert sorted(rows) == sorted((w, l) for w in ("load", "reload") for l in layers())
    for (what, layer), (n, runs, denied, errors, allowed) in rows.items():
        assert n > 100, (what, layer, n)
        assert runs == (n + LOAD_STRIDE - 1) // LOAD_STRIDE
        assert allowed == 0 and denied + errors == runs
        assert errors > 0, (what, layer)    # failures did reach the load
