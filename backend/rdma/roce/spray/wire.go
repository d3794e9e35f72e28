package spray

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vrdma/vrdma/backend/rdma/roce"
)

// BTH opcodes of the extension, in the manufacturer-specific range
// (docs/wire.md § 9.2).
const (
	OpHello    roce.Opcode = 0xC0
	OpHelloAck roce.Opcode = 0xC1
	OpData     roce.Opcode = 0xC2
	OpAck      roce.Opcode = 0xC3
	OpProbe    roce.Opcode = 0xC4
)

// Header lengths after the BTH, in bytes.
const (
	helloLen    = 16 // plus 16 per address
	dataHdrLen  = 40
	ackHdrLen   = 24 // plus 4 per SACK word
	probeLen    = 8
	addrLen     = 16
	version     = 1
	maxSACKWord = 64 // SACK words: the bitmap covers at most 2048 PSNs
)

// MaxAddrs bounds the addresses of a HELLO.
const MaxAddrs = 16

// DataOp is the operation of a DATA packet's message (SDH byte 0).
type DataOp uint8

// Data operations: requests, then responses.
const (
	DSend        DataOp = 0
	DSendImm     DataOp = 1
	DWrite       DataOp = 2
	DWriteImm    DataOp = 3
	DRead        DataOp = 4
	DCmpSwap     DataOp = 5
	DFetchAdd    DataOp = 6
	DReadResp    DataOp = 0x40
	DAtomicResp  DataOp = 0x41
	flagSE              = 1 << 0 // SDH flags: solicited event
	flagRetx            = 1 << 1 // SDH flags: a retransmission
	flagsKnown          = flagSE | flagRetx
	noPath       uint8  = 0xff
	maxPaths            = 64
	ackOK        uint8  = 0
	ackRNR       uint8  = 1
	ackNAK       uint8  = 2
	atomicReqLen        = 16 // swap/add, compare
	atomicLen           = 8
)

func (o DataOp) valid() bool    { return o <= DFetchAdd || o == DReadResp || o == DAtomicResp }
func (o DataOp) response() bool { return o == DReadResp || o == DAtomicResp }
func (o DataOp) atomic() bool   { return o == DCmpSwap || o == DFetchAdd }

// consumesRecv: the message takes a receive WQE (SEND and WRITE with
// immediate).
func (o DataOp) consumesRecv() bool { return o == DSend || o == DSendImm || o == DWriteImm }
func (o DataOp) hasImm() bool       { return o == DSendImm || o == DWriteImm }
func (o DataOp) write() bool        { return o == DWrite || o == DWriteImm }

// segmented: the message's bytes travel as payload, PMTU per packet.
func (o DataOp) segmented() bool { return o <= DWriteImm || o == DReadResp }

// ErrPacket is the sentinel of every refused packet; *PacketError says
// why.
var ErrPacket = errors.New("spray: malformed packet")

// PacketError says which rule a packet broke; it matches ErrPacket.
type PacketError struct {
	Opcode roce.Opcode
	Reason string
}

func (e *PacketError) Error() string {
	return fmt.Sprintf("spray: %s packet: %s", e.Opcode, e.Reason)
}
func (e *PacketError) Is(target error) bool { return target == ErrPacket }

// Packet is a parsed spray packet. Only the part its Opcode names is
// meaningful; Payload and SACK reference the parsed buffer.
type Packet struct {
	Opcode roce.Opcode
	DestQP uint32
	PSN    roce.PSN // DATA: the packet's PSN; HELLO, HELLO_ACK: the token (docs/wire.md § 9.2)
	Hello  Hello
	Data   Data
	Ack    Ack
	Probe  Probe
}

// Hello is the body of HELLO and HELLO_ACK.
type Hello struct {
	PMTU     roce.MTU
	Paths    uint8 // the sender's path count (informational)
	Window   uint32
	Messages uint32
	StartPSN roce.PSN
	NAddrs   int
	Addrs    [MaxAddrs]netip.Addr
}

// Data is the spray data header (SDH) and the payload.
type Data struct {
	Op      DataOp
	Flags   uint8
	Path    uint8
	MSN     uint32
	Offset  uint32
	Length  uint32
	RSN     uint32
	Imm     uint32
	RKey    uint32
	VA      uint64
	TS      uint32
	Payload []byte
}

