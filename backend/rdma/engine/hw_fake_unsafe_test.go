package engine

import (
	"encoding/binary"
	"errors"
	"sync"
	"unsafe"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// fakeNIC is a loopback host NIC for the engine's tests of the NIC seam:
// its QPs execute RC operations between each other at once, through the
// host addresses their MRs were registered with, checking keys, PDs,
// ranges and access as a NIC does, and complete into their CQs. The real
// one (backend/rdma/hostnic over rxe) is tested in a guest
// (tests/hostnic_test.go); this one shows what the engine does with any.
type fakeNIC struct {
	mu       sync.Mutex
	gids     [][16]byte
	next     uint32
	mrs      map[uint32]*fakeMR
	qps      map[uint32]*fakeQP
	live     int // objects not closed
	posts    int // PostSend and PostRecv calls
	watchers []func(uint32)
}

func newFakeNIC(gids ...[16]byte) *fakeNIC {
	return &fakeNIC{gids: gids, next: 0x40, mrs: map[uint32]*fakeMR{}, qps: map[uint32]*fakeQP{}}
}

func (n *fakeNIC) Name() string { return "verbs:fake0:1" }

func (n *fakeNIC) Watch(fn func(uint32)) func() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.watchers = append(n.watchers, fn)
	i := len(n.watchers) - 1
	return func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.watchers[i] = nil
	}
}

// event delivers a port event to the watchers.
func (n *fakeNIC) event(ev uint32) {
	n.mu.Lock()
	ws := append([]func(uint32){}, n.watchers...)
	n.mu.Unlock()
	for _, w := range ws {
		if w != nil {
			w(ev)
		}
	}
}

func (n *fakeNIC) HostGIDIndex(g [16]byte) (int, bool) {
	for i, x := range n.gids {
		if x == g {
			return i + 3, true // the host's table is not the guest's
		}
	}
	return 0, false
}

func (n *fakeNIC) id() uint32 { n.next += 0x11; return n.next }

func (n *fakeNIC) AllocPD() (NICPD, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.live++
	return &fakePD{n: n}, nil
}

func (n *fakeNIC) CreateCQ(depth uint32, notify func()) (NICCQ, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.live++
	return &fakeCQ{n: n, depth: depth, notify: notify}, nil
}

type fakePD struct{ n *fakeNIC }

func (p *fakePD) Close() error { p.n.mu.Lock(); p.n.live--; p.n.mu.Unlock(); return nil }

type fakeMR struct {
	n         *fakeNIC
	pd        *fakePD
	key       uint32
	addr      uintptr
	iova, len uint64
	access    uint32
}

func (p *fakePD) RegMR(addr uintptr, length, iova uint64, access uint32) (NICMR, error) {
	n := p.n
	n.mu.Lock()
	defer n.mu.Unlock()
	m := &fakeMR{n: n, pd: p, key: n.id(), addr: addr, iova: iova, len: length, access: access}
	n.mrs[m.key] = m
	n.live++
	return m, nil
}

func (m *fakeMR) Keys() (uint32, uint32) { return m.key, m.key }
func (m *fakeMR) Close() error {
	m.n.mu.Lock()
	defer m.n.mu.Unlock()
	delete(m.n.mrs, m.key)
	m.n.live--
	return nil
}

// bytes returns the registered bytes [addr, addr+n) if p, access and range
// allow it.
func (m *fakeMR) bytes(p *fakePD, addr, n uint64, need uint32) []byte {
	if m == nil || m.pd != p || addr < m.iova || addr-m.iova > m.len || n > m.len-(addr-m.iova) ||
		(need != 0 && m.access&need == 0) {
		return nil
	}
	if n == 0 {
		return []byte{}
	}
	return hostBytes(m.addr+uintptr(addr-m.iova), n)
}

type fakeCQ struct {
	n      *fakeNIC
	depth  uint32
	notify func()
	wc     []NICWC
}

func (c *fakeCQ) push(w NICWC) {
	if uint32(len(c.wc)) >= c.depth {
		panic("fake NIC: CQ overrun (the engine posted more than the CQ holds)")
	}
	c.wc = append(c.wc, w)
	go c.notify() // as a NIC's event thread would
}

