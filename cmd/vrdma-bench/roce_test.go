package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/netlab"
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
		b.Run("rc-write-"+wait.String(), func(b *testing.B) { benchRoCEWrite(b, l, wait) })
	}
	b.Run("udp-blast", func(b *testing.B) {
		u, err := openRawUDP(l)
		if err != nil {
			b.Fatal(err)
		}
		defer u.close()
		b.ResetTimer()
		d := time.Duration(b.N) * 100 * time.Microsecond
		g, err := u.blast(d)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(g, "Gbit/s-payload")
	})
}

func benchRoCEWrite(b *testing.B, l *roceLab, wait clientWait) {
	c, err := openRoceClient(l, roceTxDepth, roceTxDepth*roceSize)
	if err != nil {
		b.Fatal(err)
	}
	defer c.close()
	c.wait = wait
	a0 := l.counters(0)
	c.setSize(roceSize)
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
	a1 := l.counters(0)
	b.ReportMetric(float64(a1.TxDatagrams-a0.TxDatagrams)/float64(posted), "datagrams/op")
	b.ReportMetric(float64(a1.TxDatagrams-a0.TxDatagrams)/float64(max(1, a1.TxCalls-a0.TxCalls)), "datagrams/sendmmsg")
}

// TestRoCESection runs the section once, briefly: its rows are measured
// over the network (the endpoints' counters show the QP's datagrams) and
// the lab leaves nothing behind.
func TestRoCESection(t *testing.T) {
	netlab.Require(t)
	s := settings{rowTime: 50 * time.Millisecond, repeats: 1}
	sec, err := roceSection(s, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(sec.rows) != 4 {
		t.Fatalf("got %d rows, want 4: %+v", len(sec.rows), sec.rows)
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
