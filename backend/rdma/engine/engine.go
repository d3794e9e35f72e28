package engine

import (
	"encoding/binary"
	"time"

	"github.com/vrdma/vrdma/memmap"
	abi "github.com/vrdma/vrdma/virtio/rdma"
)

// pollBudget bounds the WQEs one Poll executes or flushes per QP, so that
// one QP cannot starve the others of its doorbell queue.
const pollBudget = 64

// A pass publishes (QP.publish) at its end and also after every
// publishEvery WQEs or publishBytes of payload since the last publication:
// small messages share one store of sq_ci and pi, while a driver never
// waits a whole pass of large ones for its first completion (on an
// oversubscribed machine the pass may lose its processor midway).
const (
	publishEvery = 16
	publishBytes = 16 << 10
)

// rnrPending is run's result when the responder had no receive WQE and the
// head WQE waits for an RNR retry. It is no wc status.
const rnrPending = 0xff

// epoch anchors the engine's monotonic clock.
var epoch = time.Now()

// monoNow returns monotonic nanoseconds since epoch.
func monoNow() int64 { return int64(time.Since(epoch)) }

// Poll runs the requester side of every QP of doorbell queue dbq that has
// posted send work, and the flush of every QP of dbq in ERR (both queues),
// once and bounded: at most pollBudget WQEs per QP. It reports whether it
// did anything (the caller keeps polling) and the earliest RNR retry
// deadline of a QP waiting for one (the zero time if none).
//
// Precondition: t is the device's current table, acquired by the caller,
// who runs Poll under memmap.Guard. Poll never panics on guest input.
func (d *Device) Poll(dbq int, t *memmap.Table) (worked bool, nextRetry time.Time) {
	now := monoNow()
	var next int64
	for _, q := range d.queueQPs(dbq) {
		w, r := q.poll(t, now)
		worked = worked || w
		if r != 0 && (next == 0 || r < next) {
			next = r
		}
	}
	if next != 0 {
		nextRetry = epoch.Add(time.Duration(next))
	}
	return worked, nextRetry
}

// poll is Poll for one QP.
func (q *QP) poll(t *memmap.Table, now int64) (worked bool, retry int64) {
	q.sqMu.Lock()
	defer q.sqMu.Unlock()
	if t == nil {
		return false, 0
	}
	rec, err := t.Slice(q.Record, QPRecordSize(q.RQNotify))
	if err != nil {
		// The record left guest memory: nothing can be read or flushed.
		q.toErr(true)
		return false, 0
	}
	worked, retry = q.pollLocked(t, rec, now)
	q.publish(t, rec)
	return worked, retry
}

// publish makes a poll pass's work visible at once: the record's sq_ci,
// the send CQ's pi (completions were pushed lazily) and the device's
// counters. One store each per pass instead of per WQE keeps the cache
// lines the driver polls from bouncing between its core and the engine's.
// Precondition: sqMu held; rec is the QP's record on t.
func (q *QP) publish(t *memmap.Table, rec []byte) {
	if q.sqCI != q.sqCIPub {
		memmap.StoreUint32(rec, abi.QPRecordSQCI, q.sqCI)
		q.sqCIPub = q.sqCI
	}
	if q.cqPending {
		q.cqPending = false
		if q.SendCQ.publish(t) && q.SendCQ.Dev != nil {
			q.SendCQ.Dev.postEvent(abi.EventCQCompletion, q.SendCQ.Num)
		}
	}
	if q.bytesPend != 0 {
		q.Dev.bytesMoved.Add(q.bytesPend)
		q.bytesPend = 0
	}
	for i, n := range q.opsPend {
		if n != 0 {
			q.Dev.ops[i].Add(uint64(n))
			q.opsPend[i] = 0
		}
	}
}

