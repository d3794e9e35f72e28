package engine

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

func TestSendRecv(t *testing.T) {
	tests := []struct {
		name    string
		op      uint8
		inline  bool
		src     []abi.SGE // offsets in a's MR (Addr is an offset here)
		dst     []abi.SGE // offsets in b's MR
		imm     uint32
		wantOp  uint8
		wantImm bool
	}{
		{name: "send one sge", op: abi.WROpSend, src: []abi.SGE{{Addr: 0, Length: 100}}, dst: []abi.SGE{{Addr: 0, Length: 100}}},
		{name: "send sges crossing pages", op: abi.WROpSend,
			src: []abi.SGE{{Addr: 4000, Length: 300}, {Addr: 9000, Length: 5000}, {Addr: 20000, Length: 1}},
			dst: []abi.SGE{{Addr: 8190, Length: 10}, {Addr: 100, Length: 5291}, {Addr: 30000, Length: 4096}}},
		{name: "send zero length", op: abi.WROpSend, src: nil, dst: []abi.SGE{{Addr: 0, Length: 16}}},
		{name: "send with imm", op: abi.WROpSendWithImm, imm: 0xdeadbeef, wantImm: true,
			src: []abi.SGE{{Addr: 10, Length: 64}}, dst: []abi.SGE{{Addr: 20, Length: 64}}},
		{name: "inline send", op: abi.WROpSend, inline: true, src: []abi.SGE{{Length: 64}}, dst: []abi.SGE{{Addr: 4090, Length: 64}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, pairOpts{})
			a, b := p.a, p.b
			var total uint32
			var msg []byte
			var sges []abi.SGE
			for i, s := range tc.src {
				data := pattern(int(s.Length), byte(i+1))
				msg = append(msg, data...)
				total += s.Length
				if !tc.inline {
					a.g.mrWrite(t, a.mr, mrIOVA+s.Addr, data)
					sges = append(sges, a.sge(s.Addr, s.Length))
				}
			}
			var rs []abi.SGE
			for _, s := range tc.dst {
				rs = append(rs, b.sge(s.Addr, s.Length))
			}
			b.postRecv(t, 77, rs)
			w := abi.SendWQE{WRID: 5, Opcode: tc.op, Flags: abi.WRFlagSignaled, ImmData: tc.imm}
			if tc.inline {
				a.postSend(t, w, nil, msg)
			} else {
				a.postSend(t, w, sges, nil)
			}
			p.poll(t)

			want1(t, "send cq", a.cqes(t, a.scq), abi.CQE{WRID: 5, Opcode: abi.WCOpSend, QPNum: 0x100, ByteLen: total})
			re := abi.CQE{WRID: 77, Opcode: abi.WCOpRecv, QPNum: 0x200, ByteLen: total, SrcQP: 0x100}
			if tc.wantImm {
				re.WCFlags, re.ImmData = abi.WCFlagWithImm, tc.imm
			}
			want1(t, "recv cq", b.cqes(t, b.rcq), re)
			var got []byte
			left := total
			for _, s := range tc.dst {
				n := min(left, s.Length)
				got = append(got, b.g.mrRead(t, b.mr, mrIOVA+s.Addr, uint64(n))...)
				left -= n
			}
			if !bytes.Equal(got, msg) {
				t.Fatalf("received bytes differ: got %x…, want %x…", got[:min(16, len(got))], msg[:min(16, len(msg))])
			}
			if ci := abi.LoadUint32(b.record(t), abi.QPRecordRQCI); ci != 1 {
				t.Fatalf("rq_ci: got %d, want 1", ci)
			}
			if ci := abi.LoadUint32(a.record(t), abi.QPRecordSQCI); ci != 1 {
				t.Fatalf("sq_ci: got %d, want 1", ci)
			}
			st := a.d.Stats()
			if st.Ops[tc.op] != 1 || st.BytesMoved != uint64(total) {
				t.Fatalf("stats: got ops %v bytes %d, want 1 op %d and %d bytes", st.Ops, st.BytesMoved, tc.op, total)
			}
		})
	}
}

