package virtiopci

import (
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by this package wrap one of them.
var (
	// ErrNoDevice: no PCI function with the wanted IDs, or not a virtio
	// modern device.
	ErrNoDevice = errors.New("no such virtio-pci device")
	// ErrCapability: the capability list is malformed or lacks a structure
	// the driver needs.
	ErrCapability = errors.New("bad virtio capability")
	// ErrBAR: a BAR could not be mapped or is too small for a structure.
	ErrBAR = errors.New("BAR mapping failed")
	// ErrFeatures: the device lacks a required feature or refused
	// FEATURES_OK.
	ErrFeatures = errors.New("feature negotiation failed")
	// ErrQueue: a virtqueue could not be set up.
	ErrQueue = errors.New("virtqueue setup failed")
	// ErrDevice: the device misbehaved (status did not reset, NEEDS_RESET,
	// a malformed used element).
	ErrDevice = errors.New("device error")
	// ErrHugepages: no hugepages, or their physical addresses are unknown.
	ErrHugepages = errors.New("hugepages unavailable")
	// ErrDMA: a DMA allocation request is invalid.
	ErrDMA = errors.New("bad DMA request")
	// ErrTimeout: the device did not answer in time.
	ErrTimeout = errors.New("timed out")
	// ErrClosed: the device was closed.
	ErrClosed = errors.New("device closed")
)

// CapError is a malformed virtio capability at config-space offset Offset.
// It matches ErrCapability.
type CapError struct {
	Offset int
	Reason string
}

func (e *CapError) Error() string {
	return fmt.Sprintf("capability at %#x: %s", e.Offset, e.Reason)
}

// Is matches ErrCapability.
func (e *CapError) Is(target error) bool { return target == ErrCapability }

// QueueError is a virtqueue that could not be set up. It matches ErrQueue.
type QueueError struct {
	Queue  int
	Reason string
}

func (e *QueueError) Error() string {
	return fmt.Sprintf("queue %d: %s", e.Queue, e.Reason)
}

// Is matches ErrQueue.
func (e *QueueError) Is(target error) bool { return target == ErrQueue }
