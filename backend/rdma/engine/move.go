package engine

import (
	"errors"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// errScatterShort means the destination list ended before the source: a
// caller checked the lengths, so it indicates a bug, reported as an error.
var errScatterShort = errors.New("scatter list shorter than the message")

// errAtomicSplit means the 8 bytes of an atomic's target are not one host
// view (a guest memory region boundary inside them).
var errAtomicSplit = errors.New("atomic target split across regions")

// cursor walks a checked scatter list (SGEs whose MRs are resolved) on one
// device's table.
type cursor struct {
	t    *memmap.Table
	sges []abi.SGE
	mrs  []*MR
	i    int    // current SGE
	off  uint64 // bytes of sges[i] already written
}

// mover copies a source (host views handed to srcFn) into a destination
// cursor with copy(), without an intermediate buffer. Its function values
// are made once, so moving data allocates nothing.
type mover struct {
	dst       cursor
	src       []byte // the rest of the current source view
	moved     uint64
	dstFailed bool // the destination side's translation failed

	srcFn func([]byte) error // feeds one source view
	dstFn func([]byte) error // fills one destination view from src
}

func (m *mover) init() {
	m.srcFn = m.fromSource
	m.dstFn = m.intoDest
}

// start resets the mover for a new message into dst.
func (m *mover) start(t *memmap.Table, sges []abi.SGE, mrs []*MR) {
	m.dst = cursor{t: t, sges: sges, mrs: mrs}
	m.src, m.moved, m.dstFailed = nil, 0, false
}

// fromSource scatters view over the destination. The loop ends: every
// iteration consumes bytes or moves to the next SGE.
func (m *mover) fromSource(view []byte) error {
	m.src = view
	c := &m.dst
	for len(m.src) > 0 {
		if c.i >= len(c.sges) {
			m.dstFailed = true
			return errScatterShort
		}
		s := &c.sges[c.i]
		rem := uint64(s.Length) - c.off
		if rem == 0 {
			c.i++
			c.off = 0
			continue
		}
		n := min(rem, uint64(len(m.src)))
		if err := c.mrs[c.i].RangeWrite(c.t, s.Addr+c.off, n, m.dstFn); err != nil {
			m.dstFailed = true
			return err
		}
		c.off += n
	}
	return nil
}

// intoDest copies the head of the current source view into view.
func (m *mover) intoDest(view []byte) error {
	k := copy(view, m.src)
	m.src = m.src[k:]
	m.moved += uint64(k)
	return nil
}

// errAtomicContended means a compare-and-swap lost its race maxCASTries times.
var errAtomicContended = errors.New("atomic target contended")

const maxCASTries = 1 << 16

// atomicOp performs an RDMA atomic on its target view.
type atomicOp struct {
	op         uint8
	compareAdd uint64
	swap       uint64
	orig       [8]byte // the original value, little-endian, as the guest stores it
	fn         func([]byte) error
	done       bool
}

func (a *atomicOp) init() { a.fn = a.apply }

// apply runs the 64-bit locked operation on view (8 bytes, 8-aligned in
// guest-physical space).
func (a *atomicOp) apply(view []byte) error {
	if len(view) != 8 || a.done {
		return errAtomicSplit
	}
	var old uint64
	switch a.op {
	case abi.WROpAtomicCmpSwp:
		// CAS returns no old value: load, compare, swap, retry if the
		// value changed in between. Bounded: a guest CPU hammering the
		// word makes the operation fail rather than spin forever.
		for i := 0; ; i++ {
			if i == maxCASTries {
				return errAtomicContended
			}
			old = abi.LoadUint64(view, 0)
			if old != a.compareAdd || abi.CompareAndSwapUint64(view, 0, old, a.swap) {
				break
			}
		}
	default:
		old = abi.AddUint64(view, 0, a.compareAdd) - a.compareAdd
	}
	putLE64(a.orig[:], old)
	a.done = true
	return nil
}

func putLE64(b []byte, v uint64) {
	_ = b[7]
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}

// scratch is a QP's device-local working memory, allocated once on first
// use and protected by QP.sqMu.
type scratch struct {
	wqe  [abi.PageSize]byte // the send WQE copy
	rwqe [abi.PageSize]byte // the peer's receive WQE copy

	lsge [maxSendSGEs]abi.SGE
	lmr  [maxSendSGEs]*MR
	rsge [maxRecvSGEs]abi.SGE
	rmr  [maxRecvSGEs]*MR
	one  [1]abi.SGE // a remote range as a one-entry list
	oneM [1]*MR

	mv   mover
	atom atomicOp

	// held: the head send WQE was read and decoded (into w, from wqe)
	// and waits for an RNR retry; it is not read from the ring again.
	held bool
	w    sendWQE

	req  request           // the message being answered (run builds it for respond)
	recv recvWQE           // the receive WQE it consumes
	grh  [abi.GRHSize]byte // a UD datagram's network header (ud.go)

	keys keyCache // the last keys and QP numbers this QP resolved

	// pages is a REG_MR WQE's page list, copied once (memops.go);
	// allocated by the QP's first fast registration.
	pages []abi.GPA
}

func newScratch() *scratch {
	s := &scratch{}
	s.mv.init()
	s.atom.init()
	return s
}
