#!/usr/bin/python3
"""bench_server.py - `gpuguard serve` under wrk against nginx (TLS ceiling) and a Go webhook.

    bench_server.py --bin build/gpuguard [--policies DIR] [--lua DIR] [--config FILE]
                    [--seconds 20] [--connections 32] [--threads 2] [--rounds 3]
                    [--callgrind-n 500,1500] [--go PATH|off] [--report FILE]

One run, everything on 127.0.0.1 with ephemeral ports, in a temporary directory:

 1. dev certificates from `gpuguard certs` (two pairs, laid out like a mounted
    Secret so that they can be rotated), copies of the policies, Lua library and
    configuration (so that a reload can be triggered without touching the repo);
 2. four AdmissionReview bodies: an inference pod with a gpu-fraction, a training
    pod with whole GPUs, a pod with no GPU and a pod with 30 containers; each is
    sent once and its answer checked (200, an AdmissionReview for its uid);
 3. the in-process engine (build/bench/bench_engine) on each body, and its
    instructions per review under callgrind on tests/data/reviews/bench-pod.json: the
    difference between two -n values (--callgrind-n), divided by theirs, with the
    count hook's grace raised (--grace-us) so that the count reflects a native run;
 4. the Go webhook (tests/bench/gowebhook: standard library only, encoding/json into
    structs, a JSON Patch adding one annotation) built with `go build -trimpath` next to
    bench_engine (build/bench/gowebhook), offline (GOTOOLCHAIN=local, GOPROXY=off); without
    go (--go, else go on PATH, else /usr/local/go/bin/go) or when the build fails, its rows
    say so and the rest runs as before;
 5. --rounds interleaved rounds, each of seven wrk runs of --seconds (HTTPS keep-alive,
    POST /mutate?timeout=10s, cycling through the bodies: tests/bench/wrk/review.lua):
    `gpuguard serve` with --connections, nginx (generated config, same certificate,
    `return 200` with a fixed AdmissionReview) with the same command, the Go webhook
    (same certificate, GOMAXPROCS = gpuguard's threads, as nginx's workers) with the same
    command, then the three with one connection (one request at a time), then gpuguard
    with one connection on the inference pod alone; the server's RSS is sampled from /proc
    in the first round; the shares of nginx's and of the Go webhook's requests/s and the
    p99s as ranges;
 6. the same load while a policy file is atomically replaced --events times, and
    while the certificate is swapped --events times (symlink swap), with a prober
    making a new TLS connection and one review every 200 ms: p99 and max next to
    the steady run's;
 7. the server's RSS with --idle-connections (1,000) open idle TLS connections.

It prints two Markdown tables at the end, the four headline figures (and the share of the
Go webhook) and the details, and writes them to --report.  Figures, not
pass/fail: the exit status is non-zero only when something could not be run
(a tool missing, the server not starting, a wrong answer); a missing go is not such a thing.

Ctrl-C (SIGINT, exit status 130), SIGTERM or SIGHUP stop it at once: every child (the
server, nginx and its workers, the Go webhook, go build, wrk, valgrind) is stopped with its
process group (SIGTERM, SIGKILL 10 s later) and waited for, and the temporary directory
removed.  Each child runs in a session of its own, known to a watchdog process that stops
them if this script itself is killed (tests/bench/procs.py).

Environment defaults: BENCH_SECONDS (20), BENCH_CONNECTIONS (32), BENCH_THREADS (2),
BENCH_ROUNDS (3), BENCH_IDLE_CONNECTIONS (1000), BENCH_ENGINE_N (2000),
BENCH_CALLGRIND_N (500,1500; "off" to skip), BENCH_EVENTS (5), BENCH_GO (the go command;
"off" to skip the Go webhook).
"""

import argparse
import base64
import copy
import datetime
import grp
import json
import os
import platform
import pwd
import re
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import procs  # tests/bench/procs.py: children stopped whatever happens
from repeatable import GRACE_US, CountError, per_review  # noqa: E402

REPO = Path(__file__).resolve().parent.parent.parent
WRK_SCRIPT = REPO / "tests" / "bench" / "wrk" / "review.lua"
BASE_REVIEW = REPO / "tests" / "data" / "reviews" / "bench-pod.json"
SERVICE, NAMESPACE = "gpuguard", "gpuguard-system"
SNI = f"{SERVICE}.{NAMESPACE}.svc"
PATH = "/mutate?timeout=10s"
SBIN_PATH = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"


def log(msg):
    print(f"bench: {msg}", flush=True)


class BenchError(Exception):
    pass


def env_int(name, default):
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


# --------------------------------------------------------------------------
# AdmissionReview bodies

def _env(pairs):
    return [{"name": k, "value": v} for k, v in pairs]


def _review(base, uid, namespace, meta, spec):
    r = copy.deepcopy(base)
    req = r["request"]
    req["uid"] = uid
    req["namespace"] = namespace
    obj = req["object"]
    obj["metadata"] = dict(meta, namespace=namespace)
    obj["spec"] = spec
    return r


