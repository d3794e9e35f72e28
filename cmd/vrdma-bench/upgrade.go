package main

// The upgrade section (issue 29: "Upgrade: data-path pause (longest gap in
// a stream of 64 B WRITEs across the handover) against the same stream's
// p99 without an upgrade. Target: ≤ 100 ms."). A vrdmad process (the
// --vrdmad binary, through internal/vrdmadproc) serves two devices; a
// virtio-user front-end on each, in this process, holds one end of an RC
// QP pair; one goroutine streams 64 B RDMA WRITEs from a to b one at a
// time and checks each: the requester's completion (status, work request
// id) and the destination bytes. The stream first runs without an upgrade
// (the baseline: the gaps between consecutive completions), then the
// daemon hands its devices over to a new process K times while it runs
// (POST /v1/daemon/upgrade, vrdmadproc's Upgrade following the new
// process); the figure is the longest gap between two completions that
// overlaps a handover, from the request to the answer. A stream that
// stalls, fails a completion or finds other bytes than it wrote fails the
// section (and make bench) instead of giving a number.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

const (
	// upgradeTarget is issue 29's bound on the longest gap.
	upgradeTarget = 100 * time.Millisecond
	// upgradeMsg is a WRITE's size; the stream cycles through
	// upgradeSlots slots of it on each side, so a WRITE that was lost
	// leaves the bytes of upgradeSlots rounds before in its slot.
	upgradeMsg   = 64
	upgradeSlots = 64
	// upgradeBuf is each device's registered buffer; its guest memory is
	// upgradeBuf + memOverhead (openSide).
	upgradeBuf = 1 << 20
	// Baseline WRITEs (gaps measured without an upgrade), and rounds the
	// stream completes before the baseline, between handovers and after
	// the last.
	upgradeRounds      = 50000
	upgradeQuickRounds = 5000
	upgradeSettle      = 1000
	// Handovers per run (--upgrades 0).
	upgradeCount      = 3
	upgradeQuickCount = 2
	// upgradePoll bounds the wait for one completion: longer than any
	// handover takes (the new process starts, re-pins every registered
	// page and maps every guest's memory before the devices run again).
	upgradePoll = 60 * time.Second
)

// upgradeConfig is one upgrade measurement's setup.
type upgradeConfig struct {
	vrdmad   string // vrdmad binary (an absolute path: the new process runs the same file)
	rounds   int    // baseline WRITEs
	settle   int    // rounds before the baseline, between handovers and after the last
	upgrades int    // handovers
	progress func(format string, a ...any)
}

func (c upgradeConfig) logf(format string, a ...any) {
	if c.progress != nil {
		c.progress(format, a...)
	}
}

// handover is one upgrade as the stream saw it and as the daemon told it.
type handover struct {
	ans    controlapi.UpgradeAnswer
	oldPid int
	took   time.Duration // request to answer
	gap    time.Duration // longest gap between completions overlapping the request…answer window
	rounds uint64        // rounds completed during the request…answer window
	window [2]int64      // request…answer, ns since the stream's start
}

// upgradeResult is one measurement.
type upgradeResult struct {
	base          []time.Duration // the baseline's gaps, sorted
	handovers     []handover
	rounds        uint64 // WRITEs the stream completed and verified in all
	memSize       uint64 // guest memory of each device
	stopErr       error  // the last vrdmad did not exit cleanly
	version, from string // the new process's build; the binary run
}

// longest is the longest gap across any handover, and the largest
// pause_ms the daemon reported.
func (r upgradeResult) longest() (gap time.Duration, pauseMS float64) {
	for _, h := range r.handovers {
		gap = max(gap, h.gap)
		pauseMS = max(pauseMS, h.ans.PauseMS)
	}
	return gap, pauseMS
}

