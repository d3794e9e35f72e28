#!/usr/bin/env bash
# go-toolchain.sh prints the go command to build vrdma with: a Go at least as
# new as go.mod asks (its toolchain line, else its go line). Where there is
# none it gets one by itself:
#
#   1. A go that is new enough, the first of: `go` in $PATH, /usr/local/go
#      (go.dev's tarball), Debian's /usr/lib/go-1.NN (newest first), a
#      toolchain the go command fetched before (module cache).
#   2. Without any Go 1.21 or later (the first that can fetch toolchains):
#      Debian's golang-go from <codename>-backports (Go 1.23 on bookworm), as
#      root, through the private apt configuration of lib-backports.sh.
#   3. With a Go 1.21 or later that is too old: the toolchain go.mod names,
#      through the Go module proxy (GOTOOLCHAIN=goX.Y.Z: the go command
#      downloads it, checks it against the checksum database and keeps it in
#      the module cache); its go is printed.
#
# Otherwise it prints one line saying what to install (stderr) and exits 1.
# Progress notes go to stderr; stdout has the go command and nothing else.
#
# Usage: scripts/go-toolchain.sh [--no-install]
#   --no-install   never install or download: print a go that is new enough, or fail
#
# Environment:
#   GOTOOLCHAIN=local          never fetch a toolchain (the go command's own switch)
#   GO_TOOLCHAIN_APT=0         never install Debian's golang-go
#   GO_TOOLCHAIN_SEARCH="..."  the go commands to try, instead of the places above (tests)
#   GO_TOOLCHAIN_APT_CMD=CMD   run CMD instead of the apt-get install (tests)
#   GO_TOOLCHAIN_GOMOD=FILE    the go.mod to read (default: the repository's)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GOMOD=${GO_TOOLCHAIN_GOMOD:-$ROOT/go.mod}
# The first Go that switches toolchains by itself (GOTOOLCHAIN).
readonly SWITCH_MIN=1.21

log() { printf 'go-toolchain: %s\n' "$*" >&2; }
run() {
	printf '+ %s\n' "$*" >&2
	"$@"
}
die() {
	printf 'go-toolchain: %s\n' "$*" >&2
	exit 1
}

# vkey prints a sortable key of a Go version (1.26.8, 1.26, 1.26rc1 as 1.26).
vkey() {
	local v=${1%%[!0-9.]*} a b c
	IFS=. read -r a b c _ <<<"$v"
	printf '%05d%05d%05d\n' "$((10#${a:-0}))" "$((10#${b:-0}))" "$((10#${c:-0}))"
}

# ver_ge A B: version A is B or later.
ver_ge() {
	local a b
	a=$(vkey "$1")
	b=$(vkey "$2")
	[[ ! "$a" < "$b" ]]
}

# required prints the Go version go.mod asks for: its toolchain line if
# that is newer than its go line.
required() {
	[[ -r "$GOMOD" ]] || die "cannot read $GOMOD"
	local gov tc
	gov=$(awk '$1 == "go" { print $2; exit }' "$GOMOD")
	tc=$(awk '$1 == "toolchain" && $2 ~ /^go[0-9]/ { print substr($2, 3); exit }' "$GOMOD")
	[[ "$gov" =~ ^[0-9]+\.[0-9]+ ]] || die "no go line in $GOMOD"
	if [[ -n "$tc" ]] && ver_ge "$tc" "$gov"; then
		printf '%s\n' "$tc"
	else
		printf '%s\n' "$gov"
	fi
}

