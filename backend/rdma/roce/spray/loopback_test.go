package spray

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

func lo(a, b byte) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, a, b}) }

// TestLoopbackSpray: two Conns with four addresses each on the loopback
// negotiate the extension, spray over four paths (every path carries
// packets) and run every verb, every byte checked, both ways at once.
func TestLoopbackSpray(t *testing.T) {
	a := listen(t, nil, 47950, lo(1, 1), lo(1, 2), lo(1, 3), lo(1, 4))
	b := listen(t, nil, 47950, lo(2, 1), lo(2, 2), lo(2, 3), lo(2, 4))
	x, y := connect(t, a, b, &Config{Paths: 4}, &Config{Paths: 4}, rc.Config{PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7}, 4<<20+64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		exercise(t, y, x, 1<<20, 8192, 50, 7)
	}()
	exercise(t, x, y, 4<<20, 65536, 100, 1)
	<-done
	for _, s := range []*side{x, y} {
		if s.spray.Mode() != Sprayed {
			t.Fatalf("mode %v, want spray\n%s", s.spray.Mode(), s)
		}
		for i, p := range s.spray.Paths() {
			if p.Sent == 0 || p.Acked == 0 {
				t.Fatalf("path %d unused\n%s", i, s)
			}
		}
		if c := s.spray.QP().Counters(); c.TxPackets != 0 {
			t.Fatalf("plain RC sent %d packets", c.TxPackets)
		}
	}
	t.Logf("x: %s\ny: %s", x, y)
}

// TestFallbackToPlain: a spray-capable Conn whose peer is a plain RC QP
// (udp.NewConn, standing in for rxe, which drops the vendor opcodes) gets
// no answer to its HELLOs, falls back to plain RC and works both ways;
// the work requests posted while it negotiated are not lost.
func TestFallbackToPlain(t *testing.T) {
	a := listen(t, nil, 47951, lo(3, 1), lo(3, 2))
	b := listen(t, nil, 47951, lo(4, 1))
	x, y := connect(t, a, b, &Config{Paths: 2, HelloTimeout: 5e6, HelloRetries: 2}, nil, rc.Config{PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7}, 1<<20+64)
	if x.spray.Mode() != Negotiating {
		t.Fatalf("mode %v right after Start", x.spray.Mode())
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		exercise(t, y, x, 256<<10, 4096, 20, 3)
	}()
	exercise(t, x, y, 1<<20, 16384, 30, 4)
	<-done
	if x.spray.Mode() != Plain || x.spray.Counters().Fallbacks != 1 || x.spray.Counters().Hellos != 3 {
		t.Fatalf("no fallback after 3 HELLOs\n%s", x)
	}
	if got := b[0].Counters().RxMalformed; got < 3 {
		t.Fatalf("the plain peer's endpoint counted %d malformed datagrams, want the HELLOs", got)
	}
}

// TestPlainPeerOfSpray: a Conn with Config.Plain speaks plain RC, and a
// spray Conn talking to it is answered: its requests are sprayed while
// the plain side's go as RC.
func TestPlainPeerOfSpray(t *testing.T) {
	a := listen(t, nil, 47952, lo(5, 1), lo(5, 2))
	b := listen(t, nil, 47952, lo(6, 1), lo(6, 2))
	x, y := connect(t, a, b, &Config{}, &Config{Plain: true}, rc.Config{PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7}, 1<<20+64)
	exercise(t, x, y, 1<<20, 16384, 30, 5)
	exercise(t, y, x, 256<<10, 4096, 20, 6)
	if x.spray.Mode() != Sprayed || y.spray.Mode() != Plain {
		t.Fatalf("modes %v and %v\n%s\n%s", x.spray.Mode(), y.spray.Mode(), x, y)
	}
	if len(x.spray.Paths()) != 2 {
		t.Fatalf("%d paths, want max(2, 2)", len(x.spray.Paths()))
	}
}

// TestSendWithInvPlainPeer: SPRAY_DATA has no SEND_WITH_INV, so a Conn
// that is not plain RC refuses one (rc.ErrWR: the engine completes it with
// LOC_QP_OP_ERR); a plain peer's SEND_WITH_INV reaches a spray Conn as RC,
// over UDP, and frees the key its IETH names.
func TestSendWithInvPlainPeer(t *testing.T) {
	a := listen(t, nil, 47953, lo(7, 1), lo(7, 2))
	b := listen(t, nil, 47953, lo(8, 1), lo(8, 2))
	x, y := connect(t, a, b, &Config{}, &Config{Plain: true}, rc.Config{PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7}, 1<<16)
	err := x.conn.Post(rc.SendWR{ID: 1, Opcode: rc.WRSendWithInv, Invalidate: testRKey})
	if !errors.Is(err, rc.ErrWR) {
		t.Fatalf("SEND_WITH_INV on a %v Conn: got %v, want ErrWR", x.spray.Mode(), err)
	}
	data := random(3000, 9)
	rb := make(rctest.Buf, 4096)
	x.host.PostRecv(rc.Recv{ID: 7, Len: uint32(len(rb)), Buf: rb})
	if err := y.conn.Post(rc.SendWR{ID: 2, Opcode: rc.WRSendWithInv, Length: 3000, Invalidate: testRKey, Local: rctest.Buf(data)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := y.host.TakeSends(ctx, 1)
	if err != nil || s[0].Status != abi.WCSuccess {
		t.Fatalf("send: %+v, %v", s, err)
	}
	r, err := x.host.TakeRecvs(ctx, 1)
	if err != nil || r[0].Status != abi.WCSuccess || !r[0].WithInv || r[0].InvRKey != testRKey || r[0].ByteLen != 3000 || !bytes.Equal(rb[:3000], data) {
		t.Fatalf("receive: %+v, %v", r, err)
	}
	if _, ok := x.host.Resolve(testRKey, testMRAddr, 8, rc.AccessRemoteRead); ok {
		t.Fatal("the invalidated rkey still resolves")
	}
}
