package rc

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// errRange is what the fake memories return for an access outside them.
var errRange = errors.New("fake memory: out of range")

// region is a fake MR: bytes at base, one rkey and its access rights.
type region struct {
	b       []byte
	base    uint64
	rkey    uint32
	access  Access
	atomics int // atomic operations executed
}

func (m *region) slice(va uint64, n int) ([]byte, error) {
	if va < m.base || va-m.base+uint64(n) > uint64(len(m.b)) {
		return nil, errRange
	}
	return m.b[va-m.base : va-m.base+uint64(n)], nil
}

func (m *region) WriteAt(va uint64, src []byte) error {
	d, err := m.slice(va, len(src))
	if err == nil {
		copy(d, src)
	}
	return err
}

func (m *region) ReadAt(va uint64, dst []byte) error {
	s, err := m.slice(va, len(dst))
	if err == nil {
		copy(dst, s)
	}
	return err
}

func (m *region) Atomic(va uint64, op AtomicOp, compare, swapAdd uint64) (uint64, error) {
	s, err := m.slice(va, 8)
	if err != nil {
		return 0, err
	}
	m.atomics++
	orig := binary.LittleEndian.Uint64(s)
	switch op {
	case AtomicFetchAdd:
		binary.LittleEndian.PutUint64(s, orig+swapAdd)
	case AtomicCmpSwp:
		if orig == compare {
			binary.LittleEndian.PutUint64(s, swapAdd)
		}
	}
	return orig, nil
}

// buf is a local Buffer over a slice.
type buf []byte

func (b buf) Gather(off uint32, dst []byte) error {
	if uint64(off)+uint64(len(dst)) > uint64(len(b)) {
		return errRange
	}
	copy(dst, b[off:])
	return nil
}

func (b buf) Scatter(off uint32, src []byte) error {
	if uint64(off)+uint64(len(src)) > uint64(len(b)) {
		return errRange
	}
	copy(b[off:], src)
	return nil
}

// host is a fake device: one region, a receive queue, the completions.
type host struct {
	mr       *region
	recvs    []Recv
	recvDone []RecvCompletion
	sendDone []Completion
}

func (h *host) Resolve(rkey uint32, va uint64, n uint32, access Access) (Region, bool) {
	if n == 0 {
		return nil, true
	}
	if h.mr == nil || rkey != h.mr.rkey || h.mr.access&access != access {
		return nil, false
	}
	if _, err := h.mr.slice(va, int(n)); err != nil {
		return nil, false
	}
	return h.mr, true
}

func (h *host) TakeRecv() (Recv, bool) {
	if len(h.recvs) == 0 {
		return Recv{}, false
	}
	r := h.recvs[0]
	h.recvs = h.recvs[1:]
	return r, true
}

// Invalidate frees the region (its rkey resolves nothing from then on).
func (h *host) Invalidate(rkey uint32, commit bool) bool {
	if h.mr == nil || rkey != h.mr.rkey {
		return false
	}
	if commit {
		h.mr = nil
	}
	return true
}

func (h *host) RecvDone(c RecvCompletion) { h.recvDone = append(h.recvDone, c) }
func (h *host) SendDone(c Completion)     { h.sendDone = append(h.sendDone, c) }

// port collects what a QP sends.
type port struct {
	out   [][]byte
	woken bool
}

func (p *port) Send(pkt []byte) { p.out = append(p.out, append([]byte(nil), pkt...)) }
func (p *port) Flush()          {}
func (p *port) Wake()           { p.woken = true }

// side is one end of a simulated connection.
type side struct {
	qp   *QP
	host *host
	port *port
}

// sim joins two QPs by a simulated network that the test steps: it drops
// (loss) and holds back (reorder) packets with a seeded generator, and
// moves a fake clock forward when nothing moves, so timers fire.
type sim struct {
	t        testing.TB
	a, b     *side
	now      time.Time
	rng      *rand.Rand
	loss     float64
	reorder  float64
	drop     func(from *side, pkt []byte) bool // nil: none
	held     []heldPkt
	steps    int
	advances int
}

type heldPkt struct {
	to  *side
	pkt []byte
}

const simRKey = 0x1234

