package rc

import (
	"fmt"

	"github.com/vrdma/vrdma/backend/rdma/roce"
)

// Freeze stops the QP and returns its state: from then on it sends
// nothing and takes no packet (Receive drops them, counted in DropState:
// the peer sends them again), no work (Post and Start fail with
// ErrFrozen), and Tick, Pump and Flush do nothing, until Thaw. The ACK it
// owed leaves first (unless responses it queued hold it back), and the
// Port is flushed. It fails with ErrState for a QP in the error state or
// closed (there is nothing to carry). The owner stops its timers and
// receive path first (package udp: Endpoint.Freeze), so that nothing waits
// on the lock meanwhile.
func (q *QP) Freeze() (*ConnState, error) {
	q.mu.Lock()
	if q.err || q.closed {
		q.mu.Unlock()
		return nil, ErrState
	}
	if !q.frozen && q.resp.jobs.n == 0 {
		q.sendPendingAck()
	}
	q.frozen = true
	st := q.stateLocked()
	q.mu.Unlock()
	q.port.Flush()
	return st, nil
}

// Thaw undoes Freeze (a handover that was refused): the QP goes on where
// it stopped, and the owner's next Tick or Pump sends what waits.
func (q *QP) Thaw() {
	q.mu.Lock()
	q.frozen = false
	q.mu.Unlock()
}

// stateLocked exports the QP's state. Precondition: q.mu held.
func (q *QP) stateLocked() *ConnState {
	c := &q.cfg
	st := &ConnState{
		QPN: c.QPN, DestQPN: c.DestQPN, PMTU: int(c.PMTU), SQSize: c.SQSize,
		TimeoutNS: int64(c.Timeout), RetryCnt: c.RetryCnt, RNRRetry: c.RNRRetry, MinRNRTimer: c.MinRNRTimer,
		MaxRdAtomic: c.MaxRdAtomic, MaxDestRdAtomic: c.MaxDestRdAtomic, Window: c.Window, Burst: c.Burst,
		Started: q.started,
	}
	r := &q.req
	st.Requester = RequesterState{NextPSN: uint32(r.psn), UnackedPSN: uint32(r.una), HighPSN: uint32(r.high)}
	if n := r.tail - r.head; n > 0 {
		st.Requester.WQEs = make([]WQEState, 0, n)
	}
	for i := r.head; i != r.tail; i++ {
		w := r.at(i)
		ws := WQEState{
			ID: w.wr.ID, Opcode: uint8(w.wr.Opcode), Length: w.wr.Length, RemoteAddr: w.wr.RemoteAddr, RKey: w.wr.RKey,
			Imm: w.wr.Imm, Invalidate: w.wr.Invalidate, Compare: w.wr.Compare, SwapAdd: w.wr.SwapAdd,
			Fence: w.wr.Fence, Solicited: w.wr.Solicited, Started: w.started,
		}
		if w.started {
			ws.PSN, ws.Got = uint32(w.psn), w.got
		}
		if d, ok := w.wr.Local.(Describer); ok && w.wr.Length > 0 {
			l := d.Describe()
			ws.Local = &l
		}
		st.Requester.WQEs = append(st.Requester.WQEs, ws)
	}
	p := &q.resp
	rs := &st.Responder
	rs.ExpectedPSN, rs.MSN = uint32(p.epsn), p.msn
	switch p.in {
	case msgSend:
		rs.Recv = &RecvState{ID: p.recv.ID, Length: p.recv.Len, Offset: p.recvOff}
	case msgWrite:
		rs.Write = &WriteState{RKey: p.wRKey, VA: p.wVA, Left: p.wLeft, Total: p.wTotal}
	}
	for k := range p.jobs.n {
		j := &p.jobs.buf[(p.jobs.head+k)%len(p.jobs.buf)]
		if j.atomic {
			rs.Responses = append(rs.Responses, ResponseState{Atomic: true, PSN: uint32(j.psn), MSN: j.msn, Orig: j.orig})
		} else {
			rs.Responses = append(rs.Responses, ResponseState{PSN: uint32(j.psn), MSN: j.msn, RKey: j.rkey, VA: j.va, Left: j.left, First: j.first})
		}
	}
	// Oldest first: from the slot remember writes next.
	for k := range p.replay {
		e := &p.replay[(p.rNext+k)%len(p.replay)]
		if !e.valid {
			continue
		}
		if e.read {
			rs.Replay = append(rs.Replay, ReplayState{Read: true, PSN: uint32(e.psn), VA: e.va, RKey: e.rkey, Length: e.len})
		} else {
			rs.Replay = append(rs.Replay, ReplayState{PSN: uint32(e.psn), Orig: e.orig})
		}
	}
	return st
}

