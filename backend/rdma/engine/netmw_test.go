package engine

import (
	"bytes"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestNetworkMW: over RoCEv2, a window's rkey reaches the memory it is
// bound over (the bind runs on a network QP, in send queue order after
// the WQEs posted before it), a fast registration serves as an lkey and
// an rkey, another key byte is REM_ACCESS_ERR, and SEND_WITH_INV, which
// the transport does not carry, completes with LOC_QP_OP_ERR.
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

	// SEND_WITH_INV is refused locally: the QP moves to ERR.
	a.postSend(t, abi.SendWQE{WRID: 6, Opcode: abi.WROpSendWithInv, Flags: abi.WRFlagSignaled, ImmData: k}, nil, []byte("x"))
	if e := a.waitCQEs(t, a.scq, 1); e[0].Status != abi.WCLocQPOpErr {
		t.Fatalf("SEND_WITH_INV over the network: %+v", e)
	}
	if !w.Bound() {
		t.Fatal("the refused SEND_WITH_INV freed the window")
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