// Ack is the spray ACK header (SAH) and its SACK bitmap.
type Ack struct {
	Status  uint8
	Code    uint8
	Path    uint8 // echoed path, noPath for none
	CumPSN  roce.PSN
	Retired uint32
	TS      uint32 // echoed timestamp
	PSN     roce.PSN
	MSN     uint32
	SACK    []byte // bit k of byte j: PSN CumPSN+1+8j+k received
}

// Probe is the body of PROBE.
type Probe struct {
	Path uint8
	TS   uint32
}

func perr(op roce.Opcode, format string, args ...any) error {
	return &PacketError{Opcode: op, Reason: fmt.Sprintf(format, args...)}
}

// Parse decodes and validates a spray packet, BTH to ICRC (the ICRC is not
// checked: the endpoint did). pmtu is the QP's path MTU, against which
// DATA packets are checked. It does not allocate on success; on error the
// Packet is zero.
func Parse(b []byte, pmtu roce.MTU) (Packet, error) {
	if len(b) < roce.BTHLen+roce.ICRCLen || len(b)%4 != 0 {
		return Packet{}, perr(0, "length %d", len(b))
	}
	op := roce.Opcode(b[0])
	if b[1]&0x0f != 0 {
		return Packet{}, perr(op, "TVer %d", b[1]&0x0f)
	}
	if b[1]&0xc0 != 0 {
		return Packet{}, perr(op, "SE or M set")
	}
	if pk := binary.BigEndian.Uint16(b[2:]); pk&0x7fff != 0x7fff {
		return Packet{}, perr(op, "P_Key %#x", pk)
	}
	pad := int(b[1]>>4) & 3
	p := Packet{Opcode: op, DestQP: uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7]),
		PSN: roce.PSN(uint32(b[9])<<16 | uint32(b[10])<<8 | uint32(b[11]))}
	body := b[roce.BTHLen : len(b)-roce.ICRCLen]
	if op != OpData && pad != 0 {
		return Packet{}, perr(op, "pad on a control packet")
	}
	if op != OpData && op != OpHello && op != OpHelloAck && p.PSN != 0 {
		return Packet{}, perr(op, "PSN %#x on a control packet", uint32(p.PSN))
	}
	var err error
	switch op {
	case OpHello, OpHelloAck:
		err = p.Hello.parse(body)
	case OpData:
		err = p.Data.parse(body, pad, pmtu)
	case OpAck:
		err = p.Ack.parse(body)
	case OpProbe:
		if len(body) != probeLen || body[1]|body[2]|body[3] != 0 || body[0] >= maxPaths {
			err = fmt.Errorf("PROBE body")
		} else {
			p.Probe = Probe{Path: body[0], TS: binary.BigEndian.Uint32(body[4:])}
		}
	default:
		err = fmt.Errorf("unknown opcode")
	}
	if err != nil {
		return Packet{}, perr(op, "%v", err)
	}
	return p, nil
}

func (h *Hello) parse(b []byte) error {
	if len(b) < helloLen {
		return fmt.Errorf("HELLO of %d bytes", len(b))
	}
	n := int(b[1])
	switch {
	case b[0] != version:
		return fmt.Errorf("version %d", b[0])
	case n < 1 || n > MaxAddrs || len(b) != helloLen+n*addrLen:
		return fmt.Errorf("%d addresses in %d bytes", n, len(b))
	case b[2] < 8 || b[2] > 12:
		return fmt.Errorf("PMTU code %d", b[2])
	}
	h.PMTU = roce.MTU(1 << b[2])
	h.Paths = b[3]
	h.Window = binary.BigEndian.Uint32(b[4:])
	h.Messages = binary.BigEndian.Uint32(b[8:])
	s := binary.BigEndian.Uint32(b[12:])
	if h.Window < MinWindow || h.Window > MaxWindow || h.Messages < 1 || h.Messages > MaxMessages || s > uint32(roce.PSNMask) {
		return fmt.Errorf("window %d, messages %d, start PSN %#x", h.Window, h.Messages, s)
	}
	h.StartPSN = roce.PSN(s)
	h.NAddrs = n
	for i := range n {
		a := netip.AddrFrom16([16]byte(b[helloLen+i*addrLen:])).Unmap()
		if a.IsUnspecified() || a.IsMulticast() {
			return fmt.Errorf("address %v", a)
		}
		h.Addrs[i] = a
	}
	return nil
}

