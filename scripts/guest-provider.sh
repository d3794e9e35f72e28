#!/usr/bin/env bash
# guest-provider.sh builds the vrdma rdma-core provider for the guests:
# bin/guest-stack/libvrdma-rdmav34.so and bin/guest-stack/vrdma.driver, for
# Debian 12's libibverbs1 44.0 (provider ABI 34, IBVERBS_PRIVATE_34).
#
# rdma-core keeps infiniband/driver.h private and Debian 12 serves no 44.0
# source tarball, so the provider is compiled against the headers of
# trixie's rdma-core 56.1 source (same provider ABI 34; guest/rdma-core/
# abi_check.c pins every shared layout to 44.0's and fails the build if one
# moved) and linked to the SYSTEM libibverbs.so.1, so its IBVERBS_PRIVATE_34
# references bind to Debian 12's library. guest/rdma-core/README.md has the
# details.
#
# Steps: install the few build packages; fetch rdma-core_56.1.orig.tar.gz
# with apt-get source from a private apt configuration (a deb-src line for
# trixie on the mirror the machine's own apt sources name), cache it in
# ~/.cache/vrdma/rdma-core/ and check its pinned sha256; configure the
# source once with cmake (no man pages, no pyverbs, no libnl) and generate
# kern-abi's headers; generate kernel-abi/vrdma-abi.h from
# guest/include/vrdma-abi.h with rdma-core's own make_abi_structs.py; check
# the ABI (abi_check.c); compile with rdma-core's provider flags; run the
# data-path check (datapath_check.c, a fake kernel and device); link with
# buildlib/provider.map and check every imported symbol against the system
# libibverbs.so.1.
#
# Usage (as root when packages are missing):  scripts/guest-provider.sh [fetch]
#   fetch   only install the build packages and download the source tarball
#
# Environment:
#   VRDMA_CACHE=DIR   cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/vrdma)
#
# Idempotent: when no input changed (the stamp in bin/guest-stack holds a
# hash of the sources, the shared header, this script, the tarball, the
# compiler and the libibverbs1 version) it only says so.
set -euo pipefail

readonly RDMA_CORE_VERSION=56.1
readonly RDMA_CORE_SUITE=trixie
readonly RDMA_CORE_TARBALL="rdma-core_${RDMA_CORE_VERSION}.orig.tar.gz"
readonly RDMA_CORE_SHA256=63ce7f2baa7242c2dbc76375dac957c420187dd27f8c5e148efc07971ee522a8
readonly PABI=34

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly REPO_ROOT
readonly SRC_DIR="$REPO_ROOT/guest/rdma-core"
readonly ABI_HEADER="$REPO_ROOT/guest/include/vrdma-abi.h"
readonly OUT_DIR="$REPO_ROOT/bin/guest-stack"
readonly OUT_SO="$OUT_DIR/libvrdma-rdmav${PABI}.so"
readonly OUT_DRIVER="$OUT_DIR/vrdma.driver"
readonly STAMP="$OUT_DIR/.provider-stamp"
# The memory-window check the stack image runs (guest/mwcheck): a plain
# libibverbs program, built against Debian 12's libibverbs-dev, the library
# it runs with in the guest.
readonly MWCHECK_SRC="$REPO_ROOT/guest/mwcheck/vrdma_mw_check.c"
readonly OUT_MWCHECK="$OUT_DIR/vrdma-mw-check"
readonly CACHE_ROOT="${VRDMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vrdma}/rdma-core"
readonly SYSTEM_LIBIBVERBS=/usr/lib/x86_64-linux-gnu/libibverbs.so.1

# The provider's sources, in link order.
readonly SOURCES=(vrdma.c vrdma_verbs.c vrdma_ex.c)

# Build packages. libibverbs-dev brings the system libibverbs.so.1 (and the
# 44.0 public headers the loading test compiles against); no libnl, udev or
# pandoc: the configure below needs none of them.
readonly BUILD_DEPS=(gcc libc6-dev binutils cmake ninja-build pkg-config python3 libibverbs-dev
	libibverbs1 tar gzip)

