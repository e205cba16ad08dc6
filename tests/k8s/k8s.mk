# The local Kubernetes control plane and the end-to-end tests (docs/testing.md, "The local
# control plane"); included by the Makefile.
#
#   make k8s-bin      build kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
#                     etcd and kwok from Go modules (tests/k8s) into a cache outside build/,
#                     linked into build/k8s/bin (cold: about 9 minutes on 2 cores; then instant)
#   make helm-bin     build helm from its Go module (tests/k8s/helm) into a cache of its own,
#                     linked into build/k8s/bin (cold: about 2 minutes on 2 cores; then instant)
#   make cluster-up   a control plane on 127.0.0.1 with fake GPU nodes and gpuguard installed
#                     from deploy/ (CONFIG, ADD_CONFIG, REPLICAS); kubeconfig in build/cluster
#   make cluster-down stop every process cluster-up started
#   make e2e          the end-to-end tests against it (started and stopped around the tests
#                     when none runs)
#   make chart-test   the Helm chart installed, upgraded and uninstalled on a control plane of
#                     its own (tests/chart)

K8S_BIN     := $(BUILD)/k8s/bin
CLUSTER_DIR ?= build/cluster
CONFIG      ?= deploy/gpuguard.yaml
ADD_CONFIG  ?=
REPLICAS    ?= 1
# As deploy/ ships: the quota ledger is tested with several gpuguard processes.
E2E_REPLICAS ?= 3
E2E_CONFIG  := tests/e2e/fleet.yaml
E2E_ARGS    ?=
GO          ?= /usr/local/go/bin/go
CLUSTER     := $(PYTHON) tests/k8s/cluster.py

.PHONY: k8s-bin helm-bin cluster-up cluster-down e2e

k8s-bin:
	@test -x $(GO) || { echo "k8s-bin: Go is needed at $(GO) (GO=...)"; exit 1; }
	PATH=$(dir $(GO)):$$PATH tests/k8s/build.sh $(K8S_BIN)

helm-bin:
	@test -x $(GO) || { echo "helm-bin: Go is needed at $(GO) (GO=...)"; exit 1; }
	PATH=$(dir $(GO)):$$PATH tests/k8s/build-helm.sh $(K8S_BIN)

cluster-up: deps $(BIN) k8s-bin
	$(CLUSTER) up --dir $(CLUSTER_DIR) --config $(CONFIG) --replicas $(REPLICAS) \
	    $(if $(ADD_CONFIG),--add-config $(ADD_CONFIG))

cluster-down:
	$(CLUSTER) down --dir $(CLUSTER_DIR)

# A cluster that runs already is used as it is when it runs the e2e fleet; otherwise e2e starts
# one with it and stops it afterwards, whatever the tests' outcome; if this recipe's shell is
# killed, the cluster's keeper stops it (--owner).
e2e: deps $(BIN) k8s-bin
	@set -e; started=; \
	if ! $(CLUSTER) status --dir $(CLUSTER_DIR) >/dev/null 2>&1; then \
	    $(CLUSTER) up --dir $(CLUSTER_DIR) --config $(CONFIG) --add-config $(E2E_CONFIG) \
	        --replicas $(E2E_REPLICAS) --owner $$$$; started=1; \
	fi; \
	rc=0; GPUGUARD_BIN=$(abspath $(BIN)) GPUGUARD_CLUSTER=$(abspath $(CLUSTER_DIR)) \
	    $(PYTHON) -m pytest -q -p no:cacheprovider $(E2E_ARGS) tests/e2e || rc=$$?; \
	if [ -n "$$started" ]; then $(CLUSTER) down --dir $(CLUSTER_DIR); fi; exit $$rc

# The Helm chart: first rendered (helm lint, each kustomize render of deploy/ against helm
# template, the generated files in sync: tests/integration/test_chart.py and test_deploy.py,
# which `make test` skips without helm and kubectl), then against a control plane of its own
# (tests/chart): installed with gpuguard's own certificates, a GPU pod admitted, upgraded, its
# CA rotated under load, uninstalled.  The control plane is started without gpuguard and
# stopped afterwards, whatever the outcome.
CHART_CLUSTER_DIR ?= build/chart-cluster
CHART_ARGS ?=

.PHONY: chart-test
chart-test: deps $(BIN) k8s-bin helm-bin
	GPUGUARD_BIN=$(abspath $(BIN)) $(PYTHON) -m pytest -q -p no:cacheprovider \
	    tests/integration/test_chart.py tests/integration/test_deploy.py
	@set -e; $(CLUSTER) down --dir $(CHART_CLUSTER_DIR) >/dev/null 2>&1 || true; \
	$(CLUSTER) up --dir $(CHART_CLUSTER_DIR) --no-gpuguard --owner $$$$; \
	rc=0; GPUGUARD_BIN=$(abspath $(BIN)) GPUGUARD_CHART_CLUSTER=$(abspath $(CHART_CLUSTER_DIR)) \
	    $(PYTHON) -m pytest -q -p no:cacheprovider $(CHART_ARGS) tests/chart || rc=$$?; \
	$(CLUSTER) down --dir $(CHART_CLUSTER_DIR); exit $$rc
