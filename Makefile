# tensorcast — build, run, test.  `make run` and `make test` are the quick start.
GO        ?= go
BIN       := bin
RUN_DIR   ?= $(CURDIR)/run
PKGS      := ./...
# A whole `make test` stays well under 30 minutes on 2 cores.
TEST_TIMEOUT ?= 20m
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all deps build run install test test-go test-c test-python test-rdma generate lint fuzz bench soak clean

all: build

# Installs the Debian packages the project needs, only those missing.
deps:
	@scripts/deps.sh

# Quiet checks: scripts/deps.sh asks dpkg about each package of the groups
# and installs only what is missing (a no-op, well under a second, on a
# prepared machine). build and run need only the build group; test needs
# every group.
.deps-build:
	@scripts/deps.sh build

.deps-check:
	@scripts/deps.sh

build: .deps-build
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...
	$(MAKE) -C c

# make install [PREFIX=/usr/local] [DESTDIR=] [SYSCONFDIR=/etc]: the
# binaries, the systemd units (ExecStart pointed at PREFIX), the sysusers
# file, the README, and the example config unless one is already there.
PREFIX     ?= /usr/local
SYSCONFDIR ?= /etc
UNITDIR    ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
install: build
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) \
	  $(DESTDIR)$(PREFIX)/share/doc/tensorcast $(DESTDIR)$(SYSCONFDIR)/tensorcast
	install -m 0755 $(BIN)/tensorcastd $(BIN)/tcctl $(BIN)/tcbench $(DESTDIR)$(PREFIX)/bin/
	for u in tensorcastd.service tensorcastd.socket; do \
	  sed -e 's|/usr/local/bin/|$(PREFIX)/bin/|g' -e 's|/etc/tensorcast/|$(SYSCONFDIR)/tensorcast/|g' \
	    -e 's|/usr/local/share/doc/|$(PREFIX)/share/doc/|g' deploy/$$u > $(DESTDIR)$(UNITDIR)/$$u; \
	  chmod 0644 $(DESTDIR)$(UNITDIR)/$$u; done
	install -m 0644 deploy/tensorcast.sysusers $(DESTDIR)$(SYSUSERSDIR)/tensorcast.conf
	install -m 0644 README.md $(DESTDIR)$(PREFIX)/share/doc/tensorcast/
	install -m 0644 deploy/tensorcastd.toml $(DESTDIR)$(PREFIX)/share/doc/tensorcast/tensorcastd.toml.example
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/tensorcast/tensorcastd.toml ]; then \
	  echo "install: keeping $(DESTDIR)$(SYSCONFDIR)/tensorcast/tensorcastd.toml (example in $(PREFIX)/share/doc/tensorcast)"; \
	else install -m 0640 deploy/tensorcastd.toml $(DESTDIR)$(SYSCONFDIR)/tensorcast/tensorcastd.toml; fi

# Starts the daemon in the foreground on embedded defaults: socket and data under ./run/.
run: build
	@mkdir -p $(RUN_DIR)
	$(BIN)/tensorcastd --socket $(abspath $(RUN_DIR))/tensorcastd.sock --data-dir $(abspath $(RUN_DIR))/data

test: .deps-check test-go test-c test-python test-rdma

test-go:
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)
	# Without -race too: the allocation tests hold their limits (0 per
	# request) only here, since the race detector allocates.
	$(GO) test -count=1 -tags invariants ./xfer/... ./queue/... ./shm/... ./uring/... ./store/... ./tcp/... ./reactor/... ./rdma/...
	CGO_ENABLED=0 $(GO) build ./...
	# The Go client and its protocol build off Linux too (macOS laptops).
	GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 $(GO) build ./client/... ./wire/...
	# Every benchmark once, as a smoke test: its figures are dropped, and
	# what a failing one said is shown.
	@echo "$(GO) test -count=1 -run '^\$$' -bench . -benchtime=1x $(PKGS)"
	@out=$$(mktemp); if $(GO) test -count=1 -run '^$$' -bench . -benchtime=1x $(PKGS) >$$out 2>&1; then rm -f $$out; \
	else grep -Ev '^(Benchmark.*(ns/op|B/op)|goos:|goarch:|pkg:|cpu:|PASS$$|ok )' $$out | tail -n 100; rm -f $$out; exit 1; fi

