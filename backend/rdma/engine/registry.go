package engine

import (
	"crypto/rand"
	"encoding/binary"
	"errors"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The registry: every object of a device (PD, MR, CQ, QP, AH, SRQ) by handle,
// with the lifetimes the objects impose on one another. The control path
// (package backend/rdma) validates commands, pins guest memory and then
// adds, looks up and removes objects here; the engine finds them here on
// the data path. There is no other table of device objects.
//
// Lifetimes: an MR, a QP, an SRQ and an AH hold their PD (RemovePD
// answers ErrBusy while any do); a QP holds its CQs (CQ.Users; the control
// path refuses DESTROY_CQ while it is not zero) and its SRQ (SRQ.Users;
// RemoveSRQ answers ErrSRQBusy).

// Registry errors.
var (
	ErrNoPD   = errors.New("no such protection domain")
	ErrPDBusy = errors.New("protection domain in use")
	// ErrGSIBusy: the device has a GSI QP already ("A device has at
	// most one: CREATE_QP of a GSI QP while one exists is BUSY").
	ErrGSIBusy = errors.New("the device has a GSI QP")
)

// PD is a protection domain.
type PD struct {
	Num   uint32 // immutable
	HW    NICPD  // the host NIC's PD (a device with a NIC; immutable)
	users int    // MRs, QPs, SRQs and AHs naming it (protected by RNIC.mu)
}

// AH is an address handle: the destination a UD send WQE names (RC QPs
// carry theirs in their attributes).
type AH struct {
	Num  uint32   // immutable
	PD   uint32   // immutable
	DGID [16]byte // immutable
	SGID [16]byte // the GID at sgid_index when the AH was created (immutable)
}

// Kind names one of the registry's tables.
type Kind int

// The registry's tables.
const (
	KindPD Kind = iota
	KindMR
	KindCQ
	KindQP
	KindAH
	KindSRQ
	// KindMW: memory windows. Their rkeys and MR keys share one space
	// of indices (NewHandle with KindMR or KindMW: bits 8–31 unique
	// among the device's MR, MW and ALLOC_MR keys).
	KindMW
)

// NewHandle returns a handle that no object of kind k holds: a sequence
// number in bits 8 … bits−1 and a random low byte, so that handles and
// keys cannot be guessed from one another. Zero is never a handle. bits is
// 9 … 32. The loop ends: a device's objects of one kind are far fewer than
// the 2^(bits−8) sequence numbers.
//
// QP numbers (KindQP; bits is 24, as a BTH carries them) are drawn
// uniformly instead (newQPN): a peer on the network, or another tenant of
// this host, that knows one of a device's QP numbers learns nothing of its
// others. They are 0 when none could be drawn.
func (d *RNIC) NewHandle(k Kind, bits uint) uint32 {
	if k == KindQP {
		return d.newQPN(bits)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var b [1]byte
	mask := uint32(1)<<(bits-8) - 1
	for {
		d.seq = (d.seq + 1) & 0xffffff
		seq := d.seq & mask
		if seq == 0 {
			continue
		}
		rand.Read(b[:])
		h := seq<<8 | uint32(b[0])
		if h != 0 && !d.takenLocked(k, h) {
			return h
		}
	}
}

// qpnTries bounds the draws of newQPN. A fabric holds far fewer QPs than
// the 2^24 numbers (the daemon's limits), so one draw in a few thousand
// collides; 64 in a row do not happen.
const qpnTries = 64

// newQPN draws a QP number uniformly from 2 … 2^bits−2 (0 and 1 name the
// special QPs of InfiniBand, 0xffffff the multicast QPN) that no QP of d
// nor of another device of the fabric holds, and reserves it on the
// fabric for d: AddQP takes it, ReleaseQPN gives it back when the QP is
// not created after all. 0: none found in qpnTries draws.
func (d *RNIC) newQPN(bits uint) uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	span := uint32(1)<<bits - 3
	var b [4]byte
	for range qpnTries {
		rand.Read(b[:])
		h := 2 + binary.LittleEndian.Uint32(b[:])%span
		if d.takenLocked(KindQP, h) {
			continue
		}
		// A number reserved and not yet added (by d too) is taken: the
		// same device must not be handed one twice.
		if d.fabric != nil && d.fabric.qpnReserved(h) {
			continue
		}
		if d.fabric == nil || d.fabric.claimQPN(d, h) {
			return h
		}
	}
	return 0
}

// ReleaseQPN gives back a QP number NewHandle reserved for a QP that was
// not added (AddQP failed). A number a QP of d holds stays taken.
func (d *RNIC) ReleaseQPN(num uint32) {
	d.mu.RLock()
	held := d.qps[num] != nil
	d.mu.RUnlock()
	if !held && d.fabric != nil {
		d.fabric.releaseQPN(d, num)
	}
}

// randomSeq is where a device's handle sequence starts: random, so that
// the handles and keys of two devices (created the same way, in the same
// order) differ, and an rkey of one device names nothing on another except
// by a 2^-32 chance.
func randomSeq() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint32(b[:]) & 0xffffff
}

