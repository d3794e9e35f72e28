package engine

import (
	"bytes"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestNetworkMW: over RoCEv2, a window's rkey reaches the memory it is
// bound over (the bind runs on a network QP, in send queue order after
// the WQEs posted before it), a fast registration serves as an lkey and
// an rkey, and another key byte is REM_ACCESS_ERR.
func TestNetworkMW(t *testing.T) {
	p := newNetPair(t, pairOpts{})
	a, b := p.a, p.b
	bm := b.bindMR(t, bindAccess)
	w := newMWOn(t, b.d, abi.MWType2)
	// A WRITE to a outstanding, then the bind: it waits for the WRITE.
	b.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: mrKey},
		[]abi.SGE{b.sge(0, 3000)}, nil)
	k := nextKey(w.Key())
	b.bind(t, 2, w.Key(), k, bm.Key, bindIOVA+0x800, 0x2000, remoteAll)
	got := b.waitCQEs(t, b.scq, 2)
	if got[0].WRID != 1 || got[1].WRID != 2 || got[0].Status != abi.WCSuccess || got[1].Status != abi.WCSuccess || got[1].Opcode != abi.WCOpBindMW {
		t.Fatalf("WRITE then BIND_MW on a network QP: %+v", got)
	}

	// a registers a fast MR over its own pages and WRITEs from it
	// through the window; then b READs the fast MR by its rkey.
	f, list, _ := frSetup(t, a, 4)
	fk := nextKey(f.Key())
	reg := regWQE(3, f, fk, list, abi.AccessLocalWrite|abi.AccessRemoteRead)
	postRawOn(t, a.g, a.qp, abi.Marshal(&reg))
	want1(t, "REG_MR", a.waitCQEs(t, a.scq, 1), abi.CQE{WRID: 3, Opcode: abi.WCOpRegMR, QPNum: a.qp.Num})
	data := pattern(5000, 21)
	a.g.mrWrite(t, f.Registered(), frIOVA, data)
	a.postSend(t, abi.SendWQE{WRID: 4, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: bindIOVA + 0x900, RKey: k},
		[]abi.SGE{{Addr: frIOVA, Length: 5000, LKey: fk}}, nil)
	want1(t, "write through the window", a.waitCQEs(t, a.scq, 1), abi.CQE{WRID: 4, Opcode: abi.WCOpRDMAWrite, QPNum: a.qp.Num, ByteLen: 5000})
	if !bytes.Equal(b.g.mrRead(t, bm, bindIOVA+0x900, 5000), data) {
		t.Fatal("write through the window: data differs")
	}
	b.postSend(t, abi.SendWQE{WRID: 5, Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled, RemoteAddr: frIOVA + 100, RKey: fk},
		[]abi.SGE{b.sge(0x6000, 2000)}, nil)
	want1(t, "read of the fast MR", b.waitCQEs(t, b.scq, 1), abi.CQE{WRID: 5, Opcode: abi.WCOpRDMARead, QPNum: b.qp.Num, ByteLen: 2000})
	if !bytes.Equal(b.g.mrRead(t, b.mr, mrIOVA+0x6000, 2000), data[100:2100]) {
		t.Fatal("read of the fast MR: data differs")
	}
}

// TestNetworkSendWithInv: over RoCEv2, a one-packet SEND_WITH_INV frees
// the type 2 window bound to the responder QP and a five-packet one the
// responder's fast registration (the IETH rides on the last packet); each
// receive completes WITH_INV with the key, the data placed whole, and the
// freed key reaches nothing afterwards (REM_ACCESS_ERR).
func TestNetworkSendWithInv(t *testing.T) {
	p := newNetPair(t, pairOpts{})
	a, b := p.a, p.b
	bm := b.bindMR(t, bindAccess)
	w := newMWOn(t, b.d, abi.MWType2)
	b.bind(t, 1, w.Key(), w.Key(), bm.Key, bindIOVA, 4096, remoteAll)
	if e := b.waitCQEs(t, b.scq, 1); e[0].Status != abi.WCSuccess {
		t.Fatalf("bind: %+v", e)
	}
	b.postRecv(t, 70, []abi.SGE{b.sge(0, 64)})
	a.postSend(t, abi.SendWQE{WRID: 2, Opcode: abi.WROpSendWithInv, Flags: abi.WRFlagSignaled | abi.WRFlagInline, ImmData: w.Key()}, nil, []byte("bye"))
	want1(t, "SEND_WITH_INV", a.waitCQEs(t, a.scq, 1), abi.CQE{WRID: 2, Opcode: abi.WCOpSend, QPNum: a.qp.Num, ByteLen: 3})
	want1(t, "receive", b.waitCQEs(t, b.rcq, 1), abi.CQE{WRID: 70, Opcode: abi.WCOpRecv, WCFlags: abi.WCFlagWithInv, ImmData: w.Key(),
		QPNum: b.qp.Num, SrcQP: a.qp.Num, ByteLen: 3})
	if w.Bound() {
		t.Fatal("the window is still bound")
	}
	bm.bindMu.Lock()
	nw := bm.windows
	bm.bindMu.Unlock()
	if nw != 0 {
		t.Fatalf("the MR counts %d windows", nw)
	}

	f, list, _ := frSetup(t, b, 4)
	fk := nextKey(f.Key())
	reg := regWQE(3, f, fk, list, abi.AccessLocalWrite|abi.AccessRemoteWrite)
	postRawOn(t, b.g, b.qp, abi.Marshal(&reg))
	want1(t, "REG_MR", b.waitCQEs(t, b.scq, 1), abi.CQE{WRID: 3, Opcode: abi.WCOpRegMR, QPNum: b.qp.Num})
	data := pattern(5000, 33)
	a.g.mrWrite(t, a.mr, mrIOVA, data)
	b.postRecv(t, 71, []abi.SGE{b.sge(0x1000, 8192)})
	a.postSend(t, abi.SendWQE{WRID: 4, Opcode: abi.WROpSendWithInv, Flags: abi.WRFlagSignaled, ImmData: fk}, []abi.SGE{a.sge(0, 5000)}, nil)
	want1(t, "SEND_WITH_INV of 5000 bytes", a.waitCQEs(t, a.scq, 1), abi.CQE{WRID: 4, Opcode: abi.WCOpSend, QPNum: a.qp.Num, ByteLen: 5000})
	want1(t, "receive of 5000 bytes", b.waitCQEs(t, b.rcq, 1), abi.CQE{WRID: 71, Opcode: abi.WCOpRecv, WCFlags: abi.WCFlagWithInv, ImmData: fk,
		QPNum: b.qp.Num, SrcQP: a.qp.Num, ByteLen: 5000})
	if !bytes.Equal(b.g.mrRead(t, b.mr, mrIOVA+0x1000, 5000), data) {
		t.Fatal("the message's data differs")
	}
	if f.Registered() != nil {
		t.Fatal("the fast registration is still registered")
	}
	a.postSend(t, abi.SendWQE{WRID: 5, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: frIOVA, RKey: fk},
		[]abi.SGE{a.sge(0, 8)}, nil)
	if e := a.waitCQEs(t, a.scq, 1); e[0].Status != abi.WCRemAccessErr {
		t.Fatalf("WRITE with the invalidated key: %+v, want REM_ACCESS_ERR", e)
	}
}

