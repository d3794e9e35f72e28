package rdma

import (
	"errors"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The shared receive queue commands (docs/spec.md § CREATE_SRQ …
// DESTROY_SRQ). An SRQ's ring and record are pinned like a QP's; the
// engine (engine/srq.go) consumes from it.

func (d *Device) createSRQ(req []byte, t *memmap.Table) (any, error) {
	var c abi.CreateSRQ
	inline, err := decode(req, &c, true)
	if err != nil {
		return nil, err
	}
	if err := d.checkCreateSRQ(&c); err != nil {
		return nil, err
	}
	pages, err := pageList(t, inline, c.PageList, c.NPages, abi.PageShift)
	if err != nil {
		return nil, err
	}
	s, err := d.addSRQ(t, &c, pages, 0, nil)
	if err != nil {
		return nil, err
	}
	return &abi.Handle{Handle: s.Num}, nil
}

// checkCreateSRQ validates a CREATE_SRQ request but its page list.
func (d *Device) checkCreateSRQ(c *abi.CreateSRQ) error {
	l := &d.conf
	stride := uint64(1) << (c.WQEShift & 31)
	switch {
	case c.Reserved != 0:
		return errStatus(abi.StatusInvalid)
	case d.eng.NIC() != nil:
		// "On a device whose RNIC is a host NIC, CREATE_SRQ is
		// UNSUPPORTED in this revision."
		return errStatus(abi.StatusUnsupported)
	case !d.eng.HasPD(c.PDN):
		return errStatus(abi.StatusNotFound)
	case !isPow2(c.MaxWR) || c.MaxWR > l.MaxQPWR || c.MaxSGE == 0 || c.MaxSGE > l.MaxSGE || c.SRQLimit > c.MaxWR:
		return errStatus(abi.StatusInvalid)
	case c.WQEShift < abi.MinRQWQEShift || c.WQEShift > abi.MaxWQEShift ||
		stride < abi.RecvWQEHdrSize+abi.SGESize*uint64(c.MaxSGE):
		return errStatus(abi.StatusInvalid)
	case c.DoorbellQueue >= l.NumDoorbellQueues:
		return errStatus(abi.StatusInvalid)
	case uint64(c.NPages) != pagesFor(uint64(c.MaxWR)*stride):
		return errStatus(abi.StatusInvalid)
	case uint32(d.eng.Count(engine.KindSRQ)) >= l.MaxSRQ:
		return errStatus(abi.StatusNoResources)
	}
	return nil
}

// addSRQ builds the SRQ a checked CREATE_SRQ request and its page list
// name, pins its ring and record and adds it with handle want (0: a new
// one). st is an imported SRQ's state (nil: a new SRQ, whose record's
// notify word is cleared).
func (d *Device) addSRQ(t *memmap.Table, c *abi.CreateSRQ, pages []abi.GPA, want uint32, st *engine.SRQState) (*engine.SRQ, error) {
	stride := uint64(1) << (c.WQEShift & 31)
	if err := d.pinRing(t, pages, c.Record, abi.SRQRecordSize); err != nil {
		return nil, err
	}
	h, err := d.newHandle(engine.KindSRQ, 32, want)
	if err != nil {
		d.unpinRing(pages)
		return nil, err
	}
	s := &engine.SRQ{
		Num:           h,
		PD:            c.PDN,
		Dev:           d.eng,
		Ring:          engine.Ring{Pages: pages, Depth: c.MaxWR, Stride: uint32(stride)},
		Record:        abi.GPA(c.Record),
		MaxSGE:        c.MaxSGE,
		DoorbellQueue: int(c.DoorbellQueue),
	}
	if st == nil {
		s.InitRecord(t)
		s.SetLimit(c.SRQLimit)
	} else if err := s.ImportState(*st); err != nil {
		d.unpinSRQ(s)
		return nil, err
	}
	if err := d.eng.AddSRQ(s); err != nil { // the PD was checked under d.mu
		d.unpinSRQ(s)
		return nil, errStatus(abi.StatusNotFound)
	}
	return s, nil
}

func (d *Device) modifySRQ(req []byte) error {
	var a abi.SRQAttr
	if _, err := decode(req, &a, false); err != nil {
		return err
	}
	if a.AttrMask&^uint32(abi.SRQAttrMaxWR|abi.SRQAttrLimit) != 0 {
		return errStatus(abi.StatusInvalid)
	}
	s := d.eng.LookupSRQ(a.SRQN)
	switch {
	case s == nil:
		return errStatus(abi.StatusNotFound)
	case a.AttrMask&abi.SRQAttrMaxWR != 0:
		return errStatus(abi.StatusUnsupported) // "resizing: UNSUPPORTED"
	case a.AttrMask&abi.SRQAttrLimit != 0 && a.SRQLimit > s.Ring.Depth:
		return errStatus(abi.StatusInvalid) // "above max_wr is INVALID"
	}
	if a.AttrMask&abi.SRQAttrLimit != 0 {
		s.SetLimit(a.SRQLimit)
	}
	return nil
}

func (d *Device) querySRQ(req []byte) (any, error) {
	var h abi.Handle
	if _, err := decode(req, &h, false); err != nil || h.Reserved != 0 {
		return nil, errStatus(abi.StatusInvalid)
	}
	s := d.eng.LookupSRQ(h.Handle)
	if s == nil {
		return nil, errStatus(abi.StatusNotFound)
	}
	return &abi.SRQAttr{SRQN: s.Num, MaxWR: s.Ring.Depth, SRQLimit: s.Limit()}, nil
}

func (d *Device) destroySRQ(h uint32) error {
	s, err := d.eng.RemoveSRQ(h)
	switch {
	case errors.Is(err, engine.ErrNoSRQ):
		return errStatus(abi.StatusNotFound)
	case errors.Is(err, engine.ErrSRQBusy):
		return errStatus(abi.StatusBusy) // "BUSY while a QP was created with it"
	case err != nil:
		return errStatus(abi.StatusInvalid)
	}
	d.unpinSRQ(s)
	return nil
}
