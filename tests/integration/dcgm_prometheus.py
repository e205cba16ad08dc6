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
  research/embed-0: another namespace's embed, 70000
"""

import contextlib
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


class Exporter:
    """The loopback exporter: GET /metrics serves LIVE-shaped samples."""

    def __init__(self):
        self.live = {k: list(v) for k, v in LIVE.items()}
        self.lock = threading.Lock()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = exporter.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

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
