package engine

import (
	"testing"
	"time"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestViewsOfAPair lists a connected pair's objects: numbers, state,
// peer, CQ and MR fields as created.
func TestViewsOfAPair(t *testing.T) {
	p := newPair(t, pairOpts{})
	a, b := p.a, p.b
	qs := a.d.QPViews(0, -1)
	if len(qs) != 1 {
		t.Fatalf("QPViews: got %d, want 1", len(qs))
	}
	q := qs[0]
	if q.QPN != 0x100 || q.Type != abi.QPTypeRC || q.State != abi.QPSRTS || q.PD != testPD || q.SendCQ != 0x11 || q.RecvCQ != 0x12 {
		t.Errorf("QP view: got %+v", q)
	}
	if q.Transport != TransportLocal || q.DestGID != b.d.GID() || q.DestQPN != 0x200 || q.PathMTU != abi.MTU4096 || !q.HasPSN {
		t.Errorf("QP view peer: got transport %q dgid %x dqpn %#x mtu %d psn %v, want local, %x, 0x200, 4096, true",
			q.Transport, q.DestGID, q.DestQPN, q.PathMTU, q.HasPSN, b.d.GID())
	}
	if q.SQDepth != qpDepth || q.RQDepth != qpDepth || q.MaxSendSGE != qpSGE || q.MaxInline != qpInl {
		t.Errorf("QP view caps: got %+v", q)
	}
	cs := a.d.CQViews(0, -1)
	if len(cs) != 2 || cs[0].CQN != 0x11 || cs[1].CQN != 0x12 || cs[0].Depth != cqDepth || cs[0].QPs != 1 {
		t.Fatalf("CQViews: got %+v, want 0x11 and 0x12 of depth %d used by 1 QP", cs, cqDepth)
	}
	ms := a.d.MRViews(0, -1, func(*MR) uint64 { return 4096 })
	if len(ms) != 1 {
		t.Fatalf("MRViews: got %d, want 1", len(ms))
	}
	if m := ms[0]; m.LKey != mrKey || m.RKey != mrKey || m.PD != testPD || m.Kind != MRUser || m.IOVA != mrIOVA ||
		m.Length != mrLen || m.Access != abi.AccessAll || m.PinnedBytes != 4096 || !m.Valid {
		t.Errorf("MR view: got %+v", m)
	}
	ps := a.d.PDViews(0, -1)
	if len(ps) != 1 || ps[0] != (PDView{PDN: testPD, MRs: 1, QPs: 1}) {
		t.Errorf("PDViews: got %+v, want PD %d with 1 MR and 1 QP", ps, testPD)
	}
	if c := a.d.Census(); c != (Census{PDs: 1, MRs: 1, CQs: 2, QPs: 1}) {
		t.Errorf("Census: got %+v", c)
	}
}

// TestViewPages pages through QPs by number.
func TestViewPages(t *testing.T) {
	g, d := newDevice(t)
	c := newCQ(t, g, d, 1, 16)
	for _, n := range []uint32{0x30, 0x10, 0x20, 0x40} {
		newQP(t, g, d, n, c, c, qpOpts{})
	}
	var got []uint32
	after := uint32(0)
	for range 10 {
		page := d.QPViews(after, 3)
		for _, v := range page {
			got = append(got, v.QPN)
		}
		if len(page) < 3 {
			break
		}
		after = page[len(page)-1].QPN
	}
	if want := []uint32{0x10, 0x20, 0x30, 0x40}; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || got[3] != want[3] {
		t.Errorf("pages: got %#x, want %#x", got, want)
	}
	if v := d.QPViews(0x40, 10); len(v) != 0 {
		t.Errorf("after the last: got %+v, want none", v)
	}
}

// TestErrorCountersBadRKey: a WRITE with a bad rkey is REM_ACCESS_ERR at
// the requester, counted on its QP and CQ, and a refusal counted on the
// responder QP; the flushes that follow count as WR_FLUSH_ERR.
func TestErrorCountersBadRKey(t *testing.T) {
	p := newPair(t, pairOpts{})
	a, b := p.a, p.b
	a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: mrKey ^ 0x100},
		[]abi.SGE{a.sge(0, 64)}, nil)
	a.postSend(t, abi.SendWQE{WRID: 2, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: mrKey},
		[]abi.SGE{a.sge(0, 64)}, nil)
	p.poll(t)
	qa := a.d.QPViews(0, -1)[0]
	if qa.State != abi.QPSErr {
		t.Errorf("requester state: got %d, want ERR", qa.State)
	}
	if got := qa.Errors.Completions; got[abi.WCRemAccessErr] != 1 || got[abi.WCWRFlushErr] != 1 {
		t.Errorf("requester completion errors: got %v, want REM_ACCESS_ERR 1, WR_FLUSH_ERR 1", got)
	}
	qb := b.d.QPViews(0, -1)[0]
	if qb.State != abi.QPSErr || qb.Errors.Responder[abi.WCRemAccessErr] != 1 {
		t.Errorf("responder: got state %d responder errors %v, want ERR and REM_ACCESS_ERR 1", qb.State, qb.Errors.Responder)
	}
	var scq CQView
	for _, c := range a.d.CQViews(0, -1) {
		if c.CQN == a.scq.Num {
			scq = c
		}
	}
	if scq.ErrorCQEs != 2 || scq.Written != 2 || scq.Pending != 2 || scq.Overrun {
		t.Errorf("send CQ: got %+v, want 2 error CQEs written and pending", scq)
	}
	a.cqes(t, a.scq)
	for _, c := range a.d.CQViews(0, -1) {
		if c.CQN == a.scq.Num && c.Pending != 0 {
			t.Errorf("send CQ after polling: %d pending, want 0", c.Pending)
		}
	}
}

