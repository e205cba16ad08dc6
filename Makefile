# gpuguard - admission webhook policy engine for GPU guardrails on Kubernetes.
#
#   make run     install missing packages (as root), build, create dev certs, serve
#   make test    the same set-up, then unit, Lua, policy and integration tests
#   make asan    the test suite under AddressSanitizer and UndefinedBehaviorSanitizer
#   make fuzz    each libFuzzer target for FUZZ_SECONDS (clang); see docs/testing.md
#   make lint    clang-format check, cppcheck, luac -p on every Lua file, the layers' include rule
#   make bench   benchmarks (figures, not pass/fail)
#   make lua-profile  Lua VM instructions per policy function and line (PROFILE_REVIEW, PROFILE_FLAGS)
#   make cost    the cost gate: instructions per review of the feature reviews against
#                tests/bench/cost-baseline.json, failing 3 % above (COST_UPDATE=1 rewrites it;
#                COST_FLAGS=--split: the engine's floor, the policies' logic, the bridge)
#   make deps-image  install buildah, mmdebstrap and docker-registry (as root)
#   make image       build the container image IMAGE (gpuguard:<version>) with buildah
#   make image-push  push IMAGE to its registry (IMAGE_PUSH_FLAGS, e.g. --tls-verify=false)
#   make test-image  run IMAGE as the chart's Deployment does and check its answers
#   make chart-schema  charts/gpuguard's values.schema.json and config defaults, from deploy/
#   make install-yaml  render deploy/install.yaml (and the cert-manager overlay) from the chart
#   make k8s-bin     build the Kubernetes binaries from Go modules (cached outside build/)
#   make cluster-up  a local control plane with fake GPU nodes and gpuguard (cluster-down stops it)
#   make e2e         the end-to-end tests against that control plane (tests/k8s/k8s.mk)
#   make helm-bin    build helm from its Go module (cached outside build/)
#   make chart-test  the Helm chart rendered, then installed, upgraded and uninstalled on a
#                    control plane of its own (tests/k8s/k8s.mk)

BUILD   ?= build
CC      ?= cc
SAN     ?=
PKGS    := libmicrohttpd jansson lua5.4 openssl yaml-0.1 libcurl gnutls
CFLAGS  ?= -O2 -g
override CFLAGS += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
           -Iwebhook $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(SAN)
# Lua and jansson come from Debian's static archives (liblua5.4-dev, libjansson-dev): every
# review makes thousands of calls into them, and from the shared libraries (PIC code, calls
# through the PLT) the engine ran some 15 % slower (docs/performance.md).
# What the archives need in turn (-lm, -ldl) is linked as usual.
STATIC_PKGS := lua5.4 jansson
STATIC_LIBS := $(shell pkg-config --libs $(STATIC_PKGS) 2>/dev/null)
STATIC_DEPS := $(filter-out $(STATIC_LIBS),$(shell pkg-config --static --libs $(STATIC_PKGS) 2>/dev/null))
LDLIBS  := -Wl,-Bstatic $(STATIC_LIBS) -Wl,-Bdynamic $(STATIC_DEPS) \
           $(shell pkg-config --libs $(filter-out $(STATIC_PKGS),$(PKGS)) 2>/dev/null) -lpthread -lm
override LDFLAGS += $(SAN)

# Debian packages for building, testing and linting; `make deps` installs the
# missing ones when run as root and otherwise prints the apt-get line.
DEB_PKGS := build-essential pkg-config libmicrohttpd-dev libjansson-dev liblua5.4-dev lua5.4 \
            libssl-dev libyaml-dev libcmocka-dev libcurl4-openssl-dev libgnutls28-dev openssl \
            curl python3 python3-pytest python3-pytest-xdist python3-jsonpatch python3-jsonschema \
            python3-yaml python3-prometheus-client prometheus clang-format cppcheck clang \
            libclang-rt-14-dev wrk nginx-light valgrind

