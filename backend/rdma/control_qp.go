package rdma

import (
	"encoding/binary"
	"errors"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The QP commands: CREATE_QP, MODIFY_QP, QUERY_QP, DESTROY_QP
// (docs/spec.md § CREATE_QP, § MODIFY_QP and QUERY_QP).

// decodeCreateQP decodes CREATE_QP's request: the 88-byte structure, or
// the 80-byte one before SRQs ("A request of 80 bytes is accepted too: it
// is the structure without srqn and reserved"), each followed by the
// inline page list when page_list is 0. The two lengths would be
// ambiguous with an inline list, so the list's length decides: it is
// sq_npages + rq_npages entries. It returns the request and its inline
// page list.
func decodeCreateQP(req []byte) (c abi.CreateQP, inline []byte, err error) {
	if len(req) < abi.CreateQPV1Size {
		return c, nil, errStatus(abi.StatusInvalid)
	}
	var v1 [abi.CreateQPV1Size]byte
	copy(v1[:], req)
	full := append(v1[:], make([]byte, 8)...) // srqn and reserved zero
	if err := abi.Unmarshal(full, &c); err != nil {
		return c, nil, errStatus(abi.StatusInvalid)
	}
	list := uint64(0)
	if c.PageList == 0 {
		list = (uint64(c.SQNPages) + uint64(c.RQNPages)) * 8
	}
	switch uint64(len(req)) {
	case abi.CreateQPV1Size + list:
		if c.Flags&abi.QPFlagSRQ != 0 {
			return c, nil, errStatus(abi.StatusInvalid) // "with SRQ in flags then INVALID"
		}
		return c, req[abi.CreateQPV1Size:], nil
	case uint64(binary.Size(&c)) + list:
		inline, err := decode(req, &c, true)
		return c, inline, err
	}
	return c, nil, errStatus(abi.StatusInvalid)
}

func (d *Device) createQP(req []byte, t *memmap.Table) (any, error) {
	c, inline, err := decodeCreateQP(req)
	if err != nil {
		return nil, err
	}
	if err := d.checkCreateQP(&c); err != nil {
		return nil, err
	}
	pages, err := pageList(t, inline, c.PageList, c.SQNPages+c.RQNPages, abi.PageShift)
	if err != nil {
		return nil, err
	}
	qp, err := d.addQP(t, &c, pages, 0)
	if err != nil {
		return nil, err
	}
	return &abi.Handle{Handle: qp.Num}, nil
}

// checkCreateQP validates a CREATE_QP request but its page list.
func (d *Device) checkCreateQP(c *abi.CreateQP) error {
	scq, rcq := d.eng.LookupCQ(c.SendCQN), d.eng.LookupCQ(c.RecvCQN)
	l := &d.conf
	withSRQ := c.Flags&abi.QPFlagSRQ != 0
	// The GSI QP is "a UD QP in every rule of § Semantics (UD)" but its
	// address (engine: QP.GSI).
	gsi := c.QPType == abi.QPTypeGSI
	ud := c.QPType == abi.QPTypeUD || gsi
	nic := d.eng.NIC() != nil
	sqStride, rqStride := uint64(1)<<(c.SQWQEShift&31), uint64(1)<<(c.RQWQEShift&31)
	switch {
	case c.Flags&^uint32(abi.QPFlagRQNotify|abi.QPFlagSRQ) != 0 || c.SQSigAll > 1 || c.Reserved != 0:
		return errStatus(abi.StatusInvalid)
	case !withSRQ && c.SRQN != 0:
		return errStatus(abi.StatusInvalid)
	case withSRQ && (c.MaxRecvWR != 0 || c.MaxRecvSGE != 0 || c.RQWQEShift != 0 || c.RQNPages != 0):
		return errStatus(abi.StatusInvalid) // "0 with SRQ"
	case c.QPType != abi.QPTypeRC && !ud:
		return errStatus(abi.StatusUnsupported)
	case nic && (ud || withSRQ):
		// "CREATE_SRQ and CREATE_QP of a UD or GSI QP answer
		// UNSUPPORTED on such a device"; so does a QP naming an SRQ it
		// cannot have.
		return errStatus(abi.StatusUnsupported)
	case !d.eng.HasPD(c.PDN) || scq == nil || rcq == nil:
		return errStatus(abi.StatusNotFound)
	}
	if withSRQ {
		if d.eng.LookupSRQ(c.SRQN) == nil {
			return errStatus(abi.StatusNotFound)
		}
	} else {
		switch {
		case !isPow2(c.MaxRecvWR) || c.MaxRecvWR > l.MaxQPWR || c.MaxRecvSGE == 0 || c.MaxRecvSGE > l.MaxSGE:
			return errStatus(abi.StatusInvalid)
		case c.RQWQEShift < abi.MinRQWQEShift || c.RQWQEShift > abi.MaxWQEShift ||
			rqStride < abi.RecvWQEHdrSize+abi.SGESize*uint64(c.MaxRecvSGE):
			return errStatus(abi.StatusInvalid)
		case uint64(c.RQNPages) != pagesFor(uint64(c.MaxRecvWR)*rqStride):
			return errStatus(abi.StatusInvalid)
		}
	}
	switch {
	case !isPow2(c.MaxSendWR) || c.MaxSendWR > l.MaxQPWR:
		return errStatus(abi.StatusInvalid)
	case c.MaxSendSGE == 0 || c.MaxSendSGE > l.MaxSGE:
		return errStatus(abi.StatusInvalid)
	case c.MaxInlineData > l.MaxInlineData || (ud && uint64(c.MaxInlineData) > mtuBytes(l.ActiveMTU)):
		return errStatus(abi.StatusInvalid)
	case c.SQWQEShift < abi.MinSQWQEShift || c.SQWQEShift > abi.MaxWQEShift:
		return errStatus(abi.StatusInvalid)
	case sqStride < abi.SendWQEHdrSize+abi.SGESize*uint64(c.MaxSendSGE) ||
		sqStride < abi.SendWQEHdrSize+uint64(c.MaxInlineData):
		return errStatus(abi.StatusInvalid)
	case c.DoorbellQueue >= l.NumDoorbellQueues:
		return errStatus(abi.StatusInvalid)
	case uint64(c.SQNPages) != pagesFor(uint64(c.MaxSendWR)*sqStride):
		return errStatus(abi.StatusInvalid)
	case gsi && d.eng.GSI() != nil:
		// "A device has at most one: CREATE_QP of a GSI QP while one
		// exists is BUSY" (AddQP checks it again under its lock).
		return errStatus(abi.StatusBusy)
	case uint32(d.eng.Count(engine.KindQP)) >= l.MaxQP:
		return errStatus(abi.StatusNoResources)
	}
	return nil
}

// addQP builds the QP a checked CREATE_QP request and its page list name,
// pins its rings and record and adds it with number want (0: a new one).
// An imported QP (want not 0) keeps its record as it is.
func (d *Device) addQP(t *memmap.Table, c *abi.CreateQP, pages []abi.GPA, want uint32) (*engine.QP, error) {
	scq, rcq := d.eng.LookupCQ(c.SendCQN), d.eng.LookupCQ(c.RecvCQN)
	var srq *engine.SRQ
	if c.Flags&abi.QPFlagSRQ != 0 {
		srq = d.eng.LookupSRQ(c.SRQN)
	}
	gsi := c.QPType == abi.QPTypeGSI
	ud := c.QPType == abi.QPTypeUD || gsi
	nic := d.eng.NIC() != nil
	sqStride, rqStride := uint64(1)<<(c.SQWQEShift&31), uint64(1)<<(c.RQWQEShift&31)
	rqNotify := c.Flags&abi.QPFlagRQNotify != 0
	h := uint32(0) // a host NIC's QP takes the NIC's number
	if !nic {
		var err error
		if h, err = d.newHandle(engine.KindQP, qpnBits, want); err != nil { // reserved on the fabric
			return nil, err
		}
	}
	if err := d.pinRing(t, pages, c.Record, engine.QPRecordSize(rqNotify)); err != nil {
		d.eng.ReleaseQPN(h)
		return nil, err
	}
	qp := &engine.QP{
		Num:           h,
		PD:            c.PDN,
		Dev:           d.eng,
		SendCQ:        scq,
		RecvCQ:        rcq,
		SQ:            engine.Ring{Pages: pages[:c.SQNPages], Depth: c.MaxSendWR, Stride: uint32(sqStride)},
		Record:        abi.GPA(c.Record),
		MaxSendSGE:    c.MaxSendSGE,
		MaxRecvSGE:    c.MaxRecvSGE,
		MaxInline:     c.MaxInlineData,
		SigAll:        c.SQSigAll == 1,
		DoorbellQueue: int(c.DoorbellQueue),
		RQNotify:      rqNotify,
		UD:            ud,
		GSI:           gsi,
		SRQ:           srq,
	}
	if srq == nil {
		qp.RQ = engine.Ring{Pages: pages[c.SQNPages:], Depth: c.MaxRecvWR, Stride: uint32(rqStride)}
	}
	if nic {
		if err := d.eng.CreateQPNIC(qp); err != nil {
			d.unpinQP(qp)
			d.log.WithError(err).Warn("CREATE_QP: host NIC")
			return nil, errStatus(abi.StatusNoResources)
		}
	}
	if want == 0 {
		qp.InitRecord(t)
	}
	if err := d.eng.AddQP(qp); err != nil { // the PD and the GSI QP were checked under d.mu
		qp.ReleaseNIC()
		d.eng.ReleaseQPN(h)
		d.unpinQP(qp)
		if errors.Is(err, engine.ErrGSIBusy) {
			return nil, errStatus(abi.StatusBusy)
		}
		return nil, errStatus(abi.StatusNotFound)
	}
	return qp, nil
}

// mtuBytes is an ibv_mtu value in bytes.
func mtuBytes(mtu uint32) uint64 { return 128 << (mtu & 7) }

func (d *Device) destroyQP(h uint32) error {
	qp := d.eng.RemoveQP(h)
	if qp == nil {
		return errStatus(abi.StatusNotFound)
	}
	d.unpinQP(qp)
	return nil
}

func (d *Device) modifyQP(req []byte) error {
	var a abi.QPAttr
	if _, err := decode(req, &a, false); err != nil {
		return err
	}
	qp := d.eng.LookupQP(a.QPN)
	if qp == nil {
		return errStatus(abi.StatusNotFound)
	}
	// The device's limits; the engine checks everything else.
	if (a.AttrMask&abi.QPAttrMaxQPRdAtomic != 0 && a.MaxRdAtomic > d.conf.MaxQPRdAtom) ||
		(a.AttrMask&abi.QPAttrMaxDestRdAtomic != 0 && a.MaxDestRdAtomic > d.conf.MaxQPRdAtom) {
		return errStatus(abi.StatusInvalid)
	}
	if st := qp.Modify(a); st != abi.StatusOK {
		return errStatus(st)
	}
	return nil
}

func (d *Device) queryQP(req []byte) (any, error) {
	var h abi.Handle
	if _, err := decode(req, &h, false); err != nil || h.Reserved != 0 {
		return nil, errStatus(abi.StatusInvalid)
	}
	qp := d.eng.LookupQP(h.Handle)
	if qp == nil {
		return nil, errStatus(abi.StatusNotFound)
	}
	a := qp.Attr()
	a.QPN, a.AttrMask = h.Handle, 0
	return &a, nil
}
