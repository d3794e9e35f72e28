package tests

import (
	"bytes"
	"context"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestIsolationSpoofedRoCE is security issue 25's network peer: two
// vrdmads, A and B, in two namespaces on one bridge, serve one device
// each, and a verbs user connects an RC QP between them over RoCEv2 (GID
// index 1, random initial PSNs from guest/verbs); B WRITEs to A, verified.
// Then C, a third namespace on the same bridge, forges B's address — not
// its source port (an address-only spoofer: IP_TRANSPARENT, another port)
// — and sends RDMA WRITEs with valid ICRCs to A's QP, with A's rkey and
// buffer, one for every PSN within 64 of the one A expects. A learned B's
// source port from B's first accepted packet, so the attacker gets
// nothing: A's memory is unchanged, every forged packet is counted as
// dropped (vrdma_roce_rx_dropped_total{reason="wrong_peer"}), no
// completion appears on A, and afterwards B's WRITE and SEND to A and A's
// WRITE to B complete with their data verified.
func TestIsolationSpoofedRoCE(t *testing.T) {
	vrdmad := needBinary(t, "vrdmad")
	lab := netlab.NewT(t)
	addrA, addrB, addrC := netip.MustParseAddr("10.200.251.1"), netip.MustParseAddr("10.200.251.2"), netip.MustParseAddr("10.200.251.3")
	hosts, err := lab.Segment(netip.PrefixFrom(addrA, 24), netip.PrefixFrom(addrB, 24), netip.PrefixFrom(addrC, 24))
	if err != nil {
		t.Fatal(err)
	}
	nsA, nsB, nsC := hosts[0], hosts[1], hosts[2]

	metricsA := t.TempDir() + "/metrics.sock"
	start := func(ns string, addr netip.Addr, extra ...string) *vrdmadproc.Proc {
		p, err := vrdmadproc.Start(context.Background(), vrdmadproc.Config{Binary: vrdmad, NetNS: ns,
			Devices: []string{"d0"}, Args: append([]string{"--roce-bind", addr.String()}, extra...),
			StateDir: vrdmadproc.NoState})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := p.Stop(); err != nil {
				t.Errorf("vrdmad in %s: %v\n%s", ns, err, p.Log())
			}
		})
		return p
	}
	pa := start(nsA.Name, addrA, "--metrics", "unix:"+metricsA)
	pb := start(nsB.Name, addrB)

	a, b := openPeer(t, pa.Socket("d0"), 0), openPeer(t, pb.Socket("d0"), 0)
	netGID := func(p *peer) [16]byte {
		g, err := p.ctx.QueryGIDAt(1)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	gA, gB := netGID(a), netGID(b)
	if want := netip.AddrFrom16(gA).Unmap(); want != addrA {
		t.Fatalf("A's GID 1 is %v, want %v", want, addrA)
	}
	acc := abi.AccessAll &^ abi.AccessLocalWrite
	if err := a.qp.ConnectRCOpts(gB, b.qp.Num(), b.qp.PSN(), acc, verbs.ConnectOpts{SGIDIndex: 1}); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ConnectRCOpts(gA, a.qp.Num(), a.qp.PSN(), acc, verbs.ConnectOpts{SGIDIndex: 1}); err != nil {
		t.Fatal(err)
	}
	t.Logf("A's QP %#x expects B's PSNs from %#x, B's QP %#x A's from %#x", a.qp.Num(), b.qp.PSN(), b.qp.Num(), a.qp.PSN())

	// B's first WRITE (4 KiB, verified): A learns B's source port.
	verifiedWrite(t, b, a, 0x31)
	attr, err := a.qp.Query()
	if err != nil {
		t.Fatal(err)
	}
	pmtu := uint32(128) << attr.PathMTU
	expected := roce.PSN(b.qp.PSN()).Add((4096 + pmtu - 1) / pmtu)

	wrongPeer := func() int {
		m := scrapeUnix(t, metricsA)
		return metricInt(t, m, `vrdma_roce_rx_dropped_total{address="`+addrA.String()+`",reason="wrong_peer"}`)
	}
	before, mem := wrongPeer(), append([]byte(nil), a.mr.Bytes()...)

	// C forges B's address from port 4792 and WRITEs 0xde bytes over the
	// start of A's buffer at every PSN within 64 of the expected one.
	spoofed := netip.AddrPortFrom(addrB, roce.UDPPort+1)
	c, err := nsC.SpoofUDP(spoofed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ip := roce.IPHeader{Src: addrB, Dst: addrA, FlagsFragment: roce.IPv4DF}
	const window = 64
	sent := 0
	for i := range uint32(2*window + 1) {
		psn := expected.Add(uint32(roce.PSNMask) + 1 - window).Add(i)
		p := roce.Packet{BTH: roce.BTH{Opcode: roce.OpWriteOnly, PKey: 0xffff, DestQP: a.qp.Num(), PSN: psn, AckReq: true},
			RETH: roce.RETH{VA: a.mr.Addr, RKey: a.mr.RKey, DMALen: 256}, Payload: bytes.Repeat([]byte{0xde}, 256)}
		pkt, err := p.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := roce.Seal(ip, spoofed.Port(), roce.UDPPort, pkt); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteToUDPAddrPort(pkt, netip.AddrPortFrom(addrA, roce.UDPPort)); err != nil {
			t.Fatalf("forged packet %d: %v", i, err)
		}
		sent++
	}
	deadline := time.Now().Add(10 * time.Second)
	for wrongPeer()-before < sent && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // what a forged packet drew would have landed by now
	if got := wrongPeer() - before; got != sent {
		t.Errorf("got %d packets dropped as wrong_peer, want the %d forged\n%s", got, sent,
			grepLines(scrapeUnix(t, metricsA), "vrdma_roce_"))
	}
	if !bytes.Equal(a.mr.Bytes(), mem) {
		t.Error("A's memory changed under the forged WRITEs")
	}
	var wc [4]verbs.WC
	if n, err := a.cq.Poll(wc[:]); n != 0 || err != nil {
		t.Errorf("A's CQ: %d completions (%+v), %v; want none", n, wc[:n], err)
	}

	// The legitimate connection: B's WRITE and SEND to A, A's WRITE to B.
	verifiedWrite(t, b, a, 0x32)
	recv := a.mr.Bytes()[16384 : 16384+512]
	if err := a.qp.PostRecv(verbs.RecvWR{WRID: 7, SGL: []abi.SGE{a.mr.SGE(16384, 512)}}); err != nil {
		t.Fatal(err)
	}
	msg := b.mr.Bytes()[20480 : 20480+512]
	fill(msg, 0x33)
	if err := b.qp.PostSend(verbs.SendWR{WRID: 8, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{b.mr.SGE(20480, 512)}}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, b.cq); wc.Status != abi.WCSuccess || wc.WRID != 8 {
		t.Fatalf("B's SEND: got %+v, want success", wc)
	}
	if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess || wc.WRID != 7 || wc.ByteLen != 512 {
		t.Fatalf("A's receive: got %+v, want 512 bytes", wc)
	}
	if !bytes.Equal(recv, msg) {
		t.Fatal("B's SEND: the bytes A received differ from the bytes sent")
	}
	verifiedWrite(t, a, b, 0x34)
	t.Logf("%d forged WRITEs around PSN %#x dropped as wrong_peer; the connection verified afterwards", sent, uint32(expected))
}

// metricInt returns the value of the sample named exactly series (name
// and labels) in a Prometheus text exposition; a series not exported yet
// is 0.
func metricInt(t *testing.T, exposition, series string) int {
	t.Helper()
	for _, line := range strings.Split(exposition, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("metric %s: %q: %v", series, v, err)
			}
			return int(f)
		}
	}
	return 0
}
