package engine

import (
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Rings and records that overlap (docs/spec.md, CREATE_CQ: accepted, and
// harmful only to their own device). Whatever the engine reads back from
// aliased memory is validated, so the engine always runs dry: these tests
// poll until Poll reports no work and fail if that takes more rounds than
// the CQ's depth allows.
func TestOverlappingRingsRunDry(t *testing.T) {
	type layout struct {
		cqRing   []abi.GPA
		cqRecord abi.GPA
		sq       []abi.GPA
		qpRecord abi.GPA
	}
	cases := []struct {
		name string
		lay  func(g *guest) layout
	}{
		{"CQ record is the QP record", func(g *guest) layout {
			r := g.pages(t, 1)[0]
			return layout{cqRecord: r, qpRecord: r}
		}},
		{"CQ record on the QP's consumer indices", func(g *guest) layout {
			r := g.pages(t, 1)[0]
			return layout{cqRecord: r + 8, qpRecord: r}
		}},
		{"CQ record on the QP's receive producer index", func(g *guest) layout {
			r := g.pages(t, 1)[0]
			return layout{cqRecord: r + 4, qpRecord: r}
		}},
		{"QP record inside the CQ ring", func(g *guest) layout {
			p := g.pages(t, 1)
			return layout{cqRing: p, qpRecord: p[0] + 8*abi.CQESize + 16} // in the next CQE's slot
		}},
		{"CQ ring on the send queue", func(g *guest) layout {
			p := g.pages(t, 1)
			return layout{cqRing: p, sq: p}
		}},
		{"send queue on the CQ record", func(g *guest) layout {
			p := g.pages(t, 1)
			return layout{cqRecord: p[0] + 64*8, sq: p}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, pairOpts{})
			a, b := p.a, p.b
			lay := tc.lay(a.g)
			if lay.cqRing == nil {
				lay.cqRing = a.g.pages(t, 1)
			}
			if lay.cqRecord == 0 {
				lay.cqRecord = a.g.pages(t, 1)[0]
			}
			if lay.sq == nil {
				lay.sq = a.g.pages(t, 1)
			}
			if lay.qpRecord == 0 {
				lay.qpRecord = a.g.pages(t, 1)[0] + 16
			}
			const depth = 16
			c := &CQ{Num: 0x31, Dev: a.d, Ring: Ring{Pages: lay.cqRing, Depth: cqDepth, Stride: abi.CQESize}, Record: lay.cqRecord}
			// The CQ already produced completions (its driver consumed
			// none): with aliased indices, each new CQE then republishes a
			// producer index ahead of the consumer, a stream that feeds
			// itself until the CQ overruns.
			c.pi = 8
			a.d.AddCQ(c)
			q := &QP{Num: 0x101, PD: testPD, Dev: a.d, SendCQ: c, RecvCQ: c,
				SQ:         Ring{Pages: lay.sq, Depth: depth, Stride: 128},
				RQ:         Ring{Pages: a.g.pages(t, 1), Depth: depth, Stride: 128},
				Record:     lay.qpRecord,
				MaxSendSGE: qpSGE, MaxRecvSGE: qpSGE, MaxInline: qpInl,
			}
			addQP(a.d, q)
			connect(t, q, b.d, 0x200, 0, 1, 0)
			// Driver-style posts through the aliased record.
			n := &node{g: a.g, d: a.d, qp: q}
			for i := range depth - 1 {
				n.postSend(t, abi.SendWQE{WRID: uint64(i), Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
					RemoteAddr: mrIOVA, RKey: mrKey}, []abi.SGE{a.sge(0, 64)}, nil)
			}
			// Every WQE or flush writes at most one CQE; a CQ that feeds its
			// own producer index overruns after cqDepth of them. Rounds are
			// bounded accordingly (pollBudget WQEs a round).
			limit := 4 * (cqDepth + depth)
			rounds := 0
			for {
				worked, _ := a.d.Poll(0, a.g.tbl)
				if !worked {
					break
				}
				if rounds++; rounds > limit {
					t.Fatalf("engine still busy after %d rounds over the aliased layout", rounds)
				}
			}
			t.Logf("ran dry after %d rounds; QP state %d; errors %v", rounds, q.State(), a.d.Stats().CompletionErrors)
			// The peer and the device's other QP are untouched by it.
			if s := b.qp.State(); s != abi.QPSRTS {
				t.Fatalf("peer QP: state %d, want RTS", s)
			}
			a.postSend(t, abi.SendWQE{WRID: 77, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: mrKey},
				[]abi.SGE{a.sge(0, 64)}, nil)
			p.poll(t)
			want1(t, "the device's other QP", a.cqes(t, a.scq), abi.CQE{WRID: 77, Opcode: abi.WCOpRDMAWrite, QPNum: 0x100, ByteLen: 64})
		})
	}
}