// measureUpgrade starts vrdmad with two devices, connects a QP pair
// between them, streams WRITEs through cfg.rounds without an upgrade and
// then through cfg.upgrades handovers, and stops vrdmad. An error means
// the stream or an upgrade failed (it carries vrdmad's log): no figure.
func measureUpgrade(cfg upgradeConfig) (res upgradeResult, err error) {
	res.from = cfg.vrdmad
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	p, err := vrdmadproc.Start(ctx, vrdmadproc.Config{Binary: cfg.vrdmad, Devices: []string{"a", "b"},
		LogLevel: "warn", StopTimeout: 30 * time.Second})
	cancel()
	if err != nil {
		return res, err
	}
	stopped := false
	defer func() {
		if !stopped {
			p.Kill()
		}
		if err != nil {
			err = fmt.Errorf("%w\n=== vrdmad log ===\n%s", err, p.Log())
		}
	}()
	pr, err := connectPair(p.Socket("a"), p.Socket("b"), upgradeBuf)
	if err != nil {
		return res, err
	}
	defer func() {
		if pr != nil {
			pr.close()
		}
	}()
	res.memSize = upgradeBuf + memOverhead

	s := startWriteStream(pr)
	cfg.logf("upgrade: %d WRITEs without an upgrade", cfg.rounds)
	if err := s.waitRounds(uint64(cfg.settle + cfg.rounds)); err != nil {
		return res, errors.Join(err, s.end())
	}
	for i := range cfg.upgrades {
		if err := s.waitRounds(s.rounds.Load() + uint64(cfg.settle)); err != nil {
			return res, errors.Join(err, s.end())
		}
		h := handover{oldPid: p.Pid()}
		cfg.logf("upgrade: handover %d of %d (pid %d)", i+1, cfg.upgrades, h.oldPid)
		uctx, cancel := context.WithTimeout(context.Background(), controlapi.UpgradeTimeout)
		r0 := s.rounds.Load()
		t0 := time.Now()
		h.ans, err = p.Upgrade(uctx, "")
		t1 := time.Now()
		cancel()
		h.rounds = s.rounds.Load() - r0
		h.took = t1.Sub(t0)
		h.window = [2]int64{t0.Sub(s.start).Nanoseconds(), t1.Sub(s.start).Nanoseconds()}
		if err != nil {
			return res, errors.Join(fmt.Errorf("upgrade %d: %w", i+1, err), s.end())
		}
		if h.ans.PID == h.oldPid || h.ans.PID != p.Pid() || h.ans.Devices != 2 || h.ans.Connected != 2 {
			return res, errors.Join(fmt.Errorf("upgrade %d: answer %+v from pid %d: want a new pid serving both devices, connected",
				i+1, h.ans, h.oldPid), s.end())
		}
		res.version = strings.TrimSpace(h.ans.Version + " " + h.ans.Revision)
		res.handovers = append(res.handovers, h)
	}
	// The stream must go on after the last handover too.
	if err := s.waitRounds(s.rounds.Load() + uint64(cfg.settle)); err != nil {
		return res, errors.Join(err, s.end())
	}
	if err := s.end(); err != nil {
		return res, err
	}
	res.rounds = s.rounds.Load()
	// No guest may have noticed: a device that reset or broke a QP tells
	// its driver with an async event.
	for _, sd := range []struct {
		name string
		c    *verbs.Context
	}{{"a", pr.a.c}, {"b", pr.b.c}} {
		if ev, err := sd.c.GetAsyncEvent(50 * time.Millisecond); err == nil {
			return res, fmt.Errorf("device %s: async event %+v after the upgrades", sd.name, ev)
		}
	}
	first := max(cfg.settle, 1) - 1
	res.base = streamGaps(s.ends[first : cfg.settle+cfg.rounds])
	slices.Sort(res.base)
	for i := range res.handovers {
		h := &res.handovers[i]
		g, ok := longestAcross(s.ends, h.window[0], h.window[1])
		if !ok {
			return res, fmt.Errorf("upgrade %d: no completion after the handover", i+1)
		}
		h.gap = g
	}
	pr.close()
	pr = nil
	stopped = true
	res.stopErr = p.Stop()
	return res, nil
}

// streamGaps returns the gaps between consecutive completion times (ns).
func streamGaps(ends []int64) []time.Duration {
	var gaps []time.Duration
	for i := 1; i < len(ends); i++ {
		gaps = append(gaps, time.Duration(ends[i]-ends[i-1]))
	}
	return gaps
}

// longestAcross returns the longest gap between consecutive completion
// times (ends, ascending, ns) that overlaps the window [from, to]: the
// gap in which the data path stopped, since the daemon freezes and the
// new process serves between the request and its answer. ok is false
// when no gap overlaps the window (no completion after it).
func longestAcross(ends []int64, from, to int64) (gap time.Duration, ok bool) {
	// The first gap that can overlap ends after from.
	i, _ := slices.BinarySearch(ends, from+1)
	for i = max(i, 1); i < len(ends) && ends[i-1] < to; i++ {
		gap, ok = max(gap, time.Duration(ends[i]-ends[i-1])), true
	}
	return gap, ok
}

// writeStream is the verified stream of 64 B WRITEs from p.a to p.b, one
// at a time.
type writeStream struct {
	p      *pair
	start  time.Time     // immutable
	rounds atomic.Uint64 // rounds completed and verified
	stop   chan struct{} // closed by end
	done   chan struct{} // closed when run has returned
	// ends are the completion times, ns since start: appended by run,
	// read by others once done is closed.
	ends []int64
	err  error // written before done is closed
}

