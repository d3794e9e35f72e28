package eventfd

import (
	"errors"
	"testing"
	"time"
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
