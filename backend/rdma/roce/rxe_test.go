package roce

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/vrdma/vrdma/internal/pcapfile"
)

// TestRxeCaptures runs the codec over real traffic of Linux soft-RoCE
// (testdata/rxe, made by tests/rxe_capture_test.go): every RoCE v2 frame
// of every capture, IPv4 and IPv6, parses, keeps rxe's 1024-byte path MTU
// rules, has a good ICRC (IPv4 with the Identification the frame carries,
// which RecoverIPv4ID also finds from the rest), and re-encodes to the
// same bytes.
func TestRxeCaptures(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "rxe", "*.pcap"))
	if err != nil || len(files) < 10 {
		t.Fatalf("captures: %v (%d files)", err, len(files))
	}
	ops := map[Opcode]int{}
	for _, f := range files {
		_, pkts, err := pcapfile.ReadFile(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for i, p := range pkts {
			ip, sport, dport, payload, ok := frameUDP(p.Data)
			if !ok || dport != UDPPort {
				t.Fatalf("%s: frame %d is not RoCE v2", f, i)
			}
			pkt, err := Parse(payload)
			if err != nil {
				t.Fatalf("%s: frame %d: %v", f, i, err)
			}
			if err := pkt.CheckPMTU(MTU1024); err != nil {
				t.Errorf("%s: frame %d: %v", f, i, err)
			}
			if err := Verify(ip, sport, dport, payload); err != nil {
				t.Errorf("%s: frame %d: %v", f, i, err)
			}
			if ip.Is4() {
				if id, ok := RecoverIPv4ID(ip, sport, dport, payload); !ok || id != ip.ID {
					t.Errorf("%s: frame %d: recovered IPv4 ID %#x (%v), frame has %#x", f, i, id, ok, ip.ID)
				}
			}
			enc, err := pkt.Append(nil)
			if err == nil {
				err = Seal(ip, sport, dport, enc)
			}
			if err != nil || !bytes.Equal(enc, payload) {
				t.Errorf("%s: frame %d (%v) re-encodes differently: %v", f, i, pkt.BTH.Opcode, err)
			}
			ops[pkt.BTH.Opcode]++
		}
	}
	// Every RC opcode rxe sent in perftest's runs.
	for _, op := range []Opcode{OpSendFirst, OpSendMiddle, OpSendLast, OpSendOnly, OpWriteFirst, OpWriteMiddle,
		OpWriteLast, OpWriteOnly, OpReadRequest, OpReadResponseFirst, OpReadResponseMiddle, OpReadResponseLast,
		OpAcknowledge, OpAtomicAcknowledge, OpCompareSwap, OpFetchAdd} {
		if ops[op] == 0 {
			t.Errorf("no %v packet in the captures", op)
		}
	}
}

// frameUDP splits an Ethernet frame carrying IPv4 or IPv6 UDP.
func frameUDP(f []byte) (ip IPHeader, sport, dport uint16, payload []byte, ok bool) {
	if len(f) < 14 {
		return ip, 0, 0, nil, false
	}
	var udp []byte
	switch binary.BigEndian.Uint16(f[12:]) {
	case 0x0800:
		h := f[14:]
		if len(h) < 20 || h[0]>>4 != 4 || h[9] != 17 {
			return ip, 0, 0, nil, false
		}
		hl := int(h[0]&0xf) * 4
		tot := int(binary.BigEndian.Uint16(h[2:]))
		if hl < 20 || tot < hl || tot > len(h) {
			return ip, 0, 0, nil, false
		}
		ip = IPHeader{Src: netip.AddrFrom4([4]byte(h[12:16])), Dst: netip.AddrFrom4([4]byte(h[16:20])),
			ID: binary.BigEndian.Uint16(h[4:]), FlagsFragment: binary.BigEndian.Uint16(h[6:])}
		udp = h[hl:tot]
	case 0x86dd:
		h := f[14:]
		if len(h) < 40 || h[0]>>4 != 6 || h[6] != 17 {
			return ip, 0, 0, nil, false
		}
		tot := 40 + int(binary.BigEndian.Uint16(h[4:]))
		if tot > len(h) {
			return ip, 0, 0, nil, false
		}
		ip = IPHeader{Src: netip.AddrFrom16([16]byte(h[8:24])), Dst: netip.AddrFrom16([16]byte(h[24:40]))}
		udp = h[40:tot]
	default:
		return ip, 0, 0, nil, false
	}
	if len(udp) < 8 || int(binary.BigEndian.Uint16(udp[4:])) != len(udp) {
		return ip, 0, 0, nil, false
	}
	return ip, binary.BigEndian.Uint16(udp), binary.BigEndian.Uint16(udp[2:]), udp[8:], true
}
