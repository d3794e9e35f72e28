package engine

import (
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The responder side of an RC message, as data: the requester validates
// its WQE and its local SGEs (run), then hands the responder a request —
// everything the message carries and where its payload comes from — and
// gets an outcome back. On the same host the responder places the payload
// straight from the requester's memory (no copy in between); a network
// transport would carry the same request in packets.

// outcome is what a send WQE came to for its requester: the completion
// status and the message length, or receiver-not-ready (rnr: the WQE stays
// at the head of the send queue for a retry; status and n are then unset).
type outcome struct {
	status abi.WCStatus
	n      uint64
	rnr    bool
}

// failed is the outcome of a WQE that completes in error.
func failed(st abi.WCStatus) outcome { return outcome{status: st} }

// succeeded is the outcome of a WQE that moved n bytes.
func succeeded(n uint64) outcome { return outcome{status: abi.WCSuccess, n: n} }

// request is one message of an RC QP on its way to the responder.
type request struct {
	q        *QP           // requester QP (its sqMu held)
	pq       *QP           // responder QP, q's destination
	t, pt    *memmap.Table // the requester's and the responder's device tables
	w        *sendWQE      // the validated WQE (a copy in sc)
	sc       *scratch      // q's scratch: receive WQE copy, SGE lists, mover
	lsge     []abi.SGE     // the local SGEs (none when inline)
	lmr      []*MR         // the MRs of lsge, checked
	total    uint64        // message length
	rnrRetry uint32        // q's rnr_retry
	sgid     [16]byte      // the GID q sends from
	now      int64         // monotonic ns of this pass
	// A UD datagram (ud.go): the destination GID and the Q_Key sent.
	ud   bool
	dgid [16]byte
	qkey uint32
}

// respond runs r on the responder QP under its rqMu. Remote errors move
// the responder QP to ERR with a QP_FATAL event (remoteErr).
//
// "A QP accepts requests only from the QP it is connected to" (docs/spec.md
// § Semantics): the responder must be connected back to the requester —
// its dest QPN is the requester's number, its dgid the GID the requester
// sends from, and that GID resolved to the requester's device. A request
// from any other QP, of this device or another tenant's, is answered as
// one to a QP that does not exist (RETRY_EXC_ERR, as a fabric's retries
// would end), touches nothing of the responder, and is counted on the
// responder's device (Stats.WrongPeer). The check is a few compares under
// the lock the state check takes anyway.
func (r *request) respond() outcome {
	if r.ud {
		return r.deliver()
	}
	pq := r.pq
	pq.rqMu.Lock()
	defer pq.rqMu.Unlock()
	if pq.Dev != nil && pq.Dev.fenced.Load() {
		return r.q.fenceHold(r.now) // fence.go: nothing of pq is touched
	}
	pq.mu.Lock()
	pst, pdead, pacc, minRNR := pq.attr.QPState, pq.dead, pq.attr.QPAccessFlags, pq.attr.MinRNRTimer
	// A QP connected over the network has no peer device (nil): no
	// requester of this host is ever its peer.
	ours := !pq.UD && pq.peer == r.q.Dev && pq.attr.DestQPNum == r.q.Num && pq.attr.DGID == r.sgid
	pq.mu.Unlock()
	if pdead || (pst != abi.QPSRTR && pst != abi.QPSRTS) {
		return failed(abi.WCRetryExcErr)
	}
	if !ours {
		if pq.Dev != nil {
			pq.Dev.wrongPeer.Add(1)
		}
		pq.counters().wrongPeer.Add(1)
		return failed(abi.WCRetryExcErr)
	}
	switch r.w.opcode {
	case abi.WROpSend, abi.WROpSendWithImm:
		rv, o := r.takeRecv(minRNR)
		if rv == nil {
			return o
		}
		return r.send(rv)
	case abi.WROpSendWithInv:
		return r.sendInv(minRNR)
	case abi.WROpRDMAWrite:
		return r.write(pacc, nil)
	case abi.WROpRDMAWriteWithImm:
		rv, o := r.takeRecv(minRNR)
		if rv == nil {
			return o
		}
		return r.write(pacc, rv)
	case abi.WROpRDMARead:
		return r.read(pacc)
	default: // atomics (memory operations never reach a responder: run)
		return r.atomic(pacc)
	}
}

// recvWQE is the responder's head receive WQE, copied and decoded, that a
// SEND or WRITE_WITH_IMM consumes.
type recvWQE struct {
	rec  []byte    // the responder QP's record on pt
	wrID uint64    // the receive's wr_id
	sge  []abi.SGE // its scatter list (in the scratch)
	mr   []*MR     // filled by send as it checks sge
}

// takeRecv takes the receive WQE the message consumes (QP.takeRecvWQE),
// copied into the scratch. Without one an RC requester gets
// receiver-not-ready (after asking the responder's driver for a
// notification) and a UD datagram is dropped; a receive queue the device
// cannot read or a WQE that does not decode is the responder's error. It
// returns nil and the requester's outcome when there is no receive to use.
// Precondition: pq.rqMu held.
func (r *request) takeRecv(minRNR uint32) (*recvWQE, outcome) {
	pq, pt, sc := r.pq, r.pt, r.sc
	rec, err := pt.Slice(pq.Record, QPRecordSize(pq.RQNotify))
	if err != nil {
		return nil, r.peerErr(abi.WCRemOpErr)
	}
	var waiter *QP
	if !r.ud {
		waiter = r.q // "no receiver-not-ready wait happens for UD"
	}
	wrID, nr, res := pq.takeRecvWQE(pt, rec, sc.rwqe[:], sc.rsge[:], waiter)
	switch res {
	case takeEmpty, takeStopped:
		if r.ud {
			pq.countUDDrop()
			return nil, succeeded(r.total)
		}
		pq.counters().rnrSent.Add(1)
		return nil, r.q.rnr(r.rnrRetry, minRNR, r.now)
	case takeBroken:
		return nil, r.peerErr(abi.WCRemOpErr)
	}
	rv := &sc.recv
	*rv = recvWQE{rec: rec, wrID: wrID, sge: sc.rsge[:nr], mr: sc.rmr[:nr]}
	if res == takeBad {
		r.recvDone(rv, abi.WCLocQPOpErr)
		return nil, r.peerErr(abi.WCRemOpErr)
	}
	return rv, outcome{}
}

// takeRecvWQE takes the receive WQE a message arriving at q consumes; the
// same-host responder (request.takeRecv, UD delivery included) and the
// network transport (netQP.TakeRecv) both take it here. With an SRQ it is
// the WQE stashed for q, else the SRQ's next one, consumed at once (the
// SRQ's ci); otherwise the head of q's own receive queue, which the caller
// consumes with consumeRQ when it completes it. The WQE is copied once
// into buf and decoded into sges (wr_id is filled even for takeBad). w,
// if not nil, is the requester whose message found nothing: it is kicked
// when the driver posts a receive. Precondition: q.rqMu held; rec is q's
// whole record on t, the table of q's device.
func (q *QP) takeRecvWQE(t *memmap.Table, rec, buf []byte, sges []abi.SGE, w *QP) (wrID uint64, n int, res takeResult) {
	if s := q.SRQ; s != nil {
		if st := q.srqStash; st != nil {
			q.srqStash = nil
			return st.wrID, copy(sges, st.sge), takeOK
		}
		return s.take(t, buf, sges, w)
	}
	pi := q.rqPISeen
	if pi-q.rqCI-1 >= q.RQ.Depth {
		// Not known to be ahead: read the driver's rq_pi (as sq_pi in
		// pollLocked, only when the receives last seen are used up).
		pi = abi.LoadUint32(rec, abi.QPRecordRQPI)
		q.rqPISeen = pi
	}
	if pi == q.rqCI {
		if w == nil {
			return 0, 0, takeEmpty
		}
		// Receiver not ready: ask the driver for a notification when it
		// posts a receive, then look once more.
		if pi = q.awaitRecv(t, rec, w); pi == q.rqCI {
			return 0, 0, takeEmpty
		}
	}
	if pi-q.rqCI > q.RQ.Depth {
		return 0, 0, takeBroken
	}
	slot, err := q.RQ.Slot(t, q.rqCI)
	if err != nil {
		return 0, 0, takeBroken
	}
	k := copy(buf, slot)
	wrID, n, ok := decodeRecv(buf[:k], min(q.MaxRecvSGE, maxRecvSGEs), sges)
	if !ok {
		q.counters().malformed.Add(1)
		return wrID, 0, takeBad
	}
	return wrID, n, takeOK
}

// consumeRQ consumes the head of q's own receive queue that takeRecvWQE
// took (an SRQ's WQE was consumed when taken): rq_ci advances, raised
// before the completion is pushed (ci.go). Precondition: q.rqMu held.
func (q *QP) consumeRQ() {
	if q.SRQ != nil {
		return
	}
	q.rqCI++
	q.ciDone[rqIdx].Store(q.rqCI)
}

// abandon gives back the receive WQE rv of a message the requester could
// not deliver (its own memory failed under the copy): a QP's own receive
// WQE stays at the head; one taken from an SRQ has left the SRQ, so it is
// stashed for the QP's next message (or its flush). Precondition:
// pq.rqMu held.
func (r *request) abandon(rv *recvWQE) {
	if r.pq.SRQ != nil {
		r.pq.srqStash = &stash{wrID: rv.wrID, sge: append([]abi.SGE(nil), rv.sge...)}
	}
}

// peerErr is an error the receiving side detected. RC: the responder QP
// moves to ERR with QP_FATAL and the requester completes with st. UD: the
// receiving QP moves to ERR and the sender learns nothing ("the send
// completes successfully once the datagram is delivered or dropped").
func (r *request) peerErr(st abi.WCStatus) outcome {
	if r.ud {
		r.pq.toErr(false)
		return succeeded(r.total)
	}
	return r.remoteErr(st)
}

// send places a SEND's payload into the receive WQE rv; a UD datagram's
// is preceded by its network header (sc.grh).
func (r *request) send(rv *recvWQE) outcome {
	peer, pq, sc := r.pq.Dev, r.pq, r.sc
	pd := pq.recvPD()
	var capacity uint64
	for i := range rv.sge {
		s := &rv.sge[i]
		mr := sc.keys.mr(peer, s.LKey)
		if mr == nil || mr.PD != pd || !mr.Local(r.pt, s.Addr, uint64(s.Length)) ||
			mr.Access&abi.AccessLocalWrite == 0 {
			r.recvDone(rv, abi.WCLocProtErr)
			return r.peerErr(abi.WCRemOpErr)
		}
		rv.mr[i] = mr
		capacity += uint64(s.Length)
	}
	need := r.total
	if r.ud {
		need += abi.GRHSize
	}
	if need > capacity {
		// "A message longer than the receive WQE's scatter list is
		// LOC_LEN_ERR at the responder and REM_INV_REQ_ERR at the
		// requester." UD: "A receive WQE too small for 40 + payload
		// completes with LOC_LEN_ERR and moves the receiving QP to ERR."
		r.recvDone(rv, abi.WCLocLenErr)
		return r.peerErr(abi.WCRemInvReqErr)
	}
	sc.mv.start(r.pt, rv.sge, rv.mr)
	err := error(nil)
	if r.ud {
		err = sc.mv.srcFn(sc.grh[:])
	}
	if err == nil {
		err = r.q.gather(r.t, r.w, sc, r.lsge, r.lmr)
	}
	if err != nil {
		if sc.mv.dstFailed {
			r.recvDone(rv, abi.WCLocProtErr)
			return r.peerErr(abi.WCRemOpErr)
		}
		r.abandon(rv)
		return failed(abi.WCLocProtErr)
	}
	r.recvDone(rv, abi.WCSuccess)
	return succeeded(r.total)
}

// sendInv answers a SEND_WITH_INV: "the responder, before it places any
// data, frees the type 2 MW bound to the responder QP or the registered
// fast-registration MR of the responder QP's PD named by imm_data ... A
// SEND_WITH_INV naming anything else is an invalid request:
// REM_INV_REQ_ERR at the requester, the responder's receive WQE is not
// consumed and its QP moves to ERR". The key is checked before a receive
// WQE is taken (an RNR wait invalidates nothing) and freed once it is;
// a WQE taken from an SRQ for a key that changed meanwhile is stashed
// for the QP (abandon), as for any message that does not arrive.
// Precondition: pq.rqMu held.
func (r *request) sendInv(minRNR uint32) outcome {
	pq, key := r.pq, r.w.imm
	if !pq.Dev.invalidate(key, pq, true, false) {
		return r.remoteErr(abi.WCRemInvReqErr)
	}
	rv, o := r.takeRecv(minRNR)
	if rv == nil {
		return o
	}
	if !pq.Dev.invalidate(key, pq, true, true) {
		r.abandon(rv)
		return r.remoteErr(abi.WCRemInvReqErr)
	}
	return r.send(rv)
}

// write places an RDMA WRITE's payload at the remote address; with an
// immediate (rv not nil) it then consumes the receive WQE rv, which it
// gives back (abandon) if the WRITE fails.
func (r *request) write(qpAccess uint32, rv *recvWQE) outcome {
	w, sc := r.w, r.sc
	// A zero-length WRITE names no memory: the responder checks neither
	// R_Key nor address (InfiniBand, as rxe does; UCX flushes with one),
	// only that the QP takes remote writes.
	if r.total == 0 {
		if qpAccess&abi.AccessRemoteWrite == 0 {
			if rv != nil {
				r.abandon(rv)
			}
			return r.remoteErr(abi.WCRemAccessErr)
		}
		if rv != nil {
			r.recvDone(rv, abi.WCSuccess)
		}
		return succeeded(0)
	}
	mr := remoteMR(sc, r.pq, qpAccess, w.rkey, w.remoteAddr, r.total, abi.AccessRemoteWrite)
	if mr == nil {
		if rv != nil {
			r.abandon(rv)
		}
		return r.remoteErr(abi.WCRemAccessErr)
	}
	sc.one[0] = abi.SGE{Addr: w.remoteAddr, Length: uint32(r.total), LKey: w.rkey}
	sc.oneM[0] = mr
	sc.mv.start(r.pt, sc.one[:], sc.oneM[:])
	if err := r.q.gather(r.t, w, sc, r.lsge, r.lmr); err != nil {
		if rv != nil {
			r.abandon(rv)
		}
		if sc.mv.dstFailed {
			return r.remoteErr(abi.WCRemAccessErr)
		}
		return failed(abi.WCLocProtErr)
	}
	if rv != nil {
		r.recvDone(rv, abi.WCSuccess)
	}
	return succeeded(r.total)
}

// read copies the remote range into the local SGEs.
func (r *request) read(qpAccess uint32) outcome {
	w, sc := r.w, r.sc
	// As write: a zero-length READ names no memory.
	if r.total == 0 {
		if qpAccess&abi.AccessRemoteRead == 0 {
			return r.remoteErr(abi.WCRemAccessErr)
		}
		return succeeded(0)
	}
	mr := remoteMR(sc, r.pq, qpAccess, w.rkey, w.remoteAddr, r.total, abi.AccessRemoteRead)
	if mr == nil {
		return r.remoteErr(abi.WCRemAccessErr)
	}
	sc.mv.start(r.t, r.lsge, r.lmr)
	if err := mr.Range(r.pt, w.remoteAddr, r.total, sc.mv.srcFn); err != nil {
		if sc.mv.dstFailed {
			return failed(abi.WCLocProtErr)
		}
		return r.remoteErr(abi.WCRemAccessErr)
	}
	return succeeded(r.total)
}

// atomic executes a CMP_AND_SWP or FETCH_AND_ADD on the remote 8 bytes and
// writes the original value into the local SGE.
func (r *request) atomic(qpAccess uint32) outcome {
	w, sc := r.w, r.sc
	if w.remoteAddr%8 != 0 {
		return r.remoteErr(abi.WCRemInvReqErr)
	}
	mr := remoteMR(sc, r.pq, qpAccess, w.rkey, w.remoteAddr, 8, abi.AccessRemoteAtomic)
	if mr == nil {
		return r.remoteErr(abi.WCRemAccessErr)
	}
	a := &sc.atom
	a.op, a.compareAdd, a.swap, a.done = w.opcode, w.compareAdd, w.swap, false
	if err := mr.RangeWrite(r.pt, w.remoteAddr, 8, a.fn); err != nil || !a.done {
		return failed(abi.WCRemOpErr)
	}
	sc.mv.start(r.t, r.lsge, r.lmr)
	if err := sc.mv.srcFn(a.orig[:]); err != nil {
		return failed(abi.WCLocProtErr)
	}
	return succeeded(8)
}

// remoteErr is an error the responder detected: the responder QP moves to
// ERR with a QP_FATAL event, and the requester completes with st.
func (r *request) remoteErr(st abi.WCStatus) outcome {
	if int(st) < maxWCStatus {
		r.pq.counters().responder[st].Add(1)
	}
	r.pq.toErr(true)
	return failed(st)
}

// recvDone consumes the responder's receive WQE rv (consumeRQ) and
// completes it on the responder's receive CQ with status st (and, on
// success, the message length and immediate; a UD datagram's with its
// network header and the GRH flag). Precondition: pq.rqMu held.
func (r *request) recvDone(rv *recvWQE, st abi.WCStatus) {
	pq, w := r.pq, r.w
	pq.consumeRQ() // rq_ci stored before the CQE is visible (ci.go)
	e := abi.CQE{WRID: rv.wrID, Status: st, Opcode: abi.WCOpRecv, QPNum: pq.Num, SrcQP: r.q.srcQPN()}
	if st == abi.WCSuccess {
		e.ByteLen = uint32(r.total)
		if r.ud {
			e.ByteLen += abi.GRHSize
			e.WCFlags = abi.WCFlagGRH
		}
		switch w.opcode {
		case abi.WROpSendWithImm:
			e.WCFlags, e.ImmData = e.WCFlags|abi.WCFlagWithImm, w.imm
		case abi.WROpSendWithInv:
			// "the receive completes with WITH_INV and that key in
			// imm_data" (a number).
			e.WCFlags, e.ImmData = e.WCFlags|abi.WCFlagWithInv, w.imm
		case abi.WROpRDMAWriteWithImm:
			e.Opcode, e.WCFlags, e.ImmData = abi.WCOpRecvRDMAWithImm, abi.WCFlagWithImm, w.imm
		}
	}
	// Lazily, as the requester's own completions: its pass publishes
	// (publishPeer).
	pq.Dev.completeLazy(pq.RecvCQ, r.pt, &e, w.flags&abi.WRFlagSolicited != 0, pq)
	if old := r.q.peerPend; old != nil && old != pq {
		publishPeer(r.t, old) // one pending peer at a time
	}
	r.q.peerPend = pq
}

// publishPeer publishes what the requester's messages completed lazily on
// the same-host responder QP pq: its rq_ci (also when the CQE was lost to
// a CQ in overrun), then its receive CQ's pi, and the CQ_COMPLETION event
// if that fired the CQ. A fault in pq's memory is pq's error, as under
// respond (fault.go). t is the requester's table. Precondition: the
// requester's sqMu held.
func publishPeer(t *memmap.Table, pq *QP) {
	pt := pq.Dev.acquire()
	if pt == nil {
		return
	}
	defer pt.Release()
	defer func() {
		if v := recover(); v != nil {
			peerFault(v, t, pt, pq)
		}
	}()
	pq.storeCIOn(pt)
	if pq.RecvCQ != nil {
		pq.RecvCQ.publishNotify(pt)
	}
}
