"""The inventory's ResourceClaims and ResourceClaimTemplates in the running server: `gpuguard
serve --kubeconfig` against the stand-in API server (fake_apiserver.py) with the shipped policies
and deploy/gpuguard.yaml (team-q's quota: 2 GPUs).  Claims and templates are listed and watched
(resource.k8s.io v1, else v1beta2, else v1beta1), a template the watch has not delivered is
fetched with a GET before deciding, and a running pod's charge comes from its spec whatever its
gpuguard.io/charge annotation says.  Every wait is a bounded loop."""

import concurrent.futures
import time
import uuid

import pytest

from fake_apiserver import gpu_pod
from test_inventory_sync import (NS, admission, fake, metrics, new_pod, ready_with, serve,  # noqa: F401
                                 wait_for, write_kubeconfig)

DRA = "/apis/resource.k8s.io"


def template(name, count=1, ns=NS, version="v1"):
    req = {"name": "gpus"}
    exact = {"deviceClassName": "gpu.nvidia.com", "count": count}
    if version == "v1beta1":
        req.update(exact)  # the flat form
    else:
        req["exactly"] = exact
    return {"apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-t-{name}",
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"spec": {"devices": {"requests": [req]}}}}


def claim(name, count=1, ns=NS, version="v1", annotations=None):
    obj = template(name, count, ns, version)
    obj["kind"] = "ResourceClaim"
    obj["metadata"]["uid"] = f"uid-c-{name}"
    obj["spec"] = obj["spec"]["spec"]
    if annotations:
        obj["metadata"]["annotations"] = annotations
    obj["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpus", "driver": "gpu.nvidia.com", "pool": "node-1", "device": f"gpu-{i}"}
        for i in range(count)]}}}
    return obj


def dra_pod(name, ref, ns=NS, running=False):
    """A pod with one claim: ref is ("template", name) or ("claim", name)."""
    key = "resourceClaimTemplateName" if ref[0] == "template" else "resourceClaimName"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns, "labels": {"team": "q"}},
           "spec": {"containers": [{"name": "ctr", "image": "ubuntu:22.04",
                                    "resources": {"claims": [{"name": "gpus"}]}}],
                    "resourceClaims": [{"name": "gpus", key: ref[1]}],
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                     "effect": "NoSchedule"}]}}
    if running:
        pod["metadata"]["uid"] = f"uid-p-{name}"
        pod["spec"]["nodeSelector"] = {"gpuguard.io/pool": "a100-dra"}
        pod["status"] = {"phase": "Running"}
    return pod


def usage(server, ns=NS):
    for line in metrics(server).splitlines():
        if line.startswith(f'gpuguard_inventory_usage_gpus{{namespace="{ns}"}}'):
            return line.split()[-1]
    return None


@pytest.fixture
def dra(binary, certs, tmp_path, fake):
    def start(setup):
        f = fake()
        setup(f)
        server = serve(binary, certs, tmp_path, write_kubeconfig(tmp_path, f.url))
        started.append((f, server))
        return f, server

    started = []
    yield start
    for f, server in started:
        assert server.proc.poll() is None, "the server died"
        # The API server first: its watches end, and the three informers need not wait out
        # an open watch to stop, a second each.
        f.stop()
        assert server.stop() == 0


def test_claims_and_templates_are_listed_watched_and_deleted(dra):
    def setup(f):
        f.add_object(template("one-gpu"))
        f.add(dra_pod("trainer", ("template", "one-gpu"), running=True))
        # generated from trainer's template: charged with the pod, not again
        f.add_object(claim("trainer-gpus-x7k2p", 1,
                           annotations={"resource.kubernetes.io/pod-claim-name": "gpus"}))

    f, server = dra(setup)
    assert ready_with(server, 1)
    assert wait_for(lambda: f.requests_of("watch", f"{DRA}/v1/resourceclaims")
                    and f.requests_of("watch", f"{DRA}/v1/resourceclaimtemplates"))
    assert wait_for(lambda: usage(server) == "1.000")
    ok, msg, _, _ = admission(server, dra_pod("second", ("template", "one-gpu")))
    assert ok, msg  # 1 in use + 1 = the quota of 2
    # A shared claim appears: charged once, on its own.
    f.add_object(claim("shared", 1))
    assert wait_for(lambda: usage(server) == "2.000")
    ok, msg, _, _ = admission(server, dra_pod("third", ("template", "one-gpu")))
    assert not ok and msg == ("gpu-quota: namespace team-q would use 3 of 2 GPUs (in use 2, "
                              "this pod 1); ask for fewer GPUs or free GPUs"), msg
    # Its pods add nothing.
    ok, msg, _, _ = admission(server, dra_pod("reader", ("claim", "shared")))
    assert ok, msg
    f.delete_object("ResourceClaim", "uid-c-shared")
    assert wait_for(lambda: usage(server) == "1.000")
    assert wait_for(lambda: admission(server, dra_pod("fourth", ("template", "one-gpu")))[0])
    # A template added after the start is used; deleted, it is gone.
    f.add_object(template("two-gpus", 2))
    ok, msg, _, _ = admission(server, dra_pod("big", ("template", "two-gpus")))
    assert not ok and "would use 3 of 2 GPUs (in use 1, this pod 2)" in msg, msg
    f.delete_object("ResourceClaimTemplate", "uid-t-two-gpus")
    assert wait_for(lambda: admission(server, dra_pod("big", ("template", "two-gpus")))[1] ==
                    "gpu-sharing: resourceClaims gpus names ResourceClaimTemplate "
                    "team-q/two-gpus, which does not exist; create it first")


