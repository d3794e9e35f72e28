package engine

import (
	"errors"
	"fmt"
	"slices"

	"github.com/vrdma/vrdma/memmap"
)

// Handing a device's objects over to another process (live upgrade of
// vrdmad; package backend/rdma, DeviceState). The control path rebuilds
// each object in the new process through the functions that build it for
// a guest's command (with the handle it had: ClaimHandle) and then gives
// it what it holds beyond its creation parameters, exported here as plain
// data: a CQ's producer index and arm state (CQState), an SRQ's consumer
// index and limit (SRQState), a QP's attributes, ring positions, RNR and
// lost-peer state (QPState) and, for a QP connected over the network, its
// transport's (NetQPState, state_net.go), the device's counters
// (CountersState).
//
// What is not carried, and why that is safe: a QP's scratch (the head send
// WQE decoded during an RNR wait: it is still in the ring at sq_ci and is
// read again), the RNR deadline (the head WQE is retried at once; rnrTries
// is kept), the waiter lists of an RQ or SRQ (requesters retry at once,
// and wait again if there is still no receive: the notify words keep
// their values), the key cache. Every export runs on a quiesced device
// (no engine pass, no command) with the network frozen (no transport
// goroutine), every import on a device that nothing runs on yet.

// ErrState is a state an import refuses (a value out of range, a
// reference that does not resolve); wrapped with what is wrong.
var ErrState = errors.New("invalid device state")

func stateErr(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrState}, a...)...)
}

