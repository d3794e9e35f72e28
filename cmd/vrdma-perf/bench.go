package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/perftest"
)

// A run is a set of flows, each one direction of traffic: the operations
// its requester posts land in its responder's buffer. One process holds
// both sides of every flow; in two processes each holds one side, and the
// flow's other side is nil there (the peer process runs it), its buffer
// known only by address and rkey. -b adds flow 1, the server's traffic to
// the client, beside flow 0.
//
// Buffer layout, the same on every side: QP q's stride holds one area per
// flow; flow f's area of QP q starts at areaOff(f, q) and holds the
// message buffers (slots) of the size being run, or for send the receive
// buffers, laid out for the largest size so receives posted for one size
// fit the next (-a).

// Work request IDs: the sequence number of the operation on its QP, the
// QP's index above wridShift, the flow above wridFlowShift, and wridRecv
// for a receive.
const (
	wridShift     = 40
	wridSeq       = 1<<wridShift - 1
	wridQPMask    = 1<<20 - 1
	wridFlowShift = 61
	wridRecv      = 1 << 62
)

// peerBuf is a responder's registered buffer as its requester addresses
// it.
type peerBuf struct {
	addr uint64
	rkey uint32
}

// qpState is one QP's progress in one flow over the whole run (every
// message size): operation sequence numbers continue from size to size.
type qpState struct {
	posted, done uint64 // operations posted by the requester; complete
	sent         uint64 // send: send completions on the requester
	recvs, recvd uint64 // send: receives posted on the responder; completed
}

// flow is one direction of traffic.
type flow struct {
	idx       int
	req, resp *side   // local sides; nil where the peer process runs one
	dst       peerBuf // resp's buffer
	back      peerBuf // req's buffer, which a latency test's server answers into
	qs        []qpState

	// Per size, on the requester: completions not yet stamped (poll
	// counts them, the loop stamps them), the peak's samples (nanoseconds
	// since start of each post and each completion), and when the last
	// completion came.
	fresh               uint64
	peak                bool
	tposted, tcompleted []int64
	lastNS              int64

	// Two processes, on the responder: the peer's posted counts per QP
	// from its done messages, before this size and after it.
	peerFrom, peerTo []uint64
}

// bench is one run.
type bench struct {
	o      options
	sides  []*side // the local sides
	flows  []*flow
	polled []*side // the local sides with completions to reap
	region uint64  // buffer bytes of one flow's area per QP
	maxMsg uint64  // the largest message size
	wr     [1]verbs.SendWR
	rwr    [1]verbs.RecvWR
	wc     []verbs.WC
	out    io.Writer
	tally  verifyTally

	// peer is the two-process session: consulted while waiting, so that a
	// peer's failure or end is seen; nil in one process.
	peer *session

	// The size being measured and its layout.
	size  uint64
	slots int // message buffers per area
	depth int // operations in flight per QP
	// rdepth is the receives a send test keeps posted per QP (-r): more
	// than depth, so that a responder late to repost (another process, on
	// a busy CPU) does not run its queue dry under the sender.
	rdepth int

	// Latency tests: the size's state, and the receives each end keeps
	// posted from size to size.
	lt       *latTest
	latRecvs [2]int
}

func newBench(o options, region uint64, out io.Writer) *bench {
	return &bench{o: o, region: region, maxMsg: slices.Max(o.sizes), wc: make([]verbs.WC, 64), out: out}
}

// addFlow adds the next flow from req to resp (either may be nil, not
// both), whose buffers are dst and back.
func (bn *bench) addFlow(req, resp *side, dst, back peerBuf) {
	f := &flow{idx: len(bn.flows), req: req, resp: resp, dst: dst, back: back, qs: make([]qpState, bn.o.qps),
		peerFrom: make([]uint64, bn.o.qps), peerTo: make([]uint64, bn.o.qps)}
	bn.flows = append(bn.flows, f)
	for _, s := range bn.sides {
		if (s == req || (s == resp && bn.o.op == "send")) && !slices.Contains(bn.polled, s) {
			bn.polled = append(bn.polled, s)
		}
	}
}

// stall is how long an operation may go without progress before the run
// fails.
func (bn *bench) stall() time.Duration {
	return stallTimeout + time.Duration(bn.maxMsg)*stallPerByte
}

// areaOff is the offset in each side's MR of flow f's area of QP q.
func (bn *bench) areaOff(f, q int) uint64 {
	return (uint64(q)*uint64(len(bn.flows)) + uint64(f)) * bn.region
}

// slotOff is the offset of message buffer k (an operation's sequence
// number: k mod slots) of flow f, QP q.
func (bn *bench) slotOff(f *flow, q int, k uint64) uint64 {
	return bn.areaOff(f.idx, q) + (k%uint64(bn.slots))*bn.size
}

func (bn *bench) slot(s *side, f *flow, q int, k uint64) []byte {
	o := bn.slotOff(f, q, k)
	return s.mr.Bytes()[o : o+bn.size]
}

// recvSlots is the number of receive buffers per area.
func (bn *bench) recvSlots() uint64 { return max(1, bn.region/bn.maxMsg) }

