#!/usr/bin/env bash
# qemu-build.sh builds the patched QEMU that vrdma attaches its device to.
#
# Upstream QEMU 10.0 has no device for vrdma: its generic vhost-user
# front-end (vhost-user-device-pci) is not user-creatable, and it has no
# virtio name for device ID 42. This script fetches Debian's QEMU 10.0.2
# source tarball from bookworm-backports, applies vmm/qemu/patches/*.patch
# (0003 adds the named device vhost-user-rdma-pci), builds only
# qemu-system-x86_64, caches the binary outside the checkout and leaves a copy
# in <repo>/bin/qemu-system-x86_64 (scripts/deb.sh packages it as vrdma-qemu).
#
# The source is pinned by checksum (QEMU_TARBALL_SHA256): a cached tarball is
# used only if it matches, and works offline; a new one comes from
# bookworm-backports while it serves 10.0.2, else (backports moved on to a
# newer 10.0.x or to 10.2, which is said loudly) from the mirror's pool and
# then snapshot.debian.org, always checked against the pin.
#
# Usage (as root):  scripts/qemu-build.sh [fetch|check]
#   fetch   only install the build dependencies and download the source tarball
#   check   say whether bookworm-backports still serves the pinned source (exit 1
#           if it moved on); needs no root and builds nothing
#
# Environment:
#   JOBS=N              parallel build jobs (default: 2)
#   VRDMA_CACHE=DIR     cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/vrdma)
#   KEEP_BUILD=1        keep the extracted build tree after a successful build
#
# Idempotent: a second run with a warm cache checks the dependencies, finds the
# cached binary and copies it to bin/ in a few seconds.
set -euo pipefail

readonly QEMU_VERSION=10.0.2
readonly QEMU_TARBALL="qemu_${QEMU_VERSION}+ds.orig.tar.xz"
# The pinned source: Debian's orig tarball of QEMU 10.0.2 as bookworm-backports
# served it (39449628 bytes; the same SHA-256 its signed Sources index lists).
# The SHA-1 names the file in snapshot.debian.org's store of every file Debian
# ever shipped.
readonly QEMU_TARBALL_SHA256=0901da33844a331bf8b3602b9c1fbd178e60b737c8e3ade678255bd090c9b9f1
readonly QEMU_TARBALL_SHA1=0da721835b445ce31e3d69631ac878ebe218a6af
readonly QEMU_POOL_PATH="pool/main/q/qemu/qemu_${QEMU_VERSION}%2bds.orig.tar.xz"
readonly SNAPSHOT_URL="https://snapshot.debian.org/file/$QEMU_TARBALL_SHA1"

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly REPO_ROOT
readonly PATCH_DIR="$REPO_ROOT/vmm/qemu/patches"
readonly CACHE_ROOT="${VRDMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vrdma}/qemu"
readonly JOBS="${JOBS:-2}"

# The configure line. It is part of the cache key: change it and the cache
# misses. The firmware path lets the binary find SeaBIOS (package seabios),
# the option ROMs (package qemu-system-data: kvmvapic.bin, linuxboot_dma.bin
# for -kernel) and the NICs' boot ROMs (package ipxe-qemu: efi-virtio.rom,
# which a virtio-net-pci without romfile= needs, as libvirt's <interface>
# gives it) without -L, where Debian's QEMU finds them; --prefix=/usr makes
# /usr/share/qemu the data directory (keymaps, option ROMs), and
# --disable-relocatable keeps those paths absolute (a relocatable QEMU looks
# for ../share/... next to wherever the binary is copied). The system python
# is named because meson and pycotap are installed for it, not for whatever
# python3 comes first in PATH (pyenv, venvs).
readonly CONFIGURE_ARGS=(
	--python=/usr/bin/python3
	--prefix=/usr
	--disable-relocatable
	--firmwarepath=/usr/share/seabios:/usr/share/qemu:/usr/lib/ipxe/qemu
	--target-list=x86_64-softmmu
	--without-default-features
	--enable-tcg
	--enable-kvm
	--enable-vhost-user
	--disable-docs
	--disable-install-blobs
)

# Packages needed to run the binary and to build it. meson and python3-pycotap
# come from bookworm-backports (meson >= 1.5 is required by QEMU 10).
readonly RUNTIME_DEPS=(seabios qemu-system-data ipxe-qemu libglib2.0-0 libpixman-1-0 libfdt1 zlib1g)
readonly BUILD_DEPS=(ninja-build python3-venv pkg-config libglib2.0-dev libpixman-1-dev
	libfdt-dev zlib1g-dev flex bison xz-utils patch gcc make curl ca-certificates)
