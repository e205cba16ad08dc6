"""Fixtures of `make chart-test`: the Helm chart (charts/gpuguard) installed with the helm built
here (`make helm-bin`) into a local control plane of its own (tests/k8s/cluster.py up
--no-gpuguard, directory GPUGUARD_CHART_CLUSTER), its Deployment's pods run on the host by
tests/k8s/podrun.py, and the webhooks reached through their Service as the chart registers them.

Run through `make chart-test`, which starts and stops that cluster.  Without
GPUGUARD_CHART_CLUSTER nothing here is collected."""

import os
import sys
from pathlib import Path

import pytest

# A package (its __init__.py), so that this conftest does not take the name of tests/conftest.py
# when pytest collects both; its modules import chart_support from here.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from chart_support import Api, Helm  # noqa: E402

if not os.environ.get("GPUGUARD_CHART_CLUSTER"):
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def cluster():
    from cluster import Cluster
    c = Cluster(os.environ["GPUGUARD_CHART_CLUSTER"], gpuguard=os.environ.get("GPUGUARD_BIN"))
    if not c.running():
        pytest.fail(f"no control plane runs in {c.dir}: `make chart-test` starts one")
    return c


@pytest.fixture(scope="session")
def helm(cluster):
    return Helm(cluster)


@pytest.fixture(scope="session")
def api(cluster):
    return Api(cluster)
