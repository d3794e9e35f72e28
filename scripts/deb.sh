#!/usr/bin/env bash
# deb.sh builds bin/vrdma_<version>_amd64.deb for hypervisor hosts:
#   /usr/bin/{vrdmad,vrdmactl,vrdma-perf}
#   /lib/systemd/system/vrdmad.service
#   /etc/default/vrdmad                    (conffile)
#   /usr/share/man/man8/{vrdmad,vrdmactl}.8.gz, man1/vrdma-perf.1.gz
#   /usr/share/doc/vrdma/{README.md,*.md}
#
# Environment:
#   VERSION   package version (default: from `git describe --always`)
#   OUTDIR    where the .deb goes (default: bin)
#   HELP2MAN  help2man to use, or "none" to write the man pages without it
#             (default: help2man if installed)
#   GO        go command (default: go)
#   DEB_COMPRESS  dpkg-deb compressor: xz (default), gzip (faster; tests) or zstd
#
# Manual pages come from each program's --help: through help2man when it
# is installed (apt-get install help2man), else as a short roff page that
# wraps the --help text.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
GO=${GO:-go}
OUTDIR=${OUTDIR:-bin}
ARCH=amd64
export CGO_ENABLED=0 GOOS=linux GOARCH=$ARCH GOFLAGS=${GOFLAGS:--buildvcs=false}

for t in dpkg-deb gzip; do
	command -v "$t" >/dev/null || { echo "deb.sh: $t not found (apt-get install dpkg gzip)" >&2; exit 1; }
done
command -v "$GO" >/dev/null || { echo "deb.sh: $GO not found: install Go 1.26" >&2; exit 1; }

# debian_version turns `git describe` output into a Debian version: it must
# start with a digit and may hold only [A-Za-z0-9.+~-].
debian_version() {
	local d
	d=$(git -C "$root" describe --always --tags --dirty 2>/dev/null) || d=""
	case "$d" in
	"") echo "0.1.0" ;;
	v[0-9]* | [0-9]*)
		# v1.2.3-4-gabcdef[-dirty] → 1.2.3+4.gabcdef[.dirty]
		d=${d#v}
		local base=${d%%-*} rest=""
		[[ "$d" == *-* ]] && rest=${d#*-}
		if [ -n "$rest" ]; then echo "${base}+${rest//-/.}"; else echo "$base"; fi
		;;
	*) echo "0.1.0+${d//-/.}" ;; # a bare commit: 0.1.0+abcdef[.dirty]
	esac
}
VERSION=${VERSION:-$(debian_version)}
if ! [[ "$VERSION" =~ ^[0-9][A-Za-z0-9.+~-]*$ ]]; then
	echo "deb.sh: VERSION $VERSION is not a Debian version" >&2
	exit 1
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg=$stage/pkg
mkdir -p "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/lib/systemd/system" "$pkg/etc/default" \
	"$pkg/usr/share/doc/vrdma" "$pkg/usr/share/man/man1" "$pkg/usr/share/man/man8"

echo "deb.sh: building vrdma $VERSION"
for c in vrdmad vrdmactl vrdma-perf; do
	"$GO" build -trimpath -ldflags "-s -w -X main.version=$VERSION" -o "$pkg/usr/bin/$c" "./cmd/$c"
