package engine

import (
	"bytes"
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// cutGuest is a test guest whose front-end can shrink the files behind its
// two regions, as a hostile front-end does with an unsealed memfd.
type cutGuest struct {
	*guest
	fds  [2]int // dups of the regions' memfds
	half uint64 // bytes per region
}

func newCutGuest(tb testing.TB, size uint64) *cutGuest {
	tb.Helper()
	cg := &cutGuest{half: size / 2}
	cg.guest = newGuestFds(tb, "cut", size, func(i, fd int) {
		var err error
		if cg.fds[i], err = unix.Dup(fd); err != nil {
			tb.Fatal(err)
		}
	})
	tb.Cleanup(func() {
		unix.Close(cg.fds[0])
		unix.Close(cg.fds[1])
	})
	return cg
}

// cut empties the file behind region i: every later access to it faults.
func (g *cutGuest) cut(tb testing.TB, i int) {
	tb.Helper()
	if err := unix.Ftruncate(g.fds[i], 0); err != nil {
		tb.Fatal(err)
	}
}

// newNodeOn is newNode on guest g, with the MR in g's second region (the
// rings, records and CQs stay in the first).
func newNodeOn(tb testing.TB, f *Fabric, g *cutGuest, gid byte, qpn uint32) *node {
	tb.Helper()
	return newNodeIn(tb, f, g.guest, gid, qpn, qpOpts{}, abi.GPA(guestBase+g.half))
}

// guardedPoll runs d's engine for queue 0 the way the doorbell worker does
// (under memmap.Guard) until it has nothing left to do, and returns the
// fault that escaped, if any (the worker would break its ring with it).
func guardedPoll(d *RNIC, t *memmap.Table) error {
	for range 100 {
		var worked bool
		if err := memmap.Guard(func() { worked, _ = d.Poll(0, t) }); err != nil {
			return err
		}
		if !worked {
			return nil
		}
	}
	return errors.New("engine still busy after 100 polls")
}

// faultRig is a requester a with QP 0x100 towards b (whose front-end can
// cut its memory) and QP 0x101 towards a bystander c.
type faultRig struct {
	a, b, c *node
	bg      *cutGuest
	aToC    *QP
}

func newFaultRig(t *testing.T) *faultRig {
	t.Helper()
	f := NewFabric()
	r := &faultRig{bg: newCutGuest(t, 8<<20)}
	r.a = newNode(t, f, 1, 0x100, qpOpts{})
	r.b = newNodeOn(t, f, r.bg, 2, 0x200)
	r.c = newNode(t, f, 3, 0x300, qpOpts{})
	all := uint32(abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic)
	connect(t, r.a.qp, r.b.d, 0x200, all, 1, 0)
	connect(t, r.b.qp, r.a.d, 0x100, all, 1, 0)
	r.aToC = newQP(t, r.a.g, r.a.d, 0x101, r.a.scq, r.a.rcq, qpOpts{})
	connect(t, r.aToC, r.c.d, 0x300, all, 1, 0)
	connect(t, r.c.qp, r.a.d, 0x101, all, 1, 0)
	return r
}

// checkBystander writes from a to c over a's second QP: a's engine and
// queue still work and c receives the bytes.
func (r *faultRig) checkBystander(t *testing.T) {
	t.Helper()
	a, c := r.a, r.c
	data := pattern(5000, 0x33)
	a.g.mrWrite(t, a.mr, mrIOVA+100, data)
	first := a.qp
	a.qp = r.aToC // post on a's second QP
	a.postSend(t, abi.SendWQE{WRID: 99, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA + 7, RKey: mrKey},
		[]abi.SGE{a.sge(100, 5000)}, nil)
	a.qp = first
	if err := guardedPoll(a.d, a.g.tbl); err != nil {
		t.Fatalf("requester's engine after the peer's fault: %v", err)
	}
	want1(t, "bystander write", a.cqes(t, a.scq), abi.CQE{WRID: 99, Opcode: abi.WCOpRDMAWrite, QPNum: 0x101, ByteLen: 5000})
	if got := c.g.mrRead(t, c.mr, mrIOVA+7, 5000); !bytes.Equal(got, data) {
		t.Fatal("bystander device received other bytes than were written")
	}
	if s := r.aToC.State(); s != abi.QPSRTS {
		t.Fatalf("requester's other QP: state %d, want RTS", s)
	}
}

// A fault in the responder's memory is the responder's: the requester's WR
// completes with REM_OP_ERR, the requester QP goes to ERR (RC), the
// responder QP to ERR with QP_FATAL, and the requester's engine, queue
// and other QPs go on.
func TestPeerMemoryFault(t *testing.T) {
	ops := []struct {
		name string
		op   uint8
		len  uint32
	}{
		{"write", abi.WROpRDMAWrite, 6000},
		{"write with imm", abi.WROpRDMAWriteWithImm, 100},
		{"read", abi.WROpRDMARead, 6000},
		{"fetch add", abi.WROpAtomicFetchAdd, 8},
		{"compare swap", abi.WROpAtomicCmpSwp, 8},
		{"send", abi.WROpSend, 3000},
	}
	cuts := []struct {
		name    string
		regions []int
	}{
		{"peer MR gone", []int{1}},
		{"all peer memory gone", []int{0, 1}},
	}
	for _, cut := range cuts {
		for _, tc := range ops {
			t.Run(cut.name+"/"+tc.name, func(t *testing.T) {
				r := newFaultRig(t)
				a, b := r.a, r.b
				whole := len(cut.regions) == 2
				if tc.op == abi.WROpSend || tc.op == abi.WROpRDMAWriteWithImm {
					b.postRecv(t, 55, []abi.SGE{b.sge(0, 8192)})
				}
				for _, i := range cut.regions {
					r.bg.cut(t, i)
				}
				a.postSend(t, abi.SendWQE{WRID: 7, Opcode: tc.op, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA + 64, RKey: mrKey, CompareAdd: 1},
					[]abi.SGE{a.sge(0, tc.len)}, nil)
				a.postSend(t, abi.SendWQE{WRID: 8, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: mrKey},
					[]abi.SGE{a.sge(0, 16)}, nil)
				if err := guardedPoll(a.d, a.g.tbl); err != nil {
					t.Fatalf("the peer's fault escaped the requester's engine: %v", err)
				}
				got := a.cqes(t, a.scq)
				if len(got) != 2 || got[0].WRID != 7 || got[0].Status != abi.WCRemOpErr || got[1].WRID != 8 || got[1].Status != abi.WCWRFlushErr {
					t.Fatalf("requester CQEs: got %+v, want wr 7 REM_OP_ERR (11), then wr 8 WR_FLUSH_ERR", got)
				}
				if s := a.qp.State(); s != abi.QPSErr {
					t.Fatalf("requester QP: state %d, want ERR", s)
				}
				if s := b.qp.State(); s != abi.QPSErr {
					t.Fatalf("responder QP: state %d, want ERR", s)
				}
				if evs := b.takeEvents(); len(evs) != 1 || evs[0] != (abi.Event{Type: abi.EventQPFatal, Handle: 0x200}) {
					t.Fatalf("responder events: got %+v, want one QP_FATAL for 0x200", evs)
				}
				if evs := a.takeEvents(); len(evs) != 0 {
					t.Fatalf("requester events: got %+v, want none (its error is a completion)", evs)
				}
				r.checkBystander(t)

				// The responder's own engine now flushes its QP in ERR. Its
				// rings and records are in its first region: with that one
				// intact it works; with it gone the fault is its own and
				// escapes (its doorbell queue breaks).
				err := guardedPoll(b.d, b.g.tbl)
				if whole {
					if !errors.Is(err, memmap.ErrFault) {
						t.Fatalf("responder's engine over its vanished memory: got %v, want ErrFault", err)
					}
					return
				}
				if err != nil {
					t.Fatalf("responder's engine over its intact rings: %v", err)
				}
				if tc.op == abi.WROpSend || tc.op == abi.WROpRDMAWriteWithImm {
					if got := b.cqes(t, b.rcq); len(got) != 1 || got[0].WRID != 55 || got[0].Status == abi.WCSuccess {
						t.Fatalf("responder's receive WQE: got %+v, want one error CQE for wr 55", got)
					}
				}
			})
		}
	}
}

// A fault in the requester's own memory keeps the old behaviour: it is its
// device's fault and escapes to the worker's Guard (which breaks that
// doorbell queue); the peer is not blamed.
func TestOwnMemoryFault(t *testing.T) {
	f := NewFabric()
	ag := newCutGuest(t, 8<<20)
	a := newNodeOn(t, f, ag, 1, 0x100)
	b := newNode(t, f, 2, 0x200, qpOpts{})
	all := uint32(abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic)
	connect(t, a.qp, b.d, 0x200, all, 1, 0)
	connect(t, b.qp, a.d, 0x100, all, 1, 0)
	for _, op := range []uint8{abi.WROpRDMAWrite, abi.WROpRDMARead} {
		a.postSend(t, abi.SendWQE{WRID: 1, Opcode: op, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: mrKey},
			[]abi.SGE{a.sge(0, 4096)}, nil)
	}
	ag.cut(t, 1) // a's MR: the source of the WRITE, the destination of the READ
	if err := guardedPoll(a.d, a.g.tbl); !errors.Is(err, memmap.ErrFault) {
		t.Fatalf("requester's own memory faulted: got %v, want ErrFault", err)
	}
	if s := b.qp.State(); s != abi.QPSRTS {
		t.Fatalf("peer QP blamed for the requester's fault: state %d, want RTS", s)
	}
	if evs := b.takeEvents(); len(evs) != 0 {
		t.Fatalf("peer events: got %+v, want none", evs)
	}
}

// A loopback QP (its peer is its own device) shares one memory: a fault
// there is the device's own.
func TestLoopbackMemoryFault(t *testing.T) {
	f := NewFabric()
	ag := newCutGuest(t, 8<<20)
	a := newNodeOn(t, f, ag, 1, 0x100)
	q2 := newQP(t, a.g, a.d, 0x101, a.scq, a.rcq, qpOpts{})
	all := uint32(abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic)
	connect(t, a.qp, a.d, 0x101, all, 1, 0)
	connect(t, q2, a.d, 0x100, all, 1, 0)
	a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: mrKey},
		[]abi.SGE{a.sge(0, 16)}, nil) // the source faults, then the destination would
	ag.cut(t, 1)
	if err := guardedPoll(a.d, a.g.tbl); !errors.Is(err, memmap.ErrFault) {
		t.Fatalf("loopback fault: got %v, want ErrFault", err)
	}
}

