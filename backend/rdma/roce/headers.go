package roce

import (
	"encoding/binary"
	"fmt"
)

// Limits of the 24-bit fields.
const (
	QPNMask = 1<<24 - 1 // largest queue pair number
	MSNMask = 1<<24 - 1 // largest message sequence number
)

// BTH is the base transport header (12 bytes):
//
//	byte 0     OpCode
//	byte 1     SE(1) M(1) PadCnt(2) TVer(4)
//	bytes 2-3  P_Key
//	byte 4     FECN(1) BECN(1) resv6a(6)  (the "resv8a" byte the ICRC masks)
//	bytes 5-7  DestQP
//	byte 8     AckReq(1) resv7(7)
//	bytes 9-11 PSN
//
// All multi-byte fields are big-endian.
type BTH struct {
	Opcode Opcode
	SE     bool // solicited event
	M      bool // MigReq
	// PadCount is the number of pad bytes (0-3) after the payload. Parse
	// reports it; Packet.Append computes it from the payload length and
	// ignores this field.
	PadCount uint8
	TVer     uint8 // transport header version; 0 is the only one
	PKey     uint16
	FECN     bool
	BECN     bool
	DestQP   uint32 // 24 bits
	AckReq   bool
	PSN      PSN

	// Reserved bits as received, so that a parsed packet re-encodes to the
	// same bytes; zero in a BTH the caller builds.
	resv6a uint8 // 6 bits
	resv7  uint8 // 7 bits
}

// RETH is the RDMA extended transport header (16 bytes).
type RETH struct {
	VA     uint64
	RKey   uint32
	DMALen uint32
}

// AtomicETH is the atomic extended transport header (28 bytes).
type AtomicETH struct {
	VA      uint64
	RKey    uint32
	SwapAdd uint64 // swap value (COMPARE_SWAP) or addend (FETCH_ADD)
	Compare uint64 // compare value (COMPARE_SWAP only)
}

// DETH is the datagram extended transport header of UD packets (8 bytes):
//
//	bytes 0-3  Q_Key
//	byte 4     reserved
//	bytes 5-7  SrcQP
type DETH struct {
	QKey  uint32
	SrcQP uint32 // 24 bits

	resv uint8 // as received (see BTH's reserved bits)
}

// Precondition: h.SrcQP fits in 24 bits.
func (h *DETH) append(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, h.QKey)
	return append(dst, h.resv, uint8(h.SrcQP>>16), uint8(h.SrcQP>>8), uint8(h.SrcQP))
}

func decodeDETH(b []byte) DETH {
	return DETH{QKey: binary.BigEndian.Uint32(b), resv: b[4], SrcQP: uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7])}
}

// AETH is the ACK extended transport header (4 bytes): an 8-bit
// syndrome and a 24-bit message sequence number.
type AETH struct {
	Syndrome Syndrome
	MSN      uint32 // 24 bits
}

// AtomicAckETH is the atomic ACK extended transport header (8 bytes): the value at the target address before the atomic operation.
type AtomicAckETH struct {
	OrigData uint64
}

// Syndrome is the AETH syndrome byte: bit 7 reserved (0), bits 6-5 the type
// (ACK, RNR NAK, reserved, NAK), bits 4-0 the value (credit count, RNR
// timer code or NAK code).
type Syndrome uint8

// AckType is bits 6-5 of a Syndrome.
type AckType uint8

// AETH types.
const (
	AckTypeACK      AckType = 0 // 0b00: ACK, value is the credit count
	AckTypeRNRNAK   AckType = 1 // 0b01: receiver not ready NAK, value is the RNR timer
	AckTypeReserved AckType = 2 // 0b10: reserved, refused by Parse
	AckTypeNAK      AckType = 3 // 0b11: NAK, value is a NAKCode
)

// NAKCode is the value of a NAK syndrome.
type NAKCode uint8

// NAK codes; 5 to 31 are reserved and refused by Parse.
const (
	NAKPSNSequenceError       NAKCode = 0
	NAKInvalidRequest         NAKCode = 1
	NAKRemoteAccessError      NAKCode = 2
	NAKRemoteOperationalError NAKCode = 3
	NAKInvalidRDRequest       NAKCode = 4
	maxNAKCode                        = NAKInvalidRDRequest
)

// CreditsInvalid is the ACK credit count value that means "no credit count"
// (an end-to-end flow-control-free responder, as rxe always sends).
const CreditsInvalid = 0x1f

// ACKSyndrome returns the syndrome of an ACK with the 5-bit credit count
// code credits (bits above 5 are dropped).
func ACKSyndrome(credits uint8) Syndrome { return Syndrome(credits & 0x1f) }

// RNRNAKSyndrome returns the syndrome of an RNR NAK with the 5-bit RNR timer
// code timer (bits above 5 are dropped).
func RNRNAKSyndrome(timer uint8) Syndrome { return Syndrome(0x20 | timer&0x1f) }

// NAKSyndrome returns the syndrome of a NAK with code c (bits above 5 are
// dropped).
func NAKSyndrome(c NAKCode) Syndrome { return Syndrome(0x60 | uint8(c)&0x1f) }

// Type returns the syndrome's type, bits 6-5.
func (s Syndrome) Type() AckType { return AckType(s >> 5 & 3) }

