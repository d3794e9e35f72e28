package rdma

import (
	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// PVDMA: the control path pins exactly the guest pages an object names
// (REG_MR: the 4 KiB pages holding the MR's bytes; CREATE_CQ and
// CREATE_QP: the ring pages and the record) and releases them when the
// object goes (memmap.Pinner keeps released pins in its map cache).

// pinMR pins the 4 KiB pages holding the MR's bytes, run by run, all or
// nothing.
func (d *Device) pinMR(t *memmap.Table, mr *engine.MR) error {
	var done []pinSpan
	err := mr.Extents(func(gpa abi.GPA, n uint64) error {
		s := pageSpan(gpa, n)
		if err := d.pinner.Pin(t, s.gpa, s.n); err != nil {
			return err
		}
		done = append(done, s)
		return nil
	})
	if err != nil {
		for _, s := range done {
			d.pinner.Unpin(t, s.gpa, s.n)
		}
	}
	return err
}

// unpinMR releases what pinMR pinned, with the current table.
func (d *Device) unpinMR(mr *engine.MR) {
	t := d.mem().Acquire()
	defer t.Release()
	mr.Extents(func(gpa abi.GPA, n uint64) error {
		s := pageSpan(gpa, n)
		d.pinner.Unpin(t, s.gpa, s.n)
		return nil
	})
}

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

// pinRing validates and pins a ring's page list and its doorbell record.
func (d *Device) pinRing(t *memmap.Table, pages []abi.GPA, record uint64, recordSize uint64) error {
	if record == 0 || record%8 != 0 {
		return errStatus(abi.StatusInvalid)
	}
	if _, err := t.Slice(abi.GPA(record), recordSize); err != nil {
		return errStatus(abi.StatusFault)
	}
	if err := d.pinner.PinPages(t, pages); err != nil {
		return err
	}
	if err := d.pinner.Pin(t, abi.GPA(record), recordSize); err != nil {
		d.pinner.UnpinPages(t, pages)
		return err
	}
	return nil
}

// unpinRing releases what pinRing pinned: the record and the pages of
// one ring or several.
func (d *Device) unpinRing(record abi.GPA, recordSize uint64, pages ...[]abi.GPA) {
	t := d.mem().Acquire()
	for _, p := range pages {
		d.pinner.UnpinPages(t, p)
	}
	d.pinner.Unpin(t, record, recordSize)
	t.Release()
}

// unpinCQ releases what createCQ pinned: the ring and the record.
func (d *Device) unpinCQ(cq *engine.CQ) {
	d.unpinRing(cq.Record, engine.CQRecordSize(cq.ArmRecord), cq.Ring.Pages)
}

// unpinQP releases what createQP pinned: both rings and the record.
func (d *Device) unpinQP(qp *engine.QP) {
	d.unpinRing(qp.Record, engine.QPRecordSize(qp.RQNotify), qp.SQ.Pages, qp.RQ.Pages)
}
