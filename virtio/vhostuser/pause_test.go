package vhostuser

import (
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// inq returns the bytes waiting in c's socket receive queue.
func inq(t *testing.T, c *Conn) int {
	t.Helper()
	rc, err := c.UnixConn().SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var ierr error
	rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	if ierr != nil {
		t.Fatal(ierr)
	}
	return n
}

// waitInq waits until c's receive queue holds want bytes.
func waitInq(t *testing.T, c *Conn, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for inq(t, c) != want {
		if time.Now().After(deadline) {
			t.Fatalf("receive queue holds %d bytes, want %d", inq(t, c), want)
		}
		time.Sleep(time.Millisecond)
	}
}

type readResult struct {
	m   *Message
	err error
}

func readAsync(c *Conn) chan readResult {
	ch := make(chan readResult, 1)
	go func() {
		m, err := c.ReadMessage()
		ch <- readResult{m, err}
	}()
	return ch
}

func encodeMsg(req Request, payload []byte) []byte {
	b := make([]byte, HeaderSize+len(payload))
	Header{Request: uint32(req), Flags: FlagVersion, Size: uint32(len(payload))}.put(b)
	copy(b[HeaderSize:], payload)
	return b
}

// TestConnPauseSplitMessage: a message whose first bytes (with its fd)
// were read before Pause is finished and returned whole; the next read
// reports ErrPaused without consuming the message after it, which Resume
// lets through.
func TestConnPauseSplitMessage(t *testing.T) {
	c, raw := rawPair(t)
	efd := eventfds(t, 1)[0]
	msg := encodeMsg(SetVringKick, EncodeU64(1))
	sendRaw(t, raw, msg[:5], []int{efd})
	got := readAsync(c)
	waitInq(t, c, 0) // the reader took the first piece
	c.Pause()
	sendRaw(t, raw, msg[5:], nil)
	r := <-got
	if r.err != nil {
		t.Fatalf("message split around Pause: %v, want it whole", r.err)
	}
	if r.m.Req() != SetVringKick || len(r.m.Fds) != 1 || len(r.m.Payload) != 8 {
		t.Fatalf("got %s with %d fds and %d bytes, want SET_VRING_KICK, 1 fd, 8 bytes", r.m.Req(), len(r.m.Fds), len(r.m.Payload))
	}
	r.m.CloseFds()

	next := encodeMsg(GetFeatures, nil)
	sendRaw(t, raw, next, nil)
	if m, err := c.ReadMessage(); !errors.Is(err, ErrPaused) {
		t.Fatalf("ReadMessage while paused: %v, %v; want ErrPaused", m, err)
	}
	if n := inq(t, c); n != len(next) {
		t.Fatalf("paused read consumed bytes: %d left, want %d", n, len(next))
	}
	c.Resume()
	m, err := c.ReadMessage()
	if err != nil || m.Req() != GetFeatures {
		t.Fatalf("after Resume: %v, %v; want GET_FEATURES", m, err)
	}
}

// TestConnPauseIdle: a reader waiting for a message returns ErrPaused at
// Pause, and reads on after Resume.
func TestConnPauseIdle(t *testing.T) {
	c, raw := rawPair(t)
	got := readAsync(c)
	c.Pause()
	if r := <-got; !errors.Is(r.err, ErrPaused) {
		t.Fatalf("idle reader at Pause: %v, %v; want ErrPaused", r.m, r.err)
	}
	if !c.Paused() {
		t.Fatal("Paused: false after Pause")
	}
	c.Resume()
	got = readAsync(c)
	sendRaw(t, raw, encodeMsg(GetQueueNum, nil), nil)
	if r := <-got; r.err != nil || r.m.Req() != GetQueueNum {
		t.Fatalf("after Resume: %v, %v; want GET_QUEUE_NUM", r.m, r.err)
	}
}
