package roce

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"net/netip"
	"strings"
	"testing"
)

func TestICRCSeed(t *testing.T) {
	ones := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if got := crc32.ChecksumIEEE(ones); got != icrcSeed {
		t.Fatalf("got %#08x, want %#08x", got, icrcSeed)
	}
	// rxe_icrc.c starts its raw crc32_le register at 0xdebb20e3.
	if got := ^uint32(icrcSeed); got != 0xdebb20e3 {
		t.Fatalf("got %#08x, want rxe's 0xdebb20e3", got)
	}
}

// unhex decodes a hex dump, ignoring white space.
func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// goldenFrame splits an Ethernet+IPv4+UDP frame into what ICRC takes.
func goldenFrame(t *testing.T, f []byte) (ip IPHeader, sport, dport uint16, udpPayload []byte) {
	t.Helper()
	h := f[14:]
	if h[0] != 0x45 || h[9] != ipProtoUDP {
		t.Fatalf("not IPv4/UDP without options: % x", h[:20])
	}
	ip = IPHeader{
		Src:           netip.AddrFrom4([4]byte(h[12:16])),
		Dst:           netip.AddrFrom4([4]byte(h[16:20])),
		ID:            binary.BigEndian.Uint16(h[4:]),
		FlagsFragment: binary.BigEndian.Uint16(h[6:]),
	}
	u := h[20:]
	return ip, binary.BigEndian.Uint16(u), binary.BigEndian.Uint16(u[2:]), u[8:binary.BigEndian.Uint16(u[4:])]
}

// TestICRCGolden checks ICRCs computed elsewhere: a congestion notification
// packet captured from a Mellanox ConnectX-4 Lx NIC, and a UC SEND_ONLY
// built by Scapy's RoCE layer, both from Scapy's test suite
// (test/contrib/roce.uts). The opcodes are not RC, which the ICRC does not
// care about.
func TestICRCGolden(t *testing.T) {
	tests := []struct {
		name  string
		frame string
	}{
		{"ConnectX-4 Lx CNP", `
			e41d 2dab 2bc2 7cfe 9064 3b32 0800 45c2
			003c 718c 4000 4011 9161 0a00 1101 0a00
			1201 0000 12b7 0028 0000 8100 ffff 4000
			0118 0000 0000 0000 0000 0000 0000 0000
			0000 0000 0000 82fd 002a`},
		// Ether()/IP(tos=0x1, id=1144, flags='DF', ttl=64, src=dst=
		// '192.168.0.7')/UDP(sport=49152)/BTH(opcode='UC_SEND_ONLY',
		// migreq=1, padcount=2, dqpn=211, psn=13571856)/Raw(20 bytes); the
		// IP and UDP checksums are Scapy's, the ICRC 0x78f353f3 as its
		// test reads the field (big-endian).
		{"Scapy UC SEND_ONLY", `
			248a 07a8 fa22 248a 07a8 fa22 0800 4501
			0040 0478 4000 4011 b4d5 c0a8 0007 c0a8
			0007 c000 12b7 002c aca2 2460 ffff 0000
			00d3 00cf 1710 4630 818b e289 35d9 0e9a
			9550 5401 be88 5e50 0000 78f3 53f3`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ip, sport, dport, b := goldenFrame(t, unhex(t, tt.frame))
			end := len(b) - ICRCLen
			got := binary.LittleEndian.AppendUint32(nil, ICRC(ip, sport, dport, b[:end]))
			if string(got) != string(b[end:]) {
				t.Fatalf("got ICRC bytes % x, want % x", got, b[end:])
			}
			if err := Verify(ip, sport, dport, b); err != nil {
				t.Fatalf("Verify: %v", err)
			}
			want := ip.ID
			ip.ID = 0
			if err := Verify(ip, sport, dport, b); !errors.Is(err, ErrICRC) {
				t.Fatalf("Verify with ID 0: got %v, want ErrICRC", err)
			}
			if id, ok := RecoverIPv4ID(ip, sport, dport, b); !ok || id != want {
				t.Fatalf("RecoverIPv4ID: got %#04x, %t; want %#04x", id, ok, want)
			}
		})
	}
}

