"""The inventory in the running server: `gpuguard serve --kubeconfig` against
a stand-in API server (fake_apiserver.py) on 127.0.0.1, over HTTP and HTTPS.
Quota decisions are checked through the webhook itself (mutate, then
validate on the mutated pod, as the API server calls them), with the shipped
policies and deploy/gpuguard.yaml (team-q's quota set to 2 GPUs); /readyz,
/metrics and the requests the fake saw tell the rest.  Every wait is a
bounded loop."""

import base64
import copy
import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import jsonpatch
import pytest
import yaml

from conftest import REPO, start_server, wait_for
from fake_apiserver import FakeApiServer, gpu_pod
from test_server import metric

# Pods a page of the audit's lists asks for, from webhook/engine/audit.h.
AUDIT_POD_PAGE = int(re.search(r"#define AUDIT_POD_PAGE (\d+)",
                               (REPO / "webhook" / "engine" / "audit.h").read_text()).group(1))


def informer_lists(f):
    """The pod lists the informer asked the fake for: the audit lists pods too, AUDIT_POD_PAGE
    a page, once the inventory has synced, and may have begun by the time a test counts."""
    return [q for q in f.requests_of("list") if q.get("limit") != str(AUDIT_POD_PAGE)]
NS = "team-q"


def write_config(tmp_path, not_ready="allow"):
    cfg = yaml.safe_load((REPO / "deploy" / "gpuguard.yaml").read_text())
    cfg["quotas"]["namespaces"][NS] = 2
    cfg["quotas"]["inventory_not_ready"] = not_ready
    path = tmp_path / "gpuguard.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def write_kubeconfig(tmp_path, server, user=None, cluster_extra=None, name="kubeconfig"):
    cluster = {"server": server}
    cluster.update(cluster_extra or {})
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "fake",
           "contexts": [{"name": "other", "context": {"cluster": "nowhere", "user": "nobody"}},
                        {"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
           "clusters": [{"name": "fake", "cluster": cluster}],
           "users": [{"name": "fake", "user": user or {}}]}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def no_proxy_env():
    env = dict(os.environ)
    for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        env.pop(k, None)
    env["no_proxy"] = env["NO_PROXY"] = "127.0.0.1,localhost"
    return env


def serve(binary, certs, tmp_path, kubeconfig=None, not_ready="allow", extra=()):
    args = ["--policies", str(REPO / "policies"), "--lua", str(REPO / "lua"),
            "--config", str(write_config(tmp_path, not_ready))]
    if kubeconfig:
        args += ["--kubeconfig", str(kubeconfig)]
    return start_server(binary, certs, tmp_path, *args, *extra, env=no_proxy_env())


def new_pod(gpus=1, ns=NS, uid=None, name=None):
    """A pod as the API server sends it to a webhook: with uid and name (its generateName's, made
    up) it is the one the validating webhooks see, which the API server has filled in."""
    meta = {"generateName": "train-", "namespace": ns,
            "labels": {"team": "q", "gpuguard.io/workload-class": "training"}}
    if uid:
        meta.update(uid=uid, name=name or f"train-{uid[-5:]}")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "main", "image": "pytorch/pytorch:2.3.0",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def admission(server, pod, dry_run=True, group="", resource="pods"):
    """Mutate, apply the patch, validate: (allowed, message, warnings, seconds)."""
    conn = server.connect(timeout=10)
    t0 = time.monotonic()

    def call(path, obj):
        req = {"uid": str(uuid.uuid4()),
               "kind": {"group": group, "version": "v1", "kind": obj["kind"]},
               "resource": {"group": group, "version": "v1", "resource": resource},
               "namespace": obj["metadata"]["namespace"], "operation": "CREATE",
               "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
               "object": obj, "oldObject": None, "dryRun": dry_run}
        status, _, got = conn.review({"apiVersion": "admission.k8s.io/v1",
                                      "kind": "AdmissionReview", "request": req}, path=path)
        assert status == 200, got
        return got["response"]

    mutated = call("/mutate", pod)
    obj = copy.deepcopy(pod)
    if mutated.get("patch"):
        obj = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(mutated["patch"])))
    answer = mutated if not mutated["allowed"] else call("/validate", obj)
    conn.close()
    return (answer["allowed"], answer.get("status", {}).get("message"),
            mutated.get("warnings", []) + answer.get("warnings", []), time.monotonic() - t0)


