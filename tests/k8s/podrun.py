"""Run a Deployment's gpuguard container on the host, as a kubelet would run its pods: the tests'
stand-in for the kubelet and container runtime the local control plane (cluster.py) has not, so
that what the chart installed is what serves.

What is taken from the cluster, not restated here:
- the container's args and env (fieldRef env from the downward API: POD_NAMESPACE, POD_NAME);
- its volumes: a ConfigMap or Secret volume becomes a directory with one file per key, replaced
  as a whole the way the kubelet swaps its `..data` link (`sync()` is the kubelet's periodic
  sync, done when a test asks instead of about once a minute);
- the image's own files: each `COPY SRC DEST` of deploy/Dockerfile maps DEST to the repository;
- the Service's port: connections to `name.namespace.svc:port` are routed to the processes
  (keeper.py's proxy, which the API server goes through for a webhook naming a Service);
- the ServiceAccount: a TokenRequest token in a kubeconfig (`--kubeconfig`), with the RBAC the
  chart gave it.
Listen addresses become 127.0.0.1 with ports of their own.  What a kubelet does and this does
not: probes, restarts, resource limits, the read-only root.
"""

import base64
import json
import os
import re
import shutil
import urllib.request
from pathlib import Path

import cluster as clustermod

REPO = Path(__file__).resolve().parent.parent.parent


def image_paths():
    """{path in the image: path in the repository} from deploy/Dockerfile's COPY lines."""
    out = {}
    for line in (REPO / "deploy" / "Dockerfile").read_text().splitlines():
        m = re.match(r"COPY\s+(?!--)(\S+)\s+(\S+)\s*$", line)
        if m:
            src, dest = m.groups()
            src = src.split("/*")[0]
            out[dest.rstrip("/")] = REPO / src
    return out


class Deployment:
    def __init__(self, cluster, namespace, name, service=None):
        self.cluster, self.ns, self.name = cluster, namespace, name
        self.service = service or name
        self.dir = cluster.dir / "pods" / name
        self.running = []  # [(process name, webhook port, ops port)]
        self.generation = 0

    def get(self, kind, name):
        return json.loads(self.cluster.kubectl("get", kind, name, "-n", self.ns, "-o",
                                               "json").stdout)

    # ---- volumes ------------------------------------------------------------------------

    def volume_data(self, volume):
        if "configMap" in volume:
            cm = self.get("configmap", volume["configMap"]["name"])
            return {k: v.encode() for k, v in (cm.get("data") or {}).items()}
        if "secret" in volume:
            s = self.get("secret", volume["secret"]["secretName"])
            return {k: base64.b64decode(v) for k, v in (s.get("data") or {}).items()}
        raise AssertionError(f"podrun: volume {volume['name']}: only configMap and secret volumes")

    def sync(self):
        """The kubelet's sync of every ConfigMap and Secret volume: new contents, swapped in whole
        (a new directory, then the `..data` link renamed over the old one)."""
        spec = self.get("deployment", self.name)["spec"]["template"]["spec"]
        self.generation += 1
        for v in spec.get("volumes", []):
            if "emptyDir" in v:
                (self.dir / "volumes" / v["name"]).mkdir(parents=True, exist_ok=True)
                continue
            root = self.dir / "volumes" / v["name"]
            data_dir = root / f"..{self.generation}"
            data_dir.mkdir(parents=True)
            for key, value in self.volume_data(v).items():
                (data_dir / key).write_bytes(value)
                link = root / key
                if not link.is_symlink():
                    link.symlink_to(Path("..data") / key)
            old = root / "..data"
            old = os.readlink(old) if old.is_symlink() else None
            tmp = root / "..data_tmp"
            tmp.symlink_to(data_dir.name)
            os.replace(tmp, root / "..data")
            if old:
                shutil.rmtree(root / old)
        return spec

    # ---- processes ----------------------------------------------------------------------

    def argv(self, container, mounts, listen, ops):
        def host_path(value):
            # A volume hides what the image has under its mount path.
            for paths in (mounts, image_paths()):
                for inside in sorted(paths, key=len, reverse=True):
                    if value == inside or value.startswith(inside + "/"):
                        return str(paths[inside]) + value[len(inside):]
            return value
        assert not container.get("command"), "podrun: the image's ENTRYPOINT (gpuguard serve) only"
        out = [str(self.cluster.gpuguard), "serve"]
        for a in container.get("args", []):
            flag, eq, value = a.partition("=")
            if flag == "--listen":
                value = f"127.0.0.1:{listen}"
            elif flag == "--ops-listen":
                value = f"127.0.0.1:{ops}"
            else:
                value = host_path(value)
            out.append(flag + eq + value if eq else host_path(a))
        return out + ["--kubeconfig", str(self.dir / "kubeconfig")]

    def env(self, container, pod_name):
        env = {}
        for e in container.get("env", []):
            ref = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            env[e["name"]] = {"metadata.namespace": self.ns, "metadata.name": pod_name}.get(
                ref, e.get("value", ""))
        return env

    def token(self, account):
        tok = self.cluster.kubectl("create", "token", account, "-n", self.ns,
                                   "--duration=3600s").stdout.strip()
        clustermod.write_atomic(self.dir / "token", tok, 0o600)
        self.cluster.write_kubeconfig(self.dir / "kubeconfig", {"tokenFile": str(self.dir / "token")},
                                      self.cluster.state["ports"]["api"])

    def start(self, replicas=None):
        """The Deployment's pods as processes (replicas: its spec's unless given); ready when
        /readyz answers 200; the Service routed to them."""
        if not self.running:  # what a pod of an earlier run left
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        dep = self.get("deployment", self.name)
        spec = self.sync()
        n = replicas if replicas is not None else dep["spec"].get("replicas", 1)
        self.token(spec.get("serviceAccountName", "default"))
        container = spec["containers"][0]
        mounts = {m["mountPath"]: self.dir / "volumes" / m["name"]
                  for m in container.get("volumeMounts", [])}
        new = []
        for i, (listen, ops) in enumerate(zip(clustermod.free_ports(n), clustermod.free_ports(n))):
            pod = f"{self.name}-{self.generation}-{i}"
            self.cluster.start(pod, self.argv(container, mounts, listen, ops),
                               env=self.env(container, pod))
            new.append((pod, listen, ops))
        for pod, _, ops in new:
            self.cluster.wait(f"{pod} /readyz", lambda ops=ops: urllib.request.urlopen(
                f"http://127.0.0.1:{ops}/readyz", timeout=2).status == 200, name=pod)
        old, self.running = self.running, new
        self.route()
        self.cluster.stop(*[p for p, _, _ in old])  # a rolling update: new pods first
        return new

    def route(self):
        svc = self.get("service", self.service)
        for port in svc["spec"]["ports"]:
            self.cluster.route(f"{self.service}.{self.ns}.svc:{port['port']}",
                               [listen for _, listen, _ in self.running])

    def stop(self):
        self.cluster.route(f"{self.service}.{self.ns}.svc:443", [])
        self.cluster.stop(*[p for p, _, _ in self.running])
        self.running = []