// recvOff is the offset of receive buffer j of flow f, QP q on the
// responder.
func (bn *bench) recvOff(f *flow, q int, j uint64) uint64 {
	return bn.areaOff(f.idx, q) + (j%bn.recvSlots())*bn.maxMsg
}

// patternIndex makes operation seq of flow f, QP q's pattern unique in
// the run.
func (bn *bench) patternIndex(f *flow, q int, seq uint64) uint64 {
	return (seq*uint64(bn.o.qps)+uint64(q))*2 + uint64(f.idx)
}

// setSize lays the areas out for size.
func (bn *bench) setSize(size uint64) {
	bn.size = size
	bn.slots = int(max(1, min(uint64(bn.o.txDepth), bn.region/size)))
	bn.depth = bn.o.txDepth
	bn.rdepth = max(bn.o.rxDepth, bn.depth)
	if bn.o.verify {
		// Buffers in flight may not be shared when their bytes are checked.
		bn.depth = min(bn.depth, bn.slots)
		if bn.o.op == "send" {
			bn.depth = min(bn.depth, int(bn.recvSlots()))
			bn.rdepth = max(bn.depth, min(bn.rdepth, int(bn.recvSlots())))
		}
	}
}

// prepare readies the local responders for size: a read's source buffers
// hold their patterns, a send's receives are posted.
func (bn *bench) prepare() error {
	for _, f := range bn.flows {
		if f.resp == nil {
			continue
		}
		switch bn.o.op {
		case "read":
			if bn.o.verify {
				for q := range bn.o.qps {
					for k := range uint64(bn.slots) {
						perftest.Pattern(bn.slot(f.resp, f, q, k), bn.patternIndex(f, q, k))
					}
				}
			}
		case "send":
			if err := bn.fillRecvs(f); err != nil {
				return err
			}
		}
	}
	return nil
}

// bwResult is one bandwidth measurement.
type bwResult struct {
	size  uint64
	iters uint64  // operations measured (all QPs)
	secs  float64 // the time they took
	bps   float64 // bytes per second: BW average
	mps   float64 // operations per second: MsgRate
	peak  float64 // bytes per second at the peak; 0: not measured
	depth int
	slots int
}

func newBWResult(size, iters uint64, secs float64) *bwResult {
	secs = max(secs, 1e-9)
	return &bwResult{size: size, iters: iters, secs: secs, bps: float64(iters) * float64(size) / secs, mps: float64(iters) / secs}
}

// sumBW is perftest's duplex report of the flows' results: bandwidths,
// peaks and message rates added, the iterations and time the first's.
func sumBW(rs []*bwResult) *bwResult {
	s := *rs[0]
	for _, r := range rs[1:] {
		s.bps, s.mps, s.peak = s.bps+r.bps, s.mps+r.mps, s.peak+r.peak
	}
	return &s
}

func (r *bwResult) result(o *options) result {
	return result{
		Op: o.op, Size: r.size, Iters: int(r.iters),
		GBytesPerS: r.bps / 1e9,
		Mops:       r.mps / 1e6,
		Verified:   o.verify,
		Seconds:    r.secs,
		TxDepth:    r.depth,
		Slots:      r.slots,
	}
}

