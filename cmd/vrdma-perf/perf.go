package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
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
// scratch and the event buffers.
const (
	memOverhead   = 32 << 20
	defaultBudget = 1 << 30          // buffer bytes per side when --guest-mem is not given
	stallTimeout  = 10 * time.Second // plus stallPerByte per message byte
	stallPerByte  = 20 * time.Nanosecond
)

// stall is how long an operation may go without progress before the run
// fails.
func (bn *bench) stall() time.Duration {
	return stallTimeout + time.Duration(bn.o.size)*stallPerByte
}

// side is one device with its verbs objects.
type side struct {
	ctx *rdma.Context
	f   *frontend.Frontend
	gid [16]byte
	pd  *rdma.PD
	cq  *rdma.CQ
	qp  *rdma.QP
	buf *rdma.Buffer
	mr  *rdma.MR
}

func (s *side) close() {
	if s.ctx != nil {
		s.ctx.Close()
	}
	if s.f != nil {
		s.f.Close()
	}
}

func openSide(ctx context.Context, sock string, mem uint64, bufBytes, depth int, access int) (*side, error) {
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
	if s.pd, err = s.ctx.AllocPD(); err != nil {
		return fail("alloc pd", err)
	}
	if s.cq, err = s.ctx.CreateCQ(2 * depth); err != nil {
		return fail("create cq", err)
	}
	if s.qp, err = s.pd.CreateQP(rdma.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq,
		Cap: rdma.QPCap{MaxSendWR: depth, MaxRecvWR: depth, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return fail("create qp", err)
	}
	if s.buf, err = s.ctx.AllocBuffer(bufBytes); err != nil {
		return fail("alloc buffer", err)
	}
	if s.mr, err = s.pd.RegMR(s.buf, 0, bufBytes, access); err != nil {
		return fail("reg mr", err)
	}
	return s, nil
}

// bench is one run: requester a, responder b.
type bench struct {
	o      options
	a, b   *side
	slots  int // buffers of o.size bytes per side
	depth  int // work requests in flight
	seq    uint64
	wr     [1]rdma.SendWR
	rwr    [1]rdma.RecvWR
	wc     []rdma.WC
	recvs  uint64 // receive WRs posted on b (send)
	sent   uint64 // send completions seen on a (send)
	recvd  uint64 // receive completions seen on b (send)
	done   uint64 // operations complete
	posted uint64
}

// plan decides the buffers per side and the guest memory.
func plan(o options) (slots int, mem uint64, err error) {
	size := o.size
	if o.guestMem != 0 {
		if o.guestMem < memOverhead+size {
			return 0, 0, fmt.Errorf("--guest-mem %d is too small for %d-byte buffers (need at least %d)", o.guestMem, size, memOverhead+size)
		}
		slots = int(min(uint64(o.txDepth), (o.guestMem-memOverhead)/size))
		return slots, o.guestMem, nil
	}
	slots = int(max(1, min(uint64(o.txDepth), defaultBudget/size)))
	need := uint64(slots)*size + memOverhead
	return slots, (need + (1<<20 - 1)) &^ (1<<20 - 1), nil
}

func measure(ctx context.Context, o options) (result, error) {
	slots, mem, err := plan(o)
	if err != nil {
		return result{}, err
	}
	bufBytes := uint64(slots) * o.size
	if bufBytes > 1<<40 {
		return result{}, fmt.Errorf("buffers of %d bytes are too large", bufBytes)
	}
	bn := &bench{o: o, slots: slots, depth: min(o.txDepth, slots), wc: make([]rdma.WC, 64)}
	if bn.a, err = openSide(ctx, o.sockets[0], mem, int(bufBytes), bn.depth, rdma.AccessLocalWrite); err != nil {
		return result{}, err
	}
	defer bn.a.close()
	if bn.b, err = openSide(ctx, o.sockets[1], mem, int(bufBytes), bn.depth, rdma.AccessAll); err != nil {
		return result{}, err
	}
	defer bn.b.close()
	// Exchange (GID, QPN) in-process and connect, as perftest does over TCP.
	if err := bn.a.qp.ConnectRC(bn.b.gid, bn.b.qp.Num(), 0); err != nil {
		return result{}, fmt.Errorf("connect requester: %w", err)
	}
	if err := bn.b.qp.ConnectRC(bn.a.gid, bn.a.qp.Num(), rdma.AccessRemoteWrite|rdma.AccessRemoteRead|rdma.AccessRemoteAtomic); err != nil {
		return result{}, fmt.Errorf("connect responder: %w", err)
	}
	if o.op == "send" {
		for range bn.depth {
			if err := bn.postRecv(); err != nil {
				return result{}, err
			}
		}
	}

	// Bandwidth: keep depth operations in flight.
	start := time.Now()
	if err := bn.pipeline(ctx, start); err != nil {
		return result{}, err
	}
	elapsed := time.Since(start)
	bwOps := bn.done

	// Latency: one operation at a time.
	lat := make([]time.Duration, o.latIters)
	for i := range lat {
		t0 := time.Now()
		if err := bn.post(); err != nil {
			return result{}, err
		}
		if err := bn.complete(ctx, bn.posted); err != nil {
			return result{}, err
		}
		lat[i] = time.Since(t0)
	}
	if o.verify && o.op == "atomic" {
		if got := binary.LittleEndian.Uint64(bn.b.mr.Bytes()); got != bn.done {
			return result{}, fmt.Errorf("verify: counter is %d after %d fetch-and-adds", got, bn.done)
		}
	}
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	secs := elapsed.Seconds()
	return result{
		Op: o.op, Size: o.size, Iters: int(bwOps),
		GBytesPerS: float64(bwOps) * float64(o.size) / secs / 1e9,
		Mops:       float64(bwOps) / secs / 1e6,
		LatP50:     us(lat[len(lat)*50/100]),
		LatP99:     us(lat[min(len(lat)-1, len(lat)*99/100)]),
		LatAvg:     us(sum / time.Duration(len(lat))),
		LatIters:   len(lat),
		Verified:   o.verify,
		Seconds:    secs,
		TxDepth:    bn.depth,
		Slots:      bn.slots,
	}, nil
}

// pipeline runs the bandwidth pass.
func (bn *bench) pipeline(ctx context.Context, start time.Time) error {
	o := bn.o
	more := func() bool {
		if o.duration > 0 {
			return time.Since(start) < o.duration
		}
		return bn.posted < uint64(o.iters)
	}
	for {
		posting := more()
		for posting && bn.posted-bn.done < uint64(bn.depth) {
			if err := bn.post(); err != nil {
				return err
			}
			posting = more()
		}
		if !posting && bn.done == bn.posted {
			return nil
		}
		if err := bn.complete(ctx, bn.done+1); err != nil {
			return err
		}
	}
}

// slot returns operation i's buffer in s.
func (bn *bench) slot(s *side, i uint64) []byte {
	k := int(i % uint64(bn.slots))
	return s.mr.Bytes()[k*int(bn.o.size) : (k+1)*int(bn.o.size)]
}

// post posts the next operation.
func (bn *bench) post() error {
	i := bn.posted
	a, b := bn.a, bn.b
	k := uint64(i % uint64(bn.slots))
	off := k * bn.o.size
	wr := &bn.wr[0]
	*wr = rdma.SendWR{WRID: i, Flags: rdma.WRFlagSignaled, SGL: wr.SGL[:0]}
	if cap(wr.SGL) == 0 {
		wr.SGL = make([]rdma.SGE, 0, 1)
	}
	wr.SGL = append(wr.SGL, rdma.SGE{Addr: a.mr.Addr + off, Length: uint32(bn.o.size), LKey: a.mr.LKey})
	switch bn.o.op {
	case "write":
		if bn.o.verify {
			perftest.Pattern(bn.slot(a, i), i)
		}
		wr.Opcode, wr.RemoteAddr, wr.RKey = rdma.WROpRDMAWrite, b.mr.Addr+off, b.mr.RKey
	case "read":
		if bn.o.verify {
			perftest.Pattern(bn.slot(b, i), i)
		}
		wr.Opcode, wr.RemoteAddr, wr.RKey = rdma.WROpRDMARead, b.mr.Addr+off, b.mr.RKey
	case "send":
		if bn.o.verify {
			perftest.Pattern(bn.slot(a, i), i)
		}
		wr.Opcode = rdma.WROpSend
	case "atomic":
		wr.Opcode, wr.RemoteAddr, wr.RKey, wr.CompareAdd = rdma.WROpAtomicFetchAdd, b.mr.Addr, b.mr.RKey, 1
	}
	// The device may complete a WQE before it advances sq_ci past it: a
	// full send queue is then a matter of microseconds.
	var deadline time.Time
	for {
		err := a.qp.PostSend(bn.wr[:]...)
		if err == nil {
			break
		}
		if !errors.Is(err, rdma.ErrQueueFull) {
			return fmt.Errorf("post %s %d: %w", bn.o.op, i, err)
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(bn.stall())
		} else if time.Now().After(deadline) {
			return fmt.Errorf("post %s %d: send queue full for %v", bn.o.op, i, bn.stall())
		}
		runtime.Gosched()
	}
	bn.posted++
	return nil
}

// postRecv posts the next receive on the responder.
func (bn *bench) postRecv() error {
	j := bn.recvs
	k := j % uint64(bn.slots)
	r := &bn.rwr[0]
	if cap(r.SGL) == 0 {
		r.SGL = make([]rdma.SGE, 1)
	}
	r.WRID = j
	r.SGL[0] = rdma.SGE{Addr: bn.b.mr.Addr + k*bn.o.size, Length: uint32(bn.o.size), LKey: bn.b.mr.LKey}
	if err := bn.b.qp.PostRecv(bn.rwr[:]...); err != nil {
		return fmt.Errorf("post recv %d: %w", j, err)
	}
	bn.recvs++
	return nil
}

func wcErr(side string, wc *rdma.WC) error {
	return fmt.Errorf("%s: work request %d completed with status %d (vendor error %d)", side, wc.WRID, wc.Status, wc.VendorErr)
}

// complete polls until at least `until` operations are complete, checking
// (and with --verify, verifying) every completion.
func (bn *bench) complete(ctx context.Context, until uint64) error {
	last := time.Now()
	spins := 0
	for bn.done < until {
		progress := false
		n, err := bn.a.cq.Poll(bn.wc)
		if err != nil {
			return err
		}
		for i := range bn.wc[:n] {
			wc := &bn.wc[i]
			if wc.Status != rdma.WCSuccess {
				return wcErr("requester", wc)
			}
			if bn.o.op == "send" {
				bn.sent++
				continue
			}
			if err := bn.check(wc); err != nil {
				return err
			}
			bn.done++
		}
		progress = n > 0
		if bn.o.op == "send" {
			m, err := bn.b.cq.Poll(bn.wc)
			if err != nil {
				return err
			}
			for i := range bn.wc[:m] {
				wc := &bn.wc[i]
				if wc.Status != rdma.WCSuccess {
					return wcErr("responder", wc)
				}
				if err := bn.check(wc); err != nil {
					return err
				}
				bn.recvd++
				if err := bn.postRecv(); err != nil {
					return err
				}
			}
			progress = progress || m > 0
			bn.done = min(bn.sent, bn.recvd)
		}
		if progress {
			last = time.Now()
			spins = 0
			continue
		}
		if spins++; spins&1023 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			if time.Since(last) > bn.stall() {
				return fmt.Errorf("no completion for %v (posted %d, completed %d)", bn.stall(), bn.posted, bn.done)
			}
		}
	}
	return nil
}

