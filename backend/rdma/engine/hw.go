package engine

import (
	"sync/atomic"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The data path of a device whose work runs on a host NIC (nic.go).
//
// A pass over a QP (PollBudget, under sqMu) posts the receive WQEs the
// driver added (INIT, RTR, RTS) and the send WQEs (RTS) to the host QP, as
// one chain each, and then polls the host CQs of the QP's CQs. A send WQE
// is copied and validated once, as for the software RNIC; its SGEs and
// remote address go to the NIC unchanged (the MRs are registered at the
// guest's addresses), so the engine neither translates nor checks keys:
// the NIC does. sq_ci advances when a WQE is posted (its slot is free: the
// engine keeps what the completion needs in hwQP.sq) and is stored before
// the post, so no CQE can show a WQE the record does not; rq_ci advances
// when a receive completes (in order, as RC receives do), before its CQE.
//
// Completions: every host CQ is kept armed by the NIC, whose notify wakes
// the device's doorbell queues; a pass polls the host CQs of its QPs
// (CQ.hwMu: one poller per host CQ at a time) and writes each completion
// as the guest CQ's entry, under the QP's rqMu, so that once RemoveQP
// returns no completion of the QP reaches a CQ. A host wr_id carries the
// ring index, the queue and the QP's generation (bumped at RESET), so a
// completion of a post from before a RESET is recognised and dropped.
//
// Room on the host CQs: a host CQ that overflows is lost with every QP on
// it, and every host work request completes into one (sends are all
// signaled, see below), while the guest sized its CQ for the completions
// it asked for. So each CQ keeps its host CQ's room (CQ.hwFree): a pass
// posts a work request only after taking a slot of its CQ, an accepted
// completion gives it back, and what a RESET or DESTROY_QP drops without
// completions is given back then (a stale completion polled later gives
// nothing back: hwRelease).
//
// Every host send work request is signaled: the engine learns of each
// WQE's end (its host slot is free again, and in ERR it knows when the
// host has flushed everything posted), and writes a CQE only for those the
// guest signaled (or an error). The cost is a host completion per WQE,
// polled in batches; selective signaling on the host would save the NIC
// those writes but leaves the engine unable to tell an unsignaled WQE that
// succeeded from one still in flight when the QP fails.
//
// ERR: the host QP moves to ERR with the device's QP and flushes what was
// posted; once all of that has completed, the engine flushes what it had
// taken from the rings but not posted, then the rest of the rings, in
// order (flush).

// hwBatch bounds the WQEs of one chain and the completions of one poll.
const hwBatch = 64

// hwSlot is what the engine keeps of a posted send WQE until it completes.
type hwSlot struct {
	wrID uint64
	len  uint32
	op   uint8
	want bool // the guest asked for a CQE (signaled, or sq_sig_all)
	bad  bool // failed validation: never posted, completes with LOC_QP_OP_ERR
}

// hwQP is a NIC QP's engine-side state.
type hwQP struct {
	gen      uint32        // generation, bumped at RESET (protected by sqMu and rqMu: both held to write)
	sqPosted uint32        // send ring index up to which WQEs were posted (protected by sqMu)
	sqDone   atomic.Uint32 // send ring index up to which WQEs completed (written by the CQ poller)
	rqPosted uint32        // receive ring index up to which WQEs were posted (protected by sqMu)
	sq       []hwSlot      // by send ring index mod depth
	rq       []uint64      // receive wr_ids by ring index mod depth (written by the pass, read by the poller)
	full     atomic.Bool   // the pass stopped at a full host send queue: a completion wakes it

	sends []NICSendWR // chain scratch (protected by sqMu)
	recvs []NICRecvWR
	sges  []abi.SGE
	wqe   [abi.PageSize]byte // a WQE's copy
}

// wr_id of a host work request: bit 63 receive, bits 32–55 the QP's
// generation, bits 0–31 the ring index.
const (
	hwRecvBit = 1 << 63
	hwGenMask = 1<<24 - 1
)

func hwWRID(recv bool, gen, idx uint32) uint64 {
	id := uint64(gen&hwGenMask)<<32 | uint64(idx)
	if recv {
		id |= hwRecvBit
	}
	return id
}

// pollNIC is pollLocked for a QP on a host NIC. Precondition: sqMu held;
// rec is the QP's record on t.
func (q *QP) pollNIC(t *memmap.Table, rec []byte, b *Budget) (worked bool) {
	q.mu.Lock()
	st, dead := q.attr.QPState, q.dead
	q.mu.Unlock()
	if dead {
		return false
	}
	switch st {
	case abi.QPSInit, abi.QPSRTR:
		worked = q.postRecvNIC(t, rec)
	case abi.QPSRTS:
		worked = q.postRecvNIC(t, rec)
		worked = q.postSendNIC(t, rec, b) || worked
	}
	worked = q.Dev.pollCQNIC(q.SendCQ, t) || worked
	if q.RecvCQ != q.SendCQ {
		worked = q.Dev.pollCQNIC(q.RecvCQ, t) || worked
	}
	if st == abi.QPSErr {
		worked = q.flushNIC(t, rec) || worked
	}
	return worked
}

// postRecvNIC posts the receive WQEs between what was posted and rq_pi.
func (q *QP) postRecvNIC(t *memmap.Table, rec []byte) bool {
	h := q.hw
	pi := abi.LoadUint32(rec, abi.QPRecordRQPI)
	q.rqMu.Lock()
	ci := q.rqCI
	q.rqMu.Unlock()
	if pi-ci > q.RQ.Depth {
		q.toErr(true) // "a producer index more than the depth ahead"
		return true
	}
	n, nsge := 0, 0
	maxSGE := int(min(q.MaxRecvSGE, maxRecvSGEs))
	for h.rqPosted != pi && n < len(h.recvs) && nsge+maxSGE <= len(h.sges) && q.RecvCQ.hwTakeOrWait() {
		slot, err := q.RQ.Slot(t, h.rqPosted)
		if err != nil {
			q.RecvCQ.hwFree.Add(1)
			q.toErr(true)
			return true
		}
		k := copy(h.wqe[:], slot)
		wrID, ns, ok := decodeRecv(h.wqe[:k], uint32(maxSGE), h.sges[nsge:nsge+maxSGE])
		if !ok {
			// A malformed receive WQE breaks its QP (the NIC cannot be
			// given it, and the ones after it must wait for it).
			q.RecvCQ.hwFree.Add(1)
			q.toErr(true)
			break
		}
		h.rq[h.rqPosted%q.RQ.Depth] = wrID
		h.recvs[n] = NICRecvWR{WRID: hwWRID(true, h.gen, h.rqPosted), FirstSGE: uint32(nsge), NumSGE: uint32(ns)}
		nsge += ns
		n++
		h.rqPosted++
	}
	if n == 0 {
		return false
	}
	if posted, err := q.HW.PostRecv(h.recvs[:n], h.sges[:nsge]); err != nil || posted != n {
		h.rqPosted -= uint32(n - posted)
		q.RecvCQ.hwFree.Add(int64(n - posted))
		q.Dev.log.WithError(err).WithField("qp", q.Num).Warn("host NIC refused receive WQEs")
		q.toErr(true)
	}
	return true
}

// postSendNIC posts the send WQEs between sq_ci and sq_pi, while the host
// send queue has room and the budget lasts. Precondition: sqMu held; RTS.
func (q *QP) postSendNIC(t *memmap.Table, rec []byte, b *Budget) bool {
	h := q.hw
	pi := q.sqPISeen
	if pi-q.sqCI-1 >= q.SQ.Depth {
		pi = abi.LoadUint32(rec, abi.QPRecordSQPI)
		q.sqPISeen = pi
	}
	if pi == q.sqCI {
		return false
	}
	if pi-q.sqCI > q.SQ.Depth {
		q.toErr(true)
		return true
	}
	n, nsge := 0, 0
	maxSGE := int(min(q.MaxSendSGE, maxSendSGEs))
	failed, bad := false, false
	for q.sqCI != pi && n < len(h.sends) && nsge+maxSGE <= len(h.sges) && !b.spent() {
		if q.sqCI-h.sqDone.Load() >= q.SQ.Depth {
			h.full.Store(true)
			if q.sqCI-h.sqDone.Load() >= q.SQ.Depth {
				break
			}
			h.full.Store(false)
		}
		if !q.SendCQ.hwTakeOrWait() {
			break
		}
		idx := q.sqCI
		slot, err := q.SQ.Slot(t, idx)
		if err != nil {
			q.SendCQ.hwFree.Add(1)
			q.toErr(true)
			failed = true
			break
		}
		k := copy(h.wqe[:], slot)
		w, ok := decodeSend(h.wqe[:k], false, uint32(maxSGE), q.MaxInline, h.sges[nsge:nsge+maxSGE])
		if w.opcode > abi.WROpAtomicFetchAdd {
			ok = false // memory windows and fast registration: not on a host NIC
		}
		if !ok {
			// Completes with LOC_QP_OP_ERR after what was posted
			// before it (flushNIC), and the QP enters ERR.
			h.sq[idx%q.SQ.Depth] = hwSlot{wrID: w.wrID, op: w.opcode, want: true, bad: true}
			q.SendCQ.hwFree.Add(1) // never posted
			q.sqCI++
			bad = true
			break
		}
		var total uint64
		wr := &h.sends[n]
		*wr = NICSendWR{
			RemoteAddr: w.remoteAddr, CompareAdd: w.compareAdd, Swap: w.swap, RKey: w.rkey, Imm: w.imm,
			Opcode: w.opcode, Flags: w.flags &^ abi.WRFlagSignaled,
		}
		if w.flags&abi.WRFlagInline != 0 {
			// The inline bytes are read from the ring by the post (the
			// NIC copies them); a guest changing them meanwhile
			// changes only its own message.
			wr.Inline, wr.InlineLen = memmap.HostAddr(slot[abi.SendWQEHdrSize:]), w.inlineLen
			total = uint64(w.inlineLen)
		} else {
			wr.FirstSGE, wr.NumSGE = uint32(nsge), w.numSGE
			for _, s := range h.sges[nsge : nsge+int(w.numSGE)] {
				total += uint64(s.Length)
			}
			nsge += int(w.numSGE)
		}
		want := w.flags&abi.WRFlagSignaled != 0 || q.SigAll
		wr.Flags |= abi.WRFlagSignaled
		wr.WRID = hwWRID(false, h.gen, idx)
		h.sq[idx%q.SQ.Depth] = hwSlot{wrID: w.wrID, len: uint32(min(total, 1<<32-1)), op: w.opcode, want: want}
		q.sqCI++
		n++
		b.Ops--
		b.Bytes -= int64(total) + b.OpCost
		b.Moved += total
	}
	// The slots are free: the record says so before any completion of
	// theirs can be written.
	if q.sqCI != q.sqCIPub {
		q.setCIOn(t, sqIdx, rec, q.sqCI)
		q.sqCIPub = q.sqCI
	}
	if n > 0 {
		posted, err := q.HW.PostSend(h.sends[:n], h.sges[:nsge])
		h.sqPosted += uint32(posted)
		q.SendCQ.hwFree.Add(int64(n - posted))
		if err != nil || posted != n {
			q.Dev.log.WithError(err).WithField("qp", q.Num).Warn("host NIC refused send WQEs")
			q.toErr(true)
		}
	}
	if bad {
		// After the chain before it went to the NIC.
		q.toErr(false)
	}
	return n > 0 || failed || bad
}

// pollCQNIC writes the completions of c's host CQ as c's entries.
func (d *RNIC) pollCQNIC(c *CQ, t *memmap.Table) (worked bool) {
	if c == nil || !c.hwMu.TryLock() {
		return false
	}
	defer c.hwMu.Unlock()
	if c.HW == nil {
		return false
	}
	for range 4 {
		n, err := c.HW.Poll(c.hwWC)
		if err != nil {
			d.log.WithError(err).WithField("cq", c.Num).Warn("host CQ poll")
			return worked
		}
		for i := range n {
			d.completeNIC(c, t, &c.hwWC[i])
		}
		if n > 0 && c.hwWaiting.Swap(false) {
			d.wakeAll() // a pass stopped at the full host CQ
		}
		worked = worked || n > 0
		if n < len(c.hwWC) {
			break
		}
	}
	return worked
}

// completeNIC writes one host completion as the entry of the guest CQ c.
func (d *RNIC) completeNIC(c *CQ, t *memmap.Table, wc *NICWC) {
	q := d.LookupQP(wc.QPNum)
	if q == nil || q.hw == nil {
		return // its QP was destroyed
	}
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	q.mu.Lock()
	dead := q.dead
	q.mu.Unlock()
	h := q.hw
	if dead || uint32(wc.WRID>>32)&hwGenMask != h.gen&hwGenMask {
		return // destroyed, or posted before a RESET
	}
	idx := uint32(wc.WRID)
	e := abi.CQE{Status: wc.Status, QPNum: q.Num, VendorErr: wc.VendorErr}
	if wc.WRID&hwRecvBit != 0 {
		if q.RecvCQ != c {
			return
		}
		c.hwFree.Add(1)
		rec, err := t.Slice(q.Record, QPRecordSize(q.RQNotify))
		if err != nil {
			return
		}
		e.WRID, e.Opcode, e.WCFlags = h.rq[idx%q.RQ.Depth], wc.Opcode, wc.WCFlags
		e.ByteLen, e.ImmData, e.SrcQP = wc.ByteLen, wc.Imm, wc.SrcQP
		q.rqCI = idx + 1
		q.setCIOn(t, rqIdx, rec, q.rqCI)
		// Receive completions count as solicited: the host does not say
		// which were, and an extra event is safe where a missing one
		// is not.
		d.complete(c, t, &e, true)
		if wc.Status != abi.WCSuccess && wc.Status != abi.WCWRFlushErr {
			q.toErr(false)
		}
		return
	}
	if q.SendCQ != c {
		return
	}
	c.hwFree.Add(1)
	s := h.sq[idx%q.SQ.Depth]
	h.sqDone.Store(idx + 1)
	if wc.Status == abi.WCSuccess {
		d.ops[s.op%uint8(len(d.ops))].Add(1)
		d.bytesMoved.Add(uint64(s.len))
		if h.full.Swap(false) {
			q.Dev.wakeQueue(q.DoorbellQueue) // the host queue has room again
		}
		if !s.want {
			return
		}
		e.ByteLen = s.len
	}
	e.WRID, e.Opcode = s.wrID, wcOpcode(s.op)
	d.complete(c, t, &e, false)
	if wc.Status != abi.WCSuccess && wc.Status != abi.WCWRFlushErr {
		q.toErr(false)
	}
}

// flushNIC completes, once the host has completed (flushed) everything
// posted to it, what the engine took from the rings without posting, and
// then the rings' remainder (flush). Precondition: sqMu held; ERR.
func (q *QP) flushNIC(t *memmap.Table, rec []byte) bool {
	h := q.hw
	q.rqMu.Lock()
	recvDone := q.rqCI == h.rqPosted
	q.rqMu.Unlock()
	if h.sqDone.Load() != h.sqPosted || !recvDone {
		return false // the host's flush completions are on their way
	}
	n := 0
	for h.sqPosted != q.sqCI {
		s := h.sq[h.sqPosted%q.SQ.Depth]
		status := abi.WCWRFlushErr
		if s.bad {
			status = abi.WCLocQPOpErr
		}
		h.sqPosted++
		h.sqDone.Store(h.sqPosted)
		q.Dev.complete(q.SendCQ, t, &abi.CQE{WRID: s.wrID, Status: status, Opcode: wcOpcode(s.op), QPNum: q.Num}, false)
		n++
	}
	n += q.flush(t, rec, pollBudget)
	q.rqMu.Lock()
	h.rqPosted = q.rqCI
	q.rqMu.Unlock()
	h.sqPosted = q.sqCI
	h.sqDone.Store(q.sqCI)
	return n > 0
}
