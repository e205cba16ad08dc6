"""A stand-in Kubernetes API server for the inventory and leader election tests of `make test`
(which has no cluster; the normal paths also run against the real API server in
tests/e2e/test_quota.py).  It exists for the faults the real one cannot produce on demand:
malformed watch lines, events split across reads, connections dropped mid-event, stalled
streams, errors and expired continue tokens in the middle of a list, 401s, an API server without
resource.k8s.io/v1; and for the Lease tests (test_lease.py): writes refused for a while
(refuse_writes: as an API server that lost etcd, while reads still work), answers delayed past
a client's timeout (lease_delay), and a 409 Conflict on a PUT that won the read (put_conflicts:
another writer between a GET and a PUT, a race the real one gives only by chance); and for the
GPUQuota ledger tests (test_quota_ledger.py), the same faults on a quota's status writes
(quota_conflicts, quota_refuse_until, quota_delay): the burst and the real races run against the
real API server in tests/e2e/test_quota_ledger.py.

Just enough of
GET /api/v1/pods (paginated LIST, WATCH with bookmarks) over HTTP or HTTPS on
127.0.0.1, with a pod store whose changes become watch events, and knobs a
test turns to misbehave on purpose: 401s, 410 Gone (as a status or an ERROR
event), dropped connections mid-event, slow responses, malformed lines.
ResourceClaims, ResourceClaimTemplates, DeviceClasses and ResourceSlices (resource.k8s.io, in the versions
of served_versions) are listed and watched alike, and a template can be
fetched alone (GET .../namespaces/NS/resourceclaimtemplates/NAME), also one
held back from lists and watches (hidden=True), as one the watch has not
delivered yet, and that GET held (get_hold) as by an API server too slow to answer.
Leases (coordination.k8s.io/v1): GET, POST (409 AlreadyExists when there is one), PUT with the
resourceVersion precondition of the real registry (none: 422 Invalid, another: 409 Conflict;
an absent Lease is a 404 here, where the real one would create it), a resourceVersion per write
(a sequence of their own, so that the pods' stays what the inventory tests expect),
MicroTime fields checked as the real one parses them (6 fractional digits); lease_log records
each answer.
GPUQuotas (gpuguard.io/v1alpha1, add_object): listed and watched like the DRA objects, GET of
one, and PUT of its /status with the resourceVersion precondition (none: 422, another: 409);
the status alone is taken from the body, as the real status subresource does, and the write
becomes a MODIFIED event; quota_log records each status write's answer.

Python standard library only (http.server, ssl, threading)."""

import base64
import json
import re
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def gpu_pod(ns, name, gpus=1, phase="Running", uid=None, cls=None, charge=None, node="node-1",
            resource="nvidia.com/gpu"):
    """A pod object as the API server returns it, with enough noise around
    the fields the inventory reads (managedFields, env, probes, status)."""
    labels = {"app": name, "team": ns}
    if cls:
        labels["gpuguard.io/workload-class"] = cls
    annotations = {"kubectl.kubernetes.io/restartedAt": "2024-01-01T00:00:00Z"}
    if charge is not None:
        annotations["gpuguard.io/charge"] = str(charge)
    limits = {"cpu": "2", "memory": "8Gi"}
    if gpus:
        limits[resource] = str(gpus)
    return {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {
            "name": name, "namespace": ns, "uid": uid or f"uid-{ns}-{name}",
            "labels": labels, "annotations": annotations,
            "creationTimestamp": "2024-01-01T00:00:00Z",
            "managedFields": [{"manager": "kubectl", "operation": "Update",
                               "fieldsV1": {"f:spec": {"f:containers": {}}}}],
        },
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "main", "image": "pytorch/pytorch:2.3.0",
                "env": [{"name": "A", "value": "x \"quoted\" \\ \u00e9"}],
                "resources": {"limits": limits, "requests": dict(limits)},
            }],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        },
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}]},
    }


