package vhostuser

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"golang.org/x/sys/unix"
)

// oobSize is room for exactly MaxFds fds in one SCM_RIGHTS control message:
// a sender that attaches more makes the kernel set MSG_CTRUNC.
var oobSize = unix.CmsgSpace(MaxFds * 4)

// Conn moves whole messages over a connected unix stream socket. Reads
// and writes may run concurrently with each other; concurrent reads (and
// concurrent writes) are serialised.
type Conn struct {
	uc *net.UnixConn // immutable

	callMu  sync.Mutex // serialises Call; taken before writeMu and readMu
	writeMu sync.Mutex // serialises writes, so a message's bytes stay together
	readMu  sync.Mutex // serialises ReadMessage; protects oob
	oob     []byte     // protected by readMu

	pauseMu sync.Mutex // a leaf; protects paused, kicked and the read deadline (pause.go)
	paused  bool       // protected by pauseMu; between Pause and Resume
	kicked  bool       // protected by pauseMu; Pause set a read deadline: a deadline error is a pause
}

// NewConn wraps a connected unix stream socket. The Conn owns c from now
// on.
func NewConn(c *net.UnixConn) *Conn {
	return &Conn{uc: c, oob: make([]byte, oobSize)}
}

// UnixConn returns the underlying socket (for deadlines, or to hand it to
// a poller). Reading or writing it directly desynchronises the Conn.
func (c *Conn) UnixConn() *net.UnixConn { return c.uc }

// Close closes the socket.
func (c *Conn) Close() error { return c.uc.Close() }

// recv does one recvmsg into b and returns the bytes read and the fds that
// came with them (received close-on-exec by package net). On any error the
// fds received by this call are closed and none are returned. Truncated
// control data (more than MaxFds fds) and control messages other than
// SCM_RIGHTS are ErrProtocol.
func (c *Conn) recv(b []byte) (int, []int, error) {
	n, oobn, flags, _, err := c.uc.ReadMsgUnix(b, c.oob)
	if n < 0 || n > len(b) { // a failed recvmsg may report -1
		n = 0
	}
	if oobn < 0 || oobn > len(c.oob) {
		oobn = 0
	}
	var fds []int
	var cerr error
	if oobn > 0 {
		fds, cerr = parseRights(c.oob[:oobn])
	}
	if cerr == nil && flags&unix.MSG_CTRUNC != 0 {
		cerr = protocolf(0, nil, "ancillary data truncated (more than %d fds)", MaxFds)
	}
	if cerr == nil {
		cerr = err
	}
	if cerr != nil {
		closeFds(fds)
		return n, nil, cerr
	}
	return n, fds, nil
}

// parseRights returns every fd in the SCM_RIGHTS messages of oob. Any other
// control message is an error; the fds found are still returned so that
// the caller can close them.
func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, protocolf(0, err, "malformed ancillary data")
	}
	var fds []int
	var bad error
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			bad = protocolf(0, nil, "unexpected control message level %d type %d", m.Header.Level, m.Header.Type)
			continue
		}
		r, err := unix.ParseUnixRights(&m)
		if err != nil {
			bad = protocolf(0, err, "malformed SCM_RIGHTS")
			continue
		}
		fds = append(fds, r...)
	}
	return fds, bad
}

// ReadMessage reads one message: the header, the payload and the fds sent
// with it. Fds must come with the header bytes (one sendmsg of the whole
// message attaches them to its first byte; the kernel may also deliver fds
// of a later part of the header with it); fds with the payload, a second
// batch of fds, more than MaxFds
// fds (MSG_CTRUNC), a bad version, Size > MaxPayloadSize, and EOF or an
// I/O error inside a message are ErrProtocol, and every fd received is
// closed. EOF before the first byte returns io.EOF. While the Conn is
// paused (Pause) it returns ErrPaused before the first byte of a message,
// and finishes a message it began. After any other error the connection
// must be closed.
//
// The caller owns the returned message's fds: Check, then TakeFd what it
// keeps and CloseFds the rest.
func (c *Conn) ReadMessage() (*Message, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if c.Paused() {
		return nil, ErrPaused
	}

	var hb [HeaderSize]byte
	var fds []int
	fail := func(req Request, cause error, format string, args ...any) (*Message, error) {
		closeFds(fds)
		return nil, protocolf(req, cause, format, args...)
	}
	for got := 0; got < HeaderSize; {
		n, rfds, err := c.recv(hb[got:])
		if len(rfds) > 0 {
			if fds != nil {
				closeFds(rfds)
				return fail(0, nil, "fds arrived twice within the header")
			}
			fds = rfds
		}
		got += n
		if paused, ok := c.interrupted(err, got); ok {
			if paused {
				return nil, ErrPaused // nothing consumed
			}
			continue
		}
		if err != nil {
			var me *MessageError
			switch {
			case errors.As(err, &me):
				closeFds(fds)
				return nil, err
			case got == 0 && errors.Is(err, io.EOF):
				return nil, io.EOF
			case got == 0:
				// Nothing consumed: the stream is still in step.
				return nil, fmt.Errorf("vhostuser: read header: %w", err)
			case errors.Is(err, io.EOF):
				return fail(0, io.ErrUnexpectedEOF, "eof after %d header bytes", got)
			default:
				return fail(0, err, "read header")
			}
		}
	}
	h, err := ParseHeader(hb[:])
	if err != nil {
		closeFds(fds)
		return nil, err
	}
	req := Request(h.Request)
	p := make([]byte, h.Size)
	for got := 0; got < len(p); {
		n, rfds, err := c.recv(p[got:])
		if len(rfds) > 0 {
			closeFds(rfds)
			return fail(req, nil, "fds arrived with the payload, not the header")
		}
		got += n
		if _, ok := c.interrupted(err, HeaderSize+got); ok {
			continue // a message that began is finished
		}
		if err != nil {
			var me *MessageError
			switch {
			case errors.As(err, &me):
				closeFds(fds)
				me.Request = req
				return nil, me
			case errors.Is(err, io.EOF):
				return fail(req, io.ErrUnexpectedEOF, "eof after %d of %d payload bytes", got, len(p))
			default:
				return fail(req, err, "read payload")
			}
		}
	}
	return &Message{Header: h, Payload: p, Fds: fds}, nil
}

