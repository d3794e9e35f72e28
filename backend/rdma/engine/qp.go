package engine

import (
	"errors"

	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// knownMask is every attribute mask bit of docs/spec.md § MODIFY_QP.
const knownMask = abi.QPAttrState | abi.QPAttrAccessFlags | abi.QPAttrPKeyIndex | abi.QPAttrPort |
	abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrTimeout | abi.QPAttrRetryCnt | abi.QPAttrRNRRetry |
	abi.QPAttrRQPSN | abi.QPAttrMaxQPRdAtomic | abi.QPAttrMinRNRTimer | abi.QPAttrSQPSN |
	abi.QPAttrMaxDestRdAtomic | abi.QPAttrDestQPN | abi.QPAttrPaths | abi.QPAttrQKey

// transition is one row of the RC transition table.
type transition struct {
	from, to           uint32
	required, optional uint32
}

// transitions is the table of docs/spec.md § MODIFY_QP, except "any →
// RESET" and "any → ERR", which Modify handles first.
var transitions = [...]transition{
	{abi.QPSReset, abi.QPSInit, abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrAccessFlags, 0},
	{abi.QPSInit, abi.QPSInit, abi.QPAttrState, abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrAccessFlags},
	{abi.QPSInit, abi.QPSRTR, abi.QPAttrState | abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN |
		abi.QPAttrRQPSN | abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer, abi.QPAttrPKeyIndex | abi.QPAttrAccessFlags | abi.QPAttrPaths},
	{abi.QPSRTR, abi.QPSRTS, abi.QPAttrState | abi.QPAttrSQPSN | abi.QPAttrTimeout | abi.QPAttrRetryCnt |
		abi.QPAttrRNRRetry | abi.QPAttrMaxQPRdAtomic, abi.QPAttrAccessFlags | abi.QPAttrMinRNRTimer},
	{abi.QPSRTS, abi.QPSRTS, abi.QPAttrState, abi.QPAttrAccessFlags | abi.QPAttrMinRNRTimer},
}

// udTransitions is the UD table of docs/spec.md § MODIFY_QP: a UD QP has
// no peer, so every attribute of one is INVALID in its masks.
var udTransitions = [...]transition{
	{abi.QPSReset, abi.QPSInit, abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrQKey, 0},
	{abi.QPSInit, abi.QPSInit, abi.QPAttrState, abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrQKey},
	{abi.QPSInit, abi.QPSRTR, abi.QPAttrState, abi.QPAttrPKeyIndex | abi.QPAttrQKey},
	{abi.QPSRTR, abi.QPSRTS, abi.QPAttrState | abi.QPAttrSQPSN, abi.QPAttrQKey},
	{abi.QPSRTS, abi.QPSRTS, abi.QPAttrState, abi.QPAttrQKey},
}

// checkValues validates the fields a's mask names, for a UD QP (ud) or an
// RC one.
func checkValues(a *abi.QPAttr, ud bool) bool {
	m := a.AttrMask
	has := func(bit uint32) bool { return m&bit != 0 }
	switch {
	case !ud && (a.QKey != 0 || has(abi.QPAttrQKey)), // "QKEY 0x40 (UD only)"; "zero for RC"
		has(abi.QPAttrPKeyIndex) && a.PKeyIndex != 0,
		has(abi.QPAttrPort) && a.PortNum != 1,
		has(abi.QPAttrAccessFlags) && a.QPAccessFlags&^abi.AccessAll != 0,
		has(abi.QPAttrAV) && (a.SGIDIndex >= abi.GIDTableLen || a.HopLimit > 255),
		has(abi.QPAttrPathMTU) && (a.PathMTU < abi.MTU256 || a.PathMTU > abi.MTU4096),
		has(abi.QPAttrTimeout) && a.Timeout > 31,
		has(abi.QPAttrRetryCnt) && a.RetryCnt > 7,
		has(abi.QPAttrRNRRetry) && a.RNRRetry > 7,
		has(abi.QPAttrRQPSN) && a.RQPSN >= 1<<24,
		has(abi.QPAttrSQPSN) && a.SQPSN >= 1<<24,
		has(abi.QPAttrMinRNRTimer) && a.MinRNRTimer > 31,
		has(abi.QPAttrPaths) && a.Paths > MaxPaths,
		!has(abi.QPAttrPaths) && a.Paths != 0:
		return false
	}
	return true
}

// Modify applies MODIFY_QP: the RC or UD state machine with the required
// and optional attribute masks of docs/spec.md § MODIFY_QP. It returns
// StatusOK, StatusInvalid (unknown or missing mask bits, bad values),
// StatusState (a transition not in the table), StatusNotFound (the QP was
// destroyed, or dgid is unknown to the fabric at INIT→RTR). Moving to
// RESET discards every posted WQE (the record's consumer indices become
// the producer indices); moving to ERR flushes (the engine does it, woken
// here).
func (q *QP) Modify(a abi.QPAttr) abi.Status {
	m := a.AttrMask
	if m&^uint32(knownMask) != 0 || m&abi.QPAttrState == 0 {
		return abi.StatusInvalid
	}
	to := a.QPState
	switch to {
	case abi.QPSReset, abi.QPSInit, abi.QPSRTR, abi.QPSRTS, abi.QPSErr:
	default:
		return abi.StatusInvalid
	}
	if !checkValues(&a, q.UD) {
		return abi.StatusInvalid
	}
	if to == abi.QPSReset {
		return q.reset(m)
	}

	// Resolve the peer before taking q.mu (the fabric lock is a leaf).
	// sgid_index must name an entry of the device's GID table. A dgid no
	// device of this host owns, from a network GID, is a peer on the
	// network: the transport is made here, before the transition (it
	// needs no lock of the QP), and closed again if the transition fails.
	var peer *RNIC
	var nq *netQP
	var sgid [16]byte
	if m&abi.QPAttrAV != 0 && !q.UD && q.Dev != nil && q.Dev.fabric != nil {
		var ok bool
		sgid, ok = q.Dev.GIDAt(int(a.SGIDIndex))
		if !ok {
			return abi.StatusInvalid
		}
		f := q.Dev.fabric
		peer = f.Lookup(a.DGID)
		if n := f.network(); peer == nil && n != nil && to == abi.QPSRTR && f.IsNetGID(q.Dev, sgid) && q.State() == abi.QPSInit {
			nq = newNetQP(q)
			// The remote QP is this QP's alone while it is connected,
			// and the peer's address a network destination no device
			// may claim (Fabric.claimConn).
			nq.remote = remoteQP{a.DGID, a.DestQPNum}
			if !f.claimConn(a.DGID, a.DestQPNum, nq) {
				q.Dev.log.WithField("qp", q.Num).Debug("MODIFY_QP: another QP of this host is connected to that remote QP")
				return abi.StatusBusy
			}
			conn, err := n.Connect(sgid, a.DGID, f.NetGIDs(q.Dev), int(a.Paths), q.rcConfig(&a), nq)
			if err != nil {
				nq.close(true)
				q.Dev.log.WithError(err).WithField("qp", q.Num).Warn("MODIFY_QP: cannot connect over the network")
				return abi.StatusBusy
			}
			nq.conn = conn
		}
	}
	// A UD QP of a device with network GIDs is attached to the network
	// as it enters RTR: from then on it receives from other hosts. The
	// GSI QP is attached as QP 1 at its device's host addresses; where
	// none is free for it (another device's GSI QP holds QP 1 at each of
	// them: hostnet), it goes on without the network rather than leave
	// its device without a MAD layer for peers on this host.
	var un *udNet
	if q.UD && to == abi.QPSRTR && q.Dev != nil && q.Dev.fabric != nil && q.Dev.NIC() == nil && q.State() == abi.QPSInit {
		f := q.Dev.fabric
		if n := f.udNetwork(); n != nil {
			if locals := f.NetGIDs(q.Dev); len(locals) > 0 {
				un = newUDNet(q)
				conn, err := n.OpenUD(q.srcQPN(), locals, un)
				switch {
				case err != nil && q.GSI:
					q.Dev.log.WithError(err).WithField("qp", q.Num).Warn("MODIFY_QP: the GSI QP is not attached to the network")
					un = nil
				case err != nil:
					q.Dev.log.WithError(err).WithField("qp", q.Num).Warn("MODIFY_QP: cannot attach the UD QP to the network")
					return abi.StatusBusy
				default:
					un.conn = conn
				}
			}
		}
	}
	// RTR→RTS starts a network QP's requester first: the engine may run
	// the QP's WQEs as soon as it sees RTS.
	if to == abi.QPSRTS {
		q.mu.Lock()
		from, cur := q.attr.QPState, q.net
		q.mu.Unlock()
		if from == abi.QPSRTR && cur != nil {
			if err := cur.conn.Start(rtsConfig(&a)); err != nil && !errors.Is(err, rc.ErrState) {
				return abi.StatusInvalid
			}
		}
	}

	st, toErr := func() (abi.Status, bool) {
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.dead {
			return abi.StatusNotFound, false
		}
		from := q.attr.QPState
		if to == abi.QPSErr {
			if m != abi.QPAttrState {
				return abi.StatusInvalid, false
			}
			q.attr.QPState = abi.QPSErr
			return abi.StatusOK, true
		}
		table := transitions[:]
		if q.UD {
			table = udTransitions[:]
		}
		var tr *transition
		for i := range table {
			if table[i].from == from && table[i].to == to {
				tr = &table[i]
				break
			}
		}
		if tr == nil {
			return abi.StatusState, false
		}
		if m&tr.required != tr.required || m&^(tr.required|tr.optional) != 0 {
			return abi.StatusInvalid, false
		}
		if q.HW != nil {
			// A host NIC's QP: the NIC makes the transition too, and
			// refuses what it cannot do (an unknown sgid, say).
			if st := q.modifyNIC(a); st != abi.StatusOK {
				return st, false
			}
		} else if m&abi.QPAttrAV != 0 && peer == nil && nq == nil {
			return abi.StatusNotFound, false
		}
		q.apply(&a)
		if m&abi.QPAttrAV != 0 {
			q.peer, q.sgid = peer, sgid
			if nq != nil {
				q.net, nq = nq, nil
			}
		}
		if un != nil {
			q.udNet, un = un, nil
		}
		q.attr.QPState = to
		return abi.StatusOK, false
	}()
	if nq != nil {
		nq.close(true) // the transition failed
	}
	if un != nil {
		un.conn.Close() // the transition failed
	}
	if toErr {
		q.nicToErr()
	}
	if toErr && q.Dev != nil {
		q.Dev.wakeQueue(q.DoorbellQueue)
	}
	return st
}

// apply copies the fields a's mask names. Precondition: q.mu held.
func (q *QP) apply(a *abi.QPAttr) {
	m := a.AttrMask
	x := &q.attr
	if m&abi.QPAttrAccessFlags != 0 {
		x.QPAccessFlags = a.QPAccessFlags
	}
	if m&abi.QPAttrPKeyIndex != 0 {
		x.PKeyIndex = a.PKeyIndex
	}
	if m&abi.QPAttrPort != 0 {
		x.PortNum = a.PortNum
	}
	if m&abi.QPAttrAV != 0 {
		x.DGID, x.SGIDIndex, x.HopLimit = a.DGID, a.SGIDIndex, a.HopLimit
	}
	if m&abi.QPAttrPathMTU != 0 {
		x.PathMTU = a.PathMTU
	}
	if m&abi.QPAttrTimeout != 0 {
		x.Timeout = a.Timeout
	}
	if m&abi.QPAttrRetryCnt != 0 {
		x.RetryCnt = a.RetryCnt
	}
	if m&abi.QPAttrRNRRetry != 0 {
		x.RNRRetry = a.RNRRetry
	}
	if m&abi.QPAttrRQPSN != 0 {
		x.RQPSN = a.RQPSN
	}
	if m&abi.QPAttrSQPSN != 0 {
		x.SQPSN = a.SQPSN
	}
	if m&abi.QPAttrMaxQPRdAtomic != 0 {
		x.MaxRdAtomic = a.MaxRdAtomic
	}
	if m&abi.QPAttrMaxDestRdAtomic != 0 {
		x.MaxDestRdAtomic = a.MaxDestRdAtomic
	}
	if m&abi.QPAttrMinRNRTimer != 0 {
		x.MinRNRTimer = a.MinRNRTimer
	}
	if m&abi.QPAttrDestQPN != 0 {
		x.DestQPNum = a.DestQPNum
	}
	if m&abi.QPAttrPaths != 0 {
		x.Paths = a.Paths
	}
	if m&abi.QPAttrQKey != 0 {
		x.QKey = a.QKey
	}
}

// reset moves the QP to RESET from any state: attributes are cleared, the
// peer forgotten, and every posted WQE discarded. It waits for the engine's
// pass over the QP and for in-flight responder work (sqMu, rqMu).
func (q *QP) reset(mask uint32) abi.Status {
	if mask != abi.QPAttrState {
		return abi.StatusInvalid
	}
	var t *memmap.Table
	if q.Dev != nil {
		t = q.Dev.acquire()
	}
	if t != nil {
		defer t.Release()
	}
	q.sqMu.Lock()
	defer q.sqMu.Unlock()
	q.closeNet()
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return abi.StatusNotFound
	}
	if q.HW != nil {
		q.hwRelease() // before the consumer indices jump to the producers'
	}
	q.attr = abi.QPAttr{QPN: q.Num, QPState: abi.QPSReset}
	q.peer, q.sgid = nil, [16]byte{}
	q.lostPeer = false
	q.rnrWait, q.rnrTries = 0, 0
	if q.rnrTimer != nil {
		q.rnrTimer.Stop()
	}
	q.retryExc = false
	if q.sc != nil {
		q.sc.held = false
	}
	if t == nil {
		if q.HW != nil {
			q.resetNIC()
		}
		return abi.StatusOK
	}
	rec, err := t.Slice(q.Record, QPRecordSize(q.RQNotify))
	if err != nil {
		if q.HW != nil {
			q.resetNIC()
		}
		return abi.StatusOK
	}
	q.rqFlushing = false
	q.rnrWaiter.Store(nil)
	q.updateRQNotifyOn(t, rec)
	q.srqStash, q.lastWQE = nil, false // a stashed SRQ WQE is discarded as posted ones are
	q.sqCI = abi.LoadUint32(rec, abi.QPRecordSQPI)
	q.rqCI = 0 // with an SRQ: rq_pi and rq_ci are unused
	if q.SRQ == nil {
		q.rqCI = abi.LoadUint32(rec, abi.QPRecordRQPI)
	}
	q.sqCIPub, q.sqPISeen, q.rqPISeen = q.sqCI, q.sqCI, q.rqCI
	q.resetCI(rec, q.sqCI, q.rqCI)
	q.markCI(t)
	if q.HW != nil {
		q.resetNIC()
	}
	return abi.StatusOK
}