def test_a_template_the_watch_has_not_shown_is_fetched(dra):
    f, server = dra(lambda f: f.add_object(template("late", 2), hidden=True))
    assert ready_with(server, 0)
    get = f"{DRA}/v1/namespaces/{NS}/resourceclaimtemplates/late"
    ok, msg, _, _ = admission(server, dra_pod("p", ("template", "late")))
    assert ok, msg
    assert len(f.requests_of("get", get)) == 1
    ok, _, _, _ = admission(server, dra_pod("q", ("template", "late")))
    assert ok and len(f.requests_of("get", get)) == 1  # kept: asked once
    # One that does not exist is denied, naming it, once the API server said so.
    ok, msg, _, _ = admission(server, dra_pod("r", ("template", "nowhere")))
    assert not ok and msg == ("gpu-sharing: resourceClaims gpus names ResourceClaimTemplate "
                              "team-q/nowhere, which does not exist; create it first"), msg
    # (asked by each policy that looked: absence is not kept, the template may come next)
    assert f.requests_of("get", f"{DRA}/v1/namespaces/{NS}/resourceclaimtemplates/nowhere")


def test_an_older_resource_api_is_used_when_v1_is_not_served(dra):
    def setup(f):
        f.served_versions = {"v1beta1"}
        f.add_object(claim("pair", 2, version="v1beta1"))

    f, server = dra(setup)
    assert ready_with(server, 0)
    assert wait_for(lambda: usage(server) == "2.000")
    assert f.requests_of("list", f"{DRA}/v1/resourceclaims")
    assert f.requests_of("list", f"{DRA}/v1beta2/resourceclaims")
    assert wait_for(lambda: f.requests_of("watch", f"{DRA}/v1beta1/resourceclaims"))
    ok, msg, _, _ = admission(server, new_pod())
    assert not ok and "would use 3 of 2 GPUs (in use 2, this pod 1)" in msg, msg


def test_a_charge_annotation_cannot_free_quota(dra):
    def setup(f):
        f.add(gpu_pod(NS, "big", gpus=2, charge=0))

    f, server = dra(setup)
    assert ready_with(server, 1)
    assert usage(server) == "2.000"
    ok, msg, _, _ = admission(server, new_pod())
    assert not ok and msg == ("gpu-quota: namespace team-q would use 3 of 2 GPUs (in use 2, "
                              "this pod 1); ask for fewer GPUs or free GPUs"), msg


def review_claim(server, obj, dry_run=True, user="alice", old=None):
    """The validating call for a claim or template CREATE by user (an UPDATE from old when
    given): (allowed, message)."""
    conn = server.connect(timeout=10)
    plural = obj["kind"].lower() + "s"
    version = obj["apiVersion"].split("/")[1]
    req = {"uid": "3f0a6e6c-0000-4000-8000-000000000001",
           "kind": {"group": "resource.k8s.io", "version": version, "kind": obj["kind"]},
           "resource": {"group": "resource.k8s.io", "version": version, "resource": plural},
           "namespace": obj["metadata"]["namespace"], "name": obj["metadata"]["name"],
           "operation": "UPDATE" if old else "CREATE",
           "userInfo": {"username": user, "groups": ["system:authenticated"]},
           "object": obj, "oldObject": old, "dryRun": dry_run}
    status, _, got = conn.review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "request": req}, path="/validate")
    conn.close()
    assert status == 200, got
    return got["response"]["allowed"], got["response"].get("status", {}).get("message")


