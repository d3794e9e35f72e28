package spray

import (
	"sync/atomic"
	"time"
)

// Counters count what a Conn's spray side did and refused, by reason.
// The plain RC traffic is counted by QP().Counters().
type Counters struct {
	Hellos        uint64 // HELLOs sent
	Negotiated    uint64 // 1 once the peer answered
	Fallbacks     uint64 // 1 once the requester fell back to plain RC
	TxPackets     uint64 // DATA packets sent, retransmissions included
	Retransmits   uint64 // DATA packets sent again
	RxPackets     uint64 // DATA packets received
	Duplicates    uint64 // DATA packets already received (acknowledged again)
	Retired       uint64 // request messages executed in order
	AcksSent      uint64
	Probes        uint64 // PROBEs sent
	Timeouts      uint64 // QP retry timer expiries (no progress for Timeout)
	RNRNAKsSent   uint64
	RNRNAKsRecv   uint64
	NAKsSent      uint64
	NAKsRecv      uint64
	DropMalformed uint64 // refused by Parse or inconsistent with its message
	DropWindow    uint64 // beyond the PSN or message window
	DropStale     uint64 // ACKs or responses for nothing outstanding
	DropState     uint64 // before the peer's HELLO (a HELLO_ACK before Start), or after an error
	// DropToken counts HELLOs and HELLO_ACKs from the peer's address and
	// port whose token is not the connection's initial PSN (docs/wire.md
	// § 9.2); the endpoint counts them as wrong peer too.
	DropToken uint64
}

type counters struct {
	hellos, negotiated, fallbacks, txPackets, retransmits, rxPackets, duplicates, retired atomic.Uint64
	acksSent, probes, timeouts, rnrSent, rnrRecv, naksSent, naksRecv                      atomic.Uint64
	dropMalformed, dropWindow, dropStale, dropState, dropToken                            atomic.Uint64
}

// Counters returns a snapshot of the counters.
func (c *Conn) Counters() Counters {
	k := &c.ctr
	return Counters{
		Hellos: k.hellos.Load(), Negotiated: k.negotiated.Load(), Fallbacks: k.fallbacks.Load(),
		TxPackets: k.txPackets.Load(), Retransmits: k.retransmits.Load(), RxPackets: k.rxPackets.Load(),
		Duplicates: k.duplicates.Load(), Retired: k.retired.Load(), AcksSent: k.acksSent.Load(),
		Probes: k.probes.Load(), Timeouts: k.timeouts.Load(), RNRNAKsSent: k.rnrSent.Load(),
		RNRNAKsRecv: k.rnrRecv.Load(), NAKsSent: k.naksSent.Load(), NAKsRecv: k.naksRecv.Load(),
		DropMalformed: k.dropMalformed.Load(), DropWindow: k.dropWindow.Load(),
		DropStale: k.dropStale.Load(), DropState: k.dropState.Load(), DropToken: k.dropToken.Load(),
	}
}

type pathCounters struct {
	sent, retransmits, acked, lost, timeouts, tlps, downs, ups atomic.Uint64
}

// PathStats is one path's state and counters.
type PathStats struct {
	Local, Peer string // addresses
	Up          bool
	Cwnd        float64
	SRTT        time.Duration
	Loss        float64 // moving average of the fraction lost
	Sent        uint64  // packets sent on it, retransmissions included
	Retransmits uint64  // of which retransmissions
	Acked       uint64
	Lost        uint64 // declared lost (by later packets of the path, or a timeout)
	Timeouts    uint64 // times it was silent for its RTO while another path was not
	TailProbes  uint64 // PROBEs sent because its packets in flight went unanswered for its PTO
	Downs, Ups  uint64 // times it was taken out of use and back
}

// Paths returns the paths' state (nil before the peer is known).
func (c *Conn) Paths() []PathStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []PathStats
	for i := range c.tx.paths {
		p := &c.tx.paths[i]
		s := &p.stats
		out = append(out, PathStats{
			Local: p.route.Endpoint().LocalAddr().Addr().String(), Peer: p.route.Peer().Addr().String(),
			Up: p.up, Cwnd: p.cwnd, SRTT: p.srtt, Loss: p.loss,
			Sent: s.sent.Load(), Retransmits: s.retransmits.Load(), Acked: s.acked.Load(), Lost: s.lost.Load(),
			Timeouts: s.timeouts.Load(), TailProbes: s.tlps.Load(), Downs: s.downs.Load(), Ups: s.ups.Load(),
		})
	}
	return out
}
