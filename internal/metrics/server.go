package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/internal/version"
)

// Errors of Listen; a *ListenError matches one of them with errors.Is.
var (
	ErrInvalidAddr = errors.New("invalid metrics address")
	ErrAddrInUse   = errors.New("address in use")
)

// ListenError is why Listen could not listen on Addr.
type ListenError struct {
	Addr   string // the address as given
	Reason error  // ErrInvalidAddr, ErrAddrInUse, or nil for another failure
	Detail string // what is wrong, for the operator
	Err    error  // the underlying error, if any
}

func (e *ListenError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "metrics address %q", e.Addr)
	if e.Reason != nil {
		fmt.Fprintf(&b, ": %v", e.Reason)
	}
	if e.Detail != "" {
		fmt.Fprintf(&b, ": %s", e.Detail)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

// Is reports whether target is e's Reason.
func (e *ListenError) Is(target error) bool { return e.Reason != nil && target == e.Reason }

// Unwrap returns the underlying error.
func (e *ListenError) Unwrap() error { return e.Err }

// maxUnixPath is the longest unix socket path (sun_path less its NUL).
const maxUnixPath = 107

// ParseAddr splits a --metrics address into a network and an address for
// net.Listen: "unix:PATH" is a unix socket at PATH, anything else must be
// "host:port" with a numeric port (an empty host means every interface).
func ParseAddr(addr string) (network, address string, err error) {
	bad := func(detail string) (string, string, error) {
		return "", "", &ListenError{Addr: addr, Reason: ErrInvalidAddr, Detail: detail}
	}
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		switch {
		case path == "":
			return bad("empty unix socket path")
		case len(path) > maxUnixPath:
			return bad(fmt.Sprintf("unix socket path longer than %d bytes", maxUnixPath))
		case strings.IndexByte(path, 0) >= 0:
			return bad("NUL in unix socket path")
		}
		return "unix", path, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return bad("want host:port or unix:PATH")
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return bad(fmt.Sprintf("port %q is not a number from 0 to 65535", port))
	}
	if host != "" && strings.ContainsAny(host, "/ ") {
		return bad(fmt.Sprintf("host %q", host))
	}
	return "tcp", addr, nil
}

// Server serves /metrics.
type Server struct {
	ln   net.Listener  // immutable
	srv  *http.Server  // immutable
	log  *logrus.Entry // immutable
	done chan struct{} // closed when Serve returned
}

// Option configures Handler and Listen.
type Option func(*options)

type options struct {
	build BuildInfo
}

// WithVersion sets the version label of vrdma_build_info. Without it the
// label is internal/version's Version (linked in by scripts/deb.sh), or,
// for a build from a checkout, the main module's version from the
// binary's build information (set by go install MODULE@VERSION), else
// "devel". The revision label is internal/version's Revision.
func WithVersion(v string) Option {
	return func(o *options) { o.build.Version = v }
}

func buildOptions(opts []Option) options {
	o := options{build: BuildInfo{Version: version.Version, Revision: version.Revision()}}
	if bi, ok := debug.ReadBuildInfo(); ok && o.build.Version == "devel" {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			o.build.Version = v
		}
	}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Handler returns the /metrics handler for src: the Collector, plus the Go
// runtime and process collectors of this process.
func Handler(src Source, opts ...Option) (http.Handler, error) {
	o := buildOptions(opts)
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{
		NewCollector(src, o.build),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register collector: %w", err)
		}
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	}), nil
}

// Listen listens on addr (see ParseAddr) and serves src's metrics on
// /metrics until Close. A unix socket left by a process that is gone is
// replaced; one that a process still listens on is ErrAddrInUse, as is a
// TCP port in use. A nil log discards.
func Listen(addr string, src Source, log *logrus.Entry, opts ...Option) (*Server, error) {
	network, address, err := ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	if log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		log = logrus.NewEntry(l)
	}
	h, err := Handler(src, opts...)
	if err != nil {
		return nil, err
	}
	if network == "unix" {
		if err := removeStale(addr, address); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen(network, address)
	if err != nil {
		le := &ListenError{Addr: addr, Err: err}
		if errors.Is(err, syscall.EADDRINUSE) {
			le.Reason = ErrAddrInUse
			le.Detail = "another process listens there; stop it or choose another --metrics address"
		}
		return nil, le
	}
	if network == "unix" {
		// Readable by the socket's group, so that a scraper can be let in
		// with a group rather than root.
		if err := os.Chmod(address, 0o660); err != nil {
			ln.Close()
			return nil, &ListenError{Addr: addr, Detail: "chmod socket", Err: err}
		}
	}
	return serve(ln, addr, h, log), nil
}

// Serve serves src's metrics on ln, a listener a live upgrade's old
// vrdmad passed (its socket file is left as it is, also by Close).
func Serve(ln net.Listener, src Source, log *logrus.Entry, opts ...Option) (*Server, error) {
	if log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		log = logrus.NewEntry(l)
	}
	h, err := Handler(src, opts...)
	if err != nil {
		return nil, err
	}
	if ul, ok := ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	return serve(ln, ln.Addr().String(), h, log), nil
}

// serve serves h on ln until Close.
func serve(ln net.Listener, addr string, h http.Handler, log *logrus.Entry) *Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	s := &Server{
		ln:   ln,
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute},
		log:  log.WithField("metrics", addr),
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.WithError(err).Error("metrics server stopped")
		}
	}()
	s.log.Info("metrics serving")
	return s
}

// Listener is the socket the server accepts on.
func (s *Server) Listener() net.Listener { return s.ln }

// removeStale removes a unix socket at path that nobody listens on.
func removeStale(addr, path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return &ListenError{Addr: addr, Err: err}
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return &ListenError{Addr: addr, Reason: ErrInvalidAddr, Detail: "file exists and is not a socket"}
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return &ListenError{Addr: addr, Reason: ErrAddrInUse, Detail: "another process listens on this socket; stop it or choose another --metrics address"}
	}
	if err := os.Remove(path); err != nil {
		return &ListenError{Addr: addr, Detail: "remove stale socket", Err: err}
	}
	return nil
}

// Addr is the address listened on (with the port chosen for port 0).
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops serving, waiting up to two seconds for scrapes in progress;
// a unix socket is removed.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	<-s.done
	if errors.Is(err, context.DeadlineExceeded) {
		err = s.srv.Close()
	}
	return err
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