// refICRC is a reference ICRC written from the RoCEv2 annex's description,
// independently of ICRC: it takes a whole Ethernet frame as frame() builds
// it (with real TOS, TTL, flow label and checksums), masks the variant
// fields by their offsets and runs a bitwise CRC-32.
func refICRC(f []byte) uint32 {
	m := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, f[14:len(f)-ICRCLen]...)
	ip := m[8:]
	var udp []byte
	if ip[0]>>4 == 4 {
		ip[1], ip[8], ip[10], ip[11] = 0xff, 0xff, 0xff, 0xff // TOS, TTL, checksum
		udp = ip[20:]
	} else {
		ip[0] |= 0x0f // traffic class and flow label
		ip[1], ip[2], ip[3] = 0xff, 0xff, 0xff
		ip[7] = 0xff // hop limit
		udp = ip[40:]
	}
	udp[6], udp[7] = 0xff, 0xff // UDP checksum
	udp[8+4] = 0xff             // BTH FECN, BECN, resv6a
	crc := ^uint32(0)
	for _, c := range m {
		crc ^= uint32(c)
		for i := 0; i < 8; i++ {
			if crc&1 != 0 {
				crc = crc>>1 ^ 0xedb88320
			} else {
				crc >>= 1
			}
		}
	}
	return ^crc
}

func TestICRCReference(t *testing.T) {
	mapped := IPHeader{
		Src: netip.AddrFrom16(testIPv4.Src.As16()), Dst: netip.AddrFrom16(testIPv4.Dst.As16()),
		ID: 0x1234, FlagsFragment: IPv4DF,
	}
	for _, ip := range []IPHeader{testIPv4, testIPv6, mapped} {
		for _, op := range testOpcodes {
			for _, n := range payloadSizes(op) {
				p := samplePacket(op, n)
				b := encode(t, p)
				if err := Seal(ip, testSrcPort, UDPPort, b); err != nil {
					t.Fatal(err)
				}
				want := refICRC(frame(ip, testSrcPort, b))
				if got := binary.LittleEndian.Uint32(b[len(b)-4:]); got != want {
					t.Fatalf("%v %v/%d: got %#08x, want %#08x", ip.Dst, op, n, got, want)
				}
				if err := Verify(ip, testSrcPort, UDPPort, b); err != nil {
					t.Fatalf("%v %v/%d: Verify: %v", ip.Dst, op, n, err)
				}
			}
		}
	}
}

func TestICRCCoverage(t *testing.T) {
	b := encode(t, samplePacket(OpWriteOnlyWithImmediate, 33))
	body := b[:len(b)-ICRCLen]
	base := ICRC(testIPv4, testSrcPort, UDPPort, body)
	// Byte 4 of the BTH (FECN, BECN, resv6a) is masked.
	for _, v := range []byte{0x00, 0x80, 0x40, 0x3f, 0xff} {
		c := mutate(body, func(b []byte) []byte { b[4] = v; return b })
		if got := ICRC(testIPv4, testSrcPort, UDPPort, c); got != base {
			t.Errorf("BTH byte 4 = %#02x: ICRC changed", v)
		}
	}
	// Everything else is covered.
	changed := func(name string, ip IPHeader, sport, dport uint16, body []byte) {
		t.Helper()
		if ICRC(ip, sport, dport, body) == base {
			t.Errorf("%s: ICRC did not change", name)
		}
	}
	ip := testIPv4
	ip.ID = 1
	changed("IPv4 ID", ip, testSrcPort, UDPPort, body)
	ip = testIPv4
	ip.FlagsFragment = 0
	changed("IPv4 flags", ip, testSrcPort, UDPPort, body)
	ip = testIPv4
	ip.Src = netip.MustParseAddr("192.0.2.3")
	changed("source address", ip, testSrcPort, UDPPort, body)
	changed("source port", testIPv4, testSrcPort+1, UDPPort, body)
	changed("destination port", testIPv4, testSrcPort, UDPPort+1, body)
	for i := range body {
		if i == 4 {
			continue
		}
		c := mutate(body, func(b []byte) []byte { b[i] ^= 0x01; return b })
		changed("body byte", testIPv4, testSrcPort, UDPPort, c)
	}
	changed("length", testIPv4, testSrcPort, UDPPort, append(mutate(body, func(b []byte) []byte { return b }), 0))
}

