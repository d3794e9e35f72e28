package guestvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/vmm/qemu"
)

// Defaults used when a Config field is left zero.
const (
	DefaultMemoryMiB = 512
	DefaultHugePages = 64
	DefaultName      = "guest"
)

const (
	// consoleID is the chardev of the protocol line (the guest's ttyS1).
	consoleID = "vrdmacon"
	// maxAppend is the x86 kernel's COMMAND_LINE_SIZE, less room to spare.
	maxAppend = 2000
	// maxSocketPath is what fits in sockaddr_un.sun_path.
	maxSocketPath = 107
	// exitGrace is how long Close lets a guest that printed VRDMA-EXIT
	// power off by itself before it kills QEMU.
	exitGrace = 5 * time.Second
)

var errGuestClosed = errors.New("guest closed")

// Config describes one guest.
type Config struct {
	// Name names the guest in errors and logs; empty means DefaultName.
	Name string
	// QEMU is the qemu-system-x86_64 binary (see qemu.FindBinary).
	QEMU string
	// Kernel and Initrd are the guest image (bin/guest/vmlinuz and
	// bin/guest/initramfs.img from scripts/guest-image.sh).
	Kernel, Initrd string
	// MemoryMiB is the guest RAM; zero means DefaultMemoryMiB.
	MemoryMiB int
	// SMP is the number of vCPUs; zero means one.
	SMP int
	// HugePages is the number of 2 MiB hugepages init reserves for DMA;
	// zero means DefaultHugePages.
	HugePages int
	// Run is the vrdma-guest subcommand ("probe", "selftest", "server",
	// "client"): letters, digits, '-', '_' and '.'.
	Run string
	// Args are its arguments. On the kernel command line they are joined
	// with commas, so an argument may hold no comma, whitespace, quote or
	// control character, and may not be empty.
	Args []string
	// Append is added to the kernel command line (after the vrdma.*
	// parameters), e.g. "loglevel=7". Empty adds nothing.
	Append string
	// Devices are the vrdma devices present from boot; their back-ends
	// must be listening.
	Devices []qemu.VhostUserDevice
	// ExtraQEMUArgs are appended to QEMU's command line unchanged.
	ExtraQEMUArgs []string
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = DefaultMemoryMiB
	}
	if c.HugePages == 0 {
		c.HugePages = DefaultHugePages
	}
	return c
}

func configErr(field, reason string) error { return &ConfigError{Field: field, Reason: reason} }

func validWord(s string, extra string) bool {
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(extra, r)
		if !ok {
			return false
		}
	}
	return s != ""
}

// Validate reports the first problem with c as a *ConfigError, or nil.
// Zero fields are checked after their defaults are applied; QEMU's part of
// the configuration is checked again by vmm/qemu.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.QEMU == "":
		return configErr("QEMU", "empty")
	case c.Kernel == "":
		return configErr("Kernel", "empty")
	case c.Initrd == "":
		return configErr("Initrd", "empty")
	case !validWord(c.Name, "-_."):
		return configErr("Name", "must be letters, digits, '-', '_' or '.'")
	case !validWord(c.Run, "-_."):
		return configErr("Run", "must be a non-empty word of letters, digits, '-', '_' or '.'")
	case c.HugePages < 0 || c.HugePages > 1<<20:
		return configErr("HugePages", "out of range")
	case c.MemoryMiB < 0:
		return configErr("MemoryMiB", "negative")
	case c.HugePages*2 >= c.MemoryMiB:
		return configErr("HugePages", fmt.Sprintf("%d hugepages (2 MiB) do not fit in %d MiB of RAM", c.HugePages, c.MemoryMiB))
	}
	for i, a := range c.Args {
		if a == "" {
			return configErr(fmt.Sprintf("Args[%d]", i), "empty")
		}
		for _, r := range a {
			if r <= ' ' || r >= 0x7f || r == ',' || r == '"' || r == '\'' || r == '\\' {
				return configErr(fmt.Sprintf("Args[%d]", i), fmt.Sprintf("%q holds a comma, space, quote or control character", a))
			}
		}
	}
	if strings.ContainsAny(c.Append, "\n\r\x00\"") {
		return configErr("Append", "holds a newline, NUL or quote")
	}
	if n := len(c.appendLine()); n > maxAppend {
		return configErr("Args", fmt.Sprintf("kernel command line of %d bytes is longer than %d", n, maxAppend))
	}
	return nil
}

