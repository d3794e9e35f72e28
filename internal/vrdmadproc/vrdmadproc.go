package vrdmadproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vrdma/vrdma/internal/controlapi"
)

// Defaults for the zero values of Config.
const (
	DefaultLogLevel     = "info"
	DefaultLogLimit     = 4 << 20
	DefaultReadyTimeout = 10 * time.Second
	DefaultStopTimeout  = 10 * time.Second
)

const (
	// pollInterval is the pause between two probes of the control API.
	pollInterval = 20 * time.Millisecond
	// requestTimeout bounds one control-API request of Client.
	requestTimeout = 5 * time.Second
	// waitDelay bounds how long Wait keeps reading standard error once
	// vrdmad has exited (a descendant may still hold the pipe).
	waitDelay = 5 * time.Second
)

var (
	// ErrNotReady means the control API did not answer within
	// Config.ReadyTimeout.
	ErrNotReady = errors.New("control socket did not answer")
	// ErrExited means vrdmad exited before it was ready, or exited with a
	// failure status after SIGTERM.
	ErrExited = errors.New("exited")
	// ErrStopTimeout means vrdmad was still running Config.StopTimeout
	// after SIGTERM and was killed.
	ErrStopTimeout = errors.New("did not exit after SIGTERM; killed")
)

// Error is a failed start or stop, with vrdmad's log up to that point.
// errors.Is matches Err and what it wraps (ErrNotReady, ErrExited,
// ErrStopTimeout, a context error).
type Error struct {
	Op  string // "start", "stop" or "kill"
	Err error
	Log string // vrdmad's standard error
}

