#!/usr/bin/python3
"""A real Kubernetes control plane on 127.0.0.1 with gpuguard installed as shipped
(docs/testing.md, "The local control plane").

    cluster.py up [--dir build/cluster] [--config deploy/gpuguard.yaml] [--add-config FILE]
                  [--replicas N] [--if-down] [--owner PID]
    cluster.py down [--dir build/cluster]
    cluster.py status [--dir build/cluster]

`up` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (built by
`make k8s-bin` into build/k8s/bin) on ephemeral ports with certificates made at start; creates a
fake GPU node pair for every pool of the configuration (tests/k8s/nodes.py); installs deploy/
with `kubectl apply -k` through an overlay that changes only what a control plane without kubelets
needs (the webhooks call https://127.0.0.1:PORT with the test CA; the Deployment scaled to 0);
then runs `gpuguard serve` on the host with a TokenRequest token of its ServiceAccount, so that
the shipped RBAC is what it runs with.  A keeper process refreshes that token before it expires
(as the kubelet does for a projected token) and, with --replicas above 1, forwards the webhook
port to the gpuguard processes in turn (tests/k8s/keeper.py).

Every process runs in its own process group, its PID in DIR/state.json; `down` stops them all,
and an `up` that fails stops what it started.  Logs: DIR/logs/<name>.log.
"""

import argparse
import base64
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(HERE), str(REPO / "tests" / "bench")]
import nodes  # noqa: E402
import pki  # noqa: E402
import procs  # noqa: E402  (process identity and groups, shared with the tests)

NAMESPACE = "gpuguard-system"
START_TIMEOUT = 180  # seconds for a component to come up, generous for a loaded 2-core machine
TOKEN_SECONDS = 3600
SERVERS = ("kube-apiserver", "etcd")  # stopped last, in this order


def free_ports(n):
    """n distinct free ports on 127.0.0.1: each socket stays bound until all are chosen."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def write_atomic(path, text, mode=0o644):
    """path holds text, old or new but never half: written beside it, then renamed."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


