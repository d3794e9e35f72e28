package engine

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// docs/spec.md § Memory windows and fast registration, on one host: binds
// and remote access through windows, LOCAL_INV, SEND_WITH_INV and fast
// registration.

const (
	bindIOVA   = 0x5000_0000_0000 // the MW_BIND MR of a window test
	bindLen    = 32 << 10
	remoteAll  = abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic
	bindAccess = abi.AccessAll | abi.AccessMWBind
)

// postRawOn writes the 64-byte WQE b at sq_pi of q and advances sq_pi.
func postRawOn(tb testing.TB, g *guest, q *QP, b []byte) {
	tb.Helper()
	rec := g.slice(tb, q.Record, abi.QPRecordSize)
	pi := abi.LoadUint32(rec, abi.QPRecordSQPI)
	slot, err := q.SQ.Slot(g.tbl, pi)
	if err != nil {
		tb.Fatalf("sq slot: %v", err)
	}
	clear(slot)
	copy(slot, b)
	abi.StoreUint32(rec, abi.QPRecordSQPI, pi+1)
}

// bind posts a signaled BIND_MW on the node's QP.
func (n *node) bind(tb testing.TB, wrID uint64, mw, newKey, lkey uint32, addr, length uint64, access uint32) {
	tb.Helper()
	postRawOn(tb, n.g, n.qp, abi.Marshal(&abi.BindMWWQE{WRID: wrID, Opcode: abi.WROpBindMW, Flags: abi.WRFlagSignaled,
		MW: mw, Addr: addr, NewRKey: newKey, LKey: lkey, Length: length, Access: access}))
}

// localInv posts a signaled LOCAL_INV of key on the node's QP.
func (n *node) localInv(tb testing.TB, wrID uint64, key uint32) {
	tb.Helper()
	n.postSend(tb, abi.SendWQE{WRID: wrID, Opcode: abi.WROpLocalInv, Flags: abi.WRFlagSignaled, ImmData: key}, nil, nil)
}

// bindMR registers an MR with MW_BIND (and access) on n's device.
func (n *node) bindMR(tb testing.TB, access uint32) *MR {
	tb.Helper()
	m := n.g.newMR(tb, n.d.NewHandle(KindMR, 32), testPD, access, bindIOVA, bindLen, true)
	addMR(n.d, m)
	return m
}

// newMWOn allocates a free window of type typ in the test PD of d.
func newMWOn(tb testing.TB, d *RNIC, typ uint32) *MW {
	tb.Helper()
	w := NewMW(d.NewHandle(KindMW, 32), testPD, typ)
	if err := d.AddMW(w); err != nil {
		tb.Fatal(err)
	}
	return w
}

// nextKey is key with the next key byte (verbs' ibv_inc_rkey).
func nextKey(key uint32) uint32 { return key&^0xff | (key+1)&0xff }

// status1 polls and returns the status of the one CQE of c.
func (p *pair) status1(tb testing.TB, n *node, c *CQ) abi.CQE {
	tb.Helper()
	p.poll(tb)
	got := n.cqes(tb, c)
	if len(got) != 1 {
		tb.Fatalf("got %d CQEs %+v, want 1", len(got), got)
	}
	return got[0]
}

