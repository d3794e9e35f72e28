#!/usr/bin/env bash
# Guest image with the standard RDMA stack: bin/guest-stack/vmlinuz (Debian's
# 6.1 cloud kernel, the one bin/guest-stack/vrdma.ko was built against) and
# bin/guest-stack/initramfs.img: busybox, guest/stack-init as /init, the
# kernel modules in load order (virtio-pci, virtio-net, ib_core, ib_uverbs
# and vrdma.ko last), and from Debian packages with every shared library they
# load: libibverbs1, ibverbs-utils (ibv_devices, ibv_devinfo, ibv_*_pingpong),
# perftest (ib_{write,read,send,atomic}_{bw,lat}), iproute2 (ip, ss, rdma, tc),
# strace and dash (/bin/sh); the middleware (issue 27): UCX (libucx0 and its
# transport plugins, ucx-utils: ucx_info, ucx_perftest), Open MPI 4.1
# (openmpi-bin: mpirun, orted, ompi_info, with its MCA plugins, help texts and
# /etc/openmpi, and PMIx's plugins), rdmacm-utils (rping, ucmatose, udaddy,
# rdma_server/rdma_client, riostream, rstream, mckey) and libfabric-bin
# (fi_info, fi_pingpong); the connection managers' modules (ib_cm, iw_cm,
# rdma_cm, rdma_ucm); plus the vrdma provider (libvrdma-rdmav34.so and
# vrdma.driver), guest/vrdma-perftest (/usr/bin/vrdma-perftest),
# guest/vrdma-middleware with guest/vrdma-rsh and guest/vrdma-rshd (Open MPI's
# remote shell between two guests), guest/mpi/vrdma_mpi_check.c built with
# Debian's mpicc (/usr/bin/vrdma-mpi-check; libopenmpi-dev is installed on
# the build host when mpicc is missing) and guest/perftest-jobs
# (/usr/bin/perftest-jobs, make compare-rxe's job runner, shared with the rxe
# image). About 17 MiB gzip'd, 40 MiB unpacked: the default 512 MiB of guest
# RAM holds it, and UCX's and Open MPI's buffers, with room to spare.
# Built from Debian packages only, as root. `vrdma-vmtest exec` boots it.
#
#   bash scripts/guest-stack-image.sh      # (re)build what is missing or stale
#
# Inputs made by the project, all in bin/guest-stack/:
#   vrdma.ko              scripts/guest-kmod.sh (guest/kernel)
#   libvrdma-rdmav34.so   scripts/guest-provider.sh (guest/rdma-core)
#   vrdma.driver          scripts/guest-provider.sh
# A missing one is an error, unless VRDMA_STACK_ALLOW_MISSING=1: then the
# image is built without it (for trying the image and the harness before
# the driver and the provider exist; stack-init says what is missing).
#
# The kernel is the one vrdma.ko's vermagic names (without vrdma.ko: the
# newest linux-image-6.1.0-N-cloud-amd64, as scripts/guest-image.sh picks).
# The .debs are cached in ~/.cache/vrdma/stack (linked from the guest and
# rxe caches when they have them already); nothing is rebuilt when no input
# changed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VRDMA_CACHE="${HOME:-/root}/.cache/vrdma"
CACHE="$VRDMA_CACHE/stack"
OUT="$ROOT/bin/guest-stack"
IMAGE=guest-stack-image
# shellcheck source=scripts/lib-image.sh
. "$ROOT/scripts/lib-image.sh"

need_root
for tool in readelf dpkg-deb apt-get apt-cache sha256sum chroot; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool is required"
done
mkdir -p "$CACHE/debs" "$OUT"
export DEB_REUSE_DIRS="$VRDMA_CACHE/guest/debs $VRDMA_CACHE/rxe/debs"

# --- 0. the project's parts -----------------------------------------------------

KO="$OUT/vrdma.ko"
PROVIDER="$OUT/libvrdma-rdmav34.so"
DRIVER="$OUT/vrdma.driver"
ALLOW_MISSING=${VRDMA_STACK_ALLOW_MISSING:-0}
have_ko=0 have_provider=0
[ -f "$KO" ] && have_ko=1
[ -f "$PROVIDER" ] && [ -f "$DRIVER" ] && have_provider=1
if [ "$ALLOW_MISSING" != 1 ]; then
	[ "$have_ko" = 1 ] ||
		die "bin/guest-stack/vrdma.ko is missing: build it with scripts/guest-kmod.sh (or set VRDMA_STACK_ALLOW_MISSING=1 for an image without it)"
	[ "$have_provider" = 1 ] ||
		die "bin/guest-stack/libvrdma-rdmav34.so or vrdma.driver is missing: build them with scripts/guest-provider.sh (or set VRDMA_STACK_ALLOW_MISSING=1 for an image without them)"
