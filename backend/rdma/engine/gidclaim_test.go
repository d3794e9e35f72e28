package engine

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestGIDClaims: a device holds only the GIDs its operator assigned it,
// besides its port GID and its network GIDs; a host's network address — a
// network GID of the fabric or of another device, or a remote peer's while
// a QP is connected to it — is never claimed locally, however wide the
// assignment; and "not assigned" is answered before "taken", so trying
// reveals nothing of other devices' GIDs.
func TestGIDClaims(t *testing.T) {
	p := newNetPairIdle(t, pairOpts{})
	f := p.fa // a's host: network GID hostA (10.0.0.1); a's QP is connected to hostB
	own := netip.MustParseAddr("10.0.0.9").As16()
	c := NewRNIC(f, [16]byte{0xfe, 0x80, 15: 3}, nil)
	c.SetNetGIDs([][16]byte{own})
	e := NewRNIC(f, [16]byte{0xfe, 0x80, 15: 4}, nil)
	for _, d := range []*RNIC{c, e} {
		if err := f.Register(d); err != nil {
			t.Fatal(err)
		}
	}
	gid := func(s string) [16]byte { return netip.MustParseAddr(s).As16() }
	claim := func(d *RNIC, g [16]byte) error { return d.SetGID(5, g) }

	// Nothing assigned: the port GID and the network GIDs only.
	for _, tc := range []struct {
		name string
		d    *RNIC
		g    [16]byte
		want error
	}{
		{"own port GID", e, e.GID(), nil},
		{"own port GID, modified EUI-64", e, flipUL(e.GID()), nil},
		{"another device's port GID, modified EUI-64", e, flipUL(p.a.d.GID()), ErrGIDNotAllowed},
		{"fabric's network GID, shared", e, hostA, nil},
		{"an address", e, gid("::ffff:10.11.0.5"), ErrGIDNotAllowed},
		{"another device's port GID", e, p.a.d.GID(), ErrGIDNotAllowed},
		{"another device's own network GID", e, own, ErrGIDNotAllowed},
		{"its own network GID", c, own, nil},
		{"the fabric's network GID it does not send from", c, hostA, ErrGIDNotAllowed},
		{"a remote peer's address", e, hostB, ErrGIDNotAllowed},
	} {
		if err := claim(tc.d, tc.g); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}

	// Assigned 10.0.0.0/8 and fe80::/64: addresses in it, but never a
	// host's network address, and another device's GID is then taken.
	e.SetAllowedGIDs([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fe80::/64")})
	for _, tc := range []struct {
		name string
		g    [16]byte
		want error
	}{
		{"assigned address", gid("::ffff:10.11.0.5"), nil},
		{"outside the assignment", gid("::ffff:192.0.2.1"), ErrGIDNotAllowed},
		{"IPv6 outside the assignment", gid("2001:db8::1"), ErrGIDNotAllowed},
		{"another device's port GID", p.a.d.GID(), ErrGIDTaken},
		{"another device's own network GID", own, ErrGIDNotAllowed},
		{"a remote peer's address in use", hostB, ErrGIDNotAllowed},
	} {
		if err := claim(e, tc.g); !errors.Is(err, tc.want) {
			t.Errorf("assigned, %s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	if f.Lookup(hostB) != nil {
		t.Fatal("the remote peer's GID resolves to a local device")
	}

	// Once no QP is connected to it, the remote address is an ordinary
	// one: the operator assigned it to e.
	if st := p.a.qp.Modify(abi.QPAttr{QPState: abi.QPSReset, AttrMask: abi.QPAttrState}); st != abi.StatusOK {
		t.Fatal(st)
	}
	if err := claim(e, hostB); err != nil {
		t.Fatalf("claim of an address no QP is connected to any more: %v", err)
	}
	// And a QP connecting to it then finds e, on this host.
	if f.Lookup(hostB) != e {
		t.Fatal("the claimed GID does not resolve to e")
	}
}

// TestRemoteQPHasOnePeer: while a's QP is connected over the network to
// b's QP, no other QP of a's host — another tenant's device, or a's own —
// may connect to that remote QP (the remote host tells this host's QPs
// apart by address and port alone); once a's QP lets go, one may.
func TestRemoteQPHasOnePeer(t *testing.T) {
	p := newNetPairIdle(t, pairOpts{})
	c := newNode(t, p.fa, 3, 0x300, qpOpts{})
	other := newQP(t, p.a.g, p.a.d, 0x101, p.a.scq, p.a.rcq, qpOpts{})
	rtr := func(q *QP, dest uint32) abi.Status {
		connectInit(t, q)
		return q.Modify(abi.QPAttr{QPN: q.Num, QPState: abi.QPSRTR, AttrMask: abi.QPAttrState | abi.QPAttrAV | abi.QPAttrPathMTU |
			abi.QPAttrDestQPN | abi.QPAttrRQPSN | abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer,
			DGID: hostB, SGIDIndex: 1, PathMTU: abi.MTU1024, DestQPNum: dest, MinRNRTimer: 1, MaxDestRdAtomic: 16})
	}
	reset := func(q *QP) {
		if st := q.Modify(abi.QPAttr{QPState: abi.QPSReset, AttrMask: abi.QPAttrState}); st != abi.StatusOK {
			t.Fatal(st)
		}
	}
	if st := rtr(c.qp, p.b.qp.Num); st != abi.StatusBusy {
		t.Fatalf("another device's QP to the connected remote QP: got %v, want BUSY", st)
	}
	reset(c.qp)
	if st := rtr(other, p.b.qp.Num); st != abi.StatusBusy {
		t.Fatalf("a second QP of the same device to the connected remote QP: got %v, want BUSY", st)
	}
	reset(other)
	if st := rtr(c.qp, p.b.qp.Num+1); st != abi.StatusOK {
		t.Fatalf("to another remote QP: got %v, want OK", st)
	}
	reset(c.qp)
	reset(p.a.qp) // a's transport closes: the remote QP is free
	if st := rtr(c.qp, p.b.qp.Num); st != abi.StatusOK {
		t.Fatalf("to the remote QP a let go of: got %v, want OK", st)
	}
	if st := rtr(p.a.qp, p.b.qp.Num); st != abi.StatusBusy {
		t.Fatalf("a's QP back to the remote QP c now holds: got %v, want BUSY", st)
	}
	reset(c.qp)
	if n := len(p.fa.conns); n != 0 {
		t.Fatalf("%d remote QPs still claimed with no QP connected, want 0", n)
	}
	if n := len(p.fa.remote); n != 0 {
		t.Fatalf("%d remote GIDs still in use with no QP connected, want 0", n)
	}
}
