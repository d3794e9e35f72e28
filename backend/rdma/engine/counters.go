package engine

import (
	"sync/atomic"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Per-object error counters, for an operator asking "what failed on this
// device" (the resource views, snapshot.go). They are counted where an
// error is detected, never on a successful completion: a QP that never
// fails allocates none (qpCounters is made by the first error), and the
// data path's cost is one pointer load on an error path.

// qpCounters are one QP's error counters (atomic: engines of both sides,
// transport goroutines and the control path count into them).
type qpCounters struct {
	// wc: the QP's error completions (send and receive, written or
	// lost) by status.
	wc [maxWCStatus]atomic.Uint64
	// responder: requests this QP refused as the responder, by the
	// status its requester completed with (the QP moved to ERR).
	responder [maxWCStatus]atomic.Uint64
	// rnrSent: messages that found this QP's receive queue empty
	// (receiver not ready); rnrRecv: times this QP's head WQE met an
	// empty receive queue at its peer and waited (same host).
	rnrSent, rnrRecv atomic.Uint64
	// wrongPeer: requests from a QP this one is not connected to
	// (answered as to a QP that does not exist).
	wrongPeer atomic.Uint64
	// malformed: send WQEs that did not decode (LOC_QP_OP_ERR) and
	// receive WQEs of the QP's own receive queue that did not.
	malformed atomic.Uint64
	// udDropped: UD datagrams that reached this QP and were dropped
	// (another Q_Key, not in RTR or RTS, no receive WQE).
	udDropped atomic.Uint64
}

// counters returns the QP's error counters, allocating them on the first
// error. Safe for concurrent use.
func (q *QP) counters() *qpCounters {
	if c := q.ctr.Load(); c != nil {
		return c
	}
	q.ctr.CompareAndSwap(nil, new(qpCounters))
	return q.ctr.Load()
}

// QPErrors is a snapshot of one QP's error counters.
type QPErrors struct {
	// Completions are the QP's error completions (send and receive,
	// written or lost) by status.
	Completions map[abi.WCStatus]uint64
	// Responder are the requests the QP refused as responder, by the
	// status its requester completed with.
	Responder map[abi.WCStatus]uint64
	// RNRNAKsSent counts messages that found the QP's receive queue
	// empty; RNRNAKsReceived the times its own messages found the
	// peer's empty. A network QP's include its transport's.
	RNRNAKsSent, RNRNAKsReceived uint64
	// WrongPeer counts requests from a QP the QP is not connected to.
	WrongPeer uint64
	// MalformedWQEs counts send and receive WQEs that did not decode.
	MalformedWQEs uint64
	// UDDropped counts datagrams that reached the QP and were dropped.
	UDDropped uint64
	// The network transport's (a QP connected to another host; zero
	// otherwise): packets sent again, retransmit timer expiries, PSN
	// sequence NAKs and other NAKs sent and received, packets dropped.
	Retransmits, Timeouts      uint64
	SeqNAKsSent, SeqNAKsRecv   uint64
	NAKsSent, NAKsRecv         uint64
	Duplicates, DroppedPackets uint64
}

// snapshot returns the counters' values (all zero when c is nil).
func (c *qpCounters) snapshot() QPErrors {
	e := QPErrors{Completions: map[abi.WCStatus]uint64{}, Responder: map[abi.WCStatus]uint64{}}
	if c == nil {
		return e
	}
	for i := range c.wc {
		if n := c.wc[i].Load(); n != 0 {
			e.Completions[abi.WCStatus(i)] = n
		}
		if n := c.responder[i].Load(); n != 0 {
			e.Responder[abi.WCStatus(i)] = n
		}
	}
	e.RNRNAKsSent, e.RNRNAKsReceived = c.rnrSent.Load(), c.rnrRecv.Load()
	e.WrongPeer, e.MalformedWQEs, e.UDDropped = c.wrongPeer.Load(), c.malformed.Load(), c.udDropped.Load()
	return e
}

// countCompletionError counts an error CQE e on CQ c (nil: the QP has
// none) and on the QP of this device it names. Called on the error path
// of completeLazy only; it takes RNIC.mu for reading (a leaf), as the
// responder's key lookups do.
func (cd *RNIC) countCompletionError(c *CQ, e *abi.CQE) {
	if c != nil {
		c.errCQEs.Add(1)
	}
	if int(e.Status) >= maxWCStatus {
		return
	}
	if q := cd.LookupQP(e.QPNum); q != nil {
		q.counters().wc[e.Status].Add(1)
	}
}

// countUDDrop counts a datagram dropped at q, on q and on its device.
func (q *QP) countUDDrop() {
	q.counters().udDropped.Add(1)
	if q.Dev != nil {
		q.Dev.udDropped.Add(1)
	}
}
