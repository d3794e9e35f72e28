package engine

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// FuzzWQE writes random bytes as send WQEs into a QP's ring and as receive
// WQEs into its peer's, with random producer indices, and runs both
// engines: no panic, every CQE well formed, no byte written outside the
// MRs, rings and records.
func FuzzWQE(f *testing.F) {
	// Seed: one valid RDMA WRITE and one valid SEND with a matching RECV.
	var seed []byte
	seed = append(seed, 2, 1) // sq_pi = 2, rq_pi = 1
	wqe := make([]byte, 128)
	encodeSend(wqe, &abi.SendWQE{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, NumSGE: 1, RemoteAddr: mrIOVA, RKey: mrKey})
	encodeSGE(wqe[64:], abi.SGE{Addr: mrIOVA, Length: 100, LKey: mrKey})
	seed = append(seed, wqe...)
	encodeSend(wqe, &abi.SendWQE{WRID: 2, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, NumSGE: 1})
	seed = append(seed, wqe...)
	rwqe := make([]byte, 128)
	binary.LittleEndian.PutUint64(rwqe, 7)
	binary.LittleEndian.PutUint16(rwqe[8:], 1)
	encodeSGE(rwqe[16:], abi.SGE{Addr: mrIOVA + 200, Length: 100, LKey: mrKey})
	f.Add(seed, rwqe)

	f.Fuzz(func(t *testing.T, sq, rq []byte) {
		if len(sq) < 2 {
			return
		}
		sqPI, rqPI := uint32(sq[0]%(qpDepth+3)), uint32(sq[1]%(qpDepth+3))
		sq = sq[2:]
		p := newPair(t, pairOpts{qp: qpOpts{sqDepth: qpDepth, rqDepth: qpDepth, maxSGE: qpSGE, inl: qpInl, guestSize: 512 << 10}, rnrRetry: 1})
		a, b := p.a, p.b
		for i := uint32(0); i < qpDepth && len(sq) > 0; i++ {
			slot, _ := a.qp.SQ.Slot(a.g.tbl, i)
			sq = sq[copy(slot, sq):]
		}
		for i := uint32(0); i < qpDepth && len(rq) > 0; i++ {
			slot, _ := b.qp.RQ.Slot(b.g.tbl, i)
			rq = rq[copy(slot, rq):]
		}
		// Canaries in every byte not allocated to an object.
		canary := func(g *guest) (abi.GPA, []byte) {
			n := uint64(g.end - g.next)
			c := bytes.Repeat([]byte{0xa5}, int(n))
			g.write(t, g.next, c)
			return g.next, c
		}
		ga, ca := canary(a.g)
		gb, cb := canary(b.g)
		abi.StoreUint32(a.record(t), abi.QPRecordSQPI, sqPI)
		abi.StoreUint32(b.record(t), abi.QPRecordRQPI, rqPI)
		for range 4 {
			a.d.Poll(0, a.g.tbl)
			b.d.Poll(0, b.g.tbl)
		}
		for _, c := range []struct {
			n   *node
			cq  *CQ
			qpn uint32
		}{{a, a.scq, 0x100}, {a, a.rcq, 0x100}, {b, b.scq, 0x200}, {b, b.rcq, 0x200}} {
			for _, e := range c.n.cqes(t, c.cq) {
				checkCQE(t, e, c.qpn)
			}
		}
		for _, x := range []struct {
			g   *guest
			at  abi.GPA
			img []byte
		}{{a.g, ga, ca}, {b.g, gb, cb}} {
			got := make([]byte, 0, len(x.img))
			x.g.tbl.ForEach(x.at, uint64(len(x.img)), func(v []byte) error { got = append(got, v...); return nil })
			if !bytes.Equal(got, x.img) {
				t.Fatalf("engine wrote outside its objects")
			}
		}
	})
}

// checkCQE asserts a CQE is well formed.
func checkCQE(t *testing.T, e abi.CQE, qpn uint32) {
	t.Helper()
	switch e.Status {
	case abi.WCSuccess, abi.WCLocLenErr, abi.WCLocQPOpErr, abi.WCLocProtErr, abi.WCWRFlushErr,
		abi.WCRemInvReqErr, abi.WCRemAccessErr, abi.WCRemOpErr, abi.WCRetryExcErr, abi.WCRNRRetryExcErr:
	default:
		t.Fatalf("CQE %+v: bad status", e)
	}
	switch e.Opcode {
	case abi.WCOpSend, abi.WCOpRDMAWrite, abi.WCOpRDMARead, abi.WCOpCompSwap, abi.WCOpFetchAdd:
		if e.SrcQP != 0 || e.WCFlags != 0 || e.ImmData != 0 {
			t.Fatalf("send CQE %+v: receive fields set", e)
		}
	case abi.WCOpRecv, abi.WCOpRecvRDMAWithImm:
		if e.Status == abi.WCSuccess && e.SrcQP == 0 {
			t.Fatalf("receive CQE %+v: no src_qp", e)
		}
	default:
		t.Fatalf("CQE %+v: bad opcode", e)
	}
	if e.QPNum != qpn || e.WCFlags&^abi.WCFlagWithImm != 0 || e.ByteLen > abi.MaxMsgSize || e.VendorErr != 0 {
		t.Fatalf("CQE %+v: bad fields for qp %#x", e, qpn)
	}
	if e.Status != abi.WCSuccess && e.ByteLen != 0 {
		t.Fatalf("error CQE %+v: byte_len set", e)
	}
}
