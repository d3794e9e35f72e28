package roce

import (
	"encoding/binary"
	"hash/crc32"
	"math/bits"
	"net/netip"
)

// IPHeader holds the IP header fields the ICRC covers that the UDP payload
// does not determine. The masked fields (TOS/traffic class, TTL/hop limit,
// flow label, header checksum) need no value, and the lengths follow from
// the UDP payload length, for a header without IPv4 options or IPv6
// extension headers (the only kind rxe sends or verifies: it covers exactly
// sizeof(struct iphdr) or sizeof(struct ipv6hdr) bytes).
type IPHeader struct {
	// Src and Dst are the packet's addresses. IPv4 addresses, also in
	// their v4-mapped IPv6 form (as a dual-stack socket reports them),
	// make an IPv4 header; other IPv6 addresses an IPv6 header. Both must
	// be of the same family (see Valid).
	Src, Dst netip.Addr
	// ID is the IPv4 Identification field, which the ICRC covers and a
	// UDP socket does not report; ignored for IPv6. vrdma sends 0 (see
	// the package documentation and RecoverIPv4ID).
	ID uint16
	// FlagsFragment is the IPv4 flags and fragment offset field as on the
	// wire (IPv4DF for every packet vrdma or rxe sends); ignored for IPv6.
	FlagsFragment uint16
}

// IPv4DF is the don't-fragment flag of IPHeader.FlagsFragment.
const IPv4DF = 0x4000

// Is4 reports whether h describes an IPv4 header.
func (h IPHeader) Is4() bool { return h.Dst.Unmap().Is4() }

// Valid reports whether both addresses are set and of the same family.
func (h IPHeader) Valid() bool {
	return h.Src.IsValid() && h.Dst.IsValid() && h.Src.Unmap().Is4() == h.Dst.Unmap().Is4()
}

const (
	ipv4HeaderLen = 20
	ipv6HeaderLen = 40
	udpHeaderLen  = 8
	ipProtoUDP    = 17
	ipv4IDOffset  = 4 // of the Identification field in the IPv4 header
)

// icrcSeed is the CRC-32 of the 8 bytes of 0xff that stand for the masked
// LRH. Its one's complement, 0xdebb20e3, is the raw register value
// rxe_icrc.c starts from (the register after an all-ones initial value and
// those 8 bytes).
const icrcSeed = 0x2144df1c

// ICRC returns the invariant CRC of a RoCEv2 packet as Linux rxe computes it
// (drivers/infiniband/sw/rxe/rxe_icrc.c): the IEEE CRC-32 (reflected
// polynomial 0xedb88320, initial value all-ones, final inversion, the CRC of
// hash/crc32.ChecksumIEEE) over
//
//  1. 8 bytes of 0xff, the masked LRH of the RoCEv2 annex;
//  2. the IP header with the variant fields set to all-ones: for IPv4 the
//     TOS, TTL and header checksum; for IPv6 the traffic class, flow label
//     and hop limit;
//  3. the UDP header with the checksum set to all-ones;
//  4. the BTH with byte 4 (FECN, BECN and resv6a) set to all-ones;
//  5. the rest of the packet up to the ICRC: extension headers, payload,
//     pad.
//
// udpPayload is the UDP payload without the 4-byte ICRC. The IPv4 total
// length, IPv6 payload length and UDP length are computed from its length.
// The ICRC goes on the wire little-endian (least significant byte first),
// as rxe stores the CRC (see Seal). The result is meaningless when ip is not
// Valid or udpPayload is shorter than a BTH. ICRC does not allocate.
func ICRC(ip IPHeader, srcPort, dstPort uint16, udpPayload []byte) uint32 {
	f := NewFlow(ip, srcPort, dstPort)
	return f.ICRC(udpPayload)
}

// slicing8 holds the tables of a slicing-by-8 CRC-32: slicing8[0] is
// crc32.IEEETable, slicing8[k][i] the register after byte i and k zero
// bytes. Immutable; initialised before anything that uses it (a variable's
// initialiser, not an init function: the length tables of flow.go are
// computed with it).
var slicing8 = newSlicing8()

func newSlicing8() *[8][256]uint32 {
	var t [8][256]uint32
	t[0] = *crc32.IEEETable
	for k := 1; k < len(t); k++ {
		for i := range t[k] {
			r := t[k-1][i]
			t[k][i] = t[0][byte(r)] ^ r>>8
		}
	}
	return &t
}

// updateSlicing8 returns the raw CRC-32 register (no inversions) after p,
// starting from raw, eight bytes a step.
func updateSlicing8(raw uint32, p []byte) uint32 {
	t := slicing8
	for len(p) >= 8 {
		raw ^= binary.LittleEndian.Uint32(p)
		raw = t[7][byte(raw)] ^ t[6][byte(raw>>8)] ^ t[5][byte(raw>>16)] ^ t[4][raw>>24] ^
			t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]]
		p = p[8:]
	}
	for _, c := range p {
		raw = t[0][byte(raw)^c] ^ raw>>8
	}
	return raw
}

// Seal computes the ICRC of udpPayload, a whole packet as Packet.Append
// produces it, and stores it in its last 4 bytes, little-endian. It returns
// ErrInvalid if ip is not Valid or udpPayload is shorter than a BTH and an
// ICRC.
func Seal(ip IPHeader, srcPort, dstPort uint16, udpPayload []byte) error {
	if !ip.Valid() || len(udpPayload) < BTHLen+ICRCLen {
		return packetError(ErrInvalid, 0, "seal: %d bytes, valid IP header %t", len(udpPayload), ip.Valid())
	}
	end := len(udpPayload) - ICRCLen
	binary.LittleEndian.PutUint32(udpPayload[end:], ICRC(ip, srcPort, dstPort, udpPayload[:end]))
	return nil
}

