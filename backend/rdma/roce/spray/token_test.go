package spray

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
)

// The initial PSNs of the test QPs, as the applications would have
// exchanged them: x sends from xSQ (y's rq_psn), y from ySQ.
const (
	xSQ roce.PSN = 0x3c5a17
	ySQ roce.PSN = 0x81f0c2
)

var tokenRC = rc.Config{PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7}

// forgedHello is a HELLO or HELLO_ACK a forger makes up: its own
// parameters (start PSN, a window of 64, one message, one address) and a
// token it guessed.
func forgedHello(op roce.Opcode, dest uint32, token, start roce.PSN, addr netip.Addr) []byte {
	h := Hello{PMTU: roce.MTU1024, Paths: 1, Window: MinWindow, Messages: 1, StartPSN: start, NAddrs: 1}
	h.Addrs[0] = addr
	return appendHello(nil, op, dest, token, &h)
}

// forge sends pkt from the address and port from, which the forger binds
// (the peer's own, not yet taken by the peer), to to, ICRC sealed.
func forge(t *testing.T, from, to netip.AddrPort, pkt []byte) {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(from))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roce.Seal(roce.IPHeader{Src: from.Addr(), Dst: to.Addr(), FlagsFragment: roce.IPv4DF}, from.Port(), to.Port(), pkt); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteToUDPAddrPort(pkt, to); err != nil {
		t.Fatal(err)
	}
}

