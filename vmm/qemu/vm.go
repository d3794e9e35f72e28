package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"github.com/sirupsen/logrus"
)

const (
	// startTimeout bounds Start when ctx has no earlier deadline.
	startTimeout = 30 * time.Second
	// maxSerial bounds the serial output Serial returns (the newest bytes).
	maxSerial = 16 << 20
	// maxStderr bounds the QEMU stderr kept for error messages.
	maxStderr = 64 << 10
	// eventBuffer is the queue length of each event subscriber.
	eventBuffer = 64
)

// Option configures Start.
type Option func(*options)

type options struct {
	log *logrus.Entry
}

// WithLogger sets the logger; the default discards everything.
func WithLogger(l *logrus.Entry) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

// VM is a running QEMU process with a connected QMP monitor.
type VM struct {
	cfg     Config        // immutable; QMPSocket filled in
	log     *logrus.Entry // immutable
	cmd     *exec.Cmd     // immutable
	tmpDir  string        // immutable; "" if Start made none
	serial  *tailBuffer   // immutable; nil when cfg.SerialLog is a file
	stderr  *tailBuffer   // immutable
	mon     qmp.Monitor   // immutable after Start; a connected *qmp.SocketMonitor
	version qmp.Version   // immutable after Start

	done    chan struct{} // closed when the process has exited
	waitErr error         // written before done is closed

	cleanupOnce sync.Once

	devMu   sync.Mutex
	devName string // protected by devMu; "" until found

	mu       sync.Mutex             // protects subs, nextSub, evClosed
	subs     map[int]chan qmp.Event // event subscribers
	nextSub  int
	evClosed bool
	pumpDone chan struct{} // closed when the event pump has stopped
}

// Start runs QEMU with cfg and connects to its QMP monitor. ctx bounds
// start-up only (at most 30 s), not the life of the VM: end that with
// Shutdown, Kill or Wait. QEMU dies with the calling process (Pdeathsig
// SIGKILL), so it never outlives a test. Back-ends of cfg.Devices must be
// listening before Start.
func Start(ctx context.Context, cfg Config, opts ...Option) (*VM, error) {
	o := options{log: discardLogger()}
	for _, opt := range opts {
		opt(&o)
	}
	if cfg.Binary == "" {
		return nil, configErr("Binary", "empty (see FindBinary)")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()

	vm := &VM{
		cfg:      cfg,
		log:      o.log,
		stderr:   newTailBuffer(maxStderr),
		done:     make(chan struct{}),
		subs:     map[int]chan qmp.Event{},
		pumpDone: make(chan struct{}),
	}
	if vm.cfg.QMPSocket == "" {
		dir, err := os.MkdirTemp("", "vrdma-qemu-")
		if err != nil {
			return nil, fmt.Errorf("qmp socket dir: %w", err)
		}
		vm.tmpDir = dir
		vm.cfg.QMPSocket = filepath.Join(dir, "qmp.sock")
	}
	fail := func(err error) (*VM, error) {
		vm.kill()
		vm.cleanup()
		return nil, err
	}
	var (
		name string
		err  error
	)
	if len(cfg.Devices) > 0 {
		if name, err = vm.deviceName(ctx); err != nil {
			return fail(err)
		}
	}
	args, err := vm.cfg.Args(name)
	if err != nil {
		return fail(err)
	}
	if fi, err := os.Lstat(vm.cfg.QMPSocket); err == nil && fi.Mode()&os.ModeSocket != 0 {
		// A stale socket from an earlier run; QEMU would replace it, but
		// we must not dial it before QEMU does.
		_ = os.Remove(vm.cfg.QMPSocket)
	}

	cmd := exec.Command(cfg.Binary, args...)
	cmd.Stdin = nil
	if cfg.SerialLog == "" {
		vm.serial = newTailBuffer(maxSerial)
		cmd.Stdout = vm.serial
	} else {
		cmd.Stdout = vm.stderr
	}
	cmd.Stderr = vm.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// QEMU must never outlive us, even if we are SIGKILLed.
		Pdeathsig: syscall.SIGKILL,
		// Keep terminal signals (^C) away from QEMU; we stop it ourselves.
		Setpgid: true,
	}
	vm.cmd = cmd
	vm.log.WithField("args", strings.Join(args, " ")).Debug("starting qemu")
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("start %s: %w", cfg.Binary, err))
	}
	go func() {
		err := cmd.Wait()
		vm.waitErr = err
		close(vm.done)
	}()
	vm.log = vm.log.WithField("pid", cmd.Process.Pid)

	mon, err := vm.connectQMP(ctx)
	if err != nil {
		return fail(err)
	}
	vm.mon = mon
	if mon.Version != nil {
		vm.version = *mon.Version
	}
	events, err := mon.Events(context.Background())
	if err != nil {
		return fail(fmt.Errorf("qmp events: %w", err))
	}
	go vm.pump(events)
	vm.log.WithFields(logrus.Fields{"qemu": vm.version.String(), "qmp": vm.cfg.QMPSocket}).Info("qemu started")
	return vm, nil
}