readonly BACKPORTS_DEPS=(meson python3-pycotap)
readonly MESON_MIN=1.5

log() { printf '==> %s\n' "$*" >&2; }
die() {
	printf 'qemu-build: error: %s\n' "$*" >&2
	exit 1
}
run() {
	printf '+ %s\n' "$*" >&2
	"$@"
}

BPO_APT_DIR="$CACHE_ROOT/apt"
# The private apt configuration for bookworm-backports (codename,
# find_mirror, setup_backports_apt, APT_COMMON, APT_PRIVATE, SUITE_BPO,
# BPO_MIRROR).
# shellcheck source=lib-backports.sh
. "$REPO_ROOT/scripts/lib-backports.sh"

missing_pkgs() {
	local p status
	for p in "$@"; do
		status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
		if [[ "$status" != installed ]]; then
			printf '%s\n' "$p"
		fi
	done
}

meson_ok() {
	command -v meson >/dev/null 2>&1 || return 1
	local v
	v=$(meson --version 2>/dev/null) || return 1
	[[ "$(printf '%s\n%s\n' "$MESON_MIN" "$v" | sort -V | head -n 1)" == "$MESON_MIN" ]]
}

ensure_runtime_deps() {
	local missing
	mapfile -t missing < <(missing_pkgs "${RUNTIME_DEPS[@]}")
	if ((${#missing[@]} > 0)); then
		log "installing runtime packages: ${missing[*]}"
		run apt-get "${APT_COMMON[@]}" update
		run env DEBIAN_FRONTEND=noninteractive apt-get "${APT_COMMON[@]}" install --no-install-recommends "${missing[@]}"
	else
		log "runtime packages present: ${RUNTIME_DEPS[*]}"
	fi
}

ensure_build_deps() {
	local missing bpo=() p
	mapfile -t missing < <(missing_pkgs "${BUILD_DEPS[@]}")
	if ! meson_ok; then
		bpo+=(meson)
	fi
	for p in $(missing_pkgs python3-pycotap); do
		bpo+=("$p")
	done
	if ((${#missing[@]} == 0 && ${#bpo[@]} == 0)); then
		log "build packages present (meson $(meson --version))"
		return
	fi
	setup_backports_apt
	local pkgs=("${missing[@]}")
	for p in "${bpo[@]}"; do
		pkgs+=("$p/$SUITE_BPO")
	done
	log "installing build packages: ${pkgs[*]}"
	run env DEBIAN_FRONTEND=noninteractive apt-get "${APT_COMMON[@]}" "${APT_PRIVATE[@]}" \
		install --no-install-recommends "${pkgs[@]}"
	meson_ok || die "meson >= $MESON_MIN is required, have $(meson --version 2>/dev/null || echo none)"
}

# tarball_ok FILE: FILE is the pinned source tarball.
tarball_ok() {
	[[ -s "$1" ]] && [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$QEMU_TARBALL_SHA256" ]]
}

# served_tarball prints the name of the qemu orig tarball that
# bookworm-backports serves now (its Sources index), or nothing.
served_tarball() {
	setup_backports_apt
	# Lines look like: 'URI' qemu_10.0.2+ds.orig.tar.xz 39449628 SHA256:...
	apt-get "${APT_PRIVATE[@]}" source --print-uris "qemu/$SUITE_BPO" 2>/dev/null |
		awk '$2 ~ /^qemu_.*\.orig\.tar\./ { print $2; exit }' || true
}

# fetch_source prints the path of the pinned source tarball in
# $CACHE_ROOT/downloads, fetching it when the cache has no good copy: with
# apt-get source while bookworm-backports serves it, else by its checksum
# from the mirror's pool and from snapshot.debian.org.
fetch_source() {
	local dl="$CACHE_ROOT/downloads"
	local tarball="$dl/$QEMU_TARBALL"
	if [[ -e "$tarball" ]]; then
		if tarball_ok "$tarball"; then
			log "source tarball cached, sha256 matches the pin: $tarball"
			printf '%s\n' "$tarball"
			return
		fi
		log "cached $QEMU_TARBALL does not match the pinned sha256: kept as $tarball.bad, fetching again"
		mv -f "$tarball" "$tarball.bad"
	fi
	mkdir -p "$dl"
	setup_backports_apt
	local served
	served=$(served_tarball)
	if [[ "$served" != "$QEMU_TARBALL" ]]; then
		log "NOTE: $SUITE_BPO now serves ${served:-no qemu source}, not $QEMU_TARBALL (QEMU $QEMU_VERSION, which vmm/qemu/patches target);" \
			"fetching the pinned tarball by checksum from $BPO_MIRROR/pool, then snapshot.debian.org"
	fi
	local from
	for from in apt pool snapshot; do
		case "$from" in
		apt)
			[[ "$served" == "$QEMU_TARBALL" ]] || continue
			# The .dsc may 404 on some mirrors; the tarball is all we need,
			# so the exit status does not matter, only the checksum.
			(cd "$dl" && run apt-get "${APT_PRIVATE[@]}" source --download-only "qemu/$SUITE_BPO" >&2) ||
				log "apt-get source reported an error; checking the tarball anyway"
			;;
		pool)
			run curl -fL --connect-timeout 20 --retry 2 -o "$tarball" "$BPO_MIRROR/$QEMU_POOL_PATH" >&2 || true
			;;
		snapshot)
			run curl -fL --connect-timeout 20 --retry 2 -o "$tarball" "$SNAPSHOT_URL" >&2 || true
			;;
		esac
		if tarball_ok "$tarball"; then
			log "sha256 verified ($from): $QEMU_TARBALL_SHA256"
			printf '%s\n' "$tarball"
			return
		fi
		[[ -e "$tarball" ]] && log "$from: $QEMU_TARBALL does not match the pinned sha256; discarded"
		rm -f "$tarball"
	done
	die "cannot get $QEMU_TARBALL (sha256 $QEMU_TARBALL_SHA256): $SUITE_BPO serves ${served:-no qemu source}, and neither $BPO_MIRROR/$QEMU_POOL_PATH nor $SNAPSHOT_URL gave it; put the file into $dl, or port vmm/qemu/patches to the served QEMU and update QEMU_VERSION and the checksums in $0"
}

# check_source says whether bookworm-backports still serves the pinned
# source; exit status 1 if it moved on.
check_source() {
	local served
	setup_backports_apt
	served=$(served_tarball)
	if [[ "$served" == "$QEMU_TARBALL" ]]; then
		printf 'qemu-build: %s serves the pinned %s (sha256 %s)\n' "$SUITE_BPO" "$QEMU_TARBALL" "$QEMU_TARBALL_SHA256"
		return 0
	fi
	local cached="no cached copy"
	tarball_ok "$CACHE_ROOT/downloads/$QEMU_TARBALL" && cached="a verified copy is cached in $CACHE_ROOT/downloads"
	printf 'qemu-build: %s serves %s, not the pinned %s; %s\n' "$SUITE_BPO" "${served:-no qemu source}" "$QEMU_TARBALL" "$cached"
	return 1
}

patches() {
	local p=()
	shopt -s nullglob
	p=("$PATCH_DIR"/*.patch)
	shopt -u nullglob
	((${#p[@]} > 0)) || die "no patches in $PATCH_DIR"
	printf '%s\n' "${p[@]}"
}

cache_key() {
	local p
	{
		while read -r p; do cat "$p"; done < <(patches)
		printf '%s\n' "${CONFIGURE_ARGS[@]}" "unpack_edk2_blobs = false"
	} | sha256sum | cut -c1-12
}

# smoke_test checks that the binary has the named vrdma device and boots
# without -L and without a kernel, with a virtio NIC that loads its boot ROM:
# SeaBIOS must start (it prints its banner on the debug console at port
# 0x402).
smoke_test() {
	local bin=$1 dir
	dir=$(mktemp -d)
	log "smoke test: $bin lists vhost-user-rdma-pci"
	if ! "$bin" -nodefaults -machine none -device help 2>&1 | grep -q '^name "vhost-user-rdma-pci", bus PCI'; then
		rm -rf "$dir"
		die "smoke test failed: $bin -device help does not list vhost-user-rdma-pci (vmm/qemu/patches/0003)"
	fi
	log "smoke test: $bin boots SeaBIOS without -L, efi-virtio.rom found"
	"$bin" -M q35,memory-backend=mem -object memory-backend-memfd,id=mem,size=64M,share=on \
		-nodefaults -display none -no-reboot \
		-netdev hubport,id=n0,hubid=0 -device virtio-net-pci,netdev=n0 \
		-chardev file,id=dbg,path="$dir/debugcon" -device isa-debugcon,iobase=0x402,chardev=dbg \
		-serial "file:$dir/serial" >"$dir/out" 2>&1 &
	local pid=$! i ok=0
	for ((i = 0; i < 100; i++)); do
		if grep -q 'SeaBIOS' "$dir/debugcon" 2>/dev/null; then
			ok=1
			break
		fi
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	if ((ok == 0)); then
		cat "$dir/out" >&2 || true
		rm -rf "$dir"
		die "smoke test failed: $bin did not start SeaBIOS without -L"
	fi
	log "smoke test passed: $(grep -m1 -o 'SeaBIOS (version [^)]*)' "$dir/debugcon" || echo SeaBIOS)"
	rm -rf "$dir"
}

build() {
	local tarball=$1 key=$2 out=$3
	local work="$CACHE_ROOT/build-$QEMU_VERSION-$key"
	local src="$work/qemu-$QEMU_VERSION"
	if [[ -d "$work" && ! -f "$work/.configured" ]]; then
		run rm -rf "$work"
	fi
	if [[ ! -d "$work" ]]; then
		run mkdir -p "$work"
		log "extracting $tarball"
		run tar -C "$work" -xf "$tarball"
		[[ -d "$src" ]] || src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'qemu*' | head -n 1)
		[[ -f "$src/meson.build" ]] || die "extracted tree has no meson.build"
		local p
		while read -r p; do
			log "applying $(basename "$p")"
			run patch -d "$src" -p1 --forward --batch -i "$p"
		done < <(patches)
		# The +ds tarball has no firmware blobs; do not try to unpack edk2.
		# meson.build starts with "unpack_edk2_blobs = false" and then sets it
		# to bzip2.found() for x86_64-softmmu; pin every assignment to false.
		log "setting unpack_edk2_blobs = false in meson.build"
		sed -i -E 's/^([[:space:]]*unpack_edk2_blobs[[:space:]]*=).*/\1 false/' "$src/meson.build"
		grep -q 'unpack_edk2_blobs = false' "$src/meson.build" || die "meson.build has no unpack_edk2_blobs assignment"
		if grep -E '^[[:space:]]*unpack_edk2_blobs[[:space:]]*=' "$src/meson.build" | grep -vq '= false$'; then
			die "could not set unpack_edk2_blobs = false in meson.build"
		fi
		run mkdir -p "$src/build"
		(cd "$src/build" && run ../configure "${CONFIGURE_ARGS[@]}")
		touch "$work/.configured"
	else
		[[ -d "$src" ]] || src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'qemu*' | head -n 1)
		log "reusing configured tree $src"
	fi
	local start=$SECONDS
	run ninja -C "$src/build" -j "$JOBS" qemu-system-x86_64
	log "build took $((SECONDS - start)) s"
	mkdir -p "$(dirname "$out")"
	run install -m 0755 "$src/build/qemu-system-x86_64" "$out.tmp"
	# Test the copy, not the binary in the build tree: there QEMU finds its
	# files through build/qemu-bundle, which the copy does not have.
	smoke_test "$out.tmp"
	mv -f "$out.tmp" "$out"
	if [[ "${KEEP_BUILD:-}" != 1 ]]; then
		run rm -rf "$work"
	fi
}

main() {
	local mode=${1:-build}
	case "$mode" in
	build | fetch) ;;
	check)
		check_source
		return
		;;
	*) die "usage: $0 [fetch|check]" ;;
	esac
	[[ $EUID -eq 0 ]] || die "run as root (installs packages with apt-get)"

	ensure_runtime_deps
	if [[ "$mode" == fetch ]]; then
		ensure_build_deps
		fetch_source >/dev/null
		return
	fi

	local key out
	key=$(cache_key)
	out="$CACHE_ROOT/$QEMU_VERSION-$key/qemu-system-x86_64"
	if [[ -x "$out" ]]; then
		log "cache hit: $out"
	else
		log "cache miss: building QEMU $QEMU_VERSION (key $key) with $JOBS jobs"
		ensure_build_deps
		local tarball
		tarball=$(fetch_source)
		build "$tarball" "$key" "$out"
	fi
	"$out" --version >/dev/null || die "$out does not run"

	local dest="$REPO_ROOT/bin/qemu-system-x86_64"
	mkdir -p "$REPO_ROOT/bin"
	if ! cmp -s "$out" "$dest"; then
		run install -m 0755 "$out" "$dest.tmp"
		mv -f "$dest.tmp" "$dest"
	fi
	# make compares bin/qemu-system-x86_64 with this script and the patches.
	touch "$dest"
	log "ready: $dest ($("$dest" --version | head -n 1))"
}

# Sourced (by the tests) it only defines the functions.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
	main "$@"
fi
