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
func Guard(fn func()) (err error) {
	prev := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(prev)
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		// The runtime panics with a runtime.Error that has an Addr method
		// exactly for faults at an address when panicOnFault is set.
		if fe, ok := r.(interface {
			error
			RuntimeError()
			Addr() uintptr
		}); ok {
			err = &FaultError{Addr: fe.Addr()}
			return
		}
		panic(r)
	}()
	fn()
	return nil
}