# The configure line; part of the configured tree's cache key.
readonly CMAKE_ARGS=(
	-G Ninja
	-DCMAKE_BUILD_TYPE=Release
	-DNO_MAN_PAGES=1
	-DNO_PYVERBS=1
	-DENABLE_STATIC=0
	-DENABLE_RESOLVE_NEIGH=0
	-DPYTHON_EXECUTABLE=/usr/bin/python3
)

# rdma-core's own compile and link flags for providers (its build.ninja),
# plus -Werror and -g.
readonly CFLAGS=(-std=gnu11 -O2 -g -fPIC -Werror -Wall -Wextra -Wno-sign-compare
	-Wno-unused-parameter -Wmissing-prototypes -Wmissing-declarations -Wwrite-strings
	-Wformat=2 -Wcast-function-type -Wformat-nonliteral -Wdate-time -Wnested-externs
	-Wshadow -Wstrict-prototypes -Wold-style-definition -Wredundant-decls)
# shellcheck disable=SC2054 # commas belong to the linker flags
readonly LDFLAGS=(-shared -Wl,--as-needed -Wl,--no-undefined -Wl,-z,relro -Wl,-z,now)


log() { printf '==> %s\n' "$*" >&2; }
die() {
	printf 'guest-provider: error: %s\n' "$*" >&2
	exit 1
}
run() {
	printf '+ %s\n' "$*" >&2
	"$@"
}

missing_pkgs() {
	local p status
	for p in "$@"; do
		status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
		if [[ "$status" != installed ]]; then
			printf '%s\n' "$p"
		fi
	done
}