func newSim(t testing.TB, cfg Config, memSize int) *sim {
	s := &sim{t: t, now: time.Unix(1000, 0), rng: rand.New(rand.NewPCG(1, 2))}
	mk := func(qpn, dest uint32, sq, rq roce.PSN) *side {
		c := cfg
		c.QPN, c.DestQPN, c.SQPSN, c.RQPSN = qpn, dest, sq, rq
		c.Clock = func() time.Time { return s.now }
		h := &host{mr: &region{b: make([]byte, memSize), base: 0x10000, rkey: simRKey,
			access: AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic}}
		p := &port{}
		q, err := New(c, h, p)
		if err != nil {
			t.Fatal(err)
		}
		return &side{qp: q, host: h, port: p}
	}
	s.a = mk(0x11, 0x22, cfg.SQPSN, cfg.RQPSN)
	s.b = mk(0x22, 0x11, cfg.RQPSN, cfg.SQPSN)
	return s
}

func (s *sim) peer(x *side) *side {
	if x == s.a {
		return s.b
	}
	return s.a
}

func (s *sim) deliver(to *side, pkt []byte) {
	p, err := roce.Parse(pkt)
	if err != nil {
		s.t.Fatalf("QP sent a packet Parse refuses: %v", err)
	}
	if p.BTH.DestQP != to.qp.QPN() {
		s.t.Fatalf("packet to QPN %#x reached QP %#x", p.BTH.DestQP, to.qp.QPN())
	}
	to.qp.Receive(&p)
}

// step moves every packet once; it reports whether anything moved.
func (s *sim) step() bool {
	moved := false
	for _, from := range []*side{s.a, s.b} {
		out := from.port.out
		from.port.out = nil
		to := s.peer(from)
		for _, pkt := range out {
			moved = true
			if s.drop != nil && s.drop(from, pkt) || s.loss > 0 && s.rng.Float64() < s.loss {
				continue
			}
			if s.reorder > 0 && s.rng.Float64() < s.reorder {
				s.held = append(s.held, heldPkt{to, pkt})
				continue
			}
			s.deliver(to, pkt)
		}
	}
	// Held packets arrive after the ones of this step.
	if len(s.held) > 0 && (s.rng.IntN(2) == 0 || !moved) {
		h := s.held
		s.held = nil
		for _, x := range h {
			s.deliver(x.to, x.pkt)
		}
		moved = true
	}
	for _, x := range []*side{s.a, s.b} {
		x.qp.Flush()
		checkInvariants(s.t, x.qp)
	}
	for _, x := range []*side{s.a, s.b} {
		if x.port.woken {
			x.port.woken = false
			x.qp.Pump()
			moved = true
		}
	}
	return moved
}

// run steps until done or the step bound; time moves by 1 ms whenever
// nothing moved.
func (s *sim) run(done func() bool) {
	s.t.Helper()
	for s.steps = 0; s.steps < 200000; s.steps++ {
		if done() {
			return
		}
		if !s.step() {
			s.now = s.now.Add(time.Millisecond)
			s.advances++
			s.a.qp.Tick()
			s.b.qp.Tick()
		}
	}
	for _, x := range []*side{s.a, s.b} {
		r := &x.qp.req
		for _, c := range x.host.sendDone {
			if c.Status != abi.WCSuccess {
				s.t.Logf("QP %#x: completion %+v", x.qp.QPN(), c)
				break
			}
		}
		s.t.Logf("QP %#x: sendDone %d recvDone %d recvs %d err %t %+v\n head %d cur %d tail %d off %d psn %d high %d una %d rdOut %d rnr %v deadline %v\n resp epsn %d in %d jobs %d ack %+v",
			x.qp.QPN(), len(x.host.sendDone), len(x.host.recvDone), len(x.host.recvs), x.qp.err, x.qp.Counters(), r.head, r.cur, r.tail, r.off, r.psn, r.high, r.una, r.rdOut, r.rnrUntil, r.deadline,
			x.qp.resp.epsn, x.qp.resp.in, x.qp.resp.jobs.n, x.qp.resp.ack)
	}
	s.t.Fatalf("no completion after %d steps (%v simulated)", s.steps, time.Duration(s.advances)*time.Millisecond)
}

// fill returns n bytes of a pattern that differs per seed.
func fill(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func wantStatus(t testing.TB, got []Completion, ids []uint64, st abi.WCStatus) {
	t.Helper()
	if len(got) != len(ids) {
		t.Fatalf("got %d completions %v, want %d", len(got), got, len(ids))
	}
	for i, c := range got {
		if c.ID != ids[i] || c.Status != st {
			t.Fatalf("completion %d: got id %#x status %v, want id %#x status %v", i, c.ID, c.Status, ids[i], st)
		}
	}
}
