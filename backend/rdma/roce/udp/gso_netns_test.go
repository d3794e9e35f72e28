package udp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/internal/netlab"
)

// TestNetnsGSO runs RC traffic between two namespaces through M, over IPv6
// and IPv4, twice: first with M forwarding in the kernel, where a large
// transfer must leave A as GSO super-datagrams (IPv6; never IPv4) and
// reach B's endpoint as GRO buffers, every byte intact; then through a
// forwarder of the test's own on TUN devices in M, which sees what a wire
// carries (the kernel segments super-datagrams for a device without
// offload) and checks every packet: one RoCEv2 packet per datagram, the
// ICRC right for the IP header it actually has, for IPv4 ID 0 and DF.
func TestNetnsGSO(t *testing.T) {
	for _, v6 := range []bool{true, false} {
		name := "ipv4"
		if v6 {
			name = "ipv6"
		}
		t.Run(name, func(t *testing.T) {
			l := netlab.NewT(t)
			mp, err := l.NewMultiPath(1)
			if err != nil {
				t.Fatal(err)
			}
			p := mp.Paths[0]
			aAddr, bAddr := p.A, p.B
			if v6 {
				aAddr, bAddr = p.A6, p.B6
			}
			a := listenIn(t, mp.A, Config{Addr: aAddr})
			b := listenIn(t, mp.B, Config{Addr: bAddr})
			if gso, gro := a.Offload(); gso != v6 || !gro {
				t.Fatalf("offload GSO %v, GRO %v; want GSO %v (IPv6 only) and GRO", gso, gro, v6)
			}
			x, y := connect(t, a, b, rc.Config{PMTU: roce.MTU1024, RetryCnt: 7, RNRRetry: 7}, 8<<20+64)

			a0, b0 := a.Counters(), b.Counters()
			exercise(t, x, y, 8<<20, 65536, 50)
			// A datagram counted received is counted delivered (or
			// dropped) a moment later.
			waitFor(t, func() bool {
				c := b.Counters()
				return c.RxDatagrams == c.RxDelivered+c.RxTruncated+c.RxMalformed+c.RxICRC+c.RxUnknownQP+c.RxWrongPeer
			})
			ca, cb := sub(a.Counters(), a0), sub(b.Counters(), b0)
			t.Logf("kernel forwarding:\nA %+v\nB %+v", ca, cb)
			if ca.TxErrors != 0 || cb.RxDelivered != cb.RxDatagrams {
				t.Fatalf("errors or drops: A %+v, B %+v", ca, cb)
			}
			if v6 {
				// 3 × 8 MiB of WRITE, READ request and SEND from A at
				// 1 KiB a packet: most in super-datagrams.
				if ca.TxGSO < 2*(8<<20)/65536 || ca.TxDatagrams < 8*ca.TxCalls || cb.RxGRO == 0 {
					t.Fatalf("no GSO/GRO to speak of: A %+v, B %+v", ca, cb)
				}
			} else if ca.TxGSO != 0 {
				t.Fatalf("IPv4 super-datagrams: %+v", ca)
			}

			fromA, fromB, err := mp.Divert(0, 1500)
			if err != nil {
				t.Fatal(err)
			}
			w := &wireCheck{t: t}
			var wg sync.WaitGroup
			for _, f := range []*os.File{fromA, fromB} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					w.forward(f)
				}()
			}
			a1 := a.Counters()
			exercise(t, x, y, 1<<20, 65536, 10)
			if gsos := a.Counters().TxGSO - a1.TxGSO; v6 && gsos == 0 {
				t.Fatal("no super-datagram crossed the forwarder")
			}
			fromA.Close()
			fromB.Close()
			wg.Wait()
			if err := w.first(); err != nil {
				t.Fatal(err)
			}
			if w.packets.Load() < 3*(1<<20)/1024 {
				t.Fatalf("%d packets crossed the forwarder", w.packets.Load())
			}
			t.Logf("forwarder: %d packets checked, the largest %d bytes", w.packets.Load(), w.largest.Load())
		})
	}
}

