package engine

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestOnlyThePeer: a request reaches a QP only from the QP it is connected
// to. b's QP 0x200 is connected to c's 0x300; QPs that name 0x200 without
// being its peer — another device's (a's 0x100), one of b's own device
// (0x201), c's device from a GID b's QP did not name — get what a QP that
// does not exist gives, RETRY_EXC_ERR, for every opcode, and b's QP, its
// memory and its receive queue are untouched. c's own traffic then passes.
func TestOnlyThePeer(t *testing.T) {
	ops := []struct {
		name string
		op   uint8
		rkey uint32
	}{
		{"send", abi.WROpSend, 0},
		{"send with imm", abi.WROpSendWithImm, 0},
		{"write", abi.WROpRDMAWrite, mrKey},
		{"write with imm", abi.WROpRDMAWriteWithImm, mrKey},
		{"write bad rkey", abi.WROpRDMAWrite, mrKey ^ 0x100},
		{"read", abi.WROpRDMARead, mrKey},
		{"cmp swp", abi.WROpAtomicCmpSwp, mrKey},
		{"fetch add", abi.WROpAtomicFetchAdd, mrKey},
	}
	attackers := []string{"other device", "same device", "peer device, other gid"}
	all := uint32(abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic)
	for _, who := range attackers {
		for _, o := range ops {
			t.Run(who+"/"+o.name, func(t *testing.T) {
				f := NewFabric()
				a := newNode(t, f, 1, 0x100, qpOpts{})
				b := newNode(t, f, 2, 0x200, qpOpts{})
				c := newNode(t, f, 3, 0x300, qpOpts{})
				connect(t, b.qp, c.d, 0x300, all, 1, 0)
				connect(t, c.qp, b.d, 0x200, all, 1, 0)

				// The attacker's QP and the node whose memory it sends from.
				var from *node
				var q *QP
				switch who {
				case "other device":
					from, q = a, a.qp
					connect(t, q, b.d, 0x200, all, 1, 0)
				case "same device":
					from = b
					q = newQP(t, b.g, b.d, 0x201, b.scq, b.rcq, qpOpts{})
					connect(t, q, b.d, 0x200, all, 1, 0)
				default:
					// c's device sends from a second GID of its own:
					// b's QP named c's port GID.
					other := [16]byte{0xfe, 0x80, 14: 3, 15: 3}
					c.d.SetAllowedGIDs([]netip.Prefix{netip.PrefixFrom(netip.AddrFrom16(other), 128)})
					if err := c.d.SetGID(1, other); err != nil {
						t.Fatalf("SetGID: %v", err)
					}
					from = c
					q = newQP(t, c.g, c.d, 0x301, c.scq, c.rcq, qpOpts{})
					connectFrom(t, q, 1, b.d, 0x200, all, 1, 0)
				}

				// The attacker sends from the upper half of its MR (b's own
				// when it is b's device), the victim's receive and the
				// remote address are the lower half.
				b.g.mrWrite(t, b.mr, mrIOVA, pattern(mrLen, 0x5a))
				b.postRecv(t, 77, []abi.SGE{b.sge(0, 4096)})
				mine := pattern(4096, 0x11)
				from.g.mrWrite(t, from.mr, mrIOVA+mrLen/2, mine)
				victim := b.g.mrRead(t, b.mr, mrIOVA, mrLen)
				length := uint32(4096)
				if o.op == abi.WROpAtomicCmpSwp || o.op == abi.WROpAtomicFetchAdd {
					length = 8
				}
				w := abi.SendWQE{WRID: 9, Opcode: o.op, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: o.rkey,
					CompareAdd: 1, Swap: 2}
				postOn(t, from, q, w, []abi.SGE{from.sge(mrLen/2, length)})
				for range 100 {
					wa, _ := from.d.Poll(0, from.g.tbl)
					if !wa {
						break
					}
				}
				got := from.cqes(t, q.SendCQ)
				if len(got) != 1 || got[0].WRID != 9 || got[0].Status != abi.WCRetryExcErr {
					t.Fatalf("attacker's completion: got %+v, want one RETRY_EXC_ERR (as to a QP that does not exist)", got)
				}
				if !bytes.Equal(b.g.mrRead(t, b.mr, mrIOVA, mrLen), victim) {
					t.Fatalf("the victim's memory changed")
				}
				if o.op == abi.WROpRDMARead && !bytes.Equal(from.g.mrRead(t, from.mr, mrIOVA+mrLen/2, 4096), mine) {
					t.Fatalf("the attacker's buffer changed: it read something")
				}
				if st := b.qp.State(); st != abi.QPSRTS {
					t.Fatalf("victim QP state: got %d, want RTS", st)
				}
				if n := b.d.Stats().WrongPeer; n != 1 {
					t.Fatalf("victim device's WrongPeer: got %d, want 1", n)
				}
				if from != b {
					if rc := b.cqes(t, b.rcq); len(rc) != 0 {
						t.Fatalf("victim's receive CQ: got %+v, want nothing", rc)
					}
				}

				// The peer's SEND consumes the receive the attacker
				// could not.
				c.postSend(t, abi.SendWQE{WRID: 5, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled}, nil, []byte("peer"))
				for range 100 {
					wc, _ := c.d.Poll(0, c.g.tbl)
					if !wc {
						break
					}
				}
				want1(t, "peer's send", c.cqes(t, c.scq), abi.CQE{WRID: 5, Opcode: abi.WCOpSend, QPNum: 0x300, ByteLen: 4})
				var rc []abi.CQE
				for _, e := range b.cqes(t, b.rcq) {
					if e.QPNum == 0x200 {
						rc = append(rc, e)
					}
				}
				want1(t, "victim's receive", rc, abi.CQE{WRID: 77, Opcode: abi.WCOpRecv, QPNum: 0x200, ByteLen: 4, SrcQP: 0x300})
				if got := b.g.mrRead(t, b.mr, mrIOVA, 4); string(got) != "peer" {
					t.Fatalf("received bytes: got %q, want %q", got, "peer")
				}
			})
		}
	}
}

