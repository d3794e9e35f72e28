package engine

import (
	"sync"
	"sync/atomic"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Consumer indices, published in batches and in order.
//
// A driver finds room in a work queue from the record's consumer index
// (sq_ci, rq_ci), and its application posts again as soon as it has polled
// a completion: perftest keeps exactly tx_depth WQEs outstanding, so a
// completion seen before the consumer index that covers it turns into
// ibv_post_send's ENOMEM. The device therefore stores a queue's consumer
// index before the CQ producer index (pi) that makes a completion of that
// queue visible. Both are stored once per batch of WQEs rather than per WQE
// (the driver spins on these cache lines), and a CQ's pi may be stored by
// whoever pushes into it next: its own QP's pass, another QP sharing the
// CQ, REQ_NOTIFY_CQ, or the CQ firing an event. So the ordering cannot be
// left to the QP's own pass. Instead:
//
//   - The goroutine that completes a WQE first raises the queue's done
//     index (ciDone) to cover it, then pushes the CQE lazily, which lists
//     the QP on the CQ (CQ.lazy).
//   - Whoever stores a CQ's pi first stores the consumer indices of every
//     QP listed there (QP.storeCI), then pi.
//   - The record's sq_ci and rq_ci are stored only by storeCI, under the
//     QP's ciMu, so that stores from several goroutines never move an index
//     backwards, and never after DESTROY_QP answered (ciGone).
//
// The responder half of a same-host message (respond.go) completes the
// peer's receive this way too, and the requester's pass publishes the
// peer's receive CQ when it publishes its own (QP.publish): a 64 B SEND
// stream stores rq_ci and the receive CQ's pi once per pass or per
// publishEvery messages instead of per message.

// Queues of a QP, indexing ciDone and ciStored.
const (
	sqIdx = iota
	rqIdx
)

// ciState is a QP's consumer-index publication state.
type ciState struct {
	// ciDone[i] is the consumer index that covers every WQE of queue i
	// completed so far: raised by the goroutine that owns the queue's
	// consumption (sqMu, rqMu) before it pushes the completion.
	ciDone [2]atomic.Uint32

	ciMu     sync.Mutex
	ciStored [2]uint32 // the record's sq_ci and rq_ci as last stored (protected by ciMu)
	ciGone   bool      // destroyed: the record is no longer written (protected by ciMu)
}

// storeCI stores into rec (the QP's record) the consumer indices that are
// ahead of what the record holds, and reports whether it stored (the
// caller marks the record in its table's dirty log: markCI). Safe from any
// goroutine; ciMu is a leaf lock.
func (q *QP) storeCI(rec []byte) (stored bool) {
	q.ciMu.Lock()
	defer q.ciMu.Unlock()
	if q.ciGone {
		return false
	}
	for i, off := range [2]int{abi.QPRecordSQCI, abi.QPRecordRQCI} {
		// Only forwards: a goroutine that read ciDone before another
		// raised and stored it must not store the older value. Indices
		// are free-running; a queue is at most its depth (< 2³¹) ahead.
		if v := q.ciDone[i].Load(); int32(v-q.ciStored[i]) > 0 {
			abi.StoreUint32(rec, off, v)
			q.ciStored[i] = v
			stored = true
		}
	}
	return stored
}

// setCI raises queue i's consumer index to v and stores it into rec now;
// it reports whether it stored. Callers that hold the table use setCIOn,
// which marks the dirty log.
func (q *QP) setCI(i int, rec []byte, v uint32) bool {
	q.ciDone[i].Store(v)
	return q.storeCI(rec)
}

// resetCI sets both consumer indices to the given values and stores them,
// whatever the record held (RESET). Precondition: sqMu and rqMu held.
func (q *QP) resetCI(rec []byte, sq, rq uint32) {
	q.ciMu.Lock()
	defer q.ciMu.Unlock()
	q.ciDone[sqIdx].Store(sq)
	q.ciDone[rqIdx].Store(rq)
	if q.ciGone {
		return
	}
	abi.StoreUint32(rec, abi.QPRecordSQCI, sq)
	if q.SRQ == nil { // "the device never writes them" with an SRQ
		abi.StoreUint32(rec, abi.QPRecordRQCI, rq)
	}
	q.ciStored = [2]uint32{sq, rq}
}

// ciRelease ends the record's writes (DESTROY_QP): no consumer index is
// stored after it returns.
func (q *QP) ciRelease() {
	q.ciMu.Lock()
	q.ciGone = true
	q.ciMu.Unlock()
}

// maxLazy bounds the QPs a CQ lists between two stores of its pi; a QP
// that finds the list full stores its consumer index at once.
const maxLazy = 8

// listLazy records that q has a completion in c whose consumer index may
// not be stored yet. Precondition: c.mu held; t is c.Dev's table.
func (c *CQ) listLazy(t *memmap.Table, q *QP) {
	for _, x := range c.lazy {
		if x == q {
			return
		}
	}
	if len(c.lazy) < maxLazy {
		c.lazy = append(c.lazy, q)
		return
	}
	q.storeCIOn(t)
}

// storeListedCI stores the consumer indices of the QPs listed on c, before
// c's pi. Precondition: c.mu held; t is c.Dev's table.
func (c *CQ) storeListedCI(t *memmap.Table) {
	for i, q := range c.lazy {
		q.storeCIOn(t)
		c.lazy[i] = nil
	}
	c.lazy = c.lazy[:0]
}

// storeCIOn is storeCI on the QP's record in t.
func (q *QP) storeCIOn(t *memmap.Table) {
	if t == nil {
		return
	}
	if rec, err := t.Slice(q.Record, QPRecordSize(q.RQNotify)); err == nil && q.storeCI(rec) {
		q.markCI(t)
	}
}