func (d *Data) parse(b []byte, pad int, pmtu roce.MTU) error {
	if len(b) < dataHdrLen {
		return fmt.Errorf("DATA of %d bytes", len(b))
	}
	*d = Data{Op: DataOp(b[0]), Flags: b[1], Path: b[2],
		MSN: binary.BigEndian.Uint32(b[4:]), Offset: binary.BigEndian.Uint32(b[8:]),
		Length: binary.BigEndian.Uint32(b[12:]), RSN: binary.BigEndian.Uint32(b[16:]),
		Imm: binary.BigEndian.Uint32(b[20:]), RKey: binary.BigEndian.Uint32(b[24:]),
		VA: binary.BigEndian.Uint64(b[28:]), TS: binary.BigEndian.Uint32(b[36:])}
	pl := len(b) - dataHdrLen - pad
	if pl < 0 || (pl+pad)%4 != 0 || (pad > 0 && pl == 0) {
		return fmt.Errorf("pad %d for %d bytes", pad, len(b)-dataHdrLen)
	}
	d.Payload = b[dataHdrLen : dataHdrLen+pl]
	n := uint32(pl)
	switch {
	case !d.Op.valid():
		return fmt.Errorf("op %#x", uint8(d.Op))
	case d.Flags&^flagsKnown != 0 || b[3] != 0:
		return fmt.Errorf("reserved bits")
	case d.Path >= maxPaths:
		return fmt.Errorf("path %d", d.Path)
	case d.Length > MaxMessage:
		return fmt.Errorf("length %d", d.Length)
	case !d.Op.consumesRecv() && d.RSN != 0, !d.Op.hasImm() && d.Imm != 0:
		return fmt.Errorf("RSN or immediate on op %#x", uint8(d.Op))
	case d.Op.response() && (d.RKey != 0 || d.VA != 0):
		return fmt.Errorf("RKey or VA on a response")
	}
	switch {
	case d.Op.segmented():
		want := min(uint32(pmtu), d.Length-min(d.Length, d.Offset))
		if d.Offset%uint32(pmtu) != 0 || (d.Offset >= d.Length && d.Length != 0) || (d.Length == 0 && d.Offset != 0) || n != want {
			return fmt.Errorf("%d bytes at %d of %d (PMTU %d)", n, d.Offset, d.Length, pmtu)
		}
	case d.Op == DRead:
		if d.Offset != 0 || n != 0 {
			return fmt.Errorf("READ request with payload")
		}
	case d.Op.atomic():
		if d.Offset != 0 || d.Length != atomicLen || n != atomicReqLen {
			return fmt.Errorf("atomic of %d bytes", n)
		}
	case d.Op == DAtomicResp:
		if d.Offset != 0 || d.Length != atomicLen || n != atomicLen {
			return fmt.Errorf("atomic response of %d bytes", n)
		}
	}
	return nil
}

func (a *Ack) parse(b []byte) error {
	if len(b) < ackHdrLen {
		return fmt.Errorf("ACK of %d bytes", len(b))
	}
	*a = Ack{Status: b[0], Code: b[1], Path: b[2],
		CumPSN:  roce.PSN(binary.BigEndian.Uint32(b[4:])),
		Retired: binary.BigEndian.Uint32(b[8:]), TS: binary.BigEndian.Uint32(b[12:]),
		PSN: roce.PSN(binary.BigEndian.Uint32(b[16:])), MSN: binary.BigEndian.Uint32(b[20:])}
	words := int(b[3])
	switch {
	case words > maxSACKWord || len(b) != ackHdrLen+4*words:
		return fmt.Errorf("%d SACK words in %d bytes", words, len(b))
	case a.Status > ackNAK:
		return fmt.Errorf("status %d", a.Status)
	case a.Status == ackOK && (a.Code != 0 || a.PSN != 0 || a.MSN != 0):
		return fmt.Errorf("NAK fields on an ACK")
	case a.Status == ackRNR && a.Code > 31:
		return fmt.Errorf("RNR timer %d", a.Code)
	case a.Status == ackNAK && (a.Code < 1 || a.Code > 3):
		return fmt.Errorf("NAK code %d", a.Code)
	case a.Path != noPath && a.Path >= maxPaths:
		return fmt.Errorf("path %d", a.Path)
	case !a.CumPSN.Valid() || !a.PSN.Valid():
		return fmt.Errorf("PSN beyond 24 bits")
	}
	a.SACK = b[ackHdrLen:]
	return nil
}

