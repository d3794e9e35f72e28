package backend

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestFromListener: a server on a listener it did not create serves it,
// and Close leaves the socket file to its owner.
func TestFromListener(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "inherited.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := FromListener(ln, Config{Device: nullDevice{}})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Socket(); got != sock {
		t.Errorf("Socket: got %q, want %q (the listener's path)", got, sock)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(t.Context()) }()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !connectedWithin(s, 5e9) {
		t.Fatal("front-end on the inherited listener not connected")
	}
	if err := s.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("serve: %v", err)
	}
	if _, err := os.Lstat(sock); err != nil {
		t.Errorf("socket file after Close: %v, want it left in place", err)
	}
}

func TestFromListenerNeedsDevice(t *testing.T) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "x.sock"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := FromListener(ln, Config{}); err == nil {
		t.Fatal("FromListener without a device: got nil error")
	}
	// The listener was closed: accepting fails.
	if _, err := ln.Accept(); err == nil {
		t.Error("listener still open after a failed FromListener")
	}
}