// postOn posts a send WQE on q, a QP of n's device other than n.qp.
func postOn(tb testing.TB, n *node, q *QP, w abi.SendWQE, sges []abi.SGE) {
	tb.Helper()
	saved := n.qp
	n.qp = q
	defer func() { n.qp = saved }()
	n.postSend(tb, w, sges, nil)
}

// TestQPNsUnpredictable: QP numbers are drawn uniformly from 24 bits, so
// consecutive ones are not close, and they are unique on the fabric.
func TestQPNsUnpredictable(t *testing.T) {
	f := NewFabric()
	a := NewRNIC(f, [16]byte{15: 1}, nil)
	b := NewRNIC(f, [16]byte{15: 2}, nil)
	for _, d := range []*RNIC{a, b} {
		if err := f.Register(d); err != nil {
			t.Fatal(err)
		}
	}
	seen := make(map[uint32]bool)
	close := 0
	var prev uint32
	for i := range 256 {
		d := a
		if i%2 == 1 {
			d = b
		}
		h := d.NewHandle(KindQP, 24)
		if h < 2 || h >= 1<<24-1 {
			t.Fatalf("QPN %#x outside 2 … 2^24−2", h)
		}
		if seen[h] {
			t.Fatalf("QPN %#x drawn twice on one fabric", h)
		}
		seen[h] = true
		if i > 0 && (h-prev < 1<<12 || prev-h < 1<<12) {
			close++
		}
		prev = h
	}
	// Uniform draws put two in a row within 4096 of each other with odds
	// 2^-11 each: 255 pairs make a handful a 10^-8 event.
	if close > 3 {
		t.Fatalf("%d of 255 consecutive QPNs within 4096 of each other, want at most 3", close)
	}
	// A number reserved for a QP that was never added goes back.
	h := a.NewHandle(KindQP, 24)
	if !f.qpnTaken(b, h) {
		t.Fatalf("QPN %#x not reserved on the fabric", h)
	}
	a.ReleaseQPN(h)
	if f.qpnTaken(b, h) {
		t.Fatalf("QPN %#x still reserved after ReleaseQPN", h)
	}
}
