package impair

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/netlab"
)

// labHop builds a MultiPath of paths paths with a hop interposed; both go
// at cleanup (the hop first).
func labHop(t testing.TB, paths int, cfg Config) (*netlab.MultiPath, *Hop) {
	t.Helper()
	l := netlab.NewT(t)
	mp, err := l.NewMultiPath(paths)
	if err != nil {
		t.Fatal(err)
	}
	h, err := Interpose(mp, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("hop close: %v", err)
		}
	})
	return mp, h
}

// arrival is one datagram B received.
type arrival struct {
	seq     uint32
	from    netip.AddrPort
	transit time.Duration // one way, from the timestamp in the payload
}

// stream sends n datagrams of size bytes from src in a to dst in b, never
// more than window of them unaccounted for (neither received nor counted
// by gone, the hop's drops), and returns what arrived once every packet is
// accounted for (or the deadline passed: then it fails t).
func stream(t testing.TB, a, b *netlab.NS, src, dst netip.Addr, n, size, window int,
	gone func() uint64) []arrival {
	t.Helper()
	rx, err := b.ListenUDP(netip.AddrPortFrom(dst, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	rx.SetReadBuffer(4 << 20)
	tx, err := a.ListenUDP(netip.AddrPortFrom(src, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	to := rx.LocalAddr().(*net.UDPAddr).AddrPort()

	var mu sync.Mutex
	var got []arrival // protected by mu
	received := func() int { mu.Lock(); defer mu.Unlock(); return len(got) }
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			select {
			case <-stop:
				return
			default:
			}
			rx.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			m, from, err := rx.ReadFromUDPAddrPort(buf)
			if err != nil {
				continue // a timeout; stop is checked above
			}
			now := time.Since(epoch)
			seq, sent := parsePayload(buf[:m])
			mu.Lock()
			got = append(got, arrival{seq: seq, from: from, transit: now - sent})
			mu.Unlock()
		}
	}()
	var once sync.Once
	finish := func() { once.Do(func() { close(stop); <-done }) }
	defer finish()

	deadline := time.Now().Add(60 * time.Second)
	accounted := func() uint64 { return uint64(received()) + gone() }
	for seq := range n {
		for acc := accounted(); acc < uint64(seq) && uint64(seq)-acc >= uint64(window); acc = accounted() {
			if time.Now().After(deadline) {
				t.Fatalf("stalled after %d sent: %d received, %d dropped", seq, received(), gone())
			}
			time.Sleep(50 * time.Microsecond)
		}
		if _, err := tx.WriteToUDPAddrPort(payload(uint32(seq), size), to); err != nil {
			t.Fatalf("send %d: %v", seq, err)
		}
	}
	for accounted() < uint64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("%d sent, %d received, %d dropped after 60 s", n, received(), gone())
		}
		time.Sleep(time.Millisecond)
	}
	finish()
	mu.Lock()
	defer mu.Unlock()
	return got
}

func TestHopForwardsEachPathWithAddresses(t *testing.T) {
	mp, h := labHop(t, 3, Config{Seed: 1})
	for _, p := range mp.Paths {
		for _, fam := range []struct {
			name     string
			src, dst netip.Addr
		}{{"v4", p.A, p.B}, {"v6", p.A6, p.B6}} {
			t.Run(fmt.Sprintf("path%d/%s", p.Index, fam.name), func(t *testing.T) {
				before, beforeAB := h.Counters(p.Index), h.CountersDir(p.Index, AtoB)
				got := stream(t, mp.A, mp.B, fam.src, fam.dst, 10, 100, 10, func() uint64 { return 0 })
				for _, a := range got {
					if a.from.Addr() != fam.src {
						t.Errorf("B saw source %s, want %s", a.from.Addr(), fam.src)
					}
				}
				back := stream(t, mp.B, mp.A, fam.dst, fam.src, 10, 100, 10, func() uint64 { return 0 })
				for _, a := range back {
					if a.from.Addr() != fam.dst {
						t.Errorf("A saw source %s, want %s", a.from.Addr(), fam.dst)
					}
				}
				after := h.Counters(p.Index)
				if d := after.Forwarded - before.Forwarded; d != 20 {
					t.Errorf("path %d forwarded %d packets, want 20 (through the hop)", p.Index, d)
				}
				if ab := h.CountersDir(p.Index, AtoB).Forwarded - beforeAB.Forwarded; ab != 10 {
					t.Errorf("A->B forwarded %d, want 10", ab)
				}
			})
		}
	}
	for i := range mp.Paths {
		balance(t, h.Counters(i))
	}
}