// closeNet detaches and closes the QP's network transport or UD
// attachment, if any,
// without completing what it held (RESET, destroy). Precondition: sqMu
// held, rqMu and mu not.
func (q *QP) closeNet() {
	q.mu.Lock()
	nq, un := q.net, q.udNet
	q.net, q.udNet = nil, nil
	q.mu.Unlock()
	if nq != nil {
		nq.close(true)
	}
	if un != nil {
		un.conn.Close()
	}
}

// toErr moves the QP to ERR (unless destroyed or already there), posts a
// QP_FATAL event if fatal, and wakes the QP's engine to flush. It takes
// q.mu; the caller holds no QP.mu.
func (q *QP) toErr(fatal bool) {
	q.mu.Lock()
	changed := !q.dead && q.attr.QPState != abi.QPSErr
	if changed {
		q.attr.QPState = abi.QPSErr
	}
	q.mu.Unlock()
	if !changed || q.Dev == nil {
		return
	}
	q.nicToErr()
	if fatal {
		q.Dev.postEvent(abi.EventQPFatal, q.Num)
	}
	q.Dev.wakeQueue(q.DoorbellQueue)
}

// QPRecordSize is the size of a QP's record: abi.QPNotifyRecordSize for a
// QP created with the RQ_NOTIFY flag, else abi.QPRecordSize.
func QPRecordSize(rqNotify bool) uint64 {
	if rqNotify {
		return abi.QPNotifyRecordSize
	}
	return abi.QPRecordSize
}

