# skein — build, test, demo.
GO        ?= go
BIN       := $(CURDIR)/bin
GOFLAGS   ?=
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/skeinnet/skein/internal/daemon.Version=$(VERSION) -X main.buildVersion=$(VERSION)

.PHONY: all build deps deps-demo test test-run unit demo vet fmt clean proto conformance bench bench-quick bench-frontdoors bench-kube bench-kube-startup bench-routing bench-kurma bench-egress fuzz

# cnitool (upstream, pinned) as scripts/deps.d/conformance.sh installs it.
SKEIN_TOOLS ?= $(HOME)/.cache/skein/tools
CNITOOL     ?= $(SKEIN_TOOLS)/cni-v1.3.1/cnitool
export CNITOOL
BENCH_OUT   ?= $(CURDIR)/bench/out

all: build

# Statically linked (no cgo): the CNI binaries are exec'd for every ADD and
# DEL, and loading libc through ld.so costs ~0.7 ms a start on our machines.
# bin/skein, the binary runtimes exec, is C (cmd/skein/skein.c): a Go
# program's start alone costs ~1 ms of CPU more (docs/architecture.md). So
# is bin/skein-sandbox-exec, the last step of a pod network's sandbox: a
# plugin exec'd from a single-threaded process waits for no thread to exit.
CC        ?= cc
CFLAGS    ?= -O2 -Wall -Wextra
build:
	CGO_ENABLED=0 $(GO) build $(GOFLAGS) -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/... ./bench/execfloor
	$(CC) $(CFLAGS) -static -o $(BIN)/skein cmd/skein/skein.c || { \
	  echo "make build: bin/skein needs a C compiler and a static libc (Debian: gcc libc6-dev; scripts/install-deps.sh installs them)" >&2; exit 1; }
	$(CC) $(CFLAGS) -static -o $(BIN)/skein-sandbox-exec cmd/skein-sandbox-exec/exec.c

deps:
	./scripts/install-deps.sh

# Only what `make demo` uses: ping, docker.io, qemu, dhclient, the kernel.
deps-demo:
	./scripts/install-deps.sh demo

# Every test: unit tests and the privileged ones (real namespaces, real
# kernel, the real binaries through libcni), the conformance suite
# (test/conformance) included. Run as root. test/hostcheck records the
# host's pinned namespaces, links, addresses, routes, rules, nftables and
# mounts first and compares them once the tests are done: make test fails
# if the tests fail, and also if they pass but leave the host changed.
# deps runs first: the host is recorded with the tools that read it (nft)
# installed, as it will be when it is compared.
test: deps
	@state=$$(mktemp /tmp/skein-host.XXXXXX) || exit 1; \
	$(GO) run ./test/hostcheck save "$$state" || { rm -f "$$state"; exit 1; }; \
	$(MAKE) --no-print-directory test-run; status=$$?; \
	$(GO) run ./test/hostcheck compare "$$state" || { [ $$status -ne 0 ] || status=1; }; \
	rm -f "$$state"; exit $$status

test-run: deps build vet
	SKEIN_BIN_DIR=$(BIN) $(GO) test -count=1 -timeout 30m ./...

# Unit tests only (no root needed; privileged tests skip). The skips are
# counted by reason on a last line (hack/skipsummary reads go test -json):
# "ok" alone would hide the suites that did not run. Skips alone exit 0.
UNIT_PKGS = ./internal/ipam/... ./internal/store/... ./internal/cni/... ./cmd/...
unit:
	@status=$$(mktemp /tmp/skein-unit.XXXXXX) || exit 1; \
	{ $(GO) test -json -count=1 $(UNIT_PKGS); echo $$? >"$$status"; } | $(GO) run ./hack/skipsummary; sum=$$?; \
	tests=$$(cat "$$status"); rm -f "$$status"; \
	[ "$$tests" = 0 ] && [ $$sum -eq 0 ]

# CNI conformance through clients other people wrote: cnitool, libcni,
# podman, containerd, the reference plugins chained after skein. Root.
conformance: deps build
	SKEIN_BIN_DIR=$(BIN) $(GO) test -count=1 -timeout 10m ./test/conformance/

# skein against bridge/ptp+host-local and the raw-netlink floor, one run on
# this machine: report.md, results.json and charts in $(BENCH_OUT). Root.
bench: deps build
	$(BIN)/skein-bench -bin $(BIN) -out $(BENCH_OUT)
	$(MAKE) bench-frontdoors
	$(MAKE) bench-kurma
	$(MAKE) bench-kube KUBE_SCALE="-nodes 1000 -pods 100000"
	$(MAKE) bench-kube-startup
	$(MAKE) bench-routing
	$(MAKE) bench-egress