// TestMWRemoteAccess binds a window of each type on b and reaches b's
// memory through it from a: in range the data is the MR's at those
// addresses; out of the window, without the window's right, with another
// key byte, after LOCAL_INV or DEALLOC_MW it is REM_ACCESS_ERR.
func TestMWRemoteAccess(t *testing.T) {
	const win = bindIOVA + 0x1000 // the window: [win, win+0x2000)
	type tcase struct {
		name   string
		typ    uint32
		access uint32
		before func(p *pair, w *MW) // after the bind
		op     uint8
		off    uint64 // from win
		length uint32
		key    func(w *MW) uint32
		want   abi.WCStatus
	}
	cur := func(w *MW) uint32 { return w.Key() }
	cases := []tcase{
		{name: "type 1 write", typ: 1, access: remoteAll, op: abi.WROpRDMAWrite, off: 0x10, length: 256, key: cur, want: abi.WCSuccess},
		{name: "type 2 write", typ: 2, access: remoteAll, op: abi.WROpRDMAWrite, off: 0x10, length: 256, key: cur, want: abi.WCSuccess},
		{name: "type 2 read", typ: 2, access: abi.AccessRemoteRead, op: abi.WROpRDMARead, off: 0x1f00, length: 256, key: cur, want: abi.WCSuccess},
		{name: "type 1 atomic", typ: 1, access: abi.AccessRemoteAtomic, op: abi.WROpAtomicFetchAdd, off: 0x40, length: 8, key: cur, want: abi.WCSuccess},
		{name: "past the window", typ: 2, access: remoteAll, op: abi.WROpRDMAWrite, off: 0x1f80, length: 256, key: cur, want: abi.WCRemAccessErr},
		{name: "before the window", typ: 1, access: remoteAll, op: abi.WROpRDMARead, off: 0, length: 256,
			key: cur, want: abi.WCRemAccessErr}, // off rewritten below: win-0x100
		{name: "read-only window written", typ: 2, access: abi.AccessRemoteRead, op: abi.WROpRDMAWrite, off: 0, length: 8, key: cur, want: abi.WCRemAccessErr},
		{name: "no atomic right", typ: 1, access: abi.AccessRemoteWrite, op: abi.WROpAtomicFetchAdd, off: 0, length: 8, key: cur, want: abi.WCRemAccessErr},
		{name: "other key byte", typ: 2, access: remoteAll, op: abi.WROpRDMAWrite, off: 0, length: 8,
			key: func(w *MW) uint32 { return nextKey(w.Key()) }, want: abi.WCRemAccessErr},
		{name: "after LOCAL_INV", typ: 2, access: remoteAll, op: abi.WROpRDMAWrite, off: 0, length: 8, key: cur,
			before: func(p *pair, w *MW) {
				p.b.localInv(t, 9, w.Key())
				if e := p.status1(t, p.b, p.b.scq); e.Status != abi.WCSuccess || e.Opcode != abi.WCOpLocalInv {
					t.Fatalf("LOCAL_INV: %+v", e)
				}
			}, want: abi.WCRemAccessErr},
		{name: "after DEALLOC_MW", typ: 1, access: remoteAll, op: abi.WROpRDMAWrite, off: 0, length: 8, key: cur,
			before: func(p *pair, w *MW) {
				if err := p.b.d.RemoveMW(nextKey(w.Key())); err != nil { // any key byte
					t.Fatal(err)
				}
			}, want: abi.WCRemAccessErr},
		{name: "free after unbind", typ: 1, access: remoteAll, op: abi.WROpRDMAWrite, off: 0, length: 8,
			key: func(w *MW) uint32 { return nextKey(w.Key()) },
			before: func(p *pair, w *MW) {
				p.b.bind(t, 8, w.Key(), nextKey(w.Key()), 0, 0, 0, 0)
				if e := p.status1(t, p.b, p.b.scq); e.Status != abi.WCSuccess {
					t.Fatalf("unbind: %+v", e)
				}
			}, want: abi.WCRemAccessErr},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, pairOpts{})
			a, b := p.a, p.b
			bm := b.bindMR(t, bindAccess)
			w := newMWOn(t, b.d, tc.typ)
			b.bind(t, 1, w.Key(), nextKey(w.Key()), bm.Key, win, 0x2000, tc.access)
			want1(t, "bind", []abi.CQE{p.status1(t, b, b.scq)}, abi.CQE{WRID: 1, Opcode: abi.WCOpBindMW, QPNum: b.qp.Num})
			if tc.before != nil {
				tc.before(p, w)
			}
			addr := win + tc.off
			if tc.name == "before the window" {
				addr = win - 0x100
			}
			data := pattern(int(tc.length), 5)
			b.g.mrWrite(t, bm, addr, data)
			a.g.mrWrite(t, a.mr, mrIOVA, data)
			a.postSend(t, abi.SendWQE{WRID: 2, Opcode: tc.op, Flags: abi.WRFlagSignaled, RemoteAddr: addr, RKey: tc.key(w), CompareAdd: 1},
				[]abi.SGE{a.sge(0x4000, tc.length)}, nil)
			e := p.status1(t, a, a.scq)
			if e.Status != tc.want {
				t.Fatalf("%s through the window: got %v, want %v", tc.name, e.Status, tc.want)
			}
			if tc.want != abi.WCSuccess {
				if b.qp.State() != abi.QPSErr {
					t.Fatal("the responder QP is not in ERR")
				}
				return
			}
			switch tc.op {
			case abi.WROpRDMAWrite:
				if got := b.g.mrRead(t, bm, addr, uint64(tc.length)); !bytes.Equal(got, a.g.mrRead(t, a.mr, mrIOVA+0x4000, uint64(tc.length))) {
					t.Fatal("write: the MR does not hold the data at the window's address")
				}
			case abi.WROpRDMARead:
				if got := a.g.mrRead(t, a.mr, mrIOVA+0x4000, uint64(tc.length)); !bytes.Equal(got, data) {
					t.Fatal("read: wrong data")
				}
			default:
				if got := binary.LittleEndian.Uint64(b.g.mrRead(t, bm, addr, 8)); got != binary.LittleEndian.Uint64(data)+1 {
					t.Fatalf("fetch-add: target holds %#x", got)
				}
			}
		})
	}
}

