#!/usr/bin/env bash
# qemu-build.sh builds the patched QEMU that vrdma attaches its device to.
#
# Upstream QEMU 10.0 ships the generic vhost-user front-end
# (vhost-user-device-pci) as not user-creatable and has no virtio name for
# device ID 42. This script fetches Debian's QEMU 10.0.2 source tarball from
# bookworm-backports, applies vmm/qemu/patches/*.patch, builds only
# qemu-system-x86_64, caches the binary outside the checkout and leaves a copy
# in <repo>/bin/qemu-system-x86_64.
#
# Usage (as root):  scripts/qemu-build.sh [fetch]
#   fetch   only install the build dependencies and download the source tarball
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

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly REPO_ROOT
readonly PATCH_DIR="$REPO_ROOT/vmm/qemu/patches"
readonly CACHE_ROOT="${VRDMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vrdma}/qemu"
readonly JOBS="${JOBS:-2}"

# The configure line. It is part of the cache key: change it and the cache
# misses. The firmware path lets the binary find SeaBIOS (package seabios) and
# the option ROMs (package qemu-system-data) without -L; --prefix=/usr makes
# /usr/share/qemu the data directory (keymaps, option ROMs), and
# --disable-relocatable keeps those paths absolute (a relocatable QEMU looks
# for ../share/... next to wherever the binary is copied). The system python
# is named because meson and pycotap are installed for it, not for whatever
# python3 comes first in PATH (pyenv, venvs).
readonly CONFIGURE_ARGS=(
	--python=/usr/bin/python3
	--prefix=/usr
	--disable-relocatable
	--firmwarepath=/usr/share/seabios:/usr/share/qemu
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
readonly RUNTIME_DEPS=(seabios qemu-system-data libglib2.0-0 libpixman-1-0 libfdt1 zlib1g)
readonly BUILD_DEPS=(ninja-build python3-venv pkg-config libglib2.0-dev libpixman-1-dev
	libfdt-dev zlib1g-dev flex bison xz-utils patch gcc make)
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

# APT_COMMON are the options every apt-get call gets: wait for the dpkg lock
# (other engineers may run apt at the same time) and never ask.
readonly APT_COMMON=(-o DPkg::Lock::Timeout=600 -y -q)

# Private apt configuration used for bookworm-backports (deb and deb-src):
# the system's sources plus two lines, and its own lists directory so the
# machine's apt state is not changed.
readonly APT_DIR="$CACHE_ROOT/apt"
APT_PRIVATE=()
SUITE_BPO=""

missing_pkgs() {
	local p status
	for p in "$@"; do
		status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
		if [[ "$status" != installed ]]; then
			printf '%s\n' "$p"
		fi
	done
}

# codename prints the distribution codename (bookworm).
codename() {
	local c=""
	if [[ -r /etc/os-release ]]; then
		c=$(. /etc/os-release && printf '%s' "${VERSION_CODENAME:-}")
	fi
	[[ -n "$c" ]] || die "cannot tell the distribution codename from /etc/os-release"
	printf '%s\n' "$c"
}

# find_mirror prints "URI<TAB>signed-by" for the first apt source of type deb
# whose suites include the release itself (e.g. "bookworm", not
# "bookworm-security"). It reads one-line .list files and deb822 .sources.
find_mirror() {
	local suite=$1 f
	local files=()
	[[ -f /etc/apt/sources.list ]] && files+=(/etc/apt/sources.list)
	for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
		[[ -f "$f" ]] && files+=("$f")
	done
	for f in "${files[@]}"; do
		case "$f" in
		*.sources)
			# deb822: paragraphs separated by blank lines; fields may repeat case-insensitively.
			awk -v suite="$suite" '
				function flush() {
					if (types ~ /(^| )deb( |$)/ && enabled != "no" && uris != "") {
						n = split(suites, s, /[ \t]+/)
						for (i = 1; i <= n; i++) if (s[i] == suite) {
							split(uris, u, /[ \t]+/)
							print u[1] "\t" signed
							found = 1
							exit
						}
					}
					types = uris = suites = signed = enabled = ""
				}
				/^[ \t]*#/ { next }
				/^[ \t]*$/ { flush(); next }
				{
					line = $0
					key = tolower(line); sub(/:.*/, "", key)
					val = line; sub(/^[^:]*:[ \t]*/, "", val); sub(/[ \t]+$/, "", val)
					if (key == "types") types = val
					else if (key == "uris") uris = val
					else if (key == "suites") suites = val
					else if (key == "enabled") enabled = tolower(val)
					else if (key == "signed-by" && val ~ /^\//) signed = val
				}
				END { if (!found) flush() }
			' "$f"
			;;
		*)
			# one-line: deb [opt=val ...] URI suite component...
			awk -v suite="$suite" '
				/^[ \t]*#/ { next }
				$1 == "deb" {
					signed = ""; i = 2
					if ($2 ~ /^\[/) {
						for (; i <= NF; i++) {
							if ($i ~ /signed-by=/) { v = $i; sub(/.*signed-by=/, "", v); sub(/\]$/, "", v); signed = v }
							if ($i ~ /\]$/) { i++; break }
						}
					}
					if ($(i+1) == suite) { print $i "\t" signed; exit }
				}
			' "$f"
			;;
		esac
	done | head -n 1
}

