# tensorcast — build, run, test.  `make run` and `make test` are the quick start.
GO        ?= go
BIN       := bin
RUN_DIR   ?= $(CURDIR)/run
PKGS      := ./...
# A whole `make test` stays well under 30 minutes on 2 cores.
TEST_TIMEOUT ?= 20m
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all deps build run test test-go test-rdma generate lint fuzz bench clean

all: build

# Installs the Debian packages the project needs, only those missing.
deps:
	@scripts/deps.sh

# Quiet check used by build/run/test: runs deps only when a tool is missing.
.deps-check:
	@command -v flatc >/dev/null && command -v fio >/dev/null && command -v iperf3 >/dev/null \
	  && dpkg-query -W -f='$${Status}' libibverbs-dev 2>/dev/null | grep -q 'install ok installed' \
	  || scripts/deps.sh

build: .deps-check
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...

# Starts the daemon in the foreground on embedded defaults: socket and data under ./run/.
run: build
	@mkdir -p $(RUN_DIR)
	$(BIN)/tensorcastd --socket $(RUN_DIR)/tensorcastd.sock --data-dir $(RUN_DIR)/data

test: .deps-check test-go test-rdma

test-go:
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)
	$(GO) test -count=1 -tags invariants ./xfer/... ./shm/... ./uring/... ./store/...
	CGO_ENABLED=0 $(GO) build ./...
	$(GO) test -count=1 -run '^$$' -bench . -benchtime=1x $(PKGS) >/dev/null

# Real RDMA verbs over Soft-RoCE inside a qemu VM (see rdma/vmtest).
test-rdma:
	@if [ -x scripts/rdma-vm-test.sh ]; then scripts/rdma-vm-test.sh; else echo "test-rdma: harness not present yet"; fi

generate: .deps-check
	$(GO) generate ./fbs/...

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
	scripts/bench-section.sh uring "io_uring transport vs fio (same file, same bs/iodepth)" scripts/bench-uring.sh /var/tmp/tcbench 3 10
	scripts/bench-section.sh tcp "tcp transport vs iperf3 and a raw TCP ping-pong (loopback)" scripts/bench-tcp.sh 3 3
	scripts/bench-section.sh rdma "rdma transport and tcbench vs perftest on Soft-RoCE (qemu VM; ratios only)" \
	  bash -c 'set -o pipefail; RDMA_ROUNDS=5 RXE_TIMEOUT=1500 RDMA_TEST_RUN=XXX RDMA_DAEMON_RUN=- scripts/rdma-vm-test.sh | sed -n "/^rdma vs perftest/,\$$p"'
	scripts/bench-section.sh rdma-register "Registering a 4 GiB region for RDMA (Soft-RoCE under qemu TCG)" \
	  bash -c 'set -o pipefail; RXE_MEM=9728 RXE_REG_MB=4096 RXE_TIMEOUT=600 RDMA_TEST_RUN=TestVerbsRegisterLarge RDMA_BENCH=- RDMA_DAEMON_RUN=- scripts/rdma-vm-test.sh | grep -E "MR registration|^rdma \\(Soft"'

clean:
	rm -rf $(BIN) $(RUN_DIR)
