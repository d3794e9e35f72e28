package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// newSRQ adds an SRQ of depth WQEs of maxSGE SGEs in g's memory to d,
// in PD testPD, notified on doorbell queue 0.
func newSRQ(tb testing.TB, g *guest, d *RNIC, num, depth, maxSGE uint32) *SRQ {
	tb.Helper()
	stride := uint32(32)
	for 16+16*maxSGE > stride {
		stride *= 2
	}
	np := int((depth*stride + abi.PageSize - 1) / abi.PageSize)
	s := &SRQ{Num: num, PD: testPD, Dev: d, Ring: Ring{Pages: g.scattered(tb, np), Depth: depth, Stride: stride},
		Record: g.pages(tb, 1)[0] + 32, MaxSGE: maxSGE}
	s.InitRecord(g.tbl)
	if !d.HasPD(testPD) {
		d.AddPD(testPD)
	}
	if err := d.AddSRQ(s); err != nil {
		tb.Fatal(err)
	}
	return s
}

func srqRecord(tb testing.TB, g *guest, s *SRQ) []byte {
	return g.slice(tb, s.Record, abi.SRQRecordSize)
}

// postSRQ writes a receive WQE at the SRQ's pi and advances pi, as a
// driver does; num overrides num_sge when not negative.
func postSRQ(tb testing.TB, g *guest, s *SRQ, wrID uint64, sges []abi.SGE, num int) {
	tb.Helper()
	rec := srqRecord(tb, g, s)
	pi := abi.LoadUint32(rec, abi.SRQRecordPI)
	slot, err := s.Ring.Slot(g.tbl, pi)
	if err != nil {
		tb.Fatalf("srq slot: %v", err)
	}
	clear(slot)
	if num < 0 {
		num = len(sges)
	}
	binary.LittleEndian.PutUint64(slot[0:], wrID)
	binary.LittleEndian.PutUint16(slot[8:], uint16(num))
	for i, e := range sges {
		encodeSGE(slot[16+16*i:], e)
	}
	abi.StoreUint32(rec, abi.SRQRecordPI, pi+1)
}

// srqRig is an SRQ on device b shared by b's QPs b1 and b2, connected to
// the QPs of devices a1 and a2.
type srqRig struct {
	f      *Fabric
	a1, a2 *node
	b      *node
	srq    *SRQ
	b1, b2 *QP
}

func newSRQRig(tb testing.TB, depth, minRNR, rnrRetry uint32) *srqRig {
	tb.Helper()
	f := NewFabric()
	r := &srqRig{f: f, a1: newNode(tb, f, 1, 0x101, qpOpts{}), a2: newNode(tb, f, 2, 0x102, qpOpts{}), b: newNode(tb, f, 3, 0x300, qpOpts{})}
	b := r.b
	r.srq = newSRQ(tb, b.g, b.d, 0x5501, depth, 2)
	o := qpOpts{sqDepth: qpDepth, maxSGE: qpSGE, inl: qpInl, srq: r.srq}
	r.b1 = newQP(tb, b.g, b.d, 0x301, b.scq, b.rcq, o)
	r.b2 = newQP(tb, b.g, b.d, 0x302, b.scq, b.rcq, o)
	all := uint32(abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic)
	connect(tb, r.a1.qp, b.d, r.b1.Num, all, minRNR, rnrRetry)
	connect(tb, r.b1, r.a1.d, r.a1.qp.Num, all, minRNR, rnrRetry)
	connect(tb, r.a2.qp, b.d, r.b2.Num, all, minRNR, rnrRetry)
	connect(tb, r.b2, r.a2.d, r.a2.qp.Num, all, minRNR, rnrRetry)
	return r
}

// poll runs the three engines until none has work (bounded).
func (r *srqRig) poll(tb testing.TB) {
	tb.Helper()
	for range 1000 {
		w1, _ := r.a1.d.Poll(0, r.a1.g.tbl)
		w2, _ := r.a2.d.Poll(0, r.a2.g.tbl)
		wb, _ := r.b.d.Poll(0, r.b.g.tbl)
		if !w1 && !w2 && !wb {
			return
		}
	}
	tb.Fatalf("engines still busy after 1000 rounds")
}