// pollLocked is poll's loop. Precondition: sqMu held; rec is the QP's
// record on t.
func (q *QP) pollLocked(t *memmap.Table, rec []byte, now int64) (worked bool, retry int64) {
	q.kickWaiter(rec)
	for budget := pollBudget; budget > 0; {
		q.mu.Lock()
		st, dead, lost, lostEnd, haveEnd := q.attr.QPState, q.dead, q.lostPeer, q.lostEnd, q.lostHaveEnd
		q.lostPeer = false
		q.mu.Unlock()
		if dead {
			return worked, 0
		}
		switch st {
		case abi.QPSRTS:
			pi := memmap.LoadUint32(rec, abi.QPRecordSQPI)
			if pi == q.sqCI {
				return worked, 0
			}
			if pi-q.sqCI > q.SQ.Depth {
				// "A producer index more than the depth ahead of the
				// consumer index is a QP error".
				q.toErr(true)
				worked = true
				continue
			}
			if q.rnrWait != 0 && now < q.rnrWait && !q.rnrKick.Swap(false) {
				return worked, q.rnrWait
			}
			q.step(t, rec, now)
			worked = true
			budget--
			if q.sqCI-q.sqCIPub >= publishEvery || q.bytesPend >= publishBytes {
				// Keep the driver's reaping overlapped with the pass.
				q.publish(t, rec)
			}
		case abi.QPSErr:
			if lost {
				q.retryExc = true
				q.retryEnd = lostEnd
				if !haveEnd {
					q.retryEnd = memmap.LoadUint32(rec, abi.QPRecordSQPI)
				}
			}
			n := q.flush(t, rec, budget)
			return worked || n > 0, 0
		default:
			// RESET, INIT, RTR: send WQEs wait for RTS.
			return worked, 0
		}
	}
	return worked, 0
}

// scratchBuf returns the QP's scratch, allocating it on first use.
// Precondition: sqMu held.
func (q *QP) scratchBuf() *scratch {
	if q.sc == nil {
		q.sc = newScratch()
	}
	return q.sc
}

// step executes the head send WQE (sqCI) of a QP in RTS: it reads the WQE
// once into the scratch, validates the copy, runs it, completes it and
// advances sq_ci, unless the responder was not ready (RNR), in which case
// the WQE stays at the head, held in the scratch.
// Precondition: sqMu held; rec is the QP's record on t.
func (q *QP) step(t *memmap.Table, rec []byte, now int64) {
	sc := q.scratchBuf()
	ok := true
	if !sc.held {
		slot, err := q.SQ.Slot(t, q.sqCI)
		if err != nil {
			q.toErr(true) // the ring left guest memory
			return
		}
		n := copy(sc.wqe[:], slot)
		sc.w, ok = decodeSend(sc.wqe[:n], min(q.MaxSendSGE, maxSendSGEs), q.MaxInline, sc.lsge[:])
	}
	w := &sc.w
	status, total := uint8(abi.WCLocQPOpErr), uint64(0)
	if ok {
		status, total = q.run(t, w, sc, now)
		if status == rnrPending {
			sc.held = true
			return
		}
	}
	sc.held = false
	q.rnrTries, q.rnrWait = 0, 0
	q.rnrKick.Store(false)
	d := q.Dev
	byteLen := uint32(0)
	if status == abi.WCSuccess {
		q.opsPend[w.opcode%uint8(len(q.opsPend))]++
		q.bytesPend += total
		byteLen = uint32(total)
	} else {
		q.toErr(false)
	}
	if status != abi.WCSuccess || w.flags&abi.WRFlagSignaled != 0 || q.SigAll {
		// Lazily: publish stores pi when the pass ends (or at once if
		// the completion fires an event).
		d.completeLazy(q.SendCQ, t, &abi.CQE{
			WRID: w.wrID, Status: status, Opcode: wcOpcode(w.opcode), QPNum: q.Num, ByteLen: byteLen,
		}, w.flags&abi.WRFlagSolicited != 0, true)
		q.cqPending = true
	}
	q.sqCI++ // stored into the record by publish
}

// run executes a validated send WQE whose SGEs are in sc.lsge. It returns
// the wc status (or rnrPending) and the message length.
func (q *QP) run(t *memmap.Table, w *sendWQE, sc *scratch, now int64) (status uint8, total uint64) {
	d := q.Dev
	op := w.opcode
	atomic := op == abi.WROpAtomicCmpSwp || op == abi.WROpAtomicFetchAdd
	writesLocal := op == abi.WROpRDMARead || atomic
	inline := w.flags&abi.WRFlagInline != 0

	// Local SGEs: "the lkey must name an MR of this device in the QP's PD,
	// and [addr, addr+length) must lie within the MR; an SGE the device
	// writes into needs LOCAL_WRITE. Otherwise the WQE completes with
	// LOC_PROT_ERR."
	nsge := int(w.numSGE)
	if inline {
		nsge = 0
		total = uint64(w.inlineLen)
	}
	lsge, lmr := sc.lsge[:nsge], sc.lmr[:nsge]
	for i := range lsge {
		s := &lsge[i]
		mr := d.LookupMR(s.LKey)
		if mr == nil || mr.PD != q.PD || !mr.Contains(s.Addr, uint64(s.Length)) ||
			(writesLocal && mr.Access&abi.AccessLocalWrite == 0) {
			return abi.WCLocProtErr, 0
		}
		lmr[i] = mr
		total += uint64(s.Length)
	}
	if total > abi.MaxMsgSize || (atomic && total != 8) {
		return abi.WCLocLenErr, 0
	}

	// The responder: a QP that does not exist or is not in RTR/RTS is
	// RETRY_EXC_ERR, "as a real fabric's retries would".
	q.mu.Lock()
	peer, dest, rnrRetry := q.peer, q.attr.DestQPNum, q.attr.RNRRetry
	q.mu.Unlock()
	if peer == nil {
		return abi.WCRetryExcErr, 0
	}
	pq := peer.LookupQP(dest)
	if pq == nil {
		return abi.WCRetryExcErr, 0
	}
	pt := peer.acquire()
	if pt == nil {
		return abi.WCRetryExcErr, 0
	}
	defer pt.Release()
	return q.respondContained(t, pt, pq, w, sc, lsge, lmr, total, rnrRetry, now) // fault.go
}