// WriteMessage sends one message in one sendmsg, with the fds attached to
// its first byte (if the kernel accepts only part of the bytes, the rest
// follows without fds). h.Size is set to len(payload); version bits of 0
// are set to FlagVersion. The fds stay owned by the caller. A payload
// larger than MaxPayloadSize, more than MaxFds fds, or a bad version is
// ErrInvalid and nothing is sent.
func (c *Conn) WriteMessage(h Header, payload []byte, fds []int) error {
	req := Request(h.Request)
	if len(payload) > MaxPayloadSize {
		return invalidf(req, "payload of %d bytes exceeds %d", len(payload), MaxPayloadSize)
	}
	if len(fds) > MaxFds {
		return invalidf(req, "%d fds exceed %d", len(fds), MaxFds)
	}
	switch h.Version() {
	case 0:
		h.Flags |= FlagVersion
	case FlagVersion:
	default:
		return invalidf(req, "version %d", h.Version())
	}
	for _, fd := range fds {
		if fd < 0 {
			return invalidf(req, "negative fd %d", fd)
		}
	}
	h.Size = uint32(len(payload))
	buf := make([]byte, HeaderSize+len(payload))
	h.put(buf)
	copy(buf[HeaderSize:], payload)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}

	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	n, _, err := c.uc.WriteMsgUnix(buf, oob, nil)
	if err != nil {
		return fmt.Errorf("vhostuser: write %v: %w", req, err)
	}
	if n < len(buf) {
		if _, err := c.uc.Write(buf[n:]); err != nil {
			return fmt.Errorf("vhostuser: write %v: %w", req, err)
		}
	}
	return nil
}

// Reply sends a back-end reply to req (FlagVersion|FlagReply).
func (c *Conn) Reply(req Request, payload []byte, fds []int) error {
	return c.WriteMessage(Header{Request: uint32(req), Flags: FlagVersion | FlagReply}, payload, fds)
}

// ReplyU64 sends a back-end reply to req carrying a u64 (the REPLY_ACK
// form: 0 is success).
func (c *Conn) ReplyU64(req Request, v uint64) error {
	return c.Reply(req, EncodeU64(v), nil)
}

// AlwaysReplies reports whether the back-end answers r even without
// FlagNeedReply: the GET_* requests, SET_LOG_BASE (with LOG_SHMFD, the only
// form Check accepts), SET_DEVICE_STATE_FD, CHECK_DEVICE_STATE,
// IOTLB_MSG, POSTCOPY_ADVISE/END and CREATE_CRYPTO_SESSION. For these a
// back-end sends no separate REPLY_ACK.
func (r Request) AlwaysReplies() bool {
	switch r {
	case GetFeatures, GetProtocolFeatures, GetVringBase, GetQueueNum, GetConfig,
		GetInflightFd, GetMaxMemSlots, GetStatus, GetSharedObject, SetLogBase,
		SetDeviceStateFd, CheckDeviceState, IOTLBMsg, PostcopyAdvise, PostcopyEnd,
		CreateCryptoSession:
		return true
	}
	return false
}

// Call is the front-end's request/reply helper: it sends req with payload
// and fds and, when wantReply, reads the reply and checks it with
// CheckReply (FlagReply, the same request number, the expected size and
// fds). When wantReply and req does not always reply, FlagNeedReply is
// set, which requires negotiated REPLY_ACK. A reply that fails CheckReply
// has its fds closed. Calls are serialised; do not mix Call with
// concurrent ReadMessage on the same Conn.
func (c *Conn) Call(req Request, payload []byte, fds []int, wantReply bool) (*Message, error) {
	c.callMu.Lock()
	defer c.callMu.Unlock()
	h := Header{Request: uint32(req), Flags: FlagVersion}
	if wantReply && !req.AlwaysReplies() {
		h.Flags |= FlagNeedReply
	}
	if err := c.WriteMessage(h, payload, fds); err != nil {
		return nil, err
	}
	if !wantReply {
		return nil, nil
	}
	m, err := c.ReadMessage()
	if err != nil {
		return nil, fmt.Errorf("vhostuser: reply to %v: %w", req, err)
	}
	if err := CheckReply(req, m); err != nil {
		m.CloseFds()
		return nil, err
	}
	return m, nil
}
