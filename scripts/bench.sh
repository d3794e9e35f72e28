#!/usr/bin/env bash
# make bench: the Go micro-benchmarks (one short count, for the report) and
# the whole suite through virtio-user, which writes docs/benchmarks.md and
# docs/benchmarks-bw.png and prints the tables. Needs root (mlock, pin-all).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
mkdir -p bin
micro=bin/bench-micro.txt
"$GO" test -run '^$' -bench . -benchmem -benchtime=200ms -count 1 \
	./virtio ./memmap ./backend/rdma/engine > "$micro" 2>&1 || { cat "$micro"; exit 1; }
"$GO" run ./cmd/vrdma-bench --micro "$micro" "$@"
