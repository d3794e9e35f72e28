package spray

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/internal/impair"
	"github.com/vrdma/vrdma/internal/netlab"
)

// multipath builds A and B joined by n paths through the impairment hop
// and an endpoint per path address in each (IPv4).
func multipath(t testing.TB, n int) (*netlab.MultiPath, *impair.Hop, []*udp.Endpoint, []*udp.Endpoint) {
	t.Helper()
	return multipathHop(t, n, &impair.Config{Seed: 16})
}

// multipathHop is multipath with the hop's config; nil: no hop, M
// forwards in the kernel (the Hop returned is nil).
func multipathHop(t testing.TB, n int, cfg *impair.Config) (*netlab.MultiPath, *impair.Hop, []*udp.Endpoint, []*udp.Endpoint) {
	t.Helper()
	l := netlab.NewT(t)
	mp, err := l.NewMultiPath(n)
	if err != nil {
		t.Fatal(err)
	}
	var h *impair.Hop
	if cfg != nil {
		if h, err = impair.Interpose(mp, *cfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
	}
	var as, bs []netip.Addr
	for _, p := range mp.Paths {
		as, bs = append(as, p.A), append(bs, p.B)
	}
	return mp, h, listen(t, mp.A, 0, as...), listen(t, mp.B, 0, bs...)
}

var testRC = rc.Config{PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7}

// TestNetnsImpairedPaths sprays over four paths between namespaces: one
// loses 2% (each way), one delays 5 ms, one reorders 5%, one is clean.
// Every verb, every byte verified, both directions at once; every path
// carried traffic, and the lossy one saw retransmissions.
func TestNetnsImpairedPaths(t *testing.T) {
	_, h, a, b := multipath(t, 4)
	rules := []impair.Rule{
		{Loss: 0.02},
		{Delay: 5 * time.Millisecond},
		{ReorderProb: 0.05, ReorderAfter: 4},
		{},
	}
	for i, r := range rules {
		if err := h.SetRule(i, r); err != nil {
			t.Fatal(err)
		}
	}
	x, y := connect(t, a, b, &Config{}, &Config{}, testRC, 8<<20+64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		exercise(t, y, x, 1<<20, 4096, 100, 11)
	}()
	exercise(t, x, y, 8<<20, 65536, 300, 12)
	<-done
	for _, s := range []*side{x, y} {
		if s.spray.Mode() != Sprayed {
			t.Fatalf("mode %v\n%s", s.spray.Mode(), s)
		}
		for i, p := range s.spray.Paths() {
			if p.Sent == 0 || p.Acked == 0 {
				t.Fatalf("path %d unused\n%s", i, s)
			}
		}
	}
	if c := h.Counters(0); c.DroppedLoss == 0 {
		t.Fatalf("the hop dropped nothing: %+v", c)
	}
	if c := h.Counters(2); c.Reordered == 0 {
		t.Fatalf("the hop reordered nothing: %+v", c)
	}
	if x.spray.Counters().Retransmits == 0 || x.spray.Paths()[0].Lost == 0 {
		t.Fatalf("no loss seen on path 0\n%s", x)
	}
	t.Logf("x: %s\ny: %s", x, y)
}

// TestNetnsPathDown takes one of three paths down in the middle of a
// stream of WRITEs: the QP keeps going on the others (no error), the path
// is abandoned, and once it is back it is probed, taken back and carries
// traffic again. Every byte verified.
func TestNetnsPathDown(t *testing.T) {
	mp, _, a, b := multipath(t, 3)
	x, y := connect(t, a, b, &Config{}, &Config{}, testRC, 4<<20)
	const msg = 65536
	src := random(4<<20, 21)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rounds := make(chan int, 1000)
	errc := make(chan error, 1)
	go func() {
		defer close(rounds)
		for r := 0; ctx.Err() == nil; r++ {
			var wrs []rc.SendWR
			for i := range len(src) / msg {
				wrs = append(wrs, rc.SendWR{ID: uint64(i), Opcode: rc.WRRDMAWrite, Length: msg,
					RemoteAddr: testMRAddr + uint64(i*msg), RKey: testRKey, Local: rctest.Buf(src[i*msg : (i+1)*msg])})
			}
			for _, wr := range wrs {
				for {
					err := x.conn.Post(wr)
					if err == nil {
						break
					}
					if err != rc.ErrQueueFull {
						errc <- err
						return
					}
					time.Sleep(100 * time.Microsecond)
				}
			}
			tctx, tcancel := context.WithTimeout(context.Background(), 30*time.Second)
			cs, err := x.host.TakeSends(tctx, len(wrs))
			tcancel()
			if err != nil {
				errc <- err
				return
			}
			for _, c := range cs {
				if c.Status != 0 {
					errc <- &rc.WRError{ID: c.ID, Reason: c.Status.String()}
					return
				}
			}
			rounds <- r
		}
	}()
	wait := func(what string, cond func(p PathStats) bool) {
		t.Helper()
		waitFor(t, what, func() bool {
			select {
			case err := <-errc:
				t.Fatalf("%s: %v\n%s", what, err, x)
			default:
			}
			ps := x.spray.Paths() // nil until the HELLO_ACK (a HELLO may be lost and sent again)
			return len(ps) > 1 && cond(ps[1])
		})
	}
	wait("traffic on path 1", func(p PathStats) bool { return p.Acked > 100 })
	if err := mp.SetPathUp(1, false); err != nil {
		t.Fatal(err)
	}
	wait("path 1 abandoned", func(p PathStats) bool { return !p.Up && p.Downs > 0 })
	down := x.spray.Paths()[1]
	others := x.spray.Paths()[0].Acked
	wait("traffic on path 0 while 1 is down", func(PathStats) bool { return x.spray.Paths()[0].Acked > others+1000 })
	if err := mp.SetPathUp(1, true); err != nil {
		t.Fatal(err)
	}
	wait("path 1 taken back", func(p PathStats) bool { return p.Up && p.Ups > 0 && p.Acked > down.Acked+100 })
	cancel()
	for range rounds {
	}
	select {
	case err := <-errc:
		t.Fatalf("%v\n%s", err, x)
	default:
	}
	if string(y.mr.Copy(0, len(src))) != string(src) {
		t.Fatal("data differs")
	}
	if x.spray.QP().Err() {
		t.Fatal("QP in the error state")
	}
	t.Logf("x: %s", x)
}
