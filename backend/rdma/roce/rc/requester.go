package rc

import (
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// swqe is a send work request in the send queue.
type swqe struct {
	wr      SendWR
	started bool     // its first packet was sent: psn and npkts are set
	psn     roce.PSN // first PSN
	npkts   uint32   // PSNs it takes (a READ takes one per response packet)
	got     uint32   // READ: bytes of response placed, in order
	done    bool     // READ or atomic: the whole response arrived
}

func (w *swqe) last() roce.PSN { return w.psn.Add(w.npkts - 1) }

// contains reports whether psn is one of w's PSNs. Precondition: started.
func (w *swqe) contains(psn roce.PSN) bool {
	d := psn.Diff(w.psn)
	return d >= 0 && uint32(d) < w.npkts
}

// requester is the send side's state; all of it is protected by QP.mu.
//
// Work requests live in sq between head (the oldest not completed) and
// tail; cur is the one being sent, off the bytes of it sent, psn the PSN of
// the next packet. Go-back-N moves cur, off and psn back; a work request's
// PSNs are fixed when it is first sent, so that its packets carry the same
// PSNs when sent again.
type requester struct {
	sq              []swqe
	head, cur, tail uint64
	off             uint32
	psn             roce.PSN // next PSN to send
	high            roce.PSN // next PSN never sent: every PSN before it was
	una             roce.PSN // oldest PSN not acknowledged
	noack           int      // packets since one asked for an ACK
	rdOut           int      // READs and atomics started and not done
	cwnd            int      // congestion window, packets: minCwnd .. Config.Window
	ssthresh        int      // slow start threshold
	caAcked         int      // packets acknowledged towards the next increase
	retries         int      // timeouts since progress
	fastRetx        bool     // went back to fastPSN for a lost response
	fastPSN         roce.PSN
	rnrUsed         int // RNR NAKs since progress
	deadline        time.Time
	rnrUntil        time.Time
}

func (r *requester) init(c *Config) {
	r.sq = make([]swqe, c.SQSize)
	r.psn, r.high, r.una = c.SQPSN, c.SQPSN, c.SQPSN
	r.cwnd = min(c.Window, initialCwnd)
	r.ssthresh = c.Window
}

// The congestion window: go-back-N resends everything after a loss, so a
// receiver or a hop that drops for lack of buffer would see the same burst
// again and drop it again. As TCP Reno's: the window grows by the packets
// acknowledged below ssthresh (slow start) and by about one packet per
// window above it; a sequence NAK halves it, a timeout drops it to
// minCwnd. It never exceeds Config.Window.
const (
	initialCwnd = 64
	minCwnd     = 4
)

func (r *requester) grow(acked int32, max int) {
	if r.cwnd < r.ssthresh {
		r.cwnd = min(max, r.cwnd+int(acked))
		return
	}
	r.caAcked += int(acked)
	if r.caAcked >= r.cwnd {
		r.caAcked = 0
		r.cwnd = min(max, r.cwnd+1)
	}
}

func (r *requester) shrink(timeout bool) {
	r.ssthresh = max(minCwnd, r.cwnd/2)
	if timeout {
		r.cwnd = minCwnd
	} else {
		r.cwnd = r.ssthresh
	}
	r.caAcked = 0
}

func (r *requester) at(i uint64) *swqe { return &r.sq[i%uint64(len(r.sq))] }

// push appends wr; false when the queue is full.
func (r *requester) push(wr SendWR) bool {
	if r.tail-r.head == uint64(len(r.sq)) {
		return false
	}
	*r.at(r.tail) = swqe{wr: wr}
	r.tail++
	return true
}

// outstanding reports whether a sent packet is not acknowledged yet.
func (r *requester) outstanding() bool { return r.una != r.high }

// pump sends up to budget packets of new or rewound work; it returns how
// many it sent.
func (r *requester) pump(q *QP, budget int) int {
	if !r.rnrUntil.IsZero() {
		return 0
	}
	sent := 0
	pmtu := uint32(q.cfg.PMTU)
	for sent < budget && r.cur != r.tail {
		if r.psn.Diff(r.una) >= int32(r.cwnd) {
			break
		}
		w := r.at(r.cur)
		if !w.started {
			if w.wr.Opcode.needsResponse() && r.rdOut >= q.cfg.MaxRdAtomic {
				break
			}
			if w.wr.Fence && r.rdOut > 0 {
				break
			}
			w.started, w.psn, w.npkts = true, r.psn, 1
			if !w.wr.Opcode.isAtomic() {
				w.npkts = npkts(w.wr.Length, q.cfg.PMTU)
			}
			if w.wr.Opcode.needsResponse() {
				r.rdOut++
			}
		}
		if r.psn.Before(r.high) {
			q.ctr.retransmits.Add(1)
		}
		var adv uint32
		switch op := w.wr.Opcode; {
		case op == WRRDMARead:
			a := roce.Packet{BTH: q.bth(roce.OpReadRequest, r.psn)}
			a.BTH.AckReq = true
			a.RETH = roce.RETH{VA: w.wr.RemoteAddr + uint64(r.off), RKey: w.wr.RKey, DMALen: w.wr.Length - r.off}
			q.emit(&a)
			adv = npkts(w.wr.Length-r.off, q.cfg.PMTU)
			r.off = w.wr.Length
		case op.isAtomic():
			code := roce.OpFetchAdd
			if op == WRAtomicCmpSwp {
				code = roce.OpCompareSwap
			}
			a := roce.Packet{BTH: q.bth(code, r.psn)}
			a.BTH.AckReq = true
			a.AtomicETH = roce.AtomicETH{VA: w.wr.RemoteAddr, RKey: w.wr.RKey, SwapAdd: w.wr.SwapAdd, Compare: w.wr.Compare}
			q.emit(&a)
			adv, r.off = 1, w.wr.Length
		default:
			n := min(pmtu, w.wr.Length-r.off)
			a := roce.Packet{BTH: q.bth(sendOpcode(op, w.wr.Length, r.off, n), r.psn)}
			last := r.off+n == w.wr.Length
			if a.BTH.Opcode.Ext()&roce.ExtRETH != 0 {
				a.RETH = roce.RETH{VA: w.wr.RemoteAddr, RKey: w.wr.RKey, DMALen: w.wr.Length}
			}
			a.ImmDt, a.IETH = w.wr.Imm, w.wr.Invalidate
			a.BTH.SE = last && w.wr.Solicited
			// Ask for an ACK at the end of a message and every
			// quarter window (at most every ackEvery packets), so that
			// ACKs clock the window open even when it is smaller than
			// a message.
			r.noack++
			if last || r.noack >= min(ackEvery, max(1, r.cwnd/4)) {
				a.BTH.AckReq, r.noack = true, 0
			}
			payload := q.payloadRoom(&a, n)
			if n > 0 {
				if err := w.wr.Local.Gather(r.off, payload); err != nil {
					q.dropPayload()
					q.failAt(r.cur, abi.WCLocProtErr)
					return sent
				}
			}
			q.emitPayload(&a, payload)
			adv = 1
			r.off += n
		}
		sent++
		r.psn = r.psn.Add(adv)
		if r.psn.After(r.high) {
			r.high = r.psn
		}
		if r.off == w.wr.Length {
			r.cur++
			r.off = 0
		}
		if r.deadline.IsZero() {
			r.deadline = q.now().Add(q.cfg.Timeout)
		}
	}
	return sent
}

// sendOpcode is the opcode of the SEND or WRITE packet of n bytes at off in
// a message of length bytes.
func sendOpcode(op WROpcode, length, off, n uint32) roce.Opcode {
	first, last := off == 0, off+n == length
	var seg int // 0 only, 1 first, 2 middle, 3 last
	switch {
	case first && last:
		seg = 0
	case first:
		seg = 1
	case last:
		seg = 3
	default:
		seg = 2
	}
	switch op {
	case WRSend:
		return [4]roce.Opcode{roce.OpSendOnly, roce.OpSendFirst, roce.OpSendMiddle, roce.OpSendLast}[seg]
	case WRSendWithImm:
		return [4]roce.Opcode{roce.OpSendOnlyWithImmediate, roce.OpSendFirst, roce.OpSendMiddle, roce.OpSendLastWithImmediate}[seg]
	case WRSendWithInv:
		// The IETH rides on the last packet only (rxe_opcode.c).
		return [4]roce.Opcode{roce.OpSendOnlyWithInvalidate, roce.OpSendFirst, roce.OpSendMiddle, roce.OpSendLastWithInvalidate}[seg]
	}
	imm := op == WRRDMAWriteWithImm
	return [2][4]roce.Opcode{
		{roce.OpWriteOnly, roce.OpWriteFirst, roce.OpWriteMiddle, roce.OpWriteLast},
		{roce.OpWriteOnlyWithImmediate, roce.OpWriteFirst, roce.OpWriteMiddle, roce.OpWriteLastWithImmediate},
	}[b2i(imm)][seg]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// seek moves the send cursor to PSN to, which must be in [una, high]: the
// go-back-N of a NAK, a timeout or an RNR wait. A READ restarts at its
// first missing response. It returns false (and changes nothing) when no
// sent work request holds to.
func (r *requester) seek(q *QP, to roce.PSN) bool {
	if to.Before(r.una) || to.After(r.high) {
		return false
	}
	for i := r.head; i != r.tail; i++ {
		w := r.at(i)
		if !w.started {
			if to != r.high {
				return false
			}
			r.cur, r.off, r.psn = i, 0, to
			return true
		}
		if !w.contains(to) {
			continue
		}
		r.cur = i
		switch {
		case w.wr.Opcode == WRRDMARead:
			r.off = w.got
			r.psn = w.psn.Add(w.got / uint32(q.cfg.PMTU))
		case w.wr.Opcode.isAtomic():
			r.off, r.psn = 0, w.psn
		default:
			r.off = uint32(to.Diff(w.psn)) * uint32(q.cfg.PMTU)
			r.psn = to
		}
		r.noack = 0
		return true
	}
	if to == r.high {
		r.cur, r.off, r.psn = r.tail, 0, to
		return true
	}
	return false
}

// completeHead completes the oldest work request with status.
func (q *QP) completeHead(status abi.WCStatus) {
	r := &q.req
	w := r.at(r.head)
	c := Completion{ID: w.wr.ID, Opcode: w.wr.Opcode, Status: status}
	if status == abi.WCSuccess {
		c.ByteLen = w.wr.Length
	}
	if w.started && w.wr.Opcode.needsResponse() && !w.done {
		r.rdOut--
	}
	*w = swqe{}
	r.head++
	if r.cur < r.head {
		r.cur, r.off = r.head, 0
	}
	q.host.SendDone(c)
}

// failAt fails the QP because of work request i: it completes with
// status, the ones before it (not acknowledged) and after it with
// WCWRFlushErr.
func (q *QP) failAt(i uint64, status abi.WCStatus) {
	for q.req.head != i && q.req.head != q.req.tail {
		q.completeHead(abi.WCWRFlushErr)
	}
	q.fail(status)
}

// flush completes every work request: the head one with status, the
// others with WCWRFlushErr.
func (r *requester) flush(q *QP, status abi.WCStatus) {
	for r.head != r.tail {
		q.completeHead(status)
		status = abi.WCWRFlushErr
	}
	r.deadline, r.rnrUntil = time.Time{}, time.Time{}
}

// tick runs the retransmit timer and ends RNR waits.
func (q *QP) tick(now time.Time) {
	r := &q.req
	if !r.rnrUntil.IsZero() {
		if now.Before(r.rnrUntil) {
			return
		}
		r.rnrUntil = time.Time{}
		r.deadline = now.Add(q.cfg.Timeout)
		return
	}
	if r.deadline.IsZero() || now.Before(r.deadline) {
		return
	}
	if !r.outstanding() {
		r.deadline = time.Time{}
		return
	}
	q.ctr.timeouts.Add(1)
	if r.retries >= q.cfg.RetryCnt {
		q.fail(abi.WCRetryExcErr)
		return
	}
	r.retries++
	r.shrink(true)
	r.seek(q, r.una)
	r.deadline = now.Add(q.cfg.Timeout)
}