def allowed(server):
    return admission(server, new_pod())[0]


def readyz(server):
    status, text = server.ops("/readyz")
    assert status == 200, text
    return text.splitlines()[1]


def metrics(server):
    return server.ops("/metrics")[1]


def ready_with(server, n):
    return wait_for(lambda: readyz(server) == f"inventory: ready ({n} pods)")


@pytest.fixture
def fake():
    servers = []

    def make(**kw):
        f = FakeApiServer(**kw).start()
        servers.append(f)
        return f

    yield make
    for f in servers:
        f.stop()


@pytest.fixture
def running(binary, certs, tmp_path, fake):
    """A fake API server with team-q at its quota (2 pods of 1 GPU, paginated
    among CPU pods), and gpuguard serve synced to it over HTTP."""
    f = fake()
    for i in range(2):
        f.add(gpu_pod(NS, f"busy-{i}", cls="training"))
    for i in range(5):
        f.add(gpu_pod("web", f"cpu-{i}", gpus=0))
    f.add(gpu_pod("team-a", "mig", gpus=2, resource="nvidia.com/mig-1g.10gb"))
    kc = write_kubeconfig(tmp_path, f.url, user={"token": "secret"})
    server = serve(binary, certs, tmp_path, kc)
    yield f, server
    assert server.proc.poll() is None, "the server died"
    # The API server first: its watches end, and the informers need not wait out an open
    # watch to stop, a second each.  (Tests that stop the server themselves stop it in a watch.)
    f.stop()
    assert server.stop() == 0


def test_list_then_watch_drive_quota_decisions(running):
    f, server = running
    assert ready_with(server, 3)
    lists = informer_lists(f)
    assert len(lists) == 3  # 8 pods, 3 per page
    assert all(q["limit"] == "500" for q in lists)
    assert "continue" not in lists[0] and lists[1]["continue"] and lists[2]["continue"]
    assert wait_for(lambda: f.watch_count() >= 1)
    watch = f.requests_of("watch")[0]
    assert watch["resourceVersion"] == str(f.rv)
    assert watch["allowWatchBookmarks"] == "true" and int(watch["timeoutSeconds"]) >= 300
    # team-q uses 2 of 2: one more GPU is denied, with the usage in the message.
    ok, msg, _, _ = admission(server, new_pod())
    assert not ok and "would use 3 of 2" in msg, msg
    # DELETED: the next pod fits exactly.
    f.delete(f"uid-{NS}-busy-0")
    assert wait_for(lambda: allowed(server))
    assert readyz(server) == "inventory: ready (2 pods)"
    # ADDED: full again.
    f.add(gpu_pod(NS, "busy-2", cls="training"))
    assert wait_for(lambda: not allowed(server))
    # MODIFIED to Succeeded: finished pods do not count.
    f.modify(f"uid-{NS}-busy-1", phase="Succeeded")
    assert wait_for(lambda: allowed(server))
    m = metrics(server)
    assert metric(m, "gpuguard_inventory_usage_gpus", namespace=NS) == 1
    assert metric(m, "gpuguard_inventory_usage_gpus", namespace="team-a") == 0.286
    assert metric(m, "gpuguard_inventory_pods") == 2
    assert metric(m, "gpuguard_inventory_ready") == 1
    assert metric(m, "gpuguard_quota_enforced") == 1
    assert metric(m, "gpuguard_inventory_relists_total") == 1
    assert metric(m, "gpuguard_inventory_malformed_events_total") == 0
    assert abs(metric(m, "gpuguard_inventory_last_sync_timestamp_seconds") - time.time()) < 60
    assert "# TYPE gpuguard_inventory_watch_restarts_total counter" in m


