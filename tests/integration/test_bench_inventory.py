"""bench_inventory, briefly: a relist of pods made from templates is read as the informer reads
a list, every pod held, and each template's spec charged once by the model, the rest of its pods
from the charges remembered (webhook/engine/chargememo.h); pods that are each a spec of their
own are each charged by the model; watch events go through the watch's path, those of pods
not listed adding them."""

import re
import subprocess
from pathlib import Path

import pytest

from conftest import REPO


def run(binary, *args):
    bench = Path(binary).parent / "bench" / "bench_inventory"
    if not bench.exists():
        pytest.skip(f"{bench} is not built: run through 'make test'")
    r = subprocess.run([str(bench), *args], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_pods_of_one_template_are_charged_once(binary):
    out = run(binary, "-n", "3000", "--templates", "30")
    assert "3000 pods (3000 held, 0 malformed" in out, out
    assert re.search(r"charges: 30 by the model, 2970 remembered \(30 specs held\)", out), out


def test_pods_of_their_own_specs_are_each_charged(binary):
    out = run(binary, "-n", "200")
    assert "200 pods (200 held, 0 malformed" in out, out
    assert "charges: 200 by the model, 0 remembered (200 specs held)" in out, out


def test_watch_events_update_the_listed_pods_and_add_new_ones(binary):
    out = run(binary, "-n", "300", "--templates", "3", "--events", "900")
    assert re.search(r"^  900 watch events \(MODIFIED\): \S+ s CPU \(\S+ us/event; making the "
                     r"lines, \S+ s, left out\), 900 pods held after$", out, re.M), out
