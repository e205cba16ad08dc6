"""The alert rules (deploy/prometheus) and the Grafana dashboard (deploy/grafana) against
promtool and against the metrics the server exports.

The rules: the PrometheusRule's spec (promtool reads plain rule files, not the custom
resource) goes through `promtool check rules` and `promtool test rules`
(gpuguard-alerts.test.yaml: each alert fires on the series that should fire it, and stays
silent on healthy ones).  The dashboard: one unit per panel, the Rightsizing panels in a row
of that name, the panels the docs promise.  Both: every metric they query, and every label
they filter or group on, is one a running server exports, scraped from a server with
everything that exports metrics switched on (the shipped policies and configuration, the
inventory synced to a stand-in API server, rightsizing on a stand-in Prometheus)."""

import json
import re
import shutil
import subprocess
import time

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO, start_server, wait_for
from dcgm_prometheus import FakePrometheus
from fake_apiserver import FakeApiServer, gpu_pod
from test_quota_ledger import quota as ledger_quota, validate as ledger_validate
from test_inventory_sync import no_proxy_env, write_kubeconfig
from test_rightsizing import CHAT_POD, chat_answers, mutate

RULE = REPO / "deploy" / "prometheus" / "gpuguard-alerts.yaml"
RULE_TEST = REPO / "deploy" / "prometheus" / "gpuguard-alerts.test.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "gpuguard-dashboard.json"
MONITORING_DOC = REPO / "docs" / "monitoring.md"
PROMTOOL = shutil.which("promtool", path="/usr/bin:/usr/local/bin")

# The alerts the rule must have: webhook errors (policy calls, HTTP), latency near the
# timeout, certificate expiry, the inventory not synced, quotas not enforced, reloads refused,
# and no metrics at all (every other alert blind).
ALERTS = {
    "GpuguardPolicyErrors", "GpuguardHTTPErrors", "GpuguardLatencyNearTimeout",
    "GpuguardDeadlineOverruns", "GpuguardCertificateExpiresSoon",
    "GpuguardCertificateAboutToExpire", "GpuguardCertificateReloadRefused",
    "GpuguardInventoryNotReady", "GpuguardInventoryStale", "GpuguardQuotaNotEnforced",
    "GpuguardPolicyReloadRefused", "GpuguardMetricsAbsent", "GpuguardAuditStale",
}
# The recording rules: the audit's per-namespace gauges summed cluster-wide.
RECORDS = {
    "gpuguard:rightsizing_requested_gpus:sum": "sum(gpuguard_rightsizing_requested_gpus)",
    "gpuguard:rightsizing_needed_gpus:sum": "sum(gpuguard_rightsizing_needed_gpus)",
    "gpuguard:rightsizing_waste_gpus:sum": "sum(gpuguard_rightsizing_waste_gpus)",
}

# Labels every scraped series carries (added by Prometheus), which queries may group on.
TARGET_LABELS = {"instance", "job"}


# --- the rules ----------------------------------------------------------------------------

def load_rule():
    doc = yaml.safe_load(RULE.read_text())
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    return doc


def alert_rules(doc=None):
    doc = doc or load_rule()
    return {r["alert"]: r for g in doc["spec"]["groups"] for r in g["rules"] if "alert" in r}


def promtool(*args, cwd):
    assert PROMTOOL, "promtool is not installed: the Debian package prometheus (make deps)"
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def rule_files(tmp_path):
    """The rule's spec as a plain rule file, with the unit tests next to it; (dir, doc)."""
    doc = load_rule()
    (tmp_path / "gpuguard-alerts.rules.yaml").write_text(yaml.safe_dump(doc["spec"],
                                                                        sort_keys=False))
    shutil.copy(RULE_TEST, tmp_path / RULE_TEST.name)
    return tmp_path, doc


def test_promtool_checks_the_rules(rule_files):
    where, doc = rule_files
    res = promtool("check", "rules", "gpuguard-alerts.rules.yaml", cwd=where)
    assert res.returncode == 0, res.stdout + res.stderr
    n = sum(len(g["rules"]) for g in doc["spec"]["groups"])
    assert f"SUCCESS: {n} rules found" in res.stdout, res.stdout


def test_promtool_unit_tests_pass(rule_files):
    where, _ = rule_files
    res = promtool("test", "rules", RULE_TEST.name, cwd=where)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout, res.stdout


