package engine

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// udReady moves the UD QP q through INIT and RTR to RTS with Q_Key qkey.
func udReady(tb testing.TB, q *QP, qkey uint32) {
	tb.Helper()
	for _, a := range []abi.QPAttr{
		{QPState: abi.QPSInit, AttrMask: abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrQKey, PortNum: 1, QKey: qkey},
		{QPState: abi.QPSRTR, AttrMask: abi.QPAttrState},
		{QPState: abi.QPSRTS, AttrMask: abi.QPAttrState | abi.QPAttrSQPSN},
	} {
		a.QPN = q.Num
		if st := q.Modify(a); st != abi.StatusOK {
			tb.Fatalf("modify UD %v to %d: %v", q, a.QPState, st)
		}
	}
}

// udPair is a UD QP on each of two devices (a: 0x110, b: 0x210, both with
// Q_Key udQKey) and an AH on a towards b.
type udPair struct {
	f     *Fabric
	a, b  *node
	ua    *QP
	ub    *QP
	ahNum uint32
}

const (
	udQKey = 0x11223344
	udAH   = 0xa401
)

func newUDPair(tb testing.TB) *udPair {
	tb.Helper()
	f := NewFabric()
	p := &udPair{f: f, a: newNode(tb, f, 1, 0x100, qpOpts{}), b: newNode(tb, f, 2, 0x200, qpOpts{}), ahNum: udAH}
	o := qpOpts{sqDepth: qpDepth, rqDepth: qpDepth, maxSGE: qpSGE, inl: qpInl, ud: true}
	p.ua = newQP(tb, p.a.g, p.a.d, 0x110, p.a.scq, p.a.rcq, o)
	p.ub = newQP(tb, p.b.g, p.b.d, 0x210, p.b.scq, p.b.rcq, o)
	udReady(tb, p.ua, udQKey)
	udReady(tb, p.ub, udQKey)
	if err := p.a.d.AddAH(&AH{Num: udAH, PD: testPD, DGID: p.b.d.GID(), SGID: p.a.d.GID()}); err != nil {
		tb.Fatal(err)
	}
	return p
}

func (p *udPair) poll(tb testing.TB) {
	tb.Helper()
	for range 1000 {
		wa, _ := p.a.d.Poll(0, p.a.g.tbl)
		wb, _ := p.b.d.Poll(0, p.b.g.tbl)
		if !wa && !wb {
			return
		}
	}
	tb.Fatalf("engines still busy after 1000 rounds")
}

// postRecvOn writes a receive WQE on q's own receive queue.
func postRecvOn(tb testing.TB, g *guest, q *QP, wrID uint64, sges []abi.SGE) {
	tb.Helper()
	rec := g.slice(tb, q.Record, abi.QPRecordSize)
	pi := abi.LoadUint32(rec, abi.QPRecordRQPI)
	slot, err := q.RQ.Slot(g.tbl, pi)
	if err != nil {
		tb.Fatal(err)
	}
	clear(slot)
	binary.LittleEndian.PutUint64(slot[0:], wrID)
	binary.LittleEndian.PutUint16(slot[8:], uint16(len(sges)))
	for i, s := range sges {
		encodeSGE(slot[16+16*i:], s)
	}
	abi.StoreUint32(rec, abi.QPRecordRQPI, pi+1)
}

// udSend posts a UD SEND of data (from offset 0 of a's MR) on ua.
func (p *udPair) udSend(tb testing.TB, w abi.SendWQE, data []byte) {
	tb.Helper()
	p.a.g.mrWrite(tb, p.a.mr, mrIOVA, data)
	if w.Opcode == 0 && w.AH == 0 {
		w.Opcode = abi.WROpSend
	}
	w.Flags |= abi.WRFlagSignaled
	postSendOn(tb, p.a.g, p.ua, w, []abi.SGE{p.a.sge(0, uint32(len(data)))}, nil)
}

func (p *udPair) dropped() uint64 { return p.b.d.Stats().UDDropped }

