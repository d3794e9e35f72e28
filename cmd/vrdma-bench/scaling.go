package main

// The scaling section (issue 14, item 5): aggregate 64 KiB WRITE bandwidth
// of N device pairs of one daemon streaming at once, against one pair in
// the same run, and how evenly the pairs share it (Jain's fairness index).

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

const (
	scalingSize = 64 << 10 // message size of the scaling section
	// scalingOpeners is how many pairs are opened at once: the daemon
	// answers each device's handshake and control commands on goroutines
	// of its own, so a few in parallel keep both cores busy.
	scalingOpeners = 8
	// spinPairs is the pair count of the row whose clients never yield.
	spinPairs = 4
	// scalingDeviceFds is what a device costs this process with its
	// front-end in it too: the daemon's densityDeviceFds and the
	// front-end's socket, memfd and eventfds (24 measured).
	scalingDeviceFds = 2 * densityDeviceFds
)

// scalingTargets are issue 14's targets: the aggregate at N busy pairs
// against one pair.
var scalingTargets = map[int]float64{2: 0.8, 4: 0.8, 8: 0.8, 128: 0.6}

// fairTarget is the least Jain's index across the pairs (issue 14).
const fairTarget = 0.9

// jain is Jain's fairness index of xs, (Σx)² / (n·Σx²): 1 when every x is
// equal, 1/n when one takes everything. It is 1 for no xs and for all
// zeros (nobody got less than another).
func jain(xs []float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return 1
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// scalePoint is one pair count of the sweep.
type scalePoint struct {
	pairs int
	agg   float64 // aggregate GB/s (median of the repeats)
	one   float64 // one pair alone beside it (median), GB/s
	fair  float64 // Jain's index over the pairs' rates (median)
	min   float64 // the slowest pair's share of the fair share (median)
}

// scalingRound streams 64 KiB WRITEs on every pair of ps at once for d and
// returns the aggregate GB/s and each pair's rate in bytes/s.
func scalingRound(ps []*pair, d time.Duration) (float64, []float64, error) {
	var wg sync.WaitGroup
	rates := make([]float64, len(ps))
	bytes := make([]float64, len(ps))
	errs := make([]error, len(ps))
	start := time.Now()
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ops, took, err := p.stream(abi.WROpRDMAWrite, d)
			bytes[i], errs[i] = float64(ops)*float64(p.size), err
			if took > 0 {
				rates[i] = bytes[i] / took.Seconds()
			}
		}()
	}
	wg.Wait()
	dt := time.Since(start).Seconds()
	if err := errors.Join(errs...); err != nil {
		return 0, nil, err
	}
	var sum float64
	for _, b := range bytes {
		sum += b
	}
	return sum / dt / 1e9, rates, nil
}

// scalingPoint measures the first n pairs of ps, s.repeats times, each
// time right after the first pair alone, its baseline: on a shared machine
// the load drifts over a sweep, and a baseline taken beside each figure
// keeps the ratio honest. yield sets the n pairs' clients, baseYield the
// baseline's; when both are alike, n = 1 is its own baseline.
func scalingPoint(s settings, ps []*pair, n int, yield, baseYield bool) (scalePoint, error) {
	pt := scalePoint{pairs: n}
	setYield := func(y bool) {
		for _, p := range ps[:n] {
			p.yield = y
		}
	}
	defer setYield(!s.spin)
	var aggs, ones, fairs, mins []float64
	for range s.repeats {
		if n > 1 || yield != baseYield {
			setYield(baseYield)
			one, _, err := scalingRound(ps[:1], s.rowTime)
			if err != nil {
				return pt, fmt.Errorf("1 pair: %w", err)
			}
			ones = append(ones, one)
		}
		setYield(yield)
		agg, rates, err := scalingRound(ps[:n], s.rowTime)
		if err != nil {
			return pt, err
		}
		aggs = append(aggs, agg)
		fairs = append(fairs, jain(rates))
		mins = append(mins, minShare(rates))
	}
	pt.agg, pt.fair, pt.min = median(aggs), median(fairs), median(mins)
	pt.one = pt.agg
	if len(ones) > 0 {
		pt.one = median(ones)
	}
	return pt, nil
}

