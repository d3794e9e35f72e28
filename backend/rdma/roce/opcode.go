package roce

import "fmt"

// Opcode is the 8-bit BTH opcode. The top three bits are the transport
// (0b000 for RC, 0b011 for UD); this codec implements the RC opcodes below,
// the set Linux rdma_rxe uses for RC QPs without FLUSH or ATOMIC_WRITE, and
// the two UD opcodes (docs/wire.md § UD).
type Opcode uint8

// RC opcodes (IBA Vol 1 chapter 9, the BTH OpCode field; the same values
// as IB_OPCODE_RC_* in Linux include/rdma/ib_pack.h).
const (
	OpSendFirst              Opcode = 0x00
	OpSendMiddle             Opcode = 0x01
	OpSendLast               Opcode = 0x02
	OpSendLastWithImmediate  Opcode = 0x03
	OpSendOnly               Opcode = 0x04
	OpSendOnlyWithImmediate  Opcode = 0x05
	OpWriteFirst             Opcode = 0x06
	OpWriteMiddle            Opcode = 0x07
	OpWriteLast              Opcode = 0x08
	OpWriteLastWithImmediate Opcode = 0x09
	OpWriteOnly              Opcode = 0x0a
	OpWriteOnlyWithImmediate Opcode = 0x0b
	OpReadRequest            Opcode = 0x0c
	OpReadResponseFirst      Opcode = 0x0d
	OpReadResponseMiddle     Opcode = 0x0e
	OpReadResponseLast       Opcode = 0x0f
	OpReadResponseOnly       Opcode = 0x10
	OpAcknowledge            Opcode = 0x11
	OpAtomicAcknowledge      Opcode = 0x12
	OpCompareSwap            Opcode = 0x13
	OpFetchAdd               Opcode = 0x14
	// SEND with invalidate: the last (or only) packet of a SEND carries
	// the IETH; the packets before it are plain SEND_FIRST/MIDDLE.
	OpSendLastWithInvalidate Opcode = 0x16
	OpSendOnlyWithInvalidate Opcode = 0x17
)

// UD opcodes (IB_OPCODE_UD_*): a datagram is one packet, BTH then DETH.
const (
	OpUDSendOnly              Opcode = 0x64
	OpUDSendOnlyWithImmediate Opcode = 0x65
)

// transportUD is the transport of the UD opcodes, the BTH opcode's top
// three bits.
const transportUD = 0b011

// Ext is a set of extension transport headers. On the wire they follow the
// BTH in this order: DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH
// (the order of rxe_opcode.c's offsets: RDMA_WRITE_ONLY_WITH_IMMEDIATE is
// BTH RETH ImmDt, ATOMIC_ACKNOWLEDGE is BTH AETH AtomicAckETH, UD
// SEND_ONLY_WITH_IMMEDIATE is BTH DETH ImmDt; the IETH travels alone, after
// the BTH of SEND_LAST/ONLY_WITH_INVALIDATE).
type Ext uint8

// Extension headers.
const (
	ExtRETH         Ext = 1 << iota // RDMA extended transport header, 16 bytes
	ExtAtomicETH                    // atomic extended transport header, 28 bytes
	ExtAETH                         // ACK extended transport header, 4 bytes
	ExtAtomicAckETH                 // atomic ACK extended transport header, 8 bytes
	ExtImmDt                        // immediate data, 4 bytes
	ExtDETH                         // datagram extended transport header, 8 bytes (UD)
	ExtIETH                         // invalidate extended transport header, 4 bytes (the R_Key)
)

// Header sizes in bytes.
const (
	BTHLen          = 12
	RETHLen         = 16
	AtomicETHLen    = 28
	AETHLen         = 4
	AtomicAckETHLen = 8
	ImmDtLen        = 4
	DETHLen         = 8
	IETHLen         = 4
	ICRCLen         = 4
)

// Segment is the place of a packet in its message, which decides the payload
// length rule (see Packet.CheckPMTU).
type Segment uint8

// Segments. Opcodes without payload (READ request, ACKs, atomics) are Only.
const (
	SegmentOnly Segment = iota
	SegmentFirst
	SegmentMiddle
	SegmentLast
)

var segmentNames = [...]string{"only", "first", "middle", "last"}

func (s Segment) String() string {
	if int(s) < len(segmentNames) {
		return segmentNames[s]
	}
	return fmt.Sprintf("Segment(%d)", uint8(s))
}

// opInfo describes one opcode; the table below is the codec's single source
// of truth for which headers follow the BTH and whether a payload may.
type opInfo struct {
	ok      bool // implemented
	name    string
	ext     Ext
	payload bool
	seg     Segment
	hdrLen  int // BTH plus extension headers, computed by init
}