// takenLocked reports whether an object of kind k holds handle h.
// Precondition: mu held.
func (d *RNIC) takenLocked(k Kind, h uint32) bool {
	switch k {
	case KindPD:
		return d.pds[h] != nil
	case KindMR, KindMW:
		i := h >> 8
		return d.mrs[h] != nil || d.mrIdx[i] > 0 || d.mws[i] != nil || d.frmrs[i] != nil
	case KindCQ:
		return d.cqs[h] != nil
	case KindQP:
		return d.qps[h] != nil
	case KindSRQ:
		return d.srqs[h] != nil
	default:
		return d.ahs[h] != nil
	}
}

// Count returns the number of objects of kind k.
func (d *RNIC) Count(k Kind) int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	switch k {
	case KindPD:
		return len(d.pds)
	case KindMR:
		// "MWs count against max_mr", and so do ALLOC_MR MRs.
		return len(d.mrs) + len(d.frmrs) + len(d.mws)
	case KindMW:
		return len(d.mws)
	case KindCQ:
		return len(d.cqs)
	case KindQP:
		return len(d.qps)
	case KindSRQ:
		return len(d.srqs)
	default:
		return len(d.ahs)
	}
}

// AddPD registers a protection domain with handle num.
// With a host NIC it allocates the host PD first; nil: the NIC refused.
func (d *RNIC) AddPD(num uint32) *PD { return d.addPDNIC(num) }

// RemovePD removes the PD with num: ErrNoPD if there is none, ErrPDBusy
// (and nothing changes) while an MR, QP or AH names it.
func (d *RNIC) RemovePD(num uint32) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pds[num]
	switch {
	case p == nil:
		return ErrNoPD
	case p.users > 0:
		return ErrPDBusy
	}
	delete(d.pds, num)
	if p.HW != nil {
		p.HW.Close()
	}
	return nil
}

// HasPD reports whether the PD num exists.
func (d *RNIC) HasPD(num uint32) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.pds[num] != nil
}

// holdPDLocked counts one more user of the PD num. Precondition: mu held.
func (d *RNIC) holdPDLocked(num uint32) error {
	p := d.pds[num]
	if p == nil {
		return ErrNoPD
	}
	p.users++
	return nil
}

// releasePDLocked counts one user less. Precondition: mu held.
func (d *RNIC) releasePDLocked(num uint32) {
	if p := d.pds[num]; p != nil && p.users > 0 {
		p.users--
	}
}

// AddMR makes m reachable by its key; it holds its PD (ErrNoPD if m.PD
// does not exist, and then nothing changes).
func (d *RNIC) AddMR(m *MR) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.holdPDLocked(m.PD); err != nil {
		return err
	}
	m.dev = d
	d.mrs[m.Key] = m
	d.mrIdx[m.Key>>8]++
	return nil
}

// RemoveMR removes and returns the MR with key, or nil (none, or a
// window is bound in it: DeregMR says which). An operation that resolved
// the key before RemoveMR may still be copying (see doc.go).
func (d *RNIC) RemoveMR(key uint32) *MR {
	m, _ := d.DeregMR(key)
	return m
}

// LookupMR returns the MR with key, or nil: an ordinary MR by its key,
// or the current registration of an ALLOC_MR MR by its current key.
func (d *RNIC) LookupMR(key uint32) *MR {
	m, _, _ := d.lookupLKey(key)
	return m
}