def test_claims_and_templates_are_checked_at_creation(dra):
    f, server = dra(lambda f: f.add_object(claim("held", 1)))
    assert ready_with(server, 0)
    assert wait_for(lambda: usage(server) == "1.000")
    assert review_claim(server, template("one")) == (True, None)
    assert review_claim(server, claim("one-more", 1)) == (True, None)  # 1 + 1: the quota
    assert review_claim(server, claim("two-more", 2)) == (
        False, "gpu-claims: namespace team-q would use 3 of 2 GPUs (in use 1, this claim 2); "
               "ask for fewer GPUs or free GPUs")
    every = template("every")
    every["spec"]["spec"]["devices"]["requests"][0]["exactly"] = {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}
    assert review_claim(server, every) == (
        False, "gpu-claims: ResourceClaimTemplate every request gpus asks for every device of "
               "class gpu.nvidia.com (allocationMode: All); ask for a count of devices instead")
    assert review_claim(server, template("nine", 9)) == (
        False, "gpu-claims: the template asks for 9 GPUs, more than the 8 allowed per pod; ask "
               "for fewer devices")
    # Generated from an admitted pod's template by the resource claim controller, or for a pod's
    # extended resources by the scheduler: charged with the pod, never denied here.
    generated = claim("p-gpus-x7k2p", 9, annotations={"resource.kubernetes.io/pod-claim-name": "gpus"})
    for maker in ("system:serviceaccount:kube-system:resource-claim-controller",
                  "system:kube-controller-manager"):
        assert review_claim(server, generated, user=maker) == (True, None)
    extended = claim("p-extended-resources-abcde", 9,
                     annotations={"resource.kubernetes.io/extended-resource-claim": "true"})
    assert review_claim(server, extended, user="system:kube-scheduler") == (True, None)
    # Anyone else's claim with those annotations would be charged nothing by the inventory.
    forged = ("gpu-claims: the annotations resource.kubernetes.io/pod-claim-name and "
              "resource.kubernetes.io/extended-resource-claim are for the claims Kubernetes makes "
              "for a pod's resourceClaimTemplateName and for extended resources, which are charged "
              "with their pod; remove them, and the claim is charged to the namespace")
    assert review_claim(server, generated) == (False, forged)
    assert review_claim(server, extended, user="system:kube-controller-manager") == (True, None)
    assert review_claim(server, extended, user="system:serviceaccount:team-q:default") == (
        False, forged)
    # Nor may anyone else mark a claim of theirs so later: the inventory would drop its charge.
    plain = claim("mine", 8)
    assert review_claim(server, generated, old=plain) == (False, forged)
    assert review_claim(server, extended, old=plain) == (False, forged)
    assert review_claim(server, generated, old=plain,
                        user="system:serviceaccount:kube-system:resource-claim-controller") == (
        True, None)
    assert review_claim(server, plain, old=generated) == (True, None)  # unmarked: charged again
    # Devices that are not GPUs are not gpuguard's business.
    nic = claim("nic", 64)
    nic["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "rdma.example.com"
    assert review_claim(server, nic) == (True, None)


def test_an_admitted_claim_counts_until_the_watch_shows_it(dra):
    f, server = dra(lambda f: None)
    assert ready_with(server, 0)
    # Admitted for real (not a dry run): it counts at once, before the API server stores it.
    assert review_claim(server, claim("first", 1), dry_run=False) == (True, None)
    assert review_claim(server, claim("second", 2), dry_run=False) == (
        False, "gpu-claims: namespace team-q would use 3 of 2 GPUs (in use 1, this claim 2); "
               "ask for fewer GPUs or free GPUs")
    # The watch shows it: the reservation gives way to the claim itself, counted once.
    f.add_object(claim("first", 1))
    assert wait_for(lambda: usage(server) == "1.000")
    assert review_claim(server, claim("third", 1), dry_run=True) == (True, None)
    assert review_claim(server, claim("fourth", 2), dry_run=True)[0] is False


def timed_review(server, pod, timeout):
    """One /mutate call with ?timeout=: (allowed, message, seconds from send to answer)."""
    conn = server.connect(timeout=30)
    req = {"uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
           "resource": {"group": "", "version": "v1", "resource": "pods"},
           "namespace": pod["metadata"]["namespace"], "operation": "CREATE",
           "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
           "object": pod, "oldObject": None, "dryRun": True}
    t0 = time.monotonic()
    status, _, got = conn.review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "request": req}, path="/mutate", timeout=timeout)
    took = time.monotonic() - t0
    conn.close()
    assert status == 200, got
    return got["response"]["allowed"], got["response"].get("status", {}).get("message"), took