func TestWriteRead(t *testing.T) {
	tests := []struct {
		name   string
		op     uint8
		inline bool
		local  []abi.SGE // offsets in a's MR
		remote uint64    // offset in b's MR
	}{
		{name: "write", op: abi.WROpRDMAWrite, local: []abi.SGE{{Addr: 0, Length: 4096}}, remote: 1},
		{name: "write multi sge", op: abi.WROpRDMAWrite,
			local: []abi.SGE{{Addr: 4095, Length: 2}, {Addr: 50000, Length: 12000}, {Addr: 7, Length: 9}}, remote: 8000},
		{name: "write inline", op: abi.WROpRDMAWrite, inline: true, local: []abi.SGE{{Length: 40}}, remote: 4080},
		{name: "write with imm", op: abi.WROpRDMAWriteWithImm, local: []abi.SGE{{Addr: 100, Length: 5000}}, remote: 60000},
		{name: "read", op: abi.WROpRDMARead, local: []abi.SGE{{Addr: 4000, Length: 200}, {Addr: 10000, Length: 9000}}, remote: 3},
		{name: "read whole mr", op: abi.WROpRDMARead, local: []abi.SGE{{Addr: 0, Length: mrLen}}, remote: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, pairOpts{})
			a, b := p.a, p.b
			var total uint32
			var sges []abi.SGE
			for _, s := range tc.local {
				total += s.Length
				sges = append(sges, a.sge(s.Addr, s.Length))
			}
			remote := pattern(int(total), 0x40)
			b.g.mrWrite(t, b.mr, mrIOVA+tc.remote, remote)
			var msg []byte
			for i, s := range tc.local {
				d := pattern(int(s.Length), byte(i+9))
				msg = append(msg, d...)
				if !tc.inline {
					a.g.mrWrite(t, a.mr, mrIOVA+s.Addr, d)
				}
			}
			if tc.op == abi.WROpRDMAWriteWithImm {
				b.postRecv(t, 99, nil)
			}
			w := abi.SendWQE{WRID: 6, Opcode: tc.op, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA + tc.remote, RKey: mrKey, ImmData: 42}
			if tc.inline {
				a.postSend(t, w, nil, msg)
			} else {
				a.postSend(t, w, sges, nil)
			}
			p.poll(t)
			want1(t, "send cq", a.cqes(t, a.scq), abi.CQE{WRID: 6, Opcode: wcOpcode(tc.op), QPNum: 0x100, ByteLen: total})
			if tc.op == abi.WROpRDMARead {
				var got []byte
				for _, s := range tc.local {
					got = append(got, a.g.mrRead(t, a.mr, mrIOVA+s.Addr, uint64(s.Length))...)
				}
				if !bytes.Equal(got, remote) {
					t.Fatalf("read bytes differ")
				}
				return
			}
			if got := b.g.mrRead(t, b.mr, mrIOVA+tc.remote, uint64(total)); !bytes.Equal(got, msg) {
				t.Fatalf("written bytes differ")
			}
			rc := b.cqes(t, b.rcq)
			if tc.op == abi.WROpRDMAWriteWithImm {
				want1(t, "recv cq", rc, abi.CQE{WRID: 99, Opcode: abi.WCOpRecvRDMAWithImm, WCFlags: abi.WCFlagWithImm,
					QPNum: 0x200, ByteLen: total, ImmData: 42, SrcQP: 0x100})
			} else if len(rc) != 0 {
				t.Fatalf("recv cq: got %+v, want nothing", rc)
			}
		})
	}
}

func TestWriteAcrossRegions(t *testing.T) {
	p := newPair(t, pairOpts{})
	a, b := p.a, p.b
	// An MR on b whose pages straddle the boundary of b's two memory regions.
	b.g.next = abi.GPA(guestBase + 4<<20 - 2*abi.PageSize)
	mr := b.g.newMR(t, 0x5501, testPD, abi.AccessAll, 0x100, 4*abi.PageSize, false)
	addMR(b.d, mr)
	msg := pattern(4*abi.PageSize, 3)
	a.g.mrWrite(t, a.mr, mrIOVA, msg)
	a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: 0x100, RKey: 0x5501},
		[]abi.SGE{a.sge(0, 4*abi.PageSize)}, nil)
	p.poll(t)
	want1(t, "send cq", a.cqes(t, a.scq), abi.CQE{WRID: 1, Opcode: abi.WCOpRDMAWrite, QPNum: 0x100, ByteLen: 4 * abi.PageSize})
	if got := b.g.mrRead(t, mr, 0x100, 4*abi.PageSize); !bytes.Equal(got, msg) {
		t.Fatalf("bytes differ across the region boundary")
	}
}

func TestAtomics(t *testing.T) {
	le := binary.LittleEndian
	tests := []struct {
		name             string
		op               uint8
		initial          uint64
		compareAdd, swap uint64
		wantRemote       uint64
	}{
		{"cas hit", abi.WROpAtomicCmpSwp, 5, 5, 77, 77},
		{"cas miss", abi.WROpAtomicCmpSwp, 6, 5, 77, 6},
		{"fetch add", abi.WROpAtomicFetchAdd, 1 << 40, 3, 0, 1<<40 + 3},
		{"fetch add wraps", abi.WROpAtomicFetchAdd, ^uint64(0), 2, 0, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, pairOpts{})
			a, b := p.a, p.b
			var v [8]byte
			le.PutUint64(v[:], tc.initial)
			b.g.mrWrite(t, b.mr, mrIOVA+4096, v[:]) // mrIOVA+4096 is 8-aligned
			// The 8-byte result is split over two SGEs across a page.
			a.postSend(t, abi.SendWQE{WRID: 3, Opcode: tc.op, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA + 4096,
				RKey: mrKey, CompareAdd: tc.compareAdd, Swap: tc.swap}, []abi.SGE{a.sge(12, 3), a.sge(8000, 5)}, nil)
			p.poll(t)
			want1(t, "send cq", a.cqes(t, a.scq), abi.CQE{WRID: 3, Opcode: wcOpcode(tc.op), QPNum: 0x100, ByteLen: 8})
			if got := le.Uint64(b.g.mrRead(t, b.mr, mrIOVA+4096, 8)); got != tc.wantRemote {
				t.Fatalf("remote value: got %#x, want %#x", got, tc.wantRemote)
			}
			got := append(a.g.mrRead(t, a.mr, mrIOVA+12, 3), a.g.mrRead(t, a.mr, mrIOVA+8000, 5)...)
			if o := le.Uint64(got); o != tc.initial {
				t.Fatalf("original value: got %#x, want %#x", o, tc.initial)
			}
		})
	}
}

