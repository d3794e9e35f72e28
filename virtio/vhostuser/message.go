package vhostuser

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// Header is the fixed part of every message: request number, flags and
// payload size, in native (little-endian) byte order.
type Header struct {
	Request uint32
	Flags   uint32
	Size    uint32
}

// Version returns the version bits of the flags.
func (h Header) Version() uint32 { return h.Flags & FlagVersionMask }

// IsReply reports whether FlagReply is set.
func (h Header) IsReply() bool { return h.Flags&FlagReply != 0 }

// Encode returns the 12 wire bytes of h.
func (h Header) Encode() []byte {
	b := make([]byte, HeaderSize)
	h.put(b)
	return b
}

func (h Header) put(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], h.Request)
	binary.LittleEndian.PutUint32(b[4:], h.Flags)
	binary.LittleEndian.PutUint32(b[8:], h.Size)
}

// ParseHeader decodes and validates a header: exactly HeaderSize bytes,
// version 1, Size <= MaxPayloadSize. Every error wraps ErrProtocol (a peer
// that sends such a header cannot be resynchronised) and comes with a zero
// Header.
func ParseHeader(b []byte) (Header, error) {
	if len(b) != HeaderSize {
		return Header{}, protocolf(0, nil, "header is %d bytes, want %d", len(b), HeaderSize)
	}
	h := Header{
		Request: binary.LittleEndian.Uint32(b[0:]),
		Flags:   binary.LittleEndian.Uint32(b[4:]),
		Size:    binary.LittleEndian.Uint32(b[8:]),
	}
	if v := h.Version(); v != FlagVersion {
		return Header{}, protocolf(Request(h.Request), nil, "version %d, want %d", v, FlagVersion)
	}
	if h.Size > MaxPayloadSize {
		return Header{}, protocolf(Request(h.Request), nil, "payload size %d exceeds %d", h.Size, MaxPayloadSize)
	}
	return h, nil
}

// ParseMessage decodes one whole message (header and payload, nothing
// more) from b without fds. The payload is copied. Errors wrap ErrProtocol
// and come with a nil message. It is the byte-level half of
// Conn.ReadMessage.
func ParseMessage(b []byte) (*Message, error) {
	if len(b) < HeaderSize {
		return nil, protocolf(0, nil, "message is %d bytes, shorter than a header", len(b))
	}
	h, err := ParseHeader(b[:HeaderSize])
	if err != nil {
		return nil, err
	}
	if got, want := len(b)-HeaderSize, int(h.Size); got != want {
		return nil, protocolf(Request(h.Request), nil, "payload is %d bytes, header says %d", got, want)
	}
	p := make([]byte, h.Size)
	copy(p, b[HeaderSize:])
	return &Message{Header: h, Payload: p}, nil
}

// Message is one received (or to be sent) message with the fds that came
// with it. The receiver owns Payload and every fd in Fds that is not -1.
type Message struct {
	Header
	// Payload holds exactly Header.Size bytes.
	Payload []byte
	// Fds are the fds that arrived with the message, in order; a slot is
	// -1 once taken or closed.
	Fds []int
}

// Req returns the request number as a front-end Request.
func (m *Message) Req() Request { return Request(m.Request) }

// NeedReply reports whether FlagNeedReply is set.
func (m *Message) NeedReply() bool { return m.Flags&FlagNeedReply != 0 }

// TakeFd transfers ownership of fd slot i to the caller: the slot becomes
// -1 so CloseFds leaves it open. It fails with ErrInvalid if i is out of
// range or the slot was already taken.
func (m *Message) TakeFd(i int) (int, error) {
	if i < 0 || i >= len(m.Fds) {
		return -1, invalidf(m.Req(), "fd %d requested, message has %d", i, len(m.Fds))
	}
	fd := m.Fds[i]
	if fd < 0 {
		return -1, invalidf(m.Req(), "fd %d already taken", i)
	}
	m.Fds[i] = -1
	return fd, nil
}

// CloseFds closes every fd not taken and marks its slot -1. It is
// idempotent and safe on a nil message.
func (m *Message) CloseFds() {
	if m == nil {
		return
	}
	closeFds(m.Fds)
}

func closeFds(fds []int) {
	for i, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
			fds[i] = -1
		}
	}
}