// TestMWType2OtherQP: a type 2 window answers only the QP it is bound
// to; a type 1 window any QP of its PD. DEREG_MR of its MR is BUSY while
// a window is bound in it.
func TestMWType2OtherQP(t *testing.T) {
	for _, typ := range []uint32{abi.MWType1, abi.MWType2} {
		p := newPair(t, pairOpts{})
		a, b := p.a, p.b
		// A second connection between the devices: a's 0x101 to b's 0x201.
		a2 := newQP(t, a.g, a.d, 0x101, a.scq, a.rcq, qpOpts{})
		b2 := newQP(t, b.g, b.d, 0x201, b.scq, b.rcq, qpOpts{})
		connect(t, a2, b.d, b2.Num, remoteAll, 1, 0)
		connect(t, b2, a.d, a2.Num, remoteAll, 1, 0)
		bm := b.bindMR(t, bindAccess)
		w := newMWOn(t, b.d, typ)
		b.bind(t, 1, w.Key(), w.Key(), bm.Key, bindIOVA, bindLen, remoteAll)
		if e := p.status1(t, b, b.scq); e.Status != abi.WCSuccess {
			t.Fatalf("type %d bind: %+v", typ, e)
		}
		if _, err := b.d.DeregMR(bm.Key); err != ErrMRBusy {
			t.Fatalf("type %d: DEREG_MR of the MR under a window: got %v, want ErrMRBusy", typ, err)
		}
		postSendOn(t, a.g, a2, abi.SendWQE{WRID: 2, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: bindIOVA, RKey: w.Key()},
			[]abi.SGE{a.sge(0, 64)}, nil)
		want := abi.WCSuccess
		if typ == abi.MWType2 {
			want = abi.WCRemAccessErr
		}
		if e := p.status1(t, a, a.scq); e.Status != want || e.QPNum != a2.Num {
			t.Fatalf("type %d via another QP: got %+v, want %v", typ, e, want)
		}
		if err := b.d.RemoveMW(w.Key()); err != nil {
			t.Fatal(err)
		}
		if m, err := b.d.DeregMR(bm.Key); err != nil || m != bm {
			t.Fatalf("DEREG_MR after DEALLOC_MW: %v", err)
		}
	}
}