// InitRecord clears the rq_notify word of a QP created with RQ_NOTIFY (the
// QP starts in RESET: receives need no notification). t is the table of
// q.Dev; call it before the QP is reachable.
func (q *QP) InitRecord(t *memmap.Table) {
	if !q.RQNotify || t == nil {
		return
	}
	// A host NIC's QP wants every receive at once: the engine posts it
	// to the NIC, which cannot ask for it when a message arrives.
	v := uint32(0)
	if q.HW != nil {
		v = 1
	}
	if rec, err := t.Slice(q.Record, abi.QPNotifyRecordSize); err == nil {
		abi.StoreUint32(rec, abi.QPRecordRQNotify, v)
		q.markRQNotify(t)
	}
	q.rqNotifyPub = v
}

// updateRQNotify stores the record's rq_notify word if it changed: 1
// while the QP flushes its receives (ERR) or a requester waits for one
// (RNR), else 0. The store is sequentially consistent (a full barrier on
// amd64): the device stores 1 before it reads rq_pi, the driver stores
// rq_pi before it reads rq_notify, so a receive posted meanwhile is either
// seen by the device or notified (docs/spec.md, struct
// vrdma_qp_notify_record). It reports whether it stored (callers with the
// table use updateRQNotifyOn, which marks the dirty log). Precondition:
// rqMu held (or the QP is not yet reachable); rec is the QP's whole
// record on the device's table.
func (q *QP) updateRQNotify(rec []byte) bool {
	if !q.RQNotify {
		return false
	}
	v := uint32(0)
	if q.rqFlushing || q.rnrWaiter.Load() != nil || q.HW != nil {
		v = 1
	}
	if v != q.rqNotifyPub {
		abi.StoreUint32(rec, abi.QPRecordRQNotify, v)
		q.rqNotifyPub = v
		return true
	}
	return false
}