fi
[ "$have_ko" = 1 ] || say "WARNING: building without vrdma.ko (VRDMA_STACK_ALLOW_MISSING=1)"
[ "$have_provider" = 1 ] || say "WARNING: building without the vrdma provider (VRDMA_STACK_ALLOW_MISSING=1)"

# --- 1. Debian packages (cached) -------------------------------------------------

if [ "$have_ko" = 1 ]; then
	# "6.1.0-57-cloud-amd64 SMP mod_unload modversions "
	vermagic=$(modinfo_field "$KO" vermagic)
	KVER=${vermagic%% *}
	[ -n "$KVER" ] || die "$KO has no vermagic in its .modinfo; is it a kernel module?"
	case "$KVER" in
	*-cloud-amd64) ;;
	*) die "$KO is built for $KVER; the stack image boots Debian's cloud kernel (linux-headers-6.1.0-N-cloud-amd64)" ;;
	esac
	KPKG=linux-image-$KVER
	[ -n "$(apt-cache show --no-all-versions "$KPKG" 2>/dev/null | head -1)" ] || apt-get update -qq
else
	newest_kernel cloud-amd64 cloud
fi
KDEB=$(fetch_deb "$CACHE/debs" "$KPKG")
BDEB=$(fetch_deb "$CACHE/debs" busybox-static)
extract "$KDEB" "$CACHE/kernel"
extract "$BDEB" "$CACHE/busybox"
BUSYBOX="$CACHE/busybox/bin/busybox"
[ -x "$BUSYBOX" ] || die "busybox-static has no bin/busybox"
VMLINUZ="$CACHE/kernel/boot/vmlinuz-$KVER"
[ -f "$VMLINUZ" ] || die "$KDEB has no boot/vmlinuz-$KVER"

# User space: the named packages and every library package they depend on,
# extracted into one pool; the image takes the programs below and, by
# DT_NEEDED, the libraries they load. ibverbs-providers is there for
# libmlx5.so.1, which perftest links; none of its providers is installed
# (no .driver file), so libibverbs only ever loads the vrdma provider.
# The middleware (issue 27): UCX (libucx0, ucx-utils), Open MPI over UCX
# (openmpi-bin, its libraries, MCA plugins and help texts, PMIx), librdmacm's
# example programs (rdmacm-utils) and libfabric's tools (libfabric-bin).
fill_pool "$CACHE/debs" "$CACHE/packages.txt" "$CACHE/pool" \
	libibverbs1 ibverbs-utils perftest librdmacm1 ibverbs-providers iproute2 strace dash \
	rdmacm-utils libucx0 ucx-utils openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15 \
	libfabric1 libfabric-bin
# libfabric and Open MPI's InfiniPath MTL link libpsm_infinipath.so.1, a
# name that libpsm-infinipath1's postinst makes (an alternative): make it
# as dpkg would have.
psm=""
for f in "$POOL"/usr/lib/libpsm1/libpsm_infinipath.so.1.*; do
	[ -f "$f" ] && psm=${f#"$POOL"}
done
[ -n "$psm" ] || die "libpsm-infinipath1 has no usr/lib/libpsm1/libpsm_infinipath.so.1.*"
ln -sfn "$psm" "$POOL/usr/lib/x86_64-linux-gnu/libpsm_infinipath.so.1"

# --- 2. vmlinuz ------------------------------------------------------------------

if ! cmp -s "$VMLINUZ" "$OUT/vmlinuz"; then
	cp "$VMLINUZ" "$OUT/vmlinuz.tmp"
	mv "$OUT/vmlinuz.tmp" "$OUT/vmlinuz"
	say "bin/guest-stack/vmlinuz <- $KVER"
fi

# --- 3. initramfs (rebuilt only when an input changed) -----------------------------

module_index "$CACHE/kernel/lib/modules/$KVER"
if [ "$have_ko" = 1 ]; then
	want=$(modinfo_field "${MOD_PATH[ib_core]}" vermagic)
	[ "$vermagic" = "$want" ] ||
		die "vrdma.ko's vermagic \"$vermagic\" differs from the kernel's \"$want\"; rebuild it against linux-headers-$KVER"
fi

# The MPI program the image ships (guest/mpi/vrdma_mpi_check.c), built here
# with Debian's mpicc (libopenmpi-dev, installed when missing) against the
# Open MPI the image carries; rebuilt when its source changes.
MPI_SRC="$ROOT/guest/mpi/vrdma_mpi_check.c"
MPI_BIN="$CACHE/mpi/vrdma-mpi-check"
if ! command -v mpicc >/dev/null 2>&1; then
	say "apt-get install libopenmpi-dev (for mpicc)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends libopenmpi-dev >&2 || {
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends libopenmpi-dev >&2
	}
	command -v mpicc >/dev/null 2>&1 || die "libopenmpi-dev installed no mpicc"
