package udp

import (
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
)

func listen(t testing.TB, cfg Config) *Endpoint {
	t.Helper()
	e, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestLoopback runs the protocol between two endpoints on 127.0.0.1 (two
// ports), both directions at once, and checks hostile datagrams are
// counted and dropped.
func TestLoopback(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	a := listen(t, Config{Addr: lo, Port: 0})
	_ = a
	a.Close()
	a = listen(t, Config{Addr: lo, Port: 47910})
	b := listen(t, Config{Addr: lo, Port: 47911})
	x, y := connect(t, a, b, rc.Config{PMTU: roce.MTU4096, RetryCnt: 7, RNRRetry: 7}, 4<<20+64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		exercise(t, y, x, 1<<20, 8192, 50)
	}()
	exercise(t, x, y, 4<<20, 65536, 200)
	<-done

	// Hostile datagrams to b from another socket of a's address: a
	// request from another port than the one b learned for the
	// connection (wrong peer), an unknown QPN, a broken ICRC, truncated
	// headers, an unknown opcode, an oversized datagram.
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(lo, 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Each datagram b counted received is also counted delivered or
	// dropped, a moment later: snapshot b when none is between the two.
	settled := func(x Counters) bool {
		return x.RxDatagrams == x.RxDelivered+x.RxTruncated+x.RxMalformed+x.RxICRC+x.RxUnknownQP+x.RxWrongPeer
	}
	waitFor(t, func() bool { return settled(b.Counters()) })
	before := b.Counters()
	good := roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendOnly, DestQP: 0x202, PSN: 5}, Payload: []byte{1, 2, 3, 4}}
	pkt, _ := good.Append(nil)
	ip := roce.IPHeader{Src: lo, Dst: lo, FlagsFragment: roce.IPv4DF}
	sport := uint16(c.LocalAddr().(*net.UDPAddr).Port)
	roce.Seal(ip, sport, 47911, pkt)
	unknown := append([]byte(nil), pkt...)
	unknown[7] = 0x77
	roce.Seal(ip, sport, 47911, unknown)
	bad := append([]byte(nil), pkt...)
	bad[len(bad)-1] ^= 1
	for _, d := range [][]byte{pkt, unknown, bad, pkt[:10], {0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, make([]byte, 9000)} {
		if _, err := c.WriteToUDPAddrPort(d, b.LocalAddr()); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { x := b.Counters(); return x.RxDatagrams-before.RxDatagrams == 6 && settled(x) })
	got := b.Counters()
	if got.RxDelivered-before.RxDelivered != 0 || got.RxWrongPeer-before.RxWrongPeer != 1 || got.RxUnknownQP-before.RxUnknownQP != 1 || got.RxICRC-before.RxICRC != 1 ||
		got.RxMalformed-before.RxMalformed != 2 || got.RxTruncated-before.RxTruncated != 1 {
		t.Fatalf("counters before %+v after %+v", before, got)
	}
	if x.qp.Err() || y.qp.Err() {
		t.Fatal("a QP is in the error state")
	}
	if err := a.RemoveQP(0x101); err != nil {
		t.Fatal(err)
	}
	if err := a.RemoveQP(0x101); !errors.Is(err, ErrQPN) {
		t.Fatalf("second RemoveQP: %v", err)
	}
	t.Logf("a: %s", fmtCounters(x))
}

func TestListenRefuses(t *testing.T) {
	for _, a := range []netip.Addr{{}, netip.IPv4Unspecified(), netip.IPv6Unspecified()} {
		if _, err := Listen(Config{Addr: a}); !errors.Is(err, ErrConfig) {
			t.Errorf("Listen(%v): %v, want ErrConfig", a, err)
		}
	}
	e := listen(t, Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: 47912})
	h := &nopHost{}
	if _, err := e.NewQP(rc.Config{QPN: 1, PMTU: 1024}, netip.MustParseAddrPort("[::1]:4791"), h); !errors.Is(err, ErrConfig) {
		t.Fatalf("IPv6 peer on an IPv4 endpoint: %v", err)
	}
	if _, err := e.NewQP(rc.Config{QPN: 1, PMTU: 1024}, netip.MustParseAddrPort("127.0.0.2:4791"), h); err != nil {
		t.Fatal(err)
	}
	if _, err := e.NewQP(rc.Config{QPN: 1, PMTU: 1024}, netip.MustParseAddrPort("127.0.0.2:4791"), h); !errors.Is(err, ErrQPN) {
		t.Fatalf("QPN twice: %v", err)
	}
	e.Close()
	if _, err := e.NewQP(rc.Config{QPN: 2, PMTU: 1024}, netip.MustParseAddrPort("127.0.0.2:4791"), h); !errors.Is(err, ErrClosed) {
		t.Fatalf("NewQP after Close: %v", err)
	}
}

type nopHost struct{}

func (nopHost) Resolve(uint32, uint64, uint32, rc.Access) (rc.Region, bool) { return nil, false }
func (nopHost) TakeRecv() (rc.Recv, bool)                                   { return rc.Recv{}, false }
func (nopHost) RecvDone(rc.RecvCompletion)                                  {}
func (nopHost) Invalidate(uint32, bool) bool                                { return false }
func (nopHost) SendDone(rc.Completion)                                      {}