func TestHopLoss(t *testing.T) {
	const n, p = 10000, 0.1
	mp, h := labHop(t, 2, Config{Seed: 42})
	path := mp.Paths[1]
	if err := h.SetRuleDir(1, AtoB, Rule{Loss: p}); err != nil {
		t.Fatal(err)
	}
	got := stream(t, mp.A, mp.B, path.A, path.B, n, 64, 64,
		func() uint64 { return h.CountersDir(1, AtoB).DroppedLoss })
	c := h.CountersDir(1, AtoB)
	balance(t, c)
	lost := n - len(got)
	if c.DroppedLoss != uint64(lost) {
		t.Errorf("dropped_loss %d, want sent - received = %d", c.DroppedLoss, lost)
	}
	if c.Received != n || c.QueueFull != 0 {
		t.Errorf("counters %+v, want received %d and no queue_full", c, n)
	}
	if math.Abs(float64(lost)-n*p) > lossBound(n, p) {
		t.Errorf("lost %d of %d at %v, want within %.0f of %.0f", lost, n, p, lossBound(n, p), n*p)
	}
	t.Logf("lost %d of %d at p=%v (expected %.0f ± %.0f at 6σ)", lost, n, p, n*p, lossBound(n, p))
	if other := h.Counters(0); other.DroppedLoss != 0 {
		t.Errorf("path 0 counters %+v, want no loss", other)
	}
}

func TestHopDelayLowerBound(t *testing.T) {
	const delay, jitter, n = 30 * time.Millisecond, 10 * time.Millisecond, 100
	mp, h := labHop(t, 1, Config{Seed: 5})
	p := mp.Paths[0]
	if err := h.SetRuleDir(0, AtoB, Rule{Delay: delay, Jitter: jitter}); err != nil {
		t.Fatal(err)
	}
	got := stream(t, mp.A, mp.B, p.A, p.B, n, 64, 20, func() uint64 { return 0 })
	if len(got) != n {
		t.Fatalf("got %d packets, want %d", len(got), n)
	}
	shortest := time.Duration(math.MaxInt64)
	for _, a := range got {
		shortest = min(shortest, a.transit)
	}
	if shortest < delay {
		t.Errorf("shortest one-way time %v, want at least %v", shortest, delay)
	}
	c := h.CountersDir(0, AtoB)
	if c.Delayed != n {
		t.Errorf("counters %+v, want delayed %d", c, n)
	}
	t.Logf("shortest one-way time %v with delay %v + jitter ≤ %v", shortest, delay, jitter)
}

func TestHopReorderDeliversAll(t *testing.T) {
	const n = 2000
	mp, h := labHop(t, 1, Config{Seed: 9, ReorderTimeout: 20 * time.Millisecond})
	p := mp.Paths[0]
	if err := h.SetRuleDir(0, AtoB, Rule{ReorderProb: 0.1, ReorderAfter: 3}); err != nil {
		t.Fatal(err)
	}
	got := stream(t, mp.A, mp.B, p.A, p.B, n, 64, 64, func() uint64 { return 0 })
	var seqs []uint32
	for _, a := range got {
		seqs = append(seqs, a.seq)
	}
	if !allOnce(seqs, n) {
		t.Fatalf("got %d packets, want each of the %d once", len(seqs), n)
	}
	c := h.CountersDir(0, AtoB)
	inv := inversions(seqs)
	if inv == 0 || c.Reordered == 0 {
		t.Errorf("%d inversions, counters %+v: want packets out of order", inv, c)
	}
	balance(t, c)
	t.Logf("%d packets, %d held back, %d arrived after a later one", n, c.Reordered, inv)
}

