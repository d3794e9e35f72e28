package netlab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// DefaultPrefix is the prefix of the namespace names of a Lab whose
// Config.Prefix is empty.
const DefaultPrefix = "vrdmalab"

const (
	// netnsDir is where iproute2 keeps the bind mounts of named
	// namespaces (ip netns add).
	netnsDir = "/run/netns"
	// cmdTimeout bounds one ip command.
	cmdTimeout = 30 * time.Second
	// maxStderr bounds the standard error kept in a CmdError.
	maxStderr = 4 << 10
	// maxLabel bounds a namespace label; maxIfName is IFNAMSIZ-1.
	maxLabel  = 16
	maxIfName = 15
)

// Errors of the package; the typed errors below match them with errors.Is.
var (
	// ErrCommand: an ip command (or another program the lab runs) failed.
	ErrCommand = errors.New("netlab: command failed")
	// ErrAddress: an address or prefix outside 10.200.0.0/16 and
	// fd00:7672::/32.
	ErrAddress = errors.New("netlab: address outside the lab's ranges")
	// ErrName: a label, prefix or interface name the lab does not accept.
	ErrName = errors.New("netlab: bad name")
	// ErrClosed: the Lab was closed.
	ErrClosed = errors.New("netlab: lab closed")
	// ErrUnavailable: not root, or iproute2's ip is missing.
	ErrUnavailable = errors.New("netlab: unavailable")
)

// CmdError is a failed command: its full command line, its standard error
// (trimmed, at most 4 KiB) and the error exec returned.
type CmdError struct {
	Args   []string
	Stderr string
	Err    error
}

func (e *CmdError) Error() string {
	s := fmt.Sprintf("%s: %v", strings.Join(e.Args, " "), e.Err)
	if e.Stderr != "" {
		s += ": " + e.Stderr
	}
	return s
}

func (e *CmdError) Unwrap() error        { return e.Err }
func (e *CmdError) Is(target error) bool { return target == ErrCommand }

// Config configures a Lab.
type Config struct {
	// Prefix starts every namespace name, as Prefix-<pid>-<seq>-<label>;
	// lower-case letters and digits. Empty means DefaultPrefix.
	Prefix string
	// Logger gets one debug line per command; nil discards.
	Logger *logrus.Entry
}

// Lab owns the namespaces it created and removes them in Close. Everything
// else it makes (veths, bridges, taps, TUNs, addresses, routes, rules) lives
// inside those namespaces and goes with them; nothing is created in the
// caller's namespace except the names under /run/netns.
type Lab struct {
	prefix string        // immutable
	log    *logrus.Entry // immutable
	ipPath string        // immutable

	// ctx is canceled by Close: commands from NS.Command are killed.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	nss    []*NS // protected by mu; in creation order
	closed bool  // protected by mu

	closeOnce sync.Once
	closeErr  error // written once in closeOnce
}

// NS is one network namespace of a Lab.
type NS struct {
	lab *Lab
	// Name is the namespace's name, as `ip netns list` shows it; immutable.
	Name string
	// Label is the short name given to AddNS; immutable.
	Label string
}

// nsSeq numbers the namespaces of this process, so names are unique even
// across Labs with the same prefix.
var nsSeq atomic.Uint64

// IPPath returns the path of iproute2's ip, or an error wrapping
// ErrUnavailable.
func IPPath() (string, error) {
	if p, err := exec.LookPath("ip"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"} {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: iproute2's ip not found", ErrUnavailable)
}

// Available reports why a Lab cannot be built here (nil if it can): it
// needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's ip.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root (euid %d)", ErrUnavailable, os.Geteuid())
	}
	_, err := IPPath()
	return err
}

