// Package eventfd owns Linux eventfds: the kick, call and error notifiers of
// vhost-user rings. An EventFD wraps its descriptor in an *os.File in
// non-blocking mode, so Wait parks the goroutine in Go's netpoller instead of
// holding an OS thread, and Interrupt wakes a waiter without a second fd.
//
// An EventFD owns its descriptor: Close is idempotent and the only way it is
// closed.
package eventfd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// ErrInterrupted is returned by Wait after Interrupt.
var ErrInterrupted = errors.New("eventfd: wait interrupted")

// EventFD is one eventfd. Signal and Wait may run concurrently; Close must
// not race with either.
type EventFD struct {
	f *os.File // immutable
}

// New creates an eventfd (non-blocking, close-on-exec).
func New() (*EventFD, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &EventFD{f: os.NewFile(uintptr(fd), "eventfd")}, nil
}

// FromFd takes ownership of fd (received from a peer), which must be an
// eventfd. It switches the descriptor to non-blocking mode. On error fd is
// closed.
func FromFd(fd int) (*EventFD, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("eventfd: fstat: %w", err)
	}
	// An eventfd is an anonymous inode; reject regular files, sockets and
	// the like so that a write of 8 bytes cannot land somewhere it matters.
	if st.Mode&unix.S_IFMT == unix.S_IFREG || st.Mode&unix.S_IFMT == unix.S_IFDIR {
		unix.Close(fd)
		return nil, fmt.Errorf("eventfd: fd %d is not an eventfd", fd)
	}
	// The stat check lets character devices and other anonymous inodes
	// through: a kick fd on /dev/zero would always read as signalled and
	// keep its ring's worker spinning. Where /proc is mounted the fd's
	// link names its kind exactly.
	if kind, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd)); err == nil && kind != "anon_inode:[eventfd]" {
		unix.Close(fd)
		return nil, fmt.Errorf("eventfd: fd %d is %s, not an eventfd", fd, kind)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("eventfd: set non-blocking: %w", err)
	}
	return &EventFD{f: os.NewFile(uintptr(fd), "eventfd")}, nil
}

// Fd returns the descriptor, for passing to a peer with SCM_RIGHTS. It stays
// owned by e.
func (e *EventFD) Fd() int {
	rc, err := e.f.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	rc.Control(func(u uintptr) { fd = int(u) })
	return fd
}

// Signal adds one to the counter, waking a waiter (the other side's).
func (e *EventFD) Signal() error {
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], 1)
	_, err := e.f.Write(b[:])
	if errors.Is(err, unix.EAGAIN) {
		// Counter saturated: the peer has a wake-up pending anyway.
		return nil
	}
	return err
}

// Wait blocks until the counter is non-zero, resets it and returns its
// value, or returns ErrInterrupted after Interrupt, or the deadline error.
func (e *EventFD) Wait() (uint64, error) {
	var b [8]byte
	_, err := e.f.Read(b[:])
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, ErrInterrupted
		}
		return 0, err
	}
	return binary.NativeEndian.Uint64(b[:]), nil
}

// ErrTimeout is returned by WaitTimeout when the time is up.
var ErrTimeout = errors.New("eventfd: wait timed out")

// WaitTimeout is Wait bounded by d: it returns ErrTimeout if the counter
// stayed zero that long. It must not run concurrently with Interrupt.
func (e *EventFD) WaitTimeout(d time.Duration) (uint64, error) {
	e.f.SetReadDeadline(time.Now().Add(d))
	defer e.f.SetReadDeadline(time.Time{})
	var b [8]byte
	_, err := e.f.Read(b[:])
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, ErrTimeout
		}
		return 0, err
	}
	return binary.NativeEndian.Uint64(b[:]), nil
}

// TryWait resets the counter without blocking and reports whether it was
// non-zero.
func (e *EventFD) TryWait() (bool, error) {
	rc, err := e.f.SyscallConn()
	if err != nil {
		return false, err
	}
	var n int
	var rerr error
	var b [8]byte
	if err := rc.Control(func(fd uintptr) { n, rerr = unix.Read(int(fd), b[:]) }); err != nil {
		return false, err
	}
	if errors.Is(rerr, unix.EAGAIN) {
		return false, nil
	}
	return rerr == nil && n == 8, rerr
}

// Interrupt makes a blocked (and every later) Wait return ErrInterrupted,
// until Rearm.
func (e *EventFD) Interrupt() { e.f.SetReadDeadline(time.Unix(1, 0)) }

// Rearm undoes Interrupt.
func (e *EventFD) Rearm() { e.f.SetReadDeadline(time.Time{}) }

// Close closes the descriptor. It is idempotent.
func (e *EventFD) Close() error {
	if e == nil {
		return nil
	}
	err := e.f.Close()
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}
