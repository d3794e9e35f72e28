package engine

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestCIStoredBeforePI checks ci.go's rule on one CQ: a lazily pushed
// completion's consumer index reaches the record no later than the pi that
// shows it, whoever stores that pi (a push of another QP sharing the CQ,
// REQ_NOTIFY_CQ, the pass's own publish); indices never move backwards;
// a destroyed QP's record is not written.
func TestCIStoredBeforePI(t *testing.T) {
	g, d := newDevice(t)
	c := newCQ(t, g, d, 0x11, 64)
	q := newQP(t, g, d, 0x21, c, c, qpOpts{})
	crec := g.slice(t, c.Record, abi.CQRecordSize)
	qrec := g.slice(t, q.Record, abi.QPRecordSize)
	cqe := &abi.CQE{Status: abi.WCSuccess}
	ci := func() (uint32, uint32) {
		return abi.LoadUint32(qrec, abi.QPRecordSQCI), abi.LoadUint32(qrec, abi.QPRecordRQCI)
	}

	// A lazy push stores neither.
	q.ciDone[sqIdx].Store(3)
	c.push(g.tbl, cqe, false, q)
	if sq, _ := ci(); sq != 0 || abi.LoadUint32(crec, abi.CQRecordPI) != 0 {
		t.Fatalf("lazy push stored sq_ci %d, pi %d; want both 0", sq, abi.LoadUint32(crec, abi.CQRecordPI))
	}
	// Another QP's eager push into the same CQ stores q's sq_ci with pi.
	c.push(g.tbl, cqe, false, nil)
	if sq, _ := ci(); sq != 3 || abi.LoadUint32(crec, abi.CQRecordPI) != 2 {
		t.Fatalf("after an eager push: sq_ci %d, pi %d; want 3, 2", sq, abi.LoadUint32(crec, abi.CQRecordPI))
	}
	// REQ_NOTIFY_CQ publishes too: rq_ci first.
	q.ciDone[rqIdx].Store(7)
	c.push(g.tbl, cqe, false, q)
	c.Arm(false)
	if _, rq := ci(); rq != 7 || abi.LoadUint32(crec, abi.CQRecordPI) != 3 {
		t.Fatalf("after REQ_NOTIFY_CQ: rq_ci %d, pi %d; want 7, 3", rq, abi.LoadUint32(crec, abi.CQRecordPI))
	}
	// A stale done index (read before another goroutine raised and
	// stored it) is not stored.
	q.ciDone[sqIdx].Store(2)
	q.storeCI(qrec)
	if sq, _ := ci(); sq != 3 {
		t.Fatalf("sq_ci moved back to %d", sq)
	}
	// Wrapping is forwards.
	q.ciDone[sqIdx].Store(3 + 1<<31 - 1)
	q.storeCI(qrec)
	if sq, _ := ci(); sq != 3+1<<31-1 {
		t.Fatalf("sq_ci %d, want %d", sq, uint32(3+1<<31-1))
	}
	// A full list stores at once rather than forgetting a QP.
	others := make([]*QP, maxLazy+1)
	for i := range others {
		others[i] = newQP(t, g, d, 0x30+uint32(i), c, c, qpOpts{})
		others[i].ciDone[sqIdx].Store(1)
		c.push(g.tbl, cqe, false, others[i])
	}
	last := g.slice(t, others[maxLazy].Record, abi.QPRecordSize)
	if sq := abi.LoadUint32(last, abi.QPRecordSQCI); sq != 1 {
		t.Fatalf("QP beyond the lazy list: sq_ci %d, want 1 at once", sq)
	}
	c.publish(g.tbl)
	for i, o := range others {
		if sq := abi.LoadUint32(g.slice(t, o.Record, abi.QPRecordSize), abi.QPRecordSQCI); sq != 1 {
			t.Fatalf("QP %d: sq_ci %d after publish, want 1", i, sq)
		}
	}
	// After DESTROY_QP the record is left alone.
	d.RemoveQP(q.Num)
	q.ciDone[sqIdx].Store(100)
	c.push(g.tbl, cqe, false, q)
	c.publish(g.tbl)
	if sq, _ := ci(); sq != 3+1<<31-1 {
		t.Fatalf("destroyed QP's sq_ci written: %d", sq)
	}
}

