package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"slices"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/perftest"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// result is one measurement: perftest's, whose JSON keys vrdma-guest
// prints too, so the tools share one contract. vrdma-perf leaves Role
// empty (omitted from the JSON).
type result = perftest.Result

// Memory set aside in each front-end's guest memory for rings, the control
// scratch and the event buffers, plus per QP for its rings.
const (
	memOverhead   = 32 << 20
	qpOverhead    = 256 << 10
	defaultBudget = 256 << 20        // buffer bytes per side when --guest-mem is not given
	stallTimeout  = 10 * time.Second // plus stallPerByte per message byte
	stallPerByte  = 20 * time.Nanosecond
	// A work request ID holds the QP's index above wridShift and the
	// operation's sequence number on that QP below.
	wridShift = 40
	wridSeq   = 1<<wridShift - 1
	// Receives kept posted on each side of a send latency test.
	latRecvs = 4
)

// side is one device with its verbs objects: one CQ shared by its QPs (as
// perftest's), and one registered buffer holding a region per QP.
type side struct {
	ctx  *verbs.Context
	f    *frontend.Frontend
	gid  [16]byte
	port abi.PortAttr
	pd   *verbs.PD
	cq   *verbs.CQ
	qps  []*verbs.QP
	buf  *verbs.Buffer
	mr   *verbs.MR
}

func (s *side) close() {
	if s.ctx != nil {
		s.ctx.Close()
	}
	if s.f != nil {
		s.f.Close()
	}
}

