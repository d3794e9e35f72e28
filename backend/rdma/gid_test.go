package rdma

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/engine"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/memmap"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestGIDTable follows docs/spec.md's "The GID table": entries written with
// ADD_GID resolve to their device, a GID belongs to one device of a daemon,
// and a reset restores the table.
func TestGIDTable(t *testing.T) {
	a, ta, doneA := attached(t)
	defer doneA()
	f := a.cfg.Fabric
	b, _, doneB := attachedOn(t, f, "b")
	defer doneB()

	gid := [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 11, 14: 0, 15: 1} // ::ffff:10.11.0.1
	// Both devices are assigned 10.11.0.0/24 and fe80::/64 (overlapping
	// on purpose: ownership is then what tells them apart); b also
	// nothing else.
	assigned := []netip.Prefix{netip.MustParsePrefix("10.11.0.0/24"), netip.MustParsePrefix("fe80::/64")}
	a.SetAllowedGIDs(assigned)
	b.SetAllowedGIDs(assigned)
	add := func(d *Device, index uint32, g [16]byte, typ uint32) abi.Status {
		_, st := d.command(abi.CmdAddGID, abi.Marshal(&abi.GIDEntry{PortNum: 1, Index: index, GID: g, GIDType: typ}), ta)
		return st
	}
	del := func(d *Device, index uint32) abi.Status {
		_, st := d.command(abi.CmdDelGID, abi.Marshal(&abi.GIDReq{PortNum: 1, Index: index}), ta)
		return st
	}
	query := func(d *Device, index uint32) ([16]byte, abi.Status) {
		out, st := d.command(abi.CmdQueryGID, abi.Marshal(&abi.GIDReq{PortNum: 1, Index: index}), ta)
		var g abi.GID
		if st == abi.StatusOK {
			if err := abi.Unmarshal(out, &g); err != nil {
				t.Fatal(err)
			}
		}
		return g.Raw, st
	}

	if g, st := query(a, 0); st != abi.StatusOK || g != a.conf.PortGID {
		t.Fatalf("QUERY_GID 0 after reset: %x %v, want the port GID", g, st)
	}
	if g, st := query(a, 5); st != abi.StatusOK || g != ([16]byte{}) {
		t.Fatalf("QUERY_GID 5 after reset: %x %v, want an empty entry", g, st)
	}
	if _, st := query(a, abi.GIDTableLen); st != abi.StatusInvalid {
		t.Fatalf("QUERY_GID past the table: %v, want INVALID", st)
	}
	for _, c := range []struct {
		name  string
		entry abi.GIDEntry
	}{
		{"index past the table", abi.GIDEntry{PortNum: 1, Index: abi.GIDTableLen, GID: gid}},
		{"port 2", abi.GIDEntry{PortNum: 2, Index: 2, GID: gid}},
		{"zero gid", abi.GIDEntry{PortNum: 1, Index: 2}},
		{"gid type 2", abi.GIDEntry{PortNum: 1, Index: 2, GID: gid, GIDType: 2}},
		{"reserved", abi.GIDEntry{PortNum: 1, Index: 2, GID: gid, Reserved: 1}},
	} {
		if _, st := a.command(abi.CmdAddGID, abi.Marshal(&c.entry), ta); st != abi.StatusInvalid {
			t.Errorf("ADD_GID %s: %v, want INVALID", c.name, st)
		}
	}
	if _, st := a.command(abi.CmdAddGID, abi.Marshal(&abi.GIDEntry{PortNum: 1, Index: 2, GID: gid})[:31], ta); st != abi.StatusInvalid {
		t.Errorf("short ADD_GID: %v, want INVALID", st)
	}

	// Outside the assignment: ACCESS, whether another device holds the
	// GID or not.
	for _, g := range []string{"::ffff:10.12.0.1", "2001:db8::1", "fe81::1"} {
		if st := add(a, 2, netip.MustParseAddr(g).As16(), abi.GIDTypeRoCEv2); st != abi.StatusAccess {
			t.Errorf("ADD_GID of %s (not assigned): %v, want ACCESS", g, st)
		}
	}
	if st := add(a, 2, gid, abi.GIDTypeRoCEv1); st != abi.StatusOK {
		t.Fatalf("ADD_GID: %v", st)
	}
	if st := add(a, 3, gid, abi.GIDTypeRoCEv2); st != abi.StatusOK {
		t.Fatalf("ADD_GID of the same GID at a second index: %v", st)
	}
	if st := add(b, 2, gid, abi.GIDTypeRoCEv1); st != abi.StatusBusy {
		t.Fatalf("ADD_GID of another device's GID: %v, want BUSY", st)
	}
	if st := add(b, 2, a.conf.PortGID, abi.GIDTypeRoCEv1); st != abi.StatusBusy {
		t.Fatalf("ADD_GID of another device's port GID: %v, want BUSY", st)
	}
	if got := f.Lookup(gid); got != a.eng {
		t.Fatalf("the added GID resolves to %p, want device a", got)
	}
	if g, _ := query(a, 3); g != gid {
		t.Fatalf("QUERY_GID 3: %x, want %x", g, gid)
	}
	// One of two entries removed: the GID still resolves; both: it does not.
	if st := del(a, 2); st != abi.StatusOK {
		t.Fatalf("DEL_GID: %v", st)
	}
	if f.Lookup(gid) != a.eng {
		t.Fatal("the GID stopped resolving while entry 3 still holds it")
	}
	if st := del(a, 2); st != abi.StatusNotFound {
		t.Fatalf("DEL_GID of an empty entry: %v, want NOT_FOUND", st)
	}
	if st := del(a, 3); st != abi.StatusOK || f.Lookup(gid) != nil {
		t.Fatalf("DEL_GID of the last entry: %v, lookup %p", st, f.Lookup(gid))
	}
	if st := add(b, 2, gid, abi.GIDTypeRoCEv2); st != abi.StatusOK || f.Lookup(gid) != b.eng {
		t.Fatalf("ADD_GID of a freed GID on b: %v", st)
	}

	// sgid_index must name a non-empty entry: CREATE_AH and MODIFY_QP.
	out, st := a.command(abi.CmdCreatePD, nil, ta)
	if st != abi.StatusOK {
		t.Fatal(st)
	}
	var pd abi.Handle
	_ = abi.Unmarshal(out, &pd)
	ah := abi.CreateAH{PDN: pd.Handle, PortNum: 1, DGID: gid, SGIDIndex: 4}
	if _, st := a.command(abi.CmdCreateAH, abi.Marshal(&ah), ta); st != abi.StatusInvalid {
		t.Fatalf("CREATE_AH with an empty sgid entry: %v, want INVALID", st)
	}
	if st := add(a, 4, [16]byte{0xfe, 0x80, 15: 0x44}, abi.GIDTypeRoCEv2); st != abi.StatusOK {
		t.Fatal(st)
	}
	if _, st := a.command(abi.CmdCreateAH, abi.Marshal(&ah), ta); st != abi.StatusOK {
		t.Fatalf("CREATE_AH with sgid entry 4: %v", st)
	}

	// Entry 0 can be rewritten; a reset brings the port GID back.
	if st := add(a, 0, [16]byte{0xfe, 0x80, 15: 0x55}, abi.GIDTypeRoCEv1); st != abi.StatusOK {
		t.Fatal(st)
	}
	if f.Lookup(a.conf.PortGID) != nil {
		t.Fatal("the port GID still resolves after entry 0 was rewritten")
	}
	a.Reset()
	if g, _ := query(a, 0); g != a.conf.PortGID || f.Lookup(a.conf.PortGID) != a.eng {
		t.Fatalf("after reset entry 0 is %x, want the port GID", g)
	}
	if g, _ := query(a, 4); g != ([16]byte{}) {
		t.Fatal("entry 4 survived the reset")
	}
}

