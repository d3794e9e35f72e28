package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The GSI QP, address vectors and DMA MRs (docs/spec.md § Kernel verbs
// and the GSI QP) on this host.

// gsiPair is newUDPair plus a GSI QP on each device (a: 0x1a0, b:
// 0x2a0), both in RTS with the well-known Q_Key.
type gsiPair struct {
	*udPair
	ga, gb *QP
}

func newGSIPair(tb testing.TB) *gsiPair {
	tb.Helper()
	p := &gsiPair{udPair: newUDPair(tb)}
	o := qpOpts{sqDepth: qpDepth, rqDepth: qpDepth, maxSGE: qpSGE, inl: qpInl, gsi: true}
	p.ga = newQP(tb, p.a.g, p.a.d, 0x1a0, p.a.scq, p.a.rcq, o)
	p.gb = newQP(tb, p.b.g, p.b.d, 0x2a0, p.b.scq, p.b.rcq, o)
	udReady(tb, p.ga, abi.GSIQKey)
	udReady(tb, p.gb, abi.GSIQKey)
	return p
}

// TestGSISameHost: a GSI QP's datagram to QP 1 reaches the GSI QP of the
// device owning the dgid, with source QP 1, the GRH as for any UD QP and
// the receiver's own handle in qp_num; a UD QP reaches QP 1 too (with its
// own number as the source), and the GSI QP's handle reaches nothing.
func TestGSISameHost(t *testing.T) {
	p := newGSIPair(t)
	a, b := p.a, p.b
	data := pattern(256, 5)

	postRecvOn(t, b.g, p.gb, 7, []abi.SGE{b.sge(0, 40+256)})
	a.g.mrWrite(t, a.mr, mrIOVA, data)
	postSendOn(t, a.g, p.ga, abi.SendWQE{WRID: 1, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
		AH: udAH, RemoteQPN: abi.GSIQPN, RemoteQKey: abi.QKeyUseQP}, []abi.SGE{a.sge(0, 256)}, nil)
	p.poll(t)
	want1(t, "GSI send", a.cqes(t, a.scq), abi.CQE{WRID: 1, Status: abi.WCSuccess, Opcode: abi.WCOpSend, QPNum: p.ga.Num, ByteLen: 256})
	want1(t, "GSI receive", b.cqes(t, b.rcq), abi.CQE{WRID: 7, Status: abi.WCSuccess, Opcode: abi.WCOpRecv,
		WCFlags: abi.WCFlagGRH, QPNum: p.gb.Num, ByteLen: 40 + 256, SrcQP: abi.GSIQPN})
	want := make([]byte, 40)
	want[0] = 0x60
	binary.BigEndian.PutUint16(want[4:], 8+12+8+256+4)
	want[6], want[7] = 17, 64
	sg, dg := a.d.GID(), b.d.GID()
	copy(want[8:], sg[:])
	copy(want[24:], dg[:])
	if got := b.g.mrRead(t, b.mr, mrIOVA, 40); !bytes.Equal(got, want) {
		t.Fatalf("GRH:\n got % x\nwant % x", got, want)
	}
	if got := b.g.mrRead(t, b.mr, mrIOVA+40, 256); !bytes.Equal(got, data) {
		t.Fatal("payload differs")
	}

	// A UD QP naming the GSI Q_Key sends its own (bit 31): dropped.
	postRecvOn(t, b.g, p.gb, 8, []abi.SGE{b.sge(0, 100)})
	before := p.dropped()
	p.udSend(t, abi.SendWQE{WRID: 2, AH: udAH, RemoteQPN: abi.GSIQPN, RemoteQKey: abi.GSIQKey}, data[:16])
	p.poll(t)
	if d := p.dropped() - before; d != 1 {
		t.Fatalf("privileged Q_Key from a QP without it: dropped %d, want 1", d)
	}
	a.cqes(t, a.scq)
	// With the GSI Q_Key its own (the driver's rule, not the device's),
	// it reaches QP 1 with its own number as the source.
	if st := p.ua.Modify(abi.QPAttr{QPN: p.ua.Num, QPState: abi.QPSRTS, AttrMask: abi.QPAttrState | abi.QPAttrQKey, QKey: abi.GSIQKey}); st != abi.StatusOK {
		t.Fatalf("RTS→RTS with the GSI Q_Key: %v", st)
	}
	p.udSend(t, abi.SendWQE{WRID: 2, AH: udAH, RemoteQPN: abi.GSIQPN, RemoteQKey: abi.QKeyUseQP}, data[:16])
	p.poll(t)
	want1(t, "UD to QP 1", b.cqes(t, b.rcq), abi.CQE{WRID: 8, Status: abi.WCSuccess, Opcode: abi.WCOpRecv,
		WCFlags: abi.WCFlagGRH, QPNum: p.gb.Num, ByteLen: 40 + 16, SrcQP: p.ua.Num})
	a.cqes(t, a.scq)

	// The GSI QP's handle is no address: dropped and counted.
	before = p.dropped()
	p.udSend(t, abi.SendWQE{WRID: 3, AH: udAH, RemoteQPN: p.gb.Num, RemoteQKey: abi.GSIQKey}, data[:16])
	p.poll(t)
	if got := b.cqes(t, b.rcq); len(got) != 0 {
		t.Fatalf("a datagram to the GSI QP's handle was received: %+v", got)
	}
	if d := p.dropped() - before; d != 1 {
		t.Fatalf("dropped: got %d, want 1", d)
	}
	want1(t, "send to the handle", a.cqes(t, a.scq), abi.CQE{WRID: 3, Status: abi.WCSuccess, Opcode: abi.WCOpSend, QPNum: p.ua.Num, ByteLen: 16})

	// The GSI QP sends to an ordinary UD QP with source QP 1.
	postRecvOn(t, b.g, p.ub, 9, []abi.SGE{b.sge(0, 100)})
	postSendOn(t, a.g, p.ga, abi.SendWQE{WRID: 4, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
		AH: udAH, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, []abi.SGE{a.sge(0, 8)}, nil)
	p.poll(t)
	want1(t, "GSI to UD", b.cqes(t, b.rcq), abi.CQE{WRID: 9, Status: abi.WCSuccess, Opcode: abi.WCOpRecv,
		WCFlags: abi.WCFlagGRH, QPNum: p.ub.Num, ByteLen: 40 + 8, SrcQP: abi.GSIQPN})
}

// TestGSIOnePerDevice: a second GSI QP is ErrGSIBusy while the first
// exists; destroying it frees QP 1, and datagrams to QP 1 of a device
// without a GSI QP are dropped.
func TestGSIOnePerDevice(t *testing.T) {
	p := newGSIPair(t)
	second := &QP{Num: 0x2a1, PD: testPD, Dev: p.b.d, SendCQ: p.b.scq, RecvCQ: p.b.rcq, UD: true, GSI: true}
	if err := p.b.d.AddQP(second); !errors.Is(err, ErrGSIBusy) {
		t.Fatalf("second GSI QP: got %v, want ErrGSIBusy", err)
	}
	if p.b.d.LookupQP(second.Num) != nil || p.b.d.GSI() != p.gb {
		t.Fatal("the refused GSI QP changed the registry")
	}
	if p.b.d.RemoveQP(p.gb.Num) == nil {
		t.Fatal("RemoveQP of the GSI QP")
	}
	if p.b.d.GSI() != nil {
		t.Fatal("GSI() after its QP was destroyed")
	}
	before := p.dropped()
	p.udSend(t, abi.SendWQE{WRID: 1, AH: udAH, RemoteQPN: abi.GSIQPN, RemoteQKey: abi.GSIQKey}, pattern(8, 1))
	p.poll(t)
	if d := p.dropped() - before; d != 1 {
		t.Fatalf("datagram to QP 1 without a GSI QP: dropped %d, want 1", d)
	}
	if err := p.b.d.AddQP(second); err != nil {
		t.Fatalf("GSI QP after the first was destroyed: %v", err)
	}
	if p.b.d.GSI() != second {
		t.Fatal("GSI() is not the new GSI QP")
	}
}

// postSendAV writes a send WQE with flag AV: the header, the vrdma_av at
// offset 64, then the SGEs or inline bytes at 96.
func postSendAV(tb testing.TB, g *guest, q *QP, w abi.SendWQE, av abi.AV, sges []abi.SGE, inline []byte) {
	tb.Helper()
	rec := g.slice(tb, q.Record, abi.QPRecordSize)
	pi := abi.LoadUint32(rec, abi.QPRecordSQPI)
	slot, err := q.SQ.Slot(g.tbl, pi)
	if err != nil {
		tb.Fatal(err)
	}
	clear(slot)
	w.Flags |= abi.WRFlagAV | abi.WRFlagSignaled
	if w.NumSGE == 0 {
		w.NumSGE = uint16(len(sges))
	}
	if inline != nil {
		w.Flags |= abi.WRFlagInline
		w.InlineLen = uint32(len(inline))
	}
	encodeSend(slot, &w)
	copy(slot[64:96], abi.Marshal(&av))
	for i, s := range sges {
		if 96+16*(i+1) <= len(slot) {
			encodeSGE(slot[96+16*i:], s)
		}
	}
	copy(slot[96:], inline)
	abi.StoreUint32(rec, abi.QPRecordSQPI, pi+1)
}

// TestUDAddressVector: a send WQE with AV reaches what an AH with its
// addresses reaches (SGEs and inline data after the AV), and every AV or
// layout the spec refuses completes with LOC_QP_OP_ERR, the receiver
// untouched.
func TestUDAddressVector(t *testing.T) {
	p := newGSIPair(t)
	a, b := p.a, p.b
	data := pattern(48, 9)
	a.g.mrWrite(t, a.mr, mrIOVA, data)
	av := abi.AV{DGID: b.d.GID()}
	postRecvOn(t, b.g, p.gb, 1, []abi.SGE{b.sge(0, 200)})
	postSendAV(t, a.g, p.ga, abi.SendWQE{WRID: 1, Opcode: abi.WROpSendWithImm, ImmData: 0x01020304,
		RemoteQPN: abi.GSIQPN, RemoteQKey: abi.QKeyUseQP}, av, []abi.SGE{a.sge(0, 48)}, nil)
	p.poll(t)
	want1(t, "AV send", a.cqes(t, a.scq), abi.CQE{WRID: 1, Status: abi.WCSuccess, Opcode: abi.WCOpSend, QPNum: p.ga.Num, ByteLen: 48})
	want1(t, "AV receive", b.cqes(t, b.rcq), abi.CQE{WRID: 1, Status: abi.WCSuccess, Opcode: abi.WCOpRecv,
		WCFlags: abi.WCFlagGRH | abi.WCFlagWithImm, QPNum: p.gb.Num, ByteLen: 40 + 48, ImmData: 0x01020304, SrcQP: abi.GSIQPN})
	if got := b.g.mrRead(t, b.mr, mrIOVA+40, 48); !bytes.Equal(got, data) {
		t.Fatal("AV payload differs")
	}
	// Inline data after the AV.
	postRecvOn(t, b.g, p.ub, 2, []abi.SGE{b.sge(0, 200)})
	postSendAV(t, a.g, p.ua, abi.SendWQE{WRID: 2, Opcode: abi.WROpSend, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, av, nil, data[:32])
	p.poll(t)
	want1(t, "AV inline receive", b.cqes(t, b.rcq), abi.CQE{WRID: 2, Status: abi.WCSuccess, Opcode: abi.WCOpRecv,
		WCFlags: abi.WCFlagGRH, QPNum: p.ub.Num, ByteLen: 40 + 32, SrcQP: p.ua.Num})
	if got := b.g.mrRead(t, b.mr, mrIOVA+40, 32); !bytes.Equal(got, data[:32]) {
		t.Fatal("AV inline payload differs")
	}

	cases := []struct {
		name   string
		w      abi.SendWQE
		av     func(p *gsiPair) abi.AV
		sges   int
		inline int
	}{
		{"ah and av", abi.SendWQE{AH: udAH}, nil, 1, 0},
		{"empty sgid_index", abi.SendWQE{}, func(p *gsiPair) abi.AV { return abi.AV{DGID: p.b.d.GID(), SGIDIndex: 5} }, 1, 0},
		{"sgid_index beyond the table", abi.SendWQE{}, func(p *gsiPair) abi.AV { return abi.AV{DGID: p.b.d.GID(), SGIDIndex: abi.GIDTableLen} }, 1, 0},
		{"reserved", abi.SendWQE{}, func(p *gsiPair) abi.AV { return abi.AV{DGID: p.b.d.GID(), Reserved: [12]byte{11: 1}} }, 1, 0},
		{"sges past the stride", abi.SendWQE{}, nil, 3, 0}, // 96 + 48 > 128
		{"inline past the stride", abi.SendWQE{}, nil, 0, 33},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newGSIPair(t)
			postRecvOn(t, p.b.g, p.gb, 9, []abi.SGE{p.b.sge(0, 1000)})
			av := abi.AV{DGID: p.b.d.GID()}
			if c.av != nil {
				av = c.av(p)
			}
			w := c.w
			w.WRID, w.Opcode, w.RemoteQPN, w.RemoteQKey = 3, abi.WROpSend, abi.GSIQPN, abi.QKeyUseQP
			var sges []abi.SGE
			for range c.sges {
				sges = append(sges, p.a.sge(0, 8))
			}
			var inline []byte
			if c.inline > 0 {
				inline = pattern(c.inline, 1)
			}
			postSendAV(t, p.a.g, p.ga, w, av, sges, inline)
			p.poll(t)
			got := p.a.cqes(t, p.a.scq)
			if len(got) != 1 || got[0].Status != abi.WCLocQPOpErr || got[0].WRID != 3 {
				t.Fatalf("got %+v, want one CQE with LOC_QP_OP_ERR", got)
			}
			if got := p.b.cqes(t, p.b.rcq); len(got) != 0 {
				t.Fatalf("the receiver completed %+v", got)
			}
		})
	}

	// AV on an RC QP.
	pr := newPair(t, pairOpts{})
	pr.b.postRecv(t, 1, []abi.SGE{pr.b.sge(0, 64)})
	postSendAV(t, pr.a.g, pr.a.qp, abi.SendWQE{WRID: 4, Opcode: abi.WROpSend}, abi.AV{DGID: pr.b.d.GID()}, []abi.SGE{pr.a.sge(0, 8)}, nil)
	pr.poll(t)
	if got := pr.a.cqes(t, pr.a.scq); len(got) != 1 || got[0].Status != abi.WCLocQPOpErr {
		t.Fatalf("RC WQE with AV: got %+v, want LOC_QP_OP_ERR", got)
	}
}

// TestDMAMR: an SGE naming a DMA MR addresses guest-physical memory —
// within guest memory (across its two regions too) it is read and
// written, outside it, or in another PD, the WQE completes with
// LOC_PROT_ERR; its rkey is refused for every remote access.
func TestDMAMR(t *testing.T) {
	const dmaA, dmaB = 0x0d0a_0001, 0x0d0b_0001
	p := newPair(t, pairOpts{})
	a, b := p.a, p.b
	addMR(a.d, NewDMAMR(dmaA, testPD, abi.AccessLocalWrite))
	addMR(b.d, NewDMAMR(dmaB, testPD, abi.AccessLocalWrite))
	half := uint64(8<<20) / 2 // the guests' two regions meet at guestBase+half
	src := abi.GPA(guestBase + half - 100)
	data := pattern(300, 7)
	a.g.write(t, src, data)
	dst := b.g.pages(t, 1)[0]

	// SEND from and into guest-physical memory.
	b.postRecv(t, 1, []abi.SGE{{Addr: uint64(dst), Length: 300, LKey: dmaB}})
	a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled}, []abi.SGE{{Addr: uint64(src), Length: 300, LKey: dmaA}}, nil)
	p.poll(t)
	want1(t, "DMA send", a.cqes(t, a.scq), abi.CQE{WRID: 1, Status: abi.WCSuccess, Opcode: abi.WCOpSend, QPNum: a.qp.Num, ByteLen: 300})
	want1(t, "DMA receive", b.cqes(t, b.rcq), abi.CQE{WRID: 1, Status: abi.WCSuccess, Opcode: abi.WCOpRecv, QPNum: b.qp.Num, ByteLen: 300, SrcQP: a.qp.Num})
	if got := b.g.slice(t, dst, 300); !bytes.Equal(got, data) {
		t.Fatal("DMA payload differs")
	}

	// READ into guest-physical memory (the requester's local write).
	readTo := a.g.pages(t, 1)[0]
	b.g.mrWrite(t, b.mr, mrIOVA, data[:64])
	a.postSend(t, abi.SendWQE{WRID: 2, Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: mrKey},
		[]abi.SGE{{Addr: uint64(readTo), Length: 64, LKey: dmaA}}, nil)
	p.poll(t)
	want1(t, "DMA read", a.cqes(t, a.scq), abi.CQE{WRID: 2, Status: abi.WCSuccess, Opcode: abi.WCOpRDMARead, QPNum: a.qp.Num, ByteLen: 64})
	if got := a.g.slice(t, readTo, 64); !bytes.Equal(got, data[:64]) {
		t.Fatal("READ into the DMA MR differs")
	}

	bad := []struct {
		name string
		sge  abi.SGE
		pd   bool // the DMA MR of another PD
	}{
		{"below guest memory", abi.SGE{Addr: guestBase - 8, Length: 16}, false},
		{"past guest memory", abi.SGE{Addr: guestBase + 8<<20 - 8, Length: 16}, false},
		{"wraps", abi.SGE{Addr: ^uint64(0) - 4, Length: 16}, false},
		{"another pd", abi.SGE{Addr: uint64(src), Length: 16}, true},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			p := newPair(t, pairOpts{})
			key := uint32(dmaA)
			if c.pd {
				p.a.d.AddPD(testPD + 1)
				key = dmaA + 0x100
				addMR(p.a.d, NewDMAMR(key, testPD+1, abi.AccessLocalWrite))
			} else {
				addMR(p.a.d, NewDMAMR(key, testPD, abi.AccessLocalWrite))
			}
			p.b.postRecv(t, 1, []abi.SGE{p.b.sge(0, 64)})
			s := c.sge
			s.LKey = key
			p.a.postSend(t, abi.SendWQE{WRID: 5, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled}, []abi.SGE{s}, nil)
			p.poll(t)
			if got := p.a.cqes(t, p.a.scq); len(got) != 1 || got[0].Status != abi.WCLocProtErr {
				t.Fatalf("got %+v, want LOC_PROT_ERR", got)
			}
			if got := p.b.cqes(t, p.b.rcq); len(got) != 0 {
				t.Fatalf("the responder completed %+v", got)
			}
		})
	}

	// The DMA MR's rkey, even with remote rights forced onto it, is never
	// accepted remotely.
	for _, op := range []uint8{abi.WROpRDMAWrite, abi.WROpRDMARead, abi.WROpAtomicFetchAdd} {
		p := newPair(t, pairOpts{})
		m := NewDMAMR(dmaB, testPD, abi.AccessAll)
		addMR(p.b.d, m)
		target := p.b.g.pages(t, 1)[0]
		n := uint32(8)
		p.a.postSend(t, abi.SendWQE{WRID: 6, Opcode: op, Flags: abi.WRFlagSignaled, RemoteAddr: uint64(target), RKey: dmaB},
			[]abi.SGE{p.a.sge(0, n)}, nil)
		p.poll(t)
		if got := p.a.cqes(t, p.a.scq); len(got) != 1 || got[0].Status != abi.WCRemAccessErr {
			t.Fatalf("opcode %d with the DMA MR's rkey: got %+v, want REM_ACCESS_ERR", op, got)
		}
	}
}