def make_bodies(out):
    """Writes the four review bodies into out; returns [(label, path)]."""
    base = json.loads(BASE_REVIEW.read_text())
    pod = base["request"]["object"]
    base_spec = pod["spec"]
    base_meta = pod["metadata"]

    # 1. Inference (vLLM) asking for a quarter of a GPU: MIG slice on a100-mig.
    meta = copy.deepcopy(base_meta)
    meta["annotations"].pop("gpuguard.io/gpu-memory")
    meta["annotations"]["gpuguard.io/gpu-fraction"] = "0.25"
    inference = _review(base, "0b7e4c9a-1d2f-4e3a-8b5c-6d7e8f9a0b1c", "team-a", meta,
                        copy.deepcopy(base_spec))

    # 2. Training on 4 whole GPUs (a PyTorchJob worker): exclusive on h100-train.
    spec = copy.deepcopy(base_spec)
    trainer = spec["containers"][0]
    trainer.update(name="pytorch", image="nvcr.io/nvidia/pytorch:24.01-py3",
                   command=["torchrun"], args=["--nnodes=4", "--nproc-per-node=4",
                                               "train.py", "--config=/etc/train/llama-8b.yaml"],
                   ports=[{"containerPort": 29500, "name": "pytorchjob-port",
                           "protocol": "TCP"}])
    trainer["resources"] = {
        "requests": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "4"},
        "limits": {"memory": "256Gi", "nvidia.com/gpu": "4"}}
    trainer["env"] = _env([("NCCL_DEBUG", "INFO"), ("NCCL_IB_DISABLE", "0"),
                           ("MASTER_ADDR", "llm-train-master-0"), ("MASTER_PORT", "29500"),
                           ("WORLD_SIZE", "16"), ("RANK", "4"), ("PYTHONUNBUFFERED", "1")])
    trainer.pop("readinessProbe")
    trainer.pop("livenessProbe")
    spec["containers"] = [trainer]
    spec["restartPolicy"] = "OnFailure"
    spec.pop("affinity")
    meta = {"name": "llm-train-worker-1",
            "labels": {"team": "team-b", "gpuguard.io/workload-class": "training",
                       "training.kubeflow.org/job-name": "llm-train",
                       "training.kubeflow.org/replica-type": "worker",
                       "training.kubeflow.org/replica-index": "1"},
            "annotations": {"sidecar.istio.io/inject": "false"},
            "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                 "name": "llm-train", "controller": True,
                                 "blockOwnerDeletion": True,
                                 "uid": "9a8b7c6d-5e4f-4a3b-2c1d-0e9f8a7b6c5d"}]}
    training = _review(base, "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f", "team-b", meta, spec)

    # 3. No GPU: a web front end with an Envoy sidecar.
    spec = copy.deepcopy(base_spec)
    web, sidecar = spec["containers"]
    web.update(name="web", image="registry.example.com/shop/frontend:3.14.2",
               args=["--listen=:8080"], ports=[{"containerPort": 8080, "protocol": "TCP"}])
    web["resources"] = {"requests": {"cpu": "500m", "memory": "512Mi"},
                        "limits": {"memory": "1Gi"}}
    web["env"] = _env([("PORT", "8080"), ("LOG_FORMAT", "json"), ("CART_URL", "http://cart:80")])
    for probe in ("readinessProbe", "livenessProbe"):
        web[probe]["httpGet"]["port"] = 8080
        web[probe]["httpGet"]["path"] = "/healthz"
    sidecar.update(name="envoy", image="envoyproxy/envoy:v1.31.2",
                   args=["-c", "/etc/envoy/envoy.yaml"])
    spec.pop("affinity")
    meta = {"generateName": "frontend-6d5f7c8b9-", "labels": {
        "app": "frontend", "team": "team-a", "pod-template-hash": "6d5f7c8b9"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                             "name": "frontend-6d5f7c8b9", "controller": True,
                             "blockOwnerDeletion": True,
                             "uid": "2b3c4d5e-6f7a-4b8c-9d0e-1f2a3b4c5d6e"}]}
    no_gpu = _review(base, "2d3e4f5a-6b7c-4d8e-9f0a-1b2c3d4e5f6a", "team-a", meta, spec)

    # 4. 30 containers: a batch pipeline, the first stage on a shared GPU.
    spec = copy.deepcopy(base_spec)
    template = spec["containers"][0]
    template.pop("ports")
    containers = []
    for i in range(30):
        c = copy.deepcopy(template)
        c.update(name=f"stage-{i:02d}", image=f"registry.example.com/etl/stage-{i:02d}:2.7.{i}",
                 args=["--stage", str(i), "--in", f"/data/stage-{i:02d}",
                       "--out", f"/data/stage-{i + 1:02d}"])
        c["resources"] = {"requests": {"cpu": "250m", "memory": "512Mi"},
                          "limits": {"memory": "1Gi"}}
        c["env"] = _env([("STAGE", str(i)), ("BATCH_SIZE", "512"), ("OMP_NUM_THREADS", "1")])
        c["volumeMounts"] = c["volumeMounts"][:1] + [
            {"name": "kube-api-access-abcde", "readOnly": True,
             "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
        containers.append(c)
    containers[0]["resources"]["requests"]["nvidia.com/gpu"] = "1"
    containers[0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    spec["containers"] = containers
    spec["restartPolicy"] = "Never"
    spec.pop("affinity")
    meta = {"generateName": "etl-nightly-", "labels": {
        "team": "research", "gpuguard.io/workload-class": "batch", "job-name": "etl-nightly"},
        "annotations": {"gpuguard.io/gpu-fraction.stage-00": "0.5"},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "etl-nightly",
                             "controller": True, "blockOwnerDeletion": True,
                             "uid": "3c4d5e6f-7a8b-4c9d-0e1f-2a3b4c5d6e7f"}]}
    wide = _review(base, "3e4f5a6b-7c8d-4e9f-0a1b-2c3d4e5f6a7b", "research", meta, spec)

    out.mkdir(parents=True, exist_ok=True)
    bodies = []
    for label, name, review in [
            ("inference pod, gpu-fraction 0.25", "inference-fraction", inference),
            ("training pod, 4 GPUs", "training-gpus", training),
            ("pod with no GPU", "no-gpu", no_gpu),
            ("pod with 30 containers", "containers-30", wide)]:
        path = out / f"{name}.json"
        path.write_text(json.dumps(review, separators=(",", ":")))
        bodies.append((label, path))
    return bodies


# --------------------------------------------------------------------------
# Processes

def _raise_exit(signum, _frame):
    raise SystemExit(128 + signum)


def rss_kb(pid):
    """VmRSS and VmHWM of a process in kB, (None, None) when gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None, None
    vals = {}
    for key in ("VmRSS", "VmHWM"):
        m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
        vals[key] = int(m.group(1)) if m else None
    return vals["VmRSS"], vals["VmHWM"]


def stat_seconds(path):
    """utime + stime from a /proc stat file (a process's or a thread's), in seconds; 0 when gone."""
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids):
    """utime + stime of the given processes, in seconds."""
    return sum(stat_seconds(f"/proc/{pid}/stat") for pid in pids)


def worker_seconds(pid, name="webhook-worker"):
    """utime + stime of each thread of pid named name (the webhook workers: named at their
    first connection), in seconds, by thread id."""
    out = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            if Path(f"/proc/{pid}/task/{task}/comm").read_text().strip() != name:
                continue
        except OSError:
            continue
        out[task] = stat_seconds(f"/proc/{pid}/task/{task}/stat")
    return out


def children_of(pid):
    kids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            kids += Path(f"/proc/{pid}/task/{task}/children").read_text().split()
    except OSError:
        pass
    return [int(k) for k in kids]


def loadavg():
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cpu_model():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def version(cmd, pattern):
    out = procs.run(cmd, capture_output=True, text=True)
    m = re.search(pattern, out.stdout + out.stderr)
    return m.group(1) if m else "?"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tool(name, required=True):
    path = shutil.which(name, path=SBIN_PATH)
    if not path and required:
        raise BenchError(f"{name} not found: `make deps` installs it (Debian package "
                         f"{'nginx-light' if name == 'nginx' else name})")
    return path


# --------------------------------------------------------------------------
# gpuguard

class SecretVolume:
    """tls.crt -> ..data/tls.crt, ..data -> a version directory: the kubelet's layout."""

    def __init__(self, root):
        self.root = root
        root.mkdir()
        self.n = 0

    def publish(self, pair):
        self.n += 1
        version = self.root / f"..bench_{self.n:03d}"
        version.mkdir()
        for name in ("tls.crt", "tls.key"):
            shutil.copyfile(pair / name, version / name)
        tmp = self.root / "..data_tmp"
        os.symlink(version.name, tmp)
        os.replace(tmp, self.root / "..data")
        for name in ("tls.crt", "tls.key"):
            link = self.root / name
            if not link.is_symlink():
                os.symlink(f"..data/{name}", link)


class Server:
    def __init__(self, binary, tmp, args):
        self.tmp = tmp
        self.log_path = tmp / "server.log"
        self.policies = tmp / "policies"
        shutil.copytree(args.policies, self.policies)
        shutil.copytree(args.lua, tmp / "lua")
        self.config = tmp / "config" / "gpuguard.yaml"
        self.config.parent.mkdir()
        shutil.copyfile(args.config, self.config)
        self.pairs = []
        for name in ("certs-a", "certs-b"):
            out = procs.run([binary, "certs", "--service", SERVICE, "--namespace", NAMESPACE,
                             "--out", str(tmp / name), "--dev", "--force"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if out.returncode != 0:
                raise BenchError(f"gpuguard certs exited {out.returncode}: {out.stderr}")
            self.pairs.append(tmp / name)
        self.volume = SecretVolume(tmp / "secret")
        self.volume.publish(self.pairs[0])
        cmd = [binary, "serve", "--listen", "127.0.0.1:0", "--ops-listen", "127.0.0.1:0",
               "--tls-cert", str(self.volume.root / "tls.crt"),
               "--tls-key", str(self.volume.root / "tls.key"),
               "--config", str(self.config), "--policies", str(self.policies),
               "--lua", str(tmp / "lua"), "--inventory", "off"]
        if args.server_threads:
            cmd += ["--threads", str(args.server_threads)]
        self.cmd = cmd
        # O_APPEND, so that the log can be truncated between runs (a decision line per review).
        with open(self.log_path, "ab") as logf:
            self.proc = procs.spawn(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=logf, cwd=tmp)
        self.port = self.ops_port = None
        self.threads = None
        deadline = time.monotonic() + procs.PATIENCE
        while time.monotonic() < deadline and self.port is None:
            if self.proc.poll() is not None:
                raise BenchError(f"gpuguard serve exited {self.proc.returncode}:\n"
                                 f"{self.log_path.read_text(errors='replace')[-3000:]}")
            for line in self.log_path.read_text(errors="replace").splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if rec.get("msg") == "serving":
                    self.port, self.ops_port = rec["port"], rec["ops_port"]
                    self.threads = rec.get("threads")
            time.sleep(0.02)
        if self.port is None:
            raise BenchError(f"gpuguard serve logged no `serving` line in {procs.PATIENCE:.0f} s:\n"
                             + self.log_path.read_text(errors="replace")[-3000:])
        while time.monotonic() < deadline:
            if self.ops("/readyz")[0] == 200:
                return
            time.sleep(0.05)
        raise BenchError(f"gpuguard serve not ready in {procs.PATIENCE:.0f} s: "
                         + str(self.ops("/readyz")))

    def ops(self, path):
        try:
            with socket.create_connection(("127.0.0.1", self.ops_port), timeout=5) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                          .encode())
                data = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    data += chunk
        except OSError as e:
            return 0, str(e)
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split()[1]) if head.startswith(b"HTTP/") else 0
        return status, body.decode(errors="replace")

    def metric(self, name, **labels):
        _, text = self.ops("/metrics")
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name):
                continue
            m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)$", line)
            if not m:
                continue
            have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                total += float(m.group(2))
        return total

    def context(self):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        for pair in self.pairs:
            ctx.load_verify_locations(cafile=str(pair / "ca.crt"))
        ctx.set_alpn_protocols(["http/1.1"])
        return ctx

    def rss(self):
        return rss_kb(self.proc.pid)

    def log_errors(self):
        """Error lines in the log (since the last truncate)."""
        errors = []
        with open(self.log_path, "rb") as f:
            for line in f:
                if b'"level":"error"' in line:
                    errors.append(line.decode(errors="replace").strip())
        return errors

    def truncate_log(self):
        os.truncate(self.log_path, 0)


