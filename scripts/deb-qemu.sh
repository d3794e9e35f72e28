#!/usr/bin/env bash
# deb-qemu.sh builds bin/vrdma-qemu_<version>-<revision>_amd64.deb: the
# patched QEMU (scripts/qemu-build.sh) as a package of its own, installed
# where it does not collide with Debian's QEMU:
#   /usr/lib/vrdma/bin/qemu-system-x86_64          stripped
#   /usr/share/doc/vrdma-qemu/{copyright,changelog.Debian.gz,README.vrdma}
#   /usr/share/doc/vrdma-qemu/patches/*.patch.gz   vmm/qemu/patches, what the
#                                                  build applied to QEMU's source
# Depends: the shared libraries dpkg-shlibdeps finds, and the firmware the
# binary loads from the paths it was configured with (--firmwarepath):
# seabios (bios-256k.bin), qemu-system-data (kvmvapic.bin, linuxboot_dma.bin
# for -kernel) and ipxe-qemu (efi-virtio.rom for a virtio-net-pci without
# romfile=, as libvirt's <interface> gives it).
#
# scripts/deb.sh runs it after building vrdma (make deb); it takes the
# version, the changelog and the output directory from there.
#
# Environment:
#   VERSION, DEB_REVISION  the package is VERSION-DEB_REVISION (required; deb.sh sets them)
#   VRDMA_DEB     the vrdma .deb just built, whose changelog.Debian.gz this
#                 package shares (one source package, one changelog)
#   DEB_MAINTAINER, SOURCE_DATE_EPOCH, OUTDIR, DEB_COMPRESS   as for deb.sh
#   QEMU_BIN      the binary to package (default: bin/qemu-system-x86_64, from
#                 make qemu); it must be QEMU 10.0.2 with vhost-user-rdma-pci
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
ARCH=amd64
PKG=vrdma-qemu
umask 022

OUTDIR=${OUTDIR:-bin}
QEMU_BIN=${QEMU_BIN:-bin/qemu-system-x86_64}
# The pinned source, its checksum, the configure line and the patches:
# qemu-build.sh sourced only defines them.
# shellcheck source-path=SCRIPTDIR source=qemu-build.sh
. scripts/qemu-build.sh

# After the sourcing, which defines a die of its own.
die() {
	echo "deb-qemu.sh: $*" >&2
	exit 1
}

for v in VERSION DEB_REVISION DEB_MAINTAINER SOURCE_DATE_EPOCH VRDMA_DEB; do
	[ -n "${!v:-}" ] || die "$v is not set (scripts/deb.sh runs this script)"
done
for t in dpkg-deb dpkg-shlibdeps strip gzip md5sum tar; do
	command -v "$t" >/dev/null || die "$t not found (apt-get install dpkg-dev binutils)"
done
# shellcheck disable=SC2031 # VERSION is ours; lib-backports.sh's subshell sources /etc/os-release
DEB_VERSION=$VERSION-$DEB_REVISION
export SOURCE_DATE_EPOCH

[ -x "$QEMU_BIN" ] || die "$QEMU_BIN is missing: run make qemu (or make deb, which does), or set DEB_QEMU=0 to build vrdma alone"
# The binary must be the one these sources make: QEMU_VERSION, and the
# named device of patches/0003 (`-device help` lists user-creatable
# devices only).
qver=$("$QEMU_BIN" --version | sed -n '1s/^QEMU emulator version \([0-9.]*\).*/\1/p')
[ "$qver" = "$QEMU_VERSION" ] || die "$QEMU_BIN is QEMU ${qver:-of unknown version}, not $QEMU_VERSION: run make qemu"
"$QEMU_BIN" -nodefaults -machine none -device help | grep -q '^name "vhost-user-rdma-pci", bus PCI' ||
	die "$QEMU_BIN has no vhost-user-rdma-pci (vmm/qemu/patches/0003): run make qemu"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg=$stage/pkg
doc=$pkg/usr/share/doc/$PKG
mkdir -p "$pkg/DEBIAN" "$pkg/usr/lib/vrdma/bin" "$doc/patches"

echo "deb-qemu.sh: building $PKG $DEB_VERSION from $QEMU_BIN"
# Stripped as dh_strip leaves a binary: the symbols and DWARF are two
# thirds of it.
strip --strip-unneeded --remove-section=.comment --remove-section=.note -o "$pkg/usr/lib/vrdma/bin/qemu-system-x86_64" "$QEMU_BIN"
chmod 0755 "$pkg/usr/lib/vrdma/bin/qemu-system-x86_64"
"$pkg/usr/lib/vrdma/bin/qemu-system-x86_64" --version >/dev/null || die "the stripped binary does not run"

install -m 0644 packaging/deb/qemu/copyright "$doc/copyright"
dpkg-deb --fsys-tarfile "$VRDMA_DEB" | tar -xOf - ./usr/share/doc/vrdma/changelog.Debian.gz >"$doc/changelog.Debian.gz" ||
	die "$VRDMA_DEB has no usr/share/doc/vrdma/changelog.Debian.gz"
