package engine

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestNetworkQP: QPs of two devices on two fabrics, connected through a
// Network, run every verb over the RC transport: data lands where the
// same-host path puts it, CQEs carry the same fields (imm_data bytes as
// posted), completions come in posting order, and errors are the same
// statuses.
func TestNetworkQP(t *testing.T) {
	p := newNetPair(t, pairOpts{})
	a, b := p.a, p.b
	if c, _ := p.na.counts(); c != 1 {
		t.Fatalf("a made %d network connections, want 1", c)
	}

	// WRITE of 5000 bytes (5 packets at MTU 1024) from scattered SGEs.
	data := pattern(5000, 3)
	a.g.mrWrite(t, a.mr, mrIOVA, data)
	a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA + 8192, RKey: mrKey},
		[]abi.SGE{a.sge(0, 3000), a.sge(3000, 2000)}, nil)
	want1(t, "write", a.waitCQEs(t, a.scq, 1), abi.CQE{WRID: 1, Opcode: abi.WCOpRDMAWrite, QPNum: a.qp.Num, ByteLen: 5000})
	if got := b.g.mrRead(t, b.mr, mrIOVA+8192, 5000); !bytes.Equal(got, data) {
		t.Fatal("write: data differs")
	}

	// READ it back into another place.
	a.postSend(t, abi.SendWQE{WRID: 2, Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA + 8192, RKey: mrKey},
		[]abi.SGE{a.sge(20000, 5000)}, nil)
	want1(t, "read", a.waitCQEs(t, a.scq, 1), abi.CQE{WRID: 2, Opcode: abi.WCOpRDMARead, QPNum: a.qp.Num, ByteLen: 5000})
	if got := a.g.mrRead(t, a.mr, mrIOVA+20000, 5000); !bytes.Equal(got, data) {
		t.Fatal("read: data differs")
	}

	// SEND with immediate (inline) into a posted receive; WRITE with
	// immediate consuming the next one.
	b.postRecv(t, 77, []abi.SGE{b.sge(30000, 100)})
	b.postRecv(t, 78, []abi.SGE{b.sge(31000, 100)})
	imm := binary.LittleEndian.Uint32([]byte{0xde, 0xad, 0xbe, 0xef})
	a.postSend(t, abi.SendWQE{WRID: 3, Opcode: abi.WROpSendWithImm, Flags: abi.WRFlagSignaled, ImmData: imm}, nil, []byte("hello, network"))
	a.postSend(t, abi.SendWQE{WRID: 4, Opcode: abi.WROpRDMAWriteWithImm, Flags: abi.WRFlagSignaled, ImmData: imm,
		RemoteAddr: mrIOVA + 40000, RKey: mrKey}, []abi.SGE{a.sge(0, 64)}, nil)
	got := a.waitCQEs(t, a.scq, 2)
	if got[0].WRID != 3 || got[1].WRID != 4 || got[0].Status != abi.WCSuccess || got[1].Status != abi.WCSuccess {
		t.Fatalf("send, write_imm: CQEs %+v", got)
	}
	rcqes := b.waitCQEs(t, b.rcq, 2)
	wantR := []abi.CQE{
		{WRID: 77, Opcode: abi.WCOpRecv, QPNum: b.qp.Num, SrcQP: a.qp.Num, ByteLen: 14, WCFlags: abi.WCFlagWithImm, ImmData: imm},
		{WRID: 78, Opcode: abi.WCOpRecvRDMAWithImm, QPNum: b.qp.Num, SrcQP: a.qp.Num, ByteLen: 64, WCFlags: abi.WCFlagWithImm, ImmData: imm},
	}
	for i := range wantR {
		if rcqes[i] != wantR[i] {
			t.Fatalf("receive %d: got %+v, want %+v", i, rcqes[i], wantR[i])
		}
	}
	if got := b.g.mrRead(t, b.mr, mrIOVA+30000, 14); string(got) != "hello, network" {
		t.Fatalf("send: receive holds %q", got)
	}

	// FETCH_ADD and CMP_SWP on b's word.
	b.g.mrWrite(t, b.mr, mrIOVA+48, []byte{5, 0, 0, 0, 0, 0, 0, 0})
	a.postSend(t, abi.SendWQE{WRID: 5, Opcode: abi.WROpAtomicFetchAdd, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA + 48, RKey: mrKey, CompareAdd: 10},
		[]abi.SGE{a.sge(100, 8)}, nil)
	a.postSend(t, abi.SendWQE{WRID: 6, Opcode: abi.WROpAtomicCmpSwp, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA + 48, RKey: mrKey, CompareAdd: 15, Swap: 99},
		[]abi.SGE{a.sge(108, 8)}, nil)
	got = a.waitCQEs(t, a.scq, 2)
	if got[0].Status != abi.WCSuccess || got[1].Status != abi.WCSuccess || got[0].Opcode != abi.WCOpFetchAdd || got[1].Opcode != abi.WCOpCompSwap {
		t.Fatalf("atomics: CQEs %+v", got)
	}
	orig := a.g.mrRead(t, a.mr, mrIOVA+100, 16)
	if binary.LittleEndian.Uint64(orig) != 5 || binary.LittleEndian.Uint64(orig[8:]) != 15 {
		t.Fatalf("atomics returned %d, %d; want 5, 15", binary.LittleEndian.Uint64(orig), binary.LittleEndian.Uint64(orig[8:]))
	}
	if v := binary.LittleEndian.Uint64(b.g.mrRead(t, b.mr, mrIOVA+48, 8)); v != 99 {
		t.Fatalf("remote word is %d, want 99", v)
	}
	if s := a.d.Stats(); s.Ops[abi.WROpRDMAWrite] != 1 || s.Ops[abi.WROpRDMARead] != 1 || s.BytesMoved != 5000+5000+14+64+16 {
		t.Fatalf("stats %+v", s)
	}

	// A bad rkey: REM_ACCESS_ERR at a, both QPs end in ERR, later WQEs
	// flush in order.
	a.postSend(t, abi.SendWQE{WRID: 7, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: mrKey + 1},
		[]abi.SGE{a.sge(0, 16)}, nil)
	a.postSend(t, abi.SendWQE{WRID: 8, Opcode: abi.WROpSend}, []abi.SGE{a.sge(0, 16)}, nil)
	got = a.waitCQEs(t, a.scq, 2)
	if got[0].WRID != 7 || got[0].Status != abi.WCRemAccessErr || got[1].WRID != 8 || got[1].Status != abi.WCWRFlushErr {
		t.Fatalf("bad rkey: CQEs %+v", got)
	}
	if st := a.qp.State(); st != abi.QPSErr {
		t.Fatalf("a's QP in state %d, want ERR", st)
	}
	// The transport itself completed both WQEs (the NAK, then its flush);
	// the engine closes it at its next pass over the QP in ERR.
	closed := 0
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if _, closed = p.na.counts(); closed != 0 {
			break
		}
	}
	if closed != 1 {
		t.Fatalf("a's transport closed %d times, want 1", closed)
	}
}

