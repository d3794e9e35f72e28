#!/usr/bin/env bash
# The main job (make run): two QEMU VMs (TCG), each with a vrdma device on one
# vrdmad, run an RDMA WRITE bandwidth and latency test between them with the
# data verified on both sides; then the same device used without a VM by two
# virtio-user processes (what a secure container does). Everything started
# here is stopped and every socket removed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/bin"
WORK=$(mktemp -d /tmp/vrdma-run.XXXXXX)
VRDMAD_PID=""

cleanup() {
	local rc=$?
	if [ -n "$VRDMAD_PID" ]; then
		kill -TERM "$VRDMAD_PID" 2>/dev/null || true
		wait "$VRDMAD_PID" 2>/dev/null || true
	fi
	rm -rf "$WORK"
	exit $rc
}
trap cleanup EXIT INT TERM

say() { printf '\n== %s\n' "$*"; }

say "VM to VM: RDMA WRITE 64 KiB between two guests, verified on both sides"
"$BIN/vrdma-vmtest" pair --op write --size 65536 --iters 2000

say "VM to VM: 64 B RDMA WRITE latency"
"$BIN/vrdma-vmtest" pair --op write --size 64 --iters 2000

say "without a VM: two virtio-user processes (containers) on one vrdmad"
"$BIN/vrdmad" --control "$WORK/control.sock" --state-dir "$WORK/state" --socket "ctr-a=$WORK/ctr-a.sock" --socket "ctr-b=$WORK/ctr-b.sock" --log-level warn &
VRDMAD_PID=$!
for _ in $(seq 1 200); do [ -S "$WORK/control.sock" ] && break; sleep 0.05; done
for op in write read send atomic; do
	"$BIN/vrdma-perf" --sockets "$WORK/ctr-a.sock,$WORK/ctr-b.sock" --op "$op" --size 64K --iters 2000 --verify
done
VRDMA_CONTROL="$WORK/control.sock" "$BIN/vrdmactl" device ls

echo
echo "vrdma: RDMA between VMs and between containers, every byte verified."