class FakeApiServer:
    """The pod store, the event log and the behaviour knobs."""

    def __init__(self, tls=None, token=None, page_size=3):
        self.tls = tls  # None, or dict(cert=, key=, client_ca=)
        self.token = token  # expected bearer token; None accepts anything
        self.page_size = page_size  # at most this many items per page (the server may send fewer)
        self.lock = threading.Condition()
        self.pods = {}  # uid -> pod, in insertion order
        self.rv = 100
        self.events = []  # (rv, type, object)
        self.compacted = 0  # watches from a resourceVersion below this get 410
        self.gone_as_event = False  # 410 as HTTP 200 + ERROR event instead of an HTTP status
        self.list_delay = 0.0  # seconds before each list page
        self.get_hold = 0.0  # seconds a GET of one object waits before answering (0 ends a wait)
        self.list_statuses = []  # statuses to answer the next lists with, then normal
        self.watch_scripts = []  # per watch connection: dict of knobs (see _watch)
        self.requests = []  # (kind, query dict, authorization header, path)
        self.objects = {}  # resource ("resourceclaims", ...) -> {uid: object}
        self.hidden = set()  # uids of DRA objects only a GET of their own shows
        self.served_versions = {"v1"}  # resource.k8s.io versions; others answer 404
        self.generation = 0  # end_watches() bumps it: open watches end cleanly
        self.closing = False
        self.snapshots = {}  # continue token -> remaining items
        self.expire_continue = False
        self.leases = {}  # (namespace, name) -> the stored Lease
        self.lease_rv = 0  # the Leases' resourceVersions: their own, so self.rv stays the pods'
        self.lease_log = []  # (monotonic time, method, name, status, holderIdentity written)
        self.refuse_writes_until = 0.0  # monotonic time: lease writes before it answer 503
        self.lease_delay = 0.0  # seconds each lease request waits before it is handled
        self.put_conflicts = 0  # the next this many lease PUTs lose a race: 409 Conflict
        self.quota_conflicts = 0  # the next this many GPUQuota status PUTs answer 409
        self.quota_refuse_until = 0.0  # monotonic time: GPUQuota status PUTs before it get 503
        self.quota_delay = 0.0  # seconds each GPUQuota status PUT waits before it is handled
        self.quota_log = []  # (monotonic time, namespace, name, status) of each status PUT
        self.httpd = None

    # -- the store --------------------------------------------------------

    def _bump(self, kind, obj, resource="pods"):
        self.rv += 1
        obj = json.loads(json.dumps(obj))
        if kind != "BOOKMARK":
            obj["metadata"]["resourceVersion"] = str(self.rv)
        if obj["metadata"].get("uid") not in self.hidden:
            self.events.append((self.rv, kind, obj, resource))
        self.lock.notify_all()
        return obj

    def add_object(self, obj, hidden=False):
        """A ResourceClaim, ResourceClaimTemplate, DeviceClass or ResourceSlice (by its kind)."""
        kind = obj["kind"].lower()
        resource = kind + ("es" if kind.endswith("s") else "s")
        with self.lock:
            uid = obj["metadata"]["uid"]
            if hidden:
                self.hidden.add(uid)
            self.objects.setdefault(resource, {})[uid] = self._bump("ADDED", obj, resource)
            return uid

    def delete_object(self, kind, uid):
        resource = kind.lower() + "s"
        with self.lock:
            self._bump("DELETED", self.objects[resource].pop(uid), resource)

    def add(self, pod):
        with self.lock:
            uid = pod["metadata"]["uid"]
            self.pods[uid] = self._bump("ADDED", pod)
            return uid

    def modify(self, uid, **status):
        with self.lock:
            pod = json.loads(json.dumps(self.pods[uid]))
            pod["status"].update(status)
            self.pods[uid] = self._bump("MODIFIED", pod)

    def delete(self, uid):
        with self.lock:
            pod = self.pods.pop(uid)
            self._bump("DELETED", pod)

    def bookmark(self):
        with self.lock:
            self._bump("BOOKMARK", {"kind": "Pod", "apiVersion": "v1",
                                    "metadata": {"resourceVersion": str(self.rv + 1),
                                                 "creationTimestamp": None},
                                    "spec": {"containers": None}, "status": {}})
            return str(self.rv)

    def compact(self):
        """Forget history: watches from before now get 410 Gone."""
        with self.lock:
            self.compacted = self.rv

    def end_watches(self):
        """Open watches end cleanly (as when timeoutSeconds runs out)."""
        with self.lock:
            self.generation += 1
            self.lock.notify_all()

    def refuse_writes(self, seconds):
        """Lease writes (POST, PUT) answer 503 for this long from now; reads still work."""
        with self.lock:
            self.refuse_writes_until = time.monotonic() + seconds

    def lease(self, name, ns="default"):
        """A copy of the stored Lease, or None."""
        with self.lock:
            got = self.leases.get((ns, name))
            return json.loads(json.dumps(got)) if got else None

    def put_lease(self, lease):
        """Store a Lease as is (a test's starting point), with the next resourceVersion."""
        with self.lock:
            lease = json.loads(json.dumps(lease))
            self.lease_rv += 1
            lease["metadata"]["resourceVersion"] = str(self.lease_rv)
            self.leases[(lease["metadata"]["namespace"], lease["metadata"]["name"])] = lease

    def quota(self, ns, name):
        """A copy of the stored GPUQuota, or None."""
        with self.lock:
            for o in self.objects.get("gpuquotas", {}).values():
                if o["metadata"]["namespace"] == ns and o["metadata"]["name"] == name:
                    return json.loads(json.dumps(o))
        return None

    def requests_of(self, kind, path="/api/v1/pods"):
        with self.lock:
            return [q for k, q, _, p in self.requests if k == kind and p == path]

    def watch_count(self):
        return len(self.requests_of("watch"))

    # -- serving ----------------------------------------------------------

    def start(self):
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if self.tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self.tls["cert"], self.tls["key"])
            if self.tls.get("client_ca"):
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(self.tls["client_ca"])
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    @property
    def port(self):
        return self.httpd.server_address[1]

    @property
    def url(self):
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def stop(self):
        with self.lock:
            self.closing = True
            self.lock.notify_all()
        if self.httpd:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None


