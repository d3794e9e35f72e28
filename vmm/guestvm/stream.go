package guestvm

import (
	"net"
	"sync"
)

// consoleStream is a guest's console as one byte stream across live
// migrations. It reads the current QEMU's console connection; when that
// ends while a migration is in flight (expect), it waits until the
// migration either completes (handover: it goes on with the destination's
// connection, whose bytes waited in its socket meanwhile) or ends without
// the guest moving (abandon: the console ended with the source). The
// source's connection ends only when the source QEMU quits after the
// switch-over, so every byte the source printed is read before the
// destination's first: a line cut by the switch-over is whole in the log.
type consoleStream struct {
	mu   sync.Mutex
	cond *sync.Cond // signalled on every change of next, pending, closed
	// cur is the connection being read; next the destination's, set when
	// a migration completed and taken once cur ends.
	cur, next net.Conn // protected by mu
	pending   bool     // protected by mu; a migration is in flight
	closed    bool     // protected by mu; close was called
}

func newConsoleStream(c net.Conn) *consoleStream {
	s := &consoleStream{cur: c}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// Read reads the current connection; at its end it moves on to the
// destination's (see consoleStream).
func (s *consoleStream) Read(p []byte) (int, error) {
	for {
		s.mu.Lock()
		c := s.cur
		s.mu.Unlock()
		n, err := c.Read(p)
		if n > 0 || err == nil {
			return n, nil
		}
		s.mu.Lock()
		for s.pending && s.next == nil && !s.closed {
			s.cond.Wait()
		}
		if s.closed || s.next == nil || s.cur != c {
			s.mu.Unlock()
			return 0, err
		}
		s.cur, s.next = s.next, nil
		s.mu.Unlock()
		c.Close()
	}
}

// expect says a migration is in flight: the current connection's end is
// not the console's until it resolves.
func (s *consoleStream) expect() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending = true
}

// handover gives the destination's connection, read once the current one
// ends (the source QEMU quits).
func (s *consoleStream) handover(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return
	}
	s.next, s.pending = c, false
	s.cond.Broadcast()
}

// abandon says the migration ended without the guest moving.
func (s *consoleStream) abandon() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending = false
	s.cond.Broadcast()
}

// close closes every connection; Read then ends.
func (s *consoleStream) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	s.cur.Close()
	if s.next != nil {
		s.next.Close()
	}
	s.cond.Broadcast()
}
