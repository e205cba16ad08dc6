"""A remembered answer is the answer: the shipped policies remember what they judged (10-gpu-sharing
its mutate, 20-gpu-placement, 30-gpu-guardrails and 60-gpu-queues their validate; policies/README.md,
"Remembered verdicts"), and a copy of a request must get byte for byte what the first got, patch,
warnings and audit annotations included.  Every review of tests/data/reviews is evaluated once and
three times on one engine (the last answered from the memo), and every manifest of the policy suites
and of ../shared/corpus (when present) is checked twice in one `gpuguard check`."""

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO

REVIEWS = REPO / "tests" / "data" / "reviews"
CORPUS = REPO.parent / "shared" / "corpus"
SHIPPED = ["--policies", str(REPO / "policies"), "--lua", str(REPO / "lua"), "--config",
           str(REPO / "deploy" / "gpuguard.yaml")]
# Reviews whose cluster state is a file beside them.
STATE = {"cost-dra.json": "cost-dra-state.json"}


def engine_tool():
    tools = os.environ.get("GPUGUARD_TOOLS")
    if not tools:
        pytest.skip("GPUGUARD_TOOLS is not set: run through 'make test'")
    return str(Path(tools) / "engine_tool")


def reviews():
    return sorted(p.name for p in REVIEWS.glob("*.json") if not p.name.endswith("-state.json"))


@pytest.mark.parametrize("name", reviews())
def test_a_review_answered_from_the_memo_is_answered_as_judged(name):
    flags = list(SHIPPED)
    if name in STATE:
        flags += ["--cluster-state", str(REVIEWS / STATE[name])]
    once = subprocess.run([engine_tool(), *flags, str(REVIEWS / name)], capture_output=True,
                          text=True, timeout=120)
    again = subprocess.run([engine_tool(), *flags, "--repeat", "3", str(REVIEWS / name)],
                           capture_output=True, text=True, timeout=120)
    assert once.returncode == 0, once.stderr
    assert again.returncode == 0, again.stderr
    assert again.stdout == once.stdout


def manifest_dirs():
    dirs = sorted(p for p in (REPO / "tests" / "policies").glob("*/manifests") if p.is_dir())
    return dirs + ([CORPUS] if CORPUS.is_dir() else [])


def test_every_manifest_checked_twice_gets_the_same_answers(binary, tmp_path):
    """Without quotas: check counts the pods it admitted as usage for the next, so a pod checked
    again may find its namespace full (the quota, which reads the usage, is never remembered)."""
    config = yaml.safe_load((REPO / "deploy" / "gpuguard.yaml").read_text())
    del config["quotas"]
    (tmp_path / "gpuguard.yaml").write_text(yaml.safe_dump(config))
    flags = [*SHIPPED[:4], "--config", str(tmp_path / "gpuguard.yaml")]
    dirs = [str(d) for d in manifest_dirs()]
    assert len(dirs) >= 5
    once = subprocess.run([binary, "check", *flags, *dirs], capture_output=True, text=True,
                          timeout=600)
    twice = subprocess.run([binary, "check", *flags, *dirs, *dirs], capture_output=True,
                           text=True, timeout=600)
    assert once.returncode == twice.returncode, twice.stderr[-2000:]
    body = pod_lines(once.stdout)
    lines = pod_lines(twice.stdout)
    assert len(body) > 100
    assert lines[:len(body)] == body
    assert lines[len(body):] == body  # the second time, answered from the memos


def pod_lines(out):
    """What check says of each pod, without its closing lines (the usage note and the counts)."""
    return [line for line in out.splitlines()
            if not line.startswith("GPU usage taken as empty") and not re.match(r"\d+ checked", line)]
