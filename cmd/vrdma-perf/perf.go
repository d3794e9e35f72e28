package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"time"

	"github.com/vrdma/vrdma/internal/perftest"
	"github.com/vrdma/vrdma/virtio/rdma"
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
	ctx  *rdma.Context
	f    *frontend.Frontend
	gid  [16]byte
	port rdma.PortAttr
	pd   *rdma.PD
	cq   *rdma.CQ
	qps  []*rdma.QP
	buf  *rdma.Buffer
	mr   *rdma.MR
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
		qp, err := s.pd.CreateQP(rdma.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq,
			Cap: rdma.QPCap{MaxSendWR: sq, MaxRecvWR: rq, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			return fail(fmt.Sprintf("create qp %d", i), err)
		}
		s.qps = append(s.qps, qp)
	}
	if s.buf, err = s.ctx.AllocBuffer(bufBytes); err != nil {
		return fail("alloc buffer", err)
	}
	if s.mr, err = s.pd.RegMR(s.buf, 0, bufBytes, rdma.AccessAll); err != nil {
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
	wr     [1]rdma.SendWR
	rwr    [1]rdma.RecvWR
	wc     []rdma.WC
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
		wc: make([]rdma.WC, 64), out: out}
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
	remote := rdma.AccessRemoteWrite | rdma.AccessRemoteRead | rdma.AccessRemoteAtomic
	for i := range o.qps {
		if err := bn.a.qps[i].ConnectRC(bn.b.gid, bn.b.qps[i].Num(), remote); err != nil {
			return fmt.Errorf("connect requester qp %d: %w", i, err)
		}
		if err := bn.b.qps[i].ConnectRC(bn.a.gid, bn.a.qps[i].Num(), remote); err != nil {
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
		mtu:       4096, // rdma.ConnectRC's path MTU
		outReads:  int(bn.a.ctx.Config().MaxQPRdAtom),
	}
	addr := func(s *side, i int) qpAddr {
		return qpAddr{lid: s.port.LID, qpn: s.qps[i].Num(), rkey: s.mr.RKey, vaddr: s.mr.Addr + bn.regionOff(i), gid: s.gid}
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

// post posts QP q's next operation.
func (bn *bench) post(q int) error {
	st := &bn.qs[q]
	seq := st.posted
	a, b := bn.a, bn.b
	off := bn.slotOff(q, seq)
	wr := &bn.wr[0]
	*wr = rdma.SendWR{WRID: uint64(q)<<wridShift | seq&wridSeq, Flags: rdma.WRFlagSignaled, SGL: wr.SGL[:0]}
	if cap(wr.SGL) == 0 {
		wr.SGL = make([]rdma.SGE, 0, 1)
	}
	wr.SGL = append(wr.SGL, rdma.SGE{Addr: a.mr.Addr + off, Length: uint32(bn.size), LKey: a.mr.LKey})
	pi := bn.patternIndex(q, seq)
	switch bn.o.op {
	case "write":
		if bn.o.verify {
			perftest.Pattern(bn.slot(a, q, seq), pi)
		}
		wr.Opcode, wr.RemoteAddr, wr.RKey = rdma.WROpRDMAWrite, b.mr.Addr+off, b.mr.RKey
	case "read":
		if bn.o.verify {
			perftest.Pattern(bn.slot(b, q, seq), pi)
		}
		wr.Opcode, wr.RemoteAddr, wr.RKey = rdma.WROpRDMARead, b.mr.Addr+off, b.mr.RKey
	case "send":
		if bn.o.verify {
			perftest.Pattern(bn.slot(a, q, seq), pi)
		}
		wr.Opcode = rdma.WROpSend
	case "atomic":
		wr.Opcode, wr.RemoteAddr, wr.RKey, wr.CompareAdd = rdma.WROpAtomicFetchAdd, b.mr.Addr+bn.regionOff(q), b.mr.RKey, 1
	}
	if err := bn.postSend(a.qps[q], nil); err != nil {
		return fmt.Errorf("post %s %d on qp %d: %w", bn.o.op, seq, q, err)
	}
	st.posted++
	return nil
}

// postSend posts bn.wr on qp. The device may complete a WQE before it
// advances sq_ci past it: a full send queue is then a matter of
// microseconds. drain, if not nil, is called while it waits.
func (bn *bench) postSend(qp *rdma.QP, drain func() error) error {
	var deadline time.Time
	for {
		err := qp.PostSend(bn.wr[:]...)
		if !errors.Is(err, rdma.ErrQueueFull) {
			return err
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(bn.stall())
		} else if time.Now().After(deadline) {
			return fmt.Errorf("send queue full for %v", bn.stall())
		}
		if drain != nil {
			if err := drain(); err != nil {
				return err
			}
		}
		runtime.Gosched()
	}
}

// fillRecvs posts receives on the responder until each QP has depth.
func (bn *bench) fillRecvs() error {
	for q := range bn.qs {
		for st := &bn.qs[q]; st.recvs-st.recvd < uint64(bn.depth); {
			if err := bn.postRecv(q); err != nil {
				return err
			}
		}
	}
	return nil
}

// postRecv posts QP q's next receive on the responder.
func (bn *bench) postRecv(q int) error {
	st := &bn.qs[q]
	j := st.recvs
	r := &bn.rwr[0]
	if cap(r.SGL) == 0 {
		r.SGL = make([]rdma.SGE, 1)
	}
	r.WRID = uint64(q)<<wridShift | j&wridSeq
	r.SGL[0] = rdma.SGE{Addr: bn.b.mr.Addr + bn.recvOff(q, j), Length: uint32(bn.maxMsg), LKey: bn.b.mr.LKey}
	if err := bn.b.qps[q].PostRecv(bn.rwr[:]...); err != nil {
		return fmt.Errorf("post recv %d on qp %d: %w", j, q, err)
	}
	st.recvs++
	return nil
}

func wcErr(side string, wc *rdma.WC) error {
	return fmt.Errorf("%s: qp %d: work request %d completed with status %d (vendor error %d)",
		side, wc.WRID>>wridShift, wc.WRID&wridSeq, wc.Status, wc.VendorErr)
}

// wcQP returns the QP index of a completion, checked.
func (bn *bench) wcQP(side string, wc *rdma.WC) (int, error) {
	q := wc.WRID >> wridShift
	if q >= uint64(len(bn.qs)) {
		return 0, fmt.Errorf("%s: completion for an unknown work request %#x", side, wc.WRID)
	}
	return int(q), nil
}

// poll reaps the completions there are, checking (and with --verify,
// verifying) each; completed is told how many operations completed. It
// returns the number of completions reaped.
func (bn *bench) poll(completed func(uint64)) (int, error) {
	n, err := bn.a.cq.Poll(bn.wc)
	if err != nil {
		return 0, err
	}
	for i := range bn.wc[:n] {
		wc := &bn.wc[i]
		if wc.Status != rdma.WCSuccess {
			return 0, wcErr("requester", wc)
		}
		q, err := bn.wcQP("requester", wc)
		if err != nil {
			return 0, err
		}
		st := &bn.qs[q]
		if bn.o.op == "send" {
			st.sent++
			if d := min(st.sent, st.recvd); d > st.done {
				completed(d - st.done)
				st.done = d
			}
			continue
		}
		if err := bn.check(q, wc); err != nil {
			return 0, err
		}
		st.done++
		completed(1)
	}
	if bn.o.op != "send" {
		return n, nil
	}
	m, err := bn.b.cq.Poll(bn.wc)
	if err != nil {
		return 0, err
	}
	for i := range bn.wc[:m] {
		wc := &bn.wc[i]
		if wc.Status != rdma.WCSuccess {
			return 0, wcErr("responder", wc)
		}
		q, err := bn.wcQP("responder", wc)
		if err != nil {
			return 0, err
		}
		if err := bn.check(q, wc); err != nil {
			return 0, err
		}
		st := &bn.qs[q]
		st.recvd++
		if err := bn.postRecv(q); err != nil {
			return 0, err
		}
		if d := min(st.sent, st.recvd); d > st.done {
			completed(d - st.done)
			st.done = d
		}
	}
	return n + m, nil
}

// check verifies one completion of QP q: in order, and with --verify the
// bytes that arrived.
func (bn *bench) check(q int, wc *rdma.WC) error {
	st := &bn.qs[q]
	want := st.done
	if bn.o.op == "send" {
		want = st.recvd
	}
	if got := wc.WRID & wridSeq; got != want&wridSeq {
		return fmt.Errorf("qp %d: completion for work request %d, want %d (out of order)", q, got, want&wridSeq)
	}
	if !bn.o.verify {
		return nil
	}
	seq := want
	pi := bn.patternIndex(q, seq)
	var ok bool
	switch bn.o.op {
	case "write", "read":
		// Each buffer holds the operation's pattern on the source side;
		// the destination must hold the same bytes.
		src, dst := bn.slot(bn.a, q, seq), bn.slot(bn.b, q, seq)
		ok = bytes.Equal(src, dst) && perftest.PatternOK(src, pi)
	case "send":
		if wc.ByteLen != uint32(bn.size) {
			return fmt.Errorf("verify: qp %d: receive %d got %d bytes, want %d", q, seq, wc.ByteLen, bn.size)
		}
		ro := bn.recvOff(q, seq)
		got := bn.b.mr.Bytes()[ro : ro+bn.size]
		ok = bytes.Equal(bn.slot(bn.a, q, seq), got) && perftest.PatternOK(got, pi)
	case "atomic":
		if v := binary.LittleEndian.Uint64(bn.slot(bn.a, q, seq)); v != seq {
			return fmt.Errorf("verify: qp %d: fetch-and-add %d returned %d, want %d", q, seq, v, seq)
		}
		ok = true
	}
	if !ok {
		return fmt.Errorf("verify: qp %d: %s %d: bytes that arrived differ from the pattern sent", q, bn.o.op, seq)
	}
	return nil
}

// latencyPass measures one operation at a time on QP 0, post to
// completion, after a bandwidth test with --json (lat_us_* of r).
func (bn *bench) latencyPass(ctx context.Context, r *result) error {
	saved := bn.depth
	bn.depth = 1
	defer func() { bn.depth = saved }()
	if bn.o.op == "send" {
		if err := bn.fillRecvs(); err != nil {
			return err
		}
	}
	st := &bn.qs[0]
	lat := make([]time.Duration, bn.o.latIters)
	for i := range lat {
		t0 := time.Now()
		if err := bn.post(0); err != nil {
			return err
		}
		last := time.Now()
		for spins := 0; st.done < st.posted; {
			n, err := bn.poll(func(uint64) {})
			if err != nil {
				return err
			}
			if n > 0 {
				last = time.Now()
				continue
			}
			if spins++; spins&1023 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
				if time.Since(last) > bn.stall() {
					return fmt.Errorf("latency pass: no completion for %v", bn.stall())
				}
			}
			runtime.Gosched()
		}
		lat[i] = time.Since(t0)
	}
	r.SetLatencies(lat)
	return nil
}
