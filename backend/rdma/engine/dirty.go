package engine

import (
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Dirty logging (doc.go, "Dirty logging"): every write the engine makes
// into a guest's memory is marked, after the write, in the dirty log of
// the table it wrote through (memmap.Table.MarkDirty; a nil check while
// the front-end is not migrating). The writes are of three kinds, and each
// kind has one place that marks:
//
//   - data placed through an MR (WRITE, SEND into receive buffers, READ
//     responses, atomics and their results, UD's GRH): MR.RangeWrite,
//     which the mover (move.go) and the atomic use, and rangeFor for the
//     network transport's copies (network.go);
//   - CQEs and a CQ's pi: CQ.push and CQ.storePILocked (cq.go);
//   - the words of QP and SRQ records the device owns (sq_ci, rq_ci,
//     rq_notify; an SRQ's ci and notify): the functions below, which store
//     and mark together.
//
// A function that stores into a record without a table at hand returns
// whether it stored, and its caller, which holds the table, marks
// (markCI, markRQNotify).

// rangeFor is MR.RangeWrite when into (the bytes go into guest memory),
// else MR.Range.
func (m *MR) rangeFor(t *memmap.Table, addr, n uint64, into bool, fn func([]byte) error) error {
	if into {
		return m.RangeWrite(t, addr, n, fn)
	}
	return m.Range(t, addr, n, fn)
}

// markCI marks the consumer-index words of the QP's record (sq_ci and
// rq_ci, adjacent) in t's dirty log. t is q.Dev's table.
func (q *QP) markCI(t *memmap.Table) {
	t.MarkDirty(q.Record+abi.QPRecordSQCI, abi.QPRecordRQCI+4-abi.QPRecordSQCI)
}

// setCIOn is setCI, marking the record's consumer indices in t's dirty
// log when it stored. t is q.Dev's table, rec the record on it.
func (q *QP) setCIOn(t *memmap.Table, i int, rec []byte, v uint32) {
	if q.setCI(i, rec, v) && t != nil {
		q.markCI(t)
	}
}

// markRQNotify marks the record's rq_notify word in t's dirty log.
func (q *QP) markRQNotify(t *memmap.Table) {
	t.MarkDirty(q.Record+abi.QPRecordRQNotify, 4)
}

// updateRQNotifyOn is updateRQNotify, marking the word when it stored.
func (q *QP) updateRQNotifyOn(t *memmap.Table, rec []byte) {
	if q.updateRQNotify(rec) && t != nil {
		q.markRQNotify(t)
	}
}

// storeSRQ stores v into word off of the SRQ's record rec (on t) and
// marks it.
func (s *SRQ) storeSRQ(t *memmap.Table, rec []byte, off int, v uint32) {
	abi.StoreUint32(rec, off, v)
	t.MarkDirty(s.Record+abi.GPA(off), 4)
}