def test_admitted_pod_counts_at_once_until_the_watch_shows_it(running):
    f, server = running
    assert ready_with(server, 3)
    f.delete(f"uid-{NS}-busy-0")
    assert wait_for(lambda: allowed(server))
    # A real (not dry-run) admission reserves its GPU: the next one is denied
    # before the watch has shown the first pod.
    assert admission(server, new_pod(uid="u-train-1", name="train-x7k2p"), dry_run=False)[0]
    ok, msg, _, _ = admission(server, new_pod())
    assert not ok and "would use 3 of 2" in msg
    # The pod shows up (the uid the validating call saw): counted once, not twice.
    f.add(gpu_pod(NS, "train-x7k2p", uid="u-train-1", cls="training"))
    assert ready_with(server, 3)
    ok, msg, _, _ = admission(server, new_pod())
    assert not ok and "would use 3 of 2" in msg


def test_a_reservation_is_settled_by_its_own_pod_only(running):
    """Another pod whose name starts like the admitted pod's generateName (an older replica, a
    pod named train-cpu) leaves the admitted pod counted: only its uid settles it."""
    f, server = running
    assert ready_with(server, 3)
    f.delete(f"uid-{NS}-busy-0")
    assert wait_for(lambda: allowed(server))
    assert admission(server, new_pod(uid="u-train-2", name="train-abcde"), dry_run=False)[0]
    f.add(gpu_pod(NS, "train-cpu", gpus=0))
    f.add(gpu_pod("team-a", "marker"))  # events come in order: once it counts, train-cpu was seen
    assert wait_for(lambda: metric(metrics(server), "gpuguard_inventory_pods") == 3)
    ok, msg, _, _ = admission(server, new_pod(uid="u-train-3"), dry_run=False)
    assert not ok and "would use 3 of 2" in msg, msg


def test_concurrent_creations_take_the_last_room_exactly_once(running):
    """Of many pods created at once, exactly as many as the quota has room for are admitted:
    each review reserves before its policies read the usage (quotas.default: 4 GPUs in each
    fresh namespace, team-* for the training class), in a few rounds, as a race shows only now and then."""
    from concurrent.futures import ThreadPoolExecutor
    _, server = running
    assert ready_with(server, 3)
    with ThreadPoolExecutor(max_workers=32) as pool:
        for rnd in range(40):  # a race the old order lost about once in 20 rounds here
            ns = f"team-burst-{rnd}"
            pods = [new_pod(ns=ns, uid=f"u-{rnd}-{i:05d}") for i in range(64)]
            answers = list(pool.map(lambda p: admission(server, p, dry_run=False)[0], pods))
            assert answers.count(True) == 4, (ns, answers.count(True))


def test_a_workloads_template_reserves_nothing(running):
    """The workloads webhooks put a Deployment's template through the pod policies; that is no
    pod: its pods are charged when they are created, not the template as well."""
    f, server = running
    assert ready_with(server, 3)
    f.delete(f"uid-{NS}-busy-0")
    assert wait_for(lambda: allowed(server))
    pod = new_pod()
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "train", "namespace": NS, "labels": {"team": "q"}},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "train"}},
                           "template": {"metadata": {"labels": {**pod["metadata"]["labels"], "app": "train"}},
                                        "spec": pod["spec"]}}}
    assert admission(server, deployment, dry_run=False, group="apps", resource="deployments")[0]
    assert admission(server, new_pod(), dry_run=False)[0]  # the Deployment's one pod fits


def test_bookmarks_move_the_resume_point(running):
    f, server = running
    assert ready_with(server, 3)
    assert wait_for(lambda: f.watch_count() >= 1)
    rv = f.bookmark()
    time.sleep(0.3)
    f.end_watches()
    assert wait_for(lambda: f.watch_count() >= 2)
    assert f.requests_of("watch")[1]["resourceVersion"] == rv
    assert len(informer_lists(f)) == 3  # resumed, not relisted
    assert wait_for(lambda: metric(metrics(server), "gpuguard_inventory_watch_restarts_total") >= 1)


