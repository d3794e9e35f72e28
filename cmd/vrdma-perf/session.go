package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// session is the TCP connection to the peer process. One goroutine reads
// the peer's messages as they come, so that a side busy with its own
// operations (or asleep while the peer runs) sees the peer's done or
// failure without a read of its own; the side consumes them in order.
type session struct {
	conn net.Conn      // immutable
	in   chan inbound  // the reader's messages
	stop chan struct{} // closed by close: the reader stops sending
	wg   sync.WaitGroup

	// Owned by the side's goroutine.
	queue []inbound // read from in, not consumed yet
	err   error     // the first failure: the peer's, or the connection's
}

// inbound is one message from the peer, or the error that ended reading.
type inbound struct {
	kind byte
	body []byte
	err  error
}

func newSession(conn net.Conn) *session {
	s := &session{conn: conn, in: make(chan inbound, 4), stop: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			kind, body, err := readMessage(conn)
			select {
			case s.in <- inbound{kind, body, err}:
			case <-s.stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return s
}

func (s *session) close() {
	close(s.stop)
	s.conn.Close()
	s.wg.Wait()
}

func (s *session) send(b []byte) error {
	s.conn.SetWriteDeadline(time.Now().Add(exchangeTimeout))
	if _, err := s.conn.Write(b); err != nil {
		return fmt.Errorf("exchange with %s: %w", s.conn.RemoteAddr(), err)
	}
	return nil
}

// fail tells the peer why this side stops; best effort, as the
// connection may be what failed.
func (s *session) fail(err error) {
	s.send((&fin{text: err.Error()}).encode())
}

// take files a message the reader delivered: a failed read or the peer's
// failure ends the session (s.err); anything else waits in the queue.
func (s *session) take(m inbound) {
	switch {
	case s.err != nil:
	case errors.Is(m.err, io.EOF):
		s.err = fmt.Errorf("the peer %s closed the connection (did its vrdma-perf exit?)", s.conn.RemoteAddr())
	case m.err != nil:
		s.err = fmt.Errorf("exchange with %s: %w", s.conn.RemoteAddr(), m.err)
	case m.kind == kindFin:
		f, err := decodeFin(m.body)
		switch {
		case err != nil:
			s.err = fmt.Errorf("exchange with %s: %w", s.conn.RemoteAddr(), err)
		case !f.ok:
			s.err = fmt.Errorf("peer %s failed: %s", s.conn.RemoteAddr(), f.text)
		default:
			s.queue = append(s.queue, m)
		}
	default:
		s.queue = append(s.queue, m)
	}
}

// poll takes what the reader has without waiting; it returns the
// session's failure, if any.
func (s *session) poll() error {
	for s.err == nil {
		select {
		case m := <-s.in:
			s.take(m)
		default:
			return nil
		}
	}
	return s.err
}

// recv returns the body of the peer's next message, which must be of kind,
// waiting at most d for it.
func (s *session) recv(ctx context.Context, kind byte, d time.Duration) ([]byte, error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		if s.err != nil {
			return nil, s.err
		}
		if len(s.queue) > 0 {
			m := s.queue[0]
			s.queue = s.queue[1:]
			if m.kind != kind {
				s.err = fmt.Errorf("exchange with %s: %w: message kind %d, want %d", s.conn.RemoteAddr(), errMalformed, m.kind, kind)
				return nil, s.err
			}
			return m.body, nil
		}
		select {
		case m := <-s.in:
			s.take(m)
		case <-timer.C:
			return nil, fmt.Errorf("exchange with %s: nothing from the peer for %v", s.conn.RemoteAddr(), d)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// exchangeHellos sends me and reads the peer's hello (the client first)
// and checks that both run the same test. A server that disagrees tells
// the client why in a fin.
func (s *session) exchangeHellos(ctx context.Context, me *hello, server bool) (*hello, error) {
	if !server {
		if err := s.send(me.encode()); err != nil {
			return nil, err
		}
	}
	b, err := s.recv(ctx, kindHello, 2*exchangeTimeout)
	if err != nil {
		return nil, err
	}
	peer, err := decodeHello(b)
	if err != nil {
		return nil, fmt.Errorf("exchange with %s: %w", s.conn.RemoteAddr(), err)
	}
	we, they := "client", "server"
	if server {
		we, they = they, we
	}
	if d := me.differs(&peer, we, they); d != "" {
		if server {
			s.send((&fin{text: "the server runs a different test: " + d}).encode())
		}
		return nil, fmt.Errorf("the peer runs a different test: %s", d)
	}
	if server {
		if err := s.send(me.encode()); err != nil {
			return nil, err
		}
	}
	return &peer, nil
}

// differs says how the peer's test differs from ours ("" when it does
// not), naming the sides.
func (h *hello) differs(p *hello, we, they string) string {
	var d []string
	check := func(name string, ours, theirs any) {
		if ours != theirs {
			d = append(d, fmt.Sprintf("%s %v on the %s, %v on the %s", name, ours, we, theirs, they))
		}
	}
	check("--op", h.op, p.op)
	check("latency test (_lat)", h.lat, p.lat)
	check("--verify", h.verify, p.verify)
	check("-b", h.bidir, p.bidir)
	check("-a", h.all, p.all)
	check("-s", h.size, p.size)
	check("-D", h.duration, p.duration)
	if h.duration {
		check("-D", time.Duration(h.iters), time.Duration(p.iters))
	} else {
		check("-n", h.iters, p.iters)
	}
	check("-q", len(h.qps), len(p.qps))
	check("--lat-iters", h.latIters, p.latIters)
	check("-t", h.txDepth, p.txDepth)
	check("the buffer size (--guest-mem?)", h.bufSize, p.bufSize)
	return strings.Join(d, ", ")
}

// barrier tells the peer this side is ready to run size and waits until
// the peer is.
func (s *session) barrier(ctx context.Context, size uint64, d time.Duration) error {
	if err := s.send(ready{size: size}.encode()); err != nil {
		return err
	}
	b, err := s.recv(ctx, kindReady, d)
	if err != nil {
		return err
	}
	r, err := decodeReady(b)
	if err == nil && r.size != size {
		err = fmt.Errorf("%w: the peer is ready for %d-byte messages, this side for %d", errMalformed, r.size, size)
	}
	if err != nil {
		s.err = fmt.Errorf("exchange with %s: %w", s.conn.RemoteAddr(), err)
	}
	return s.err
}

// peerDone says whether the peer's done for size has come (a -D latency
// server's loop ends with it).
func (s *session) peerDone(size uint64) bool {
	if s.poll() != nil {
		return true // the failure surfaces at the next wait
	}
	for _, m := range s.queue {
		if m.kind == kindDone {
			d, err := decodeDone(m.body)
			return err != nil || d.size == size
		}
	}
	return false
}

// waitDone reads the peer's done for size, waiting at most d.
func (s *session) waitDone(ctx context.Context, size uint64, qps int, d time.Duration) (done, error) {
	b, err := s.recv(ctx, kindDone, d)
	if err != nil {
		return done{}, err
	}
	pd, err := decodeDone(b)
	switch {
	case err != nil:
	case pd.size != size:
		err = fmt.Errorf("%w: the peer is done with %d-byte messages, this side runs %d", errMalformed, pd.size, size)
	case len(pd.posted) != 0 && len(pd.posted) != qps:
		err = fmt.Errorf("%w: the peer's done counts %d QPs, the test runs %d", errMalformed, len(pd.posted), qps)
	}
	if err != nil {
		s.err = fmt.Errorf("exchange with %s: %w", s.conn.RemoteAddr(), err)
		return done{}, s.err
	}
	return pd, nil
}

// finish sends this side's fin (what it verified) and reads the peer's.
func (s *session) finish(ctx context.Context, text string) (fin, error) {
	if err := s.send((&fin{ok: true, text: text}).encode()); err != nil {
		return fin{}, err
	}
	b, err := s.recv(ctx, kindFin, exchangeTimeout)
	if err != nil {
		return fin{}, err
	}
	return decodeFin(b) // ok: take files only successful fins
}

// accept waits for one client on port (all interfaces, as perftest's
// server) until ctx ends.
func accept(ctx context.Context, port int) (net.Conn, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	conn, err := ln.Accept()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("waiting for a client: %w", ctx.Err())
		}
		return nil, fmt.Errorf("accept: %w", err)
	}
	return conn, nil
}

// dial connects to the server at addr, retrying for connectTimeout while
// nothing listens there yet.
func dial(ctx context.Context, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return conn, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to %s: no server within %v: %w", addr, connectTimeout, err)
		case <-time.After(dialRetry):
		}
	}
}
