package roce

import "encoding/binary"

// UDPPort is the IANA destination port of RoCEv2.
const UDPPort = 4791

// MTU is an InfiniBand path MTU: the largest payload of one packet.
type MTU int

// The IBA path MTUs. vrdma uses 1024 (Ethernet MTU 1500), 2048 and 4096
// (jumbo frames); 256 and 512 are accepted from peers that use them.
const (
	MTU256  MTU = 256
	MTU512  MTU = 512
	MTU1024 MTU = 1024
	MTU2048 MTU = 2048
	MTU4096 MTU = 4096
)

// MaxPayload is the largest payload of any packet: the largest IBA PMTU.
const MaxPayload = int(MTU4096)

// Valid reports whether m is one of the IBA path MTUs.
func (m MTU) Valid() bool {
	switch m {
	case MTU256, MTU512, MTU1024, MTU2048, MTU4096:
		return true
	}
	return false
}

// Packet is one RoCEv2 packet: the UDP payload, from the BTH to the ICRC.
//
// A Packet returned by Parse references the parsed slice (Payload is a
// subslice of it): it is valid as long as that buffer is not reused. Only
// the extension headers that BTH.Opcode carries (Opcode.Ext) are
// meaningful; Parse leaves the others zero and Append ignores them.
type Packet struct {
	BTH          BTH
	DETH         DETH         // ExtDETH (UD)
	RETH         RETH         // ExtRETH
	AtomicETH    AtomicETH    // ExtAtomicETH
	AETH         AETH         // ExtAETH
	AtomicAckETH AtomicAckETH // ExtAtomicAckETH
	// ImmDt is the immediate data (ExtImmDt), as a big-endian number: the
	// wire bytes are opaque to IBA, and verbs hand them to applications in
	// network byte order.
	ImmDt uint32
	// IETH is the R_Key a SEND with invalidate asks the responder to
	// invalidate (ExtIETH), as a number.
	IETH uint32
	// Payload is the payload without pad and ICRC; nil or empty for opcodes
	// without payload.
	Payload []byte
	// ICRC is the value of the invariant CRC field (see ICRC for its byte
	// order). Parse reports it without checking it; Append writes it as is,
	// so a sender appends with ICRC 0 and then calls Seal.
	ICRC uint32

	// pad holds the pad bytes as received (BTH.PadCount of them), so that
	// a parsed packet re-encodes to the same bytes; zero otherwise.
	pad [3]byte
}