// errorCase is one error path: setup posts what fails; the requester's
// CQE and the QP states are checked.
func TestErrors(t *testing.T) {
	type env struct {
		t    *testing.T
		p    *pair
		a, b *node
	}
	send := func(e env, w abi.SendWQE, sges ...abi.SGE) {
		e.a.postSend(e.t, w, sges, nil)
	}
	tests := []struct {
		name       string
		opts       pairOpts
		setup      func(t *testing.T, e env)
		wantStatus abi.WCStatus
		peerErr    bool          // b's QP must be in ERR with a QP_FATAL event
		recvStatus *abi.WCStatus // b's receive CQE status, if one is expected
	}{
		{name: "bad lkey", wantStatus: abi.WCLocProtErr, setup: func(t *testing.T, e env) {
			send(e, abi.SendWQE{Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: mrKey}, abi.SGE{Addr: mrIOVA, Length: 8, LKey: 0xbad})
		}},
		{name: "lkey of another pd", wantStatus: abi.WCLocProtErr, setup: func(t *testing.T, e env) {
			m := e.a.g.newMR(t, 0x7702, 2, abi.AccessAll, 0x1000, 4096, false)
			addMR(e.a.d, m)
			send(e, abi.SendWQE{Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: mrKey}, abi.SGE{Addr: 0x1000, Length: 8, LKey: 0x7702})
		}},
		{name: "local out of bounds", wantStatus: abi.WCLocProtErr, setup: func(t *testing.T, e env) {
			send(e, abi.SendWQE{Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: mrKey}, e.a.sge(mrLen-4, 8))
		}},
		{name: "local address overflow", wantStatus: abi.WCLocProtErr, setup: func(t *testing.T, e env) {
			send(e, abi.SendWQE{Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: mrKey}, abi.SGE{Addr: ^uint64(0) - 2, Length: 8, LKey: mrKey})
		}},
		{name: "read into mr without local write", wantStatus: abi.WCLocProtErr, setup: func(t *testing.T, e env) {
			m := e.a.g.newMR(t, 0x7703, testPD, abi.AccessRemoteRead, 0x1000, 4096, false)
			addMR(e.a.d, m)
			send(e, abi.SendWQE{Opcode: abi.WROpRDMARead, RemoteAddr: mrIOVA, RKey: mrKey}, abi.SGE{Addr: 0x1000, Length: 8, LKey: 0x7703})
		}},
		{name: "message above 2^31", wantStatus: abi.WCLocLenErr, setup: func(t *testing.T, e env) {
			// A huge MR without backing pages is fine: lengths are checked before data moves.
			m := NewMR(0x7705, testPD, abi.AccessAll, 0, 3<<30, make([]abi.GPA, (3<<30)/abi.PageSize), abi.PageShift)
			addMR(e.a.d, m)
			send(e, abi.SendWQE{Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: mrKey},
				abi.SGE{Addr: 0, Length: 1 << 31, LKey: 0x7705}, abi.SGE{Addr: 0, Length: 1, LKey: 0x7705})
		}},
		{name: "bad rkey", wantStatus: abi.WCRemAccessErr, peerErr: true, setup: func(t *testing.T, e env) {
			send(e, abi.SendWQE{Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: 0xbad}, e.a.sge(0, 8))
		}},
		{name: "rkey of another pd", wantStatus: abi.WCRemAccessErr, peerErr: true, setup: func(t *testing.T, e env) {
			m := e.b.g.newMR(t, 0x8801, 2, abi.AccessAll, 0x1000, 4096, false)
			addMR(e.b.d, m)
			send(e, abi.SendWQE{Opcode: abi.WROpRDMAWrite, RemoteAddr: 0x1000, RKey: 0x8801}, e.a.sge(0, 8))
		}},
		{name: "remote out of bounds", wantStatus: abi.WCRemAccessErr, peerErr: true, setup: func(t *testing.T, e env) {
			send(e, abi.SendWQE{Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA + mrLen - 4, RKey: mrKey}, e.a.sge(0, 8))
		}},
		{name: "mr without remote write", wantStatus: abi.WCRemAccessErr, peerErr: true, setup: func(t *testing.T, e env) {
			m := e.b.g.newMR(t, 0x8802, testPD, abi.AccessLocalWrite|abi.AccessRemoteRead, 0x1000, 4096, false)
			addMR(e.b.d, m)
			send(e, abi.SendWQE{Opcode: abi.WROpRDMAWrite, RemoteAddr: 0x1000, RKey: 0x8802}, e.a.sge(0, 8))
		}},
		{name: "mr without remote atomic", wantStatus: abi.WCRemAccessErr, peerErr: true, setup: func(t *testing.T, e env) {
			m := e.b.g.newMR(t, 0x8803, testPD, abi.AccessLocalWrite|abi.AccessRemoteWrite, 0x1000, 4096, false)
			addMR(e.b.d, m)
			send(e, abi.SendWQE{Opcode: abi.WROpAtomicFetchAdd, RemoteAddr: 0x1000, RKey: 0x8803}, e.a.sge(0, 8))
		}},
		{name: "qp without remote read", opts: pairOpts{accessB: abi.AccessRemoteWrite}, wantStatus: abi.WCRemAccessErr, peerErr: true,
			setup: func(t *testing.T, e env) {
				send(e, abi.SendWQE{Opcode: abi.WROpRDMARead, RemoteAddr: mrIOVA, RKey: mrKey}, e.a.sge(0, 8))
			}},
		{name: "atomic misaligned", wantStatus: abi.WCRemInvReqErr, peerErr: true, setup: func(t *testing.T, e env) {
			send(e, abi.SendWQE{Opcode: abi.WROpAtomicCmpSwp, RemoteAddr: mrIOVA + 4, RKey: mrKey}, e.a.sge(0, 8))
		}},
		{name: "atomic local length", wantStatus: abi.WCLocLenErr, setup: func(t *testing.T, e env) {
			send(e, abi.SendWQE{Opcode: abi.WROpAtomicCmpSwp, RemoteAddr: mrIOVA + 16, RKey: mrKey}, e.a.sge(0, 4))
		}},
		{name: "peer qp missing", wantStatus: abi.WCRetryExcErr, setup: func(t *testing.T, e env) {
			e.b.d.RemoveQP(0x200)
			send(e, abi.SendWQE{Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: mrKey}, e.a.sge(0, 8))
		}},
		{name: "peer qp not ready", wantStatus: abi.WCRetryExcErr, setup: func(t *testing.T, e env) {
			if st := e.b.qp.Modify(abi.QPAttr{AttrMask: abi.QPAttrState, QPState: abi.QPSReset}); st != abi.StatusOK {
				t.Fatalf("reset: %v", st)
			}
			send(e, abi.SendWQE{Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: mrKey}, e.a.sge(0, 8))
		}},
		{name: "peer device detached", wantStatus: abi.WCRetryExcErr, setup: func(t *testing.T, e env) {
			e.b.d.Detach()
			send(e, abi.SendWQE{Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: mrKey}, e.a.sge(0, 8))
		}},
		{name: "rnr with rnr_retry 0", wantStatus: abi.WCRNRRetryExcErr, setup: func(t *testing.T, e env) {
			send(e, abi.SendWQE{Opcode: abi.WROpSend}, e.a.sge(0, 8))
		}},
		{name: "message too long for the recv", wantStatus: abi.WCRemInvReqErr, peerErr: true, recvStatus: ptr[abi.WCStatus](abi.WCLocLenErr),
			setup: func(t *testing.T, e env) {
				e.b.postRecv(t, 1, []abi.SGE{e.b.sge(0, 4), e.b.sge(100, 3)})
				send(e, abi.SendWQE{Opcode: abi.WROpSend}, e.a.sge(0, 8))
			}},
		{name: "recv sge bad lkey", wantStatus: abi.WCRemOpErr, peerErr: true, recvStatus: ptr[abi.WCStatus](abi.WCLocProtErr),
			setup: func(t *testing.T, e env) {
				e.b.postRecv(t, 1, []abi.SGE{{Addr: mrIOVA, Length: 64, LKey: 0x999}})
				send(e, abi.SendWQE{Opcode: abi.WROpSend}, e.a.sge(0, 8))
			}},
		{name: "malformed opcode", wantStatus: abi.WCLocQPOpErr, setup: func(t *testing.T, e env) {
			send(e, abi.SendWQE{Opcode: 7}, e.a.sge(0, 8))
		}},
		{name: "malformed num_sge", wantStatus: abi.WCLocQPOpErr, setup: func(t *testing.T, e env) {
			send(e, abi.SendWQE{Opcode: abi.WROpSend, NumSGE: qpSGE + 1})
		}},
		{name: "malformed inline_len", wantStatus: abi.WCLocQPOpErr, setup: func(t *testing.T, e env) {
			send(e, abi.SendWQE{Opcode: abi.WROpSend, Flags: abi.WRFlagInline, InlineLen: qpInl + 1})
		}},
		{name: "malformed reserved", wantStatus: abi.WCLocQPOpErr, setup: func(t *testing.T, e env) {
			send(e, abi.SendWQE{Opcode: abi.WROpSend, Reserved: 1 << 24}, e.a.sge(0, 8))
		}},
		{name: "malformed flags", wantStatus: abi.WCLocQPOpErr, setup: func(t *testing.T, e env) {
			send(e, abi.SendWQE{Opcode: abi.WROpSend, Flags: 0x80}, e.a.sge(0, 8))
		}},
		{name: "malformed inline read", wantStatus: abi.WCLocQPOpErr, setup: func(t *testing.T, e env) {
			send(e, abi.SendWQE{Opcode: abi.WROpRDMARead, Flags: abi.WRFlagInline, InlineLen: 8})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, tc.opts)
			e := env{t: t, p: p, a: p.a, b: p.b}
			tc.setup(t, e)
			// A second WQE behind the failing one is flushed.
			e.a.postSend(t, abi.SendWQE{WRID: 2, Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: mrKey}, []abi.SGE{e.a.sge(0, 8)}, nil)
			p.poll(t)
			got := e.a.cqes(t, e.a.scq)
			if len(got) != 2 {
				t.Fatalf("send cq: got %d CQEs %+v, want 2", len(got), got)
			}
			if got[0].Status != tc.wantStatus || got[0].WRID != 0 || got[0].QPNum != 0x100 {
				t.Fatalf("failed WQE: got %+v, want status %d", got[0], tc.wantStatus)
			}
			if got[1].Status != abi.WCWRFlushErr || got[1].WRID != 2 {
				t.Fatalf("second WQE: got %+v, want WR_FLUSH_ERR for wr 2", got[1])
			}
			if s := e.a.qp.State(); s != abi.QPSErr {
				t.Fatalf("requester state: got %d, want ERR", s)
			}
			if ci := abi.LoadUint32(e.a.record(t), abi.QPRecordSQCI); ci != 2 {
				t.Fatalf("sq_ci: got %d, want 2", ci)
			}
			if n := e.a.d.Stats().CompletionErrors[tc.wantStatus]; n != 1 {
				t.Fatalf("stats errors[%d]: got %d, want 1", tc.wantStatus, n)
			}
			bState := e.b.qp.State()
			fatal := false
			for _, ev := range e.b.takeEvents() {
				if ev.Type == abi.EventQPFatal && ev.Handle == 0x200 {
					fatal = true
				}
			}
			if tc.peerErr && (bState != abi.QPSErr || !fatal) {
				t.Fatalf("responder: got state %d, QP_FATAL %v; want ERR with QP_FATAL", bState, fatal)
			}
			if !tc.peerErr && fatal {
				t.Fatalf("responder: unexpected QP_FATAL")
			}
			rc := e.b.cqes(t, e.b.rcq)
			if tc.recvStatus != nil {
				if len(rc) != 1 || rc[0].Status != *tc.recvStatus || rc[0].WRID != 1 {
					t.Fatalf("recv cq: got %+v, want one CQE with status %d", rc, *tc.recvStatus)
				}
			} else if len(rc) != 0 {
				t.Fatalf("recv cq: got %+v, want none", rc)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestRNRRetryThenSuccess(t *testing.T) {
	p := newPair(t, pairOpts{rnrRetry: 7, minRNR: 2}) // 20 µs, forever
	a, b := p.a, p.b
	a.postSend(t, abi.SendWQE{WRID: 9, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled}, []abi.SGE{a.sge(0, 32)}, nil)
	worked, next := a.d.Poll(0, a.g.tbl)
	if !worked || next.IsZero() {
		t.Fatalf("first poll: got worked %v next %v, want work and a retry deadline", worked, next)
	}
	if d := time.Until(next); d > 20*time.Microsecond {
		t.Fatalf("retry deadline in %v, want ≤ 20µs", d)
	}
	// Before the deadline the head WQE blocks the QP.
	if got := a.cqes(t, a.scq); len(got) != 0 {
		t.Fatalf("send cq after RNR: got %+v, want none", got)
	}
	// The timer wakes the engine.
	deadline := time.Now().Add(5 * time.Second)
	for a.wakes.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Microsecond)
	}
	if a.wakes.Load() == 0 {
		t.Fatalf("RNR timer did not call wake")
	}
	// Retries keep failing while nothing is posted.
	for range 5 {
		time.Sleep(30 * time.Microsecond)
		a.d.Poll(0, a.g.tbl)
	}
	if s := a.qp.State(); s != abi.QPSRTS {
		t.Fatalf("state while retrying forever: got %d, want RTS", s)
	}
	// The guest changes the WQE in the ring: the engine must not re-read it.
	slot, _ := a.qp.SQ.Slot(a.g.tbl, 0)
	binary.LittleEndian.PutUint64(slot, 1234)
	b.postRecv(t, 10, []abi.SGE{b.sge(0, 64)})
	time.Sleep(30 * time.Microsecond)
	p.poll(t)
	want1(t, "send cq", a.cqes(t, a.scq), abi.CQE{WRID: 9, Opcode: abi.WCOpSend, QPNum: 0x100, ByteLen: 32})
	want1(t, "recv cq", b.cqes(t, b.rcq), abi.CQE{WRID: 10, Opcode: abi.WCOpRecv, QPNum: 0x200, ByteLen: 32, SrcQP: 0x100})
}

func TestRNRRetryExhausted(t *testing.T) {
	p := newPair(t, pairOpts{rnrRetry: 2, minRNR: 1})
	a := p.a
	a.postSend(t, abi.SendWQE{WRID: 9, Opcode: abi.WROpSend}, []abi.SGE{a.sge(0, 32)}, nil)
	for i := 0; i < 100 && a.qp.State() == abi.QPSRTS; i++ {
		a.d.Poll(0, a.g.tbl)
		time.Sleep(20 * time.Microsecond)
	}
	want1(t, "send cq", a.cqes(t, a.scq), abi.CQE{WRID: 9, Status: abi.WCRNRRetryExcErr, Opcode: abi.WCOpSend, QPNum: 0x100})
	if s := a.qp.State(); s != abi.QPSErr {
		t.Fatalf("state: got %d, want ERR", s)
	}
}

func TestNotInRTS(t *testing.T) {
	f := NewFabric()
	a := newNode(t, f, 1, 0x100, qpOpts{})
	b := newNode(t, f, 2, 0x200, qpOpts{})
	connect(t, b.qp, a.d, 0x100, abi.AccessRemoteWrite, 1, 0)
	a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: mrKey},
		[]abi.SGE{a.sge(0, 8)}, nil)
	steps := []abi.QPAttr{
		{QPState: abi.QPSInit, AttrMask: abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrAccessFlags, PortNum: 1},
		{QPState: abi.QPSRTR, AttrMask: abi.QPAttrState | abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN |
			abi.QPAttrRQPSN | abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer, DGID: b.d.GID(), PathMTU: 5, DestQPNum: 0x200},
		{QPState: abi.QPSRTS, AttrMask: abi.QPAttrState | abi.QPAttrSQPSN | abi.QPAttrTimeout | abi.QPAttrRetryCnt |
			abi.QPAttrRNRRetry | abi.QPAttrMaxQPRdAtomic},
	}
	for i, s := range steps {
		if w, _ := a.d.Poll(0, a.g.tbl); w {
			t.Fatalf("step %d: poll worked before RTS", i)
		}
		if got := a.cqes(t, a.scq); len(got) != 0 {
			t.Fatalf("step %d: got CQEs %+v before RTS", i, got)
		}
		if st := a.qp.Modify(s); st != abi.StatusOK {
			t.Fatalf("step %d: modify got %v", i, st)
		}
	}
	if w, _ := a.d.Poll(0, a.g.tbl); !w {
		t.Fatalf("poll in RTS did no work")
	}
	want1(t, "send cq", a.cqes(t, a.scq), abi.CQE{WRID: 1, Opcode: abi.WCOpRDMAWrite, QPNum: 0x100, ByteLen: 8})
}

