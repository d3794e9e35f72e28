package backend

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/eventfd"
	"github.com/vrdma/vrdma/virtio"
)

// Freezing a Server for a live upgrade (backend/doc.go, "Live upgrade"):
// Freeze stops it between two messages and describes it (state.go), Thaw
// lets it run on, Adopt (adopt.go) rebuilds it in another process.

// freezeWait bounds how long Freeze waits for the session to finish the
// message it is handling (a front-end that does not read its replies, or
// sends half a message, holds it there).
const freezeWait = 5 * time.Second

// maxBrokenLen bounds RingState.Broken.
const maxBrokenLen = 1024

// pastDeadline is an expired deadline: it wakes the accept loop without
// closing the listener.
var pastDeadline = time.Unix(1, 0)

var (
	errFrozen       = errors.New("backend: server is frozen")
	errClosed       = errors.New("backend: server is closed")
	errSessionEnded = errors.New("backend: the session ended while freezing")
)

// freezeRequest is one Freeze's request to a session.
type freezeRequest struct {
	result chan frozenSession // buffered 1: the session goroutine's answer
	thaw   chan struct{}      // closed by Thaw: the paused session runs on
}

type frozenSession struct {
	st  *SessionState
	fds []int
	err error
}

// Freeze stops the server at a clean point and describes it: the accept
// loop stops accepting (the listener stays open and keeps its path: it is
// never unlinked while frozen, also by Close), the session goroutine stops
// reading at a message boundary (a message it began is read and handled
// first), every ring worker stops and is joined (HandleQueue does not run
// afterwards, Queue.Run returns ErrQueueStopped, and kicks that arrive stay
// in the eventfds), and the device's NotifyConfigChange is recorded instead
// of sent. Nothing is reset, detached, closed or sent to the front-end. A
// front-end that connects meanwhile waits in the backlog (or, accepted just
// before, until Thaw or Close).
//
// It returns the state and dups of every descriptor the state names, in
// the order of its indexes; the caller closes them. After a handover the
// process should exit rather than Close: Close of a frozen server resets
// and detaches its device, whose state the new process now owns (it sends
// nothing and closes only this process's descriptors). Freeze fails on a
// closed or frozen server, on an adopted server before Serve, and when the
// session does not reach a message boundary within freezeWait; the server
// then runs on.
func (s *Server) Freeze() (*ServerState, []int, error) {
	s.freezeMu.Lock()
	defer s.freezeMu.Unlock()
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return nil, nil, errClosed
	case s.frozen:
		s.mu.Unlock()
		return nil, nil, errFrozen
	case s.pending != nil:
		s.mu.Unlock()
		return nil, nil, errors.New("backend: freeze of an adopted server that is not served yet")
	}
	s.frozen = true
	s.thawCh = make(chan struct{})
	s.parkedCh = make(chan struct{})
	s.parked = false
	serving, parked, unlink := s.serving, s.parkedCh, s.unlink
	s.mu.Unlock()
	s.ln.SetUnlinkOnClose(false)
	s.ln.SetDeadline(pastDeadline)
	if serving {
		select {
		case <-parked:
		case <-s.closedCh:
			s.thawLocked()
			return nil, nil, errClosed
		}
	}
	st, fds, err := s.describe(unlink)
	if err != nil {
		closeFds(fds)
		s.thawLocked()
		return nil, nil, err
	}
	return st, fds, nil
}

// describe builds the state of a frozen server, freezing its session if it
// has one. Precondition: freezeMu held, the accept loop parked.
func (s *Server) describe(unlink bool) (*ServerState, []int, error) {
	lfd, err := dupSyscallConn(s.ln)
	if err != nil {
		return nil, nil, fmt.Errorf("backend: freeze: listener: %w", err)
	}
	fds := []int{lfd}
	st := &ServerState{Listener: 0, UnlinkOnClose: unlink}
	s.mu.Lock()
	sess, since := s.active, s.peer.Since
	s.mu.Unlock()
	if sess != nil {
		req := sess.requestFreeze()
		timer := time.NewTimer(freezeWait)
		defer timer.Stop()
		var f frozenSession
		select {
		case f = <-req.result:
		case <-sess.done:
			// The front-end left meanwhile: there is no session to hand
			// over (a front-end that connects next waits for Thaw).
			f.err = errNoSession
		case <-s.closedCh:
			f.err = errClosed
		case <-timer.C:
			var ok bool
			if f, ok = sess.cancelFreeze(req); !ok {
				f.err = fmt.Errorf("backend: freeze: the session did not reach a message boundary within %v", freezeWait)
			}
		}
		switch {
		case errors.Is(f.err, errNoSession):
		case f.err != nil:
			// The session runs on: it withdrew or failed by itself, or it
			// ends (Close).
			return nil, fds, f.err
		default:
			f.st.Since = since
			f.st.shift(len(fds))
			fds = append(fds, f.fds...)
			st.Session = f.st
			s.mu.Lock()
			s.freezeReq = req
			s.mu.Unlock()
		}
	}
	st.Stats = s.Stats()
	return st, fds, nil
}