def tls_connect(port, ctx, timeout=10, sni=SNI):
    """A TLS connection as the API server's Go client makes it: TCP_NODELAY, as Go, curl and
    wrk set it (without it, the request written right after the client's Finished waits for
    the delayed ACK of the server, 40 ms, when the server sends nothing in between)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        return ctx.wrap_socket(sock, server_hostname=sni)
    except BaseException:
        sock.close()
        raise


def http_request(body, host="127.0.0.1"):
    return (f"POST {PATH} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, */*\r\nUser-Agent: bench-server\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def exchange(tls, request):
    """One request on an open connection; (status, body bytes)."""
    if request:
        tls.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = tls.recv(65536)
        if not chunk:
            raise BenchError("connection closed before the response headers")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "content-length":
            length = int(v.strip())
    while len(body) < length:
        chunk = tls.recv(65536)
        if not chunk:
            raise BenchError("connection closed in the response body")
        body += chunk
    return status, body


def answers(port, ctx, bodies, who=""):
    """Each body once over TLS, checked to be answered 200 with an AdmissionReview for its uid:
    ([(label, path, body, answer, response)], the TLS version and cipher)."""
    got = []
    with tls_connect(port, ctx) as tls:
        tls_info = f"{tls.version()} {tls.cipher()[0]}"
        for label, path in bodies:
            body = path.read_bytes()
            status, answer = exchange(tls, http_request(body))
            if status != 200:
                raise BenchError(f"{who}{path.name}: HTTP {status}: {answer[:500]!r}")
            resp = json.loads(answer)["response"]
            uid = json.loads(body)["request"]["uid"]
            if resp.get("uid") != uid:
                raise BenchError(f"{who}{path.name}: answer for uid {resp.get('uid')}, not {uid}")
            got.append((label, path, body, answer, resp))
    return got, tls_info


def check_answers(server, bodies):
    """Each body once over TLS: 200, an AdmissionReview for its uid; returns facts."""
    facts = []
    got, tls_info = answers(server.port, server.context(), bodies)
    for label, path, body, answer, resp in got:
        ops = len(json.loads(base64.b64decode(resp["patch"]))) if resp.get("patch") else 0
        verdict = ("denied" if not resp.get("allowed") else
                   f"patched ({ops} ops)" if ops else "allowed")
        facts.append({"label": label, "path": path, "size": len(body), "verdict": verdict,
                      "answer": answer, "message": (resp.get("status") or {}).get("message")})
    return facts, tls_info


# --------------------------------------------------------------------------
# nginx

def nginx_body(answer):
    """The fixed AdmissionReview for nginx's `return 200 '...'`; no quote, $ or backslash."""
    text = answer.decode()
    if any(c in text for c in "'$\\\n"):
        text = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "response": {"uid": "0b7e4c9a-1d2f-4e3a-8b5c-6d7e8f9a0b1c",
                                        "allowed": True}}, separators=(",", ":"))
    return text


class Nginx:
    def __init__(self, binary, tmp, cert, key, body, workers):
        self.dir = tmp / "nginx"
        self.dir.mkdir()
        self.error_log = self.dir / "error.log"
        user = ""
        if os.geteuid() == 0:  # workers drop to nobody; the master has read the key already
            nobody = pwd.getpwnam("nobody")
            user = f"user nobody {grp.getgrgid(nobody.pw_gid).gr_name};"
        last = ""
        for _ in range(5):  # a free port may be taken before nginx binds it
            self.port = free_port()
            conf = self.dir / "nginx.conf"
            d = self.dir
            conf.write_text(f"""
{user}
worker_processes {workers};
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {self.error_log} warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    keepalive_timeout 120s;
    keepalive_requests 100000000;
    client_max_body_size 16m;
    server {{
        listen 127.0.0.1:{self.port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        location / {{
            default_type application/json;
            return 200 '{body}';
        }}
    }}
}}
""")
            self.proc = procs.spawn([binary, "-p", str(d), "-c", str(conf), "-e",
                                     str(self.error_log)], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + procs.PATIENCE
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    return
                except OSError:
                    time.sleep(0.05)
            procs.stop(self.proc)
            last = self.error_log.read_text(errors="replace")[-2000:] \
                if self.error_log.exists() else ""
            if "Address already in use" not in last:
                break
        raise BenchError(f"nginx did not start: {last}")

    def pids(self):
        return [self.proc.pid] + children_of(self.proc.pid)

    def stop(self):
        procs.stop(self.proc, signal.SIGQUIT)


# --------------------------------------------------------------------------
# The Go webhook: a webhook written the usual way, as a second reference

GO_SOURCE = REPO / "tests" / "bench" / "gowebhook"


def find_go(choice):
    """The go command: choice (--go) when given, else go on PATH, else /usr/local/go/bin/go;
    (None, why) without one or with --go off."""
    if choice == "off":
        return None, "--go off"
    if choice:
        path = shutil.which(choice)
        return (path, None) if path else (None, f"{choice} is not an executable go command")
    path = shutil.which("go") or shutil.which("/usr/local/go/bin/go")
    return (path, None) if path else (None, "go is not installed (not on PATH nor in "
                                            "/usr/local/go/bin)")


def go_env(spare):
    """The environment go builds and tests tests/bench/gowebhook in, offline: the module has no
    dependencies, so nothing is fetched (GOPROXY=off) and no other toolchain is looked for
    (GOTOOLCHAIN=local); the build cache goes into spare (a directory) when the home
    directory cannot hold it."""
    env = dict(os.environ, GOTOOLCHAIN="local", GOPROXY="off", GOFLAGS="", GOWORK="off",
               CGO_ENABLED="0")
    if "GOCACHE" not in env:
        home = Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME") or "/nonexistent") /
                    ".cache")
        probe = home if home.exists() else home.parent
        if not os.access(probe, os.W_OK):
            env["GOCACHE"] = str(Path(spare) / "go-cache")
    return env


