package spray

import (
	"encoding/binary"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// swqe is a send work request; its MSN is its index in the send queue
// (uint32, wrapping).
type swqe struct {
	wr      rc.SendWR
	rsn     uint32 // receive sequence number (SEND, WRITE with immediate)
	npkts   uint32 // request packets
	sent    uint32 // request packets sent once
	got     uint32 // READ: response packets placed; atomic: 1 once answered
	started bool
	counted bool // READ or atomic counted in rdOut
}

// resp is a response message this side owes the peer (READ data or an
// atomic's original value), kept until all its packets are acknowledged.
type resp struct {
	msn    uint32
	atomic bool
	orig   uint64
	region rc.Region
	va     uint64
	length uint32
	npkts  uint32
	sent   uint32
	acked  uint32
}

// Packet states in the send window.
const (
	pkFree uint8 = iota
	pkInflight
	pkSacked
	pkLost // queued for retransmission
	pkRNR  // refused for want of a receive: sent again after the RNR wait
)

// txPkt is one PSN of the send window. path, pathSeq and sentAt are
// those of its latest transmission.
type txPkt struct {
	state   uint8
	isResp  bool
	retx    bool // sent more than once: an acknowledgement does not say which copy arrived
	path    uint8
	ref     uint64 // send queue index, or response ring index
	off     uint32
	pathSeq uint32
	sentAt  time.Time
}

// path is one path's state: a congestion window of its own (Reno-like),
// RTT estimates, a loss average, up or down, and what is known to have
// crossed it. A path is FIFO: a transmission known delivered means every
// earlier one on the path arrived or was lost.
type path struct {
	route     *udp.Route
	up        bool
	cwnd      float64
	ssthresh  float64
	inflight  int
	seq       uint32    // next path sequence number
	highAcked int64     // highest path sequence number known delivered, -1 none
	delivered uint32    // send timestamp (c.ts) of the latest transmission known delivered
	anyDeliv  bool      // delivered is set
	heard     time.Time // when an ACK last acknowledged or echoed a transmission of the path
	recover   uint32    // losses of packets sent before this do not shrink again
	srtt      time.Duration
	rttvar    time.Duration
	loss      float64   // moving average of lost / sent
	probeAt   time.Time // the next PROBE is due (down: back-off; up: tail-loss probe)
	probeGap  time.Duration
	stats     pathCounters
}

// sender is the send side: the send queue, responses owed, the window of
// PSNs in flight and the paths. Protected by Conn.mu.
type sender struct {
	sq              []swqe
	head, cur, tail uint64
	rsnNext         uint32
	rdOut           int

	resps              []resp
	rHead, rCur, rTail uint64

	pk        []txPkt // nil until the peer is known
	una, next uint64  // window: [una, next) sent, sequence numbers from c.start
	limit     int     // PSNs in flight: min(own window, peer's)
	msgLimit  uint32  // request messages beyond the peer's retired point
	retx      []uint64
	rxHead    uint64
	rxTail    uint64
	paths     []path
	rr        int
	peerRet   uint32 // the peer's retired MSN
	detect    bool   // a path's delivered point moved: look for losses
	progress  time.Time
	retries   int
	rnrUntil  time.Time
	rnrUsed   int
}

func (t *sender) init(c *Conn) { t.sq = make([]swqe, c.rcCfg.SQSize) }

// initPeer sizes the window once the peer's HELLO or HELLO_ACK arrived.
func (t *sender) initPeer(c *Conn) {
	h := &c.peer.hello
	t.limit = min(c.cfg.Window, int(h.Window))
	t.msgLimit = h.Messages
	t.pk = make([]txPkt, t.limit)
	t.retx = make([]uint64, t.limit)
	if t.resps == nil {
		mdr := c.cfg.RC.MaxDestRdAtomic
		if mdr == 0 {
			mdr = rc.DefaultMaxDestRdAtomic
		}
		t.resps = make([]resp, mdr)
	}
	n := c.cfg.Paths
	L, R := len(c.cfg.Locals), h.NAddrs
	if n == 0 {
		n = max(L, R)
	}
	t.paths = make([]path, n)
	for i := range t.paths {
		t.paths[i] = path{route: c.peer.routes[i%L][i%R], up: true, cwnd: initCwnd,
			ssthresh: float64(t.limit), highAcked: -1, heard: c.now()}
	}
	t.progress = c.now()
}

func (t *sender) at(i uint64) *swqe  { return &t.sq[i%uint64(len(t.sq))] }
func (t *sender) rat(i uint64) *resp { return &t.resps[i%uint64(len(t.resps))] }
func (t *sender) p(seq uint64) *txPkt {
	return &t.pk[seq%uint64(len(t.pk))]
}

// push appends wr to the send queue; false when full.
func (t *sender) push(wr rc.SendWR) bool {
	if t.sq == nil || t.tail-t.head == uint64(len(t.sq)) {
		return false
	}
	w := swqe{wr: wr, npkts: 1}
	op := toDataOp(wr.Opcode)
	if op.consumesRecv() {
		w.rsn = t.rsnNext
		t.rsnNext++
	}
	*t.at(t.tail) = w
	t.tail++
	return true
}

func toDataOp(o rc.WROpcode) DataOp {
	switch o {
	case rc.WRSend:
		return DSend
	case rc.WRSendWithImm:
		return DSendImm
	case rc.WRRDMAWrite:
		return DWrite
	case rc.WRRDMAWriteWithImm:
		return DWriteImm
	case rc.WRRDMARead:
		return DRead
	case rc.WRAtomicCmpSwp:
		return DCmpSwap
	}
	return DFetchAdd
}

func npkts(n uint32, pmtu roce.MTU) uint32 {
	if n == 0 {
		return 1
	}
	return (n + uint32(pmtu) - 1) / uint32(pmtu)
}

// pick returns the next up path with room in its window, round robin
// from the one after the path last sent on (transmit moves rr), or -1.
func (t *sender) pick() int {
	n := len(t.paths)
	for k := range n {
		i := (t.rr + k) % n
		p := &t.paths[i]
		if p.up && float64(p.inflight) < p.cwnd {
			return i
		}
	}
	return -1
}

// pump sends up to budget packets: retransmissions, then responses, then
// requests. It reports whether it stopped for the budget with more to
// send.
func (t *sender) pump(c *Conn, budget int) bool {
	pmtu := uint32(c.cfg.RC.PMTU)
	for sent := 0; ; sent++ {
		if c.failed {
			return false
		}
		if sent == budget {
			return true
		}
		pi := t.pick()
		if pi < 0 {
			return false
		}
		// Retransmissions first.
		for t.rxHead != t.rxTail && t.p(t.retx[t.rxHead%uint64(len(t.retx))]).state != pkLost {
			t.rxHead++
		}
		if t.rxHead != t.rxTail {
			seq := t.retx[t.rxHead%uint64(len(t.retx))]
			t.rxHead++
			t.transmit(c, seq, pi, true)
			continue
		}
		if t.next-t.una >= uint64(t.limit) {
			return false
		}
		// Responses the peer waits for.
		if t.rCur != t.rTail {
			r := t.rat(t.rCur)
			seq := t.next
			t.next++
			*t.p(seq) = txPkt{isResp: true, ref: t.rCur, off: r.sent * pmtu}
			r.sent++
			if r.sent == r.npkts {
				t.rCur++
			}
			t.transmit(c, seq, pi, false)
			continue
		}
		// New requests.
		if c.Mode() != Sprayed || t.cur == t.tail || (!t.rnrUntil.IsZero() && c.now().Before(t.rnrUntil)) {
			return false
		}
		w := t.at(t.cur)
		if !w.started {
			op := toDataOp(w.wr.Opcode)
			if uint32(t.cur)-t.peerRet >= t.msgLimit {
				return false
			}
			if (op == DRead || op.atomic()) && t.rdOut >= c.rcCfg.MaxRdAtomic {
				return false
			}
			if w.wr.Fence && t.rdOut > 0 {
				return false
			}
			w.started = true
			if op.segmented() {
				w.npkts = npkts(w.wr.Length, c.cfg.RC.PMTU)
			}
			if op == DRead || op.atomic() {
				t.rdOut++
				w.counted = true
			}
		}
		seq := t.next
		t.next++
		*t.p(seq) = txPkt{ref: t.cur, off: w.sent * pmtu}
		w.sent++
		if w.sent == w.npkts {
			t.cur++
		}
		t.transmit(c, seq, pi, false)
	}
}

// transmit sends (again) the packet of sequence number seq on path pi.
func (t *sender) transmit(c *Conn, seq uint64, pi int, retx bool) {
	pk := t.p(seq)
	now := c.now()
	p := &t.paths[pi]
	d := Data{Path: uint8(pi), Offset: pk.off, TS: c.ts(now)}
	if retx {
		pk.retx = true
		d.Flags |= flagRetx
		c.ctr.retransmits.Add(1)
		p.stats.retransmits.Add(1)
	}
	pmtu := uint32(c.cfg.RC.PMTU)
	if pk.isResp {
		r := t.rat(pk.ref)
		d.MSN, d.Length = r.msn, r.length
		if r.atomic {
			d.Op = DAtomicResp
			d.Payload = binary.BigEndian.AppendUint64(c.data[:0], r.orig)
		} else {
			d.Op = DReadResp
			n := min(pmtu, r.length-pk.off)
			d.Payload = c.data[:n]
			if n > 0 {
				if err := r.region.ReadAt(r.va+uint64(pk.off), d.Payload); err != nil {
					c.rx.nak(c, r.msn, 3)
					c.fail(abi.WCWRFlushErr)
					return
				}
			}
		}
	} else {
		w := t.at(pk.ref)
		op := toDataOp(w.wr.Opcode)
		d.Op, d.MSN, d.Length, d.RSN = op, uint32(pk.ref), w.wr.Length, w.rsn
		if op.hasImm() {
			d.Imm = w.wr.Imm
		}
		if w.wr.Solicited && (op == DSend || op == DSendImm || op == DWriteImm) {
			d.Flags |= flagSE
		}
		switch {
		case op.segmented():
			d.RKey, d.VA = w.wr.RKey, w.wr.RemoteAddr
			if op == DSend || op == DSendImm {
				d.RKey, d.VA = 0, 0
			}
			n := min(pmtu, w.wr.Length-pk.off)
			d.Payload = c.data[:n]
			if n > 0 {
				if err := w.wr.Local.Gather(pk.off, d.Payload); err != nil {
					t.failAt(c, pk.ref, abi.WCLocProtErr)
					return
				}
			}
		case op == DRead:
			d.RKey, d.VA = w.wr.RKey, w.wr.RemoteAddr
		default:
			d.RKey, d.VA, d.Length = w.wr.RKey, w.wr.RemoteAddr, atomicLen
			b := binary.BigEndian.AppendUint64(c.data[:0], w.wr.SwapAdd)
			d.Payload = binary.BigEndian.AppendUint64(b, w.wr.Compare)
		}
	}
	psn := c.start.Add(uint32(seq))
	c.pkt = appendData(c.pkt[:0], c.cfg.RC.DestQPN, psn, &d)
	c.send(p.route, c.pkt)
	pk.state, pk.path, pk.pathSeq, pk.sentAt = pkInflight, uint8(pi), p.seq, now
	p.seq++
	p.inflight++
	t.rr = (pi + 1) % len(t.paths)
	p.stats.sent.Add(1)
	c.ctr.txPackets.Add(1)
}

// tick runs the per-path retransmission timeouts, the probes of paths
// that are down, the end of an RNR wait and the QP's retry timer.
func (t *sender) tick(c *Conn, now time.Time) {
	if t.pk == nil {
		return
	}
	if !t.rnrUntil.IsZero() && !now.Before(t.rnrUntil) {
		t.rnrUntil = time.Time{}
		for s := t.una; s != t.next; s++ {
			if pk := t.p(s); pk.state == pkRNR {
				pk.state = pkInflight
				t.paths[pk.path].inflight++
				t.lost(c, s, false)
				t.paths[pk.path].stats.lost.Add(^uint64(0)) // not a loss of the path
			}
		}
	}
	t.tickResponses(c, now)
	outstanding := t.head != t.tail && t.at(t.head).started
	if !outstanding || now.Sub(t.progress) < c.rcCfg.Timeout {
		return
	}
	t.progress = now
	c.ctr.timeouts.Add(1)
	if t.retries >= c.rcCfg.RetryCnt {
		c.fail(abi.WCRetryExcErr)
		return
	}
	t.retries++
	for i := range t.paths {
		t.probe(c, i, now) // an ACK tells where the peer is
	}
}

// tickResponses runs the paths' timers, which the responses owed need
// even when this side sends no request. A path whose packets in flight
// went unanswered for its PTO gets a PROBE: its ACK's echo tells what
// crossed the path before it (a lost tail is found without a timeout).
// A path silent for its RTO while another one was heard from is taken
// down: what it had in flight is lost, and it is probed with back-off
// until an ACK echoes it. When every path is silent it is the peer, or
// this host, that stalls: the paths stay up, probed with back-off, and
// the QP's retry timer decides.
func (t *sender) tickResponses(c *Conn, now time.Time) {
	if t.pk == nil {
		return
	}
	// The oldest transmission in flight on each path.
	var oldest [maxPaths]time.Time
	for s := t.una; s != t.next; s++ {
		pk := t.p(s)
		if pk.state != pkInflight {
			continue
		}
		if o := &oldest[pk.path]; o.IsZero() || pk.sentAt.Before(*o) {
			*o = pk.sentAt
		}
	}
	var latest time.Time // the last time any up path was heard from
	for i := range t.paths {
		if p := &t.paths[i]; p.up && p.heard.After(latest) {
			latest = p.heard
		}
	}
	down := false
	for i := range t.paths {
		p := &t.paths[i]
		if !p.up {
			if !now.Before(p.probeAt) {
				t.probe(c, i, now)
				p.probeGap = min(2*p.probeGap, maxProbeGap)
				p.probeAt = now.Add(p.probeGap)
			}
			continue
		}
		if oldest[i].IsZero() {
			continue
		}
		since := oldest[i]
		if p.heard.After(since) {
			since = p.heard
		}
		idle := now.Sub(since)
		if rto := t.rto(c, p); idle >= rto && now.Sub(latest) < rto && latest.After(since) {
			p.stats.timeouts.Add(1)
			p.up = false
			p.stats.downs.Add(1)
			p.probeAt, p.probeGap = now, rto
			p.ssthresh = max(2, p.cwnd/2)
			p.cwnd = initCwnd
			p.anyDeliv, p.highAcked = false, int64(p.seq)-1
			down = true
			continue
		}
		if pto := t.pto(c, p); idle >= pto && !now.Before(p.probeAt) {
			t.probe(c, i, now)
			p.stats.tlps.Add(1)
			p.probeGap = min(max(2*p.probeGap, pto), maxProbeGap)
			p.probeAt = now.Add(p.probeGap)
		}
	}
	if !down {
		return
	}
	// A path that is down loses what is still in flight on it.
	for s := t.una; s != t.next; s++ {
		if pk := t.p(s); pk.state == pkInflight && !t.paths[pk.path].up {
			t.lost(c, s, true)
		}
	}
}

func (t *sender) probe(c *Conn, i int, now time.Time) {
	c.pkt = appendProbe(c.pkt[:0], c.cfg.RC.DestQPN, Probe{Path: uint8(i), TS: c.ts(now)})
	c.send(t.paths[i].route, c.pkt)
	c.ctr.probes.Add(1)
}

// freeResps frees the responses whose packets were all acknowledged.
func (t *sender) freeResps() {
	for t.rHead != t.rCur {
		r := t.rat(t.rHead)
		if r.acked < r.npkts {
			return
		}
		*r = resp{}
		t.rHead++
	}
}

// complete completes, in order, the work requests that are done: a SEND
// or WRITE when the peer retired it, a READ when its response is whole,
// an atomic when answered.
func (t *sender) complete(c *Conn) {
	for t.head != t.cur {
		w := t.at(t.head)
		op := toDataOp(w.wr.Opcode)
		switch {
		case op == DRead:
			if w.got < npkts(w.wr.Length, c.cfg.RC.PMTU) {
				return
			}
		case op.atomic():
			if w.got == 0 {
				return
			}
		default:
			if int32(t.peerRet-uint32(t.head)) <= 0 {
				return
			}
		}
		t.completeHead(c, abi.WCSuccess)
		t.progress, t.retries, t.rnrUsed = c.now(), 0, 0
	}
}

func (t *sender) completeHead(c *Conn, st abi.WCStatus) {
	w := t.at(t.head)
	cpl := rc.Completion{ID: w.wr.ID, Opcode: w.wr.Opcode, Status: st}
	if st == abi.WCSuccess {
		cpl.ByteLen = w.wr.Length
	}
	if w.counted {
		t.rdOut--
	}
	*w = swqe{}
	t.head++
	if t.cur < t.head {
		t.cur = t.head
	}
	c.host.SendDone(cpl)
}

// failAt fails the QP because of work request i.
func (t *sender) failAt(c *Conn, i uint64, st abi.WCStatus) {
	for t.head != i && t.head != t.tail {
		t.completeHead(c, abi.WCWRFlushErr)
	}
	c.fail(st)
}

// flush completes every work request, the head one with st.
func (t *sender) flush(c *Conn, st abi.WCStatus) {
	for t.head != t.tail {
		t.completeHead(c, st)
		st = abi.WCWRFlushErr
	}
	t.cur = t.head
}

// response places a READ response or atomic response packet for one of
// our requests; false when it names nothing outstanding.
func (t *sender) response(c *Conn, d *Data) bool {
	i := uint64(d.MSN-uint32(t.head)) + t.head // at or after head
	if i >= t.cur {
		return false // not sent (a READ or atomic request is one packet)
	}
	w := t.at(i)
	op := toDataOp(w.wr.Opcode)
	switch {
	case d.Op == DReadResp && op == DRead && d.Length == w.wr.Length:
		if len(d.Payload) > 0 {
			if err := w.wr.Local.Scatter(d.Offset, d.Payload); err != nil {
				t.failAt(c, i, abi.WCLocProtErr)
				return true
			}
		}
		w.got++
	case d.Op == DAtomicResp && op.atomic() && w.got == 0:
		var le [8]byte
		binary.LittleEndian.PutUint64(le[:], binary.BigEndian.Uint64(d.Payload))
		if err := w.wr.Local.Scatter(0, le[:]); err != nil {
			t.failAt(c, i, abi.WCLocProtErr)
			return true
		}
		w.got = 1
	default:
		return false
	}
	t.progress, t.retries = c.now(), 0
	return true
}
