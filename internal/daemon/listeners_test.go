package daemon

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// rawSocket makes a socket of the given family and type, bound to path
// when path is not empty, listening when listen is set. Its descriptor is
// not close-on-exec, as an inherited one may not be.
func rawSocket(t *testing.T, family, typ int, path string, listen bool) int {
	t.Helper()
	fd, err := unix.Socket(family, typ, 0)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case path != "":
		if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
			t.Fatal(err)
		}
	case family == unix.AF_INET:
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			t.Fatal(err)
		}
	}
	if listen {
		if err := unix.Listen(fd, 8); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

// TestInheritFD: --fd accepts exactly a listening unix stream socket.
func TestInheritFD(t *testing.T) {
	dir := t.TempDir()
	file, err := os.Create(filepath.Join(dir, "file"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	var pipe [2]int
	if err := unix.Pipe(pipe[:]); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pipe[1])
	// A descriptor number that is not open: one just closed.
	closed, err := unix.Dup(pipe[1])
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(closed)
	tests := []struct {
		name    string
		fd      func() int
		wantErr string
	}{
		{"stdin", func() int { return 0 }, "standard input"},
		{"not open", func() int { return closed }, "not open"},
		{"regular file", func() int { d, _ := unix.Dup(int(file.Fd())); return d }, "not a socket"},
		{"pipe", func() int { return pipe[0] }, "not a socket"},
		{"unix stream, not listening", func() int {
			return rawSocket(t, unix.AF_UNIX, unix.SOCK_STREAM, filepath.Join(dir, "idle.sock"), false)
		}, "not listening"},
		{"unix datagram", func() int {
			return rawSocket(t, unix.AF_UNIX, unix.SOCK_DGRAM, filepath.Join(dir, "dgram.sock"), false)
		}, "SOCK_STREAM"},
		{"unix seqpacket, listening", func() int {
			return rawSocket(t, unix.AF_UNIX, unix.SOCK_SEQPACKET, filepath.Join(dir, "seq.sock"), true)
		}, "SOCK_STREAM"},
		{"tcp, listening", func() int { return rawSocket(t, unix.AF_INET, unix.SOCK_STREAM, "", true) }, "AF_UNIX"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fd := tt.fd()
			ln, err := InheritFD(fd)
			if err == nil {
				ln.Close()
				t.Fatalf("InheritFD(%d): got a listener, want an error with %q", fd, tt.wantErr)
			}
			var fe *FDError
			if !errors.As(err, &fe) || !errors.Is(err, ErrNotListener) || fe.FD != fd || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("InheritFD(%d): got %v, want an *FDError for fd %d saying %q", fd, err, fd, tt.wantErr)
			}
		})
	}

	t.Run("listening unix stream", func(t *testing.T) {
		sock := filepath.Join(dir, "ok.sock")
		fd := rawSocket(t, unix.AF_UNIX, unix.SOCK_STREAM, sock, true)
		ln, err := InheritFD(fd)
		if err != nil {
			t.Fatal(err)
		}
		if got := ln.Addr().String(); got != sock {
			t.Errorf("address: got %q, want %q", got, sock)
		}
		// The inherited descriptor itself is closed; the listener's own
		// is close-on-exec.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
			t.Errorf("fd %d after InheritFD: %v, want it closed", fd, err)
		}
		rc, err := ln.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var flags int
		rc.Control(func(fd uintptr) { flags, _ = unix.FcntlInt(fd, unix.F_GETFD, 0) })
		if flags&unix.FD_CLOEXEC == 0 {
			t.Error("listener's descriptor is not close-on-exec")
		}
		go func() {
			if c, err := ln.Accept(); err == nil {
				c.Close()
			}
		}()
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatalf("dial the inherited socket: %v", err)
		}
		c.Close()
		ln.Close()
		if _, err := os.Lstat(sock); err != nil {
			t.Errorf("socket file after Close: %v, want it left to its owner", err)
		}
	})
}

// TestCheckListenerCloexec: an accepted descriptor is made
// close-on-exec, so a child vrdmad might start never inherits it.
func TestCheckListenerCloexec(t *testing.T) {
	fd := rawSocket(t, unix.AF_UNIX, unix.SOCK_STREAM, filepath.Join(t.TempDir(), "s.sock"), true)
	defer unix.Close(fd)
	if flags, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); flags&unix.FD_CLOEXEC != 0 {
		t.Fatal("test socket is close-on-exec already")
	}
	if _, err := checkListener(fd); err != nil {
		t.Fatal(err)
	}
	if flags, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); flags&unix.FD_CLOEXEC == 0 {
		t.Error("checkListener left the descriptor inheritable")
	}
}

// TestActivationNone: without LISTEN_PID naming this process there are
// no activation sockets, and the variables are cleared.
func TestActivationNone(t *testing.T) {
	t.Setenv("LISTEN_PID", "1")
	t.Setenv("LISTEN_FDS", "2")
	t.Setenv("LISTEN_FDNAMES", "control:vm1")
	got, err := ActivationListeners()
	if err != nil || got != nil {
		t.Fatalf("got %v, %v; want nothing", got, err)
	}
	for _, v := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		if _, ok := os.LookupEnv(v); ok {
			t.Errorf("%s still set", v)
		}
	}
}

// TestDeviceOnInheritedListener: a device served on a listener it did not
// create cannot be persisted, and removing it leaves the socket file.
func TestDeviceOnInheritedListener(t *testing.T) {
	d := stateDaemon(t, t.TempDir())
	sock := filepath.Join(t.TempDir(), "inh.sock")
	newLn := func() *net.UnixListener {
		ln, err := InheritFD(rawSocket(t, unix.AF_UNIX, unix.SOCK_STREAM, sock, true))
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	if _, err := d.AddDevice(DeviceSpec{ID: "p", Listener: newLn(), Persist: true}); err == nil {
		t.Fatal("persisted device on an inherited socket: got nil error")
	}
	os.Remove(sock)
	dv, err := d.AddDevice(DeviceSpec{ID: "inh", Listener: newLn()})
	if err != nil {
		t.Fatal(err)
	}
	if got := dv.Info().Socket; got != sock {
		t.Errorf("socket: got %q, want %q", got, sock)
	}
	if err := d.RemoveDevice("inh"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sock); err != nil {
		t.Errorf("socket file after removal: %v, want it left in place", err)
	}
}
