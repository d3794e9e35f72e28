#!/usr/bin/env bash
# Guest image for vrdma's end-to-end runs: bin/guest/vmlinuz (Debian's 6.1
# cloud kernel) and bin/guest/initramfs.img (busybox, guest/init and the
# static bin/vrdma-guest). Built from Debian packages only, as root.
#
#   bash scripts/guest-image.sh            # (re)build what is missing or stale
#
# The .debs are cached in ~/.cache/vrdma/guest (apt-get download runs once);
# rebuilding the initramfs after vrdma-guest changed takes a few seconds, and
# a run with nothing changed does nothing.
#
# Environment:
#   VRDMA_GUEST_BIN  use this static binary as /bin/vrdma-guest instead of
#                    building cmd/vrdma-guest (for trying the image alone)
#   GO               the Go toolchain (default: go, then /usr/local/go/bin/go)
#
# No kernel modules go into the image: the cloud kernel has PCI sysfs,
# hugetlbfs (MAP_HUGETLB), devtmpfs and the 8250 serial ports built in
# (checked below against the kernel's config), and virtio_pci must never be
# loaded (it would claim the device's BARs; see docs ARCHITECTURE "Guests").
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${HOME:-/root}/.cache/vrdma/guest"
OUT="$ROOT/bin/guest"
GO="${GO:-go}"
command -v "$GO" >/dev/null 2>&1 || GO=/usr/local/go/bin/go
IMAGE=guest-image
# shellcheck source=scripts/lib-image.sh
. "$ROOT/scripts/lib-image.sh"

need_root
mkdir -p "$CACHE/debs" "$OUT"

# --- 1. Debian packages (cached) --------------------------------------------

newest_kernel cloud-amd64 cloud
KDEB=$(fetch_deb "$CACHE/debs" "$KPKG")
BDEB=$(fetch_deb "$CACHE/debs" busybox-static)
extract "$KDEB" "$CACHE/kernel"
extract "$BDEB" "$CACHE/busybox"

BUSYBOX="$CACHE/busybox/bin/busybox"
[ -x "$BUSYBOX" ] || die "busybox-static has no bin/busybox"
VMLINUZ="$CACHE/kernel/boot/vmlinuz-$KVER"
[ -f "$VMLINUZ" ] || die "$KDEB has no boot/vmlinuz-$KVER"

# The image relies on built-in kernel features, not modules: check them.
KCONFIG="$CACHE/kernel/boot/config-$KVER"
if [ -f "$KCONFIG" ]; then
	for opt in CONFIG_PCI CONFIG_SYSFS CONFIG_PROC_FS CONFIG_DEVTMPFS CONFIG_HUGETLBFS \
		CONFIG_SERIAL_8250 CONFIG_SERIAL_8250_CONSOLE CONFIG_BLK_DEV_INITRD CONFIG_RD_GZIP; do
		grep -q "^$opt=y" "$KCONFIG" || die "$KVER: $opt is not built in; the image would need modules"
	done
fi

# --- 2. vrdma-guest (static) --------------------------------------------------

if [ -n "${VRDMA_GUEST_BIN:-}" ]; then
	GUEST_BIN=$VRDMA_GUEST_BIN
	[ -x "$GUEST_BIN" ] || die "VRDMA_GUEST_BIN=$GUEST_BIN is not executable"
else
	[ -d "$ROOT/cmd/vrdma-guest" ] || die "cmd/vrdma-guest does not exist yet"
	GUEST_BIN="$ROOT/bin/vrdma-guest"
	say "go build cmd/vrdma-guest (static)"
	(cd "$ROOT" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false "$GO" build -trimpath -o "$GUEST_BIN" ./cmd/vrdma-guest)
fi
if file "$GUEST_BIN" 2>/dev/null | grep -q 'dynamically linked'; then
	die "$GUEST_BIN is dynamically linked; the image has no libc"
fi

# --- 3. vmlinuz ---------------------------------------------------------------

if ! cmp -s "$VMLINUZ" "$OUT/vmlinuz"; then
	cp "$VMLINUZ" "$OUT/vmlinuz.tmp"
	mv "$OUT/vmlinuz.tmp" "$OUT/vmlinuz"
	say "bin/guest/vmlinuz <- $KVER"
fi

# --- 4. initramfs (rebuilt only when an input changed) ------------------------

STAMP="$OUT/.initramfs.inputs"
inputs=$(input_hashes "$BUSYBOX" "$ROOT/guest/init" "$GUEST_BIN" "${BASH_SOURCE[0]}")
if up_to_date "$OUT/initramfs.img" "$STAMP" "$inputs"; then
	say "bin/guest/initramfs.img is up to date"
	exit 0
fi

new_stage "$BUSYBOX" bin sbin usr/bin usr/sbin dev proc sys tmp run etc root mnt/huge
install -m 0755 "$GUEST_BIN" "$STAGE/bin/vrdma-guest"
stage_base "$ROOT/guest/init"
pack_initramfs "$OUT/initramfs.img" "$STAMP" "$inputs"
say "bin/guest/initramfs.img ($(du -h "$OUT/initramfs.img" | cut -f1)): busybox, /init, vrdma-guest; kernel $KVER"