fi
mpi_key="$(sha256sum "$MPI_SRC" | cut -d' ' -f1) $(dpkg-query -W -f '${Version}' libopenmpi-dev 2>/dev/null)"
if [ ! -x "$MPI_BIN" ] || [ "$(cat "$MPI_BIN.key" 2>/dev/null)" != "$mpi_key" ]; then
	mkdir -p "$CACHE/mpi"
	say "mpicc guest/mpi/vrdma_mpi_check.c"
	mpicc -O2 -g0 -Wall -Wextra -Werror -o "$MPI_BIN.tmp" "$MPI_SRC"
	mv "$MPI_BIN.tmp" "$MPI_BIN"
	printf '%s' "$mpi_key" >"$MPI_BIN.key"
fi

STAMP="$OUT/.initramfs.inputs"
PERFTEST_SCRIPT="$ROOT/guest/vrdma-perftest"
MIDDLEWARE_SCRIPTS=("$ROOT/guest/vrdma-middleware" "$ROOT/guest/vrdma-rsh" "$ROOT/guest/vrdma-rshd")
files=("$BUSYBOX" "$ROOT/guest/stack-init" "$ROOT/guest/perftest-jobs" "${BASH_SOURCE[0]}"
	"$MPI_BIN" "${MIDDLEWARE_SCRIPTS[@]}")
[ -f "$PERFTEST_SCRIPT" ] && files+=("$PERFTEST_SCRIPT")
[ "$have_ko" = 1 ] && files+=("$KO")
[ "$have_provider" = 1 ] && files+=("$PROVIDER" "$DRIVER")
MWCHECK="$OUT/vrdma-mw-check"
[ -f "$MWCHECK" ] && files+=("$MWCHECK")
inputs="$(input_hashes "${files[@]}") ko=$have_ko provider=$have_provider $(basename "$KDEB") $POOL_KEY"
if up_to_date "$OUT/initramfs.img" "$STAMP" "$inputs"; then
	say "bin/guest-stack/initramfs.img is up to date"
	exit 0
fi

new_stage "$BUSYBOX" bin sbin usr/bin usr/sbin dev proc sys tmp run etc root var/tmp \
	lib/modules lib64 lib/x86_64-linux-gnu etc/libibverbs.d usr/lib/x86_64-linux-gnu/libibverbs

# Modules: the wanted ones after their dependencies (lib-image.sh), vrdma.ko
# last; /init loads /lib/modules/load-order.
# The connection managers (ib_cm, iw_cm, rdma_cm and rdma_ucm, librdmacm's
# kernel side): before vrdma, so that they are there when it registers.
module_order virtio_pci virtio_net ib_core ib_uverbs ib_cm iw_cm rdma_cm rdma_ucm
if [ "$have_ko" = 1 ]; then
	module_add vrdma "$KO"
	module_order vrdma
fi
stage_modules
# The kernel's storage protocols over RDMA, staged but not loaded at boot:
# NVMe over RDMA's host (nvme-rdma) and target (nvmet-rdma) and a RAM disk
# (brd) for the target's namespace, each after the modules it needs that
# the boot did not load; the nvmeof suite loads /lib/modules/extra/load-order.
BOOT_ORDER=("${ORDER[@]}")
ORDER=()
module_order nvme_rdma nvmet_rdma brd
EXTRA_ORDER=("${ORDER[@]}")
ORDER=("${BOOT_ORDER[@]}")
mkdir -p "$STAGE/lib/modules/extra"
: >"$STAGE/lib/modules/extra/load-order"
for m in "${EXTRA_ORDER[@]}"; do
	cp "${MOD_PATH[$m]}" "$STAGE/lib/modules/extra/$m.ko"
	echo "$m" >>"$STAGE/lib/modules/extra/load-order"