def test_every_alert_exists_with_severity_and_text():
    rules = alert_rules()
    assert set(rules) == ALERTS, set(rules) ^ ALERTS
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        # The description sends the reader to what to do.
        assert f"docs/monitoring.md, {name}." in " ".join(rule["annotations"]["description"]
                                                          .split()), name


def test_every_alert_is_tested_firing_and_silent():
    """Each alert has a case in the unit tests where it fires and one where it does not."""
    cases = [case for group in yaml.safe_load(RULE_TEST.read_text())["tests"]
             for case in group.get("alert_rule_test", [])]
    fires = {c["alertname"] for c in cases if c.get("exp_alerts")}
    silent = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert fires == ALERTS, ALERTS - fires
    assert silent == ALERTS, ALERTS - silent


def test_the_recording_rules_are_tested():
    """The audit's cluster-wide sums, each with the expression it records and a promtool case
    that checks its value."""
    records = {r["record"]: " ".join(r["expr"].split()) for g in load_rule()["spec"]["groups"]
               for r in g["rules"] if "record" in r}
    assert records == RECORDS
    cases = [case for group in yaml.safe_load(RULE_TEST.read_text())["tests"]
             for case in group.get("promql_expr_test", [])]
    assert {c["expr"] for c in cases if c.get("exp_samples")} >= set(RECORDS)


def test_the_latency_alert_sits_below_the_webhook_timeout():
    """The threshold is under the API server's timeoutSeconds and above the policies' own
    wall clock (engine.timeout), as its description says."""
    hooks = [h for d in yaml.safe_load_all((REPO / "deploy" / "install.yaml").read_text())
             if d and d["kind"].endswith("WebhookConfiguration") for h in d["webhooks"]]
    timeout = min(h["timeoutSeconds"] for h in hooks)
    engine = yaml.safe_load((REPO / "deploy" / "gpuguard.yaml").read_text())["engine"]
    amount, unit = re.fullmatch(r"([0-9.]+)(ms|s)", engine["timeout"]).groups()
    lua_s = float(amount) / (1000 if unit == "ms" else 1)
    expr = alert_rules()["GpuguardLatencyNearTimeout"]["expr"]
    threshold = float(re.search(r"\)\s*>\s*([0-9.]+)\s*$", expr).group(1))
    assert lua_s < threshold < timeout, (lua_s, threshold, timeout)
    assert f"gives up at {timeout} s" in alert_rules()["GpuguardLatencyNearTimeout"][
        "annotations"]["description"]