# Sources sit in one folder per layer (docs/architecture.md).  The core
# library holds everything but the HTTP server and the CLI front ends.
LAYERS    := util codec kube engine http cli
FRONT_SRC := webhook/cli/main.c webhook/http/server.c $(wildcard webhook/cli/cli_*.c)
CORE_SRC  := $(filter-out $(FRONT_SRC),$(foreach l,$(LAYERS),$(wildcard webhook/$(l)/*.c)))
CORE_OBJ  := $(CORE_SRC:webhook/%.c=$(BUILD)/obj/%.o)
FRONT_OBJ := $(FRONT_SRC:webhook/%.c=$(BUILD)/obj/%.o)
CORE_LIB  := $(BUILD)/libgpuguard.a
BIN       := $(BUILD)/gpuguard

UNIT_SRC  := $(wildcard tests/unit/test_*.c)
UNIT_BIN  := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
BENCH_SRC := $(wildcard tests/bench/*.c)
BENCH_BIN := $(BENCH_SRC:tests/bench/%.c=$(BUILD)/bench/%)
# Small programs over the core library that the Python tests drive.
SHIMS     := failmalloc fixedtime
TOOL_SRC  := $(filter-out $(SHIMS:%=tests/tools/%.c),$(wildcard tests/tools/*.c))
TOOL_BIN  := $(TOOL_SRC:tests/tools/%.c=$(BUILD)/tests/tools/%) $(SHIMS:%=$(BUILD)/tests/tools/%.so)

# Fuzz targets (tests/fuzz/fuzz_<target>.c): each also links with replay.c into
# a corpus replayer that `make test` runs over tests/fuzz/corpus/<target>.
FUZZ_TARGETS ?= admission jsonpatch quantity yaml manifest luabridge luapattern infscan
FUZZ_SECONDS ?= 600
FUZZ_ARGS    ?=
FUZZ_DIR     := build/fuzz
FUZZ_SAN     := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
# luabridge and luapattern keep Lua VMs for the whole run and their garbage
# outlives each input, so libFuzzer's leak check after every input would scan
# the heap most of the time (60 times slower); their leaks are checked at exit.
FUZZ_FLAGS_VM := -detect_leaks=0
REPLAY_BIN   := $(FUZZ_TARGETS:%=$(BUILD)/fuzz/replay_%)

DEV_CERTS := certs/dev
PYTHON    := /usr/bin/python3

.PHONY: all deps run test unit integration asan lint bench lua-profile cost fuzz fuzz-replay install clean FORCE

all: $(BIN)

deps:
	@missing=$$(for p in $(DEB_PKGS); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	    if [ "$$(id -u)" = 0 ]; then \
	        echo "installing: $$missing"; \
	        apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	            apt-get install -y -q --no-install-recommends $$missing; \
	    else \
	        echo "missing packages; run as root:"; \
	        echo "  apt-get install -y --no-install-recommends" $$missing; exit 1; \
	    fi; \
	fi

# Every compile writes its header dependencies next to its output (-MMD);
# -MP adds an empty rule per header so a deleted header does not stop make.
DEPFLAGS = -MMD -MP -MF $@.d

$(BUILD)/obj/%.o: webhook/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(DEPFLAGS) -c -o $@ $<

-include $(wildcard $(BUILD)/obj/*/*.d $(BUILD)/tests/*.d $(BUILD)/tests/tools/*.d \
                    $(BUILD)/fuzz/*.d $(BUILD)/bench/*.d $(BUILD)/bench/profile/*.d)

# The link flags, in a file rewritten only when they change: every program depends on it, so a
# build tree made before a change of libraries (one linked statically, say) relinks.
LINK_STAMP := $(BUILD)/link-flags
$(LINK_STAMP): FORCE
	@mkdir -p $(@D)
	@echo '$(LDFLAGS) $(LDLIBS)' | cmp -s - $@ || echo '$(LDFLAGS) $(LDLIBS)' > $@

$(CORE_LIB): $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BIN): $(FRONT_OBJ) $(CORE_LIB) $(LINK_STAMP)
	$(CC) $(LDFLAGS) -o $@ $(FRONT_OBJ) $(CORE_LIB) $(LDLIBS)

$(BUILD)/tests/test_%: tests/unit/test_%.c $(CORE_LIB) $(LINK_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(DEPFLAGS) $(LDFLAGS) -o $@ $< $(CORE_LIB) $(LDLIBS) -lcmocka

$(BUILD)/tests/tools/%: tests/tools/%.c $(CORE_LIB) $(LINK_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(DEPFLAGS) $(LDFLAGS) -o $@ $< $(CORE_LIB) $(LDLIBS)

# LD_PRELOAD shims: failmalloc fails allocations in the running server (not under
# sanitizers), fixedtime stops time() for instruction counts that repeat.
$(BUILD)/tests/tools/%.so: tests/tools/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(DEPFLAGS) -fPIC -shared -o $@ $<

# replay.c compiled on its own, so that each compile keeps its own dependency file.
$(BUILD)/fuzz/replay.o: tests/fuzz/replay.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(DEPFLAGS) -c -o $@ $<

$(BUILD)/fuzz/replay_%: tests/fuzz/fuzz_%.c $(BUILD)/fuzz/replay.o $(CORE_LIB) $(LINK_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(DEPFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/fuzz/replay.o $(CORE_LIB) $(LDLIBS)

# libFuzzer binaries; only built by `make fuzz`, in a sub-make with CC=clang.
$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c $(CORE_LIB) $(LINK_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LDFLAGS) -fsanitize=fuzzer,address,undefined -o $@ $< $(CORE_LIB) $(LDLIBS)

$(BUILD)/bench/%: tests/bench/%.c $(CORE_LIB) $(LINK_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(DEPFLAGS) $(LDFLAGS) -o $@ $< $(CORE_LIB) $(LDLIBS)

# bench_engine with the Lua profiler: its hook wraps the engine's (lua_profile.c).  Two
# objects, so that each keeps its own dependency file.
PROFILE_WRAP := -Wl,--wrap=lua_sethook,--wrap=lua_gethook,--wrap=lua_newstate
$(BUILD)/bench/profile/bench_engine.o: tests/bench/bench_engine.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(DEPFLAGS) -DGG_LUA_PROFILE -Itests/bench -c -o $@ $<

$(BUILD)/bench/profile/lua_profile.o: tests/bench/profile/lua_profile.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(DEPFLAGS) -c -o $@ $<

$(BUILD)/bench/bench_engine_profile: $(BUILD)/bench/profile/bench_engine.o \
    $(BUILD)/bench/profile/lua_profile.o $(CORE_LIB) $(LINK_STAMP)
	$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(CORE_LIB) $(PROFILE_WRAP) $(LDLIBS)

$(DEV_CERTS)/tls.crt: | $(BIN)
	$(BIN) certs --service gpuguard --namespace gpuguard-system --out $(DEV_CERTS) --dev

run: deps
	@$(MAKE) --no-print-directory $(BIN) $(DEV_CERTS)/tls.crt
	$(BIN) serve --listen 127.0.0.1:8443 --ops-listen 127.0.0.1:9090 \
	    --tls-cert $(DEV_CERTS)/tls.crt --tls-key $(DEV_CERTS)/tls.key \
	    --config deploy/gpuguard.yaml --policies policies --lua lua

test: deps
	@$(MAKE) --no-print-directory unit integration

unit: $(UNIT_BIN) $(TOOL_BIN) fuzz-replay
	@set -e; for t in $(UNIT_BIN); do echo "== $$t"; $$t; done
	@echo "== Lua library tests (in the policy sandbox)"
	$(BUILD)/tests/tools/lua_tests --lua lua --test-lib tests/lua/lib tests/lua/test_*.lua

# Every fuzz target over its seed and regression corpus (no fuzzing, no clang).
fuzz-replay: $(REPLAY_BIN)
	@pass=0; fail=0; for t in $(FUZZ_TARGETS); do \
	    if $(BUILD)/fuzz/replay_$$t tests/fuzz/corpus/$$t; then pass=$$((pass + 1)); \
	    else echo "FAIL: fuzz replay $$t (rerun with -v to name each input)"; fail=$$((fail + 1)); fi; \
	done; echo "fuzz-replay: $$pass passed, $$fail failed"; [ $$fail -eq 0 ]

# Python tests (pytest) under tests/: integration, policies, patch checks.
integration: $(BIN) $(TOOL_BIN) $(BUILD)/bench/bench_engine $(BUILD)/bench/bench_engine_profile \
             $(BUILD)/bench/bench_inventory
	@echo "== pytest, one worker per core (pytest-xdist): all but the whole_machine tests"
	GPUGUARD_BIN=$(abspath $(BIN)) GPUGUARD_TOOLS=$(abspath $(BUILD)/tests/tools) \
	    $(PYTHON) -m pytest -q -p no:cacheprovider -n auto --dist loadgroup \
	    -m "not whole_machine" tests
	@echo "== pytest, the whole_machine tests (benchmark runs that load every core), alone"
	GPUGUARD_BIN=$(abspath $(BIN)) GPUGUARD_TOOLS=$(abspath $(BUILD)/tests/tools) \
	    $(PYTHON) -m pytest -q -p no:cacheprovider -m whole_machine tests

asan:
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	$(MAKE) BUILD=build/asan CC=clang CFLAGS="-O1 -g -fno-omit-frame-pointer" \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined" test

# Each target in FUZZ_TARGETS for FUZZ_SECONDS with its dictionary, on a copy
# of its corpus in build/fuzz/corpus/<target> (new inputs land there);
# crashes go to build/fuzz/crashes/.  Extra libFuzzer flags: FUZZ_ARGS.
fuzz: deps
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_DIR)/san CC=clang \
	    CFLAGS="-O1 -g -fno-omit-frame-pointer" SAN="$(FUZZ_SAN)" \
	    $(FUZZ_TARGETS:%=$(FUZZ_DIR)/fuzz_%)
	@mkdir -p $(FUZZ_DIR)/crashes; failed=""; for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(FUZZ_DIR)/corpus/$$t && cp -R tests/fuzz/corpus/$$t/. $(FUZZ_DIR)/corpus/$$t/; \
	    echo "== fuzz $$t for $(FUZZ_SECONDS) s"; flags=""; \
	    case $$t in luabridge|luapattern) flags="$(FUZZ_FLAGS_VM)";; esac; \
	    $(FUZZ_DIR)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=10 -print_final_stats=1 \
	        -dict=tests/fuzz/$$t.dict -artifact_prefix=$(FUZZ_DIR)/crashes/$$t- $$flags $(FUZZ_ARGS) \
	        $(FUZZ_DIR)/corpus/$$t || failed="$$failed $$t"; \
	done; if [ -n "$$failed" ]; then echo "fuzz: crashes in$$failed (see $(FUZZ_DIR)/crashes)"; \
	    exit 1; fi

# Figures, not pass/fail: the in-process engine, the CLI, the inventory, then the server
# against nginx; bench_server.py ends with the four headline figures (engine instructions
# per review under callgrind, share of nginx's req/s, p99 with one connection, RSS with
# 1,000 idle TLS connections).
bench: deps
	@$(MAKE) --no-print-directory $(BIN) $(BENCH_BIN) $(BUILD)/tests/tools/fixedtime.so
	$(BUILD)/bench/bench_engine --policies policies --lua lua --config deploy/gpuguard.yaml \
	    -n 20000 tests/data/reviews/bench-pod.json
	$(PYTHON) tests/bench/bench_check.py --bin $(BIN) --policies policies --lua lua --config deploy/gpuguard.yaml -n 10000
	$(BUILD)/bench/bench_inventory -n 50000 --events 100000
	$(BUILD)/bench/bench_inventory -n 1000000 --templates 2000
	@echo "== gpuguard serve under wrk against nginx (BENCH_SECONDS per run, default 20)"
	$(PYTHON) tests/bench/bench_server.py --bin $(BIN) --bench-engine $(BUILD)/bench/bench_engine \
	    --policies policies --lua lua --config deploy/gpuguard.yaml --report $(BUILD)/bench/report.md

# Where the policies' Lua work goes for one review, in VM instructions per function and line.
PROFILE_REVIEW ?= tests/data/reviews/bench-pod.json
PROFILE_FLAGS ?= --policies policies --lua lua --config deploy/gpuguard.yaml --phases both -n 200
lua-profile: deps $(BUILD)/bench/bench_engine_profile
	$(BUILD)/bench/bench_engine_profile $(PROFILE_FLAGS) $(PROFILE_REVIEW)

# The cost gate (tests/bench/cost.py, docs/performance.md "The cost gate"): callgrind's
# instructions per review of each review of its set, against tests/bench/cost-baseline.json; a
# review more than 3 % above its baseline fails.  COST_UPDATE=1 writes the counts as the baseline
# (lowering it is part of any change that makes a review cheaper).  COST_FLAGS: more flags,
# e.g. --reviews cost-dra.json, or --split for a review's instructions split three ways
# (tests/bench/policy_cost.py: the engine's floor, the policies' logic, the bridge).
COST_FLAGS ?=
cost: deps $(BUILD)/bench/bench_engine $(BUILD)/tests/tools/fixedtime.so
	$(PYTHON) tests/bench/cost.py --bench-engine $(BUILD)/bench/bench_engine \
	    --policies policies --lua lua --config deploy/gpuguard.yaml \
	    $(if $(COST_UPDATE),--update) $(COST_FLAGS)

lint:
	clang-format --dry-run --Werror webhook/*/*.c webhook/*/*.h tests/unit/*.c tests/fuzz/*.c
	cppcheck --quiet --error-exitcode=1 --enable=warning,portability --inline-suppr \
	    --suppress=missingIncludeSystem --include=/usr/include/jansson.h -Iwebhook webhook tests/unit tests/tools tests/bench tests/fuzz
	@for f in $$(find lua policies tests -name '*.lua'); do luac5.4 -p $$f || exit 1; done
	$(PYTHON) tests/lint/check_layers.py webhook

install: $(BIN)
	install -D -m 0755 $(BIN) $(DESTDIR)/usr/local/bin/gpuguard

# A cluster running from build/ is stopped first (tests/k8s/k8s.mk).
clean:
	@if [ -f $(CLUSTER_DIR)/state.json ]; then $(CLUSTER) down --dir $(CLUSTER_DIR); fi
	rm -rf build

# ---- the container image (deploy/Dockerfile), built with buildah: no Docker
# daemon needed.  deploy/image.sh makes the Debian base images with mmdebstrap
# when they cannot be pulled (IMAGE_PULL_TIMEOUT, in seconds, bounds each pull);
# tests/image/image_smoke.py is the smoke test.
VERSION          := $(shell sed -n 's/^#define GG_VERSION "\(.*\)"$$/\1/p' webhook/util/gpuguard.h)
IMAGE            ?= gpuguard:$(VERSION)
IMAGE_PUSH_FLAGS ?=
IMAGE_DEB_PKGS   := buildah mmdebstrap docker-registry

.PHONY: deps-image image image-push test-image

deps-image:
	@$(MAKE) --no-print-directory deps DEB_PKGS="$(IMAGE_DEB_PKGS)"

image:
	deploy/image.sh $(IMAGE)

image-push:
	buildah push $(IMAGE_PUSH_FLAGS) $(IMAGE) docker://$(IMAGE)

test-image: deps $(BIN)
	GPUGUARD_IMAGE=$(IMAGE) GPUGUARD_BIN=$(abspath $(BIN)) \
	    $(PYTHON) -m pytest -q -p no:cacheprovider tests/image/image_smoke.py
	@echo "test-image: ran $(IMAGE) from buildah mount, root read-only, chrooted as the" \
	    "Deployment's user (tests/image/pod.sh); its size: $$(buildah images --noheading \
	    --format '{{.Size}}' $(IMAGE) | tr -s ' ')"

# ---- the Helm chart (charts/gpuguard), the one home of the Kubernetes manifests, and the files
# made from it and from deploy/gpuguard.yaml by charts/generate.py: its values schema and
# config defaults (no helm needed), deploy/install.yaml and the cert-manager overlay's objects
# (helm from helm-bin).  tests/integration/test_chart.py fails while one of them is stale.
.PHONY: chart-schema install-yaml

chart-schema:
	$(PYTHON) charts/generate.py schema values

install-yaml: chart-schema helm-bin
	$(PYTHON) charts/generate.py --helm $(K8S_BIN)/helm install

# The control plane's targets; absent where only the sources are copied (deploy/Dockerfile).
-include tests/k8s/k8s.mk