@pytest.mark.parametrize("as_event", [False, True], ids=["status", "error-event"])
def test_410_gone_relists(running, as_event):
    f, server = running
    assert ready_with(server, 3)
    assert wait_for(lambda: f.watch_count() >= 1)
    f.gone_as_event = as_event
    # Changes the informer misses while its watch is down, then history is gone.
    with f.lock:
        f.generation += 1
        f.lock.notify_all()
        f.watch_scripts.append({"hold": 0.5})
    f.delete(f"uid-{NS}-busy-0")
    f.delete(f"uid-{NS}-busy-1")
    f.compact()
    assert wait_for(lambda: metric(metrics(server), "gpuguard_inventory_relists_total") == 2)
    assert ready_with(server, 1)
    assert metric(metrics(server), "gpuguard_inventory_usage_gpus", namespace=NS) is None
    assert allowed(server)
    # 3 pages, then the relist: 6 pods, 3 per page
    assert len(informer_lists(f)) == 5


def test_repeated_410_relists_back_off(running):
    f, server = running
    assert ready_with(server, 3)
    assert wait_for(lambda: f.watch_count() >= 1)
    with f.lock:
        f.watch_scripts += [{"status": 410}] * 50
    f.end_watches()
    # Relists come spaced by the backoff (0.5 s, doubling), not one per round trip, which
    # would spend the 50 scripted 410s at once.  Waited for rather than slept on: a loaded
    # machine (a sanitized build beside a benchmark) gave the informer one relist in 3 s.
    start = time.monotonic()
    relists = wait_for(lambda: (n := metric(metrics(server), "gpuguard_inventory_relists_total"))
                       >= 3 and n, step=0.02)
    elapsed = time.monotonic() - start
    assert relists and relists <= 3 + 2 * elapsed, (relists, elapsed)
    assert readyz(server) == "inventory: ready (3 pods)"


def test_dropped_connection_resumes_from_the_last_event(running):
    f, server = running
    assert ready_with(server, 3)
    assert wait_for(lambda: f.watch_count() >= 1)
    with f.lock:
        f.watch_scripts.append({"after": 1, "drop": True})
    f.end_watches()
    assert wait_for(lambda: f.watch_count() >= 2)
    f.delete(f"uid-{NS}-busy-0")  # delivered
    rv_delivered = str(f.rv)
    f.add(gpu_pod(NS, "late", cls="training"))  # cut in the middle of its line
    assert wait_for(lambda: f.watch_count() >= 3)
    assert f.requests_of("watch")[2]["resourceVersion"] == rv_delivered
    assert ready_with(server, 3)  # the event cut short came again on the new watch
    ok, msg, _, _ = admission(server, new_pod())
    assert not ok and "would use 3 of 2" in msg
    m = metrics(server)
    assert metric(m, "gpuguard_inventory_malformed_events_total") == 0
    assert metric(m, "gpuguard_inventory_relists_total") == 1
    logs = [r for r in server.log_lines() if r.get("msg") == "inventory: watch connection lost"]
    assert logs and logs[0]["mid_event"] is True


def test_malformed_event_lines_are_skipped_and_counted(running):
    f, server = running
    assert ready_with(server, 3)
    assert wait_for(lambda: f.watch_count() >= 1)
    bad = ["this is not json", '{"type":"ADDED"}',
           '{"type":"ADDED","object":{"metadata":{"name":"no-uid"}}}',
           '{"type":"EXPLODED","object":{}}', '{"type":"ADDED","object":{"metadata":',
           '{"type":"ADDED","object":{"metadata":{"uid":"x"}}} trailing',
           '["ADDED"]', '{"type":"BOOKMARK","object":{"metadata":{}}}']
    with f.lock:
        f.watch_scripts.append({"lines": bad})
    f.end_watches()
    assert wait_for(lambda: f.watch_count() >= 2)
    f.delete(f"uid-{NS}-busy-0")
    assert wait_for(lambda: allowed(server))
    m = metrics(server)
    assert metric(m, "gpuguard_inventory_malformed_events_total") == len(bad)
    assert readyz(server) == "inventory: ready (2 pods)"
    logged = [r for r in server.log_lines()
              if r.get("msg") == "inventory: malformed watch event skipped"]
    assert logged and "this is not json" in logged[0]["line"]


