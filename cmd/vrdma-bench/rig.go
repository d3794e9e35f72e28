package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// Sizes of the rig.
const (
	depth       = 64        // work requests in flight per QP
	rxDepth     = 2 * depth // receives a QP's receive queue holds (perftest's rx_depth)
	rxBatch     = depth / 2 // receives are reposted when this many are missing
	memOverhead = 32 << 20  // guest memory for rings, scratch and events
	stall       = 30 * time.Second
)

// rig is an in-process daemon whose devices the measurements open through
// virtio-user front-ends.
type rig struct {
	d    *daemon.Daemon
	dir  string
	next int
}

func newRig(pin memmap.PinConfig) (*rig, error) {
	l := logrus.New()
	l.SetLevel(logrus.PanicLevel)
	dir, err := os.MkdirTemp("", "vrdma-bench-")
	if err != nil {
		return nil, err
	}
	return &rig{d: daemon.New(logrus.NewEntry(l), daemonConfig(pin)), dir: dir}, nil
}

// device adds a device and returns its socket.
func (r *rig) device() (string, error) {
	r.next++
	id := fmt.Sprintf("dev%d", r.next)
	sock := filepath.Join(r.dir, id+".sock")
	if _, err := r.d.AddDevice(daemon.DeviceSpec{ID: id, Socket: sock, Device: rdma.Config{}}); err != nil {
		return "", err
	}
	return sock, nil
}

func (r *rig) close() {
	r.d.Close()
	os.RemoveAll(r.dir)
}