// TestMWBindErrors: every bind the rules refuse completes with
// MW_BIND_ERR and moves the QP to ERR, changing nothing.
func TestMWBindErrors(t *testing.T) {
	cases := []struct {
		name string
		typ  uint32
		mod  func(b *abi.BindMWWQE, w *MW, bm, plain *MR)
	}{
		{"no MW_BIND on the MR", 1, func(b *abi.BindMWWQE, w *MW, bm, plain *MR) { b.LKey = plain.Key }},
		{"index changed", 2, func(b *abi.BindMWWQE, w *MW, bm, plain *MR) { b.NewRKey = w.Key() + 0x100 }},
		{"stale key byte", 1, func(b *abi.BindMWWQE, w *MW, bm, plain *MR) { b.MW = nextKey(w.Key()) }},
		{"past the MR", 2, func(b *abi.BindMWWQE, w *MW, bm, plain *MR) { b.Length = bindLen + 1 }},
		{"length overflows", 1, func(b *abi.BindMWWQE, w *MW, bm, plain *MR) { b.Addr, b.Length = bindIOVA+8, ^uint64(0) }},
		{"local write asked", 1, func(b *abi.BindMWWQE, w *MW, bm, plain *MR) { b.Access |= abi.AccessLocalWrite }},
		{"MW_BIND asked", 1, func(b *abi.BindMWWQE, w *MW, bm, plain *MR) { b.Access |= abi.AccessMWBind }},
		{"type 2 unbind", 2, func(b *abi.BindMWWQE, w *MW, bm, plain *MR) { b.Length, b.LKey, b.Addr, b.Access = 0, 0, 0, 0 }},
		{"unbind with an lkey", 1, func(b *abi.BindMWWQE, w *MW, bm, plain *MR) { b.Length = 0 }},
		{"no such MW", 1, func(b *abi.BindMWWQE, w *MW, bm, plain *MR) { b.MW, b.NewRKey = w.Key()^0x800000, w.Key()^0x800000 }},
		{"no such MR", 1, func(b *abi.BindMWWQE, w *MW, bm, plain *MR) { b.LKey = nextKey(bm.Key) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, pairOpts{})
			b := p.b
			bm := b.bindMR(t, bindAccess)
			w := newMWOn(t, b.d, tc.typ)
			wqe := abi.BindMWWQE{WRID: 4, Opcode: abi.WROpBindMW, MW: w.Key(), NewRKey: w.Key(), LKey: bm.Key,
				Addr: bindIOVA, Length: 4096, Access: remoteAll}
			tc.mod(&wqe, w, bm, b.mr)
			postRawOn(t, b.g, b.qp, abi.Marshal(&wqe))
			e := p.status1(t, b, b.scq)
			if e.Status != abi.WCMWBindErr || e.Opcode != abi.WCOpBindMW || b.qp.State() != abi.QPSErr {
				t.Fatalf("got %+v in state %d, want MW_BIND_ERR and ERR", e, b.qp.State())
			}
			if w.Bound() || bm.windows != 0 {
				t.Fatal("a refused bind changed the window")
			}
		})
	}

	// A type 2 window is bound once; the second bind is refused. A
	// REMOTE_WRITE window needs LOCAL_WRITE on the MR. Another PD's MW.
	p := newPair(t, pairOpts{})
	b := p.b
	bm := b.bindMR(t, bindAccess)
	ro := b.bindMR(t, abi.AccessRemoteRead|abi.AccessMWBind)
	w := newMWOn(t, b.d, abi.MWType2)
	b.bind(t, 1, w.Key(), w.Key(), ro.Key, bindIOVA, 64, abi.AccessRemoteRead)
	b.bind(t, 2, w.Key(), w.Key(), bm.Key, bindIOVA, 64, remoteAll)
	p.poll(t)
	got := b.cqes(t, b.scq)
	if len(got) != 2 || got[0].Status != abi.WCSuccess || got[1].Status != abi.WCMWBindErr {
		t.Fatalf("second type 2 bind: %+v", got)
	}
	p = newPair(t, pairOpts{})
	b = p.b
	ro = b.bindMR(t, abi.AccessRemoteRead|abi.AccessMWBind)
	w = newMWOn(t, b.d, abi.MWType1)
	b.bind(t, 1, w.Key(), w.Key(), ro.Key, bindIOVA, 64, abi.AccessRemoteWrite)
	if e := p.status1(t, b, b.scq); e.Status != abi.WCMWBindErr {
		t.Fatalf("writable window on an MR without LOCAL_WRITE: %+v", e)
	}
	p = newPair(t, pairOpts{})
	b = p.b
	bm = b.bindMR(t, bindAccess)
	b.d.AddPD(2)
	other := NewMW(b.d.NewHandle(KindMW, 32), 2, abi.MWType1)
	if err := b.d.AddMW(other); err != nil {
		t.Fatal(err)
	}
	b.bind(t, 1, other.Key(), other.Key(), bm.Key, bindIOVA, 64, remoteAll)
	if e := p.status1(t, b, b.scq); e.Status != abi.WCMWBindErr {
		t.Fatalf("another PD's MW: %+v", e)
	}
}