// TestCIBeforeCompletionsConcurrent runs both directions at once into one
// CQ of b's, from two engines in two goroutines: a's engine completes b's
// receives (the responder half of a's SENDs) while b's completes b's
// WRITEs. b's driver polls the shared CQ as the rdma-core provider does and
// checks, for every batch it reaps, that the record's sq_ci and rq_ci
// already cover every completion it has seen: otherwise an application
// that posts again per completion (perftest) would find the queue full.
func TestCIBeforeCompletionsConcurrent(t *testing.T) {
	f := NewFabric()
	a := newNode(t, f, 1, 0x100, qpOpts{})
	b := newNode(t, f, 2, 0x200, qpOpts{sharedCQ: true})
	all := uint32(abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic)
	connect(t, a.qp, b.d, b.qp.Num, all, 1, 7)
	connect(t, b.qp, a.d, a.qp.Num, all, 1, 7)
	const msgs = 20000
	deadline := time.Now().Add(30 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	var failed atomic.Bool // either side stops the other
	fail := func(err error) {
		failed.Store(true)
		errs <- err
	}
	wg.Add(2)
	go func() { // a: SENDs to b, its engine, its CQs
		defer wg.Done()
		rec := a.record(t)
		var posted, done int
		for done < msgs && !failed.Load() {
			if time.Now().After(deadline) {
				fail(fmt.Errorf("a: %d of %d sends done", done, msgs))
				return
			}
			for posted < msgs && abi.LoadUint32(rec, abi.QPRecordSQPI)-abi.LoadUint32(rec, abi.QPRecordSQCI) < qpDepth {
				a.postSend(t, abi.SendWQE{WRID: uint64(posted), Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled},
					[]abi.SGE{a.sge(0, 64)}, nil)
				posted++
			}
			a.d.Poll(0, a.g.tbl)
			n, bad := drainCount(a, a.scq, nil)
			if bad != 0 {
				fail(fmt.Errorf("a: send completed with status %d", bad))
				return
			}
			done += n
		}
	}()
	go func() { // b: receives and WRITEs to a, its engine, the shared CQ
		defer wg.Done()
		rec := b.record(t)
		var posted, sends, recvs int
		for (sends < msgs || recvs < msgs) && !failed.Load() {
			if time.Now().After(deadline) {
				fail(fmt.Errorf("b: %d writes and %d receives of %d done", sends, recvs, msgs))
				return
			}
			for abi.LoadUint32(rec, abi.QPRecordRQPI)-abi.LoadUint32(rec, abi.QPRecordRQCI) < qpDepth {
				b.postRecv(t, 0, []abi.SGE{b.sge(4096, 64)})
			}
			for posted < msgs && abi.LoadUint32(rec, abi.QPRecordSQPI)-abi.LoadUint32(rec, abi.QPRecordSQCI) < qpDepth {
				b.postSend(t, abi.SendWQE{Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: mrKey},
					[]abi.SGE{b.sge(0, 64)}, nil)
				posted++
			}
			b.d.Poll(0, b.g.tbl)
			var bad uint8
			drainCount(b, b.scq, func(e []byte) {
				switch {
				case e[8] != 0:
					bad = e[8]
				case e[9] == abi.WCOpRecv:
					recvs++
				default:
					sends++
				}
			})
			if bad != 0 {
				fail(fmt.Errorf("b: completion with status %d", bad))
				return
			}
			// pi was loaded before these: what it showed is covered.
			sq, rq := abi.LoadUint32(rec, abi.QPRecordSQCI), abi.LoadUint32(rec, abi.QPRecordRQCI)
			if int(sq) < sends || int(rq) < recvs {
				fail(fmt.Errorf("b reaped %d write and %d receive completions while sq_ci is %d and rq_ci %d",
					sends, recvs, sq, rq))
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
