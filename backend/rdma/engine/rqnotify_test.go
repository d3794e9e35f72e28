package engine

import (
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestQPRQNotify follows docs/spec.md's struct vrdma_qp_notify_record: the
// device clears rq_notify at creation and at RESET, keeps it clear while
// receives are consumed by arriving messages (no notification needed), and
// sets it when the QP is in ERR before the flush reads rq_pi, so that a
// receive posted then is flushed.
func TestQPRQNotify(t *testing.T) {
	p := newPair(t, pairOpts{})
	a, b := p.a, p.b
	rec := b.g.slice(t, b.qp.Record, abi.QPNotifyRecordSize)
	notify := func() uint32 { return abi.LoadUint32(rec, abi.QPRecordRQNotify) }

	// Creation: whatever the driver left there is overwritten with 0.
	abi.StoreUint32(rec, abi.QPRecordRQNotify, 7)
	b.qp.RQNotify = true
	b.qp.InitRecord(b.g.tbl)
	if got := notify(); got != 0 {
		t.Fatalf("rq_notify after creation = %d, want 0", got)
	}

	// A SEND consumes a receive posted with no notification at all: b's
	// engine never runs; a's engine reads b's rq_pi when the message lands.
	b.postRecv(t, 41, []abi.SGE{b.sge(0, 64)})
	a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled}, []abi.SGE{a.sge(0, 64)}, nil)
	for range 10 {
		if w, _ := a.d.Poll(0, a.g.tbl); !w {
			break
		}
	}
	want1(t, "receive", b.cqes(t, b.rcq), abi.CQE{WRID: 41, Status: abi.WCSuccess, Opcode: abi.WCOpRecv,
		QPNum: b.qp.Num, ByteLen: 64, SrcQP: a.qp.Num})
	if got := notify(); got != 0 {
		t.Fatalf("rq_notify in RTS = %d, want 0", got)
	}

	// ERR: the pass that flushes announces it first; a receive posted
	// after that is flushed by the next pass.
	if st := b.qp.Modify(abi.QPAttr{QPN: b.qp.Num, AttrMask: abi.QPAttrState, QPState: abi.QPSErr}); st != abi.StatusOK {
		t.Fatalf("modify to ERR: %v", st)
	}
	p.poll(t)
	if got := notify(); got != 1 {
		t.Fatalf("rq_notify in ERR = %d, want 1", got)
	}
	b.postRecv(t, 42, []abi.SGE{b.sge(0, 64)})
	p.poll(t)
	want1(t, "flushed receive", b.cqes(t, b.rcq), abi.CQE{WRID: 42, Status: abi.WCWRFlushErr, Opcode: abi.WCOpRecv, QPNum: b.qp.Num})

	// RESET clears it again.
	if st := b.qp.Modify(abi.QPAttr{QPN: b.qp.Num, AttrMask: abi.QPAttrState, QPState: abi.QPSReset}); st != abi.StatusOK {
		t.Fatalf("modify to RESET: %v", st)
	}
	if got := notify(); got != 0 {
		t.Fatalf("rq_notify after RESET = %d, want 0", got)
	}

	// A QP created without the flag never writes past its 16-byte record.
	arec := a.g.slice(t, a.qp.Record, abi.QPNotifyRecordSize)
	abi.StoreUint32(arec, abi.QPRecordRQNotify, 0x5a5a)
	if st := a.qp.Modify(abi.QPAttr{QPN: a.qp.Num, AttrMask: abi.QPAttrState, QPState: abi.QPSErr}); st != abi.StatusOK {
		t.Fatalf("modify a to ERR: %v", st)
	}
	p.poll(t)
	if got := abi.LoadUint32(arec, abi.QPRecordRQNotify); got != 0x5a5a {
		t.Fatalf("a QP without RQ_NOTIFY wrote %#x after its record", got)
	}
}

// TestRNRKick: a SEND that finds the responder's receive queue empty waits
// for the responder's min_rnr_timer, unless the responder's driver posts a
// receive first: rq_notify asks it for a notification, and the responder's
// engine, woken by it, ends the requester's wait at once.
func TestRNRKick(t *testing.T) {
	p := newPair(t, pairOpts{minRNR: 31, rnrRetry: 7}) // 491.52 ms
	a, b := p.a, p.b
	b.qp.RQNotify = true
	b.qp.InitRecord(b.g.tbl)
	rec := b.g.slice(t, b.qp.Record, abi.QPNotifyRecordSize)
	notify := func() uint32 { return abi.LoadUint32(rec, abi.QPRecordRQNotify) }

	a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled}, []abi.SGE{a.sge(0, 32)}, nil)
	if _, retry := a.d.Poll(0, a.g.tbl); retry.IsZero() {
		t.Fatal("the SEND did not wait for a receive (no RNR retry deadline)")
	}
	if got := notify(); got != 1 {
		t.Fatalf("rq_notify with a requester waiting = %d, want 1", got)
	}
	if w, _ := a.d.Poll(0, a.g.tbl); w {
		t.Fatal("the requester retried before its RNR timer with no receive posted")
	}

	// The driver posts a receive, sees rq_notify and notifies: b's engine
	// runs, kicks a's engine, and a's retry lands now, not in 491 ms.
	wakes := a.wakes.Load()
	b.postRecv(t, 9, []abi.SGE{b.sge(0, 32)})
	b.d.Poll(0, b.g.tbl)
	if a.wakes.Load() == wakes {
		t.Fatal("the responder's engine did not wake the waiting requester")
	}
	if got := notify(); got != 0 {
		t.Fatalf("rq_notify after the kick = %d, want 0", got)
	}
	a.d.Poll(0, a.g.tbl)
	want1(t, "receive after the kick", b.cqes(t, b.rcq), abi.CQE{WRID: 9, Status: abi.WCSuccess, Opcode: abi.WCOpRecv,
		QPNum: b.qp.Num, ByteLen: 32, SrcQP: a.qp.Num})
	want1(t, "send after the kick", a.cqes(t, a.scq), abi.CQE{WRID: 1, Status: abi.WCSuccess, Opcode: abi.WCOpSend,
		QPNum: a.qp.Num, ByteLen: 32})
}

// TestAwaitRecvPostedMeanwhile: when the look after the announcement finds
// a receive (posted between the first look and the announcement), nobody
// waits: the waiter is cleared and rq_notify is back to 0 at once.
func TestAwaitRecvPostedMeanwhile(t *testing.T) {
	p := newPair(t, pairOpts{})
	a, b := p.a, p.b
	b.qp.RQNotify = true
	b.qp.InitRecord(b.g.tbl)
	rec := b.g.slice(t, b.qp.Record, abi.QPNotifyRecordSize)
	b.postRecv(t, 1, []abi.SGE{b.sge(0, 8)})
	b.qp.rqMu.Lock()
	pi := b.qp.awaitRecv(b.g.tbl, rec, a.qp)
	b.qp.rqMu.Unlock()
	if pi == b.qp.rqCI {
		t.Fatal("the posted receive was not seen")
	}
	if w := b.qp.rnrWaiter.Load(); w != nil || abi.LoadUint32(rec, abi.QPRecordRQNotify) != 0 {
		t.Fatalf("waiter %v, rq_notify %d; want none and 0", w, abi.LoadUint32(rec, abi.QPRecordRQNotify))
	}
}
