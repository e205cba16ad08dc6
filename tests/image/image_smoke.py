"""image_smoke.py - the container image (`make image`), run the way the chart's
Deployment runs it: `make test-image` (GPUGUARD_IMAGE names the image).

The Deployment is deploy/install.yaml's (charts/gpuguard) with the certificate
read from a mounted Secret, as deploy/components/certs-from-secret makes it (its
JSON patch applied here): the default, certs.mode self, keeps the certificate
through the API server, which this test has not.  buildah run has no read-only
root, so the pod is made by hand: the image's root filesystem (`buildah mount`)
is bound read-only in a private mount and PID namespace, the Deployment's
volumes - a TLS Secret and the ConfigMap's files - are bound read-only at their
mountPaths, and the image's entrypoint runs chrooted (tests/image/pod.sh) with
the Deployment's user, group, fsGroup and arguments, its ports moved to
127.0.0.1:0 (loopback, ephemeral); the policies and the Lua library are the
image's own.  Its answers are checked against the tree's build (GPUGUARD_BIN)
serving the same files.  `make image-push` is checked against Debian's
docker-registry on loopback.

Not collected by `make test` (the file name): it needs root, buildah and a
built image.
"""

import base64
import json
import os
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

import jsonpatch
import pytest
import yaml

from conftest import REPO, launch, load_review, procs, start_server, wait_for

IMAGE = os.environ.get("GPUGUARD_IMAGE")
BIN = os.environ.get("GPUGUARD_BIN")
POD_SH = Path(__file__).resolve().parent / "pod.sh"
INSTALL = REPO / "deploy" / "install.yaml"
FROM_SECRET = REPO / "deploy" / "components" / "certs-from-secret" / "deployment.yaml"
# Packages of compilers and build tools, and -dev packages: none may be in the final
# stage (gcc-12-base, in every Debian base, holds no tool and does not match).
BUILD_TOOLS = re.compile(r"(gcc|g\+\+|cpp|clang|llvm)(-\d+)?|binutils.*|build-essential|make"
                         r"|pkg-?config|pkgconf|.*-dev")

if not IMAGE or not BIN:
    pytest.fail("GPUGUARD_IMAGE and GPUGUARD_BIN are not set: run through `make test-image`",
                pytrace=False)
if os.geteuid() != 0:
    pytest.fail("make test-image mounts and chroots: run it as root", pytrace=False)


def buildah(*args):
    res = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"buildah {' '.join(args)}: {res.stderr}"
    return res.stdout.strip()


# ---------------------------------------------------------------- the image and the pod spec


@pytest.fixture(scope="module")
def config():
    """The image's OCI configuration (user, entrypoint, environment)."""
    return json.loads(buildah("inspect", "--type", "image", IMAGE))["OCIv1"]["config"]


@pytest.fixture(scope="module")
def rootfs():
    """A working container of the image, mounted; removed afterwards."""
    ctr = buildah("from", "--pull=never", "--name", f"gpuguard-smoke-{os.getpid()}", IMAGE)
    try:
        yield Path(buildah("mount", ctr))
    finally:
        buildah("umount", ctr)
        buildah("rm", ctr)
    assert ctr not in buildah("containers", "--format", "{{.ContainerName}}").split()


def install_docs():
    return [d for d in yaml.safe_load_all(INSTALL.read_text()) if d]


@pytest.fixture(scope="module")
def pod():
    """The Deployment's pod template, certificate from the mounted Secret: (pod spec, its one
    container)."""
    [dep] = [d for d in install_docs() if d["kind"] == "Deployment"]
    dep = jsonpatch.apply_patch(dep, yaml.safe_load(FROM_SECRET.read_text()))
    spec = dep["spec"]["template"]["spec"]
    assert len(spec["containers"]) == 1
    return spec, spec["containers"][0]


def configmap_files(name):
    """{key: text} of deploy/install.yaml's ConfigMap `name`."""
    found = [d for d in install_docs()
             if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name]
    assert len(found) == 1, f"deploy/install.yaml has no ConfigMap {name}"
    return found[0]["data"]


@pytest.fixture(scope="module")
def volumes(pod, tmp_path_factory):
    """The container's volumeMounts laid out on the host: {"mounts": [(host path,
    mountPath)], "ca": the CA of the Secret's pair}.  The Secret's files have its
    defaultMode and group fsGroup, as the kubelet makes them."""
    spec, ctr = pod
    root = tmp_path_factory.mktemp("volumes")
    certs = root / "certs"
    subprocess.run([BIN, "certs", "--service", "gpuguard", "--namespace", "gpuguard-system",
                    "--out", str(certs), "--dev"], check=True, stdout=subprocess.DEVNULL)
    by_name = {v["name"]: v for v in spec["volumes"]}
    mounts = []
    for m in ctr["volumeMounts"]:
        assert m.get("readOnly"), f"volume {m['name']} is mounted read-write"
        vol, host = by_name[m["name"]], root / m["name"]
        host.mkdir()
        if "secret" in vol:
            files = {n: (certs / n).read_text() for n in ("tls.crt", "tls.key")}
        else:
            files = configmap_files(vol["configMap"]["name"])
        for key, text in files.items():
            (host / key).write_text(text)
            if "secret" in vol:
                os.chown(host / key, 0, spec["securityContext"]["fsGroup"])
                os.chmod(host / key, vol["secret"]["defaultMode"])
        assert "subPath" not in m, f"volume {m['name']}: a subPath mount is never updated"
        mounts.append((host, m["mountPath"]))
    return {"mounts": mounts, "ca": certs / "ca.crt"}