// AddCQ makes c reachable by its number. c.Dev must be d.
func (d *RNIC) AddCQ(c *CQ) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.cqs[c.Num] = c
}

// RemoveCQ removes and returns the CQ with num, or nil. Later completions
// for it are dropped.
func (d *RNIC) RemoveCQ(num uint32) *CQ {
	d.mu.Lock()
	c := d.cqs[num]
	delete(d.cqs, num)
	d.mu.Unlock()
	if c != nil {
		c.mu.Lock()
		c.dead = true
		c.armed = false
		c.mu.Unlock()
		c.closeNIC()
	}
	return c
}

// LookupCQ returns the CQ with num, or nil.
func (d *RNIC) LookupCQ(num uint32) *CQ {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.cqs[num]
}

// AddQP makes q reachable by its number and by the engine of
// q.DoorbellQueue; it holds its PD (ErrNoPD if q.PD does not exist, and
// then nothing changes) and its CQs (Users). A GSI QP (q.GSI) becomes
// the device's QP 1 (GSI), ErrGSIBusy while it has one. q starts in RESET.
// q.Dev must be d.
func (d *RNIC) AddQP(q *QP) error {
	q.mu.Lock()
	q.attr = abi.QPAttr{QPN: q.Num, QPState: abi.QPSReset}
	q.peer = nil
	q.dead = false
	q.mu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if q.GSI && d.gsi != nil {
		return ErrGSIBusy
	}
	if err := d.holdPDLocked(q.PD); err != nil {
		return err
	}
	if q.GSI {
		d.gsi = q
	}
	if q.SendCQ != nil {
		q.SendCQ.Users.Add(1)
	}
	if q.RecvCQ != nil {
		q.RecvCQ.Users.Add(1)
	}
	if q.SRQ != nil {
		q.SRQ.Users.Add(1)
	}
	d.qps[q.Num] = q
	if d.fabric != nil {
		// A number taken on another device (only a caller choosing its
		// own can collide) stays usable on this host; connecting it
		// over the network then fails.
		d.fabric.claimQPN(d, q.Num)
	}
	old := d.byDBQ[q.DoorbellQueue]
	list := make([]*QP, len(old), len(old)+1)
	copy(list, old)
	d.byDBQ[q.DoorbellQueue] = append(list, q)
	return nil
}

// RemoveQP destroys the QP with num and returns it, or nil. Peers stop
// reaching it at once; RemoveQP then waits for the engine's current pass
// over it and for in-flight remote operations on it to end (both are
// bounded), so nothing touches its rings or CQs after it returns. It
// releases its PD and its CQs. The caller must not hold a lock that
// EventSink or wake take.
func (d *RNIC) RemoveQP(num uint32) *QP {
	q := d.removeQP(num)
	if q != nil && q.HW != nil {
		q.sqMu.Lock()
		q.rqMu.Lock()
		q.hwRelease()
		q.rqMu.Unlock()
		q.sqMu.Unlock()
		// No pass runs on it and no completion of it is written any
		// more (dead, under sqMu and rqMu): the host QP goes.
		if err := q.HW.Close(); err != nil {
			d.log.WithError(err).WithField("qp", q.Num).Warn("destroy host QP")
		}
	}
	return q
}

// removeQP is RemoveQP but for the host QP.
func (d *RNIC) removeQP(num uint32) *QP {
	d.mu.Lock()
	q := d.qps[num]
	if q == nil {
		d.mu.Unlock()
		return nil
	}
	delete(d.qps, num)
	if d.gsi == q {
		d.gsi = nil
	}
	if d.fabric != nil {
		d.fabric.releaseQPN(d, num)
	}
	d.gen.Add(1)
	d.releasePDLocked(q.PD)
	old := d.byDBQ[q.DoorbellQueue]
	list := make([]*QP, 0, len(old))
	for _, o := range old {
		if o != q {
			list = append(list, o)
		}
	}
	if len(list) == 0 {
		delete(d.byDBQ, q.DoorbellQueue)
	} else {
		d.byDBQ[q.DoorbellQueue] = list
	}
	d.mu.Unlock()

	q.sqMu.Lock()
	defer q.sqMu.Unlock()
	q.closeNet()
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return q
	}
	q.dead = true
	q.ciRelease() // "the device neither reads the QP's rings and record nor writes its CQs again"
	q.peer = nil
	if q.rnrTimer != nil {
		q.rnrTimer.Stop()
	}
	if q.SendCQ != nil {
		q.SendCQ.Users.Add(-1)
	}
	if q.RecvCQ != nil {
		q.RecvCQ.Users.Add(-1)
	}
	if q.SRQ != nil {
		q.SRQ.Users.Add(-1)
	}
	q.srqStash = nil
	return q
}

