# shellcheck shell=bash
# Helpers shared by the guest-image recipes (scripts/guest-image.sh,
# scripts/rxe-image.sh): Debian packages fetched once into a cache, a
# staging tree with busybox, and the initramfs packed from it with
# busybox's own cpio (no host cpio needed).
#
# Sourced, not run. The caller sets, before sourcing:
#   IMAGE  the name messages start with ("guest-image", "rxe-image")
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

fetch_deb() { # dir package -> prints the cached .deb path
	local dir=$1 pkg=$2 deb
	deb=$(ls "$dir/${pkg}"_*.deb 2>/dev/null | sort -V | tail -1 || true)
	if [ -z "$deb" ]; then
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
