package vhostuser

import (
	"errors"
	"os"
	"time"
)

// ErrPaused is returned by ReadMessage while the Conn is paused (Pause),
// when it has read nothing of the next message: the stream is still at a
// message boundary.
var ErrPaused = errors.New("vhostuser: reading paused")

// pastDeadline is a read deadline that has expired: setting it wakes a
// reader parked in the netpoller without consuming any data.
var pastDeadline = time.Unix(1, 0)

// Pause makes ReadMessage stop at the next message boundary: a reader
// blocked before the first byte of a message returns ErrPaused at once, a
// reader in the middle of a message finishes reading it (and returns it),
// and every later ReadMessage returns ErrPaused until Resume. Nothing is
// consumed from the socket and nothing is sent. A live upgrade uses it to
// stop a session between two messages, so that another process can go on
// reading the same socket. Safe from any goroutine.
//
// Pause works through the socket's read deadline: a paused Conn must not
// have read deadlines of its own set by its user.
func (c *Conn) Pause() {
	c.pauseMu.Lock()
	defer c.pauseMu.Unlock()
	c.paused, c.kicked = true, true
	c.uc.SetReadDeadline(pastDeadline)
}

// Resume undoes Pause: ReadMessage blocks for the next message again.
func (c *Conn) Resume() {
	c.pauseMu.Lock()
	defer c.pauseMu.Unlock()
	c.paused = false
	c.uc.SetReadDeadline(time.Time{})
}

// Paused reports whether the Conn is paused.
func (c *Conn) Paused() bool {
	c.pauseMu.Lock()
	defer c.pauseMu.Unlock()
	return c.paused
}

// interrupted sorts out a read error after got bytes of a message: ok is
// false for an error Pause did not cause; otherwise paused tells whether
// ReadMessage returns ErrPaused (nothing read yet) or reads on (the
// deadline is cleared: a message that began is finished, so that the
// stream stays in step).
func (c *Conn) interrupted(err error, got int) (paused, ok bool) {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return false, false
	}
	c.pauseMu.Lock()
	defer c.pauseMu.Unlock()
	if !c.kicked {
		return false, false
	}
	if got == 0 && c.paused {
		return true, true
	}
	// Part of a message was read (or Resume came meanwhile): finish it.
	c.uc.SetReadDeadline(time.Time{})
	return false, true
}