func sendFrom(tb testing.TB, n *node, wrID uint64, off uint64, data []byte) {
	tb.Helper()
	n.g.mrWrite(tb, n.mr, mrIOVA+off, data)
	n.postSend(tb, abi.SendWQE{WRID: wrID, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled}, []abi.SGE{n.sge(off, uint32(len(data)))}, nil)
}

// TestSRQShared: two QPs take their receives from one SRQ in the SRQ's
// order, whichever QP a message arrives for; the data lands in the
// WQE each took; the SRQ's ci advances and the QPs' rq_ci stay 0.
func TestSRQShared(t *testing.T) {
	r := newSRQRig(t, 8, 1, 7)
	b := r.b
	for i := range 4 {
		postSRQ(t, b.g, r.srq, uint64(100+i), []abi.SGE{b.sge(uint64(i)*1024, 256), b.sge(uint64(i)*1024+512, 256)}, -1)
	}
	msgs := []struct {
		from *node
		to   *QP
		data []byte
	}{
		{r.a1, r.b1, pattern(300, 1)},
		{r.a2, r.b2, pattern(40, 2)},
		{r.a2, r.b2, pattern(512, 3)},
		{r.a1, r.b1, pattern(1, 4)},
	}
	for i, m := range msgs {
		sendFrom(t, m.from, uint64(i), 0, m.data)
		r.poll(t)
		want1(t, "send", m.from.cqes(t, m.from.scq), abi.CQE{WRID: uint64(i), Status: abi.WCSuccess, Opcode: abi.WCOpSend, QPNum: m.from.qp.Num, ByteLen: uint32(len(m.data))})
		want1(t, "receive", b.cqes(t, b.rcq), abi.CQE{WRID: uint64(100 + i), Status: abi.WCSuccess, Opcode: abi.WCOpRecv,
			QPNum: m.to.Num, ByteLen: uint32(len(m.data)), SrcQP: m.from.qp.Num})
		got := b.g.mrRead(t, b.mr, mrIOVA+uint64(i)*1024, 256)
		if n := len(m.data); n > 256 {
			got = append(got, b.g.mrRead(t, b.mr, mrIOVA+uint64(i)*1024+512, uint64(n-256))...)
		}
		if !bytes.Equal(got[:len(m.data)], m.data) {
			t.Fatalf("message %d: data not in the SRQ WQE it took", i)
		}
	}
	rec := srqRecord(t, b.g, r.srq)
	if ci := abi.LoadUint32(rec, abi.SRQRecordCI); ci != 4 {
		t.Fatalf("srq ci: got %d, want 4", ci)
	}
	for _, q := range []*QP{r.b1, r.b2} {
		qrec := b.g.slice(t, q.Record, abi.QPRecordSize)
		if v := abi.LoadUint32(qrec, abi.QPRecordRQCI); v != 0 {
			t.Fatalf("%v rq_ci: got %d, want 0 (unused with an SRQ)", q, v)
		}
	}
}

// TestSRQLimit: the limit event fires once when fewer WQEs than the limit
// are left after a consumption, then the limit reads 0.
func TestSRQLimit(t *testing.T) {
	r := newSRQRig(t, 8, 1, 7)
	b := r.b
	r.srq.SetLimit(2)
	for i := range 3 {
		postSRQ(t, b.g, r.srq, uint64(i), []abi.SGE{b.sge(0, 64)}, -1)
	}
	limitEvents := func() (n int) {
		for _, ev := range b.takeEvents() {
			if ev.Type == abi.EventSRQLimit {
				if ev.Handle != r.srq.Num {
					t.Fatalf("SRQ_LIMIT_REACHED for %#x, want %#x", ev.Handle, r.srq.Num)
				}
				n++
			}
		}
		return n
	}
	sendFrom(t, r.a1, 1, 0, pattern(8, 1))
	r.poll(t)
	if n := limitEvents(); n != 0 || r.srq.Limit() != 2 {
		t.Fatalf("2 WQEs left, limit 2: %d events, limit %d; want none, still armed", n, r.srq.Limit())
	}
	sendFrom(t, r.a2, 2, 0, pattern(8, 2))
	r.poll(t)
	if n := limitEvents(); n != 1 || r.srq.Limit() != 0 {
		t.Fatalf("1 WQE left, limit 2: %d events, limit %d; want 1, disarmed", n, r.srq.Limit())
	}
	sendFrom(t, r.a1, 3, 0, pattern(8, 3))
	r.poll(t)
	if n := limitEvents(); n != 0 {
		t.Fatalf("disarmed: %d events", n)
	}
	if got := len(b.cqes(t, b.rcq)); got != 3 {
		t.Fatalf("receives: got %d, want 3", got)
	}
}