// TestDMAMRUDReceive: a UD receive scattering into a DMA MR gets the GRH
// and the payload at guest-physical addresses.
func TestDMAMRUDReceive(t *testing.T) {
	p := newGSIPair(t)
	const dma = 0x0d0c_0001
	addMR(p.b.d, NewDMAMR(dma, testPD, abi.AccessLocalWrite))
	dst := p.b.g.pages(t, 1)[0]
	postRecvOn(t, p.b.g, p.gb, 1, []abi.SGE{{Addr: uint64(dst), Length: 200, LKey: dma}})
	data := pattern(64, 3)
	p.a.g.mrWrite(t, p.a.mr, mrIOVA, data)
	postSendOn(t, p.a.g, p.ga, abi.SendWQE{WRID: 1, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
		AH: udAH, RemoteQPN: abi.GSIQPN, RemoteQKey: abi.QKeyUseQP}, []abi.SGE{p.a.sge(0, 64)}, nil)
	p.poll(t)
	want1(t, "receive", p.b.cqes(t, p.b.rcq), abi.CQE{WRID: 1, Status: abi.WCSuccess, Opcode: abi.WCOpRecv,
		WCFlags: abi.WCFlagGRH, QPNum: p.gb.Num, ByteLen: 40 + 64, SrcQP: abi.GSIQPN})
	if got := p.b.g.slice(t, dst+40, 64); !bytes.Equal(got, data) {
		t.Fatal("payload in the DMA MR differs")
	}
}