// respond runs the responder side of w on pq (of device pq.Dev, table
// pt) under pq.rqMu. Remote errors move pq to ERR with a QP_FATAL event.
func (q *QP) respond(t, pt *memmap.Table, pq *QP, w *sendWQE, sc *scratch, lsge []abi.SGE, lmr []*MR,
	total uint64, rnrRetry uint32, now int64) (uint8, uint64) {
	peer := pq.Dev
	pq.rqMu.Lock()
	defer pq.rqMu.Unlock()
	pq.mu.Lock()
	pst, pdead, pacc, minRNR := pq.attr.QPState, pq.dead, pq.attr.QPAccessFlags, pq.attr.MinRNRTimer
	pq.mu.Unlock()
	if pdead || (pst != abi.QPSRTR && pst != abi.QPSRTS) {
		return abi.WCRetryExcErr, 0
	}
	op := w.opcode

	// Operations that consume the responder's next receive WQE.
	var (
		prec  []byte
		rwrID uint64
		nr    int
	)
	if op == abi.WROpSend || op == abi.WROpSendWithImm || op == abi.WROpRDMAWriteWithImm {
		var err error
		prec, err = pt.Slice(pq.Record, QPRecordSize(pq.RQNotify))
		if err != nil {
			pq.toErr(true)
			return abi.WCRemOpErr, 0
		}
		pi := memmap.LoadUint32(prec, abi.QPRecordRQPI)
		if pi == pq.rqCI {
			// Receiver not ready: ask pq's driver for a notification
			// when it posts a receive, then look once more.
			if pi = pq.awaitRecv(prec, q); pi == pq.rqCI {
				return q.rnr(rnrRetry, minRNR, now), 0
			}
		}
		if pi-pq.rqCI > pq.RQ.Depth {
			pq.toErr(true)
			return abi.WCRemOpErr, 0
		}
		slot, err := pq.RQ.Slot(pt, pq.rqCI)
		if err != nil {
			pq.toErr(true)
			return abi.WCRemOpErr, 0
		}
		n := copy(sc.rwqe[:], slot)
		var ok bool
		rwrID, nr, ok = decodeRecv(sc.rwqe[:n], min(pq.MaxRecvSGE, maxRecvSGEs), sc.rsge[:])
		if !ok {
			q.recvDone(pq, pt, prec, rwrID, abi.WCLocQPOpErr, w, 0)
			pq.toErr(true)
			return abi.WCRemOpErr, 0
		}
	}

	switch op {
	case abi.WROpSend, abi.WROpSendWithImm:
		rs, rm := sc.rsge[:nr], sc.rmr[:nr]
		var capacity uint64
		for i := range rs {
			s := &rs[i]
			mr := peer.LookupMR(s.LKey)
			if mr == nil || mr.PD != pq.PD || !mr.Contains(s.Addr, uint64(s.Length)) ||
				mr.Access&abi.AccessLocalWrite == 0 {
				q.recvDone(pq, pt, prec, rwrID, abi.WCLocProtErr, w, 0)
				pq.toErr(true)
				return abi.WCRemOpErr, 0
			}
			rm[i] = mr
			capacity += uint64(s.Length)
		}
		if total > capacity {
			// "A message longer than the receive WQE's scatter list is
			// LOC_LEN_ERR at the responder and REM_INV_REQ_ERR at the
			// requester."
			q.recvDone(pq, pt, prec, rwrID, abi.WCLocLenErr, w, 0)
			pq.toErr(true)
			return abi.WCRemInvReqErr, 0
		}
		sc.mv.start(pt, rs, rm)
		if err := q.gather(t, w, sc, lsge, lmr); err != nil {
			if sc.mv.dstFailed {
				q.recvDone(pq, pt, prec, rwrID, abi.WCLocProtErr, w, 0)
				pq.toErr(true)
				return abi.WCRemOpErr, 0
			}
			return abi.WCLocProtErr, 0
		}
		q.recvDone(pq, pt, prec, rwrID, abi.WCSuccess, w, total)
		return abi.WCSuccess, total

	case abi.WROpRDMAWrite, abi.WROpRDMAWriteWithImm:
		mr := remoteMR(pq, pacc, w.rkey, w.remoteAddr, total, abi.AccessRemoteWrite)
		if mr == nil {
			pq.toErr(true)
			return abi.WCRemAccessErr, 0
		}
		sc.one[0] = abi.SGE{Addr: w.remoteAddr, Length: uint32(total), LKey: w.rkey}
		sc.oneM[0] = mr
		sc.mv.start(pt, sc.one[:], sc.oneM[:])
		if err := q.gather(t, w, sc, lsge, lmr); err != nil {
			if sc.mv.dstFailed {
				pq.toErr(true)
				return abi.WCRemAccessErr, 0
			}
			return abi.WCLocProtErr, 0
		}
		if op == abi.WROpRDMAWriteWithImm {
			q.recvDone(pq, pt, prec, rwrID, abi.WCSuccess, w, total)
		}
		return abi.WCSuccess, total

	case abi.WROpRDMARead:
		mr := remoteMR(pq, pacc, w.rkey, w.remoteAddr, total, abi.AccessRemoteRead)
		if mr == nil {
			pq.toErr(true)
			return abi.WCRemAccessErr, 0
		}
		sc.mv.start(t, lsge, lmr)
		if err := mr.Range(pt, w.remoteAddr, total, sc.mv.srcFn); err != nil {
			if sc.mv.dstFailed {
				return abi.WCLocProtErr, 0
			}
			pq.toErr(true)
			return abi.WCRemAccessErr, 0
		}
		return abi.WCSuccess, total

	default: // atomics (decodeSend admits no other opcode)
		if w.remoteAddr%8 != 0 {
			pq.toErr(true)
			return abi.WCRemInvReqErr, 0
		}
		mr := remoteMR(pq, pacc, w.rkey, w.remoteAddr, 8, abi.AccessRemoteAtomic)
		if mr == nil {
			pq.toErr(true)
			return abi.WCRemAccessErr, 0
		}
		a := &sc.atom
		a.op, a.compareAdd, a.swap, a.done = op, w.compareAdd, w.swap, false
		if err := mr.Range(pt, w.remoteAddr, 8, a.fn); err != nil || !a.done {
			return abi.WCRemOpErr, 0
		}
		sc.mv.start(t, lsge, lmr)
		if err := sc.mv.srcFn(a.orig[:]); err != nil {
			return abi.WCLocProtErr, 0
		}
		return abi.WCSuccess, 8
	}
}

