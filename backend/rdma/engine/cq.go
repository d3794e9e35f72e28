package engine

import (
	"encoding/binary"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// putCQE encodes e into a CQ slot (at least CQESize bytes).
func putCQE(b []byte, e *abi.CQE) {
	_ = b[abi.CQESize-1]
	binary.LittleEndian.PutUint64(b[0:], e.WRID)
	b[8] = uint8(e.Status)
	b[9] = e.Opcode
	binary.LittleEndian.PutUint16(b[10:], e.WCFlags)
	binary.LittleEndian.PutUint32(b[12:], e.QPNum)
	binary.LittleEndian.PutUint32(b[16:], e.ByteLen)
	binary.LittleEndian.PutUint32(b[20:], e.ImmData)
	binary.LittleEndian.PutUint32(b[24:], e.SrcQP)
	binary.LittleEndian.PutUint32(b[28:], e.VendorErr)
}

// Outcomes of CQ.push.
const (
	pushOK      = iota // written
	pushDropped        // CQ destroyed, already in overrun, or its memory is gone
	pushOverrun        // the CQ just overflowed: the caller raises CQ_ERROR
)

// CQRecordSize is the size of a CQ's record: abi.CQArmRecordSize for a CQ
// armed through its record, else abi.CQRecordSize.
func CQRecordSize(armRecord bool) uint64 {
	if armRecord {
		return abi.CQArmRecordSize
	}
	return abi.CQRecordSize
}

// InitArm reads the record's arm word as the one the device has acted on
// (spec: "The device reads arm when the CQ is created and remembers it"), so
// whatever the word held before does not count as an arm. t is the table of
// c.Dev; call it before the CQ is reachable.
func (c *CQ) InitArm(t *memmap.Table) {
	if !c.ArmRecord || t == nil {
		return
	}
	if rec, err := t.Slice(c.Record, abi.CQArmRecordSize); err == nil {
		c.armSeen = abi.LoadUint32(rec, abi.CQRecordArm)
	}
}

// push writes e into the CQ's next slot and advances the record's pi.
// t is the table of c.Dev. It reports whether the armed CQ fired (the
// caller posts CQ_COMPLETION) and the outcome. Never panics on bad guest
// state (other than memory faults, which the caller's Guard contains);
// c.mu is released by defer.
//
// Spec: "When pi − ci equals cqe the CQ is full: a completion that finds it
// full is lost, the CQ is in overrun".
//
// With lazy (the QP whose WQE completes), the record's pi is not stored
// unless the CQ fires (an event must find its entry visible): the caller
// publishes it with publish before it lets go of the table, once for a
// batch of completions, so the driver polling pi sees one cache-line write
// per batch, not per CQE. The caller has raised lazy's done index over the
// WQE; the QP is listed so that whoever stores pi stores that index first
// (ci.go). Without lazy, the caller has stored the consumer index itself.
func (c *CQ) push(t *memmap.Table, e *abi.CQE, solicited bool, lazy *QP) (fire bool, outcome int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead || c.overrun || t == nil {
		return false, pushDropped
	}
	rec, err := t.Slice(c.Record, CQRecordSize(c.ArmRecord))
	if err != nil {
		return false, pushDropped
	}
	if c.pi-c.ciSeen >= c.Ring.Depth {
		// Full as far as the device last looked: read the driver's ci
		// again. Only then: ci is on the cache line the driver writes
		// as it polls, and reading it per CQE bounced the line between
		// the driver's core and the engine's.
		c.ciSeen = abi.LoadUint32(rec, abi.CQRecordCI)
		if c.pi-c.ciSeen >= c.Ring.Depth {
			// Full (or a ci the driver moved past pi, which is as broken).
			c.overrun = true
			c.armed = false
			return false, pushOverrun
		}
	}
	slot, err := c.Ring.Slot(t, c.pi)
	if err != nil || len(slot) < abi.CQESize {
		return false, pushDropped
	}
	putCQE(slot, e)
	t.MarkDirty(c.Ring.slotGPA(c.pi), abi.CQESize)
	c.pi++
	c.written++
	qualifies := solicited || e.Status != abi.WCSuccess
	c.pendAny = true
	c.pendSolicited = c.pendSolicited || qualifies
	if c.armed && (!c.solicitedOnly || qualifies) {
		c.armed = false
		fire = true
	}
	if lazy != nil {
		c.listLazy(t, lazy)
		if !fire {
			c.unpublished = true
			return false, pushOK
		}
	}
	return c.storePILocked(t, rec) || fire, pushOK
}

// storePILocked stores pi into the record rec (on t, the table of c.Dev),
// after the consumer indices of the QPs listed as lazy, and then, for a CQ
// armed through its record, reads the arm word: spec, "it advances pi
// (release), issues a full barrier and then reads arm". It reports whether
// the record arm fired. abi.StoreUint32 is sequentially consistent, which
// is the barrier. Precondition: c.mu held.
func (c *CQ) storePILocked(t *memmap.Table, rec []byte) (fire bool) {
	c.storeListedCI(t)
	abi.StoreUint32(rec, abi.CQRecordPI, c.pi)
	t.MarkDirty(c.Record+abi.CQRecordPI, 4)
	c.unpublished = false
	pending, sol := c.pendAny, c.pendSolicited
	c.pendAny, c.pendSolicited = false, false
	if !c.ArmRecord || !pending {
		return false
	}
	arm := abi.LoadUint32(rec, abi.CQRecordArm)
	if arm>>abi.CQArmSeqShift == c.armSeen>>abi.CQArmSeqShift {
		return false
	}
	if arm&abi.CQArmSolicited != 0 && !sol {
		return false // still armed, for a solicited or error completion
	}
	c.armSeen = arm
	return true
}

// publish stores the CQ's pi into its record if lazy pushes advanced it,
// and reports whether the CQ fired (the caller posts CQ_COMPLETION).
// t is the table of c.Dev.
func (c *CQ) publish(t *memmap.Table) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.publishLocked(t)
}

