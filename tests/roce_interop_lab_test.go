package tests

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/internal/roceinterop"
	"github.com/vrdma/vrdma/vmm/guestvm"
)

// Interop topology (internal/roceinterop): namespace g holds the rxe
// guest's tap and a bridge to a veth whose other end is in namespace h,
// where the Go RC endpoint (or vrdmad) and the perftest peer listen.
var (
	interopGoIP    = roceinterop.HostIP
	interopGuestIP = roceinterop.GuestIP
)

// interopLab is the interop tests' topology and what they need to boot the
// rxe guest.
type interopLab struct {
	*roceinterop.Lab
	g, h               *netlab.NS
	qemu, root, tshark string
	kernel, initrd     string
}

// newInteropLab checks what the test needs (skipping outside CI, failing
// in it) and builds the namespaces.
func newInteropLab(t *testing.T) *interopLab {
	t.Helper()
	qemuBin := needBinary(t, "qemu-system-x86_64")
	root := repoRoot(t)
	kernel, initrd, err := roceinterop.RxeImage(root)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI: %v", err)
		}
		t.Skipf("%v", err)
	}
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI: tshark missing (make test-tools): %v", err)
		}
		t.Skipf("tshark missing (make test-tools): %v", err)
	}
	l, err := roceinterop.NewLabOn(netlab.NewT(t))
	if err != nil {
		t.Fatal(err)
	}
	return &interopLab{Lab: l, g: l.G, h: l.H, qemu: qemuBin, root: root, tshark: tshark, kernel: kernel, initrd: initrd}
}

// runGuest boots the rxe guest in g as perftest's role (client: it
// connects to interopGoIP; server: it waits for a client) with the jobs,
// records its link into dump, and returns its results and log once it
// powered off.
func (l *interopLab) runGuest(t *testing.T, role string, jobs []string, dump string) ([]guestvm.Result, string) {
	t.Helper()
	cfg := roceinterop.Guest{QEMU: l.qemu, Kernel: l.kernel, Initrd: l.initrd, Role: role, Dump: dump}
	for _, s := range jobs {
		j, err := roceinterop.ParseJob(s)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Jobs = append(cfg.Jobs, j)
	}
	results, glog, err := l.RunGuest(context.Background(), cfg)
	if err != nil {
		t.Fatalf("%v\n%s", err, glog)
	}
	return results, glog
}