// TestSRQBusy: an SRQ is not destroyed while a QP uses it; once it is,
// the device consumes nothing from it.
func TestSRQBusy(t *testing.T) {
	r := newSRQRig(t, 8, 1, 7)
	d := r.b.d
	if _, err := d.RemoveSRQ(r.srq.Num); !errors.Is(err, ErrSRQBusy) {
		t.Fatalf("RemoveSRQ with QPs: got %v, want ErrSRQBusy", err)
	}
	if err := d.RemovePD(testPD); !errors.Is(err, ErrPDBusy) {
		t.Fatalf("RemovePD under an SRQ: got %v, want ErrPDBusy", err)
	}
	d.RemoveQP(r.b1.Num)
	if _, err := d.RemoveSRQ(r.srq.Num); !errors.Is(err, ErrSRQBusy) {
		t.Fatalf("RemoveSRQ with one QP left: got %v, want ErrSRQBusy", err)
	}
	d.RemoveQP(r.b2.Num)
	s, err := d.RemoveSRQ(r.srq.Num)
	if err != nil || s != r.srq {
		t.Fatalf("RemoveSRQ: got %v, %v", s, err)
	}
	if _, err := d.RemoveSRQ(r.srq.Num); !errors.Is(err, ErrNoSRQ) {
		t.Fatalf("RemoveSRQ twice: got %v, want ErrNoSRQ", err)
	}
	postSRQ(t, r.b.g, s, 1, []abi.SGE{r.b.sge(0, 64)}, -1)
	var buf [abi.PageSize]byte
	var sges [maxRecvSGEs]abi.SGE
	if _, _, res := s.take(r.b.g.tbl, buf[:], sges[:], nil); res != takeStopped {
		t.Fatalf("take from a destroyed SRQ: got %v, want takeStopped", res)
	}
}