func (c *fakeCQ) Poll(out []NICWC) (int, error) {
	c.n.mu.Lock()
	defer c.n.mu.Unlock()
	k := copy(out, c.wc)
	c.wc = c.wc[k:]
	return k, nil
}

func (c *fakeCQ) Depth() uint32 { return c.depth }

func (c *fakeCQ) Close() error { c.n.mu.Lock(); c.n.live--; c.n.mu.Unlock(); return nil }

type fakeQP struct {
	n     *fakeNIC
	pd    *fakePD
	num   uint32
	scq   *fakeCQ
	rcq   *fakeCQ
	state uint32
	dest  uint32
	sgid  uint32
	recvs []fakeRecv
}

type fakeRecv struct {
	wrID uint64
	sges []abi.SGE
}

func (p *fakePD) CreateQP(init NICQPInit) (NICQP, error) {
	n := p.n
	n.mu.Lock()
	defer n.mu.Unlock()
	q := &fakeQP{n: n, pd: p, num: n.id() & 0xffffff, scq: init.SendCQ.(*fakeCQ), rcq: init.RecvCQ.(*fakeCQ), state: abi.QPSReset}
	n.qps[q.num] = q
	n.live++
	return q, nil
}

func (q *fakeQP) Num() uint32 { return q.num }

func (q *fakeQP) Close() error {
	q.n.mu.Lock()
	defer q.n.mu.Unlock()
	delete(q.n.qps, q.num)
	q.n.live--
	return nil
}

func (q *fakeQP) Modify(a *abi.QPAttr) error {
	q.n.mu.Lock()
	defer q.n.mu.Unlock()
	if a.AttrMask&abi.QPAttrDestQPN != 0 {
		q.dest = a.DestQPNum
	}
	if a.AttrMask&abi.QPAttrAV != 0 {
		if a.SGIDIndex < 3 {
			return errors.New("fake: the guest's sgid_index reached the NIC")
		}
		q.sgid = a.SGIDIndex
	}
	q.state = a.QPState
	switch a.QPState {
	case abi.QPSErr:
		for _, r := range q.recvs {
			q.rcq.push(NICWC{WRID: r.wrID, Status: abi.WCWRFlushErr, QPNum: q.num})
		}
		q.recvs = nil
	case abi.QPSReset:
		q.recvs = nil
	}
	return nil
}

func (q *fakeQP) PostRecv(wrs []NICRecvWR, sges []abi.SGE) (int, error) {
	q.n.mu.Lock()
	defer q.n.mu.Unlock()
	q.n.posts++
	if q.state == abi.QPSReset || q.state == abi.QPSErr {
		return 0, errors.New("fake: post_recv in RESET/ERR")
	}
	for _, w := range wrs {
		q.recvs = append(q.recvs, fakeRecv{w.WRID, append([]abi.SGE(nil), sges[w.FirstSGE:w.FirstSGE+w.NumSGE]...)})
	}
	return len(wrs), nil
}

func (q *fakeQP) PostSend(wrs []NICSendWR, sges []abi.SGE) (int, error) {
	n := q.n
	n.mu.Lock()
	defer n.mu.Unlock()
	n.posts++
	if q.state != abi.QPSRTS {
		return 0, errors.New("fake: post_send outside RTS")
	}
	for _, w := range wrs {
		st, byteLen := q.execute(&w, sges[w.FirstSGE:w.FirstSGE+uint32(w.NumSGE)])
		if w.Flags&abi.WRFlagSignaled != 0 || st != abi.WCSuccess {
			q.scq.push(NICWC{WRID: w.WRID, Status: st, Opcode: wcOpcode(w.Opcode), QPNum: q.num, ByteLen: byteLen})
		}
		if st != abi.WCSuccess {
			q.state = abi.QPSErr
		}
	}
	return len(wrs), nil
}

