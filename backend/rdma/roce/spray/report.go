package spray

import "github.com/vrdma/vrdma/backend/rdma/roce/rc"

var _ rc.Reporter = (*Conn)(nil)

// Report is rc.Reporter's: the plain RC QP's report while the requester
// speaks plain RC (or still negotiates), and once it sprays, the paths in
// use and the spray side's counters added to the plain QP's (which still
// answers the peer's plain requests). Sprayed DATA carries a sequence
// space of its own, so the PSNs are not reported then.
func (c *Conn) Report() rc.Report {
	r := c.qp.Report()
	if c.Mode() != Sprayed {
		return r
	}
	k := c.Counters()
	c.mu.Lock()
	r.Paths = len(c.tx.paths)
	c.mu.Unlock()
	r.HasPSN, r.SQPSN, r.RQPSN = false, 0, 0
	r.Retransmits += k.Retransmits
	r.Timeouts += k.Timeouts
	r.RNRNAKsSent += k.RNRNAKsSent
	r.RNRNAKsRecv += k.RNRNAKsRecv
	r.NAKsSent += k.NAKsSent
	r.NAKsRecv += k.NAKsRecv
	r.Duplicates += k.Duplicates
	r.Dropped += k.DropMalformed + k.DropWindow + k.DropStale + k.DropState + k.DropToken
	return r
}
