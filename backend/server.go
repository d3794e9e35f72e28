package backend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// Config describes one device socket.
type Config struct {
	// Socket is the path of the unix socket QEMU connects to. A stale
	// socket file (nobody listening) is replaced; a live one is an error.
	Socket string
	// Device is the device served on the socket; it lives as long as the
	// server and is Reset between front-ends.
	Device Device
	// Mode is the socket file's permission; zero means 0600.
	Mode os.FileMode
	// Owner, when set, owns the socket file (QEMU's user and group, e.g.
	// libvirt-qemu:kvm); nil keeps the daemon's.
	Owner *Owner
	// AllowUIDs, when not empty, lists the peer uids (SO_PEERCRED) that may
	// connect; any other front-end is refused at once.
	AllowUIDs []uint32
}

// Owner is a socket file's owner; -1 leaves that id unchanged.
type Owner struct{ UID, GID int }

// Option configures a Server.
type Option func(*Server)

// WithLogger sets the logger; the default discards.
func WithLogger(l *logrus.Entry) Option { return func(s *Server) { s.log = l } }

// Stats are a server's counters; all fields are atomic.
type Stats struct {
	sessions       atomic.Uint64
	refused        atomic.Uint64
	messages       atomic.Uint64
	protocolErrors atomic.Uint64
	ringErrors     atomic.Uint64
	interrupts     atomic.Uint64
	memTables      atomic.Uint64
}

// StatsSnapshot is a copy of Stats.
type StatsSnapshot struct {
	Sessions       uint64 `json:"sessions"`
	Refused        uint64 `json:"refused"`
	Messages       uint64 `json:"messages"`
	ProtocolErrors uint64 `json:"protocol_errors"`
	RingErrors     uint64 `json:"ring_errors"`
	Interrupts     uint64 `json:"interrupts"`
	MemTables      uint64 `json:"mem_tables"`
}

// Server listens on one device socket and serves one front-end at a time.
type Server struct {
	cfg Config            // immutable
	log *logrus.Entry     // immutable
	ln  *net.UnixListener // immutable once Listen or FromListener returns

	stats Stats // atomic counters

	mu       sync.Mutex     // taken with no other lock held but freezeMu (doc.go)
	active   *session       // protected by mu
	peer     Peer           // protected by mu; active's front-end
	closed   bool           // protected by mu
	closedCh chan struct{}  // immutable; closed by Close
	wg       sync.WaitGroup // counts admit goroutines (and so sessions)
	unlink   bool           // protected by mu; Close removes the socket file (Listen made it)

	// Freezing (handover.go). freezeMu serialises Freeze and Thaw.
	freezeMu  sync.Mutex
	frozen    bool           // protected by mu; between Freeze and Thaw
	thawCh    chan struct{}  // protected by mu; closed by Thaw: parked goroutines go on
	serving   bool           // protected by mu; Serve's accept loop runs
	parked    bool           // protected by mu; the accept loop is parked for the current Freeze
	parkedCh  chan struct{}  // protected by mu; closed when the accept loop parks
	freezeReq *freezeRequest // protected by mu; the frozen session's request, nil when none
	pending   *session       // protected by mu; an adopted session that Serve has not started
}

// newServer is a Server for cfg with its options applied and its logger
// set (silent when no WithLogger).
func newServer(cfg Config, opts []Option) *Server {
	s := &Server{cfg: cfg, closedCh: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	if s.log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		s.log = logrus.NewEntry(l)
	}
	s.log = s.log.WithField("socket", cfg.Socket)
	return s
}

// Listen creates the device socket.
func Listen(cfg Config, opts ...Option) (*Server, error) {
	if cfg.Socket == "" || cfg.Device == nil {
		return nil, errors.New("backend: socket path and device are required")
	}
	s := newServer(cfg, opts)
	if err := removeStale(cfg.Socket); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.Socket, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("backend: listen: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	mode := cfg.Mode
	if mode == 0 {
		mode = 0o600
	}
	if err := os.Chmod(cfg.Socket, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("backend: chmod socket: %w", err)
	}
	if o := cfg.Owner; o != nil {
		if err := os.Lchown(cfg.Socket, o.UID, o.GID); err != nil {
			ln.Close()
			return nil, fmt.Errorf("backend: chown socket: %w", err)
		}
	}
	s.ln = ln
	s.unlink = true
	return s, nil
}

// removeStale removes a socket file nobody listens on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("backend: %w", err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("backend: %s exists and is not a socket", path)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return fmt.Errorf("backend: %s is in use by another listener", path)
	}
	return os.Remove(path)
}