done
install -m 0644 packaging/vrdmad.service "$pkg/lib/systemd/system/vrdmad.service"
install -m 0644 packaging/vrdmad.default "$pkg/etc/default/vrdmad"
install -m 0644 README.md "$pkg/usr/share/doc/vrdma/README.md"
for f in docs/*.md; do
	[ -e "$f" ] && install -m 0644 "$f" "$pkg/usr/share/doc/vrdma/$(basename "$f")"
done

# roff_escape makes plain text safe inside a .nf block of a man page.
roff_escape() {
	sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"
}

# manpage NAME SECTION SUMMARY writes usr/share/man/manSECTION/NAME.SECTION.gz.
manpage() {
	local name=$1 sec=$2 summary=$3 bin=$pkg/usr/bin/$1
	local out=$stage/$name.$sec help
	local h2m=${HELP2MAN-}
	if [ -z "$h2m" ]; then h2m=$(command -v help2man || true); fi
	if [ -n "$h2m" ] && [ "$h2m" != none ] &&
		"$h2m" --no-info --no-discard-stderr --section="$sec" --name="$summary" \
			--version-string="$VERSION" --help-option=--help --output="$out" "$bin" 2>/dev/null &&
		[ -s "$out" ]; then
		:
	else
		# --help may exit non-zero and may print on stderr (flag's default).
		help=$("$bin" --help 2>&1 || true)
		if [ -z "$help" ]; then
			echo "deb.sh: $name --help printed nothing" >&2
			exit 1
		fi
		local upper
		upper=$(tr '[:lower:]' '[:upper:]' <<<"$name")
		{
			printf '.TH %s %s "%s" "vrdma %s" "vrdma"\n' "$upper" "$sec" "$(date -u +%Y-%m-%d ${SOURCE_DATE_EPOCH:+-d @$SOURCE_DATE_EPOCH})" "$VERSION"
			printf '.SH NAME\n%s \\- %s\n' "$name" "$summary"
			printf '.SH SYNOPSIS\n.B %s\n[\\fIOPTIONS\\fR]\n' "$name"
			printf '.SH DESCRIPTION\nThe text below is the output of\n.BR "%s --help" .\n.PP\n.nf\n' "$name"
			roff_escape <<<"$help"
			printf '.fi\n.SH SEE ALSO\n'
			printf '.BR vrdmad (8),\n.BR vrdmactl (8),\n.BR vrdma-perf (1),\n/usr/share/doc/vrdma/\n'
		} >"$out"
	fi
	gzip -9n -c "$out" >"$pkg/usr/share/man/man$sec/$name.$sec.gz"
	chmod 0644 "$pkg/usr/share/man/man$sec/$name.$sec.gz"
}
manpage vrdmad 8 "vrdma host daemon: para-virtual RDMA devices for QEMU over vhost-user"
manpage vrdmactl 8 "control a running vrdmad: add, remove and list devices"
manpage vrdma-perf 1 "measure vrdma's data path with in-process front-ends"

echo /etc/default/vrdmad >"$pkg/DEBIAN/conffiles"

# The service is not enabled or started on install: the administrator
# decides (systemctl enable --now vrdmad). Upgrades restart it if it runs.
cat >"$pkg/DEBIAN/postinst" <<'SH'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null || true
	if [ "$1" = configure ] && [ -n "$2" ]; then
		systemctl try-restart vrdmad.service >/dev/null || true
	fi
fi
exit 0
SH
cat >"$pkg/DEBIAN/prerm" <<'SH'
#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
	systemctl stop vrdmad.service >/dev/null || true
	systemctl disable vrdmad.service >/dev/null 2>&1 || true
fi
exit 0
SH
cat >"$pkg/DEBIAN/postrm" <<'SH'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null || true
fi
if [ "$1" = purge ]; then
	rm -rf /var/lib/vrdma
fi
exit 0
SH
chmod 0755 "$pkg/DEBIAN/postinst" "$pkg/DEBIAN/prerm" "$pkg/DEBIAN/postrm"

size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
cat >"$pkg/DEBIAN/control" <<CTRL
Package: vrdma
Version: $VERSION
Architecture: $ARCH
Maintainer: vrdma developers <vrdma@localhost>
Section: admin
Priority: optional
Installed-Size: $size
Recommends: qemu-system-x86
Description: para-virtual RDMA for QEMU VMs over vhost-user
 vrdmad is a host daemon that implements the device side of a para-virtual
 RDMA device (virtio device ID 42) over the vhost-user protocol: QEMU
 attaches it with a unix socket. The package holds vrdmad, its control
 tool vrdmactl, the vrdma-perf benchmark, a systemd unit (not enabled on
 install) and documentation.
CTRL

mkdir -p "$OUTDIR"
deb=$OUTDIR/vrdma_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Z"${DEB_COMPRESS:-xz}" --build "$pkg" "$deb" >/dev/null
echo "deb.sh: wrote $deb"
