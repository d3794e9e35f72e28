package udp

import (
	"bytes"
	"errors"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
	"github.com/vrdma/vrdma/backend/rdma/roce/ud"
)

// udHost records what arrives (ud.Host): copies, since the payload is
// valid during Receive only.
type udHost struct{ got chan ud.Arrival }

func newUDHost() *udHost { return &udHost{got: make(chan ud.Arrival, 16)} }

func (h *udHost) Receive(a *ud.Arrival) {
	c := *a
	c.Payload = bytes.Clone(a.Payload)
	select {
	case h.got <- c:
	default:
	}
}

func (h *udHost) next(t *testing.T) ud.Arrival {
	t.Helper()
	select {
	case a := <-h.got:
		return a
	case <-time.After(5 * time.Second):
		t.Fatal("no datagram arrived")
		return ud.Arrival{}
	}
}

// TestUDLoopback: SendUD from one endpoint reaches the UD QP registered on
// another (SEND_ONLY and SEND_ONLY_WITH_IMMEDIATE, a payload of the
// largest MTU, from any source); what the endpoint refuses to send errs;
// a packet of the wrong transport or P_Key, or to an unregistered QP, is
// counted and never reaches the QP.
func TestUDLoopback(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	a := listen(t, Config{Addr: lo, Port: 47920})
	b := listen(t, Config{Addr: lo, Port: roce.UDPPort + 1})
	_ = b.Close()
	b = listen(t, Config{Addr: netip.MustParseAddr("127.0.0.2"), RecoverIPv4ID: true})
	h := newUDHost()
	if err := b.RegisterUD(0x4242, h); err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterUD(0x4242, h); !errors.Is(err, ErrQPN) {
		t.Fatalf("register twice: got %v, want ErrQPN", err)
	}
	dst := b.LocalAddr().Addr()
	payload := random(roce.MaxPayload, 5)
	for i, d := range []ud.Datagram{
		{SrcQPN: 0x111, DestQPN: 0x4242, QKey: 0x80000001, Payload: payload[:1]},
		{SrcQPN: 0x112, DestQPN: 0x4242, QKey: 7, Imm: 0xdeadbeef, WithImm: true, Solicited: true, Payload: payload},
		{SrcQPN: 0x113, DestQPN: 0x4242, QKey: 7},
	} {
		if err := a.SendUD(dst, roce.PSN(i), &d); err != nil {
			t.Fatal(err)
		}
		got := h.next(t)
		if got.Src != lo || got.Dst != dst || got.SrcPort != 47920 || got.IPv4ID != 0 {
			t.Errorf("datagram %d: from %v:%d to %v, ID %d", i, got.Src, got.SrcPort, got.Dst, got.IPv4ID)
		}
		if !bytes.Equal(got.Payload, d.Payload) {
			t.Errorf("datagram %d: payload of %d bytes differs from the %d sent", i, len(got.Payload), len(d.Payload))
		}
		got.Payload, d.Payload = nil, nil
		if !reflect.DeepEqual(got.Datagram, d) {
			t.Errorf("datagram %d: got %+v, want %+v", i, got.Datagram, d)
		}
	}
	for _, bad := range []struct {
		dst netip.Addr
		n   int
	}{{netip.MustParseAddr("::1"), 1}, {netip.IPv4Unspecified(), 1}, {netip.MustParseAddr("224.0.0.1"), 1}, {dst, roce.MaxPayload + 1}} {
		if err := a.SendUD(bad.dst, 0, &ud.Datagram{DestQPN: 0x4242, Payload: make([]byte, bad.n)}); !errors.Is(err, ErrConfig) {
			t.Errorf("SendUD to %v, %d bytes: got %v, want ErrConfig", bad.dst, bad.n, err)
		}
	}
	if err := a.SendUD(dst, 0, &ud.Datagram{DestQPN: 1 << 24}); err == nil {
		t.Error("SendUD to QPN 2^24: got nil error")
	}

	// Refused on arrival: an RC SEND to the UD QP, a UD datagram with
	// another partition's P_Key, one to an unregistered QPN. The QP's
	// handler runs before its datagram is counted delivered: wait for the
	// count of the three above, or the snapshot can miss the last.
	waitFor(t, func() bool { return b.Counters().RxDelivered == 3 })
	before := b.Counters()
	r, err := a.Route(netip.AddrPortFrom(dst, roce.UDPPort))
	if err != nil {
		t.Fatal(err)
	}
	send := func(p roce.Packet) {
		pkt, err := p.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Send(append(pkt, 0, 0, 0, 0)[:len(pkt)])
		r.Flush()
	}
	send(roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendOnly, PKey: 0xffff, DestQP: 0x4242}, Payload: []byte{1, 2, 3, 4}})
	send(roce.Packet{BTH: roce.BTH{Opcode: roce.OpUDSendOnly, PKey: 0x8001, DestQP: 0x4242}, DETH: roce.DETH{QKey: 7, SrcQP: 1}})
	send(roce.Packet{BTH: roce.BTH{Opcode: roce.OpUDSendOnly, PKey: 0xffff, DestQP: 0x4243}, DETH: roce.DETH{QKey: 7, SrcQP: 1}})
	waitFor(t, func() bool { return b.Counters().RxDatagrams == before.RxDatagrams+3 })
	c := b.Counters()
	if c.RxMalformed != before.RxMalformed+2 || c.RxUnknownQP != before.RxUnknownQP+1 || c.RxDelivered != before.RxDelivered {
		t.Errorf("refused datagrams: counters %+v, before %+v", c, before)
	}
	select {
	case got := <-h.got:
		t.Fatalf("a refused datagram arrived: %+v", got)
	default:
	}
	b.UnregisterUD(0x4242, h)
	if err := a.SendUD(dst, 0, &ud.Datagram{DestQPN: 0x4242}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return b.Counters().RxUnknownQP == c.RxUnknownQP+1 })
}

