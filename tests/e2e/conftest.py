"""Fixtures of the end-to-end tests against the local control plane (tests/k8s/cluster.py): a
real kube-apiserver, etcd, controller manager, scheduler and kwok nodes, gpuguard installed from
deploy/.  Every assertion is on what the API server answers or stores.

Run through `make e2e`, which starts the cluster when none runs (GPUGUARD_CLUSTER names its
directory).  Without GPUGUARD_CLUSTER nothing here is collected."""

import os
import sys
from pathlib import Path

import pytest

# A package (its __init__.py), so that this conftest does not take the name of tests/conftest.py
# when pytest collects both; its modules import e2e_support from here.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_support import FLEET, REPO, Gpuguard, Kube, make_namespace  # noqa: E402


if not os.environ.get("GPUGUARD_CLUSTER"):
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def cluster():
    from cluster import Cluster
    c = Cluster(os.environ["GPUGUARD_CLUSTER"])
    if not c.running():
        pytest.fail(f"no cluster runs in {c.dir}: `make cluster-up` or `make e2e`")
    if c.state.get("add_config") != str(FLEET):
        pytest.fail(f"the cluster in {c.dir} was started without the e2e fleet "
                    f"({FLEET.relative_to(REPO)}): `make cluster-down`, then `make e2e`")
    return c


@pytest.fixture(scope="session")
def kube(cluster):
    return Kube(cluster)


@pytest.fixture(scope="session")
def gpuguard(cluster):
    return Gpuguard(cluster)


@pytest.fixture
def namespace(kube):
    """A fresh namespace that gpuguard's webhooks match, deleted after the test."""
    name = make_namespace(kube, "e2e")
    yield name
    kube.run("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def ignored_namespace(kube):
    """A fresh namespace gpuguard's webhooks leave out (gpuguard.io/ignore=true): what is sent
    there is judged by the API server alone."""
    name = make_namespace(kube, "e2e-plain", {"gpuguard.io/ignore": "true"})
    yield name
    kube.run("delete", "namespace", name, "--wait=false", check=False)