// bandwidth runs perftest's bandwidth test for one message size on the
// flows whose requester is local: each QP keeps depth operations in
// flight, for -n operations per QP or for -D. It returns one result per
// such flow (none when this side only responds). Two processes call
// prepare and their barrier before it.
func (bn *bench) bandwidth(ctx context.Context, size uint64) ([]*bwResult, error) {
	o := &bn.o
	var flows []*flow
	for _, f := range bn.flows {
		if f.req != nil {
			flows = append(flows, f)
		}
	}
	if len(flows) == 0 {
		return nil, nil
	}
	base := make([][]uint64, len(flows))   // done per QP at the start
	target := make([][]uint64, len(flows)) // posted count at which each QP stops (iterations)
	for i, f := range flows {
		base[i], target[i] = make([]uint64, o.qps), make([]uint64, o.qps)
		for q := range f.qs {
			base[i][q], target[i][q] = f.qs[q].done, f.qs[q].posted+uint64(o.iters)
		}
		// The peak needs every post's and completion's time, as perftest
		// records them: only for runs of at most 20000 iterations per QP.
		f.peak = o.duration == 0 && o.iters <= peakItersLimit
		f.tposted, f.tcompleted, f.fresh, f.lastNS = f.tposted[:0], f.tcompleted[:0], 0, 0
	}
	total := func(i int) (n uint64) {
		for q := range flows[i].qs {
			n += flows[i].qs[q].done
		}
		return n
	}
	start := time.Now()
	var end, sampleStart, sampleEnd time.Time
	doneAtStart, doneAtEnd := make([]uint64, len(flows)), make([]uint64, len(flows))
	sampling, sampled := false, false
	if o.duration != 0 {
		// perftest: a quarter of the duration, in whole seconds, before and
		// after the sample.
		margin := time.Duration(int64(o.duration/time.Second)/4) * time.Second
		end = start.Add(o.duration)
		sampleStart, sampleEnd = start.Add(margin), end.Add(-margin)
	}
	last := start
	for spins := 0; ; {
		posting := true
		if o.duration != 0 {
			now := time.Now()
			if !sampling && !sampled && !now.Before(sampleStart) {
				sampling, sampleStart = true, now
				for i := range flows {
					doneAtStart[i] = total(i)
				}
			}
			if sampling && !now.Before(sampleEnd) {
				sampling, sampled, sampleEnd = false, true, now
				for i := range flows {
					doneAtEnd[i] = total(i)
				}
			}
			posting = now.Before(end)
		}
		busy := false
		for i, f := range flows {
			for q := range f.qs {
				st := &f.qs[q]
				for posting && st.posted-st.done < uint64(bn.depth) && (o.duration != 0 || st.posted < target[i][q]) {
					if f.peak {
						// perftest reads the clock just before it posts.
						f.tposted = append(f.tposted, int64(time.Since(start)))
					}
					if err := bn.post(f, q); err != nil {
						return nil, err
					}
				}
				busy = busy || st.posted != st.done
			}
		}
		if !busy && (o.duration == 0 || !posting) {
			break
		}
		n, err := bn.pollAll()
		if err != nil {
			return nil, err
		}
		if n > 0 {
			t := time.Since(start)
			for _, f := range flows {
				bn.stamp(f, int64(t))
			}
			last, spins = start.Add(t), 0
			continue
		}
		if spins++; spins&1023 == 0 {
			if err := bn.idle(ctx, last, "%s, %d-byte messages", bn.progress(), size); err != nil {
				return nil, err
			}
		}
		relax(spins)
	}
	var rs []*bwResult
	for i, f := range flows {
		var r *bwResult
		switch {
		case o.duration != 0:
			if !sampled { // the loop ended at the same instant as the sample
				sampleEnd, doneAtEnd[i] = time.Now(), total(i)
			}
			r = newBWResult(size, doneAtEnd[i]-doneAtStart[i], sampleEnd.Sub(sampleStart).Seconds())
		default:
			// perftest: from the first post to the last completion.
			r = newBWResult(size, total(i)-sum(base[i]), time.Duration(f.lastNS).Seconds())
			if f.peak && len(f.tcompleted) > 0 {
				r = newBWResult(size, r.iters, time.Duration(f.tcompleted[len(f.tcompleted)-1]-f.tposted[0]).Seconds())
				if ns := peakInterval(f.tposted, f.tcompleted); ns > 0 {
					r.peak = float64(size) / (ns / 1e9)
				}
			}
		}
		r.depth, r.slots = bn.depth, bn.slots
		rs = append(rs, r)
	}
	return rs, nil
}

func sum(v []uint64) (n uint64) {
	for _, x := range v {
		n += x
	}
	return n
}

// stamp gives flow f's completions since the last stamp the time t
// (nanoseconds since the run's start), as perftest reads its clock for each
// completion it polls.
func (bn *bench) stamp(f *flow, t int64) {
	if f.fresh == 0 {
		return
	}
	if f.peak {
		for range f.fresh {
			f.tcompleted = append(f.tcompleted, t)
		}
	}
	f.fresh, f.lastNS = 0, t
}

// idle is the check a waiting loop makes now and then: the context, the
// peer process, and how long since the last progress (last).
func (bn *bench) idle(ctx context.Context, last time.Time, what string, args ...any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if bn.peer != nil {
		if err := bn.peer.poll(); err != nil {
			return err
		}
	}
	if time.Since(last) > bn.stall() {
		return fmt.Errorf("no completion for %v ("+what+")", append([]any{bn.stall()}, args...)...)
	}
	return nil
}

func (bn *bench) progress() string {
	var posted, done uint64
	for _, f := range bn.flows {
		for _, st := range f.qs {
			posted, done = posted+st.posted, done+st.done
		}
	}
	return fmt.Sprintf("posted %d, completed %d", posted, done)
}

// peakInterval is perftest's peak (print_report_bw): the least time per
// operation over any run of consecutive operations i…j, (tcompleted[j] -
// tposted[i]) / (j - i + 1), in nanoseconds, where tposted[i] is read just
// before operation i is posted and tcompleted[j] when the j+1-th
// completion is polled. perftest tries every pair; a binary search on the
// answer finds the same minimum in linear time per step: some i ≤ j has
// tcompleted[j] - tposted[i] ≤ λ(j-i+1) iff tcompleted[j] - λ(j+1) ≤ max
// over i ≤ j of tposted[i] - λi. The peak bandwidth is the message size
// over it.
func peakInterval(tposted, tcompleted []int64) float64 {
	n := min(len(tposted), len(tcompleted))
	if n == 0 {
		return 0
	}
	hi := float64(tcompleted[0] - tposted[0]) // the run of operation 0 alone
	if hi <= 0 {
		return 0
	}
	feasible := func(l float64) bool {
		best := -1e300
		for j := range n {
			best = max(best, float64(tposted[j])-l*float64(j))
			if float64(tcompleted[j])-l*float64(j+1) <= best {
				return true
			}
		}
		return false
	}
	lo := 0.0
	for range 64 {
		mid := (lo + hi) / 2
		if feasible(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}