func TestFlushAfterErr(t *testing.T) {
	p := newPair(t, pairOpts{})
	a := p.a
	a.postRecv(t, 100, []abi.SGE{a.sge(0, 8)})
	a.postRecv(t, 101, nil)
	if st := a.qp.Modify(abi.QPAttr{AttrMask: abi.QPAttrState, QPState: abi.QPSErr}); st != abi.StatusOK {
		t.Fatalf("modify to ERR: %v", st)
	}
	if a.wakes.Load() == 0 {
		t.Fatalf("entering ERR did not wake the engine")
	}
	a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpSend}, nil, nil)
	p.poll(t)
	if got := a.cqes(t, a.scq); len(got) != 1 || got[0].WRID != 1 || got[0].Status != abi.WCWRFlushErr {
		t.Fatalf("send cq: got %+v, want wr 1 flushed", got)
	}
	rc := a.cqes(t, a.rcq)
	if len(rc) != 2 || rc[0].WRID != 100 || rc[1].WRID != 101 || rc[0].Status != abi.WCWRFlushErr || rc[1].Opcode != abi.WCOpRecv {
		t.Fatalf("recv cq: got %+v, want 100 and 101 flushed in order", rc)
	}
	// Later posts are flushed too.
	a.postSend(t, abi.SendWQE{WRID: 2, Opcode: abi.WROpRDMARead}, nil, nil)
	a.postRecv(t, 102, nil)
	p.poll(t)
	if got := a.cqes(t, a.scq); len(got) != 1 || got[0].WRID != 2 || got[0].Status != abi.WCWRFlushErr || got[0].Opcode != abi.WCOpRDMARead {
		t.Fatalf("send cq: got %+v, want wr 2 flushed", got)
	}
	if got := a.cqes(t, a.rcq); len(got) != 1 || got[0].WRID != 102 {
		t.Fatalf("recv cq: got %+v, want 102 flushed", got)
	}
	rec := a.record(t)
	if sq, rq := abi.LoadUint32(rec, abi.QPRecordSQCI), abi.LoadUint32(rec, abi.QPRecordRQCI); sq != 2 || rq != 3 {
		t.Fatalf("consumer indices: got sq %d rq %d, want 2 and 3", sq, rq)
	}
}

