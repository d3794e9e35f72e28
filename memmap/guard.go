package memmap

import "runtime/debug"

// Guard runs fn with runtime/debug.SetPanicOnFault(true) on the current
// goroutine, restoring the previous setting afterwards, and turns a memory
// fault inside fn (SIGBUS, or SIGSEGV at a non-nil address) into a
// *FaultError, which matches ErrFault. Other panics, including nil pointer
// dereferences, propagate.
//
// Workers that touch guest memory run under Guard because a front-end can
// shrink the file behind a region, after which the next access raises
// SIGBUS. Only fn's own goroutine is protected.
//
// Code running under Guard that touches the memory of more than one guest
// can attribute a fault itself, before Guard sees it: recover, ask
// FaultAddr for the faulting address and Table.MapsHost which guest's
// mappings hold it, and panic again with the same value for a fault that is
// not its to handle (Guard then reports it as usual).
func Guard(fn func()) (err error) {
	prev := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(prev)
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if addr, ok := FaultAddr(r); ok {
			err = &FaultError{Addr: addr}
			return
		}
		panic(r)
	}()
	fn()
	return nil
}

// FaultAddr reports whether v, a value recovered from a panic, is a memory
// fault that the runtime raised because SetPanicOnFault was on (SIGBUS, or
// SIGSEGV at a non-nil address), and returns the faulting host address. A
// nil pointer dereference or any other panic value is not one.
func FaultAddr(v any) (uintptr, bool) {
	// The runtime panics with a runtime.Error that has an Addr method
	// exactly for faults at an address when panicOnFault is set.
	fe, ok := v.(interface {
		error
		RuntimeError()
		Addr() uintptr
	})
	if !ok {
		return 0, false
	}
	return fe.Addr(), true
}
