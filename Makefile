# gpuguard - admission webhook policy engine for GPU guardrails on Kubernetes.
#
#   make run     install missing packages (as root), build, create dev certs, serve
#   make test    the same set-up, then unit, Lua, policy and integration tests
#   make asan    the test suite under AddressSanitizer and UndefinedBehaviorSanitizer
#   make lint    clang-format check, cppcheck, luac -p on every Lua file
#   make bench   benchmarks (figures, not pass/fail)

BUILD   ?= build
CC      ?= cc
SAN     ?=
PKGS    := libmicrohttpd jansson lua5.4 openssl yaml-0.1 libcurl gnutls
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
           -Iwebhook $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(SAN)
LDLIBS  := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lpthread -lm
LDFLAGS += $(SAN)

# Debian packages for building, testing and linting; `make deps` installs the
# missing ones when run as root and otherwise prints the apt-get line.
DEB_PKGS := build-essential pkg-config libmicrohttpd-dev libjansson-dev liblua5.4-dev lua5.4 \
            libssl-dev libyaml-dev libcmocka-dev libcurl4-openssl-dev libgnutls28-dev openssl \
            curl python3 python3-pytest python3-jsonpatch python3-yaml python3-prometheus-client \
            clang-format cppcheck

# The core library holds everything but the HTTP server and the CLI front ends.
FRONT_SRC := webhook/main.c webhook/server.c $(wildcard webhook/cli_*.c)
CORE_SRC  := $(filter-out $(FRONT_SRC),$(wildcard webhook/*.c))
CORE_OBJ  := $(CORE_SRC:webhook/%.c=$(BUILD)/obj/%.o)
FRONT_OBJ := $(FRONT_SRC:webhook/%.c=$(BUILD)/obj/%.o)
CORE_LIB  := $(BUILD)/libgpuguard.a
BIN       := $(BUILD)/gpuguard

UNIT_SRC  := $(wildcard tests/unit/test_*.c)
UNIT_BIN  := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
BENCH_SRC := $(wildcard tests/bench/*.c)
BENCH_BIN := $(BENCH_SRC:tests/bench/%.c=$(BUILD)/bench/%)
# Small programs over the core library that the Python tests drive.
TOOL_SRC  := $(wildcard tests/tools/*.c)
TOOL_BIN  := $(TOOL_SRC:tests/tools/%.c=$(BUILD)/tests/tools/%)

DEV_CERTS := certs/dev
PYTHON    := /usr/bin/python3

.PHONY: all deps run test unit integration asan lint bench fuzz install clean

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

$(BUILD)/obj/%.o: webhook/%.c $(wildcard webhook/*.h)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<

$(CORE_LIB): $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BIN): $(FRONT_OBJ) $(CORE_LIB)
	$(CC) $(LDFLAGS) -o $@ $(FRONT_OBJ) $(CORE_LIB) $(LDLIBS)

$(BUILD)/tests/test_%: tests/unit/test_%.c $(CORE_LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(CORE_LIB) $(LDLIBS) -lcmocka

$(BUILD)/tests/tools/%: tests/tools/%.c $(CORE_LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(CORE_LIB) $(LDLIBS)

$(BUILD)/bench/%: tests/bench/%.c $(CORE_LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(CORE_LIB) $(LDLIBS)

$(DEV_CERTS)/tls.crt: | $(BIN)
	$(BIN) certs --service gpuguard --namespace gpuguard-system --out $(DEV_CERTS) --dev

run: deps
	@$(MAKE) --no-print-directory $(BIN) $(DEV_CERTS)/tls.crt
	$(BIN) serve --listen 127.0.0.1:8443 --ops-listen 127.0.0.1:9090 \
	    --tls-cert $(DEV_CERTS)/tls.crt --tls-key $(DEV_CERTS)/tls.key \
	    --config deploy/gpuguard.yaml --policies policies --lua lua

test: deps
	@$(MAKE) --no-print-directory unit integration

unit: $(UNIT_BIN) $(TOOL_BIN)
	@set -e; for t in $(UNIT_BIN); do echo "== $$t"; $$t; done
	@echo "== Lua library tests (in the policy sandbox)"
	$(BUILD)/tests/tools/lua_tests --lua lua tests/lua/test_*.lua

# Python tests (pytest) under tests/: integration, policies, patch checks.
integration: $(BIN) $(TOOL_BIN)
	GPUGUARD_BIN=$(abspath $(BIN)) GPUGUARD_TOOLS=$(abspath $(BUILD)/tests/tools) \
	    $(PYTHON) -m pytest -q -p no:cacheprovider tests

asan:
	$(MAKE) BUILD=build/asan CC=clang CFLAGS="-O1 -g -fno-omit-frame-pointer" \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined" test

# Figures, not pass/fail: the in-process engine benchmark on the shipped policies.
bench: deps
	@$(MAKE) --no-print-directory $(BIN) $(BENCH_BIN)
	$(BUILD)/bench/bench_engine --policies policies --lua lua --config deploy/gpuguard.yaml \
	    -n 20000 tests/data/reviews/bench-pod.json

lint:
	clang-format --dry-run --Werror webhook/*.c webhook/*.h tests/unit/*.c
	cppcheck --quiet --error-exitcode=1 --enable=warning,portability --inline-suppr \
	    --suppress=missingIncludeSystem --include=/usr/include/jansson.h -Iwebhook webhook tests/unit tests/tools tests/bench
	@for f in $$(find lua policies tests -name '*.lua'); do luac5.4 -p $$f || exit 1; done

install: $(BIN)
	install -D -m 0755 $(BIN) $(DESTDIR)/usr/local/bin/gpuguard

clean:
	rm -rf build