// Socket is the path served.
func (s *Server) Socket() string { return s.cfg.Socket }

// Device is the device served.
func (s *Server) Device() Device { return s.cfg.Device }

// Connected reports whether a front-end is connected.
func (s *Server) Connected() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active != nil
}

// Peer is a connected front-end: the process that connected (SO_PEERCRED,
// as it was at connect time) and when.
type Peer struct {
	// PID, UID and GID are the front-end's (QEMU's); all zero when the
	// kernel did not tell (Known false).
	PID      int32
	UID, GID uint32
	Known    bool
	// Since is when its session started.
	Since time.Time
}

// Peer returns the connected front-end, and false when none is.
func (s *Server) Peer() (Peer, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peer, s.active != nil
}

// peerOf is cred as a Peer (cred nil: unknown).
func peerOf(cred *unix.Ucred, since time.Time) Peer {
	if cred == nil {
		return Peer{Since: since}
	}
	return Peer{PID: cred.Pid, UID: cred.Uid, GID: cred.Gid, Known: true, Since: since}
}

// Stats returns a copy of the counters.
func (s *Server) Stats() StatsSnapshot {
	return StatsSnapshot{
		Sessions:       s.stats.sessions.Load(),
		Refused:        s.stats.refused.Load(),
		Messages:       s.stats.messages.Load(),
		ProtocolErrors: s.stats.protocolErrors.Load(),
		RingErrors:     s.stats.ringErrors.Load(),
		Interrupts:     s.stats.interrupts.Load(),
		MemTables:      s.stats.memTables.Load(),
	}
}

// Serve accepts front-ends until ctx ends or Close. A second front-end
// while one is connected is refused: its connection is closed before any
// answer (a vhost-user back-end has no way to say why; QEMU reports the
// closed connection, a Go front-end ErrRefused) and the refusal is logged
// at warn level with both front-ends' pids.
//
// On an adopted server (Adopt) it first starts the adopted session: its
// ring workers (each looks at its ring once: doorbells are not lost) and
// its message loop, as if the session had been there from the beginning.
// While the server is frozen the loop accepts nothing.
func (s *Server) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	s.mu.Lock()
	s.serving = true
	if sess := s.pending; sess != nil && !s.closed {
		s.pending = nil
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.runSession(sess, sess.log, sess.runAdopted)
		}()
	}
	s.mu.Unlock()
	var pause time.Duration // after EMFILE/ENFILE: doubles to a second, reset by an accept
	for {
		if !s.waitThawed(true) {
			s.wg.Wait()
			return nil
		}
		c, err := s.ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				s.wg.Wait()
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
				// Out of descriptors: the pending connection stays in the
				// backlog; try again after a pause (as net/http does)
				// rather than spinning on a core until one frees.
				pause = min(max(2*pause, 5*time.Millisecond), time.Second)
				s.log.WithError(err).Warnf("accept: retrying in %v", pause)
				select {
				case <-ctx.Done():
				case <-time.After(pause):
				}
				continue
			}
			return fmt.Errorf("backend: accept: %w", err)
		}
		pause = 0
		s.wg.Add(1)
		go s.admit(c)
	}
}

// handoverWait is how long a new front-end waits for the previous one's
// session to finish its teardown (a reconnecting QEMU arrives while the
// back-end is still releasing the old connection's resources). A second
// front-end on a device that stays connected is refused after it.
const handoverWait = 2 * time.Second

// PeerCredentials are the pid, uid and gid of the process that connected
// c (SO_PEERCRED: as they were when it called connect).
func PeerCredentials(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	return cred, nil
}

