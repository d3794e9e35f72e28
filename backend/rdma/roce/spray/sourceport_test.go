package spray

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
)

// TestVendorSourcePort: a spray Conn takes the extension's packets only
// from the port its peer's endpoints are bound to (the one it sends to):
// a well-sealed HELLO and DATA-range packet from the peer's address but
// another port is counted as wrong peer by the endpoint, and the
// connection, sprayed, still works.
func TestVendorSourcePort(t *testing.T) {
	a := listen(t, nil, 47953, lo(7, 1), lo(7, 2))
	b := listen(t, nil, 47953, lo(8, 1), lo(8, 2))
	x, y := connect(t, a, b, &Config{Paths: 2}, &Config{Paths: 2}, rc.Config{PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7}, 1<<20+64)
	exercise(t, x, y, 256<<10, 16384, 10, 8)
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(lo(8, 1), 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sport := uint16(c.LocalAddr().(*net.UDPAddr).Port)
	before := a[0].Counters()
	for _, op := range []byte{byte(OpHello), byte(udp.VendorOpcodes) + 1} {
		pkt := make([]byte, roce.BTHLen+8+roce.ICRCLen)
		pkt[0] = op
		pkt[2], pkt[3] = 0xff, 0xff
		pkt[5], pkt[6], pkt[7] = 0, 0x01, 0x01 // QPN 0x101: x
		if err := roce.Seal(roce.IPHeader{Src: lo(8, 1), Dst: lo(7, 1), FlagsFragment: roce.IPv4DF}, sport, 47953, pkt); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteToUDPAddrPort(pkt, a[0].LocalAddr()); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the forged packets counted", func() bool { return a[0].Counters().RxWrongPeer-before.RxWrongPeer == 2 })
	exercise(t, x, y, 256<<10, 16384, 10, 9)
	if x.spray.Mode() != Sprayed || y.spray.Mode() != Sprayed {
		t.Fatalf("modes %v and %v\n%s\n%s", x.spray.Mode(), y.spray.Mode(), x, y)
	}
}
