#!/usr/bin/env bash
# Guest image for the soft-RoCE comparison (cmd/vrdma-compare, make
# compare-rxe): bin/rxe/vmlinux (Debian's *generic* 6.1 kernel, which has
# rdma_rxe; the cloud kernel does not) and bin/rxe/initramfs.img (busybox,
# guest/rxe-init, the modules rdma_rxe and rdma_cm need, virtio-net,
# perftest, UCX's ucx_perftest with its verbs transports, librdmacm's
# rping/ucmatose/udaddy, the job runner guest/perftest-jobs and the `rdma`
# tool with every shared library they load). Built from Debian packages only, as root.
#
# internal/hostniclab (vrdma-vmtest hostnic) boots this image with
# vrdma.run=exec and a second initramfs archive appended at run time
# (vrdmad, the vrdma-vmtest agent, /extra/job.sh): the image is not rebuilt
# per change of those programs. A vrdmad built with cgo (the verbs RNIC
# dlopens libibverbs.so.1) runs here: the image has glibc's loader and
# libc, libibverbs.so.1 and the rxe provider; hostniclab checks a dynamic
# vrdmad's DT_NEEDED against this image's files before it boots.
#
#   bash scripts/rxe-image.sh              # (re)build what is missing or stale
#
# The .debs are cached in ~/.cache/vrdma/rxe (apt-get download runs once).
#
# vmlinux, not vmlinuz: QEMU boots an uncompressed ELF kernel through its PVH
# entry point, which skips decompressing the xz bzImage payload (about three
# times the boot time under TCG). The payload is found by its xz magic and
# checked to be an ELF with a PVH note.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${HOME:-/root}/.cache/vrdma/rxe"
GUEST_CACHE="${HOME:-/root}/.cache/vrdma/guest"
OUT="$ROOT/bin/rxe"
IMAGE=rxe-image
# shellcheck source=scripts/lib-image.sh
. "$ROOT/scripts/lib-image.sh"

need_root
for tool in readelf xz dpkg-deb apt-get apt-cache od; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool is required"
done
mkdir -p "$CACHE/debs" "$OUT" "$GUEST_CACHE/debs"

# --- 1. Debian packages (cached) --------------------------------------------

newest_kernel amd64 generic

KDEB=$(fetch_deb "$CACHE/debs" "$KPKG")
BDEB=$(fetch_deb "$GUEST_CACHE/debs" busybox-static)
extract "$KDEB" "$CACHE/kernel"
extract "$BDEB" "$CACHE/busybox"
BUSYBOX="$CACHE/busybox/bin/busybox"
[ -x "$BUSYBOX" ] || die "busybox-static has no bin/busybox"

# User space: the named packages and every library package they depend on
# (apt's dependency closure, library packages only), extracted into one pool.
# What goes into the image is picked from the pool by DT_NEEDED below.
fill_pool "$CACHE/debs" "$CACHE/packages.txt" "$CACHE/pool" \
	perftest libibverbs1 ibverbs-providers librdmacm1 iproute2 rdmacm-utils libucx0 ucx-utils
pool_key=$POOL_KEY

# --- 2. vmlinux (uncompressed, for PVH boot) ---------------------------------

VMLINUZ="$CACHE/kernel/boot/vmlinuz-$KVER"
[ -f "$VMLINUZ" ] || die "$KDEB has no boot/vmlinuz-$KVER"
if [ ! -f "$OUT/vmlinux" ] || [ ! -f "$OUT/.vmlinux.from" ] ||
	[ "$(cat "$OUT/.vmlinux.from")" != "$(basename "$KDEB")" ]; then
	# Byte offsets of the xz stream magic fd 37 7a 58 5a 00; the first one
	# that decompresses to an ELF is the kernel.
	offsets=$(LC_ALL=C grep -obUaP '\xfd\x37\x7a\x58\x5a\x00' "$VMLINUZ" | cut -d: -f1 | head -4 || true)
	[ -n "$offsets" ] || die "$VMLINUZ has no xz stream"
	ok=0
	for off in $offsets; do
		rm -f "$OUT/vmlinux.tmp"
		# xz complains about the trailing bzImage bytes after the stream; the
		# ELF check below decides.
		tail -c +$((off + 1)) "$VMLINUZ" | xz -dc >"$OUT/vmlinux.tmp" 2>/dev/null || true
		if [ "$(head -c 4 "$OUT/vmlinux.tmp" | od -A n -t x1 | tr -d ' \n')" = 7f454c46 ]; then
			ok=1
			break
		fi
	done
	[ "$ok" = 1 ] || die "no xz stream in $VMLINUZ decompresses to an ELF"
	readelf -n "$OUT/vmlinux.tmp" 2>/dev/null | grep -qi 'xen' ||
		die "$KVER vmlinux has no Xen/PVH ELF note; QEMU cannot boot it with -kernel"
	mv "$OUT/vmlinux.tmp" "$OUT/vmlinux"
	basename "$KDEB" >"$OUT/.vmlinux.from"
	say "bin/rxe/vmlinux <- $KVER ($(du -h "$OUT/vmlinux" | cut -f1))"
