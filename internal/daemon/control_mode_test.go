package daemon

import (
	"os"
	"path/filepath"
	"testing"
)

// TestControlSocketMode: the control API's socket is its owner's alone
// (mode 0600): the API adds and removes tenants' devices, so another user
// of the host must not reach it (docs/security.md).
func TestControlSocketMode(t *testing.T) {
	d, _ := testDaemon(t)
	path := filepath.Join(t.TempDir(), "control.sock")
	if err := d.ServeControl(path); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("control socket mode: got %v, want a socket with 0600", fi.Mode())
	}
}
