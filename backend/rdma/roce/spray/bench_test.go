package spray

import (
	"context"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
	"github.com/vrdma/vrdma/internal/impair"
)

// BenchmarkSprayLoss compares, between namespaces, the WRITE goodput of a
// QP sprayed over four paths, one of which loses 1% of its packets each
// way, with a plain RC QP (go-back-N) on that lossy path alone, in the
// same run: spray-MB/s, rc-MB/s and their ratio. It asserts nothing about
// timing.
func BenchmarkSprayLoss(b *testing.B) {
	_, h, a, bb := multipath(b, 4)
	if err := h.SetRule(0, impair.Rule{Loss: 0.01}); err != nil {
		b.Fatal(err)
	}
	const size, msg = 16 << 20, 65536
	x, _ := connect(b, a, bb, &Config{Paths: 4}, &Config{Paths: 4}, testRC, size)
	// The baseline: plain RC QPs on path 0 only (QPNs of their own).
	rcc := testRC
	h0, _ := newHost(size)
	h1, _ := newHost(size)
	rcc.QPN, rcc.DestQPN = 0x301, 0x302
	p, err := a[0].NewConn(rcc, bb[0].LocalAddr(), h0)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	rcc.QPN, rcc.DestQPN = 0x302, 0x301
	q, err := bb[0].NewConn(rcc, a[0].LocalAddr(), h1)
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	for _, c := range []rc.Conn{p, q} {
		if err := c.Start(testRC); err != nil {
			b.Fatal(err)
		}
	}
	plain := &side{conn: p, eps: a, host: h0}
	src := random(size, 31)
	var wrs []rc.SendWR
	for i := range size / msg {
		wrs = append(wrs, rc.SendWR{ID: uint64(i), Opcode: rc.WRRDMAWrite, Length: msg,
			RemoteAddr: testMRAddr + uint64(i*msg), RKey: testRKey, Local: rctest.Buf(src[i*msg : (i+1)*msg])})
	}
	run := func(s *side) time.Duration {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		t0 := time.Now()
		postAll(ctx, b, s, wrs)
		return time.Since(t0)
	}
	run(x) // negotiation and warm-up
	b.SetBytes(size)
	b.ResetTimer()
	var ts, tr time.Duration
	for range b.N {
		ts += run(x)
		b.StopTimer()
		tr += run(plain)
		b.StartTimer()
	}
	mbs := func(d time.Duration) float64 { return float64(size) * float64(b.N) / d.Seconds() / 1e6 }
	b.ReportMetric(mbs(ts), "spray-MB/s")
	b.ReportMetric(mbs(tr), "rc-MB/s")
	b.ReportMetric(mbs(ts)/mbs(tr), "spray/rc")
	b.ReportMetric(float64(x.spray.Counters().Retransmits)/float64(b.N+1), "spray-retx/op")
	b.ReportMetric(float64(p.Counters().Retransmits)/float64(b.N), "rc-retx/op")
}