// minShare is the smallest x over the mean of xs (1: nobody below the
// mean; 0: someone got nothing).
func minShare(xs []float64) float64 {
	if len(xs) == 0 {
		return 1
	}
	var sum float64
	lo := xs[0]
	for _, x := range xs {
		sum += x
		lo = min(lo, x)
	}
	if sum == 0 {
		return 1
	}
	return lo / (sum / float64(len(xs)))
}

// devicePairs adds 2n devices to r and returns their sockets, a pair's
// two side by side.
func devicePairs(r *rig, n int) ([][2]string, error) {
	socks := make([][2]string, n)
	for i := range socks {
		for j := range socks[i] {
			var err error
			if socks[i][j], err = r.device(); err != nil {
				return nil, err
			}
		}
	}
	return socks, nil
}

// connectPairs opens and connects a pair on each two sockets,
// scalingOpeners at a time.
func connectPairs(socks [][2]string, bufBytes int) ([]*pair, error) {
	n := len(socks)
	ps := make([]*pair, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(n, scalingOpeners) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				ps[i], errs[i] = connectPair(socks[i][0], socks[i][1], bufBytes)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, p := range ps {
			if p != nil {
				p.close()
			}
		}
		return nil, err
	}
	return ps, nil
}

// openFds counts this process's open descriptors.
func openFds() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

// rigCost is what setting up and tearing down the scaling rig cost.
type rigCost struct {
	devices       int
	open, close   time.Duration
	fdsBefore     int // before the daemon
	fdsListen     int // with every device listening
	fdsOpen       int // with every pair connected
	fdsAfter      int // once the daemon tore every session down
	leak, pinLeak error
}

// scalingSection measures the aggregate at each pair count of s.pairs and
// the fairness between the pairs; the clients yield when a poll finds
// nothing (clientYield), and one row shows clients that never do.
func scalingSection(s settings) (section, []scalePoint, error) {
	maxN := s.pairs[len(s.pairs)-1]
	sec := section{title: "Scaling: aggregate 64 KiB WRITE bandwidth over device pairs",
		intro: fmt.Sprintf("N pairs of devices in one daemon (%d devices at most, one fabric), each pair streaming "+
			"64 KiB WRITEs (64 in flight) from its own client goroutine at once; %s. Baseline: one pair alone, "+
			"measured in each repeat just before the N pairs (so each row has its own, and load that drifts over "+
			"the run moves figure and baseline alike). Jain's fairness index is (Σx)² / (n·Σx²) over the pairs' rates (1: equal shares, 1/n: one "+
			"pair takes all); \"slowest pair\" in the table's note is the slowest pair's rate over the mean. "+
			"Targets (issue 14): the aggregate at 2, 4 and 8 pairs ≥ 0.8× one pair, at 128 ≥ 0.6×; "+
			"Jain's index ≥ %.1f.\n\n%s\n\n![Aggregate 64 KiB WRITE bandwidth against busy pairs](benchmarks-scaling.png)",
			2*maxN, engineDesc(), fairTarget, clientYield)}
	var pts []scalePoint
	if need := openFds() + 2*maxN*scalingDeviceFds + densityFdMargin; uint64(need) > nofileHard() {
		return sec, nil, fmt.Errorf("%d pairs need about %d descriptors in this process, RLIMIT_NOFILE allows %d",
			maxN, need, nofileHard())
	}
	cost := rigCost{devices: 2 * maxN, fdsBefore: openFds()}
	r, err := newRig(mmPin(false))
	if err != nil {
		return sec, nil, err
	}
	rigClosed := false
	defer func() {
		if !rigClosed {
			r.close()
		}
	}()
	t0 := time.Now()
	socks, err := devicePairs(r, maxN)
	if err != nil {
		return sec, nil, err
	}
	cost.fdsListen = openFds()
	ps, err := connectPairs(socks, depth*scalingSize)
	if err != nil {
		return sec, nil, fmt.Errorf("open %d pairs: %w", maxN, err)
	}
	cost.open = time.Since(t0)
	cost.fdsOpen = openFds()
	closed := false
	defer func() {
		if !closed {
			for _, p := range ps {
				p.close()
			}
		}
	}()
	for _, p := range ps {
		p.setSize(scalingSize)
		p.yield = !s.spin
	}
	// Every pair once before any is timed: the one-pair baseline is
	// warm in every repeat (its buffers in the daemon's page tables and
	// the caches), so the pairs it is compared with must be too. Cold,
	// the first round of 128 pairs faulted in 1 GiB of the daemon's
	// mappings and ran at a twentieth of the rate of the next.
	if _, _, err := scalingRound(ps, s.rowTime); err != nil {
		return sec, nil, fmt.Errorf("warm-up of %d pairs: %w", maxN, err)
	}
	for _, n := range s.pairs {
		pt, err := scalingPoint(s, ps, n, !s.spin, !s.spin)
		if err != nil {
			return sec, nil, fmt.Errorf("scaling %d: %w", n, err)
		}
		pts = append(pts, pt)
		sec.rows = append(sec.rows, scalingRows(pt)...)
	}
	if !s.spin {
		rows, sp, err := spinRows(s, ps)
		if err != nil {
			return sec, nil, err
		}
		sec.rows, pts = append(sec.rows, rows...), append(pts, sp...)
	}

	t0 = time.Now()
	for _, p := range ps {
		p.close()
	}
	closed = true
	cost.pinLeak = r.waitUnpinned()
	cost.leak = waitFds(cost.fdsListen, stall)
	cost.close = time.Since(t0)
	cost.fdsAfter = openFds()
	r.close()
	rigClosed = true
	if err := waitFds(cost.fdsBefore, stall); err != nil && cost.leak == nil {
		cost.leak = fmt.Errorf("daemon closed: %w", err)
	}
	sec.notes = append(sec.notes, scalingNote(pts), cost.note(), verdict(sec.rows, scalingMiss))
	return sec, pts, nil
}

