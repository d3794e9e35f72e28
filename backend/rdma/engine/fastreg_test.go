package engine

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

const (
	frIOVA = 0x6000_0000_0100 // not page aligned
	frLen  = 3*abi.PageSize - 0x200
)

// frSetup allocates an ALLOC_MR MR of max pages on n's device and a page
// list in n's guest naming fresh scattered pages for [frIOVA, +frLen):
// the MR, the list's address and the pages.
func frSetup(tb testing.TB, n *node, max uint32) (*FRMR, abi.GPA, []abi.GPA) {
	tb.Helper()
	f := NewFRMR(n.d.NewHandle(KindMR, 32), testPD, max, 1<<40)
	if err := n.d.AddFRMR(f); err != nil {
		tb.Fatal(err)
	}
	pages := n.g.scattered(tb, 3)
	list := n.g.pages(tb, 1)[0]
	b := make([]byte, 8*len(pages))
	for i, pg := range pages {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(pg))
	}
	n.g.write(tb, list, b)
	return f, list, pages
}

// regWQE is a REG_MR WQE registering [frIOVA, +frLen) over list in f.
func regWQE(wrID uint64, f *FRMR, newKey uint32, list abi.GPA, access uint32) abi.RegMRWQE {
	return abi.RegMRWQE{WRID: wrID, Opcode: abi.WROpRegMR, Flags: abi.WRFlagSignaled, MR: f.Key(), IOVA: frIOVA,
		NewKey: newKey, Access: access, Length: frLen, PageList: uint64(list), NPages: 3, PageShift: abi.PageShift}
}

