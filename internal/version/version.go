// Package version is what every vrdma program says it is: the release
// version, set at link time, and the source revision the Go toolchain
// stamped into the binary.
//
// scripts/deb.sh links with
//
//	-ldflags "-X github.com/vrdma/vrdma/internal/version.Version=1.2.3"
//
// so the packaged programs report the package's upstream version; a
// binary built from a checkout reports "devel". The revision is linked in
// the same way (…/internal/version.linkedRevision=COMMIT, by make build and
// scripts/deb.sh), because the toolchain's own stamp (vcs.revision, which
// Revision falls back to) is absent whenever -buildvcs=false is in effect,
// as GOFLAGS has it on some build hosts.
package version

import (
	"runtime/debug"
	"sync"
)

// Version is the release version ("devel" for a build from a checkout).
var Version = "devel"

// linkedRevision is the revision -ldflags -X set, if any.
var linkedRevision string

var revision = sync.OnceValue(func() string {
	if linkedRevision != "" {
		return linkedRevision
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" && dirty {
		rev += "-dirty"
	}
	return rev
})

// Revision is the source revision the binary was built from (a git commit
// hash, "-dirty" appended when the work tree had changes), or "" when the
// build recorded none (go run, -buildvcs=false, a tarball build).
func Revision() string { return revision() }

// String is the one-line form every program's --version prints after its
// name: "VERSION (revision REV)", or VERSION alone without a revision.
func String() string {
	if r := Revision(); r != "" {
		return Version + " (revision " + r + ")"
	}
	return Version
}