// spinRows measures 1 and spinPairs pairs whose clients never yield (as
// before this section's clients did): the first against one pair whose
// client yields, the second against one pair whose client does not. The
// points have pairs < 0.
func spinRows(s settings, ps []*pair) ([]row, []scalePoint, error) {
	var rows []row
	var pts []scalePoint
	counts := []int{1}
	if m := min(spinPairs, len(ps)); m > 1 {
		counts = append(counts, m)
	}
	for _, n := range counts {
		pt, err := scalingPoint(s, ps, n, false, n == 1)
		if err != nil {
			return nil, nil, fmt.Errorf("scaling %d, clients never yielding: %w", n, err)
		}
		r := row{name: fmt.Sprintf("%d pairs, clients that never yield", n), figure: pt.agg, unit: "GB/s",
			baseName: "1 pair, never yielding", baseline: pt.one, baseUnit: "GB/s"}
		if n == 1 {
			r.name, r.baseName = "1 pair, a client that never yields", "1 pair, yielding"
		}
		rows = append(rows, r)
		pts = append(pts, scalePoint{pairs: -n, agg: pt.agg, one: pt.one, fair: pt.fair, min: pt.min})
	}
	return rows, pts, nil
}

// scalingRows are a pair count's rows: the aggregate, and for more than
// one pair how fairly the pairs shared it.
func scalingRows(pt scalePoint) []row {
	r := row{name: fmt.Sprintf("%d pairs: aggregate", pt.pairs), figure: pt.agg, unit: "GB/s", baseName: "1 pair",
		baseline: pt.one, baseUnit: "GB/s"}
	if pt.pairs == 1 {
		r.name = "1 pair"
	}
	if t, ok := scalingTargets[pt.pairs]; ok {
		r.target, r.met = fmt.Sprintf("≥ %.1f×", t), boolp(r.ratio() >= t)
	}
	rows := []row{r}
	if pt.pairs > 1 {
		rows = append(rows, row{name: fmt.Sprintf("%d pairs: Jain's fairness index", pt.pairs), figure: pt.fair,
			unit: "", baseName: "equal shares", baseline: 1, baseUnit: "", target: fmt.Sprintf("≥ %.1f", fairTarget),
			met: boolp(pt.fair >= fairTarget)})
	}
	return rows
}