// TestUDSendReceive: a datagram lands behind a 40-byte IPv6 header (the
// port GIDs are link-local), with GRH, src_qp, byte_len 40 + payload and
// the immediate; the Q_Key may be the sender QP's own (bit 31).
func TestUDSendReceive(t *testing.T) {
	p := newUDPair(t)
	a, b := p.a, p.b
	data := pattern(100, 3)
	postRecvOn(t, b.g, p.ub, 9, []abi.SGE{b.sge(0, 40), b.sge(1000, 200)})
	p.udSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpSendWithImm, ImmData: 0xdeadbeef, AH: udAH, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, data)
	p.poll(t)
	want1(t, "send", a.cqes(t, a.scq), abi.CQE{WRID: 1, Status: abi.WCSuccess, Opcode: abi.WCOpSend, QPNum: p.ua.Num, ByteLen: 100})
	want1(t, "receive", b.cqes(t, b.rcq), abi.CQE{WRID: 9, Status: abi.WCSuccess, Opcode: abi.WCOpRecv,
		WCFlags: abi.WCFlagGRH | abi.WCFlagWithImm, QPNum: p.ub.Num, ByteLen: 140, ImmData: 0xdeadbeef, SrcQP: p.ua.Num})
	grh := b.g.mrRead(t, b.mr, mrIOVA, 40)
	want := make([]byte, 40)
	want[0] = 0x60
	binary.BigEndian.PutUint16(want[4:], 8+12+8+100+4)
	want[6], want[7] = 17, 64
	sg, dg := a.d.GID(), b.d.GID()
	copy(want[8:], sg[:])
	copy(want[24:], dg[:])
	if !bytes.Equal(grh, want) {
		t.Fatalf("GRH:\n got % x\nwant % x", grh, want)
	}
	if got := b.g.mrRead(t, b.mr, mrIOVA+1000, 100); !bytes.Equal(got, data) {
		t.Fatal("payload after the GRH differs")
	}

	// The QP's own Q_Key.
	postRecvOn(t, b.g, p.ub, 10, []abi.SGE{b.sge(0, 200)})
	p.udSend(t, abi.SendWQE{WRID: 2, AH: udAH, RemoteQPN: p.ub.Num, RemoteQKey: abi.QKeyUseQP}, data[:10])
	p.poll(t)
	want1(t, "receive with the QP's Q_Key", b.cqes(t, b.rcq), abi.CQE{WRID: 10, Status: abi.WCSuccess, Opcode: abi.WCOpRecv,
		WCFlags: abi.WCFlagGRH, QPNum: p.ub.Num, ByteLen: 50, SrcQP: p.ua.Num})
	if d := p.dropped(); d != 0 {
		t.Fatalf("dropped: %d", d)
	}
}

