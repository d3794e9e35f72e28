package engine

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// nicNode is a node whose device runs on a host NIC: its objects are
// made the way the control path makes them (host object first).
func newNICNode(tb testing.TB, nic *fakeNIC, gid [16]byte, o qpOpts, depth uint32) *node {
	tb.Helper()
	n := &node{g: newGuest(tb, "guest", 8<<20)}
	n.d = NewRNIC(nil, gid, nil)
	n.d.SetNIC(nic, [][16]byte{gid})
	n.d.Attach(n.g.mem, func(ev abi.Event) {
		n.evMu.Lock()
		n.events = append(n.events, ev)
		n.evMu.Unlock()
	}, func(int) { n.wakes.Add(1) })
	if n.d.AddPD(testPD) == nil {
		tb.Fatal("AddPD on the NIC failed")
	}
	mkCQ := func(num uint32) *CQ {
		rec := n.g.pages(tb, 1)[0]
		np := (int(depth)*abi.CQESize + abi.PageSize - 1) / abi.PageSize
		c := &CQ{Num: num, Dev: n.d, Ring: Ring{Pages: n.g.scattered(tb, np), Depth: depth, Stride: abi.CQESize}, Record: rec}
		if err := n.d.CreateCQNIC(c); err != nil {
			tb.Fatalf("CreateCQNIC: %v", err)
		}
		n.d.AddCQ(c)
		return c
	}
	n.scq, n.rcq = mkCQ(0x11), mkCQ(0x12)
	// newQP's ring layout, without its AddQP.
	if o.sqDepth == 0 {
		o.sqDepth, o.rqDepth, o.maxSGE, o.inl = qpDepth, qpDepth, qpSGE, qpInl
	}
	q := &QP{
		PD: testPD, Dev: n.d, SendCQ: n.scq, RecvCQ: n.rcq,
		SQ:         Ring{Pages: n.g.scattered(tb, int(o.sqDepth*256/abi.PageSize)+1), Depth: o.sqDepth, Stride: 256},
		RQ:         Ring{Pages: n.g.scattered(tb, int(o.rqDepth*128/abi.PageSize)+1), Depth: o.rqDepth, Stride: 128},
		Record:     n.g.pages(tb, 1)[0] + 16,
		MaxSendSGE: o.maxSGE, MaxRecvSGE: o.maxSGE, MaxInline: o.inl, SigAll: o.sigAll,
	}
	if err := n.d.CreateQPNIC(q); err != nil {
		tb.Fatalf("CreateQPNIC: %v", err)
	}
	if err := n.d.AddQP(q); err != nil {
		tb.Fatalf("AddQP: %v", err)
	}
	n.qp = q
	n.mr = n.g.newMR(tb, 0, testPD, abi.AccessAll, mrIOVA, mrLen, true)
	if err := n.d.RegisterMRNIC(n.g.tbl, n.mr); err != nil {
		tb.Fatalf("RegisterMRNIC: %v", err)
	}
	if err := n.d.AddMR(n.mr); err != nil {
		tb.Fatalf("AddMR: %v", err)
	}
	return n
}

func (n *node) nicSGE(off uint64, length uint32) abi.SGE {
	return abi.SGE{Addr: mrIOVA + off, Length: length, LKey: n.mr.Key}
}

type nicPair struct {
	nic  *fakeNIC
	a, b *node
}

func newNICPair(tb testing.TB, o qpOpts) *nicPair { return newNICPairCQ(tb, o, cqDepth) }

func newNICPairCQ(tb testing.TB, o qpOpts, depth uint32) *nicPair {
	tb.Helper()
	ga, gb := [16]byte{0xfe, 0x80, 15: 1}, [16]byte{0xfe, 0x80, 15: 2}
	nic := newFakeNIC(ga, gb)
	p := &nicPair{nic: nic, a: newNICNode(tb, nic, ga, o, depth), b: newNICNode(tb, nic, gb, o, depth)}
	all := uint32(abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic)
	connect(tb, p.a.qp, p.b.d, p.b.qp.Num, all, 1, 7)
	connect(tb, p.b.qp, p.a.d, p.a.qp.Num, all, 1, 7)
	return p
}