func TestProducerTooFarAhead(t *testing.T) {
	p := newPair(t, pairOpts{})
	a := p.a
	abi.StoreUint32(a.record(t), abi.QPRecordSQPI, qpDepth+1)
	p.poll(t)
	if s := a.qp.State(); s != abi.QPSErr {
		t.Fatalf("state: got %d, want ERR", s)
	}
	evs := a.takeEvents()
	if len(evs) != 1 || evs[0] != (abi.Event{Type: abi.EventQPFatal, Handle: 0x100}) {
		t.Fatalf("events: got %+v, want one QP_FATAL", evs)
	}
	if got := a.cqes(t, a.scq); len(got) != 0 {
		t.Fatalf("send cq: got %+v, want nothing from a broken index", got)
	}
}

func TestCQOverrun(t *testing.T) {
	f := NewFabric()
	a := newNode(t, f, 1, 0x100, qpOpts{})
	b := newNode(t, f, 2, 0x200, qpOpts{})
	small := newCQ(t, a.g, a.d, 0x33, 2)
	q := newQP(t, a.g, a.d, 0x101, small, small, qpOpts{})
	connect(t, q, b.d, 0x200, 0, 1, 0)
	connect(t, b.qp, a.d, 0x101, abi.AccessRemoteWrite, 1, 0)
	post := func(id uint64) {
		rec := a.g.slice(t, q.Record, 16)
		pi := abi.LoadUint32(rec, 0)
		slot, _ := q.SQ.Slot(a.g.tbl, pi)
		clear(slot)
		encodeSend(slot, &abi.SendWQE{WRID: id, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: mrKey})
		abi.StoreUint32(rec, 0, pi+1)
	}
	for i := range 3 {
		post(uint64(i))
	}
	a.d.Poll(0, a.g.tbl)
	evs := a.takeEvents()
	if len(evs) != 1 || evs[0] != (abi.Event{Type: abi.EventCQError, Handle: 0x33}) {
		t.Fatalf("events: got %+v, want one CQ_ERROR", evs)
	}
	if s := q.State(); s != abi.QPSErr {
		t.Fatalf("qp on the overrun CQ: got state %d, want ERR", s)
	}
	if s := a.qp.State(); s != abi.QPSReset {
		t.Fatalf("qp on another CQ: got state %d, want RESET", s)
	}
	if got := a.cqes(t, small); len(got) != 2 || got[0].WRID != 0 || got[1].WRID != 1 {
		t.Fatalf("cq: got %+v, want the first two", got)
	}
}