// Value returns bits 4-0: the credit count, RNR timer or NAK code.
func (s Syndrome) Value() uint8 { return uint8(s) & 0x1f }

// Valid reports whether s is no reserved encoding: bit 7 clear, the type not
// reserved, and for a NAK a defined code.
func (s Syndrome) Valid() bool {
	switch {
	case s&0x80 != 0, s.Type() == AckTypeReserved:
		return false
	case s.Type() == AckTypeNAK:
		return NAKCode(s.Value()) <= maxNAKCode
	}
	return true
}

var nakNames = [...]string{
	NAKPSNSequenceError:       "PSN sequence error",
	NAKInvalidRequest:         "invalid request",
	NAKRemoteAccessError:      "remote access error",
	NAKRemoteOperationalError: "remote operational error",
	NAKInvalidRDRequest:       "invalid RD request",
}

func (c NAKCode) String() string {
	if c <= maxNAKCode {
		return nakNames[c]
	}
	return fmt.Sprintf("NAKCode(%d)", uint8(c))
}

func (s Syndrome) String() string {
	if !s.Valid() {
		return fmt.Sprintf("Syndrome(%#02x)", uint8(s))
	}
	switch s.Type() {
	case AckTypeACK:
		return fmt.Sprintf("ACK(credits %d)", s.Value())
	case AckTypeRNRNAK:
		return fmt.Sprintf("RNR NAK(timer %d)", s.Value())
	default:
		return "NAK(" + NAKCode(s.Value()).String() + ")"
	}
}

// Bits of BTH bytes 1, 4 and 8.
const (
	bthSE        = 0x80
	bthM         = 0x40
	bthPadShift  = 4
	bthPadMask   = 0x30
	bthTVerMask  = 0x0f
	bthFECN      = 0x80
	bthBECN      = 0x40
	bthResv6Mask = 0x3f
	bthAckReq    = 0x80
	bthResv7Mask = 0x7f
)

func flag(b bool, bit uint8) uint8 {
	if b {
		return bit
	}
	return 0
}

// append appends the 12 bytes of h with pad count pad.
// Precondition: h.DestQP and h.PSN fit in 24 bits, h.TVer in 4, pad < 4.
func (h *BTH) append(dst []byte, pad uint8) []byte {
	return append(dst,
		uint8(h.Opcode),
		flag(h.SE, bthSE)|flag(h.M, bthM)|pad<<bthPadShift|h.TVer&bthTVerMask,
		uint8(h.PKey>>8), uint8(h.PKey),
		flag(h.FECN, bthFECN)|flag(h.BECN, bthBECN)|h.resv6a&bthResv6Mask,
		uint8(h.DestQP>>16), uint8(h.DestQP>>8), uint8(h.DestQP),
		flag(h.AckReq, bthAckReq)|h.resv7&bthResv7Mask,
		uint8(h.PSN>>16), uint8(h.PSN>>8), uint8(h.PSN))
}

// decodeBTH decodes b[:BTHLen]. Precondition: len(b) >= BTHLen.
func decodeBTH(b []byte) BTH {
	return BTH{
		Opcode:   Opcode(b[0]),
		SE:       b[1]&bthSE != 0,
		M:        b[1]&bthM != 0,
		PadCount: b[1] & bthPadMask >> bthPadShift,
		TVer:     b[1] & bthTVerMask,
		PKey:     binary.BigEndian.Uint16(b[2:]),
		FECN:     b[4]&bthFECN != 0,
		BECN:     b[4]&bthBECN != 0,
		resv6a:   b[4] & bthResv6Mask,
		DestQP:   uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7]),
		AckReq:   b[8]&bthAckReq != 0,
		resv7:    b[8] & bthResv7Mask,
		PSN:      PSN(b[9])<<16 | PSN(b[10])<<8 | PSN(b[11]),
	}
}

func (h *RETH) append(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, h.VA)
	dst = binary.BigEndian.AppendUint32(dst, h.RKey)
	return binary.BigEndian.AppendUint32(dst, h.DMALen)
}

func decodeRETH(b []byte) RETH {
	return RETH{
		VA:     binary.BigEndian.Uint64(b),
		RKey:   binary.BigEndian.Uint32(b[8:]),
		DMALen: binary.BigEndian.Uint32(b[12:]),
	}
}

func (h *AtomicETH) append(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint64(dst, h.VA)
	dst = binary.BigEndian.AppendUint32(dst, h.RKey)
	dst = binary.BigEndian.AppendUint64(dst, h.SwapAdd)
	return binary.BigEndian.AppendUint64(dst, h.Compare)
}

func decodeAtomicETH(b []byte) AtomicETH {
	return AtomicETH{
		VA:      binary.BigEndian.Uint64(b),
		RKey:    binary.BigEndian.Uint32(b[8:]),
		SwapAdd: binary.BigEndian.Uint64(b[12:]),
		Compare: binary.BigEndian.Uint64(b[20:]),
	}
}

// Precondition: h.MSN fits in 24 bits.
func (h *AETH) append(dst []byte) []byte {
	return binary.BigEndian.AppendUint32(dst, uint32(h.Syndrome)<<24|h.MSN)
}

func decodeAETH(b []byte) AETH {
	v := binary.BigEndian.Uint32(b)
	return AETH{Syndrome: Syndrome(v >> 24), MSN: v & MSNMask}
}