func startWriteStream(p *pair) *writeStream {
	s := &writeStream{p: p, start: time.Now(), stop: make(chan struct{}), done: make(chan struct{}),
		ends: make([]int64, 0, 1<<20)}
	go func() {
		defer close(s.done)
		s.err = s.run()
	}()
	return s
}

// stamp fills b with round r's bytes (every byte depends on r and its
// offset, none is constant across rounds).
func stamp(b []byte, r uint64) {
	for i := range b {
		b[i] = byte(r*131 + uint64(i)*7 + 1)
	}
}

// stamped reports whether b holds round r's bytes.
func stamped(b []byte, r uint64) bool {
	for i := range b {
		if b[i] != byte(r*131+uint64(i)*7+1) {
			return false
		}
	}
	return true
}

// run posts one WRITE, polls until its completion, checks it and the
// destination's bytes, and records the time; until stop is closed.
func (s *writeStream) run() error {
	a, b := s.p.a, s.p.b
	var sge [1]abi.SGE
	wr := verbs.SendWR{Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, SGL: sge[:], RKey: b.mr.RKey}
	var wc [1]verbs.WC
	for r := uint64(0); ; r++ {
		select {
		case <-s.stop:
			return nil
		default:
		}
		off := (r % upgradeSlots) * upgradeMsg
		stamp(a.mr.Bytes()[off:off+upgradeMsg], r)
		sge[0] = abi.SGE{Addr: a.mr.Addr + off, Length: upgradeMsg, LKey: a.mr.LKey}
		wr.WRID, wr.RemoteAddr = r, b.mr.Addr+off
		if err := a.qp.PostSend(wr); err != nil {
			return fmt.Errorf("round %d: post: %w", r, err)
		}
		t0 := time.Now()
		for spins := 1; ; spins++ {
			n, err := a.cq.Poll(wc[:])
			if err != nil {
				return fmt.Errorf("round %d: poll: %w", r, err)
			}
			if n == 1 {
				break
			}
			if spins&1023 == 0 && time.Since(t0) > upgradePoll {
				return fmt.Errorf("round %d: no completion within %v", r, upgradePoll)
			}
			runtime.Gosched()
		}
		now := time.Since(s.start).Nanoseconds()
		if wc[0].Status != abi.WCSuccess || wc[0].WRID != r {
			return fmt.Errorf("round %d: completion of work request %d with status %d (vendor error %d), want %d successful",
				r, wc[0].WRID, wc[0].Status, wc[0].VendorErr, r)
		}
		if !stamped(b.mr.Bytes()[off:off+upgradeMsg], r) {
			return fmt.Errorf("round %d: the destination does not hold the bytes written", r)
		}
		s.ends = append(s.ends, now)
		s.rounds.Add(1)
	}
}

// waitRounds waits until the stream has completed n rounds; an error if
// it ended or made no progress for upgradePoll.
func (s *writeStream) waitRounds(n uint64) error {
	last, lastAt := s.rounds.Load(), time.Now()
	for {
		got := s.rounds.Load()
		if got >= n {
			return nil
		}
		select {
		case <-s.done:
			if s.err != nil {
				return fmt.Errorf("stream: %w", s.err)
			}
			return fmt.Errorf("stream ended after %d rounds", got)
		case <-time.After(time.Millisecond):
		}
		if got != last {
			last, lastAt = got, time.Now()
		} else if time.Since(lastAt) > 2*upgradePoll {
			return fmt.Errorf("stream stuck at round %d", got)
		}
	}
}

// end stops the stream and returns its error.
func (s *writeStream) end() error {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
	if s.err != nil {
		return fmt.Errorf("stream: %w", s.err)
	}
	return nil
}