# Flags that need an API server, which this test has not: gpuguard writing its webhook
# configurations' failurePolicy (make chart-test runs them against a control plane).
NEEDS_API_SERVER = ("--webhook-configuration", "--webhook-failure-policy")


def local_args(args, paths=None):
    """The container's arguments with the ports on loopback, chosen by the kernel,
    absolute paths moved by `paths` (a function) when given, and without the flags that
    need an API server."""
    out = []
    for arg in args:
        name, eq, value = arg.partition("=")
        assert eq, f"argument {arg!r} is not --flag=value"
        if name in NEEDS_API_SERVER:
            continue
        if name in ("--listen", "--ops-listen"):
            value = "127.0.0.1:0"
        elif paths and value.startswith("/"):
            value = paths(value)
        out += [name, value]
    return out


def in_image(rootfs, pod, volumes, tmp_path, command):
    """The command line that runs `command` in the image as the pod's container:
    unshare, whose child runs it as the new namespace's PID 1."""
    spec, _ = pod
    sc = spec["securityContext"]
    mounts = tmp_path / "mounts"
    mounts.write_text("".join(f"{src} {dst}\n" for src, dst in volumes["mounts"]))
    root = tmp_path / "root"
    root.mkdir()
    return ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child",
            "sh", str(POD_SH), str(rootfs), str(root), str(mounts), str(sc["runAsUser"]),
            str(sc["runAsGroup"]), "--", *command]


def image_env(config):
    """The image's environment, and nothing of this process's."""
    return dict(e.split("=", 1) for e in config["Env"])


def child_pid(proc):
    """The host PID of unshare's child (the container's PID 1)."""
    children = wait_for(lambda: Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text()
                        .split(), step=0.01)
    assert children, "unshare started no child"
    return int(children[0])


def proc_status(pid):
    return dict(line.split(":\t", 1) for line in
                Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)


def exchange(server):
    """What the server answers: a GPU pod on both webhook paths, then a request
    that is not a review.  [(path, status, body)], patches decoded."""
    review = load_review("pod-create.json")
    answers = []
    for path, body in (("/mutate", review), ("/validate", review), ("/mutate", {"kind": "Pod"})):
        conn = server.connect()
        status, _, answer = conn.review(body, path=path, timeout="10s")
        conn.close()
        if isinstance(answer, dict) and "patch" in answer.get("response", {}):
            # Decoded: the order of keys inside an added object is the Lua table's.
            answer["response"]["patch"] = json.loads(base64.b64decode(answer["response"]["patch"]))
        answers.append((path, status, answer))
    return answers


# ---------------------------------------------------------------- the tests


def test_image_user_matches_the_deployment(config, pod):
    """Without the Deployment's securityContext the image runs as the same user."""
    spec, ctr = pod
    sc = spec["securityContext"]
    assert config["User"] == f"{sc['runAsUser']}:{sc['runAsGroup']}"
    assert ctr["securityContext"]["readOnlyRootFilesystem"] is True
    assert ctr["securityContext"]["allowPrivilegeEscalation"] is False


def test_serves_as_the_deployment_runs_it(rootfs, pod, config, volumes, tmp_path):
    spec, ctr = pod
    sc = spec["securityContext"]
    cmd = in_image(rootfs, pod, volumes, tmp_path, config["Entrypoint"] + local_args(ctr["args"]))
    # launch() takes the ports from the serving line and waits for /readyz.
    server = launch(cmd, tmp_path / "image.log", volumes["ca"], env=image_env(config))
    pid = child_pid(server.proc)
    try:
        status = proc_status(pid)
        assert status["Name"] == "gpuguard"
        uid, gid = str(sc["runAsUser"]), str(sc["runAsGroup"])
        assert status["Uid"].split() == [uid] * 4
        assert status["Gid"].split() == [gid] * 4
        assert status["Groups"].split() == [str(sc["fsGroup"])]
        assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
        assert status["NoNewPrivs"] == "1"
        assert status["NSpid"].split()[-1] == "1", "not the container's PID 1"
        mountinfo = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        options = {line.split()[4]: line.split()[5].split(",") for line in mountinfo}
        assert "ro" in options["/"], options["/"]
        for _, dst in volumes["mounts"]:
            assert "ro" in options[dst], (dst, options[dst])

        readyz = server.ops(ctr["readinessProbe"]["httpGet"]["path"])
        assert readyz[0] == 200 and readyz[1].startswith("ready: "), readyz
        assert server.ops(ctr["livenessProbe"]["httpGet"]["path"])[0] == 200
        answers = exchange(server)
    finally:
        os.kill(pid, signal.SIGTERM)
        exit_code = procs.stop(server.proc, None)  # unshare, once its child has exited
    assert exit_code == 0, (tmp_path / "image.log").read_text()
    errors = [r for r in server.log_lines() if r.get("level") == "error"]
    assert not errors, errors

    (_, mutate, mutated), (_, validate, validated), (_, bad, bad_body) = answers
    uid = load_review("pod-create.json")["request"]["uid"]
    assert mutate == 200 and mutated["response"]["uid"] == uid, mutated
    assert mutated["response"]["allowed"] is True
    assert mutated["response"]["patchType"] == "JSONPatch" and mutated["response"]["patch"]
    assert mutated["response"]["auditAnnotations"]["verdict"] == "patched"
    assert validate == 200 and validated["response"]["uid"] == uid, validated
    assert validated["response"]["allowed"] is True and "patch" not in validated["response"]
    assert bad == 400 and bad_body == "not an AdmissionReview: apiVersion is missing\n"

    # The tree's build, given the same files (the volumes', else the image's), answers the same.
    def on_host(path):
        for src, dst in volumes["mounts"]:
            if path == dst or path.startswith(dst + "/"):
                return str(src) + path[len(dst):]
        assert (rootfs / path.lstrip("/")).exists(), f"{path} is in no volume and not in the image"
        return str(rootfs / path.lstrip("/"))

    local = tmp_path / "local"
    local.mkdir()
    ref = start_server(BIN, volumes["ca"].parent, local, *local_args(ctr["args"], on_host))
    try:
        assert exchange(ref) == answers
    finally:
        assert ref.stop() == 0