func (e *Error) Error() string {
	s := "vrdmad " + e.Op + ": " + e.Err.Error()
	if e.Log != "" {
		s += "\n=== vrdmad log ===\n" + e.Log
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// Config says how to run vrdmad.
type Config struct {
	// Binary is the vrdmad executable. Required.
	Binary string
	// Dir holds the control socket (control.sock) and the sockets of
	// Devices (ID.sock). Empty: Start makes a temporary directory and
	// Stop removes it; a directory given here is left in place.
	Dir string
	// Control is the control socket's path; empty means Dir/control.sock.
	Control string
	// Devices are served from the start: each adds --socket ID=Dir/ID.sock.
	// An ID is not empty and has no '=' or '/'.
	Devices []string
	// StateDir is vrdmad's --state-dir, where it keeps the devices added
	// through the control API. Empty means Dir/state: a harness's vrdmad
	// never touches the host's /var/lib/vrdma, whose lock would also keep
	// two of them from running at once. NoState means none (--state-dir
	// ""). Ignored when Args hold a --state-dir of their own, and for a
	// vrdmad that has no such flag (older builds keep no state).
	StateDir string
	// Args are further vrdmad arguments, after the ones above.
	Args []string
	// NetNS, when set, runs vrdmad in that named network namespace
	// (through `ip netns exec`, which execs vrdmad in place: the pid,
	// signals and Pdeathsig are vrdmad's). Its sockets are paths, which
	// every namespace reaches.
	NetNS string
	// Env are variables added to vrdmad's environment ("KEY=VALUE").
	Env []string
	// LogLevel is vrdmad's --log-level; empty means DefaultLogLevel.
	LogLevel string
	// LogLimit bounds the log kept, in bytes; what comes beyond it is
	// counted, not kept. Zero means DefaultLogLimit.
	LogLimit int
	// ReadyTimeout bounds the wait for the control API; zero means
	// DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// StopTimeout is how long Stop waits after SIGTERM before it kills
	// vrdmad; zero means DefaultStopTimeout.
	StopTimeout time.Duration
}

// NoState is the Config.StateDir that keeps no state (--state-dir "").
const NoState = "-"

// Proc is a running vrdmad started by Start.
type Proc struct {
	cmd          *exec.Cmd          // immutable after Start
	dir          string             // immutable
	ownDir       bool               // immutable: Stop and Kill remove dir
	control      string             // immutable
	sockets      map[string]string  // immutable: device ID -> socket path
	client       *controlapi.Client // immutable; safe for concurrent use
	log          *logBuffer         // has its own mutex
	readyTimeout time.Duration      // immutable
	stopTimeout  time.Duration      // immutable

	exited  chan struct{} // closed once cmd.Wait has returned
	logDone chan struct{} // closed once standard error's writers are all gone
	waitErr error         // written before exited is closed, read after

	stopOnce sync.Once
	stopErr  error // written inside stopOnce

	// adopted is the pid of the vrdmad that took over from the child
	// through a live upgrade (Upgrade), 0 before: Stop and Kill end it.
	adopted atomic.Int64
}

// Start runs vrdmad as cfg says and returns once its control API answers
// GET /v1/devices. ctx bounds only that wait: vrdmad keeps running until
// Stop. When vrdmad exits first, does not answer within cfg.ReadyTimeout,
// or ctx ends, Start stops it and returns an *Error with the log.
func Start(ctx context.Context, cfg Config) (*Proc, error) {
	p, err := launch(cfg)
	if err != nil {
		return nil, err
	}
	if err := p.waitReady(ctx, p.readyTimeout); err != nil {
		p.Stop() // err says what went wrong; the log has the rest
		return nil, &Error{Op: "start", Err: err, Log: p.log.String()}
	}
	return p, nil
}

// launch checks cfg and starts the process, without waiting for it.
func launch(cfg Config) (*Proc, error) {
	if cfg.Binary == "" {
		return nil, errors.New("vrdmadproc: Config.Binary is empty")
	}
	seen := make(map[string]bool, len(cfg.Devices))
	for _, id := range cfg.Devices {
		if id == "" || strings.ContainsAny(id, "=/") || seen[id] {
			return nil, fmt.Errorf("vrdmadproc: device ID %q: want unique, non-empty, without '=' or '/'", id)
		}
		seen[id] = true
	}
	level := cfg.LogLevel
	if level == "" {
		level = DefaultLogLevel
	}
	limit := cfg.LogLimit
	if limit <= 0 {
		limit = DefaultLogLimit
	}
	p := &Proc{dir: cfg.Dir, sockets: make(map[string]string, len(cfg.Devices)),
		log: &logBuffer{limit: limit}, readyTimeout: cfg.ReadyTimeout, stopTimeout: cfg.StopTimeout,
		exited: make(chan struct{}), logDone: make(chan struct{})}
	if p.readyTimeout <= 0 {
		p.readyTimeout = DefaultReadyTimeout
	}
	if p.stopTimeout <= 0 {
		p.stopTimeout = DefaultStopTimeout
	}
	if p.dir == "" {
		dir, err := os.MkdirTemp("", "vrdmad-")
		if err != nil {
			return nil, fmt.Errorf("vrdmadproc: %w", err)
		}
		p.dir, p.ownDir = dir, true
	}
	p.control = cfg.Control
	if p.control == "" {
		p.control = filepath.Join(p.dir, "control.sock")
	}
	p.client = controlapi.New(p.control, controlapi.WithTimeout(requestTimeout))
	args := []string{"--control", p.control, "--log-level", level}
	for _, id := range cfg.Devices {
		p.sockets[id] = filepath.Join(p.dir, id+".sock")
		args = append(args, "--socket", id+"="+p.sockets[id])
	}
	if !hasFlag(cfg.Args, "state-dir") && knowsFlag(cfg.Binary, "state-dir") {
		switch cfg.StateDir {
		case "":
			args = append(args, "--state-dir", filepath.Join(p.dir, "state"))
		case NoState:
			args = append(args, "--state-dir", "")
		default:
			args = append(args, "--state-dir", cfg.StateDir)
		}
	}
	args = append(args, cfg.Args...)

	p.cmd = exec.Command(cfg.Binary, args...)
	if cfg.NetNS != "" {
		ip, err := exec.LookPath("ip")
		if err != nil {
			if p.ownDir {
				os.RemoveAll(p.dir)
			}
			return nil, &Error{Op: "start", Err: fmt.Errorf("NetNS %s: %w", cfg.NetNS, err)}
		}
		p.cmd = exec.Command(ip, append([]string{"netns", "exec", cfg.NetNS, cfg.Binary}, args...)...)
	}
	// Standard error through a pipe this side reads itself rather than
	// through exec's copying: a live upgrade's new vrdmad (Upgrade)
	// inherits the pipe and writes to it after this child has exited, so
	// the reading end must stay open until every writer is gone (exec
	// closes its own after WaitDelay, and a vrdmad writing to a closed
	// pipe would die of SIGPIPE).
	logR, logW, err := os.Pipe()
	if err != nil {
		if p.ownDir {
			os.RemoveAll(p.dir)
		}
		return nil, &Error{Op: "start", Err: err}
	}
	if len(cfg.Env) > 0 {
		p.cmd.Env = append(os.Environ(), cfg.Env...)
	}
	p.cmd.Stderr = logW
	p.cmd.WaitDelay = waitDelay
	// Its own process group keeps terminal signals (^C) away from it: the
	// caller stops it (Stop, Kill), after what depends on it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	// Pdeathsig fires when the forking thread ends, not the process: a
	// goroutine locked to its thread forks vrdmad and waits for it, so
	// that thread lives exactly as long as vrdmad. (A thread the runtime
	// hands to another goroutine may end under it: one that leaves a
	// locked network namespace switch, netlab's Do, does.)
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := p.cmd.Start()
		logW.Close()
		if err != nil {
			logR.Close()
			started <- err
			return
		}
		go func() {
			defer close(p.logDone)
			io.Copy(p.log, logR)
			logR.Close()
		}()
		started <- nil
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	if err := <-started; err != nil {
		if p.ownDir {
			os.RemoveAll(p.dir)
		}
		return nil, &Error{Op: "start", Err: err}
	}
	return p, nil
}

// hasFlag reports whether args hold the flag name ("-name", "--name",
// either with "=value").
func hasFlag(args []string, name string) bool {
	for _, a := range args {
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

// flagCache holds what knowsFlag learnt: flagKey -> bool.
var flagCache sync.Map

type flagKey struct {
	path, name string
	mtime      time.Time
	size       int64
}

// maxBinary bounds the bytes knowsFlag reads.
const maxBinary = 256 << 20

// knowsFlag reports whether binary knows the flag name: whether the name
// is in the file (Go's flag package keeps flag names as strings in the
// binary). A vrdmad older than --state-dir has none, and would refuse it.
// Reading, not running, the binary: a test's stand-in script may not
// answer --help. The answer is cached per binary, size and modification
// time.
func knowsFlag(binary, name string) bool {
	fi, err := os.Stat(binary)
	if err != nil {
		return false
	}
	key := flagKey{binary, name, fi.ModTime(), fi.Size()}
	if v, ok := flagCache.Load(key); ok {
		return v.(bool)
	}
	f, err := os.Open(binary)
	if err != nil {
		return false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxBinary))
	if err != nil {
		return false
	}
	known := bytes.Contains(b, []byte(name))
	flagCache.Store(key, known)
	return known
}

// waitReady polls the control API until it answers, vrdmad exits, timeout
// passes or ctx ends.
func (p *Proc) waitReady(ctx context.Context, timeout time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		_, err := p.client.Devices(wctx)
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%w before its control socket answered", exitError(p.waitErr))
		case <-wctx.Done():
			if cerr := ctx.Err(); cerr != nil {
				return fmt.Errorf("wait for the control socket: %w", cerr)
			}
			return fmt.Errorf("%w within %v (last: %v)", ErrNotReady, timeout, err)
		case <-tick.C:
		}
	}
}

// exitError describes how cmd.Wait ended as an ErrExited.
func exitError(err error) error {
	if err == nil {
		return fmt.Errorf("%w with status 0", ErrExited)
	}
	return fmt.Errorf("%w with %w", ErrExited, err)
}

// Stop sends vrdmad SIGTERM and waits for it to exit, killing it after
// Config.StopTimeout; then it removes the directory Start made. It
// returns nil for an exit with status 0, else an *Error (ErrExited,
// ErrStopTimeout) with the log. Later calls return the first result.
func (p *Proc) Stop() error {
	p.stopOnce.Do(func() {
		p.stopErr = p.terminate()
		p.release()
	})
	return p.stopErr
}

// Kill ends vrdmad with SIGKILL, as a crash would (its sockets stay
// behind), waits for it and removes the directory Start made. It returns
// nil when SIGKILL ended it, else an *Error (ErrExited: it had exited
// already). Kill and Stop end the process once: a later call of either
// returns the first result.
func (p *Proc) Kill() error {
	p.stopOnce.Do(func() {
		if pid := p.adopted.Load(); pid != 0 {
			p.stopErr = p.endAdopted(int(pid), syscall.SIGKILL)
			p.release()
			return
		}
		_ = p.cmd.Process.Kill()
		<-p.exited
		var ee *exec.ExitError
		if errors.As(p.waitErr, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
				p.release()
				return
			}
		}
		p.stopErr = &Error{Op: "kill", Err: exitError(p.waitErr), Log: p.log.String()}
		p.release()
	})
	return p.stopErr
}