// peerAllowed checks the connecting process's uid (cred, nil when it
// could not be read) against Config.AllowUIDs.
func (s *Server) peerAllowed(cred *unix.Ucred, credErr error) error {
	if len(s.cfg.AllowUIDs) == 0 {
		return nil
	}
	if credErr != nil {
		return credErr
	}
	for _, u := range s.cfg.AllowUIDs {
		if cred.Uid == u {
			return nil
		}
	}
	return fmt.Errorf("peer uid %d (pid %d) is not allowed", cred.Uid, cred.Pid)
}

// admit serves c once no other session is active, or refuses it. Every
// outcome is logged with the peer's pid and uid: which QEMU held the
// device, and when.
func (s *Server) admit(c *net.UnixConn) {
	defer s.wg.Done()
	cred, credErr := PeerCredentials(c)
	log := s.log
	if credErr == nil {
		log = log.WithFields(logrus.Fields{"pid": cred.Pid, "uid": cred.Uid, "gid": cred.Gid})
	} else {
		log = log.WithField("peer_error", credErr.Error())
	}
	if err := s.peerAllowed(cred, credErr); err != nil {
		s.stats.refused.Add(1)
		log.WithError(err).Warn("refused a front-end")
		c.Close()
		return
	}
	deadline := time.NewTimer(handoverWait)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		if s.frozen {
			// Accepted just before a Freeze: wait for Thaw (after a
			// handover this process exits, and the front-end sees its
			// connection closed, as a refusal).
			s.mu.Unlock()
			s.waitThawed(false)
			continue
		}
		prev := s.active
		if prev == nil {
			break // with s.mu held
		}
		s.mu.Unlock()
		select {
		case <-prev.done:
			continue
		case <-deadline.C:
		}
		s.mu.Lock()
		if !s.closed && s.active == nil {
			break // it left just now: take its place (with s.mu held)
		}
		holder, closed := s.peer, s.closed
		s.mu.Unlock()
		if !closed {
			s.stats.refused.Add(1)
			l := log
			if holder.Known {
				l = l.WithFields(logrus.Fields{"holder_pid": holder.PID, "holder_uid": holder.UID})
			}
			l.Warnf("refused a second front-end: the device is connected to another one (pid %d, since %s); "+
				"disconnect that one first (vrdmactl device show names it)", holder.PID, holder.Since.Format(time.RFC3339))
		}
		c.Close()
		return
	}
	log = log.WithField("session", s.stats.sessions.Add(1))
	sess := newSession(c, s.cfg.Device, log, &s.stats)
	s.active = sess
	s.peer = peerOf(cred, time.Now())
	s.mu.Unlock()
	log.Info("front-end connected")
	s.runSession(sess, log, sess.serve)
}

// runSession runs a session's goroutine (run: serve, or runAdopted) and
// clears the server's record of it when it has released everything.
func (s *Server) runSession(sess *session, log *logrus.Entry, run func() error) {
	if err := run(); err != nil {
		log.WithError(err).Warn("front-end disconnected: session ended with an error")
	} else {
		log.Info("front-end disconnected")
	}
	s.endSession(sess)
}

// endSession forgets sess, which has released everything.
func (s *Server) endSession(sess *session) {
	s.mu.Lock()
	s.active = nil
	s.peer = Peer{}
	s.mu.Unlock()
	close(sess.done)
}

// Disconnect closes the current front-end's connection, if any; its
// session releases everything it owned. On a frozen server the session,
// paused, ends as well (see Freeze); on an adopted server before Serve the
// session is torn down at once.
func (s *Server) Disconnect() {
	s.mu.Lock()
	sess, pending := s.active, s.pending
	s.pending = nil
	s.mu.Unlock()
	if pending != nil {
		pending.teardown()
		s.endSession(pending)
		return
	}
	if sess != nil {
		sess.end()
	}
}

// Close stops listening, ends the current session, waits for it to release
// everything, and removes the socket file (not while frozen: see Freeze).
// It is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closedCh)
	s.mu.Unlock()
	err := s.ln.Close()
	s.Disconnect()
	s.wg.Wait()
	return err
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
