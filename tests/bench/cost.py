#!/usr/bin/python3
"""cost.py - the cost gate (`make cost`): instructions per review of a fixed set of reviews that
stands for the features, each compared with its baseline in tests/bench/cost-baseline.json.

    cost.py --bench-engine build/bench/bench_engine [--policies policies] [--lua lua]
            [--config deploy/gpuguard.yaml] [--baseline tests/bench/cost-baseline.json]
            [--callgrind-n 500,1500] [--jobs N] [--reviews NAME,...] [--limit 3]
            [--update | --split [--phases both|mutate]]

Each review is counted with callgrind as tests/bench/repeatable.py counts (time() stopped,
address randomisation off, --grace-us past any run, both phases): bench_engine -n 1500 minus
bench_engine -n 500, divided by 1,000.  A review more than --limit % above its baseline fails
the gate (exit 1, a line naming the review, its count, its baseline and the percentage); so
does a review whose verdict (allowed, patched or denied, and its patch's number of operations) is no longer
the one it stands for (it would measure another path).  A review with a target is also held
to at most a percentage above another review of the same run: the DRA review to 20 % above the
headline's (its template's lookups and charge are the difference).
A table of every review is printed either way, and a review more than --limit % below its
baseline is named as one whose baseline is to be lowered.

--update writes the counts as the baseline (those of --reviews only, when given), with the
commit, the date and the command: lowering the baseline is part of any change that makes a
review cheaper; raising it is a deliberate commit that says which feature costs what and why.
It writes nothing while a review leaves its path or misses its target (a feature that breaks a
target changes the target in REVIEWS, in a commit that says so).

--split prints, instead, where the instructions of the --reviews (bench-pod.json unless given)
go: the engine's floor, the policies' logic and the bridge (tests/bench/policy_cost.py), of
both phases or, with --phases mutate, of the mutate phase only (the server's /mutate).

The reviews are tests/data/reviews/<name>; what each stands for is REVIEWS below, and
docs/performance.md ("The cost gate") lists them with their counts and spread.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from repeatable import CountError, count, review_share

REPO = Path(__file__).resolve().parent.parent.parent
REVIEWS_DIR = REPO / "tests" / "data" / "reviews"
BASELINE = REPO / "tests" / "bench" / "cost-baseline.json"
COMMAND = "make cost COST_UPDATE=1"
PHASES = "both"

# A pool the shipped configuration lacks: a KAI pod (its gpu-fraction annotation, the KAI
# scheduler) is denied without one ("no GPU pool runs KAI annotations"), so cost-kai.json runs
# with deploy/gpuguard.yaml plus this pool, as the first of its pools.
KAI_POOL = """\
- name: kai-l40s
  model: L40S
  sharing: kai
  node_selector: {gpuguard.io/pool: kai-l40s}
  taints: [{key: nvidia.com/gpu, value: kai-l40s, effect: NoSchedule}]
