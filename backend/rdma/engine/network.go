package engine

import (
	"errors"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Network reaches QPs on other hosts: package roce/udp implements it over
// UDP 4791 (RoCEv2). The fabric has at most one (Fabric.SetNetwork).
type Network interface {
	// Connect makes the transport of a local QP connected from the
	// host address of GID sgid to QP cfg.DestQPN at the host address of
	// GID dgid, in RTR (rc.Conn: Start moves it to RTS). locals are the
	// device's network GIDs (sgid among them), paths the paths the QP
	// asked to spray over (0: the network's default; 1: plain RoCEv2).
	// host is the QP's memory, receives and completions.
	Connect(sgid, dgid [16]byte, locals [][16]byte, paths int, cfg rc.Config, host rc.Host) (rc.Conn, error)
}

// MaxPaths bounds MODIFY_QP's paths.
const MaxPaths = 64

// errGuestFault is what a network transport's access to guest memory
// returns when the memory faulted (the front-end shrank the file behind
// it): the transport completes the work request in error.
var errGuestFault = errors.New("guest memory fault")

// containFault, deferred by every method a network transport calls into
// guest memory with, turns a memory fault into errGuestFault (in *err) and
// lets any other panic through. The transports' goroutines run with
// debug.SetPanicOnFault (package udp), the engine's under memmap.Guard.
func containFault(err *error) {
	if r := recover(); r != nil {
		if _, ok := memmap.FaultAddr(r); ok {
			*err = errGuestFault
			return
		}
		panic(r)
	}
}

// netQP is the network side of a QP connected to a peer on another host:
// the engine's requester posts the QP's send WQEs to conn (post, under
// sqMu), and conn calls back, from its own goroutines and with its lock
// held, as the QP's rc.Host: Resolve and the Region methods of *MR for
// incoming WRITE, READ and atomic requests, TakeRecv and RecvDone for the
// receive queue, SendDone for completions.
//
// A posted WQE lives in slot seq mod len(slots) until its completion:
// conn holds at most len(slots) (rc.Config.SQSize), so a slot is never
// reused while conn may still gather from it.
//
// Lock order (doc.go): QP.sqMu, then conn's lock, then QP.rqMu, QP.mu,
// CQ.mu. Nothing calls into conn holding rqMu or mu.
type netQP struct {
	q    *QP     // immutable
	conn rc.Conn // immutable once set by Modify (before the QP reaches RTR)

	slots []netSlot // see above
	tail  uint64    // next seq to post (protected by q.sqMu)
	done  atomic.Uint64

	// waiting: the requester stopped on a full transport or on a WQE that
	// must complete after the outstanding ones; the next completion
	// kicks it.
	waiting atomic.Bool
	// quiet: completions are not written (the QP is being destroyed or
	// reset: its WQEs are discarded, not completed).
	quiet  atomic.Bool
	closed atomic.Bool
	held   atomic.Bool // frozen for a live migration (RNIC.HoldNet, RestoreNet) until HoldNet(false)
	// remote is the peer QP, claimed on the fabric (claimConn) from
	// before the transport is made until it closes (immutable once set by
	// Modify).
	remote remoteQP

	// The receives conn took and has not completed, oldest first: a
	// ring of recvOpen of them from recvHead (plain RC fills one at a
	// time; spray places into several at once and completes them in the
	// order it took them). Written under conn's lock; read after Close
	// returned.
	recvs    []recvBuf
	recvHead int
	recvOpen int

	// restoreT is the device's table while RestoreNet rebuilds the
	// transport (rc.Rebuilder); nil otherwise.
	restoreT *memmap.Table
}

// netSlot is one posted send WQE.
type netSlot struct {
	wrID      uint64
	opcode    uint8
	signaled  bool
	solicited bool
	buf       sendBuf
}

func newNetQP(q *QP) *netQP {
	n := &netQP{q: q, slots: make([]netSlot, q.SQ.Depth)}
	for i := range n.slots {
		n.slots[i].buf.dev = q.Dev
	}
	n.recvs = make([]recvBuf, q.recvDepth())
	for i := range n.recvs {
		n.recvs[i].dev = q.Dev
	}
	return n
}

// outstanding reports whether posted WQEs await their completion.
func (n *netQP) outstanding() bool { return n.done.Load() != n.tail }

// rcConfig is the transport configuration of QP q for MODIFY_QP INIT→RTR
// attributes a.
func (q *QP) rcConfig(a *abi.QPAttr) rc.Config {
	return rc.Config{
		QPN: q.Num, DestQPN: a.DestQPNum,
		RQPSN:           roce.PSN(a.RQPSN),
		PMTU:            roce.MTU(128 << a.PathMTU),
		SQSize:          int(q.SQ.Depth),
		MinRNRTimer:     uint8(a.MinRNRTimer),
		MaxDestRdAtomic: int(a.MaxDestRdAtomic),
	}
}

// rtsConfig is the requester's part of the configuration at RTR→RTS.
func rtsConfig(a *abi.QPAttr) rc.Config {
	return rc.Config{
		SQPSN:       roce.PSN(a.SQPSN),
		Timeout:     rc.TimeoutDuration(uint8(a.Timeout)),
		RetryCnt:    int(a.RetryCnt),
		RNRRetry:    int(a.RNRRetry),
		MaxRdAtomic: int(a.MaxRdAtomic),
	}
}

// postResult is what the transport made of a WQE (netQP.post).
type postResult uint8

const (
	netPosted  postResult = iota
	netHeld               // the transport cannot take it now: it stays at the head; a completion kicks the QP
	netRefused            // the transport cannot carry it (rc.ErrWR): it fails with LOC_QP_OP_ERR
)

// post hands the validated WQE w (its local SGEs checked: lsge, lmr, total)
// to the transport. Precondition: sqMu held.
func (n *netQP) post(w *sendWQE, sc *scratch, lsge []abi.SGE, lmr []*MR, total uint64) postResult {
	// Slot tail is free once the WQE posted len(slots) before it has
	// completed: SendDone stores done after its last use of the slot.
	// (sq_ci advanced when that WQE was posted, so the driver may have
	// reused its ring slot long before.)
	if n.tail-n.done.Load() >= uint64(len(n.slots)) {
		n.waiting.Store(true) // before looking again: a completion now kicks
		if n.tail-n.done.Load() >= uint64(len(n.slots)) {
			return netHeld
		}
		n.waiting.Store(false)
	}
	s := &n.slots[n.tail%uint64(len(n.slots))]
	s.wrID, s.opcode = w.wrID, w.opcode
	s.signaled = w.flags&abi.WRFlagSignaled != 0 || n.q.SigAll
	s.solicited = w.flags&abi.WRFlagSolicited != 0
	b := &s.buf
	b.sge = append(b.sge[:0], lsge...)
	b.mr = append(b.mr[:0], lmr...)
	b.inline = b.inline[:0]
	if w.flags&abi.WRFlagInline != 0 {
		b.inline = append(b.inline, sc.wqe[abi.SendWQEHdrSize:abi.SendWQEHdrSize+int(w.inlineLen)]...)
	}
	wr := rc.SendWR{
		ID: n.tail, Opcode: rc.WROpcode(w.opcode), Length: uint32(total),
		RemoteAddr: w.remoteAddr, RKey: w.rkey,
		// The WQE holds imm_data as the guest stored the big-endian
		// word; the transport takes it as a number.
		Imm:       bits.ReverseBytes32(w.imm),
		Fence:     w.flags&abi.WRFlagFence != 0,
		Solicited: s.solicited,
	}
	switch w.opcode {
	case abi.WROpAtomicCmpSwp:
		wr.Compare, wr.SwapAdd = w.compareAdd, w.swap
	case abi.WROpAtomicFetchAdd:
		wr.SwapAdd = w.compareAdd
	case abi.WROpSendWithInv:
		wr.Imm, wr.Invalidate = 0, w.imm // imm_data holds the key as a number
	}
	if total > 0 {
		wr.Local = b
	}
	n.waiting.Store(true) // before Post: a completion racing with a refusal kicks
	switch err := n.conn.Post(wr); {
	case err == nil:
		n.waiting.Store(false)
		n.tail++
		return netPosted
	case errors.Is(err, rc.ErrWR):
		// A valid WQE the transport cannot carry (SEND_WITH_INV over
		// the spray extension).
		n.waiting.Store(false)
		return netRefused
	default:
		// ErrQueueFull, or ErrState: RTS reached before Start (a race
		// with MODIFY_QP) or the transport failed (its completion moved
		// the QP to ERR).
		return netHeld
	}
}

// SendDone completes the posted WQE c.ID (rc.Host; completions arrive in
// posting order).
func (n *netQP) SendDone(c rc.Completion) {
	q := n.q
	s := &n.slots[c.ID%uint64(len(n.slots))]
	d := q.Dev
	if c.Status == abi.WCSuccess {
		if int(s.opcode) < len(d.ops) {
			d.ops[s.opcode].Add(1)
		}
		d.bytesMoved.Add(uint64(c.ByteLen))
	}
	if !n.quiet.Load() && (c.Status != abi.WCSuccess || s.signaled) {
		e := abi.CQE{WRID: s.wrID, Status: c.Status, Opcode: wcOpcode(s.opcode), QPNum: q.Num}
		if c.Status == abi.WCSuccess {
			e.ByteLen = c.ByteLen
		}
		n.completeOn(q.SendCQ, &e, false, true)
	}
	clear(s.buf.mr) // drop the MR references
	s.buf.mr = s.buf.mr[:0]
	n.done.Store(c.ID + 1)
	if c.Status != abi.WCSuccess && c.Status != abi.WCWRFlushErr {
		q.toErr(false)
	}
	if n.waiting.Swap(false) {
		q.rnrKick.Store(true)
		d.wakeQueue(q.DoorbellQueue)
	}
}

// completeOn writes a CQE from a transport goroutine (send: of a send
// WQE): the device's table is acquired for it, and a fault in the CQ's
// ring (the front-end's memory) loses the CQE rather than the daemon.
func (n *netQP) completeOn(c *CQ, e *abi.CQE, solicited, send bool) {
	d := n.q.Dev
	t := d.acquire()
	if t == nil {
		return
	}
	defer t.Release()
	var err error
	func() {
		defer containFault(&err)
		if send {
			// The send WQE's consumer index (raised when the pass
			// handed it to the transport, stored by the pass's
			// publish) before its CQE: the pass may not have
			// published it yet (ci.go). A receive's rq_ci was stored
			// when the transport took the WQE (TakeRecv).
			n.q.storeCIOn(t)
		}
		d.complete(c, t, e, solicited)
	}()
	if err != nil {
		d.log.WithField("qp", n.q.Num).Warn("completion lost: guest memory fault")
	}
}

// Resolve checks an incoming request's rkey (rc.Host): the MR, or the
// bound window, must be of this QP's PD, hold the whole range and allow
// the access, and so must the QP's access flags. A zero-length request
// checks the QP's access flags only, as on this host (respond.go).
func (n *netQP) Resolve(rkey uint32, va uint64, length uint32, access rc.Access) (rc.Region, bool) {
	q := n.q
	q.mu.Lock()
	acc := q.attr.QPAccessFlags
	q.mu.Unlock()
	if length == 0 {
		return nil, acc&uint32(access) == uint32(access)
	}
	// An MR's rkey or a bound window's, as on this host (remoteKey): a
	// type 2 window answers only this QP.
	mr := remoteKey(nil, q, acc, rkey, va, uint64(length), uint32(access))
	if mr == nil {
		return nil, false
	}
	return mr, true
}

// TakeRecv consumes the head receive WQE (rc.Host): it is copied and
// checked, rq_ci advances at once, and its completion comes with RecvDone.
// A WQE that does not decode or names memory the QP may not write is
// handed over as a receive that fails to scatter (LOC_PROT_ERR).
func (n *netQP) TakeRecv() (rv rc.Recv, ok bool) {
	q := n.q
	t := q.Dev.acquire()
	if t == nil {
		return rc.Recv{}, false
	}
	defer t.Release()
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	var err error
	func() {
		defer containFault(&err)
		rv, ok = n.takeRecvLocked(t)
	}()
	if err != nil {
		q.toErr(true)
		return rc.Recv{}, false
	}
	return rv, ok
}

// takeRecvLocked is TakeRecv under rqMu and the table t.
func (n *netQP) takeRecvLocked(t *memmap.Table) (rc.Recv, bool) {
	q := n.q
	rec, err := t.Slice(q.Record, QPRecordSize(q.RQNotify))
	if err != nil {
		return rc.Recv{}, false
	}
	if n.recvOpen == len(n.recvs) {
		return rc.Recv{}, false // as many receives in flight as the queue holds
	}
	b := &n.recvs[(n.recvHead+n.recvOpen)%len(n.recvs)]
	var wqe [abi.PageSize]byte
	var sges [maxRecvSGEs]abi.SGE
	// The same-host responder's function: the QP's receive queue or its
	// SRQ. Nothing posted, a broken index (the engine's pass breaks the
	// QP) or a stopped SRQ is receiver-not-ready for the transport.
	wrID, ns, res := q.takeRecvWQE(t, rec, wqe[:], sges[:], nil)
	if res != takeOK && res != takeBad {
		return rc.Recv{}, false
	}
	b.sge, b.mr, b.bad = append(b.sge[:0], sges[:ns]...), b.mr[:0], res == takeBad
	pd := q.recvPD()
	var capacity uint64
	for i := range b.sge {
		s := &b.sge[i]
		mr := q.Dev.LookupMR(s.LKey)
		if mr == nil || mr.PD != pd || !mr.Local(t, s.Addr, uint64(s.Length)) || mr.Access&abi.AccessLocalWrite == 0 {
			b.bad = true
		}
		b.mr = append(b.mr, mr)
		capacity += uint64(s.Length)
	}
	if q.SRQ == nil {
		q.rqCI++
		q.setCIOn(t, rqIdx, rec, q.rqCI)
	}
	b.wrID = wrID
	n.recvOpen++
	return rc.Recv{ID: wrID, Len: uint32(min(capacity, abi.MaxMsgSize)), Buf: b}, true
}

// RecvDone completes a receive (rc.Host). An error completion moves the
// QP to ERR, as the responder's errors do on the same host.
func (n *netQP) RecvDone(c rc.RecvCompletion) {
	q := n.q
	if n.recvOpen > 0 {
		// Completions come in the order the receives were taken.
		b := &n.recvs[n.recvHead]
		clear(b.mr)
		b.mr = b.mr[:0]
		n.recvHead = (n.recvHead + 1) % len(n.recvs)
		n.recvOpen--
	}
	if n.quiet.Load() {
		return
	}
	q.mu.Lock()
	src := q.attr.DestQPNum
	q.mu.Unlock()
	e := abi.CQE{WRID: c.ID, Status: c.Status, Opcode: abi.WCOpRecv, QPNum: q.Num, SrcQP: src}
	if c.Status == abi.WCSuccess {
		e.ByteLen = c.ByteLen
		if c.WithImm {
			e.WCFlags, e.ImmData = abi.WCFlagWithImm, bits.ReverseBytes32(c.Imm)
		}
		if c.Write {
			e.Opcode = abi.WCOpRecvRDMAWithImm
		}
		if c.WithInv {
			e.WCFlags, e.ImmData = abi.WCFlagWithInv, c.InvRKey // a key: a number
		}
	}
	n.completeOn(q.RecvCQ, &e, c.Solicited, false)
	if c.Status != abi.WCSuccess {
		q.toErr(true)
	}
}

// Failed moves the QP to ERR when its transport failed by itself
// (rc.Failer): fatal for a request it refused, which raises QP_FATAL as
// a responder error does on one host.
func (n *netQP) Failed(fatal bool) { n.q.toErr(fatal) }

// close stops the transport. quiet: the QP's WQEs are being discarded
// (RESET, destroy), so the flushed ones are not completed.
func (n *netQP) close(quiet bool) {
	if quiet {
		n.quiet.Store(true)
	}
	if n.closed.Swap(true) {
		return
	}
	if n.conn != nil {
		n.conn.Close()
	}
	if n.q.Dev != nil && n.q.Dev.fabric != nil {
		n.q.Dev.fabric.releaseConn(n.remote.gid, n.remote.qpn, n)
	}
	// Messages were arriving into these receives: they were consumed
	// (rq_ci advanced), so they complete, flushed, before the ones still
	// in the ring.
	for n.recvOpen > 0 {
		n.RecvDone(rc.RecvCompletion{ID: n.recvs[n.recvHead].wrID, Status: abi.WCWRFlushErr})
	}
}

// sendBuf is a posted WQE's local memory (rc.Buffer): its checked SGEs and
// their MRs, or its inline bytes.
type sendBuf struct {
	dev    *RNIC
	sge    []abi.SGE
	mr     []*MR
	inline []byte
}

// Gather copies the message's bytes [off, off+len(dst)) into dst.
func (b *sendBuf) Gather(off uint32, dst []byte) error {
	if len(b.inline) > 0 {
		if uint64(off)+uint64(len(dst)) > uint64(len(b.inline)) {
			return ErrOutOfRange
		}
		copy(dst, b.inline[off:])
		return nil
	}
	if len(b.mr) != len(b.sge) {
		return ErrOutOfRange
	}
	return walkSGEs(b.dev, b.sge, b.mr, off, dst, false)
}

// Scatter is not used for send buffers but for READ responses and atomic
// results, which land in the same SGEs.
func (b *sendBuf) Scatter(off uint32, src []byte) error {
	if len(b.mr) != len(b.sge) {
		return ErrOutOfRange
	}
	return walkSGEs(b.dev, b.sge, b.mr, off, src, true)
}

// recvBuf is the receive a SEND fills (rc.Buffer).
type recvBuf struct {
	dev  *RNIC
	wrID uint64
	sge  []abi.SGE
	mr   []*MR
	bad  bool // the WQE failed its checks: every Scatter fails
}

func (b *recvBuf) Gather(uint32, []byte) error { return ErrOutOfRange }

func (b *recvBuf) Scatter(off uint32, src []byte) error {
	if b.bad || len(b.mr) != len(b.sge) {
		return ErrOutOfRange
	}
	return walkSGEs(b.dev, b.sge, b.mr, off, src, true)
}

// sgeCopy carries one walkSGEs copy through MR.Range without a closure
// per call.
type sgeCopy struct {
	buf  []byte
	into bool // into guest memory
	fn   func([]byte) error
}

var sgeCopies = sync.Pool{New: func() any {
	c := &sgeCopy{}
	c.fn = c.step
	return c
}}

func (c *sgeCopy) step(view []byte) error {
	var k int
	if c.into {
		k = copy(view, c.buf)
	} else {
		k = copy(c.buf, view)
	}
	c.buf = c.buf[k:]
	return nil
}

// walkSGEs copies between buf and the bytes [off, off+len(buf)) of the
// message laid over sges (into: buf into guest memory). It acquires the
// device's table for the copy and contains faults.
func walkSGEs(d *RNIC, sges []abi.SGE, mrs []*MR, off uint32, buf []byte, into bool) (err error) {
	t := d.acquire()
	if t == nil {
		return ErrNoMemory
	}
	defer t.Release()
	defer containFault(&err)
	c := sgeCopies.Get().(*sgeCopy)
	defer sgeCopies.Put(c)
	c.buf, c.into = buf, into
	skip := uint64(off)
	for i := range sges {
		if len(c.buf) == 0 {
			break
		}
		s := &sges[i]
		l := uint64(s.Length)
		if skip >= l {
			skip -= l
			continue
		}
		k := min(l-skip, uint64(len(c.buf)))
		if err := mrs[i].rangeFor(t, s.Addr+skip, k, into, c.fn); err != nil {
			return err
		}
		skip = 0
	}
	left := len(c.buf)
	c.buf = nil
	if left > 0 {
		return ErrOutOfRange
	}
	return nil
}

// The Region of an incoming request (rc.Region) is the MR that Resolve
// checked: the transport calls it only inside the range it resolved.

// WriteAt copies src to the MR's bytes at va (an incoming WRITE).
func (m *MR) WriteAt(va uint64, src []byte) error { return m.copyAt(va, src, true) }

// ReadAt copies the MR's bytes at va into dst (a READ response).
func (m *MR) ReadAt(va uint64, dst []byte) error { return m.copyAt(va, dst, false) }

func (m *MR) copyAt(va uint64, buf []byte, into bool) (err error) {
	if m.dev == nil {
		return ErrNoMemory
	}
	t := m.dev.acquire()
	if t == nil {
		return ErrNoMemory
	}
	defer t.Release()
	defer containFault(&err)
	c := sgeCopies.Get().(*sgeCopy)
	defer sgeCopies.Put(c)
	c.buf, c.into = buf, into
	err = m.rangeFor(t, va, uint64(len(buf)), into, c.fn)
	c.buf = nil
	return err
}

// Atomic runs an incoming atomic on the 8 bytes at va and returns the value
// they held.
func (m *MR) Atomic(va uint64, op rc.AtomicOp, compare, swapAdd uint64) (orig uint64, err error) {
	if m.dev == nil {
		return 0, ErrNoMemory
	}
	t := m.dev.acquire()
	if t == nil {
		return 0, ErrNoMemory
	}
	defer t.Release()
	defer containFault(&err)
	var a atomicOp
	a.init()
	a.op, a.compareAdd, a.swap = abi.WROpAtomicFetchAdd, swapAdd, 0
	if op == rc.AtomicCmpSwp {
		a.op, a.compareAdd, a.swap = abi.WROpAtomicCmpSwp, compare, swapAdd
	}
	if err := m.RangeWrite(t, va, 8, a.fn); err != nil {
		return 0, err
	}
	if !a.done {
		return 0, errAtomicSplit
	}
	for i := 7; i >= 0; i-- {
		orig = orig<<8 | uint64(a.orig[i])
	}
	return orig, nil
}