func sub(x, y Counters) Counters {
	return Counters{RxDatagrams: x.RxDatagrams - y.RxDatagrams, RxDelivered: x.RxDelivered - y.RxDelivered,
		RxTruncated: x.RxTruncated - y.RxTruncated, RxMalformed: x.RxMalformed - y.RxMalformed, RxICRC: x.RxICRC - y.RxICRC,
		RxRecoveredID: x.RxRecoveredID - y.RxRecoveredID, RxUnknownQP: x.RxUnknownQP - y.RxUnknownQP,
		RxWrongPeer: x.RxWrongPeer - y.RxWrongPeer, TxDatagrams: x.TxDatagrams - y.TxDatagrams, TxErrors: x.TxErrors - y.TxErrors,
		TxCalls: x.TxCalls - y.TxCalls, RxCalls: x.RxCalls - y.RxCalls, TxGSO: x.TxGSO - y.TxGSO, RxGRO: x.RxGRO - y.RxGRO}
}

// wireCheck forwards the packets of a diverted path (each written back to
// the TUN it came from, which M then routes on) after checking each.
type wireCheck struct {
	t       *testing.T
	packets atomic.Int64
	largest atomic.Int64
	mu      sync.Mutex
	err     error // the first bad packet
}

func (w *wireCheck) forward(f *os.File) {
	buf := make([]byte, 2048)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return // closed
		}
		if err := checkWire(buf[:n]); err != nil {
			w.mu.Lock()
			if w.err == nil {
				w.err = err
			}
			w.mu.Unlock()
		}
		w.packets.Add(1)
		if int64(n) > w.largest.Load() {
			w.largest.Store(int64(n))
		}
		if _, err := f.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (w *wireCheck) first() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// checkWire checks one IP packet as a wire carries it: UDP to or from
// port 4791, whose payload is exactly one RoCEv2 packet with an ICRC
// right for the packet's own IP header; IPv4 with DF and ID 0.
func checkWire(pkt []byte) error {
	if len(pkt) < 1 {
		return errors.New("empty packet")
	}
	var ip roce.IPHeader
	var udp []byte
	switch pkt[0] >> 4 {
	case 4:
		ihl := int(pkt[0]&0xf) * 4
		if ihl != 20 || len(pkt) < ihl+8 || pkt[9] != 17 || int(binary.BigEndian.Uint16(pkt[2:])) != len(pkt) {
			return fmt.Errorf("not a plain IPv4 UDP packet: % x", pkt[:min(len(pkt), 28)])
		}
		ip = roce.IPHeader{Src: netip.AddrFrom4([4]byte(pkt[12:16])), Dst: netip.AddrFrom4([4]byte(pkt[16:20])),
			ID: binary.BigEndian.Uint16(pkt[4:]), FlagsFragment: binary.BigEndian.Uint16(pkt[6:])}
		if ip.ID != 0 || ip.FlagsFragment != roce.IPv4DF {
			return fmt.Errorf("IPv4 ID %#x, flags/fragment %#x: want 0 and DF", ip.ID, ip.FlagsFragment)
		}
		udp = pkt[ihl:]
	case 6:
		if len(pkt) < 48 || pkt[6] != 17 || int(binary.BigEndian.Uint16(pkt[4:]))+40 != len(pkt) {
			return fmt.Errorf("not a plain IPv6 UDP packet: % x", pkt[:min(len(pkt), 48)])
		}
		ip = roce.IPHeader{Src: netip.AddrFrom16([16]byte(pkt[8:24])), Dst: netip.AddrFrom16([16]byte(pkt[24:40]))}
		udp = pkt[40:]
	default:
		return fmt.Errorf("IP version %d", pkt[0]>>4)
	}
	sport, dport := binary.BigEndian.Uint16(udp), binary.BigEndian.Uint16(udp[2:])
	if int(binary.BigEndian.Uint16(udp[4:])) != len(udp) || (sport != roce.UDPPort && dport != roce.UDPPort) {
		return fmt.Errorf("UDP %d → %d, length %d of %d", sport, dport, binary.BigEndian.Uint16(udp[4:]), len(udp))
	}
	payload := udp[8:]
	if _, err := roce.Parse(payload); err != nil {
		return fmt.Errorf("UDP payload of %d bytes: %w", len(payload), err)
	}
	if err := roce.Verify(ip, sport, dport, payload); err != nil {
		return fmt.Errorf("%d bytes from %v: %w", len(payload), ip.Src, err)
	}
	return nil
}
