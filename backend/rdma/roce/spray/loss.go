package spray

// The sender's side of acknowledgements: what an ACK tells of the
// window and of each path (SACK, loss detection by time and by count,
// RTT samples), and RNR.

import (
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// ack handles the peer's ACK: selective acknowledgement, RTT sample,
// losses, completions, NAKs.
func (t *sender) ack(c *Conn, a *Ack) {
	now := c.now()
	if a.Path != noPath && int(a.Path) < len(t.paths) {
		// The echo names one transmission exactly (path and send time):
		// an RTT sample, and every earlier transmission of that path
		// arrived before it or was lost. Even a stale ACK's echo says so.
		// An echo from the future, or older than any packet can be in
		// flight, is not believed.
		if rtt := time.Duration(c.ts(now)-a.TS) * time.Microsecond; rtt <= maxEchoAge {
			t.rttSample(c, int(a.Path), rtt, now)
			t.deliveredAt(int(a.Path), a.TS, now)
		}
	}
	cum := int64(a.CumPSN.Diff(c.start.Add(uint32(t.una))))
	if cum < 0 || uint64(cum) > t.next-t.una {
		c.ctr.dropStale.Add(1)
		return
	}
	progress := false
	end := t.una + uint64(cum)
	for s := t.una; s != end; s++ {
		progress = t.sacked(c, s, now) || progress
	}
	// Bits beyond the cumulative point (cum itself is missing).
	for j, by := range a.SACK {
		for k := range 8 {
			if by&(1<<k) == 0 {
				continue
			}
			s := end + 1 + uint64(8*j+k)
			if s >= t.next {
				break
			}
			progress = t.sacked(c, s, now) || progress
		}
	}
	for t.una != t.next && t.p(t.una).state == pkSacked {
		t.p(t.una).state = pkFree
		t.una++
	}
	t.detectLosses(c)
	// The peer's retired point can only cover requests sent.
	if a.Retired != t.peerRet && a.Retired-t.peerRet <= uint32(t.cur)-t.peerRet {
		t.peerRet = a.Retired
		progress = true
	}
	switch a.Status {
	case ackRNR:
		t.rnr(c, a, now)
	case ackNAK:
		t.complete(c)
		st := [4]abi.WCStatus{abi.WCRemOpErr, abi.WCRemInvReqErr, abi.WCRemAccessErr, abi.WCRemOpErr}[a.Code&3]
		c.ctr.naksRecv.Add(1)
		c.fail(st)
		return
	}
	if progress {
		t.progress, t.retries = now, 0
	}
	t.freeResps()
	t.complete(c)
	c.rx.retire(c) // a response slot may have freed
	c.pumpLocked()
}

// deliveredAt notes that the transmission sent on path i at timestamp ts
// (c.ts) arrived.
func (t *sender) deliveredAt(i int, ts uint32, now time.Time) {
	p := &t.paths[i]
	if !p.anyDeliv || int32(ts-p.delivered) > 0 {
		p.delivered, p.anyDeliv, t.detect = ts, true, true
	}
	p.heard = now
	if p.up {
		p.probeGap = 0 // tail-loss probes start again from the PTO
	}
}

// sacked marks seq acknowledged; true if it was not yet.
func (t *sender) sacked(c *Conn, s uint64, now time.Time) bool {
	pk := t.p(s)
	if pk.state == pkSacked || pk.state == pkFree {
		return false
	}
	p := &t.paths[pk.path]
	if pk.state == pkInflight {
		p.inflight--
	}
	pk.state = pkSacked
	// A packet sent more than once may have arrived by an earlier copy, on
	// another path or earlier on this one: it says nothing of its latest
	// path (Karn). The echo does, for the transmission it names.
	if !pk.retx {
		if int64(pk.pathSeq) > p.highAcked {
			p.highAcked, t.detect = int64(pk.pathSeq), true
		}
		t.deliveredAt(int(pk.path), c.ts(pk.sentAt), now)
	}
	p.loss -= p.loss / 64
	if p.cwnd < p.ssthresh {
		p.cwnd++
	} else {
		p.cwnd += 1 / p.cwnd
	}
	p.cwnd = min(p.cwnd, float64(t.limit))
	p.stats.acked.Add(1)
	if pk.isResp {
		t.rat(pk.ref).acked++
	}
	return true
}

// detectLosses declares lost a packet in flight when dupThresh packets
// sent after it on the same path were acknowledged, or a transmission
// sent on the path more than reorderWindow after it arrived (a path is
// FIFO; the window absorbs what reordering there is).
func (t *sender) detectLosses(c *Conn) {
	if !t.detect {
		return
	}
	t.detect = false
	var reo [maxPaths]int32
	for i := range t.paths {
		reo[i] = int32(t.reorderWindow(&t.paths[i]) / time.Microsecond)
	}
	for s := t.una; s != t.next; s++ {
		pk := t.p(s)
		if pk.state != pkInflight {
			continue
		}
		p := &t.paths[pk.path]
		if p.highAcked >= int64(pk.pathSeq)+dupThresh ||
			(p.anyDeliv && int32(p.delivered-c.ts(pk.sentAt)) > reo[pk.path]) {
			t.lost(c, s, false)
		}
	}
}

// reorderWindow is how much later a transmission on p may be sent than an
// earlier one still missing before that one counts as lost: a quarter of
// the path's smoothed RTT.
func (t *sender) reorderWindow(p *path) time.Duration { return p.srtt / 4 }

// pto is the tail-loss probe timeout of p: how long its packets in flight
// may go unanswered before a PROBE asks where the peer is.
func (t *sender) pto(c *Conn, p *path) time.Duration {
	if p.srtt == 0 {
		return t.rto(c, p)
	}
	return max(2*p.srtt, minPTO)
}

// lost queues seq for retransmission and charges its path: a halved
// window once per round, unless the path went down (timeout).
func (t *sender) lost(c *Conn, s uint64, timeout bool) {
	pk := t.p(s)
	p := &t.paths[pk.path]
	p.inflight--
	pk.state = pkLost
	t.retx[t.rxTail%uint64(len(t.retx))] = s
	t.rxTail++
	p.loss += (1 - p.loss) / 64
	p.stats.lost.Add(1)
	if timeout {
		return // the path is down (tickResponses): its window starts again
	}
	if pk.pathSeq >= p.recover {
		p.ssthresh = max(2, p.cwnd/2)
		p.cwnd = p.ssthresh
		p.recover = p.seq
	}
}

func (t *sender) rto(c *Conn, p *path) time.Duration {
	r := p.srtt + 4*p.rttvar
	if p.srtt == 0 {
		r = c.rcCfg.Timeout
	}
	return min(max(r, c.cfg.MinRTO), max(c.rcCfg.Timeout, c.cfg.MinRTO))
}

func (t *sender) rttSample(c *Conn, i int, rtt time.Duration, now time.Time) {
	p := &t.paths[i]
	if p.srtt == 0 {
		p.srtt, p.rttvar = rtt, rtt/2
	} else {
		d := p.srtt - rtt
		if d < 0 {
			d = -d
		}
		p.rttvar += (d - p.rttvar) / 4
		p.srtt += (rtt - p.srtt) / 8
	}
	if !p.up {
		p.up = true
		p.cwnd = initCwnd
		p.recover = p.seq
		p.probeGap = 0
		p.stats.ups.Add(1)
	}
}

// rnr handles an RNR NAK: the refused packet waits for the RNR time, not
// counted as a loss of its path.
func (t *sender) rnr(c *Conn, a *Ack, now time.Time) {
	d := int64(a.PSN.Diff(c.start.Add(uint32(t.una))))
	c.ctr.rnrRecv.Add(1)
	if d < 0 || uint64(d) >= t.next-t.una {
		return
	}
	s := t.una + uint64(d)
	pk := t.p(s)
	if pk.state != pkInflight && pk.state != pkLost {
		return
	}
	if pk.state == pkInflight {
		t.paths[pk.path].inflight--
	}
	pk.state = pkRNR
	if t.rnrUntil.IsZero() {
		t.rnrUsed++
		if c.rcCfg.RNRRetry != 7 && t.rnrUsed > c.rcCfg.RNRRetry {
			c.fail(abi.WCRNRRetryExcErr)
			return
		}
		t.rnrUntil = now.Add(rc.RNRTime(a.Code))
	}
}