// Resetting a device reads the records of the peers connected to it; a
// peer whose memory vanished must not take the daemon down there (Reset
// runs outside any Guard).
func TestResetWithFaultedPeer(t *testing.T) {
	r := newFaultRig(t)
	a, b := r.a, r.b
	b.postSend(t, abi.SendWQE{WRID: 3, Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: mrKey}, nil, nil)
	r.bg.cut(t, 0)
	r.bg.cut(t, 1)
	a.d.Reset()
	if a.d.Count(KindQP) != 0 {
		t.Fatalf("after reset: %d QPs, want none", a.d.Count(KindQP))
	}
	if s := b.qp.State(); s != abi.QPSErr {
		t.Fatalf("peer QP of the reset device: state %d, want ERR", s)
	}
	if s := r.c.qp.State(); s != abi.QPSErr {
		t.Fatalf("bystander QP connected to the reset device: state %d, want ERR", s)
	}
}

// A fault while writing the responder's CQE (its receive CQ's ring is
// gone, its receive queue and MR are not): the data moved, but the
// responder could not complete, so the requester gets REM_OP_ERR, and no
// lock is left held by the aborted completion.
func TestPeerCQFault(t *testing.T) {
	for _, op := range []uint8{abi.WROpSend, abi.WROpRDMAWriteWithImm} {
		f := NewFabric()
		bg := newCutGuest(t, 8<<20)
		a := newNode(t, f, 1, 0x100, qpOpts{})
		b := newNodeOn(t, f, bg, 2, 0x200)
		// b's receive CQ ring in the second region, everything else of b
		// (the MR included) in the first.
		b.g.next = abi.GPA(guestBase + bg.half)
		rcq := &CQ{Num: 0x13, Dev: b.d, Ring: Ring{Pages: b.g.pages(t, 1), Depth: cqDepth, Stride: abi.CQESize},
			Record: b.rcq.Record + 64}
		b.d.AddCQ(rcq)
		b.g.next = guestBase + 0x80000
		mr := b.g.newMR(t, mrKey+1, testPD, abi.AccessAll, 0, 8192, false)
		addMR(b.d, mr)
		bq := newQP(t, b.g, b.d, 0x201, b.scq, rcq, qpOpts{})
		all := uint32(abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic)
		connect(t, a.qp, b.d, 0x201, all, 1, 0)
		connect(t, bq, a.d, 0x100, all, 1, 0)
		first := b.qp
		b.qp = bq
		b.postRecv(t, 5, []abi.SGE{{Addr: 0, Length: 4096, LKey: mrKey + 1}})
		b.qp = first
		bg.cut(t, 1)
		a.postSend(t, abi.SendWQE{WRID: 6, Opcode: op, Flags: abi.WRFlagSignaled, RemoteAddr: 0, RKey: mrKey + 1},
			[]abi.SGE{a.sge(0, 100)}, nil)
		if err := guardedPoll(a.d, a.g.tbl); err != nil {
			t.Fatalf("op %d: the peer's CQ fault escaped: %v", op, err)
		}
		if got := a.cqes(t, a.scq); len(got) != 1 || got[0].Status != abi.WCRemOpErr {
			t.Fatalf("op %d: requester CQEs %+v, want one REM_OP_ERR", op, got)
		}
		if s := bq.State(); s != abi.QPSErr {
			t.Fatalf("op %d: responder QP state %d, want ERR", op, s)
		}
		if !rcq.mu.TryLock() {
			t.Fatalf("op %d: the responder CQ's lock was left held by the aborted completion", op)
		}
		rcq.mu.Unlock()
		if !bq.rqMu.TryLock() {
			t.Fatalf("op %d: the responder QP's rqMu was left held", op)
		}
		bq.rqMu.Unlock()
	}
}