// newSide makes a spray Conn in RTR on eps, connected to peer.
func newSide(t *testing.T, eps []*udp.Endpoint, peer netip.AddrPort, cfg Config, qpn, dest uint32, rq roce.PSN) *side {
	t.Helper()
	h, mr := newHost(1<<20 + 64)
	cfg.RC = tokenRC
	cfg.RC.QPN, cfg.RC.DestQPN, cfg.RC.RQPSN = qpn, dest, rq
	cfg.Locals, cfg.Peer = eps, peer
	c, err := New(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &side{conn: c, spray: c, eps: eps, host: h, mr: mr}
}

func (s *side) start(t *testing.T, sq roce.PSN) {
	t.Helper()
	r := tokenRC
	r.SQPSN = sq
	if err := s.conn.Start(r); err != nil {
		t.Fatal(err)
	}
}

// peerHello returns what the Conn took as the peer's HELLO (nil: none).
func (s *side) peerHello() *Hello {
	s.spray.mu.Lock()
	defer s.spray.mu.Unlock()
	if s.spray.peer == nil {
		return nil
	}
	h := s.spray.peer.hello
	return &h
}

// TestHelloToken: a Conn takes a HELLO only when its token (BTH PSN) is
// the QP's initial rq_psn, and a HELLO_ACK only after Start and when its
// token is the QP's initial sq_psn. Anything else from the peer's very
// address and port is refused as wrong peer and counted (DropToken),
// fixes none of the peer's parameters and draws no answer. What it sends
// carries the same rule: every HELLO (retries too) its sq_psn, every
// HELLO_ACK its rq_psn.
func TestHelloToken(t *testing.T) {
	const rq, sq = ySQ, xSQ
	a := listen(t, nil, 47954, lo(11, 1))
	peer := netip.AddrPortFrom(lo(11, 2), 47954)
	sink, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(peer))
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	// received drains what the Conn sent the peer.
	received := func() (hellos, acks []roce.PSN) {
		buf := make([]byte, 2048)
		for {
			_ = sink.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			n, err := sink.Read(buf)
			if err != nil {
				return hellos, acks
			}
			p, err := Parse(buf[:n], roce.MTU1024)
			if err != nil {
				t.Fatalf("the Conn sent %x: %v", buf[:n], err)
			}
			if p.Opcode == OpHello {
				hellos = append(hellos, p.PSN)
			} else if p.Opcode == OpHelloAck {
				acks = append(acks, p.PSN)
			}
		}
	}
	cases := []struct {
		name      string
		op        roce.Opcode
		token     roce.PSN
		started   bool
		want      udp.Verdict
		taken     bool // the peer's parameters fixed
		mode      Mode
		dropToken uint64
		dropState uint64
	}{
		{"HELLO, rq_psn", OpHello, rq, true, udp.Delivered, true, Negotiating, 0, 0},
		{"HELLO in RTR, rq_psn", OpHello, rq, false, udp.Delivered, true, Negotiating, 0, 0},
		{"HELLO, rq_psn+1", OpHello, rq + 1, true, udp.WrongPeer, false, Negotiating, 1, 0},
		{"HELLO, rq_psn with bit 23 flipped", OpHello, rq ^ 0x800000, true, udp.WrongPeer, false, Negotiating, 1, 0},
		{"HELLO, no token (0)", OpHello, 0, true, udp.WrongPeer, false, Negotiating, 1, 0},
		{"HELLO, own sq_psn reflected", OpHello, sq, true, udp.WrongPeer, false, Negotiating, 1, 0},
		{"HELLO in RTR, wrong token", OpHello, rq - 1, false, udp.WrongPeer, false, Negotiating, 1, 0},
		{"HELLO_ACK, sq_psn", OpHelloAck, sq, true, udp.Delivered, true, Sprayed, 0, 0},
		{"HELLO_ACK, rq_psn", OpHelloAck, rq, true, udp.WrongPeer, false, Negotiating, 1, 0},
		{"HELLO_ACK, sq_psn+1", OpHelloAck, sq + 1, true, udp.WrongPeer, false, Negotiating, 1, 0},
		{"HELLO_ACK, no token (0)", OpHelloAck, 0, true, udp.WrongPeer, false, Negotiating, 1, 0},
		{"HELLO_ACK in RTR, sq_psn", OpHelloAck, sq, false, udp.Delivered, false, Negotiating, 0, 1},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newSide(t, a, peer, Config{HelloTimeout: time.Minute}, uint32(0x400+i), 0x500, rq)
			defer s.conn.Close()
			if tc.started {
				s.start(t, sq)
			}
			hellos, acks := received()
			if tc.started && (len(hellos) != 1 || hellos[0] != sq || len(acks) != 0) {
				t.Fatalf("at Start the Conn sent HELLOs %#x and HELLO_ACKs %#x, want one HELLO with token %#x", hellos, acks, sq)
			}
			got := s.spray.ReceiveVendor(forgedHello(tc.op, s.spray.QPN(), tc.token, 0x777777, peer.Addr()), peer, a[0])
			if got != tc.want {
				t.Errorf("verdict %v, want %v", got, tc.want)
			}
			if h := s.peerHello(); (h != nil) != tc.taken || h != nil && h.StartPSN != 0x777777 {
				t.Errorf("peer's HELLO %+v, want taken %v", h, tc.taken)
			}
			if m := s.spray.Mode(); m != tc.mode {
				t.Errorf("mode %v, want %v", m, tc.mode)
			}
			c := s.spray.Counters()
			if c.DropToken != tc.dropToken || c.DropState != tc.dropState {
				t.Errorf("DropToken %d, DropState %d, want %d, %d", c.DropToken, c.DropState, tc.dropToken, tc.dropState)
			}
			hellos, acks = received()
			wantAcks := 0
			if tc.op == OpHello && tc.taken {
				wantAcks = 1
			}
			if len(hellos) != 0 || len(acks) != wantAcks || wantAcks == 1 && acks[0] != rq {
				t.Errorf("answered with HELLOs %#x and HELLO_ACKs %#x, want %d HELLO_ACK with token %#x", hellos, acks, wantAcks, rq)
			}
		})
	}
	t.Run("retries carry the initial sq_psn", func(t *testing.T) {
		s := newSide(t, a, peer, Config{HelloTimeout: 2 * time.Millisecond, HelloRetries: 3}, 0x4ff, 0x500, rq)
		s.start(t, sq)
		waitFor(t, "the fallback", func() bool { return s.spray.Mode() == Plain })
		hellos, _ := received()
		if len(hellos) != 4 {
			t.Fatalf("%d HELLOs, want 4", len(hellos))
		}
		for i, tok := range hellos {
			if tok != sq {
				t.Errorf("HELLO %d: token %#x, want %#x", i, tok, sq)
			}
		}
	})
}