// TestSRQQPError: a QP with an SRQ in ERR flushes its send queue only,
// posts QP_LAST_WQE_REACHED once, and the SRQ's WQEs stay for the other
// QP.
func TestSRQQPError(t *testing.T) {
	r := newSRQRig(t, 8, 1, 7)
	b := r.b
	postSRQ(t, b.g, r.srq, 7, []abi.SGE{b.sge(0, 64)}, -1)
	postSendOn(t, b.g, r.b1, abi.SendWQE{WRID: 1, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled}, []abi.SGE{b.sge(4096, 8)}, nil)
	postSendOn(t, b.g, r.b1, abi.SendWQE{WRID: 2, Opcode: abi.WROpSend}, []abi.SGE{b.sge(4096, 8)}, nil)
	if st := r.b1.Modify(abi.QPAttr{QPN: r.b1.Num, AttrMask: abi.QPAttrState, QPState: abi.QPSErr}); st != abi.StatusOK {
		t.Fatalf("modify to ERR: %v", st)
	}
	r.poll(t)
	cqes := b.cqes(t, b.scq)
	if len(cqes) != 2 || cqes[0].WRID != 1 || cqes[1].WRID != 2 || cqes[0].Status != abi.WCWRFlushErr || cqes[1].Status != abi.WCWRFlushErr {
		t.Fatalf("send flush: got %+v, want WR 1 and 2 flushed", cqes)
	}
	if got := b.cqes(t, b.rcq); len(got) != 0 {
		t.Fatalf("receive CQEs after the flush: got %+v, want none (the SRQ's WQEs are the SRQ's)", got)
	}
	last := 0
	for _, ev := range b.takeEvents() {
		if ev.Type == abi.EventQPLastWQE {
			if ev.Handle != r.b1.Num {
				t.Fatalf("QP_LAST_WQE_REACHED for %#x, want %#x", ev.Handle, r.b1.Num)
			}
			last++
		}
	}
	if last != 1 {
		t.Fatalf("QP_LAST_WQE_REACHED: got %d events, want 1", last)
	}
	r.b.d.wakeQueue(0)
	r.poll(t)
	for _, ev := range b.takeEvents() {
		if ev.Type == abi.EventQPLastWQE {
			t.Fatal("QP_LAST_WQE_REACHED posted twice")
		}
	}
	if ci := abi.LoadUint32(srqRecord(t, b.g, r.srq), abi.SRQRecordCI); ci != 0 {
		t.Fatalf("srq ci after the flush: got %d, want 0", ci)
	}
	sendFrom(t, r.a2, 9, 0, pattern(16, 9))
	r.poll(t)
	want1(t, "b2's receive", b.cqes(t, b.rcq), abi.CQE{WRID: 7, Status: abi.WCSuccess, Opcode: abi.WCOpRecv, QPNum: r.b2.Num, ByteLen: 16, SrcQP: r.a2.qp.Num})
	// RESET and back: the event may come again after the next ERR.
	if st := r.b1.Modify(abi.QPAttr{QPN: r.b1.Num, AttrMask: abi.QPAttrState, QPState: abi.QPSReset}); st != abi.StatusOK {
		t.Fatalf("reset: %v", st)
	}
	if st := r.b1.Modify(abi.QPAttr{QPN: r.b1.Num, AttrMask: abi.QPAttrState, QPState: abi.QPSErr}); st != abi.StatusOK {
		t.Fatalf("modify to ERR: %v", st)
	}
	r.poll(t)
	last = 0
	for _, ev := range b.takeEvents() {
		if ev.Type == abi.EventQPLastWQE {
			last++
		}
	}
	if last != 1 {
		t.Fatalf("QP_LAST_WQE_REACHED after RESET and ERR again: got %d, want 1", last)
	}
}

// TestSRQRNRKick: a SEND that finds the SRQ empty waits receiver-not-ready
// (notify set); a post followed by the poll of the SRQ's doorbell queue
// ends the wait at once, long before min_rnr_timer (655 ms).
func TestSRQRNRKick(t *testing.T) {
	r := newSRQRig(t, 8, 0, 7)
	a, b := r.a1, r.b
	rec := srqRecord(t, b.g, r.srq)
	sendFrom(t, a, 1, 0, pattern(32, 5))
	a.d.Poll(0, a.g.tbl)
	if got := a.cqes(t, a.scq); len(got) != 0 {
		t.Fatalf("empty SRQ: got %+v, want the SEND waiting", got)
	}
	if n := abi.LoadUint32(rec, abi.SRQRecordNotify); n != 1 {
		t.Fatalf("notify while a SEND waits: got %d, want 1", n)
	}
	postSRQ(t, b.g, r.srq, 77, []abi.SGE{b.sge(0, 64)}, -1)
	wakes := a.wakes.Load()
	b.d.Poll(0, b.g.tbl) // the notification woke the SRQ's doorbell queue
	if a.wakes.Load() == wakes || !a.qp.rnrKick.Load() {
		t.Fatal("the post to the SRQ did not kick the waiting requester")
	}
	if n := abi.LoadUint32(rec, abi.SRQRecordNotify); n != 0 {
		t.Fatalf("notify after the kick: got %d, want 0", n)
	}
	a.d.Poll(0, a.g.tbl)
	want1(t, "send after the kick", a.cqes(t, a.scq), abi.CQE{WRID: 1, Status: abi.WCSuccess, Opcode: abi.WCOpSend, QPNum: a.qp.Num, ByteLen: 32})
	want1(t, "receive", b.cqes(t, b.rcq), abi.CQE{WRID: 77, Status: abi.WCSuccess, Opcode: abi.WCOpRecv, QPNum: r.b1.Num, ByteLen: 32, SrcQP: a.qp.Num})
}