class Cluster:
    def __init__(self, dir, bin_dir=None, gpuguard=None):
        self.dir = Path(dir).resolve()
        self.bin = Path(bin_dir or REPO / "build" / "k8s" / "bin").resolve()
        self.gpuguard = Path(gpuguard or REPO / "build" / "gpuguard").resolve()
        self.state_file = self.dir / "state.json"
        self.state = json.loads(self.state_file.read_text()) if self.state_file.exists() else {}

    # ---- state and processes ------------------------------------------------------------

    def save(self):
        write_atomic(self.state_file, json.dumps(self.state, indent=2))

    @contextlib.contextmanager
    def changing(self):
        """The state as it is on disk now, locked against the other processes that write it
        (a test, the keeper, cluster-down), saved when the block ends."""
        with open(self.dir / "state.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.state_file.exists():
                self.state = json.loads(self.state_file.read_text())
            yield self.state
            self.save()

    @property
    def kubeconfig(self):
        return self.dir / "kubeconfig"

    def start(self, name, argv, env=None):
        """Start argv in its own process group, output to logs/<name>.log; record its PID.
        Not procs.spawn: the cluster outlives the process that starts it.  env: variables
        added to this process's environment."""
        with open(self.dir / "logs" / f"{name}.log", "ab") as log:
            proc = subprocess.Popen([str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO,
                                    env={**os.environ, **(env or {})} if env else None)
        with self.changing() as st:
            st.setdefault("pids", {})[name] = proc.pid
            st.setdefault("starts", {})[name] = procs.start_time(proc.pid)
        return proc

    def ours(self, name, pid):
        """Is pid still the process started as name (not one that took its PID since)?"""
        return pid and procs.start_time(pid) == self.state.get("starts", {}).get(name)

    def alive(self, name):
        pid = self.state.get("pids", {}).get(name)
        st = self.ours(name, pid) and procs.stat(pid)
        return bool(st) and st[0] != "Z"  # a zombie of ours is not alive

    def stop(self, *names, grace=15):
        """SIGTERM the process groups of names all at once, SIGKILL to what is left after grace
        seconds; returns once no process of them is left (zombies do not count)."""
        pids = []
        with self.changing() as st:
            for name in names:
                pid = st.get("pids", {}).pop(name, None)
                if self.ours(name, pid):
                    pids.append(pid)
                st.get("starts", {}).pop(name, None)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(procs.group_members(pid) for pid in pids) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)  # our own child (a test restarted it): reap it
            time.sleep(0.05)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)

    def wait(self, what, check, timeout=START_TIMEOUT, name=None):
        """Poll check() until it is true; fail naming what, with the log's tail."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if check():
                    return
            except Exception:  # not up yet
                pass
            if name and not self.alive(name):
                raise SystemExit(f"cluster: {name} exited while waiting for {what}\n"
                                 + self.log_tail(name))
            if time.monotonic() > deadline:
                raise SystemExit(f"cluster: {what} not ready after {timeout} s\n"
                                 + (self.log_tail(name) if name else ""))
            time.sleep(0.25)

    def log_tail(self, name, lines=25):
        try:
            text = (self.dir / "logs" / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "".join(f"  {name}| {l}\n" for l in text.splitlines()[-lines:])

    # ---- kubectl ------------------------------------------------------------------------

    def kubectl(self, *args, input=None, check=True):
        """kubectl (the one built here) on the admin kubeconfig; failing, a SystemExit with
        its message unless check is false."""
        cmd = [str(self.bin / "kubectl"), "--kubeconfig", str(self.kubeconfig), *map(str, args)]
        r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise SystemExit(f"cluster: kubectl {' '.join(map(str, args))}: {r.stderr.strip()}")
        return r

    def apply(self, objects):
        text = yaml.safe_dump_all(objects, sort_keys=False)
        return self.kubectl("apply", "--server-side", "--force-conflicts",
                            "--field-manager=gpuguard-e2e", "-f", "-", input=text)

    # ---- the pieces ---------------------------------------------------------------------

    def write_kubeconfig(self, path, user, api):
        pk = self.dir / "pki"
        if isinstance(user, str):
            auth = {"client-certificate": str(pk / f"{user}.crt"), "client-key": str(pk / f"{user}.key")}
        else:
            auth = user
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
            "clusters": [{"name": "e2e", "cluster": {"server": f"https://127.0.0.1:{api}",
                                                      "certificate-authority": str(pk / "ca.crt")}}],
            "users": [{"name": "e2e", "user": auth}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
        }))
        path.chmod(0o600)

    def start_etcd(self):
        ports = self.state["ports"]
        c, p = ports["etcd"], ports["etcd_peer"]
        self.start("etcd", [
            self.bin / "etcd", "--name", "e2e", "--data-dir", self.dir / "etcd",
            "--listen-client-urls", f"http://127.0.0.1:{c}",
            "--advertise-client-urls", f"http://127.0.0.1:{c}",
            "--listen-peer-urls", f"http://127.0.0.1:{p}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{p}",
            "--initial-cluster", f"e2e=http://127.0.0.1:{p}",
            "--unsafe-no-fsync", "--log-level", "warn"])
        self.wait("etcd", lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{c}/health", timeout=2).status == 200, name="etcd")

    def apiserver_argv(self):
        ports, pk = self.state["ports"], self.dir / "pki"
        return [
            self.bin / "kube-apiserver",
            "--etcd-servers", f"http://127.0.0.1:{ports['etcd']}",
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", ports["api"], "--endpoint-reconciler-type", "none",
            "--tls-cert-file", pk / "apiserver.crt", "--tls-private-key-file", pk / "apiserver.key",
            "--client-ca-file", pk / "ca.crt",
            "--service-cluster-ip-range", "10.0.0.0/24", "--allow-privileged=true",
            "--authorization-mode", "Node,RBAC",
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", pk / "sa.pub",
            "--service-account-signing-key-file", pk / "sa.key",
            "--profiling=false"]

    def start_apiserver(self):
        # Webhooks that name a Service reach it through the keeper (keeper.py, service_proxy).
        proxy = f"http://127.0.0.1:{self.state['ports']['proxy']}"
        self.start("kube-apiserver", self.apiserver_argv(),
                   env={"HTTPS_PROXY": proxy, "https_proxy": proxy})
        self.wait("kube-apiserver", lambda: self.kubectl(
            "get", "--raw", "/readyz", check=False).stdout.strip() == "ok", name="kube-apiserver")

    def restart_apiserver(self, compact=False):
        """Stop the API server and start it again with the same flags and ports.  Until it is
        ready its authorizer may refuse what RBAC allows (its caches fill after it serves): the
        window goes in the state, for tests that read logs.  With compact, etcd's history is
        compacted while the API server is down (compact_etcd)."""
        stopped = time.time()
        self.stop("kube-apiserver")
        if compact:
            self.compact_etcd()
        self.start_apiserver()
        with self.changing() as st:
            st.setdefault("apiserver_restarts", []).append([stopped, time.time()])

    def compact_etcd(self):
        """Write a key outside the API server's prefix, then compact etcd's history up to that
        write (its JSON gateway, as etcdctl put and compact do).  Every resourceVersion a client
        saw before is then older than the compaction, so its watch gets 410 Gone; without the
        write a client that had seen the newest revision could resume from it, which is still
        there.  Call it with the API server stopped, so no client sees the write."""
        url = f"http://127.0.0.1:{self.state['ports']['etcd']}/v3/kv"

        def post(path, body):
            req = urllib.request.Request(f"{url}/{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())
        marker = base64.b64encode(b"/cluster-test/compaction").decode()
        rev = int(post("put", {"key": marker, "value": marker})["header"]["revision"])
        post("compaction", {"revision": rev, "physical": True})
        return rev

    def start_controllers(self):
        pk = self.dir / "pki"
        self.start("kube-controller-manager", [
            self.bin / "kube-controller-manager", "--kubeconfig", self.dir / "controller-manager.kubeconfig",
            "--use-service-account-credentials=true",
            "--service-account-private-key-file", pk / "sa.key", "--root-ca-file", pk / "ca.crt",
            "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "0",
            "--controllers", "*"])
        self.start("kube-scheduler", [
            self.bin / "kube-scheduler", "--kubeconfig", self.dir / "scheduler.kubeconfig",
            "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "0"])
        self.start("kwok", [
            self.bin / "kwok", "--kubeconfig", self.kubeconfig, "--config", self.bin / "kwok-stages.yaml",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector", "kwok.x-k8s.io/node=fake",
            "--node-ip", "127.0.0.1", "--cidr", "10.244.0.0/16"])
        # The service account controller is up once a namespace has its default account.
        self.wait("the controller manager (default ServiceAccount)", lambda: self.kubectl(
            "get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0,
            name="kube-controller-manager")

    def make_fleet(self, config):
        objs = nodes.objects(config)
        self.apply(objs)
        names = [o["metadata"]["name"] for o in objs if o["kind"] == "Node"]

        def ready():
            got = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)["items"]
            ok = {n["metadata"]["name"] for n in got
                  if any(c["type"] == "Ready" and c["status"] == "True"
                         for c in n.get("status", {}).get("conditions", []))
                  and not any(t["key"] == "node.kubernetes.io/not-ready"
                              for t in n.get("spec", {}).get("taints") or [])}
            return set(names) <= ok
        self.wait(f"{len(names)} fake GPU nodes Ready", ready, name="kwok")

    def write_config(self, config_path, add_config):
        config = yaml.safe_load(Path(config_path).read_text())
        if add_config:
            extra = yaml.safe_load(Path(add_config).read_text())
            pools = extra.pop("pools", [])
            merge(config, extra)
            config["pools"] = config.get("pools", []) + pools
        write_atomic(self.dir / "gpuguard" / "gpuguard.yaml",
                     "# written by tests/k8s/cluster.py from " + str(config_path)
                     + (f" and {add_config}" if add_config else "") + "\n"
                     + yaml.safe_dump(config, sort_keys=False))
        return config

    def write_overlay(self):
        """deploy/ (deploy/install.yaml) with the webhooks pointed at the host with failurePolicy
        Fail (the install's is Ignore until gpuguard writes its CA: here the CA is the test's),
        the Deployment scaled to 0 and the configuration replaced."""
        ov = self.dir / "overlay"
        ov.mkdir(exist_ok=True)
        ca = base64.b64encode((self.dir / "gpuguard" / "ca.crt").read_bytes()).decode()
        url = f"https://127.0.0.1:{self.state['ports']['webhook']}"

        def client(path):
            return [op for i in (0, 1) for op in (
                {"op": "replace", "path": f"/webhooks/{i}/clientConfig",
                 "value": {"url": url + path, "caBundle": ca}},
                {"op": "replace", "path": f"/webhooks/{i}/failurePolicy", "value": "Fail"})]
        patches = [
            {"target": {"kind": "MutatingWebhookConfiguration", "name": "gpuguard"},
             "patch": yaml.safe_dump(client("/mutate"))},
            {"target": {"kind": "ValidatingWebhookConfiguration", "name": "gpuguard"},
             "patch": yaml.safe_dump(client("/validate"))},
            {"target": {"kind": "Deployment", "name": "gpuguard"},
             "patch": yaml.safe_dump([{"op": "replace", "path": "/spec/replicas", "value": 0}])},
        ]
        (ov / "gpuguard.yaml").write_bytes((self.dir / "gpuguard" / "gpuguard.yaml").read_bytes())
        (ov / "kustomization.yaml").write_text(
            "# Written by tests/k8s/cluster.py: deploy/ as shipped, but for what a control\n"
            "# plane without kubelets needs (the webhooks call gpuguard on the host).\n"
            + yaml.safe_dump({
                "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                "resources": [os.path.relpath(REPO / "deploy", ov)],
                # The install's ConfigMap is not generated: the namespace finds it.
                "configMapGenerator": [{"name": "gpuguard-config", "namespace": NAMESPACE,
                                        "behavior": "replace", "files": ["gpuguard.yaml"]}],
                "patches": patches}, sort_keys=False))
        return ov

    def refresh_token(self):
        """A TokenRequest token of gpuguard's ServiceAccount, written atomically."""
        token = self.kubectl("create", "token", "gpuguard", "-n", NAMESPACE,
                             f"--duration={TOKEN_SECONDS}s").stdout.strip()
        write_atomic(self.dir / "gpuguard" / "token", token, 0o600)

    def gpuguard_names(self):
        """The names of the gpuguard processes (their logs: logs/<name>.log)."""
        n = self.state["replicas"]
        return ["gpuguard"] if n == 1 else [f"gpuguard-{i}" for i in range(n)]

    def start_gpuguard(self):
        g, ports = self.dir / "gpuguard", self.state["ports"]
        self.write_kubeconfig(g / "kubeconfig", {"tokenFile": str(g / "token")}, ports["api"])
        self.serve()
        self.start("keeper", [sys.executable, HERE / "keeper.py", self.dir])
        self.wait_ready()

    def serve(self):
        """Start the gpuguard processes on gpuguard/gpuguard.yaml."""
        g, ports = self.dir / "gpuguard", self.state["ports"]
        names = self.gpuguard_names()
        for i, name in enumerate(names):
            listen = ports["webhook"] if len(names) == 1 else ports["replicas"][i]
            self.start(name, [
                self.gpuguard, "serve", "--listen", f"127.0.0.1:{listen}",
                "--ops-listen", f"127.0.0.1:{ports['ops'][i]}",
                "--tls-cert", g / "tls.crt", "--tls-key", g / "tls.key",
                "--config", g / "gpuguard.yaml", "--policies", REPO / "policies", "--lua", REPO / "lua",
                "--kubeconfig", g / "kubeconfig", "--threads", "2",
                *self.state.get("serve_flags", [])])

    def wait_ready(self):
        ports = self.state["ports"]
        for i, name in enumerate(self.gpuguard_names()):
            self.wait(f"{name} /readyz", lambda i=i: urllib.request.urlopen(
                f"http://127.0.0.1:{ports['ops'][i]}/readyz", timeout=2).status == 200, name=name)

    def restart_gpuguard(self, config_text=None, flags=None):
        """gpuguard again on another configuration (what it reads once at start, such as the
        rightsizing source, changes only so), or with other serve flags (kept for later
        restarts; [] for none); the keeper and its forwarder stay."""
        if config_text is not None:
            write_atomic(self.dir / "gpuguard" / "gpuguard.yaml", config_text, 0o644)
        if flags is not None:
            with self.changing() as st:
                st["serve_flags"] = [str(f) for f in flags]
        self.stop(*self.gpuguard_names())
        self.serve()
        self.wait_ready()

    def kill(self, name):
        """SIGKILL one process group at once, as a crash would end it; the others run on."""
        pid = self.state.get("pids", {}).get(name)
        if self.ours(name, pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)

    def wait_webhooks(self):
        """Until the API server calls gpuguard: a dry-run pod in a matched namespace is decided."""
        probe = {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "e2e-webhook-probe", "namespace": "default"},
                 "spec": {"containers": [{"name": "c", "image": "busybox"}]}}

        def answered():
            r = self.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                             input=json.dumps(probe), check=False)
            return r.returncode == 0
        # With several processes the keeper's forwarder is what the API server reaches.
        self.wait("the webhooks (a dry-run pod admitted through gpuguard)", answered,
                  name="keeper" if self.state["replicas"] > 1 else "gpuguard")

    # ---- up and down --------------------------------------------------------------------

    def route(self, service, ports):
        """Connections to service ("name.namespace.svc:443") go to ports on 127.0.0.1 in turn
        (keeper.py, service_proxy); no ports: the Service has no endpoints."""
        with self.changing():
            path = self.dir / "services.json"
            routes = json.loads(path.read_text()) if path.exists() else {}
            routes[service] = list(ports)
            write_atomic(path, json.dumps(routes))

    def up(self, config, add_config, replicas, owner=None, install=True):
        for d in ("logs", "pki", "gpuguard"):
            (self.dir / d).mkdir(parents=True, exist_ok=True)
        self.state = {"config": str(Path(config).resolve()),
                      "add_config": str(Path(add_config).resolve()) if add_config else None,
                      "replicas": replicas, "owner": owner, "pids": {},
                      "ports": {}}
        ports = free_ports(5 + replicas + (replicas if replicas > 1 else 0))
        self.state["ports"] = {"etcd": ports[0], "etcd_peer": ports[1], "api": ports[2],
                               "webhook": ports[3], "ops": ports[4:4 + replicas],
                               "replicas": ports[4 + replicas:-1], "proxy": ports[-1]}
        self.save()
        started = time.monotonic()
        pki.make(self.dir / "pki")
        subprocess.run([self.gpuguard, "certs", "--service", "gpuguard", "--namespace", NAMESPACE,
                        "--out", self.dir / "gpuguard", "--dev", "--force"], check=True,
                       stdout=subprocess.DEVNULL)
        api = self.state["ports"]["api"]
        self.write_kubeconfig(self.kubeconfig, "admin", api)
        self.write_kubeconfig(self.dir / "controller-manager.kubeconfig", "controller-manager", api)
        self.write_kubeconfig(self.dir / "scheduler.kubeconfig", "scheduler", api)
        cfg = self.write_config(config, add_config)
        self.start_etcd()
        self.start_apiserver()
        self.start_controllers()
        self.make_fleet(cfg)
        if install:
            self.install_gpuguard()
        else:  # the chart's tests install gpuguard themselves (tests/chart); the proxy is here
            self.start("keeper", [sys.executable, HERE / "keeper.py", self.dir])
        with self.changing() as st:
            st["started_in_s"] = round(time.monotonic() - started, 1)

    def install_gpuguard(self):
        """deploy/ through the tests' overlay, the policy reports' CRDs of both APIs (as
        README's install says, for the audit: tests/e2e/test_audit.py), and gpuguard serving
        on the host."""
        self.kubectl("apply", "-k", self.write_overlay())
        self.kubectl("create", "-f", REPO / "deploy" / "reports" / "wgpolicyk8s.io.yaml",
                     "-f", REPO / "deploy" / "reports" / "openreports.io.yaml")
        self.wait("the gpuguard ServiceAccount", lambda: self.kubectl(
            "get", "serviceaccount", "gpuguard", "-n", NAMESPACE, check=False).returncode == 0)
        self.refresh_token()
        self.start_gpuguard()
        self.wait_webhooks()

    def down(self, spare=()):
        """Stop every process of the cluster but those named in spare (the keeper stopping the
        cluster spares itself)."""
        if not self.state_file.exists():
            return
        with self.changing():
            pass  # the state as the last writer left it
        names = [n for n in self.state.get("pids", {}) if n not in spare]
        # The API server's clients together, then the API server, then etcd: an API server whose
        # etcd is gone takes its whole grace to stop.
        self.stop(*(n for n in names if n not in SERVERS))
        for server in SERVERS:
            self.stop(*(n for n in names if n == server))
        # Whatever was started without being recorded (a test killed between the two): every
        # component of this cluster names its directory in its arguments.
        for pid in self.strays({os.getpid()} if spare else ()):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def strays(self, spare_pids=()):
        """PIDs of live process-group leaders that are components of this cluster: one of its
        programs (build/k8s/bin, gpuguard, the keeper) naming its directory in its arguments."""
        marks = (str(self.dir).encode() + b"/", str(self.dir).encode() + b"\0")
        programs = {str(self.gpuguard).encode(), str(HERE / "keeper.py").encode(),
                    *(str(p).encode() for p in self.bin.glob("*"))}
        out = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                leader = os.getpgid(int(entry.name)) == int(entry.name)
            except (OSError, ProcessLookupError):
                continue
            ours = any(a in programs for a in argv[:2])
            if leader and ours and int(entry.name) not in spare_pids and \
                    any(m in b"\0".join(argv) + b"\0" for m in marks):
                out.append(int(entry.name))
        return out

    def running(self):
        return bool(self.state.get("pids")) and all(self.alive(n) for n in self.state["pids"])


