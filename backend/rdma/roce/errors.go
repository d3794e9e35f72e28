package roce

import (
	"errors"
	"fmt"
)

// Sentinels, one per class of defect, so that a receiver can count drops per
// reason with errors.Is. Every error Parse, CheckPMTU and Verify return
// matches exactly one of them.
var (
	// ErrTruncated: the packet is shorter than the headers its opcode
	// requires plus the 4-byte ICRC.
	ErrTruncated = errors.New("roce: packet truncated")
	// ErrOpcode: the BTH opcode is not one of the RC opcodes this codec
	// implements (UC, RD, CNP, FLUSH, ATOMIC_WRITE and the reserved
	// values are all refused).
	ErrOpcode = errors.New("roce: unsupported opcode")
	// ErrVersion: the BTH transport header version (TVer) is not 0.
	ErrVersion = errors.New("roce: unsupported transport header version")
	// ErrPad: the pad count does not fit the packet (payload plus pad not a
	// multiple of 4 bytes, pad longer than the payload area, or a pad on an
	// opcode without payload).
	ErrPad = errors.New("roce: inconsistent pad count")
	// ErrLength: the payload length breaks a rule the codec can check alone
	// (payload on an opcode without payload, more than MaxPayload bytes, a
	// FIRST or MIDDLE packet whose payload is no IBA path MTU).
	ErrLength = errors.New("roce: bad payload length")
	// ErrPMTU: the payload length breaks the path-MTU rule for the QP's
	// PMTU (see Packet.CheckPMTU).
	ErrPMTU = errors.New("roce: payload length does not match the path MTU")
	// ErrSyndrome: the AETH syndrome is reserved (bit 7 set, the reserved
	// type 0b10, or a reserved NAK code).
	ErrSyndrome = errors.New("roce: reserved AETH syndrome")
	// ErrICRC: the invariant CRC does not match the packet.
	ErrICRC = errors.New("roce: ICRC mismatch")
	// ErrInvalid: the caller, not the peer, is at fault: a field out of
	// range when encoding, an invalid MTU or IP header.
	ErrInvalid = errors.New("roce: invalid argument")
)

// PacketError reports why a packet was refused (or could not be encoded).
// errors.Is matches Err, one of the sentinels above.
type PacketError struct {
	// Opcode is the BTH opcode of the packet, when it was read (Parse
	// reports ErrTruncated on fewer than 16 bytes with Opcode 0).
	Opcode Opcode
	// Reason says what was wrong, with the values involved, in lower case.
	Reason string
	// Err is the sentinel of the class.
	Err error
}

// Error implements error.
func (e *PacketError) Error() string {
	return fmt.Sprintf("%v: %v: %s", e.Err, e.Opcode, e.Reason)
}

// Is reports whether target is e.Err.
func (e *PacketError) Is(target error) bool { return target == e.Err }

func packetError(err error, op Opcode, format string, args ...any) error {
	return &PacketError{Opcode: op, Reason: fmt.Sprintf(format, args...), Err: err}
}

// ICRCError reports an ICRC mismatch. It matches ErrICRC.
type ICRCError struct {
	Got  uint32 // the ICRC carried by the packet
	Want uint32 // the ICRC computed over the packet
}

// Error implements error.
func (e *ICRCError) Error() string {
	return fmt.Sprintf("%v: packet carries %#08x, computed %#08x", ErrICRC, e.Got, e.Want)
}

// Is reports whether target is ErrICRC.
func (e *ICRCError) Is(target error) bool { return target == ErrICRC }