// upgradeSection measures the pause of a live upgrade (--only upgrade).
func upgradeSection(o options, w io.Writer) (section, error) {
	cfg := upgradeConfig{vrdmad: o.vrdmad, rounds: upgradeRounds, settle: upgradeSettle, upgrades: o.upgrades,
		progress: func(f string, a ...any) { progress(w, f, a...) }}
	if o.s.quick {
		cfg.rounds = upgradeQuickRounds
	}
	sec := section{title: "Live upgrade: data-path pause",
		intro: fmt.Sprintf("On the host (no guest, no TCG): a vrdmad process (`%s`) serves two devices; a "+
			"virtio-user front-end on each (in the benchmark's process, %s of memfd guest memory, %s registered) "+
			"holds one end of an RC QP pair. One goroutine streams 64 B RDMA WRITEs from one to the other one at "+
			"a time: post, busy-poll the requester's CQ (yielding the processor between polls), check the "+
			"completion and the destination's bytes (%d slots, each round's bytes distinct), post the next. "+
			"Baseline: the gaps between consecutive completions over %d WRITEs without an upgrade. Then, while "+
			"the stream runs, the daemon hands its devices over to a new process running the same binary %d "+
			"times (`vrdmactl daemon upgrade`: POST /v1/daemon/upgrade, %d rounds apart); the figure is the "+
			"longest gap between two completions that overlaps a handover (request to answer), the longest over "+
			"the handovers. pause_ms is the daemon's own measure of a handover (its freeze to the new process "+
			"serving). A stream that stalls, fails a completion or reads other bytes than it wrote fails the "+
			"run. Target (issue 29): ≤ %d ms.",
			o.vrdmad, sizeName(upgradeBuf+memOverhead), sizeName(upgradeBuf), upgradeSlots, cfg.rounds,
			cfg.upgrades, upgradeSettle, upgradeTarget.Milliseconds())}
	if !exists(o.vrdmad) {
		sec.notes = append(sec.notes, "Not measured in this run: "+o.vrdmad+" is not built (make build).")
		return sec, nil
	}
	var err error
	if cfg.vrdmad, err = filepath.Abs(o.vrdmad); err != nil {
		return sec, err
	}
	res, err := measureUpgrade(cfg)
	if err != nil {
		return sec, fmt.Errorf("upgrade: %w", err)
	}
	sec.rows = upgradeRows(res)
	sec.notes = append(sec.notes, upgradeTable(res))
	if res.stopErr != nil {
		sec.notes = append(sec.notes, "Problems: the last vrdmad did not exit cleanly: "+firstLine(res.stopErr, nil)+".")
	}
	sec.notes = append(sec.notes, verdict(sec.rows, upgradeMiss))
	for _, n := range sec.notes {
		fmt.Fprintln(w, n)
	}
	return sec, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func upgradeRows(res upgradeResult) []row {
	gap, pause := res.longest()
	p99 := ms(percentile(res.base, 99))
	return []row{
		{name: "upgrade: longest stream gap", figure: ms(gap), unit: "ms", baseName: "stream p99 without upgrade",
			baseline: p99, baseUnit: "ms", invRatio: true, target: fmt.Sprintf("≤ %d ms", upgradeTarget.Milliseconds()), met: boolp(gap <= upgradeTarget)},
		{name: "upgrade: daemon's pause_ms (longest)", figure: pause, unit: "ms", baseName: "longest stream gap",
			baseline: ms(gap), baseUnit: "ms", invRatio: true},
	}
}

// upgradeTable is the raw figures: the baseline's distribution and each
// handover.
func upgradeTable(res upgradeResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Raw figures (%s, %s; %d WRITEs completed and verified in all): without an upgrade, %d gaps: "+
		"p50 %.1f µs, p99 %s ms, max %s ms.", res.from, orUnknown(res.version), res.rounds, len(res.base),
		us(percentile(res.base, 50)), fmtNum(ms(percentile(res.base, 99))), fmtNum(ms(maxGap(res.base))))
	for i, h := range res.handovers {
		fmt.Fprintf(&b, " Handover %d: pid %d → %d, longest gap %s ms, pause_ms %s, request to answer %s ms "+
			"(WRITEs completed meanwhile: %d), state %d bytes.", i+1, h.oldPid, h.ans.PID, fmtNum(ms(h.gap)),
			fmtNum(h.ans.PauseMS), fmtNum(ms(h.took)), h.rounds, h.ans.StateBytes)
	}
	return b.String()
}

// maxGap is the last of sorted gaps (0 for none).
func maxGap(sorted []time.Duration) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[len(sorted)-1]
}

func orUnknown(s string) string {
	if s == "" {
		return "version unknown"
	}
	return "version " + s
}

// upgradeMiss is printed under a missed target. The order of a handover
// is docs/state.md's.
const upgradeMiss = "The data path stops for the whole handover (docs/state.md): the old process freezes every " +
	"device first, then starts the new binary, which (a new Go process) maps each guest's memory, pins every " +
	"registered page again and adopts the sockets before it says ready; only after the commit does it start the " +
	"rings and engines. pause_ms, the daemon's measure from its freeze to the new process serving, is most of " +
	"the gap, so the gap is mostly the new process's start-up; on a loaded machine (see the load average above) " +
	"that process waits for a core. What would shorten it: starting and preparing the new process before the " +
	"freeze, so that only the state that changed is handed over while the devices stand still."