// TestNetworkQPLoss: with packets dropped the transport retransmits under
// the engine, and every byte arrives once and in place.
func TestNetworkQPLoss(t *testing.T) {
	p := newNetPair(t, pairOpts{})
	a, b := p.a, p.b
	p.w.mu.Lock()
	p.w.drop = func(n int) bool { return n%7 == 3 }
	p.w.mu.Unlock()
	data := pattern(mrLen/2, 9)
	a.g.mrWrite(t, a.mr, mrIOVA, data)
	const msgs = 8
	chunk := uint32(len(data) / msgs)
	for i := range msgs {
		a.postSend(t, abi.SendWQE{WRID: uint64(i), Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
			RemoteAddr: mrIOVA + uint64(mrLen/2) + uint64(i)*uint64(chunk), RKey: mrKey},
			[]abi.SGE{a.sge(uint64(i)*uint64(chunk), chunk)}, nil)
	}
	got := a.waitCQEs(t, a.scq, msgs)
	for i, e := range got {
		if e.WRID != uint64(i) || e.Status != abi.WCSuccess {
			t.Fatalf("CQE %d: %+v", i, e)
		}
	}
	if !bytes.Equal(b.g.mrRead(t, b.mr, mrIOVA+mrLen/2, uint64(len(data))), data) {
		t.Fatal("data differs")
	}
	if c := p.w.qp(a.qp.Num).Counters(); c.Retransmits == 0 {
		t.Fatalf("nothing retransmitted: %+v", c)
	}
}

