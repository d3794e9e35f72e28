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
