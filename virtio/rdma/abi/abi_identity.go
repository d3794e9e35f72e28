package abi

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
)

// Identity: a device's node GUID, the port GID derived from it, and the
// pairing of a GUID with the MAC address of the NIC that carries its RoCE
// traffic (docs/spec.md, § Config space). This is the one place these are
// computed; the guest kernel driver applies the same MAC rule in C.

// Bits of a GUID's first byte.
const (
	guidLocal     = 0x02 // locally administered
	guidMulticast = 0x01 // group
)

// CheckGUID reports whether g is a locally administered unicast EUI-64, as
// device GUIDs are (first byte: bit 0x02 set, bit 0x01 clear).
func CheckGUID(g uint64) error {
	if byte(g>>56)&(guidLocal|guidMulticast) != guidLocal {
		return fmt.Errorf("%s is not a locally administered unicast EUI-64 (first byte: bit 0x02 set, bit 0x01 clear)", FormatGUID(g))
	}
	return nil
}

// GUIDOfUUID derives a node GUID from a device UUID, as vrdmad does for a
// device created without one: the UUID's first eight bytes with the
// locally administered bit set and the group bit clear.
func GUIDOfUUID(u [16]byte) uint64 {
	g := binary.BigEndian.Uint64(u[:8])
	g |= guidLocal << 56
	g &^= guidMulticast << 56
	return g
}

// GUIDOfMAC is the node GUID of a device paired with the NIC of MAC
// address mac: its EUI-64, mac[0:3] ff fe mac[3:6], without flipping the
// universal/local bit. The MAC must be locally administered and unicast,
// as device GUIDs are. The guest driver binds the device's RoCE port to
// the netdev with that MAC.
func GUIDOfMAC(mac net.HardwareAddr) (uint64, error) {
	if len(mac) != 6 {
		return 0, fmt.Errorf("%q is not an EUI-48 MAC address", mac.String())
	}
	g := uint64(mac[0])<<56 | uint64(mac[1])<<48 | uint64(mac[2])<<40 | 0xfffe<<24 |
		uint64(mac[3])<<16 | uint64(mac[4])<<8 | uint64(mac[5])
	if err := CheckGUID(g); err != nil {
		return 0, fmt.Errorf("%s: %v", mac, err)
	}
	return g, nil
}

// MACOfGUID is the MAC address a node GUID pairs with, or nil when the GUID
// is not an EUI-48 in an EUI-64 (bytes 3 and 4 are not ff fe).
func MACOfGUID(g uint64) net.HardwareAddr {
	if g>>24&0xffff != 0xfffe {
		return nil
	}
	return net.HardwareAddr{byte(g >> 56), byte(g >> 48), byte(g >> 40), byte(g >> 16), byte(g >> 8), byte(g)}
}

// LinkLocalGID is a port's GID 0: fe80::/64 with the node GUID as its
// interface identifier, as IB and RoCE form the default GID.
func LinkLocalGID(guid uint64) [16]byte {
	var g [16]byte
	g[0], g[1] = 0xfe, 0x80
	binary.BigEndian.PutUint64(g[8:], guid)
	return g
}

// FormatGUID writes a GUID as ibstat does: "0211:2233:4455:6677".
func FormatGUID(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff)
}

// ParseGUID parses a GUID written as four colon-separated groups of four
// hex digits ("0211:2233:4455:6677") or as 16 hex digits, and checks it
// with CheckGUID.
func ParseGUID(s string) (uint64, error) {
	bad := fmt.Errorf("%q: want xxxx:xxxx:xxxx:xxxx or 16 hex digits", s)
	h := s
	if len(s) == 19 {
		if s[4] != ':' || s[9] != ':' || s[14] != ':' {
			return 0, bad
		}
		h = strings.ReplaceAll(s, ":", "")
	}
	if len(h) != 16 {
		return 0, bad
	}
	b, err := hex.DecodeString(h)
	if err != nil {
		return 0, bad
	}
	g := binary.BigEndian.Uint64(b)
	if err := CheckGUID(g); err != nil {
		return 0, err
	}
	return g, nil
}