// TestNetworkQPResetDestroy: RESET with work outstanding closes the
// transport without completing anything; destroying a connected QP closes
// it too; a dgid nobody has, from the port GID, is still NOT_FOUND.
func TestNetworkQPResetDestroy(t *testing.T) {
	// b has no receive posted and rnr_retry is 7: a's SEND stays
	// outstanding in the transport.
	p := newNetPairIdle(t, pairOpts{rnrRetry: 7})
	a, b := p.a, p.b
	a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled}, []abi.SGE{a.sge(0, 16)}, nil)
	a.d.Poll(0, a.g.tbl) // posted to the transport
	if st := a.qp.Modify(abi.QPAttr{QPState: abi.QPSReset, AttrMask: abi.QPAttrState}); st != abi.StatusOK {
		t.Fatalf("reset: %v", st)
	}
	if _, closed := p.na.counts(); closed != 1 {
		t.Fatalf("a's transport closed %d times, want 1", closed)
	}
	time.Sleep(20 * time.Millisecond)
	if got := a.cqes(t, a.scq); len(got) != 0 {
		t.Fatalf("reset completed %+v", got)
	}
	if q := b.d.RemoveQP(b.qp.Num); q == nil {
		t.Fatal("remove b's QP")
	}
	if _, closed := p.nb.counts(); closed != 1 {
		t.Fatalf("b's transport closed %d times, want 1", closed)
	}
	if p.fb.qpnTaken(nil, b.qp.Num) {
		t.Fatal("b's QP number still claimed")
	}
	// From the port GID (index 0) an unknown dgid is not a network peer.
	connectInit(t, a.qp)
	st := a.qp.Modify(abi.QPAttr{QPState: abi.QPSRTR, AttrMask: abi.QPAttrState | abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN |
		abi.QPAttrRQPSN | abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer, DGID: hostB, SGIDIndex: 0, PathMTU: abi.MTU1024, DestQPNum: 5})
	if st != abi.StatusNotFound {
		t.Fatalf("RTR from the port GID to a network GID: %v, want NOT_FOUND", st)
	}
}

func connectInit(tb testing.TB, q *QP) {
	tb.Helper()
	if st := q.Modify(abi.QPAttr{QPState: abi.QPSInit, AttrMask: abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrAccessFlags,
		PortNum: 1, QPAccessFlags: abi.AccessRemoteWrite}); st != abi.StatusOK {
		tb.Fatalf("INIT: %v", st)
	}
}