// TestFastReg registers an ALLOC_MR MR with a REG_MR WQE, uses it as an
// lkey and (by the peer) as an rkey, invalidates it (both keys then reach
// nothing), registers it again with the next key byte, and invalidates it
// with a SEND_WITH_INV from the peer.
func TestFastReg(t *testing.T) {
	p := newPair(t, pairOpts{})
	a, b := p.a, p.b
	f, list, pages := frSetup(t, a, 8)
	k1 := nextKey(f.Key())
	wqe := regWQE(1, f, k1, list, abi.AccessAll)
	postRawOn(t, a.g, a.qp, abi.Marshal(&wqe))
	p.poll(t)
	want1(t, "REG_MR", a.cqes(t, a.scq), abi.CQE{WRID: 1, Opcode: abi.WCOpRegMR, QPNum: a.qp.Num})
	mr := f.Registered()
	if mr == nil || mr.Key != k1 || !mr.Fast || mr.NumExtents() != 3 {
		t.Fatalf("registration %+v", mr)
	}

	// As an lkey: a WRITE from the registered memory into b's MR. The
	// bytes at frIOVA are at offset 0x100 of the first page.
	data := pattern(frLen, 11)
	a.g.mrWrite(t, mr, frIOVA, data)
	if got := a.g.slice(t, pages[0]+0x100, 16); !bytes.Equal(got, data[:16]) {
		t.Fatal("the registration does not map iova onto the page list")
	}
	a.postSend(t, abi.SendWQE{WRID: 2, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: mrKey},
		[]abi.SGE{{Addr: frIOVA, Length: frLen, LKey: k1}}, nil)
	if e := p.status1(t, a, a.scq); e.Status != abi.WCSuccess {
		t.Fatalf("write from the fast MR: %+v", e)
	}
	if !bytes.Equal(b.g.mrRead(t, b.mr, mrIOVA, frLen), data) {
		t.Fatal("write from the fast MR: data differs")
	}
	// As an rkey: b reads it.
	b.postSend(t, abi.SendWQE{WRID: 3, Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled, RemoteAddr: frIOVA + 4000, RKey: k1},
		[]abi.SGE{b.sge(0x8000, 1000)}, nil)
	if e := p.status1(t, b, b.scq); e.Status != abi.WCSuccess {
		t.Fatalf("read of the fast MR: %+v", e)
	}
	if !bytes.Equal(b.g.mrRead(t, b.mr, mrIOVA+0x8000, 1000), data[4000:5000]) {
		t.Fatal("read of the fast MR: data differs")
	}

	// A second registration while registered is refused.
	wqe = regWQE(4, f, nextKey(k1), list, abi.AccessAll)
	postRawOn(t, a.g, a.qp, abi.Marshal(&wqe))
	if e := p.status1(t, a, a.scq); e.Status != abi.WCLocQPOpErr || e.Opcode != abi.WCOpRegMR {
		t.Fatalf("REG_MR of a registered MR: %+v", e)
	}
	if f.Registered() != mr {
		t.Fatal("a refused REG_MR changed the MR")
	}

	// A fresh pair of QPs on the same devices: LOCAL_INV, then both
	// keys reach nothing.
	p2 := reconnect(t, p)
	a.localInv(t, 5, k1)
	if e := p2.status1(t, a, a.scq); e.Status != abi.WCSuccess || e.Opcode != abi.WCOpLocalInv {
		t.Fatalf("LOCAL_INV: %+v", e)
	}
	if f.Registered() != nil || f.Key() != k1 {
		t.Fatal("LOCAL_INV: the MR is still registered")
	}
	b.postSend(t, abi.SendWQE{WRID: 6, Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled, RemoteAddr: frIOVA, RKey: k1},
		[]abi.SGE{b.sge(0, 8)}, nil)
	if e := p2.status1(t, b, b.scq); e.Status != abi.WCRemAccessErr {
		t.Fatalf("rkey after LOCAL_INV: %+v", e)
	}

	p3 := reconnect(t, p2)
	a.postSend(t, abi.SendWQE{WRID: 7, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: mrKey},
		[]abi.SGE{{Addr: frIOVA, Length: 8, LKey: k1}}, nil)
	if e := p3.status1(t, a, a.scq); e.Status != abi.WCLocProtErr {
		t.Fatalf("lkey after LOCAL_INV: %+v", e)
	}

	// Registered again with the next key byte; the old key stays dead,
	// and b's SEND_WITH_INV of the new one frees it.
	p4 := reconnect(t, p3)
	k2 := nextKey(k1)
	wqe = regWQE(8, f, k2, list, abi.AccessLocalWrite|abi.AccessRemoteRead)
	postRawOn(t, a.g, a.qp, abi.Marshal(&wqe))
	if e := p4.status1(t, a, a.scq); e.Status != abi.WCSuccess {
		t.Fatalf("REG_MR again: %+v", e)
	}
	a.postRecv(t, 90, []abi.SGE{a.sge(0, 64)})
	b.postSend(t, abi.SendWQE{WRID: 9, Opcode: abi.WROpSendWithInv, Flags: abi.WRFlagSignaled, ImmData: k1}, nil, []byte("old"))
	if e := p4.status1(t, b, b.scq); e.Status != abi.WCRemInvReqErr {
		t.Fatalf("SEND_WITH_INV of the old key: %+v", e)
	}
	p5 := reconnect(t, p4)
	a.postRecv(t, 91, []abi.SGE{a.sge(0, 64)})
	b.postSend(t, abi.SendWQE{WRID: 10, Opcode: abi.WROpSendWithInv, Flags: abi.WRFlagSignaled, ImmData: k2}, nil, []byte("new"))
	if e := p5.status1(t, b, b.scq); e.Status != abi.WCSuccess {
		t.Fatalf("SEND_WITH_INV of the new key: %+v", e)
	}
	want1(t, "receive", a.cqes(t, a.rcq), abi.CQE{WRID: 91, Opcode: abi.WCOpRecv, WCFlags: abi.WCFlagWithInv, ImmData: k2,
		QPNum: a.qp.Num, SrcQP: b.qp.Num, ByteLen: 3})
	if f.Registered() != nil {
		t.Fatal("SEND_WITH_INV left the MR registered")
	}
	if _, err := a.d.DeregMR(nextKey(k2)); err != nil || a.d.LookupFRMR(k2) != nil {
		t.Fatalf("DEREG_MR of a free fast MR (any key byte): %v", err)
	}
}

// reconnect replaces the QPs of p's devices, whose last test left them in
// ERR (or not), by new connected ones on the same devices, CQs and MRs.
func reconnect(tb testing.TB, p *pair) *pair {
	tb.Helper()
	p.poll(tb)
	p.a.cqes(tb, p.a.scq)
	p.a.cqes(tb, p.a.rcq)
	p.b.cqes(tb, p.b.scq)
	p.b.cqes(tb, p.b.rcq)
	for _, n := range []*node{p.a, p.b} {
		old := n.qp
		n.d.RemoveQP(old.Num)
		n.qp = newQP(tb, n.g, n.d, old.Num+0x1000, n.scq, n.rcq, qpOpts{})
	}
	connect(tb, p.a.qp, p.b.d, p.b.qp.Num, remoteAll, 1, 0)
	connect(tb, p.b.qp, p.a.d, p.a.qp.Num, remoteAll, 1, 0)
	return p
}

