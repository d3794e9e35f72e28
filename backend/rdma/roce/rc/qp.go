package rc

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Counters count what a QP did and what it refused, by reason.
type Counters struct {
	RxRequests  uint64 // in-sequence requests executed
	RxResponses uint64 // ACKs, NAKs and responses that advanced the requester
	TxPackets   uint64 // packets sent (retransmissions included)
	Retransmits uint64 // packets sent again (go-back-N)
	Timeouts    uint64 // retransmit timer expiries
	SeqNAKsSent uint64 // PSN sequence error NAKs sent
	SeqNAKsRecv uint64 // PSN sequence error NAKs received
	RNRNAKsSent uint64
	RNRNAKsRecv uint64
	Duplicates  uint64 // duplicate requests answered (re-ACK, READ again, atomic replay)
	OutOfSeq    uint64 // requests beyond the expected PSN (dropped, NAKed once)
	DropStale   uint64 // responses for nothing outstanding, or out of order
	DropInvalid uint64 // packets against the protocol (wrong opcode, length, PMTU)
	DropState   uint64 // packets to a QP in the error state
	NAKsSent    uint64 // invalid request, remote access and operational error NAKs
}

// counters are the atomics behind Counters (read without the QP lock).
type counters struct {
	rxRequests, rxResponses, txPackets, retransmits, timeouts      atomic.Uint64
	seqNAKsSent, seqNAKsRecv, rnrNAKsSent, rnrNAKsRecv, duplicates atomic.Uint64
	outOfSeq, dropStale, dropInvalid, dropState, naksSent          atomic.Uint64
}

// QP is the RC transport of one connected queue pair: requester, responder
// and completer. Its methods are safe for concurrent use; all of them take
// q.mu, and call Host and Port with it held.
type QP struct {
	// cfg is immutable after New but for the requester's fields, which
	// Start sets under mu (QPN, DestQPN and PMTU never change).
	cfg  Config
	host Host        // immutable
	port Port        // immutable
	ipp  InPlacePort // immutable: port, if it is one (nil otherwise)

	ctr counters

	mu      sync.Mutex
	err     bool      // protected by mu: the QP is in the error state
	closed  bool      // protected by mu
	started bool      // protected by mu: Start ran (RTS); Post works
	frozen  bool      // protected by mu: Freeze ran, Thaw not yet: nothing is sent or received
	pkt     []byte    // protected by mu: the packet being built
	data    []byte    // protected by mu: gathered payload (without an InPlacePort)
	room    []byte    // protected by mu: the InPlacePort's room for the packet being built
	req     requester // protected by mu
	resp    responder // protected by mu
}

// New returns a connected QP (in RTS). host and port must not be nil.
func New(cfg Config, host Host, port Port) (*QP, error) {
	q, err := NewRTR(cfg, host, port)
	if err == nil {
		q.started = true
	}
	return q, err
}

// NewRTR returns a connected QP in RTR: its responder answers requests at
// once, while its requester waits for Start (Post fails with ErrState
// until then). This is MODIFY_QP's order: INIT→RTR gives the responder's
// attributes, RTR→RTS the requester's (Config.SQPSN, Timeout, RetryCnt,
// RNRRetry, MaxRdAtomic), which NewRTR takes as placeholders.
func NewRTR(cfg Config, host Host, port Port) (*QP, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if host == nil || port == nil {
		return nil, fmt.Errorf("%w: nil host or port", ErrConfig)
	}
	q := &QP{
		cfg:  cfg,
		host: host,
		port: port,
		pkt:  make([]byte, 0, roce.BTHLen+roce.RETHLen+roce.ImmDtLen+roce.MaxPayload+roce.ICRCLen+8),
		data: make([]byte, roce.MaxPayload),
	}
	q.ipp, _ = port.(InPlacePort)
	q.req.init(&q.cfg)
	q.resp.init(&q.cfg)
	return q, nil
}

// Start moves a QP made by NewRTR to RTS: the requester takes cfg's
// SQPSN, Timeout, RetryCnt, RNRRetry and MaxRdAtomic (the other fields are
// ignored) and Post works from then on. It fails with ErrConfig for
// invalid values and ErrState once the QP is closed, in error or started.
func (q *QP) Start(cfg Config) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err || q.closed || q.started {
		return ErrState
	}
	if q.frozen {
		return ErrFrozen
	}
	c := q.cfg
	c.SQPSN, c.Timeout, c.RetryCnt, c.RNRRetry, c.MaxRdAtomic = cfg.SQPSN, cfg.Timeout, cfg.RetryCnt, cfg.RNRRetry, cfg.MaxRdAtomic
	if err := c.fill(); err != nil {
		return err
	}
	q.cfg = c
	q.req.init(&q.cfg)
	q.started = true
	return nil
}

