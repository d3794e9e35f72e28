package perftest

import (
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// helloRetry is the pause between hellos while the server's QP is not
// ready yet.
const helloRetry = 50 * time.Millisecond

// Run is the client: it connects to the server's endpoint, measures and
// exchanges the end-of-test messages. Verified is true only when the
// client's checks and the server's verdict both passed.
func (s *Side) Run(peer Endpoint) (Result, error) {
	gid, err := peer.gid()
	if err != nil {
		return Result{}, err
	}
	if peer.Size < uint64(s.slots)*s.cfg.Size {
		return Result{}, fmt.Errorf("peer buffer of %d bytes, want %d (different --size/--tx-depth?)", peer.Size, uint64(s.slots)*s.cfg.Size)
	}
	if err := s.hello(gid, peer); err != nil {
		return Result{}, err
	}
	if err := s.postCtrlRecv(1); err != nil {
		return Result{}, fmt.Errorf("post verdict receive: %w", err)
	}
	c := &client{Side: s, peer: peer}
	start := time.Now()
	c.gap.start(start)
	// more: Iters operations, and with a duration until it has passed.
	more := func() bool {
		return c.posted < uint64(s.cfg.Iters) || (s.cfg.Duration > 0 && time.Since(start) < s.cfg.Duration)
	}
	for {
		for c.posted-c.done < uint64(s.depth) && more() {
			if err := c.post(); err != nil {
				return Result{}, err
			}
		}
		if c.done == c.posted {
			break
		}
		if err := c.complete(c.done + 1); err != nil {
			return Result{}, err
		}
	}
	elapsed := time.Since(start)
	bwOps := c.done
	lat := make([]time.Duration, s.cfg.LatIters)
	for i := range lat {
		t0 := time.Now()
		if err := c.post(); err != nil {
			return Result{}, err
		}
		if err := c.complete(c.posted); err != nil {
			return Result{}, err
		}
		lat[i] = time.Since(t0)
	}
	r := result(s.cfg, bwOps, elapsed, lat)
	r.Slots, r.TxDepth, r.Role = s.slots, s.depth, "client"
	r.MaxGapMS, r.Bytes = c.gap.ms(), c.posted*s.cfg.Size
	// Done: the measurements go to the server, which verifies and answers.
	m := message{kind: kindDone, op: opIndex(s.cfg.Op), count: c.posted, size: s.cfg.Size,
		gbps: r.GBytesPerS, mops: r.Mops, p50: r.LatP50, p99: r.LatP99, avg: r.LatAvg, secs: r.Seconds,
		iters: uint64(r.Iters), latIter: uint64(r.LatIters)}
	send := s.sendCtrl
	if s.cfg.sendStream() {
		send = s.sendDoneImm
	}
	if err := send(&m); err != nil {
		return Result{}, fmt.Errorf("send done: %w", err)
	}
	var sent, got bool
	var verdict message
	for !sent || !got {
		wcs, err := s.poll()
		if err != nil {
			return Result{}, fmt.Errorf("end of test: %w", err)
		}
		for i := range wcs {
			wc := &wcs[i]
			if wc.Status != abi.WCSuccess {
				return Result{}, fmt.Errorf("end of test: %w", wcErr(wc))
			}
			switch wc.WRID {
			case ctrlWRID:
				sent = true
			case ctrlWRID | 1:
				if verdict, err = decode(s.ctrlBuf(1)); err != nil || verdict.kind != kindVerdict {
					return Result{}, fmt.Errorf("server verdict: malformed (%v)", err)
				}
				got = true
			}
		}
	}
	if verdict.ok != 1 {
		return r, fmt.Errorf("server: verification failed: %s", verdict.reason)
	}
	r.Verified = s.cfg.Verify
	return r, nil
}

// hello connects and sends the hello until the server's QP accepts it: a
// QP not yet in RTR fails the send (RETRY_EXC_ERR), after which the QP is
// reset and connected again (its QPN, which the server knows, stays).
func (s *Side) hello(gid [16]byte, peer Endpoint) error {
	deadline := time.Now().Add(s.cfg.Timeout)
	for {
		if err := s.qp.ConnectRCOpts(gid, peer.QPN, peer.PSN, abi.AccessRemoteWrite|abi.AccessRemoteRead|abi.AccessRemoteAtomic, s.cfg.connectOpts()); err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		m := message{kind: kindHello, op: opIndex(s.cfg.Op), size: s.cfg.Size, iters: uint64(s.cfg.Iters), latIter: uint64(s.cfg.LatIters)}
		if err := s.sendCtrl(&m); err != nil {
			return fmt.Errorf("send hello: %w", err)
		}
		wcs, err := s.poll()
		if err != nil {
			return fmt.Errorf("hello: %w", err)
		}
		wc := wcs[0]
		if wc.WRID != ctrlWRID {
			return fmt.Errorf("hello: unexpected completion %#x", wc.WRID)
		}
		if wc.Status == abi.WCSuccess {
			return nil
		}
		if wc.Status != abi.WCRetryExcErr || time.Now().After(deadline) {
			return fmt.Errorf("hello: %w", wcErr(&wc))
		}
		for n, _ := s.cq.Poll(s.wc); n > 0; n, _ = s.cq.Poll(s.wc) { // flushed leftovers
		}
		if err := s.qp.Modify(abi.QPAttr{QPState: abi.QPSReset}, abi.QPAttrState); err != nil {
			return fmt.Errorf("hello: reset qp: %w", err)
		}
		time.Sleep(helloRetry)
	}
}

// client is the measuring state.
type client struct {
	*Side
	peer         Endpoint
	posted, done uint64
	gap          gapMeter // between completions of data operations
}

func (c *client) post() error {
	i := c.posted
	wr := verbs.SendWR{WRID: i, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{{Addr: c.slotAddr(i), Length: uint32(c.cfg.Size), LKey: c.mr.LKey}}}
	remote := c.peer.Addr + (i%uint64(c.slots))*c.cfg.Size
	switch c.cfg.Op {
	case "write":
		if c.cfg.Verify {
			Pattern(c.slot(i), i)
		}
		wr.Opcode, wr.RemoteAddr, wr.RKey = abi.WROpRDMAWrite, remote, c.peer.RKey
	case "read":
		if c.cfg.Verify {
			clear(c.slot(i))
		}
		wr.Opcode, wr.RemoteAddr, wr.RKey = abi.WROpRDMARead, remote, c.peer.RKey
	case "send":
		if c.cfg.Verify {
			Pattern(c.slot(i), i)
		}
		wr.Opcode = abi.WROpSend
	case "atomic":
		wr.Opcode, wr.RemoteAddr, wr.RKey, wr.CompareAdd = abi.WROpAtomicFetchAdd, c.peer.Addr, c.peer.RKey, 1
	}
	if err := c.postSend(wr); err != nil {
		return fmt.Errorf("post %s %d: %w", c.cfg.Op, i, err)
	}
	c.posted++
	return nil
}

// complete polls until `until` operations are complete, checking each.
func (c *client) complete(until uint64) error {
	for c.done < until {
		wcs, err := c.poll()
		if err != nil {
			return fmt.Errorf("posted %d, completed %d: %w", c.posted, c.done, err)
		}
		c.gap.mark(time.Now())
		for i := range wcs {
			wc := &wcs[i]
			if wc.Status != abi.WCSuccess {
				return wcErr(wc)
			}
			if wc.WRID != c.done {
				return fmt.Errorf("completion for work request %d, want %d (out of order)", wc.WRID, c.done)
			}
			if c.cfg.Verify {
				if err := c.check(wc.WRID); err != nil {
					return err
				}
			}
			c.done++
		}
	}
	return nil
}

func (c *client) check(i uint64) error {
	switch c.cfg.Op {
	case "read":
		k := i % uint64(c.slots)
		if !PatternOK(c.slot(i), k) {
			return fmt.Errorf("verify: read %d: bytes differ from the server's pattern", i)
		}
	case "atomic":
		if got := binary.LittleEndian.Uint64(c.slot(i)); got != i {
			return fmt.Errorf("verify: fetch-and-add %d returned %d, want %d", i, got, i)
		}
	}
	return nil
}

// result computes the measurement.
func result(cfg Config, ops uint64, elapsed time.Duration, lat []time.Duration) Result {
	secs := max(elapsed.Seconds(), 1e-9)
	r := Result{Op: cfg.Op, Size: cfg.Size, Iters: int(ops), Seconds: secs, LatIters: len(lat),
		GBytesPerS: float64(ops) * float64(cfg.Size) / secs / 1e9, Mops: float64(ops) / secs / 1e6}
	r.SetLatencies(lat)
	return r
}

// SetLatencies sorts lat (one sample per operation) and sets the result's
// LatIters, LatP50, LatP99 and LatAvg from it; an empty lat leaves them.
func (r *Result) SetLatencies(lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	r.LatIters = len(lat)
	r.LatP50 = us(lat[len(lat)*50/100])
	r.LatP99 = us(lat[min(len(lat)-1, len(lat)*99/100)])
	r.LatAvg = us(sum / time.Duration(len(lat)))
}
