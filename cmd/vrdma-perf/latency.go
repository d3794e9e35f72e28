package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/perftest"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// latTail is perftest's LAT_MEASURE_TAIL: the largest samples left out.
const latTail = 2

// errPeerDone ends a two-process responder's ping-pong loop: the peer is
// done with the size (-D).
var errPeerDone = errors.New("the peer is done")

// latResult is one latency measurement, in microseconds.
type latResult struct {
	size  uint64
	iters uint64
	secs  float64 // the run (iterations) or the sample (duration)
	// Iterations: perftest's statistics of the time between posts.
	min, max, typical, avg, stdev, p99, p999 float64
	// Duration: the mean time per operation and operations per second.
	duration bool
	tps      float64
}

func (r *latResult) result(o *options) result {
	res := result{
		Op: o.op + "_lat", Size: r.size, Iters: int(r.iters), Verified: o.verify, Seconds: r.secs,
		LatAvg: r.avg, LatP50: r.typical, LatP99: r.p99, LatIters: int(r.iters), TxDepth: 1, Slots: 2,
	}
	if r.secs > 0 {
		res.GBytesPerS = float64(r.iters) * float64(r.size) / r.secs / 1e9
		res.Mops = float64(r.iters) / r.secs / 1e6
	}
	return res
}

// latStats computes perftest's latency figures (print_report_lat) from the
// times of consecutive posts: the differences, sorted, without the
// largest two, divided by rtt (2 for the ping-pong tests, which report
// half a round trip), in microseconds.
func latStats(posts []time.Duration, rtt float64) (r latResult, err error) {
	if len(posts) < 2+latTail+1 {
		return r, fmt.Errorf("%d iterations: a latency test needs at least %d", len(posts), 2+latTail+1)
	}
	d := make([]float64, len(posts)-1)
	for i := range d {
		d[i] = float64(posts[i+1]-posts[i]) / float64(time.Microsecond) / rtt
	}
	slices.Sort(d)
	n := len(d) - latTail
	if (n-1)%2 != 0 {
		r.typical = (d[n/2] + d[n/2-1]) / 2
	} else {
		r.typical = d[n/2]
	}
	var sum float64
	for _, v := range d[:n] {
		sum += v
	}
	r.avg = sum / float64(n)
	var sq float64
	for _, v := range d[:n] {
		sq += (v - r.avg) * (v - r.avg)
	}
	r.stdev = math.Sqrt(sq / float64(n))
	r.min, r.max = d[0], d[n]
	r.p99 = d[int(math.Ceil(float64(n)*0.99))]
	r.p999 = d[int(math.Ceil(float64(n)*0.999))]
	r.iters = uint64(len(posts))
	return r, nil
}

// latEnd is one end of a latency test on QP 0 of flow 0: end 0 the client
// (it pings, and it measures), end 1 the server.
type latEnd struct {
	s       *side // nil where the peer process runs this end
	isB     bool
	in, out []byte  // the inbox (the other end writes or sends here) and the outbox
	dst     peerBuf // the other end's buffer
	pend    int     // signaled sends whose completion is not reaped yet
	recvd   int     // receive completions reaped
	used    int     // receives await took: a peer process may send the next before this end looks
}

// latTest is the state of one size's latency test.
type latTest struct {
	bn            *bench
	size          uint64
	inOff, outOff uint64
	ends          [2]*latEnd
	seq           uint64 // work request IDs
	count         uint64 // iterations run
}

// latPrepare readies the local ends for size: a stale inbox byte cannot
// pass for the first write, the receives of a send test are posted, a read
// test's source holds its pattern and an atomic test's counter is zero.
func (bn *bench) latPrepare(size uint64) error {
	f := bn.flows[0]
	lt := &latTest{bn: bn, size: size, inOff: bn.areaOff(0, 0), outOff: bn.areaOff(0, 0) + bn.maxMsg}
	for i, s := range []*side{f.req, f.resp} {
		e := &latEnd{s: s, isB: i == 1}
		lt.ends[i] = e
		if s == nil {
			continue
		}
		b := s.mr.Bytes()
		e.in, e.out = b[lt.inOff:lt.inOff+size], b[lt.outOff:lt.outOff+size]
		switch bn.o.op {
		case "write":
			e.in[size-1] = ^lt.expect(0, !e.isB)
		case "send":
			for ; bn.latRecvs[i] < latRecvs; bn.latRecvs[i]++ {
				if err := lt.postRecv(e); err != nil {
					return err
				}
			}
		case "read":
			if e.isB && bn.o.verify {
				perftest.Pattern(e.in, latReadPattern)
			}
		case "atomic":
			if e.isB {
				clear(e.in[:8])
			}
		}
	}
	lt.ends[0].dst, lt.ends[1].dst = f.dst, f.back
	bn.lt = lt
	return nil
}

