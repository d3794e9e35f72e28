#!/usr/bin/env bash
# deb.sh builds bin/vrdma_<version>-<revision>_amd64.deb for hypervisor
# hosts, and beside it vrdma-qemu (scripts/deb-qemu.sh: the patched QEMU of
# make qemu), without debhelper, to Debian policy (lintian reports no errors;
# packaging/packaging_test.go and packaging/qemu_deb_test.go run it):
#   /usr/bin/{vrdmad,vrdmactl,vrdma-perf}          Go programs (PIE, no shared library), stripped
#   /lib/systemd/system/vrdmad.service, vrdmad.socket, vrdmad-device@.socket
#   /usr/lib/sysusers.d/vrdma.conf                 the vrdma system user
#   /etc/default/vrdmad                            (conffile)
#   /usr/share/man/man8/{vrdmad,vrdmactl}.8.gz, man1/vrdma-perf.1.gz   packaging/man/
#   /usr/share/bash-completion/completions/vrdmactl, /usr/share/zsh/vendor-completions/_vrdmactl
#   /usr/share/doc/vrdma/{copyright,changelog.Debian.gz,README.md}
#   /usr/share/doc/vrdma/docs/{*.md,*.png,libvirt-domain.xml}  (README.md's links resolve)
#   /usr/share/lintian/overrides/vrdma             (the warnings kept, with reasons)
# and the maintainer scripts of packaging/deb/ (postinst: the vrdma user
# through systemd-sysusers, then enable vrdmad.socket and vrdmad.service
# and start the socket, as dh_installsystemd would; prerm; postrm).
#
# Environment:
#   VERSION       upstream version (default: from `git describe --always`)
#   DEB_REVISION  Debian revision (default: 1): the package is VERSION-DEB_REVISION
#   DEB_MAINTAINER  the Maintainer field (default: packaging/deb/changelog's)
#   OUTDIR        where the .debs go (default: bin)
#   DEB_QEMU      0: build vrdma alone, not vrdma-qemu (default: 1, which needs
#                 bin/qemu-system-x86_64 from make qemu, or QEMU_BIN)
#   GO            go command (default: go)
#   DEB_COMPRESS  dpkg-deb compressor: xz (default), gzip (faster; tests) or zstd
#   SOURCE_DATE_EPOCH  timestamp of the files, the man pages and the changelog
#                 entry (default: the last commit's time): the same tree gives
#                 the same .deb
#
# The manual pages are written by hand (packaging/man, man(7) macros);
# this script stamps the build's date and version on their .TH line.
# packaging/man_test.go checks them against each program's --help.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
GO=${GO:-go}
OUTDIR=${OUTDIR:-bin}
ARCH=amd64
export CGO_ENABLED=0 GOOS=linux GOARCH=$ARCH GOFLAGS=${GOFLAGS:--buildvcs=false}
umask 022

for t in dpkg-deb gzip md5sum; do
	command -v "$t" >/dev/null || { echo "deb.sh: $t not found (apt-get install dpkg gzip coreutils)" >&2; exit 1; }
done
command -v "$GO" >/dev/null || { echo "deb.sh: $GO not found: install Go 1.26" >&2; exit 1; }
for f in packaging/vrdmad.service packaging/vrdmad.socket packaging/vrdmad-device@.socket packaging/vrdmad.default \
	packaging/deb/copyright packaging/deb/changelog packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm \
	packaging/deb/sysusers.conf packaging/deb/lintian-overrides packaging/man/vrdmad.8 packaging/man/vrdmactl.8 \
	packaging/man/vrdma-perf.1; do
	[ -f "$f" ] || { echo "deb.sh: $f is missing" >&2; exit 1; }
done