// execute runs one work request against the destination QP.
func (q *fakeQP) execute(w *NICSendWR, sges []abi.SGE) (abi.WCStatus, uint32) {
	n := q.n
	var src []byte
	if w.Flags&abi.WRFlagInline != 0 {
		src = append(src, hostBytes(w.Inline, uint64(w.InlineLen))...)
	}
	var local [][]byte
	need := uint32(0)
	if w.Opcode == abi.WROpRDMARead || w.Opcode >= abi.WROpAtomicCmpSwp {
		need = abi.AccessLocalWrite
	}
	for _, s := range sges {
		b := n.mrs[s.LKey].bytes(q.pd, s.Addr, uint64(s.Length), need)
		if b == nil {
			return abi.WCLocProtErr, 0
		}
		local = append(local, b)
		if w.Flags&abi.WRFlagInline == 0 {
			src = append(src, b...)
		}
	}
	p := n.qps[q.dest]
	if p == nil || p.state < abi.QPSRTR || p.state == abi.QPSErr || p.dest != q.num {
		return abi.WCRetryExcErr, 0
	}
	remote := func(size uint64, acc uint32) []byte {
		return n.mrs[w.RKey].bytes(p.pd, w.RemoteAddr, size, acc)
	}
	recv := func(imm bool) abi.WCStatus {
		if len(p.recvs) == 0 {
			return abi.WCRNRRetryExcErr
		}
		r := p.recvs[0]
		p.recvs = p.recvs[1:]
		wc := NICWC{WRID: r.wrID, QPNum: p.num, SrcQP: q.num, Opcode: abi.WCOpRecv}
		if imm {
			wc.WCFlags, wc.Imm = abi.WCFlagWithImm, w.Imm
		}
		if w.Opcode == abi.WROpRDMAWriteWithImm {
			wc.Opcode = abi.WCOpRecvRDMAWithImm
		} else {
			rest := src
			for _, s := range r.sges {
				b := n.mrs[s.LKey].bytes(p.pd, s.Addr, uint64(s.Length), abi.AccessLocalWrite)
				if b == nil {
					wc.Status = abi.WCLocProtErr
					break
				}
				rest = rest[copy(b, rest):]
			}
			if len(rest) != 0 && wc.Status == abi.WCSuccess {
				wc.Status = abi.WCLocLenErr
			}
			wc.ByteLen = uint32(len(src))
		}
		p.rcq.push(wc)
		if wc.Status != abi.WCSuccess {
			return abi.WCRemOpErr
		}
		return abi.WCSuccess
	}
	switch w.Opcode {
	case abi.WROpSend, abi.WROpSendWithImm:
		return recv(w.Opcode == abi.WROpSendWithImm), uint32(len(src))
	case abi.WROpRDMAWrite, abi.WROpRDMAWriteWithImm:
		dst := remote(uint64(len(src)), abi.AccessRemoteWrite)
		if dst == nil {
			return abi.WCRemAccessErr, 0
		}
		copy(dst, src)
		if w.Opcode == abi.WROpRDMAWriteWithImm {
			return recv(true), uint32(len(src))
		}
		return abi.WCSuccess, uint32(len(src))
	case abi.WROpRDMARead:
		from := remote(uint64(len(src)), abi.AccessRemoteRead)
		if from == nil {
			return abi.WCRemAccessErr, 0
		}
		for _, b := range local {
			from = from[copy(b, from):]
		}
		return abi.WCSuccess, uint32(len(src))
	default:
		at := remote(8, abi.AccessRemoteAtomic)
		if at == nil || len(local) != 1 || len(local[0]) != 8 {
			return abi.WCRemAccessErr, 0
		}
		old := binary.LittleEndian.Uint64(at)
		if w.Opcode == abi.WROpAtomicFetchAdd {
			binary.LittleEndian.PutUint64(at, old+w.CompareAdd)
		} else if old == w.CompareAdd {
			binary.LittleEndian.PutUint64(at, w.Swap)
		}
		binary.LittleEndian.PutUint64(local[0], old)
		return abi.WCSuccess, 8
	}
}

// hostBytes is the n bytes at host address addr (memory mapped outside Go's
// heap: a guest memory view or ring).
func hostBytes(addr uintptr, n uint64) []byte {
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}