// publishNotify is publish, then the CQ_COMPLETION event if it fired.
func (c *CQ) publishNotify(t *memmap.Table) {
	if c.publish(t) && c.Dev != nil {
		c.Dev.postEvent(abi.EventCQCompletion, c.Num)
	}
}

// publishLocked is publish with c.mu held.
func (c *CQ) publishLocked(t *memmap.Table) bool {
	if !c.unpublished || c.dead || t == nil {
		return false
	}
	c.unpublished = false
	if rec, err := t.Slice(c.Record, CQRecordSize(c.ArmRecord)); err == nil {
		return c.storePILocked(t, rec)
	}
	return false
}

// Arm applies REQ_NOTIFY_CQ: the next completion written to the CQ (only a
// solicited or error one if solicitedOnly) posts one CQ_COMPLETION event,
// after which the CQ is disarmed. If the CQ holds unconsumed entries (pi ≠
// ci) the event is posted at once and the CQ stays disarmed.
func (c *CQ) Arm(solicitedOnly bool) {
	var t *memmap.Table
	if c.Dev != nil {
		t = c.Dev.acquire()
	}
	if t != nil {
		defer t.Release()
	}
	fire := false
	func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.dead {
			return
		}
		c.armed, c.solicitedOnly = true, solicitedOnly
		if t == nil {
			return
		}
		if c.publishLocked(t) {
			fire = true // the record's arm fired for what was unpublished
		}
		rec, err := t.Slice(c.Record, abi.CQRecordSize)
		if err != nil {
			return
		}
		if abi.LoadUint32(rec, abi.CQRecordCI) != c.pi {
			c.armed = false
			fire = true
		}
	}()
	if fire && c.Dev != nil {
		c.Dev.postEvent(abi.EventCQCompletion, c.Num)
	}
}

// complete writes e to c (a CQ of device cd, whose table is t) and handles
// what follows: the CQ_COMPLETION event of an armed CQ, or on overrun the
// CQ_ERROR event and every QP using c moving to ERR. It counts error
// completions. Called with no CQ lock held.
func (cd *RNIC) complete(c *CQ, t *memmap.Table, e *abi.CQE, solicited bool) {
	cd.completeLazy(c, t, e, solicited, nil)
}

// completeLazy is complete with push's lazy publication of pi for the QP
// lazy, if not nil (see push).
func (cd *RNIC) completeLazy(c *CQ, t *memmap.Table, e *abi.CQE, solicited bool, lazy *QP) {
	if e.Status != abi.WCSuccess {
		if int(e.Status) < maxWCStatus {
			cd.wcErrors[e.Status].Add(1)
		}
		cd.countCompletionError(c, e)
	}
	if c == nil {
		return
	}
	fire, outcome := c.push(t, e, solicited, lazy)
	if fire {
		cd.postEvent(abi.EventCQCompletion, c.Num)
	}
	if outcome != pushOK {
		c.lostCQEs.Add(1)
	}
	if outcome != pushOverrun {
		return
	}
	cd.postEvent(abi.EventCQError, c.Num)
	for _, q := range cd.allQPs() {
		if q.SendCQ == c || q.RecvCQ == c {
			q.toErr(false)
		}
	}
}
