"""The shipped webhook configurations and RBAC as the real API server applies them:
matchConditions (compiled by the API server) keep the controllers' own writes away from
gpuguard, failurePolicy Fail refuses pods while gpuguard is down and only where it should, and
gpuguard's ServiceAccount may do exactly what README says."""

import re

from e2e_support import REPO, pod_running, settled_requests, wait_for

SA = "system:serviceaccount:gpuguard-system:gpuguard"


def deployment(name, image="registry.example/app:1"):
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": {"team": "e2e"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name, "team": "e2e"}},
                                  "spec": {"containers": [{"name": "main", "image": image}]}}}}


def test_the_configurations_are_stored_with_their_match_conditions(kube):
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        cfg = kube.get(kind, "gpuguard")
        assert all(w.get("matchConditions") for w in cfg["webhooks"] if w["name"].startswith("workloads."))
    validating = kube.get("validatingwebhookconfiguration", "gpuguard")
    assert validating["webhooks"][0]["matchConditions"][0]["name"] == "reviewed-by-gpuguard"


def test_only_what_gpuguard_reads_is_sent_to_it(kube, gpuguard, namespace):
    web = deployment("web")
    web["spec"]["replicas"] = 2
    kube.run("apply", "-n", namespace, "-f", "-", input=web)
    wait_for("web's pods running", lambda: len([p for p in kube.items("pods", namespace, "app=web")
                                                if p.get("status", {}).get("phase") == "Running"]) == 2)
    pod = kube.items("pods", namespace, "app=web")[0]["metadata"]["name"]

    # Each changes something and none reaches gpuguard: fewer replicas make no new pods.
    before = settled_requests(gpuguard)
    kube.run("label", "pod", pod, "-n", namespace, "owner=alice")          # a label-only UPDATE
    kube.run("patch", "deployment", "web", "-n", namespace, "--type=merge",
             "-p", '{"spec":{"replicas":1}}')                               # replicas by patch
    kube.run("scale", "deployment", "web", "-n", namespace, "--replicas=0")  # the scale subresource
    assert settled_requests(gpuguard) == before
    assert kube.get("deployment", "web", namespace)["spec"]["replicas"] == 0

    kube.run("set", "image", "deployment/web", "-n", namespace, "main=registry.example/app:2")
    wait_for("the template change sent to gpuguard", lambda: gpuguard.requests() > before)
    changed = [d for d in gpuguard.decisions(namespace)
               if d.get("name") == "web" and d.get("operation") == "UPDATE"]
    assert {d["endpoint"] for d in changed} == {"mutate", "validate"}


def test_gpuguard_down_refuses_pods_where_it_looks_and_only_there(kube, cluster, namespace):
    argv = {}
    try:
        for n in cluster.gpuguard_names():
            argv[n] = cmdline(cluster.state["pids"][n])
            cluster.stop(n)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"team": "e2e"}},
               "spec": {"containers": [{"name": "main", "image": "registry.example/app:1"}]}}
        r = kube.run("create", "-n", namespace, "-f", "-", input=pod, check=False)
        assert r.returncode == 1
        # One process: nothing listens. Several: the forwarder takes the connection and closes it.
        assert re.search(r'Internal error occurred: failed calling webhook "mutate\.gpuguard\.io": '
                         r'failed to call webhook: Post "https://127\.0\.0\.1:\d+/mutate\?timeout=5s": '
                         r'(dial tcp 127\.0\.0\.1:\d+: connect: connection refused|EOF)$',
                         r.stderr.strip()), r.stderr
        # Namespaces the configurations leave out still get pods.
        kube.run("create", "-n", "kube-system", "-f", "-",
                 input={**pod, "metadata": {**pod["metadata"], "name": "e2e-while-down"}})
        kube.run("delete", "pod", "e2e-while-down", "-n", "kube-system", "--wait=false")
    finally:
        for n, cmd in argv.items():
            cluster.start(n, cmd)
    wait_for("a pod created once gpuguard is back", lambda: isinstance(kube.create(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "back", "labels": {"team": "e2e"}},
         "spec": {"containers": [{"name": "main", "image": "registry.example/app:1"}]}},
        namespace, check=False), dict))
    wait_for("the pod running", lambda: pod_running(kube, namespace, "back"))


def cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


def can_i(kube, user, namespace):
    """`kubectl auth can-i --list` in namespace as a service account of gpuguard-system: a set
    of (resource, resource names, verbs) rows."""
    out = kube.run("auth", "can-i", "--list", "-n", namespace, "--as", user,
                   "--as-group", "system:serviceaccounts",
                   "--as-group", "system:serviceaccounts:gpuguard-system",
                   "--as-group", "system:authenticated").stdout
    rows = set()
    for line in out.splitlines()[1:]:
        cols = re.split(r"\s{2,}", line.strip())
        resource, verbs = cols[0], cols[-1]
        names = cols[-2] if len(cols) >= 4 else "[]"
        rows.add((resource, tuple(sorted(names.strip("[]").split())),
                  tuple(sorted(verbs.strip("[]").split()))))
    return rows


def readme_rbac():
    """The table under "What gpuguard's ServiceAccount may do" in README.md: (resource, resource
    names, verbs, where) rows, where is `cluster-wide` or a namespace."""
    text = (REPO / "README.md").read_text()
    section = text.split("What gpuguard's ServiceAccount may do", 1)[1]
    rows = set()
    for line in section.splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "resource" or set(cells[0]) <= {"-"}:
            continue
        m = re.fullmatch(r"`([^`]+)`(?: named `([^`]+)`)?", cells[0])
        assert m, line
        verbs = tuple(sorted(re.findall(r"`([^`]+)`", cells[1])))
        rows.add((m.group(1), (m.group(2),) if m.group(2) else (), verbs, cells[2].strip("`")))
    return rows


def test_gpuguards_service_account_may_do_what_readme_says(kube, namespace):
    """Cluster-wide rows everywhere (a fresh namespace shows them), the Lease rows in
    gpuguard-system only."""
    table = readme_rbac()
    assert {w for *_, w in table} == {"cluster-wide", "gpuguard-system"}
    nobody = "system:serviceaccount:gpuguard-system:e2e-nobody"
    for ns in (namespace, "gpuguard-system"):
        own = can_i(kube, SA, ns) - can_i(kube, nobody, ns)
        assert own == {r[:3] for r in table if r[3] in ("cluster-wide", ns)}, ns