def test_watch_error_event_and_server_errors_back_off_and_recover(running):
    f, server = running
    assert ready_with(server, 3)
    assert wait_for(lambda: f.watch_count() >= 1)
    with f.lock:
        f.watch_scripts += [{"error": 500}, {"status": 500}, {"status": 503}]
    f.end_watches()
    assert wait_for(lambda: f.watch_count() >= 5)
    f.delete(f"uid-{NS}-busy-0")
    assert wait_for(lambda: allowed(server))
    assert metric(metrics(server), "gpuguard_inventory_relists_total") == 1


def test_slow_watch_events_split_across_reads(running):
    f, server = running
    assert ready_with(server, 3)
    assert wait_for(lambda: f.watch_count() >= 1)
    with f.lock:
        f.watch_scripts.append({"slow": 0.15})
    f.end_watches()
    assert wait_for(lambda: f.watch_count() >= 2)
    f.delete(f"uid-{NS}-busy-0")
    assert wait_for(lambda: allowed(server))
    assert metric(metrics(server), "gpuguard_inventory_malformed_events_total") == 0


def test_expired_continue_token_restarts_the_list(binary, certs, tmp_path, fake):
    f = fake()
    for i in range(7):
        f.add(gpu_pod(NS, f"p{i}", gpus=1 if i < 2 else 0))
    f.expire_continue = True
    kc = write_kubeconfig(tmp_path, f.url)
    server = serve(binary, certs, tmp_path, kc)
    try:
        assert ready_with(server, 2)
        lists = informer_lists(f)
        assert len(lists) == 5  # page 1, expired page 2, then 3 pages
        assert "continue" not in lists[2]
        assert not allowed(server)
    finally:
        assert server.stop() == 0


def test_slow_then_down_api_server_never_blocks_admissions(binary, certs, tmp_path, fake):
    f = fake()
    f.add(gpu_pod(NS, "busy-0", gpus=2))
    f.list_delay = 3
    kc = write_kubeconfig(tmp_path, f.url)
    server = serve(binary, certs, tmp_path, kc, not_ready="deny")
    try:
        # Syncing: the configured rule answers at once.
        assert readyz(server) == "inventory: syncing"
        ok, msg, _, seconds = admission(server, new_pod())
        assert not ok and "has not synced" in msg and seconds < 1
        assert metric(metrics(server), "gpuguard_inventory_ready") == 0
        assert metric(metrics(server), "gpuguard_quota_enforced") == 0
        assert ready_with(server, 1)
        assert not allowed(server)
        # Down: decisions keep using the last state, as fast as ever.
        f.stop()
        times = []
        for _ in range(10):
            ok, msg, _, seconds = admission(server, new_pod())
            assert not ok and "would use 3 of 2" in msg
            times.append(seconds)
        assert max(times) < 1, times
        assert readyz(server) == "inventory: ready (1 pods)"
    finally:
        assert server.proc.poll() is None
        assert server.stop() == 0


def test_unreachable_api_server_reports_syncing_with_the_error(binary, certs, tmp_path):
    kc = write_kubeconfig(tmp_path, "http://127.0.0.1:1")
    server = serve(binary, certs, tmp_path, kc)
    try:
        assert wait_for(lambda: "last error" in readyz(server))
        assert readyz(server).startswith("inventory: syncing (last error: GET /api/v1/pods")
        ok, _, warnings, seconds = admission(server, new_pod())
        assert ok and seconds < 1
        assert any("inventory has not synced" in w for w in warnings)
    finally:
        assert server.stop() == 0


def test_https_token_file_rotation_after_401(binary, certs, tmp_path, fake):
    f = fake(tls={"cert": str(certs / "tls.crt"), "key": str(certs / "tls.key")}, token="t2")
    f.add(gpu_pod(NS, "busy-0", gpus=2))
    token = tmp_path / "token"
    token.write_text("t1\n")
    kc = write_kubeconfig(tmp_path, f.url, user={"tokenFile": "token"},
                          cluster_extra={"certificate-authority": str(certs / "ca.crt")})
    server = serve(binary, certs, tmp_path, kc)
    try:
        assert wait_for(lambda: "HTTP 401" in readyz(server))
        assert f.requests_of("list")[0] is not None
        token.write_text("t2\n")  # rotated by the kubelet
        assert ready_with(server, 1)
        assert not allowed(server)
        # The token expires while watching: 401, then the rotated file is read again.
        with f.lock:
            f.token = "t3"
        f.end_watches()
        assert wait_for(lambda: any(r.get("status") == 401 for r in server.log_lines()
                                    if r.get("msg") == "inventory: watch refused"))
        token.write_text("t3")
        f.delete(f"uid-{NS}-busy-0")
        assert wait_for(lambda: allowed(server))
        auths = {a for _, _, a, _ in f.requests}
        assert {"Bearer t1", "Bearer t2", "Bearer t3"} <= auths
    finally:
        assert server.proc.poll() is None
        assert server.stop() == 0