// TestForgedHelloFirst is the attack docs/wire.md § 11 describes: a
// forger that owns the peer's address and port 4791 (here: binds them
// before the peer does) sends its HELLO (to the responder) or HELLO_ACK
// (to the requester) before the real one, to fix the peer's parameters —
// its own start PSN, window and address — for the QP's life. Without the
// QP's initial PSN it cannot: the forged packet is counted (DropToken,
// the endpoint's RxWrongPeer), the real peer then negotiates, both sides
// spray, and every byte both ways is verified; the parameters each side
// holds are the real peer's.
func TestForgedHelloFirst(t *testing.T) {
	const port = 47955
	cases := []struct {
		name  string
		x, y  byte // third octets of x's and y's loopback addresses
		ack   bool // forge y's HELLO_ACK to x, else x's HELLO to y
		token roce.PSN
	}{
		{"HELLO to the responder", 13, 14, false, xSQ ^ 1},
		{"HELLO to the responder, no token", 15, 16, false, 0},
		{"HELLO_ACK to the requester", 17, 18, true, xSQ + 0x1000},
		{"HELLO_ACK to the requester, the peer's sq_psn", 19, 20, true, ySQ},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			xa, ya := []netip.Addr{lo(tc.x, 1), lo(tc.x, 2)}, []netip.Addr{lo(tc.y, 1), lo(tc.y, 2)}
			xPeer, yPeer := netip.AddrPortFrom(ya[0], port), netip.AddrPortFrom(xa[0], port)
			cfg := Config{Paths: 2, HelloTimeout: 5 * time.Millisecond, HelloRetries: 30}
			var x, y *side
			var a, b []*udp.Endpoint
			const forgedStart = 0x000100
			if !tc.ack {
				// y is in RTR; the forger, on x's address and port, is first.
				b = listen(t, nil, port, ya...)
				y = newSide(t, b, yPeer, cfg, 0x202, 0x101, xSQ)
				before := b[0].Counters()
				forge(t, yPeer, xPeer, forgedHello(OpHello, 0x202, tc.token, forgedStart, xa[0]))
				waitFor(t, "the forged HELLO counted", func() bool { return y.spray.Counters().DropToken == 1 })
				if got := b[0].Counters().RxWrongPeer - before.RxWrongPeer; got != 1 {
					t.Fatalf("y's endpoint counted %d wrong peer, want 1", got)
				}
				if h := y.peerHello(); h != nil {
					t.Fatalf("the forged HELLO fixed y's peer: %+v", h)
				}
				a = listen(t, nil, port, xa...)
				x = newSide(t, a, xPeer, cfg, 0x101, 0x202, ySQ)
				y.start(t, ySQ)
				x.start(t, xSQ)
			} else {
				// x is in RTS, its HELLO unanswered; the forger, on y's
				// address and port, answers first.
				a = listen(t, nil, port, xa...)
				x = newSide(t, a, xPeer, cfg, 0x101, 0x202, ySQ)
				x.start(t, xSQ)
				before := a[0].Counters()
				forge(t, xPeer, yPeer, forgedHello(OpHelloAck, 0x101, tc.token, forgedStart, ya[0]))
				waitFor(t, "the forged HELLO_ACK counted", func() bool { return x.spray.Counters().DropToken == 1 })
				if got := a[0].Counters().RxWrongPeer - before.RxWrongPeer; got != 1 {
					t.Fatalf("x's endpoint counted %d wrong peer, want 1", got)
				}
				if h, m := x.peerHello(), x.spray.Mode(); h != nil || m != Negotiating {
					t.Fatalf("after the forged HELLO_ACK: peer %+v, mode %v, want none, negotiating", h, m)
				}
				b = listen(t, nil, port, ya...)
				y = newSide(t, b, yPeer, cfg, 0x202, 0x101, xSQ)
				y.start(t, ySQ)
			}
			exercise(t, x, y, 256<<10, 16384, 10, 11)
			exercise(t, y, x, 128<<10, 8192, 10, 12)
			for _, s := range []struct {
				name       string
				me, peer   *side
				peerAddrs  []netip.Addr
				dropTokens uint64
			}{{"x", x, y, ya, b2u(tc.ack)}, {"y", y, x, xa, b2u(!tc.ack)}} {
				if m := s.me.spray.Mode(); m != Sprayed {
					t.Errorf("%s: mode %v, want spray\n%s", s.name, m, s.me)
				}
				h := s.me.peerHello()
				if h == nil || h.StartPSN != s.peer.spray.start || h.Window != uint32(s.peer.spray.cfg.Window) ||
					h.Messages != uint32(s.peer.spray.cfg.Messages) || h.NAddrs != len(s.peerAddrs) || h.Addrs[0] != s.peerAddrs[0] || h.Addrs[1] != s.peerAddrs[1] {
					t.Errorf("%s holds the peer's HELLO %+v, want the real peer's (start %#x, window %d, messages %d, addresses %v)",
						s.name, h, s.peer.spray.start, s.peer.spray.cfg.Window, s.peer.spray.cfg.Messages, s.peerAddrs)
				}
				if c := s.me.spray.Counters(); c.DropToken != s.dropTokens {
					t.Errorf("%s: DropToken %d, want %d", s.name, c.DropToken, s.dropTokens)
				}
			}
		})
	}
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// TestHelloTokenAfterRCTraffic: the token is the initial PSN, fixed for
// the QP's life, not where RC traffic got to. x sprays to y, which speaks
// plain RC (Config.Plain) to x; once y's RC requests have moved x's
// expected PSN far from its initial rq_psn, a HELLO as y's retry would be
// (y's own parameters, its initial sq_psn) still passes the token check,
// and one carrying the PSN x's RC responder now expects is refused.
func TestHelloTokenAfterRCTraffic(t *testing.T) {
	a := listen(t, nil, 47956, lo(21, 1), lo(21, 2))
	b := listen(t, nil, 47956, lo(22, 1), lo(22, 2))
	x, y := connect(t, a, b, &Config{}, &Config{Plain: true}, tokenRC, 1<<20+64)
	exercise(t, x, y, 256<<10, 16384, 10, 13)
	exercise(t, y, x, 256<<10, 4096, 10, 14)
	if rx := x.spray.QP().Counters().RxRequests; rx < 64 {
		t.Fatalf("x's RC responder executed %d requests, want y's traffic", rx)
	}
	// connect's PSNs: y sends from 0x123456, x's rq_psn.
	const yInitial roce.PSN = 0x123456
	moved := yInitial.Add(uint32(x.spray.QP().Counters().RxRequests))
	h := y.spray.ownHello()
	src := netip.AddrPortFrom(b[0].LocalAddr().Addr(), b[0].LocalAddr().Port())
	for _, tc := range []struct {
		name      string
		token     roce.PSN
		want      udp.Verdict
		dropToken uint64
	}{
		{"the initial rq_psn", yInitial, udp.Delivered, 0},
		{"the PSN RC got to", moved, udp.WrongPeer, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := x.spray.Counters()
			got := x.spray.ReceiveVendor(appendHello(nil, OpHello, x.spray.QPN(), tc.token, &h), src, a[0])
			after := x.spray.Counters()
			if got != tc.want || after.DropToken-before.DropToken != tc.dropToken {
				t.Errorf("verdict %v, DropToken +%d; want %v, +%d", got, after.DropToken-before.DropToken, tc.want, tc.dropToken)
			}
		})
	}
	exercise(t, x, y, 64<<10, 16384, 5, 15)
	if x.spray.Mode() != Sprayed || y.spray.Mode() != Plain {
		t.Fatalf("modes %v and %v", x.spray.Mode(), y.spray.Mode())
	}
}

// ownHello returns the HELLO this Conn sends (its own parameters).
func (c *Conn) ownHello() Hello {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := Hello{PMTU: c.cfg.RC.PMTU, Paths: uint8(c.cfg.Paths), Window: uint32(c.cfg.Window),
		Messages: uint32(c.cfg.Messages), StartPSN: c.start, NAddrs: len(c.locals)}
	copy(h.Addrs[:], c.locals)
	return h
}
