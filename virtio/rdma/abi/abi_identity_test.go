package abi

import (
	"fmt"
	"net"
	"testing"
)

// TestGUIDOfMAC: the node GUID that pairs with a NIC's MAC is its EUI-64
// without the universal/local flip, and only locally administered unicast
// MACs give one; MACOfGUID goes back.
func TestGUIDOfMAC(t *testing.T) {
	tests := []struct {
		mac, guid string
		ok        bool
	}{
		{"52:54:00:00:00:01", "525400fffe000001", true},
		{"52:54:00:12:34:56", "525400fffe123456", true},
		{"02:AB:cd:ef:01:02", "02abcdfffeef0102", true},
		{"00:16:3e:00:00:01", "", false}, // universally administered
		{"53:54:00:00:00:01", "", false}, // multicast
		{"52:54:00:ff:fe:00:00:01", "", false},
	}
	for _, tt := range tests {
		hw, err := net.ParseMAC(tt.mac)
		if err != nil {
			t.Fatal(err)
		}
		g, err := GUIDOfMAC(hw)
		got := ""
		if err == nil {
			got = fmt.Sprintf("%016x", g)
		}
		if (err == nil) != tt.ok || got != tt.guid {
			t.Errorf("GUIDOfMAC(%q) = %q, %v; want %q, ok=%v", tt.mac, got, err, tt.guid, tt.ok)
		}
		if tt.ok {
			if back := MACOfGUID(g); back.String() != hw.String() {
				t.Errorf("MACOfGUID(%s) = %q, want %s", FormatGUID(g), back, hw)
			}
		}
	}
	if m := MACOfGUID(0x0211223344556677); m != nil {
		t.Errorf("MACOfGUID of a GUID without ff:fe = %s, want none", m)
	}
	if _, err := GUIDOfMAC(net.HardwareAddr{1, 2, 3}); err == nil {
		t.Error("a 3-byte address gave a GUID")
	}
}

// TestGUIDOfUUID: the derived GUID is locally administered unicast whatever
// the UUID's first byte, and the port GID is fe80::/64 with it.
func TestGUIDOfUUID(t *testing.T) {
	for _, first := range []byte{0x00, 0x01, 0x02, 0x03, 0xff} {
		g := GUIDOfUUID([16]byte{first, 1, 2, 3, 4, 5, 6, 7, 8})
		if err := CheckGUID(g); err != nil {
			t.Errorf("first byte %#x: %v", first, err)
		}
		gid := LinkLocalGID(g)
		if gid[0] != 0xfe || gid[1] != 0x80 || gid[8]&^0x03 != first&^0x03 || gid[15] != 7 {
			t.Errorf("first byte %#x: GID %x", first, gid)
		}
	}
	for _, s := range []string{"0211:2233:4455:6677", "0211223344556677"} {
		if g, err := ParseGUID(s); err != nil || g != 0x0211223344556677 {
			t.Errorf("ParseGUID(%q) = %#x, %v", s, g, err)
		}
	}
	for _, s := range []string{"0111:2233:4455:6677", "0211:2233:4455:667", "02112233445566zz", "0211-2233-4455-6677"} {
		if _, err := ParseGUID(s); err == nil {
			t.Errorf("ParseGUID(%q) succeeded", s)
		}
	}
}
