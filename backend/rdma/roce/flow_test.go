package roce

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// TestFlowReference: a Flow's ICRC is the reference ICRC of the frame,
// for both families, v4-mapped addresses, IDs, and every length from a
// bare BTH to beyond 255 and 4095 bytes of UDP payload (the length
// tables' high bytes); Check accepts what Seal sealed and nothing else.
func TestFlowReference(t *testing.T) {
	mapped := IPHeader{
		Src: netip.AddrFrom16(testIPv4.Src.As16()), Dst: netip.AddrFrom16(testIPv4.Dst.As16()),
		ID: 0x1234, FlagsFragment: IPv4DF,
	}
	for _, ip := range []IPHeader{testIPv4, testIPv6, mapped} {
		f := NewFlow(ip, testSrcPort, UDPPort)
		for _, n := range []int{0, 1, 4, 200, 232, 256, 1024, 1027, 4000, 4096} {
			b := encode(t, samplePacket(OpSendOnly, n))
			if err := f.Seal(b); err != nil {
				t.Fatal(err)
			}
			want := refICRC(frame(ip, testSrcPort, b))
			if got := binary.LittleEndian.Uint32(b[len(b)-ICRCLen:]); got != want {
				t.Fatalf("%v, %d bytes: got %#08x, want %#08x", ip.Dst, n, got, want)
			}
			if got := ICRC(ip, testSrcPort, UDPPort, b[:len(b)-ICRCLen]); got != want {
				t.Fatalf("%v, %d bytes: ICRC %#08x, want %#08x", ip.Dst, n, got, want)
			}
			if !f.Check(b) {
				t.Fatalf("%v, %d bytes: Check refused what Seal sealed", ip.Dst, n)
			}
			b[len(b)-1] ^= 1
			if f.Check(b) {
				t.Fatalf("%v, %d bytes: Check accepted a wrong ICRC", ip.Dst, n)
			}
		}
	}
	var zero Flow
	b := encode(t, samplePacket(OpAcknowledge, 0))
	if zero.Seal(b) == nil || zero.Check(b) {
		t.Error("the zero Flow sealed or checked a packet")
	}
	f := NewFlow(testIPv4, testSrcPort, UDPPort)
	if f.Seal(b[:BTHLen+ICRCLen-1]) == nil || f.Check(b[:BTHLen+ICRCLen-1]) {
		t.Error("a packet shorter than a BTH and an ICRC was sealed or checked")
	}
}

// TestFlowRecoverIPv4ID: a Flow recovers the ID of a packet whatever ID
// it was made with.
func TestFlowRecoverIPv4ID(t *testing.T) {
	b := encode(t, samplePacket(OpWriteMiddle, 1024))
	for _, id := range []uint16{0, 1, 0x718c, 0xffff} {
		ip := testIPv4
		ip.ID = id
		if err := Seal(ip, testSrcPort, UDPPort, b); err != nil {
			t.Fatal(err)
		}
		for _, flowID := range []uint16{0, 7, id} {
			ip.ID = flowID
			f := NewFlow(ip, testSrcPort, UDPPort)
			if got, ok := f.RecoverIPv4ID(b); !ok || got != id {
				t.Fatalf("ID %#04x, flow ID %#04x: got %#04x, %t", id, flowID, got, ok)
			}
		}
	}
	f := NewFlow(testIPv6, testSrcPort, UDPPort)
	if _, ok := f.RecoverIPv4ID(b); ok {
		t.Error("IPv6 flow: got ok")
	}
}

// TestFlowDoesNotAllocate: sealing and checking with a Flow allocate
// nothing.
func TestFlowDoesNotAllocate(t *testing.T) {
	f := NewFlow(testIPv6, testSrcPort, UDPPort)
	b := encode(t, samplePacket(OpWriteMiddle, 1024))
	if n := testing.AllocsPerRun(100, func() {
		_ = f.Seal(b)
		_ = f.Check(b)
	}); n != 0 {
		t.Errorf("%v allocations, want 0", n)
	}
}