// TestUDGRHIPv4: between IPv4-mapped GIDs the header is 20 zero bytes and
// an IPv4 header with a valid checksum.
func TestUDGRHIPv4(t *testing.T) {
	p := newUDPair(t)
	a, b := p.a, p.b
	src := [16]byte{10: 0xff, 11: 0xff, 192, 0, 2, 1}
	dst := [16]byte{10: 0xff, 11: 0xff, 192, 0, 2, 2}
	b.d.SetAllowedGIDs([]netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")})
	if err := b.d.SetGID(1, dst); err != nil {
		t.Fatal(err)
	}
	if err := a.d.AddAH(&AH{Num: udAH + 1, PD: testPD, DGID: dst, SGID: src}); err != nil {
		t.Fatal(err)
	}
	postRecvOn(t, b.g, p.ub, 9, []abi.SGE{b.sge(0, 1000)})
	p.udSend(t, abi.SendWQE{WRID: 1, AH: udAH + 1, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, pattern(64, 1))
	p.poll(t)
	want1(t, "receive", b.cqes(t, b.rcq), abi.CQE{WRID: 9, Status: abi.WCSuccess, Opcode: abi.WCOpRecv,
		WCFlags: abi.WCFlagGRH, QPNum: p.ub.Num, ByteLen: 104, SrcQP: p.ua.Num})
	grh := b.g.mrRead(t, b.mr, mrIOVA, 40)
	if !bytes.Equal(grh[:20], make([]byte, 20)) {
		t.Fatalf("first 20 bytes: % x, want zero", grh[:20])
	}
	h := grh[20:]
	want := []byte{0x45, 0, 0, 20 + 8 + 12 + 8 + 64 + 4, 0, 0, 0, 0, 64, 17, 0, 0, 192, 0, 2, 1, 192, 0, 2, 2}
	got := append([]byte(nil), h...)
	got[10], got[11] = 0, 0
	if !bytes.Equal(got, want) {
		t.Fatalf("IPv4 header:\n got % x\nwant % x (checksum aside)", got, want)
	}
	// A header with its checksum sums to 0xffff in ones' complement;
	// 4500 0074 0000 0000 4011 0000 c000 0201 c000 0202 sums to
	// 0x20988, folded 0x098a: the checksum is 0xf675.
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	if sum != 0xffff || binary.BigEndian.Uint16(h[10:]) != 0xf675 {
		t.Fatalf("IPv4 checksum %#04x: sum %#x, want 0xffff and 0xf675", binary.BigEndian.Uint16(h[10:]), sum)
	}
}

// TestUDDrops: datagrams the receiver does not take are dropped and
// counted on its device, the sender completing successfully; the receive
// WQE stays for the next datagram.
func TestUDDrops(t *testing.T) {
	p := newUDPair(t)
	a, b := p.a, p.b
	rc := newQP(t, b.g, b.d, 0x220, b.scq, b.rcq, qpOpts{})
	postRecvOn(t, b.g, p.ub, 9, []abi.SGE{b.sge(0, 200)})
	cases := []struct {
		name string
		w    abi.SendWQE
	}{
		{"q_key mismatch", abi.SendWQE{AH: udAH, RemoteQPN: p.ub.Num, RemoteQKey: udQKey + 1}},
		{"no such qp", abi.SendWQE{AH: udAH, RemoteQPN: 0x777, RemoteQKey: udQKey}},
		{"rc qp", abi.SendWQE{AH: udAH, RemoteQPN: rc.Num, RemoteQKey: 0}},
	}
	for i, c := range cases {
		c.w.WRID = uint64(i)
		p.udSend(t, c.w, pattern(8, 1))
		p.poll(t)
		want1(t, c.name+": send", a.cqes(t, a.scq), abi.CQE{WRID: uint64(i), Status: abi.WCSuccess, Opcode: abi.WCOpSend, QPNum: p.ua.Num, ByteLen: 8})
		if got := b.cqes(t, b.rcq); len(got) != 0 {
			t.Fatalf("%s: receiver completed %+v", c.name, got)
		}
		if d := p.dropped(); d != uint64(i+1) {
			t.Fatalf("%s: dropped %d, want %d", c.name, d, i+1)
		}
	}
	// No receive WQE: dropped, no receiver-not-ready wait.
	p.udSend(t, abi.SendWQE{WRID: 5, AH: udAH, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, pattern(8, 1))
	p.poll(t)
	if got := b.cqes(t, b.rcq); len(got) != 1 || got[0].WRID != 9 {
		t.Fatalf("the kept receive: got %+v", got)
	}
	p.udSend(t, abi.SendWQE{WRID: 6, AH: udAH, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, pattern(8, 1))
	p.poll(t)
	if got := a.cqes(t, a.scq); len(got) != 2 || got[1].WRID != 6 || got[1].Status != abi.WCSuccess {
		t.Fatalf("sends to an empty receive queue: got %+v, want both successful at once", got)
	}
	if d := p.dropped(); d != 4 {
		t.Fatalf("dropped: %d, want 4", d)
	}
	// A receiver not in RTR/RTS.
	if st := p.ub.Modify(abi.QPAttr{QPN: p.ub.Num, AttrMask: abi.QPAttrState, QPState: abi.QPSErr}); st != abi.StatusOK {
		t.Fatal(st)
	}
	p.poll(t)
	b.cqes(t, b.rcq)
	p.udSend(t, abi.SendWQE{WRID: 7, AH: udAH, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, pattern(8, 1))
	p.poll(t)
	if d := p.dropped(); d != 5 {
		t.Fatalf("dropped after ERR: %d, want 5", d)
	}
}

// TestUDSenderErrors: what the sender's own checks refuse.
func TestUDSenderErrors(t *testing.T) {
	cases := []struct {
		name  string
		setup func(p *udPair) (abi.SendWQE, []byte)
		want  abi.WCStatus
	}{
		{"oversize", func(p *udPair) (abi.SendWQE, []byte) {
			p.a.d.SetActiveMTU(abi.MTU256)
			return abi.SendWQE{AH: udAH, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, pattern(257, 1)
		}, abi.WCLocLenErr},
		{"rdma write", func(p *udPair) (abi.SendWQE, []byte) {
			return abi.SendWQE{Opcode: abi.WROpRDMAWrite, AH: udAH, RemoteQPN: p.ub.Num, RemoteQKey: udQKey, RKey: mrKey, RemoteAddr: mrIOVA}, pattern(8, 1)
		}, abi.WCLocQPOpErr},
		{"fence", func(p *udPair) (abi.SendWQE, []byte) {
			return abi.SendWQE{Flags: abi.WRFlagFence, AH: udAH, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, pattern(8, 1)
		}, abi.WCLocQPOpErr},
		{"qpn above 24 bits", func(p *udPair) (abi.SendWQE, []byte) {
			return abi.SendWQE{AH: udAH, RemoteQPN: 1 << 24, RemoteQKey: udQKey}, pattern(8, 1)
		}, abi.WCLocQPOpErr},
		{"no ah", func(p *udPair) (abi.SendWQE, []byte) {
			return abi.SendWQE{AH: udAH + 9, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, pattern(8, 1)
		}, abi.WCLocQPOpErr},
		{"destroyed ah", func(p *udPair) (abi.SendWQE, []byte) {
			p.a.d.RemoveAH(udAH)
			return abi.SendWQE{AH: udAH, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, pattern(8, 1)
		}, abi.WCLocQPOpErr},
		{"ah of another pd", func(p *udPair) (abi.SendWQE, []byte) {
			p.a.d.AddPD(testPD + 1)
			if err := p.a.d.AddAH(&AH{Num: udAH + 2, PD: testPD + 1, DGID: p.b.d.GID()}); err != nil {
				t.Fatal(err)
			}
			return abi.SendWQE{AH: udAH + 2, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, pattern(8, 1)
		}, abi.WCLocQPOpErr},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newUDPair(t)
			postRecvOn(t, p.b.g, p.ub, 9, []abi.SGE{p.b.sge(0, 1000)})
			w, data := c.setup(p)
			w.WRID = 3
			p.udSend(t, w, data)
			p.poll(t)
			got := p.a.cqes(t, p.a.scq)
			if len(got) != 1 || got[0].Status != c.want || got[0].WRID != 3 {
				t.Fatalf("got %+v, want one CQE with %v", got, c.want)
			}
			if got := p.b.cqes(t, p.b.rcq); len(got) != 0 {
				t.Fatalf("the receiver completed %+v", got)
			}
		})
	}
	// An RC QP with UD fields set: LOC_QP_OP_ERR.
	pr := newPair(t, pairOpts{})
	pr.b.postRecv(t, 1, []abi.SGE{pr.b.sge(0, 64)})
	pr.a.postSend(t, abi.SendWQE{WRID: 4, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, AH: 1}, []abi.SGE{pr.a.sge(0, 8)}, nil)
	pr.poll(t)
	if got := pr.a.cqes(t, pr.a.scq); len(got) != 1 || got[0].Status != abi.WCLocQPOpErr {
		t.Fatalf("RC WQE with an AH: got %+v, want LOC_QP_OP_ERR", got)
	}
}

// TestUDReceiverErrors: a receive WQE too small for 40 + payload is
// LOC_LEN_ERR and moves the receiving QP to ERR; the sender succeeds.
func TestUDReceiverErrors(t *testing.T) {
	p := newUDPair(t)
	postRecvOn(t, p.b.g, p.ub, 9, []abi.SGE{p.b.sge(0, 40+7)})
	p.udSend(t, abi.SendWQE{WRID: 1, AH: udAH, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, pattern(8, 1))
	p.poll(t)
	want1(t, "send", p.a.cqes(t, p.a.scq), abi.CQE{WRID: 1, Status: abi.WCSuccess, Opcode: abi.WCOpSend, QPNum: p.ua.Num, ByteLen: 8})
	want1(t, "receive", p.b.cqes(t, p.b.rcq), abi.CQE{WRID: 9, Status: abi.WCLocLenErr, Opcode: abi.WCOpRecv, QPNum: p.ub.Num, SrcQP: p.ua.Num})
	if st := p.ub.State(); st != abi.QPSErr {
		t.Fatalf("receiving QP: state %d, want ERR", st)
	}
}

// TestUDLoopbackAndSRQ: a datagram to a QP of the sender's own device
// (here the sender itself), received through an SRQ.
func TestUDLoopbackAndSRQ(t *testing.T) {
	g := newGuest(t, "guest", 8<<20)
	f := NewFabric()
	n := newNodeIn(t, f, g, 1, 0x100, qpOpts{}, 0)
	srq := newSRQ(t, g, n.d, 0x5501, 4, 1)
	q := newQP(t, g, n.d, 0x130, n.scq, n.rcq, qpOpts{sqDepth: qpDepth, maxSGE: qpSGE, inl: qpInl, ud: true, srq: srq})
	udReady(t, q, 5)
	if err := n.d.AddAH(&AH{Num: udAH, PD: testPD, DGID: n.d.GID(), SGID: n.d.GID()}); err != nil {
		t.Fatal(err)
	}
	postSRQ(t, g, srq, 44, []abi.SGE{n.sge(4096, 100)}, -1)
	postSendOn(t, g, q, abi.SendWQE{WRID: 1, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, AH: udAH, RemoteQPN: q.Num, RemoteQKey: abi.QKeyUseQP},
		nil, []byte("hello"))
	for range 10 {
		n.d.Poll(0, g.tbl)
	}
	want1(t, "send", n.cqes(t, n.scq), abi.CQE{WRID: 1, Status: abi.WCSuccess, Opcode: abi.WCOpSend, QPNum: q.Num, ByteLen: 5})
	want1(t, "receive", n.cqes(t, n.rcq), abi.CQE{WRID: 44, Status: abi.WCSuccess, Opcode: abi.WCOpRecv, WCFlags: abi.WCFlagGRH, QPNum: q.Num, ByteLen: 45, SrcQP: q.Num})
	if got := g.mrRead(t, n.mr, mrIOVA+4096+40, 5); string(got) != "hello" {
		t.Fatalf("payload: %q", got)
	}
}

// TestRCRequestToUDQP: an RC QP connected to a UD QP's number is answered
// as by a QP that does not exist: "a QP answers only its peer".
func TestRCRequestToUDQP(t *testing.T) {
	p := newUDPair(t)
	postRecvOn(t, p.b.g, p.ub, 9, []abi.SGE{p.b.sge(0, 100)})
	connect(t, p.a.qp, p.b.d, p.ub.Num, 0, 1, 0)
	p.a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled}, []abi.SGE{p.a.sge(0, 8)}, nil)
	p.poll(t)
	if got := p.a.cqes(t, p.a.scq); len(got) != 1 || got[0].Status != abi.WCRetryExcErr {
		t.Fatalf("RC SEND to a UD QP: got %+v, want RETRY_EXC_ERR", got)
	}
	if got := p.b.cqes(t, p.b.rcq); len(got) != 0 {
		t.Fatalf("the UD QP completed %+v", got)
	}
}