var errNoSession = errors.New("backend: no session")

// Thaw undoes Freeze when the handover was refused: everything runs again
// as before (each ring worker looks at its ring once, as after a kick, and
// a config change recorded while frozen is sent). It does nothing on a
// server that is not frozen.
func (s *Server) Thaw() {
	s.freezeMu.Lock()
	defer s.freezeMu.Unlock()
	s.thawLocked()
}

// thawLocked is Thaw. Precondition: freezeMu held.
func (s *Server) thawLocked() {
	s.mu.Lock()
	if !s.frozen {
		s.mu.Unlock()
		return
	}
	req, unlink := s.freezeReq, s.unlink
	s.mu.Unlock()
	s.ln.SetDeadline(time.Time{})
	s.ln.SetUnlinkOnClose(unlink)
	if req != nil {
		close(req.thaw)
	}
	s.mu.Lock()
	s.frozen, s.freezeReq = false, nil
	close(s.thawCh)
	s.mu.Unlock()
}

// waitThawed parks the caller (the accept loop with park, or an admit)
// while the server is frozen; it returns false once the server is closed.
func (s *Server) waitThawed(park bool) bool {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return false
		}
		if !s.frozen {
			s.mu.Unlock()
			return true
		}
		if park && !s.parked {
			s.parked = true
			close(s.parkedCh)
		}
		th := s.thawCh
		s.mu.Unlock()
		select {
		case <-th:
		case <-s.closedCh:
		}
	}
}

// shift adds off to every descriptor index of st (-1 stays).
func (st *SessionState) shift(off int) {
	sh := func(p *int) {
		if *p >= 0 {
			*p += off
		}
	}
	sh(&st.Conn)
	sh(&st.Backend)
	for i := range st.Regions {
		sh(&st.Regions[i].FD)
	}
	for i := range st.Rings {
		r := &st.Rings[i]
		sh(&r.Kick)
		sh(&r.Call)
		sh(&r.Err)
	}
}

// requestFreeze asks the session goroutine to freeze at the next message
// boundary; its answer comes on the request's result.
func (s *session) requestFreeze() *freezeRequest {
	req := &freezeRequest{result: make(chan frozenSession, 1), thaw: make(chan struct{})}
	s.pauseMu.Lock()
	s.freezeReq = req
	s.conn.Pause()
	s.pauseMu.Unlock()
	return req
}

// cancelFreeze withdraws req. When the session answered already it returns
// the answer and true: a successful one stands (the session is paused and
// waits for req.thaw).
func (s *session) cancelFreeze(req *freezeRequest) (frozenSession, bool) {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	select {
	case f := <-req.result:
		return f, true
	default:
	}
	if s.freezeReq == req {
		s.freezeReq = nil
		s.conn.Resume()
	}
	return frozenSession{}, false
}

// paused runs on the session goroutine when ReadMessage stopped for a
// pause: it freezes the session and answers the Freeze, then waits. It
// returns true when the session runs on (thawed, withdrawn or failed) and
// false when it must end (Disconnect or Close while frozen).
func (s *session) paused() bool {
	s.pauseMu.Lock()
	req := s.freezeReq
	s.pauseMu.Unlock()
	if req == nil {
		return true // withdrawn: cancelFreeze resumed the connection
	}
	st, fds, err := s.freeze()
	s.pauseMu.Lock()
	if s.freezeReq != req || err != nil {
		withdrawn := s.freezeReq != req
		if !withdrawn {
			s.freezeReq = nil
			s.conn.Resume()
			req.result <- frozenSession{err: err}
		}
		s.pauseMu.Unlock()
		if err == nil {
			closeFds(fds)
			s.thaw()
		}
		return true
	}
	req.result <- frozenSession{st: st, fds: fds}
	s.pauseMu.Unlock()
	select {
	case <-req.thaw:
		s.pauseMu.Lock()
		s.freezeReq = nil
		s.conn.Resume()
		s.pauseMu.Unlock()
		s.thaw()
		return true
	case <-s.kill:
		return false
	}
}

// freeze stops the backend channel's writers and the ring workers, and
// describes the session; on error it thaws what it froze. Precondition:
// session goroutine.
func (s *session) freeze() (*SessionState, []int, error) {
	s.backendMu.Lock()
	s.backendFrozen = true
	s.backendMu.Unlock()
	// A config change being written finishes first: the next process
	// must not find half a message on the channel.
	written := make(chan struct{})
	go func() { s.notifying.Wait(); close(written) }()
	select {
	case <-written:
	case <-s.kill:
		s.thaw()
		return nil, nil, errSessionEnded
	}
	for _, r := range s.rings {
		r.pause()
	}
	st, fds, err := s.describe()
	if err != nil {
		closeFds(fds)
		s.thaw()
		return nil, nil, err
	}
	return st, fds, nil
}