// TestNetworkGIDs: the network GIDs fill entries 1… of every device's
// table, after a reset too, and are shared: ADD_GID of one on another
// device is not BUSY, and no device owns it (Lookup finds none).
func TestNetworkGIDs(t *testing.T) {
	f := NewFabric()
	f.SetNetwork(&memNet{}, [][16]byte{hostA, hostB})
	d1 := NewRNIC(f, [16]byte{0xfe, 0x80, 15: 1}, nil)
	d2 := NewRNIC(f, [16]byte{0xfe, 0x80, 15: 2}, nil)
	d2.SetNetGIDs([][16]byte{hostB})
	for _, d := range []*RNIC{d1, d2} {
		if err := f.Register(d); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range [][16]byte{d1.GID(), hostA, hostB} {
		if g, ok := d1.GIDAt(i); !ok || g != want {
			t.Fatalf("d1 entry %d: %x %v, want %x", i, g, ok, want)
		}
	}
	if g, ok := d2.GIDAt(1); !ok || g != hostB {
		t.Fatalf("d2 entry 1: %x %v", g, ok)
	}
	if _, ok := d2.GIDAt(2); ok {
		t.Fatal("d2 has the fabric's network GIDs besides its own")
	}
	if err := d2.SetGID(5, hostB); err != nil {
		t.Fatalf("ADD_GID of a shared network GID: %v", err)
	}
	if f.Lookup(hostB) != nil || f.Lookup(hostA) != nil {
		t.Fatal("a network GID resolves to a device")
	}
	d1.SetGID(1, [16]byte{1})
	d1.ResetGIDs()
	if g, ok := d1.GIDAt(1); !ok || g != hostA {
		t.Fatalf("after reset, d1 entry 1: %x %v", g, ok)
	}
	if !f.IsNetGID(d1, hostA) || f.IsNetGID(d2, hostA) || !f.IsNetGID(d2, hostB) {
		t.Fatal("IsNetGID")
	}
}

// TestNetworkPeerMemoryFault: the responder's memory vanishes (its
// front-end shrank the file) while requests arrive from the network. The
// transport's goroutine contains the fault (no crash): the requester gets
// an error completion, the responder QP ends in ERR, and both engines keep
// serving.
func TestNetworkPeerMemoryFault(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   uint8
		want abi.WCStatus
	}{
		// REM_OP_ERR, as on one host (fault.go): the keys were good,
		// the memory failed.
		{"write", abi.WROpRDMAWrite, abi.WCRemOpErr},
		{"read", abi.WROpRDMARead, abi.WCRemOpErr},
		{"atomic", abi.WROpAtomicFetchAdd, abi.WCRemOpErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bg := newCutGuest(t, 8<<20)
			p := newNetPairOn(t, pairOpts{}, bg)
			a := p.a
			bg.cut(t, 1)
			a.postSend(t, abi.SendWQE{WRID: 9, Opcode: tc.op, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA + 64, RKey: mrKey, CompareAdd: 1},
				[]abi.SGE{a.sge(0, 8)}, nil)
			var got []abi.CQE
			for deadline := time.Now().Add(10 * time.Second); len(got) == 0; {
				if err := guardedPoll(a.d, a.g.tbl); err != nil {
					t.Fatalf("fault escaped: %v", err)
				}
				got = a.cqes(t, a.scq)
				if time.Now().After(deadline) {
					t.Fatal("no completion")
				}
				time.Sleep(time.Millisecond)
			}
			if got[0].WRID != 9 || got[0].Status != tc.want {
				t.Fatalf("CQE %+v, want status %v", got[0], tc.want)
			}
			if st := p.b.qp.State(); st != abi.QPSErr {
				t.Fatalf("responder QP in state %d, want ERR", st)
			}
		})
	}
}

