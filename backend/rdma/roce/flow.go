package roce

import (
	"encoding/binary"
	"hash/crc32"
)

// Flow is the ICRC's pseudo header of one direction of a connection,
// computed once: the masked LRH and the IP and UDP headers of given
// addresses, ID, flags and ports. A packet's ICRC is then the CRC of its
// BTH and what follows, started from the Flow's register, with the lengths
// the headers hold (IPv4 total length or IPv6 payload length, UDP length,
// all following from the packet's length) folded in by four table look-ups:
// the raw CRC register is linear in the message bytes, so the register
// after headers whose length fields hold L is the register after the same
// headers with those fields 0, XOR the contribution of L's bytes at their
// places (lenTables). Flow.ICRC(b) equals ICRC(ip, srcPort, dstPort, b) for
// every b (ICRC is implemented with it); a sender or receiver that keeps a
// Flow per peer saves the 28 (IPv4) or 48 (IPv6) header bytes per packet.
//
// Its zero value is not valid: ICRC returns meaningless values and Seal
// fails, as for an invalid IPHeader. A Flow is a value, immutable; it does
// not allocate.
type Flow struct {
	raw   uint32     // the raw register after the LRH and the headers with their length fields 0
	lens  *lenTables // the family's
	id    uint16     // the IPv4 ID the headers hold (RecoverIPv4ID)
	valid bool       // the IPHeader was Valid
}

// lenTables are the contributions of the length fields' bytes to the raw
// CRC register after the IP and UDP headers of one family: byte b of
// field byte k (the IP length field's high and low byte, then the UDP
// length field's) is tab[k][b]. Immutable after init.
type lenTables struct {
	tab [4][256]uint32
	// ipAdd is what the IP length field holds beyond the UDP length:
	// the IPv4 header's 20 bytes (total length), 0 for IPv6 (payload
	// length).
	ipAdd int
}

var (
	lens4 = newLenTables(ipv4HeaderLen, [4]int{2, 3, ipv4HeaderLen + 4, ipv4HeaderLen + 5}, ipv4HeaderLen)
	lens6 = newLenTables(ipv6HeaderLen, [4]int{4, 5, ipv6HeaderLen + 4, ipv6HeaderLen + 5}, 0)
)

// newLenTables computes the tables of an IP header of ipLen bytes, then a
// UDP header, whose length fields' bytes are at pos.
func newLenTables(ipLen int, pos [4]int, ipAdd int) *lenTables {
	t := &lenTables{ipAdd: ipAdd}
	var m [ipv6HeaderLen + udpHeaderLen]byte
	for k, p := range pos {
		for b := range 256 {
			m[p] = byte(b)
			t.tab[k][b] = updateSlicing8(0, m[:ipLen+udpHeaderLen])
		}
		m[p] = 0
	}
	return t
}

// NewFlow returns the Flow of packets from srcPort to dstPort with the IP
// header ip. It is valid only if ip is (IPHeader.Valid).
func NewFlow(ip IPHeader, srcPort, dstPort uint16) Flow {
	f := Flow{valid: ip.Valid(), id: ip.ID}
	var hdr [ipv6HeaderLen + udpHeaderLen]byte
	var n int
	if ip.Is4() {
		f.lens = lens4
		h := hdr[:ipv4HeaderLen]
		h[0] = 0x45 // version 4, IHL 5
		h[1] = 0xff // TOS
		// h[2:4], the total length: lenTables
		binary.BigEndian.PutUint16(h[ipv4IDOffset:], ip.ID)
		binary.BigEndian.PutUint16(h[6:], ip.FlagsFragment)
		h[8] = 0xff // TTL
		h[9] = ipProtoUDP
		h[10], h[11] = 0xff, 0xff // header checksum
		src, dst := ip.Src.Unmap(), ip.Dst.Unmap()
		if src.Is4() {
			a := src.As4()
			copy(h[12:], a[:])
		}
		a := dst.As4()
		copy(h[16:], a[:])
		n = ipv4HeaderLen
	} else {
		f.lens = lens6
		h := hdr[:ipv6HeaderLen]
		// Version 6, then traffic class and flow label all-ones.
		h[0], h[1], h[2], h[3] = 0x6f, 0xff, 0xff, 0xff
		// h[4:6], the payload length: lenTables
		h[6] = ipProtoUDP // next header
		h[7] = 0xff       // hop limit
		if ip.Src.IsValid() {
			a := ip.Src.As16()
			copy(h[8:], a[:])
		}
		if ip.Dst.IsValid() {
			a := ip.Dst.As16()
			copy(h[24:], a[:])
		}
		n = ipv6HeaderLen
	}
	u := hdr[n : n+udpHeaderLen]
	binary.BigEndian.PutUint16(u[0:], srcPort)
	binary.BigEndian.PutUint16(u[2:], dstPort)
	// u[4:6], the UDP length: lenTables
	u[6], u[7] = 0xff, 0xff // checksum
	f.raw = updateSlicing8(^uint32(icrcSeed), hdr[:n+udpHeaderLen])
	return f
}