def test_the_docs_explain_every_alert():
    text = MONITORING_DOC.read_text()
    for name in ALERTS:
        assert re.search(rf"^#+ .*\b{name}\b", text, re.M), f"docs/monitoring.md: {name}"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_renders_the_rule_alone():
    res = subprocess.run(["kubectl", "kustomize", str(RULE.parent)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    assert [(d["kind"], d["metadata"]["namespace"]) for d in docs] == [
        ("PrometheusRule", "gpuguard-system")]
    assert alert_rules(docs[0]) == alert_rules()


# --- the dashboard ------------------------------------------------------------------------

def load_dashboard():
    return json.loads(DASHBOARD.read_text())


def rows_and_panels(dash):
    """[(row title or None, panel)] for every panel that is not a row, collapsed rows
    included; the row of an expanded one is the last row above it in the list."""
    out, current = [], None
    for p in dash["panels"]:
        if p["type"] == "row":
            current = p
            # Grafana drops the panels of an expanded row's own list: they follow it instead.
            if not p.get("collapsed"):
                assert not p.get("panels"), f"row {p['title']}: panels inside an expanded row"
            out += [(p["title"], q) for q in p.get("panels", [])]
        else:
            if current is not None and not current.get("collapsed"):
                assert p["gridPos"]["y"] > current["gridPos"]["y"], p["title"]
            out.append((current["title"] if current else None, p))
    return out


def exprs(panel):
    return [t["expr"] for t in panel.get("targets", [])]


def test_every_panel_has_one_unit():
    for _, p in rows_and_panels(load_dashboard()):
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
        assert isinstance(unit, str) and unit, f"{p['title']}: no unit"
        for o in p["fieldConfig"].get("overrides", []):
            for prop in o.get("properties", []):
                assert prop["id"] != "unit" or prop["value"] == unit, (
                    f"{p['title']}: an override sets unit {prop['value']} besides {unit}")


def test_panels_have_queries_and_do_not_overlap():
    dash = load_dashboard()
    ids = [p["id"] for p in dash["panels"]] + [q["id"] for p in dash["panels"]
                                                for q in p.get("panels", [])]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    cells = {}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
    for _, p in rows_and_panels(dash):
        assert exprs(p), f"{p['title']}: no query"


AUDIT_ROW = "GPU waste (audit)"


def test_rightsizing_panels_sit_in_the_rightsizing_row():
    """The rightsizing metrics in the Rightsizing row, or in the audit's row (the waste of
    what runs); each row queries only its own metrics."""
    placed = rows_and_panels(load_dashboard())
    rs = [(row, p) for row, p in placed
          if any("gpuguard_rightsizing_" in e for e in exprs(p))]
    assert len(rs) >= 3, "the Rightsizing panels"
    for row, p in rs:
        assert row in ("Rightsizing", AUDIT_ROW), f"{p['title']}: in row {row}"
    for row, p in placed:
        if row == "Rightsizing":
            assert all("gpuguard_rightsizing_" in e for e in exprs(p)), p["title"]
        if row == AUDIT_ROW:
            assert all(re.search(r"gpuguard_(rightsizing|audit)_", e) for e in exprs(p)), \
                p["title"]
        else:
            assert not any("gpuguard_audit_" in e for e in exprs(p)), p["title"]


# The audit's row: a title word and what each panel queries.
AUDIT_PANELS = [
    ("waste by namespace", r"^sort_desc\(sum by \(namespace\) \(gpuguard_rightsizing_waste_gpus\)\)$"),
    ("held vs. needed vs. waste", r"^sum\(gpuguard_rightsizing_requested_gpus\)$"),
    ("held vs. needed vs. waste", r"^sum\(gpuguard_rightsizing_needed_gpus\)$"),
    ("held vs. needed vs. waste", r"^sum\(gpuguard_rightsizing_waste_gpus\)$"),
    ("without usage history", r"gpuguard_rightsizing_unknown_gpus"),
    ("Audit results", r"^sum by \(result\) \(gpuguard_audit_results\)$"),
    ("last success", r"^time\(\) - max\(gpuguard_audit_last_success_timestamp_seconds\)$"),
]


def test_the_audit_row():
    """Per-namespace and cluster sums (only the leader exports the gauges, so sums over
    replicas are right), and the time since the last audit with GpuguardAuditStale's
    threshold."""
    placed = [p for row, p in rows_and_panels(load_dashboard()) if row == AUDIT_ROW]
    assert len(placed) == 5
    for word, query in AUDIT_PANELS:
        assert [p for p in placed if word in p["title"]
                and any(re.search(query, e) for e in exprs(p))], f"a {word} panel on {query}"
    [stale] = [p for p in placed if "last success" in p["title"]]
    steps = stale["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["value"] == 1800 and "> 1800" in alert_rules()["GpuguardAuditStale"]["expr"]


# Panels the dashboard must have: a title word and what it queries.
REQUIRED_PANELS = [
    ("Admission rate", r"gpuguard_admission_requests_total"),
    ("latency", r"gpuguard_admission_request_duration_seconds_bucket"),
    ("Denials by policy", r'result="denied"'),
    ("Policy errors", r'result=~"error\|budget\|memory\|timeout"'),
    ("Deadline overruns", r"gpuguard_deadline_overruns_total"),
    ("HTTP errors", r"gpuguard_http_errors_total"),
    ("Inventory", r"gpuguard_inventory_last_sync_timestamp_seconds"),
    ("Inventory", r"gpuguard_inventory_ready"),
    ("Quotas enforced", r"gpuguard_quota_enforced"),
    ("quota", r"gpuguard_quota_gpus"),
    ("reload", r"gpuguard_policy_reloads_total"),
    ("reload", r"gpuguard_policy_last_reload_success"),
    ("certificate", r"gpuguard_tls_certificate_expiry_timestamp_seconds"),
    ("Rightsizing", r"gpuguard_rightsizing_requested_gpus"),
    ("Rightsizing", r"gpuguard_rightsizing_recommendations_total"),
    ("Rightsizing", r"gpuguard_rightsizing_source_up"),
]


def test_the_required_panels_exist():
    placed = rows_and_panels(load_dashboard())
    for word, query in REQUIRED_PANELS:
        assert [p for _, p in placed if word in p["title"]
                and any(re.search(query, e) for e in exprs(p))], f"a {word} panel on {query}"


# --- what the dashboard and the rules query, against what the server exports -------------

@pytest.fixture
def everything_on(binary, certs, tmp_path):
    """A server with every source of metrics on: the shipped policies and configuration,
    the inventory synced to a stand-in API server holding a GPU pod, rightsizing on a
    stand-in Prometheus with one workload's history (and that workload's pod reviewed), one
    HTTP error, and a GPUQuota's ledger charged, full and corrected."""
    api = FakeApiServer().start()
    api.add(gpu_pod("team-a", "train-0", cls="training"))
    api.add_object(ledger_quota(hard="2", status={"used": {"gpu": "0"}, "entries": []}))
    prom = FakePrometheus(*chat_answers(int(time.time())))
    srv = None
    try:
        cfg = yaml.safe_load((REPO / "deploy" / "gpuguard.yaml").read_text())
        cfg["rightsizing"].update({"prometheus": {"url": prom.url, "timeout": "2s"},
                                   "mode": "recommend", "refresh": "2s"})
        config = tmp_path / "gpuguard.yaml"
        config.write_text(yaml.safe_dump(cfg))
        srv = start_server(binary, certs, tmp_path, "--policies", str(REPO / "policies"),
                           "--lua", str(REPO / "lua"), "--config", str(config),
                           "--kubeconfig", str(write_kubeconfig(tmp_path, api.url)),
                           "--lease-namespace", "gpuguard-system", "--quota-entry-bound", "1s",
                           env=no_proxy_env())
        assert wait_for(lambda: "inventory: ready" in srv.ops("/readyz")[1])
        # The quota ledger: a pod charged, one refused while the ledger cannot be written, and
        # the charged one never created (a correction once the bound has passed).
        assert ledger_validate(srv, "a") == (True, None)
        api.quota_refuse_until = time.monotonic() + 60
        assert not ledger_validate(srv, "b", timeout="2s")[0]
        api.quota_refuse_until = 0
        assert wait_for(lambda: "gpuguard_quota_ledger_corrections_total{" in srv.ops("/metrics")[1])
        assert wait_for(lambda: "rightsizing: ok (1 workloads" in srv.ops("/readyz")[1])
        mutate(srv, CHAT_POD)  # a reviewed workload: the requested and needed gauges
        conn = srv.connect()
        conn.request("GET", "/mutate")  # an HTTP error: the code label
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 405
        conn.close()
        yield srv
    finally:
        api.stop()
        prom.close()
        if srv is not None:
            assert srv.stop() == 0


def exported(text):
    """{series name: set of label names} of a /metrics text; families without samples
    count with the names their TYPE line implies."""
    names = {}
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
        for suffix in suffixes:
            names.setdefault(name + suffix, set())
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            names.setdefault(s.name, set()).update(s.labels)
    return names


def label_values(text, series, label):
    return {s.labels[label] for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == series and label in s.labels}


def queries():
    """(where, PromQL expression) of every dashboard target and every rule."""
    out = [(f"dashboard: {p['title']}", e) for _, p in rows_and_panels(load_dashboard())
           for e in exprs(p)]
    out += [(f"rule: {name}", r["expr"]) for name, r in alert_rules().items()]
    out += [(f"rule: {name}", expr) for name, expr in RECORDS.items()]
    return out


def test_dashboard_and_rules_query_only_what_the_server_exports(everything_on):
    status, text = everything_on.ops("/metrics")
    assert status == 200
    names = exported(text)
    checked = set()
    for where, expr in queries():
        used = re.findall(r"\b(gpuguard_[a-z_]+)\b(\{[^}]*\})?", expr)
        assert used, f"{where}: queries no gpuguard metric"
        labels = set(TARGET_LABELS)
        for name, matchers in used:
            assert name in names, f"{where}: {name} is not exported"
            checked.add(name)
            labels |= names[name]
            for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', matchers):
                assert label in names[name], f"{where}: {name} has no label {label}"
                if op in ("=", "=~"):
                    have = label_values(text, name, label)
                    for want in value.split("|") if op == "=~" else [value]:
                        assert want in have, f"{where}: {name}{{{label}}} is never {want!r}"
        for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            for label in filter(None, (g.strip() for g in group.split(","))):
                assert label in labels, f"{where}: grouped by {label}, which it lacks"
    # The rules and the dashboard between them watch these.
    assert {"gpuguard_policy_evaluations_total", "gpuguard_http_errors_total",
            "gpuguard_deadline_overruns_total", "gpuguard_inventory_ready",
            "gpuguard_inventory_last_sync_timestamp_seconds", "gpuguard_quota_enforced",
            "gpuguard_policy_last_reload_success",
            "gpuguard_tls_certificate_expiry_timestamp_seconds"} <= checked