func TestArm(t *testing.T) {
	p := newPair(t, pairOpts{})
	a, b := p.a, p.b
	write := func(flags uint8) {
		a.postSend(t, abi.SendWQE{Opcode: abi.WROpRDMAWrite, Flags: flags, RemoteAddr: mrIOVA, RKey: mrKey}, nil, nil)
		p.poll(t)
	}
	countCQEvents := func() int {
		n := 0
		for _, ev := range a.takeEvents() {
			if ev == (abi.Event{Type: abi.EventCQCompletion, Handle: a.scq.Num}) {
				n++
			} else {
				t.Fatalf("unexpected event %+v", ev)
			}
		}
		return n
	}
	write(abi.WRFlagSignaled)
	if n := countCQEvents(); n != 0 {
		t.Fatalf("unarmed: got %d events, want 0", n)
	}
	a.scq.Arm(false) // pi ≠ ci: fires at once
	if n := countCQEvents(); n != 1 {
		t.Fatalf("arm with entries: got %d events, want 1", n)
	}
	a.cqes(t, a.scq)
	a.scq.Arm(false)
	if n := countCQEvents(); n != 0 {
		t.Fatalf("arm on empty CQ: got %d events, want 0", n)
	}
	write(abi.WRFlagSignaled)
	write(abi.WRFlagSignaled)
	if n := countCQEvents(); n != 1 {
		t.Fatalf("armed: got %d events for two CQEs, want 1", n)
	}
	a.cqes(t, a.scq)
	a.scq.Arm(true)
	write(abi.WRFlagSignaled)
	if n := countCQEvents(); n != 0 {
		t.Fatalf("solicited-only, unsolicited CQE: got %d events, want 0", n)
	}
	write(abi.WRFlagSignaled | abi.WRFlagSolicited)
	if n := countCQEvents(); n != 1 {
		t.Fatalf("solicited-only, solicited CQE: got %d events, want 1", n)
	}
	// Solicited-only fires for an error completion.
	a.cqes(t, a.scq)
	a.scq.Arm(true)
	// (An opcode the device lacks: LOC_QP_OP_ERR. A zero-length WRITE no
	// longer fails, whatever its key.)
	a.postSend(t, abi.SendWQE{Opcode: 99}, nil, nil)
	p.poll(t)
	if n := countCQEvents(); n != 1 {
		t.Fatalf("solicited-only, error CQE: got %d events, want 1", n)
	}
	_ = b
}