// Parse decodes and validates one RoCEv2 packet, the payload of a UDP
// datagram to UDPPort. It checks everything the packet alone determines:
//
//   - the opcode is an implemented RC or UD opcode (ErrOpcode) and TVer
//     is 0 (ErrVersion);
//   - the packet holds the headers of its opcode and the ICRC
//     (ErrTruncated);
//   - the pad count fits: payload plus pad is a multiple of 4 bytes and an
//     opcode without payload has neither payload nor pad (ErrPad,
//     ErrLength);
//   - the payload is at most MaxPayload bytes, and a FIRST or MIDDLE
//     packet's payload is an IBA path MTU (ErrLength);
//   - an AETH syndrome is not a reserved encoding (ErrSyndrome).
//
// It checks neither the ICRC (Verify needs the IP and UDP headers) nor the
// payload against the QP's path MTU (CheckPMTU). On error it returns the
// zero Packet and a *PacketError. It does not allocate on success.
func Parse(b []byte) (Packet, error) {
	if len(b) < BTHLen+ICRCLen {
		var op Opcode
		if len(b) > 0 {
			op = Opcode(b[0])
		}
		return Packet{}, packetError(ErrTruncated, op, "%d bytes, want at least %d", len(b), BTHLen+ICRCLen)
	}
	op := Opcode(b[0])
	if !op.Valid() {
		return Packet{}, packetError(ErrOpcode, op, "not an implemented RC or UD opcode")
	}
	info := &opTable[op]
	bth := decodeBTH(b)
	if bth.TVer != 0 {
		return Packet{}, packetError(ErrVersion, op, "TVer %d, want 0", bth.TVer)
	}
	if len(b) < info.hdrLen+ICRCLen {
		return Packet{}, packetError(ErrTruncated, op, "%d bytes, want at least %d", len(b), info.hdrLen+ICRCLen)
	}
	// area is payload plus pad; both are 0 for an opcode without payload.
	area := len(b) - info.hdrLen - ICRCLen
	pad := int(bth.PadCount)
	switch {
	case !info.payload && pad != 0:
		return Packet{}, packetError(ErrPad, op, "pad count %d on an opcode without payload", pad)
	case !info.payload && area != 0:
		return Packet{}, packetError(ErrLength, op, "%d bytes after the headers of an opcode without payload", area)
	case area%4 != 0:
		return Packet{}, packetError(ErrPad, op, "payload and pad %d bytes, not a multiple of 4", area)
	case pad > area:
		return Packet{}, packetError(ErrPad, op, "pad count %d with %d bytes of payload and pad", pad, area)
	}
	n := area - pad
	if n > MaxPayload {
		return Packet{}, packetError(ErrLength, op, "payload %d bytes, more than %d", n, MaxPayload)
	}
	// FIRST and MIDDLE packets carry exactly PMTU bytes (the rule of
	// rxe_resp_check_length), so their payload is one of the path MTUs
	// whatever the QP's PMTU is.
	if seg := info.seg; (seg == SegmentFirst || seg == SegmentMiddle) && !MTU(n).Valid() {
		return Packet{}, packetError(ErrLength, op, "%s packet with payload %d bytes, not a path MTU", seg, n)
	}

	p := Packet{BTH: bth}
	off := BTHLen
	if info.ext&ExtDETH != 0 {
		p.DETH = decodeDETH(b[off:])
		off += DETHLen
	}
	if info.ext&ExtRETH != 0 {
		p.RETH = decodeRETH(b[off:])
		off += RETHLen
	}
	if info.ext&ExtAtomicETH != 0 {
		p.AtomicETH = decodeAtomicETH(b[off:])
		off += AtomicETHLen
	}
	if info.ext&ExtAETH != 0 {
		p.AETH = decodeAETH(b[off:])
		if !p.AETH.Syndrome.Valid() {
			return Packet{}, packetError(ErrSyndrome, op, "syndrome %#02x", uint8(p.AETH.Syndrome))
		}
		off += AETHLen
	}
	if info.ext&ExtAtomicAckETH != 0 {
		p.AtomicAckETH = AtomicAckETH{OrigData: binary.BigEndian.Uint64(b[off:])}
		off += AtomicAckETHLen
	}
	if info.ext&ExtImmDt != 0 {
		p.ImmDt = binary.BigEndian.Uint32(b[off:])
		off += ImmDtLen
	}
	if info.ext&ExtIETH != 0 {
		p.IETH = binary.BigEndian.Uint32(b[off:])
		off += IETHLen
	}
	if info.payload {
		p.Payload = b[off : off+n : off+n]
		copy(p.pad[:], b[off+n:off+area])
	}
	p.ICRC = binary.LittleEndian.Uint32(b[len(b)-ICRCLen:])
	return p, nil
}

// CheckPMTU checks the payload length against the QP's path MTU, the rule
// Linux rxe applies (rxe_resp.c, rxe_resp_check_length): a FIRST or MIDDLE packet
// carries exactly pmtu bytes, a LAST packet 1 to pmtu bytes, an ONLY packet
// 0 to pmtu bytes. It returns nil for opcodes without payload, ErrPMTU when
// the rule is broken and ErrInvalid when pmtu is no IBA path MTU.
func (p *Packet) CheckPMTU(pmtu MTU) error {
	op := p.BTH.Opcode
	if !pmtu.Valid() {
		return packetError(ErrInvalid, op, "path MTU %d", int(pmtu))
	}
	if !op.HasPayload() {
		return nil
	}
	n := len(p.Payload)
	switch seg := op.Segment(); seg {
	case SegmentFirst, SegmentMiddle:
		if n != int(pmtu) {
			return packetError(ErrPMTU, op, "%s packet with payload %d bytes, want PMTU %d", seg, n, int(pmtu))
		}
	case SegmentLast:
		if n == 0 || n > int(pmtu) {
			return packetError(ErrPMTU, op, "last packet with payload %d bytes, want 1 to PMTU %d", n, int(pmtu))
		}
	default:
		if n > int(pmtu) {
			return packetError(ErrPMTU, op, "only packet with payload %d bytes, more than PMTU %d", n, int(pmtu))
		}
	}
	return nil
}

// Len returns the length of the encoded packet, ICRC included (0 if the
// opcode is not implemented).
func (p *Packet) Len() int {
	op := p.BTH.Opcode
	if !op.Valid() {
		return 0
	}
	n := len(p.Payload)
	return op.HeaderLen() + n + padLen(n) + ICRCLen
}

func padLen(n int) int { return -n & 3 }