// New returns an empty Lab. Close removes what it made.
func New(cfg Config) (*Lab, error) {
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !isLowerAlnum(prefix, 32) {
		return nil, fmt.Errorf("%w: prefix %q (want 1-32 of [a-z0-9])", ErrName, prefix)
	}
	if err := Available(); err != nil {
		return nil, err
	}
	ipPath, _ := IPPath()
	log := cfg.Logger
	if log == nil {
		l := logrus.New()
		l.SetOutput(io.Discard)
		log = logrus.NewEntry(l)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Lab{prefix: prefix, log: log.WithField("lab", prefix), ipPath: ipPath,
		ctx: ctx, cancel: cancel}, nil
}

// AddNS creates a namespace labelled label (1-16 of [a-z0-9]) with its
// loopback up.
func (l *Lab) AddNS(label string) (*NS, error) {
	if !isLowerAlnum(label, maxLabel) {
		return nil, fmt.Errorf("%w: label %q (want 1-%d of [a-z0-9])", ErrName, label, maxLabel)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	name := fmt.Sprintf("%s-%d-%d-%s", l.prefix, os.Getpid(), nsSeq.Add(1), label)
	if _, err := l.run("netns", "add", name); err != nil {
		return nil, fmt.Errorf("add namespace %s: %w", label, err)
	}
	n := &NS{lab: l, Name: name, Label: label}
	l.nss = append(l.nss, n)
	if _, err := n.IP("link", "set", "dev", "lo", "up"); err != nil {
		return nil, fmt.Errorf("namespace %s: %w", label, err)
	}
	return n, nil
}

// Namespaces returns the names of the namespaces the Lab still owns.
func (l *Lab) Namespaces() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var names []string
	for _, n := range l.nss {
		names = append(names, n.Name)
	}
	return names
}

// Close kills the commands started with NS.Command and deletes the Lab's
// namespaces, newest first. It is idempotent; later calls return the first
// result. A namespace stays alive, unnamed, while something still holds it
// (an open TUN or socket made inside, a process that did not die): close
// those first (t.Cleanup runs in reverse order, so a hop made after the
// Lab is closed before it).
func (l *Lab) Close() error {
	l.closeOnce.Do(func() {
		l.cancel()
		l.mu.Lock()
		l.closed = true
		nss := l.nss
		l.nss = nil
		l.mu.Unlock()
		var errs []error
		for i := len(nss) - 1; i >= 0; i-- {
			if _, err := l.run("netns", "delete", nss[i].Name); err != nil {
				errs = append(errs, err)
			}
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// run runs ip with args and returns its standard output.
func (l *Lab) run(args ...string) (string, error) {
	return runIP(l.ipPath, l.log, args...)
}

func runIP(ipPath string, log *logrus.Entry, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, ipPath, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	err := cmd.Run()
	if log != nil {
		log.WithField("cmd", "ip "+strings.Join(args, " ")).Debug("netlab: ip")
	}
	if err != nil {
		se := strings.TrimSpace(stderr.String())
		if len(se) > maxStderr {
			se = se[:maxStderr]
		}
		return "", &CmdError{Args: append([]string{ipPath}, args...), Stderr: se, Err: err}
	}
	return stdout.String(), nil
}

// IP runs `ip -n <ns> args...` and returns its standard output. It is the
// raw escape hatch: unlike the typed helpers it checks no address range.
func (n *NS) IP(args ...string) (string, error) {
	return n.lab.run(append([]string{"-n", n.Name}, args...)...)
}

// Sweep deletes the namespaces named prefix-<pid>-… whose pid is not a
// live process: leftovers of runs that crashed before Close. Namespaces of
// live processes (this one included) are left alone. It returns the names
// it deleted. A recycled pid keeps its stale namespaces until that process
// ends too.
func Sweep(prefix string) ([]string, error) {
	if !isLowerAlnum(prefix, 32) {
		return nil, fmt.Errorf("%w: prefix %q", ErrName, prefix)
	}
	ipPath, err := IPPath()
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sweep: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		pid, ok := parsePid(prefix, e.Name())
		if !ok || pidAlive(pid) {
			continue
		}
		if _, err := runIP(ipPath, nil, "netns", "delete", e.Name()); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}

// parsePid returns the pid in a name prefix-<pid>-….
func parsePid(prefix, name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix+"-")
	if !ok {
		return 0, false
	}
	p, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(p)
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, true
}

// pidAlive: kill(pid, 0) succeeds or fails with EPERM.
func pidAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// nsPath is the bind mount of a named namespace.
func nsPath(name string) string { return filepath.Join(netnsDir, name) }

func isLowerAlnum(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// checkIfName accepts interface names as the kernel does (1-15 bytes, no
// '/', ':', whitespace or NUL, not "." or "..") minus '.', which a sysctl
// key would split.
func checkIfName(name string) error {
	if len(name) == 0 || len(name) > maxIfName || name == "." || name == ".." ||
		strings.ContainsAny(name, "/: \t\n.\x00") {
		return fmt.Errorf("%w: interface name %q", ErrName, name)
	}
	return nil
}