// connectQMP dials the QMP socket until QEMU accepts, QEMU exits or ctx
// ends, and performs the capabilities handshake.
func (vm *VM) connectQMP(ctx context.Context) (*qmp.SocketMonitor, error) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		mon, err := qmp.NewSocketMonitor("unix", vm.cfg.QMPSocket, time.Second)
		if err == nil {
			res := make(chan error, 1)
			go func() { res <- mon.Connect() }()
			select {
			case err = <-res:
			case <-ctx.Done():
				_ = mon.Disconnect()
				return nil, fmt.Errorf("qmp handshake: %w%s", ctx.Err(), vm.stderrSuffix())
			case <-vm.done:
				_ = mon.Disconnect()
				return nil, vm.exitedErr("during qmp handshake")
			}
			if err != nil {
				_ = mon.Disconnect()
				// QEMU closes the socket when it exits on a bad command
				// line; report the exit, with QEMU's words, not the
				// broken handshake.
				select {
				case <-vm.done:
					return nil, vm.exitedErr("during qmp handshake")
				case <-time.After(2 * time.Second):
				}
				return nil, fmt.Errorf("qmp handshake: %w%s", err, vm.stderrSuffix())
			}
			return mon, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("qmp socket %s: %w%s", vm.cfg.QMPSocket, ctx.Err(), vm.stderrSuffix())
		case <-vm.done:
			return nil, vm.exitedErr("before its qmp socket accepted")
		case <-tick.C:
		}
	}
}

func (vm *VM) exitedErr(when string) error {
	return fmt.Errorf("%w %s: %v%s", ErrExited, when, vm.waitErr, vm.stderrSuffix())
}

func (vm *VM) stderrSuffix() string {
	s := strings.TrimSpace(vm.stderr.String())
	if s == "" {
		return ""
	}
	return ": qemu said: " + s
}

// pump forwards QMP events to subscribers until the monitor closes. A
// subscriber that does not keep up loses events (logged), so QMP command
// replies are never blocked behind events.
func (vm *VM) pump(events <-chan qmp.Event) {
	defer close(vm.pumpDone)
	for ev := range events {
		vm.log.WithField("event", ev.Event).Debug("qmp event")
		vm.mu.Lock()
		for id, ch := range vm.subs {
			select {
			case ch <- ev:
			default:
				vm.log.WithFields(logrus.Fields{"event": ev.Event, "subscriber": id}).Warn("qmp event dropped: subscriber too slow")
			}
		}
		vm.mu.Unlock()
	}
	vm.mu.Lock()
	vm.evClosed = true
	for id, ch := range vm.subs {
		close(ch)
		delete(vm.subs, id)
	}
	vm.mu.Unlock()
}

// subscribe returns a channel of QMP events and a function that ends the
// subscription. The channel is closed when the monitor closes or after
// cancel.
func (vm *VM) subscribe() (<-chan qmp.Event, func()) {
	ch := make(chan qmp.Event, eventBuffer)
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.evClosed {
		close(ch)
		return ch, func() {}
	}
	id := vm.nextSub
	vm.nextSub++
	vm.subs[id] = ch
	return ch, func() {
		vm.mu.Lock()
		defer vm.mu.Unlock()
		if c, ok := vm.subs[id]; ok {
			close(c)
			delete(vm.subs, id)
		}
	}
}

// QMP returns the VM's connected monitor. The VM owns the connection:
// Connect and Disconnect on it do nothing. Events returns a private
// subscription that ends with its context, so any number of callers may
// listen.
func (vm *VM) QMP() qmp.Monitor { return vmMonitor{vm} }

type vmMonitor struct{ vm *VM }

