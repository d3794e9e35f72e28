package engine

import (
	"fmt"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The objects of a device on a host NIC (nic.go): each guest object's host
// counterpart, made before the guest's is reachable and gone with it, and
// the QP's transitions on the NIC. hw.go has the data path.

// AddPDNIC registers a PD as AddPD does and, for a device with a NIC,
// allocates its host PD first. nil: the NIC refused.
func (d *RNIC) addPDNIC(num uint32) *PD {
	nic := d.NIC()
	var hw NICPD
	if nic != nil {
		var err error
		if hw, err = nic.AllocPD(); err != nil {
			d.log.WithError(err).Warn("CREATE_PD: host NIC")
			return nil
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	p := &PD{Num: num, HW: hw}
	d.pds[num] = p
	return p
}

// RegisterMRNIC registers m with the device's NIC over a host view of its
// pages on t, at m.IOVA: m.Key becomes the NIC's lkey, m.RKey its rkey.
// Call it before AddMR; on error nothing is left registered or mapped.
func (d *RNIC) RegisterMRNIC(t *memmap.Table, m *MR) error {
	d.mu.RLock()
	p := d.pds[m.PD]
	d.mu.RUnlock()
	if p == nil || p.HW == nil {
		return ErrNoPD
	}
	page := uint64(abi.PageSize)
	runs := make([]memmap.Run, 0, len(m.extents))
	head := uint64(0)
	for i, e := range m.extents {
		start, end := uint64(e.gpa), uint64(e.gpa)+e.len
		if i == 0 {
			head = start % page
			start -= head
		}
		if i == len(m.extents)-1 {
			end = (end + page - 1) &^ (page - 1)
		}
		if k := len(runs); k > 0 && uint64(runs[k-1].GPA)+runs[k-1].Len == start {
			runs[k-1].Len += end - start
			continue
		}
		runs = append(runs, memmap.Run{GPA: abi.GPA(start), Len: end - start})
	}
	v, err := t.NewView(runs)
	if err != nil {
		return fmt.Errorf("host view of the MR: %w", err)
	}
	hw, err := p.HW.RegMR(v.Addr()+uintptr(head), m.Length, m.IOVA, m.Access)
	if err != nil {
		v.Close()
		return fmt.Errorf("%w: %w", ErrNICObject, err)
	}
	m.HW, m.view = hw, v
	m.Key, m.RKey = hw.Keys()
	return nil
}

// ReleaseNIC undoes RegisterMRNIC for an MR that was not added.
func (m *MR) ReleaseNIC() { m.closeNIC() }

// ReleaseNIC undoes CreateQPNIC for a QP that was not added.
func (q *QP) ReleaseNIC() {
	if q.HW != nil {
		q.HW.Close()
		q.HW, q.hw = nil, nil
	}
}

// closeNIC deregisters the MR from the NIC and unmaps its view (once).
func (m *MR) closeNIC() {
	m.hwMu.Lock()
	defer m.hwMu.Unlock()
	if m.HW != nil {
		m.HW.Close()
		m.HW = nil
	}
	if m.view != nil {
		m.view.Close()
		m.view = nil
	}
}

// DropStaleNIC deregisters from the NIC every MR with pages outside t,
// the device's new memory table: the front-end took memory away under a
// live MR, whose registration would otherwise keep those pages. The MR
// stays the guest's (DEREG_MR finds it); the NIC now refuses its keys,
// as the software RNIC refuses an access to memory that is gone. An MR
// within t keeps its registration: a front-end that maps the same file
// again (QEMU sends a whole new table when memory is added) keeps the
// same pages.
func (d *RNIC) DropStaleNIC(t *memmap.Table) {
	if d.NIC() == nil || t == nil {
		return
	}
	d.mu.RLock()
	mrs := make([]*MR, 0, len(d.mrs))
	for _, m := range d.mrs {
		mrs = append(mrs, m)
	}
	d.mu.RUnlock()
	nop := func([]byte) error { return nil }
	for _, m := range mrs {
		if m.Extents(func(gpa abi.GPA, n uint64) error { return t.ForEach(gpa, n, nop) }) != nil {
			d.log.WithField("lkey", m.Key).Warn("guest memory under a registered MR went away: its NIC registration is dropped")
			m.closeNIC()
		}
	}
}

// CreateCQNIC gives c a host CQ of the device's NIC. Call it before AddCQ.
func (d *RNIC) CreateCQNIC(c *CQ) error {
	nic := d.NIC()
	if nic == nil {
		return nil
	}
	hw, err := nic.CreateCQ(c.Ring.Depth, d.wakeAll)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNICObject, err)
	}
	c.HW = hw
	c.hwWC = make([]NICWC, hwBatch)
	c.hwFree.Store(int64(hw.Depth()))
	return nil
}

// hwTake takes a slot of c's host CQ for a work request to be posted.
func (c *CQ) hwTake() bool {
	if c.hwFree.Add(-1) < 0 {
		c.hwFree.Add(1)
		return false
	}
	return true
}

// hwTakeOrWait is hwTake that, when the host CQ is full, asks the poller
// that next frees a slot to wake the device's queues (hwWaiting).
func (c *CQ) hwTakeOrWait() bool {
	if c.hwTake() {
		return true
	}
	c.hwWaiting.Store(true)
	if c.hwTake() { // freed meanwhile
		c.hwWaiting.Store(false)
		return true
	}
	return false
}

// hwRelease gives back the slots of what q posted and will never see
// complete (RESET, DESTROY_QP): its outstanding sends and receives.
// Precondition: sqMu and rqMu held (no completion of q is accepted
// meanwhile).
func (q *QP) hwRelease() {
	h := q.hw
	if n := h.sqPosted - h.sqDone.Load(); n > 0 && n <= q.SQ.Depth {
		q.SendCQ.hwFree.Add(int64(n))
	}
	if n := h.rqPosted - q.rqCI; n > 0 && n <= q.RQ.Depth {
		q.RecvCQ.hwFree.Add(int64(n))
	}
}

// closeNIC destroys the host CQ, waiting for a poll in progress.
func (c *CQ) closeNIC() {
	c.hwMu.Lock()
	defer c.hwMu.Unlock()
	if c.HW != nil {
		c.HW.Close()
		c.HW = nil
	}
}

// CreateQPNIC gives q a host QP of the device's NIC, in q's PD, on its
// CQs' host CQs; q.Num becomes the host QP's number. Call it before AddQP
// (the CQs must have host CQs).
func (d *RNIC) CreateQPNIC(q *QP) error {
	d.mu.RLock()
	p := d.pds[q.PD]
	d.mu.RUnlock()
	if p == nil || p.HW == nil || q.SendCQ == nil || q.RecvCQ == nil || q.SendCQ.HW == nil || q.RecvCQ.HW == nil {
		return ErrNoPD
	}
	hw, err := p.HW.CreateQP(NICQPInit{
		SendCQ: q.SendCQ.HW, RecvCQ: q.RecvCQ.HW,
		MaxSendWR: q.SQ.Depth, MaxRecvWR: q.RQ.Depth,
		MaxSendSGE: q.MaxSendSGE, MaxRecvSGE: q.MaxRecvSGE, MaxInline: q.MaxInline,
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNICObject, err)
	}
	sge := max(q.MaxSendSGE, q.MaxRecvSGE)
	q.HW = hw
	q.Num = hw.Num()
	q.hw = &hwQP{
		sq:    make([]hwSlot, q.SQ.Depth),
		rq:    make([]uint64, q.RQ.Depth),
		sends: make([]NICSendWR, hwBatch),
		recvs: make([]NICRecvWR, hwBatch),
		sges:  make([]abi.SGE, hwBatch*int(min(sge, maxSendSGEs))),
	}
	return nil
}

// wakeAll wakes every doorbell queue of the device (a host CQ's
// notification: its completions are polled by the passes of its QPs'
// queues).
func (d *RNIC) wakeAll() {
	d.mu.RLock()
	w := d.wake
	dbqs := make([]int, 0, 4)
	for dbq := range d.byDBQ {
		dbqs = append(dbqs, dbq)
	}
	d.mu.RUnlock()
	if w == nil {
		return
	}
	for _, dbq := range dbqs {
		w(dbq)
	}
}

// modifyNIC applies a validated transition to the host QP. The guest's
// sgid_index names an entry of the device's table; the host's index of
// that GID replaces it. Precondition: q.mu held (the transition was
// checked against the table under it).
func (q *QP) modifyNIC(a abi.QPAttr) abi.Status {
	if a.AttrMask&abi.QPAttrAV != 0 {
		g, ok := q.Dev.nicGIDAt(int(a.SGIDIndex))
		if !ok {
			return abi.StatusInvalid
		}
		hi, ok := q.Dev.nic.HostGIDIndex(g)
		if !ok {
			return abi.StatusInvalid
		}
		a.SGIDIndex = uint32(hi)
	}
	if err := q.HW.Modify(&a); err != nil {
		q.Dev.log.WithError(err).WithField("qp", q.Num).Debug("MODIFY_QP: host NIC")
		return abi.StatusInvalid
	}
	return abi.StatusOK
}

// nicToErr moves the host QP to ERR (it flushes what was posted).
func (q *QP) nicToErr() {
	if q.HW == nil {
		return
	}
	if err := q.HW.Modify(&abi.QPAttr{AttrMask: abi.QPAttrState, QPState: abi.QPSErr}); err != nil {
		q.Dev.log.WithError(err).WithField("qp", q.Num).Warn("host QP to ERR")
	}
}

// resetNIC moves the host QP to RESET and starts a new generation: what
// was posted is gone without completions. Precondition: sqMu and rqMu
// held; q.sqCI and q.rqCI are the new consumer indices; hwRelease ran
// before they were set.
func (q *QP) resetNIC() {
	if err := q.HW.Modify(&abi.QPAttr{AttrMask: abi.QPAttrState, QPState: abi.QPSReset}); err != nil {
		q.Dev.log.WithError(err).WithField("qp", q.Num).Warn("host QP to RESET")
	}
	h := q.hw
	h.gen++
	h.sqPosted = q.sqCI
	h.sqDone.Store(q.sqCI)
	h.rqPosted = q.rqCI
}
