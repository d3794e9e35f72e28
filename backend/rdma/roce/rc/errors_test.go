package rc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestRNR: a SEND with no receive posted is RNR-NAKed and retried after
// the RNR timer until a receive appears.
func TestRNR(t *testing.T) {
	s := newSim(t, Config{PMTU: roce.MTU1024, RNRRetry: 7, MinRNRTimer: 14}, simMem)
	data := fill(5000, 3)
	if err := s.a.qp.Post(SendWR{ID: 7, Opcode: WRSend, Length: 5000, Local: buf(data)}); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		s.step()
	}
	s.now = s.now.Add(10 * time.Millisecond)
	s.a.qp.Tick()
	for range 50 {
		s.step()
	}
	if n := s.b.qp.Counters().RNRNAKsSent; n < 2 {
		t.Fatalf("%d RNR NAKs sent, want at least 2", n)
	}
	rb := make([]byte, 5000)
	s.b.host.recvs = append(s.b.host.recvs, Recv{ID: 1, Len: 5000, Buf: buf(rb)})
	s.run(func() bool { return len(s.a.host.sendDone) == 1 })
	wantStatus(t, s.a.host.sendDone, []uint64{7}, abi.WCSuccess)
	if !bytes.Equal(rb, data) || len(s.b.host.recvDone) != 1 || s.b.host.recvDone[0].ByteLen != 5000 {
		t.Fatalf("receive: completions %+v, data equal %t", s.b.host.recvDone, bytes.Equal(rb, data))
	}
	if got := s.a.qp.Counters().RNRNAKsRecv; got < 2 {
		t.Fatalf("%d RNR NAKs received", got)
	}
}

// TestRNRRetryExceeded: with rnr_retry 2, the third RNR NAK fails the WR
// with WCRNRRetryExcErr, the next one is flushed, and the QP is in error.
func TestRNRRetryExceeded(t *testing.T) {
	s := newSim(t, Config{PMTU: roce.MTU1024, RNRRetry: 2, MinRNRTimer: 1}, simMem)
	for i := range 2 {
		if err := s.a.qp.Post(SendWR{ID: uint64(i), Opcode: WRSend, Length: 10, Local: buf(make([]byte, 10))}); err != nil {
			t.Fatal(err)
		}
	}
	s.run(func() bool { return len(s.a.host.sendDone) == 2 })
	if c := s.a.host.sendDone; c[0].Status != abi.WCRNRRetryExcErr || c[1].Status != abi.WCWRFlushErr {
		t.Fatalf("completions %+v", c)
	}
	if !s.a.qp.Err() {
		t.Fatal("QP not in the error state")
	}
	if err := s.a.qp.Post(SendWR{ID: 9, Opcode: WRSend}); !errors.Is(err, ErrState) {
		t.Fatalf("Post after the error: %v, want ErrState", err)
	}
	if got := s.a.qp.Counters().RNRNAKsRecv; got != 3 {
		t.Fatalf("%d RNR NAKs, want 3", got)
	}
}

// TestRetryExceeded: a peer that answers nothing makes the head WR fail
// with WCRetryExcErr after retry_cnt retransmissions, each after the
// timeout, and the others flushed.
func TestRetryExceeded(t *testing.T) {
	s := newSim(t, Config{PMTU: roce.MTU1024, RetryCnt: 3, Timeout: 5 * time.Millisecond}, simMem)
	s.drop = func(from *side, pkt []byte) bool { return true }
	start := s.now
	for i := range 3 {
		if err := s.a.qp.Post(SendWR{ID: uint64(i), Opcode: WRRDMAWrite, Length: 3000, RemoteAddr: 0x10000, RKey: simRKey, Local: buf(make([]byte, 3000))}); err != nil {
			t.Fatal(err)
		}
	}
	s.run(func() bool { return len(s.a.host.sendDone) == 3 })
	wantStatus(t, s.a.host.sendDone[:1], []uint64{0}, abi.WCRetryExcErr)
	wantStatus(t, s.a.host.sendDone[1:], []uint64{1, 2}, abi.WCWRFlushErr)
	c := s.a.qp.Counters()
	// 9 packets, then after each timeout the congestion window's 4.
	if c.Timeouts != 4 || c.TxPackets != 9+3*minCwnd {
		t.Fatalf("timeouts %d, packets %d; want 4 and %d", c.Timeouts, c.TxPackets, 9+3*minCwnd)
	}
	if d := s.now.Sub(start); d < 20*time.Millisecond || d > 30*time.Millisecond {
		t.Fatalf("failed after %v, want 4 timeouts of 5 ms", d)
	}
}