// TestStatusOfErrors maps the errors commands fail with to the statuses the
// spec names.
func TestStatusOfErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		want abi.Status
	}{
		{errStatus(abi.StatusBusy), abi.StatusBusy},
		{fmt.Errorf("pin: %w", memmap.ErrQuota), abi.StatusQuota},
		{fmt.Errorf("pin: %w", memmap.ErrNotMapped), abi.StatusFault},
		{fmt.Errorf("mlock gpa 0x1000+0x1000: %w", unix.ENOMEM), abi.StatusNoResources},
		{fmt.Errorf("mlock gpa 0x1000+0x1000: %w", unix.EAGAIN), abi.StatusNoResources},
		{fmt.Errorf("mlock gpa 0x1000+0x1000: %w", unix.EPERM), abi.StatusNoResources},
		{fmt.Errorf("pin: %w", &memmap.RegionError{Err: fmt.Errorf("256 regions tracked: %w", memmap.ErrTooManyRegions)}), abi.StatusNoResources},
		{errors.New("anything else"), abi.StatusInvalid},
	} {
		if got := status(c.err); got != c.want {
			t.Errorf("status(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestQPNumbers24Bits: QP numbers fit the 24 bits of an InfiniBand QPN
// however many handles the device handed out before (perftest and
// ibv_rc_pingpong exchange them as 24-bit numbers).
func TestQPNumbers24Bits(t *testing.T) {
	e := engine.NewRNIC(engine.NewFabric(), [16]byte{0xfe, 0x80, 15: 1}, nil)
	for i := range 200_000 {
		if i%3 == 0 {
			if h := e.NewHandle(engine.KindQP, qpnBits); h == 0 || h >= 1<<24 {
				t.Fatalf("QP number %#x after %d handles", h, i)
			}
		} else {
			e.NewHandle(engine.KindMR, 32) // other objects advance the sequence
		}
	}
}

// GIDs lists the filled entries: the port GID, then what ADD_GID wrote,
// until DEL_GID empties it.
func TestGIDsList(t *testing.T) {
	a, ta, done := attached(t)
	defer done()
	gid := [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 11, 14: 0, 15: 7}
	a.SetAllowedGIDs([]netip.Prefix{netip.MustParsePrefix("10.11.0.7/32")})
	want := []GIDEntry{{0, a.conf.PortGID}}
	if got := a.GIDs(); !slices.Equal(got, want) {
		t.Fatalf("GIDs after reset: %v, want %v", got, want)
	}
	if _, st := a.command(abi.CmdAddGID, abi.Marshal(&abi.GIDEntry{PortNum: 1, Index: 3, GID: gid, GIDType: abi.GIDTypeRoCEv2}), ta); st != abi.StatusOK {
		t.Fatalf("ADD_GID: %v", st)
	}
	want = append(want, GIDEntry{3, gid})
	if got := a.GIDs(); !slices.Equal(got, want) {
		t.Fatalf("GIDs after ADD_GID 3: %v, want %v", got, want)
	}
	if _, st := a.command(abi.CmdDelGID, abi.Marshal(&abi.GIDReq{PortNum: 1, Index: 3}), ta); st != abi.StatusOK {
		t.Fatalf("DEL_GID: %v", st)
	}
	if got := a.GIDs(); !slices.Equal(got, want[:1]) {
		t.Fatalf("GIDs after DEL_GID 3: %v, want %v", got, want[:1])
	}
}