// release frees what the process left to this side, once it has exited.
func (p *Proc) release() {
	select {
	case <-p.logDone:
	case <-time.After(waitDelay):
	}
	p.client.CloseIdleConnections()
	if p.ownDir {
		os.RemoveAll(p.dir)
	}
}

func (p *Proc) terminate() error {
	if pid := p.adopted.Load(); pid != 0 {
		return p.endAdopted(int(pid), syscall.SIGTERM)
	}
	// An error here means vrdmad has exited already; Wait tells how.
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(p.stopTimeout)
	defer t.Stop()
	select {
	case <-p.exited:
		if p.waitErr != nil {
			return &Error{Op: "stop", Err: exitError(p.waitErr), Log: p.log.String()}
		}
		return nil
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.exited
		return &Error{Op: "stop", Err: fmt.Errorf("%w within %v", ErrStopTimeout, p.stopTimeout), Log: p.log.String()}
	}
}

// Dir is the directory of the sockets.
func (p *Proc) Dir() string { return p.dir }

// Control is the control socket's path.
func (p *Proc) Control() string { return p.control }

// Socket is the vhost-user socket of a device named in Config.Devices, or
// "" for another ID.
func (p *Proc) Socket(id string) string { return p.sockets[id] }

// Log is what vrdmad wrote to standard error so far (all of it once Stop
// has returned), up to Config.LogLimit bytes.
func (p *Proc) Log() string { return p.log.String() }

