package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"golang.org/x/sys/unix"
)

// Inherited sockets. vrdmad serves sockets it did not create in two ways:
// --fd=FDNUM, the vhost-user backend program convention (QEMU
// docs/interop/vhost-user.rst, "Backend program conventions"), and
// systemd socket activation (sd_listen_fds(3): LISTEN_PID, LISTEN_FDS,
// LISTEN_FDNAMES, descriptors from 3 on), read through go-systemd's
// activation package. Either way a descriptor is checked before use: it
// must be open, a socket, AF_UNIX, SOCK_STREAM and listening
// (SO_ACCEPTCONN), as vrdmad would have made it; it is then marked
// close-on-exec.

// ErrNotListener means an inherited file descriptor is not a listening
// unix stream socket. Returned as *FDError.
var ErrNotListener = errors.New("not a listening unix stream socket")

// FDError is an inherited file descriptor that cannot be served.
type FDError struct {
	FD     int
	Name   string // the LISTEN_FDNAMES name, "" for --fd
	Reason string
}

func (e *FDError) Error() string {
	if e.Name != "" {
		return fmt.Sprintf("fd %d (%q): %v: %s", e.FD, e.Name, ErrNotListener, e.Reason)
	}
	return fmt.Sprintf("fd %d: %v: %s", e.FD, ErrNotListener, e.Reason)
}

// Is reports whether target is ErrNotListener.
func (e *FDError) Is(target error) bool { return target == ErrNotListener }

// maxListenFDs bounds LISTEN_FDS: the control socket and a socket per
// device.
const maxListenFDs = MaxDevices + 1

// checkListener checks that fd is an open, listening AF_UNIX SOCK_STREAM
// socket and returns its bound path ("" for an unnamed socket, "@name"
// for an abstract one). On success fd is close-on-exec.
func checkListener(fd int) (string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", fmt.Errorf("not open: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return "", errors.New("not a socket")
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return "", fmt.Errorf("getsockname: %w", err)
	}
	ua, ok := sa.(*unix.SockaddrUnix)
	if !ok {
		return "", fmt.Errorf("address family is not AF_UNIX (%T)", sa)
	}
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return "", fmt.Errorf("SO_TYPE: %w", err)
	}
	if typ != unix.SOCK_STREAM {
		return "", fmt.Errorf("socket type %d, want SOCK_STREAM (%d)", typ, unix.SOCK_STREAM)
	}
	acc, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if err != nil {
		return "", fmt.Errorf("SO_ACCEPTCONN: %w", err)
	}
	if acc != 1 {
		return "", errors.New("not listening (listen(2) was not called on it)")
	}
	unix.CloseOnExec(fd)
	name := ua.Name
	if len(name) > 0 && name[0] == 0 {
		name = "@" + name[1:]
	}
	return name, nil
}

// fileListener checks f (see checkListener) and turns it into a listener.
// f is closed in every case; the listener has its own descriptor
// (close-on-exec).
func fileListener(f *os.File, name string) (*net.UnixListener, error) {
	defer f.Close()
	fd := int(f.Fd())
	if _, err := checkListener(fd); err != nil {
		return nil, &FDError{FD: fd, Name: name, Reason: err.Error()}
	}
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, &FDError{FD: fd, Name: name, Reason: err.Error()}
	}
	ul, ok := ln.(*net.UnixListener)
	if !ok {
		ln.Close()
		return nil, &FDError{FD: fd, Name: name, Reason: fmt.Sprintf("a %T", ln)}
	}
	ul.SetUnlinkOnClose(false) // the socket file is the caller's
	return ul, nil
}

// InheritFD returns a listener on fd, a listening unix stream socket
// handed over by the process that started vrdmad (--fd=FDNUM). fd 0, 1
// and 2 are standard input, output and error by the same convention, and
// refused. fd itself is closed: the listener has its own descriptor.
func InheritFD(fd int) (*net.UnixListener, error) {
	if fd < 3 {
		return nil, &FDError{FD: fd, Reason: "0, 1 and 2 are standard input, output and error"}
	}
	// Check fd before os.NewFile: closing a File on a descriptor that was
	// never open could close one opened since under the same number.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		return nil, &FDError{FD: fd, Reason: fmt.Sprintf("not open: %v", err)}
	}
	return fileListener(os.NewFile(uintptr(fd), "fd "+strconv.Itoa(fd)), "")
}

// NamedListener is a socket passed by systemd with its name
// (FileDescriptorName= of its .socket unit; systemd's default is the
// socket unit's name).
type NamedListener struct {
	Name     string
	FD       int
	Listener *net.UnixListener
}

// ActivationListeners returns the sockets systemd passed to this process
// (nil when it passed none), in order, and unsets LISTEN_PID, LISTEN_FDS
// and LISTEN_FDNAMES. Every descriptor must be a listening unix stream
// socket: if one is not, all are closed and the error names it.
func ActivationListeners() ([]NamedListener, error) {
	if pid, err := strconv.Atoi(os.Getenv("LISTEN_PID")); err != nil || pid != os.Getpid() {
		activation.Files(true) // unsets the variables; returns nothing
		return nil, nil
	}
	n, err := strconv.Atoi(os.Getenv("LISTEN_FDS"))
	if err != nil || n <= 0 || n > maxListenFDs {
		activation.Files(true)
		if err == nil && n > maxListenFDs {
			return nil, fmt.Errorf("LISTEN_FDS=%d: more than %d sockets", n, maxListenFDs)
		}
		return nil, nil
	}
	// As in InheritFD: a File must not be made for a descriptor that is
	// not open.
	for fd := 3; fd < 3+n; fd++ {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			activation.Files(true)
			return nil, &FDError{FD: fd, Reason: fmt.Sprintf("LISTEN_FDS=%d but the descriptor is not open: %v", n, err)}
		}
	}
	files := activation.Files(true)
	out := make([]NamedListener, 0, len(files))
	var firstErr error
	for _, f := range files {
		fd, name := int(f.Fd()), f.Name()
		if firstErr != nil {
			f.Close()
			continue
		}
		ln, err := fileListener(f, name)
		if err != nil {
			firstErr = err
			continue
		}
		out = append(out, NamedListener{Name: name, FD: fd, Listener: ln})
	}
	if firstErr != nil {
		for _, nl := range out {
			nl.Listener.Close()
		}
		return nil, fmt.Errorf("socket activation: %w", firstErr)
	}
	return out, nil
}

// checkSocketFree fails with ErrSocketInUse when path exists and is not a
// socket, or is a socket some process accepts connections on. A socket
// file nobody listens on is stale; the back-end replaces it.
func checkSocketFree(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("socket %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%w: %s exists and is not a socket", ErrSocketInUse, path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%w: another process listens on %s", ErrSocketInUse, path)
	}
	return nil
}
