#!/usr/bin/env bash
# The main job (make run): what vrdma is for, in three sections, each ending
# in one line that says what it showed.
#
#   1. VM to VM with the standard RDMA stack: two QEMU VMs (TCG), each with
#      a vrdma device on one vrdmad, the vrdma kernel driver and Debian's
#      libibverbs with the vrdma provider, run Debian's unmodified perftest
#      between them: ib_write_bw and ib_write_lat, perftest's own tables.
#   2. Containers: the same daemon's devices used without a VM by two
#      virtio-user processes (what a secure container does), each
#      operation's data verified.
#   3. Two hosts: two vrdmads in two network namespaces joined by a veth,
#      each carrying its device's traffic as RoCEv2 on UDP 4791 of its own
#      address; perftest's two-process mode between them, data verified.
#
# Everything started here is stopped, and every socket, namespace and
# temporary file removed, on exit. Needs root (namespaces); the Makefile
# builds the binaries, QEMU and the guest image first.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="${VRDMA_BIN:-$ROOT/bin}"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vrdma-run.XXXXXX")
# Namespaces are named per run, so two runs never meet.
NS_A="vrdma-run-a-$$"
NS_B="vrdma-run-b-$$"
# Addresses that exist only inside the two namespaces (RFC 2544's
# benchmarking range, routed nowhere).
ADDR_A=198.18.91.1
ADDR_B=198.18.91.2
PIDS=()

cleanup() {
	local rc=$?
	local p
	for p in "${PIDS[@]}"; do
		kill -TERM "$p" 2>/dev/null || true
	done
	for p in "${PIDS[@]}"; do
		wait "$p" 2>/dev/null || true
	done
	ip netns del "$NS_A" 2>/dev/null || true
	ip netns del "$NS_B" 2>/dev/null || true
	rm -rf "$WORK"
	exit $rc
}
trap cleanup EXIT INT TERM

say() { printf '\n== %s\n' "$*"; }
shown() { printf -- '-> shown: %s\n' "$*"; }
fail() {
	printf 'make run: %s\n' "$*" >&2
	exit 1
}

[ "$(id -u)" = 0 ] || fail "run as root: section 3 creates network namespaces"
for b in vrdmad vrdma-perf vrdma-vmtest vrdmactl; do
	[ -x "$BIN/$b" ] || fail "$BIN/$b is missing (make build)"
done

# wait_socket PATH: until vrdmad's socket exists (bounded: 10 s).
wait_socket() {
	local _
	for _ in $(seq 1 200); do
		[ -S "$1" ] && return 0
		sleep 0.05
	done
	fail "no socket $1 after 10 s"
}

# Each vrdmad holds descriptors per connected front-end (eventfds, memory
# files): give it the room the packaged unit gives it (LimitNOFILE).
ulimit -n 65536 2>/dev/null || true

# --- 1. VM to VM, the standard stack -------------------------------------

say "1/3 VM to VM: Debian's perftest between two VMs over vrdma (kernel driver + rdma-core provider)"
# guest/vrdma-perftest's "quick" suite: ib_write_bw -s 65536, then
# ib_write_lat, each server in the first VM and client in the second;
# perftest's tables come from the client. VRDMA-* lines are the harness's.
out="$WORK/vms.out"
if ! "$BIN/vrdma-vmtest" --timeout 4m exec-pair -q \
	--server 'vrdma-perftest server quick' --client 'vrdma-perftest client quick {server}' >"$out" 2>&1; then
	cat "$out"
	fail "perftest between the two VMs failed"
fi
sed -n 's/^client| //p' "$out" | grep -v '^VRDMA-'
grep -q '^client| VRDMA-SUITE ok' "$out" || fail "the client's perftest suite did not pass"
grep -q '^server| VRDMA-SUITE ok' "$out" || fail "the server's perftest suite did not pass"
shown "unmodified ib_write_bw and ib_write_lat ran between two VMs on one vrdmad, both sides exit 0"

# --- 2. Containers ---------------------------------------------------------

say "2/3 without a VM: two virtio-user processes (containers) on one vrdmad"
"$BIN/vrdmad" --control "$WORK/control.sock" --state-dir "$WORK/state" \
	--socket "ctr-a=$WORK/ctr-a.sock" --socket "ctr-b=$WORK/ctr-b.sock" --log-level warn &
PIDS+=($!)
wait_socket "$WORK/control.sock"
for op in write read send atomic; do
	"$BIN/vrdma-perf" --sockets "$WORK/ctr-a.sock,$WORK/ctr-b.sock" --op "$op" --size 64K --iters 2000 --verify
done
VRDMA_CONTROL="$WORK/control.sock" "$BIN/vrdmactl" device ls
shown "RDMA WRITE, READ, SEND and atomics between two container processes, every byte verified"

# --- 3. Two hosts over RoCEv2 ------------------------------------------------

say "3/3 two hosts: RoCEv2 between two vrdmads in two network namespaces"
ip netns add "$NS_A"
ip netns add "$NS_B"
ip link add va netns "$NS_A" type veth peer name vb netns "$NS_B"
ip -n "$NS_A" addr add "$ADDR_A/24" dev va
ip -n "$NS_B" addr add "$ADDR_B/24" dev vb
for ns in "$NS_A" "$NS_B"; do
	ip -n "$ns" link set lo up
done
ip -n "$NS_A" link set va up
ip -n "$NS_B" link set vb up
for side in a b; do
	ns=$NS_A addr=$ADDR_A
	[ "$side" = b ] && ns=$NS_B addr=$ADDR_B
	ip netns exec "$ns" "$BIN/vrdmad" --control "$WORK/host-$side.control" --state-dir "$WORK/host-$side.state" \
		--socket "host-$side=$WORK/host-$side.sock" --roce-bind "$addr" --log-level warn &
	PIDS+=($!)
done
wait_socket "$WORK/host-a.sock"
wait_socket "$WORK/host-b.sock"
# perftest's two-process mode: the server (B) waits on TCP, the client (A)
# connects to it, both send from GID index 1, the host address's: the RC
# QPs run over RoCEv2 on the veth.
port=18700
for op in write read send; do
	ip netns exec "$NS_B" "$BIN/vrdma-perf" --socket "$WORK/host-b.sock" --op "$op" -s 64K -n 500 -x 1 --verify -p "$port" \
		>"$WORK/server.out" 2>&1 &
	srv=$!
	if ! ip netns exec "$NS_A" "$BIN/vrdma-perf" --socket "$WORK/host-a.sock" --op "$op" -s 64K -n 500 -x 1 --verify -p "$port" "$ADDR_B"; then
		wait "$srv" || true
		cat "$WORK/server.out"
		fail "RoCEv2 $op between the namespaces failed"
	fi
	wait "$srv" || {
		cat "$WORK/server.out"
		fail "the RoCEv2 $op server failed"
	}
	port=$((port + 1))
done
shown "RDMA WRITE, READ and SEND as RoCEv2 between two hosts' vrdmads ($ADDR_A <-> $ADDR_B), every byte verified"

echo
echo "vrdma: perftest between VMs, RDMA between containers and RoCEv2 between hosts."