// latReadPattern is the pattern of a read latency test's source.
const latReadPattern = 1

// latency runs perftest's latency test for the size latPrepare readied:
// -n iterations (or -D), one operation at a time on QP 0. The client end
// measures; a server end alone answers pings until the client is done and
// returns no result.
func (bn *bench) latency(ctx context.Context) (*latResult, error) {
	o := &bn.o
	lt := bn.lt
	rtt, iter := 1.0, lt.oneSided
	if o.op == "write" || o.op == "send" {
		rtt, iter = 2, lt.pingPong
	}
	if lt.ends[0].s == nil {
		if o.op == "read" || o.op == "atomic" {
			return nil, nil // the client's reads and atomics need nothing of the server's process
		}
		for i := uint64(0); o.duration != 0 || i < uint64(o.iters); i++ {
			if err := iter(ctx, i); errors.Is(err, errPeerDone) {
				break
			} else if err != nil {
				return nil, err
			}
		}
		return nil, lt.drain(ctx)
	}
	start := time.Now()
	var r *latResult
	if o.duration == 0 {
		posts := make([]time.Duration, o.iters)
		for i := range posts {
			posts[i] = time.Since(start)
			if err := iter(ctx, uint64(i)); err != nil {
				return nil, err
			}
		}
		secs := time.Since(start).Seconds()
		st, err := latStats(posts, rtt)
		if err != nil {
			return nil, err
		}
		st.secs = secs
		r = &st
	} else {
		margin := time.Duration(int64(o.duration/time.Second)/4) * time.Second
		end := start.Add(o.duration)
		sampleStart, sampleEnd := start.Add(margin), end.Add(-margin)
		var n, first uint64
		var t0, t1 time.Time
		for i := uint64(0); ; i++ {
			now := time.Now()
			if t0.IsZero() && !now.Before(sampleStart) {
				t0, first = now, i
			}
			if !now.Before(sampleEnd) || !now.Before(end) {
				t1, n = now, i-first
				break
			}
			if err := iter(ctx, i); err != nil {
				return nil, err
			}
		}
		secs := t1.Sub(t0).Seconds()
		r = &latResult{duration: true, iters: n, secs: secs}
		if n > 0 {
			r.avg = secs * 1e6 / rtt / float64(n)
			r.tps = float64(n) / secs
		}
	}
	r.size = lt.size
	bn.flows[0].qs[0].posted += lt.count
	if err := lt.drain(ctx); err != nil {
		return nil, err
	}
	if lt.ends[1].s != nil {
		if err := lt.finalCheck(lt.count); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// expect is the last byte of write i (from B when fromB), which the peer
// polls for: the pattern's with --verify, else i+1 as perftest's counter.
func (lt *latTest) expect(i uint64, fromB bool) byte {
	if !lt.bn.o.verify {
		return byte(i + 1)
	}
	// perftest.Pattern's byte j of operation k: byte(k*131+7) + byte(j) + byte(j>>8)*3.
	j := lt.size - 1
	k := lt.patternIndex(i, fromB)
	return byte(k*131+7) + byte(j) + byte(j>>8)*3
}

// patternIndex numbers the two directions' operations apart.
func (lt *latTest) patternIndex(i uint64, fromB bool) uint64 {
	if fromB {
		return 2*i + 1
	}
	return 2 * i
}

// fill writes operation i's bytes into out: the whole pattern with
// --verify, else the last byte only (perftest's counter).
func (lt *latTest) fill(out []byte, i uint64, fromB bool) {
	if lt.bn.o.verify {
		perftest.Pattern(out, lt.patternIndex(i, fromB))
		return
	}
	out[len(out)-1] = lt.expect(i, fromB)
}

// wr sets bn.wr to op from e's outbox (or into it, a read or an atomic)
// at the other end's inbox.
func (lt *latTest) wr(op int, e *latEnd) {
	bn := lt.bn
	wr := &bn.wr[0]
	*wr = verbs.SendWR{WRID: lt.seq, Opcode: op, Flags: abi.WRFlagSignaled, SGL: wr.SGL[:0]}
	lt.seq++
	if cap(wr.SGL) == 0 {
		wr.SGL = make([]abi.SGE, 0, 1)
	}
	if (op == abi.WROpRDMAWrite || op == abi.WROpSend) && lt.size <= uint64(e.s.link.inline) {
		wr.Inline, wr.Flags = e.out, wr.Flags|abi.WRFlagInline
	} else {
		wr.SGL = append(wr.SGL, abi.SGE{Addr: e.s.mr.Addr + lt.outOff, Length: uint32(lt.size), LKey: e.s.mr.LKey})
	}
	if op != abi.WROpSend {
		wr.RemoteAddr, wr.RKey = e.dst.addr+lt.inOff, e.dst.rkey
	}
}

// reap polls e's CQ once: send completions lower e.pend, receive
// completions (their length checked) raise e.recvd.
func (lt *latTest) reap(e *latEnd) error {
	bn := lt.bn
	n, err := e.s.cq.Poll(bn.wc)
	if err != nil {
		return fmt.Errorf("%s: poll cq: %w", e.s.name, err)
	}
	for i := range bn.wc[:n] {
		wc := &bn.wc[i]
		if wc.Status != abi.WCSuccess {
			return fmt.Errorf("%s: work request %#x completed with error %s (status %d, vendor error %#x)",
				e.s.name, wc.WRID, wcStatusName(wc.Status), uint8(wc.Status), wc.VendorErr)
		}
		if wc.WRID&wridRecv == 0 {
			e.pend--
			continue
		}
		if wc.ByteLen != uint32(lt.size) {
			return fmt.Errorf("%s: receive of %d bytes, want %d", e.s.name, wc.ByteLen, lt.size)
		}
		e.recvd++
	}
	return nil
}

// spin calls step until done reports true, bounded by the stall timeout;
// now and then it looks at the context and the peer process: with -D a
// server's wait ends (errPeerDone) when the client is done.
func (lt *latTest) spin(ctx context.Context, what string, step func() (bool, error)) error {
	bn := lt.bn
	start := time.Now()
	for spins := 0; ; spins++ {
		ok, err := step()
		if err != nil || ok {
			return err
		}
		if spins&1023 == 1023 {
			if err := bn.idle(ctx, start, "%s", what); err != nil {
				return err
			}
			if bn.peer != nil && lt.ends[0].s == nil && bn.peer.peerDone(lt.size) {
				return errPeerDone
			}
		}
		if spins >= spinBeforeYield {
			relax(spins)
		}
	}
}

// post posts bn.wr on e's QP, reaping e's completions while its send
// queue is full.
func (lt *latTest) post(e *latEnd) error {
	e.pend++
	return lt.bn.postSend(e.s.qps[0], func() error { return lt.reap(e) })
}

// postRecv posts one receive on e into its inbox.
func (lt *latTest) postRecv(e *latEnd) error {
	bn := lt.bn
	r := &bn.rwr[0]
	if cap(r.SGL) == 0 {
		r.SGL = make([]abi.SGE, 1)
	}
	r.WRID = wridRecv | lt.seq
	lt.seq++
	r.SGL[0] = abi.SGE{Addr: e.s.mr.Addr + lt.inOff, Length: uint32(bn.maxMsg), LKey: e.s.mr.LKey}
	if err := e.s.qps[0].PostRecv(bn.rwr[:]...); err != nil {
		return fmt.Errorf("%s: post recv: %w", e.s.name, err)
	}
	return nil
}

// pingPong is one iteration of ib_write_lat or ib_send_lat: A writes (or
// sends) to B, B sees it and answers, A sees the answer. Each process runs
// the steps of its local ends.
func (lt *latTest) pingPong(ctx context.Context, i uint64) error {
	a, b := lt.ends[0], lt.ends[1]
	if a.s != nil {
		if err := lt.send(a, i); err != nil {
			return err
		}
	}
	if b.s != nil {
		if err := lt.await(ctx, b, i); err != nil {
			return err
		}
		if err := lt.send(b, i); err != nil {
			return err
		}
	}
	if a.s != nil {
		if err := lt.await(ctx, a, i); err != nil {
			return err
		}
	}
	lt.count++
	for _, e := range lt.ends {
		if e.s != nil {
			if err := lt.reap(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// send posts e's message i to the other end.
func (lt *latTest) send(e *latEnd, i uint64) error {
	op, name := abi.WROpRDMAWrite, "write"
	if lt.bn.o.op == "send" {
		op, name = abi.WROpSend, "send"
	}
	lt.fill(e.out, i, e.isB)
	lt.wr(op, e)
	if err := lt.post(e); err != nil {
		return fmt.Errorf("%s: post %s %d: %w", e.s.name, name, i, err)
	}
	return nil
}

// await waits until the other end's message i is in e's inbox and, with
// --verify, checks every byte of it; a send's receive is replaced.
func (lt *latTest) await(ctx context.Context, e *latEnd, i uint64) error {
	bn := lt.bn
	other := lt.ends[0]
	if !e.isB {
		other = lt.ends[1]
	}
	fromB := !e.isB
	if bn.o.op == "send" {
		if err := lt.spin(ctx, fmt.Sprintf("receive %d", i), func() (bool, error) {
			if e.recvd > e.used {
				return true, nil
			}
			return e.recvd > e.used, lt.reap(e)
		}); err != nil {
			return err
		}
		e.used++
		if bn.o.verify {
			if !perftest.PatternOK(e.in, lt.patternIndex(i, fromB)) {
				return fmt.Errorf("verify: %s: send %d: bytes that arrived differ from the pattern sent", e.s.name, i)
			}
			bn.tally.add(tallySend, 1, lt.size)
		}
		return lt.postRecv(e)
	}
	want, last := lt.expect(i, fromB), len(e.in)-1
	if err := lt.spin(ctx, fmt.Sprintf("write %d", i), func() (bool, error) { return loadByte(e.in, last) == want, nil }); err != nil {
		return err
	}
	if !bn.o.verify {
		return nil
	}
	pi := lt.patternIndex(i, fromB)
	if other.s != nil {
		// The writer is here: once its completion is reaped every byte is
		// placed.
		if err := lt.spin(ctx, fmt.Sprintf("completion of write %d", i), func() (bool, error) {
			return other.pend == 0, lt.reap(other)
		}); err != nil {
			return err
		}
		if !perftest.PatternOK(e.in, pi) {
			return fmt.Errorf("verify: %s: write %d: bytes that arrived differ from the pattern sent", e.s.name, i)
		}
	} else if err := lt.spin(ctx, fmt.Sprintf("write %d's bytes to match its pattern", i), func() (bool, error) {
		// The writer is the peer process: the last byte may land before
		// the others (a message sprayed over paths), so the bytes must
		// come to match, and a wrong one stalls into a failure.
		return perftest.PatternOK(e.in, pi), nil
	}); err != nil {
		return fmt.Errorf("verify: %s: %w", e.s.name, err)
	}
	bn.tally.add(tallyWrite, 1, lt.size)
	return nil
}

// oneSided is one iteration of ib_read_lat or ib_atomic_lat on the client:
// post, wait for the completion.
func (lt *latTest) oneSided(ctx context.Context, i uint64) error {
	bn := lt.bn
	a := lt.ends[0]
	if a.s == nil {
		return nil
	}
	op := abi.WROpRDMARead
	if bn.o.op == "atomic" {
		op = abi.WROpAtomicFetchAdd
	} else if bn.o.verify {
		clear(a.out)
	}
	lt.wr(op, a)
	if op == abi.WROpAtomicFetchAdd {
		bn.wr[0].CompareAdd = 1
	}
	if err := lt.post(a); err != nil {
		return fmt.Errorf("%s: post %s %d: %w", a.s.name, bn.o.op, i, err)
	}
	if err := lt.spin(ctx, fmt.Sprintf("%s %d", bn.o.op, i), func() (bool, error) {
		return a.pend == 0, lt.reap(a)
	}); err != nil {
		return err
	}
	lt.count++
	if !bn.o.verify {
		return nil
	}
	if bn.o.op == "atomic" {
		if v := binary.LittleEndian.Uint64(a.out); v != i {
			return fmt.Errorf("verify: %s: fetch-and-add %d returned %d, want %d", a.s.name, i, v, i)
		}
		bn.tally.add(tallyFetchAdd, 1, atomicSize)
		return nil
	}
	if !perftest.PatternOK(a.out, latReadPattern) {
		return fmt.Errorf("verify: %s: read %d: bytes read differ from the responder's pattern", a.s.name, i)
	}
	bn.tally.add(tallyRead, 1, lt.size)
	return nil
}

// finalCheck checks the server end's buffer after count one-sided
// operations: a read's source unchanged, the counter at count.
func (lt *latTest) finalCheck(count uint64) error {
	b := lt.ends[1]
	if !lt.bn.o.verify || b.s == nil {
		return nil
	}
	switch lt.bn.o.op {
	case "read":
		if !perftest.PatternOK(b.in, latReadPattern) {
			return fmt.Errorf("verify: %s: the buffer changed under the reads", b.s.name)
		}
		lt.bn.tally.add(tallyReadSrc, 1, lt.size)
	case "atomic":
		if got := binary.LittleEndian.Uint64(b.in); got != count {
			return fmt.Errorf("verify: %s: the counter is %d after %d fetch-and-adds", b.s.name, got, count)
		}
		lt.bn.tally.add(tallyCounter, 1, atomicSize)
	}
	return nil
}

// drain waits for the completions of every local send still pending.
func (lt *latTest) drain(ctx context.Context) error {
	saved := lt.bn.peer
	lt.bn.peer = nil // a peer done now is no reason to stop draining
	defer func() { lt.bn.peer = saved }()
	return lt.spin(ctx, "last completions", func() (bool, error) {
		for _, e := range lt.ends {
			if e.s == nil {
				continue
			}
			if err := lt.reap(e); err != nil {
				return false, err
			}
		}
		return (lt.ends[0].s == nil || lt.ends[0].pend == 0) && (lt.ends[1].s == nil || lt.ends[1].pend == 0), nil
	})
}