# version_of GO prints the version of the go command GO (1.26.8), or nothing
# if it does not run. GOTOOLCHAIN=local: the go's own version, never a switch.
version_of() {
	local out v
	out=$(cd / && GOTOOLCHAIN=local GOFLAGS='' "$1" version 2>/dev/null) || return 0
	# "go version go1.26.8 linux/amd64", or "go version devel go1.27-abc ..."
	# shellcheck disable=SC2086 # split into words on purpose
	set -- $out
	v=${3:-}
	[[ "$v" == devel ]] && v=${4:-}
	v=${v#go}
	[[ "$v" =~ ^[0-9]+\.[0-9]+ ]] && printf '%s\n' "${v%%[-+ ]*}"
	return 0
}

# candidates prints the go commands to try, in order of preference.
candidates() {
	if [[ -n "${GO_TOOLCHAIN_SEARCH+set}" ]]; then
		# shellcheck disable=SC2086 # a list of paths, split on purpose
		printf '%s\n' $GO_TOOLCHAIN_SEARCH
		return
	fi
	command -v go 2>/dev/null || true
	echo /usr/local/go/bin/go
	compgen -G '/usr/lib/go-1.*/bin/go' | sort -rV || true
	local cache=${GOMODCACHE:-${GOPATH:-$HOME/go}}
	[[ -n "${GOMODCACHE:-}" ]] || cache=${cache%%:*}/pkg/mod
	compgen -G "$cache/golang.org/toolchain@v0.0.1-go*/bin/go" | sort -rV || true
}

# scan looks at every candidate: FOUND is the first new enough, SWITCHER the
# newest that can fetch a toolchain, SEEN describes what was found.
FOUND="" SWITCHER="" SWITCHER_V="" SEEN=""
scan() {
	FOUND="" SWITCHER="" SWITCHER_V="" SEEN=""
	local c v real
	local -A tried=()
	while read -r c; do
		[[ -n "$c" && -f "$c" && -x "$c" ]] || continue
		real=$(readlink -f "$c")
		[[ -z "${tried[$real]:-}" ]] || continue
		tried[$real]=1
		v=$(version_of "$c")
		[[ -n "$v" ]] || continue
		SEEN+="${SEEN:+, }go $v at $c"
		if ver_ge "$v" "$WANT"; then
			FOUND=$c
			return
		fi
		if ver_ge "$v" "$SWITCH_MIN" && { [[ -z "$SWITCHER" ]] || ! ver_ge "$SWITCHER_V" "$v"; }; then
			SWITCHER=$c SWITCHER_V=$v
		fi
	done < <(candidates)
}

# install_backports_go installs Debian's golang-go from <codename>-backports.
install_backports_go() {
	[[ "${GO_TOOLCHAIN_APT:-1}" != 0 ]] || return 1
	if [[ -n "${GO_TOOLCHAIN_APT_CMD:-}" ]]; then
		log "installing golang-go: $GO_TOOLCHAIN_APT_CMD"
		$GO_TOOLCHAIN_APT_CMD >&2
		return
	fi
	[[ $EUID -eq 0 ]] && command -v apt-get >/dev/null && [[ -r /etc/debian_version ]] || return 1
	# shellcheck source=lib-backports.sh
	. "$ROOT/scripts/lib-backports.sh"
	setup_backports_apt
	log "no Go $SWITCH_MIN or later here: installing golang-go from $SUITE_BPO"
	run env DEBIAN_FRONTEND=noninteractive apt-get "${APT_COMMON[@]}" "${APT_PRIVATE[@]}" \
		install -t "$SUITE_BPO" --no-install-recommends golang-go >&2
}

# fetch_toolchain has SWITCHER fetch go$DL through the module proxy and
# prints the fetched go; FETCH_ERR says why not.
FETCH_ERR=""
fetch_toolchain() {
	if [[ "${GOTOOLCHAIN:-}" == local ]]; then
		FETCH_ERR="GOTOOLCHAIN=local forbids fetching go$DL"
		return 1
	fi
	log "fetching go$DL through the Go module proxy with go $SWITCHER_V ($SWITCHER)"
	local out root go v
	if ! out=$(cd / && GOTOOLCHAIN="go$DL" GOFLAGS='' "$SWITCHER" env GOROOT 2>&1); then
		FETCH_ERR="fetching go$DL failed: $(tail -n 1 <<<"$out")"
		return 1
	fi
	root=$(tail -n 1 <<<"$out")
	go=$root/bin/go
	v=$(version_of "$go")
	if [[ -z "$v" ]] || ! ver_ge "$v" "$WANT"; then
		FETCH_ERR="GOTOOLCHAIN=go$DL gave ${v:-no working go} at $go"
		return 1
	fi
	printf '%s\n' "$go"
}

main() {
	local install=1
	case "${1:-}" in
	"") ;;
	--no-install) install=0 ;;
	*) die "usage: $0 [--no-install]" ;;
	esac
	WANT=$(required)
	# A go line without a patch release ("1.26") names the language; its
	# first release, and the toolchain to fetch, is 1.26.0.
	DL=$WANT
	[[ "$DL" =~ ^[0-9]+\.[0-9]+$ ]] && DL=$DL.0

	scan
	if [[ -n "$FOUND" ]]; then
		printf '%s\n' "$FOUND"
		return
	fi
	if ((install)); then
		if [[ -z "$SWITCHER" ]] && install_backports_go; then
			scan
			if [[ -n "$FOUND" ]]; then
				printf '%s\n' "$FOUND"
				return
			fi
		fi
		if [[ -n "$SWITCHER" ]] && fetch_toolchain; then
			return
		fi
	fi
	local why="found ${SEEN:-no Go}"
	[[ -n "$FETCH_ERR" ]] && why+="; $FETCH_ERR"
	die "need Go $WANT or later (go.mod), $why: install Go $DL from https://go.dev/dl/ into /usr/local/go, or any Go $SWITCH_MIN+ with access to proxy.golang.org (Debian 12, as root: apt-get install -t bookworm-backports golang-go)"
}

main "$@"
