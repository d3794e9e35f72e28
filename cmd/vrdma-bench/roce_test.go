package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/internal/pftexchange"
	"github.com/vrdma/vrdma/internal/roceinterop"
	"github.com/vrdma/vrdma/vmm/guestvm"
)

// newRoceLabT is newRoceLab for a test: it skips (or, under CI, fails)
// where no network namespaces can be made, and removes the lab at the end.
func newRoceLabT(tb testing.TB) *roceLab {
	tb.Helper()
	netlab.Require(tb)
	l, err := newRoceLab()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(l.close)
	return l
}

// BenchmarkRoCEWrite64K is the roce section's goodput figure as a Go
// benchmark, for profiling the data path in place (go test -run '^$'
// -bench RoCE -cpuprofile cpu.out ./cmd/vrdma-bench; needs root): one QP,
// 64 KiB WRITEs, 128 in flight, between devices whose endpoints are in two
// namespaces joined by a veth. rc-write streams them; udp-blast is the
// baseline on the same veth, reported as payload bytes received.
func BenchmarkRoCEWrite64K(b *testing.B) {
	l := newRoceLabT(b)
	for _, wait := range []clientWait{waitSleep, waitYield, waitSpin} {
		b.Run("rc-write-"+wait.String(), func(b *testing.B) { benchRoCEWrite(b, l, wait, false) })
	}
	// The IPv6 row: the endpoints send GSO super-datagrams and receive
	// with GRO (the section's target row).
	b.Run("rc-write6-sleep", func(b *testing.B) { benchRoCEWrite(b, l, waitSleep, true) })
	for _, v6 := range []bool{false, true} {
		family := ""
		if v6 {
			family = "6"
		}
		for _, gso := range []bool{false, true} {
			name := "udp-blast" + family
			if gso {
				name += "-gso"
			}
			b.Run(name, func(b *testing.B) { benchBlast(b, l, v6, gso) })
		}
	}
}

// benchBlast is a raw UDP blast on the lab's veth (IPv4 or IPv6, sendmmsg
// or UDP_SEGMENT), reported as payload received.
func benchBlast(b *testing.B, l *roceLab, v6, gso bool) {
	addrs := roceAddrs
	if v6 {
		addrs = roceAddrs6
	}
	u, err := openRawUDPOn(l, addrs)
	if err != nil {
		b.Fatal(err)
	}
	defer u.close()
	if err := firstPing(u); err != nil { // the neighbour entries
		b.Fatal(err)
	}
	b.ResetTimer()
	d := time.Duration(b.N) * 100 * time.Microsecond
	blast := u.blast
	if gso {
		blast = u.blastGSO
	}
	g, err := blast(d)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(g, "Gbit/s-payload")
}

func benchRoCEWrite(b *testing.B, l *roceLab, wait clientWait, v6 bool) {
	open := openRoceClient
	if v6 {
		open = openRoceClient6
		// One round trip first, as roceMeasure6: the QP's first burst
		// must not wait in (or overflow) a neighbour queue.
		u, err := openRawUDPOn(l, roceAddrs6)
		if err != nil {
			b.Fatal(err)
		}
		err = firstPing(u)
		u.close()
		if err != nil {
			b.Fatal(err)
		}
	}
	c, err := open(l, roceTxDepth, roceTxDepth*roceSize)
	if err != nil {
		b.Fatal(err)
	}
	defer c.close()
	c.wait = wait
	c.setSize(roceSize)
	// Past slow start and, over IPv6, neighbour discovery.
	if _, _, err := c.stream(roceWarmup); err != nil {
		b.Fatal(err)
	}
	a0, b0 := l.counters(0, v6), l.counters(1, v6)
	b.SetBytes(roceSize)
	b.ReportAllocs()
	b.ResetTimer()
	var posted uint64
	for posted < uint64(b.N) {
		// stream ends at a time, not a count: post in slices of
		// about a millisecond's worth.
		n, _, err := c.stream(time.Millisecond)
		if err != nil {
			b.Fatal(err)
		}
		posted += n
	}
	a1, b1 := l.counters(0, v6), l.counters(1, v6)
	b.ReportMetric(float64(a1.TxDatagrams-a0.TxDatagrams)/float64(posted), "datagrams/op")
	b.ReportMetric(float64(a1.TxDatagrams-a0.TxDatagrams)/float64(max(1, a1.TxCalls-a0.TxCalls)), "datagrams/sendmmsg")
	if v6 {
		b.ReportMetric(float64(a1.TxDatagrams-a0.TxDatagrams)/float64(max(1, a1.TxGSO-a0.TxGSO)), "datagrams/gso")
		b.ReportMetric(float64(b1.RxDatagrams-b0.RxDatagrams)/float64(max(1, b1.RxCalls-b0.RxCalls)), "datagrams/recvmmsg")
		b.ReportMetric(float64(b1.RxDatagrams-b0.RxDatagrams)/float64(max(1, b1.RxGRO-b0.RxGRO)), "datagrams/gro")
	}
}