// waitUnpinned waits until the daemon has nothing pinned (a closed
// front-end's session is torn down asynchronously).
func (r *rig) waitUnpinned() error {
	deadline := time.Now().Add(stall)
	for r.d.PinnedBytes() != 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("daemon still pins %d bytes after the front-ends left", r.d.PinnedBytes())
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// side is one front-end with a PD, CQ, QP and a registered buffer.
type side struct {
	c   *verbs.Context
	f   *frontend.Frontend
	gid [16]byte
	pd  *verbs.PD
	cq  *verbs.CQ
	qp  *verbs.QP
	buf *verbs.Buffer
	mr  *verbs.MR
}

func openSide(sock string, bufBytes int) (*side, error) { return openSideDepth(sock, bufBytes, depth) }

// openSideDepth is openSide with a send queue of sq work requests (and a
// CQ of 4×sq entries).
func openSideDepth(sock string, bufBytes, sq int) (*side, error) {
	ctx, cancel := context.WithTimeout(context.Background(), stall)
	defer cancel()
	s := &side{}
	var err error
	if s.c, s.f, err = frontend.OpenRDMA(ctx, sock, uint64(bufBytes)+memOverhead); err != nil {
		return nil, fmt.Errorf("open %s: %w", sock, err)
	}
	fail := func(what string, err error) (*side, error) {
		s.close()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if s.gid, err = s.c.QueryGID(); err != nil {
		return fail("query gid", err)
	}
	if s.pd, err = s.c.AllocPD(); err != nil {
		return fail("alloc pd", err)
	}
	if s.cq, err = s.c.CreateCQ(4 * sq); err != nil {
		return fail("create cq", err)
	}
	if s.qp, err = s.pd.CreateQP(verbs.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq,
		Cap: verbs.QPCap{MaxSendWR: sq, MaxRecvWR: rxDepth, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return fail("create qp", err)
	}
	if s.buf, err = s.c.AllocBuffer(bufBytes); err != nil {
		return fail("alloc buffer", err)
	}
	if s.mr, err = s.pd.RegMR(s.buf, 0, bufBytes, abi.AccessAll); err != nil {
		return fail("reg mr", err)
	}
	return s, nil
}

func (s *side) close() {
	if s.c != nil {
		s.c.Close()
	}
	if s.f != nil {
		s.f.Close()
	}
}

// pair is a connected RC QP pair between two devices: a requests, b
// responds.
type pair struct {
	a, b  *side
	slots int // buffers per side
	size  uint64
	wrs   []verbs.SendWR
	sges  []abi.SGE
	rwr   []verbs.RecvWR
	rsge  []abi.SGE
	wc    []verbs.WC
	// receives posted on b and completed, across measurements
	recvs, recvd uint64
	// yield makes a poll of the client's CQs that found nothing yield the
	// processor (runtime.Gosched), as the host time-slices a guest's vCPU;
	// otherwise the client busy-polls without yielding (perftest's loop on
	// a core of its own). The sections with more client goroutines than
	// cores set it (clientYield).
	yield bool
}

// idle is what the client does after a poll of its CQs found nothing.
func (p *pair) idle() {
	if p.yield {
		runtime.Gosched()
	}
}

// openPair opens two devices of r with bufBytes of registered memory each
// and connects them.
func openPair(r *rig, bufBytes int) (*pair, error) {
	s1, err := r.device()
	if err != nil {
		return nil, err
	}
	s2, err := r.device()
	if err != nil {
		return nil, err
	}
	return connectPair(s1, s2, bufBytes)
}

// connectPair opens the devices at sockets s1 and s2 with bufBytes of
// registered memory each and connects them.
func connectPair(s1, s2 string, bufBytes int) (*pair, error) {
	var err error
	p := &pair{wrs: make([]verbs.SendWR, depth), sges: make([]abi.SGE, depth),
		rwr: make([]verbs.RecvWR, rxDepth), rsge: make([]abi.SGE, rxDepth), wc: make([]verbs.WC, 2*depth)}
	for i := range p.wrs {
		p.wrs[i].SGL = p.sges[i : i+1 : i+1]
	}
	for i := range p.rwr {
		p.rwr[i].SGL = p.rsge[i : i+1 : i+1]
	}
	if p.a, err = openSide(s1, bufBytes); err != nil {
		return nil, err
	}
	if p.b, err = openSide(s2, bufBytes); err != nil {
		p.a.close()
		return nil, err
	}
	acc := abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic
	if err := p.a.qp.ConnectRC(p.b.gid, p.b.qp.Num(), p.b.qp.PSN(), acc); err != nil {
		p.close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := p.b.qp.ConnectRC(p.a.gid, p.a.qp.Num(), p.a.qp.PSN(), acc); err != nil {
		p.close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	return p, nil
}

func (p *pair) close() {
	p.a.close()
	p.b.close()
}

// setSize selects the message size; the buffers hold slots messages.
func (p *pair) setSize(size uint64) {
	p.size = size
	p.slots = int(max(1, min(depth, uint64(len(p.a.mr.Bytes()))/size)))
}

func (p *pair) off(i uint64) uint64 { return (i % uint64(p.slots)) * p.size }

// fill prepares send WR j for operation i.
func (p *pair) fill(j int, op int, i uint64) {
	off := p.off(i)
	wr := &p.wrs[j]
	wr.WRID, wr.Opcode, wr.Flags = i, op, abi.WRFlagSignaled
	p.sges[j] = abi.SGE{Addr: p.a.mr.Addr + off, Length: uint32(p.size), LKey: p.a.mr.LKey}
	wr.RemoteAddr, wr.RKey = 0, 0
	if op != abi.WROpSend {
		wr.RemoteAddr, wr.RKey = p.b.mr.Addr+off, p.b.mr.RKey
	}
}

// postRecvs posts n receives on b starting at receive number first.
func (p *pair) postRecvs(first uint64, n int) error {
	for j := range n {
		i := first + uint64(j)
		p.rwr[j].WRID = i
		p.rsge[j] = abi.SGE{Addr: p.b.mr.Addr + p.off(i), Length: uint32(p.size), LKey: p.b.mr.LKey}
	}
	return p.b.qp.PostRecv(p.rwr[:n]...)
}

// topUp posts receives on b until rxDepth are outstanding, once rxBatch or
// more are missing: a post notifies b's doorbell queue unless its engine
// polls, and b's engine idles (b only receives), so receives go in batches, as perftest's rx_depth
// above its tx_depth does. At least rxDepth-rxBatch ≥ depth stay posted,
// one for every SEND that can be in flight, so no SEND meets RNR.
func (p *pair) topUp() error {
	n := rxDepth - int(p.recvs-p.recvd)
	if n < rxBatch {
		return nil
	}
	if err := p.postRecvs(p.recvs, n); err != nil {
		return fmt.Errorf("post recv: %w", err)
	}
	p.recvs += uint64(n)
	return nil
}

// reap polls both CQs once, checks every completion and reposts
// receives; it returns the requester and responder completions.
func (p *pair) reap() (int, int, error) {
	n, err := p.a.cq.Poll(p.wc)
	if err != nil {
		return 0, 0, err
	}
	m, err := p.b.cq.Poll(p.wc[n:])
	if err != nil {
		return 0, 0, err
	}
	for k := range p.wc[:n+m] {
		if err := wcCheck(&p.wc[k]); err != nil {
			return 0, 0, err
		}
	}
	if m > 0 {
		p.recvd += uint64(m)
		if err := p.topUp(); err != nil {
			return 0, 0, err
		}
	}
	return n, m, nil
}

// stream keeps depth operations of op in flight for d (posting every free
// slot with one doorbell, reaping completions in batches) and returns the
// operations completed and the time taken. A SEND is done when both its
// completions (requester and receiver) were seen.
func (p *pair) stream(op int, d time.Duration) (uint64, time.Duration, error) {
	end := time.Now().Add(d)
	return p.streamWhile(op, func() bool { return time.Now().Before(end) })
}

// streamWhile is stream posting for as long as more, which it calls every
// few polls, returns true; it then waits for what is in flight.
func (p *pair) streamWhile(op int, more func() bool) (uint64, time.Duration, error) {
	var posted, sent, recvd uint64
	send := op == abi.WROpSend
	if err := p.topUp(); err != nil {
		return 0, 0, err
	}
	done := func() uint64 {
		if send {
			return min(sent, recvd)
		}
		return sent
	}
	start := time.Now()
	last := start
	posting := true
	for spins := 0; ; spins++ {
		if spins&15 == 0 && posting {
			posting = more()
		}
		if !posting && done() == posted {
			break
		}
		if free := depth - int(posted-done()); posting && free > 0 {
			for j := range free {
				p.fill(j, op, posted+uint64(j))
			}
			err := p.a.qp.PostSend(p.wrs[:free]...)
			if err != nil && !errors.Is(err, verbs.ErrQueueFull) {
				return 0, 0, fmt.Errorf("post: %w", err)
			}
			if err == nil {
				posted += uint64(free)
			}
		}
		n, m, err := p.reap()
		if err != nil {
			return 0, 0, err
		}
		sent += uint64(n)
		recvd += uint64(m)
		if n+m > 0 {
			last = time.Now()
			continue
		}
		if spins&1023 == 0 && time.Since(last) > stall {
			return 0, 0, fmt.Errorf("no completion for %v (posted %d, done %d)", stall, posted, done())
		}
		p.idle()
	}
	return done(), time.Since(start), nil
}

// latency measures op one at a time for d (at most max samples): the time
// from post to the completion that shows the data arrived (WRITE, READ:
// the requester's; SEND: the receiver's, the sender's is reaped untimed).
func (p *pair) latency(op int, d time.Duration, maxSamples int) ([]time.Duration, error) {
	if err := p.topUp(); err != nil {
		return nil, err
	}
	lat := make([]time.Duration, 0, maxSamples)
	end := time.Now().Add(d)
	send := op == abi.WROpSend
	for i := uint64(0); len(lat) < maxSamples && (len(lat) < 100 || time.Now().Before(end)); i++ {
		p.fill(0, op, i)
		t0 := time.Now()
		if err := p.a.qp.PostSend(p.wrs[:1]...); err != nil {
			return nil, fmt.Errorf("post: %w", err)
		}
		var dt time.Duration
		gotA, gotB := false, !send
		for spins := 0; !gotA || !gotB; spins++ {
			n, m, err := p.reap()
			if err != nil {
				return nil, err
			}
			if n > 0 && !send {
				dt = time.Since(t0)
			}
			if m > 0 && send {
				dt = time.Since(t0)
			}
			gotA, gotB = gotA || n > 0, gotB || m > 0
			if spins&1023 == 1023 && time.Since(t0) > stall {
				return nil, fmt.Errorf("no completion for %v", stall)
			}
			if n+m == 0 {
				p.idle()
			}
		}
		lat = append(lat, dt)
	}
	return lat, nil
}

func wcCheck(wc *verbs.WC) error {
	if wc.Status != abi.WCSuccess {
		return fmt.Errorf("work request %d completed with status %d (vendor error %d)", wc.WRID, wc.Status, wc.VendorErr)
	}
	return nil
}

func mmPin(all bool) memmap.PinConfig { return memmap.PinConfig{All: all} }