// awaitRecv is called by w's engine when w's message found this QP's
// receive queue empty: it records w as the waiter to kick when a receive
// is posted, announces that in rq_notify, and reads rq_pi again (a
// receive posted before the announcement was not notified). It returns
// the fresh rq_pi. Precondition: rqMu held; rec is the QP's whole record
// on t, its device's table.
func (q *QP) awaitRecv(t *memmap.Table, rec []byte, w *QP) uint32 {
	q.rnrWaiter.Store(w)
	q.updateRQNotifyOn(t, rec)
	pi := abi.LoadUint32(rec, abi.QPRecordRQPI)
	if pi != q.rqCI {
		// Posted meanwhile: nobody waits after all.
		q.rnrWaiter.Store(nil)
		q.updateRQNotifyOn(t, rec)
	}
	return pi
}

// kickWaiter ends the RNR wait of the requester waiting on this QP's
// receive queue once a receive is there: it clears the waiter, then sets
// the requester's rnrKick and wakes its engine. Run by this QP's engine
// (the driver's notification after posting a receive wakes it).
// Precondition: sqMu held, rqMu not held; rec is the QP's whole record on
// t, its device's table.
func (q *QP) kickWaiter(t *memmap.Table, rec []byte) {
	if q.rnrWaiter.Load() == nil {
		return
	}
	q.rqMu.Lock()
	w := q.rnrWaiter.Load()
	if w == nil || abi.LoadUint32(rec, abi.QPRecordRQPI) == q.rqCI {
		q.rqMu.Unlock()
		return
	}
	q.rnrWaiter.Store(nil)
	q.updateRQNotifyOn(t, rec)
	q.rqMu.Unlock()
	w.rnrKick.Store(true)
	if w.Dev != nil {
		w.Dev.wakeQueue(w.DoorbellQueue)
	}
}