"""


class Review:
    def __init__(self, name, stands_for, verdict, cluster_state=None, pool=None, within=None,
                 at_most=None):
        self.name = name
        self.stands_for = stands_for
        self.verdict = verdict  # bench_engine's verdict of the last review: "patched, N ops"
        self.cluster_state = cluster_state  # a file beside the review, for --cluster-state
        self.pool = pool  # YAML of a pool added to the configuration
        self.within = within  # (another review, percent): at most that much above its count
        self.at_most = at_most  # instructions per review it may take at most


# The set, in the order of the table.  Each is an AdmissionReview as the API server sends it at
# CREATE (defaults filled in, no managedFields).
REVIEWS = [
    Review("bench-pod.json", "the headline: a vLLM pod (ReplicaSet) asking 18Gi of GPU memory, "
           "made a MIG 1g.20gb slice on a100-mig", "patched, 8 ops", at_most=550_000),
    Review("cost-whole-gpu.json", "a whole GPU: a training Job's pod, nvidia.com/gpu 1, "
           "exclusive on h100-train", "patched, 3 ops"),
    Review("cost-fraction.json", "a fraction: a notebook (StatefulSet pod), "
           "gpuguard.io/gpu-fraction 0.25, time-slicing on l4-shared", "patched, 8 ops"),
    Review("cost-mig.json", "MIG by name: a Triton pod (ReplicaSet), nvidia.com/mig-2g.20gb, "
           "on a100-mig", "patched, 6 ops"),
    Review("cost-dra.json", "DRA: a Job's pod claiming from the ResourceClaimTemplate "
           "single-gpu (cost-dra-state.json, as cluster state), on a100-dra", "patched, 5 ops",
           cluster_state="cost-dra-state.json", within=("bench-pod.json", 20)),
    Review("cost-kai.json", "KAI: a pod for kai-scheduler, gpu-fraction 0.5, passed through to "
           "kai-l40s (a pool added to the configuration)", "patched, 6 ops", pool=KAI_POOL),
    Review("cost-deployment.json", "a Deployment (kubectl apply), 1 GPU per replica: its "
           "template's pod through the policies", "patched, 4 ops"),
    Review("cost-pytorchjob.json", "a Kubeflow PyTorchJob, master and 3 workers of 8 GPUs: "
           "two templates' pods through the policies", "patched, 8 ops"),
]


def with_pool(config, pool, out):
    """config (YAML text) with pool first in its top-level pools list, written to out."""
    text = Path(config).read_text()
    m = re.search(r"^pools:[ \t]*(?:#.*)?\n(?:[ \t]*(?:#.*)?\n)*([ \t]*)- ", text, re.M)
    if not m:
        raise CountError(f"{config}: no block list of pools to add the review's pool to")
    block = "".join(m.group(1) + line + "\n" for line in pool.splitlines())
    at = text.index("\n", m.start()) + 1  # after the pools: line, before its comments
    out.write_text(text[:at] + block + text[at:])
    return out


def review_flags(review, args, work):
    """bench_engine's flags for what review runs against: the configuration (with its pool)
    and its cluster state."""
    flags = []
    config = args.config
    if review.pool:
        config = with_pool(config, review.pool, work / f"config-{Path(review.name).stem}.yaml")
    if config:
        flags += ["--config", config]
    if review.cluster_state:
        flags += ["--cluster-state", args.reviews_dir / review.cluster_state]
    return flags


def flags_of(review, args, work):
    return ["--policies", args.policies, "--lua", args.lua, "--phases", PHASES,
            *review_flags(review, args, work)]


def measure(reviews, args, work, baseline):
    """{name: (instructions per review, verdict)}, the runs spread over args.jobs workers, the
    longest first (by the baseline's count times -n), so that no long one starts last."""
    lo, hi = args.counts
    runs = sorted(((r, n) for n in (hi, lo) for r in reviews),
                  key=lambda job: -baseline["reviews"].get(job[0].name, 10 ** 6) * job[1])
    flags = {r.name: flags_of(r, args, work) for r in reviews}

    def run(job):
        r, n = job
        return count(args.bench_engine, flags[r.name], n, args.reviews_dir / r.name, work)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        got = dict(zip(runs, pool.map(run, runs)))
    result = {}
    for r in reviews:
        (a, _), (b, out) = got[(r, lo)], got[(r, hi)]
        m = re.search(r"^verdict: (\w+), (\d+) patch ops", out, re.M)
        result[r.name] = (review_share(a, b, args.counts),
                          f"{m.group(1)}, {m.group(2)} ops" if m else "?")
    return result


def load_baseline(path):
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {"reviews": {}}
    except ValueError as e:
        sys.exit(f"cost: {path}: {e}")
    if not isinstance(doc.get("reviews"), dict):
        sys.exit(f"cost: {path}: no \"reviews\" object (review -> instructions)")
    return doc


def commit():
    """The commit counted, and whether the tree differed from it (read only: no index
    refresh, so as not to take git's lock under someone else's feet)."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "--no-optional-locks", "-C", str(REPO), "status",
                                "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    return (head or "unknown") + (" (with uncommitted changes)" if dirty else "")


def write_baseline(path, doc, got, args):
    reviews = dict(doc.get("reviews", {}))
    for name, (instructions, _) in got.items():
        reviews[name] = instructions
    order = [r.name for r in REVIEWS]
    out = {
        "about": "make cost's baseline: instructions per review (callgrind) of each review of "
                 "tests/bench/cost.py's set; the gate fails a review more than 3 % above its "
                 "figure. Lowering it is part of any change that makes a review cheaper; raising "
                 "it is a deliberate commit that says which feature costs what and why.",
        "command": COMMAND,
        "measured": {"commit": commit(),
                     "date": datetime.date.today().isoformat(),
                     "callgrind_n": list(args.counts), "phases": PHASES,
                     "reviews_updated": sorted(got, key=order.index)},
        "reviews": {k: reviews[k] for k in sorted(reviews, key=lambda k: (
            order.index(k) if k in order else len(order), k))},
    }
    Path(path).write_text(json.dumps(out, indent=2) + "\n")


def percent(now, base):
    return (now - base) * 100.0 / base


def report(reviews, got, baseline, args):
    """Prints the table and the verdict lines; returns the failures."""
    lo, hi = args.counts
    print(f"cost: instructions per review (callgrind, -n {hi} minus -n {lo}, phases {PHASES}); "
          f"baseline {args.baseline}, a review fails more than {args.limit:g} % above it")
    measured = baseline.get("measured", {}).get("callgrind_n")
    if measured and list(measured) != [lo, hi]:
        print(f"cost: note: the baseline was counted with -n {measured[1]} minus -n "
              f"{measured[0]}; fewer reviews count less exactly")
    print("| review | stands for | verdict | instructions | baseline | change |")
    print("|---|---|---|---|---|---|")
    failures, lower = [], []
    for r in reviews:
        now, verdict = got[r.name]
        base = baseline["reviews"].get(r.name)
        change = f"{percent(now, base):+.2f} %" if base else "none"
        print(f"| {r.name} | {r.stands_for} | {verdict} | {now:,} | "
              f"{f'{base:,}' if base else 'none'} | {change} |")
        if verdict != r.verdict:
            failures.append(f"{r.name}: verdict {verdict}, not {r.verdict}: the review no "
                            "longer takes the path it stands for (check it with engine_tool "
                            "or gpuguard check)")
        elif args.update:
            pass
        elif not base:
            failures.append(f"{r.name}: {now:,} instructions per review and no baseline: add "
                            f"it with `{COMMAND}`")
        elif percent(now, base) > args.limit:
            failures.append(f"{r.name}: {now:,} instructions per review, "
                            f"{percent(now, base):.2f} % above its baseline {base:,} (limit "
                            f"{args.limit:g} %): make it cheaper, or raise the baseline "
                            f"(`{COMMAND}`) in a commit that says which feature costs what "
                            "and why")
        elif percent(now, base) < -args.limit:
            lower.append(f"{r.name}: {now:,}, {-percent(now, base):.2f} % below its baseline "
                         f"{base:,}")
    for line in lower:
        print(f"cost: lower the baseline ({COMMAND}): {line}")
    return failures + targets(reviews, got)


def targets(reviews, got):
    """Prints how each review with a target stands: its count against its ceiling
    (Review.at_most), how far it is above the review it is held to, counted in the same run
    (Review.within); returns the failures."""
    failures = []
    for r in reviews:
        if r.at_most and r.name in got:
            line = (f"{r.name}: {got[r.name][0]:,} instructions per review (target: at most "
                    f"{r.at_most:,})")
            print(f"cost: {line}")
            if got[r.name][0] > r.at_most:
                failures.append(line)
        if not r.within:
            continue
        other, limit = r.within
        if other not in got:
            print(f"cost: note: {r.name} is held to at most {limit} % above {other}, which this "
                  "run did not count")
            continue
        now, then = got[r.name][0], got[other][0]
        line = (f"{r.name}: {now:,} instructions per review, {percent(now, then):.2f} % above "
                f"{other}'s {then:,} (target: at most {limit} %)")
        print(f"cost: {line}")
        if percent(now, then) > limit:
            failures.append(line)
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench-engine", required=True, type=Path)
    ap.add_argument("--policies", default=REPO / "policies", type=Path)
    ap.add_argument("--lua", default=REPO / "lua", type=Path)
    ap.add_argument("--config", default=REPO / "deploy" / "gpuguard.yaml", type=Path)
    ap.add_argument("--baseline", default=BASELINE, type=Path)
    ap.add_argument("--reviews-dir", default=REVIEWS_DIR, type=Path)
    ap.add_argument("--reviews", help="names of the set's reviews, comma-separated [all; "
                    "--split: bench-pod.json]")
    ap.add_argument("--callgrind-n", default="500,1500",
                    help="the two review counts whose difference is measured [500,1500]")
    ap.add_argument("--jobs", type=int, default=min(os.cpu_count() or 1, 2),
                    help="callgrind runs at once [the CPUs, at most 2]")
    ap.add_argument("--limit", type=float, default=3.0,
                    help="percent above the baseline that fails [3]")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--update", action="store_true",
                      help="write the counts as the baseline (of --reviews only, when given)")
    mode.add_argument("--split", action="store_true",
                      help="print the floor, the policies' logic and the bridge instead")
    ap.add_argument("--work-dir", type=Path, help="with --split: keep the generated policies here")
    ap.add_argument("--phases", choices=("both", "mutate"), default=PHASES,
                    help="with --split: both phases (the gate's figure) or mutate [both]")
    args = ap.parse_args()
    if args.phases != PHASES and not args.split:
        ap.error("--phases: the gate and its baseline count both phases; only --split takes "
                 "another")
    args.counts = tuple(int(x) for x in args.callgrind_n.split(","))
    if len(args.counts) != 2 or not 0 < args.counts[0] < args.counts[1]:
        ap.error("--callgrind-n: two counts, the first smaller, e.g. 500,1500")
    by_name = {r.name: r for r in REVIEWS}
    names = args.reviews.split(",") if args.reviews else \
        ["bench-pod.json"] if args.split else list(by_name)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        ap.error(f"--reviews: {', '.join(unknown)} not in the set ({', '.join(by_name)})")
    reviews = [by_name[n] for n in names]
    if not shutil.which("valgrind"):
        sys.exit("cost: valgrind is not installed (`make deps` installs it)")
    with tempfile.TemporaryDirectory(prefix="cost-") as tmp:
        work = Path(tmp)
        if args.split:
            from policy_cost import split
            split(args.bench_engine, args.policies, args.lua, args.phases, args.counts,
                  [(args.reviews_dir / r.name, review_flags(r, args, work)) for r in reviews],
                  args.work_dir or work)
            return
        baseline = load_baseline(args.baseline)
        try:
            got = measure(reviews, args, work, baseline)
        except CountError as e:
            sys.exit(f"cost: {e}")
    failures = report(reviews, got, baseline, args)
    if failures:
        for line in failures:
            print(f"cost: FAIL {line}")
        sys.exit(1)
    if args.update:
        write_baseline(args.baseline, baseline, got, args)
        print(f"cost: baseline written to {args.baseline} ({len(got)} "
              f"review{'s' if len(got) != 1 else ''})")
    else:
        print(f"cost: every review within {args.limit:g} % of its baseline")


if __name__ == "__main__":
    main()
