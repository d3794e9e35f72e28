package rdma

import (
	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// PVDMA: the control path pins exactly the guest pages an object names
// (REG_MR: the 4 KiB pages holding the MR's bytes; CREATE_CQ, CREATE_QP
// and CREATE_SRQ: the ring pages and the record) and releases them when the
// object goes (memmap.Pinner keeps released pins in its map cache).
//
// Every pin is taken on behalf of its object (memmap.Pinner.PinFor): the
// pinner records which pages of which mapping the object pinned, and
// destroying the object drops exactly those, never by translating its
// guest-physical addresses through whatever table is current then. An
// object created on one memory table keeps its pages (and that table's
// region mapping) until it is destroyed, across SET_MEM_TABLE, ADD_MEM_REG
// and REM_MEM_REG, and its DEREG_MR or DESTROY never unpins pages another
// object holds. The owner keys: the *engine.MR for an MR, and for a ring
// the first element of its page list (pageList allocates one per command,
// and the CQ's Ring.Pages and the QP's SQ.Pages begin there), so the
// control path needs no table of its own.

// ringOwner is the pin owner of the rings whose page list begins where
// pages does (cap(pages) > 0: an empty SQ page list still begins there).
func ringOwner(pages []abi.GPA) any { return &pages[:1][0] }

// pinMR pins the 4 KiB pages holding the MR's bytes, run by run, all or
// nothing.
func (d *Device) pinMR(t *memmap.Table, mr *engine.MR) error {
	err := mr.Extents(func(gpa abi.GPA, n uint64) error {
		s := pageSpan(gpa, n)
		return d.pinner.PinFor(mr, t, s.gpa, s.n)
	})
	if err != nil {
		d.pinner.UnpinOwner(mr)
	}
	return err
}

// unpinMR releases what pinMR pinned, in the mappings it pinned.
func (d *Device) unpinMR(mr *engine.MR) { d.pinner.UnpinOwner(mr) }

// pinSpan is a page-aligned guest-physical range.
type pinSpan struct {
	gpa abi.GPA
	n   uint64
}

// pageSpan widens [gpa, gpa+n) to whole 4 KiB pages. n > 0; the range was
// checked not to wrap (the MR's pages lie below 2^64 and its length is
// bounded), so rounding the end up stays below 2^64 or is refused by the
// pinner as out of memory.
func pageSpan(gpa abi.GPA, n uint64) pinSpan {
	lo := uint64(gpa) &^ (abi.PageSize - 1)
	hi := uint64(gpa) + n
	if r := hi & (abi.PageSize - 1); r != 0 {
		hi += abi.PageSize - r
	}
	return pinSpan{gpa: abi.GPA(lo), n: hi - lo}
}

// pinRing validates and pins a ring's page list and its doorbell record,
// on behalf of ringOwner(pages).
func (d *Device) pinRing(t *memmap.Table, pages []abi.GPA, record uint64, recordSize uint64) error {
	if record == 0 || record%8 != 0 || len(pages) == 0 {
		return errStatus(abi.StatusInvalid)
	}
	if _, err := t.Slice(abi.GPA(record), recordSize); err != nil {
		return errStatus(abi.StatusFault)
	}
	owner := ringOwner(pages)
	if err := d.pinner.PinPagesFor(owner, t, pages); err != nil {
		return err
	}
	if err := d.pinner.PinFor(owner, t, abi.GPA(record), recordSize); err != nil {
		d.pinner.UnpinOwner(owner)
		return err
	}
	return nil
}

// unpinRing releases what pinRing pinned for the rings whose page list
// begins with pages.
func (d *Device) unpinRing(pages []abi.GPA) {
	if cap(pages) > 0 {
		d.pinner.UnpinOwner(ringOwner(pages))
	}
}

// unpinCQ releases what createCQ pinned: the ring and the record.
func (d *Device) unpinCQ(cq *engine.CQ) { d.unpinRing(cq.Ring.Pages) }

// unpinQP releases what createQP pinned: both rings and the record (one
// page list, the SQ's pages first).
func (d *Device) unpinQP(qp *engine.QP) { d.unpinRing(qp.SQ.Pages) }

// unpinSRQ releases what createSRQ pinned: the ring and the record.
func (d *Device) unpinSRQ(s *engine.SRQ) { d.unpinRing(s.Ring.Pages) }
