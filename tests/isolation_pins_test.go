package tests

import (
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// Security issue 25, item 4: pins stay exact across memory-table changes.

// TestIsolationMemTableChangeKeepsPinsExact: device A (dev0) switches its
// memory table twice (SET_MEM_TABLE with the same memory cut into new
// regions, then whole again) while it has a live MR and a QP with traffic;
// it registers MR2 over MR1's buffer on the new table and deregisters MR1.
// A's pinned bytes are exactly what its live objects name at every step
// (MR2's pages stay pinned after DEREG_MR of MR1), A's QP keeps moving
// verified bytes, the bystander pair B (dev1) and C (dev2) keeps moving
// verified bytes with no broken ring, and once A's objects are gone
// nothing of A's stays pinned (hygiene: VmLck, mappings, fds back to
// where they were).
func TestIsolationMemTableChangeKeepsPinsExact(t *testing.T) {
	hygiene(t)
	d, socks := startDaemon(t, 3)
	b, c := openPeer(t, socks[1], 0), openPeer(t, socks[2], 0)
	connectPair(t, b, c)
	verifiedWrite(t, b, c, 1)
	a := openPeerCfg(t, socks[0], frontend.Config{})
	cqp := newPeerQP(t, c) // C's end of A's QP
	if err := a.qp.ConnectRC(c.gid, cqp.Num(), cqp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if err := cqp.ConnectRC(a.gid, a.qp.Num(), a.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	verifiedWrite(t, a, c, 3)
	pinned := func(what string, want uint64) {
		t.Helper()
		dv, ok := d.Device("dev0")
		if !ok {
			t.Fatal("dev0 gone")
		}
		if got := dv.Info().PinnedBytes; got != want {
			t.Errorf("%s: A has %#x bytes pinned, want %#x", what, got, want)
		}
	}
	dv, _ := d.Device("dev0")
	base := dv.Info().PinnedBytes // A's CQ, QP and 64 KiB MR
	if base == 0 {
		t.Fatal("A pins nothing with live objects")
	}

	const mrSize = 16 << 10
	buf, err := a.ctx.AllocBuffer(mrSize)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	mr1, err := a.pd.RegMR(buf, 0, mrSize, abi.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	pinned("MR1 registered", base+mrSize)

	// The same memory, cut into two regions the daemon maps anew.
	half := uint64(len(a.f.Memory()) / 2)
	if err := a.f.SetMemTableRegions(a.f.SplitRegions(half)); err != nil {
		t.Fatalf("SET_MEM_TABLE (split): %v", err)
	}
	pinned("after SET_MEM_TABLE", base+mrSize)
	verifiedWrite(t, a, c, 5) // A's QP, rings and MR from before the change
	mr2, err := a.pd.RegMR(buf, 0, mrSize, abi.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	// MR1 pins the old mapping's pages, MR2 the new one's: both count.
	pinned("MR2 registered on the new table", base+2*mrSize)
	if err := mr1.Dereg(); err != nil {
		t.Fatal(err)
	}
	pinned("after DEREG_MR MR1", base+mrSize)

	// Whole again: a third table; MR2 and the rest keep their pins.
	if err := a.f.SetMemTableRegions(a.f.SplitRegions()); err != nil {
		t.Fatalf("SET_MEM_TABLE (whole): %v", err)
	}
	pinned("after the second SET_MEM_TABLE", base+mrSize)
	old := a.mr
	a.mr = mr2
	verifiedWrite(t, a, c, 7) // from MR2, registered on the second table
	a.mr = old
	verifiedWrite(t, b, c, 9)
	verifiedWrite(t, c, b, 11)
	noRingErrors(t, d, "dev1", "dev2")

	if err := mr2.Dereg(); err != nil {
		t.Fatal(err)
	}
	pinned("after DEREG_MR MR2", base)
	if err := cqp.Destroy(); err != nil {
		t.Fatal(err)
	}
	a.teardown(t)
	pinned("every object of A gone", 0)
	verifiedWrite(t, b, c, 13)
	noRingErrors(t, d, "dev0", "dev1", "dev2")
}
