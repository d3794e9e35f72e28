package engine

import (
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

func TestModify(t *testing.T) {
	const (
		toInit = abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrAccessFlags
		toRTR  = abi.QPAttrState | abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN | abi.QPAttrRQPSN |
			abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer
		toRTS = abi.QPAttrState | abi.QPAttrSQPSN | abi.QPAttrTimeout | abi.QPAttrRetryCnt | abi.QPAttrRNRRetry |
			abi.QPAttrMaxQPRdAtomic
	)
	peerGID := [16]byte{0xfe, 0x80, 15: 2}
	init := abi.QPAttr{AttrMask: toInit, QPState: abi.QPSInit, PortNum: 1}
	rtr := abi.QPAttr{AttrMask: toRTR, QPState: abi.QPSRTR, PathMTU: abi.MTU1024, DGID: peerGID, DestQPNum: 9}
	rts := abi.QPAttr{AttrMask: toRTS, QPState: abi.QPSRTS, RNRRetry: 7}
	with := func(a abi.QPAttr, f func(*abi.QPAttr)) abi.QPAttr { f(&a); return a }
	state := func(s uint32) abi.QPAttr { return abi.QPAttr{AttrMask: abi.QPAttrState, QPState: s} }

	tests := []struct {
		name      string
		before    []abi.QPAttr // applied first, each must succeed
		attr      abi.QPAttr
		want      abi.Status
		wantState uint32
	}{
		{"reset to init", nil, init, abi.StatusOK, abi.QPSInit},
		{"reset to init missing port", nil, with(init, func(a *abi.QPAttr) { a.AttrMask &^= abi.QPAttrPort }), abi.StatusInvalid, abi.QPSReset},
		{"reset to init extra bit", nil, with(init, func(a *abi.QPAttr) { a.AttrMask |= abi.QPAttrMinRNRTimer }), abi.StatusInvalid, abi.QPSReset},
		{"reset to init bad port", nil, with(init, func(a *abi.QPAttr) { a.PortNum = 2 }), abi.StatusInvalid, abi.QPSReset},
		{"reset to init bad pkey", nil, with(init, func(a *abi.QPAttr) { a.PKeyIndex = 1 }), abi.StatusInvalid, abi.QPSReset},
		{"reset to init bad access", nil, with(init, func(a *abi.QPAttr) { a.QPAccessFlags = 0x10 }), abi.StatusInvalid, abi.QPSReset},
		{"unknown mask bit", nil, with(init, func(a *abi.QPAttr) { a.AttrMask |= 0x2 }), abi.StatusInvalid, abi.QPSReset},
		{"no state bit", nil, with(init, func(a *abi.QPAttr) { a.AttrMask &^= abi.QPAttrState }), abi.StatusInvalid, abi.QPSReset},
		{"unsupported state", nil, state(abi.QPSSQD), abi.StatusInvalid, abi.QPSReset},
		{"qkey on an RC QP", nil, with(init, func(a *abi.QPAttr) { a.QKey = 1 }), abi.StatusInvalid, abi.QPSReset},
		{"reset to rtr", nil, rtr, abi.StatusState, abi.QPSReset},
		{"reset to rts", nil, rts, abi.StatusState, abi.QPSReset},
		{"init to init", []abi.QPAttr{init}, with(state(abi.QPSInit), func(a *abi.QPAttr) {
			a.AttrMask |= abi.QPAttrAccessFlags
			a.QPAccessFlags = abi.AccessRemoteRead
		}), abi.StatusOK, abi.QPSInit},
		{"init to rtr", []abi.QPAttr{init}, rtr, abi.StatusOK, abi.QPSRTR},
		{"init to rtr unknown gid", []abi.QPAttr{init}, with(rtr, func(a *abi.QPAttr) { a.DGID[15] = 99 }), abi.StatusNotFound, abi.QPSInit},
		{"init to rtr missing min_rnr_timer", []abi.QPAttr{init}, with(rtr, func(a *abi.QPAttr) { a.AttrMask &^= abi.QPAttrMinRNRTimer }), abi.StatusInvalid, abi.QPSInit},
		{"init to rtr bad mtu", []abi.QPAttr{init}, with(rtr, func(a *abi.QPAttr) { a.PathMTU = 6 }), abi.StatusInvalid, abi.QPSInit},
		{"init to rtr bad sgid index", []abi.QPAttr{init}, with(rtr, func(a *abi.QPAttr) { a.SGIDIndex = 1 }), abi.StatusInvalid, abi.QPSInit},
		{"init to rtr bad psn", []abi.QPAttr{init}, with(rtr, func(a *abi.QPAttr) { a.RQPSN = 1 << 24 }), abi.StatusInvalid, abi.QPSInit},
		{"init to rts", []abi.QPAttr{init}, rts, abi.StatusState, abi.QPSInit},
		{"rtr to rts", []abi.QPAttr{init, rtr}, rts, abi.StatusOK, abi.QPSRTS},
		{"rtr to rts bad rnr_retry", []abi.QPAttr{init, rtr}, with(rts, func(a *abi.QPAttr) { a.RNRRetry = 8 }), abi.StatusInvalid, abi.QPSRTR},
		{"rtr to rts with optional", []abi.QPAttr{init, rtr}, with(rts, func(a *abi.QPAttr) {
			a.AttrMask |= abi.QPAttrMinRNRTimer | abi.QPAttrAccessFlags
			a.MinRNRTimer = 31
		}), abi.StatusOK, abi.QPSRTS},
		{"rtr to rts bad min_rnr_timer", []abi.QPAttr{init, rtr}, with(rts, func(a *abi.QPAttr) {
			a.AttrMask |= abi.QPAttrMinRNRTimer
			a.MinRNRTimer = 32
		}), abi.StatusInvalid, abi.QPSRTR},
		{"rts to rts", []abi.QPAttr{init, rtr, rts}, with(state(abi.QPSRTS), func(a *abi.QPAttr) { a.AttrMask |= abi.QPAttrMinRNRTimer }), abi.StatusOK, abi.QPSRTS},
		{"rts to rts path mtu", []abi.QPAttr{init, rtr, rts}, with(state(abi.QPSRTS), func(a *abi.QPAttr) { a.AttrMask |= abi.QPAttrPathMTU }), abi.StatusInvalid, abi.QPSRTS},
		{"rts to rtr", []abi.QPAttr{init, rtr, rts}, rtr, abi.StatusState, abi.QPSRTS},
		{"rts to init", []abi.QPAttr{init, rtr, rts}, init, abi.StatusState, abi.QPSRTS},
		{"any to err", []abi.QPAttr{init}, state(abi.QPSErr), abi.StatusOK, abi.QPSErr},
		{"reset to err", nil, state(abi.QPSErr), abi.StatusOK, abi.QPSErr},
		{"to err with extra bit", []abi.QPAttr{init}, with(state(abi.QPSErr), func(a *abi.QPAttr) { a.AttrMask |= abi.QPAttrPort; a.PortNum = 1 }), abi.StatusInvalid, abi.QPSInit},
		{"err to reset", []abi.QPAttr{state(abi.QPSErr)}, state(abi.QPSReset), abi.StatusOK, abi.QPSReset},
		{"to reset with extra bit", []abi.QPAttr{init}, with(state(abi.QPSReset), func(a *abi.QPAttr) { a.AttrMask |= abi.QPAttrAccessFlags }), abi.StatusInvalid, abi.QPSInit},
		{"err to rts", []abi.QPAttr{state(abi.QPSErr)}, rts, abi.StatusState, abi.QPSErr},
		{"err to init", []abi.QPAttr{state(abi.QPSErr)}, init, abi.StatusState, abi.QPSErr},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFabric()
			a := newNode(t, f, 1, 0x100, qpOpts{})
			newNode(t, f, 2, 0x200, qpOpts{})
			for i, b := range tc.before {
				if st := a.qp.Modify(b); st != abi.StatusOK {
					t.Fatalf("before[%d]: got %v, want OK", i, st)
				}
			}
			if st := a.qp.Modify(tc.attr); st != tc.want {
				t.Fatalf("got %v, want %v", st, tc.want)
			}
			if s := a.qp.State(); s != tc.wantState {
				t.Fatalf("state: got %d, want %d", s, tc.wantState)
			}
		})
	}
}

