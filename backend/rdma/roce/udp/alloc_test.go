package udp

import (
	"net/netip"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
)

// TestHandleNoAllocations: the receive path of a datagram (checks, ICRC,
// demultiplexing, the QP placing a WRITE and acknowledging it) does not
// allocate, for an IPv4 packet sealed with ID 0 and for one whose ID has
// to be recovered.
func TestHandleNoAllocations(t *testing.T) {
	local := netip.MustParseAddr("10.200.0.1")
	peer := netip.MustParseAddr("10.200.0.129")
	e := &Endpoint{
		cfg:     Config{Addr: local, Port: roce.UDPPort, RecoverIPv4ID: true},
		local:   netip.AddrPortFrom(local, roce.UDPPort),
		rx:      newBatch(1, bufSize, 0),
		touched: make([]*qpEntry, 0, 1),
	}
	h := rctest.NewHost()
	h.AddMR(&rctest.MR{Buf: make([]byte, 4096), Addr: testMRAddr, RKey: testRKey, Access: rc.AccessRemoteWrite})
	qp, err := rc.New(rc.Config{QPN: 7, DestQPN: 9, PMTU: roce.MTU1024}, h, &nopPort{})
	if err != nil {
		t.Fatal(err)
	}
	table := map[uint32]*qpEntry{7: {qp: qp, peer: peer}}
	e.table.Store(&table)
	p := roce.Packet{BTH: roce.BTH{Opcode: roce.OpWriteOnly, PKey: 0xffff, DestQP: 7, AckReq: true},
		RETH: roce.RETH{VA: testMRAddr, RKey: testRKey, DMALen: 1024}, Payload: make([]byte, 1024)}
	pkt, err := p.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint16{0, 0x1234} {
		ip := roce.IPHeader{Src: peer, Dst: local, ID: id, FlagsFragment: roce.IPv4DF}
		psn := roce.PSN(0)
		gen := uint64(0)
		n := testing.AllocsPerRun(500, func() {
			pkt[9], pkt[10], pkt[11] = byte(psn>>16), byte(psn>>8), byte(psn)
			psn = psn.Add(1)
			roce.Seal(ip, 50000, roce.UDPPort, pkt)
			copy(e.rx.bufs[0], pkt)
			e.rx.setSend(0, len(pkt), netip.AddrPortFrom(peer, 50000))
			e.rx.hdrs[0].Len = uint32(len(pkt))
			gen++
			e.handle(0, gen)
			for _, ent := range e.touched {
				ent.qp.Flush()
			}
			e.touched = e.touched[:0]
		})
		if n != 0 {
			t.Errorf("ID %#x: %v allocations per datagram", id, n)
		}
		// Restart the QP's PSN for the next round.
		qp.Close()
		if qp, err = rc.New(rc.Config{QPN: 7, DestQPN: 9, PMTU: roce.MTU1024}, h, &nopPort{}); err != nil {
			t.Fatal(err)
		}
		table = map[uint32]*qpEntry{7: {qp: qp, peer: peer}}
		e.table.Store(&table)
	}
	c := e.Counters()
	if c.RxDelivered != c.RxDatagrams || c.RxRecoveredID == 0 {
		t.Fatalf("counters %+v", c)
	}
}
