package vhostuser

import (
	"errors"
	"fmt"
)

var (
	// ErrProtocol means the stream is desynchronised or unusable (bad
	// header, oversized payload, truncated or misplaced ancillary data,
	// EOF inside a message): the connection must be closed.
	ErrProtocol = errors.New("vhost-user protocol error")
	// ErrInvalid means one message is malformed (wrong payload size or fd
	// count, bad field): the receiver answers with an error (or ignores it)
	// and the connection may continue.
	ErrInvalid = errors.New("invalid vhost-user message")
)

// MessageError describes why a message was refused. errors.Is matches Err,
// which is ErrInvalid or ErrProtocol.
type MessageError struct {
	// Request is the request number of the refused message (0 if the
	// header was never read). For back-end channel messages it holds the
	// BackendRequest number and Backend is true.
	Request Request
	// Backend tells that Request is a BackendRequest number.
	Backend bool
	// Reason says what was wrong, in lower case.
	Reason string
	// Err is ErrInvalid or ErrProtocol.
	Err error
	// Cause is the underlying error (an I/O error, io.ErrUnexpectedEOF),
	// or nil.
	Cause error
}

func (e *MessageError) name() string {
	if e.Backend {
		return BackendRequest(e.Request).String()
	}
	if e.Request == 0 {
		return "message"
	}
	return e.Request.String()
}

// Error implements error.
func (e *MessageError) Error() string {
	s := fmt.Sprintf("vhostuser: %s: %s", e.name(), e.Reason)
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

// Is reports whether target is e.Err.
func (e *MessageError) Is(target error) bool { return target == e.Err }

// Unwrap returns Err and, when set, Cause.
func (e *MessageError) Unwrap() []error {
	if e.Cause != nil {
		return []error{e.Err, e.Cause}
	}
	return []error{e.Err}
}

func invalidf(req Request, format string, args ...any) error {
	return &MessageError{Request: req, Reason: fmt.Sprintf(format, args...), Err: ErrInvalid}
}

func protocolf(req Request, cause error, format string, args ...any) error {
	return &MessageError{Request: req, Reason: fmt.Sprintf(format, args...), Err: ErrProtocol, Cause: cause}
}