# debian_version turns `git describe` output into an upstream version: it
# must start with a digit and may hold only [A-Za-z0-9.+~] (no '-': the
# Debian revision follows it). A tag v1.2.3 gives 1.2.3, four commits past
# it 1.2.3+4.gabcdef, an untagged tree 0.1.0+gabcdef; ".dirty" marks
# uncommitted changes.
debian_version() {
	local d
	if d=$(git -C "$root" describe --tags --dirty 2>/dev/null) && [[ "$d" =~ ^v?[0-9] ]]; then
		# v1.2.3-4-gabcdef[-dirty] → 1.2.3+4.gabcdef[.dirty]
		d=${d#v}
		local base=${d%%-*} rest=""
		[[ "$d" == *-* ]] && rest=${d#*-}
		if [ -n "$rest" ]; then echo "${base}+${rest//-/.}"; else echo "$base"; fi
	elif d=$(git -C "$root" describe --always --dirty 2>/dev/null); then
		echo "0.1.0+g${d//-/.}" # 0.1.0+gabcdef[.dirty]
	else
		echo "0.1.0"
	fi
}
VERSION=${VERSION:-$(debian_version)}
if ! [[ "$VERSION" =~ ^[0-9][A-Za-z0-9.+~]*$ ]]; then
	echo "deb.sh: VERSION $VERSION is not an upstream version (a digit, then [A-Za-z0-9.+~])" >&2
	exit 1
fi
# The source revision the programs report (internal/version), "" outside
# a git checkout.
REVISION=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || true)
if [ -n "$REVISION" ] && ! git -C "$root" diff --quiet HEAD 2>/dev/null; then
	REVISION="$REVISION-dirty"
fi
DEB_REVISION=${DEB_REVISION:-1}
if ! [[ "$DEB_REVISION" =~ ^[A-Za-z0-9.+~]+$ ]]; then
	echo "deb.sh: DEB_REVISION $DEB_REVISION is not a Debian revision" >&2
	exit 1
fi
DEB_VERSION=$VERSION-$DEB_REVISION
# The maintainer of packaging/deb/changelog's latest entry.
DEB_MAINTAINER=${DEB_MAINTAINER:-$(sed -n 's/^ -- \(.*>\)  .*/\1/p' packaging/deb/changelog | head -1)}
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null || date +%s)
fi
export SOURCE_DATE_EPOCH

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg=$stage/pkg
doc=$pkg/usr/share/doc/vrdma
mkdir -p "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/lib/systemd/system" "$pkg/etc/default" "$pkg/usr/lib/sysusers.d" \
	"$doc" "$pkg/usr/share/man/man1" "$pkg/usr/share/man/man8" \
	"$pkg/usr/share/bash-completion/completions" "$pkg/usr/share/zsh/vendor-completions" "$pkg/usr/share/lintian/overrides"

echo "deb.sh: building vrdma $DEB_VERSION"
for c in vrdmad vrdmactl vrdma-perf; do
	# -buildmode=pie: a position-independent executable (ASLR; Debian's
	# default for C programs): with CGO_ENABLED=0 it needs only the dynamic
	# loader for its relocations, no shared library. A static Go program
	# is a lintian error (statically-linked-binary) unless it comes from a
	# source package that build-depends on golang-go, which this is not.
	# -s -w: stripped (no symbol table, no DWARF), as dh_strip leaves a
	# binary; -trimpath: no build paths in it.
	# vrdmad is built with cgo: its verbs RNIC calls the host's libibverbs,
	# which it dlopens at run time (Recommends: libibverbs1,
	# ibverbs-providers), so it links glibc alone (Depends: libc6).
	cgo=0
	[ "$c" = vrdmad ] && cgo=1
	CGO_ENABLED=$cgo "$GO" build -buildmode=pie -trimpath -ldflags "-s -w -X github.com/vrdma/vrdma/internal/version.Version=$VERSION -X github.com/vrdma/vrdma/internal/version.linkedRevision=$REVISION" -o "$pkg/usr/bin/$c" "./cmd/$c"
done
install -m 0644 packaging/vrdmad.service packaging/vrdmad.socket packaging/vrdmad-device@.socket "$pkg/lib/systemd/system/"
install -m 0644 packaging/vrdmad.default "$pkg/etc/default/vrdmad"
install -m 0644 packaging/deb/sysusers.conf "$pkg/usr/lib/sysusers.d/vrdma.conf"
install -m 0644 packaging/deb/lintian-overrides "$pkg/usr/share/lintian/overrides/vrdma"
"$pkg/usr/bin/vrdmactl" completion bash >"$pkg/usr/share/bash-completion/completions/vrdmactl"
# zsh's compinit autoloads _vrdmactl from $fpath (Debian's zsh has
# vendor-completions in it) by its #compdef line.
"$pkg/usr/bin/vrdmactl" completion zsh >"$pkg/usr/share/zsh/vendor-completions/_vrdmactl"
chmod 0644 "$pkg/usr/share/bash-completion/completions/vrdmactl" "$pkg/usr/share/zsh/vendor-completions/_vrdmactl"

