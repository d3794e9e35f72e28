package spray

import (
	"net/netip"
	"os"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
)

// FuzzParse: Parse never panics, an error comes with the zero Packet,
// and what it accepts re-encodes to the same bytes.
func FuzzParse(f *testing.F) {
	h := Hello{PMTU: roce.MTU1024, Paths: 4, Window: 1024, Messages: 256, StartPSN: 0x123456, NAddrs: 2,
		Addrs: [MaxAddrs]netip.Addr{netip.MustParseAddr("10.200.0.1"), netip.MustParseAddr("fd00::1")}}
	f.Add(appendHello(nil, OpHello, 7, 0, &h))
	f.Add(appendHello(nil, OpHelloAck, 7, 0xabcdef, &h)) // a token in the BTH PSN
	f.Add(appendData(nil, 7, 9, &Data{Op: DWrite, Path: 1, MSN: 3, Offset: 1024, Length: 2000, RKey: 5, VA: 0x1000, TS: 77, Payload: make([]byte, 976)}))
	f.Add(appendData(nil, 7, 9, &Data{Op: DFetchAdd, Length: 8, RKey: 5, VA: 0x1000, Payload: make([]byte, 16)}))
	f.Add(appendAck(nil, 7, &Ack{Status: ackRNR, Code: 5, Path: 2, CumPSN: 100, Retired: 4, PSN: 101, MSN: 4, SACK: []byte{0xff, 0, 1, 0}}))
	f.Add(appendProbe(nil, 7, Probe{Path: 3, TS: 99}))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Parse(b, roce.MTU1024)
		if err != nil {
			if p.Opcode != 0 || p.Data.Payload != nil || p.Ack.SACK != nil {
				t.Fatalf("error %v with a packet %+v", err, p)
			}
			return
		}
		var out []byte
		switch p.Opcode {
		case OpHello, OpHelloAck:
			out = appendHello(nil, p.Opcode, p.DestQP, p.PSN, &p.Hello)
		case OpData:
			out = appendData(nil, p.DestQP, p.PSN, &p.Data)
		case OpAck:
			out = appendAck(nil, p.DestQP, &p.Ack)
		case OpProbe:
			out = appendProbe(nil, p.DestQP, p.Probe)
		}
		// The ICRC, P_Key (0x7fff is accepted) and the BTH bits the
		// parser ignores are not compared; the PSN (DATA's, HELLO's
		// token, 0 on the rest) is.
		n := len(b) - roce.ICRCLen - int(b[1]>>4&3) // pad bytes are ignored
		if len(out) != len(b) || string(out[roce.BTHLen:n]) != string(b[roce.BTHLen:n]) || out[0] != b[0] || string(out[9:12]) != string(b[9:12]) {
			t.Fatalf("re-encoded\n%x\nfrom\n%x", out, b)
		}
	})
}

// FuzzReceive feeds arbitrary spray packets from the peer into a Conn
// that negotiated with it and has work outstanding both ways: nothing
// panics, and the Conn stays within its bounds.
func FuzzReceive(f *testing.F) {
	f.Add(appendData(nil, 1, 0, &Data{Op: DWrite, MSN: 0, Length: 8, RKey: testRKey, VA: testMRAddr, Payload: make([]byte, 8)}))
	f.Add(appendData(nil, 1, 5, &Data{Op: DSend, MSN: 3, RSN: 2, Length: 3000, Offset: 2048, Payload: make([]byte, 952)}))
	f.Add(appendData(nil, 1, 1, &Data{Op: DReadResp, MSN: 0, Length: 100, Payload: make([]byte, 100)}))
	f.Add(appendAck(nil, 1, &Ack{Status: ackNAK, Code: 2, Path: noPath, CumPSN: 3}))
	f.Add(appendAck(nil, 1, &Ack{Path: 0, CumPSN: 1, Retired: 1, SACK: []byte{1, 2, 3, 4}}))
	f.Add(appendProbe(nil, 1, Probe{}))
	f.Add(appendHello(nil, OpHello, 1, 0, &Hello{PMTU: roce.MTU1024, Window: 1024, Messages: 256, NAddrs: 1,
		Addrs: [MaxAddrs]netip.Addr{netip.MustParseAddr("127.0.9.2")}}))
	f.Add(appendHello(nil, OpHello, 1, 0x5a5a5a, &Hello{PMTU: roce.MTU1024, Window: 64, Messages: 1, StartPSN: 7, NAddrs: 1,
		Addrs: [MaxAddrs]netip.Addr{netip.MustParseAddr("127.0.9.2")}}))
	a := netip.MustParseAddr("127.0.9.1")
	peer := netip.MustParseAddr("127.0.9.2")
	// Each fuzzing process binds a port of its own.
	ep, err := udp.Listen(udp.Config{Addr: a, Port: uint16(40000 + os.Getpid()%20000)})
	if err != nil {
		f.Fatal(err)
	}
	defer ep.Close()
	var qpn uint32
	f.Fuzz(func(t *testing.T, b []byte) {
		qpn++
		host, _ := newHost(4096)
		host.PostRecv(rc.Recv{ID: 1, Len: 4096, Buf: make(bufT, 4096)})
		c, err := New(Config{RC: rc.Config{QPN: qpn, DestQPN: 1, PMTU: roce.MTU1024}, Locals: []*udp.Endpoint{ep},
			Peer: netip.AddrPortFrom(peer, 47961), HelloRetries: 100}, host)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.Start(rc.Config{}); err != nil {
			t.Fatal(err)
		}
		hl := Hello{PMTU: roce.MTU1024, Window: 1024, Messages: 256, StartPSN: 0, NAddrs: 1, Addrs: [MaxAddrs]netip.Addr{peer}}
		src := netip.AddrPortFrom(peer, 47961)
		c.ReceiveVendor(appendHello(nil, OpHelloAck, qpn, 0, &hl), src, ep) // token: the SQPSN given to Start
		if c.Mode() != Sprayed {
			t.Fatalf("mode %v", c.Mode())
		}
		_ = c.Post(rc.SendWR{ID: 1, Opcode: rc.WRRDMARead, Length: 3000, RemoteAddr: 0x1000, RKey: 3, Local: make(bufT, 3000)})
		_ = c.Post(rc.SendWR{ID: 2, Opcode: rc.WRSend, Length: 10, Local: make(bufT, 10)})
		before := c.Counters().DropToken
		c.ReceiveVendor(b, src, ep)
		// RQPSN and SQPSN are 0: a HELLO or HELLO_ACK with another token
		// is refused, one with 0 only if its parameters are the first's.
		if p, err := Parse(b, roce.MTU1024); err == nil && (p.Opcode == OpHello || p.Opcode == OpHelloAck) && p.Hello.PMTU == roce.MTU1024 {
			if got, want := c.Counters().DropToken-before, uint64(min(uint32(p.PSN), 1)); got != want {
				t.Fatalf("token %#x: DropToken +%d, want +%d", uint32(p.PSN), got, want)
			}
		}
		c.Flush()
		c.Tick(ep)
	})
}

// bufT is an rc.Buffer over a slice.
type bufT []byte

func (b bufT) Gather(off uint32, dst []byte) error {
	if int(off)+len(dst) > len(b) {
		return rc.ErrWR
	}
	copy(dst, b[off:])
	return nil
}

func (b bufT) Scatter(off uint32, src []byte) error {
	if int(off)+len(src) > len(b) {
		return rc.ErrWR
	}
	copy(b[off:], src)
	return nil
}