func TestSigAllAndUnsignaled(t *testing.T) {
	for _, sigAll := range []bool{false, true} {
		p := newPair(t, pairOpts{qp: qpOpts{sqDepth: 8, rqDepth: 8, maxSGE: 2, inl: 16, sigAll: sigAll}})
		a := p.a
		a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: mrKey}, nil, nil)
		p.poll(t)
		want := 0
		if sigAll {
			want = 1
		}
		if got := a.cqes(t, a.scq); len(got) != want {
			t.Fatalf("sigAll %v: got %d CQEs, want %d", sigAll, len(got), want)
		}
		if ci := abi.LoadUint32(a.record(t), abi.QPRecordSQCI); ci != 1 {
			t.Fatalf("sq_ci: got %d, want 1", ci)
		}
	}
}

func TestResetDevice(t *testing.T) {
	p := newPair(t, pairOpts{})
	a, b := p.a, p.b
	a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: mrKey}, nil, nil)
	a.postSend(t, abi.SendWQE{WRID: 2, Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: mrKey}, nil, nil)
	b.d.Reset()
	if b.d.Count(KindQP) != 0 || b.d.Count(KindCQ) != 0 || b.d.Count(KindMR) != 0 {
		t.Fatalf("after reset: %d QPs %d CQs %d MRs, want none", b.d.Count(KindQP), b.d.Count(KindCQ), b.d.Count(KindMR))
	}
	if b.scq.Users.Load() != 0 || b.rcq.Users.Load() != 0 {
		t.Fatalf("CQ users after reset: got %d %d, want 0", b.scq.Users.Load(), b.rcq.Users.Load())
	}
	if s := a.qp.State(); s != abi.QPSErr {
		t.Fatalf("peer QP: got state %d, want ERR", s)
	}
	if evs := a.takeEvents(); len(evs) != 1 || evs[0].Type != abi.EventQPFatal {
		t.Fatalf("peer events: got %+v, want QP_FATAL", evs)
	}
	a.postSend(t, abi.SendWQE{WRID: 3, Opcode: abi.WROpRDMAWrite, RemoteAddr: mrIOVA, RKey: mrKey}, nil, nil)
	p.a.d.Poll(0, a.g.tbl)
	got := a.cqes(t, a.scq)
	if len(got) != 3 || got[0].Status != abi.WCRetryExcErr || got[1].Status != abi.WCRetryExcErr || got[2].Status != abi.WCWRFlushErr {
		t.Fatalf("send cq: got %+v, want RETRY_EXC_ERR ×2 then WR_FLUSH_ERR", got)
	}
}

