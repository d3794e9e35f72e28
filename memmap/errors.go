package memmap

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error this package returns matches one of them with
// errors.Is, usually through a *RangeError, *RegionError or *FaultError.
var (
	// ErrNotMapped reports that no region holds an address.
	ErrNotMapped = errors.New("address not mapped")
	// ErrCrossesRegion reports a range that starts in a region but does not
	// end in it.
	ErrCrossesRegion = errors.New("range crosses a region boundary")
	// ErrOverflow reports address or size arithmetic that overflows.
	ErrOverflow = errors.New("address arithmetic overflows")
	// ErrOverlap reports regions that overlap in guest-physical or
	// front-end virtual space.
	ErrOverlap = errors.New("regions overlap")
	// ErrTooManyRegions reports a table that would exceed MaxRegions.
	ErrTooManyRegions = errors.New("too many memory regions")
	// ErrFileTooSmall reports a region that extends past the end of its file.
	ErrFileTooSmall = errors.New("region extends past the end of its file")
	// ErrBadRegion reports a region that is malformed (zero size, bad fd,
	// not a regular file, already released).
	ErrBadRegion = errors.New("bad memory region")
	// ErrFault reports a memory access that faulted (SIGBUS or SIGSEGV),
	// caught by Guard.
	ErrFault = errors.New("memory access faulted")
)

// Address spaces named by RangeError.Space.
const (
	SpaceGuest = "guest-physical"
	SpaceUser  = "front-end virtual"
)

// RangeError reports a translation failure for the range [Addr, Addr+Len).
type RangeError struct {
	Space string // SpaceGuest or SpaceUser
	Addr  uint64
	Len   uint64
	Err   error // one of the sentinels: ErrNotMapped, ErrCrossesRegion, ErrOverflow
}

func (e *RangeError) Error() string {
	return fmt.Sprintf("%s range %#x+%#x: %v", e.Space, e.Addr, e.Len, e.Err)
}

// Unwrap returns e.Err.
func (e *RangeError) Unwrap() error { return e.Err }

// RegionError reports a region that MapRegion, NewTable or Table.With
// refused, or that could not be mapped.
type RegionError struct {
	Spec RegionSpec
	Err  error // a sentinel, or a wrapped system error
}

func (e *RegionError) Error() string {
	return fmt.Sprintf("region gpa %#x size %#x uva %#x offset %#x: %v",
		uint64(e.Spec.GuestAddr), e.Spec.Size, uint64(e.Spec.UserAddr), e.Spec.MmapOffset, e.Err)
}

// Unwrap returns e.Err.
func (e *RegionError) Unwrap() error { return e.Err }

// FaultError reports a memory fault that Guard caught.
type FaultError struct {
	Addr uintptr // faulting host address
}

func (e *FaultError) Error() string {
	return fmt.Sprintf("%v at %#x", ErrFault, e.Addr)
}

// Is reports whether target is ErrFault.
func (e *FaultError) Is(target error) bool { return target == ErrFault }
