"""A real Prometheus (Debian's) on 127.0.0.1 with DCGM exporter history:
series generated here are backfilled with `promtool tsdb create-blocks-from
openmetrics`, and a small loopback exporter that Prometheus scrapes every
second serves the samples of now, which a test can change.

The history (namespace ml unless said otherwise; value = DCGM_FI_DEV_FB_USED
in MiB, one sample a minute, ending two minutes ago):

  chat   Deployment on a whole A100: pod chat-5d8f7c9b4-x2x7z from 26.5 h
         ago to 13 h ago (5000, 7270 once every 100 min), a gap, then the
         restarted pod chat-5d8f7c9b4-q8k4w from 12 h ago (6000, live too)
  embed  StatefulSet on a MIG 3g.40gb instance: embed-0 from 20.5 h to 15 h
         ago (peak 15000), then the same name again from 10 h ago (12000)
  lab    Deployment on a time-sliced GPU: two pods on one device, each seeing
         the device's 20000 (left out: not attributable)
  sweep  Job, 40 minutes of history (3000): less than min_history
  vec    Deployment on a whole A100 for 5.5 h (3000, live too)
  serve  LeaderWorkerSet's pod serve-0-1 on a whole A100 for 3.5 h (3000): by its name alone
         it folds into "serve-0"; the inventory knows its owner
  idle   Deployment on a whole A100 for 10 h, every sample 0 (an idle GPU, or an exporter
         that reports nothing): no evidence of a small workload, left out
  research/embed-0: another namespace's embed, 70000
"""

import contextlib
import json
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import procs

METRIC = "DCGM_FI_DEV_FB_USED"
STEP = 60


def _labels(d):
    return ",".join(f'{k}="{v}"' for k, v in d.items())


def device(gpu, uuid, host="gpu-node-1", profile=None, instance_id=None):
    d = {"gpu": str(gpu), "UUID": uuid, "device": f"nvidia{gpu}",
         "modelName": "NVIDIA A100-SXM4-80GB", "Hostname": host}
    if profile:
        d.update({"GPU_I_PROFILE": profile, "GPU_I_ID": str(instance_id)})
    return d


A = device(0, "GPU-0a1b2c3d")
MIG = device(1, "GPU-1e2f3a4b", profile="3g.40gb", instance_id=1)
SHARED = device(2, "GPU-2c3d4e5f")
C = device(3, "GPU-3f4a5b6c")
V = device(4, "GPU-4b5c6d7e")
W = device(5, "GPU-6a7b8c9d")
IDLE = device(6, "GPU-7d8e9f0a")
R = device(0, "GPU-5d6e7f8a", host="gpu-node-2")

LIVE = {  # what the exporter serves now: pod -> (device, namespace, container, MiB)
    "chat-5d8f7c9b4-q8k4w": [A, "ml", "server", 6000],
    "vec-6b7c8d9f5-k2k2k": [V, "ml", "index", 3000],
}