// TestNetworkSendWithInvBadKey: a key that names nothing the responder QP
// may invalidate is REM_INV_REQ_ERR at the requester (the WQE after it
// flushed); the responder's QP moves to ERR and its receive is flushed,
// whether the message took it (five packets: the IETH comes last) or not
// (one packet: checked before a receive is taken). A window bound to the
// responder keeps its binding.
func TestNetworkSendWithInvBadKey(t *testing.T) {
	for _, n := range []uint32{3, 5000} {
		p := newNetPair(t, pairOpts{})
		a, b := p.a, p.b
		bm := b.bindMR(t, bindAccess)
		w := newMWOn(t, b.d, abi.MWType2)
		b.bind(t, 1, w.Key(), w.Key(), bm.Key, bindIOVA, 4096, remoteAll)
		if e := b.waitCQEs(t, b.scq, 1); e[0].Status != abi.WCSuccess {
			t.Fatalf("bind: %+v", e)
		}
		b.postRecv(t, 70, []abi.SGE{b.sge(0, 8192)})
		a.postSend(t, abi.SendWQE{WRID: 2, Opcode: abi.WROpSendWithInv, Flags: abi.WRFlagSignaled, ImmData: nextKey(w.Key())},
			[]abi.SGE{a.sge(0, n)}, nil)
		a.postSend(t, abi.SendWQE{WRID: 3, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled}, []abi.SGE{a.sge(0, 8)}, nil)
		if e := a.waitCQEs(t, a.scq, 2); e[0].WRID != 2 || e[0].Status != abi.WCRemInvReqErr || e[1].WRID != 3 || e[1].Status != abi.WCWRFlushErr {
			t.Fatalf("%d bytes: completions %+v, want REM_INV_REQ_ERR then WR_FLUSH_ERR", n, e)
		}
		if st := b.qp.State(); st != abi.QPSErr {
			t.Fatalf("%d bytes: responder QP in state %d, want ERR", n, st)
		}
		if e := b.waitCQEs(t, b.rcq, 1); e[0].WRID != 70 || e[0].Status != abi.WCWRFlushErr {
			t.Fatalf("%d bytes: the receive: %+v, want it flushed", n, e)
		}
		if !w.Bound() {
			t.Fatalf("%d bytes: the window lost its binding", n)
		}
	}
}

// TestNetworkMWWrongKey: the window's rkey with another key byte is
// REM_ACCESS_ERR over RoCEv2, as on one host.
func TestNetworkMWWrongKey(t *testing.T) {
	p := newNetPair(t, pairOpts{})
	a, b := p.a, p.b
	bm := b.bindMR(t, bindAccess)
	w := newMWOn(t, b.d, abi.MWType1)
	b.bind(t, 1, w.Key(), w.Key(), bm.Key, bindIOVA, 0x1000, remoteAll)
	if e := b.waitCQEs(t, b.scq, 1); e[0].Status != abi.WCSuccess {
		t.Fatalf("bind: %+v", e)
	}
	a.postSend(t, abi.SendWQE{WRID: 2, Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled, RemoteAddr: bindIOVA, RKey: nextKey(w.Key())},
		[]abi.SGE{a.sge(0, 64)}, nil)
	if e := a.waitCQEs(t, a.scq, 1); e[0].Status != abi.WCRemAccessErr {
		t.Fatalf("read with another key byte: %+v, want REM_ACCESS_ERR", e)
	}
}