// TestAtomicOnce: the atomic ACK is lost three times; the request is sent
// again each time and answered from the replay cache, executed once.
func TestAtomicOnce(t *testing.T) {
	s := newSim(t, Config{PMTU: roce.MTU1024, RetryCnt: 7}, simMem)
	binary.LittleEndian.PutUint64(s.b.host.mr.b[8:], 40)
	lost := 0
	s.drop = func(from *side, pkt []byte) bool {
		if pkt[0] == byte(roce.OpAtomicAcknowledge) && lost < 3 {
			lost++
			return true
		}
		return false
	}
	res := make([]byte, 8)
	if err := s.a.qp.Post(SendWR{ID: 1, Opcode: WRAtomicCmpSwp, Length: 8, RemoteAddr: 0x10008, RKey: simRKey, Compare: 40, SwapAdd: 2, Local: buf(res)}); err != nil {
		t.Fatal(err)
	}
	s.run(func() bool { return len(s.a.host.sendDone) == 1 })
	wantStatus(t, s.a.host.sendDone, []uint64{1}, abi.WCSuccess)
	if got := binary.LittleEndian.Uint64(res); got != 40 {
		t.Fatalf("original value %d, want 40", got)
	}
	if got := binary.LittleEndian.Uint64(s.b.host.mr.b[8:]); got != 2 || s.b.host.mr.atomics != 1 {
		t.Fatalf("target %d after %d executions, want 2 after 1", got, s.b.host.mr.atomics)
	}
	if d := s.b.qp.Counters().Duplicates; d != 3 {
		t.Fatalf("%d duplicates answered, want 3", d)
	}
}

// TestRemoteErrors: a bad rkey, a range outside the MR, a missing access
// right and a receive too small complete the WR with the remote error, the
// others flushed, and put both QPs in the error state.
func TestRemoteErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		wr   SendWR
		recv bool
		want abi.WCStatus
	}{
		{"rkey", SendWR{Opcode: WRRDMAWrite, Length: 10, RemoteAddr: 0x10000, RKey: 99}, false, abi.WCRemAccessErr},
		{"range", SendWR{Opcode: WRRDMARead, Length: 10, RemoteAddr: 0x10000 + simMem - 4, RKey: simRKey}, false, abi.WCRemAccessErr},
		{"atomic rkey", SendWR{Opcode: WRAtomicFetchAdd, Length: 8, RemoteAddr: 0x10000, RKey: 5}, false, abi.WCRemAccessErr},
		{"recv length", SendWR{Opcode: WRSend, Length: 100}, true, abi.WCRemInvReqErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, Config{PMTU: roce.MTU1024}, simMem)
			if tc.recv {
				s.b.host.recvs = append(s.b.host.recvs, Recv{ID: 3, Len: 50, Buf: buf(make([]byte, 50))})
			}
			wr := tc.wr
			wr.ID, wr.Local = 1, buf(make([]byte, wr.Length))
			if err := s.a.qp.Post(wr); err != nil {
				t.Fatal(err)
			}
			if err := s.a.qp.Post(SendWR{ID: 2, Opcode: WRSend, Length: 1, Local: buf{0}}); err != nil {
				t.Fatal(err)
			}
			s.run(func() bool { return len(s.a.host.sendDone) == 2 })
			wantStatus(t, s.a.host.sendDone[:1], []uint64{1}, tc.want)
			wantStatus(t, s.a.host.sendDone[1:], []uint64{2}, abi.WCWRFlushErr)
			if !s.a.qp.Err() || !s.b.qp.Err() {
				t.Fatalf("error states: requester %t, responder %t", s.a.qp.Err(), s.b.qp.Err())
			}
		})
	}
}

func TestPostRefuses(t *testing.T) {
	s := newSim(t, Config{PMTU: roce.MTU1024, SQSize: 2, Window: 1}, simMem)
	for _, wr := range []SendWR{
		{Opcode: 9},
		{Opcode: WRAtomicFetchAdd, Length: 4, Local: buf{}},
		{Opcode: WRAtomicFetchAdd, Length: 8, RemoteAddr: 4, Local: buf{}},
		{Opcode: WRSend, Length: 4},
		{Opcode: WRSend, Length: 1<<31 + 1, Local: buf{}},
	} {
		if err := s.a.qp.Post(wr); !errors.Is(err, ErrWR) {
			t.Errorf("Post(%+v) = %v, want ErrWR", wr, err)
		}
	}
	for i := range 2 {
		if err := s.a.qp.Post(SendWR{ID: uint64(i), Opcode: WRSend}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.a.qp.Post(SendWR{Opcode: WRSend}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("Post on a full queue: %v", err)
	}
	if _, err := New(Config{PMTU: 1000}, s.a.host, s.a.port); !errors.Is(err, ErrConfig) {
		t.Fatalf("New with PMTU 1000: %v", err)
	}
	s.a.qp.Close()
	s.a.qp.Close()
	wantStatus(t, s.a.host.sendDone, []uint64{0, 1}, abi.WCWRFlushErr)
}