def status_body(code, reason, message):
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


LEASES = "/apis/coordination.k8s.io/v1/namespaces/"
QUOTAS = "/apis/gpuguard.io/v1alpha1/namespaces/"
MICROTIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")


def refusal(code, reason, message):
    """A Lease request's refusal: (status, Status body, no holder written)."""
    return code, status_body(code, reason, message), None


def lease_problem(lease):
    """What the API server would refuse in a Lease body (400), or None."""
    spec = lease.get("spec")
    if not isinstance(spec, dict):
        return "spec: Required value"
    for key in ("acquireTime", "renewTime"):
        if key in spec and spec[key] is not None and not (
                isinstance(spec[key], str) and MICROTIME.fullmatch(spec[key])):
            return f"spec.{key}: {spec[key]!r} is not a MicroTime (RFC 3339, 6 fractional digits)"
    for key in ("leaseDurationSeconds", "leaseTransitions"):
        if key in spec and not (isinstance(spec[key], int) and 0 <= spec[key] < 2**31):
            return f"spec.{key}: must be an int32"
    if spec.get("leaseDurationSeconds") == 0:
        return "spec.leaseDurationSeconds: must be greater than 0"
    return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without this, a keep-alive client's next request
    # waits on the delayed ACK (40 ms), as no real API server makes it wait.
    disable_nagle_algorithm = True
    server_fake = None

    def log_message(self, fmt, *args):  # quiet
        pass

    def _json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _status(self, code):
        reasons = {401: ("Unauthorized", "Unauthorized"),
                   403: ("Forbidden", "pods is forbidden: cannot list resource pods"),
                   410: ("Expired", "too old resource version"),
                   500: ("InternalError", "etcd is unhappy")}
        reason, msg = reasons.get(code, ("Unknown", "error"))
        self._json(code, status_body(code, reason, msg))

    # -- Leases -----------------------------------------------------------

    def do_POST(self):
        self._lease_request("POST")

    def do_PUT(self):
        if self.path.startswith(QUOTAS):
            return self._quota_status_put()
        self._lease_request("PUT")

    def _quota_status_put(self):
        """PUT .../namespaces/NS/gpuquotas/NAME/status: the status of the body, if the body's
        resourceVersion is the stored one."""
        fake = self.server_fake
        parts = urllib.parse.urlsplit(self.path).path[len(QUOTAS):].split("/")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with fake.lock:
            fake.requests.append(("quota-put", {}, self.headers.get("Authorization"), self.path))
            delay = fake.quota_delay
        if delay:
            time.sleep(delay)
        code, obj = self._quota_answer(fake, parts, body)
        with fake.lock:
            fake.quota_log.append((time.monotonic(), parts[0], parts[2] if len(parts) > 2 else "",
                                   code))
        try:
            self._json(code, obj)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self.close_connection = True

    @staticmethod
    def _quota_answer(fake, parts, body):
        if len(parts) != 4 or parts[1] != "gpuquotas" or parts[3] != "status":
            return refusal(404, "NotFound", "the server could not find the requested resource")[:2]
        ns, name = parts[0], parts[2]
        what = f'gpuquotas.gpuguard.io "{name}"'
        with fake.lock:
            if time.monotonic() < fake.quota_refuse_until:
                return refusal(503, "ServiceUnavailable", "etcdserver: request timed out")[:2]
            stored = next((o for o in fake.objects.get("gpuquotas", {}).values()
                           if o["metadata"]["namespace"] == ns
                           and o["metadata"]["name"] == name), None)
            if stored is None:
                return refusal(404, "NotFound", f"{what} not found")[:2]
            try:
                sent = json.loads(body)
                rv = sent["metadata"].get("resourceVersion")
            except (ValueError, KeyError, TypeError, AttributeError):
                return refusal(400, "BadRequest", "not a GPUQuota")[:2]
            if not rv:
                return refusal(422, "Invalid", f"{what} is invalid: metadata.resourceVersion: "
                               "Invalid value: 0x0: must be specified for an update")[:2]
            if fake.quota_conflicts > 0:  # another writer got in since the read
                fake.quota_conflicts -= 1
                stored = fake._bump("MODIFIED", stored, "gpuquotas")
                fake.objects["gpuquotas"][stored["metadata"]["uid"]] = stored
            if rv != stored["metadata"]["resourceVersion"]:
                return refusal(409, "Conflict", f"Operation cannot be fulfilled on {what}: the "
                               "object has been modified; please apply your changes to the "
                               "latest version and try again")[:2]
            updated = dict(stored, status=sent.get("status", {}))
            updated = fake._bump("MODIFIED", updated, "gpuquotas")
            fake.objects["gpuquotas"][updated["metadata"]["uid"]] = updated
            return 200, updated

    def _lease_request(self, method):
        """A Lease request: GET, POST or PUT under /apis/coordination.k8s.io/v1/."""
        fake = self.server_fake
        url = urllib.parse.urlsplit(self.path)
        parts = url.path[len(LEASES):].split("/") if url.path.startswith(LEASES) else []
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with fake.lock:
            fake.requests.append((f"lease-{method.lower()}", {},
                                  self.headers.get("Authorization"), url.path))
            delay = fake.lease_delay
        if delay:
            time.sleep(delay)
        try:
            code, obj, holder = self._lease_answer(fake, method, parts, body)
            with fake.lock:
                name = parts[2] if len(parts) > 2 else ""
                fake.lease_log.append((time.monotonic(), method, name, code, holder))
            self._json(code, obj)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self.close_connection = True  # the client gave up waiting

    def _lease_answer(self, fake, method, parts, body):
        """(status, JSON answer, holderIdentity written or None)."""
        if fake.token is not None and self.headers.get("Authorization") != f"Bearer {fake.token}":
            return refusal(401, "Unauthorized", "Unauthorized")
        named = len(parts) == 3 and parts[1] == "leases" and parts[2] != ""
        collection = len(parts) == 2 and parts[1] == "leases"
        if not (named or collection) or named != (method != "POST"):
            return refusal(404, "NotFound", "the server could not find the requested resource")
        ns, what = parts[0], f'leases.coordination.k8s.io "{parts[-1]}"'
        with fake.lock:
            if method == "GET":
                got = fake.leases.get((ns, parts[2]))
                return (200, got, None) if got else refusal(404, "NotFound", f"{what} not found")
            if time.monotonic() < fake.refuse_writes_until:
                return refusal(503, "ServiceUnavailable", "etcdserver: request timed out")
            try:
                lease = json.loads(body)
                name = lease["metadata"]["name"]
            except (ValueError, KeyError, TypeError):
                return refusal(400, "BadRequest", "not a Lease")
            problem = lease_problem(lease)
            if not problem and (lease["metadata"].get("namespace", ns) != ns
                                or (named and name != parts[2])):
                problem = "the name or namespace does not match the path"
            if problem:
                return refusal(400, "BadRequest", problem)
            return self._lease_write(fake, method, ns, name, lease)

    @staticmethod
    def _lease_write(fake, method, ns, name, lease):
        """POST or PUT of a well-formed Lease, under fake.lock."""
        what = f'leases.coordination.k8s.io "{name}"'
        stored = fake.leases.get((ns, name))
        if method == "POST" and stored:
            return refusal(409, "AlreadyExists", f"{what} already exists")
        if method == "PUT" and not stored:
            return refusal(404, "NotFound", f"{what} not found")
        if method == "POST":
            lease["metadata"].update(namespace=ns, uid=f"uid-lease-{ns}-{name}",
                                     creationTimestamp="2024-01-01T00:00:00Z")
        else:
            rv = lease["metadata"].get("resourceVersion")
            if not rv:
                return refusal(422, "Invalid", f"{what} is invalid: metadata.resourceVersion: "
                               "Invalid value: 0x0: must be specified for an update")
            if fake.put_conflicts > 0:  # another writer got in since the read: a new version
                fake.put_conflicts -= 1
                fake.lease_rv += 1
                stored["metadata"]["resourceVersion"] = str(fake.lease_rv)
            if rv != stored["metadata"]["resourceVersion"]:
                return refusal(409, "Conflict", f"Operation cannot be fulfilled on {what}: the "
                               "object has been modified; please apply your changes to the "
                               "latest version and try again")
            for key in ("uid", "creationTimestamp"):
                lease["metadata"][key] = stored["metadata"].get(key)
        fake.lease_rv += 1
        lease["metadata"]["resourceVersion"] = str(fake.lease_rv)
        fake.leases[(ns, name)] = lease
        return 201 if method == "POST" else 200, lease, lease["spec"].get("holderIdentity")

    def do_GET(self):
        fake = self.server_fake
        if self.path.startswith(LEASES):
            return self._lease_request("GET")
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        auth = self.headers.get("Authorization")
        kind = "watch" if query.get("watch") in ("1", "true") else "list"
        parts = url.path.split("/")  # ["", "apis", "resource.k8s.io", v, ...]
        dra = url.path.startswith("/apis/resource.k8s.io/") and len(parts) >= 5
        quotas = url.path.startswith("/apis/gpuguard.io/v1alpha1/") and len(parts) >= 5
        if (dra or quotas) and len(parts) == 8 and parts[4] == "namespaces":
            kind = "get"
        # A watch takes its script and the watches' generation as it is counted, under the
        # lock: a test that has seen it counted and then adds a script or ends the open
        # watches means the next watch, never this one (a race under load otherwise).
        script, generation = {}, None
        with fake.lock:
            fake.requests.append((kind, query, auth, url.path))
            if kind == "watch":
                generation = fake.generation
                if url.path == "/api/v1/pods" and fake.watch_scripts:
                    script = fake.watch_scripts.pop(0)
        if dra and parts[3] not in fake.served_versions:
            return self._status(404)
        if fake.token is not None and auth != f"Bearer {fake.token}":
            return self._status(401)
        if kind == "get":
            return self._get(fake, parts[6], parts[5], parts[7])
        if dra and len(parts) == 5 and parts[4] in ("resourceclaims", "resourceclaimtemplates",
                                                    "deviceclasses", "resourceslices"):
            resource = parts[4]
        elif quotas and len(parts) == 5 and parts[4] == "gpuquotas":
            resource = "gpuquotas"
        elif url.path == "/api/v1/pods":
            resource = "pods"
        else:
            return self._status(404)
        if kind == "list":
            return self._list(fake, query, resource)
        return self._watch(fake, query, resource, script, generation)

    def _get(self, fake, resource, ns, name):
        until = time.monotonic() + fake.get_hold
        while fake.get_hold and time.monotonic() < until:
            time.sleep(0.05)
        with fake.lock:
            found = [o for o in fake.objects.get(resource, {}).values()
                     if o["metadata"]["namespace"] == ns and o["metadata"]["name"] == name]
        if not found:
            return self._json(404, status_body(404, "NotFound", f"{resource} \"{name}\" not found"))
        self._json(200, found[0])

    # -- LIST -------------------------------------------------------------

    def _list(self, fake, query, resource):
        if fake.list_delay:
            time.sleep(fake.list_delay)
        with fake.lock:
            if fake.list_statuses:
                return self._status(fake.list_statuses.pop(0))
            limit = min(int(query.get("limit", "0") or 0) or 10**9, fake.page_size)
            token = query.get("continue")
            if token:
                if fake.expire_continue or token not in fake.snapshots:
                    fake.expire_continue = False
                    return self._status(410)
                rv, items = fake.snapshots.pop(token)
            elif resource == "pods":
                rv, items = str(fake.rv), [p for p in fake.pods.values()]
            else:  # list items carry no kind or apiVersion, as the API server sends them
                rv = str(fake.rv)
                items = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
                         for o in fake.objects.get(resource, {}).values()
                         if o["metadata"]["uid"] not in fake.hidden]
            page, rest = items[:limit], items[limit:]
            meta = {"resourceVersion": rv}
            if rest:
                nxt = base64.b64encode(json.dumps({"rv": rv, "n": len(fake.snapshots),
                                                   "at": time.time()}).encode()).decode()
                fake.snapshots[nxt] = (rv, rest)
                meta["continue"] = nxt
                meta["remainingItemCount"] = len(rest)
        self._json(200, {"kind": "PodList" if resource == "pods" else "List", "apiVersion": "v1",
                         "metadata": meta, "items": page})

    # -- WATCH ------------------------------------------------------------

    def _chunk(self, data):
        if isinstance(data, str):
            data = data.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _drop(self):
        """Close the connection without ending the chunked body."""
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(2)
        except OSError:
            pass

    def _watch(self, fake, query, resource, script, generation):
        """One watch connection.  A script (fake.watch_scripts, one per
        connection, consumed in order as the watches arrive) may say:
          hold:       seconds to wait before answering at all
          status:     answer with this HTTP error status
          lines:      raw lines sent first (malformed events)
          after:      send this many events, then
          drop:       cut the connection in the middle of the next event
          error:      send an ERROR event with this code and end
          slow:       send each event in 3 pieces with this pause between"""
        if script.get("hold"):
            time.sleep(script["hold"])
        with fake.lock:
            since = int(query.get("resourceVersion") or 0)
            gone = since < fake.compacted
        if script.get("status"):
            return self._status(script["status"])
        if gone and not fake.gone_as_event:
            return self._status(410)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            if gone:
                ev = {"type": "ERROR", "object": status_body(
                    410, "Expired", f"too old resource version: {since} ({fake.compacted})")}
                self._chunk(json.dumps(ev) + "\n")
                return self._chunk(b"")
            for line in script.get("lines", []):
                self._chunk(line + "\n")
            if "error" in script:
                ev = {"type": "ERROR", "object": status_body(script["error"], "InternalError",
                                                             "scripted error")}
                self._chunk(json.dumps(ev) + "\n")
                return self._chunk(b"")
            self._stream(fake, query, since, script, resource, generation)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self.close_connection = True

    def _stream(self, fake, query, since, script, resource, generation):
        deadline = time.monotonic() + int(query.get("timeoutSeconds") or 60)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        sent = 0
        while True:
            with fake.lock:
                pending = [e for e in fake.events if e[0] > since and e[3] == resource]
                while (not pending and fake.generation == generation and not fake.closing
                       and time.monotonic() < deadline):
                    fake.lock.wait(0.2)
                    pending = [e for e in fake.events if e[0] > since and e[3] == resource]
                ended = fake.generation != generation or fake.closing
            if ended or (not pending and time.monotonic() >= deadline):
                return self._chunk(b"")
            for rv, kind, obj, _ in pending:
                since = rv
                if kind == "BOOKMARK" and not bookmarks:
                    continue
                line = json.dumps({"type": kind, "object": obj}) + "\n"
                if "after" in script and sent >= script["after"]:
                    if script.get("drop"):
                        self._chunk(line[: len(line) // 2])
                        return self._drop()
                if script.get("slow"):
                    third = len(line) // 3
                    for piece in (line[:third], line[third: 2 * third], line[2 * third:]):
                        self._chunk(piece)
                        time.sleep(script["slow"])
                else:
                    self._chunk(line)
                sent += 1
