package tests

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/vmm/guestvm"
)

// interopLab is the interop tests' topology: namespace g holds the rxe
// guest's tap, bridged to a veth whose other end, in namespace h, carries
// the Go side's address.
type interopLab struct {
	g, h               *netlab.NS
	qemu, root, tshark string
}

// newInteropLab checks what the test needs (skipping outside CI, failing
// in it) and builds the namespaces.
func newInteropLab(t *testing.T) *interopLab {
	t.Helper()
	qemuBin := needBinary(t, "qemu-system-x86_64")
	root := repoRoot(t)
	for _, f := range []string{"rxe/vmlinux", "rxe/initramfs.img"} {
		if _, err := os.Stat(filepath.Join(root, "bin", f)); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("CI: bin/%s is missing (make rxe-image): %v", f, err)
			}
			t.Skipf("bin/%s not built (make rxe-image): %v", f, err)
		}
	}
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI: tshark missing (make test-tools): %v", err)
		}
		t.Skipf("tshark missing (make test-tools): %v", err)
	}
	lab := netlab.NewT(t)
	g, err := lab.AddNS("g")
	if err != nil {
		t.Fatal(err)
	}
	h, err := lab.AddNS("h")
	if err != nil {
		t.Fatal(err)
	}
	steps := []func() error{
		func() error { return lab.Veth(g, "vg", h, "vh") },
		func() error { return g.AddBridge("br0") },
		func() error { return g.AddTap("tap0") },
		func() error { return g.SetMaster("tap0", "br0") },
		func() error { return g.SetMaster("vg", "br0") },
		func() error { return g.SetUp("br0", true) },
		func() error { return g.SetUp("vg", true) },
		func() error { return h.AddAddr("vh", netip.PrefixFrom(interopGoIP, 24)) },
		func() error { return h.SetUp("vh", true) },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			t.Fatal(err)
		}
	}
	return &interopLab{g: g, h: h, qemu: qemuBin, root: root, tshark: tshark}
}

// runGuest boots the rxe guest in g as perftest's role (client: it
// connects to interopGoIP; server: it waits for a client) with the jobs,
// records its link into dump, and returns its results and log once it
// powered off. QEMU is started on g's thread, so it lives in g; its
// Pdeathsig is tied to that thread, so the guest's whole life runs inside
// Do.
func (l *interopLab) runGuest(t *testing.T, role string, jobs []string, dump string) ([]guestvm.Result, string) {
	t.Helper()
	app := "rxe.role=" + role + " rxe.ip=" + interopGuestIP.String() + " rxe.runs=1 rxe.gid=1"
	if role == "client" {
		app += " rxe.peer=" + interopGoIP.String()
	}
	cfg := guestvm.Config{
		Name: "rxe-interop-" + role, QEMU: l.qemu, Kernel: filepath.Join(l.root, "bin", "rxe", "vmlinux"),
		Initrd: filepath.Join(l.root, "bin", "rxe", "initramfs.img"), SMP: 1, HugePages: 1, Run: "perftest", Args: jobs,
		Append: app,
		ExtraQEMUArgs: []string{
			"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
			"-device", "virtio-net-pci,netdev=n0,romfile=,mac=52:54:00:77:00:02",
			"-object", "filter-dump,id=dump0,netdev=n0,file=" + dump + ",maxlen=65536",
		},
	}
	var results []guestvm.Result
	var glog string
	err := l.g.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		guest, err := guestvm.Boot(ctx, cfg)
		if err != nil {
			return err
		}
		defer guest.Close()
		results, err = guest.WaitResult(ctx)
		glog = guest.Log()
		return err
	})
	if err != nil {
		t.Fatalf("guest (%s): %v\n%s", role, err, glog)
	}
	return results, glog
}
