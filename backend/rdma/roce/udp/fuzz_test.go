package udp

import (
	"net/netip"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
)

// nopPort is an rc.Port that sends nowhere.
type nopPort struct{ sent int }

func (p *nopPort) Send([]byte) { p.sent++ }
func (p *nopPort) Flush()      {}
func (p *nopPort) Wake()       {}

// FuzzHandle feeds arbitrary datagrams, from the QP's peer or another
// address, through the endpoint's receive path (size, Parse, ICRC with ID
// recovery, demultiplexing, peer check) into a QP with work outstanding:
// nothing panics, and every datagram lands in exactly one counter.
func FuzzHandle(f *testing.F) {
	local := netip.MustParseAddr("10.200.0.1")
	peer := netip.MustParseAddr("10.200.0.129")
	seal := func(p roce.Packet) []byte {
		p.BTH.PKey = 0xffff
		b, err := p.Append(nil)
		if err != nil {
			f.Fatal(err)
		}
		roce.Seal(roce.IPHeader{Src: peer, Dst: local, FlagsFragment: roce.IPv4DF}, 50000, roce.UDPPort, b)
		return append([]byte{0}, b...)
	}
	f.Add(seal(roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendOnly, DestQP: 7, PSN: 100}, Payload: []byte{1, 2, 3}}))
	f.Add(seal(roce.Packet{BTH: roce.BTH{Opcode: roce.OpAcknowledge, DestQP: 7, PSN: 1}, AETH: roce.AETH{Syndrome: roce.ACKSyndrome(31)}}))
	f.Add(seal(roce.Packet{BTH: roce.BTH{Opcode: roce.OpWriteOnly, DestQP: 8, PSN: 100}, RETH: roce.RETH{VA: testMRAddr, RKey: testRKey, DMALen: 4}, Payload: []byte{1, 2, 3, 4}}))
	f.Add([]byte{1, 0x11, 0, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		e := &Endpoint{
			cfg:     Config{Addr: local, Port: roce.UDPPort, RecoverIPv4ID: true},
			local:   netip.AddrPortFrom(local, roce.UDPPort),
			rx:      newBatch(1, bufSize, 0),
			touched: make([]*qpEntry, 0, 1),
		}
		h := rctest.NewHost()
		h.AddMR(&rctest.MR{Buf: make([]byte, 4096), Addr: testMRAddr, RKey: testRKey, Access: rc.AccessRemoteWrite | rc.AccessRemoteRead | rc.AccessRemoteAtomic})
		h.PostRecv(rc.Recv{ID: 1, Len: 64, Buf: rctest.Buf(make([]byte, 64))})
		qp, err := rc.New(rc.Config{QPN: 7, DestQPN: 9, SQPSN: 0, RQPSN: 100, PMTU: roce.MTU1024}, h, &nopPort{})
		if err != nil {
			t.Fatal(err)
		}
		if err := qp.Post(rc.SendWR{ID: 1, Opcode: rc.WRRDMARead, Length: 2048, RemoteAddr: 0x1000, RKey: 3, Local: rctest.Buf(make([]byte, 2048))}); err != nil {
			t.Fatal(err)
		}
		table := map[uint32]*qpEntry{7: {qp: qp, peer: peer}}
		e.table.Store(&table)
		src := peer
		if data[0]&1 != 0 {
			src = netip.MustParseAddr("10.200.0.130")
		}
		d := data[1:]
		n := copy(e.rx.bufs[0], d)
		e.rx.setSend(0, n, netip.AddrPortFrom(src, 50000))
		e.rx.hdrs[0].Len = uint32(len(d))
		e.rx.hdrs[0].Hdr.Flags = 0
		e.handle(0, 1)
		for _, ent := range e.touched {
			ent.qp.Flush()
		}
		c := e.Counters()
		if sum := c.RxDelivered + c.RxTruncated + c.RxMalformed + c.RxICRC + c.RxUnknownQP + c.RxWrongPeer; c.RxDatagrams != 1 || sum != 1 {
			t.Fatalf("one datagram, counters %+v", c)
		}
		qp.Close()
	})
}

// FuzzHandleGRO feeds arbitrary receive buffers with an arbitrary gso_size
// in their UDP_GRO control message through the split and the receive
// path: nothing panics, every datagram the split makes lands in exactly
// one counter, and there are never more than the buffer has bytes.
func FuzzHandleGRO(f *testing.F) {
	local, peer := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	pkts := writePackets(f, peer, local, 0, 0, 3*1024, 7)
	f.Add(append(append([]byte(nil), pkts[1]...), pkts[2]...), int32(len(pkts[1])))
	f.Add(pkts[0], int32(0))
	f.Add([]byte{1, 2, 3}, int32(1))
	f.Fuzz(func(t *testing.T, data []byte, seg int32) {
		if len(data) > groBufSize {
			return
		}
		e, _ := groEndpoint(t, local, peer)
		coalesce(e, netip.AddrPortFrom(peer, 50000), seg, data)
		e.handle(0, 1)
		for _, ent := range e.touched {
			ent.qp.Flush()
		}
		c := e.Counters()
		sum := c.RxDelivered + c.RxTruncated + c.RxMalformed + c.RxICRC + c.RxUnknownQP + c.RxWrongPeer
		if c.RxDatagrams != sum || c.RxDatagrams == 0 || c.RxDatagrams > uint64(max(1, len(data))) {
			t.Fatalf("%d bytes, gso_size %d: counters %+v", len(data), seg, c)
		}
	})
}