// remoteMR checks a remote access: "the rkey must name an MR of the peer
// device in the peer QP's PD, the range must lie within it, and the MR and
// the peer QP's qp_access_flags must both allow the operation".
func remoteMR(pq *QP, qpAccess, rkey uint32, addr, n uint64, need uint32) *MR {
	mr := pq.Dev.LookupMR(rkey)
	if mr == nil || mr.PD != pq.PD || !mr.Contains(addr, n) || mr.Access&need == 0 || qpAccess&need == 0 {
		return nil
	}
	return mr
}

// gather feeds the message's source (inline bytes or local SGEs) to the
// mover, which scatters it over its destination.
func (q *QP) gather(t *memmap.Table, w *sendWQE, sc *scratch, lsge []abi.SGE, lmr []*MR) error {
	if w.flags&abi.WRFlagInline != 0 {
		return sc.mv.srcFn(sc.wqe[abi.SendWQEHdrSize : abi.SendWQEHdrSize+int(w.inlineLen)])
	}
	for i := range lsge {
		if err := lmr[i].Range(t, lsge[i].Addr, uint64(lsge[i].Length), sc.mv.srcFn); err != nil {
			return err
		}
	}
	return nil
}

// recvDone consumes pq's head receive WQE (rq_ci advances) and completes
// it on pq's receive CQ. Precondition: pq.rqMu held; prec is pq's record
// on pt.
func (q *QP) recvDone(pq *QP, pt *memmap.Table, prec []byte, wrID uint64, status uint8, w *sendWQE, n uint64) {
	pq.rqCI++
	memmap.StoreUint32(prec, abi.QPRecordRQCI, pq.rqCI)
	e := abi.CQE{WRID: wrID, Status: status, Opcode: abi.WCOpRecv, QPNum: pq.Num, SrcQP: q.Num}
	if status == abi.WCSuccess {
		e.ByteLen = uint32(n)
		switch w.opcode {
		case abi.WROpSendWithImm:
			e.WCFlags, e.ImmData = abi.WCFlagWithImm, w.imm
		case abi.WROpRDMAWriteWithImm:
			e.Opcode, e.WCFlags, e.ImmData = abi.WCOpRecvRDMAWithImm, abi.WCFlagWithImm, w.imm
		}
	}
	pq.Dev.complete(pq.RecvCQ, pt, &e, w.flags&abi.WRFlagSolicited != 0)
}