func TestModifyToResetDiscards(t *testing.T) {
	p := newPair(t, pairOpts{})
	a := p.a
	if st := a.qp.Modify(abi.QPAttr{AttrMask: abi.QPAttrState, QPState: abi.QPSErr}); st != abi.StatusOK {
		t.Fatal(st)
	}
	a.postSend(t, abi.SendWQE{WRID: 1}, nil, nil)
	a.postRecv(t, 2, nil)
	a.postRecv(t, 3, nil)
	if st := a.qp.Modify(abi.QPAttr{AttrMask: abi.QPAttrState, QPState: abi.QPSReset}); st != abi.StatusOK {
		t.Fatal(st)
	}
	rec := a.record(t)
	if sq, rq := abi.LoadUint32(rec, abi.QPRecordSQCI), abi.LoadUint32(rec, abi.QPRecordRQCI); sq != 1 || rq != 2 {
		t.Fatalf("consumer indices: got %d %d, want 1 2", sq, rq)
	}
	p.poll(t)
	if got := a.cqes(t, a.scq); len(got) != 0 {
		t.Fatalf("got CQEs %+v after RESET, want none", got)
	}
	if at := a.qp.Attr(); at != (abi.QPAttr{QPN: 0x100}) {
		t.Fatalf("attributes after RESET: got %+v", at)
	}
}

func TestAtomicAccessors(t *testing.T) {
	b := make([]byte, 16)
	if !abi.CompareAndSwapUint64(b, 8, 0, 5) || abi.CompareAndSwapUint64(b, 8, 0, 6) {
		t.Fatal("CompareAndSwapUint64: wrong result")
	}
	if got := abi.AddUint64(b, 8, 3); got != 8 || binary.LittleEndian.Uint64(b[8:]) != 8 {
		t.Fatalf("AddUint64: got %d, want 8", got)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("AddUint64 past the end did not panic")
		}
	}()
	abi.AddUint64(b, 9, 1)
}
