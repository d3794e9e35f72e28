package tests

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
)

// vethHosts makes two network namespaces of lab ("hosts" A and B)
// joined by a veth, va in A and vb in B, with the prefixes given on
// each end, both ends up.
func vethHosts(t *testing.T, lab *netlab.Lab, labelA, labelB string, onA, onB []netip.Prefix) (nsA, nsB *netlab.NS) {
	t.Helper()
	nsA, err := lab.AddNS(labelA)
	if err != nil {
		t.Fatal(err)
	}
	nsB, err = lab.AddNS(labelB)
	if err != nil {
		t.Fatal(err)
	}
	if err := lab.Veth(nsA, "va", nsB, "vb"); err != nil {
		t.Fatal(err)
	}
	for _, end := range []struct {
		ns   *netlab.NS
		link string
		ps   []netip.Prefix
	}{{nsA, "va", onA}, {nsB, "vb", onB}} {
		for _, p := range end.ps {
			if err := end.ns.AddAddr(end.link, p); err != nil {
				t.Fatal(err)
			}
		}
		if err := end.ns.SetUp(end.link, true); err != nil {
			t.Fatal(err)
		}
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
