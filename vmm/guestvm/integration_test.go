package guestvm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/vmm/qemu"
)

// image returns the patched QEMU and the guest image of this checkout. It
// skips when they are missing outside CI; in CI (CI=true) that fails.
func image(t *testing.T) (qemuBin, kernel, initrd string) {
	if testing.Short() {
		t.Skip("short mode: boots a guest (make test runs it in its full pass)")
	}
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	missing := func(what string, err error) {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI: %s is missing (make qemu / make guest-image): %v", what, err)
		}
		t.Skipf("%s not built (make qemu / make guest-image): %v", what, err)
	}
	qemuBin, err = qemu.FindBinary(root)
	if err != nil {
		missing("qemu", err)
	}
	kernel = filepath.Join(root, "bin", "guest", "vmlinuz")
	initrd = filepath.Join(root, "bin", "guest", "initramfs.img")
	for _, p := range []string{kernel, initrd} {
		if _, err := os.Stat(p); err != nil {
			missing("the guest image", err)
		}
	}
	return qemuBin, kernel, initrd
}

// TestBootNoDevice boots the real guest image with no vrdma device: init
// runs vrdma-guest, which must report that it found no device; the guest
// powers itself off, and Close leaves nothing behind.
func TestBootNoDevice(t *testing.T) {
	qemuBin, kernel, initrd := image(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := Boot(ctx, Config{Name: "nodev", QEMU: qemuBin, Kernel: kernel, Initrd: initrd, Run: "probe", MemoryMiB: 256, HugePages: 16})
	if err != nil {
		t.Fatal(err)
	}
	dir := g.dir
	res, err := g.WaitResult(ctx)
	var ge *GuestError
	if !errors.Is(err, ErrGuestFailed) || !errors.As(err, &ge) {
		t.Fatalf("got (%v, %v), want a reported failure\n%s", res, err, g.Log())
	}
	if ge.Guest != "nodev" || ge.ExitCode != 1 || len(ge.Messages) == 0 {
		t.Errorf("got %+v, want guest nodev, exit 1 and a message", ge)
	}
	t.Logf("/init after %.1f s; guest said: %v", g.InitTime().Seconds(), err)
	if g.InitTime() <= 0 {
		t.Errorf("got init time %v, want the VRDMA-INIT line seen", g.InitTime())
	}
	// The guest powers off by itself after VRDMA-EXIT.
	select {
	case <-g.VM().Exited():
	case <-time.After(30 * time.Second):
		t.Errorf("QEMU still runs 30 s after VRDMA-EXIT")
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("console directory %s still there after Close (%v)", dir, err)
	}
	if err := g.WriteLine("x"); err == nil {
		t.Errorf("WriteLine after Close succeeded")
	}
	if !strings.Contains(g.Console(), PrefixInit) {
		t.Errorf("console log lacks %s:\n%s", PrefixInit, g.Console())
	}
}

// TestCloseKillsRunningGuest closes a guest that is still booting: Close
// kills QEMU at once.
func TestCloseKillsRunningGuest(t *testing.T) {
	qemuBin, kernel, initrd := image(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Closed right after Boot, while the kernel is still booting.
	g, err := Boot(ctx, Config{Name: "early", QEMU: qemuBin, Kernel: kernel, Initrd: initrd, Run: "probe", MemoryMiB: 256, HugePages: 16})
	if err != nil {
		t.Fatal(err)
	}
	pid := g.VM().PID()
	start := time.Now()
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Close of a booting guest took %v", d)
	}
	select {
	case <-g.VM().Exited():
	default:
		t.Fatalf("QEMU (pid %d) still runs after Close", pid)
	}
	if _, err := g.WaitResult(ctx); !errors.Is(err, errGuestClosed) && !errors.Is(err, ErrGuestGone) {
		t.Errorf("WaitResult after Close: got %v, want the guest closed or gone", err)
	}
}