func TestVerifyErrors(t *testing.T) {
	b := encode(t, samplePacket(OpSendOnly, 100))
	if err := Seal(testIPv6, testSrcPort, UDPPort, b); err != nil {
		t.Fatal(err)
	}
	if err := Verify(testIPv6, testSrcPort, UDPPort, b); err != nil {
		t.Fatal(err)
	}
	bad := mutate(b, func(b []byte) []byte { b[BTHLen+50] ^= 0x10; return b })
	err := Verify(testIPv6, testSrcPort, UDPPort, bad)
	var ie *ICRCError
	if !errors.Is(err, ErrICRC) || !errors.As(err, &ie) || ie.Got == ie.Want {
		t.Fatalf("corrupt payload: got %v, want an *ICRCError", err)
	}
	if err := Verify(testIPv6, testSrcPort, UDPPort, b[:15]); !errors.Is(err, ErrTruncated) {
		t.Fatalf("15 bytes: got %v, want ErrTruncated", err)
	}
	mixed := IPHeader{Src: testIPv4.Src, Dst: testIPv6.Dst}
	for _, ip := range []IPHeader{{}, mixed, {Dst: testIPv6.Dst}} {
		if err := Verify(ip, testSrcPort, UDPPort, b); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: Verify: got %v, want ErrInvalid", ip, err)
		}
		if err := Seal(ip, testSrcPort, UDPPort, b); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: Seal: got %v, want ErrInvalid", ip, err)
		}
		_ = ICRC(ip, testSrcPort, UDPPort, b) // meaningless, must not panic
	}
	if err := Seal(testIPv4, testSrcPort, UDPPort, b[:15]); !errors.Is(err, ErrInvalid) {
		t.Errorf("Seal of 15 bytes: got %v, want ErrInvalid", err)
	}
	_ = ICRC(testIPv4, testSrcPort, UDPPort, b[:5]) // shorter than a BTH: must not panic
}

func TestRecoverIPv4ID(t *testing.T) {
	for _, n := range []int{0, 1, 1000, 4096} {
		b := encode(t, samplePacket(OpSendOnly, n))
		for _, id := range []uint16{0, 1, 0x8000, 0x718c, 0xffff, uint16(n * 2654435761 >> 7)} {
			ip := testIPv4
			ip.ID = id
			if err := Seal(ip, testSrcPort, UDPPort, b); err != nil {
				t.Fatal(err)
			}
			ip.ID = 0xbeef // ignored
			if got, ok := RecoverIPv4ID(ip, testSrcPort, UDPPort, b); !ok || got != id {
				t.Fatalf("%d bytes, ID %#04x: got %#04x, %t", n, id, got, ok)
			}
			// Corrupting one bit of the packet leaves no consistent ID
			// (each bit's image lies outside the 16-dimensional span of
			// the ID's images, checked here for every bit of the BTH).
			for i := 0; i < BTHLen*8; i++ {
				if i/8 == 4 {
					continue // masked
				}
				c := mutate(b, func(b []byte) []byte { b[i/8] ^= 1 << (i % 8); return b })
				if got, ok := RecoverIPv4ID(ip, testSrcPort, UDPPort, c); ok {
					t.Fatalf("%d bytes, ID %#04x, bit %d flipped: recovered %#04x", n, id, i, got)
				}
			}
		}
	}
	b := encode(t, samplePacket(OpAcknowledge, 0))
	if _, ok := RecoverIPv4ID(testIPv6, testSrcPort, UDPPort, b); ok {
		t.Error("IPv6: got ok")
	}
	if _, ok := RecoverIPv4ID(testIPv4, testSrcPort, UDPPort, b[:15]); ok {
		t.Error("15 bytes: got ok")
	}
}

func TestPolyMul(t *testing.T) {
	// x^(8k) shifts a raw CRC register over k zero bytes.
	for _, k := range []int{0, 1, 2, 7, 100, 4137} {
		for _, r := range []uint32{1, 0x80000000, 0xdeadbeef, 0xffffffff} {
			want := r
			for i := 0; i < k; i++ {
				want = crc32.IEEETable[byte(want)] ^ want>>8
			}
			if got := polyMul(r, xPow(8*k)); got != want {
				t.Fatalf("r %#08x over %d zero bytes: got %#08x, want %#08x", r, k, got, want)
			}
		}
	}
}