// thaw undoes freeze: the rings' workers run again and a config change
// recorded meanwhile is sent. Precondition: session goroutine.
func (s *session) thaw() {
	for _, r := range s.rings {
		r.resume()
	}
	s.backendMu.Lock()
	s.backendFrozen = false
	pending := s.configPending
	s.configPending = false
	s.backendMu.Unlock()
	if pending {
		// Not on the session goroutine: the write may block until the
		// front-end reads its channel (NotifyConfigChange).
		go func() {
			if err := s.NotifyConfigChange(); err != nil {
				s.log.WithError(err).Warn("config change recorded while frozen: not sent")
			}
		}()
	}
}

// describe is the state of a frozen session with dups of its descriptors.
// On error it returns the dups made so far for the caller to close.
// Precondition: session goroutine, rings paused, backend frozen.
func (s *session) describe() (*SessionState, []int, error) {
	if s.logBase != nil || s.features&virtio.FeatureLogAll != 0 || s.xfer != nil {
		// The next process would neither mark the pages QEMU still
		// copies nor finish the transfer: the guest's memory at the
		// destination would be stale. Refused; the migration goes on.
		return nil, nil, fmt.Errorf("backend: freeze: %w: a migration is under way (dirty log or device-state transfer)", ErrMigrating)
	}
	var fds []int
	add := func(fd int, err error) (int, error) {
		if err != nil {
			return -1, err
		}
		fds = append(fds, fd)
		return len(fds) - 1, nil
	}
	st := &SessionState{
		Backend:     -1,
		Features:    s.features,
		Protocol:    s.protocol,
		ProtocolSet: s.protocolSet,
		Owner:       s.owner,
		Status:      s.status,
		Resumed:     s.resumed.Load(),
	}
	var err error
	if st.Conn, err = add(dupSyscallConn(s.conn.UnixConn())); err != nil {
		return nil, fds, fmt.Errorf("backend: freeze: connection: %w", err)
	}
	s.backendMu.Lock()
	bc := s.backendConn
	st.ConfigChangePending = s.configPending
	s.backendMu.Unlock()
	if bc != nil {
		if st.Backend, err = add(dupSyscallConn(bc.UnixConn())); err != nil {
			return nil, fds, fmt.Errorf("backend: freeze: backend channel: %w", err)
		}
	}
	t := s.mem.Acquire()
	defer t.Release()
	for i, spec := range t.Regions() {
		fd, err := add(t.Region(i).DupFd())
		if err != nil {
			return nil, fds, fmt.Errorf("backend: freeze: region %d: %w", i, err)
		}
		st.Regions = append(st.Regions, RegionState{
			GuestAddr: uint64(spec.GuestAddr), Size: spec.Size, UserAddr: uint64(spec.UserAddr),
			MmapOffset: spec.MmapOffset, FD: fd,
		})
	}
	st.Rings = make([]RingState, len(s.rings))
	for i, r := range s.rings {
		rs := &st.Rings[i]
		*rs = RingState{
			Num: r.num, Desc: uint64(r.desc), Avail: uint64(r.avail), Used: uint64(r.used), AddrSet: r.addrSet,
			Base: r.base, BaseOurs: r.ours, Started: r.started, Enabled: r.enabled.Load(),
			LastAvail: r.base, Kick: -1, Call: -1, Err: -1,
		}
		if err := r.broken(); err != nil {
			msg := err.Error()
			if len(msg) > maxBrokenLen {
				msg = msg[:maxBrokenLen]
			}
			if msg == "" {
				msg = "broken"
			}
			rs.Broken = msg
		}
		r.q.mu.Lock()
		if vq := r.q.vq; vq != nil {
			rs.LastAvail, rs.UsedIdx = vq.LastAvail(), vq.UsedIdx()
		}
		call, errfd := r.call, r.errfd
		r.q.mu.Unlock()
		for _, e := range []struct {
			e   *eventfd.EventFD
			idx *int
		}{{r.kick, &rs.Kick}, {call, &rs.Call}, {errfd, &rs.Err}} {
			if e.e == nil {
				continue
			}
			if *e.idx, err = add(dupFd(e.e.Fd())); err != nil {
				return nil, fds, fmt.Errorf("backend: freeze: ring %d: %w", i, err)
			}
		}
	}
	return st, fds, nil
}

// ErrMigrating refuses a handover of a session whose front-end is
// migrating the guest (dirty logging on, or its device state moving).
var ErrMigrating = errors.New("session is migrating")

// dupFd duplicates fd (close-on-exec).
func dupFd(fd int) (int, error) {
	if fd < 0 {
		return -1, fmt.Errorf("dup: bad fd %d", fd)
	}
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("dup: %w", err)
	}
	return d, nil
}

// dupSyscallConn duplicates the descriptor of a socket (close-on-exec).
func dupSyscallConn(c syscall.Conn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(u uintptr) { fd, derr = dupFd(int(u)) }); err != nil {
		return -1, err
	}
	return fd, derr
}

// closeFds closes every fd of fds.
func closeFds(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}