def make_client_cert(tmp_path):
    """A client CA and a client certificate for CN=gpuguard (openssl CLI)."""
    d = tmp_path / "client"
    d.mkdir()

    def run(*args):
        subprocess.run(["openssl", *args], check=True, cwd=d, capture_output=True)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=client-ca")
    (d / "ext").write_text("extendedKeyUsage=clientAuth\n")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=gpuguard")
    run("x509", "-req", "-in", "client.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "client.crt", "-days", "1", "-extfile", "ext")
    return d


def test_https_client_certificate_and_inline_ca(binary, certs, tmp_path, fake):
    client = make_client_cert(tmp_path)
    f = fake(tls={"cert": str(certs / "tls.crt"), "key": str(certs / "tls.key"),
                  "client_ca": str(client / "ca.crt")})
    f.add(gpu_pod(NS, "busy-0", gpus=2))

    def b64(p):
        return base64.b64encode(Path(p).read_bytes()).decode()

    kc = write_kubeconfig(
        tmp_path, f.url,
        user={"client-certificate-data": b64(client / "client.crt"),
              "client-key-data": b64(client / "client.key")},
        cluster_extra={"certificate-authority-data": b64(certs / "ca.crt")})
    server = serve(binary, certs, tmp_path, kc)
    try:
        assert ready_with(server, 1)
        assert not allowed(server)
        f.delete(f"uid-{NS}-busy-0")
        assert wait_for(lambda: allowed(server))
    finally:
        assert server.stop() == 0


def test_https_with_an_untrusted_certificate_is_refused(binary, certs, tmp_path, fake):
    f = fake(tls={"cert": str(certs / "tls.crt"), "key": str(certs / "tls.key")})
    kc = write_kubeconfig(tmp_path, f.url)  # no CA: the system store does not know ours
    server = serve(binary, certs, tmp_path, kc)
    try:
        assert wait_for(lambda: "last error" in readyz(server))
        assert not f.requests  # never got past the handshake
        kc2 = write_kubeconfig(tmp_path, f.url, cluster_extra={"insecure-skip-tls-verify": True},
                               name="kubeconfig2")
        other = tmp_path / "second"
        other.mkdir()
        server2 = serve(binary, certs, other, kc2)
        try:
            assert ready_with(server2, 0)
        finally:
            assert server2.stop() == 0
    finally:
        assert server.stop() == 0


def test_inventory_off(binary, certs, tmp_path):
    server = serve(binary, certs, tmp_path)
    try:
        assert readyz(server) == "inventory: off"
        assert "gpuguard_inventory_" not in metrics(server)
        assert metric(metrics(server), "gpuguard_quota_enforced") == 0
        # Said once at start, not on every review: nothing is syncing.
        ok, _, warnings, _ = admission(server, new_pod())
        assert ok and not any("not checked" in w for w in warnings), warnings
        ok, msg, _, _ = admission(server, new_pod(gpus=3))
        assert not ok and "would use 3 of 2" in msg  # a pod alone over the quota never fits
    finally:
        assert server.stop() == 0


def test_inventory_off_wins_over_a_kubeconfig(binary, certs, tmp_path, fake):
    f = fake()
    kc = write_kubeconfig(tmp_path, f.url)
    server = serve(binary, certs, tmp_path, kc, extra=("--inventory", "off"))
    try:
        assert readyz(server) == "inventory: off"
        time.sleep(0.3)
        assert not f.requests
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("content,message", [
    ("current-context: x\n", 'context "x" not found'),
    ("kind: Config\n", "no current-context"),
    ("current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
     "clusters: [{name: k, cluster: {server: 'ftp://x'}}]\n", "server must be an https://"),
    ("current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
     "clusters: [{name: k, cluster: {server: 'https://x'}}]\n"
     "users: [{name: u, user: {exec: {command: aws}}}]\n", "exec plugins"),
    ("current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
     "clusters: [{name: k, cluster: {server: 'https://x', certificate-authority-data: '%%%'}}]\n",
     "certificate-authority-data is not base64"),
    ("current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
     "clusters: [{name: k, cluster: {server: 'https://x'}}]\n"
     "users: [{name: u, user: {tokenFile: missing}}]\n", "missing"),
    ("{ not yaml", "kubeconfig"),
])
def test_bad_kubeconfig_is_refused_at_start(binary, certs, tmp_path, content, message):
    kc = tmp_path / "kubeconfig"
    kc.write_text(content)
    out = subprocess.run([binary, "serve", "--listen", "127.0.0.1:0", "--ops-listen",
                          "127.0.0.1:0", "--tls-cert", str(certs / "tls.crt"), "--tls-key",
                          str(certs / "tls.key"), "--policies", str(REPO / "policies"),
                          "--lua", str(REPO / "lua"), "--kubeconfig", str(kc)],
                         capture_output=True, timeout=20, env=no_proxy_env())
    assert out.returncode == 1
    logged = [json.loads(line).get("msg", "") for line in out.stderr.decode().splitlines()
              if line.startswith("{")]
    assert any(message in m for m in logged), out.stderr.decode()


def test_inventory_on_needs_a_cluster(binary, certs, tmp_path):
    env = no_proxy_env()
    env.pop("KUBERNETES_SERVICE_HOST", None)
    out = subprocess.run([binary, "serve", "--tls-cert", str(certs / "tls.crt"), "--tls-key",
                          str(certs / "tls.key"), "--inventory", "on"],
                         capture_output=True, timeout=20, env=env)
    assert out.returncode == 1
    assert "--inventory on needs --kubeconfig" in out.stderr.decode()
    out = subprocess.run([binary, "serve", "--tls-cert", "x", "--tls-key", "y",
                          "--inventory", "maybe"], capture_output=True, timeout=20)
    assert out.returncode == 2 and "--inventory must be on or off" in out.stderr.decode()


# ---- gpuguard check --cluster-state ------------------------------------------


def check(binary, tmp_path, state_pods, *manifests):
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": state_pods}))
    files = []
    for i, m in enumerate(manifests):
        p = tmp_path / f"m{i}.yaml"
        p.write_text(yaml.safe_dump(m))
        files.append(str(p))
    return subprocess.run([binary, "check", "--config", str(REPO / "deploy" / "gpuguard.yaml"),
                           "--policies", str(REPO / "policies"), "--lua", str(REPO / "lua"),
                           "--cluster-state", str(state), "-o", "json", *files],
                          capture_output=True, timeout=60)


def named_pod(name, ns, gpus):
    pod = new_pod(gpus, ns)
    del pod["metadata"]["generateName"]
    pod["metadata"]["name"] = name
    return pod


def test_check_cluster_state_denies_a_namespace_over_quota(binary, tmp_path):
    # team-a's quota is 8 in deploy/gpuguard.yaml; 7 GPUs in use, and finished pods do not count.
    in_use = [gpu_pod("team-a", "a", gpus=4), gpu_pod("team-a", "b", gpus=3),
              gpu_pod("team-a", "done", gpus=8, phase="Succeeded"),
              gpu_pod("team-b", "c", gpus=8)]
    out = check(binary, tmp_path, in_use, named_pod("fits", "team-a", 1))
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    out = check(binary, tmp_path, in_use, named_pod("too-many", "team-a", 2))
    assert out.returncode == 1, out.stdout.decode() + out.stderr.decode()
    rec = json.loads(out.stdout.decode().splitlines()[0])
    assert not rec["allowed"]
    assert "namespace team-a would use 9 of 8 GPUs (in use 7" in rec["message"]
    # Other namespaces are not charged for team-a's pods.
    out = check(binary, tmp_path, in_use, named_pod("ok", "research", 8))
    assert out.returncode == 0, out.stdout.decode()


def device_class(name, *expressions):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]}}