// poll runs both devices' passes until neither has work, waiting a little
// for the NIC's completions (bounded).
func (p *nicPair) poll(tb testing.TB) {
	tb.Helper()
	idle := 0
	for range 2000 {
		wa, _ := p.a.d.Poll(0, p.a.g.tbl)
		wb, _ := p.b.d.Poll(0, p.b.g.tbl)
		if wa || wb {
			idle = 0
			continue
		}
		if idle++; idle > 3 {
			return
		}
		time.Sleep(time.Millisecond)
	}
	tb.Fatalf("still busy after 2000 rounds")
}

// TestNICDataPath: every opcode goes from the guest's rings to the host
// NIC with the guest's own addresses and keys (the NIC's), and the host's
// completions come back as the guest's CQEs with the guest's wr_ids; the
// QP numbers the guests see are the NIC's.
func TestNICDataPath(t *testing.T) {
	p := newNICPair(t, qpOpts{})
	a, b := p.a, p.b
	if got := a.qp.Num; p.nic.qps[got] == nil {
		t.Fatalf("QP number %#x is not the NIC's", got)
	}
	if a.mr.Key != a.mr.RKey || p.nic.mrs[a.mr.Key] == nil {
		t.Fatalf("MR keys %#x/%#x are not the NIC's", a.mr.Key, a.mr.RKey)
	}
	data := pattern(3000, 5)
	a.g.mrWrite(t, a.mr, mrIOVA, data)

	// WRITE.
	a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		RemoteAddr: mrIOVA + 100, RKey: b.mr.RKey}, []abi.SGE{a.nicSGE(0, 1000), a.nicSGE(1000, 2000)}, nil)
	p.poll(t)
	want1(t, "write", a.cqes(t, a.scq), abi.CQE{WRID: 1, Opcode: abi.WCOpRDMAWrite, QPNum: a.qp.Num, ByteLen: 3000})
	if got := b.g.mrRead(t, b.mr, mrIOVA+100, 3000); !bytes.Equal(got, data) {
		t.Fatal("WRITE: the data did not arrive")
	}

	// SEND with immediate into a posted receive, and the same inline.
	b.postRecv(t, 77, []abi.SGE{b.nicSGE(8192, 4096)})
	b.postRecv(t, 78, []abi.SGE{b.nicSGE(16384, 64)})
	p.poll(t) // on the NIC before the SEND (a real one would retry RNR)
	a.postSend(t, abi.SendWQE{WRID: 2, Opcode: abi.WROpSendWithImm, Flags: abi.WRFlagSignaled, ImmData: 0xa1b2c3d4},
		[]abi.SGE{a.nicSGE(0, 3000)}, nil)
	a.postSend(t, abi.SendWQE{WRID: 3, Opcode: abi.WROpSend}, nil, []byte("inline bytes"))
	p.poll(t)
	want1(t, "send", a.cqes(t, a.scq), abi.CQE{WRID: 2, Opcode: abi.WCOpSend, QPNum: a.qp.Num, ByteLen: 3000})
	rc := b.cqes(t, b.rcq)
	if len(rc) != 2 || rc[0].WRID != 77 || rc[0].ByteLen != 3000 || rc[0].ImmData != 0xa1b2c3d4 ||
		rc[0].WCFlags != abi.WCFlagWithImm || rc[0].SrcQP != a.qp.Num || rc[0].QPNum != b.qp.Num ||
		rc[1].WRID != 78 || rc[1].ByteLen != 12 {
		t.Fatalf("receive CQEs %+v", rc)
	}
	if got := b.g.mrRead(t, b.mr, mrIOVA+16384, 12); string(got) != "inline bytes" {
		t.Fatalf("inline SEND delivered %q", got)
	}
	if rec := b.record(t); abi.LoadUint32(rec, abi.QPRecordRQCI) != 2 {
		t.Fatalf("rq_ci %d after two receives", abi.LoadUint32(rec, abi.QPRecordRQCI))
	}

	// READ and atomics.
	b.g.mrWrite(t, b.mr, mrIOVA+40000, pattern(500, 9))
	a.postSend(t, abi.SendWQE{WRID: 4, Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled,
		RemoteAddr: mrIOVA + 40000, RKey: b.mr.RKey}, []abi.SGE{a.nicSGE(20000, 500)}, nil)
	var v [8]byte
	binary.LittleEndian.PutUint64(v[:], 40)
	b.g.mrWrite(t, b.mr, mrIOVA+48, v[:])
	a.postSend(t, abi.SendWQE{WRID: 5, Opcode: abi.WROpAtomicFetchAdd, Flags: abi.WRFlagSignaled,
		RemoteAddr: mrIOVA + 48, RKey: b.mr.RKey, CompareAdd: 2}, []abi.SGE{a.nicSGE(30000, 8)}, nil)
	a.postSend(t, abi.SendWQE{WRID: 6, Opcode: abi.WROpAtomicCmpSwp, Flags: abi.WRFlagSignaled,
		RemoteAddr: mrIOVA + 48, RKey: b.mr.RKey, CompareAdd: 42, Swap: 7}, []abi.SGE{a.nicSGE(30008, 8)}, nil)
	p.poll(t)
	if c := a.cqes(t, a.scq); len(c) != 3 || c[0].WRID != 4 || c[1].WRID != 5 || c[2].WRID != 6 ||
		c[0].Status != abi.WCSuccess || c[2].Status != abi.WCSuccess {
		t.Fatalf("READ/atomic CQEs %+v", c)
	}
	if got := a.g.mrRead(t, a.mr, mrIOVA+20000, 500); !bytes.Equal(got, pattern(500, 9)) {
		t.Fatal("READ: wrong data")
	}
	if got := a.g.mrRead(t, a.mr, mrIOVA+30000, 16); binary.LittleEndian.Uint64(got) != 40 || binary.LittleEndian.Uint64(got[8:]) != 42 {
		t.Fatalf("atomics returned %x", got)
	}
	if got := b.g.mrRead(t, b.mr, mrIOVA+48, 8); binary.LittleEndian.Uint64(got) != 7 {
		t.Fatalf("atomics left %x", got)
	}
	if s := a.d.Stats(); s.Ops[abi.WROpRDMAWrite] != 1 || s.Ops[abi.WROpAtomicCmpSwp] != 1 || s.BytesMoved != 3000+3000+12+500+16 {
		t.Fatalf("stats %+v", s)
	}
}