// appendLine is the kernel command line for c (defaults applied).
func (c Config) appendLine() string {
	parts := []string{
		// no_timer_check: under TCG on a loaded host the kernel's check
		// that the IO-APIC timer ticks can miss its window and panic the
		// boot ("IO-APIC + timer doesn't work!"); the emulated timer
		// works, only the host was slow.
		"console=ttyS0", "quiet", "panic=-1", "no_timer_check",
		"vrdma.console=ttyS1",
		"vrdma.hugepages=" + strconv.Itoa(c.HugePages),
		"vrdma.run=" + c.Run,
	}
	if len(c.Args) > 0 {
		parts = append(parts, "vrdma.args="+strings.Join(c.Args, ","))
	}
	if c.Append != "" {
		parts = append(parts, c.Append)
	}
	return strings.Join(parts, " ")
}

// Option configures Boot and StartPair.
type Option func(*options)

type options struct {
	log *logrus.Entry
}

// WithLogger sets the logger (also given to vmm/qemu); the default discards
// everything.
func WithLogger(l *logrus.Entry) Option { return func(o *options) { o.log = l } }

func buildOptions(opts []Option) options {
	o := options{}
	for _, f := range opts {
		f(&o)
	}
	if o.log == nil {
		l := logrus.New()
		l.SetOutput(io.Discard)
		o.log = logrus.NewEntry(l)
	}
	return o
}

// Guest is a booted guest VM and the protocol line to the program inside.
// A live migration (Migrate) moves it to another QEMU: the Guest, its
// console's lines and its readers stay, the QEMU behind them changes.
type Guest struct {
	name string        // immutable
	log  *logrus.Entry // immutable
	// qcfg is the machine Boot started, without the console's chardev: a
	// migration's destination starts the same one. Immutable.
	qcfg qemu.Config
	line *lineLog // the console's lines
	// con is what the console reader reads: the QEMU's console socket,
	// then, after a migration, the destination's.
	con *consoleStream

	wmu  sync.Mutex // serialises WriteLine and a switch-over's change of conn
	conn net.Conn   // protected by wmu; the console (guest's ttyS1) lines are written to

	vmMu sync.Mutex // protects vm, dir, oldSerial, mig
	vm   *qemu.VM   // the QEMU the guest runs in; replaced by a completed migration
	dir  string     // vm's private directory (console socket)
	// oldSerial is the kernel console (ttyS0) of the QEMUs the guest
	// migrated away from, for Log.
	oldSerial string
	mig       *Migration // the migration in flight, or nil

	done       chan struct{} // closed by Close
	readerDone chan struct{} // closed when the console reader ended
	closeOnce  sync.Once
	closeErr   error // set once by closeOnce
	booted     time.Time
}

// Boot starts QEMU with the guest image and cfg's devices and connects to
// the guest's protocol line. It returns once QEMU runs; the guest is then
// still booting (about 2 s to /init under TCG). ctx bounds start-up only.
// On failure nothing stays behind. The caller must Close the Guest.
func Boot(ctx context.Context, cfg Config, opts ...Option) (*Guest, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return boot(ctx, cfg.Name, qemu.Config{
		Binary:    cfg.QEMU,
		MemoryMiB: cfg.MemoryMiB,
		SMP:       cfg.SMP,
		Kernel:    cfg.Kernel,
		Initrd:    cfg.Initrd,
		Append:    cfg.appendLine(),
		Devices:   cfg.Devices,
		ExtraArgs: cfg.ExtraQEMUArgs,
	}, opts)
}

// boot starts QEMU with qcfg, whose ExtraArgs get the console's chardev and
// serial port in front of them, and connects to the guest's protocol line
// (see Boot).
func boot(ctx context.Context, name string, qcfg qemu.Config, opts []Option) (*Guest, error) {
	o := buildOptions(opts)
	log := o.log.WithField("guest", name)
	start := time.Now()
	vm, conn, dir, err := startQEMU(ctx, name, qcfg, log)
	if err != nil {
		return nil, err
	}
	g := &Guest{
		name: name, log: log, qcfg: qcfg, vm: vm, dir: dir, conn: conn, con: newConsoleStream(conn),
		line: newLineLog(), done: make(chan struct{}), readerDone: make(chan struct{}), booted: start,
	}
	go func() {
		defer close(g.readerDone)
		readLines(g.con, g.line)
	}()
	log.WithField("pid", vm.PID()).Debug("guest booting")
	return g, nil
}

