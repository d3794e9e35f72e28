# shellcheck shell=bash
# Helpers shared by the guest-image recipes (scripts/guest-image.sh,
# scripts/rxe-image.sh, scripts/guest-stack-image.sh): Debian packages
# fetched once into a cache, a staging tree with busybox, user space picked
# from Debian packages with its shared-library closure, kernel modules in
# dependency order, and the initramfs packed with busybox's own cpio (no
# host cpio needed).
#
# Sourced, not run. The caller sets, before sourcing:
#   IMAGE  the name messages start with ("guest-image", "rxe-image",
#          "guest-stack-image")
# and before calling new_stage:
#   CACHE  the cache directory the staging tree is made in
# The caller's `set -euo pipefail` applies here too; die ends the script.

IMAGE_LIB=${BASH_SOURCE[0]}

say() { printf '%s: %s\n' "$IMAGE" "$*"; }
die() { printf '%s: %s\n' "$IMAGE" "$*" >&2; exit 1; }

need_root() {
	[ "$(id -u)" = 0 ] || die "run as root (dpkg -x keeps ownership and modes)"
}

# newest_kernel FLAVOUR WHAT: sets KPKG and KVER to the newest
# linux-image-6.1.0-N-FLAVOUR package in the apt sources (after an apt-get
# update when the cache has none). WHAT names the kernel in the message.
newest_kernel() {
	local flavour=$1 what=$2
	kernel_pkg() {
		apt-cache search "^linux-image-6\\.1\\.0-[0-9]+-${flavour}\$" | awk '{print $1}' | sort -V | tail -1
	}
	KPKG=$(kernel_pkg || true)
	if [ -z "$KPKG" ]; then
		say "apt cache has no $what kernel: apt-get update"
		apt-get update -qq
		KPKG=$(kernel_pkg || true)
	fi
	[ -n "$KPKG" ] || die "no linux-image-6.1.0-N-$flavour package in the apt sources"
	KVER=${KPKG#linux-image-}
}

# fetch_deb DIR PACKAGE: prints the path of PACKAGE's .deb in DIR, fetched
# with apt-get download unless DIR (or one of the directories in
# $DEB_REUSE_DIRS, whose file is then linked into DIR) has one already.
fetch_deb() {
	local dir=$1 pkg=$2 deb other
	deb=$(ls "$dir/${pkg}"_*.deb 2>/dev/null | sort -V | tail -1 || true)
	if [ -z "$deb" ]; then
		# Another image's cache may hold it already.
		for other in ${DEB_REUSE_DIRS:-}; do
			deb=$(ls "$other/${pkg}"_*.deb 2>/dev/null | sort -V | tail -1 || true)
			if [ -n "$deb" ]; then
				ln -f "$deb" "$dir/" 2>/dev/null || cp "$deb" "$dir/"
				deb="$dir/$(basename "$deb")"
				printf '%s\n' "$deb"
				return 0
			fi
		done
		say "apt-get download $pkg" >&2
		(cd "$dir" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2) || {
			apt-get update -qq >&2
			(cd "$dir" && apt-get download -q -o APT::Sandbox::User=root "$pkg" >&2)
		}
		deb=$(ls "$dir/${pkg}"_*.deb 2>/dev/null | sort -V | tail -1 || true)
		[ -n "$deb" ] || die "apt-get download $pkg left no .deb"
	fi
	printf '%s\n' "$deb"
}

extract() { # deb dir: dpkg -x, unless dir already holds this .deb
	local deb=$1 dir=$2
	if [ ! -f "$dir/.extracted" ] || [ "$(cat "$dir/.extracted")" != "$(basename "$deb")" ]; then
		say "dpkg -x $(basename "$deb")"
		rm -rf "$dir"
		mkdir -p "$dir"
		dpkg -x "$deb" "$dir"
		basename "$deb" >"$dir/.extracted"
	fi
}

# input_hashes FILE...: the files' sha256 sums on one line, for a stamp
# (this library is one of the inputs of every image).
input_hashes() {
	sha256sum "$@" "$IMAGE_LIB" | awk '{print $1}' | tr '\n' ' '
}

# up_to_date IMG STAMP INPUTS: IMG exists and STAMP records INPUTS.
up_to_date() {
	[ -f "$1" ] && [ -f "$2" ] && [ "$(cat "$2")" = "$3" ]
}

# new_stage BUSYBOX DIR...: sets STAGE to a new staging tree in $CACHE
# (removed when the script exits) with the directories DIR... and busybox
# as /bin/busybox, with one link per applet where busybox says it belongs
# (/bin/sh, /sbin/poweroff, ...).
new_stage() {
	local busybox=$1 d
	shift
	STAGE=$(mktemp -d "$CACHE/stage.XXXXXX")
	trap 'rm -rf "$STAGE"' EXIT
	for d in "$@"; do
		mkdir -p "$STAGE/$d"
	done
	cp "$busybox" "$STAGE/bin/busybox"
	"$STAGE/bin/busybox" --list-full | while read -r applet; do
		[ -e "$STAGE/$applet" ] || ln -s /bin/busybox "$STAGE/$applet"
	done
}

# stage_base INIT: INIT as /init, root in /etc/passwd and /etc/group, and
# /dev/console and /dev/null. /dev/console must exist before devtmpfs is
# mounted, for the kernel to open init's stdin/stdout; busybox mknod makes
# it inside the archive tree.
stage_base() {
	install -m 0755 "$1" "$STAGE/init"
	printf 'root:x:0:0:root:/root:/bin/sh\n' >"$STAGE/etc/passwd"
	printf 'root:x:0:\n' >"$STAGE/etc/group"
	"$STAGE/bin/busybox" mknod -m 600 "$STAGE/dev/console" c 5 1
	"$STAGE/bin/busybox" mknod -m 666 "$STAGE/dev/null" c 1 3
}

# pack_initramfs IMG STAMP INPUTS: the staging tree as a gzip'd newc cpio
# owned by root, written to IMG, and INPUTS recorded in STAMP.
pack_initramfs() {
	(cd "$STAGE" && find . | "$STAGE/bin/busybox" cpio -o -H newc -R 0:0 2>/dev/null | gzip -1 >"$1.tmp")
	mv "$1.tmp" "$1"
	printf '%s' "$3" >"$2"
}

# --- User space from Debian packages: a pool and a DT_NEEDED closure --------
#
# A pool is the named packages and every library package apt says they
# depend on, extracted into one tree; what goes into the image is picked
# from it, file by file, with every shared library the picked programs
# load (DT_NEEDED, recursively) and the dynamic loader.

# fill_pool DEBDIR PKGLIST POOL PKG...: the dependency closure of PKG...
# (library packages only; resolved into PKGLIST once per set of PKG...,
# which PKGLIST.for records), each .deb fetched
# into DEBDIR, all extracted into POOL (again only when the set of .debs
# changed). Sets POOL and POOL_KEY (the .deb file names, for a stamp).
fill_pool() {
	local debdir=$1 pkglist=$2 pool=$3 pkg deb
	shift 3
	if [ ! -s "$pkglist" ] || [ "$(cat "$pkglist.for" 2>/dev/null)" != "$*" ]; then
		say "resolving the dependency closure of $*"
		{
			printf '%s\n' "$@"
			apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
				--no-breaks --no-replaces --no-enhances --no-pre-depends "$@" |
				awk '/^[a-z0-9]/ {print $1}' | sed 's/:amd64$//' | grep -E '^(lib|zlib)' || true
		} | sort -u >"$pkglist.tmp"
		mv "$pkglist.tmp" "$pkglist"
		printf '%s' "$*" >"$pkglist.for"
	fi
	POOL=$pool
	POOL_KEY=""
	while read -r pkg; do
		[ -n "$pkg" ] || continue
		# Virtual packages (no .deb of their own) are skipped; what they
		# stand for is in the closure too.
		if ! ls "$debdir/${pkg}"_*.deb >/dev/null 2>&1 &&
			[ -z "$(apt-cache show --no-all-versions "$pkg" 2>/dev/null | head -1)" ]; then
			continue
		fi
		deb=$(fetch_deb "$debdir" "$pkg")
		POOL_KEY="$POOL_KEY $(basename "$deb")"
	done <"$pkglist"
	if [ ! -f "$POOL/.extracted" ] || [ "$(cat "$POOL/.extracted")" != "$POOL_KEY" ]; then
		say "extracting $(wc -w <<<"$POOL_KEY") packages into the pool"
		rm -rf "$POOL"
		mkdir -p "$POOL"
		for deb in $POOL_KEY; do
			dpkg -x "$debdir/$deb" "$POOL"
		done
		printf '%s' "$POOL_KEY" >"$POOL/.extracted"
	fi
}

# Where shared libraries are looked for, in the pool.
LIBDIRS="lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu lib64 usr/lib64 lib usr/lib"

# copy_file REL: the pool's REL into the stage at the same place; a
# symlink is kept as a symlink and its target copied too. A busybox applet
# link at that place gives way to the real program.
copy_file() {
	local rel=$1 target
	mkdir -p "$STAGE/$(dirname "$rel")"
	if [ -L "$STAGE/$rel" ] && [ "$(readlink "$STAGE/$rel")" = /bin/busybox ]; then
		rm -f "$STAGE/$rel"
	fi
	if [ -L "$POOL/$rel" ]; then
		target=$(readlink "$POOL/$rel")
		ln -sfn "$target" "$STAGE/$rel"
		case "$target" in
		/*) copy_file "${target#/}" ;;
		*) copy_file "$(dirname "$rel")/$target" ;;
		esac
	elif [ -f "$POOL/$rel" ]; then
		[ -e "$STAGE/$rel" ] || cp -p "$POOL/$rel" "$STAGE/$rel"
	else
		die "the pool has no $rel"
	fi
}

# find_lib SONAME: prints the pool-relative path of SONAME.
find_lib() {
	local d
	for d in $LIBDIRS; do
		if [ -e "$POOL/$d/$1" ]; then
			printf '%s\n' "$d/$1"
			return 0
		fi
	done
	return 1
}

# stage_elfs [--from-host] FILE...: each pool-relative FILE into the stage
# (copy_file), remembered for stage_closure. With --from-host, FILE is
# instead an absolute host path already copied into the stage by the
# caller (a program or provider built by this project): only its DT_NEEDED
# libraries come from the pool.
ELF_QUEUE=()
stage_elfs() {
	local rel
	if [ "${1:-}" = --from-host ]; then
		shift
		for rel in "$@"; do
			[ -f "$rel" ] || die "$rel is missing"
			ELF_QUEUE+=("$rel")
		done
		return 0
	fi
	for rel in "$@"; do
		[ -e "$POOL/$rel" ] || die "the pool has no $rel"
		copy_file "$rel"
		ELF_QUEUE+=("$rel")
	done
}

# stage_closure: the dynamic loader and, by DT_NEEDED, every shared library
# the files given to stage_elfs need, recursively, from the pool.
declare -A LIB_DONE=()
# stage_plugin_dirs DIR...: every shared object in the pool's plugin
# directories DIR (relative to the pool) into the stage, symlinks as
# symlinks; PLUGINS lists the real files (staged by DT_NEEDED closure with
# the rest). Middleware loads its plugins with dlopen, so no DT_NEEDED
# names them. A directory the pool lacks is skipped.
stage_plugin_dirs() {
	PLUGINS=()
	local d f
	for d in "$@"; do
		[ -d "$POOL/$d" ] || continue
		for f in "$POOL/$d"/*.so "$POOL/$d"/*.so.*; do
			[ -e "$f" ] || continue
			if [ -L "$f" ]; then
				copy_file "${f#"$POOL"/}"
			else
				PLUGINS+=("${f#"$POOL"/}")
			fi
		done
	done
	[ "${#PLUGINS[@]}" -gt 0 ] || die "the pool has no plugins in $*"
	stage_elfs "${PLUGINS[@]}"
}

stage_closure() {
	local ldso steps=0 rel elf so lib
	ldso=$(find_lib ld-linux-x86-64.so.2) || die "the pool has no ld-linux-x86-64.so.2 (libc6)"
	copy_file "$ldso"
	mkdir -p "$STAGE/lib64"
	ln -sfn "/$ldso" "$STAGE/lib64/ld-linux-x86-64.so.2"
	while [ "${#ELF_QUEUE[@]}" -gt 0 ]; do
		steps=$((steps + 1))
		[ "$steps" -le 1000 ] || die "shared library closure does not converge"
		rel=${ELF_QUEUE[0]}
		ELF_QUEUE=("${ELF_QUEUE[@]:1}")
		case "$rel" in
		/*) elf=$rel ;;
		*) elf=$POOL/$rel ;;
		esac
		for so in $(readelf -d "$elf" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
			[ -z "${LIB_DONE[$so]:-}" ] || continue
			LIB_DONE[$so]=1
			lib=$(find_lib "$so") || die "no package in the closure provides $so (needed by ${rel#"$POOL"/})"
			copy_file "$lib"
			ELF_QUEUE+=("$(cd "$POOL" && readlink -f "$lib" | sed "s|^$POOL/||")")
		done
	done
}

# --- Kernel modules in load order --------------------------------------------
#
# The kernel packages ship no modules.dep (depmod makes it at install
# time): the order comes from each .ko's .modinfo "depends=".

# module_index KMODDIR: reads KMODDIR/modules.order, so that
# module_order can find a module by name.
declare -A MOD_PATH=() MOD_SEEN=()
module_index() {
	local rel name
	KMOD=$1
	[ -f "$KMOD/modules.order" ] || die "$KMOD has no modules.order"
	while read -r rel; do
		name=${rel##*/}
		name=${name%.ko}
		MOD_PATH[${name//-/_}]=$KMOD/$rel
	done <"$KMOD/modules.order"
}

# module_add NAME FILE: an extra module (out of tree) that module_order
# may name, at the absolute path FILE.
module_add() {
	MOD_PATH[${1//-/_}]=$2
}

# module_order MODULE...: appends to ORDER every MODULE after the modules
# it depends on, each once.
ORDER=()
module_order() {
	local m
	for m in "$@"; do
		module_visit "$m" 0
	done
}

module_visit() { # module depth
	local m=${1//-/_} depth=$2 deps d
	[ "$depth" -le 16 ] || die "module dependencies of $1 nest too deep"
	[ -z "${MOD_SEEN[$m]:-}" ] || return 0
	MOD_SEEN[$m]=1
	[ -n "${MOD_PATH[$m]:-}" ] || die "${KVER:-the kernel} has no module $m"
	[ -f "${MOD_PATH[$m]}" ] || die "module $m: ${MOD_PATH[$m]} is missing"
	deps=$(readelf -p .modinfo "${MOD_PATH[$m]}" 2>/dev/null | sed -n 's/.*depends=\(.*\)$/\1/p' | head -1)
	for d in ${deps//,/ }; do
		module_visit "$d" $((depth + 1))
	done
	ORDER+=("$m")
}

# stage_modules: the modules of ORDER as /lib/modules/NAME.ko, and their
# names in load order in /lib/modules/load-order (what the images' /init
# reads).
stage_modules() {
	local m
	mkdir -p "$STAGE/lib/modules"
	: >"$STAGE/lib/modules/load-order"
	for m in "${ORDER[@]}"; do
		cp "${MOD_PATH[$m]}" "$STAGE/lib/modules/$m.ko"
		echo "$m" >>"$STAGE/lib/modules/load-order"
	done
}

# modinfo_field FILE KEY: the value of KEY in a .ko's .modinfo.
modinfo_field() {
	readelf -p .modinfo "$1" 2>/dev/null | sed -n "s/.*\\b$2=\\(.*\\)\$/\\1/p" | head -1
}