def own_claim(ns, name, device_class_name, count):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {
                "deviceClassName": device_class_name, "count": count}}]}}}


@pytest.mark.parametrize("expression,gpus", [
    ('device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"', 4),
    ("device.driver.endsWith('nvidia.com') // any of NVIDIA's", 4),
    ('device.driver == "gpu.amd.com"', 4),
    ('device.driver == "gpu.example.com"', 4),  # dra.gpu_drivers names it
    ('device.driver == "gpu\\x2envidia.com"', 4),  # unreadable: a GPU, on the safe side
    ('device.driver == "compute-domain.nvidia.com"', 0),  # IMEX channels
    ('device.driver == "rdma.example.com"', 0),
])
def test_check_cluster_state_charges_a_clusters_own_gpu_device_class(binary, tmp_path, expression,
                                                                     gpus):
    """A DeviceClass of the cluster that dra.classes does not name is a GPU class when its
    selectors name a GPU driver (NVIDIA's, AMD's, Intel's and dra.gpu_drivers'): a claim of 4
    of its devices is charged 4 whole GPUs.  team-a: quota 8, 3 GPUs in pods."""
    cfg = yaml.safe_load((REPO / "deploy" / "gpuguard.yaml").read_text())
    cfg["dra"]["gpu_drivers"] = ["gpu.example.com"]
    config = tmp_path / "gpuguard.yaml"
    config.write_text(yaml.safe_dump(cfg))
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        gpu_pod("team-a", "a", gpus=3), device_class("admin-gpu", expression),
        own_claim("team-a", "held", "admin-gpu", 4)]}))
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump(named_pod("one-more", "team-a", 2)))
    out = subprocess.run([binary, "check", "--config", str(config), "--policies",
                          str(REPO / "policies"), "--lua", str(REPO / "lua"), "--cluster-state",
                          str(state), "-o", "json", str(pod)], capture_output=True, timeout=60)
    rec = json.loads(out.stdout.decode().splitlines()[0])
    if gpus:
        assert out.returncode == 1 and f"would use {3 + gpus + 2} of 8 GPUs (in use {3 + gpus}" \
            in rec["message"], rec
    else:
        assert out.returncode == 0 and rec["allowed"], rec