# Kubernetes mode at scale (test/kubescale): a real apiserver+etcd with
# deploy/kubernetes's skeind RBAC, identity policies and priority level
# (skeind-flowcontrol.yaml), the skein-controller binary (its AddressBlock
# webhook on every claim), and simulated nodes running skeind's
# kubestore+ipam as skeind's ServiceAccount, all starting and claiming at
# once: claim latency, collisions (writes per claim), 429s, duplicate
# addresses, RSS; $(BENCH_OUT)/kube-scale (docs/benchmarks/kube-scale.md).
# The full size is KUBE_SCALE="-nodes 1000 -pods 100000"; flags such as
# -leases=false, -webhook=false, -watch take parts out or in. `make test`
# runs the same at 30 nodes with its figures asserted (TestClaimBurst).
KUBE_SCALE ?= -nodes 100 -pods 10000
bench-kube: deps build
	SKEIN_BIN_DIR=$(BIN) $(GO) test -count=1 -run '^$$' -bench KubeScale -benchtime 1x -timeout 60m ./test/kubescale/ \
		-args $(KUBE_SCALE) -out $(BENCH_OUT)/kube-scale

# Pod startup latency on a real node (test/kubelet: kubelet, containerd,
# kube-proxy; skein installed by kubectl apply -k): 100 pods at once, from
# kubectl apply to Ready, skein against the reference bridge + host-local
# conflist on the same node, rounds interleaved; report.md and
# results.json in $(BENCH_OUT)/kube-startup (docs/benchmarks/kube-startup.md).
# KUBE_STARTUP="-startup.pairs 1" for a shorter run. Root.
KUBE_STARTUP ?=
bench-kube-startup: deps build
	SKEIN_BIN_DIR=$(BIN) $(GO) test -count=1 -run '^$$' -bench KubeStartup -benchtime 1x -timeout 30m ./test/kubelet/ \
		-args -startup.out $(BENCH_OUT)/kube-startup $(KUBE_STARTUP)

# Routing between nodes (test/routebench): pod-to-pod throughput and
# round trips in direct and vxlan mode against the bare underlay and a
# VXLAN pair made by hand, and a new block's route reaching every node with
# 1,000 simulated nodes' blocks present; $(BENCH_OUT)/routing. Root.
ROUTING_BENCH ?=
ROUTING_QUICK := -reps 1 -seconds 2 -rr-seconds 1 -nodes 100 -probes 20
bench-routing: deps build
	SKEIN_BIN_DIR=$(BIN) $(GO) test -count=1 -run '^$$' -bench Routing -benchtime 1x -timeout 60m ./test/routebench/ \
		-args -out $(BENCH_OUT)/routing $(ROUTING_BENCH)

# The other front doors, each against its incumbent in one run: `docker run`
# on a skein network vs Docker's bridge driver, and a VM's DHCP lease from
# skeind vs dnsmasq (udhcpc, 100 leases). Results in $(BENCH_OUT)/*.txt.
bench-frontdoors: deps build
	mkdir -p $(BENCH_OUT)
	SKEIN_BIN_DIR=$(BIN) $(GO) test -count=1 -run '^$$' -bench DockerRun -benchtime 30x ./test/docker/ | tee $(BENCH_OUT)/docker.txt
	SKEIN_BIN_DIR=$(BIN) $(GO) test -count=1 -run '^$$' -bench DHCPLease -benchtime 100x ./test/vm/ | tee $(BENCH_OUT)/dhcp.txt

# Pod networks (Kurma): an image-backed network (the reference ptp packed
# by skeinctl image pack-cni) vs the same plugin through libcni, one pod
# and 8 at once, image unpack, a pod on 3 networks vs 3 libcni calls;
# medians in $(BENCH_OUT)/kurma.txt (docs/benchmarks/kurma.md). Then the
# one-pod figure again with KURMA_MOUNTS more mounts in skeind's mount
# table (scripts/with-mounts.sh), as a busy node has. Root.
KURMA_BENCHTIME ?= 30x
KURMA_MOUNTS ?= 500
bench-kurma: deps build
	mkdir -p $(BENCH_OUT)
	SKEIN_BIN_DIR=$(BIN) $(GO) test -count=1 -run '^$$' -bench Kurma -benchtime $(KURMA_BENCHTIME) ./test/kurma/ | tee $(BENCH_OUT)/kurma.txt
	$(GO) test -c -o $(BIN)/kurma.test ./test/kurma/
	cd test/kurma && SKEIN_BIN_DIR=$(BIN) $(CURDIR)/scripts/with-mounts.sh $(KURMA_MOUNTS) $(BIN)/kurma.test -test.run '^$$' -test.bench 'KurmaAttach$$' -test.benchtime $(KURMA_BENCHTIME) | tee $(BENCH_OUT)/kurma-mounts.txt

