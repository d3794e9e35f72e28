package udp

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
)

// TestSourcePortLearned: an endpoint QP whose peer sends from a port of
// its own, as Linux rxe does (one per QP, 0xc000 and up, not the 4791 it
// listens on), learns that port from the peer's first packet the QP
// accepts and from then on refuses the peer's address from any other port
// (RxWrongPeer). Before that, packets from any port reach the QP, which
// accepts none but the one at the expected PSN.
func TestSourcePortLearned(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	e := listen(t, Config{Addr: lo, Port: 47920})
	h := rctest.NewHost()
	mr := &rctest.MR{Buf: make([]byte, 4096), Addr: testMRAddr, RKey: testRKey, Access: rc.AccessRemoteWrite}
	h.AddMR(mr)
	const start roce.PSN = 0xabcdef
	qp, err := e.NewQP(rc.Config{QPN: 0x77, DestQPN: 0x88, PMTU: roce.MTU1024, RQPSN: start, SQPSN: 1},
		netip.AddrPortFrom(lo, 47921), h) // the peer listens on 47921 …
	if err != nil {
		t.Fatal(err)
	}
	sock := func() *net.UDPConn { // … and sends from ports of its own
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(lo, 0)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	peer, other := sock(), sock()
	write := func(c *net.UDPConn, psn roce.PSN, off uint64, v byte) {
		t.Helper()
		p := roce.Packet{BTH: roce.BTH{Opcode: roce.OpWriteOnly, PKey: 0xffff, DestQP: 0x77, PSN: psn},
			RETH: roce.RETH{VA: testMRAddr + off, RKey: testRKey, DMALen: 8}, Payload: bytes.Repeat([]byte{v}, 8)}
		b, err := p.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		sport := uint16(c.LocalAddr().(*net.UDPAddr).Port)
		if err := roce.Seal(roce.IPHeader{Src: lo, Dst: lo, FlagsFragment: roce.IPv4DF}, sport, e.LocalAddr().Port(), b); err != nil {
			t.Fatal(err)
		}
		before := e.Counters().RxDatagrams
		if _, err := c.WriteToUDPAddrPort(b, e.LocalAddr()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool {
			x := e.Counters()
			return x.RxDatagrams > before && x.RxDatagrams == x.RxDelivered+x.RxMalformed+x.RxICRC+x.RxUnknownQP+x.RxWrongPeer+x.RxTruncated
		})
	}
	steps := []struct {
		name                 string
		c                    *net.UDPConn
		psn                  roce.PSN
		off                  uint64
		v                    byte
		delivered, wrongPeer uint64 // counted by this step
		placed               bool
	}{
		{"another port, out of sequence, nothing learned yet", other, start.Add(1), 0, 0xaa, 1, 0, false},
		{"the peer's port at the expected PSN: learned", peer, start, 8, 0x11, 1, 0, true},
		{"another port at the expected PSN", other, start.Add(1), 16, 0xbb, 0, 1, false},
		{"the peer's port at the expected PSN", peer, start.Add(1), 24, 0x22, 1, 0, true},
	}
	for _, s := range steps {
		before := e.Counters()
		write(s.c, s.psn, s.off, s.v)
		got := e.Counters()
		if d, w := got.RxDelivered-before.RxDelivered, got.RxWrongPeer-before.RxWrongPeer; d != s.delivered || w != s.wrongPeer {
			t.Errorf("%s: got %d delivered, %d wrong peer; want %d, %d", s.name, d, w, s.delivered, s.wrongPeer)
		}
		want := make([]byte, 8)
		if s.placed {
			want = bytes.Repeat([]byte{s.v}, 8)
		}
		if got := mr.Copy(int(s.off), 8); !bytes.Equal(got, want) {
			t.Errorf("%s: memory %x, want %x", s.name, got, want)
		}
	}
	if qp.Err() {
		t.Fatal("QP in the error state")
	}
}