var opTable = completeOps([256]opInfo{
	OpSendFirst:              {name: "SEND_FIRST", payload: true, seg: SegmentFirst},
	OpSendMiddle:             {name: "SEND_MIDDLE", payload: true, seg: SegmentMiddle},
	OpSendLast:               {name: "SEND_LAST", payload: true, seg: SegmentLast},
	OpSendLastWithImmediate:  {name: "SEND_LAST_WITH_IMMEDIATE", ext: ExtImmDt, payload: true, seg: SegmentLast},
	OpSendOnly:               {name: "SEND_ONLY", payload: true, seg: SegmentOnly},
	OpSendOnlyWithImmediate:  {name: "SEND_ONLY_WITH_IMMEDIATE", ext: ExtImmDt, payload: true, seg: SegmentOnly},
	OpWriteFirst:             {name: "RDMA_WRITE_FIRST", ext: ExtRETH, payload: true, seg: SegmentFirst},
	OpWriteMiddle:            {name: "RDMA_WRITE_MIDDLE", payload: true, seg: SegmentMiddle},
	OpWriteLast:              {name: "RDMA_WRITE_LAST", payload: true, seg: SegmentLast},
	OpWriteLastWithImmediate: {name: "RDMA_WRITE_LAST_WITH_IMMEDIATE", ext: ExtImmDt, payload: true, seg: SegmentLast},
	OpWriteOnly:              {name: "RDMA_WRITE_ONLY", ext: ExtRETH, payload: true, seg: SegmentOnly},
	OpWriteOnlyWithImmediate: {name: "RDMA_WRITE_ONLY_WITH_IMMEDIATE", ext: ExtRETH | ExtImmDt, payload: true, seg: SegmentOnly},
	OpReadRequest:            {name: "RDMA_READ_REQUEST", ext: ExtRETH, seg: SegmentOnly},
	OpReadResponseFirst:      {name: "RDMA_READ_RESPONSE_FIRST", ext: ExtAETH, payload: true, seg: SegmentFirst},
	OpReadResponseMiddle:     {name: "RDMA_READ_RESPONSE_MIDDLE", payload: true, seg: SegmentMiddle},
	OpReadResponseLast:       {name: "RDMA_READ_RESPONSE_LAST", ext: ExtAETH, payload: true, seg: SegmentLast},
	OpReadResponseOnly:       {name: "RDMA_READ_RESPONSE_ONLY", ext: ExtAETH, payload: true, seg: SegmentOnly},
	OpAcknowledge:            {name: "ACKNOWLEDGE", ext: ExtAETH, seg: SegmentOnly},
	OpAtomicAcknowledge:      {name: "ATOMIC_ACKNOWLEDGE", ext: ExtAETH | ExtAtomicAckETH, seg: SegmentOnly},
	OpCompareSwap:            {name: "COMPARE_SWAP", ext: ExtAtomicETH, seg: SegmentOnly},
	OpFetchAdd:               {name: "FETCH_ADD", ext: ExtAtomicETH, seg: SegmentOnly},
	OpSendLastWithInvalidate: {name: "SEND_LAST_WITH_INVALIDATE", ext: ExtIETH, payload: true, seg: SegmentLast},
	OpSendOnlyWithInvalidate: {name: "SEND_ONLY_WITH_INVALIDATE", ext: ExtIETH, payload: true, seg: SegmentOnly},

	OpUDSendOnly:              {name: "UD_SEND_ONLY", ext: ExtDETH, payload: true, seg: SegmentOnly},
	OpUDSendOnlyWithImmediate: {name: "UD_SEND_ONLY_WITH_IMMEDIATE", ext: ExtDETH | ExtImmDt, payload: true, seg: SegmentOnly},
})

// completeOps fills in what follows from each named entry of t: ok and
// hdrLen. A function of the variable's initialiser rather than an init
// func, so that package-level variables may use the table.
func completeOps(t [256]opInfo) [256]opInfo {
	for i := range t {
		if t[i].name != "" {
			t[i].ok = true
			t[i].hdrLen = BTHLen + t[i].ext.Len()
		}
	}
	return t
}

// Len returns the total length in bytes of the headers in e.
func (e Ext) Len() int {
	n := 0
	if e&ExtRETH != 0 {
		n += RETHLen
	}
	if e&ExtAtomicETH != 0 {
		n += AtomicETHLen
	}
	if e&ExtAETH != 0 {
		n += AETHLen
	}
	if e&ExtAtomicAckETH != 0 {
		n += AtomicAckETHLen
	}
	if e&ExtImmDt != 0 {
		n += ImmDtLen
	}
	if e&ExtDETH != 0 {
		n += DETHLen
	}
	if e&ExtIETH != 0 {
		n += IETHLen
	}
	return n
}

// Valid reports whether the codec implements op.
func (op Opcode) Valid() bool { return opTable[op].ok }

// IsUD reports whether op is of the UD transport (it may not be
// implemented: Valid).
func (op Opcode) IsUD() bool { return op>>5 == transportUD }

// Ext returns the extension headers that follow the BTH (0 if !op.Valid()).
func (op Opcode) Ext() Ext {
	if !op.Valid() {
		return 0
	}
	return opTable[op].ext
}

// HasPayload reports whether op may carry a payload.
func (op Opcode) HasPayload() bool { return op.Valid() && opTable[op].payload }

// Segment returns the place of op in a message.
func (op Opcode) Segment() Segment {
	if !op.Valid() {
		return SegmentOnly
	}
	return opTable[op].seg
}

// HeaderLen returns the length of the BTH and the extension headers of op
// (0 if !op.Valid()).
func (op Opcode) HeaderLen() int {
	if !op.Valid() {
		return 0
	}
	return opTable[op].hdrLen
}

// String returns the IBA name of op without the "RC " prefix, e.g.
// "SEND_FIRST" ("UD_SEND_ONLY" for UD), or "Opcode(0x20)" for one the codec does not implement.
func (op Opcode) String() string {
	if !op.Valid() {
		return fmt.Sprintf("Opcode(%#02x)", uint8(op))
	}
	return opTable[op].name
}