// QPN returns the local QP number.
func (q *QP) QPN() uint32 { return q.cfg.QPN }

// DestQPN returns the peer's QP number.
func (q *QP) DestQPN() uint32 { return q.cfg.DestQPN }

// Counters returns a snapshot of the QP's counters.
func (q *QP) Counters() Counters {
	c := &q.ctr
	return Counters{
		RxRequests: c.rxRequests.Load(), RxResponses: c.rxResponses.Load(), TxPackets: c.txPackets.Load(),
		Retransmits: c.retransmits.Load(), Timeouts: c.timeouts.Load(), SeqNAKsSent: c.seqNAKsSent.Load(),
		SeqNAKsRecv: c.seqNAKsRecv.Load(), RNRNAKsSent: c.rnrNAKsSent.Load(), RNRNAKsRecv: c.rnrNAKsRecv.Load(),
		Duplicates: c.duplicates.Load(), OutOfSeq: c.outOfSeq.Load(), DropStale: c.dropStale.Load(),
		DropInvalid: c.dropInvalid.Load(), DropState: c.dropState.Load(), NAKsSent: c.naksSent.Load(),
	}
}

// Err reports whether the QP is in the error state.
func (q *QP) Err() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// Post queues a send work request and starts sending it. It returns
// ErrQueueFull, ErrState, ErrFrozen (until Thaw) or a *WRError without
// queueing anything.
func (q *QP) Post(wr SendWR) error {
	if !wr.Opcode.Valid() {
		return &WRError{ID: wr.ID, Reason: "opcode " + wr.Opcode.String()}
	}
	switch {
	case wr.Length > abi.MaxMsgSize:
		return &WRError{ID: wr.ID, Reason: fmt.Sprintf("length %d beyond %d", wr.Length, abi.MaxMsgSize)}
	case wr.Opcode.isAtomic() && (wr.Length != 8 || wr.RemoteAddr%8 != 0):
		return &WRError{ID: wr.ID, Reason: fmt.Sprintf("atomic of %d bytes at %#x, want 8 aligned", wr.Length, wr.RemoteAddr)}
	case wr.Length > 0 && wr.Local == nil:
		return &WRError{ID: wr.ID, Reason: "no local buffer"}
	}
	q.mu.Lock()
	if q.err || q.closed || !q.started {
		q.mu.Unlock()
		return ErrState
	}
	if q.frozen {
		q.mu.Unlock()
		return ErrFrozen
	}
	if !q.req.push(wr) {
		q.mu.Unlock()
		return ErrQueueFull
	}
	flush := q.pumpLocked()
	q.mu.Unlock()
	if flush {
		q.port.Flush()
	}
	return nil
}

// Receive handles one packet for this QP, parsed by roce.Parse and with a
// verified ICRC. p.Payload may be reused once Receive returns. Replies, and
// the requests an ACK let out, are queued on the Port; the caller calls
// Flush after a batch of packets, so that ACKs are coalesced and the
// packets leave together.
//
// It reports whether the packet was accepted: it moved the QP forward —
// a request at the expected PSN that the responder took (the expected PSN
// advanced), or a response that acknowledged or answered something
// outstanding (the oldest unacknowledged PSN advanced). Duplicates, PSNs
// out of sequence, NAKs, stale responses and refused packets are not.
// Only a sender that knows the connection's PSNs gets a packet accepted;
// the owner may trust the packet's source from then on (package udp
// learns the peer's source port from it).
func (q *QP) Receive(p *roce.Packet) (accepted bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err || q.closed || q.frozen {
		q.ctr.dropState.Add(1)
		return false
	}
	// The default partition only (what rxe and vrdma send): P_Key
	// 0xffff, or 0x7fff from a limited member.
	if err := p.CheckPMTU(q.cfg.PMTU); err != nil || p.BTH.PKey&0x7fff != 0x7fff {
		q.ctr.dropInvalid.Add(1)
		return false
	}
	// Both only move forward: a change is progress.
	epsn, una := q.resp.epsn, q.req.una
	switch op := p.BTH.Opcode; {
	case isResponse(op):
		q.complete(p)
	default:
		q.respond(p)
	}
	if !q.err {
		q.pumpLocked() // the caller's Flush sends it
	}
	return q.resp.epsn != epsn || q.req.una != una
}

// Flush sends the coalesced ACK, if any, and flushes the Port (after
// releasing the QP's lock: the system call does not hold up the QP's
// other callers).
func (q *QP) Flush() {
	q.mu.Lock()
	if !q.err && !q.closed && !q.frozen && q.resp.jobs.n == 0 {
		q.sendPendingAck()
	}
	q.mu.Unlock()
	q.port.Flush()
}