// scalingNote lists each pair count's slowest pair.
func scalingNote(pts []scalePoint) string {
	var parts []string
	for _, pt := range pts {
		if pt.pairs > 1 {
			parts = append(parts, fmt.Sprintf("%d pairs %.2f", pt.pairs, pt.min))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "Slowest pair's rate over the mean rate (median of the repeats): " + strings.Join(parts, ", ") + "."
}

func (c rigCost) note() string {
	s := fmt.Sprintf("The rig: %d devices opened (front-end connected, PD, CQ, QP, 4 MiB MR each, pairs connected) in "+
		"%s, %d at a time, i.e. %.0f devices/s; this process (daemon and front-ends) held %d descriptors with all of "+
		"them connected (%.1f per device, RLIMIT_NOFILE %d), %d after the front-ends closed and the daemon tore "+
		"their sessions down (%s; %d with the devices listening, %d before the daemon).", c.devices,
		c.open.Round(time.Millisecond), 2*scalingOpeners, float64(c.devices)/c.open.Seconds(), c.fdsOpen,
		float64(c.fdsOpen-c.fdsBefore)/float64(c.devices), nofileHard(), c.fdsAfter, c.close.Round(time.Millisecond),
		c.fdsListen, c.fdsBefore)
	if err := errors.Join(c.leak, c.pinLeak); err != nil {
		s += " Problem: " + err.Error() + "."
	}
	return s
}

// waitFds waits until this process holds at most want descriptors (a
// closed front-end's session is torn down asynchronously).
func waitFds(want int, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		n := openFds()
		if n <= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d descriptors open %v after teardown, %d before the rig", n, d, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// engineDesc says what executes the devices' doorbell queues in this
// process and on how many cores.
func engineDesc() string {
	if w := engineWorkers(); w > 0 {
		return fmt.Sprintf("the engine is one pool of %d workers (vrdmad's --engine-threads, by default one per CPU "+
			"the process may use) serving every device's doorbell queues, on a machine with %d cores (GOMAXPROCS %d)",
			w, runtime.NumCPU(), runtime.GOMAXPROCS(0))
	}
	return fmt.Sprintf("each doorbell queue has an engine goroutine of its own, on a machine with %d cores "+
		"(GOMAXPROCS %d)", runtime.NumCPU(), runtime.GOMAXPROCS(0))
}

// clientYield is the client's behaviour and why, for the section's
// intro. The figures are from the investigation with the engine of one
// goroutine per doorbell queue (before package sched), on the 2-core
// machine: `vrdma-bench --only scaling --pairs 1,4 --spin-clients --row-time
// 1s --trace FILE`, the trace read with `go tool trace -d=parsed` (each
// goroutine's running slices and runnable waits), and a CPU profile
// (--cpuprofile) of the 1, 2, 4 and 8 pair rows.
const clientYield = "The clients are virtio-user front-ends in the daemon's own process, so they are goroutines " +
	"beside the engine's. A client that busy-polls its CQs without ever yielding (perftest's loop) holds a Go " +
	"processor until the runtime preempts it, which it does only after 10 ms of running. Investigated with the " +
	"engine of one goroutine per doorbell queue (`vrdma-bench --only scaling --pairs 1,4 --spin-clients --trace " +
	"FILE`, read with `go tool trace -d=parsed`): at 4 pairs on 2 cores the four clients held both processors in " +
	"slices of 20 ms on average, each ended by preemption, while the engine goroutines waited runnable for up to " +
	"55 ms at a time (0.83 s of waiting in a 1 s row); each preemption let one engine run one batch (64 × 64 KiB) " +
	"before it went back behind the spinning clients, so the aggregate was about 4 MiB per slice per core: " +
	"0.39 GB/s against 13.6 GB/s for one pair (0.03×). The CPU profile agrees: the clients' loop (`stream` → " +
	"`CQ.Poll` and its mutex) took 71 % of the samples and the engine 11 %. The starvation is the rig's, not the " +
	"daemon's: a guest's vCPU that busy-polls is a host thread which the kernel time-slices against the daemon's " +
	"threads. So the clients here behave as such a vCPU does: when a poll of their CQs finds nothing they yield " +
	"(`runtime.Gosched`), and a runnable engine worker or another client runs. The rows \"clients that never " +
	"yield\" measure the old behaviour in the same run (an engine made of goroutines, a pool's workers too, is " +
	"starved alike). A client alone loses little by yielding on a quiet machine; under other load each " +
	"`Gosched` may wake another thread to look for work (`runtime.wakep`): compare the two one-pair rows."

// scalingMiss is printed under the table when a target was missed.
const scalingMiss = "The clients yield when they find nothing to do, so a miss of the aggregate or of the fairness " +
	"index is the engine's share of the cores, not the rig's: profile the row with `vrdma-bench --only scaling " +
	"--pairs 1,N --cpuprofile FILE`, and look at the engine's runnable waits in an execution trace (`--trace FILE`, " +
	"`go tool trace`). Other load on the machine (the load average above) lowers every row, one pair included."