// TestNICUnsignaled: unsignaled WQEs write no CQE, free their slots, and
// a batch goes to the NIC as one chain per pass.
func TestNICUnsignaled(t *testing.T) {
	p := newNICPair(t, qpOpts{})
	a, b := p.a, p.b
	for i := range qpDepth - 1 {
		a.postSend(t, abi.SendWQE{WRID: uint64(i), Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: b.mr.RKey},
			[]abi.SGE{a.nicSGE(0, 64)}, nil)
	}
	a.postSend(t, abi.SendWQE{WRID: 99, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: b.mr.RKey},
		[]abi.SGE{a.nicSGE(0, 64)}, nil)
	before := p.nic.posts
	p.poll(t)
	want1(t, "unsignaled batch", a.cqes(t, a.scq), abi.CQE{WRID: 99, Opcode: abi.WCOpRDMAWrite, QPNum: a.qp.Num, ByteLen: 64})
	if got := p.nic.posts - before; got != 1 {
		t.Fatalf("%d posts for one batch of %d WQEs, want 1 chain", got, qpDepth)
	}
	if ci := abi.LoadUint32(a.record(t), abi.QPRecordSQCI); ci != qpDepth {
		t.Fatalf("sq_ci %d, want %d", ci, qpDepth)
	}
	// The ring wraps: the host's slots were freed by the completions.
	for i := range 2 * qpDepth {
		a.postSend(t, abi.SendWQE{WRID: uint64(1000 + i), Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
			RemoteAddr: mrIOVA, RKey: b.mr.RKey}, []abi.SGE{a.nicSGE(0, 8)}, nil)
		p.poll(t)
	}
	if c := a.cqes(t, a.scq); len(c) != 2*qpDepth || c[len(c)-1].WRID != 1000+2*qpDepth-1 {
		t.Fatalf("%d CQEs after wrapping", len(c))
	}
}

