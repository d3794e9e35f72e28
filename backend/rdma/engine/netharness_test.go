package engine

import (
	"bytes"
	"net/netip"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// A network between fabrics in memory: rc QPs whose packets a goroutine
// delivers (parsed, as package udp would after checking the ICRC), and a
// ticker running their timers. It can drop packets, so that the
// transport's recovery runs under the engine too.
type memWire struct {
	mu   sync.Mutex
	qps  map[uint32]*rc.QP // by QPN (protected by mu)
	drop func(n int) bool  // protected by mu: drop the n-th packet
	sent int               // protected by mu
	ch   chan []byte
	stop chan struct{}
	wg   sync.WaitGroup
}

func newMemWire(tb testing.TB) *memWire {
	w := &memWire{qps: make(map[uint32]*rc.QP), ch: make(chan []byte, 4096), stop: make(chan struct{})}
	w.wg.Add(2)
	go w.deliver()
	go w.tick()
	tb.Cleanup(func() {
		close(w.stop)
		w.wg.Wait()
	})
	return w
}

func (w *memWire) qp(qpn uint32) *rc.QP {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.qps[qpn]
}

func (w *memWire) deliver() {
	defer w.wg.Done()
	debug.SetPanicOnFault(true) // as package udp's goroutines

	for {
		select {
		case <-w.stop:
			return
		case b := <-w.ch:
			p, err := roce.Parse(b)
			if err != nil {
				panic(err)
			}
			if q := w.qp(p.BTH.DestQP); q != nil {
				q.Receive(&p)
				q.Flush()
			}
		}
	}
}

func (w *memWire) tick() {
	defer w.wg.Done()
	debug.SetPanicOnFault(true)
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			w.mu.Lock()
			qs := make([]*rc.QP, 0, len(w.qps))
			for _, q := range w.qps {
				qs = append(qs, q)
			}
			w.mu.Unlock()
			for _, q := range qs {
				q.Tick()
			}
		}
	}
}

// memNet is one host's side of a memWire (an engine.Network).
type memNet struct {
	w      *memWire
	local  [16]byte
	mu     sync.Mutex
	conns  int // protected by mu
	closed int // protected by mu
	paths  int // protected by mu: the last Connect's
	locals int // protected by mu: the last Connect's
}

type memPort struct {
	w  *memWire
	qp *rc.QP
}

func (p *memPort) Send(pkt []byte) {
	p.w.mu.Lock()
	p.w.sent++
	drop := p.w.drop != nil && p.w.drop(p.w.sent)
	p.w.mu.Unlock()
	if !drop {
		p.w.ch <- bytes.Clone(pkt)
	}
}
func (p *memPort) Flush() {}
func (p *memPort) Wake()  { go p.qp.Pump() }

type memConn struct {
	*rc.QP
	n *memNet
}

func (c *memConn) Close() {
	c.n.w.mu.Lock()
	delete(c.n.w.qps, c.QPN())
	c.n.w.mu.Unlock()
	c.n.mu.Lock()
	c.n.closed++
	c.n.mu.Unlock()
	c.QP.Close()
}

func (n *memNet) Connect(sgid, dgid [16]byte, locals [][16]byte, paths int, cfg rc.Config, host rc.Host) (rc.Conn, error) {
	if sgid != n.local {
		return nil, ErrGIDIndex
	}
	p := &memPort{w: n.w}
	q, err := rc.NewRTR(cfg, host, p)
	if err != nil {
		return nil, err
	}
	p.qp = q
	n.w.mu.Lock()
	n.w.qps[cfg.QPN] = q
	n.w.mu.Unlock()
	n.mu.Lock()
	n.conns++
	n.paths, n.locals = paths, len(locals)
	n.mu.Unlock()
	return &memConn{QP: q, n: n}, nil
}

func (n *memNet) counts() (conns, closed int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.conns, n.closed
}

var (
	hostA = netip.MustParseAddr("10.0.0.1").As16()
	hostB = netip.MustParseAddr("10.0.0.2").As16()
)

// netPair is two nodes on two fabrics (hosts) joined by a memWire, their
// QPs connected over it from network GID index 1.
type netPair struct {
	w          *memWire
	na, nb     *memNet
	a, b       *node
	fa, fb     *Fabric
	stopEngine chan struct{}
}