// TestSRQHostile: a pi more than max_wr ahead stops the SRQ (its QPs
// answer receiver-not-ready until the requester's retries end), and a WQE
// with num_sge above the SRQ's max_sge is the receiving QP's error.
func TestSRQHostile(t *testing.T) {
	t.Run("pi far ahead", func(t *testing.T) {
		r := newSRQRig(t, 8, 1, 2)
		a, b := r.a1, r.b
		rec := srqRecord(t, b.g, r.srq)
		abi.StoreUint32(rec, abi.SRQRecordPI, 8+5)
		sendFrom(t, a, 1, 0, pattern(8, 1))
		var got []abi.CQE
		for deadline := time.Now().Add(5 * time.Second); len(got) == 0 && time.Now().Before(deadline); {
			r.poll(t)
			got = a.cqes(t, a.scq)
			time.Sleep(100 * time.Microsecond)
		}
		want1(t, "send to a stopped SRQ", got, abi.CQE{WRID: 1, Status: abi.WCRNRRetryExcErr, Opcode: abi.WCOpSend, QPNum: a.qp.Num})
		if ci := abi.LoadUint32(rec, abi.SRQRecordCI); ci != 0 {
			t.Fatalf("ci of a stopped SRQ: got %d, want 0", ci)
		}
		// Fixing pi does not restart it: "until the driver resets the device".
		abi.StoreUint32(rec, abi.SRQRecordPI, 0)
		postSRQ(t, b.g, r.srq, 5, []abi.SGE{b.sge(0, 64)}, -1)
		sendFrom(t, r.a2, 2, 0, pattern(8, 2))
		r.poll(t)
		if got := b.cqes(t, b.rcq); len(got) != 0 {
			t.Fatalf("a stopped SRQ completed %+v", got)
		}
	})
	t.Run("num_sge", func(t *testing.T) {
		r := newSRQRig(t, 8, 1, 7)
		a, b := r.a1, r.b
		postSRQ(t, b.g, r.srq, 5, []abi.SGE{b.sge(0, 64)}, 3) // max_sge is 2
		sendFrom(t, a, 1, 0, pattern(8, 1))
		r.poll(t)
		want1(t, "send", a.cqes(t, a.scq), abi.CQE{WRID: 1, Status: abi.WCRemOpErr, Opcode: abi.WCOpSend, QPNum: a.qp.Num})
		want1(t, "receive", b.cqes(t, b.rcq), abi.CQE{WRID: 5, Status: abi.WCLocQPOpErr, Opcode: abi.WCOpRecv, QPNum: r.b1.Num, SrcQP: a.qp.Num})
		if st := r.b1.State(); st != abi.QPSErr {
			t.Fatalf("receiving QP state: got %d, want ERR", st)
		}
		if ci := abi.LoadUint32(srqRecord(t, b.g, r.srq), abi.SRQRecordCI); ci != 1 {
			t.Fatalf("srq ci: got %d, want 1 (the bad WQE was consumed)", ci)
		}
	})
	t.Run("sge of another pd", func(t *testing.T) {
		r := newSRQRig(t, 8, 1, 7)
		a, b := r.a1, r.b
		other := b.g.newMR(t, 0x5678_0001, testPD+1, abi.AccessAll, 0x9000_0000, 4096, false)
		addMR(b.d, other)
		postSRQ(t, b.g, r.srq, 5, []abi.SGE{{Addr: 0x9000_0000, Length: 64, LKey: other.Key}}, -1)
		sendFrom(t, a, 1, 0, pattern(8, 1))
		r.poll(t)
		want1(t, "receive", b.cqes(t, b.rcq), abi.CQE{WRID: 5, Status: abi.WCLocProtErr, Opcode: abi.WCOpRecv, QPNum: r.b1.Num, SrcQP: a.qp.Num})
	})
}

