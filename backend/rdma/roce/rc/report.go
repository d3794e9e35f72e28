package rc

// Report is what a connected QP's transport tells an operator about it
// (the daemon's resource views): where its sequence numbers stand, how
// many paths it uses and what went wrong on the wire.
type Report struct {
	// SQPSN is the PSN of the next request packet the requester sends,
	// RQPSN the PSN the responder expects next; HasPSN is false for a
	// transport whose packets do not carry the QP's PSNs (a sprayed
	// QP's own sequence space).
	SQPSN, RQPSN uint32
	HasPSN       bool
	// Paths is the number of paths the QP's packets take: 1 for plain
	// RoCEv2.
	Paths int
	// Counters: packets sent again, retransmit timer expiries, RNR,
	// PSN sequence and other NAKs, duplicates answered, and packets
	// dropped (out of sequence, stale, invalid, or for a QP in error).
	Retransmits, Timeouts    uint64
	RNRNAKsSent, RNRNAKsRecv uint64
	SeqNAKsSent, SeqNAKsRecv uint64
	NAKsSent, NAKsRecv       uint64
	Duplicates, Dropped      uint64
}

// Reporter is a transport (rc.Conn) that reports on itself; *QP and the
// connections built on it are.
type Reporter interface {
	Report() Report
}

// Report returns the QP's sequence numbers and counters. It takes q.mu
// for the PSNs, so it must not be called with a lock the QP calls its
// Host or Port with.
func (q *QP) Report() Report {
	c := q.Counters()
	q.mu.Lock()
	sq, rq := uint32(q.req.psn), uint32(q.resp.epsn)
	q.mu.Unlock()
	return Report{
		SQPSN: sq, RQPSN: rq, HasPSN: true, Paths: 1,
		Retransmits: c.Retransmits, Timeouts: c.Timeouts,
		RNRNAKsSent: c.RNRNAKsSent, RNRNAKsRecv: c.RNRNAKsRecv,
		SeqNAKsSent: c.SeqNAKsSent, SeqNAKsRecv: c.SeqNAKsRecv,
		NAKsSent: c.NAKsSent, Duplicates: c.Duplicates,
		Dropped: c.OutOfSeq + c.DropStale + c.DropInvalid + c.DropState,
	}
}