// Append appends the encoded packet, from the BTH to the ICRC field (written
// from p.ICRC, see Seal), to dst and returns the extended slice. The pad
// count is computed from len(p.Payload); BTH.PadCount is ignored.
//
// It refuses, with ErrInvalid and dst unchanged, what Parse would refuse:
// an opcode the codec does not implement, TVer not 0, DestQP, PSN or MSN
// beyond 24 bits, a reserved syndrome, a payload on an opcode without one,
// longer than MaxPayload, or (FIRST, MIDDLE) not a path MTU. It does not check the PMTU rules (CheckPMTU). It
// allocates only when dst lacks capacity (see Len).
func (p *Packet) Append(dst []byte) ([]byte, error) {
	if err := p.checkEncode(len(p.Payload)); err != nil {
		return dst, err
	}
	n := len(p.Payload)
	pad := padLen(n)
	dst = p.appendHeaders(dst, pad)
	dst = append(dst, p.Payload...)
	dst = append(dst, p.pad[:pad]...)
	return binary.LittleEndian.AppendUint32(dst, p.ICRC), nil
}

// Encode writes the packet with a payload of n bytes that is already in
// place into b, which must be exactly a packet of that payload long
// (HeaderLen + n + pad + ICRCLen) and hold the payload at
// [HeaderLen, HeaderLen+n): it writes the headers before the payload, zero
// pad bytes and p.ICRC after it, and ignores p.Payload. A sender builds a
// packet so in the memory it sends from, the payload copied there once
// (then Seal). It refuses, with ErrInvalid and b unchanged, what Append
// refuses for such a payload, and a b of another length.
func (p *Packet) Encode(b []byte, n int) error {
	if err := p.checkEncode(n); err != nil {
		return err
	}
	pad := padLen(n)
	hl := p.BTH.Opcode.HeaderLen()
	if n < 0 || len(b) != hl+n+pad+ICRCLen {
		return packetError(ErrInvalid, p.BTH.Opcode, "encode: %d bytes for a payload of %d", len(b), n)
	}
	p.appendHeaders(b[:0], pad)
	clear(b[hl+n : hl+n+pad])
	binary.LittleEndian.PutUint32(b[hl+n+pad:], p.ICRC)
	return nil
}

// appendHeaders appends the BTH (with pad count pad) and the extension
// headers of the opcode. Precondition: checkEncode passed.
func (p *Packet) appendHeaders(dst []byte, pad int) []byte {
	info := &opTable[p.BTH.Opcode]
	dst = p.BTH.append(dst, uint8(pad))
	if info.ext&ExtDETH != 0 {
		dst = p.DETH.append(dst)
	}
	if info.ext&ExtRETH != 0 {
		dst = p.RETH.append(dst)
	}
	if info.ext&ExtAtomicETH != 0 {
		dst = p.AtomicETH.append(dst)
	}
	if info.ext&ExtAETH != 0 {
		dst = p.AETH.append(dst)
	}
	if info.ext&ExtAtomicAckETH != 0 {
		dst = binary.BigEndian.AppendUint64(dst, p.AtomicAckETH.OrigData)
	}
	if info.ext&ExtImmDt != 0 {
		dst = binary.BigEndian.AppendUint32(dst, p.ImmDt)
	}
	if info.ext&ExtIETH != 0 {
		dst = binary.BigEndian.AppendUint32(dst, p.IETH)
	}
	return dst
}

// checkEncode checks the packet for encoding with a payload of n bytes.
func (p *Packet) checkEncode(n int) error {
	h := &p.BTH
	op := h.Opcode
	switch {
	case !op.Valid():
		return packetError(ErrInvalid, op, "not an implemented RC or UD opcode")
	case h.TVer != 0:
		return packetError(ErrInvalid, op, "TVer %d, want 0", h.TVer)
	case h.DestQP > QPNMask:
		return packetError(ErrInvalid, op, "DestQP %#x beyond 24 bits", h.DestQP)
	case !h.PSN.Valid():
		return packetError(ErrInvalid, op, "PSN %#x beyond 24 bits", uint32(h.PSN))
	case !op.HasPayload() && n != 0:
		return packetError(ErrInvalid, op, "payload %d bytes on an opcode without payload", n)
	case n > MaxPayload:
		return packetError(ErrInvalid, op, "payload %d bytes, more than %d", n, MaxPayload)
	case (op.Segment() == SegmentFirst || op.Segment() == SegmentMiddle) && !MTU(n).Valid():
		return packetError(ErrInvalid, op, "%s packet with payload %d bytes, not a path MTU", op.Segment(), n)
	}
	if op.Ext()&ExtDETH != 0 && p.DETH.SrcQP > QPNMask {
		return packetError(ErrInvalid, op, "SrcQP %#x beyond 24 bits", p.DETH.SrcQP)
	}
	if op.Ext()&ExtAETH != 0 {
		switch {
		case p.AETH.MSN > MSNMask:
			return packetError(ErrInvalid, op, "MSN %#x beyond 24 bits", p.AETH.MSN)
		case !p.AETH.Syndrome.Valid():
			return packetError(ErrInvalid, op, "syndrome %#02x", uint8(p.AETH.Syndrome))
		}
	}
	return nil
}