func TestHopDownDropsAllUpRestores(t *testing.T) {
	const n = 200
	mp, h := labHop(t, 2, Config{Seed: 2})
	p := mp.Paths[0]
	if err := h.SetRule(0, Rule{Down: true}); err != nil {
		t.Fatal(err)
	}
	got := stream(t, mp.A, mp.B, p.A, p.B, n, 64, 32,
		func() uint64 { return h.CountersDir(0, AtoB).DroppedDown })
	if len(got) != 0 {
		t.Errorf("received %d packets over a path that is down", len(got))
	}
	if c := h.CountersDir(0, AtoB); c.DroppedDown != n || c.Forwarded != 0 {
		t.Errorf("counters %+v, want dropped_down %d, nothing forwarded", c, n)
	}
	// The other path works meanwhile.
	q := mp.Paths[1]
	if got := stream(t, mp.A, mp.B, q.A, q.B, n, 64, 32, func() uint64 { return 0 }); len(got) != n {
		t.Errorf("path 1 delivered %d of %d while path 0 was down", len(got), n)
	}
	if err := h.SetRule(0, Rule{}); err != nil {
		t.Fatal(err)
	}
	if got := stream(t, mp.A, mp.B, p.A, p.B, n, 64, 32, func() uint64 { return 0 }); len(got) != n {
		t.Errorf("path 0 delivered %d of %d after coming back up", len(got), n)
	}
	balance(t, h.CountersDir(0, AtoB))
}

func TestHopTUNsGoWithTheHop(t *testing.T) {
	mp, h := labHop(t, 2, Config{})
	for _, name := range []string{"hopa0", "hopb0", "hopa1", "hopb1"} {
		if _, err := mp.M.IP("link", "show", "dev", name); err != nil {
			t.Fatalf("TUN %s: %v", name, err)
		}
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"hopa0", "hopb0", "hopa1", "hopb1"} {
		if _, err := mp.M.IP("link", "show", "dev", name); err == nil {
			t.Errorf("%s still exists after Close", name)
		} else if !errors.Is(err, netlab.ErrCommand) {
			t.Errorf("ip link show %s: %v", name, err)
		}
	}
	// M forwards in the kernel again.
	p := mp.Paths[1]
	if got := stream(t, mp.A, mp.B, p.A, p.B, 10, 64, 10, func() uint64 { return 0 }); len(got) != 10 {
		t.Errorf("after the hop closed, %d of 10 arrived", len(got))
	}
}

// TestHopTUNQueueFollowsQueueLen: a QueueLen above the kernel's 500 makes
// the TUNs' own queue as long, so that the kernel drops no more in front
// of a reader kept waiting than the lane would; the default leaves it.
func TestHopTUNQueueFollowsQueueLen(t *testing.T) {
	for _, tc := range []struct{ queueLen, want int }{{0, tunQueueLen}, {2048, 2048}} {
		t.Run(fmt.Sprint(tc.queueLen), func(t *testing.T) {
			mp, _ := labHop(t, 1, Config{QueueLen: tc.queueLen})
			for _, name := range []string{"hopa0", "hopb0"} {
				out, err := mp.M.IP("link", "show", "dev", name)
				if err != nil {
					t.Fatal(err)
				}
				if want := fmt.Sprintf(" qlen %d", tc.want); !strings.Contains(out, want) {
					t.Errorf("%s: got %q, want%s", name, out, want)
				}
			}
		})
	}
}

// BenchmarkHopUDP1KiB measures packets per second of 1 KiB UDP datagrams
// from A to B over one path, with at most 256 in flight: through the hop,
// and through M's kernel forwarding as the baseline.
func BenchmarkHopUDP1KiB(b *testing.B) {
	if err := netlab.Available(); os.Getenv("CI") == "" && err != nil {
		b.Skip(err)
	}
	for _, hop := range []bool{true, false} {
		name := "kernel"
		if hop {
			name = "hop"
		}
		b.Run(name, func(b *testing.B) {
			var mp *netlab.MultiPath
			gone := func() uint64 { return 0 }
			if hop {
				var h *Hop
				mp, h = labHop(b, 1, Config{})
				gone = func() uint64 { c := h.CountersDir(0, AtoB); return c.QueueFull + c.WriteErrors }
			} else {
				var err error
				if mp, err = netlab.NewT(b).NewMultiPath(1); err != nil {
					b.Fatal(err)
				}
			}
			p := mp.Paths[0]
			b.SetBytes(1024)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			got := stream(b, mp.A, mp.B, p.A, p.B, b.N, 1024, 256, gone)
			b.ReportMetric(float64(len(got))/time.Since(start).Seconds(), "pkts/s")
			b.ReportMetric(float64(gone()), "drops")
		})
	}
}
