# skein — build, test, demo.
GO        ?= go
BIN       := $(CURDIR)/bin
GOFLAGS   ?=
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/skeinnet/skein/internal/daemon.Version=$(VERSION) -X main.buildVersion=$(VERSION)

.PHONY: all build deps test unit demo vet fmt clean proto conformance bench bench-quick bench-frontdoors

# cnitool (upstream, pinned) as scripts/deps.d/conformance.sh installs it.
SKEIN_TOOLS ?= $(HOME)/.cache/skein/tools
CNITOOL     ?= $(SKEIN_TOOLS)/cni-v1.3.1/cnitool
export CNITOOL
BENCH_OUT   ?= $(CURDIR)/bench/out

all: build

# Statically linked (no cgo): the CNI binaries are exec'd for every ADD and
# DEL, and loading libc through ld.so costs ~0.7 ms a start on our machines.
build:
	CGO_ENABLED=0 $(GO) build $(GOFLAGS) -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/... ./bench/execfloor

deps:
	./scripts/install-deps.sh

# Every test: unit tests and the privileged ones (real namespaces, real
# kernel, the real binaries through libcni), the conformance suite
# (test/conformance) included. Run as root.
test: deps build vet
	SKEIN_BIN_DIR=$(BIN) $(GO) test -count=1 -timeout 30m ./...

# Unit tests only (no root needed; privileged tests skip).
unit:
	$(GO) test -count=1 ./internal/ipam/... ./internal/store/... ./internal/cni/... ./cmd/...

# CNI conformance through clients other people wrote: cnitool, libcni,
# podman, containerd, the reference plugins chained after skein. Root.
conformance: deps build
	SKEIN_BIN_DIR=$(BIN) $(GO) test -count=1 -timeout 10m ./test/conformance/

# skein against bridge/ptp+host-local and the raw-netlink floor, one run on
# this machine: report.md, results.json and charts in $(BENCH_OUT). Root.
bench: deps build
	$(BIN)/skein-bench -bin $(BIN) -out $(BENCH_OUT)
	$(MAKE) bench-frontdoors

# The other front doors, each against its incumbent in one run: `docker run`
# on a skein network vs Docker's bridge driver, and a VM's DHCP lease from
# skeind vs dnsmasq (udhcpc, 100 leases). Results in $(BENCH_OUT)/*.txt.
bench-frontdoors: deps build
	mkdir -p $(BENCH_OUT)
	SKEIN_BIN_DIR=$(BIN) $(GO) test -count=1 -run '^$$' -bench DockerRun -benchtime 30x ./test/docker/ | tee $(BENCH_OUT)/docker.txt
	SKEIN_BIN_DIR=$(BIN) $(GO) test -count=1 -run '^$$' -bench DHCPLease -benchtime 100x ./test/vm/ | tee $(BENCH_OUT)/dhcp.txt

# The same in under two minutes: fewer operations, nodes of 10 and 1,000.
bench-quick: deps build
	$(BIN)/skein-bench -bin $(BIN) -out $(BENCH_OUT) -quick

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }

demo: deps build
	$(GO) run ./test/demo -bin $(BIN)

proto:
	cd api/rpc && protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative skein.proto vm.proto

clean:
	rm -rf $(BIN)