# Egress (FoU gateway) inside the qemu guest: gateway vs direct TCP
# throughput and round trips, ApplyClient time; $(BENCH_OUT)/egress.txt
# (docs/benchmarks/egress.md). Root.
bench-egress: deps
	mkdir -p $(BENCH_OUT)
	$(GO) test -count=1 -run '^$$' -bench '^BenchmarkEgressInGuest$$' -benchtime 1x -timeout 15m ./internal/egress/ | tee $(BENCH_OUT)/egress.txt

# The same in under two minutes: fewer operations, nodes of 10 and 1,000.
bench-quick: deps build
	$(BIN)/skein-bench -bin $(BIN) -out $(BENCH_OUT) -quick
	$(MAKE) bench-kurma KURMA_BENCHTIME=5x
	$(MAKE) bench-kube
	$(MAKE) bench-routing ROUTING_BENCH="$(ROUTING_QUICK)"

# Every fuzz target for FUZZTIME each (go test fuzzes one target per
# run). The seed corpora (testdata/fuzz) already run in `make test`; a
# failure leaves its input in the package's testdata/fuzz/FuzzX/. Minimizing
# is bounded (FUZZMINIMIZE runs) so that the slower targets, which replay a
# Docker session per input, spend their time fuzzing.
FUZZTIME     ?= 30s
FUZZMINIMIZE ?= 200x
FUZZFLAGS    ?=
FUZZ_PKGS    := ./internal/cni ./internal/cnirun ./internal/docker ./internal/vm ./cmd/skeind
fuzz:
	@set -e; for pkg in $(FUZZ_PKGS); do \
		list=$$($(GO) test -list '^Fuzz' $$pkg); \
		for target in $$(echo "$$list" | grep '^Fuzz'); do \
			echo "== $$pkg $$target ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE) $(FUZZFLAGS) $$pkg; \
		done; \
	done

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }

# A pool, two CNI pods, a Docker container and a qemu VM reaching each
# other; the host is checked unchanged at the end. Root. If installing
# fails (offline, apt busy), the demo still runs and says what it skipped.
# A local Kubernetes cluster with skein installed (test/kubelet): two
# nodes, each its own network namespace with a real containerd, kubelet and
# kube-proxy, a control plane beside them; `make cluster-down` removes it.
# Root. Prints how to use kubectl against it.
.PHONY: cluster cluster-down
cluster: deps build
	BIN=$(abspath $(BIN)) ./scripts/cluster.sh up

cluster-down:
	./scripts/cluster.sh down

demo:
	./scripts/install-deps.sh demo || echo "make demo: could not install every dependency (above); the demo skips what is missing and says why"
	$(MAKE) --no-print-directory build
	$(GO) run ./test/demo -bin $(BIN)

# Kubernetes API (api/v1alpha1): deepcopy code and the CRDs in
# deploy/kubernetes/crd, made by controller-gen (pinned; go run builds it
# once). api/v1alpha1's TestGenerated fails when they are stale.
CONTROLLER_GEN_VERSION := v0.20.0
.PHONY: generate
generate:
	$(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION) object crd paths=./api/... output:crd:dir=deploy/kubernetes/crd

proto:
	cd api/rpc && protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative skein.proto vm.proto

clean:
	rm -rf $(BIN)

# One image FROM scratch holding the static binaries, written without a
# container engine as an image tarball (docker load -i, podman load -i,
# kind load image-archive) by hack/mkimage; the Dockerfile makes the same
# image with an engine. deploy/kubernetes runs IMAGE.
IMAGE ?= skein:dev
.PHONY: image
image: build
	$(GO) run ./hack/mkimage -bin $(BIN) -out $(BIN)/skein-image.tar -tag $(IMAGE) -version $(VERSION)