func TestModifyDestroyed(t *testing.T) {
	f := NewFabric()
	a := newNode(t, f, 1, 0x100, qpOpts{})
	if q := a.d.RemoveQP(0x100); q != a.qp {
		t.Fatalf("RemoveQP: got %v, want the QP", q)
	}
	if a.d.RemoveQP(0x100) != nil {
		t.Fatalf("second RemoveQP: got a QP, want nil")
	}
	if st := a.qp.Modify(abi.QPAttr{AttrMask: abi.QPAttrState, QPState: abi.QPSErr}); st != abi.StatusNotFound {
		t.Fatalf("modify destroyed QP: got %v, want NOT_FOUND", st)
	}
	if a.scq.Users.Load() != 0 || a.rcq.Users.Load() != 0 {
		t.Fatalf("CQ users: got %d %d, want 0", a.scq.Users.Load(), a.rcq.Users.Load())
	}
}

func TestFabric(t *testing.T) {
	f := NewFabric()
	g := [16]byte{1}
	d1, d2 := NewRNIC(f, g, nil), NewRNIC(f, g, nil)
	if err := f.Register(d1); err != nil {
		t.Fatalf("Register: %v", err)
	}
	err := f.Register(d2)
	var ge *GIDError
	if !errorsIs(err, ErrGIDTaken) || !errorsAs(err, &ge) || ge.GID != g {
		t.Fatalf("Register duplicate: got %v, want a *GIDError matching ErrGIDTaken", err)
	}
	if f.Lookup(g) != d1 {
		t.Fatalf("Lookup: wrong device")
	}
	f.Unregister(d2) // not registered: no effect
	if f.Lookup(g) != d1 {
		t.Fatalf("Unregister of another device removed the GID")
	}
	f.Unregister(d1)
	if f.Lookup(g) != nil {
		t.Fatalf("Lookup after Unregister: got a device")
	}
}
