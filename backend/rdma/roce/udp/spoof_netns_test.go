package udp

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
	"github.com/vrdma/vrdma/internal/netlab"
)

// bridged is three hosts, A, B and C, on one Ethernet segment: each a
// namespace with a veth (v0) whose other end is a port of bridge br0 in a
// fourth namespace.
type bridged struct {
	a, b, c             *netlab.NS
	addrA, addrB, addrC netip.Addr
}

// newBridged builds the segment in lab; everything goes with the lab.
func newBridged(t *testing.T, lab *netlab.Lab) *bridged {
	t.Helper()
	n := &bridged{addrA: netip.MustParseAddr("10.200.250.1"), addrB: netip.MustParseAddr("10.200.250.2"),
		addrC: netip.MustParseAddr("10.200.250.3")}
	hosts, err := lab.Segment(netip.PrefixFrom(n.addrA, 24), netip.PrefixFrom(n.addrB, 24), netip.PrefixFrom(n.addrC, 24))
	if err != nil {
		t.Fatal(err)
	}
	n.a, n.b, n.c = hosts[0], hosts[1], hosts[2]
	return n
}

// spoofWrites sends from c, sealed as if from src, an RDMA WRITE ONLY of
// 0xde bytes to (dst, qpn) for every PSN in [expected-w, expected+w], with
// valid ICRCs over the forged addresses and ports. It returns how many it
// sent.
func spoofWrites(t *testing.T, c *net.UDPConn, src netip.AddrPort, dst netip.Addr, qpn uint32, expected roce.PSN, w uint32,
	va uint64, rkey uint32) int {
	t.Helper()
	ip := roce.IPHeader{Src: src.Addr(), Dst: dst, FlagsFragment: roce.IPv4DF}
	n := 0
	for i := range 2*w + 1 {
		psn := expected.Add(uint32(roce.PSNMask) + 1 - w).Add(i)
		p := roce.Packet{BTH: roce.BTH{Opcode: roce.OpWriteOnly, PKey: 0xffff, DestQP: qpn, PSN: psn, AckReq: true},
			RETH: roce.RETH{VA: va, RKey: rkey, DMALen: 64}, Payload: bytes.Repeat([]byte{0xde}, 64)}
		b, err := p.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := roce.Seal(ip, src.Port(), roce.UDPPort, b); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteToUDPAddrPort(b, netip.AddrPortFrom(dst, roce.UDPPort)); err != nil {
			t.Fatalf("spoofed packet %d: %v", i, err)
		}
		n++
	}
	return n
}

// TestIsolationSpoofedRoCEEndpoint: A and B, endpoints in two namespaces
// on one bridge, run a connection; C, a third namespace on the bridge,
// forges B's address (not its port: an address-only spoofer) and sends
// RDMA WRITEs with valid ICRCs to A's QP, one for every PSN within 64 of
// the one A expects. A learned B's source port from B's first accepted
// packet, so every forged packet is dropped as RxWrongPeer: none is
// delivered, A's memory is unchanged, and B's traffic to A (WRITE, READ,
// SEND, atomics, every byte verified) completes afterwards.
func TestIsolationSpoofedRoCEEndpoint(t *testing.T) {
	lab := netlab.NewT(t)
	n := newBridged(t, lab)
	a := listenIn(t, n.a, Config{Addr: n.addrA})
	b := listenIn(t, n.b, Config{Addr: n.addrB})
	const mrSize = 1<<20 + 64
	x, y := connect(t, a, b, rc.Config{PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7}, mrSize) // x on A, y on B
	// B's first WRITE to A: A learns B's port (4791) from it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	postAll(ctx, t, y, []rc.SendWR{{ID: 1, Opcode: rc.WRRDMAWrite, Length: 64, RemoteAddr: testMRAddr, RKey: testRKey,
		Local: rctest.Buf(bytes.Repeat([]byte{0x11}, 64))}})
	if got := x.mr.Copy(0, 64); !bytes.Equal(got, bytes.Repeat([]byte{0x11}, 64)) {
		t.Fatalf("B's WRITE: got %x", got)
	}
	// y sent PSN 0x123456 (connect's): A expects 0x123457 next.
	const expected roce.PSN = 0x123457
	before, mem := a.Counters(), x.mr.Copy(0, mrSize)

	// C forges B's address from another port.
	spoofPort := netip.AddrPortFrom(n.addrB, roce.UDPPort+1)
	c, err := n.c.SpoofUDP(spoofPort)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	sent := spoofWrites(t, c, spoofPort, n.addrA, x.qp.QPN(), expected, 64, testMRAddr, testRKey)
	// Every datagram A received is counted delivered or dropped a moment
	// later: wait for the forged ones to be, and for anything they drew.
	waitFor(t, func() bool {
		x := a.Counters()
		return x.RxDatagrams-before.RxDatagrams >= uint64(sent) &&
			x.RxDatagrams == x.RxDelivered+x.RxTruncated+x.RxMalformed+x.RxICRC+x.RxUnknownQP+x.RxWrongPeer
	})
	time.Sleep(100 * time.Millisecond)
	got := a.Counters()
	if d := got.RxWrongPeer - before.RxWrongPeer; d != uint64(sent) {
		t.Errorf("got %d packets dropped as wrong peer, want the %d forged", d, sent)
	}
	if d := got.RxDelivered - before.RxDelivered; d != 0 {
		t.Errorf("got %d packets delivered during the attack, want 0", d)
	}
	if !bytes.Equal(x.mr.Copy(0, mrSize), mem) {
		t.Error("A's memory changed under forged WRITEs")
	}
	if x.qp.Err() || y.qp.Err() {
		t.Fatal("a QP is in the error state after the attack")
	}
	if c := x.qp.Counters(); c.Duplicates+c.OutOfSeq+c.DropInvalid != 0 {
		t.Errorf("A's QP saw forged packets: %+v", c)
	}
	// The legitimate connection works, every byte verified.
	exercise(t, y, x, 256<<10, 4096, 10)
	t.Logf("A: %+v", a.Counters())
}