def build_gowebhook(go, out):
    """`go build -trimpath` of tests/bench/gowebhook into out (go_env, its cache next to out);
    (version, None) or (None, why)."""
    env = go_env(out.parent)
    ver = version([go, "version"], r"go version (\S+)")
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        res = procs.run([go, "build", "-trimpath", "-o", str(out), "."], cwd=GO_SOURCE, env=env,
                        capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return None, "go build took more than 600 s"
    if res.returncode != 0:
        return None, f"go build failed: {(res.stderr or res.stdout).strip()[-500:]}"
    log(f"Go webhook built with {ver} in {time.monotonic() - t0:.1f} s: {out}")
    return ver, None


class GoWebhook:
    """tests/bench/gowebhook on 127.0.0.1:0 (it prints the port it got), GOMAXPROCS threads."""

    def __init__(self, binary, tmp, cert, key, threads):
        self.out_path = tmp / "gowebhook.log"
        env = dict(os.environ, GOMAXPROCS=str(threads))
        with open(self.out_path, "ab") as out:
            self.proc = procs.spawn([str(binary), "--listen", "127.0.0.1:0", "--tls-cert",
                                     str(cert), "--tls-key", str(key)], env=env,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        self.port = None
        deadline = time.monotonic() + procs.PATIENCE
        while time.monotonic() < deadline:
            text = self.out_path.read_text(errors="replace")
            m = re.search(r"^gowebhook: serving on 127\.0\.0\.1:(\d+)$", text, re.M)
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                raise BenchError(f"the Go webhook exited {self.proc.returncode}: {text[-2000:]}")
            time.sleep(0.02)
        raise BenchError(f"the Go webhook printed no port in {procs.PATIENCE:.0f} s")

    def pids(self):
        return [self.proc.pid]

    def stop(self):
        rc = procs.stop(self.proc)
        if rc != 0:
            log(f"the Go webhook exited {rc} on SIGTERM")


def check_go_answers(port, ctx, bodies):
    """Each body once: 200, an AdmissionReview for its uid, allowed, a one-operation patch
    adding an annotation; returns (TLS version and cipher, the answer to the first body)."""
    got, tls_info = answers(port, ctx, bodies, "Go webhook, ")
    for _, path, _, answer, resp in got:
        patch = json.loads(base64.b64decode(resp.get("patch") or "W10="))
        if not resp.get("allowed") or len(patch) != 1 or \
                not patch[0]["path"].startswith("/metadata/annotations"):
            raise BenchError(f"Go webhook, {path.name}: unexpected answer {answer[:500]!r}")
    return tls_info, got[0][3]


# --------------------------------------------------------------------------
# Load

class Sampler(threading.Thread):
    """VmRSS of a process every 0.2 s until stopped."""

    def __init__(self, pid, stop, deadline):
        super().__init__(daemon=True)
        self.pid, self.stop_event, self.deadline = pid, stop, deadline
        self.samples = []

    def run(self):
        while not self.stop_event.is_set() and time.monotonic() < self.deadline:
            rss, _ = rss_kb(self.pid)
            if rss is not None:
                self.samples.append(rss)
            self.stop_event.wait(0.2)


class Prober(threading.Thread):
    """A new TLS connection and one review every `every` seconds: (latency ms, ok)."""

    def __init__(self, port, ctx, body, stop, deadline, every=0.2):
        super().__init__(daemon=True)
        self.port, self.ctx, self.request = port, ctx, http_request(body)
        self.stop_event, self.deadline, self.every = stop, deadline, every
        self.results = []

    def run(self):
        while not self.stop_event.is_set() and time.monotonic() < self.deadline:
            t0 = time.perf_counter()
            ok = False
            try:
                with tls_connect(self.port, self.ctx, timeout=10) as tls:
                    ok = exchange(tls, self.request)[0] == 200
            except (OSError, BenchError, ValueError):
                pass
            self.results.append(((time.perf_counter() - t0) * 1000, ok))
            self.stop_event.wait(self.every)


class Events(threading.Thread):
    """Calls action(i) `count` times, evenly over `seconds`."""

    def __init__(self, action, count, seconds, stop):
        super().__init__(daemon=True)
        self.action, self.count, self.seconds, self.stop_event = action, count, seconds, stop
        self.done = 0
        self.error = None

    def run(self):
        start = time.monotonic()
        for i in range(self.count):
            at = start + self.seconds * (i + 0.5) / self.count
            if self.stop_event.wait(max(0.0, at - time.monotonic())):
                return
            try:
                self.action(i)
                self.done += 1
            except Exception as e:  # reported, not raised: the run goes on
                self.error = f"{type(e).__name__}: {e}"
                return


def machine_busy():
    """(busy, total, steal) jiffies of all CPUs from /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(f[:8])
    return total - f[3] - f[4], total, f[7]


def run_wrk(wrk, args, port, bodies, seconds, label, pid_list=None, rss_pid=None,
            events=None, probe=None, tmp=None, connections=None, workers_pid=None):
    """One wrk run (--connections unless given); returns a dict of its figures (with
    workers_pid, the cores each of its worker threads used: how evenly the load spread)."""
    url = f"https://127.0.0.1:{port}{PATH}"
    conns = connections or args.connections
    threads = min(args.threads, conns)
    cmd = [wrk, f"-t{threads}", f"-c{conns}", f"-d{seconds}s", "--timeout", "10s",
           "--latency", "-s", str(WRK_SCRIPT), url, "--"] + [str(p) for _, p in bodies]
    log(f"{label}: wrk -t{threads} -c{conns} -d{seconds}s {url}")
    stop = threading.Event()
    deadline = time.monotonic() + seconds + 30
    helpers = []
    sampler = prober = None
    if rss_pid:
        sampler = Sampler(rss_pid, stop, deadline)
        helpers.append(sampler)
    if probe:
        prober = Prober(port, probe[0], probe[1], stop, deadline)
        helpers.append(prober)
    if events:
        helpers.append(events)
    cpu0 = cpu_seconds(pid_list() if pid_list else [])
    workers0 = worker_seconds(workers_pid) if workers_pid else {}
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0 = machine_busy()
    t0 = time.monotonic()
    out_path = (tmp or Path(tempfile.gettempdir())) / f"wrk-{label.replace(' ', '-')}.txt"
    with open(out_path, "wb") as out:
        proc = procs.spawn(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    log(f"{label}: wrk pid {proc.pid}")
    try:
        for h in helpers:
            h.start()
        proc.wait(timeout=seconds + procs.PATIENCE)
    finally:
        # On an interrupt too: wrk killed at once, the helpers (daemon threads) told to stop
        # and left to it; only a run that ended waits for their figures.
        stop.set()
        procs.stop(proc, signal.SIGKILL)
    for h in helpers:
        h.join(timeout=15)
    wall = time.monotonic() - t0
    cpu = cpu_seconds(pid_list() if pid_list else []) - cpu0
    busy1 = machine_busy()
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # wrk, the only child reaped meanwhile
    text = out_path.read_text(errors="replace")
    for line in text.splitlines():
        if not line.startswith("BENCH_RESULT"):
            print("    " + line)
    m = re.search(r"^BENCH_RESULT (\{.*\})$", text, re.M)
    if proc.returncode != 0 or not m:
        raise BenchError(f"wrk failed ({proc.returncode}):\n{text[-3000:]}")
    res = json.loads(m.group(1))
    res["rps"] = res["requests"] / (res["duration_us"] / 1e6)
    res["errors_total"] = sum(res["errors"].values())
    res["cpu_cores"] = cpu / wall if pid_list else None
    if workers_pid:
        workers1 = worker_seconds(workers_pid)
        res["worker_cores"] = sorted(((workers1[t] - workers0.get(t, 0)) / wall for t in workers1),
                                     reverse=True)
    res["wrk_cores"] = (kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime) / wall
    span = max(1, busy1[1] - busy0[1])
    res["machine_cores"] = (busy1[0] - busy0[0]) / span * os.cpu_count()
    res["steal_cores"] = (busy1[2] - busy0[2]) / span * os.cpu_count()
    if sampler:
        res["rss_max_kb"] = max(sampler.samples) if sampler.samples else None
    if prober:
        lat = sorted(ms for ms, _ in prober.results)
        res["probe"] = {"n": len(lat), "failed": sum(1 for _, ok in prober.results if not ok),
                        "p50": lat[len(lat) // 2] if lat else None,
                        "max": lat[-1] if lat else None}
    if events:
        res["events_done"] = events.done
        res["events_error"] = events.error
    return res


def open_idle_connections(server, n, body, deadline):
    """n TLS connections, each with one review answered, left open; returns them.
    Each review is sent as soon as its handshake is done (the server closes a connection
    whose request has not come within its request timeout, 10 s, and 1,000 handshakes
    can take longer than that), then the answers are read."""
    ctx = server.context()
    conns = []
    request = http_request(body)
    try:
        for _ in range(n):
            if time.monotonic() > deadline:
                raise BenchError(f"opened only {len(conns)} of {n} connections in time")
            conns.append(tls_connect(server.port, ctx, timeout=10))
            conns[-1].sendall(request)
        for i, tls in enumerate(conns):
            if time.monotonic() > deadline:
                raise BenchError(f"only {i} of {n} reviews answered in time")
            status, _ = exchange(tls, b"")
            if status != 200:
                raise BenchError(f"review on idle connection {i + 1}: HTTP {status}")
    except BaseException:
        for c in conns:
            c.close()
        raise
    return conns


def callgrind_count(binary, tmp, counts):
    """Instructions per review of bench_engine on bench-pod.json under callgrind
    (repeatable.per_review, counts: (small n, large n))."""
    flags = ["--policies", tmp / "policies", "--lua", tmp / "lua", "--config",
             tmp / "config" / "gpuguard.yaml"]
    try:
        per, _ = per_review(binary, flags, counts, BASE_REVIEW, tmp, run=procs.run)
    except (CountError, OSError) as e:
        raise BenchError(str(e)) from None
    log(f"engine under callgrind: {per:,} instructions per review (-n {counts[1]} minus "
        f"-n {counts[0]})")
    return per


def engine_bench(binary, args, tmp, bodies):
    """bench_engine on each body: {label: (total us, wall us)}."""
    results = {}
    for label, path in bodies:
        out = procs.run([binary, "--policies", str(tmp / "policies"), "--lua",
                         str(tmp / "lua"), "--config", str(tmp / "config" / "gpuguard.yaml"),
                         "-n", str(args.engine_n), str(path)],
                        capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise BenchError(f"bench_engine on {path.name}: {out.stderr[-2000:]}")
        total = re.search(r"total\s+([\d.]+) us", out.stdout)
        wall = re.search(r"wall clock per review ([\d.]+) us", out.stdout)
        stages = " ".join(f"{k} {float(v):.0f}" for k, v in
                          re.findall(r"^  (?!total)(\S+)\s+([\d.]+) us$", out.stdout, re.M))
        results[label] = (float(total.group(1)), float(wall.group(1)) if wall else None, stages)
        log(f"engine {label}: {total.group(1)} us/review ({stages})")
    return results


# --------------------------------------------------------------------------
# Report

def ms(us):
    return f"{us / 1000:.2f}" if us is not None else "-"


def mb(kb):
    return f"{kb / 1024:.1f} MB" if kb is not None else "-"


def lat_row(r):
    lat = r["latency_us"]
    return f"{ms(lat['p50'])} / {ms(lat['p99'])} / {ms(lat['p99.9'])} / {ms(lat['max'])} ms"


def probe_text(r):
    p = r.get("probe")
    if not p or not p["n"]:
        return ""
    failed = f", {p['failed']} failed" if p["failed"] else ""
    return (f"; new connection + review (prober, {p['n']}×): "
            f"p50 {p['p50']:.1f} ms, max {p['max']:.1f} ms{failed}")


def others_text(r):
    others = max(0.0, r["machine_cores"] - r["cpu_cores"] - r["wrk_cores"] - r["steal_cores"])
    return f"everything else {others:.2f} cores, steal {r['steal_cores']:.2f}"


def cpu_text(name, r, ctx):
    others = max(0.0, r["machine_cores"] - r["cpu_cores"] - r["wrk_cores"] - r["steal_cores"])
    return (f"{name} {r['cpu_cores']:.2f}, wrk {r['wrk_cores']:.2f}, everything else "
            f"(this script included) {others:.2f}, stolen by the hypervisor "
            f"{r['steal_cores']:.2f} (of {ctx['nproc']})")


def spread(values, fmt):
    lo, hi = min(values), max(values)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}-{fmt(hi)}"


def headline(ctx):
    """The four figures the speed targets are held against."""
    a, rounds = ctx["args"], ctx["rounds"]
    rows = ["| figure | this run | target |", "|---|---|---|"]
    cg = ctx.get("callgrind")
    n1, n2 = a.callgrind_counts or (0, 0)
    rows.append("| engine instructions per review (callgrind, bench_engine on bench-pod.json, "
                f"difference between -n {n2} and -n {n1} per review, "
                f"--grace-us {GRACE_US}) | "
                + (f"{cg / 1000:,.0f} K" if cg else "not measured") + " | ≤ 550 K (make cost) |")
    share = [100 * r["g"]["rps"] / r["n"]["rps"] for r in rounds]
    rows.append(f"| webhook req/s as a share of nginx (wrk -t{min(a.threads, a.connections)} "
                f"-c{a.connections}, {len(rounds)} interleaved rounds of {a.seconds} s) | "
                f"**{spread(share, lambda v: f'{v:.0f}')} %** (gpuguard "
                f"{spread([r['g']['rps'] for r in rounds], lambda v: f'{v:,.0f}')} req/s, nginx "
                f"{spread([r['n']['rps'] for r in rounds], lambda v: f'{v:,.0f}')}) | ≥ 30 % |")
    p99 = lambda key: spread([r[key]["latency_us"]["p99"] for r in rounds], ms)  # noqa: E731
    rps = lambda key: spread([r[key]["rps"] for r in rounds], lambda v: f"{v:,.0f}")  # noqa: E731
    go_skip = ctx["go"]["skip"]
    if go_skip:
        rows.append("| gpuguard req/s as a share of a minimal Go webhook | not measured: "
                    f"{go_skip} | |")
    else:
        share = [100 * r["g"]["rps"] / r["w"]["rps"] for r in rounds]
        rows.append("| gpuguard req/s as a share of a minimal Go webhook (tests/bench/gowebhook, "
                    f"same rounds and wrk command) | **{spread(share, lambda v: f'{v:.0f}')} %** "
                    f"(Go webhook {rps('w')} req/s) | |")
    go_p99 = "Go webhook not measured" if go_skip else \
        f"Go webhook {p99('w1')} ms ({rps('w1')} req/s)"
    rows.append(f"| p99, one connection (wrk -t1 -c1, same rounds) | **{p99('g1')} ms** "
                f"({rps('g1')} req/s, the four bodies cycled); the {ctx['facts'][0]['label']} "
                f"alone **{p99('g1_one')} ms** ({rps('g1_one')} req/s); nginx {p99('n1')} ms "
                f"({rps('n1')} req/s); {go_p99} | ≤ 0.25 ms |")
    idle = ctx.get("idle")
    rows.append(f"| RSS with {idle['n']:,} kept-alive TLS connections | **{mb(idle['rss'])}** | "
                "≤ 64 MB |" if idle else "| RSS with kept-alive TLS connections | not measured | |")
    rows.append(f"| load average (1/5/15 min) at start / end | {ctx['load_start']} / "
                f"{ctx['load_end']} | |")
    return "\n".join(rows) + "\n"


def report(ctx):
    a = ctx["args"]
    rows = []

    def row(what, figure, target=""):
        rows.append(f"| {what} | {figure} | {target} |")

    g, n, w = ctx["steady"], ctx.get("nginx"), ctx.get("gowebhook")
    row("date", ctx["date"])
    row("machine", f"{os.cpu_count()} × {cpu_model()} (`nproc` {ctx['nproc']}), "
        f"{platform.system()} {platform.release()}, {ctx['mem_gb']:.0f} GiB")
    row("load average (1/5/15 min) at start / end",
        f"{ctx['load_start']} / {ctx['load_end']} (the machine is shared with other work)")
    row("load", f"wrk {ctx['wrk_version']}, {a.threads} threads, {a.connections} connections, "
        f"HTTPS keep-alive ({ctx['tls']}), {a.seconds} s per run, POST {PATH}, bodies cycled: "
        + "; ".join(f"{f['label']} ({f['size'] / 1024:.1f} KB, {f['verdict']})"
                    for f in ctx["facts"]))
    row("gpuguard", f"`gpuguard serve` {ctx['server_threads']} threads, shipped policies "
        f"({ctx['policies']}), `deploy/gpuguard.yaml`, log level info (a decision line per review)")
    row("**gpuguard requests/s**", f"**{g['rps']:,.0f}**")
    row("gpuguard latency p50 / p99 / p99.9 / max", lat_row(g), "p99 ≤ 2 ms")
    row("CPU during the run (cores)", cpu_text("gpuguard", g, ctx))
    if g.get("worker_cores"):
        # A worker is named at its first connection: one that never had any is not listed.
        idle = [0.0] * (ctx["server_threads"] - len(g["worker_cores"]))
        row("CPU of each worker thread during the run (cores; even is balanced)",
            ", ".join(f"{c:.2f}" for c in g["worker_cores"] + idle))
    if n:
        row("nginx ceiling requests/s", f"{n['rps']:,.0f}")
        row("nginx latency p50 / p99 / p99.9 / max", lat_row(n))
        row("nginx", f"nginx {ctx['nginx_version']}, {ctx['nginx_workers']} workers, "
            f"`return 200` with a fixed {ctx['nginx_body_size']} B AdmissionReview, "
            "same certificate and key, keep-alive, access log off")
        row("CPU during the nginx run (cores)", cpu_text("nginx", n, ctx))
        row("**gpuguard / nginx requests/s**", f"**{100 * g['rps'] / n['rps']:.0f} %**", "≥ 30 %")
    go = ctx["go"]
    if w:
        row("Go webhook requests/s", f"{w['rps']:,.0f}")
        row("Go webhook latency p50 / p99 / p99.9 / max", lat_row(w))
        row("Go webhook", f"tests/bench/gowebhook, {go['version']} (`go build -trimpath`, "
            f"standard library only), GOMAXPROCS {go['threads']}: net/http and crypto/tls "
            f"({go['tls']}), the review and the pod's metadata and containers decoded with "
            "encoding/json into structs, an answer for the uid, allowed, a JSON Patch adding "
            f"one annotation ({go['answer_size']} B for the first body), no log line per "
            "request; same certificate and key, keep-alive")
        row("CPU during the Go webhook run (cores)", cpu_text("Go webhook", w, ctx))
        row("**gpuguard / Go webhook requests/s**", f"**{100 * g['rps'] / w['rps']:.0f} %**")
    else:
        row("Go webhook", f"not measured: {go['skip']}")
    for conns, key in ((a.connections, ""), (1, "1")):
        names = ["gpuguard", "nginx"] + (["Go webhook"] if w else [])
        row(f"requests/s per round, wrk -c{conns}: {' / '.join(names)}",
            "; ".join(f"{i}: " + " / ".join(f"{r[k + key]['rps']:,.0f}"
                                            for k in "gnw"[:len(names)])
                      for i, r in enumerate(ctx["rounds"], 1)))
    servers = [("gpuguard", g), ("nginx", n), ("Go webhook", w)]
    probes = [(name, r["probe"]) for name, r in servers if r and r.get("probe")
              and r["probe"]["n"]]
    if len(probes) > 1:
        row("first review on a new TLS connection during the runs (prober, every 0.2 s; "
            "connect + handshake + review), p50 / max",
            ", ".join(f"{name} {p['p50']:.1f} / {p['max']:.1f} ms" for name, p in probes))
    for key, what in (("reload", "policy reload under load"),
                      ("rotation", "certificate rotation under load")):
        r = ctx.get(key)
        if not r:
            continue
        err = f", error: {r['events_error']}" if r.get("events_error") else ""
        row(f"{what}: {r['events_what']}",
            f"{r['rps']:,.0f} req/s, p99 {ms(r['latency_us']['p99'])} ms, "
            f"max {ms(r['latency_us']['max'])} ms{probe_text(r)}{err}; {others_text(r)}",
            "no spike vs steady")
    row("steady run for the two above",
        f"{g['rps']:,.0f} req/s, p99 {ms(g['latency_us']['p99'])} ms, "
        f"max {ms(g['latency_us']['max'])} ms{probe_text(g)}; {others_text(g)}")
    errs = [f"{name} {r['errors_total']}" for name, r in
            (("gpuguard", g), ("nginx", n), ("Go webhook", w), ("reload", ctx.get("reload")),
             ("rotation", ctx.get("rotation"))) if r]
    row("wrk errors (socket, timeout, non-2xx)", ", ".join(errs), "0")
    eng = ctx.get("engine")
    if eng:
        mean = sum(t for t, _, _ in eng.values()) / len(eng)
        row(f"engine in process (`bench_engine -n {a.engine_n}`, 1 thread): µs per review",
            "; ".join(f"{label} {t:.0f}" for label, (t, _, _) in eng.items())
            + f"; mean {mean:.0f} µs → at most {ctx['server_threads'] * 1e6 / mean:,.0f} "
            f"reviews/s on {ctx['server_threads']} threads before HTTP and TLS")
    else:
        row("engine in process", "bench_engine not built (`make bench` builds it)")
    row("server RSS after start (idle)", mb(ctx["rss_start"]))
    row("server RSS under load (peak of samples during the steady run)", mb(g.get("rss_max_kb")))
    idle = ctx.get("idle")
    if idle:
        row(f"server RSS with {idle['n']:,} open idle TLS connections",
            f"{mb(idle['rss'])} (before opening them {mb(idle['before'])}; "
            f"gpuguard_open_connections {idle['open']:.0f})", "≤ 64 MB")
    row("server peak RSS over the whole run (VmHWM)", mb(ctx.get("hwm")))
    lines = ["| what | figure | target |", "|---|---|---|"] + rows
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(REPO / "build" / "gpuguard"))
    ap.add_argument("--bench-engine", help="bench_engine binary [next to --bin: bench/]")
    ap.add_argument("--policies", default=str(REPO / "policies"))
    ap.add_argument("--lua", default=str(REPO / "lua"))
    ap.add_argument("--config", default=str(REPO / "deploy" / "gpuguard.yaml"))
    ap.add_argument("--seconds", type=int, default=env_int("BENCH_SECONDS", 20))
    ap.add_argument("--connections", type=int, default=env_int("BENCH_CONNECTIONS", 32))
    ap.add_argument("--threads", type=int, default=env_int("BENCH_THREADS", 2),
                    help="wrk threads")
    ap.add_argument("--server-threads", type=int, default=0,
                    help="gpuguard serve --threads [its default: the number of CPUs]")
    ap.add_argument("--idle-connections", type=int,
                    default=env_int("BENCH_IDLE_CONNECTIONS", 1000))
    ap.add_argument("--rounds", type=int, default=env_int("BENCH_ROUNDS", 3),
                    help="interleaved gpuguard / nginx rounds")
    ap.add_argument("--engine-n", type=int, default=env_int("BENCH_ENGINE_N", 2000))
    ap.add_argument("--callgrind-n", default=os.environ.get("BENCH_CALLGRIND_N") or "500,1500",
                    help='two review counts for the callgrind difference, or "off"')
    ap.add_argument("--warm-up", type=int,
                    help="seconds of each server's warm-up run [a quarter of --seconds, 1 to 3]")
    ap.add_argument("--events", type=int, default=env_int("BENCH_EVENTS", 5),
                    help="policy reloads and certificate swaps per run")
    ap.add_argument("--go", default=os.environ.get("BENCH_GO", ""),
                    help='the go command that builds the Go webhook [go on PATH, else '
                    '/usr/local/go/bin/go], or "off" to run without it')
    ap.add_argument("--report", default=str(REPO / "build" / "bench" / "report.md"))
    ap.add_argument("--keep-tmp", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()
    if a.seconds < 1 or a.connections < a.threads or a.threads < 1 or a.rounds < 1 or \
            (a.warm_up is not None and a.warm_up < 1):
        ap.error("need --seconds ≥ 1, --warm-up ≥ 1, --connections ≥ --threads ≥ 1 and "
                 "--rounds ≥ 1")
    a.callgrind_counts = None
    if a.callgrind_n != "off":
        try:
            a.callgrind_counts = tuple(int(v) for v in a.callgrind_n.split(","))
        except ValueError:
            a.callgrind_counts = ()
        if len(a.callgrind_counts) != 2 or not 0 < a.callgrind_counts[0] < a.callgrind_counts[1]:
            ap.error('--callgrind-n takes two increasing counts ("500,1500") or "off"')

    # Ctrl-C is KeyboardInterrupt even when this was started with SIGINT ignored, as a shell
    # starts a background job (`make test &`, a CI runner): otherwise Python leaves it ignored
    # and a SIGINT (test_bench_smoke.py sends one) would not stop the run.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_exit)
    tmp = Path(tempfile.mkdtemp(prefix="gpuguard-bench-"))
    try:
        return bench(a, tmp)
    except BenchError as e:
        print(f"bench: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted; stopping everything", file=sys.stderr)
        return 130
    finally:
        # Every child still running (all of them, after an error or an interrupt) is stopped
        # with its process group: SIGTERM (nginx's master then reaps its workers), SIGKILL
        # to what is left CLEAN_UP seconds later; a second Ctrl-C cannot cut it short.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        procs.shutdown(signal.SIGTERM, procs.CLEAN_UP)
        if a.keep_tmp:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def bench(a, tmp):
    wrk = tool("wrk")
    nginx_bin = tool("nginx")
    binary = str(Path(a.bin).resolve())
    if not os.access(binary, os.X_OK):
        raise BenchError(f"{binary} is not built (make)")
    engine_bin = Path(a.bench_engine) if a.bench_engine else Path(binary).parent / "bench" / \
        "bench_engine"

    # Room for the idle connections (server and this process inherit it).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = a.idle_connections + 1024
    if soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        log(f"ulimit -n {soft} -> {new}")
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft < want:
        a.idle_connections = max(0, soft - 1024)
        log(f"ulimit -n is {soft}: only {a.idle_connections} idle connections")

    ctx = {"args": a, "nproc": os.cpu_count(), "load_start": loadavg(),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "mem_gb": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30}
    ctx["wrk_version"] = version([wrk, "--version"], r"wrk (\S+)")
    ctx["nginx_version"] = version([nginx_bin, "-v"], r"nginx/(\S+)")
    log(f"{ctx['nproc']} CPUs ({cpu_model()}), load average {ctx['load_start']}, "
        f"{a.seconds} s per run, temporary directory {tmp}")

    # The Go webhook, built before anything runs (with a cold build cache: some 20 s).
    go, why = find_go(a.go)
    gobin = Path(binary).parent / "bench" / "gowebhook"
    ctx["go"] = {"skip": why}
    if go:
        ctx["go"]["version"], ctx["go"]["skip"] = build_gowebhook(go, gobin)
    if ctx["go"]["skip"]:
        log(f"no Go webhook figures: {ctx['go']['skip']}")

    bodies = make_bodies(tmp / "bodies")
    server = Server(binary, tmp, a)
    ctx["server_threads"] = server.threads or os.cpu_count()
    ctx["policies"] = ", ".join(sorted(p.stem for p in server.policies.glob("*.lua")))
    ctx["rss_start"] = server.rss()[0]
    log(f"gpuguard serve pid {server.proc.pid} on 127.0.0.1:{server.port} "
        f"(ops {server.ops_port}), RSS {mb(ctx['rss_start'])}")

    facts, ctx["tls"] = check_answers(server, bodies)
    ctx["facts"] = facts
    for f in facts:
        log(f"{f['path'].name}: {f['size']} B -> {f['verdict']}"
            + (f" ({f['message']})" if f["message"] else ""))

    if engine_bin.exists():
        ctx["engine"] = engine_bench(str(engine_bin), a, tmp, bodies)
        if a.callgrind_counts:
            ctx["callgrind"] = callgrind_count(str(engine_bin), tmp, a.callgrind_counts)
    else:
        log(f"{engine_bin} not built: no engine figures")

    server_pids = lambda: [server.proc.pid]  # noqa: E731
    probe_body = bodies[2][1].read_bytes()
    warm = a.warm_up if a.warm_up is not None else max(1, min(3, a.seconds // 4))
    run_wrk(wrk, a, server.port, bodies, warm, "gpuguard warm-up", tmp=tmp)
    server.truncate_log()

    # nginx, the ceiling: same certificate, same wrk command, the other server idle
    # meanwhile; the two alternate so that the machine's drift hits both alike.
    body = nginx_body(facts[0]["answer"])
    ctx["nginx_body_size"] = len(body)
    ctx["nginx_workers"] = ctx["server_threads"]
    ngx = Nginx(nginx_bin, tmp, server.pairs[0] / "tls.crt", server.pairs[0] / "tls.key",
                body, ctx["nginx_workers"])
    log(f"nginx pid {ngx.proc.pid} on 127.0.0.1:{ngx.port}")
    run_wrk(wrk, a, ngx.port, bodies, warm, "nginx warm-up", tmp=tmp)
    # The Go webhook, the same way: same certificate, as many threads as gpuguard's.
    gow = None
    if not ctx["go"]["skip"]:
        ctx["go"]["threads"] = ctx["server_threads"]
        gow = GoWebhook(gobin, tmp, server.pairs[0] / "tls.crt", server.pairs[0] / "tls.key",
                        ctx["go"]["threads"])
        ctx["go"]["tls"], answer = check_go_answers(gow.port, server.context(), bodies)
        ctx["go"]["answer_size"] = len(answer)
        log(f"Go webhook pid {gow.proc.pid} on 127.0.0.1:{gow.port}")
        run_wrk(wrk, a, gow.port, bodies, warm, "Go webhook warm-up", tmp=tmp)
    rounds = []
    for i in range(1, a.rounds + 1):
        first = i == 1
        probe = (server.context(), probe_body) if first else None
        r = {"g": run_wrk(wrk, a, server.port, bodies, a.seconds, f"gpuguard steady, round {i}",
                          pid_list=server_pids, rss_pid=server.proc.pid if first else None,
                          probe=probe, tmp=tmp, workers_pid=server.proc.pid),
             "n": run_wrk(wrk, a, ngx.port, bodies, a.seconds, f"nginx, round {i}",
                          pid_list=ngx.pids, probe=probe, tmp=tmp)}
        if gow:
            r["w"] = run_wrk(wrk, a, gow.port, bodies, a.seconds, f"Go webhook, round {i}",
                             pid_list=gow.pids, probe=probe, tmp=tmp)
        r["g1"] = run_wrk(wrk, a, server.port, bodies, a.seconds,
                          f"gpuguard one connection, round {i}", pid_list=server_pids, tmp=tmp,
                          connections=1)
        r["n1"] = run_wrk(wrk, a, ngx.port, bodies, a.seconds,
                          f"nginx one connection, round {i}", pid_list=ngx.pids, tmp=tmp,
                          connections=1)
        if gow:
            r["w1"] = run_wrk(wrk, a, gow.port, bodies, a.seconds,
                              f"Go webhook one connection, round {i}", pid_list=gow.pids,
                              tmp=tmp, connections=1)
        # One GPU pod over and over, as a quiet API server admitting a Deployment's replicas
        # sends it: the 30-container pod (a quarter of the cycle) sets the p99 above.
        r["g1_one"] = run_wrk(wrk, a, server.port, bodies[:1], a.seconds,
                              f"gpuguard one connection, {bodies[0][0]} alone, round {i}",
                              pid_list=server_pids, tmp=tmp, connections=1)
        rounds.append(r)
        server.truncate_log()
    ctx["rounds"] = rounds
    ctx["steady"], ctx["nginx"], ctx["gowebhook"] = rounds[0]["g"], rounds[0]["n"], \
        rounds[0].get("w")
    ngx.stop()
    if gow:
        gow.stop()

    # Policy reloads under load: atomic replace of a policy file (a changed comment).
    target = sorted(server.policies.glob("*.lua"))[0]
    original = target.read_text()

    def replace_policy(i):
        tmp_file = server.policies / f".{target.name}.bench-tmp"
        tmp_file.write_text(original + f"\n-- bench reload {i + 1}\n")
        os.replace(tmp_file, target)

    before = server.metric("gpuguard_policy_reloads_total", result="ok")
    stop = threading.Event()
    r = run_wrk(wrk, a, server.port, bodies, a.seconds, "gpuguard policy reloads",
                events=Events(replace_policy, a.events, a.seconds, stop), pid_list=server_pids,
                probe=(server.context(), probe_body), tmp=tmp)
    reloads = server.metric("gpuguard_policy_reloads_total", result="ok") - before
    failed = server.metric("gpuguard_policy_reloads_total", result="error")
    r["events_what"] = (f"{r['events_done']} atomic replaces of {target.name}, "
                        f"{reloads:.0f} reloads" + (f", {failed:.0f} refused" if failed else ""))
    ctx["reload"] = r
    errors = server.log_errors()
    server.truncate_log()
    if errors:
        log(f"{len(errors)} error lines during the reload run, first: {errors[0]}")

    # Certificate rotations under load: the Secret volume's ..data symlink swapped.
    def rotate(i):
        server.volume.publish(server.pairs[(i + 1) % 2])

    before = server.metric("gpuguard_tls_certificate_loads_total", result="ok")
    r = run_wrk(wrk, a, server.port, bodies, a.seconds, "gpuguard certificate rotations",
                events=Events(rotate, a.events, a.seconds, stop), pid_list=server_pids,
                probe=(server.context(), probe_body), tmp=tmp)
    loads = server.metric("gpuguard_tls_certificate_loads_total", result="ok") - before
    r["events_what"] = f"{r['events_done']} symlink swaps, {loads:.0f} certificate loads"
    ctx["rotation"] = r
    errors = server.log_errors()
    server.truncate_log()
    if errors:
        log(f"{len(errors)} error lines during the rotation run, first: {errors[0]}")

    # Idle connections.
    if a.idle_connections > 0:
        time.sleep(1)
        before = server.rss()[0]
        log(f"opening {a.idle_connections} idle TLS connections")
        t0 = time.monotonic()
        conns = open_idle_connections(server, a.idle_connections, probe_body, t0 + 120)
        log(f"opened in {time.monotonic() - t0:.1f} s")
        try:
            time.sleep(1)
            rss = server.rss()[0]
            open_now = server.metric("gpuguard_open_connections")
        finally:
            for c in conns:
                c.close()
        ctx["idle"] = {"n": a.idle_connections, "before": before, "rss": rss, "open": open_now}
        log(f"RSS with {a.idle_connections} connections: {mb(rss)} (before {mb(before)})")

    ctx["hwm"] = server.rss()[1]
    ctx["load_end"] = loadavg()
    if server.proc.poll() is not None:
        raise BenchError(f"gpuguard serve died with status {server.proc.returncode}")
    rc = procs.stop(server.proc)
    if rc != 0:
        log(f"gpuguard serve exited {rc} on SIGTERM")

    table = headline(ctx) + "\n" + report(ctx)
    out = Path(a.report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# gpuguard benchmark, {ctx['date']}\n\n{table}")
    print()
    print(table, end="")
    log(f"written to {out}")
    bad = [name for name in ("steady", "nginx", "gowebhook", "reload", "rotation")
           if ctx.get(name) and ctx[name]["errors_total"]]
    if bad:
        log(f"note: wrk counted errors in: {', '.join(bad)} (see the table)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