func newNetPair(tb testing.TB, o pairOpts) *netPair {
	tb.Helper()
	p := newNetPairIdle(tb, o)
	// The engines: a driver's doorbell would wake them; here they poll.
	p.stopEngine = make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-p.stopEngine:
				return
			default:
			}
			wa, _ := p.a.d.Poll(0, p.a.g.tbl)
			wb, _ := p.b.d.Poll(0, p.b.g.tbl)
			if !wa && !wb {
				time.Sleep(50 * time.Microsecond)
			}
		}
	}()
	tb.Cleanup(func() {
		close(p.stopEngine)
		wg.Wait()
	})
	return p
}

// newNetPairIdle is newNetPair without engines: the test polls.
func newNetPairIdle(tb testing.TB, o pairOpts) *netPair {
	return newNetPairOn(tb, o, nil)
}

// newNetPairOn is newNetPairIdle with b on guest bg (nil: a fresh one),
// its MR in bg's second region.
func newNetPairOn(tb testing.TB, o pairOpts, bg *cutGuest) *netPair {
	tb.Helper()
	w := newMemWire(tb)
	p := &netPair{w: w, na: &memNet{w: w, local: hostA}, nb: &memNet{w: w, local: hostB}, fa: NewFabric(), fb: NewFabric()}
	p.fa.SetNetwork(p.na, [][16]byte{hostA})
	p.fb.SetNetwork(p.nb, [][16]byte{hostB})
	p.a = newNode(tb, p.fa, 1, 0x100, o.qp)
	if bg != nil {
		p.b = newNodeOn(tb, p.fb, bg, 2, 0x200)
	} else {
		p.b = newNode(tb, p.fb, 2, 0x200, o.qp)
	}
	access := o.accessB
	if access == 0 {
		access = abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic
	}
	minRNR := o.minRNR
	if minRNR == 0 {
		minRNR = 1
	}
	netConnect(tb, p.a.qp, hostB, p.b.qp.Num, abi.AccessRemoteWrite|abi.AccessRemoteRead|abi.AccessRemoteAtomic, minRNR, o.rnrRetry)
	netConnect(tb, p.b.qp, hostA, p.a.qp.Num, access, minRNR, o.rnrRetry)
	return p
}

// netConnect is connect with the peer's network GID at sgid_index 1.
func netConnect(tb testing.TB, q *QP, dgid [16]byte, dest, access, minRNR, rnrRetry uint32) {
	tb.Helper()
	steps := []abi.QPAttr{
		{QPN: q.Num, QPState: abi.QPSInit, AttrMask: abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrAccessFlags,
			PortNum: 1, QPAccessFlags: access},
		{QPN: q.Num, QPState: abi.QPSRTR, AttrMask: abi.QPAttrState | abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN |
			abi.QPAttrRQPSN | abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer,
			DGID: dgid, SGIDIndex: 1, PathMTU: abi.MTU1024, DestQPNum: dest, MinRNRTimer: minRNR, MaxDestRdAtomic: 16, RQPSN: 0x123},
		{QPN: q.Num, QPState: abi.QPSRTS, AttrMask: abi.QPAttrState | abi.QPAttrSQPSN | abi.QPAttrTimeout | abi.QPAttrRetryCnt |
			abi.QPAttrRNRRetry | abi.QPAttrMaxQPRdAtomic, RNRRetry: rnrRetry, Timeout: 10, RetryCnt: 7, MaxRdAtomic: 16, SQPSN: 0x123},
	}
	for _, s := range steps {
		if st := q.Modify(s); st != abi.StatusOK {
			tb.Fatalf("modify %v to %d: got %v, want OK", q, s.QPState, st)
		}
	}
}

// waitCQEs collects CQEs of c until it has n (bounded).
func (n *node) waitCQEs(tb testing.TB, c *CQ, want int) []abi.CQE {
	tb.Helper()
	var got []abi.CQE
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < want {
		got = append(got, n.cqes(tb, c)...)
		if time.Now().After(deadline) {
			tb.Fatalf("got %d CQEs %+v, want %d", len(got), got, want)
		}
		time.Sleep(100 * time.Microsecond)
	}
	return got
}