// Client is the control API's client, with a 5 s timeout per request.
// It is shared and safe for concurrent use.
func (p *Proc) Client() *controlapi.Client { return p.client }

// Devices lists the daemon's devices (GET /v1/devices).
func (p *Proc) Devices() ([]controlapi.DeviceInfo, error) {
	return p.client.Devices(context.Background())
}

// AddDevice creates a device through the control API (POST /v1/devices)
// and returns it as the daemon shows it. A refusal is a
// *controlapi.StatusError carrying the daemon's message. The device's
// socket is the caller's to choose; Dir is a good place (Stop removes a
// directory Start made).
func (p *Proc) AddDevice(ctx context.Context, req controlapi.AddRequest) (controlapi.DeviceInfo, error) {
	info, err := p.client.AddDevice(ctx, req)
	if err != nil {
		return controlapi.DeviceInfo{}, fmt.Errorf("add device %s: %w", req.ID, err)
	}
	return info, nil
}

// UnixClient is an HTTP client whose every connection goes to the unix
// socket path (the control API's, or a --metrics unix: socket's), with a
// 5 s timeout.
//
// Deprecated: use controlapi.New for the control API and
// controlapi.HTTPClient for another unix socket.
func UnixClient(path string) *http.Client { return controlapi.HTTPClient(path, requestTimeout) }

// logBuffer keeps the first limit bytes written to it and counts the rest.
type logBuffer struct {
	limit   int // immutable
	mu      sync.Mutex
	b       []byte // protected by mu
	dropped int64  // protected by mu
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := min(max(l.limit-len(l.b), 0), len(p))
	l.b = append(l.b, p[:n]...)
	l.dropped += int64(len(p) - n)
	return len(p), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dropped == 0 {
		return string(l.b)
	}
	s := string(l.b)
	if !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	return s + fmt.Sprintf("[%d more bytes of the log dropped]\n", l.dropped)
}