// TestSRQNetwork: a QP connected over the network consumes receives from
// its SRQ as a same-host QP does (one function: QP.takeRecvWQE).
func TestSRQNetwork(t *testing.T) {
	p := newNetPair(t, pairOpts{})
	a, b := p.a, p.b
	srq := newSRQ(t, b.g, b.d, 0x5501, 4, 1)
	qa := newQP(t, a.g, a.d, 0x101, a.scq, a.rcq, qpOpts{})
	qb := newQP(t, b.g, b.d, 0x201, b.scq, b.rcq, qpOpts{sqDepth: qpDepth, maxSGE: qpSGE, inl: qpInl, srq: srq})
	all := uint32(abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic)
	netConnect(t, qa, hostB, qb.Num, all, 1, 7)
	netConnect(t, qb, hostA, qa.Num, all, 1, 7)
	postSRQ(t, b.g, srq, 61, []abi.SGE{b.sge(0, 2000)}, -1)
	postSRQ(t, b.g, srq, 62, []abi.SGE{b.sge(4096, 100)}, -1)
	data := pattern(1500, 7)
	a.g.mrWrite(t, a.mr, mrIOVA, data)
	postSendOn(t, a.g, qa, abi.SendWQE{WRID: 1, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled}, []abi.SGE{a.sge(0, 1500)}, nil)
	postSendOn(t, a.g, qa, abi.SendWQE{WRID: 2, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled}, nil, []byte("second"))
	if got := a.waitCQEs(t, a.scq, 2); got[0].Status != abi.WCSuccess || got[1].Status != abi.WCSuccess {
		t.Fatalf("sends: %+v", got)
	}
	got := b.waitCQEs(t, b.rcq, 2)
	want := []abi.CQE{
		{WRID: 61, Opcode: abi.WCOpRecv, QPNum: qb.Num, SrcQP: qa.Num, ByteLen: 1500},
		{WRID: 62, Opcode: abi.WCOpRecv, QPNum: qb.Num, SrcQP: qa.Num, ByteLen: 6},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("receive %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if !bytes.Equal(b.g.mrRead(t, b.mr, mrIOVA, 1500), data) || string(b.g.mrRead(t, b.mr, mrIOVA+4096, 6)) != "second" {
		t.Fatal("data not in the SRQ's WQEs")
	}
	if ci := abi.LoadUint32(srqRecord(t, b.g, srq), abi.SRQRecordCI); ci != 2 {
		t.Fatalf("srq ci: got %d, want 2", ci)
	}
}

// TestSRQConcurrent: two QPs on two doorbell queues, polled by two
// goroutines, consume one SRQ: every WQE is taken exactly once.
func TestSRQConcurrent(t *testing.T) {
	const n = 64
	r := newSRQRig(t, 128, 1, 7)
	b := r.b
	for i := range n {
		postSRQ(t, b.g, r.srq, uint64(1000+i), []abi.SGE{b.sge(uint64(i)*64, 64)}, -1)
	}
	done := make(chan struct{})
	for _, a := range []*node{r.a1, r.a2} {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range n / 2 {
				a.g.mrWrite(t, a.mr, mrIOVA, pattern(16, byte(i)))
				a.postSend(t, abi.SendWQE{WRID: uint64(i), Opcode: abi.WROpSend}, []abi.SGE{a.sge(0, 16)}, nil)
				for range 100 {
					if w, _ := a.d.Poll(0, a.g.tbl); !w {
						break
					}
				}
			}
		}()
	}
	<-done
	<-done
	seen := map[uint64]bool{}
	for _, e := range b.cqes(t, b.rcq) {
		if e.Status != abi.WCSuccess || seen[e.WRID] {
			t.Fatalf("receive %+v: failed or taken twice", e)
		}
		seen[e.WRID] = true
	}
	if len(seen) != n {
		t.Fatalf("receives: got %d, want %d", len(seen), n)
	}
}
