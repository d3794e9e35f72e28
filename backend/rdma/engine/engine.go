package engine

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
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

// epoch anchors the engine's monotonic clock.
var epoch = time.Now()

// monoNow returns monotonic nanoseconds since epoch.
func monoNow() int64 { return int64(time.Since(epoch)) }

// Budget bounds one PollBudget call: the engine time its WQEs may take,
// counted as payload bytes plus OpCost per WQE, and the WQEs it may
// execute. A WQE runs while both are positive and charges its whole cost,
// so a message larger than what is left takes Bytes below zero (a debt for
// the caller's scheduler, which shares the engine between devices by
// deficit round robin; package sched).
type Budget struct {
	Bytes  int64
	Ops    int
	OpCost int64
	// Moved adds up the payload of the WQEs run.
	Moved uint64
}

func (b *Budget) spent() bool { return b.Bytes <= 0 || b.Ops <= 0 }

// Poll is PollBudget without a budget (still at most pollBudget WQEs per
// QP).
func (d *RNIC) Poll(dbq int, t *memmap.Table) (worked bool, nextRetry time.Time) {
	b := Budget{Bytes: math.MaxInt64, Ops: math.MaxInt}
	return d.PollBudget(dbq, t, &b)
}

// PollBudget runs the requester side of every QP of doorbell queue dbq
// that has posted send work, and the flush of every QP of dbq in ERR (both
// queues), once and bounded: at most pollBudget WQEs per QP, and no WQE
// once b is spent. It starts at a different QP each call, so that QPs
// share a budget that runs out midway. It reports whether it did anything
// (the caller keeps polling) and the earliest RNR retry deadline of a QP
// waiting for one (the zero time if none).
//
// Precondition: t is the device's current table, acquired by the caller,
// who runs PollBudget under memmap.Guard. It never panics on guest input.
func (d *RNIC) PollBudget(dbq int, t *memmap.Table, b *Budget) (worked bool, nextRetry time.Time) {
	now := monoNow()
	var next int64
	// The driver's notification after posting to an SRQ with notify set
	// wakes the SRQ's doorbell queue: requesters waiting on it go on.
	for _, s := range d.queueSRQs(dbq) {
		s.kick(t)
	}
	qs := d.queueQPs(dbq)
	start := 0
	if len(qs) > 1 {
		start = int(d.rotor.Add(1) % uint32(len(qs)))
	}
	for i := range qs {
		if b.spent() {
			worked = true // work may be left: the caller comes back
			break
		}
		q := qs[(start+i)%len(qs)]
		w, r := q.poll(t, now, b)
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

// poll is PollBudget for one QP.
func (q *QP) poll(t *memmap.Table, now int64, b *Budget) (worked bool, retry int64) {
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
	if q.HW != nil {
		worked = q.pollNIC(t, rec, b)
	} else {
		worked, retry = q.pollLocked(t, rec, now, b)
	}
	q.publish(t, rec)
	return worked, retry
}

// publish makes a poll pass's work visible at once: the record's sq_ci,
// the send CQ's pi (completions were pushed lazily), the same-host
// responder's rq_ci and receive CQ pi, and the device's counters. One
// store each per pass instead of per WQE keeps the cache lines the driver
// polls from bouncing between its core and the engine's (ci.go).
// Precondition: sqMu held; rec is the QP's record on t.
func (q *QP) publish(t *memmap.Table, rec []byte) {
	if q.sqCI != q.sqCIPub {
		q.setCIOn(t, sqIdx, rec, q.sqCI)
		q.sqCIPub = q.sqCI
	}
	if pq := q.peerPend; pq != nil {
		q.peerPend = nil
		publishPeer(t, pq)
	}
	if q.cqPending {
		q.cqPending = false
		q.SendCQ.publishNotify(t)
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
func (q *QP) pollLocked(t *memmap.Table, rec []byte, now int64, b *Budget) (worked bool, retry int64) {
	q.kickWaiter(t, rec)
	for budget := pollBudget; budget > 0 && !b.spent(); {
		q.mu.Lock()
		st, dead, lost, lostEnd, haveEnd, nq := q.attr.QPState, q.dead, q.lostPeer, q.lostEnd, q.lostHaveEnd, q.net
		q.lostPeer = false
		q.mu.Unlock()
		if dead {
			return worked, 0
		}
		switch st {
		case abi.QPSRTS:
			pi := q.sqPISeen
			if pi-q.sqCI-1 >= q.SQ.Depth {
				// Not known to be ahead (within the depth): read the
				// driver's sq_pi, which shares its cache line with
				// the words the driver writes as it posts, only then.
				pi = abi.LoadUint32(rec, abi.QPRecordSQPI)
				q.sqPISeen = pi
			}
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
			n := q.step(t, rec, now, nq)
			worked = true
			budget--
			b.Ops--
			b.Bytes -= int64(min(n, math.MaxInt64/2)) + b.OpCost
			b.Moved += n
			if q.sqCI-q.sqCIPub >= publishEvery || q.bytesPend >= publishBytes {
				// Keep the driver's reaping overlapped with the pass.
				q.publish(t, rec)
			}
		case abi.QPSErr:
			if nq != nil {
				// Outstanding network WQEs complete (flushed) before
				// the ones still in the ring.
				nq.close(false)
			}
			if lost {
				q.retryExc = true
				q.retryEnd = lostEnd
				if !haveEnd {
					q.retryEnd = abi.LoadUint32(rec, abi.QPRecordSQPI)
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
// the WQE stays at the head, held in the scratch. It returns the bytes the
// WQE moved.
// Precondition: sqMu held; rec is the QP's record on t.
func (q *QP) step(t *memmap.Table, rec []byte, now int64, nq *netQP) (moved uint64) {
	sc := q.scratchBuf()
	ok := true
	if !sc.held {
		slot, err := q.SQ.Slot(t, q.sqCI)
		if err != nil {
			q.toErr(true) // the ring left guest memory
			return
		}
		n := copy(sc.wqe[:], slot)
		sc.w, ok = decodeSend(sc.wqe[:n], q.UD, min(q.MaxSendSGE, maxSendSGEs), q.MaxInline, sc.lsge[:])
		if !ok {
			q.counters().malformed.Add(1)
		}
	}
	w := &sc.w
	o := outcome{status: abi.WCLocQPOpErr}
	switch {
	case nq != nil:
		var posted bool
		if o, posted = q.postNet(t, nq, w, sc, ok, now); posted {
			sc.held = false
			q.rnrTries, q.rnrWait, q.fenceWaits = 0, 0, 0
			q.rnrKick.Store(false)
			q.sqCI++ // stored into the record by publish, or before the WQE's completion (netQP.completeOn)
			q.ciDone[sqIdx].Store(q.sqCI)
			return o.n
		}
		if o.rnr {
			sc.held = true
			return 0
		}
	case ok:
		if o = q.run(t, w, sc, now); o.rnr {
			sc.held = true
			return
		}
	}
	status, total := o.status, o.n
	sc.held = false
	q.rnrTries, q.rnrWait, q.fenceWaits = 0, 0, 0
	q.rnrKick.Store(false)
	d := q.Dev
	byteLen := uint32(0)
	if status == abi.WCSuccess {
		if int(w.opcode) < len(q.opsPend) {
			q.opsPend[w.opcode]++
		}
		q.bytesPend += total
		byteLen = uint32(total)
		moved = total
	} else {
		q.toErr(false)
	}
	q.sqCI++ // stored into the record by publish
	if status != abi.WCSuccess || w.flags&abi.WRFlagSignaled != 0 || q.SigAll {
		// Lazily: publish stores pi when the pass ends (or at once if
		// the completion fires an event), sq_ci before it (ci.go).
		q.ciDone[sqIdx].Store(q.sqCI)
		d.completeLazy(q.SendCQ, t, &abi.CQE{
			WRID: w.wrID, Status: status, Opcode: wcOpcode(w.opcode), QPNum: q.Num, ByteLen: byteLen,
		}, w.flags&abi.WRFlagSolicited != 0, q)
		q.cqPending = true
	}
	return moved
}

// checkLocal checks the local side of a validated send WQE whose SGEs are
// in sc.lsge: "the lkey must name an MR of this device in the QP's PD, and
// [addr, addr+length) must lie within the MR; an SGE the device writes
// into needs LOCAL_WRITE. Otherwise the WQE completes with LOC_PROT_ERR."
// It returns the SGEs with their MRs and the message length, or the
// failed outcome (st not WCSuccess). t is q's device's table.
func (q *QP) checkLocal(t *memmap.Table, w *sendWQE, sc *scratch) (lsge []abi.SGE, lmr []*MR, total uint64, st abi.WCStatus) {
	op := w.opcode
	atomic := op == abi.WROpAtomicCmpSwp || op == abi.WROpAtomicFetchAdd
	writesLocal := op == abi.WROpRDMARead || atomic
	nsge := int(w.numSGE)
	if w.flags&abi.WRFlagInline != 0 {
		nsge = 0
		total = uint64(w.inlineLen)
	}
	lsge, lmr = sc.lsge[:nsge], sc.lmr[:nsge]
	for i := range lsge {
		s := &lsge[i]
		mr := sc.keys.mr(q.Dev, s.LKey)
		if mr == nil || mr.PD != q.PD || !mr.Local(t, s.Addr, uint64(s.Length)) ||
			(writesLocal && mr.Access&abi.AccessLocalWrite == 0) {
			return nil, nil, 0, abi.WCLocProtErr
		}
		lmr[i] = mr
		total += uint64(s.Length)
	}
	if total > abi.MaxMsgSize || (atomic && total != 8) {
		return nil, nil, 0, abi.WCLocLenErr
	}
	return lsge, lmr, total, abi.WCSuccess
}

// netHold is how long a WQE a network QP could not post waits at the head
// when no completion kicks it first (a bound, not the expected wait).
const netHold = int64(time.Millisecond)

// postNet runs the head send WQE of a network QP (decoded: ok false if it
// did not validate): posted (its completion comes from the transport;
// o.n is its length), held at the head (o.rnr: the transport is full, or
// the WQE fails locally and must complete after the outstanding ones), or
// failed (o.status). Precondition: sqMu held.
func (q *QP) postNet(t *memmap.Table, nq *netQP, w *sendWQE, sc *scratch, ok bool, now int64) (o outcome, posted bool) {
	var lsge []abi.SGE
	var lmr []*MR
	var total uint64
	st := abi.WCLocQPOpErr
	switch {
	case ok && isMemOp(w.opcode):
		// On this device, after the WQEs posted before it have
		// completed: a bind or an invalidation takes effect in send
		// queue order, and completions keep posting order.
		if q.netDrained(nq, now) {
			return q.runMem(t, w, sc), false
		}
		return outcome{rnr: true}, false
	case ok:
		lsge, lmr, total, st = q.checkLocal(t, w, sc)
	}
	if st == abi.WCSuccess {
		switch nq.post(w, sc, lsge, lmr, total) {
		case netPosted:
			return outcome{n: total}, true
		case netRefused:
			st = abi.WCLocQPOpErr
		}
	}
	if st == abi.WCSuccess || nq.outstanding() {
		// Completions keep posting order: a local failure waits for
		// the completions before it.
		if st != abi.WCSuccess {
			nq.waiting.Store(true)
			if !nq.outstanding() {
				nq.waiting.Store(false)
				return failed(st), false
			}
		}
		q.rnrWait = now + netHold
		return outcome{rnr: true}, false
	}
	return failed(st), false
}

// netDrained reports whether network QP nq has no WQE outstanding; if it
// has, the head WQE waits (the next completion kicks the QP, netHold
// bounds the wait). Precondition: sqMu held.
func (q *QP) netDrained(nq *netQP, now int64) bool {
	if !nq.outstanding() {
		return true
	}
	nq.waiting.Store(true)
	if !nq.outstanding() {
		nq.waiting.Store(false)
		return true
	}
	q.rnrWait = now + netHold
	return false
}

// run executes a validated send WQE whose SGEs are in sc.lsge: it checks
// the local side, builds the request and hands it to the responder.
func (q *QP) run(t *memmap.Table, w *sendWQE, sc *scratch, now int64) outcome {
	if q.UD {
		return q.sendUD(t, w, sc, now)
	}
	if isMemOp(w.opcode) {
		return q.runMem(t, w, sc)
	}
	lsge, lmr, total, st := q.checkLocal(t, w, sc)
	if st != abi.WCSuccess {
		return failed(st)
	}

	// The responder: a QP that does not exist or is not in RTR/RTS is
	// RETRY_EXC_ERR, "as a real fabric's retries would".
	q.mu.Lock()
	peer, dest, rnrRetry, sgid := q.peer, q.attr.DestQPNum, q.attr.RNRRetry, q.sgid
	q.mu.Unlock()
	if peer == nil {
		return failed(abi.WCRetryExcErr)
	}
	if peer.fenced.Load() {
		// Before the lookup: a migrated-out peer's QPs may be gone
		// while the fabric repoints this QP (fence.go). respond
		// checks again under the responder's rqMu.
		return q.fenceHold(now)
	}
	pq := sc.keys.lookupQP(peer, dest)
	if pq == nil {
		return failed(abi.WCRetryExcErr)
	}
	pt := peer.acquire()
	if pt == nil {
		return failed(abi.WCRetryExcErr)
	}
	defer pt.Release()
	r := &sc.req
	*r = request{q: q, pq: pq, t: t, pt: pt, w: w, sc: sc, lsge: lsge, lmr: lmr,
		total: total, rnrRetry: rnrRetry, sgid: sgid, now: now}
	o := r.respondContained() // fault.go
	*r = request{}            // drop the references until the next WQE
	return o
}

// remoteMR checks a remote access through the requester's key cache: an
// MR's rkey or a bound window's (remoteKey).
func remoteMR(sc *scratch, pq *QP, qpAccess, rkey uint32, addr, n uint64, need uint32) *MR {
	return remoteKey(&sc.keys, pq, qpAccess, rkey, addr, n, need)
}

// gather feeds the message's source (inline bytes or local SGEs) to the
// mover, which scatters it over its destination.
func (q *QP) gather(t *memmap.Table, w *sendWQE, sc *scratch, lsge []abi.SGE, lmr []*MR) error {
	if w.flags&abi.WRFlagInline != 0 {
		off := w.dataOff()
		return sc.mv.srcFn(sc.wqe[off : off+int(w.inlineLen)])
	}
	for i := range lsge {
		if err := lmr[i].Range(t, lsge[i].Addr, uint64(lsge[i].Length), sc.mv.srcFn); err != nil {
			return err
		}
	}
	return nil
}

// rnr handles a receiver-not-ready answer: the head WQE is retried after
// the responder's min_rnr_timer (or when the responder's driver posts a
// receive: kickWaiter), up to rnr_retry times (7: forever), then completes
// with RNR_RETRY_EXC_ERR. Precondition: sqMu held.
func (q *QP) rnr(rnrRetry, minRNR uint32, now int64) outcome {
	q.counters().rnrRecv.Add(1)
	if rnrRetry != 7 && q.rnrTries >= rnrRetry {
		return failed(abi.WCRNRRetryExcErr)
	}
	q.rnrTries++
	return q.holdHead(now, time.Duration(rnrDelayUS[minRNR&31])*time.Microsecond)
}

// holdHead keeps the send queue's head WQE for delay (receiver not ready,
// or a fenced peer: fence.go): the QP is skipped until then, and a timer
// wakes its doorbell queue to send it again. Precondition: sqMu held.
func (q *QP) holdHead(now int64, delay time.Duration) outcome {
	q.rnrWait = now + int64(delay)
	if q.rnrTimer == nil {
		dev, dbq := q.Dev, q.DoorbellQueue
		q.rnrTimer = time.AfterFunc(delay, func() { dev.wakeQueue(dbq) })
	} else {
		q.rnrTimer.Reset(delay)
	}
	return outcome{rnr: true}
}

// flush completes, in order, every send WQE between sqCI and sq_pi and
// every receive WQE between rqCI and rq_pi (a QP with an SRQ: see
// flushSRQ) with WR_FLUSH_ERR (or
// RETRY_EXC_ERR for sends outstanding when the peer device was reset), at
// most budget of them. A producer index more than the depth ahead is not
// flushed (the QP is broken). Precondition: sqMu held; state ERR.
func (q *QP) flush(t *memmap.Table, rec []byte, budget int) (n int) {
	d := q.Dev
	pi := abi.LoadUint32(rec, abi.QPRecordSQPI)
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
			status := abi.WCWRFlushErr
			if q.retryExc && int32(q.retryEnd-q.sqCI) > 0 {
				status = abi.WCRetryExcErr
			}
			q.sqCI++
			q.sqCIPub = q.sqCI
			q.setCIOn(t, sqIdx, rec, q.sqCI) // before the CQE is visible
			d.complete(q.SendCQ, t, &abi.CQE{WRID: wrID, Status: status, Opcode: wcOpcode(op), QPNum: q.Num}, false)
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
	if q.SRQ != nil {
		return q.flushSRQ(t, budget)
	}
	// Receives posted from now on need a notification: announced
	// before rq_pi is read.
	q.rqFlushing = true
	q.updateRQNotifyOn(t, rec)
	pi := abi.LoadUint32(rec, abi.QPRecordRQPI)
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
		q.setCIOn(t, rqIdx, rec, q.rqCI)
		q.Dev.complete(q.RecvCQ, t, &abi.CQE{WRID: wrID, Status: abi.WCWRFlushErr, Opcode: abi.WCOpRecv, QPNum: q.Num}, false)
		n++
	}
	return n
}

// flushSRQ is flushRecv for a QP with an SRQ: "A QP in ERR flushes its
// send queue only: the WQEs in the SRQ belong to the SRQ and stay for its
// other QPs". A WQE the QP had consumed for a message that did not
// complete (stash) completes with WR_FLUSH_ERR; then, once, the QP posts
// QP_LAST_WQE_REACHED: it is in ERR, so under rqMu (held) no responder
// and, its transport closed by the pass, no network message consumes for
// it any more. Precondition: rqMu held; state ERR.
func (q *QP) flushSRQ(t *memmap.Table, budget int) (n int) {
	if budget <= 0 {
		return 0 // the next pass
	}
	if st := q.srqStash; st != nil {
		q.srqStash = nil
		q.Dev.complete(q.RecvCQ, t, &abi.CQE{WRID: st.wrID, Status: abi.WCWRFlushErr, Opcode: abi.WCOpRecv, QPNum: q.Num}, false)
		n++
	}
	if !q.lastWQE {
		q.lastWQE = true
		q.Dev.postEvent(abi.EventQPLastWQE, q.Num)
	}
	return n
}