// Transferable reports why the device's objects cannot be handed over by
// this version (nil: they can): a host NIC, a QP connected over the
// network by multipath (spray), a memory window or an ALLOC_MR MR. A UD QP
// attached to the network is transferable (it is attached again:
// ReattachUD), and so is a QP connected over plain RoCEv2 (its transport's
// state is carried: state_net.go).
func (d *RNIC) Transferable() error {
	if d.NIC() != nil {
		return errors.New("the device runs on a host NIC")
	}
	d.mu.RLock()
	nmw, nfr := len(d.mws), len(d.frmrs)
	qs := make([]*QP, 0, len(d.qps))
	for _, q := range d.qps {
		qs = append(qs, q)
	}
	d.mu.RUnlock()
	if nmw > 0 {
		return fmt.Errorf("%d memory windows", nmw)
	}
	if nfr > 0 {
		return fmt.Errorf("%d fast-registration (ALLOC_MR) MRs", nfr)
	}
	for _, q := range qs {
		q.mu.Lock()
		err := q.netTransferableLocked()
		q.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// ClaimHandle takes handle h of kind k for an object being imported, as
// NewHandle would have drawn it: false if h is not a handle NewHandle
// could return for bits (zero, too wide, a QP number 0, 1 or 0xffffff) or
// an object holds it (for a QP number: any device of the fabric; a number
// a Handoff gave d is d's to claim).
func (d *RNIC) ClaimHandle(k Kind, h uint32, bits uint) bool {
	if h == 0 || (bits < 32 && h>>bits != 0) {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if k == KindQP {
		if h < 2 || h >= 1<<bits-1 || d.takenLocked(KindQP, h) {
			return false
		}
		if d.fabric != nil && !d.fabric.takeHanded(d, h) && (d.fabric.qpnReserved(h) || !d.fabric.claimQPN(d, h)) {
			return false
		}
		return true
	}
	if h>>8 == 0 {
		return false // NewHandle's sequence numbers start at 1
	}
	return !d.takenLocked(k, h)
}

// HandleSeq returns the position of the device's handle sequence.
func (d *RNIC) HandleSeq() uint32 {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.seq
}

// SetHandleSeq sets it (an import): handles drawn afterwards continue the
// exporting process's sequence. Only its low 24 bits are used.
func (d *RNIC) SetHandleSeq(seq uint32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq = seq & 0xffffff
}

// Quiesced makes the records show everything the engine did: every CQ's
// lazily pushed pi and every QP's consumer indices are stored (a pass
// publishes at its end, so this normally stores nothing). A CQ armed
// through its record that fires here posts its event, as the pass would
// have. Precondition: no engine pass runs on the device; t is its table.
func (d *RNIC) Quiesced(t *memmap.Table) {
	if t == nil {
		return
	}
	d.mu.RLock()
	cqs := make([]*CQ, 0, len(d.cqs))
	for _, c := range d.cqs {
		cqs = append(cqs, c)
	}
	qs := make([]*QP, 0, len(d.qps))
	for _, q := range d.qps {
		qs = append(qs, q)
	}
	d.mu.RUnlock()
	for _, q := range qs {
		q.sqMu.Lock()
		if q.sqCI != q.sqCIPub {
			q.ciDone[sqIdx].Store(q.sqCI)
			q.sqCIPub = q.sqCI
		}
		q.sqMu.Unlock()
		q.storeCIOn(t)
	}
	for _, c := range cqs {
		c.publishNotify(t)
	}
}

// CQState is what a CQ holds beyond CREATE_CQ's parameters.
type CQState struct {
	// PI is the next CQE index (free-running; the record's pi).
	PI uint32 `json:"pi"`
	// Written counts the CQEs written since creation.
	Written uint64 `json:"written"`
	// CISeen is the record's ci as the device last read it.
	CISeen uint32 `json:"ci_seen"`
	// Armed: a REQ_NOTIFY_CQ is pending; SolicitedOnly: for a solicited
	// or error completion only.
	Armed         bool `json:"armed"`
	SolicitedOnly bool `json:"solicited_only"`
	// ArmSeen is the record's arm word the device last acted on (a CQ
	// armed through its record).
	ArmSeen uint32 `json:"arm_seen"`
	// Overrun: the CQ overflowed and takes no more CQEs.
	Overrun bool `json:"overrun"`
	// ErrorCQEs and LostCQEs are the CQ's error counters.
	ErrorCQEs uint64 `json:"error_cqes"`
	LostCQEs  uint64 `json:"lost_cqes"`
}

// ExportState returns c's state. An error: completions are not published yet
// (the device was not quiesced: RNIC.Quiesced).
func (c *CQ) ExportState() (CQState, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unpublished || len(c.lazy) > 0 {
		return CQState{}, fmt.Errorf("CQ %d has unpublished completions", c.Num)
	}
	return CQState{PI: c.pi, Written: c.written, CISeen: c.ciSeen, Armed: c.armed, SolicitedOnly: c.solicitedOnly,
		ArmSeen: c.armSeen, Overrun: c.overrun, ErrorCQEs: c.errCQEs.Load(), LostCQEs: c.lostCQEs.Load()}, nil
}

// ImportState gives a CQ being imported its state, before AddCQ. Any value
// is one the engine copes with (pi and ci are free-running; a ci_seen
// out of the window is read again from the record before it is used).
func (c *CQ) ImportState(s CQState) error {
	if s.SolicitedOnly && !s.Armed {
		return stateErr("CQ %d: solicited_only without armed", c.Num)
	}
	if s.Armed && s.Overrun {
		return stateErr("CQ %d: armed in overrun", c.Num)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pi, c.written, c.ciSeen = s.PI, s.Written, s.CISeen
	c.armed, c.solicitedOnly, c.armSeen, c.overrun = s.Armed, s.SolicitedOnly, s.ArmSeen, s.Overrun
	c.errCQEs.Store(s.ErrorCQEs)
	c.lostCQEs.Store(s.LostCQEs)
	return nil
}

// SRQState is what an SRQ holds beyond CREATE_SRQ's parameters.
type SRQState struct {
	// CI is the next WQE to consume (free-running; the record's ci).
	CI uint32 `json:"ci"`
	// PISeen is the record's pi as last read.
	PISeen uint32 `json:"pi_seen"`
	// Limit is the armed SRQ limit (0: not armed).
	Limit uint32 `json:"limit"`
	// Stopped: the SRQ broke (a pi more than max_wr ahead, its ring
	// outside guest memory) and is consumed no more.
	Stopped bool `json:"stopped"`
	// Notify is the record's notify word as last stored (1 while a
	// requester waited for a WQE).
	Notify uint32 `json:"notify"`
}

// ExportState returns s's state.
func (s *SRQ) ExportState() SRQState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SRQState{CI: s.ci, PISeen: s.piSeen, Limit: s.limit, Stopped: s.stopped, Notify: s.notifyPub}
}

// ImportState gives an SRQ being imported its state, before AddSRQ.
func (s *SRQ) ImportState(st SRQState) error {
	switch {
	case st.Limit > s.Ring.Depth:
		return stateErr("SRQ %d: limit %d above max_wr %d", s.Num, st.Limit, s.Ring.Depth)
	case st.Notify > 1:
		return stateErr("SRQ %d: notify %d", s.Num, st.Notify)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ci, s.piSeen, s.limit, s.stopped, s.notifyPub = st.CI, st.PISeen, st.Limit, st.Stopped, st.Notify
	return nil
}

// CountersState are the device's data-path counters (Stats).
type CountersState struct {
	BytesMoved    uint64            `json:"bytes_moved"`
	Ops           [7]uint64         `json:"ops"`
	WCErrors      map[uint32]uint64 `json:"wc_errors,omitempty"`
	EventsDropped uint64            `json:"events_dropped"`
	WrongPeer     uint64            `json:"wrong_peer"`
	UDDropped     uint64            `json:"ud_dropped"`
}

// Counters returns the device's counters.
func (d *RNIC) Counters() CountersState {
	s := d.Stats()
	c := CountersState{BytesMoved: s.BytesMoved, Ops: s.Ops, EventsDropped: s.EventsDropped,
		WrongPeer: s.WrongPeer, UDDropped: s.UDDropped, WCErrors: map[uint32]uint64{}}
	for k, v := range s.CompletionErrors {
		c.WCErrors[uint32(k)] = v
	}
	return c
}

// SetCounters sets them (an import).
func (d *RNIC) SetCounters(c CountersState) error {
	for k := range c.WCErrors {
		if k >= maxWCStatus {
			return stateErr("counter of wc status %d", k)
		}
	}
	d.bytesMoved.Store(c.BytesMoved)
	for i, v := range c.Ops {
		d.ops[i].Store(v)
	}
	for i := range d.wcErrors {
		d.wcErrors[i].Store(c.WCErrors[uint32(i)])
	}
	d.eventsDropped.Store(c.EventsDropped)
	d.wrongPeer.Store(c.WrongPeer)
	d.udDropped.Store(c.UDDropped)
	return nil
}

// Objects are a device's objects, each kind in handle order.
type Objects struct {
	PDs  []uint32
	MRs  []*MR
	AHs  []*AH
	CQs  []*CQ
	SRQs []*SRQ
	QPs  []*QP
}

// Objects lists the device's objects (ordinary MRs only: Transferable
// refuses windows and ALLOC_MR MRs).
func (d *RNIC) Objects() Objects {
	d.mu.RLock()
	defer d.mu.RUnlock()
	var o Objects
	for _, k := range sortedKeys(d.pds) {
		o.PDs = append(o.PDs, k)
	}
	for _, k := range sortedKeys(d.mrs) {
		o.MRs = append(o.MRs, d.mrs[k])
	}
	for _, k := range sortedKeys(d.ahs) {
		o.AHs = append(o.AHs, d.ahs[k])
	}
	for _, k := range sortedKeys(d.cqs) {
		o.CQs = append(o.CQs, d.cqs[k])
	}
	for _, k := range sortedKeys(d.srqs) {
		o.SRQs = append(o.SRQs, d.srqs[k])
	}
	for _, k := range sortedKeys(d.qps) {
		o.QPs = append(o.QPs, d.qps[k])
	}
	return o
}

// sortedKeys returns m's keys in increasing order.
func sortedKeys[V any](m map[uint32]V) []uint32 {
	ks := make([]uint32, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