// Restore rebuilds a connected QP from st (Freeze's, in this or another
// process) over host and port: it validates st (Validate), takes its
// work requests' local memory and the receive being filled from host (a
// Rebuilder, when st has any) and resolves the remote regions of the
// WRITE being placed and of the queued READ responses again
// (Host.Resolve; a key that no longer resolves fails Restore). It sends
// nothing: the owner's first Pump retransmits from the oldest
// unacknowledged PSN (go-back-N, every later packet with its PSN), and
// its first Flush re-acknowledges the last PSN received, so that a peer
// whose ACK was lost goes on at once. Restore completes nothing: on error
// the host has seen no call but Resolve and Rebuilder's. The QP is
// frozen only if st is (ConnState.Frozen: Thaw lets it go).
func Restore(st *ConnState, host Host, port Port) (*QP, error) {
	if err := st.Validate(); err != nil {
		return nil, err
	}
	cfg, _ := st.config()
	q, err := NewRTR(cfg, host, port)
	if err != nil {
		return nil, err
	}
	q.started = st.Started
	q.frozen = st.Frozen
	rb, _ := host.(Rebuilder)
	if err := q.restoreRequester(&st.Requester, rb); err != nil {
		return nil, err
	}
	if err := q.restoreResponder(&st.Responder, rb); err != nil {
		return nil, err
	}
	return q, nil
}

func (q *QP) restoreRequester(rs *RequesterState, rb Rebuilder) error {
	r := &q.req
	r.una, r.high, r.psn = roce.PSN(rs.UnackedPSN), roce.PSN(rs.HighPSN), roce.PSN(rs.UnackedPSN)
	for i := range rs.WQEs {
		ws := &rs.WQEs[i]
		wr := SendWR{
			ID: ws.ID, Opcode: WROpcode(ws.Opcode), Length: ws.Length, RemoteAddr: ws.RemoteAddr, RKey: ws.RKey,
			Imm: ws.Imm, Invalidate: ws.Invalidate, Compare: ws.Compare, SwapAdd: ws.SwapAdd,
			Fence: ws.Fence, Solicited: ws.Solicited,
		}
		if wr.Length > 0 {
			if rb == nil {
				return fmt.Errorf("%w: work request %#x has data and the host rebuilds no buffer", ErrConnState, ws.ID)
			}
			b, err := rb.SendBuffer(ws)
			if err == nil && b == nil {
				err = fmt.Errorf("no buffer")
			}
			if err != nil {
				return fmt.Errorf("rc: restore work request %#x: %w", ws.ID, err)
			}
			wr.Local = b
		}
		w := swqe{wr: wr, started: ws.Started}
		if ws.Started {
			w.psn, w.got = roce.PSN(ws.PSN), ws.Got
			w.npkts = ws.packets(q.cfg.PMTU)
			if wr.Opcode.needsResponse() {
				r.rdOut++
			}
		}
		*r.at(r.tail) = w
		r.tail++
	}
	// Go back to the oldest unacknowledged PSN, as after a timeout.
	if !r.seek(q, r.una) {
		return fmt.Errorf("%w: no work request holds PSN %#x", ErrConnState, r.una)
	}
	return nil
}

func (q *QP) restoreResponder(rs *ResponderState, rb Rebuilder) error {
	p := &q.resp
	p.epsn, p.msn = roce.PSN(rs.ExpectedPSN), rs.MSN
	switch {
	case rs.Recv != nil:
		if rb == nil {
			return fmt.Errorf("%w: a receive in progress and the host rebuilds no buffer", ErrConnState)
		}
		b, err := rb.RecvBuffer(rs.Recv)
		if err == nil && b == nil {
			err = fmt.Errorf("no buffer")
		}
		if err != nil {
			return fmt.Errorf("rc: restore receive %#x: %w", rs.Recv.ID, err)
		}
		p.recv, p.recvOff, p.in = Recv{ID: rs.Recv.ID, Len: rs.Recv.Length, Buf: b}, rs.Recv.Offset, msgSend
	case rs.Write != nil:
		w := rs.Write
		var reg Region
		if w.Left > 0 {
			var ok bool
			if reg, ok = q.host.Resolve(w.RKey, w.VA, w.Left, AccessRemoteWrite); !ok {
				return fmt.Errorf("%w: WRITE in progress: rkey %#x does not resolve for %d bytes at %#x", ErrConnState, w.RKey, w.Left, w.VA)
			}
		}
		p.wRegion, p.wRKey, p.wVA, p.wLeft, p.wTotal, p.in = reg, w.RKey, w.VA, w.Left, w.Total, msgWrite
	}
	for i := range rs.Responses {
		j := &rs.Responses[i]
		if j.Atomic {
			p.jobs.push(respJob{atomic: true, psn: roce.PSN(j.PSN), msn: j.MSN, orig: j.Orig})
			continue
		}
		reg, ok := q.host.Resolve(j.RKey, j.VA, j.Left, AccessRemoteRead)
		if !ok {
			return fmt.Errorf("%w: READ response at PSN %#x: rkey %#x does not resolve for %d bytes at %#x", ErrConnState, j.PSN, j.RKey, j.Left, j.VA)
		}
		p.jobs.push(respJob{region: reg, rkey: j.RKey, va: j.VA, left: j.Left, first: j.First, psn: roce.PSN(j.PSN), msn: j.MSN})
	}
	for i := range rs.Replay {
		e := &rs.Replay[i]
		p.remember(replayEntry{read: e.Read, psn: roce.PSN(e.PSN), orig: e.Orig, va: e.VA, rkey: e.RKey, len: e.Length})
	}
	// Re-acknowledge the last PSN received: its ACK may have been lost
	// with the old process. A peer that saw it takes it as a duplicate.
	p.setAck(pendingAck{syn: roce.ACKSyndrome(31), psn: p.epsn.Add(uint32(roce.PSNMask)), msn: p.msn})
	return nil
}
