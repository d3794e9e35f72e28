package netlab

import (
	"os"
	"sync"
	"testing"
)

// sweepOnce runs Sweep(DefaultPrefix) once per process, before the first
// Lab of NewT.
var sweepOnce sync.Once

// Require skips tb when no Lab can be built here (not root, no ip), except
// under CI (environment variable CI non-empty), where it fails: CI runs
// these tests as root.
func Require(tb testing.TB) {
	tb.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("CI: %v", err)
		}
		tb.Skipf("%v", err)
	}
}

// NewT is New for a test: it calls Require, sweeps the stale namespaces of
// crashed runs (once per process), and registers Close with tb.Cleanup,
// failing tb if Close fails.
func NewT(tb testing.TB) *Lab {
	tb.Helper()
	Require(tb)
	sweepOnce.Do(func() {
		removed, err := Sweep(DefaultPrefix)
		if err != nil {
			tb.Logf("netlab: sweep: %v", err)
		}
		if len(removed) > 0 {
			tb.Logf("netlab: removed stale namespaces %v", removed)
		}
	})
	l, err := New(Config{})
	if err != nil {
		tb.Fatalf("netlab: %v", err)
	}
	tb.Cleanup(func() {
		if err := l.Close(); err != nil {
			tb.Errorf("netlab: close: %v", err)
		}
	})
	return l
}