// FuzzHandleUD feeds arbitrary datagrams through the receive path to an
// endpoint with a UD QP (7) and an RC QP (8): nothing panics, every
// datagram lands in exactly one counter, and what reaches the UD QP is a
// whole valid UD packet to it, its payload within the packet.
func FuzzHandleUD(f *testing.F) {
	local := netip.MustParseAddr("10.200.0.1")
	peer := netip.MustParseAddr("10.200.0.129")
	seal := func(p roce.Packet) []byte {
		b, err := p.Append(nil)
		if err != nil {
			f.Fatal(err)
		}
		roce.Seal(roce.IPHeader{Src: peer, Dst: local, ID: 0x1234, FlagsFragment: roce.IPv4DF}, 50000, roce.UDPPort, b)
		return b
	}
	f.Add(seal(roce.Packet{BTH: roce.BTH{Opcode: roce.OpUDSendOnly, PKey: 0xffff, DestQP: 7}, DETH: roce.DETH{QKey: 1, SrcQP: 2}, Payload: []byte{1, 2, 3}}))
	f.Add(seal(roce.Packet{BTH: roce.BTH{Opcode: roce.OpUDSendOnlyWithImmediate, PKey: 0x7fff, DestQP: 7}, DETH: roce.DETH{QKey: 1, SrcQP: 2}, ImmDt: 9}))
	f.Add(seal(roce.Packet{BTH: roce.BTH{Opcode: roce.OpUDSendOnly, PKey: 0xffff, DestQP: 8}, DETH: roce.DETH{QKey: 1, SrcQP: 2}}))
	f.Add(seal(roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendOnly, PKey: 0xffff, DestQP: 7}}))
	f.Add([]byte{0x64, 0, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		e := &Endpoint{
			cfg:     Config{Addr: local, Port: roce.UDPPort, RecoverIPv4ID: true},
			local:   netip.AddrPortFrom(local, roce.UDPPort),
			rx:      newBatch(1, bufSize, 0),
			touched: make([]*qpEntry, 0, 1),
		}
		h := newUDHost()
		qp, err := rc.New(rc.Config{QPN: 8, DestQPN: 9, PMTU: roce.MTU1024}, rctest.NewHost(), &nopPort{})
		if err != nil {
			t.Fatal(err)
		}
		defer qp.Close()
		table := map[uint32]*qpEntry{7: {ud: h}, 8: {qp: qp, peer: peer}}
		e.table.Store(&table)
		n := copy(e.rx.bufs[0], data)
		e.rx.setSend(0, n, netip.AddrPortFrom(peer, 50000))
		e.rx.hdrs[0].Len = uint32(len(data))
		e.rx.hdrs[0].Hdr.Flags = 0
		e.handle(0, 1)
		for _, ent := range e.touched {
			ent.flush()
		}
		c := e.Counters()
		if sum := c.RxDelivered + c.RxTruncated + c.RxMalformed + c.RxICRC + c.RxUnknownQP + c.RxWrongPeer; c.RxDatagrams != 1 || sum != 1 {
			t.Fatalf("one datagram, counters %+v", c)
		}
		select {
		case a := <-h.got:
			p, err := roce.Parse(data)
			if err != nil || !p.BTH.Opcode.IsUD() || p.BTH.DestQP != 7 || !bytes.Equal(p.Payload, a.Payload) ||
				a.SrcQPN != p.DETH.SrcQP || a.QKey != p.DETH.QKey || a.Src != peer || a.Dst != local {
				t.Fatalf("delivered %+v from % x (%v)", a, data, err)
			}
			if len(data) > bufSize {
				t.Fatalf("delivered a datagram of %d bytes", len(data))
			}
		default:
		}
	})
}