setup_backports_apt() {
	if ((${#APT_PRIVATE[@]} > 0)); then
		return
	fi
	local suite mirror uri signed opt=""
	suite=$(codename)
	mirror=$(find_mirror "$suite")
	[[ -n "$mirror" ]] || die "no apt source for suite $suite in /etc/apt/sources.list{,.d/*}: cannot derive the $suite-backports mirror"
	uri=${mirror%%$'\t'*}
	signed=${mirror#*$'\t'}
	[[ -n "$signed" ]] && opt="[signed-by=$signed] "
	log "backports mirror derived from the apt sources: $uri ($suite-backports)"

	mkdir -p "$APT_DIR/lists/partial"
	local list="$APT_DIR/sources.list" tmp
	tmp=$(mktemp "$APT_DIR/sources.list.XXXXXX")
	{
		echo "# generated by scripts/qemu-build.sh: the system's sources plus $suite-backports"
		[[ -f /etc/apt/sources.list ]] && cat /etc/apt/sources.list
		echo "deb ${opt}${uri} ${suite}-backports main"
		echo "deb-src ${opt}${uri} ${suite}-backports main"
	} >"$tmp"
	mv -f "$tmp" "$list"
	# The system's sources.list.d stays in use (deb822 files included); only
	# the main list file and the lists directory are private.
	APT_PRIVATE=(-o "Dir::Etc::sourcelist=$list" -o "Dir::State::Lists=$APT_DIR/lists")

	# Refresh the private lists once a day at most.
	local stamp="$APT_DIR/updated"
	if [[ ! -f "$stamp" || "$list" -nt "$stamp" || -n "$(find "$stamp" -mmin +1440 2>/dev/null)" ]]; then
		run apt-get "${APT_COMMON[@]}" "${APT_PRIVATE[@]}" update >&2
		touch "$stamp"
	fi
	SUITE_BPO="${suite}-backports"
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

# fetch_source downloads the orig tarball with apt-get source into
# $CACHE_ROOT/downloads and prints its path.
fetch_source() {
	local dl="$CACHE_ROOT/downloads"
	local tarball="$dl/$QEMU_TARBALL"
	if [[ -s "$tarball" ]] && xz -t "$tarball" 2>/dev/null; then
		log "source tarball cached: $tarball"
		printf '%s\n' "$tarball"
		return
	fi
	setup_backports_apt
	mkdir -p "$dl"
	# The expected checksum comes from the signed Sources index.
	local uris want
	uris=$(apt-get "${APT_PRIVATE[@]}" source --print-uris "qemu/$SUITE_BPO" 2>/dev/null) ||
		die "apt-get source --print-uris qemu/$SUITE_BPO failed (no deb-src for $SUITE_BPO?)"
	grep -qF "$QEMU_TARBALL" <<<"$uris" ||
		die "$SUITE_BPO does not offer $QEMU_TARBALL; the patch targets QEMU $QEMU_VERSION. Offered: $(grep -o "qemu_[^ ']*orig[^ ']*" <<<"$uris" | head -n 1)"
	want=$(grep -F "$QEMU_TARBALL" <<<"$uris" | grep -o 'SHA256:[0-9a-f]*' | head -n 1 | cut -d: -f2)
	# The .dsc may 404 on some mirrors; the tarball is all we need, so the exit
	# status of apt-get source does not matter, only the tarball's checksum.
	(cd "$dl" && run apt-get "${APT_PRIVATE[@]}" source --download-only "qemu/$SUITE_BPO" >&2) ||
		log "apt-get source reported an error; checking the tarball anyway"
	[[ -s "$tarball" ]] || die "apt-get source did not download $QEMU_TARBALL"
	if [[ -n "$want" ]]; then
		local got
		got=$(sha256sum "$tarball" | cut -d' ' -f1)
		[[ "$got" == "$want" ]] || {
			rm -f "$tarball"
			die "$QEMU_TARBALL: sha256 $got, want $want"
		}
		log "sha256 verified: $want"
	fi
	printf '%s\n' "$tarball"
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

# smoke_test boots the binary without -L and without a kernel; SeaBIOS must
# start (it prints its banner on the debug console at port 0x402).
smoke_test() {
	local bin=$1 dir
	dir=$(mktemp -d)
	log "smoke test: $bin boots SeaBIOS without -L"
	"$bin" -M q35,memory-backend=mem -object memory-backend-memfd,id=mem,size=64M,share=on \
		-nodefaults -display none -no-reboot \
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
	[[ $EUID -eq 0 ]] || die "run as root (installs packages with apt-get)"
	local mode=${1:-build}
	case "$mode" in
	build | fetch) ;;
	*) die "usage: $0 [fetch]" ;;
	esac

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

main "$@"