// TestNICErrors: a bad rkey fails on the NIC and the QP flushes what
// follows in order, a malformed WQE completes with LOC_QP_OP_ERR, and
// RESET starts over.
func TestNICErrors(t *testing.T) {
	p := newNICPair(t, qpOpts{})
	a, b := p.a, p.b
	b.postRecv(t, 5, []abi.SGE{b.nicSGE(0, 64)})
	p.poll(t)
	a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: b.mr.RKey ^ 0x100},
		[]abi.SGE{a.nicSGE(0, 64)}, nil)
	p.poll(t)
	a.postSend(t, abi.SendWQE{WRID: 2, Opcode: abi.WROpSend}, []abi.SGE{a.nicSGE(0, 64)}, nil)
	p.poll(t)
	c := a.cqes(t, a.scq)
	if len(c) != 2 || c[0].WRID != 1 || c[0].Status != abi.WCRemAccessErr || c[1].WRID != 2 || c[1].Status != abi.WCWRFlushErr {
		t.Fatalf("after a bad rkey: %+v", c)
	}
	if a.qp.State() != abi.QPSErr {
		t.Fatalf("QP in %d after a remote error", a.qp.State())
	}

	// RESET, connect again, and a malformed WQE (an unknown opcode).
	if st := a.qp.Modify(abi.QPAttr{QPN: a.qp.Num, AttrMask: abi.QPAttrState, QPState: abi.QPSReset}); st != abi.StatusOK {
		t.Fatalf("RESET: %v", st)
	}
	connect(t, a.qp, b.d, b.qp.Num, abi.AccessRemoteWrite, 1, 7)
	a.postSend(t, abi.SendWQE{WRID: 3, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: b.mr.RKey},
		[]abi.SGE{a.nicSGE(0, 64)}, nil)
	a.postSend(t, abi.SendWQE{WRID: 4, Opcode: 0x55, Flags: abi.WRFlagSignaled}, nil, nil)
	a.postSend(t, abi.SendWQE{WRID: 5, Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: b.mr.RKey}, []abi.SGE{a.nicSGE(0, 64)}, nil)
	p.poll(t)
	c = a.cqes(t, a.scq)
	if len(c) != 3 || c[0].WRID != 3 || c[0].Status != abi.WCSuccess || c[1].WRID != 4 || c[1].Status != abi.WCLocQPOpErr ||
		c[2].WRID != 5 || c[2].Status != abi.WCWRFlushErr {
		t.Fatalf("after a malformed WQE: %+v", c)
	}
	// b's posted receive flushes when b moves to ERR.
	if st := b.qp.Modify(abi.QPAttr{QPN: b.qp.Num, AttrMask: abi.QPAttrState, QPState: abi.QPSErr}); st != abi.StatusOK {
		t.Fatalf("ERR: %v", st)
	}
	b.postRecv(t, 6, []abi.SGE{b.nicSGE(0, 64)})
	p.poll(t)
	if c := b.cqes(t, b.rcq); len(c) != 2 || c[0].WRID != 5 || c[0].Status != abi.WCWRFlushErr || c[1].WRID != 6 {
		t.Fatalf("b's receives after ERR: %+v", c)
	}
}

// TestNICTeardown: destroying and resetting a device leaves no host object.
func TestNICTeardown(t *testing.T) {
	p := newNICPair(t, qpOpts{})
	if p.nic.live == 0 {
		t.Fatal("no host objects")
	}
	a := p.a
	if q := a.d.RemoveQP(a.qp.Num); q == nil {
		t.Fatal("RemoveQP")
	}
	if a.d.RemoveMR(a.mr.Key) == nil || a.d.RemoveCQ(0x11) == nil || a.d.RemoveCQ(0x12) == nil {
		t.Fatal("remove")
	}
	if err := a.d.RemovePD(testPD); err != nil {
		t.Fatal(err)
	}
	p.b.d.Reset()
	if p.nic.live != 0 {
		t.Fatalf("%d host objects left behind", p.nic.live)
	}
}