install -m 0644 packaging/deb/copyright "$doc/copyright"
install -m 0644 README.md "$doc/README.md"
# docs/ as it is in the tree, beside README.md, so that the relative links
# of both resolve (packaging/doclinks_test.go checks them against the
# package's files). Uncompressed: a compressed .md breaks its links.
mkdir -p "$doc/docs"
for f in docs/*.md docs/*.png docs/*.xml; do
	[ -e "$f" ] && install -m 0644 "$f" "$doc/docs/$(basename "$f")"
done

# changelog.Debian.gz: packaging/deb/changelog, under an entry for this
# build when its version is not the latest entry's.
{
	if [ "$(sed -n '1s/^vrdma (\([^)]*\)).*/\1/p' packaging/deb/changelog)" != "$DEB_VERSION" ]; then
		printf 'vrdma (%s) unstable; urgency=medium\n\n' "$DEB_VERSION"
		printf '  * Built from the vrdma tree at %s.\n\n' \
			"$(git -C "$root" describe --always --tags --dirty 2>/dev/null || echo "$VERSION")"
		printf ' -- %s  %s\n\n' "$DEB_MAINTAINER" "$(date -u -R -d "@$SOURCE_DATE_EPOCH")"
	fi
	cat packaging/deb/changelog
} | gzip -9n >"$doc/changelog.Debian.gz"
chmod 0644 "$doc/changelog.Debian.gz"

# The manual pages, with this build's date and version on the .TH line
# (".TH NAME SECTION DATE SOURCE MANUAL").
mandate=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)
for page in packaging/man/vrdmad.8 packaging/man/vrdmactl.8 packaging/man/vrdma-perf.1; do
	name=$(basename "$page")
	sec=${name##*.}
	sed "s/^\.TH \([^ ]*\) \([^ ]*\) [^ ]* \"[^\"]*\" /.TH \1 \2 $mandate \"vrdma $VERSION\" /" "$page" >"$stage/$name"
	if ! grep -q "^\.TH [^ ]* $sec $mandate \"vrdma $VERSION\" " "$stage/$name"; then
		echo "deb.sh: $page: no .TH NAME $sec DATE \"SOURCE\" line to stamp" >&2
		exit 1
	fi
	gzip -9n -c "$stage/$name" >"$pkg/usr/share/man/man$sec/$name.gz"
	chmod 0644 "$pkg/usr/share/man/man$sec/$name.gz"
done

echo /etc/default/vrdmad >"$pkg/DEBIAN/conffiles"
install -m 0755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm "$pkg/DEBIAN/"

# md5sums of every file but the conffiles (dpkg keeps theirs), as
# dh_md5sums writes it.
(cd "$pkg" && find . -type f ! -path ./DEBIAN/\* ! -path ./etc/\* -printf '%P\0' | LC_ALL=C sort -z |
	xargs -0 md5sum) >"$pkg/DEBIAN/md5sums"
chmod 0644 "$pkg/DEBIAN/md5sums" "$pkg/DEBIAN/conffiles"
find "$pkg" -type d -exec chmod 0755 {} +
find "$pkg" -exec touch --no-dereference -d "@$SOURCE_DATE_EPOCH" {} +

size=$(du -sk --apparent-size --exclude=DEBIAN "$pkg" | cut -f1)
cat >"$pkg/DEBIAN/control" <<CTRL
Package: vrdma
Version: $DEB_VERSION
Architecture: $ARCH
Maintainer: $DEB_MAINTAINER
Installed-Size: $size
Depends: libc6 (>= 2.34), systemd | systemd-standalone-sysusers | systemd-sysusers
Recommends: vrdma-qemu, libibverbs1, ibverbs-providers
Section: admin
Priority: optional
Homepage: https://github.com/vrdma/vrdma
Description: para-virtual RDMA for QEMU VMs over vhost-user
 vrdmad is a host daemon that implements the device side of a para-virtual
 RDMA device (virtio device ID 42) over the vhost-user protocol: QEMU
 attaches it with a unix socket (vrdma-qemu has a QEMU with the device,
 vhost-user-rdma-pci). The package holds vrdmad, its control
 tool vrdmactl, the vrdma-perf benchmark, the systemd units (vrdmad.socket
 and vrdmad.service, enabled on install; the daemon runs as the system user
 vrdma) and documentation.
CTRL
chmod 0644 "$pkg/DEBIAN/control"

mkdir -p "$OUTDIR"
deb=$OUTDIR/vrdma_${DEB_VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Z"${DEB_COMPRESS:-xz}" --build "$pkg" "$deb" >/dev/null
echo "deb.sh: wrote $deb"

# The second package, vrdma-qemu: the patched QEMU (scripts/deb-qemu.sh).
if [ "${DEB_QEMU:-1}" != 0 ]; then
	VERSION=$VERSION DEB_REVISION=$DEB_REVISION DEB_MAINTAINER=$DEB_MAINTAINER SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH \
		OUTDIR=$OUTDIR VRDMA_DEB=$deb bash scripts/deb-qemu.sh
fi
