package verbs

import (
	"errors"
	"fmt"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Errors of the verbs library. A command the device refused comes back as a
// *CommandError, which unwraps to the abi.Status (errors.As(err, &st) and
// errors.Is(err, abi.StatusBusy) both work).
var (
	// ErrQueueFull: a post asked for more slots than the send or receive
	// queue has free (the consumer index in the QP record says how many).
	ErrQueueFull = errors.New("rdma: work queue full")
	// ErrInvalid: an argument the library rejects before the device sees it.
	ErrInvalid = errors.New("rdma: invalid argument")
	// ErrProtocol: the device or transport answered something the ABI does
	// not allow (a short response, a producer index beyond the ring).
	ErrProtocol = errors.New("rdma: device protocol violation")
	// ErrClosed: the context or object was closed or destroyed.
	ErrClosed = errors.New("rdma: closed")
	// ErrTimeout: no event arrived in time.
	ErrTimeout = errors.New("rdma: timed out")
	// ErrUnsupported: the device does not implement what was asked: its
	// attributes say so (max_srq 0), or it answered UNSUPPORTED (a
	// *CommandError with that status matches ErrUnsupported too).
	ErrUnsupported = errors.New("rdma: not supported by the device")
)

// CommandError is a control command that failed with a non-OK status.
type CommandError struct {
	Op     abi.Opcode
	Status abi.Status
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("rdma: %s: %s", e.Op, e.Status)
}

// Unwrap returns the status, so errors.As(err, &status) works.
func (e *CommandError) Unwrap() error { return e.Status }

// Is reports whether target is ErrUnsupported and the device answered
// UNSUPPORTED, so one check covers what the library and the device refuse.
func (e *CommandError) Is(target error) bool {
	return target == ErrUnsupported && e.Status == abi.StatusUnsupported
}

// ArgError is an argument the library rejected; it matches ErrInvalid.
type ArgError struct {
	What   string // the argument
	Reason string
}

func (e *ArgError) Error() string { return "rdma: invalid " + e.What + ": " + e.Reason }

// Is reports whether target is ErrInvalid.
func (e *ArgError) Is(target error) bool { return target == ErrInvalid }

func argErr(what, format string, args ...any) error {
	return &ArgError{What: what, Reason: fmt.Sprintf(format, args...)}
}
