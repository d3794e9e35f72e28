package spray

import (
	"encoding/binary"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// NAK codes of the ACK (those of the AETH, docs/wire.md § 3).
const (
	nakInvalid uint8 = 1
	nakAccess  uint8 = 2
	nakOperErr uint8 = 3
	statusNone       = ackOK
)

// rxMsg is a request message being received: its packets are placed as
// they come; it is retired (executed, completed) in MSN order.
type rxMsg struct {
	used             bool
	op               DataOp
	flags            uint8
	length, npkts    uint32
	got              uint32 // distinct packets placed
	rsn, imm, rkey   uint32
	va               uint64
	region           rc.Region // WRITE: resolved at the first packet
	swapAdd, compare uint64    // atomic
	bad              uint8     // NAK code to answer when it would retire
}

// receiver is the receive side. Protected by Conn.mu.
type receiver struct {
	ready    bool
	startPSN roce.PSN
	cum      uint64   // next sequence number expected: all before it arrived
	high     uint64   // one past the highest sequence number arrived
	bits     []uint64 // arrived, for [cum, cum+window): bit s % window
	msgs     []rxMsg
	retired  uint32 // next request MSN to retire
	recvs    []rc.Recv
	taken    uint32 // next receive sequence number to take
	done     uint32 // next receive sequence number to complete

	need     bool // an ACK is owed at the end of this receive batch
	owed     int  // DATA packets received since the last ACK
	route    *udp.Route
	echoPath uint8
	echoTS   uint32
	status   uint8
	code     uint8
	nakPSN   roce.PSN
	nakMSN   uint32
	sack     []byte
}

func (r *receiver) init(c *Conn) {
	r.bits = make([]uint64, c.cfg.Window/64+1)
	r.msgs = make([]rxMsg, c.cfg.Messages)
	r.recvs = make([]rc.Recv, c.cfg.Messages)
	r.sack = make([]byte, 0, maxSACKWord*4)
	r.echoPath = noPath
}

func (r *receiver) start(c *Conn, psn roce.PSN) { r.ready, r.startPSN = true, psn }

func (r *receiver) window() uint64 { return uint64(len(r.bits)-1) * 64 }
func (r *receiver) bit(s uint64) bool {
	i := s % r.window()
	return r.bits[i/64]&(1<<(i%64)) != 0
}
func (r *receiver) setBit(s uint64, v bool) {
	i := s % r.window()
	if v {
		r.bits[i/64] |= 1 << (i % 64)
	} else {
		r.bits[i/64] &^= 1 << (i % 64)
	}
}

// data handles a DATA packet.
func (r *receiver) data(c *Conn, p *Packet, route *udp.Route) {
	d := &p.Data
	if !r.ready {
		c.ctr.dropState.Add(1)
		return
	}
	r.route, r.echoPath, r.echoTS = route, d.Path, d.TS
	r.owed++
	c.ctr.rxPackets.Add(1)
	// An ACK goes at the end of the batch for what the sender should hear
	// of now — a retransmission, a duplicate, a refused packet (below), a
	// retired message (retire), a response's last packet, a PROBE — or once
	// ackEvery packets went unacknowledged; otherwise a later ACK or the
	// next tick (Conn.Tick) carries it.
	r.need = r.need || r.owed >= ackEvery || d.Flags&flagRetx != 0
	if c.failed {
		c.ctr.dropState.Add(1)
		return
	}
	diff := int64(p.PSN.Diff(r.startPSN.Add(uint32(r.cum))))
	switch {
	case diff < 0:
		r.need = true
		c.ctr.duplicates.Add(1)
		return
	case uint64(diff) >= r.window():
		r.need = true
		c.ctr.dropWindow.Add(1)
		return
	}
	s := r.cum + uint64(diff)
	if r.bit(s) {
		r.need = true
		c.ctr.duplicates.Add(1)
		return
	}
	if d.Op.response() {
		if c.tx.sq == nil || !c.tx.response(c, d) {
			c.ctr.dropStale.Add(1)
		}
		if d.Op == DAtomicResp || d.Offset+uint32(len(d.Payload)) >= d.Length {
			r.need = true // the responder frees a response once acknowledged
		}
	} else if !r.request(c, d, p.PSN) {
		r.need = true
		return
	}
	r.setBit(s, true)
	if s >= r.high {
		r.high = s + 1
	}
	for r.cum < r.high && r.bit(r.cum) {
		r.setBit(r.cum, false)
		r.cum++
	}
	r.retire(c)
}

// request places a request packet; false when it was refused (dropped,
// or RNR) and must come again.
func (r *receiver) request(c *Conn, d *Data, psn roce.PSN) bool {
	m := d.MSN - r.retired
	if m >= uint32(len(r.msgs)) {
		c.ctr.dropWindow.Add(1) // beyond the announced message window, or retired
		return false
	}
	e := &r.msgs[d.MSN%uint32(len(r.msgs))]
	if !e.used {
		*e = rxMsg{used: true, op: d.Op, flags: d.Flags & flagSE, length: d.Length, npkts: 1,
			rsn: d.RSN, imm: d.Imm, rkey: d.RKey, va: d.VA}
		if d.Op.segmented() {
			e.npkts = npkts(d.Length, c.cfg.RC.PMTU)
		}
		switch {
		case d.Op.write() && d.Length > 0:
			reg, ok := c.host.Resolve(d.RKey, d.VA, d.Length, rc.AccessRemoteWrite)
			if !ok {
				e.bad = nakAccess
			}
			e.region = reg
		case d.Op.consumesRecv() && d.RSN-r.done >= uint32(len(r.recvs)):
			e.bad = nakInvalid
		case d.Op.atomic():
			e.swapAdd = binary.BigEndian.Uint64(d.Payload)
			e.compare = binary.BigEndian.Uint64(d.Payload[8:])
		}
	} else if e.op != d.Op || e.length != d.Length || e.rsn != d.RSN || e.imm != d.Imm || e.rkey != d.RKey ||
		e.va != d.VA || e.flags != d.Flags&flagSE {
		// Packets of one message agree on it.
		c.ctr.dropMalformed.Add(1)
		return false
	}
	if d.Op.consumesRecv() && e.bad == 0 {
		for int32(e.rsn-r.taken) >= 0 {
			rv, ok := c.host.TakeRecv()
			if !ok {
				if r.status != ackNAK {
					r.status, r.code, r.nakPSN, r.nakMSN = ackRNR, c.cfg.RC.MinRNRTimer, psn, d.MSN
				}
				c.ctr.rnrSent.Add(1)
				return false
			}
			r.recvs[r.taken%uint32(len(r.recvs))] = rv
			r.taken++
		}
	}
	n := uint32(len(d.Payload))
	switch {
	case e.bad != 0:
	case d.Op == DSend || d.Op == DSendImm:
		rv := &r.recvs[e.rsn%uint32(len(r.recvs))]
		if e.length > rv.Len {
			e.bad = nakInvalid
		} else if n > 0 {
			if err := rv.Buf.Scatter(d.Offset, d.Payload); err != nil {
				e.bad = nakOperErr
			}
		}
	case d.Op.write() && n > 0:
		if err := e.region.WriteAt(e.va+uint64(d.Offset), d.Payload); err != nil {
			e.bad = nakAccess
		}
	}
	e.got++
	return true
}

// retire executes and completes, in MSN order, the messages whose packets
// all arrived: receive completions, READ and atomic execution (a READ
// sees every earlier WRITE placed). It stops while the response ring is
// full.
func (r *receiver) retire(c *Conn) {
	for !c.failed && r.ready {
		e := &r.msgs[r.retired%uint32(len(r.msgs))]
		if !e.used || e.got < e.npkts {
			return
		}
		if e.op.consumesRecv() && e.bad == 0 && e.rsn != r.done {
			e.bad = nakInvalid // RSNs must count the receive-consuming messages
		}
		if e.bad != 0 {
			r.fatal(c, e)
			return
		}
		t := &c.tx
		switch e.op {
		case DSend, DSendImm:
			rv := r.recvs[e.rsn%uint32(len(r.recvs))]
			r.recvs[e.rsn%uint32(len(r.recvs))] = rc.Recv{}
			r.done++
			c.host.RecvDone(rc.RecvCompletion{ID: rv.ID, Status: abi.WCSuccess, ByteLen: e.length, Imm: e.imm,
				WithImm: e.op == DSendImm, Solicited: e.flags&flagSE != 0})
		case DWriteImm:
			rv := r.recvs[e.rsn%uint32(len(r.recvs))]
			r.recvs[e.rsn%uint32(len(r.recvs))] = rc.Recv{}
			r.done++
			c.host.RecvDone(rc.RecvCompletion{ID: rv.ID, Status: abi.WCSuccess, ByteLen: e.length, Imm: e.imm,
				WithImm: true, Write: true, Solicited: e.flags&flagSE != 0})
		case DRead, DCmpSwap, DFetchAdd:
			if t.rTail-t.rHead == uint64(len(t.resps)) {
				return // stalled until responses are acknowledged
			}
			rs := resp{msn: r.retired, length: e.length, npkts: npkts(e.length, c.cfg.RC.PMTU), va: e.va}
			if e.op == DRead {
				if e.length > 0 {
					reg, ok := c.host.Resolve(e.rkey, e.va, e.length, rc.AccessRemoteRead)
					if !ok {
						e.bad = nakAccess
						r.fatal(c, e)
						return
					}
					rs.region = reg
				}
			} else {
				reg, ok := c.host.Resolve(e.rkey, e.va, atomicLen, rc.AccessRemoteAtomic)
				if e.va%8 != 0 {
					e.bad = nakInvalid
				} else if !ok {
					e.bad = nakAccess
				}
				if e.bad != 0 {
					r.fatal(c, e)
					return
				}
				aop := rc.AtomicFetchAdd
				if e.op == DCmpSwap {
					aop = rc.AtomicCmpSwp
				}
				orig, err := reg.Atomic(e.va, aop, e.compare, e.swapAdd)
				if err != nil {
					e.bad = nakOperErr
					r.fatal(c, e)
					return
				}
				rs = resp{msn: r.retired, atomic: true, orig: orig, length: atomicLen, npkts: 1}
			}
			*t.rat(t.rTail) = rs
			t.rTail++
		}
		*e = rxMsg{}
		r.retired++
		r.need = true
		c.ctr.retired.Add(1)
	}
}

// fatal answers a message that cannot execute with a NAK and puts the QP
// in the error state (IBA's class B-D responder errors).
func (r *receiver) fatal(c *Conn, e *rxMsg) {
	if e.op == DSend || e.op == DSendImm {
		if int32(e.rsn-r.done) >= 0 && int32(e.rsn-r.taken) < 0 {
			st := abi.WCLocLenErr
			if e.bad == nakOperErr {
				st = abi.WCLocProtErr
			}
			rv := r.recvs[e.rsn%uint32(len(r.recvs))]
			if e.rsn == r.done {
				r.recvs[e.rsn%uint32(len(r.recvs))] = rc.Recv{}
				r.done++
				c.host.RecvDone(rc.RecvCompletion{ID: rv.ID, Status: st})
			}
		}
	}
	r.nak(c, r.retired, e.bad)
	c.fail(abi.WCWRFlushErr)
}

// nak sends (and keeps answering with) a NAK for msn.
func (r *receiver) nak(c *Conn, msn uint32, code uint8) {
	r.status, r.code, r.nakPSN, r.nakMSN, r.need = ackNAK, code, 0, msn, true
	if r.route == nil && c.peer != nil {
		r.route = c.peer.routes[0][0]
	}
	c.ctr.naksSent.Add(1)
	r.sendAck(c)
}

// flush completes the receives taken and not completed (WCWRFlushErr).
func (r *receiver) flush(c *Conn) {
	for r.done != r.taken {
		rv := r.recvs[r.done%uint32(len(r.recvs))]
		r.recvs[r.done%uint32(len(r.recvs))] = rc.Recv{}
		r.done++
		c.host.RecvDone(rc.RecvCompletion{ID: rv.ID, Status: abi.WCWRFlushErr})
	}
	for i := range r.msgs {
		r.msgs[i] = rxMsg{}
	}
}

// probe answers a PROBE with an ACK on the path it came by.
func (r *receiver) probe(c *Conn, p *Probe, route *udp.Route) {
	if !r.ready {
		c.ctr.dropState.Add(1)
		return
	}
	r.need, r.route, r.echoPath, r.echoTS = true, route, p.Path, p.TS
}

// sendAck sends the ACK owed, if any, on the route of the packet that
// asked last.
func (r *receiver) sendAck(c *Conn) {
	if !r.need || r.route == nil || !r.ready {
		return
	}
	a := Ack{Status: r.status, Code: r.code, Path: r.echoPath, TS: r.echoTS,
		CumPSN: r.startPSN.Add(uint32(r.cum)), Retired: r.retired}
	if r.status != ackOK {
		a.PSN, a.MSN = r.nakPSN, r.nakMSN
	}
	// SACK: the arrivals after cum (which is missing), whole words.
	r.sack = r.sack[:0]
	if r.high > r.cum+1 {
		nbits := min(r.high-r.cum-1, maxSACKWord*32)
		nbytes := (nbits + 31) / 32 * 4
		r.sack = r.sack[:nbytes]
		clear(r.sack)
		for k := range nbits {
			if r.bit(r.cum + 1 + k) {
				r.sack[k/8] |= 1 << (k % 8)
			}
		}
	}
	a.SACK = r.sack
	c.pkt = appendAck(c.pkt[:0], c.cfg.RC.DestQPN, &a)
	c.send(r.route, c.pkt)
	c.ctr.acksSent.Add(1)
	r.need, r.echoPath, r.owed = false, noPath, 0
	if r.status == ackRNR {
		r.status, r.code = ackOK, 0
	}
}
