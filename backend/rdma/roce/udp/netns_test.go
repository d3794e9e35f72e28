package udp

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
	"github.com/vrdma/vrdma/internal/impair"
	"github.com/vrdma/vrdma/internal/netlab"
	"golang.org/x/sys/unix"
)

// listenIn binds an endpoint inside namespace ns.
func listenIn(t testing.TB, ns *netlab.NS, cfg Config) *Endpoint {
	t.Helper()
	var e *Endpoint
	if err := ns.Do(func() error {
		var err error
		e, err = Listen(cfg)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestNetnsLossReorder runs the RC protocol between two network
// namespaces over real UDP sockets, through the user-space impairment hop
// (internal/impair) dropping 1% and reordering 2% of the packets in each
// direction, over IPv4 and IPv6: WRITE, READ, SEND and FETCH_ADD, every
// byte verified, each atomic executed once.
func TestNetnsLossReorder(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		name := "ipv4"
		if v6 {
			name = "ipv6"
		}
		t.Run(name, func(t *testing.T) {
			l := netlab.NewT(t)
			mp, err := l.NewMultiPath(1)
			if err != nil {
				t.Fatal(err)
			}
			h, err := impair.Interpose(mp, impair.Config{Seed: 16})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { h.Close() })
			rule := impair.Rule{Loss: 0.01, ReorderProb: 0.02, ReorderAfter: 3}
			if err := h.SetRule(0, rule); err != nil {
				t.Fatal(err)
			}
			p := mp.Paths[0]
			aAddr, bAddr := p.A, p.B
			if v6 {
				aAddr, bAddr = p.A6, p.B6
			}
			a := listenIn(t, mp.A, Config{Addr: aAddr})
			b := listenIn(t, mp.B, Config{Addr: bAddr})
			x, y := connect(t, a, b, rc.Config{PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7}, 8<<20+64)
			start := time.Now()
			done := make(chan struct{})
			go func() {
				defer close(done)
				exercise(t, y, x, 1<<20, 4096, 100)
			}()
			exercise(t, x, y, 8<<20, 65536, 300)
			<-done
			t.Logf("%v; x: %s\ny: %s", time.Since(start), fmtCounters(x), fmtCounters(y))
			c := h.Counters(0)
			if c.DroppedLoss == 0 || c.Reordered == 0 {
				t.Fatalf("the hop neither dropped nor reordered: %+v", c)
			}
			if cx := x.qp.Counters(); cx.Retransmits == 0 {
				t.Fatalf("no retransmission with %d packets dropped: %+v", c.DroppedLoss, cx)
			}
			t.Logf("hop: %+v", c)
		})
	}
}

// TestNetnsHostilePeer sends, from the middle namespace (an address that
// is no QP's peer), forged packets with valid ICRCs to B's QP: counted as
// RxWrongPeer, never delivered; the connection then still works.
func TestNetnsHostilePeer(t *testing.T) {
	l := netlab.NewT(t)
	mp, err := l.NewMultiPath(1)
	if err != nil {
		t.Fatal(err)
	}
	p := mp.Paths[0]
	a := listenIn(t, mp.A, Config{Addr: p.A})
	b := listenIn(t, mp.B, Config{Addr: p.B})
	x, y := connect(t, a, b, rc.Config{PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7}, 1<<20+64)
	c, err := mp.M.ListenUDP(netip.AddrPortFrom(p.MB, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sport := uint16(c.LocalAddr().(*net.UDPAddr).Port)
	for psn := range 1000 {
		f := roce.Packet{BTH: roce.BTH{Opcode: roce.OpWriteOnly, DestQP: y.qp.QPN(), PSN: roce.PSN(0xfffff0 + psn).Add(0)},
			RETH: roce.RETH{VA: testMRAddr, RKey: testRKey, DMALen: 4}, Payload: []byte{0xde, 0xad, 0xbe, 0xef}}
		pkt, err := f.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := roce.Seal(roce.IPHeader{Src: p.MB, Dst: p.B, FlagsFragment: roce.IPv4DF}, sport, roce.UDPPort, pkt); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteToUDPAddrPort(pkt, b.LocalAddr()); err != nil {
			t.Fatal(err)
		}
	}
	// Wait until the receiver is quiet (a socket buffer may drop some of
	// the burst under load): everything it received was refused.
	var last uint64
	waitFor(t, func() bool {
		n := b.Counters().RxDatagrams
		quiet := n == last && n > 0
		last = n
		time.Sleep(100 * time.Millisecond)
		return quiet
	})
	bc := b.Counters()
	if bc.RxWrongPeer != bc.RxDatagrams || bc.RxWrongPeer < 100 || bc.RxDelivered != 0 || y.mr.Copy(0, 4)[0] == 0xde {
		t.Fatalf("forged packets delivered or placed: %+v", bc)
	}
	exercise(t, x, y, 1<<20, 65536, 10)
}

// BenchmarkNetnsGoodput measures one QP's WRITE goodput (64 KiB messages,
// PMTU 1024) between two namespaces through M's kernel forwarding, and as
// the baseline a raw UDP blast of 1040-byte datagrams with sendmmsg over
// the same veths (what arrives, counted at the receiver: Gbit/s-received).
func BenchmarkNetnsGoodput(b *testing.B) {
	l := netlab.NewT(b)
	mp, err := l.NewMultiPath(1)
	if err != nil {
		b.Fatal(err)
	}
	p := mp.Paths[0]
	b.Run("rc-write", func(b *testing.B) {
		a := listenIn(b, mp.A, Config{Addr: p.A})
		bb := listenIn(b, mp.B, Config{Addr: p.B})
		x, y := connect(b, a, bb, rc.Config{PMTU: roce.MTU1024, RetryCnt: 7}, 64<<20)
		_ = y
		src := random(64<<20, 3)
		b.SetBytes(64 << 20)
		b.ResetTimer()
		for range b.N {
			var wrs []rc.SendWR
			for i := range 1024 {
				wrs = append(wrs, rc.SendWR{ID: uint64(i), Opcode: rc.WRRDMAWrite, Length: 65536,
					RemoteAddr: testMRAddr + uint64(i)*65536, RKey: testRKey, Local: rctest.Buf(src[i*65536 : (i+1)*65536])})
			}
			postAllB(b, x, wrs)
		}
		b.ReportMetric(float64(x.qp.Counters().Retransmits)/float64(b.N), "retx/op")
	})
	b.Run("udp-blast", func(b *testing.B) {
		rx, err := mp.B.ListenUDP(netip.AddrPortFrom(p.B, 0))
		if err != nil {
			b.Fatal(err)
		}
		defer rx.Close()
		rx.SetReadBuffer(4 << 20)
		tx, err := mp.A.ListenUDP(netip.AddrPortFrom(p.A, 0))
		if err != nil {
			b.Fatal(err)
		}
		defer tx.Close()
		got := make(chan int, 1)
		go func() {
			buf := make([]byte, 2048)
			n := 0
			for {
				rx.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
				m, _, err := rx.ReadFromUDPAddrPort(buf)
				if err != nil {
					got <- n
					return
				}
				n += m
			}
		}()
		// sendmmsg, 64 datagrams of 1040 bytes (a 1024-byte payload with
		// BTH and ICRC) a call, as the endpoint sends.
		raw, err := tx.SyscallConn()
		if err != nil {
			b.Fatal(err)
		}
		bt := newBatch(64, 2048, 0)
		for i := range 64 {
			bt.setSend(i, 1040, rx.LocalAddr().(*net.UDPAddr).AddrPort())
		}
		b.SetBytes(64 << 20)
		b.ResetTimer()
		start := time.Now()
		for left := b.N * 65536; left > 0; {
			var n int
			var errno unix.Errno
			raw.Write(func(fd uintptr) bool {
				n, errno = mmsg(unix.SYS_SENDMMSG, fd, bt.hdrs[:min(64, left)])
				return errno != unix.EAGAIN
			})
			if errno != 0 {
				b.Fatal(errno)
			}
			left -= n
		}
		n := <-got
		el := time.Since(start) - 200*time.Millisecond
		b.ReportMetric(float64(n)/el.Seconds()*8/1e9, "Gbit/s-received")
	})
}