done

# Programs: every verbs utility and perftest's RDMA tests (not its raw
# Ethernet ones), iproute2's ip, ss, rdma and tc (in place of busybox's ip
# and tc applets), strace, and dash as /bin/sh: the shell the command runs
# in, which (unlike busybox's sh, which /init keeps) finds programs by PATH
# rather than preferring busybox's applets of the same name.
progs=()
for f in "$POOL"/usr/bin/ibv_* "$POOL"/usr/bin/ib_*_bw "$POOL"/usr/bin/ib_*_lat; do
	[ -f "$f" ] && progs+=("${f#"$POOL"/}")
done
progs+=(bin/ip sbin/ip bin/ss usr/bin/rdma sbin/tc usr/bin/strace bin/dash bin/sh)
# The middleware: UCX's tools, Open MPI's launcher (mpirun is orterun; the
# alternatives link Debian's postinst makes is made below) and its daemon,
# librdmacm's example programs and libfabric's tools.
progs+=(usr/bin/ucx_info usr/bin/ucx_perftest
	usr/bin/orterun usr/bin/mpirun.openmpi usr/bin/mpiexec.openmpi usr/bin/orted usr/bin/ompi_info
	usr/bin/rping usr/bin/ucmatose usr/bin/udaddy usr/bin/rdma_server usr/bin/rdma_client
	usr/bin/riostream usr/bin/rstream usr/bin/mckey
	usr/bin/fi_info usr/bin/fi_pingpong usr/bin/fi_strerror)
stage_elfs "${progs[@]}"
[ "$(readlink "$STAGE/bin/sh")" = dash ] || die "/bin/sh is not dash"

# Plugins: UCX loads its transports (libuct_ib: rc_verbs, ud_verbs, dc;
# libuct_rdmacm; libuct_cma), Open MPI its MCA components and PMIx its own
# with dlopen, so no DT_NEEDED names them: the whole plugin directories go
# in, and their libraries by DT_NEEDED. hwloc's plugins stay out (GL,
# OpenCL, libxml, PCI: hwloc's built-in Linux discovery is all Open MPI
# needs in a guest).
# UCX's plugins link each other (libuct_rdmacm needs libuct_ib) through
# their RUNPATH, the plugin directory: the closure looks there too.
LIBDIRS="$LIBDIRS usr/lib/x86_64-linux-gnu/ucx"
stage_plugin_dirs usr/lib/x86_64-linux-gnu/ucx usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3 \
	usr/lib/x86_64-linux-gnu/pmix2/lib/pmix usr/lib/x86_64-linux-gnu/libfabric
plugins=("${PLUGINS[@]}")
for p in ucx/libuct_ib.so.0 openmpi/lib/openmpi3/mca_pml_ucx.so openmpi/lib/openmpi3/mca_plm_rsh.so; do
	[ -e "$STAGE/usr/lib/x86_64-linux-gnu/$p" ] || die "image lacks /usr/lib/x86_64-linux-gnu/$p"
done
# Data files the middleware reads at run time: Open MPI's help texts and
# its default MCA parameters (Debian's turn the UCX PML off unless asked:
# the tests ask, --mca pml ucx), PMIx's.
while IFS= read -r f; do
	copy_file "${f#"$POOL"/}"
done < <(find "$POOL/usr/share/openmpi" "$POOL/etc/openmpi" "$POOL/usr/lib/x86_64-linux-gnu/pmix2/share" \
	\( -type f -o -type l \) ! -name '*.tcl' ! -name '*.supp' ! -name '*wrapper-data.txt' | sort)
ln -sfn mpirun.openmpi "$STAGE/usr/bin/mpirun"
ln -sfn mpiexec.openmpi "$STAGE/usr/bin/mpiexec"

