package rc

import (
	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// msgKind is the multi-packet message a responder is in the middle of.
type msgKind uint8

const (
	msgNone msgKind = iota
	msgSend
	msgWrite
)

// respJob is a queued response: a READ's response packets or an atomic's
// ACK. Responses leave in PSN order, and an ACK never overtakes them.
type respJob struct {
	atomic bool
	region Region   // READ
	rkey   uint32   // READ: the R_Key region was resolved with (ConnState)
	va     uint64   // READ: next address
	left   uint32   // READ: bytes left
	first  bool     // READ: next packet is the first
	psn    roce.PSN // next PSN
	msn    uint32
	orig   uint64 // atomic
}

// jobRing is a bounded FIFO of responses.
type jobRing struct {
	buf     []respJob
	head, n int
}

func (r *jobRing) full() bool      { return r.n == len(r.buf) }
func (r *jobRing) front() *respJob { return &r.buf[r.head] }
func (r *jobRing) push(j respJob)  { r.buf[(r.head+r.n)%len(r.buf)] = j; r.n++ }
func (r *jobRing) pop()            { r.buf[r.head] = respJob{}; r.head = (r.head + 1) % len(r.buf); r.n-- }
func (r *jobRing) clear()          { clear(r.buf); r.head, r.n = 0, 0 }

// replayEntry is an executed READ or atomic, kept to answer a
// retransmitted request: an atomic without executing it again (IBA
// C9-150), a READ (or its tail) only if it is one of the last
// MaxDestRdAtomic READs, so a duplicate asks for nothing the peer was not
// granted before and a flood of made-up duplicates draws no answer.
type replayEntry struct {
	valid bool
	read  bool
	psn   roce.PSN
	orig  uint64 // atomic
	va    uint64 // READ
	rkey  uint32
	len   uint32
}

// pendingAck is the coalesced ACK or NAK the responder owes.
type pendingAck struct {
	valid bool
	nak   bool // a NAK (sequence or RNR): a later plain ACK does not replace it
	syn   roce.Syndrome
	psn   roce.PSN
	msn   uint32
}

// responder is the receive side's state; all of it is protected by QP.mu.
type responder struct {
	fatal   bool     // the QP failed on a request it refused (nakFatal)
	epsn    roce.PSN // expected PSN
	msn     uint32   // messages completed, 24 bits
	nakSent bool     // a sequence or RNR NAK for epsn was sent
	oosHigh roce.PSN // the highest PSN beyond epsn since then
	in      msgKind

	wRegion Region // WRITE in progress
	wRKey   uint32 // its R_Key (ConnState)
	wVA     uint64
	wLeft   uint32
	wTotal  uint32

	recv    Recv // SEND in progress
	recvOff uint32

	ack    pendingAck
	jobs   jobRing
	replay []replayEntry
	rNext  int
}

func (r *responder) init(c *Config) {
	r.epsn = c.RQPSN
	r.jobs.buf = make([]respJob, c.MaxDestRdAtomic)
	r.replay = make([]replayEntry, c.MaxDestRdAtomic)
}

func (r *responder) reset() {
	r.jobs.clear()
	r.ack = pendingAck{}
	r.in = msgNone
	r.wRegion, r.recv = nil, Recv{}
}

// npkts returns the packets of a message of n bytes (at least one).
func npkts(n uint32, pmtu roce.MTU) uint32 {
	if n == 0 {
		return 1
	}
	return (n + uint32(pmtu) - 1) / uint32(pmtu)
}

func opClass(op roce.Opcode) msgKind {
	switch {
	case op <= roce.OpSendOnlyWithImmediate, op == roce.OpSendLastWithInvalidate, op == roce.OpSendOnlyWithInvalidate:
		return msgSend
	case op <= roce.OpWriteOnlyWithImmediate:
		return msgWrite
	}
	return msgNone
}

// setAck records an ACK or NAK to send, coalescing with the one pending.
func (r *responder) setAck(a pendingAck) {
	a.valid = true
	if r.ack.valid && r.ack.nak && !a.nak && a.psn.Before(r.ack.psn) {
		return
	}
	r.ack = a
}

// respond handles a request packet (the responder, IBA 9.7.5.1).
func (q *QP) respond(p *roce.Packet) {
	r := &q.resp
	switch d := p.BTH.PSN.Diff(r.epsn); {
	case d < 0:
		q.duplicate(p)
		return
	case d > 0:
		// One NAK per gap, and one more each time the requester starts
		// over (a PSN below the highest seen since the NAK: its resent
		// packet at epsn was lost too, and without this only the
		// retransmit timer would recover).
		q.ctr.outOfSeq.Add(1)
		if !r.nakSent || p.BTH.PSN.Before(r.oosHigh) {
			r.nakSent = true
			q.ctr.seqNAKsSent.Add(1)
			r.setAck(pendingAck{nak: true, syn: roce.NAKSyndrome(roce.NAKPSNSequenceError), psn: r.epsn, msn: r.msn})
			r.oosHigh = p.BTH.PSN
		}
		if p.BTH.PSN.After(r.oosHigh) {
			r.oosHigh = p.BTH.PSN
		}
		return
	}
	op := p.BTH.Opcode
	seg := op.Segment()
	cls := opClass(op)
	starts := seg == roce.SegmentFirst || seg == roce.SegmentOnly
	if (r.in == msgNone) != starts || (r.in != msgNone && r.in != cls) {
		q.nakFatal(p, roce.NAKInvalidRequest)
		return
	}
	switch cls {
	case msgSend:
		if !q.recvSend(p, seg, starts) {
			return
		}
	case msgWrite:
		if !q.recvWrite(p, seg, starts) {
			return
		}
	default:
		if op == roce.OpReadRequest {
			q.recvRead(p)
		} else {
			q.recvAtomic(p)
		}
		return
	}
	r.nakSent = false
	r.epsn = r.epsn.Add(1)
	q.ctr.rxRequests.Add(1)
	if seg == roce.SegmentLast || seg == roce.SegmentOnly {
		r.msn = (r.msn + 1) & roce.MSNMask
		r.in = msgNone
	}
	if p.BTH.AckReq {
		r.setAck(pendingAck{syn: roce.ACKSyndrome(31), psn: p.BTH.PSN, msn: r.msn})
	}
}

// rnr answers a request that needs a receive when none is posted.
func (q *QP) rnr(p *roce.Packet) {
	r := &q.resp
	q.ctr.rnrNAKsSent.Add(1)
	r.nakSent = true
	r.oosHigh = p.BTH.PSN
	r.setAck(pendingAck{nak: true, syn: roce.RNRNAKSyndrome(q.cfg.MinRNRTimer), psn: p.BTH.PSN, msn: r.msn})
}

// recvSend places a SEND packet; false when it was refused (NAKed).
//
// A SEND with invalidate names its key in the IETH of its last packet, so
// the responder checks and invalidates it when that packet arrives, before
// placing that packet's payload (docs/spec.md, the network's form of "before
// it places any data"). A one-packet message is checked before a receive
// is taken, as on one host. A key that names nothing this QP may
// invalidate is an invalid request: the receive is left to the flush of
// the QP's error state (WR_FLUSH_ERR), whatever earlier packets of the
// message placed in it.
func (q *QP) recvSend(p *roce.Packet, seg roce.Segment, starts bool) bool {
	r := &q.resp
	inv := p.BTH.Opcode.Ext()&roce.ExtIETH != 0
	if starts {
		if inv && !q.host.Invalidate(p.IETH, false) {
			q.nakFatal(p, roce.NAKInvalidRequest)
			return false
		}
		rv, ok := q.host.TakeRecv()
		if !ok {
			q.rnr(p)
			return false
		}
		r.recv, r.recvOff, r.in = rv, 0, msgSend
	}
	n := uint32(len(p.Payload))
	if uint64(r.recvOff)+uint64(n) > uint64(r.recv.Len) {
		q.host.RecvDone(RecvCompletion{ID: r.recv.ID, Status: abi.WCLocLenErr})
		q.nakFatal(p, roce.NAKInvalidRequest)
		return false
	}
	if inv && !q.host.Invalidate(p.IETH, true) {
		q.nakFatal(p, roce.NAKInvalidRequest)
		return false
	}
	if n > 0 {
		if err := r.recv.Buf.Scatter(r.recvOff, p.Payload); err != nil {
			q.host.RecvDone(RecvCompletion{ID: r.recv.ID, Status: abi.WCLocProtErr})
			q.nakFatal(p, roce.NAKRemoteOperationalError)
			return false
		}
	}
	r.recvOff += n
	if seg == roce.SegmentLast || seg == roce.SegmentOnly {
		imm := p.BTH.Opcode == roce.OpSendLastWithImmediate || p.BTH.Opcode == roce.OpSendOnlyWithImmediate
		q.host.RecvDone(RecvCompletion{ID: r.recv.ID, Status: abi.WCSuccess, ByteLen: r.recvOff, Imm: p.ImmDt, WithImm: imm,
			Solicited: p.BTH.SE, WithInv: inv, InvRKey: p.IETH})
		r.recv = Recv{}
	}
	return true
}

// recvWrite places an RDMA WRITE packet; false when it was refused.
func (q *QP) recvWrite(p *roce.Packet, seg roce.Segment, starts bool) bool {
	r := &q.resp
	op := p.BTH.Opcode
	withImm := op == roce.OpWriteOnlyWithImmediate || op == roce.OpWriteLastWithImmediate
	n := uint32(len(p.Payload))
	if starts {
		l := p.RETH.DMALen
		if (seg == roce.SegmentOnly && n != l) || (seg == roce.SegmentFirst && n >= l) || l > abi.MaxMsgSize {
			q.nakFatal(p, roce.NAKInvalidRequest)
			return false
		}
		reg, ok := q.host.Resolve(p.RETH.RKey, p.RETH.VA, l, AccessRemoteWrite)
		if !ok {
			q.nakFatal(p, roce.NAKRemoteAccessError)
			return false
		}
		r.wRegion, r.wRKey, r.wVA, r.wLeft, r.wTotal = reg, p.RETH.RKey, p.RETH.VA, l, l
	}
	last := seg == roce.SegmentLast || seg == roce.SegmentOnly
	if n > r.wLeft || (last && n != r.wLeft) {
		q.nakFatal(p, roce.NAKInvalidRequest)
		return false
	}
	var rv Recv
	if withImm {
		// The receive is taken before anything is placed, so that an
		// RNR NAK leaves the packet to be sent again whole.
		var ok bool
		if rv, ok = q.host.TakeRecv(); !ok {
			q.rnr(p)
			return false
		}
	}
	r.in = msgWrite
	if n > 0 {
		if err := r.wRegion.WriteAt(r.wVA, p.Payload); err != nil {
			// The range was checked (Resolve): the memory failed.
			q.nakFatal(p, roce.NAKRemoteOperationalError)
			return false
		}
	}
	r.wVA += uint64(n)
	r.wLeft -= n
	if last {
		if withImm {
			q.host.RecvDone(RecvCompletion{ID: rv.ID, Status: abi.WCSuccess, ByteLen: r.wTotal, Imm: p.ImmDt, WithImm: true, Write: true, Solicited: p.BTH.SE})
		}
		r.wRegion = nil
	}
	return true
}

// recvRead queues the responses of an in-sequence READ request.
func (q *QP) recvRead(p *roce.Packet) {
	r := &q.resp
	l := p.RETH.DMALen
	if l > abi.MaxMsgSize || r.jobs.full() {
		q.nakFatal(p, roce.NAKInvalidRequest)
		return
	}
	reg, ok := q.host.Resolve(p.RETH.RKey, p.RETH.VA, l, AccessRemoteRead)
	if !ok {
		q.nakFatal(p, roce.NAKRemoteAccessError)
		return
	}
	r.remember(replayEntry{read: true, psn: p.BTH.PSN, va: p.RETH.VA, rkey: p.RETH.RKey, len: l})
	r.nakSent = false
	r.epsn = r.epsn.Add(npkts(l, q.cfg.PMTU))
	r.msn = (r.msn + 1) & roce.MSNMask
	q.ctr.rxRequests.Add(1)
	q.pushJob(respJob{region: reg, rkey: p.RETH.RKey, va: p.RETH.VA, left: l, first: true, psn: p.BTH.PSN, msn: r.msn})
}

func (r *responder) remember(e replayEntry) {
	e.valid = true
	r.replay[r.rNext] = e
	r.rNext = (r.rNext + 1) % len(r.replay)
}

// findRead returns the remembered READ whose response holds PSN psn at
// address va for length bytes (the tail a requester asks for again).
func (r *responder) findRead(psn roce.PSN, va uint64, rkey, length uint32, pmtu roce.MTU) bool {
	for i := range r.replay {
		e := &r.replay[i]
		if !e.valid || !e.read || e.rkey != rkey {
			continue
		}
		d := psn.Diff(e.psn)
		if d < 0 || uint32(d) >= npkts(e.len, pmtu) {
			continue
		}
		off := uint64(d) * uint64(pmtu)
		if va == e.va+off && uint64(length)+off == uint64(e.len) {
			return true
		}
	}
	return false
}

// truncate drops the queued responses whose first PSN is at or after psn
// (within the half window before epsn).
func (r *responder) truncate(psn roce.PSN) {
	for r.jobs.n > 0 {
		last := &r.jobs.buf[(r.jobs.head+r.jobs.n-1)%len(r.jobs.buf)]
		if last.psn.Before(psn) {
			return
		}
		*last = respJob{}
		r.jobs.n--
	}
}

// recvAtomic executes an in-sequence atomic once and queues its ACK.
func (q *QP) recvAtomic(p *roce.Packet) {
	r := &q.resp
	a := &p.AtomicETH
	if a.VA%8 != 0 || r.jobs.full() {
		q.nakFatal(p, roce.NAKInvalidRequest)
		return
	}
	reg, ok := q.host.Resolve(a.RKey, a.VA, 8, AccessRemoteAtomic)
	if !ok {
		q.nakFatal(p, roce.NAKRemoteAccessError)
		return
	}
	op := AtomicFetchAdd
	if p.BTH.Opcode == roce.OpCompareSwap {
		op = AtomicCmpSwp
	}
	orig, err := reg.Atomic(a.VA, op, a.Compare, a.SwapAdd)
	if err != nil {
		q.nakFatal(p, roce.NAKRemoteOperationalError)
		return
	}
	r.remember(replayEntry{psn: p.BTH.PSN, orig: orig})
	r.nakSent = false
	r.epsn = r.epsn.Add(1)
	r.msn = (r.msn + 1) & roce.MSNMask
	q.ctr.rxRequests.Add(1)
	q.pushJob(respJob{atomic: true, psn: p.BTH.PSN, msn: r.msn, orig: orig})
}

// duplicate answers a request before the expected PSN (IBA 9.7.5.1.2):
// SEND and WRITE are acknowledged again, a READ is executed again from its
// own RETH, an atomic answered from the replay cache (never executed
// twice). What cannot be answered is dropped.
func (q *QP) duplicate(p *roce.Packet) {
	r := &q.resp
	switch op := p.BTH.Opcode; {
	case opClass(op) != msgNone:
		q.ctr.duplicates.Add(1)
		r.setAck(pendingAck{syn: roce.ACKSyndrome(31), psn: r.epsn.Add(uint32(roce.PSNMask)), msn: r.msn})
	case op == roce.OpReadRequest:
		l := p.RETH.DMALen
		if !r.findRead(p.BTH.PSN, p.RETH.VA, p.RETH.RKey, l, q.cfg.PMTU) {
			q.ctr.dropStale.Add(1)
			return
		}
		// The requester went back to p.PSN (go-back-N) and sends every
		// later request again: the responses queued from p.PSN on are
		// dropped rather than sent twice.
		r.truncate(p.BTH.PSN)
		if r.jobs.full() {
			q.ctr.dropStale.Add(1)
			return
		}
		reg, ok := q.host.Resolve(p.RETH.RKey, p.RETH.VA, l, AccessRemoteRead)
		if !ok {
			q.ctr.dropInvalid.Add(1)
			return
		}
		q.ctr.duplicates.Add(1)
		q.pushJob(respJob{region: reg, rkey: p.RETH.RKey, va: p.RETH.VA, left: l, first: true, psn: p.BTH.PSN, msn: r.msn})
	default: // atomics
		for i := range r.replay {
			e := &r.replay[i]
			if e.valid && !e.read && e.psn == p.BTH.PSN {
				r.truncate(p.BTH.PSN)
				if r.jobs.full() {
					break
				}
				q.ctr.duplicates.Add(1)
				q.pushJob(respJob{atomic: true, psn: e.psn, msn: r.msn, orig: e.orig})
				return
			}
		}
		q.ctr.dropStale.Add(1)
	}
}

// nakFatal NAKs p with code and puts the QP in the error state (the
// responder's class B-D errors, IBA 9.9.3): the peer's requester reports
// the remote error; locally the outstanding work is flushed.
func (q *QP) nakFatal(p *roce.Packet, code roce.NAKCode) {
	q.ctr.naksSent.Add(1)
	q.resp.jobs.clear()
	q.resp.ack = pendingAck{}
	a := roce.Packet{BTH: q.bth(roce.OpAcknowledge, p.BTH.PSN)}
	a.AETH = roce.AETH{Syndrome: roce.NAKSyndrome(code), MSN: q.resp.msn}
	q.emit(&a)
	q.port.Flush()
	q.resp.fatal = true
	q.fail(abi.WCWRFlushErr)
}

// pushJob queues a response; a pending ACK, which is earlier, leaves
// first. Precondition: !jobs.full().
func (q *QP) pushJob(j respJob) {
	r := &q.resp
	if r.jobs.n == 0 && r.ack.valid {
		q.sendPendingAck()
	}
	r.jobs.push(j)
}

// sendPendingAck sends the coalesced ACK or NAK, if any.
func (q *QP) sendPendingAck() {
	r := &q.resp
	if !r.ack.valid {
		return
	}
	a := roce.Packet{BTH: q.bth(roce.OpAcknowledge, r.ack.psn)}
	a.AETH = roce.AETH{Syndrome: r.ack.syn, MSN: r.ack.msn}
	r.ack = pendingAck{}
	q.emit(&a)
}

// pump sends up to budget response packets; it returns how many it sent.
// The pending ACK follows once every queued response has left.
func (r *responder) pump(q *QP, budget int) int {
	sent := 0
	for sent < budget && r.jobs.n > 0 {
		j := r.jobs.front()
		if j.atomic {
			a := roce.Packet{BTH: q.bth(roce.OpAtomicAcknowledge, j.psn)}
			a.AETH = roce.AETH{Syndrome: roce.ACKSyndrome(31), MSN: j.msn}
			a.AtomicAckETH.OrigData = j.orig
			q.emit(&a)
			r.jobs.pop()
			sent++
			continue
		}
		n := min(j.left, uint32(q.cfg.PMTU))
		var op roce.Opcode
		switch {
		case j.first && j.left <= uint32(q.cfg.PMTU):
			op = roce.OpReadResponseOnly
		case j.first:
			op = roce.OpReadResponseFirst
		case j.left <= uint32(q.cfg.PMTU):
			op = roce.OpReadResponseLast
		default:
			op = roce.OpReadResponseMiddle
		}
		a := roce.Packet{BTH: q.bth(op, j.psn)}
		a.AETH = roce.AETH{Syndrome: roce.ACKSyndrome(31), MSN: j.msn}
		payload := q.payloadRoom(&a, n)
		if n > 0 {
			if err := j.region.ReadAt(j.va, payload); err != nil {
				q.dropPayload()
				p := roce.Packet{BTH: q.bth(roce.OpReadRequest, j.psn)}
				q.nakFatal(&p, roce.NAKRemoteOperationalError)
				return sent
			}
		}
		q.emitPayload(&a, payload)
		sent++
		j.first = false
		j.va += uint64(n)
		j.left -= n
		j.psn = j.psn.Add(1)
		if j.left == 0 {
			r.jobs.pop()
		}
	}
	if sent > 0 && r.jobs.n == 0 {
		// The ACK held back behind the responses; otherwise it waits
		// for Flush, which coalesces it with later ones.
		q.sendPendingAck()
	}
	return sent
}
