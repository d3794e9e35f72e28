package tests

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/vrdma/vrdma/vmm/frontend"
)

// TestVrdmadSocketFlags: the device sockets get the mode vrdmad is told,
// and a front-end whose uid is not in --allow-uid is refused at once while
// the daemon keeps serving (its control API answers, nothing connected).
func TestVrdmadSocketFlags(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "vm.sock")
	other := os.Getuid() + 4242
	d := startVrdmad(t, dir, "--socket", "vm="+sock, "--socket-mode", "0660", "--allow-uid", strconv.Itoa(other),
		"--max-qps", "7", "--max-commands-per-sec", "1000")
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode %v, want 0660", fi.Mode().Perm())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if f, err := frontend.Dial(ctx, frontend.Config{Socket: sock}); err == nil {
		f.Close()
		t.Fatalf("uid %d connected although only uid %d is allowed", os.Getuid(), other)
	}
	devs, err := d.devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 1 || devs[0].Connected {
		t.Fatalf("control API after a refused front-end: %+v", devs)
	}
	if devs[0].Limits.MaxQPs != 7 {
		t.Fatalf("--max-qps 7: device shows max_qps %d", devs[0].Limits.MaxQPs)
	}
}