func openSide(ctx context.Context, sock string, mem uint64, bufBytes, qps, sq, rq int) (*side, error) {
	s := &side{}
	var err error
	if s.ctx, s.f, err = frontend.OpenRDMA(ctx, sock, mem); err != nil {
		return nil, fmt.Errorf("open %s: %w", sock, err)
	}
	fail := func(what string, err error) (*side, error) {
		s.close()
		return nil, fmt.Errorf("%s: %s: %w", sock, what, err)
	}
	if s.gid, err = s.ctx.QueryGID(); err != nil {
		return fail("query gid", err)
	}
	if s.port, err = s.ctx.QueryPort(); err != nil {
		return fail("query port", err)
	}
	if s.pd, err = s.ctx.AllocPD(); err != nil {
		return fail("alloc pd", err)
	}
	if s.cq, err = s.ctx.CreateCQ(qps*(sq+rq) + 8); err != nil {
		return fail("create cq", err)
	}
	for i := range qps {
		qp, err := s.pd.CreateQP(verbs.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq,
			Cap: verbs.QPCap{MaxSendWR: sq, MaxRecvWR: rq, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			return fail(fmt.Sprintf("create qp %d", i), err)
		}
		s.qps = append(s.qps, qp)
	}
	if s.buf, err = s.ctx.AllocBuffer(bufBytes); err != nil {
		return fail("alloc buffer", err)
	}
	if s.mr, err = s.pd.RegMR(s.buf, 0, bufBytes, abi.AccessAll); err != nil {
		return fail("reg mr", err)
	}
	return s, nil
}

// qpState is one QP pair's progress over the whole run (every message
// size): operation q's sequence numbers continue from size to size.
type qpState struct {
	posted, done uint64 // operations posted on the requester; complete
	sent         uint64 // send: send completions on the requester
	recvs, recvd uint64 // send: receives posted on the responder; completed
}

// bench is one run: requester a, responder b, o.qps QP pairs.
type bench struct {
	o      options
	a, b   *side
	region uint64 // buffer bytes per QP on each side
	maxMsg uint64 // the largest message size
	qs     []qpState
	wr     [1]verbs.SendWR
	rwr    [1]verbs.RecvWR
	wc     []verbs.WC
	out    io.Writer

	// The size being measured and its layout.
	size  uint64
	slots int // message buffers per QP region
	depth int // operations in flight per QP
}

// plan decides the buffer bytes per QP region on each side and the guest
// memory of each front-end.
func plan(o options) (region, mem uint64, err error) {
	maxMsg := slices.Max(o.sizes)
	qps := uint64(o.qps)
	overhead := memOverhead + qps*qpOverhead
	if o.lat {
		// An inbox and an outbox.
		region = 2 * maxMsg
	} else {
		budget := uint64(defaultBudget)
		if o.guestMem != 0 {
			if o.guestMem < overhead+qps*maxMsg {
				return 0, 0, fmt.Errorf("--guest-mem %d is too small for %d QPs of %d-byte buffers (need at least %d)",
					o.guestMem, qps, maxMsg, overhead+qps*maxMsg)
			}
			budget = o.guestMem - overhead
		}
		region = maxMsg * max(1, min(uint64(o.txDepth), budget/(qps*maxMsg)))
	}
	if o.guestMem != 0 {
		if o.guestMem < overhead+qps*region {
			return 0, 0, fmt.Errorf("--guest-mem %d is too small (need at least %d)", o.guestMem, overhead+qps*region)
		}
		return region, o.guestMem, nil
	}
	mem = qps*region + overhead
	return region, (mem + (1<<20 - 1)) &^ (1<<20 - 1), nil
}

// measure opens the two devices, runs the test for every size and prints
// the results on out.
func measure(ctx context.Context, o options, out io.Writer) error {
	region, mem, err := plan(o)
	if err != nil {
		return err
	}
	total := region * uint64(o.qps)
	if total > 1<<40 {
		return fmt.Errorf("buffers of %d bytes are too large", total)
	}
	bn := &bench{o: o, region: region, maxMsg: slices.Max(o.sizes), qs: make([]qpState, o.qps),
		wc: make([]verbs.WC, 64), out: out}
	sq, rq := o.txDepth+2, o.txDepth+2
	if o.lat {
		sq, rq = 16, latRecvs+2
	}
	if bn.a, err = openSide(ctx, o.sockets[0], mem, int(total), o.qps, sq, rq); err != nil {
		return err
	}
	defer bn.a.close()
	if bn.b, err = openSide(ctx, o.sockets[1], mem, int(total), o.qps, sq, rq); err != nil {
		return err
	}
	defer bn.b.close()
	// Exchange (GID, QPN) in-process and connect, as perftest does over TCP.
	remote := abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic
	for i := range o.qps {
		if err := bn.a.qps[i].ConnectRC(bn.b.gid, bn.b.qps[i].Num(), bn.b.qps[i].PSN(), remote); err != nil {
			return fmt.Errorf("connect requester qp %d: %w", i, err)
		}
		if err := bn.b.qps[i].ConnectRC(bn.a.gid, bn.a.qps[i].Num(), bn.a.qps[i].PSN(), remote); err != nil {
			return fmt.Errorf("connect responder qp %d: %w", i, err)
		}
	}
	var rep *reporter
	if !o.json {
		rep = newReporter(out, &o, bn.info())
		rep.header()
	}
	for _, size := range o.sizes {
		var r result
		var row any
		if o.lat {
			lr, err := bn.latency(ctx, size)
			if err != nil {
				return err
			}
			r, row = lr.result(&o), lr
		} else {
			br, err := bn.bandwidth(ctx, size)
			if err != nil {
				return err
			}
			r, row = br.result(&o), br
			if o.json && o.latIters > 0 {
				if err := bn.latencyPass(ctx, &r); err != nil {
					return err
				}
			}
		}
		if o.json {
			if err := json.NewEncoder(out).Encode(r); err != nil { // one line
				return err
			}
			continue
		}
		rep.row(row)
	}
	if o.verify && o.op == "atomic" && !o.lat {
		for q := range bn.qs {
			if got, want := binary.LittleEndian.Uint64(bn.b.mr.Bytes()[bn.regionOff(q):]), bn.qs[q].done; got != want {
				return fmt.Errorf("verify: qp %d: counter is %d after %d fetch-and-adds", q, got, want)
			}
		}
	}
	if rep != nil {
		rep.footer()
	}
	return nil
}

// info is what the table's header shows.
func (bn *bench) info() testInfo {
	ti := testInfo{
		device:    bn.o.sockets[0],
		linkLayer: bn.a.port.LinkLayer,
		mtu:       4096, // verbs.ConnectRC's path MTU
		outReads:  int(bn.a.ctx.Config().MaxQPRdAtom),
	}
	addr := func(s *side, i int) qpAddr {
		return qpAddr{lid: s.port.LID, qpn: s.qps[i].Num(), psn: s.qps[i].PSN(), rkey: s.mr.RKey, vaddr: s.mr.Addr + bn.regionOff(i), gid: s.gid}
	}
	for i := range bn.o.qps {
		ti.local = append(ti.local, addr(bn.a, i))
		ti.remote = append(ti.remote, addr(bn.b, i))
	}
	return ti
}

// stall is how long an operation may go without progress before the run
// fails.
func (bn *bench) stall() time.Duration {
	return stallTimeout + time.Duration(bn.maxMsg)*stallPerByte
}

func (bn *bench) regionOff(q int) uint64 { return uint64(q) * bn.region }

// slotOff is the offset in the MR of message buffer k of QP q.
func (bn *bench) slotOff(q int, k uint64) uint64 {
	return bn.regionOff(q) + (k%uint64(bn.slots))*bn.size
}

func (bn *bench) slot(s *side, q int, seq uint64) []byte {
	o := bn.slotOff(q, seq)
	return s.mr.Bytes()[o : o+bn.size]
}

// recvOff is the offset of receive buffer j of QP q on the responder: the
// receive buffers are laid out for the largest size, so receives posted
// for one size fit the next (-a).
func (bn *bench) recvOff(q int, j uint64) uint64 {
	n := max(1, bn.region/bn.maxMsg)
	return bn.regionOff(q) + (j%n)*bn.maxMsg
}

// patternIndex makes operation seq of QP q's pattern unique in the run.
func (bn *bench) patternIndex(q int, seq uint64) uint64 {
	return seq*uint64(bn.o.qps) + uint64(q)
}

// setSize lays the QP regions out for size.
func (bn *bench) setSize(size uint64) {
	bn.size = size
	bn.slots = int(max(1, min(uint64(bn.o.txDepth), bn.region/size)))
	bn.depth = bn.o.txDepth
	if bn.o.verify {
		// Buffers in flight may not be shared when their bytes are checked.
		bn.depth = min(bn.depth, bn.slots)
		if bn.o.op == "send" {
			bn.depth = min(bn.depth, int(max(1, bn.region/bn.maxMsg)))
		}
	}
}

// bwResult is one bandwidth measurement.
type bwResult struct {
	size       uint64
	iters      uint64  // operations measured (all QPs)
	secs       float64 // the time they took
	peakPerSec float64 // bytes per second at the peak; 0: not measured
	depth      int
	slots      int
}

func (r *bwResult) bytesPerSec() float64 { return float64(r.iters) * float64(r.size) / r.secs }

func (r *bwResult) result(o *options) result {
	return result{
		Op: o.op, Size: r.size, Iters: int(r.iters),
		GBytesPerS: r.bytesPerSec() / 1e9,
		Mops:       float64(r.iters) / r.secs / 1e6,
		Verified:   o.verify,
		Seconds:    r.secs,
		TxDepth:    r.depth,
		Slots:      r.slots,
	}
}

// bandwidth runs perftest's bandwidth test for one message size: each QP
// keeps depth operations in flight, for -n operations per QP or for -D.
func (bn *bench) bandwidth(ctx context.Context, size uint64) (*bwResult, error) {
	bn.setSize(size)
	o := &bn.o
	if o.op == "send" {
		if err := bn.fillRecvs(); err != nil {
			return nil, err
		}
	}
	qps := len(bn.qs)
	target := make([]uint64, qps) // posted count at which each QP stops (iterations)
	base := make([]uint64, qps)
	for q := range bn.qs {
		base[q] = bn.qs[q].done
		target[q] = bn.qs[q].posted + uint64(o.iters)
	}
	// The peak needs every post's and completion's time, as perftest
	// records them: only for runs of at most 20000 iterations per QP.
	var tposted, tcompleted []int64
	peak := o.duration == 0 && o.iters <= peakItersLimit
	if peak {
		tposted = make([]int64, 0, o.iters*qps)
		tcompleted = make([]int64, 0, o.iters*qps)
	}
	start := time.Now()
	var end, sampleStart, sampleEnd time.Time
	var doneAtStart, doneAtEnd uint64
	sampling, sampled := false, false
	if o.duration != 0 {
		// perftest: a quarter of the duration, in whole seconds, before and
		// after the sample.
		margin := time.Duration(int64(o.duration/time.Second)/4) * time.Second
		end = start.Add(o.duration)
		sampleStart, sampleEnd = start.Add(margin), end.Add(-margin)
	}
	total := func() (n uint64) {
		for q := range bn.qs {
			n += bn.qs[q].done
		}
		return n
	}
	completed := func(n uint64) {
		if peak {
			t := int64(time.Since(start))
			for range n {
				tcompleted = append(tcompleted, t)
			}
		}
	}
	last := time.Now()
	for spins := 0; ; {
		now := time.Now()
		posting := true
		if o.duration != 0 {
			if !sampling && !sampled && !now.Before(sampleStart) {
				sampling, sampleStart, doneAtStart = true, now, total()
			}
			if sampling && !now.Before(sampleEnd) {
				sampling, sampled, sampleEnd, doneAtEnd = false, true, now, total()
			}
			posting = now.Before(end)
		}
		busy := false
		for q := range bn.qs {
			st := &bn.qs[q]
			for posting && st.posted-st.done < uint64(bn.depth) && (o.duration != 0 || st.posted < target[q]) {
				if err := bn.post(q); err != nil {
					return nil, err
				}
				if peak {
					tposted = append(tposted, int64(time.Since(start)))
				}
			}
			busy = busy || st.posted != st.done
		}
		if !busy && (o.duration == 0 || !posting) {
			break
		}
		n, err := bn.poll(completed)
		if err != nil {
			return nil, err
		}
		if n > 0 {
			last, spins = time.Now(), 0
			continue
		}
		if spins++; spins&1023 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if time.Since(last) > bn.stall() {
				return nil, fmt.Errorf("no completion for %v (%s, %d-byte messages)", bn.stall(), bn.progress(), size)
			}
		}
		runtime.Gosched()
	}
	r := &bwResult{size: size, depth: bn.depth, slots: bn.slots}
	if o.duration != 0 {
		if !sampled { // the loop ended at the same instant as the sample
			sampleEnd, doneAtEnd = time.Now(), total()
		}
		r.iters, r.secs = doneAtEnd-doneAtStart, sampleEnd.Sub(sampleStart).Seconds()
		return r, nil
	}
	for q := range bn.qs {
		r.iters += bn.qs[q].done - base[q]
	}
	r.secs = time.Since(start).Seconds()
	if peak && len(tcompleted) > 0 {
		r.secs = time.Duration(tcompleted[len(tcompleted)-1]).Seconds()
		if ns := peakInterval(tposted, tcompleted); ns > 0 {
			r.peakPerSec = float64(size) / (ns / 1e9)
		}
	}
	return r, nil
}

func (bn *bench) progress() string {
	var posted, done uint64
	for _, st := range bn.qs {
		posted, done = posted+st.posted, done+st.done
	}
	return fmt.Sprintf("posted %d, completed %d", posted, done)
}

// peakInterval is perftest's peak: the least time per operation over any
// run of consecutive operations i…j, (tcompleted[j] - tposted[i]) /
// (j - i + 1), in nanoseconds. perftest tries every pair; a binary search
// on the answer finds the same minimum in linear time per step: some i ≤ j
// has tcompleted[j] - tposted[i] ≤ λ(j-i+1) iff tcompleted[j] - λ(j+1) ≤
// max over i ≤ j of tposted[i] - λi.
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