fi

# --- 3. initramfs (rebuilt only when an input changed) ------------------------

module_index "$CACHE/kernel/lib/modules/$KVER"
STAMP="$OUT/.initramfs.inputs"
inputs=$(input_hashes "$BUSYBOX" "$ROOT/guest/rxe-init" "$ROOT/guest/perftest-jobs" "${BASH_SOURCE[0]}")
inputs="$inputs $(basename "$KDEB") $pool_key"
if up_to_date "$OUT/initramfs.img" "$STAMP" "$inputs"; then
	say "bin/rxe/initramfs.img is up to date"
	exit 0
fi

new_stage "$BUSYBOX" bin sbin usr/bin usr/sbin dev proc sys tmp run etc root lib/modules lib64 lib/x86_64-linux-gnu

# Modules: the wanted ones after their dependencies, listed in load order
# in /lib/modules/load-order (scripts/lib-image.sh).
module_order crc32_generic virtio_pci virtio_net ib_core ib_uverbs rdma_ucm rdma_rxe
stage_modules

# User space: the programs, the rxe verbs provider (dlopened by libibverbs,
# found through /etc/libibverbs.d/rxe.driver) and, by DT_NEEDED, every
# shared library they need, plus the dynamic loader. PERFTEST are the
# perftest programs guest/perftest-jobs' jobs run (ib_atomic_bw serves both
# atomic_bw and atomic_cs_bw); make compare-rxe uses write_bw, read_bw,
# write_lat and send_lat, tests/rxe_capture_test.go also send_bw and the
# atomics.
PERFTEST=(ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw ib_write_lat ib_read_lat ib_send_lat)
# The middleware rows of make compare-rxe (UCX's ucx_perftest; ib_send_lat
# -R connects through rdma_cm, whose modules come with rdma_ucm) and
# librdmacm's example programs (tests/roce_cm_interop_test.go: rping,
# ucmatose, udaddy against a vrdma guest).
MIDDLEWARE=(ucx_perftest ucx_info rping ucmatose udaddy)
stage_elfs "${PERFTEST[@]/#/usr/bin/}" "${MIDDLEWARE[@]/#/usr/bin/}" \
	usr/bin/rdma usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so \
	usr/lib/x86_64-linux-gnu/libibverbs.so.1
# UCX's transports are plugins (libuct_ib: rc_verbs, ud_verbs), linked to
# each other through their RUNPATH, the plugin directory.
LIBDIRS="$LIBDIRS usr/lib/x86_64-linux-gnu/ucx"
stage_plugin_dirs usr/lib/x86_64-linux-gnu/ucx
[ -e "$STAGE/usr/lib/x86_64-linux-gnu/ucx/libuct_ib.so.0" ] || die "image lacks UCX's libuct_ib"
# glibc dlopens libgcc_s.so.1 for pthread_exit and thread cancellation
# (rping's threads exit that way): no DT_NEEDED names it.
stage_elfs lib/x86_64-linux-gnu/libgcc_s.so.1
stage_closure
mkdir -p "$STAGE/etc/libibverbs.d"
cp "$POOL/etc/libibverbs.d/rxe.driver" "$STAGE/etc/libibverbs.d/"
for f in "${PERFTEST[@]}" "${MIDDLEWARE[@]}" rdma; do
	[ -x "$STAGE/usr/bin/$f" ] || die "image lacks $f"
done

# The perftest job runner rxe-init runs (shared with the stack image).
install -m 0755 "$ROOT/guest/perftest-jobs" "$STAGE/usr/bin/perftest-jobs"

stage_base "$ROOT/guest/rxe-init"
printf '127.0.0.1 localhost\n' >"$STAGE/etc/hosts"
pack_initramfs "$OUT/initramfs.img" "$STAMP" "$inputs"
say "bin/rxe/initramfs.img ($(du -h "$OUT/initramfs.img" | cut -f1)): busybox, /init, ${#ORDER[@]} modules, perftest, UCX, librdmacm's tools, rdma; kernel $KVER"