def history(now):
    """(labels, [(t, value)]) of every backfilled series."""
    end = now - 120
    h = 3600

    def span(t0, t1, value):
        return [(t, value(t)) for t in range((t0 // STEP) * STEP, t1, STEP)]

    def pod(dev, ns, name, container):
        return dict(dev, namespace=ns, pod=name, container=container)

    return [
        (pod(A, "ml", "chat-5d8f7c9b4-x2x7z", "server"),
         span(now - 26 * h - 1800, now - 13 * h, lambda t: 7270 if (t // STEP) % 100 == 0 else 5000)),
        (pod(A, "ml", "chat-5d8f7c9b4-q8k4w", "server"), span(now - 12 * h, end, lambda t: 6000)),
        (pod(MIG, "ml", "embed-0", "model"),
         span(now - 20 * h - 1800, now - 15 * h, lambda t: 15000 if (t // STEP) % 7 == 0 else 9000)),
        (pod(MIG, "ml", "embed-0", "model"), span(now - 10 * h, end, lambda t: 12000)),
        (pod(SHARED, "ml", "lab-7c9b4d5f8-b2b2b", "nb"), span(now - 20 * h, end, lambda t: 20000)),
        (pod(SHARED, "ml", "lab-7c9b4d5f8-c4c4c", "nb"), span(now - 20 * h, end, lambda t: 20000)),
        (pod(C, "ml", "sweep-k7k7k", "trial"), span(now - 2400, end, lambda t: 3000)),
        (pod(V, "ml", "vec-6b7c8d9f5-k2k2k", "index"), span(now - 5 * h - 1800, end, lambda t: 3000)),
        (pod(W, "ml", "serve-0-1", "vllm"), span(now - 3 * h - 1800, end, lambda t: 3000)),
        (pod(IDLE, "ml", "idle-5c6d7f8b9-m2m2m", "server"), span(now - 10 * h, end, lambda t: 0)),
        (pod(R, "research", "embed-0", "model"), span(now - 20 * h, end, lambda t: 70000)),
    ]


def openmetrics(now, target):
    """The backfill as OpenMetrics text, each series with the job and instance
    labels Prometheus gives the live exporter's samples (so live samples
    continue the same series)."""
    out = [f"# HELP {METRIC} Framebuffer memory used (in MiB).", f"# TYPE {METRIC} gauge"]
    for labels, samples in history(now):
        lab = _labels(dict(labels, instance=target, job="dcgm"))
        out += [f"{METRIC}{{{lab}}} {v} {t}" for t, v in samples]
    out.append("# EOF")
    return "\n".join(out) + "\n"


def loopback_server(body_of, content_type):
    """A threaded HTTP server on 127.0.0.1 whose every GET answers 200 with body_of(path) (str or
    bytes) as content_type; the server, already serving."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = body_of(self.path)
            body = body.encode() if isinstance(body, str) else body
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


class Exporter:
    """The loopback exporter: GET /metrics serves LIVE-shaped samples."""

    def __init__(self):
        self.live = {k: list(v) for k, v in LIVE.items()}
        self.lock = threading.Lock()
        self.httpd = loopback_server(lambda _: self.text(), "text/plain; version=0.0.4")
        self.target = f"127.0.0.1:{self.httpd.server_address[1]}"

    def set(self, pod, mib):
        with self.lock:
            self.live[pod][3] = mib

    def text(self):
        with self.lock:
            lines = [f"# TYPE {METRIC} gauge"]
            for pod, (dev, ns, container, mib) in self.live.items():
                lines.append(f"{METRIC}{{{_labels(dict(dev, namespace=ns, pod=pod, container=container))}}} {mib}")
        return "\n".join(lines) + "\n"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """Debian's prometheus on a data directory backfilled with history(), scraping the exporter."""

    def __init__(self, tmp, exporter):
        self.tmp = tmp
        now = int(time.time())
        data = tmp / "data"
        data.mkdir()
        om = tmp / "dcgm.om"
        om.write_text(openmetrics(now, exporter.target))
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "--quiet",
                        str(om), str(data)], check=True, capture_output=True,
                       timeout=procs.PATIENCE)
        (tmp / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - {{job_name: dcgm, static_configs: [{{targets: ['{exporter.target}']}}]}}\n")
        log = tmp / "prometheus.log"
        for _ in range(5):  # a free port may be taken (by a test running beside) before it binds
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            with open(log, "wb") as out:
                self.proc = procs.spawn(
                    ["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                     f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{self.port}",
                     "--storage.tsdb.retention.time=30d", "--log.level=warn"],
                    stdout=out, stderr=out)
            deadline = time.monotonic() + procs.PATIENCE
            while time.monotonic() < deadline and self.proc.poll() is None:
                if self.ready() and self.scraped():
                    return
                time.sleep(0.2)
            self.stop()
            if "address already in use" not in log.read_text():
                break
        raise RuntimeError(f"prometheus did not become ready with a scrape: {log.read_text()}")

    def ready(self):
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def scraped(self):
        """True once the exporter has been scraped (its samples are live)."""
        q = urllib.parse.quote('up{job="dcgm"} == 1')
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query?query={q}", timeout=2) as r:
                return b'"result":[{' in r.read()
        except OSError:
            return False

    def stop(self):
        procs.stop(self.proc, signal.SIGTERM)


@contextlib.contextmanager
def serving(tmp):
    """A Prometheus with its exporter (as .exporter) in tmp, stopped on the way out (continued
    first, should a test have stopped it)."""
    exporter = Exporter()
    p = Prometheus(tmp, exporter)
    p.exporter = exporter
    try:
        yield p
    finally:
        p.proc.send_signal(signal.SIGCONT)
        p.stop()
        exporter.close()


# ---- a stand-in Prometheus: fixed answers, for what a real one will not send ------------------

def vector_answer(samples, t=1795526098.47):
    """The body of an instant-vector answer: samples are (labels, value) pairs."""
    rows = ",".join('{"metric":%s,"value":[%.3f,"%s"]}'
                    % (json.dumps(labels, separators=(",", ":")), t, value)
                    for labels, value in samples)
    return '{"status":"success","data":{"resultType":"vector","result":[%s]}}' % rows


def many_pods(n, namespaces=100):
    """n pods of n workloads (Jobs' pods, one a workload), each with a peak, in a generated
    cluster: the answers Prometheus sends for a large fleet over the window.  The peak answer has
    n series; the history two per pod for the first 40 % of them (0.8 n series: its series are
    longer), so that both stay under the 32 MiB bound up to about 330,000 pods."""
    pods = [(f"ns-{i % namespaces}", f"job-{i}-bcdfg") for i in range(n)]
    peak = vector_answer(({"namespace": ns, "pod": p}, 2048 + i % 50000)
                         for i, (ns, p) in enumerate(pods))
    edges = []
    for ns, p in pods[:n * 2 // 5]:
        edges.append(({"edge": "first", "namespace": ns, "pod": p}, 1795400000))
        edges.append(({"edge": "last", "namespace": ns, "pod": p}, 1795526040))
    return peak, vector_answer(edges)


class FakePrometheus:
    """GET /api/v1/query on 127.0.0.1: the peak query's answer is .peak, the history query's
    (the one with label_replace) .history, both bodies (str or bytes) a test may change."""

    def __init__(self, peak, history):
        self.peak, self.history = peak, history
        self.queries = 0
        self.httpd = loopback_server(self.answer, "application/json")
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def answer(self, path):
        text = urllib.parse.parse_qs(urllib.parse.urlparse(path).query).get("query", [""])[0]
        self.queries += 1
        return self.history if "label_replace" in text else self.peak

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
