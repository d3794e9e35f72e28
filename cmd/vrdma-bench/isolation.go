package main

// The isolation section (issue 14, item 2): a victim pair's 64 B WRITE
// latency alone and while a neighbour pair of the same daemon floods the
// engine, with 64 B WRITEs or with 4 MiB READs.

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

const (
	isoReadSize  = 4 << 20 // the READ flood's message size
	isoReadSlots = 16      // buffers of isoReadSize per side of the neighbour
	isoVictimBuf = 64 << 10
	isoP99Bound  = 3 // the victim's p99 beside a flood over alone, at most (issue 14)
)

// flood is what the neighbour does while the victim is measured.
type flood struct {
	name string
	op   int
	size uint64
}

var floods = []flood{
	{"a 64 B WRITE flood", abi.WROpRDMAWrite, 64},
	{"a 4 MiB READ flood", abi.WROpRDMARead, isoReadSize},
}

// latStats are a victim's latencies in µs and the neighbour's rate while
// they were taken (operations/s, bytes/s), medians over the repeats.
type latStats struct {
	p50, p99   float64
	ops, bytes float64
}

// victimLatency measures v's 64 B WRITE latency for d; with f, while the
// neighbour nb keeps f's operations in flight all the time.
func victimLatency(v, nb *pair, f *flood, d time.Duration) (p50, p99, ops, bytes float64, err error) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	var n uint64
	var took time.Duration
	var ferr error
	if f != nil {
		nb.setSize(f.size)
		started := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			n, took, ferr = nb.streamWhile(f.op, func() bool {
				if first {
					close(started)
					first = false
				}
				return !stop.Load()
			})
			if first {
				close(started)
			}
		}()
		<-started
	}
	lat, err := v.latency(abi.WROpRDMAWrite, d, 200000)
	stop.Store(true)
	wg.Wait()
	if err == nil && ferr != nil {
		err = fmt.Errorf("%s: %w", f.name, ferr)
	}
	if err != nil {
		return 0, 0, 0, 0, err
	}
	slices.Sort(lat)
	if took > 0 {
		ops = float64(n) / took.Seconds()
		bytes = ops * float64(f.size)
	}
	return us(percentile(lat, 50)), us(percentile(lat, 99)), ops, bytes, nil
}

// isolationSection measures a victim pair's latency alone and beside each
// flood, alternating within each repeat so that the machine's load moves
// both alike.
func isolationSection(s settings) (section, error) {
	sec := section{title: "Isolation: a victim's 64 B WRITE latency beside a flooding neighbour",
		intro: fmt.Sprintf("Two pairs of devices in one daemon: the victim posts one 64 B WRITE at a time and "+
			"times it from post to its completion (as the latency section); the neighbour keeps 64 operations in "+
			"flight all the time, either 64 B WRITEs (the most work requests per second) or 4 MiB READs (%d "+
			"buffers a side; the most bytes per work request). %s; %s Baseline: the victim alone, measured in "+
			"the same repeat just before. Target (issue 14): p99 beside a flood ≤ %d× p99 alone.",
			isoReadSlots, capitalize(engineDesc()), clientYieldShort, isoP99Bound)}
	r, err := newRig(mmPin(false))
	if err != nil {
		return sec, err
	}
	defer r.close()
	v, err := openPair(r, isoVictimBuf)
	if err != nil {
		return sec, fmt.Errorf("victim: %w", err)
	}
	defer v.close()
	nb, err := openPair(r, isoReadSlots*isoReadSize)
	if err != nil {
		return sec, fmt.Errorf("neighbour: %w", err)
	}
	defer nb.close()
	v.yield, nb.yield = !s.spin, !s.spin
	v.setSize(64)

	alone := make([]latStats, 0, s.repeats)
	beside := make([][]latStats, len(floods))
	for range s.repeats {
		p50, p99, _, _, err := victimLatency(v, nb, nil, s.rowTime)
		if err != nil {
			return sec, fmt.Errorf("victim alone: %w", err)
		}
		alone = append(alone, latStats{p50: p50, p99: p99})
		for i := range floods {
			p50, p99, ops, bytes, err := victimLatency(v, nb, &floods[i], s.rowTime)
			if err != nil {
				return sec, fmt.Errorf("victim beside %s: %w", floods[i].name, err)
			}
			beside[i] = append(beside[i], latStats{p50, p99, ops, bytes})
		}
	}
	a := medianStats(alone)
	var rates []string
	for i, f := range floods {
		b := medianStats(beside[i])
		sec.rows = append(sec.rows,
			row{name: "victim p50 beside " + f.name, figure: b.p50, unit: "µs", baseName: "victim alone p50",
				baseline: a.p50, baseUnit: "µs", invRatio: true},
			row{name: "victim p99 beside " + f.name, figure: b.p99, unit: "µs", baseName: "victim alone p99",
				baseline: a.p99, baseUnit: "µs", invRatio: true,
				target: fmt.Sprintf("≤ %d× alone (ratio ≥ %.2f×)", isoP99Bound, 1.0/isoP99Bound),
				met:    boolp(b.p99 <= isoP99Bound*a.p99)})
		rate := fmtNum(b.ops/1e6) + " Mops/s"
		if f.size >= 1<<20 {
			rate = fmtNum(b.bytes/1e9) + " GB/s"
		}
		rates = append(rates, f.name+" "+rate)
	}
	sec.notes = append(sec.notes, "What the neighbour moved while the victim was measured (median of the repeats): "+
		strings.Join(rates, "; ")+".", verdict(sec.rows, isolationMiss))
	return sec, nil
}

// medianStats is the median of each field of xs.
func medianStats(xs []latStats) latStats {
	field := func(get func(latStats) float64) float64 {
		v := make([]float64, len(xs))
		for i, x := range xs {
			v[i] = get(x)
		}
		return median(v)
	}
	return latStats{
		p50:   field(func(x latStats) float64 { return x.p50 }),
		p99:   field(func(x latStats) float64 { return x.p99 }),
		ops:   field(func(x latStats) float64 { return x.ops }),
		bytes: field(func(x latStats) float64 { return x.bytes }),
	}
}

// capitalize upper-cases s's first letter (ASCII).
func capitalize(s string) string {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}

const clientYieldShort = "both clients yield the processor when a poll of their CQs finds nothing, as a guest's " +
	"vCPU is time-sliced (see the scaling section)."

const isolationMiss = "A p99 beside a flood above the bound means the victim's doorbell queue waited behind the " +
	"neighbour's (its turn in the engine comes after the neighbour's visit, whose length the engine's per-visit " +
	"budget bounds) or the victim's client waited for a core behind the neighbour's client and the engine; with a " +
	"p99 alone of a few microseconds, a single scheduler slice of other load on the machine (the load average above) " +
	"is enough to miss. Run the section alone to see which: `vrdma-bench --only iso --trace FILE`."