// Verify checks the ICRC of a received packet, the whole UDP payload. It
// returns a *ICRCError (ErrICRC) on a mismatch, ErrTruncated if udpPayload
// is shorter than a BTH and an ICRC, ErrInvalid if ip is not Valid. For
// IPv4 the result depends on ip.ID; see RecoverIPv4ID.
func Verify(ip IPHeader, srcPort, dstPort uint16, udpPayload []byte) error {
	if !ip.Valid() {
		return packetError(ErrInvalid, 0, "verify: invalid IP header")
	}
	if len(udpPayload) < BTHLen+ICRCLen {
		return packetError(ErrTruncated, 0, "%d bytes, want at least %d", len(udpPayload), BTHLen+ICRCLen)
	}
	end := len(udpPayload) - ICRCLen
	got := binary.LittleEndian.Uint32(udpPayload[end:])
	if want := ICRC(ip, srcPort, dstPort, udpPayload[:end]); got != want {
		return &ICRCError{Got: got, Want: want}
	}
	return nil
}

// RecoverIPv4ID returns the IPv4 Identification with which the packet's
// ICRC is correct, if there is one (ok), ignoring ip.ID. A UDP socket does
// not report the ID of a received datagram, and Linux rxe sends IDs the
// receiver cannot predict (see the package documentation). The CRC is
// affine in the 16 ID bits, so the ID follows from the ICRC by solving 32
// linear equations over GF(2): one CRC pass over the packet, no search.
//
// Accepting a packet this way leaves 16 of the ICRC's 32 bits to detect
// corruption (a random error passes with probability 2^-16, as with the UDP
// checksum), so a receiver should first Verify with the ID it expects.
// It returns false for IPv6 or an invalid header, or a packet shorter than
// a BTH and an ICRC.
func RecoverIPv4ID(ip IPHeader, srcPort, dstPort uint16, udpPayload []byte) (id uint16, ok bool) {
	if !ip.Valid() || !ip.Is4() || len(udpPayload) < BTHLen+ICRCLen {
		return 0, false
	}
	ip.ID = 0
	f := NewFlow(ip, srcPort, dstPort)
	return f.RecoverIPv4ID(udpPayload)
}

// solveIPv4ID returns the ID whose bits, in the ID field of a packet whose
// ICRC covers end bytes of UDP payload, change the ICRC by delta, if one
// does.
func solveIPv4ID(delta uint32, end int) (uint16, bool) {
	// For messages of equal length CRC(a) ^ CRC(b) is the raw CRC (zero
	// initial value, no inversion) of a ^ b: here the two ID bytes followed
	// by every byte after them, all zero, i.e. rawCRC(ID bytes) times x^(8k)
	// modulo the polynomial, k the number of bytes after the ID field.
	k := ipv4HeaderLen - ipv4IDOffset - 2 + udpHeaderLen + end
	shift := xPow(8 * k)
	// Reduce the images of the 16 ID bits to row echelon form, keeping
	// which ID bits make up each row; then reduce delta with them.
	var rows [32]uint32 // rows[j] has leading (highest) bit j, or is 0
	var comb [32]uint16 // the ID bits whose images XOR to rows[j]
	for i := range idBasis {
		v, m := polyMul(idBasis[i], shift), uint16(1)<<i
		for v != 0 {
			j := bits.Len32(v) - 1
			if rows[j] == 0 {
				rows[j], comb[j] = v, m
				break
			}
			v, m = v^rows[j], m^comb[j]
		}
	}
	v, m := delta, uint16(0)
	for v != 0 {
		j := bits.Len32(v) - 1
		if rows[j] == 0 {
			return 0, false
		}
		v, m = v^rows[j], m^comb[j]
	}
	return m, true
}

// idBasis[i] is the raw CRC-32 register (zero initial value, no final
// inversion) after the two big-endian bytes of the ID 1<<i. Immutable after
// init.
var idBasis [16]uint32

func init() {
	for i := range idBasis {
		v := uint16(1) << i
		var c uint32
		for _, b := range [2]byte{byte(v >> 8), byte(v)} {
			c = crc32.IEEETable[byte(c)^b] ^ c>>8
		}
		idBasis[i] = c
	}
}

// polyMul returns a·b modulo the CRC-32 polynomial, both in the reflected
// representation crc32.IEEE uses: bit 31 holds the coefficient of x^0, bit
// 0 that of x^31.
func polyMul(a, b uint32) uint32 {
	var p uint32
	for i := 31; i >= 0; i-- { // bit i of a is the coefficient of x^(31-i)
		if a&(1<<i) != 0 {
			p ^= b
		}
		// b *= x: one step toward bit 0; x^32 reduces to the polynomial.
		if b&1 != 0 {
			b = b>>1 ^ crc32.IEEE
		} else {
			b >>= 1
		}
	}
	return p
}

// xPow returns x^n modulo the CRC-32 polynomial (reflected), n >= 0.
func xPow(n int) uint32 {
	r, sq := uint32(1)<<31, uint32(1)<<30 // x^0, x^1
	for ; n > 0; n >>= 1 {
		if n&1 != 0 {
			r = polyMul(r, sq)
		}
		sq = polyMul(sq, sq)
	}
	return r
}