// check verifies one completion: in order, the expected opcode and length,
// and with --verify the bytes that arrived.
func (bn *bench) check(wc *rdma.WC) error {
	want := bn.done
	if bn.o.op == "send" {
		want = bn.recvd
	}
	if wc.WRID != want {
		return fmt.Errorf("completion for work request %d, want %d (out of order)", wc.WRID, want)
	}
	if !bn.o.verify {
		return nil
	}
	i := wc.WRID
	var ok bool
	switch bn.o.op {
	case "write", "read":
		// Each buffer holds the operation's pattern on the source side;
		// the destination must hold the same bytes.
		src, dst := bn.slot(bn.a, i), bn.slot(bn.b, i)
		ok = bytes.Equal(src, dst) && perftest.PatternOK(src, i)
	case "send":
		if wc.ByteLen != uint32(bn.o.size) {
			return fmt.Errorf("verify: receive %d got %d bytes, want %d", i, wc.ByteLen, bn.o.size)
		}
		ok = bytes.Equal(bn.slot(bn.a, i), bn.slot(bn.b, i)) && perftest.PatternOK(bn.slot(bn.b, i), i)
	case "atomic":
		ok = binary.LittleEndian.Uint64(bn.slot(bn.a, i)) == i
		if !ok {
			return fmt.Errorf("verify: fetch-and-add %d returned %d, want %d", i, binary.LittleEndian.Uint64(bn.slot(bn.a, i)), i)
		}
	}
	if !ok {
		return fmt.Errorf("verify: %s %d: bytes that arrived differ from the pattern sent", bn.o.op, i)
	}
	return nil
}