// startQEMU starts QEMU with qcfg and the guest's console (ttyS1) on a unix
// socket in a private directory, and connects to it. On failure nothing
// stays behind; on success the caller owns vm, conn and dir.
func startQEMU(ctx context.Context, name string, qcfg qemu.Config, log *logrus.Entry) (*qemu.VM, net.Conn, string, error) {
	dir, err := os.MkdirTemp("", "vrdma-guest-")
	if err != nil {
		return nil, nil, "", fmt.Errorf("guest %s: console directory: %w", name, err)
	}
	sock := filepath.Join(dir, "console.sock")
	if len(sock) > maxSocketPath {
		os.RemoveAll(dir)
		return nil, nil, "", configErr("console socket", fmt.Sprintf("%s is longer than a unix socket path may be (set TMPDIR shorter)", sock))
	}

	// QEMU waits (wait=on) for the console's first connection before it
	// runs the guest, so no early line is lost; dial it while Start runs.
	dialCtx, stopDial := context.WithCancel(context.Background())
	dialed := make(chan net.Conn, 1)
	go func() {
		for {
			c, err := net.Dial("unix", sock)
			if err == nil {
				dialed <- c
				return
			}
			select {
			case <-dialCtx.Done():
				dialed <- nil
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	fail := func(vm *qemu.VM, err error) (*qemu.VM, net.Conn, string, error) {
		stopDial()
		if c := <-dialed; c != nil {
			c.Close()
		}
		if vm != nil {
			vm.Kill()
		}
		os.RemoveAll(dir)
		return nil, nil, "", err
	}

	qcfg.ExtraArgs = append([]string{
		"-chardev", "socket,id=" + consoleID + ",path=" + strings.ReplaceAll(sock, ",", ",,") + ",server=on,wait=on",
		"-serial", "chardev:" + consoleID,
	}, qcfg.ExtraArgs...)
	vm, err := qemu.Start(ctx, qcfg, qemu.WithLogger(log))
	if err != nil {
		return fail(nil, fmt.Errorf("guest %s: start qemu: %w", name, err))
	}
	var conn net.Conn
	select {
	case conn = <-dialed:
	case <-time.After(10 * time.Second):
		return fail(vm, fmt.Errorf("guest %s: qemu runs but its console socket never accepted", name))
	}
	stopDial()
	if conn == nil {
		return fail(vm, fmt.Errorf("guest %s: no console connection", name))
	}
	return vm, conn, dir, nil
}

// Name returns the guest's name.
func (g *Guest) Name() string { return g.name }

// VM returns the guest's QEMU (QMP, PID, Kill): after a completed
// migration, the destination's.
func (g *Guest) VM() *qemu.VM {
	g.vmMu.Lock()
	defer g.vmMu.Unlock()
	return g.vm
}

// Kill kills the guest's QEMU with SIGKILL, as a host crash or power loss
// would; the console then closes. Close is still needed.
func (g *Guest) Kill() error { return g.VM().Kill() }

// Lines returns every console line from the guest's boot on, in order, on
// a channel of its own; each call starts again at the first line. The
// channel is closed when the console closes (QEMU exited) and every line
// was delivered, or when the Guest is closed.
func (g *Guest) Lines() <-chan string {
	ch := make(chan string, 64)
	go func() {
		defer close(ch)
		i := 0
		for {
			s, n, err := g.line.next(context.Background(), g.done, i)
			if err != nil {
				return
			}
			i = n
			select {
			case ch <- s:
			case <-g.done:
				return
			}
		}
	}()
	return ch
}

// waitFor waits for a line of kind k; false when the console closed or
// the Guest was closed first.
func (g *Guest) waitFor(k Kind) bool {
	for i := 0; ; {
		s, n, err := g.line.next(context.Background(), g.done, i)
		if err != nil {
			return false
		}
		if kind, _ := Classify(s); kind == k {
			return true
		}
		i = n
	}
}

// WriteLine writes s and a newline to the guest's protocol line (the
// guest's stdin). s may hold no newline or carriage return. Lines written
// before the guest program reads its stdin may lose bytes (the guest's
// UART drops what it holds while it is being set up): write after a line
// that says the program runs, as Pair does after VRDMA-EXCHANGE.
func (g *Guest) WriteLine(s string) error {
	if strings.ContainsAny(s, "\r\n") {
		return fmt.Errorf("guest %s: write line: holds a line break", g.name)
	}
	select {
	case <-g.done:
		return fmt.Errorf("guest %s: write line: %w", g.name, net.ErrClosed)
	default:
	}
	// A line written while a migration switches over may be lost: the
	// source's UART state may already have gone to the destination.
	g.wmu.Lock()
	defer g.wmu.Unlock()
	g.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(g.conn, s+"\n"); err != nil {
		return fmt.Errorf("guest %s: write line: %w", g.name, err)
	}
	return nil
}

// WaitResult reads the console from its first line until VRDMA-EXIT and
// returns the VRDMA-RESULT lines in order. It fails with a *GuestError
// (errors.Is ErrGuestFailed) when the guest printed VRDMA-ERROR, an
// unparsable VRDMA-RESULT or a non-zero exit code, and with a *GuestError
// (errors.Is ErrGuestGone) when the console closed before VRDMA-EXIT. When
// ctx ends first it returns ctx's error. The results read so far are
// returned in every case.
func (g *Guest) WaitResult(ctx context.Context) ([]Result, error) {
	var results []Result
	var msgs []string
	code := -1
	for i := 0; ; {
		s, n, err := g.line.next(ctx, g.done, i)
		if errors.Is(err, errLogClosed) {
			break
		}
		if err != nil {
			return results, fmt.Errorf("guest %s: wait for VRDMA-EXIT: %w", g.name, err)
		}
		i = n
		kind, payload := Classify(s)
		switch kind {
		case KindResult:
			r, err := ParseResult(payload)
			if err != nil {
				msgs = append(msgs, fmt.Sprintf("unparsable VRDMA-RESULT %q: %v", truncate(payload, 200), err))
				continue
			}
			results = append(results, r)
		case KindError:
			if payload == "" {
				payload = "VRDMA-ERROR without a message"
			}
			msgs = append(msgs, payload)
		case KindExit:
			c, err := ParseExit(payload)
			if err != nil {
				msgs = append(msgs, fmt.Sprintf("unparsable VRDMA-EXIT %q", truncate(payload, 20)))
				c = 255
			}
			code = c
		}
		if code >= 0 {
			break
		}
	}
	if code != 0 || len(msgs) > 0 {
		return results, &GuestError{Guest: g.name, Messages: msgs, ExitCode: code}
	}
	return results, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// InitTime returns how long the guest took from Boot to its /init's first
// line (VRDMA-INIT), or zero when that line has not come yet.
func (g *Guest) InitTime() time.Duration {
	g.line.mu.Lock()
	defer g.line.mu.Unlock()
	if g.line.initAt.IsZero() {
		return 0
	}
	return g.line.initAt.Sub(g.booted)
}

// Console returns the guest's protocol line as read so far (what
// vrdma-guest and init printed; at most the newest 16 MiB).
func (g *Guest) Console() string { return g.line.text() }

// Log returns everything known about the guest for a failure report: the
// protocol line, the kernel console (ttyS0) and QEMU's stderr.
func (g *Guest) Log() string {
	g.vmMu.Lock()
	vm, old := g.vm, g.oldSerial
	g.vmMu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "=== guest %s: console (ttyS1) ===\n%s", g.name, g.Console())
	fmt.Fprintf(&b, "=== guest %s: kernel (ttyS0) ===\n%s%s\n", g.name, old, vm.Serial())
	if s := vm.Stderr(); s != "" {
		fmt.Fprintf(&b, "=== guest %s: qemu stderr ===\n%s\n", g.name, s)
	}
	return b.String()
}

// Close stops the guest: a guest that printed VRDMA-EXIT gets a few seconds
// to power off by itself, then QEMU is killed (and the destination of a
// migration in flight). It removes the console socket and waits for every
// goroutine of the Guest. It is idempotent.
func (g *Guest) Close() error {
	g.closeOnce.Do(func() {
		vm := g.VM()
		if g.sawExit() {
			select {
			case <-vm.Exited():
			case <-time.After(exitGrace):
			}
		}
		close(g.done)
		g.vmMu.Lock()
		mig := g.mig
		g.vmMu.Unlock()
		if mig != nil {
			mig.abort()
		}
		g.vmMu.Lock()
		vm, dir := g.vm, g.dir
		g.vmMu.Unlock()
		g.closeErr = vm.Kill()
		g.con.close()
		<-g.readerDone
		if err := os.RemoveAll(dir); err != nil && g.closeErr == nil {
			g.closeErr = err
		}
	})
	return g.closeErr
}

func (g *Guest) sawExit() bool {
	g.line.mu.Lock()
	defer g.line.mu.Unlock()
	for k := len(g.line.lines) - 1; k >= 0 && k >= len(g.line.lines)-8; k-- {
		if kind, _ := Classify(g.line.lines[k]); kind == KindExit {
			return true
		}
	}
	return false
}