// TestNICMemoryGone: a memory table without an MR's pages drops the MR's
// NIC registration (nothing keeps the pages the front-end took away); an
// MR within the table keeps its own.
func TestNICMemoryGone(t *testing.T) {
	p := newNICPair(t, qpOpts{})
	a := p.a
	in := a.g.newMR(t, 0, testPD, abi.AccessAll, 0x5000, 4096, false)
	if err := a.d.RegisterMRNIC(a.g.tbl, in); err != nil {
		t.Fatal(err)
	}
	if err := a.d.AddMR(in); err != nil {
		t.Fatal(err)
	}
	live := p.nic.live
	// The table without its second region (where the test MR's pages are
	// not: newMR allocates from the start of guest memory).
	small, err := a.g.tbl.Without(a.g.tbl.Regions()[1])
	if err != nil {
		t.Fatal(err)
	}
	defer small.Release()
	a.d.DropStaleNIC(small)
	if p.nic.live != live {
		t.Fatalf("an MR within the table lost its registration (%d → %d host objects)", live, p.nic.live)
	}
	none, err := small.Without(small.Regions()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer none.Release()
	a.d.DropStaleNIC(none)
	if p.nic.live != live-2 {
		t.Fatalf("%d host objects after the memory went away, want %d (both MRs dropped)", p.nic.live, live-2)
	}
	if a.d.RemoveMR(in.Key) == nil || p.nic.live != live-2 {
		t.Fatal("DEREG_MR after the drop")
	}
}

// TestNICGIDs: the guest's GID table holds what the operator gave the
// device, and MODIFY_QP hands the NIC the host's index of the sgid.
func TestNICGIDs(t *testing.T) {
	p := newNICPair(t, qpOpts{})
	d := p.a.d
	if g, ok := d.GIDAt(0); !ok || g != p.nic.gids[0] {
		t.Fatalf("entry 0: %x %v", g, ok)
	}
	if _, ok := d.GIDAt(1); ok {
		t.Fatal("entry 1 filled")
	}
	if err := d.SetGID(2, p.nic.gids[1]); err == nil {
		t.Fatal("ADD_GID of another device's GID succeeded")
	}
	if err := d.SetGID(2, p.nic.gids[0]); err != nil {
		t.Fatalf("ADD_GID of its own GID at another index: %v", err)
	}
	if q := p.nic.qps[p.a.qp.Num]; q.sgid != 3 {
		t.Fatalf("host sgid index %d, want 3 (the host's, not the guest's 0)", q.sgid)
	}
	d.ResetGIDs()
	if _, ok := d.GIDAt(2); ok {
		t.Fatal("entry 2 survived a reset")
	}
}

// TestNICPortEvents: the NIC's port events reach every device on it as
// port events, until the device closes.
func TestNICPortEvents(t *testing.T) {
	p := newNICPair(t, qpOpts{})
	p.a.takeEvents()
	p.b.takeEvents()
	p.nic.event(abi.EventPortError)
	p.a.d.CloseNIC()
	p.nic.event(abi.EventPortActive)
	if ev := p.a.takeEvents(); len(ev) != 1 || ev[0] != (abi.Event{Type: abi.EventPortError, Handle: 1}) {
		t.Fatalf("a's events %+v", ev)
	}
	if ev := p.b.takeEvents(); len(ev) != 2 || ev[1] != (abi.Event{Type: abi.EventPortActive, Handle: 1}) {
		t.Fatalf("b's events %+v", ev)
	}
}

// TestNICSmallCQ: a CQ smaller than the send queue (the guest signals one
// WQE in many) never overflows on the host, although every host work
// request completes into it: the engine posts only what the host CQ can
// take (the fake NIC panics on an overrun).
func TestNICSmallCQ(t *testing.T) {
	p := newNICPairCQ(t, qpOpts{sqDepth: 64, rqDepth: 16, maxSGE: 2, inl: 64}, 4)
	a, b := p.a, p.b
	for round := range 4 {
		for i := range 63 {
			a.postSend(t, abi.SendWQE{WRID: uint64(i), Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: b.mr.RKey},
				[]abi.SGE{a.nicSGE(0, 32)}, nil)
		}
		a.postSend(t, abi.SendWQE{WRID: 1000 + uint64(round), Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
			RemoteAddr: mrIOVA, RKey: b.mr.RKey}, []abi.SGE{a.nicSGE(0, 32)}, nil)
		p.poll(t)
		want1(t, "a round of 64 WRITEs", a.cqes(t, a.scq), abi.CQE{WRID: 1000 + uint64(round), Opcode: abi.WCOpRDMAWrite, QPNum: a.qp.Num, ByteLen: 32})
	}
	if free := a.scq.hwFree.Load(); free != 4 {
		t.Fatalf("host CQ room %d after everything completed, want 4", free)
	}
	// A RESET with receives posted gives their room back.
	for i := range 3 {
		b.postRecv(t, uint64(i), []abi.SGE{b.nicSGE(0, 64)})
	}
	p.poll(t)
	if free := b.rcq.hwFree.Load(); free != 1 {
		t.Fatalf("host CQ room %d with 3 receives posted, want 1", free)
	}
	if st := b.qp.Modify(abi.QPAttr{QPN: b.qp.Num, AttrMask: abi.QPAttrState, QPState: abi.QPSReset}); st != abi.StatusOK {
		t.Fatal(st)
	}
	if free := b.rcq.hwFree.Load(); free != 4 {
		t.Fatalf("host CQ room %d after RESET, want 4", free)
	}
}