// GSI returns the device's GSI QP, or nil.
func (d *RNIC) GSI() *QP {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.gsi
}

// LookupQP returns the QP with num, or nil.
func (d *RNIC) LookupQP(num uint32) *QP {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.qps[num]
}

// AddAH registers a; it holds its PD (ErrNoPD if a.PD does not exist).
func (d *RNIC) AddAH(a *AH) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.holdPDLocked(a.PD); err != nil {
		return err
	}
	d.ahs[a.Num] = a
	return nil
}

// LookupAH returns the AH with num, or nil.
func (d *RNIC) LookupAH(num uint32) *AH {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.ahs[num]
}

// RemoveAH removes and returns the AH with num, or nil.
func (d *RNIC) RemoveAH(num uint32) *AH {
	d.mu.Lock()
	defer d.mu.Unlock()
	a := d.ahs[num]
	if a != nil {
		delete(d.ahs, num)
		d.releasePDLocked(a.PD)
	}
	return a
}

// queueQPs returns the QPs of doorbell queue dbq (an immutable slice).
func (d *RNIC) queueQPs(dbq int) []*QP {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.byDBQ[dbq]
}

// allQPs returns a snapshot of every QP.
func (d *RNIC) allQPs() []*QP {
	d.mu.RLock()
	defer d.mu.RUnlock()
	qs := make([]*QP, 0, len(d.qps))
	for _, q := range d.qps {
		qs = append(qs, q)
	}
	return qs
}

// Released is what Reset removed from the registry, for the control path
// to release the memory they pinned.
type Released struct {
	QPs  []*QP
	SRQs []*SRQ
	CQs  []*CQ
	MRs  []*MR
}

// Reset destroys every object: every QP first (peers' QPs connected to
// them move to ERR, and their outstanding send WQEs complete with
// RETRY_EXC_ERR), then every SRQ (no QP uses one any more), CQ, MR, AH
// and PD. It returns what held pinned guest memory.
func (d *RNIC) Reset() Released {
	var rel Released
	rel.QPs = d.allQPs()
	d.loseQPs(rel.QPs)
	for _, q := range rel.QPs {
		d.RemoveQP(q.Num)
	}
	d.mu.RLock()
	rel.SRQs = make([]*SRQ, 0, len(d.srqs))
	for _, s := range d.srqs {
		rel.SRQs = append(rel.SRQs, s)
	}
	d.mu.RUnlock()
	for _, s := range rel.SRQs {
		d.RemoveSRQ(s.Num) // not busy: its QPs went above
	}
	d.mu.Lock()
	rel.CQs = make([]*CQ, 0, len(d.cqs))
	for _, c := range d.cqs {
		rel.CQs = append(rel.CQs, c)
	}
	d.mu.Unlock()
	for _, c := range rel.CQs {
		d.RemoveCQ(c.Num)
	}
	d.mu.Lock()
	rel.MRs = make([]*MR, 0, len(d.mrs))
	for _, m := range d.mrs {
		rel.MRs = append(rel.MRs, m)
	}
	clear(d.mrs)
	clear(d.mrIdx)
	mws, frs := d.takeKeyedLocked()
	d.gen.Add(1)
	clear(d.ahs)
	pds := make([]*PD, 0, len(d.pds))
	for _, p := range d.pds {
		pds = append(pds, p)
	}
	clear(d.pds)
	d.mu.Unlock()
	killKeyed(mws, frs)
	// The host NIC's objects go in dependency order: QPs and CQs went
	// above, MRs before their PDs.
	for _, m := range rel.MRs {
		m.closeNIC()
	}
	for _, p := range pds {
		if p.HW != nil {
			p.HW.Close()
		}
	}
	return rel
}
