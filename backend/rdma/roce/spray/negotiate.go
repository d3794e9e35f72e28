package spray

// The negotiation (HELLO, HELLO_ACK) and the entry point of the
// vendor-opcode packets.

import (
	"net/netip"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// fallBack makes the requester plain RC for good: the work requests
// queued while negotiating go to the plain QP in order.
func (c *Conn) fallBack() {
	c.mode.Store(int32(Plain))
	c.ctr.fallbacks.Add(1)
	for c.tx.head != c.tx.tail {
		w := c.tx.at(c.tx.head)
		wr := w.wr
		*w = swqe{}
		c.tx.head++
		if err := c.qp.Post(wr); err != nil {
			// The QP failed meanwhile: it flushed, and so do we.
			c.host.SendDone(rc.Completion{ID: wr.ID, Opcode: wr.Opcode, Status: abi.WCWRFlushErr})
		}
	}
	c.tx.cur, c.tx.tail = c.tx.head, c.tx.head
}

// sendHello sends a HELLO or HELLO_ACK from Locals[0] to the peer. Its
// token (the BTH PSN, docs/wire.md § 9.2) is the initial RC send PSN of
// the side that sends the HELLO: on a HELLO this side's (sq_psn at RTS),
// on a HELLO_ACK the peer's (rq_psn at RTR), the value the HELLO it
// answers carried. Both are fixed for the QP's life, so every retry and
// every answer carries the same token however far RC traffic went.
func (c *Conn) sendHello(op roce.Opcode) {
	h := Hello{PMTU: c.cfg.RC.PMTU, Paths: uint8(c.cfg.Paths), Window: uint32(c.cfg.Window),
		Messages: uint32(c.cfg.Messages), StartPSN: c.start, NAddrs: len(c.locals)}
	copy(h.Addrs[:], c.locals)
	token := c.cfg.RC.RQPSN
	if op == OpHello {
		token = c.rcCfg.SQPSN
	}
	c.pkt = appendHello(c.pkt[:0], op, c.cfg.RC.DestQPN, token, &h)
	c.qpPort.route.Send(c.pkt)
	c.dirty |= 1
	if op == OpHello {
		c.ctr.hellos.Add(1)
	}
}

// ReceiveVendor implements udp.PacketHandler.
func (c *Conn) ReceiveVendor(b []byte, src netip.AddrPort, via *udp.Endpoint) udp.Verdict {
	// Only a vrdma host speaks the extension, and it sends from the port
	// its endpoints are bound to, the one the routes send to (all of the
	// peer's addresses share it): any other source port is not the peer.
	if src.Port() != c.cfg.Peer.Port() {
		return udp.WrongPeer
	}
	p, err := Parse(b, c.cfg.RC.PMTU)
	if err != nil {
		c.ctr.dropMalformed.Add(1)
		return udp.Delivered
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.ctr.dropState.Add(1)
		return udp.Delivered
	}
	if p.Opcode == OpHello || p.Opcode == OpHelloAck {
		if src.Addr() != c.cfg.Peer.Addr() || via != c.cfg.Locals[0] {
			return udp.WrongPeer
		}
		if p.Opcode == OpHelloAck && !c.started {
			c.ctr.dropState.Add(1) // no HELLO sent yet: nothing to answer
			return udp.Delivered
		}
		if !c.helloToken(&p) {
			// Address and port are no secret (4791 is well known); the
			// token is the connection's: whoever lacks it is not the peer.
			c.ctr.dropToken.Add(1)
			return udp.WrongPeer
		}
		c.hello(&p)
		return udp.Delivered
	}
	if c.peer == nil {
		c.ctr.dropState.Add(1) // no HELLO yet: nothing is known of the peer
		return udp.Delivered
	}
	li, ri := c.localIndex(via), c.peerIndex(src.Addr())
	if li < 0 || ri < 0 {
		return udp.WrongPeer
	}
	route := c.peer.routes[li][ri]
	switch p.Opcode {
	case OpData:
		c.rx.data(c, &p, route)
	case OpAck:
		if c.tx.pk == nil {
			c.ctr.dropState.Add(1)
			break
		}
		c.tx.ack(c, &p.Ack)
	case OpProbe:
		c.rx.probe(c, &p.Probe, route)
	}
	return udp.Delivered
}

// helloToken reports whether a HELLO or HELLO_ACK carries the token
// docs/wire.md § 9.2 asks of it: "A receiver takes a HELLO only if its
// token equals its QP's initial rq_psn, a HELLO_ACK only if its token
// equals its QP's initial sq_psn." These are the RC connection's own
// initial PSNs, which the applications exchanged out of band (random 24
// bits): a forger that knows the peer's address and port must still
// guess 24 bits, as it must to inject plain RC. Precondition: c.mu held;
// for a HELLO_ACK, c.started.
func (c *Conn) helloToken(p *Packet) bool {
	if p.Opcode == OpHello {
		return p.PSN == c.cfg.RC.RQPSN
	}
	return p.PSN == c.rcCfg.SQPSN
}

// hello handles a HELLO (answered every time) or HELLO_ACK whose token
// was checked.
func (c *Conn) hello(p *Packet) {
	h := &p.Hello
	if h.PMTU != c.cfg.RC.PMTU || !sameFamily(h, c.locals[0].Is4()) {
		c.ctr.dropMalformed.Add(1) // cannot spray with it: no answer, the peer falls back
		return
	}
	if c.peer == nil {
		pi := &peerInfo{hello: *h}
		for _, e := range c.cfg.Locals {
			row := make([]*udp.Route, h.NAddrs)
			for j := range h.NAddrs {
				r, err := e.Route(netip.AddrPortFrom(h.Addrs[j], c.cfg.Peer.Port()))
				if err != nil {
					c.ctr.dropMalformed.Add(1)
					return
				}
				row[j] = r
			}
			pi.routes = append(pi.routes, row)
		}
		c.peer = pi
		c.rx.start(c, h.StartPSN)
	} else if c.peer.hello.StartPSN != h.StartPSN || c.peer.hello.Window != h.Window || c.peer.hello.Messages != h.Messages {
		c.ctr.dropStale.Add(1) // a HELLO of another incarnation
		return
	}
	if c.tx.pk == nil {
		c.tx.initPeer(c)
	}
	if p.Opcode == OpHello {
		c.sendHello(OpHelloAck)
		c.flushLocked()
		return
	}
	if c.started && c.Mode() == Negotiating && !c.failed {
		c.mode.Store(int32(Sprayed))
		c.ctr.negotiated.Add(1)
		c.pumpLocked()
		c.flushLocked()
	}
}

func sameFamily(h *Hello, v4 bool) bool {
	for i := range h.NAddrs {
		if h.Addrs[i].Is4() != v4 {
			return false
		}
	}
	return true
}

func (c *Conn) localIndex(e *udp.Endpoint) int {
	for i, l := range c.cfg.Locals {
		if l == e {
			return i
		}
	}
	return -1
}

func (c *Conn) peerIndex(a netip.Addr) int {
	for i := range c.peer.hello.NAddrs {
		if c.peer.hello.Addrs[i] == a {
			return i
		}
	}
	return -1
}