// TestErrorCountersRNR: a SEND to an empty receive queue counts an RNR
// NAK on both QPs, and a malformed send WQE is counted as such.
func TestErrorCountersRNR(t *testing.T) {
	p := newPair(t, pairOpts{rnrRetry: 1, minRNR: 1})
	a, b := p.a, p.b
	a.postSend(t, abi.SendWQE{WRID: 9, Opcode: abi.WROpSend}, []abi.SGE{a.sge(0, 32)}, nil)
	for i := 0; i < 100 && a.qp.State() == abi.QPSRTS; i++ {
		a.d.Poll(0, a.g.tbl)
		time.Sleep(20 * time.Microsecond)
	}
	ea, eb := a.d.QPViews(0, -1)[0].Errors, b.d.QPViews(0, -1)[0].Errors
	if ea.RNRNAKsReceived != 2 || eb.RNRNAKsSent != 2 || ea.Completions[abi.WCRNRRetryExcErr] != 1 {
		t.Errorf("RNR: got received %d sent %d completions %v, want 2, 2, RNR_RETRY_EXC_ERR 1",
			ea.RNRNAKsReceived, eb.RNRNAKsSent, ea.Completions)
	}

	q := newPair(t, pairOpts{})
	q.a.postSend(t, abi.SendWQE{WRID: 3, Opcode: 0x7f}, nil, nil) // no such opcode
	q.poll(t)
	if e := q.a.d.QPViews(0, -1)[0].Errors; e.MalformedWQEs != 1 || e.Completions[abi.WCLocQPOpErr] != 1 {
		t.Errorf("malformed WQE: got %d malformed, completions %v, want 1 and LOC_QP_OP_ERR 1", e.MalformedWQEs, e.Completions)
	}
}

// TestViewsRaceTraffic reads every view while the pair moves data and
// fails (run under -race: the views take the objects' locks).
func TestViewsRaceTraffic(t *testing.T) {
	p := newPair(t, pairOpts{})
	a, b := p.a, p.b
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, d := range []*RNIC{a.d, b.d} {
				d.QPViews(0, -1)
				d.CQViews(0, -1)
				d.MRViews(0, -1, nil)
				d.PDViews(0, -1)
				d.SRQViews(0, -1)
				d.MWViews(0, -1)
				d.Census()
			}
		}
	}()
	for i := range 200 {
		rkey := uint32(mrKey)
		if i == 150 {
			rkey ^= 0x100 // the pair fails midway
		}
		a.postSend(t, abi.SendWQE{WRID: uint64(i), Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: rkey},
			[]abi.SGE{a.sge(0, 256)}, nil)
		p.poll(t)
		a.cqes(t, a.scq)
	}
	close(stop)
	<-done
	if e := a.d.QPViews(0, -1)[0].Errors; e.Completions[abi.WCRemAccessErr] != 1 {
		t.Errorf("completion errors: got %v, want REM_ACCESS_ERR 1", e.Completions)
	}
}

// TestViewNetworkQP: a QP connected to another host shows the RoCE
// transport, the transport's PSNs (moved on by the messages sent) and
// its retransmissions on a lossy wire.
func TestViewNetworkQP(t *testing.T) {
	p := newNetPair(t, pairOpts{})
	a := p.a
	p.w.mu.Lock()
	p.w.drop = func(n int) bool { return n%5 == 2 }
	p.w.mu.Unlock()
	const msgs = 4
	for i := range msgs {
		a.postSend(t, abi.SendWQE{WRID: uint64(i), Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
			RemoteAddr: mrIOVA, RKey: mrKey}, []abi.SGE{a.sge(0, 4096)}, nil)
	}
	for _, e := range a.waitCQEs(t, a.scq, msgs) {
		if e.Status != abi.WCSuccess {
			t.Fatalf("CQE %+v, want success", e)
		}
	}
	v := a.d.QPViews(0, -1)[0]
	// 4 WRITEs of 4 KiB at a 1 KiB path MTU: 16 packets from PSN 0x123.
	if v.Transport != TransportRoCE || !v.HasPSN || v.SQPSN != 0x123+16 || v.RQPSN != 0x123 || v.Paths != 1 || v.DestGID != hostB {
		t.Errorf("network QP view: got transport %q psn %v %#x/%#x paths %d dgid %x, want roce, %#x/0x123, 1 path",
			v.Transport, v.HasPSN, v.SQPSN, v.RQPSN, v.Paths, v.DestGID, 0x123+16)
	}
	if v.Errors.Retransmits == 0 {
		t.Errorf("network QP view: no retransmits counted on a lossy wire: %+v", v.Errors)
	}
}