SLICE = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
         "metadata": {"name": "node-1-gpu.nvidia.com"},
         "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-1",
                  "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
                  "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}},
                              {"name": "gpu-1-mig-0", "attributes": {
                                  "type": {"string": "mig"}, "profile": {"string": "1g.5gb"}}}]}}


@pytest.mark.parametrize("allocated,in_use", [
    ({"driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0"}, "4"),  # a whole GPU
    ({"driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-1-mig-0"}, "3.143"),
    ({"driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-9"}, "3.143"),  # no slice shows it
    ({"driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0", "adminAccess": True}, "3.143"),
    (None, "3.143"),  # not allocated yet
])
def test_check_cluster_state_charges_an_allocated_claim_by_its_devices(binary, tmp_path, allocated,
                                                                      in_use):
    """A claim is charged what it was allocated when that is more than its spec asks: a claim
    for one MIG 1g.5gb slice (0.143) allocated a whole GPU (its ResourceSlice says type gpu)
    counts 1.  team-a: quota 8, 3 GPUs in pods."""
    claim = own_claim("team-a", "held", "mig.nvidia.com", 1)
    claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {
        "expression": "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'"}}]
    if allocated:
        claim["status"] = {"allocation": {"devices": {"results": [{"request": "r", **allocated}]}}}
    out = check(binary, tmp_path, [gpu_pod("team-a", "a", gpus=3), SLICE, claim],
                named_pod("five", "team-a", 5))
    rec = json.loads(out.stdout.decode().splitlines()[0])
    assert out.returncode == 1 and f"(in use {in_use}, this pod 5)" in rec["message"], rec
