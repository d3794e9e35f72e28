# vrdma — para-virtual RDMA for QEMU VMs over vhost-user.
#
#   make run     build what is missing and run the main job (scripts/run.sh: perftest between
#                two VMs, the container path, RoCEv2 between two network namespaces)
#   make test    set up what is missing (Go modules, patched QEMU) and run every test
#   make build   every binary into bin/
#   make qemu    the patched QEMU into bin/qemu-system-x86_64 (cached in ~/.cache/vrdma)
#   make guest-image  bin/guest/vmlinuz + initramfs.img (Debian cloud kernel, busybox, vrdma-guest)
#   make guest-stack-image  bin/guest-stack/: the guest kernel driver, rdma-core provider, perftest image
#   make fuzz    every fuzz target for FUZZTIME (default 30s)
#   make compare-rxe  perftest over vrdma (and the Go guest) against perftest over soft-RoCE (rdma_rxe on virtio-net), same run
#   make deb     the .debs for hypervisor hosts: vrdma (binaries, systemd units, man pages) and
#                vrdma-qemu (the patched QEMU, as /usr/lib/vrdma/bin/qemu-system-x86_64)
#   make bench   the benchmark suite: docs/benchmarks.md + docs/benchmarks-bw.png (no QEMU needed)
#   make soak    random operations and faults across 4 devices for SOAK (default 10m)

SHELL      := /bin/bash
# The go command: scripts/go-toolchain.sh prints one at least as new as
# go.mod asks, after getting one if there is none (Debian's golang-go from
# bookworm-backports, then go.mod's toolchain through the Go module proxy),
# or stops with one line saying what to install. It runs once, when a recipe
# first uses $(GO) (deps does, first), and that go's directory goes first in
# PATH, so scripts that run `go` use it too. GO=... on the command line or in
# the environment skips it.
ifeq ($(origin GO),undefined)
GO = $(eval GO := $$(or $$(shell bash scripts/go-toolchain.sh),false))$(if $(filter-out false,$(GO)),$(eval export PATH := $(dir $(GO)):$$(PATH)))$(GO)
endif
BIN        := bin
FUZZTIME   ?= 30s
SOAK       ?= 10m
TEST_SOAK  ?= 60s
TEST_FUZZTIME ?= 3000x
export PATH := $(PATH):/usr/local/go/bin
export GOFLAGS := -buildvcs=false

