package backend

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/sirupsen/logrus"

	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// Live migration through the front-end (doc.go, "Live migration"): the
// vhost-user device-state protocol (VHOST_USER_PROTOCOL_F_DEVICE_STATE).
// "Migrating back-end state": SET_DEVICE_STATE_FD gives the back-end one
// end of a channel (a pipe) and a direction — save, on the source, the
// back-end writes its state; load, on the destination, it reads one — in
// the phase "stopped": the VM is stopped and the device suspended (every
// ring stopped). The front-end closes its end when it has read or written
// everything, then asks CHECK_DEVICE_STATE whether the back-end's side
// went well.

// StateSaver is implemented by a Device whose state (what its driver
// created) can move to another back-end: the device of a migrating VM.
// Both are called on the session goroutine with every ring stopped (the
// device is suspended: no worker runs), never concurrently with the
// device's other methods called there; the device synchronises with its
// own goroutines as usual.
type StateSaver interface {
	// SaveState writes the device's state to w, at most MaxDeviceState
	// bytes, and leaves the device as it was: the source runs on if the
	// migration fails. An error (a state this device cannot transfer)
	// refuses the migration: the front-end cancels it.
	SaveState(w io.Writer) error
	// LoadState reads a state SaveState wrote, in another process or on
	// another host, from r (at most MaxDeviceState bytes: the session
	// bounds it), validates all of it as hostile input and takes it up,
	// so that the driver goes on as if nothing happened. On error the
	// device is left as it was before (with nothing of the state).
	LoadState(r io.Reader) error
}

// MaxDeviceState bounds a device state: a longer stream is refused
// without being read to its end.
const MaxDeviceState = 64 << 20

// Errors of the device-state protocol, which CHECK_DEVICE_STATE (or the
// reply to SET_DEVICE_STATE_FD) reports as a non-zero status.
var (
	// ErrStateTooBig: the stream to load is longer than MaxDeviceState.
	ErrStateTooBig = errors.New("device state longer than the bound")
	// errNoTransfer: CHECK_DEVICE_STATE without a transfer to check.
	errNoTransfer = errors.New("no device state transfer to check")
)

// Reply values of SET_DEVICE_STATE_FD: "Bits 0–7 are 0 on success, and
// non-zero on error. Bit 8 is the invalid FD flag" (the back-end returns
// no channel of its own: it uses the front-end's pipe).
const (
	stateFdOK     = vu.VringFileNoFd
	stateFdFailed = vu.VringFileNoFd | 1
)

// stateTransfer is a transfer under way: its goroutine moves the bytes
// between the pipe and buf and closes done when it is finished.
type stateTransfer struct {
	dir  uint32        // immutable: vu.TransferSave or vu.TransferLoad
	done chan struct{} // closed by the goroutine
	buf  []byte        // load: what was read (the goroutine's until done)
	err  error         // the goroutine's until done: the transfer failed
}

// setDeviceStateFd is SET_DEVICE_STATE_FD. Failures are answered (the
// reply's low byte), never fatal to the session: QEMU then fails the
// migration and the source goes on.
func (s *session) setDeviceStateFd(m *vu.Message) ([]byte, error) {
	err := s.startTransfer(m)
	if err != nil {
		s.log.WithField("msg", m.Req().String()).WithError(err).Warn("device state transfer refused")
		return vu.EncodeU64(stateFdFailed), nil
	}
	return vu.EncodeU64(stateFdOK), nil
}