func (m vmMonitor) Connect() error                 { return nil }
func (m vmMonitor) Disconnect() error              { return nil }
func (m vmMonitor) Run(cmd []byte) ([]byte, error) { return m.vm.mon.Run(cmd) }
func (m vmMonitor) Events(ctx context.Context) (<-chan qmp.Event, error) {
	in, cancel := m.vm.subscribe()
	out := make(chan qmp.Event)
	go func() {
		defer close(out)
		defer cancel()
		for {
			select {
			case ev, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// PID returns QEMU's process id.
func (vm *VM) PID() int { return vm.cmd.Process.Pid }

// Serial returns what the guest has printed on its serial console so far
// (at most the newest 16 MiB).
func (vm *VM) Serial() string {
	if vm.serial != nil {
		return vm.serial.String()
	}
	f, err := os.Open(vm.cfg.SerialLog)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > maxSerial {
		if _, err := f.Seek(fi.Size()-maxSerial, io.SeekStart); err != nil {
			return ""
		}
	}
	b, _ := io.ReadAll(io.LimitReader(f, maxSerial))
	return string(b)
}

// Stderr returns the newest 64 KiB QEMU wrote to stderr (warnings, errors).
func (vm *VM) Stderr() string { return vm.stderr.String() }

// Wait waits for QEMU to exit and returns its exit error (nil for status 0;
// after Kill, the "signal: killed" error).
func (vm *VM) Wait() error {
	<-vm.done
	vm.cleanup()
	return vm.waitErr
}

// Exited returns a channel closed when QEMU has exited.
func (vm *VM) Exited() <-chan struct{} { return vm.done }

// Kill kills QEMU with SIGKILL and waits until it is gone. It is
// idempotent and returns nil once the process is gone.
func (vm *VM) Kill() error {
	err := vm.kill()
	vm.cleanup()
	return err
}

func (vm *VM) kill() error {
	if vm.cmd == nil || vm.cmd.Process == nil {
		return nil
	}
	select {
	case <-vm.done:
		return nil
	default:
	}
	if err := vm.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill qemu %d: %w", vm.cmd.Process.Pid, err)
	}
	<-vm.done
	return nil
}

// Shutdown asks QEMU to quit over QMP and waits for it to exit; when ctx
// ends first it kills QEMU and returns ctx's error.
func (vm *VM) Shutdown(ctx context.Context) error {
	select {
	case <-vm.done:
		vm.cleanup()
		return nil
	default:
	}
	// QEMU may close the socket before it answers "quit"; the exit is
	// what counts, so the reply is only logged.
	if _, err := vm.run(ctx, "quit", nil); err != nil {
		vm.log.WithError(err).Debug("qmp quit")
	}
	select {
	case <-vm.done:
		vm.cleanup()
		return nil
	case <-ctx.Done():
		err := vm.kill()
		vm.cleanup()
		if err != nil {
			return err
		}
		return fmt.Errorf("qemu did not quit: %w", ctx.Err())
	}
}

// cleanup disconnects the monitor and removes the temporary directory.
// Precondition: the process has exited or was never started.
func (vm *VM) cleanup() {
	vm.cleanupOnce.Do(func() {
		if vm.mon != nil {
			_ = vm.mon.Disconnect()
		}
		if vm.tmpDir != "" {
			_ = os.RemoveAll(vm.tmpDir)
		}
	})
}

// deviceName returns the device name the VM's devices are created as:
// cfg.DeviceName if cfg.Binary lists it, else the one DeviceName picks;
// cached after the first success.
func (vm *VM) deviceName(ctx context.Context) (string, error) {
	vm.devMu.Lock()
	defer vm.devMu.Unlock()
	if vm.devName != "" {
		return vm.devName, nil
	}
	name := vm.cfg.DeviceName
	if name != "" {
		ok, err := HasDevice(ctx, vm.cfg.Binary, name)
		if err != nil {
			return "", err
		}
		if !ok {
			return "", fmt.Errorf("%w: %s does not list %s (Config.DeviceName)", ErrNoRDMADevice, vm.cfg.Binary, name)
		}
	} else {
		var err error
		if name, err = DeviceName(ctx, vm.cfg.Binary); err != nil {
			return "", err
		}
	}
	vm.devName = name
	return name, nil
}

func discardLogger() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return logrus.NewEntry(l)
}

// tailBuffer is an io.Writer that keeps the newest limit bytes.
type tailBuffer struct {
	mu    sync.Mutex
	buf   []byte // protected by mu
	limit int    // immutable
}

func newTailBuffer(limit int) *tailBuffer { return &tailBuffer{limit: limit} }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= t.limit {
		t.buf = append(t.buf[:0], p[len(p)-t.limit:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.limit; over > 0 {
		m := copy(t.buf, t.buf[over:])
		t.buf = t.buf[:m]
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