// TestMWRebind: a type 1 window rebound moves, with its new key; the old
// key reaches nothing, and the first MR is free of it.
func TestMWRebind(t *testing.T) {
	p := newPair(t, pairOpts{})
	a, b := p.a, p.b
	m1, m2 := b.bindMR(t, bindAccess), b.bindMR(t, bindAccess)
	w := newMWOn(t, b.d, abi.MWType1)
	k1 := nextKey(w.Key())
	k2 := nextKey(k1)
	b.bind(t, 1, w.Key(), k1, m1.Key, bindIOVA, 4096, remoteAll)
	b.bind(t, 2, k1, k2, m2.Key, bindIOVA+4096, 4096, remoteAll)
	p.poll(t)
	if got := b.cqes(t, b.scq); len(got) != 2 || got[0].Status != abi.WCSuccess || got[1].Status != abi.WCSuccess {
		t.Fatalf("binds: %+v", got)
	}
	if m1.windows != 0 || m2.windows != 1 {
		t.Fatalf("windows: %d in the first MR, %d in the second; want 0, 1", m1.windows, m2.windows)
	}
	data := pattern(64, 9)
	a.g.mrWrite(t, a.mr, mrIOVA, data)
	a.postSend(t, abi.SendWQE{WRID: 3, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: bindIOVA + 4096, RKey: k2},
		[]abi.SGE{a.sge(0, 64)}, nil)
	if e := p.status1(t, a, a.scq); e.Status != abi.WCSuccess {
		t.Fatalf("write through the rebound window: %+v", e)
	}
	if !bytes.Equal(b.g.mrRead(t, m2, bindIOVA+4096, 64), data) {
		t.Fatal("the data is not in the second MR")
	}
	a.postSend(t, abi.SendWQE{WRID: 4, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: bindIOVA + 4096, RKey: k1},
		[]abi.SGE{a.sge(0, 64)}, nil)
	if e := p.status1(t, a, a.scq); e.Status != abi.WCRemAccessErr {
		t.Fatalf("the old key: %+v, want REM_ACCESS_ERR", e)
	}
}

