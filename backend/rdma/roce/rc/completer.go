package rc

import (
	"encoding/binary"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// complete handles a response (ACK, NAK, READ response, atomic ACK): the
// completer, IBA 9.7.5.2.
func (q *QP) complete(p *roce.Packet) {
	r := &q.req
	psn := p.BTH.PSN
	// Every response names a PSN that was sent: [una-1, high). una-1 is
	// the re-ACK of duplicates, which acknowledges nothing new.
	if !psn.Before(r.high) || psn.Before(r.una.Add(uint32(roce.PSNMask))) {
		q.ctr.dropStale.Add(1)
		return
	}
	switch p.BTH.Opcode {
	case roce.OpAcknowledge:
		q.ack(p)
	case roce.OpAtomicAcknowledge:
		q.atomicAck(p)
	default:
		q.readResponse(p)
	}
}

// ack handles an ACKNOWLEDGE: an ACK, an RNR NAK or a NAK.
func (q *QP) ack(p *roce.Packet) {
	r := &q.req
	psn := p.BTH.PSN
	syn := p.AETH.Syndrome
	switch syn.Type() {
	case roce.AckTypeACK:
		if !q.ackThrough(psn) {
			q.ctr.dropStale.Add(1)
			return
		}
		q.ctr.rxResponses.Add(1)
	case roce.AckTypeRNRNAK:
		q.ackThrough(psn.Add(uint32(roce.PSNMask)))
		if q.err {
			return
		}
		q.ctr.rnrNAKsRecv.Add(1)
		if q.cfg.RNRRetry != 7 {
			if r.rnrUsed >= q.cfg.RNRRetry {
				q.fail(abi.WCRNRRetryExcErr)
				return
			}
			r.rnrUsed++
		}
		if !r.seek(q, psn) {
			q.ctr.dropStale.Add(1)
			return
		}
		r.rnrUntil = q.now().Add(RNRTime(syn.Value()))
		r.deadline = r.rnrUntil.Add(q.cfg.Timeout)
	default: // NAK
		q.ackThrough(psn.Add(uint32(roce.PSNMask)))
		if q.err {
			return
		}
		switch code := roce.NAKCode(syn.Value()); code {
		case roce.NAKPSNSequenceError:
			// Go back to the PSN the responder expects. This does not
			// use up retry_cnt: the NAK shows the responder alive, and
			// the retransmit timer, which restarts only on progress,
			// still bounds a connection that makes none.
			q.ctr.seqNAKsRecv.Add(1)
			if !r.seek(q, psn) {
				q.ctr.dropStale.Add(1)
				return
			}
			r.shrink(false)
		case roce.NAKInvalidRequest:
			q.fail(abi.WCRemInvReqErr)
		case roce.NAKRemoteAccessError:
			q.fail(abi.WCRemAccessErr)
		default:
			q.fail(abi.WCRemOpErr)
		}
	}
}

// ackThrough acknowledges every PSN up to and including a: the work
// requests whose packets are all acknowledged complete in order. A READ
// or atomic the responder acknowledged past without its response arriving
// lost its response: the requester asks again. It reports progress.
func (q *QP) ackThrough(a roce.PSN) bool {
	r := &q.req
	next := a.Add(1)
	if !next.After(r.una) {
		return false
	}
	for r.head != r.tail {
		w := r.at(r.head)
		if !w.started {
			break
		}
		if w.wr.Opcode.needsResponse() && !w.done {
			// Nothing of a READ or atomic is acknowledged before its
			// response arrives. Acknowledged past it, its response
			// was lost (or is overtaken by this ACK): ask again from
			// the first missing packet.
			first := w.psn.Add(w.got / uint32(q.cfg.PMTU))
			if first.Before(next) {
				// Once per missing PSN (a fast retransmit): a
				// storm of later responses must not make a storm
				// of requests; the timer recovers the rest.
				if !w.last().After(a) && !(r.fastRetx && r.fastPSN == first) {
					r.fastRetx, r.fastPSN = true, first
					r.seek(q, first)
				}
				next = first
			}
			break
		}
		if w.last().After(a) {
			break
		}
		q.completeHead(abi.WCSuccess)
	}
	q.progress(next)
	return true
}

// progress records that every PSN before next is acknowledged.
func (q *QP) progress(next roce.PSN) {
	r := &q.req
	if next.After(r.una) {
		r.grow(next.Diff(r.una), q.cfg.Window)
		r.una = next
		r.retries, r.rnrUsed = 0, 0
		r.fastRetx = false
	}
	if r.psn.Before(r.una) {
		r.seek(q, r.una)
	}
	if r.outstanding() {
		r.deadline = q.now().Add(q.cfg.Timeout)
	} else {
		r.deadline = time.Time{}
	}
}

// responseHead takes a READ response or atomic ACK at psn as the ACK of
// everything before it and returns the head work request, which it must
// answer; nil when the QP failed or nothing is outstanding (counted).
func (q *QP) responseHead(psn roce.PSN) *swqe {
	r := &q.req
	q.ackThrough(psn.Add(uint32(roce.PSNMask)))
	if q.err {
		return nil
	}
	if r.head == r.tail {
		q.ctr.dropStale.Add(1)
		return nil
	}
	return r.at(r.head)
}

// readResponse places one READ response packet, in PSN order.
func (q *QP) readResponse(p *roce.Packet) {
	r := &q.req
	psn := p.BTH.PSN
	w := q.responseHead(psn)
	if w == nil {
		return
	}
	pmtu := uint32(q.cfg.PMTU)
	if !w.started || w.wr.Opcode != WRRDMARead || w.done || psn != w.psn.Add(w.got/pmtu) {
		q.ctr.dropStale.Add(1)
		return
	}
	n := uint32(len(p.Payload))
	seg := p.BTH.Opcode.Segment()
	lastPkt := seg == roce.SegmentLast || seg == roce.SegmentOnly
	if n != min(pmtu, w.wr.Length-w.got) || lastPkt != (w.got+n == w.wr.Length) {
		q.ctr.dropInvalid.Add(1)
		return
	}
	if n > 0 {
		if err := w.wr.Local.Scatter(w.got, p.Payload); err != nil {
			q.fail(abi.WCLocProtErr)
			return
		}
	}
	w.got += n
	q.ctr.rxResponses.Add(1)
	if lastPkt {
		w.done = true
		r.rdOut--
		q.completeHead(abi.WCSuccess)
	}
	q.progress(psn.Add(1))
}

// atomicAck places an atomic's original value.
func (q *QP) atomicAck(p *roce.Packet) {
	r := &q.req
	psn := p.BTH.PSN
	w := q.responseHead(psn)
	if w == nil {
		return
	}
	if !w.started || !w.wr.Opcode.isAtomic() || w.done || psn != w.psn {
		q.ctr.dropStale.Add(1)
		return
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], p.AtomicAckETH.OrigData)
	if err := w.wr.Local.Scatter(0, b[:]); err != nil {
		q.fail(abi.WCLocProtErr)
		return
	}
	w.done = true
	r.rdOut--
	q.ctr.rxResponses.Add(1)
	q.completeHead(abi.WCSuccess)
	q.progress(psn.Add(1))
}
