// Package ud is the contract between the engine's UD QPs and the RoCEv2
// network that carries their datagrams (docs/wire.md § UD), as package rc
// is for RC: a UD QP is attached to the network (Conn) and receives what
// arrives for its QP number (Host). A datagram is one packet, BTH then DETH
// (then ImmDt), unacknowledged: nothing here retransmits, orders or checks
// a PSN.
//
// QP 1 is a number like the others here: the engine attaches a device's
// GSI QP as QP 1 and sends its datagrams with SrcQPN 1 (docs/wire.md § 12).
//
// Non-goals: multicast, the SMI (QP0) and P_Key tables (the default P_Key is
// sent and any P_Key whose low 15 bits are all ones is accepted), TOS,
// TTL and flow labels (a UDP socket neither sets them per datagram nor
// reports them).
package ud

import (
	"encoding/binary"
	"net/netip"
)

// GRHSize is the network header a UD receive finds before the payload.
const GRHSize = 40

// Datagram is one UD SEND, as sent or as received.
type Datagram struct {
	SrcQPN, DestQPN uint32 // 24 bits each
	QKey            uint32
	Imm             uint32 // the ImmDt as a big-endian number, if WithImm
	WithImm         bool
	Solicited       bool
	// Payload is the message, at most one path MTU. A received one is
	// valid during Host.Receive only.
	Payload []byte
}

// Arrival is a datagram that arrived, with what the receiver's GRH is
// built from: the IP header's addresses and, for IPv4, the ID the ICRC
// was verified with.
type Arrival struct {
	Datagram
	Src, Dst netip.Addr // unmapped: IPv4 or IPv6
	IPv4ID   uint16
	SrcPort  uint16
}

// RoCEv2 headers after the IP header of a datagram of n payload bytes,
// UDP to ICRC: UDP, BTH, DETH, the ImmDt if any, the pad and the ICRC.
func udpLen(n int, imm bool) int {
	l := 8 + 12 + 8 + n + (-n & 3) + 4
	if imm {
		l += 4
	}
	return l
}

// PutGRH writes the 40-byte network header of the datagram a as verbs
// show it to a UD receive (docs/wire.md § UD): for IPv4, 20 zero bytes
// then the IPv4 header (IHL 5, the total length the packet had, the ID,
// DF, protocol UDP, the addresses, its checksum; TOS 0 and TTL 64, which a
// UDP socket does not report); for IPv6, the IPv6 header (traffic class
// and flow label 0, the payload length, next header UDP, hop limit 64,
// the addresses).
func (a *Arrival) PutGRH(b *[GRHSize]byte) {
	clear(b[:])
	be := binary.BigEndian
	l := udpLen(len(a.Payload), a.WithImm)
	if a.Src.Is4() && a.Dst.Is4() {
		h := b[20:40]
		h[0] = 0x45
		be.PutUint16(h[2:], uint16(20+l))
		be.PutUint16(h[4:], a.IPv4ID)
		be.PutUint16(h[6:], 0x4000) // DF
		h[8] = 64
		h[9] = 17
		s, d := a.Src.As4(), a.Dst.As4()
		copy(h[12:16], s[:])
		copy(h[16:20], d[:])
		be.PutUint16(h[10:], checksum(h))
		return
	}
	b[0] = 0x60
	be.PutUint16(b[4:], uint16(l))
	b[6] = 17
	b[7] = 64
	s, d := a.Src.As16(), a.Dst.As16()
	copy(b[8:24], s[:])
	copy(b[24:40], d[:])
}

// checksum is the IPv4 header checksum of h (its checksum field zero).
func checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// Host is the receiving side of a UD QP: the engine. Receive is called
// from the network's receive goroutines, which hold none of its locks,
// with a datagram whose packet was checked whole (lengths, opcode, ICRC)
// and addressed to the QP's number on one of the host addresses it was
// attached to. The Q_Key and the QP's state are Host's to check.
type Host interface {
	Receive(a *Arrival)
}

// Conn is a UD QP attached to the network.
type Conn interface {
	// Send sends d from the host address of GID sgid (one the QP was
	// attached to) to the host address of GID dgid, UDP port 4791. It
	// returns nil once the packet was handed to the socket (which may
	// still drop it, as a network may), or an error without sending: no
	// endpoint for sgid, a destination of the other family or none a
	// packet goes to, a payload over roce.MaxPayload. d.Payload is not
	// kept.
	Send(sgid, dgid [16]byte, d *Datagram) error
	// Close detaches the QP: no Receive starts after it returns, though
	// one in progress may still end. Idempotent.
	Close()
}
