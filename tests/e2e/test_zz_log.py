"""Last of the end-to-end files (pytest runs them in name order): after every run above,
gpuguard's log shows no request refused for want of a right or a token.  While an API server
restarts (test_quota.py) its authorizer refuses what RBAC allows until its caches have filled
(it serves before it is ready): those minutes are left out."""

import re
from datetime import datetime


def restarting(cluster, ts):
    t = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    return any(start <= t <= ready for start, ready in cluster.state.get("apiserver_restarts", []))


def test_no_401_or_403_in_gpuguards_log(gpuguard, cluster):
    refused = [l for l in gpuguard.log_lines()
               if (l.get("status") in (401, 403) or re.search(r"\b40[13]\b", str(l.get("error", ""))))
               and not restarting(cluster, l["ts"])]
    assert refused == []