# The provider: dlopened by libibverbs from its provider directory, named
# by /etc/libibverbs.d/vrdma.driver ("driver vrdma").
if [ "$have_provider" = 1 ]; then
	readelf -h "$PROVIDER" 2>/dev/null | grep -q 'DYN (Shared object file)' ||
		die "$PROVIDER is not a shared object"
	# The private ABI it was built for must be the one Debian's libibverbs
	# exports (IBVERBS_PRIVATE_34 in 44.0).
	abi=$(readelf -V "$PROVIDER" 2>/dev/null | grep -o 'IBVERBS_PRIVATE_[0-9]*' | sort -u | head -1)
	libv=$(find_lib libibverbs.so.1) || die "the pool has no libibverbs.so.1"
	if [ -n "$abi" ] && ! readelf -V "$POOL/$libv" 2>/dev/null | grep -q "Name: $abi\$"; then
		die "$PROVIDER needs $abi; Debian's libibverbs exports $(readelf -V "$POOL/$libv" | grep -o 'IBVERBS_PRIVATE_[0-9]*' | sort -u | tr '\n' ' ')"
	fi
	install -m 0644 "$PROVIDER" "$STAGE/usr/lib/x86_64-linux-gnu/libibverbs/libvrdma-rdmav34.so"
	install -m 0644 "$DRIVER" "$STAGE/etc/libibverbs.d/vrdma.driver"
	# The memory-window check (guest/mwcheck, scripts/guest-provider.sh).
	if [ -f "$MWCHECK" ]; then
		install -m 0755 "$MWCHECK" "$STAGE/usr/bin/vrdma-mw-check"
		stage_elfs --from-host "$MWCHECK"
	fi
	stage_elfs --from-host "$PROVIDER"
fi
install -m 0755 "$MPI_BIN" "$STAGE/usr/bin/vrdma-mpi-check"
stage_elfs --from-host "$MPI_BIN"
# glibc dlopens libgcc_s.so.1 for pthread_exit and thread cancellation
# (rping's threads exit that way): no DT_NEEDED names it.
stage_elfs lib/x86_64-linux-gnu/libgcc_s.so.1
stage_closure

# Every program and the provider must find all its libraries in the image:
# ask the image's own dynamic loader, inside the stage.
check=("${progs[@]}" "${plugins[@]}" usr/bin/vrdma-mpi-check)
[ "$have_provider" = 1 ] && check+=(usr/lib/x86_64-linux-gnu/libibverbs/libvrdma-rdmav34.so)
for rel in "${check[@]}"; do
	[ -e "$STAGE/$rel" ] || die "image lacks $rel"
	out=$(chroot "$STAGE" /lib64/ld-linux-x86-64.so.2 --list "/$rel" 2>&1) || die "/$rel does not link in the image: $out"
	if grep -q 'not found' <<<"$out"; then
		die "/$rel does not link in the image: $(grep 'not found' <<<"$out" | tr '\n' ' ')"
	fi
done
for f in ibv_devices ibv_devinfo ibv_rc_pingpong ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw \
	ib_write_lat ib_send_lat ib_read_lat strace rdma; do
	[ -x "$STAGE/usr/bin/$f" ] || die "image lacks /usr/bin/$f"
done

# The end-to-end tests' perftest driver (a dash script).
[ -f "$PERFTEST_SCRIPT" ] && install -m 0755 "$PERFTEST_SCRIPT" "$STAGE/usr/bin/vrdma-perftest"
# The middleware suites' driver, and the remote shell mpirun starts its
# daemon on the other guest with (guest/vrdma-rsh says why).
for f in "${MIDDLEWARE_SCRIPTS[@]}"; do
	install -m 0755 "$f" "$STAGE/usr/bin/${f##*/}"
done
# make compare-rxe's perftest job runner (the rxe image has it too).
install -m 0755 "$ROOT/guest/perftest-jobs" "$STAGE/usr/bin/perftest-jobs"

stage_base "$ROOT/guest/stack-init"
printf '127.0.0.1 localhost\n' >"$STAGE/etc/hosts"
pack_initramfs "$OUT/initramfs.img" "$STAMP" "$inputs"
what="${#ORDER[@]} modules (${ORDER[*]}), ${#progs[@]} programs"
[ "$have_provider" = 1 ] && what="$what, the vrdma provider" || what="$what, NO vrdma provider"
[ "$have_ko" = 1 ] || what="$what, NO vrdma.ko"
say "bin/guest-stack/initramfs.img ($(du -h "$OUT/initramfs.img" | cut -f1)): busybox, /init, $what; kernel $KVER"
