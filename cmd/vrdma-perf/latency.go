package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"slices"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/perftest"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// latTail is perftest's LAT_MEASURE_TAIL: the largest samples left out.
const latTail = 2

// recvWRID marks the work request IDs of receives in a latency test.
const recvWRID = 1 << 62

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

// latTest is the state of one latency test on QP 0.
type latTest struct {
	bn           *bench
	size         uint64
	inA, inB     []byte // inboxes: the peer writes or sends here
	outA, outB   []byte // outboxes: the source of writes and sends
	inOff        uint64
	outOff       uint64
	pendA, pendB int // signaled sends whose completion is not reaped yet
	recvA, recvB int // receive completions reaped
	seq          uint64
}

// latency runs perftest's latency test for one message size: -n
// iterations (or -D), one operation at a time on QP 0.
func (bn *bench) latency(ctx context.Context, size uint64) (*latResult, error) {
	bn.setSize(size)
	o := &bn.o
	lt := &latTest{bn: bn, size: size, inOff: bn.regionOff(0), outOff: bn.regionOff(0) + bn.maxMsg}
	lt.inA = bn.a.mr.Bytes()[lt.inOff : lt.inOff+size]
	lt.inB = bn.b.mr.Bytes()[lt.inOff : lt.inOff+size]
	lt.outA = bn.a.mr.Bytes()[lt.outOff : lt.outOff+size]
	lt.outB = bn.b.mr.Bytes()[lt.outOff : lt.outOff+size]
	rtt := 1.0
	switch o.op {
	case "write":
		rtt = 2
		// No stale byte may look like the first one expected.
		lt.inA[size-1], lt.inB[size-1] = ^lt.expect(0, false), ^lt.expect(0, true)
	case "send":
		rtt = 2
		for range latRecvs {
			if err := lt.postRecvs(); err != nil {
				return nil, err
			}
		}
	case "atomic":
		clear(lt.inB[:8])
	}
	iter := map[string]func(context.Context, uint64) error{
		"write": lt.writePingPong, "send": lt.sendPingPong, "read": lt.oneSided, "atomic": lt.oneSided,
	}[o.op]

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
	r.size = size
	if err := lt.drain(ctx); err != nil {
		return nil, err
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

func (lt *latTest) wr(op int, from, to *side, srcOff, dstOff uint64) {
	bn := lt.bn
	wr := &bn.wr[0]
	*wr = verbs.SendWR{WRID: lt.seq, Opcode: op, Flags: abi.WRFlagSignaled, SGL: wr.SGL[:0]}
	lt.seq++
	if cap(wr.SGL) == 0 {
		wr.SGL = make([]abi.SGE, 0, 1)
	}
	wr.SGL = append(wr.SGL, abi.SGE{Addr: from.mr.Addr + srcOff, Length: uint32(lt.size), LKey: from.mr.LKey})
	if op != abi.WROpSend {
		wr.RemoteAddr, wr.RKey = to.mr.Addr+dstOff, to.mr.RKey
	}
}

// reap polls s's CQ once: send completions lower *pend, receive
// completions (with their check) raise *recvd.
func (lt *latTest) reap(s *side, name string, pend, recvd *int) error {
	bn := lt.bn
	n, err := s.cq.Poll(bn.wc)
	if err != nil {
		return err
	}
	for i := range bn.wc[:n] {
		wc := &bn.wc[i]
		if wc.Status != abi.WCSuccess {
			return fmt.Errorf("%s: work request %#x completed with status %d (vendor error %d)", name, wc.WRID, wc.Status, wc.VendorErr)
		}
		if wc.WRID&recvWRID == 0 {
			*pend--
			continue
		}
		if wc.ByteLen != uint32(lt.size) {
			return fmt.Errorf("%s: receive of %d bytes, want %d", name, wc.ByteLen, lt.size)
		}
		*recvd++
	}
	return nil
}

// spin calls step until done reports true, bounded by the stall timeout.
func (lt *latTest) spin(ctx context.Context, what string, step func() (bool, error)) error {
	start := time.Now()
	for spins := 0; ; spins++ {
		ok, err := step()
		if err != nil || ok {
			return err
		}
		if spins&1023 == 1023 {
			if err := ctx.Err(); err != nil {
				return err
			}
			if time.Since(start) > lt.bn.stall() {
				return fmt.Errorf("%s: nothing for %v", what, lt.bn.stall())
			}
			runtime.Gosched()
		}
	}
}

func (lt *latTest) postA() error {
	lt.pendA++
	return lt.bn.postSend(lt.bn.a.qps[0], func() error { return lt.reap(lt.bn.a, "requester", &lt.pendA, &lt.recvA) })
}

func (lt *latTest) postB() error {
	lt.pendB++
	return lt.bn.postSend(lt.bn.b.qps[0], func() error { return lt.reap(lt.bn.b, "responder", &lt.pendB, &lt.recvB) })
}

// writePingPong is one iteration of ib_write_lat: A writes B's inbox, B
// sees the last byte change and writes A's inbox, A sees it.
func (lt *latTest) writePingPong(ctx context.Context, i uint64) error {
	bn := lt.bn
	lt.fill(lt.outA, i, false)
	lt.wr(abi.WROpRDMAWrite, bn.a, bn.b, lt.outOff, lt.inOff)
	if err := lt.postA(); err != nil {
		return fmt.Errorf("post write %d: %w", i, err)
	}
	if err := lt.arrive(ctx, lt.inB, i, false, bn.a, "requester", &lt.pendA); err != nil {
		return err
	}
	lt.fill(lt.outB, i, true)
	lt.wr(abi.WROpRDMAWrite, bn.b, bn.a, lt.outOff, lt.inOff)
	if err := lt.postB(); err != nil {
		return fmt.Errorf("post write %d back: %w", i, err)
	}
	if err := lt.arrive(ctx, lt.inA, i, true, bn.b, "responder", &lt.pendB); err != nil {
		return err
	}
	var none int
	if err := lt.reap(bn.a, "requester", &lt.pendA, &none); err != nil {
		return err
	}
	return lt.reap(bn.b, "responder", &lt.pendB, &none)
}

// arrive waits until write i's last byte is in in; with --verify it then
// waits for the writer's completion (every byte placed) and checks them.
func (lt *latTest) arrive(ctx context.Context, in []byte, i uint64, fromB bool, writer *side, name string, pend *int) error {
	want := lt.expect(i, fromB)
	last := len(in) - 1
	if err := lt.spin(ctx, fmt.Sprintf("write %d", i), func() (bool, error) { return loadByte(in, last) == want, nil }); err != nil {
		return err
	}
	if !lt.bn.o.verify {
		return nil
	}
	var none int
	if err := lt.spin(ctx, fmt.Sprintf("completion of write %d", i), func() (bool, error) {
		return *pend == 0, lt.reap(writer, name, pend, &none)
	}); err != nil {
		return err
	}
	if !perftest.PatternOK(in, lt.patternIndex(i, fromB)) {
		return fmt.Errorf("verify: write %d: bytes that arrived differ from the pattern sent", i)
	}
	return nil
}

// postRecvs posts one receive on each side, into its inbox.
func (lt *latTest) postRecvs() error {
	bn := lt.bn
	for _, s := range []*side{bn.a, bn.b} {
		r := &bn.rwr[0]
		if cap(r.SGL) == 0 {
			r.SGL = make([]abi.SGE, 1)
		}
		r.WRID = recvWRID | lt.seq
		lt.seq++
		r.SGL[0] = abi.SGE{Addr: s.mr.Addr + lt.inOff, Length: uint32(bn.maxMsg), LKey: s.mr.LKey}
		if err := s.qps[0].PostRecv(bn.rwr[:]...); err != nil {
			return fmt.Errorf("post recv: %w", err)
		}
	}
	return nil
}

// sendPingPong is one iteration of ib_send_lat: A sends, B receives and
// sends back, A receives.
func (lt *latTest) sendPingPong(ctx context.Context, i uint64) error {
	bn := lt.bn
	for _, d := range []struct {
		from, to   *side
		out, in    []byte
		fromB      bool
		post       func() error
		name, peer string
		pend, recv *int
	}{
		{bn.a, bn.b, lt.outA, lt.inB, false, lt.postA, "requester", "responder", &lt.pendB, &lt.recvB},
		{bn.b, bn.a, lt.outB, lt.inA, true, lt.postB, "responder", "requester", &lt.pendA, &lt.recvA},
	} {
		lt.fill(d.out, i, d.fromB)
		lt.wr(abi.WROpSend, d.from, d.to, lt.outOff, 0)
		if err := d.post(); err != nil {
			return fmt.Errorf("%s: post send %d: %w", d.name, i, err)
		}
		want := *d.recv + 1
		if err := lt.spin(ctx, fmt.Sprintf("receive %d", i), func() (bool, error) {
			return *d.recv >= want, lt.reap(d.to, d.peer, d.pend, d.recv)
		}); err != nil {
			return err
		}
		if bn.o.verify && !perftest.PatternOK(d.in, lt.patternIndex(i, d.fromB)) {
			return fmt.Errorf("verify: send %d: bytes that arrived differ from the pattern sent", i)
		}
		// Replace the receive just used (on the receiving side only).
		r := &bn.rwr[0]
		if cap(r.SGL) == 0 {
			r.SGL = make([]abi.SGE, 1)
		}
		r.WRID = recvWRID | lt.seq
		lt.seq++
		r.SGL[0] = abi.SGE{Addr: d.to.mr.Addr + lt.inOff, Length: uint32(bn.maxMsg), LKey: d.to.mr.LKey}
		if err := d.to.qps[0].PostRecv(bn.rwr[:]...); err != nil {
			return fmt.Errorf("%s: post recv: %w", d.peer, err)
		}
	}
	var none int
	if err := lt.reap(bn.a, "requester", &lt.pendA, &none); err != nil {
		return err
	}
	return lt.reap(bn.b, "responder", &lt.pendB, &none)
}

// oneSided is one iteration of ib_read_lat or ib_atomic_lat: post, wait
// for the completion.
func (lt *latTest) oneSided(ctx context.Context, i uint64) error {
	bn := lt.bn
	op := abi.WROpRDMARead
	if bn.o.op == "atomic" {
		op = abi.WROpAtomicFetchAdd
	} else if bn.o.verify {
		perftest.Pattern(lt.inB, 2*i)
	}
	lt.wr(op, bn.a, bn.b, lt.outOff, lt.inOff)
	if op == abi.WROpAtomicFetchAdd {
		bn.wr[0].CompareAdd = 1
	}
	if err := lt.postA(); err != nil {
		return fmt.Errorf("post %s %d: %w", bn.o.op, i, err)
	}
	var none int
	if err := lt.spin(ctx, fmt.Sprintf("%s %d", bn.o.op, i), func() (bool, error) {
		return lt.pendA == 0, lt.reap(bn.a, "requester", &lt.pendA, &none)
	}); err != nil {
		return err
	}
	if !bn.o.verify {
		return nil
	}
	if bn.o.op == "atomic" {
		if v := binary.LittleEndian.Uint64(lt.outA); v != i {
			return fmt.Errorf("verify: fetch-and-add %d returned %d, want %d", i, v, i)
		}
		return nil
	}
	if !perftest.PatternOK(lt.outA, 2*i) {
		return fmt.Errorf("verify: read %d: bytes that arrived differ from the pattern", i)
	}
	return nil
}

// drain waits for the completions of every send still pending.
func (lt *latTest) drain(ctx context.Context) error {
	var none int
	return lt.spin(ctx, "last completions", func() (bool, error) {
		if err := lt.reap(lt.bn.a, "requester", &lt.pendA, &none); err != nil {
			return false, err
		}
		err := lt.reap(lt.bn.b, "responder", &lt.pendB, &none)
		return lt.pendA == 0 && lt.pendB == 0, err
	})
}
