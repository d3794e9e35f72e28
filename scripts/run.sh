#!/usr/bin/env bash
# The main job (make run): start vrdmad, boot a QEMU VM with a vrdma device
# attached over vhost-user, show the device on the VM's PCI bus and in the
# daemon's control API, then move data with RDMA between two virtio-user
# devices of the same daemon (what a secure container uses) and verify it.
# Everything started here is stopped and every socket removed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="$ROOT/bin"
QEMU="${VRDMA_QEMU:-$BIN/qemu-system-x86_64}"
WORK=$(mktemp -d /tmp/vrdma-run.XXXXXX)
VRDMAD_PID=""
QEMU_PID=""

cleanup() {
	local rc=$?
	[ -n "$QEMU_PID" ] && kill "$QEMU_PID" 2>/dev/null && wait "$QEMU_PID" 2>/dev/null || true
	if [ -n "$VRDMAD_PID" ]; then
		kill -TERM "$VRDMAD_PID" 2>/dev/null || true
		wait "$VRDMAD_PID" 2>/dev/null || true
	fi
	rm -rf "$WORK"
	exit $rc
}
trap cleanup EXIT INT TERM

say() { printf '\n== %s\n' "$*"; }

wait_for() { # path, what
	for _ in $(seq 1 200); do
		[ -S "$1" ] && return 0
		sleep 0.05
	done
	echo "run: $2 did not appear at $1" >&2
	return 1
}

say "starting vrdmad (3 devices: one for the VM, two for virtio-user containers)"
"$BIN/vrdmad" --control "$WORK/control.sock" \
	--socket "vm1=$WORK/vm1.sock" --socket "ctr-a=$WORK/ctr-a.sock" --socket "ctr-b=$WORK/ctr-b.sock" \
	--log-level warn &
VRDMAD_PID=$!
wait_for "$WORK/control.sock" "the control socket"

say "booting QEMU (q35, TCG, 512 MiB memfd guest RAM) with vhost-user-device-pci virtio-id=42"
"$QEMU" -M q35,memory-backend=mem -object memory-backend-memfd,id=mem,size=512M,share=on \
	-m 512M -smp 1 -nodefaults -nographic -no-reboot -display none -serial none \
	-qmp "unix:$WORK/qmp.sock,server=on,wait=off" \
	-chardev "socket,id=vrdma0-chr,path=$WORK/vm1.sock" \
	-device pcie-root-port,id=rp1,chassis=1 \
	-device "vhost-user-device-pci,id=vrdma0,bus=rp1,chardev=vrdma0-chr,virtio-id=42,num_vqs=3,vq_size=256,config_size=96" &
QEMU_PID=$!
wait_for "$WORK/qmp.sock" "QEMU's QMP socket"

say "the VM's PCI bus (QMP query-pci)"
# The device behind its root port is listed once the firmware has numbered
# the port's bus, a moment after QEMU starts.
for _ in $(seq 1 150); do
	"$BIN/vrdmactl" vm pci --qmp "$WORK/qmp.sock" >"$WORK/pci.txt" 2>&1 && grep -q '1af4:106a' "$WORK/pci.txt" && break
	sleep 0.2
done
cat "$WORK/pci.txt"
grep -q '1af4:106a' "$WORK/pci.txt" || { echo "run: the vrdma device is not on the VM's PCI bus" >&2; exit 1; }

say "RDMA WRITE, READ, SEND and ATOMIC between two virtio-user devices, every byte verified"
for op in write read send atomic; do
	"$BIN/vrdma-perf" --sockets "$WORK/ctr-a.sock,$WORK/ctr-b.sock" --op "$op" --size 64K --iters 2000 --verify
done

say "the daemon's view (vrdmactl device ls)"
VRDMA_CONTROL="$WORK/control.sock" "$BIN/vrdmactl" device ls

echo
echo "vrdma: device attached to QEMU and RDMA verified. (Guest images and VM-to-VM RDMA: issue 4.)"
