package eventfd

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestSignalWait(t *testing.T) {
	e, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if ok, err := e.TryWait(); ok || err != nil {
		t.Fatalf("TryWait on fresh eventfd = %v, %v; want false, nil", ok, err)
	}
	e.Signal()
	e.Signal()
	if n, err := e.Wait(); n != 2 || err != nil {
		t.Fatalf("Wait = %d, %v; want 2, nil", n, err)
	}
	done := make(chan error)
	go func() { _, err := e.Wait(); done <- err }()
	time.Sleep(10 * time.Millisecond)
	e.Interrupt()
	if err := <-done; !errors.Is(err, ErrInterrupted) {
		t.Fatalf("Wait after Interrupt = %v, want ErrInterrupted", err)
	}
	e.Rearm()
	e.Signal()
	if ok, err := e.TryWait(); !ok || err != nil {
		t.Fatalf("TryWait after Signal = %v, %v", ok, err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close = %v, want nil", err)
	}
}

func TestFromFdShared(t *testing.T) {
	a, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	fd, err := dup(a.Fd())
	if err != nil {
		t.Fatal(err)
	}
	b, err := FromFd(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a.Signal()
	if n, err := b.Wait(); n != 1 || err != nil {
		t.Fatalf("Wait on dup = %d, %v", n, err)
	}
}

// TestFromFdRejectsOthers: only an eventfd is taken; a regular file, a
// character device that always reads (a kick on /dev/zero would spin its
// worker) and a pipe are refused, and their fds closed.
func TestFromFdRejectsOthers(t *testing.T) {
	open := func(path string) int {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
		if err != nil {
			t.Fatalf("open %s: %v", path, err)
		}
		return fd
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[1])
	for name, fd := range map[string]int{
		"regular file": open(filepath.Join(t.TempDir(), "f")),
		"/dev/zero":    open("/dev/zero"),
		"pipe":         p[0],
	} {
		if e, err := FromFd(fd); err == nil {
			e.Close()
			t.Errorf("%s: accepted as an eventfd", name)
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
			t.Errorf("%s: fd %d left open after the refusal", name, fd)
		}
	}
}