// TestRoCESection runs the section once, briefly: its rows are measured
// over the network (the endpoints' counters show the QP's datagrams; the
// sprayed QP used every path, the single-path QP only the lossy one), the
// loss picture has its points, and the labs leave nothing behind.
func TestRoCESection(t *testing.T) {
	netlab.Require(t)
	s := settings{rowTime: 50 * time.Millisecond, repeats: 1, quick: true}
	sec, loss, err := roceSection(s, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// The veth's six rows, the spray row, and the rxe row where QEMU
	// and bin/rxe are found from the working directory (not from a
	// package's: then a note says so).
	if len(sec.rows) < 7 || len(sec.rows) > 8 {
		t.Fatalf("got %d rows, want 7 or 8: %+v", len(sec.rows), sec.rows)
	}
	if r := sec.rows[2]; !strings.Contains(r.name, "IPv6, GSO") || r.met == nil {
		t.Errorf("row 3 is %q (target met %v), want the IPv6 GSO row with its target", r.name, r.met)
	}
	if r := sec.rows[6]; !strings.Contains(r.name, "sprayed") || r.met == nil {
		t.Errorf("row 7 is %q (target met %v), want the spray row with its target", r.name, r.met)
	}
	if want := len(sprayLossRates(s.quick)); len(loss) != want {
		t.Errorf("got %d points of the loss picture, want %d: %+v", len(loss), want, loss)
	}
	for _, p := range loss {
		if p.spray <= 0 || p.plain <= 0 {
			t.Errorf("loss %v: sprayed %v, single-path %v Gbit/s: want both measured", p.loss, p.spray, p.plain)
		}
	}
	for _, r := range sec.rows {
		if r.figure <= 0 || r.baseline <= 0 {
			t.Errorf("row %q: figure %v, baseline %v: want both measured", r.name, r.figure, r.baseline)
		}
	}
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), fmt.Sprintf("%s-%d-", roceLabPrefix, os.Getpid())) {
			t.Errorf("namespace %s left behind", e.Name())
		}
	}
}

// BenchmarkRoCEWriteLatency is the roce section's latency figure: 64 B
// WRITEs one at a time, reported as p50 and p99, for each way the client
// can wait (the section's row busy-polls), beside the UDP ping-pong.
func BenchmarkRoCEWriteLatency(b *testing.B) {
	l := newRoceLabT(b)
	report := func(b *testing.B, lat []time.Duration) {
		slices.Sort(lat)
		b.ReportMetric(us(percentile(lat, 50)), "µs-p50")
		b.ReportMetric(us(percentile(lat, 99)), "µs-p99")
	}
	for _, wait := range []clientWait{waitSpin, waitYield} {
		b.Run("rc-write-"+wait.String(), func(b *testing.B) {
			c, err := openRoceClient(l, 1, roceTxDepth*roceSize)
			if err != nil {
				b.Fatal(err)
			}
			defer c.close()
			c.wait = wait
			c.setSize(roceLatSize)
			b.ResetTimer()
			lat, err := c.latency(time.Hour, max(b.N, 100))
			if err != nil {
				b.Fatal(err)
			}
			report(b, lat)
		})
	}
	b.Run("udp-ping-pong", func(b *testing.B) {
		u, err := openRawUDP(l)
		if err != nil {
			b.Fatal(err)
		}
		defer u.close()
		b.ResetTimer()
		lat, err := u.pingPong(time.Hour, max(b.N, 100))
		if err != nil {
			b.Fatal(err)
		}
		report(b, lat)
	})
}

// TestLossChart: both series of the goodput-against-loss picture are drawn.
func TestLossChart(t *testing.T) {
	pts := []lossPoint{{0, 1.2, 1.4}, {0.001, 1.1, 0.9}, {0.01, 1, 0.1}, {0.05, 1.1, 0.01}}
	p := filepath.Join(t.TempDir(), lossPNG)
	if err := writePNG(p, drawLossChart(pts)); err != nil {
		t.Fatal(err)
	}
	img := readChart(t, p)
	for _, c := range []color.RGBA{seriesColor[0], seriesColor[2]} {
		found := false
		for y := 0; y < chartH && !found; y++ {
			for x := 0; x < chartW; x++ {
				r, g, b, _ := img.At(x, y).RGBA()
				if uint8(r>>8) == c.R && uint8(g>>8) == c.G && uint8(b>>8) == c.B {
					found = true
					break
				}
			}
		}
		if !found {
			t.Errorf("colour %v not drawn", c)
		}
	}
	for _, tc := range []struct {
		p    float64
		want string
	}{{0, "0"}, {0.001, "0.1"}, {0.005, "0.5"}, {0.01, "1"}, {0.05, "5"}} {
		if got := lossLabel(tc.p); got != tc.want {
			t.Errorf("lossLabel(%v) = %q, want %q", tc.p, got, tc.want)
		}
	}
}

// TestRxeGbits: a pairing's results count only when there is one
// write_bw result with a rate per job.
func TestRxeGbits(t *testing.T) {
	job := roceinterop.Job{Op: pftexchange.WriteBW, Size: rxeSize, Iters: 32}
	ok := guestvm.Result{Op: "write_bw", Size: rxeSize, Iters: 32, GBytesPerS: 0.03}
	for _, tc := range []struct {
		name string
		rs   []guestvm.Result
		n    int
		want []float64
	}{
		{"two jobs", []guestvm.Result{ok, ok}, 2, []float64{0.24, 0.24}},
		{"a result missing", []guestvm.Result{ok}, 2, nil},
		{"another op", []guestvm.Result{{Op: "read_bw", Size: rxeSize, GBytesPerS: 0.03}}, 1, nil},
		{"another size", []guestvm.Result{{Op: "write_bw", Size: 4096, GBytesPerS: 0.03}}, 1, nil},
		{"no rate", []guestvm.Result{{Op: "write_bw", Size: rxeSize}}, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := rxeGbits(tc.rs, job, tc.n)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("got %v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) || math.Abs(got[0]-tc.want[0]) > 1e-9 {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