TOO_LATE = ("gpu-sharing: resourceClaims gpus: ResourceClaimTemplate team-q/slow could not be "
            "read (the API server did not answer before the review's deadline); try again")


def test_a_template_get_ends_within_the_reviews_deadline(dra):
    """The GET runs inside the review: held by the API server, it ends at the review's deadline
    (?timeout=, or the engine's 2 s wall clock when that comes first) with a denial naming the
    template, and a review waiting for another's GET waits no longer than its own deadline.
    Before, each GET had its own 3 s, one per policy that looked, so a review held its
    answer for seconds past the API server's timeout."""
    f, server = dra(lambda f: f.add_object(template("slow", 1), hidden=True))
    assert ready_with(server, 0)
    get = f"{DRA}/v1/namespaces/{NS}/resourceclaimtemplates/slow"
    f.get_hold = 30.0
    ok, msg, took = timed_review(server, dra_pod("p", ("template", "slow")), "1500ms")
    assert (ok, msg) == (False, TOO_LATE) and took < 1.5, (msg, took)
    assert f.requests_of("get", get)
    # Two at once: the second waits for the first's GET, within its own deadline.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(timed_review, server, dra_pod("a", ("template", "slow")), "10s")
        time.sleep(0.3)
        second = pool.submit(timed_review, server, dra_pod("b", ("template", "slow")), "1500ms")
        ok, msg, took = second.result()
        assert (ok, msg) == (False, TOO_LATE) and took < 1.5, (msg, took)
        ok, msg, took = first.result()
        assert (ok, msg) == (False, TOO_LATE) and took < 2.5, (msg, took)  # the engine's 2 s
    # The API server answers again: the template is fetched and the pod admitted.
    f.get_hold = 0.0
    assert wait_for(lambda: timed_review(server, dra_pod("c", ("template", "slow")), "10s")[0])


def nested(depth):
    value = 1
    for _ in range(depth):
        value = {"x": value}
    return value


def test_a_template_nested_too_deep_is_a_denial_and_the_server_lives_on(dra):
    """gpuguard.dra's object comes from the review's arena: when converting it raises (nested
    deeper than policies may see), it is released at once, not by a collection after the
    arena is gone (that freed arena memory: "free(): invalid size", and the server aborted after
    the first such review)."""
    deep = template("deep")
    deep["spec"]["spec"]["devices"]["config"] = [
        {"opaque": {"driver": "gpu.nvidia.com", "parameters": nested(120)}}]

    def setup(f):
        f.add_object(deep)
        f.add_object(template("plain"))
    f, server = dra(setup)
    assert ready_with(server, 0)
    for i in range(3):
        ok, msg, _, _ = admission(server, dra_pod(f"d{i}", ("template", "deep")))
        assert not ok and "ResourceClaimTemplate team-q/deep nests deeper than 100 levels" in msg, msg
    for i in range(40):  # reviews enough for the collector to run between them
        ok, msg, _, _ = admission(server, dra_pod(f"p{i}", ("template", "plain")))
        assert ok, msg
    assert server.proc.poll() is None, "the server died"


def test_device_classes_and_slices_are_listed_and_charged(dra):
    """The server lists and watches DeviceClasses and ResourceSlices: a claim of the cluster's
    own GPU class is charged its devices, and a claim for one MIG slice that was allocated a
    whole GPU (its slice says so) is charged the GPU."""
    from test_inventory_sync import SLICE, device_class, own_claim

    def setup(f):
        f.add_object({**SLICE, "metadata": {**SLICE["metadata"], "uid": "uid-slice"}})
        admin = device_class("admin-gpu", 'device.driver == "gpu.nvidia.com"')
        admin["metadata"]["uid"] = "uid-class"
        f.add_object(admin)
        f.add_object(own_claim(NS, "admins", "admin-gpu", 1))

    f, server = dra(setup)
    assert ready_with(server, 0)
    assert wait_for(lambda: f.requests_of("watch", f"{DRA}/v1/deviceclasses")
                    and f.requests_of("watch", f"{DRA}/v1/resourceslices"))
    assert wait_for(lambda: usage(server) == "1.000")
    mig = own_claim(NS, "one-slice", "mig.nvidia.com", 1)
    mig["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {
        "expression": "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'"}}]
    mig["status"] = {"allocation": {"devices": {"results": [
        {"request": "r", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0"}]}}}
    f.add_object(mig)
    assert wait_for(lambda: usage(server) == "2.000")