def merge(into, extra):
    """extra's keys into into, mappings merged key by key, everything else replaced."""
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            merge(into[k], v)
        else:
            into[k] = v


def main():
    ap = argparse.ArgumentParser(description="A local Kubernetes control plane with gpuguard")
    ap.add_argument("command", choices=["up", "down", "status"])
    ap.add_argument("--dir", default=str(REPO / "build" / "cluster"))
    ap.add_argument("--config", default=str(REPO / "deploy" / "gpuguard.yaml"),
                    help="gpuguard configuration [deploy/gpuguard.yaml]")
    ap.add_argument("--add-config", help="a configuration merged over --config (pools appended)")
    ap.add_argument("--replicas", type=int, default=1, help="gpuguard processes [1]")
    ap.add_argument("--if-down", action="store_true",
                    help="up: do nothing when this cluster runs already")
    ap.add_argument("--owner", type=int,
                    help="up: stop the cluster when the process with this PID is gone")
    ap.add_argument("--no-gpuguard", action="store_true",
                    help="up: the control plane and its fleet only (the chart's tests install "
                         "gpuguard with helm)")
    a = ap.parse_args()
    c = Cluster(a.dir)
    if a.command == "status":
        print(json.dumps(c.state, indent=2))
        sys.exit(0 if c.running() else 1)
    if a.command == "down":
        c.down()
        print(f"cluster: stopped ({c.dir})")
        return
    if c.state.get("pids"):
        if a.if_down and c.running():
            print(f"cluster: running already ({c.dir})")
            return
        if c.running():
            raise SystemExit(f"cluster: running already in {c.dir}; `make cluster-down` first")
        c.down()  # what is left of a cluster that died
    if c.dir.exists():
        if not c.state_file.exists() and any(c.dir.iterdir()):
            raise SystemExit(f"cluster: {c.dir} holds files but no cluster state; not removing it")
        shutil.rmtree(c.dir)
    c.dir.mkdir(parents=True)
    # Stop what was started when up fails or is interrupted.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        c.up(a.config, a.add_config, a.replicas, a.owner, install=not a.no_gpuguard)
    except BaseException:
        c.down()
        raise
    print(f"cluster: up in {c.state['started_in_s']} s; "
          f"kubectl --kubeconfig {c.kubeconfig} get nodes")


if __name__ == "__main__":
    main()