chmod 0644 "$doc/changelog.Debian.gz"
while read -r p; do
	gzip -9n -c "$p" >"$doc/patches/$(basename "$p").gz"
	chmod 0644 "$doc/patches/$(basename "$p").gz"
done < <(patches)

# README.vrdma: what the binary is and how it was built, so that its
# source can be had again (GPL-2 section 3).
{
	title="vrdma-qemu: QEMU $QEMU_VERSION for vrdma"
	printf '%s\n%s\n' "$title" "${title//?/=}"
	cat <<README

/usr/lib/vrdma/bin/qemu-system-x86_64 is QEMU $QEMU_VERSION (x86_64 system
emulation only) with the vrdma patches, for VMs with vrdma's para-virtual RDMA
device (virtio device ID 42) served by vrdmad (package vrdma):

  qemu-system-x86_64 ... -object memory-backend-memfd,id=mem,size=2G,share=on \\
    -machine q35,memory-backend=mem \\
    -chardev socket,id=vm1-chr,path=/run/vrdma/vm1.sock,reconnect-ms=1000 \\
    -device vhost-user-rdma-pci,chardev=vm1-chr

It is installed beside Debian's QEMU, not in its place: name it in libvirt's
<emulator> (/usr/share/doc/vrdma/docs/libvirt-domain.xml) or on the command
line; /usr/share/doc/vrdma/docs/operations.md has the rest.

The patches (patches/ here):
README
	while read -r p; do
		printf '  %s: %s\n' "$(basename "$p")" "$(head -n 1 "$p")"
	done < <(patches)
	cat <<README

Source: $QEMU_TARBALL from Debian (bookworm-backports; also at
$SNAPSHOT_URL),
SHA-256 $QEMU_TARBALL_SHA256,
with the patches applied by patch -p1 in order, and unpack_edk2_blobs = false
in meson.build. Configured with:

README
	printf '  ../configure'
	printf ' \\\n    %s' "${CONFIGURE_ARGS[@]}"
	printf '\n\nand built as: ninja qemu-system-x86_64. vrdma'"'"'s scripts/qemu-build.sh does all of it.\n'
} >"$doc/README.vrdma"
chmod 0644 "$doc/README.vrdma"

# Depends: the libraries' packages, from the binary's DT_NEEDED and the
# installed packages' shlibs/symbols files.
shlibs=$(cd "$stage" && mkdir -p debian && printf 'Source: vrdma\n\nPackage: %s\nArchitecture: %s\n' "$PKG" "$ARCH" >debian/control &&
	dpkg-shlibdeps -O -e"$pkg/usr/lib/vrdma/bin/qemu-system-x86_64" 2>"$stage/shlibdeps.err" |
	sed -n 's/^shlibs:Depends=//p') || true
[ -n "$shlibs" ] || die "dpkg-shlibdeps found no dependencies: $(cat "$stage/shlibdeps.err")"

(cd "$pkg" && find . -type f ! -path ./DEBIAN/\* -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) >"$pkg/DEBIAN/md5sums"
chmod 0644 "$pkg/DEBIAN/md5sums"
find "$pkg" -type d -exec chmod 0755 {} +
find "$pkg" -exec touch --no-dereference -d "@$SOURCE_DATE_EPOCH" {} +

size=$(du -sk --apparent-size --exclude=DEBIAN "$pkg" | cut -f1)
cat >"$pkg/DEBIAN/control" <<CTRL
Package: $PKG
Source: vrdma
Version: $DEB_VERSION
Architecture: $ARCH
Maintainer: $DEB_MAINTAINER
Installed-Size: $size
Depends: $shlibs, seabios, qemu-system-data, ipxe-qemu
Recommends: vrdma
Section: otherosfs
Priority: optional
Homepage: https://github.com/vrdma/vrdma
Description: QEMU $QEMU_VERSION with vrdma's para-virtual RDMA device
 This is QEMU's x86_64 system emulator, version $QEMU_VERSION, with the vrdma
 patches: the device vhost-user-rdma-pci (virtio device ID 42, served by
 vrdmad from the package vrdma over vhost-user), QEMU's generic vhost-user
 device made user-creatable, and VMs that live through a restart of their
 vhost-user back-end.
 .
 It is installed as /usr/lib/vrdma/bin/qemu-system-x86_64, beside Debian's
 QEMU (packages qemu-system-x86 and qemu-utils, which it does not need), for
 libvirt's <emulator> or a command line of one's own. It uses Debian's
 firmware (SeaBIOS, the option ROMs of qemu-system-data, iPXE).
CTRL
chmod 0644 "$pkg/DEBIAN/control"

mkdir -p "$OUTDIR"
deb=$OUTDIR/${PKG}_${DEB_VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Z"${DEB_COMPRESS:-xz}" --build "$pkg" "$deb" >/dev/null
echo "deb-qemu.sh: wrote $deb"