// TestFastRegErrors: REG_MR WQEs the rules refuse complete with
// LOC_QP_OP_ERR, move the QP to ERR and leave the MR free.
func TestFastRegErrors(t *testing.T) {
	cases := []struct {
		name string
		mod  func(w *abi.RegMRWQE, n *node, list abi.GPA)
	}{
		{"index changed", func(w *abi.RegMRWQE, n *node, list abi.GPA) { w.NewKey += 0x100 }},
		{"stale key byte", func(w *abi.RegMRWQE, n *node, list abi.GPA) { w.MR = nextKey(w.MR) }},
		{"an ordinary MR", func(w *abi.RegMRWQE, n *node, list abi.GPA) { w.MR, w.NewKey = mrKey, mrKey }},
		{"npages formula", func(w *abi.RegMRWQE, n *node, list abi.GPA) { w.NPages = 4 }},
		{"over max_pages", func(w *abi.RegMRWQE, n *node, list abi.GPA) { w.Length, w.NPages = 5*abi.PageSize, 6 }},
		{"page_shift", func(w *abi.RegMRWQE, n *node, list abi.GPA) { w.PageShift = 11 }},
		{"length zero", func(w *abi.RegMRWQE, n *node, list abi.GPA) { w.Length = 0 }},
		{"length overflows", func(w *abi.RegMRWQE, n *node, list abi.GPA) { w.IOVA = ^uint64(0) - 10 }},
		{"remote write without local", func(w *abi.RegMRWQE, n *node, list abi.GPA) { w.Access = abi.AccessRemoteWrite }},
		{"unknown access", func(w *abi.RegMRWQE, n *node, list abi.GPA) { w.Access |= 0x20 }},
		{"list unaligned", func(w *abi.RegMRWQE, n *node, list abi.GPA) { w.PageList++ }},
		{"list outside memory", func(w *abi.RegMRWQE, n *node, list abi.GPA) { w.PageList = 0x8000_0000 }},
		{"list zero", func(w *abi.RegMRWQE, n *node, list abi.GPA) { w.PageList = 0 }},
		{"page unaligned", func(w *abi.RegMRWQE, n *node, list abi.GPA) { n.g.write(t, list+8, []byte{0x10}) }},
		{"page outside memory", func(w *abi.RegMRWQE, n *node, list abi.GPA) {
			n.g.write(t, list+16, binary.LittleEndian.AppendUint64(nil, 0x4000_0000))
		}},
		{"reserved", func(w *abi.RegMRWQE, n *node, list abi.GPA) { w.Reserved2 = 1 }},
		{"inline flag", func(w *abi.RegMRWQE, n *node, list abi.GPA) { w.Flags |= abi.WRFlagInline }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, pairOpts{})
			a := p.a
			f, list, _ := frSetup(t, a, 4)
			wqe := regWQE(1, f, f.Key(), list, abi.AccessAll)
			tc.mod(&wqe, a, list)
			postRawOn(t, a.g, a.qp, abi.Marshal(&wqe))
			e := p.status1(t, a, a.scq)
			if e.Status != abi.WCLocQPOpErr || a.qp.State() != abi.QPSErr {
				t.Fatalf("got %+v in state %d, want LOC_QP_OP_ERR and ERR", e, a.qp.State())
			}
			if f.Registered() != nil {
				t.Fatal("a refused REG_MR registered the MR")
			}
		})
	}
}

// TestFastRegWindow: a window bound in a fast registration keeps it from
// LOCAL_INV and DEREG_MR until the window goes.
func TestFastRegWindow(t *testing.T) {
	p := newPair(t, pairOpts{})
	a := p.a
	f, list, _ := frSetup(t, a, 4)
	wqe := regWQE(1, f, f.Key(), list, abi.AccessLocalWrite|abi.AccessMWBind)
	postRawOn(t, a.g, a.qp, abi.Marshal(&wqe))
	w := newMWOn(t, a.d, abi.MWType2)
	a.bind(t, 2, w.Key(), w.Key(), f.Key(), frIOVA, 64, abi.AccessRemoteWrite)
	a.localInv(t, 3, f.Key())
	p.poll(t)
	got := a.cqes(t, a.scq)
	if len(got) != 3 || got[0].Status != abi.WCSuccess || got[1].Status != abi.WCSuccess || got[2].Status != abi.WCLocQPOpErr {
		t.Fatalf("REG_MR, BIND_MW, LOCAL_INV of the MR: %+v", got)
	}
	if _, err := a.d.DeregMR(f.Key()); err != ErrMRBusy {
		t.Fatalf("DEREG_MR under a window: %v, want ErrMRBusy", err)
	}
	if err := a.d.RemoveMW(w.Key()); err != nil {
		t.Fatal(err)
	}
	if _, err := a.d.DeregMR(f.Key()); err != nil {
		t.Fatalf("DEREG_MR of a registered fast MR: %v", err)
	}
}
