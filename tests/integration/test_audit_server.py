"""The audit of `gpuguard serve` against an API server that does not serve the report API (no
CRDs installed): the stand-in of tests/integration/fake_apiserver.py answers 404 there, as the
real one does without the CRDs; the reports themselves, against the real API server, are
tests/e2e/test_audit.py's.  The audit still judges what runs and publishes its figures, says
once that the API is not served, counts the audit as one that is not whole, and writes nothing."""

import re

from conftest import wait_for
from test_inventory_sync import fake, metrics, running  # noqa: F401 (fixtures)
from test_server import metric


def audits(server):
    return [line for line in server.log_lines() if line.get("msg") == "audit"]


def test_without_the_report_crds_the_audit_says_so_once_and_still_counts(running):  # noqa: F811
    api, server = running
    assert wait_for(lambda: any(a.get("outcome") for a in audits(server)), timeout=60)
    done = [a for a in audits(server) if a.get("outcome")][0]
    # Two GPU pods of team-q and the MIG pod of team-a, judged (and each, a workload of its own,
    # reviewed for rightsizing): their reports and the cluster's not written.
    assert (done["outcome"], done["evaluations"], done["resources"], done["written"]) == (
        "failed", 6, 4, 0), done
    said = [a["error"] for a in audits(server) if isinstance(a.get("error"), str)]
    assert said.count("the API wgpolicyk8s.io/v1alpha2 is not served (its CRDs are not "
                      "installed: deploy/reports/wgpolicyk8s.io.yaml): no reports") == 1, said
    assert not [s for s in said if "POST" in s or "PUT" in s], said
    text = metrics(server)
    assert metric(text, "gpuguard_audit_runs_total", result="error") >= 1
    assert metric(text, "gpuguard_audit_runs_total", result="ok") == 0
    # No audit is whole: no results yet, and GpuguardAuditStale will say so.
    assert metric(text, "gpuguard_audit_results", result="pass") == 0
    # The figures still come: every pod was seen (no history here: what they hold is unknown).
    assert metric(text, "gpuguard_rightsizing_unknown_gpus", namespace="team-a") == 0.286
    assert not re.search(r"^gpuguard_audit_last_success_timestamp_seconds [1-9]", text, re.M)
