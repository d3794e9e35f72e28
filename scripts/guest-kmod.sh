#!/usr/bin/env bash
# The guest kernel driver (guest/kernel) built out of tree for the guest
# image's kernel: bin/guest-stack/vrdma.ko.
#
#   bash scripts/guest-kmod.sh            # build when an input changed
#   bash scripts/guest-kmod.sh --force    # build anyway
#   bash scripts/guest-kmod.sh --check    # kernel style: checkpatch.pl, no errors
#
# The kernel version is the one scripts/guest-image.sh puts in the image (the
# newest linux-image-6.1.0-N-cloud-amd64, scripts/lib-image.sh newest_kernel),
# and the module is built against the matching linux-headers-$KVER, which
# this script installs with apt-get when missing (as root; it pulls
# linux-kbuild-6.1 and gcc-12). Sources are copied to a build directory
# outside the checkout (~/.cache/vrdma/kmod/build) so guest/kernel stays
# clean; the build runs with W=1 and fails on any compiler warning. A stamp
# with the inputs' hashes and KVER makes a run with nothing changed do
# nothing.
#
# --check runs the kernel's scripts/checkpatch.pl (--no-tree -f) on
# guest/kernel/*.[ch]. The headers package has no checkpatch, so the script
# takes checkpatch.pl, spelling.txt and const_structs.checkpatch out of
# Debian's linux-source-6.1 package (139 MB download, about 10 s to extract
# the three files) once into ~/.cache/vrdma/checkpatch. It fails on any
# error or warning.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${HOME:-/root}/.cache/vrdma/kmod"
CPCACHE="${HOME:-/root}/.cache/vrdma/checkpatch"
OUT="$ROOT/bin/guest-stack"
IMAGE=guest-kmod
# shellcheck source=scripts/lib-image.sh
. "$ROOT/scripts/lib-image.sh"

mode=build
force=
for arg in "$@"; do
	case $arg in
	--check) mode=check ;;
	--force) force=1 ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*) die "unknown argument $arg (use --check, --force)" ;;
	esac
done

SRCS=("$ROOT"/guest/kernel/*.c "$ROOT"/guest/kernel/*.h)
[ -f "${SRCS[0]}" ] || die "guest/kernel has no sources"

# --- checkpatch ---------------------------------------------------------------

if [ "$mode" = check ]; then
	CP="$CPCACHE/scripts/checkpatch.pl"
	if [ ! -f "$CP" ]; then
		need_root
		mkdir -p "$CPCACHE/debs"
		SDEB=$(fetch_deb "$CPCACHE/debs" linux-source-6.1)
		say "extract checkpatch from $(basename "$SDEB")"
		tmp=$(mktemp -d "$CPCACHE/x.XXXXXX")
		trap 'rm -rf "$tmp"' EXIT
		dpkg-deb --fsys-tarfile "$SDEB" | tar -xO ./usr/src/linux-source-6.1.tar.xz |
			xz -dc | tar -x -C "$tmp" --wildcards \
			'linux-source-6.1/scripts/checkpatch.pl' \
			'linux-source-6.1/scripts/spelling.txt' \
			'linux-source-6.1/scripts/const_structs.checkpatch'
		mkdir -p "$CPCACHE/scripts"
		cp "$tmp"/linux-source-6.1/scripts/* "$CPCACHE/scripts/"
		basename "$SDEB" >"$CPCACHE/scripts/.from"
		rm -f "$SDEB" # 139 MB, no longer needed
	fi
	say "checkpatch ($(cat "$CPCACHE/scripts/.from" 2>/dev/null || echo cached))"
	cd "$ROOT"
	out=$(perl "$CP" --no-tree --terse --show-types -f "${SRCS[@]#"$ROOT"/}" 2>&1) || true
	printf '%s\n' "$out"
	if printf '%s\n' "$out" | grep -Eq ': (ERROR|WARNING):'; then
		die "checkpatch found problems"
	fi
	say "checkpatch: no errors, no warnings"
	exit 0
fi

# --- build --------------------------------------------------------------------

newest_kernel cloud-amd64 cloud
KDIR="/usr/src/linux-headers-$KVER"
if [ ! -f "$KDIR/Makefile" ]; then
	need_root
	say "apt-get install linux-headers-$KVER"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q "linux-headers-$KVER" >&2 || {
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q "linux-headers-$KVER" >&2
	}
	[ -f "$KDIR/Makefile" ] || die "linux-headers-$KVER left no $KDIR/Makefile"
fi

INPUTS="$(input_hashes "${SRCS[@]}" "$ROOT/guest/kernel/Kbuild" \
	"$ROOT/guest/include/vrdma-abi.h" "$0") $KVER"
STAMP="$CACHE/vrdma.ko.stamp"
mkdir -p "$OUT" "$CACHE"
if [ -z "$force" ] && up_to_date "$OUT/vrdma.ko" "$STAMP" "$INPUTS"; then
	say "bin/guest-stack/vrdma.ko is up to date ($KVER)"
	exit 0
fi

# The build tree mirrors guest/ so Kbuild's -I$(src)/../include holds.
BUILD="$CACHE/build"
rm -rf "$BUILD"
mkdir -p "$BUILD/kernel" "$BUILD/include"
cp "${SRCS[@]}" "$ROOT/guest/kernel/Kbuild" "$BUILD/kernel/"
cp "$ROOT/guest/include/vrdma-abi.h" "$BUILD/include/"
say "make modules W=1 against $KVER"
log="$CACHE/build.log"
if ! nice make -C "$KDIR" M="$BUILD/kernel" W=1 modules >"$log" 2>&1; then
	cat "$log" >&2
	die "build failed"
fi
if grep -E 'warning:|error:' "$log" >&2; then
	die "the build has warnings (W=1); see $log"
fi
modinfo=$(strings "$BUILD/kernel/vrdma.ko" | grep '^vermagic=' || true)
case $modinfo in
"vermagic=$KVER "*) ;;
*) die "vrdma.ko has $modinfo, want $KVER" ;;
esac
cp "$BUILD/kernel/vrdma.ko" "$OUT/vrdma.ko.tmp"
mv "$OUT/vrdma.ko.tmp" "$OUT/vrdma.ko"
printf '%s' "$INPUTS" >"$STAMP"
say "bin/guest-stack/vrdma.ko <- $KVER"