// TestSendWithInv: SEND_WITH_INV frees the type 2 window bound to the
// responder QP (the receive completes WITH_INV, the key in imm_data), and
// with a key that names nothing it is REM_INV_REQ_ERR, the receive WQE
// not consumed, the responder in ERR.
func TestSendWithInv(t *testing.T) {
	p := newPair(t, pairOpts{})
	a, b := p.a, p.b
	bm := b.bindMR(t, bindAccess)
	w := newMWOn(t, b.d, abi.MWType2)
	b.bind(t, 1, w.Key(), w.Key(), bm.Key, bindIOVA, 4096, remoteAll)
	if e := p.status1(t, b, b.scq); e.Status != abi.WCSuccess {
		t.Fatalf("bind: %+v", e)
	}
	b.postRecv(t, 70, []abi.SGE{b.sge(0, 64)})
	a.postSend(t, abi.SendWQE{WRID: 2, Opcode: abi.WROpSendWithInv, Flags: abi.WRFlagSignaled, ImmData: w.Key()}, nil, []byte("bye"))
	if e := p.status1(t, a, a.scq); e.Status != abi.WCSuccess || e.Opcode != abi.WCOpSend {
		t.Fatalf("SEND_WITH_INV: %+v", e)
	}
	want1(t, "receive", b.cqes(t, b.rcq), abi.CQE{WRID: 70, Opcode: abi.WCOpRecv, WCFlags: abi.WCFlagWithInv, ImmData: w.Key(),
		QPNum: b.qp.Num, SrcQP: a.qp.Num, ByteLen: 3})
	if w.Bound() || bm.windows != 0 {
		t.Fatal("the window is still bound")
	}

	// Again: the window is free now, so the key names nothing.
	b.postRecv(t, 71, []abi.SGE{b.sge(0, 64)})
	a.postSend(t, abi.SendWQE{WRID: 3, Opcode: abi.WROpSendWithInv, Flags: abi.WRFlagSignaled, ImmData: w.Key()}, nil, []byte("bye"))
	if e := p.status1(t, a, a.scq); e.Status != abi.WCRemInvReqErr {
		t.Fatalf("SEND_WITH_INV of a free window: %+v, want REM_INV_REQ_ERR", e)
	}
	if b.qp.State() != abi.QPSErr {
		t.Fatal("the responder is not in ERR")
	}
	// Its receive was not consumed by the message: it is flushed.
	if got := b.cqes(t, b.rcq); len(got) != 1 || got[0].WRID != 71 || got[0].Status != abi.WCWRFlushErr {
		t.Fatalf("the receive: %+v, want it flushed", got)
	}
}

// TestSendWithInvOtherQP: a type 2 window bound to another QP of the
// responder's device is not the responder's to invalidate.
func TestSendWithInvOtherQP(t *testing.T) {
	p := newPair(t, pairOpts{})
	a, b := p.a, p.b
	b2 := newQP(t, b.g, b.d, 0x201, b.scq, b.rcq, qpOpts{})
	connect(t, b2, a.d, 0x101, remoteAll, 1, 0)
	bm := b.bindMR(t, bindAccess)
	w := newMWOn(t, b.d, abi.MWType2)
	postRawOn(t, b.g, b2, abi.Marshal(&abi.BindMWWQE{WRID: 1, Opcode: abi.WROpBindMW, Flags: abi.WRFlagSignaled,
		MW: w.Key(), NewRKey: w.Key(), LKey: bm.Key, Addr: bindIOVA, Length: 64, Access: remoteAll}))
	if e := p.status1(t, b, b.scq); e.Status != abi.WCSuccess || e.QPNum != b2.Num {
		t.Fatalf("bind on the second QP: %+v", e)
	}
	b.postRecv(t, 70, []abi.SGE{b.sge(0, 64)})
	a.postSend(t, abi.SendWQE{WRID: 2, Opcode: abi.WROpSendWithInv, Flags: abi.WRFlagSignaled, ImmData: w.Key()}, nil, []byte("x"))
	if e := p.status1(t, a, a.scq); e.Status != abi.WCRemInvReqErr {
		t.Fatalf("SEND_WITH_INV of another QP's window: %+v", e)
	}
	if !w.Bound() {
		t.Fatal("the window was invalidated")
	}
}
