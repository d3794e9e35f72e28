package spray

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
)

// senderRig is a Conn whose peer the test plays: the Conn sends into
// endpoints that know no QP, and the test hands it the ACKs it makes up,
// at the times of a clock it moves. The endpoints' timers are off; the
// test calls Tick.
type senderRig struct {
	t     *testing.T
	c     *Conn
	now   atomic.Int64 // ns since t0
	t0    time.Time
	peers []netip.Addr
}

func newSenderRig(t *testing.T, port uint16, paths int) *senderRig {
	t.Helper()
	r := &senderRig{t: t, t0: time.Unix(1e9, 0)}
	ep := func(a netip.Addr) *udp.Endpoint {
		e, err := udp.Listen(udp.Config{Addr: a, Port: port, Tick: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	var locals []*udp.Endpoint
	for i := range paths {
		locals = append(locals, ep(lo(9, byte(i+1))))
		r.peers = append(r.peers, lo(10, byte(i+1)))
		ep(r.peers[i]) // a sink: it drops what comes, knowing no QP
	}
	rcc := rc.Config{PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7, QPN: 0x11, DestQPN: 0x22,
		Clock: func() time.Time { return r.t0.Add(time.Duration(r.now.Load())) }}
	h, _ := newHost(1 << 16)
	c, err := New(Config{RC: rcc, Locals: locals, Peer: netip.AddrPortFrom(r.peers[0], 0), Paths: paths}, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.Start(rcc); err != nil {
		t.Fatal(err)
	}
	hello := Hello{PMTU: roce.MTU1024, Window: DefaultWindow, Messages: DefaultMessages, NAddrs: paths}
	copy(hello.Addrs[:], r.peers)
	c.mu.Lock()
	c.hello(&Packet{Opcode: OpHelloAck, Hello: hello})
	c.mu.Unlock()
	if c.Mode() != Sprayed {
		t.Fatalf("mode %v after HELLO_ACK", c.Mode())
	}
	r.c = c
	return r
}

func (r *senderRig) at(d time.Duration) { r.now.Store(int64(d)) }

// write posts a WRITE of n packets.
func (r *senderRig) write(n int) {
	r.t.Helper()
	err := r.c.Post(rc.SendWR{Opcode: rc.WRRDMAWrite, Length: uint32(n * 1024), RemoteAddr: testMRAddr,
		RKey: testRKey, Local: rctest.Buf(make([]byte, n*1024))})
	if err != nil {
		r.t.Fatal(err)
	}
}

// ack hands the Conn an ACK: every sequence number below cum and those of
// sacked received; echo names the path and send time it echoes (path <
// 0: none).
func (r *senderRig) ack(cum uint64, sacked []uint64, echo int, sent time.Duration) {
	c := r.c
	a := Ack{Path: noPath, CumPSN: c.start.Add(uint32(cum)), SACK: make([]byte, 8)}
	for _, s := range sacked {
		k := s - cum - 1
		a.SACK[k/8] |= 1 << (k % 8)
	}
	if echo >= 0 {
		a.Path, a.TS = uint8(echo), c.ts(r.t0.Add(sent))
	}
	c.mu.Lock()
	c.tx.ack(c, &a)
	c.flushLocked()
	c.mu.Unlock()
}

func (r *senderRig) tick() { r.c.Tick(r.c.cfg.Locals[0]) }

func (r *senderRig) path(i int) PathStats { return r.c.Paths()[i] }

// TestTailLossProbe: the last packet sent on a path is lost, and nothing
// is sent after it there. A PROBE after the path's PTO, not a timeout,
// finds it: the ACK that echoes the PROBE shows it missing, it is sent
// again, and the path stays up.
func TestTailLossProbe(t *testing.T) {
	r := newSenderRig(t, 47960, 2)
	r.write(8) // PSNs 0-7, round robin: path 0 has 0, 2, 4, 6
	r.at(time.Millisecond)
	// 6 is lost; the ACK of 7 echoes path 0's packet 4 (sent at 0).
	r.ack(6, []uint64{7}, 0, 0)
	if got := r.c.Counters().Retransmits; got != 0 {
		t.Fatalf("%d retransmissions before any probe, want 0", got)
	}
	r.at(2 * time.Millisecond)
	r.tick() // 1 ms since path 0 was heard: within its PTO (2·SRTT)
	if p := r.path(0); p.TailProbes != 0 {
		t.Fatalf("probed after 1 ms: %+v", p)
	}
	r.at(3 * time.Millisecond)
	r.tick()
	if p := r.path(0); p.TailProbes != 1 || !p.Up {
		t.Fatalf("path 0 after its PTO: %+v, want one tail probe, up", p)
	}
	r.at(4 * time.Millisecond)
	r.ack(6, []uint64{7}, 0, 3*time.Millisecond) // the PROBE's echo
	if got := r.c.Counters().Retransmits; got != 1 {
		t.Fatalf("%d retransmissions after the probe's ACK, want 1", got)
	}
	if p := r.path(0); !p.Up || p.Timeouts != 0 || p.Lost != 1 {
		t.Fatalf("path 0: %+v, want up, no timeout, 1 lost", p)
	}
}

// TestRetransmissionSaysNothingOfItsPath: a packet sent again and then
// acknowledged may have arrived by its first copy, so it does not tell
// that the packets sent before the retransmission on its path arrived
// (Karn): none of them is declared lost because of it.
func TestRetransmissionSaysNothingOfItsPath(t *testing.T) {
	r := newSenderRig(t, 47961, 1)
	r.write(4) // PSNs 0-3 at 0
	r.at(500 * time.Microsecond)
	r.write(1) // PSN 4 at 0.5 ms
	r.at(time.Millisecond)
	r.ack(0, []uint64{1, 2, 3}, 0, 0) // 3 later packets acknowledged: 0 is lost, sent again at 1 ms
	if got := r.c.Counters().Retransmits; got != 1 {
		t.Fatalf("%d retransmissions, want 1", got)
	}
	r.at(1200 * time.Microsecond)
	r.ack(4, nil, -1, 0) // 0's first copy arrives late
	if p := r.path(0); p.Lost != 1 || r.c.Counters().Retransmits != 1 {
		t.Fatalf("PSN 4 declared lost: %+v, %d retransmissions", p, r.c.Counters().Retransmits)
	}
}

// TestPathDownOnlyWhenOthersAreHeard: paths silent all together are a
// stall (of the peer, or of this host), not a path failure: they stay up
// and are probed. A path silent for its RTO while another is heard from
// goes down, and its packets in flight go to the other.
func TestPathDownOnlyWhenOthersAreHeard(t *testing.T) {
	r := newSenderRig(t, 47962, 2)
	r.write(8) // path 0: 0, 2, 4, 6; path 1: 1, 3, 5, 7
	r.at(25 * time.Millisecond)
	r.tick() // beyond the RTO (the QP's 20 ms: no RTT sample yet)
	for i := range 2 {
		if p := r.path(i); !p.Up || p.Downs != 0 || p.TailProbes != 1 {
			t.Fatalf("path %d after a silence of all: %+v, want up, probed once", i, p)
		}
	}
	r.ack(0, []uint64{1, 3, 5, 7}, 1, 25*time.Millisecond) // path 1 answers
	r.tick()
	if p := r.path(0); p.Up || p.Downs != 1 || p.Timeouts != 1 {
		t.Fatalf("path 0 silent while path 1 is heard: %+v, want down", p)
	}
	if p := r.path(1); !p.Up || p.Retransmits != 4 {
		t.Fatalf("path 1: %+v, want up with path 0's 4 packets sent again", p)
	}
}

// TestEchoAcrossTimestampWrap: the 32-bit µs timestamps wrap every 71.6
// minutes; an echo is still an RTT sample after that.
func TestEchoAcrossTimestampWrap(t *testing.T) {
	r := newSenderRig(t, 47963, 1)
	wrap := time.Duration(1<<32) * time.Microsecond
	r.at(wrap + time.Millisecond)
	r.write(1)
	r.at(wrap + 2*time.Millisecond)
	r.ack(1, nil, 0, wrap+time.Millisecond)
	if p := r.path(0); p.SRTT != time.Millisecond {
		t.Fatalf("SRTT %v after an echo across the wrap, want 1ms", p.SRTT)
	}
}
