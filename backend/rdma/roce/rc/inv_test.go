package rc

import (
	"bytes"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestSendWithInv: a SEND_WITH_INV of one packet and of several crosses
// as SEND_FIRST/MIDDLE and SEND_LAST/ONLY_WITH_INVALIDATE with the key in
// the IETH of the last packet only; the receive completes WithInv with the
// key, and the key is freed (a later WRITE with it is a remote access
// error).
func TestSendWithInv(t *testing.T) {
	for _, n := range []int{0, 100, 1024, 5000} {
		s := newSim(t, Config{PMTU: roce.MTU1024}, simMem)
		var ops []roce.Opcode
		var keys []uint32
		s.drop = func(from *side, pkt []byte) bool {
			if p, err := roce.Parse(pkt); err == nil && from == s.a {
				ops = append(ops, p.BTH.Opcode)
				keys = append(keys, p.IETH)
			}
			return false
		}
		data := fill(n, uint64(n))
		rb := make([]byte, 8192)
		s.b.host.recvs = append(s.b.host.recvs, Recv{ID: 5, Len: uint32(len(rb)), Buf: buf(rb)})
		if err := s.a.qp.Post(SendWR{ID: 1, Opcode: WRSendWithInv, Length: uint32(n), Invalidate: simRKey, Imm: 0xdead, Local: buf(data)}); err != nil {
			t.Fatal(err)
		}
		s.run(func() bool { return len(s.a.host.sendDone) == 1 })
		wantStatus(t, s.a.host.sendDone, []uint64{1}, abi.WCSuccess)
		want := []roce.Opcode{roce.OpSendOnlyWithInvalidate}
		if pk := int(npkts(uint32(n), roce.MTU1024)); pk > 1 {
			want = []roce.Opcode{roce.OpSendFirst}
			for range pk - 2 {
				want = append(want, roce.OpSendMiddle)
			}
			want = append(want, roce.OpSendLastWithInvalidate)
		}
		if len(ops) != len(want) {
			t.Fatalf("%d bytes: sent %v, want %v", n, ops, want)
		}
		for i := range want {
			wk := uint32(0)
			if i == len(want)-1 {
				wk = simRKey
			}
			if ops[i] != want[i] || keys[i] != wk {
				t.Fatalf("%d bytes: packet %d is %v with IETH %#x, want %v with %#x", n, i, ops[i], keys[i], want[i], wk)
			}
		}
		rd := s.b.host.recvDone
		if len(rd) != 1 || rd[0].Status != abi.WCSuccess || !rd[0].WithInv || rd[0].InvRKey != simRKey ||
			rd[0].WithImm || rd[0].ByteLen != uint32(n) || !bytes.Equal(rb[:n], data) {
			t.Fatalf("%d bytes: receive %+v", n, rd)
		}
		if s.b.host.mr != nil {
			t.Fatalf("%d bytes: the key was not invalidated", n)
		}
		s.drop = nil
		if err := s.a.qp.Post(SendWR{ID: 2, Opcode: WRRDMAWrite, Length: 8, RemoteAddr: 0x10000, RKey: simRKey, Local: buf(make([]byte, 8))}); err != nil {
			t.Fatal(err)
		}
		s.run(func() bool { return len(s.a.host.sendDone) == 2 })
		if c := s.a.host.sendDone[1]; c.Status != abi.WCRemAccessErr {
			t.Fatalf("%d bytes: WRITE with the invalidated key: %+v", n, c)
		}
	}
}

// TestSendWithInvBadKey: a key the responder may not invalidate is an
// invalid request: REM_INV_REQ_ERR at the requester, the responder's QP in
// the error state, its receive not completed (a one-packet message takes
// none; a longer one leaves the one it filled to the owner's flush), and
// the key it holds still valid.
func TestSendWithInvBadKey(t *testing.T) {
	for _, n := range []int{10, 3000} {
		s := newSim(t, Config{PMTU: roce.MTU1024}, simMem)
		rb := make([]byte, 4096)
		s.b.host.recvs = append(s.b.host.recvs, Recv{ID: 5, Len: uint32(len(rb)), Buf: buf(rb)})
		for i, wr := range []SendWR{
			{Opcode: WRSendWithInv, Length: uint32(n), Invalidate: simRKey + 1, Local: buf(fill(n, 1))},
			{Opcode: WRSend, Length: 4, Local: buf(make([]byte, 4))},
		} {
			wr.ID = uint64(i)
			if err := s.a.qp.Post(wr); err != nil {
				t.Fatal(err)
			}
		}
		s.run(func() bool { return len(s.a.host.sendDone) == 2 })
		if c := s.a.host.sendDone; c[0].Status != abi.WCRemInvReqErr || c[1].Status != abi.WCWRFlushErr {
			t.Fatalf("%d bytes: completions %+v", n, c)
		}
		if !s.b.qp.Err() || s.b.qp.Counters().NAKsSent != 1 {
			t.Fatalf("%d bytes: responder err %t, counters %+v", n, s.b.qp.Err(), s.b.qp.Counters())
		}
		if len(s.b.host.recvDone) != 0 || s.b.host.mr == nil {
			t.Fatalf("%d bytes: receives %+v, region %v", n, s.b.host.recvDone, s.b.host.mr)
		}
		if taken := len(s.b.host.recvs) == 0; taken != (n > 1024) {
			t.Fatalf("%d bytes: receive taken %t", n, taken)
		}
	}
}

// TestSendWithInvRNR: a SEND_ONLY_WITH_INVALIDATE without a receive is
// RNR-NAKed and invalidates nothing until a receive lets it in.
func TestSendWithInvRNR(t *testing.T) {
	s := newSim(t, Config{PMTU: roce.MTU1024, RNRRetry: 7, MinRNRTimer: 1}, simMem)
	if err := s.a.qp.Post(SendWR{ID: 1, Opcode: WRSendWithInv, Length: 4, Invalidate: simRKey, Local: buf(make([]byte, 4))}); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		s.step()
	}
	if s.b.qp.Counters().RNRNAKsSent == 0 || s.b.host.mr == nil {
		t.Fatalf("RNR NAKs %d, region %v", s.b.qp.Counters().RNRNAKsSent, s.b.host.mr)
	}
	s.b.host.recvs = append(s.b.host.recvs, Recv{ID: 5, Len: 4, Buf: buf(make([]byte, 4))})
	s.now = s.now.Add(time.Millisecond)
	s.run(func() bool { return len(s.a.host.sendDone) == 1 })
	wantStatus(t, s.a.host.sendDone, []uint64{1}, abi.WCSuccess)
	if rd := s.b.host.recvDone; len(rd) != 1 || !rd[0].WithInv || s.b.host.mr != nil {
		t.Fatalf("receive %+v, region %v", rd, s.b.host.mr)
	}
}
