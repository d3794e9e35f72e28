package virtio

import (
	"errors"
	"fmt"
)

var (
	// ErrBroken is matched by every error that breaks a queue: a malformed
	// ring or descriptor chain from the other side. A broken queue stays
	// broken until it is recreated.
	ErrBroken = errors.New("virtio: queue broken")

	// ErrQueueFull is returned by DriverQueue.Add when there are not enough
	// free descriptors for the chain.
	ErrQueueFull = errors.New("virtio: queue full")

	// ErrInvalid is matched by errors the caller (not the other side)
	// caused: a bad configuration, bad rings, a bad argument. They do not
	// break the queue.
	ErrInvalid = errors.New("virtio: invalid argument")
)

// Reasons carried by DescriptorError and RingError. Tests and callers that
// count failures may compare against them.
const (
	ReasonAvailIdx           = "available index too far ahead"
	ReasonHeadRange          = "head index out of range"
	ReasonNextRange          = "next index out of range"
	ReasonChainTooLong       = "chain longer than queue size (loop)"
	ReasonIndirectNotAllowed = "indirect descriptor not negotiated"
	ReasonIndirectNext       = "indirect descriptor with NEXT flag"
	ReasonIndirectEmpty      = "empty indirect table"
	ReasonIndirectUnaligned  = "indirect table length not a multiple of 16"
	ReasonIndirectTooLong    = "indirect table longer than maximum queue size"
	ReasonIndirectNested     = "nested indirect descriptor"
	ReasonIndirectMemory     = "indirect table outside guest memory"
	ReasonReadAfterWrite     = "device-readable descriptor after device-writable one"
	ReasonAddrOverflow       = "buffer address plus length overflows"
	ReasonBufferMemory       = "buffer outside guest memory"
	ReasonChainBytes         = "chain length above bound"
	ReasonUsedIdx            = "used index too far ahead"
	ReasonUsedID             = "used element id out of range"
	ReasonUsedNotInFlight    = "used element id not in flight"
	ReasonUsedLen            = "used length above writable length"
)

// DescriptorError reports a malformed descriptor chain. It matches ErrBroken.
type DescriptorError struct {
	Queue int    // queue index
	Head  uint16 // head of the chain
	// Index is the descriptor at fault: an index into the descriptor table,
	// or into the indirect table when Indirect is set.
	Index    uint16
	Indirect bool
	Reason   string // one of the Reason constants
	Err      error  // underlying error (e.g. from Memory), or nil
}

func (e *DescriptorError) Error() string {
	where := "descriptor"
	if e.Indirect {
		where = "indirect descriptor"
	}
	s := fmt.Sprintf("virtio: queue %d: chain %d: %s %d: %s", e.Queue, e.Head, where, e.Index, e.Reason)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is reports whether target is ErrBroken.
func (e *DescriptorError) Is(target error) bool { return target == ErrBroken }

// Unwrap returns the underlying error, if any.
func (e *DescriptorError) Unwrap() error { return e.Err }

// RingError reports a malformed ring (an index or used element the other side
// published). It matches ErrBroken.
type RingError struct {
	Queue  int
	Reason string // one of the Reason constants
	Detail string // values involved, for humans
}

func (e *RingError) Error() string {
	s := fmt.Sprintf("virtio: queue %d: %s", e.Queue, e.Reason)
	if e.Detail != "" {
		s += " (" + e.Detail + ")"
	}
	return s
}

// Is reports whether target is ErrBroken.
func (e *RingError) Is(target error) bool { return target == ErrBroken }