// bth writes a BTH for op to QP dest at b[0:12].
func putBTH(b []byte, op roce.Opcode, pad int, dest uint32, psn roce.PSN) {
	b[0] = byte(op)
	b[1] = byte(pad&3) << 4
	b[2], b[3] = 0xff, 0xff
	b[4] = 0
	b[5], b[6], b[7] = byte(dest>>16), byte(dest>>8), byte(dest)
	b[8] = 0
	b[9], b[10], b[11] = byte(psn>>16), byte(psn>>8), byte(psn)
}

// appendHello appends a HELLO or HELLO_ACK to dst, token in its BTH PSN
// (docs/wire.md § 9.2: the initial RC send PSN of the HELLO's sender).
func appendHello(dst []byte, op roce.Opcode, dest uint32, token roce.PSN, h *Hello) []byte {
	n := len(dst)
	dst = append(dst, make([]byte, roce.BTHLen+helloLen+h.NAddrs*addrLen+roce.ICRCLen)...)
	b := dst[n:]
	putBTH(b, op, 0, dest, token)
	s := b[roce.BTHLen:]
	s[0], s[1] = version, byte(h.NAddrs)
	code := byte(8)
	for 1<<code < int(h.PMTU) {
		code++
	}
	s[2], s[3] = code, h.Paths
	binary.BigEndian.PutUint32(s[4:], h.Window)
	binary.BigEndian.PutUint32(s[8:], h.Messages)
	binary.BigEndian.PutUint32(s[12:], uint32(h.StartPSN))
	for i := range h.NAddrs {
		a := h.Addrs[i].As16()
		copy(s[helloLen+i*addrLen:], a[:])
	}
	return dst
}

// appendData appends a DATA packet; d.Payload is copied.
func appendData(dst []byte, dest uint32, psn roce.PSN, d *Data) []byte {
	pad := -len(d.Payload) & 3
	n := len(dst)
	total := roce.BTHLen + dataHdrLen + len(d.Payload) + pad + roce.ICRCLen
	dst = grow(dst, total)
	b := dst[n:]
	putBTH(b, OpData, pad, dest, psn)
	s := b[roce.BTHLen:]
	s[0], s[1], s[2], s[3] = byte(d.Op), d.Flags, d.Path, 0
	binary.BigEndian.PutUint32(s[4:], d.MSN)
	binary.BigEndian.PutUint32(s[8:], d.Offset)
	binary.BigEndian.PutUint32(s[12:], d.Length)
	binary.BigEndian.PutUint32(s[16:], d.RSN)
	binary.BigEndian.PutUint32(s[20:], d.Imm)
	binary.BigEndian.PutUint32(s[24:], d.RKey)
	binary.BigEndian.PutUint64(s[28:], d.VA)
	binary.BigEndian.PutUint32(s[36:], d.TS)
	copy(s[dataHdrLen:], d.Payload)
	clear(s[dataHdrLen+len(d.Payload):])
	return dst
}

// appendAck appends an ACK; a.SACK is copied (at most maxSACKWord words).
func appendAck(dst []byte, dest uint32, a *Ack) []byte {
	words := (len(a.SACK) + 3) / 4
	n := len(dst)
	dst = grow(dst, roce.BTHLen+ackHdrLen+4*words+roce.ICRCLen)
	b := dst[n:]
	putBTH(b, OpAck, 0, dest, 0)
	s := b[roce.BTHLen:]
	s[0], s[1], s[2], s[3] = a.Status, a.Code, a.Path, byte(words)
	binary.BigEndian.PutUint32(s[4:], uint32(a.CumPSN))
	binary.BigEndian.PutUint32(s[8:], a.Retired)
	binary.BigEndian.PutUint32(s[12:], a.TS)
	binary.BigEndian.PutUint32(s[16:], uint32(a.PSN))
	binary.BigEndian.PutUint32(s[20:], a.MSN)
	copy(s[ackHdrLen:], a.SACK)
	clear(s[ackHdrLen+len(a.SACK):])
	return dst
}

func appendProbe(dst []byte, dest uint32, p Probe) []byte {
	n := len(dst)
	dst = grow(dst, roce.BTHLen+probeLen+roce.ICRCLen)
	b := dst[n:]
	putBTH(b, OpProbe, 0, dest, 0)
	s := b[roce.BTHLen:]
	s[0], s[1], s[2], s[3] = p.Path, 0, 0, 0
	binary.BigEndian.PutUint32(s[4:], p.TS)
	clear(s[probeLen:])
	return dst
}

// grow extends b by n bytes, without allocating when its capacity allows.
func grow(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b[:len(b)+n]
	}
	return append(b, make([]byte, n)...)
}
