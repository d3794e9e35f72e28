#!/usr/bin/env bash
# make bench: the Go micro-benchmarks (one short count, for the report) and
# the whole suite through virtio-user, which writes docs/benchmarks.md,
# docs/benchmarks-bw.png, docs/benchmarks-scaling.png and
# docs/benchmarks-roce-loss.png and prints the tables. Needs root (mlock,
# pin-all, network namespaces); the roce section's rxe rows also need
# bin/qemu-system-x86_64 and bin/rxe (make qemu rxe-image), and say so
# instead when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
mkdir -p bin
micro=bin/bench-micro.txt
"$GO" test -run '^$' -bench . -benchmem -benchtime=200ms -count 1 \
	./virtio ./memmap ./backend/rdma/engine > "$micro" 2>&1 || { cat "$micro"; exit 1; }
"$GO" run ./cmd/vrdma-bench --micro "$micro" "$@"