def test_version_is_the_trees(rootfs, pod, config, volumes, tmp_path):
    tree = subprocess.run([BIN, "version"], capture_output=True, text=True, check=True).stdout
    cmd = in_image(rootfs, pod, volumes, tmp_path, [config["Entrypoint"][0], "version"])
    res = subprocess.run(cmd, env=image_env(config), capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout, res.stderr) == (0, tree, "")


def test_no_build_tools(rootfs):
    """The final stage holds no compiler, build tool or -dev package."""
    res = subprocess.run(["dpkg-query", f"--admindir={rootfs}/var/lib/dpkg", "-W",
                          "-f=${Package}\n"], capture_output=True, text=True, check=True)
    packages = res.stdout.split()
    assert "libc6" in packages and "libgnutls30" in packages, "not the package list"
    tools = [p for p in packages if BUILD_TOOLS.fullmatch(p)]
    assert not tools, f"build tools in the image: {tools}"
    for tool in ("cc", "gcc", "c++", "ld", "as", "make"):
        assert not (rootfs / "usr/bin" / tool).exists(), f"/usr/bin/{tool} in the image"


@pytest.fixture
def registry(tmp_path):
    """Debian's docker-registry on loopback (plain HTTP): its host:port."""
    conf = tmp_path / "registry.yml"
    conf.write_text(yaml.safe_dump({
        "version": 0.1, "http": {"addr": "127.0.0.1:0"},
        "storage": {"filesystem": {"rootdirectory": str(tmp_path / "data")}}}))
    log = tmp_path / "registry.log"
    with open(log, "wb") as out:
        proc = procs.spawn(["docker-registry", "serve", str(conf)], stdout=out,
                           stderr=subprocess.STDOUT)
    try:
        found = wait_for(lambda: re.search(r'msg="listening on (127\.0\.0\.1:\d+)"',
                                           log.read_text()) or proc.poll() is not None, step=0.02)
        assert isinstance(found, re.Match), f"docker-registry did not start: {log.read_text()}"
        yield found.group(1)
    finally:
        procs.stop(proc, signal.SIGTERM)


def make_image_push(name):
    return subprocess.run(["make", "--no-print-directory", "image-push", f"IMAGE={name}",
                           "IMAGE_PUSH_FLAGS=--tls-verify=false"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def test_image_push(registry):
    """`make image-push` puts the image, unchanged, in IMAGE's registry."""
    tag = IMAGE.rpartition(":")[2] if ":" in IMAGE.rpartition("/")[2] else "latest"
    name = f"{registry}/gpuguard:{tag}"
    buildah("tag", IMAGE, name)
    try:
        res = make_image_push(name)
        assert res.returncode == 0, res.stdout + res.stderr
        req = urllib.request.Request(f"http://{registry}/v2/gpuguard/manifests/{tag}", headers={
            "Accept": "application/vnd.oci.image.manifest.v1+json,"
                      "application/vnd.docker.distribution.manifest.v2+json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            manifest = json.load(resp)
        image_id = buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", IMAGE)
        assert manifest["config"]["digest"] == f"sha256:{image_id}"
    finally:
        buildah("rmi", name)


def test_image_push_fails_without_registry():
    """A registry that does not answer fails the push, and the error names it."""
    unreachable = f"127.0.0.1:1/gpuguard:smoke-{os.getpid()}"
    buildah("tag", IMAGE, unreachable)
    try:
        res = make_image_push(unreachable)
        assert res.returncode != 0
        assert "127.0.0.1:1" in res.stderr, res.stderr
    finally:
        buildah("rmi", unreachable)
