package tests

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
)

// vethHosts is netlab.Lab.VethHosts, failing the test on error.
func vethHosts(t *testing.T, lab *netlab.Lab, labelA, labelB string, onA, onB []netip.Prefix) (nsA, nsB *netlab.NS) {
	t.Helper()
	nsA, nsB, err := lab.VethHosts(labelA, labelB, onA, onB)
	if err != nil {
		t.Fatal(err)
	}
	return nsA, nsB
}

// startVrdmadIn starts vrdmad in ns serving devices, with args and no
// state directory; it is stopped when the test ends, its log shown if
// the test failed.
func startVrdmadIn(t *testing.T, vrdmad string, ns *netlab.NS, devices []string, args ...string) *vrdmadproc.Proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := vrdmadproc.Start(ctx, vrdmadproc.Config{Binary: vrdmad, NetNS: ns.Name, Devices: devices,
		Args: args, StateDir: vrdmadproc.NoState})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("vrdmad in %s: %v", ns.Name, err)
		}
		if t.Failed() {
			t.Logf("vrdmad in %s:\n%s", ns.Name, p.Log())
		}
	})
	return p
}