// TestNetworkQPFullTransport: more WQEs than the send queue holds are
// posted while the network delivers nothing, so the transport fills and
// the driver reuses ring slots whose WQEs are still unacknowledged. None
// is lost or overwritten: once packets flow, each completes in order with
// its own wr_id and data.
func TestNetworkQPFullTransport(t *testing.T) {
	p := newNetPair(t, pairOpts{})
	a, b := p.a, p.b
	p.w.mu.Lock()
	p.w.drop = func(int) bool { return true }
	p.w.mu.Unlock()
	const n = 3 * qpDepth
	data := pattern(n*256, 5)
	a.g.mrWrite(t, a.mr, mrIOVA, data)
	rec := a.record(t)
	for i := 0; i < n; {
		// As a driver: post while the ring has room (sq_ci advances as
		// the engine hands WQEs to the transport).
		if abi.LoadUint32(rec, abi.QPRecordSQPI)-abi.LoadUint32(rec, abi.QPRecordSQCI) < qpDepth {
			a.postSend(t, abi.SendWQE{WRID: uint64(100 + i), Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
				RemoteAddr: mrIOVA + 32768 + uint64(i)*256, RKey: mrKey}, []abi.SGE{a.sge(uint64(i)*256, 256)}, nil)
			i++
			continue
		}
		if i >= 2*qpDepth {
			break // the transport is full and the ring too
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	p.w.mu.Lock()
	p.w.drop = nil
	p.w.mu.Unlock()
	var got []abi.CQE
	for posted := int(abi.LoadUint32(rec, abi.QPRecordSQPI)); len(got) < n; {
		got = append(got, a.waitCQEs(t, a.scq, 1)...)
		for posted < n && abi.LoadUint32(rec, abi.QPRecordSQPI)-abi.LoadUint32(rec, abi.QPRecordSQCI) < qpDepth {
			a.postSend(t, abi.SendWQE{WRID: uint64(100 + posted), Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
				RemoteAddr: mrIOVA + 32768 + uint64(posted)*256, RKey: mrKey}, []abi.SGE{a.sge(uint64(posted)*256, 256)}, nil)
			posted++
		}
	}
	for i, e := range got {
		if e.WRID != uint64(100+i) || e.Status != abi.WCSuccess {
			t.Fatalf("CQE %d: %+v", i, e)
		}
	}
	if !bytes.Equal(b.g.mrRead(t, b.mr, mrIOVA+32768, uint64(len(data))), data) {
		t.Fatal("data differs")
	}
}

// TestNetworkPaths: MODIFY_QP's PATHS reaches the network with the
// device's network GIDs; beyond 64, or set without its mask bit, it is
// INVALID and nothing connects.
func TestNetworkPaths(t *testing.T) {
	p := newNetPairIdle(t, pairOpts{})
	q := newQP(t, p.a.g, p.a.d, 0x300, p.a.scq, p.a.rcq, qpOpts{})
	connectInit(t, q)
	rtr := abi.QPAttr{QPState: abi.QPSRTR, AttrMask: abi.QPAttrState | abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN |
		abi.QPAttrRQPSN | abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer, DGID: hostB, SGIDIndex: 1, PathMTU: abi.MTU1024, DestQPNum: 0x201} // a's QP holds 0x200
	before, _ := p.na.counts()
	for _, bad := range []abi.QPAttr{
		func() abi.QPAttr { a := rtr; a.Paths = 4; return a }(), // no mask bit
		func() abi.QPAttr { a := rtr; a.AttrMask |= abi.QPAttrPaths; a.Paths = MaxPaths + 1; return a }(),
	} {
		if st := q.Modify(bad); st != abi.StatusInvalid {
			t.Fatalf("paths %d mask %#x: %v, want INVALID", bad.Paths, bad.AttrMask, st)
		}
	}
	if c, _ := p.na.counts(); c != before {
		t.Fatal("an invalid MODIFY_QP connected")
	}
	a := rtr
	a.AttrMask |= abi.QPAttrPaths
	a.Paths = 8
	if st := q.Modify(a); st != abi.StatusOK {
		t.Fatalf("RTR with 8 paths: %v", st)
	}
	p.na.mu.Lock()
	paths, locals := p.na.paths, p.na.locals
	p.na.mu.Unlock()
	if paths != 8 || locals != 1 {
		t.Fatalf("network got paths %d, %d local GIDs; want 8, 1", paths, locals)
	}
	if got := q.Attr().Paths; got != 8 {
		t.Fatalf("QUERY_QP paths %d, want 8", got)
	}
}