# libtensorcast under ASan/UBSan against real daemons (c/test).
test-c: build
	$(MAKE) -C c test TENSORCASTD=$(CURDIR)/$(BIN)/tensorcastd

# The Python package (python/tests): on Debian's python3, which has numpy
# and torch, then the core tests on the python3 first on PATH (it may be
# another interpreter, without them). The cross-client test runs the C,
# Python and Go clients against one daemon; the install test (about a
# minute) pip-installs ./python into a fresh venv, offline, and runs the core
# tests against the installed package.
PYTHON ?= /usr/bin/python3
test-python: build
	TENSORCASTD=$(CURDIR)/$(BIN)/tensorcastd TENSORCAST_COMPAT_C=$(CURDIR)/c/build/tc_compat \
	  PYTHONPATH=python $(PYTHON) -m unittest discover -s python/tests -t python
	@other=$$(command -v python3); if [ -n "$$other" ] && [ "$$(readlink -f $$other)" != "$$(readlink -f $(PYTHON))" ]; then \
	  echo "test-python: core tests on $$other ($$($$other --version 2>&1))"; \
	  TENSORCASTD=$(CURDIR)/$(BIN)/tensorcastd PYTHONPATH=python $$other -m unittest tests.test_core tests.test_queue tests.test_store; fi

# Real RDMA verbs over Soft-RoCE inside a qemu VM (see rdma/vmtest).
test-rdma:
	@if [ -x scripts/rdma-vm-test.sh ]; then scripts/rdma-vm-test.sh; else echo "test-rdma: harness not present yet"; fi

generate: .deps-build
	$(GO) generate ./fbs/...
	$(MAKE) -C c generate

lint:
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^fbs/.*/')); [ -z "$$out" ] || { echo "gofmt: $$out"; exit 1; }
	$(GO) run $(STATICCHECK) $(PKGS)

# Short fuzzing of every decoder of outside bytes (FUZZTIME each).
FUZZTIME ?= 30s
fuzz:
	scripts/fuzz.sh $(FUZZTIME)

