"""test_doc_commands.py - the documentation's cluster blocks, run as written against the local
control plane.

A block marked `<!-- cluster -->` (docs/testing.md, "Commands in the docs") runs as a reader runs
it after `make cluster-up` and the page's set-up: from the repository root, with KUBECONFIG
build/cluster/kubeconfig and build/k8s/bin first on the PATH.  Here that is a scratch copy of
the tree whose build/cluster is the running cluster's directory and build/gpuguard the binary
under test.  A page's cluster blocks run in order (a later one reads what an earlier one
created), each with its exit status and output checked as in
tests/integration/test_doc_commands.py, which finds and parses them; the namespaces they create
are deleted afterwards, whatever the outcome, so the other tests find the nodes' GPUs free."""

import os
import sys

import pytest

from e2e_support import REPO, wait_for

sys.path.insert(0, str(REPO / "tests" / "integration"))
import test_doc_commands as docs  # noqa: E402  (imported whole: its tests are not collected here)

BLOCK_TIMEOUT = 300  # seconds for one block: it waits on the scheduler and kwok at most 2 min
PAGES = sorted({b.path for b in docs.BLOCKS if b.runnable and b.cluster})


def namespaces(kube):
    return set(kube.run("get", "namespaces", "-o", "name").stdout.split())


def test_the_docs_have_cluster_blocks():
    assert PAGES, "no page has a `<!-- cluster -->` block"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_cluster_blocks_run_as_written(page, cluster, kube, tmp_path):
    blocks = [b for b in docs.BLOCKS if b.path == page and b.runnable and b.cluster]
    binary = os.environ.get("GPUGUARD_BIN", str(REPO / "build" / "gpuguard"))
    tree = docs.scratch_tree(tmp_path / "repo", binary)
    os.symlink(cluster.dir, tree / "build" / "cluster")
    (tree / "build" / "k8s").mkdir()
    os.symlink(cluster.bin, tree / "build" / "k8s" / "bin")
    home = tmp_path / "home"
    home.mkdir()
    env = docs.block_env(home, docs.no_gpuguard_on_path(tmp_path / "shim"),
                         extra_path=[tree / "build" / "k8s" / "bin"])
    env["KUBECONFIG"] = str(tree / "build" / "cluster" / "kubeconfig")
    before = namespaces(kube)
    try:
        for block in blocks:
            docs.check_block(block, tree, env, timeout=BLOCK_TIMEOUT)
    finally:
        made = namespaces(kube) - before
        for ns in sorted(made):
            kube.run("delete", ns, "--wait=false", check=False)
        wait_for(f"the namespaces the blocks of {page.name} made gone ({sorted(made)})",
                 lambda: not (namespaces(kube) & made))


def test_a_cluster_block_that_prints_something_else_fails(cluster, tmp_path):
    """The check can fail here too: what the API server answers is compared word for word."""
    binary = os.environ.get("GPUGUARD_BIN", str(REPO / "build" / "gpuguard"))
    tree = docs.scratch_tree(tmp_path / "repo", binary)
    home = tmp_path / "home"
    home.mkdir()
    env = docs.block_env(home, docs.no_gpuguard_on_path(tmp_path / "shim"),
                         extra_path=[cluster.bin])
    env["KUBECONFIG"] = str(cluster.kubeconfig)
    block = docs.Block(REPO / "README.md", 1, "sh", "cluster",
                       "kubectl get namespace kube-system\n")
    block.output = docs.Block(REPO / "README.md", 2, "text", "output",
                              "NAME STATUS AGE\nkube-system Terminating ...\n")
    with pytest.raises(pytest.fail.Exception, match="prints something else"):
        docs.check_block(block, tree, env, timeout=BLOCK_TIMEOUT)
    block.output.text = "NAME STATUS AGE\nkube-system Active ...\n"
    docs.check_block(block, tree, env, timeout=BLOCK_TIMEOUT)