func (s *session) startTransfer(m *vu.Message) error {
	if s.protocol&vu.ProtocolDeviceState == 0 {
		return fmt.Errorf("%w: DEVICE_STATE not negotiated", errUnsupported)
	}
	p, err := vu.DecodeDeviceStateTransfer(m.Payload)
	if err != nil {
		return err
	}
	if p.Phase != vu.TransferPhaseStopped {
		return fmt.Errorf("%w: transfer phase %d (only 0, stopped)", errUnsupported, p.Phase)
	}
	if p.Direction != vu.TransferSave && p.Direction != vu.TransferLoad {
		return fmt.Errorf("transfer direction %d is neither save (0) nor load (1)", p.Direction)
	}
	saver, err := s.suspendedSaver("ring %d is running: the device is not suspended")
	if err != nil {
		return err
	}
	if s.xfer != nil {
		// A transfer the front-end did not check: it gave up on it
		// (closed its end); this one replaces it.
		s.endTransfer()
	}
	fd, err := m.TakeFd(0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), "vhost-user-device-state")
	x := &stateTransfer{dir: p.Direction, done: make(chan struct{})}
	if p.Direction == vu.TransferSave {
		// The state is taken now, while the device is suspended; the
		// goroutine only writes it out as the front-end reads.
		var b bytes.Buffer
		if err := saver.SaveState(&limitWriter{w: &b, n: MaxDeviceState}); err != nil {
			f.Close()
			return fmt.Errorf("save: %w", err)
		}
		go func() {
			defer close(x.done)
			_, x.err = f.Write(b.Bytes())
			if cerr := f.Close(); x.err == nil {
				x.err = cerr
			}
		}()
	} else {
		go func() {
			defer close(x.done)
			x.buf, x.err = readBounded(f, MaxDeviceState)
			f.Close()
		}()
	}
	s.xfer = x
	return nil
}

// checkDeviceState is CHECK_DEVICE_STATE: it waits for the transfer's
// goroutine (the front-end closed its end first, so it ends at once; a
// front-end that did not waits alone, until it disconnects) and, for a
// load, takes the state up. 0 is success.
func (s *session) checkDeviceState() ([]byte, error) {
	x := s.xfer
	s.xfer = nil
	err := errNoTransfer
	if x != nil {
		select {
		case <-x.done:
			err = x.err
		case <-s.kill:
			return nil, errors.New("device state transfer: session ended while waiting")
		}
		if err == nil && x.dir == vu.TransferLoad {
			err = s.loadState(x.buf)
		}
	}
	if err != nil {
		s.log.WithField("msg", vu.CheckDeviceState.String()).WithError(err).Warn("device state transfer failed")
		return vu.EncodeU64(1), nil
	}
	if s.log.Logger.IsLevelEnabled(logrus.DebugLevel) {
		s.log.WithField("msg", vu.CheckDeviceState.String()).Debug("device state transferred")
	}
	return vu.EncodeU64(0), nil
}

// loadState gives the state read to the device, with the rings still
// stopped (the front-end starts them when the VM runs).
func (s *session) loadState(b []byte) error {
	saver, err := s.suspendedSaver("load: ring %d started during the transfer")
	if err != nil {
		return err
	}
	if err := saver.LoadState(bytes.NewReader(b)); err != nil {
		return fmt.Errorf("load: %w", err)
	}
	return nil
}

// suspendedSaver returns the device as a StateSaver when it is one and
// suspended: "The VM guest is stopped, and the vhost-user device is
// suspended": no worker may run while the state is read or replaced.
// running is the error for a started ring (its index the argument).
// Precondition: session goroutine.
func (s *session) suspendedSaver(running string) (StateSaver, error) {
	saver, ok := s.dev.(StateSaver)
	if !ok {
		return nil, fmt.Errorf("%w: the device's state cannot be transferred", errUnsupported)
	}
	for i, r := range s.rings {
		if r.started {
			return nil, fmt.Errorf(running, i)
		}
	}
	return saver, nil
}

// endTransfer forgets the transfer under way without checking it; its
// goroutine ends when the front-end's end of the pipe closes.
func (s *session) endTransfer() { s.xfer = nil }

// readBounded reads r to its end, refusing more than max bytes (it stops
// reading at max+1).
func readBounded(r io.Reader, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, fmt.Errorf("read device state: %w", err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%w (%d bytes)", ErrStateTooBig, max)
	}
	return b, nil
}

// limitWriter fails a write that would pass n bytes in all.
type limitWriter struct {
	w io.Writer
	n int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.n {
		return 0, fmt.Errorf("%w (%d bytes)", ErrStateTooBig, MaxDeviceState)
	}
	n, err := l.w.Write(p)
	l.n -= int64(n)
	return n, err
}
