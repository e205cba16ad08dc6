"""`make lua-profile`'s binary, bench_engine_profile: the Lua VM instructions of the timed reviews
per policy function and line (tests/bench/profile/lua_profile.c)."""

import re
import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from test_policy_error_locations import lua_name

REVIEW = REPO / "tests" / "data" / "reviews" / "bench-pod.json"


def profiler(binary):
    path = Path(binary).parent / "bench" / "bench_engine_profile"
    if not path.exists():
        pytest.skip(f"{path} is not built (`make integration` builds it)")
    return path


def profile(binary, n, policies="policies", config="deploy/gpuguard.yaml", review=REVIEW,
            timeout=120):
    out = subprocess.run([str(profiler(binary)), "--policies", str(policies), "--lua", "lua",
                          "--config", str(config), "--phases", "both", "-n", str(n), str(review)],
                         cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    total = re.search(r"^Lua VM instructions per review: ([\d.]+) \((\d+) reviews profiled\)$",
                      out.stdout, re.M)
    assert total, out.stdout[-3000:]
    assert int(total.group(2)) == n
    sections = out.stdout.split("\nper function")[1]
    functions, rest = sections.split("\nper line (self)\n")
    lines, calls = rest.split("\ncalls per review")
    return float(total.group(1)), functions, lines, calls


def rows(section):
    """(inclusive or self, name) of each row of a section."""
    out = []
    for line in section.splitlines():
        m = re.match(r"^\s+([\d.]+)(?:\s+[\d.]+)?\s{2}(\S.*)$", line)
        if m:
            out.append((float(m.group(1)), m.group(2)))
    return out


def test_the_profile_counts_each_review_once_and_names_the_policy_lines(binary):
    few, functions, lines, calls = profile(binary, 3)
    more, _, _, _ = profile(binary, 9)
    # The same review each time: per review, 3 and 9 reviews agree (the 200 warm-up reviews
    # before the timed ones are left out, or the 3 would count some 67 times over).
    assert few > 1000
    assert abs(few - more) / more < 0.02, (few, more)
    # 40-gpu-quota reads the usage: judged every time, where the calls the policies remember are
    # answered from the memo after the first review (policies/README.md, "Remembered verdicts").
    by_name = {name: value for value, name in rows(functions)}
    quota = [v for name, v in by_name.items() if name.startswith("policies/40-gpu-quota.lua:")]
    assert quota and max(quota) <= few, functions
    assert any(name.startswith("lua/") for _, name in rows(lines)), lines
    assert any(name.startswith("C function ") for _, name in rows(calls)), calls


def counting_policy(tmp_path, loops):
    policies = tmp_path / f"loops-{loops}"
    policies.mkdir()
    (policies / "count.lua").write_text(
        "return { name = 'count', match = { kinds = { 'Pod' } },\n"
        "  validate = function()\n"
        f"    for i = 1, {loops} do end\n"
        "  end }\n")
    return policies


def test_each_instruction_is_counted_once_on_its_line_and_function(binary, tmp_path):
    runs = {}
    for loops in (1000, 3000):
        total, functions, lines, _ = profile(binary, 4, policies=counting_policy(tmp_path, loops),
                                             config=REPO / "deploy" / "gpuguard.yaml")
        line_counts = {name: v for v, name in rows(lines)}
        inclusive = {name: v for v, name in rows(functions)}
        selfs = [float(line.split()[1]) for line in functions.splitlines()[1:] if line.strip()]
        # Every instruction on one line and in one function's self count; the validate function
        # calls nothing, so its inclusive count is its self count, which is everything.
        assert sum(line_counts.values()) == total, lines
        assert sum(selfs) == total, functions
        count = lua_name(tmp_path / f"loops-{loops}" / "count.lua")  # as --policies names it
        assert inclusive.get(f"{count}:2") == total, functions
        runs[loops] = line_counts[f"{count}:3"]
    # One FORLOOP per iteration: 2,000 more iterations are 2,000 more instructions, no more.
    assert runs[3000] - runs[1000] == 2000, runs


def test_the_instruction_budget_still_stops_a_runaway_policy(binary, tmp_path):
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "spin.lua").write_text(
        "return { name = 'spin', match = { kinds = { 'Pod' } },\n"
        "  validate = function() while true do end end }\n")
    config = tmp_path / "gpuguard.yaml"
    config.write_text("engine:\n  instructions: 100000\n")
    total, _, lines, _ = profile(binary, 2, policies=policies, config=config, timeout=60)
    spin = [v for v, name in rows(lines) if name.endswith("spin.lua:2")]
    # Stopped by the budget (100,000 instructions once the 1 ms grace is over).  The deadline
    # too is checked only by the engine's hook: were the profiler to drop that hook, the policy
    # would spin until the subprocess timeout.
    assert spin, lines
    assert 100000 <= sum(spin) <= 200000, (sum(spin), total)