CMDS := $(notdir $(wildcard cmd/*))


.PHONY: build-tools
.PHONY: all build run test bench deb test-tools fuzz fuzz-short soak compare-rxe rxe-image qemu guest-image guest-kmod guest-provider guest-stack-image vet fmt-check clean deps

all: build

deps:
	@test "$(GO)" != false || exit 1
	$(GO) mod download

# vrdmad is built with cgo: its verbs RNIC (backend/rdma/hostnic) calls
# the host's libibverbs, which it loads at run time (dlopen), so the
# binary needs only glibc and starts on hosts without rdma-core. The build
# needs gcc and libibverbs-dev's headers (build-tools installs them). The
# other programs stay static (vrdma-guest and vrdma-vmtest run in guests).
BUILD_APT := gcc libc6-dev libibverbs-dev

build-tools:
	@missing=""; for p in $(BUILD_APT); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; fi

# The source revision every program reports (--version, /v1/health,
# vrdma_build_info), "-dirty" with uncommitted changes; linked in, since the
# toolchain's own stamp is off wherever GOFLAGS has -buildvcs=false.
REVISION   := $(shell git rev-parse --short=12 HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
LDFLAGS    := -X github.com/vrdma/vrdma/internal/version.linkedRevision=$(REVISION)

build: deps build-tools
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...
	CGO_ENABLED=1 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/vrdmad ./cmd/vrdmad

qemu: $(BIN)/qemu-system-x86_64

$(BIN)/qemu-system-x86_64: scripts/qemu-build.sh $(wildcard vmm/qemu/patches/*.patch)
	bash scripts/qemu-build.sh

guest-image: deps
	bash scripts/guest-image.sh

# The standard RDMA stack in a guest: the kernel driver (guest/kernel ->
# bin/guest-stack/vrdma.ko), the rdma-core provider (guest/rdma-core ->
# bin/guest-stack/libvrdma-rdmav34.so, vrdma.driver) and the image that
# holds them with libibverbs, ibverbs-utils, perftest, iproute2 and strace
# (bin/guest-stack/vmlinuz + initramfs.img), which `vrdma-vmtest exec` and
# `exec-pair` boot. Each script rebuilds only what changed.
guest-kmod:
	bash scripts/guest-kmod.sh

guest-provider:
	bash scripts/guest-provider.sh

guest-stack-image: deps guest-kmod guest-provider
	bash scripts/guest-stack-image.sh

# The rxe comparison's guests: Debian's generic kernel (rdma_rxe), perftest.
rxe-image: deps
	bash scripts/rxe-image.sh

compare-rxe: build qemu guest-image guest-stack-image rxe-image
	$(BIN)/vrdma-compare

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# Every fuzz target, one at a time (scripts/fuzz.sh; go test -fuzz takes one
# target per run). make test gives each an execution count, not a duration:
# Go 1.26's duration budget can end in a spurious failure (go.dev/issue/75804).
fuzz:
	FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh

fuzz-short:
	FUZZTIME=$(TEST_FUZZTIME) bash scripts/fuzz.sh

# make test: everything, including the tests that need root and the patched
# QEMU (CI has both; they fail rather than skip when CI=true).
# Debian packages the tests use beyond the build's: man-db and groff-base
# (the manual pages are rendered with man --warnings and groff -ww), zsh
# (the packaged zsh completion is loaded and run) and curl (the documented
# control-API examples are run); dpkg-dev's dpkg-shlibdeps gives vrdma-qemu
# its Depends.
TEST_APT := man-db groff-base zsh curl dpkg dpkg-dev systemd
# libvirt: virt-xml-validate (libvirt-clients, and xmllint from libxml2-utils)
# checks the documented domain; libvirtd with its QEMU driver runs it.
TEST_APT += libvirt-clients libxml2-utils libvirt-daemon libvirt-daemon-driver-qemu
# Packaging and metrics: lintian checks the .deb, shellcheck its maintainer
# scripts, and promtool (Debian ships it only in prometheus) a live /metrics
# scrape (internal/metrics, packaging).
TEST_APT += lintian shellcheck prometheus
# RoCEv2 (backend/rdma/roce): tshark dissects what the codec writes, and
# Scapy computes ICRCs independently of it.
TEST_APT += tshark python3-scapy
# The verbs RNIC's binding (backend/rdma/hostnic/ibv) loads the host's
# libibverbs in its tests (the build needs only libibverbs-dev's headers).
TEST_APT += libibverbs1 ibverbs-providers

test-tools:
	@missing=""; for p in $(TEST_APT); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; fi

test: deps build-tools test-tools fmt-check vet qemu build guest-image rxe-image guest-stack-image
	$(GO) test -count=1 -timeout 30m -race -short ./...
	$(GO) test -count=1 -timeout 30m ./...
	@cat $(BIN)/e2e-summary.txt 2>/dev/null || echo "e2e summary: missing (the end-to-end tests did not run)"
	VRDMA_SOAK=$(TEST_SOAK) $(GO) test -count=1 -run '^TestSoak$$' ./tests
	@cat $(BIN)/soak-summary.txt
	@$(MAKE) --no-print-directory fuzz-short

# make soak: a random mix of verified RDMA operations, object churn and
# front-end faults across 4 devices for SOAK (default 10m).
soak: deps
	@mkdir -p $(BIN)
	VRDMA_SOAK=$(SOAK) $(GO) test -count=1 -timeout 0 -run '^TestSoak$$' -v ./tests | grep -E '^(---|\s+soak|soak:|ok|FAIL|PASS)'
	@cat $(BIN)/soak-summary.txt

run: build qemu guest-stack-image
	bash scripts/run.sh

bench: deps build
	bash scripts/bench.sh

# make deb: bin/vrdma_<version>_amd64.deb with the binaries, the systemd unit and man pages,
# and bin/vrdma-qemu_<version>_amd64.deb with the patched QEMU.
deb: build qemu
	bash scripts/deb.sh

clean:
	rm -rf $(BIN)