// rnr handles a receiver-not-ready answer: the head WQE is retried after
// the responder's min_rnr_timer, up to rnr_retry times (7: forever), then
// completes with RNR_RETRY_EXC_ERR. Precondition: sqMu held.
func (q *QP) rnr(rnrRetry, minRNR uint32, now int64) uint8 {
	if rnrRetry != 7 && q.rnrTries >= rnrRetry {
		return abi.WCRNRRetryExcErr
	}
	q.rnrTries++
	delay := time.Duration(rnrDelayUS[minRNR&31]) * time.Microsecond
	q.rnrWait = now + int64(delay)
	if q.rnrTimer == nil {
		dev, dbq := q.Dev, q.DoorbellQueue
		q.rnrTimer = time.AfterFunc(delay, func() { dev.wakeQueue(dbq) })
	} else {
		q.rnrTimer.Reset(delay)
	}
	return rnrPending
}

// flush completes, in order, every send WQE between sqCI and sq_pi and
// every receive WQE between rqCI and rq_pi with WR_FLUSH_ERR (or
// RETRY_EXC_ERR for sends outstanding when the peer device was reset), at
// most budget of them. A producer index more than the depth ahead is not
// flushed (the QP is broken). Precondition: sqMu held; state ERR.
func (q *QP) flush(t *memmap.Table, rec []byte, budget int) (n int) {
	d := q.Dev
	pi := memmap.LoadUint32(rec, abi.QPRecordSQPI)
	if pi-q.sqCI <= q.SQ.Depth {
		for q.sqCI != pi && n < budget {
			var wrID uint64
			var op uint8
			if q.sc != nil && q.sc.held {
				wrID, op = q.sc.w.wrID, q.sc.w.opcode
				q.sc.held = false
			} else if slot, err := q.SQ.Slot(t, q.sqCI); err == nil && len(slot) >= 9 {
				var hdr [9]byte
				copy(hdr[:], slot)
				wrID, op = binary.LittleEndian.Uint64(hdr[:]), hdr[8]
			}
			status := uint8(abi.WCWRFlushErr)
			if q.retryExc && int32(q.retryEnd-q.sqCI) > 0 {
				status = abi.WCRetryExcErr
			}
			d.complete(q.SendCQ, t, &abi.CQE{WRID: wrID, Status: status, Opcode: wcOpcode(op), QPNum: q.Num}, false)
			q.sqCI++
			memmap.StoreUint32(rec, abi.QPRecordSQCI, q.sqCI)
			n++
		}
	}
	if q.retryExc && int32(q.retryEnd-q.sqCI) <= 0 {
		q.retryExc = false
	}
	return n + q.flushRecv(t, rec, budget-n)
}

// flushRecv is flush's receive half, under rqMu.
func (q *QP) flushRecv(t *memmap.Table, rec []byte, budget int) (n int) {
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	// Receives posted from now on need a notification: announced
	// before rq_pi is read.
	q.rqFlushing = true
	q.updateRQNotify(rec)
	pi := memmap.LoadUint32(rec, abi.QPRecordRQPI)
	if pi-q.rqCI > q.RQ.Depth {
		return 0
	}
	for q.rqCI != pi && n < budget {
		var wrID uint64
		if slot, err := q.RQ.Slot(t, q.rqCI); err == nil && len(slot) >= 8 {
			var hdr [8]byte
			copy(hdr[:], slot)
			wrID = binary.LittleEndian.Uint64(hdr[:])
		}
		q.rqCI++
		memmap.StoreUint32(rec, abi.QPRecordRQCI, q.rqCI)
		q.Dev.complete(q.RecvCQ, t, &abi.CQE{WRID: wrID, Status: abi.WCWRFlushErr, Opcode: abi.WCOpRecv, QPNum: q.Num}, false)
		n++
	}
	return n
}