// ICRC returns the ICRC of a packet of this flow (see the function ICRC):
// udpPayload is the UDP payload without the 4-byte ICRC. It does not
// allocate.
func (f *Flow) ICRC(udpPayload []byte) uint32 {
	t := f.lens
	if t == nil {
		return 0 // the zero Flow
	}
	udpLen := udpHeaderLen + len(udpPayload) + ICRCLen
	ipLen := udpLen + t.ipAdd
	raw := f.raw ^ t.tab[0][byte(ipLen>>8)] ^ t.tab[1][byte(ipLen)] ^ t.tab[2][byte(udpLen>>8)] ^ t.tab[3][byte(udpLen)]
	rest := udpPayload
	if len(udpPayload) >= BTHLen {
		var bth [BTHLen]byte
		copy(bth[:], udpPayload[:BTHLen])
		bth[4] = 0xff // FECN, BECN, resv6a
		raw = updateSlicing8(raw, bth[:])
		rest = udpPayload[BTHLen:]
	}
	return crc32.Update(^raw, crc32.IEEETable, rest)
}

// Seal is the function Seal for a packet of this flow: it stores the ICRC
// of udpPayload, a whole packet, in its last 4 bytes. It returns
// ErrInvalid if the flow's IPHeader was not Valid or udpPayload is
// shorter than a BTH and an ICRC.
func (f *Flow) Seal(udpPayload []byte) error {
	if !f.valid || len(udpPayload) < BTHLen+ICRCLen {
		return packetError(ErrInvalid, 0, "seal: %d bytes, valid IP header %t", len(udpPayload), f.valid)
	}
	end := len(udpPayload) - ICRCLen
	binary.LittleEndian.PutUint32(udpPayload[end:], f.ICRC(udpPayload[:end]))
	return nil
}

// Check reports whether the ICRC of udpPayload, a whole received packet,
// is right for this flow: the check of Verify without its error value. It
// is false for an invalid flow or a packet shorter than a BTH and an ICRC.
func (f *Flow) Check(udpPayload []byte) bool {
	if !f.valid || len(udpPayload) < BTHLen+ICRCLen {
		return false
	}
	end := len(udpPayload) - ICRCLen
	return f.ICRC(udpPayload[:end]) == binary.LittleEndian.Uint32(udpPayload[end:])
}

// RecoverIPv4ID is the function RecoverIPv4ID for a packet of this flow
// (whatever ID the flow's IPHeader held): the ID with which the packet's
// ICRC is right, if any.
func (f *Flow) RecoverIPv4ID(udpPayload []byte) (id uint16, ok bool) {
	if !f.valid || f.lens != lens4 || len(udpPayload) < BTHLen+ICRCLen {
		return 0, false
	}
	end := len(udpPayload) - ICRCLen
	got := binary.LittleEndian.Uint32(udpPayload[end:])
	delta := got ^ f.ICRC(udpPayload[:end])
	if delta == 0 {
		return f.id, true
	}
	m, ok := solveIPv4ID(delta, end)
	return m ^ f.id, ok
}