// Pump sends up to Config.Burst packets of pending work (READ responses,
// then requests) and calls Port.Wake when more remains; otherwise it
// flushes the Port.
func (q *QP) Pump() {
	q.mu.Lock()
	flush := true
	if !q.err && !q.closed && !q.frozen {
		flush = q.pumpLocked()
	}
	q.mu.Unlock()
	if flush {
		q.port.Flush()
	}
}

// Tick runs the timers: the retransmit timeout and the end of an RNR wait.
// The owner calls it periodically (a fraction of Config.Timeout).
func (q *QP) Tick() {
	q.mu.Lock()
	if q.err || q.closed || q.frozen {
		q.mu.Unlock()
		return
	}
	q.tick(q.cfg.Clock())
	flush := false
	if !q.err {
		flush = q.pumpLocked()
	}
	q.mu.Unlock()
	if flush {
		q.port.Flush()
	}
}

// Close moves the QP to the error state: the outstanding send work
// requests complete with WCWRFlushErr and nothing is sent any more. It is
// idempotent.
func (q *QP) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.closed = true
	q.fail(abi.WCWRFlushErr)
}

// pumpLocked sends up to Burst packets and wakes the owner if more remain.
// It reports whether the caller should flush the Port once it released the
// lock: it sent something and did not ask for a Wake (the Pump that
// follows a Wake flushes, so that a long run of packets leaves in large
// batches).
func (q *QP) pumpLocked() (flush bool) {
	budget := q.cfg.Burst
	budget -= q.resp.pump(q, budget)
	if budget > 0 {
		budget -= q.req.pump(q, budget)
	}
	if budget <= 0 {
		q.port.Wake()
		return false
	}
	return budget < q.cfg.Burst
}

// fail puts the QP in the error state: the head work request, if any
// unfinished, completes with status (unless status is WCWRFlushErr) and
// every other one with WCWRFlushErr.
func (q *QP) fail(status abi.WCStatus) {
	if q.err {
		return
	}
	q.err = true
	if f, ok := q.host.(Failer); ok && !q.closed {
		f.Failed(q.resp.fatal)
	}
	q.req.flush(q, status)
	q.resp.reset()
}

// emit encodes p into the QP's packet buffer and hands it to the Port.
func (q *QP) emit(p *roce.Packet) {
	b, err := p.Append(q.pkt[:0])
	if err != nil {
		// A bug of this package, not of the peer: count and drop.
		q.ctr.dropInvalid.Add(1)
		return
	}
	q.pkt = b[:0]
	q.ctr.txPackets.Add(1)
	q.port.Send(b)
}

// payloadRoom starts a packet with n bytes of payload, a's opcode set: it
// returns where the payload goes, which the caller fills before
// emitPayload (or dropPayload on failure). With an InPlacePort that is its
// place in the Port's room, and the payload is copied once; otherwise
// q.data, which emitPayload encodes from.
func (q *QP) payloadRoom(a *roce.Packet, n uint32) []byte {
	if q.ipp == nil {
		return q.data[:n]
	}
	hl := a.BTH.Opcode.HeaderLen()
	total := hl + int(n) + (-int(n) & 3) + roce.ICRCLen
	q.room = q.ipp.Reserve(total)
	if len(q.room) < total { // beyond the Port's packets: Send will refuse it
		q.ipp.Commit(nil)
		q.room = nil
		return q.data[:n]
	}
	return q.room[hl : hl+int(n)]
}

// emitPayload sends a, whose payload payloadRoom returned and the caller
// filled.
func (q *QP) emitPayload(a *roce.Packet, payload []byte) {
	if q.room == nil {
		a.Payload = payload
		q.emit(a)
		return
	}
	room := q.room[:len(q.room):len(q.room)]
	q.room = nil
	if err := a.Encode(room, len(payload)); err != nil {
		q.ctr.dropInvalid.Add(1) // a bug of this package, as in emit
		q.ipp.Commit(nil)
		return
	}
	q.ctr.txPackets.Add(1)
	q.ipp.Commit(room)
}

// dropPayload abandons the packet payloadRoom started.
func (q *QP) dropPayload() {
	if q.room != nil {
		q.room = nil
		q.ipp.Commit(nil)
	}
}

func (q *QP) bth(op roce.Opcode, psn roce.PSN) roce.BTH {
	return roce.BTH{Opcode: op, PKey: 0xffff, DestQP: q.cfg.DestQPN, PSN: psn}
}

func (q *QP) now() time.Time { return q.cfg.Clock() }

func isResponse(op roce.Opcode) bool {
	return op >= roce.OpReadResponseFirst && op <= roce.OpAtomicAcknowledge
}
