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

say() { printf 'guest-image: %s\n' "$*"; }
die() { printf 'guest-image: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (dpkg -x keeps ownership and modes)"
mkdir -p "$CACHE/debs" "$OUT"

# --- 1. Debian packages (cached) --------------------------------------------

kernel_pkg() {
	apt-cache search '^linux-image-6\.1\.0-[0-9]+-cloud-amd64$' | awk '{print $1}' | sort -V | tail -1
}

KPKG=$(kernel_pkg || true)
if [ -z "$KPKG" ]; then
	say "apt cache has no cloud kernel: apt-get update"
	apt-get update -qq
	KPKG=$(kernel_pkg || true)
fi
[ -n "$KPKG" ] || die "no linux-image-6.1.0-N-cloud-amd64 package in the apt sources"
KVER=${KPKG#linux-image-}

fetch_deb() { # package -> prints the cached .deb path
	local pkg=$1 deb
	deb=$(ls "$CACHE/debs/${pkg}"_*.deb 2>/dev/null | sort -V | tail -1 || true)
	if [ -z "$deb" ]; then
		say "apt-get download $pkg" >&2
		(cd "$CACHE/debs" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2) || {
			apt-get update -qq >&2
			(cd "$CACHE/debs" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2)
		}
		deb=$(ls "$CACHE/debs/${pkg}"_*.deb 2>/dev/null | sort -V | tail -1 || true)
		[ -n "$deb" ] || die "apt-get download $pkg left no .deb"
	fi
	printf '%s\n' "$deb"
}

KDEB=$(fetch_deb "$KPKG")
BDEB=$(fetch_deb busybox-static)

extract() { # deb dir
	local deb=$1 dir=$2
	if [ ! -f "$dir/.extracted" ] || [ "$(cat "$dir/.extracted")" != "$(basename "$deb")" ]; then
		say "dpkg -x $(basename "$deb")"
		rm -rf "$dir"
		mkdir -p "$dir"
		dpkg -x "$deb" "$dir"
		basename "$deb" >"$dir/.extracted"
	fi
}
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
inputs=$(sha256sum "$BUSYBOX" "$ROOT/guest/init" "$GUEST_BIN" "${BASH_SOURCE[0]}" | awk '{print $1}' | tr '\n' ' ')
if [ -f "$OUT/initramfs.img" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$inputs" ]; then
	say "bin/guest/initramfs.img is up to date"
	exit 0
fi

STAGE=$(mktemp -d "$CACHE/stage.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,run,etc,root,mnt/huge}
cp "$BUSYBOX" "$STAGE/bin/busybox"
# One link per applet, where busybox says it belongs (/bin/sh, /sbin/poweroff, ...).
"$STAGE/bin/busybox" --list-full | while read -r applet; do
	[ -e "$STAGE/$applet" ] || ln -s /bin/busybox "$STAGE/$applet"
done
install -m 0755 "$ROOT/guest/init" "$STAGE/init"
install -m 0755 "$GUEST_BIN" "$STAGE/bin/vrdma-guest"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$STAGE/etc/passwd"
printf 'root:x:0:\n' >"$STAGE/etc/group"
# /dev/console must exist before devtmpfs is mounted, for the kernel to open
# init's stdin/stdout; busybox mknod makes it inside the archive tree.
"$BUSYBOX" mknod -m 600 "$STAGE/dev/console" c 5 1
"$BUSYBOX" mknod -m 666 "$STAGE/dev/null" c 1 3

(cd "$STAGE" && find . | "$BUSYBOX" cpio -o -H newc -R 0:0 2>/dev/null | gzip -1 >"$OUT/initramfs.img.tmp")
mv "$OUT/initramfs.img.tmp" "$OUT/initramfs.img"
printf '%s' "$inputs" >"$STAMP"
say "bin/guest/initramfs.img ($(du -h "$OUT/initramfs.img" | cut -f1)): busybox, /init, vrdma-guest; kernel $KVER"