# Every figure in BENCHMARKS.md comes from here, each beside its reference
# tool measured in the same run (see each script's header).
bench: build
	scripts/bench.sh
	scripts/bench-section.sh --markdown micro "Foundation micro-benchmarks" scripts/bench-micro.sh 5 2s
	scripts/bench-section.sh metrics-cost "Hot-path cost of the metrics (engine, local and control benchmarks without and with the meters, benchstat)" \
	  scripts/bench-metrics-cost.sh 8 1s
	scripts/bench-section.sh uring "io_uring transport vs fio (same file, same bs/iodepth)" scripts/bench-uring.sh /var/tmp/tcbench 3 10
	scripts/bench-section.sh --markdown store-queue "KV block store through the queue (daemon in its own process) vs memcpy and fio" \
	  scripts/bench-store-queue.sh 5 2s /var/tmp/tcbench-store-queue
	scripts/bench-section.sh tcp "tcp transport vs iperf3 and a raw TCP ping-pong (loopback)" scripts/bench-tcp.sh 3 3
	scripts/bench-section.sh clib "libtensorcast vs the Go client: queue round trip at depth 1 (NOP, 4 KiB local WRITE), and 64 KiB local copies in a stream beside memcpy" \
	  scripts/bench-clib.sh 5 200000 100000
	scripts/bench-section.sh --markdown syscalls "System calls per request through the queue, and daemon CPU per request" \
	  scripts/bench-syscalls.sh 1000000
	scripts/bench-section.sh directory "The etcd directory at 100 daemons: hit and fallback rates, lookups, churn, etcd down 30 s" \
	  scripts/bench-directory.sh 100 120 30
	scripts/bench-section.sh --markdown python "The Python client's store calls vs numpy copying the same bytes, and the SGLang-shaped backend" \
	  scripts/bench-python.sh 5 1
	scripts/bench-section.sh --markdown compare "Before and after the restructuring (issue 14): the same jobs through both builds, one run" \
	  scripts/bench-compare.sh 0c15c63
	scripts/bench-section.sh --markdown queue-groups "The queue worker's 256 KiB Submit groups: local copies before (6faf278) and after, one run" \
	  scripts/bench-compare.sh 6faf278 examples/jobs/local-64k.fio examples/jobs/local-1m.fio
	scripts/bench-section.sh --markdown session-compare "The io_uring view's sample and the large writes alone (1ed66da before): uring and local 1 MiB, one run" \
	  scripts/bench-compare.sh 1ed66da examples/jobs/uring-1m-seqread.fio examples/jobs/uring-1m-seqwrite.fio examples/jobs/local-1m.fio examples/jobs/uring-4k-randread.fio
	scripts/bench-section.sh --markdown ebpf-cost "What the kernel-side io_uring view costs the I/O it watches: off, one request in 16 timed, every request timed" \
	  scripts/bench-ebpf-cost.sh 3
	scripts/bench-section.sh --markdown answer-compare "Answers inside Submit and the learned spin budget (831b1b1 before): local, tcp and uring, one run" \
	  scripts/bench-compare.sh 831b1b1 examples/jobs/local-1m.fio examples/jobs/local-64k.fio examples/jobs/tcp-4k-randread-qd1.fio examples/jobs/uring-4k-randread.fio
	scripts/bench-section.sh --markdown prewake-compare "A completion that empties a queue wakes its worker (f07dc5c before): tcp and local at depth 1, uring, local and tcp under load, one run" \
	  env REPEAT=5 scripts/bench-compare.sh f07dc5c examples/jobs/tcp-4k-randread-qd1.fio examples/jobs/local-4k-qd1.fio examples/jobs/uring-4k-randread.fio examples/jobs/local-1m.fio examples/jobs/tcp-1m-write.fio
	scripts/bench-section.sh --markdown wait-target-compare "The clients' wait target and arrival-aware spin (18616b6 before; tcbench reaps one at a time): local, uring, tcp, one run" \
	  scripts/bench-compare.sh 18616b6 examples/jobs/local-1m.fio examples/jobs/local-64k.fio examples/jobs/uring-4k-randread.fio examples/jobs/uring-1m-seqread.fio examples/jobs/tcp-1m-write.fio
	scripts/bench-section.sh rdma "rdma transport and tcbench vs perftest on Soft-RoCE (qemu VM; ratios only)" \
	  bash -c 'set -o pipefail; RDMA_ROUNDS=5 RXE_TIMEOUT=1500 RDMA_TEST_RUN=XXX RDMA_DAEMON_RUN=- scripts/rdma-vm-test.sh | sed -n "/^rdma vs perftest/,\$$p"'
	scripts/bench-section.sh rdma-register "Registering a 4 GiB region for RDMA (Soft-RoCE under qemu TCG)" \
	  bash -c 'set -o pipefail; RXE_MEM=9728 RXE_REG_MB=4096 RXE_TIMEOUT=600 RDMA_TEST_RUN=TestVerbsRegisterLarge RDMA_BENCH=- RDMA_DAEMON_RUN=- scripts/rdma-vm-test.sh | grep -E "MR registration|^rdma \\(Soft"'

# A long run of four daemons under mixed load and faults (cmd/tcsoak), not
# part of `make test`: it reports requests by final code, hangs, leaks,
# acknowledged writes and durable puts lost after kill -9, values lost
# across a hitless restart, breaches of tenant isolation, wrong bytes from
# the store across hosts and removed keys found again there, and fails on
# any of them. SOAK sets how long; it needs root for its faults (netns, tmpfs,
# rlimits) and skips, saying so, those it cannot inject.
SOAK ?= 10m
soak: build
	@mkdir -p $(RUN_DIR)
	$(BIN)/tcsoak -duration $(SOAK) -json $(RUN_DIR)/soak.json

clean:
	rm -rf $(BIN) $(RUN_DIR)
	$(MAKE) -C c clean