// FuzzDecodeSend decodes random send WQEs for RC and UD QPs (AV
// included): a WQE that decodes keeps its SGEs or inline data inside the
// stride after the header (after the AV with AV), has AV only on UD and
// then no AH, and its SGEs are what the bytes hold. A BIND_MW or REG_MR
// WQE decodes only on RC, with SIGNALED and FENCE at most, reserved
// bytes zero and its fields where the bytes hold them; the memory
// opcodes and SEND_WITH_INV never decode on UD.
func FuzzDecodeSend(f *testing.F) {
	wqe := make([]byte, 128)
	encodeSend(wqe, &abi.SendWQE{WRID: 1, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled | abi.WRFlagAV, NumSGE: 2, RemoteQPN: 1, RemoteQKey: abi.QKeyUseQP})
	copy(wqe[64:96], abi.Marshal(&abi.AV{DGID: [16]byte{0xfe, 0x80, 15: 2}}))
	encodeSGE(wqe[96:], abi.SGE{Addr: 0x1000, Length: 8, LKey: 5})
	f.Add(wqe, true)
	rc := make([]byte, 128)
	encodeSend(rc, &abi.SendWQE{WRID: 2, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagInline, InlineLen: 64})
	f.Add(rc, false)
	f.Add(abi.Marshal(&abi.BindMWWQE{WRID: 3, Opcode: abi.WROpBindMW, Flags: abi.WRFlagSignaled, MW: 0x1201, NewRKey: 0x1202,
		LKey: 0x3401, Addr: 0x1000, Length: 64, Access: abi.AccessRemoteRead}), false)
	f.Add(abi.Marshal(&abi.RegMRWQE{WRID: 4, Opcode: abi.WROpRegMR, MR: 0x1201, NewKey: 0x1202, IOVA: 0x1000,
		Length: 64, PageList: 0x2000, NPages: 1, PageShift: 12}), false)
	inv := make([]byte, 64)
	encodeSend(inv, &abi.SendWQE{WRID: 5, Opcode: abi.WROpLocalInv, ImmData: 0x1202})
	f.Add(inv, false)
	f.Fuzz(func(t *testing.T, b []byte, ud bool) {
		var sges [maxSendSGEs]abi.SGE
		w, ok := decodeSend(b, ud, qpSGE, qpInl, sges[:])
		if !ok {
			return
		}
		if ud && w.opcode != abi.WROpSend && w.opcode != abi.WROpSendWithImm {
			t.Fatalf("opcode %d decoded on UD", w.opcode)
		}
		if w.opcode == abi.WROpBindMW || w.opcode == abi.WROpRegMR {
			le := binary.LittleEndian
			m := &w.mem
			if w.flags&^memFlags != 0 || w.numSGE != 0 || m.key != le.Uint32(b[12:]) || m.addr != le.Uint64(b[16:]) ||
				m.newKey != le.Uint32(b[24:]) || m.length != le.Uint64(b[32:]) {
				t.Fatalf("memory WQE decoded wrong: %+v", w)
			}
			if w.opcode == abi.WROpRegMR && (m.pageList != le.Uint64(b[40:]) || le.Uint64(b[56:]) != 0) {
				t.Fatalf("REG_MR WQE decoded wrong: %+v", w)
			}
			return
		}
		off := abi.SendWQEHdrSize
		if w.flags&abi.WRFlagAV != 0 {
			if !ud || w.ah != 0 {
				t.Fatalf("AV accepted: ud %v, ah %#x", ud, w.ah)
			}
			off += abi.AVSize
			if !bytes.Equal(b[64:80], w.avDGID[:]) || binary.LittleEndian.Uint32(b[80:]) != w.avSGIDIndex {
				t.Fatal("AV decoded wrong")
			}
		}
		if w.dataOff() != off {
			t.Fatalf("dataOff %d, want %d", w.dataOff(), off)
		}
		if w.flags&abi.WRFlagInline != 0 {
			if w.numSGE != 0 || off+int(w.inlineLen) > len(b) || w.inlineLen > qpInl {
				t.Fatalf("inline %d bytes at %d of a %d-byte WQE", w.inlineLen, off, len(b))
			}
			return
		}
		n := int(w.numSGE)
		if n > qpSGE || off+n*abi.SGESize > len(b) {
			t.Fatalf("%d SGEs at %d of a %d-byte WQE", n, off, len(b))
		}
		for i := range n {
			e := b[off+16*i:]
			if sges[i] != (abi.SGE{Addr: binary.LittleEndian.Uint64(e), Length: binary.LittleEndian.Uint32(e[8:]), LKey: binary.LittleEndian.Uint32(e[12:])}) {
				t.Fatalf("SGE %d decoded wrong", i)
			}
		}
	})
}
