package spray

import (
	"context"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
	"github.com/vrdma/vrdma/internal/impair"
)

// What the benchmarks move, and how: the same WRITEs for every QP, and
// the same number of packets allowed in flight.
const (
	benchSize   = 16 << 20 // bytes per op
	benchMsg    = 65536    // bytes per WRITE
	benchWindow = 1024     // spray's Window and rc's Window alike
)

// benchHop is the hop of the benchmarks: its queues (each lane's and the
// TUNs' in front of it) hold more than a whole window, so that the hop
// loses nothing but what its Rule says, whichever QP fills it.
var benchHop = impair.Config{Seed: 16, QueueLen: 2 * benchWindow}

func benchWRs() []rc.SendWR {
	src := random(benchSize, 31)
	var wrs []rc.SendWR
	for i := range benchSize / benchMsg {
		wrs = append(wrs, rc.SendWR{ID: uint64(i), Opcode: rc.WRRDMAWrite, Length: benchMsg,
			RemoteAddr: testMRAddr + uint64(i*benchMsg), RKey: testRKey, Local: rctest.Buf(src[i*benchMsg : (i+1)*benchMsg])})
	}
	return wrs
}

// benchRun posts wrs from s and waits for their completions.
func benchRun(b *testing.B, s *side, wrs []rc.SendWR) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t0 := time.Now()
	postAll(ctx, b, s, wrs)
	return time.Since(t0)
}

// BenchmarkSprayLoss compares, between namespaces, the WRITE goodput of a
// QP sprayed over four paths, one of which loses 1% of its packets each
// way, with a plain RC QP (go-back-N) on that lossy path alone, in the
// same run: spray-MB/s, rc-MB/s and their ratio. Both QPs move the same
// WRITEs with the same window (benchWindow), each warmed up once first;
// the hop drops only by its Rule (benchHop). It asserts nothing about
// timing.
//
// The spray QP is bound by what the hop forwards (CPU: a TUN read and
// write per packet), go-back-N by its recovery (retransmit timeouts), so
// the ratio depends on how busy the machine is. Each round therefore also
// runs the spray QP with path 0 clean: spray-clean-MB/s is the ceiling of
// that moment, spray-loss/clean what the loss costs spray (1: nothing),
// and bound = spray-clean/rc the ratio that ceiling allows.
// BenchmarkSprayCeiling measures the ceilings alone.
func BenchmarkSprayLoss(b *testing.B) {
	_, h, a, bb := multipathHop(b, 4, &benchHop)
	if err := h.SetRule(0, impair.Rule{Loss: 0.01}); err != nil {
		b.Fatal(err)
	}
	rcc := testRC
	rcc.Window = benchWindow
	cfg := Config{Paths: 4, Window: benchWindow}
	x, _ := connect(b, a, bb, &cfg, &cfg, rcc, benchSize)
	// The baseline: plain RC QPs on path 0 only (QPNs of their own).
	h0, _ := newHost(benchSize)
	h1, _ := newHost(benchSize)
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
		if err := c.Start(rcc); err != nil {
			b.Fatal(err)
		}
	}
	plain := &side{conn: p, eps: a, host: h0}
	wrs := benchWRs()
	benchRun(b, x, wrs) // negotiation and warm-up
	benchRun(b, plain, wrs)
	sc0, pc0 := x.spray.Counters(), p.Counters()
	b.SetBytes(benchSize)
	b.ResetTimer()
	clean := func(loss float64) {
		if err := h.SetRule(0, impair.Rule{Loss: loss}); err != nil {
			b.Fatal(err)
		}
	}
	var ts, tr, tc time.Duration
	var cleanRetx uint64
	for range b.N {
		ts += benchRun(b, x, wrs)
		b.StopTimer()
		tr += benchRun(b, plain, wrs)
		clean(0)
		r0 := x.spray.Counters().Retransmits
		tc += benchRun(b, x, wrs)
		cleanRetx += x.spray.Counters().Retransmits - r0
		clean(0.01)
		b.StartTimer()
	}
	b.StopTimer()
	mbs := func(d time.Duration) float64 { return float64(benchSize) * float64(b.N) / d.Seconds() / 1e6 }
	sc, pc := x.spray.Counters(), p.Counters()
	b.ReportMetric(mbs(ts), "spray-MB/s")
	b.ReportMetric(mbs(tr), "rc-MB/s")
	b.ReportMetric(mbs(ts)/mbs(tr), "spray/rc")
	b.ReportMetric(mbs(tc), "spray-clean-MB/s")
	b.ReportMetric(mbs(ts)/mbs(tc), "spray-loss/clean")
	b.ReportMetric(mbs(tc)/mbs(tr), "bound")
	b.ReportMetric(float64(sc.Retransmits-sc0.Retransmits-cleanRetx)/float64(b.N), "spray-retx/op")
	b.ReportMetric(float64(pc.Retransmits-pc0.Retransmits)/float64(b.N), "rc-retx/op")
	b.ReportMetric(float64(pc.Timeouts-pc0.Timeouts)/float64(b.N), "rc-timeouts/op")
}

// BenchmarkSprayCeiling measures what the paths carry without loss, the
// bound of BenchmarkSprayLoss: a QP sprayed over four clean paths and a
// plain RC QP over one, through the user-space hop ("hop") and through
// M's kernel forwarding alone ("kernel"), same WRITEs and window as
// BenchmarkSprayLoss.
func BenchmarkSprayCeiling(b *testing.B) {
	for _, net := range []string{"hop", "kernel"} {
		for _, qp := range []string{"spray4", "rc1"} {
			b.Run(qp+"/"+net, func(b *testing.B) {
				var hc *impair.Config
				if net == "hop" {
					hc = &benchHop
				}
				_, _, a, bb := multipathHop(b, 4, hc)
				rcc := testRC
				rcc.Window = benchWindow
				var x *side
				if qp == "spray4" {
					cfg := Config{Paths: 4, Window: benchWindow}
					x, _ = connect(b, a, bb, &cfg, &cfg, rcc, benchSize)
				} else {
					x, _ = connect(b, a[:1], bb[:1], nil, nil, rcc, benchSize)
				}
				wrs := benchWRs()
				benchRun(b, x, wrs)
				b.SetBytes(benchSize)
				b.ResetTimer()
				for range b.N {
					benchRun(b, x, wrs)
				}
			})
		}
	}
}