ensure_build_deps() {
	local missing
	mapfile -t missing < <(missing_pkgs "${BUILD_DEPS[@]}")
	if ((${#missing[@]} == 0)); then
		return
	fi
	[[ $EUID -eq 0 ]] || die "missing packages ${missing[*]}: run as root (installs them with apt-get)"
	log "installing build packages: ${missing[*]}"
	run apt-get "${APT_COMMON[@]}" update
	run env DEBIAN_FRONTEND=noninteractive apt-get "${APT_COMMON[@]}" install --no-install-recommends "${missing[@]}"
}

# codename and find_mirror (the machine's own mirror), and APT_COMMON, come
# from the library qemu-build.sh and go-toolchain.sh share.
# shellcheck source=scripts/lib-backports.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib-backports.sh"

# A private apt configuration that knows one deb-src line (trixie main on
# the machine's own mirror) and keeps its own lists: the machine's apt state
# is not changed, and the update fetches only trixie's Sources index.
readonly APT_DIR="$CACHE_ROOT/apt"
APT_PRIVATE=()

setup_private_apt() {
	if ((${#APT_PRIVATE[@]} > 0)); then
		return
	fi
	local mirror uri signed opt=""
	mirror=$(find_mirror "$(codename)")
	[[ -n "$mirror" ]] || die "no deb line for $(codename) in the apt sources: cannot derive the mirror for $RDMA_CORE_SUITE"
	uri=${mirror%%$'\t'*}
	signed=${mirror#*$'\t'}
	[[ -n "$signed" ]] && opt="[signed-by=$signed] "
	log "mirror derived from the apt sources: $uri ($RDMA_CORE_SUITE, deb-src)"

	mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/sources.list.d"
	local list="$APT_DIR/sources.list" tmp
	tmp=$(mktemp "$APT_DIR/sources.list.XXXXXX")
	{
		echo "# generated by scripts/guest-provider.sh"
		echo "deb-src ${opt}${uri} ${RDMA_CORE_SUITE} main"
	} >"$tmp"
	if cmp -s "$tmp" "$list"; then
		rm -f "$tmp"
	else
		mv -f "$tmp" "$list"
	fi
	APT_PRIVATE=(-o "Dir::Etc::sourcelist=$list" -o "Dir::Etc::sourceparts=$APT_DIR/sources.list.d"
		-o "Dir::State::Lists=$APT_DIR/lists")

	local stamp="$APT_DIR/updated"
	if [[ ! -f "$stamp" || "$list" -nt "$stamp" || -n "$(find "$stamp" -mmin +1440 2>/dev/null)" ]]; then
		run apt-get -q "${APT_PRIVATE[@]}" update >&2
		touch "$stamp"
	fi
}

# fetch_source downloads the orig tarball into $CACHE_ROOT/downloads (once)
# and prints its path; the sha256 is pinned here and checked every time.
fetch_source() {
	local dl="$CACHE_ROOT/downloads"
	local tarball="$dl/$RDMA_CORE_TARBALL"
	if [[ ! -s "$tarball" ]]; then
		setup_private_apt
		mkdir -p "$dl"
		local uris
		uris=$(apt-get "${APT_PRIVATE[@]}" source --print-uris "rdma-core/$RDMA_CORE_SUITE" 2>/dev/null) ||
			die "apt-get source --print-uris rdma-core/$RDMA_CORE_SUITE failed"
		grep -qF "$RDMA_CORE_TARBALL" <<<"$uris" ||
			die "$RDMA_CORE_SUITE does not offer $RDMA_CORE_TARBALL (offered: $(grep -o "rdma-core_[^ ']*orig[^ ']*" <<<"$uris" | head -n 1)); update RDMA_CORE_VERSION and RDMA_CORE_SHA256 after checking guest/rdma-core/abi_check.c"
		# The .dsc may 404 on the mirror; the tarball is all that is used.
		(cd "$dl" && run apt-get -q "${APT_PRIVATE[@]}" source --download-only "rdma-core/$RDMA_CORE_SUITE" >&2) ||
			log "apt-get source reported an error; checking the tarball anyway"
		[[ -s "$tarball" ]] || die "apt-get source did not download $RDMA_CORE_TARBALL"
	fi
	local got
	got=$(sha256sum "$tarball" | cut -d' ' -f1)
	if [[ "$got" != "$RDMA_CORE_SHA256" ]]; then
		rm -f "$tarball"
		die "$RDMA_CORE_TARBALL: sha256 $got, want $RDMA_CORE_SHA256 (removed; run again)"
	fi
	printf '%s\n' "$tarball"
}

# configured_tree extracts and configures the rdma-core source once per
# configure line and prints the directory holding src/ and build/.
configured_tree() {
	local tarball=$1 key work
	key=$(printf '%s\n' "$RDMA_CORE_SHA256" "${CMAKE_ARGS[@]}" | sha256sum | cut -c1-12)
	work="$CACHE_ROOT/build-$RDMA_CORE_VERSION-$key"
	if [[ -f "$work/.configured" ]]; then
		printf '%s\n' "$work"
		return
	fi
	run rm -rf "$work"
	run mkdir -p "$work/src" "$work/build"
	run tar -C "$work/src" --strip-components=1 -xzf "$tarball"
	[[ -f "$work/src/libibverbs/driver.h" ]] || die "the tarball has no libibverbs/driver.h"
	(cd "$work/build" && run cmake "${CMAKE_ARGS[@]}" ../src >&2) || die "cmake configure of rdma-core $RDMA_CORE_VERSION failed"
	# kern-abi.h includes <kernel-abi/ib_user_verbs.h>, generated at build
	# time from kernel-headers/rdma/ib_user_verbs.h.
	run ninja -C "$work/build" include/kernel-abi/ib_user_verbs.h >&2
	touch "$work/.configured"
	printf '%s\n' "$work"
}

# inputs_hash hashes everything the output depends on.
inputs_hash() {
	{
		printf 'rdma-core %s %s\n' "$RDMA_CORE_VERSION" "$RDMA_CORE_SHA256"
		printf '%s\n' "${CMAKE_ARGS[@]}" "${CFLAGS[@]}" "${LDFLAGS[@]}"
		cc --version 2>/dev/null | head -n 1 || true
		dpkg-query -W -f='${Package} ${Version}\n' libibverbs1 2>/dev/null || true
		sha256sum "${BASH_SOURCE[0]}" "$ABI_HEADER" "$SRC_DIR"/*.c "$SRC_DIR"/*.h "$SRC_DIR"/vrdma.driver \
			"$MWCHECK_SRC" | cut -d' ' -f1
	} | sha256sum | cut -d' ' -f1
}

# check_symbols fails when the provider imports a libibverbs symbol (with
# its version) that the system's libibverbs.so.1 does not export.
check_symbols() {
	local so=$1 sym ver bad=0
	local exported
	exported=$(objdump -T "$SYSTEM_LIBIBVERBS" | awk 'NF >= 6 && $4 != "*UND*" && $(NF-1) ~ /^IBVERBS/ {print $(NF-1) " " $NF}')
	while read -r ver sym; do
		if ! grep -qxF "$ver $sym" <<<"$exported"; then
			printf 'guest-provider: %s imports %s@%s, which %s does not export\n' "$so" "$sym" "$ver" "$SYSTEM_LIBIBVERBS" >&2
			bad=1
		fi
	done < <(objdump -T "$so" | awk 'NF >= 6 && $4 == "*UND*" && $(NF-1) ~ /^\(IBVERBS/ {v = $(NF-1); gsub(/[()]/, "", v); print v " " $NF}')
	((bad == 0)) || die "the provider needs symbols Debian 12's libibverbs lacks"
}

build() {
	local work=$1 gen obj=() f
	local inc=(-I "$work/build/include")
	gen=$(mktemp -d "$CACHE_ROOT/gen.XXXXXX")
	# shellcheck disable=SC2064
	trap "rm -rf '$gen'" EXIT

	# <kernel-abi/vrdma-abi.h>: the _STRUCT_ macros DECLARE_DRV_CMD needs,
	# made by rdma-core's own script from the project's shared header.
	mkdir -p "$gen/include/kernel-abi"
	run /usr/bin/python3 "$work/src/buildlib/make_abi_structs.py" "$ABI_HEADER" \
		"$gen/include/kernel-abi/vrdma-abi.h"
	inc+=(-I "$gen/include" -I "$(dirname "$ABI_HEADER")")

	log "checking the 56.1 headers against rdma-core 44.0's layouts (abi_check.c)"
	run cc "${CFLAGS[@]}" "${inc[@]}" -fsyntax-only "$SRC_DIR/abi_check.c"

	for f in "${SOURCES[@]}"; do
		run cc "${CFLAGS[@]}" "${inc[@]}" -c "$SRC_DIR/$f" -o "$gen/${f%.c}.o"
		obj+=("$gen/${f%.c}.o")
	done
	# The data path against a fake kernel and device (datapath_check.c):
	# WQE and CQE encoding, indices, the doorbell rule, and no system call
	# on post, poll or arm (SECCOMP_MODE_STRICT).
	log "running the data-path check (datapath_check.c)"
	run cc "${CFLAGS[@]}" "${inc[@]}" -I "$SRC_DIR" -o "$gen/datapath_check" \
		"$SRC_DIR/datapath_check.c" "$gen/vrdma_verbs.o" "$gen/vrdma_ex.o" -lpthread
	run "$gen/datapath_check" >&2 || die "the data-path check failed"

	mkdir -p "$OUT_DIR"
	# Linked against the system's libibverbs.so.1 by path, so the versioned
	# references are Debian 12's, whatever the 56.1 tree holds.
	run cc "${LDFLAGS[@]}" -Wl,--version-script,"$work/src/buildlib/provider.map" \
		-o "$OUT_SO.tmp" "${obj[@]}" "$SYSTEM_LIBIBVERBS" -lpthread
	check_symbols "$OUT_SO.tmp"
	mv -f "$OUT_SO.tmp" "$OUT_SO"
	install -m 0644 "$SRC_DIR/vrdma.driver" "$OUT_DRIVER"
	run cc -O2 -g -Wall -Wextra -Werror -o "$OUT_MWCHECK.tmp" "$MWCHECK_SRC" -libverbs
	mv -f "$OUT_MWCHECK.tmp" "$OUT_MWCHECK"
	rm -rf "$gen"
	trap - EXIT
}

main() {
	local mode=${1:-build}
	case "$mode" in
	build | fetch) ;;
	*) die "usage: $0 [fetch]" ;;
	esac

	ensure_build_deps
	mkdir -p "$CACHE_ROOT"
	if [[ "$mode" == fetch ]]; then
		fetch_source >/dev/null
		return
	fi

	local want
	want=$(inputs_hash)
	if [[ -f "$OUT_SO" && -f "$OUT_DRIVER" && -f "$OUT_MWCHECK" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
		log "up to date: $OUT_SO"
		return
	fi
	local tarball work
	tarball=$(fetch_source)
	work=$(configured_tree "$tarball")
	build "$work"
	printf '%s\n' "$want" >"$STAMP"
	log "ready: $OUT_SO, $OUT_DRIVER"
}

main "$@"
