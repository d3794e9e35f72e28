package engine

import (
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// drainCount consumes c's CQEs without allocating, returning how many and
// the first non-success status (0 if none).
func drainCount(n *node, c *CQ, check func(e []byte)) (cnt int, bad uint8) {
	rec, _ := n.g.tbl.Slice(c.Record, abi.CQRecordSize)
	pi := abi.LoadUint32(rec, abi.CQRecordPI)
	ci := abi.LoadUint32(rec, abi.CQRecordCI)
	for ; ci != pi; ci++ {
		slot, _ := c.Ring.Slot(n.g.tbl, ci)
		if s := slot[8]; s != 0 && bad == 0 {
			bad = s
		}
		if check != nil {
			check(slot)
		}
		cnt++
	}
	abi.StoreUint32(rec, abi.CQRecordCI, ci)
	return cnt, bad
}

func TestNoAllocsPerWQE(t *testing.T) {
	p := newPair(t, pairOpts{})
	a, b := p.a, p.b
	sg := []abi.SGE{a.sge(0, 3000), a.sge(5000, 2000)}
	rs := []abi.SGE{b.sge(100, 8192)}
	cases := []struct {
		name string
		post func()
	}{
		{"write", func() {
			a.postSend(t, abi.SendWQE{Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA + 9, RKey: mrKey}, sg, nil)
		}},
		{"read", func() {
			a.postSend(t, abi.SendWQE{Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA + 9, RKey: mrKey}, sg, nil)
		}},
		{"send", func() {
			b.postRecv(t, 1, rs)
			a.postSend(t, abi.SendWQE{Opcode: abi.WROpSendWithImm, Flags: abi.WRFlagSignaled}, sg, nil)
		}},
		{"fetch add", func() {
			a.postSend(t, abi.SendWQE{Opcode: abi.WROpAtomicFetchAdd, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA + 16, RKey: mrKey, CompareAdd: 1}, sg[:1:1], nil)
			// fix the SGE length to 8 in place
			slot, _ := a.qp.SQ.Slot(a.g.tbl, abi.LoadUint32(a.record(t), abi.QPRecordSQPI)-1)
			binary.LittleEndian.PutUint32(slot[64+8:], 8)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			allocs := testing.AllocsPerRun(100, func() {
				tc.post()
				a.d.Poll(0, a.g.tbl)
				if n, bad := drainCount(a, a.scq, nil); n != 1 || bad != 0 {
					panic("unexpected completion")
				}
				drainCount(b, b.rcq, nil)
			})
			if allocs != 0 {
				t.Fatalf("got %v allocations per WQE, want 0", allocs)
			}
		})
	}
}

// TestConcurrentSend has two devices send to each other from two
// goroutines (each device's engine and driver in one goroutine), while a
// third arms CQs and reads stats. Run with -race.
func TestConcurrentSend(t *testing.T) {
	p := newPair(t, pairOpts{rnrRetry: 7, minRNR: 1})
	const msgs = 3000
	run := func(me, peer *node, errs chan<- string) {
		var sent, sendDone, posted, recvd int
		deadline := time.Now().Add(30 * time.Second)
		for (sendDone < msgs || recvd < msgs) && time.Now().Before(deadline) {
			for posted < msgs && posted-recvd < qpDepth {
				slotOff := uint64(posted%qpDepth) * 64
				me.postRecv(t, uint64(posted), []abi.SGE{me.sge(32768+slotOff, 64)})
				posted++
			}
			for sent < msgs && sent-sendDone < qpDepth {
				off := uint64(sent%qpDepth) * 64
				var v [8]byte
				binary.LittleEndian.PutUint64(v[:], uint64(sent))
				me.g.mrWrite(t, me.mr, mrIOVA+off, v[:])
				me.postSend(t, abi.SendWQE{WRID: uint64(sent), Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled}, []abi.SGE{me.sge(off, 64)}, nil)
				sent++
			}
			me.d.Poll(0, me.g.tbl)
			n, bad := drainCount(me, me.scq, nil)
			if bad != 0 {
				errs <- "send completion error"
				return
			}
			sendDone += n
			n, bad = drainCount(me, me.rcq, func(e []byte) {
				id := binary.LittleEndian.Uint64(e)
				buf := me.g.mrRead(t, me.mr, mrIOVA+32768+(id%qpDepth)*64, 8)
				if got := binary.LittleEndian.Uint64(buf); got != id {
					errs <- "message out of order"
				}
			})
			if bad != 0 {
				errs <- "recv completion error"
				return
			}
			recvd += n
		}
		if sendDone < msgs || recvd < msgs {
			errs <- "timed out"
		}
	}
	errs := make(chan string, 16)
	stop := make(chan struct{})
	var wg, side sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); run(p.a, p.b, errs) }()
	go func() { defer wg.Done(); run(p.b, p.a, errs) }()
	side.Add(1)
	go func() {
		defer side.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			p.a.scq.Arm(false)
			p.b.rcq.Arm(true)
			_ = p.a.d.Stats()
			_ = p.b.qp.Attr()
			time.Sleep(50 * time.Microsecond)
		}
	}()
	wg.Wait()
	close(stop)
	side.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	for _, n := range []*node{p.a, p.b} {
		if s := n.qp.State(); s != abi.QPSRTS {
			t.Fatalf("%v: state %d, want RTS", n.qp, s)
		}
		if got := n.d.Stats().Ops[abi.WROpSend]; got != msgs {
			t.Fatalf("%v: %d sends counted, want %d", n.qp, got, msgs)
		}
	}
}

// TestRemoveQPWhilePeerSends destroys a responder QP while the requester
// keeps sending from another goroutine.
func TestRemoveQPWhilePeerSends(t *testing.T) {
	p := newPair(t, pairOpts{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 2000; i++ {
			rec := p.a.record(t)
			if abi.LoadUint32(rec, abi.QPRecordSQPI)-abi.LoadUint32(rec, abi.QPRecordSQCI) < qpDepth {
				p.a.postSend(t, abi.SendWQE{Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: mrKey}, []abi.SGE{p.a.sge(0, 256)}, nil)
			}
			p.a.d.Poll(0, p.a.g.tbl)
			drainCount(p.a, p.a.scq, nil)
		}
	}()
	time.Sleep(time.Millisecond)
	p.b.d.Reset()
	<-done
	if s := p.a.qp.State(); s != abi.QPSErr {
		t.Fatalf("requester state: got %d, want ERR", s)
	}
}
