#!/usr/bin/python3
"""bench_check.py - `gpuguard check` over generated pod manifests: documents
per second, one process on one core (the CLI is single-threaded).

    bench_check.py --bin build/gpuguard [--policies DIR] [--lua DIR]
                   [--config FILE] [-n 10000] [--repeat 3]

Generates N manifests (GPU and CPU Pods and Deployments, as a CI repository
holds them) twice: as N files in a directory tree and as one multi-document
stream, runs `check -o json` over each (output to /dev/null), and prints the
best of --repeat runs.  A figure, not a pass/fail test.
"""

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def manifest(i, rng):
    gpus = rng.choice([0, 0, 1, 1, 2, 4, 8])
    kind = rng.choice(["Pod", "Pod", "Deployment"])
    ns = rng.choice(["ml-train", "ml-serve", "research", "default"])
    labels = f"    app: app-{i}\n    team: team-{i % 7}\n"
    if gpus and i % 3 == 0:
        labels += f"    gpuguard.io/workload-class: {rng.choice(['training', 'inference', 'batch'])}\n"
    annotations = ""
    if gpus == 1 and i % 5 == 0:
        annotations = "  annotations:\n    gpuguard.io/gpu-memory: 18Gi\n"
    limits = f"            nvidia.com/gpu: {gpus}\n" if gpus else ""
    container = f"""      containers:
      - name: main
        image: nvcr.io/nvidia/pytorch:24.01-py3
        command: ["python", "train.py", "--epochs", "10"]
        env:
        - name: NCCL_DEBUG
          value: INFO
        resources:
          requests:
            cpu: "4"
            memory: 16Gi
          limits:
            memory: 32Gi
{limits}        volumeMounts:
        - name: data
          mountPath: /data
      volumes:
      - name: data
        emptyDir: {{}}
"""
    if kind == "Pod":
        spec = "\n".join(line[4:] for line in container.splitlines()) + "\n"
        return (f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: pod-{i}\n  namespace: {ns}\n"
                f"  labels:\n{labels.replace('    ', '    ')}{annotations}spec:\n"
                f"  restartPolicy: Never\n{spec}")
    tpl_labels = "".join("    " + line + "\n" for line in labels.splitlines())
    tpl_ann = "".join("    " + line + "\n" for line in annotations.splitlines())
    return (f"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: deploy-{i}\n"
            f"  namespace: {ns}\nspec:\n  replicas: 2\n  selector:\n    matchLabels:\n"
            f"      app: app-{i}\n  template:\n    metadata:\n      labels:\n{tpl_labels}"
            f"{tpl_ann}    spec:\n{container}")


def run(cmd, docs):
    t0 = time.perf_counter()
    out = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t0
    if out.returncode not in (0, 1):
        sys.exit(f"check failed ({out.returncode}): {out.stderr.decode()[-2000:]}")
    return docs / dt, dt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build/gpuguard")
    ap.add_argument("--policies", default="policies")
    ap.add_argument("--lua", default="lua")
    ap.add_argument("--config")
    ap.add_argument("-n", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    flags = ["--policies", a.policies, "--lua", a.lua]
    if a.config:
        if Path(a.config).exists():
            flags += ["--config", a.config]
        else:
            print(f"note: {a.config} does not exist; running without a configuration")
    rng = random.Random(42)
    docs = [manifest(i, rng) for i in range(a.n)]
    with tempfile.TemporaryDirectory(prefix="gpuguard-bench-") as tmp:
        tree = Path(tmp) / "tree"
        for i, text in enumerate(docs):
            d = tree / f"team-{i % 10}" / f"app-{i // 100}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"m-{i}.yaml").write_text(text)
        stream = Path(tmp) / "all.yaml"
        stream.write_text("---\n".join(docs))
        print(f"gpuguard check over {a.n} pod manifests "
              f"({'policies ' + a.policies if os.listdir(a.policies) else 'no policies'}), "
              f"one process, best of {a.repeat}:")
        for label, target in [(f"{a.n} files in a directory tree", tree),
                              (f"one stream of {a.n} documents", stream)]:
            config = [] if "--config" in flags else ["--no-config"]
            best = max(run([a.bin, "check", "-o", "json", *config, *flags, str(target)], a.n)
                       for _ in range(a.repeat))
            print(f"  {label:36s} {best[0]:10.0f} documents/s  ({best[1]:.2f} s)")


if __name__ == "__main__":
    main()
