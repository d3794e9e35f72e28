package backend

import (
	"bytes"
	"errors"
	"io"
	"os"
	"sync"
	"testing"

	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// stateDevice is a fakeDevice whose state is a byte string.
type stateDevice struct {
	*fakeDevice
	mu      sync.Mutex
	state   []byte // what SaveState writes and LoadState replaced
	saveErr error  // SaveState fails with it
	loaded  int    // LoadState calls that succeeded
}

var errBadState = errors.New("bad state")

func (d *stateDevice) SaveState(w io.Writer) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.saveErr != nil {
		return d.saveErr
	}
	_, err := w.Write(d.state)
	return err
}

// LoadState accepts a state that starts with "state:" and refuses
// anything else, leaving the old state.
func (d *stateDevice) LoadState(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(b, []byte("state:")) {
		return errBadState
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.state = b
	d.loaded++
	return nil
}

func (d *stateDevice) get() ([]byte, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.state, d.loaded
}

// newStateFrontend starts a session for a stateDevice and negotiates
// DEVICE_STATE (and REPLY_ACK).
func newStateFrontend(t *testing.T, state []byte) (*testFrontend, *stateDevice) {
	t.Helper()
	dev := &stateDevice{fakeDevice: newFakeDevice(2), state: state}
	a, b := socketpair(t)
	stats := &Stats{}
	s := newSession(b, dev, discardLog(), stats)
	f := &testFrontend{t: t, conn: vu.NewConn(a), dev: dev.fakeDevice, sess: s, stats: stats, done: make(chan error, 1)}
	go func() { f.done <- s.serve() }()
	f.initMemory()
	t.Cleanup(f.close)
	f.negotiate(vu.ProtocolReplyAck | vu.ProtocolDeviceState)
	return f, dev
}

// setStateFd sends SET_DEVICE_STATE_FD with fd and returns the reply's
// u64.
func (f *testFrontend) setStateFd(dir, phase uint32, fd *os.File) uint64 {
	f.t.Helper()
	p := vu.DeviceStateTransfer{Direction: dir, Phase: phase}.Encode()
	f.write(vu.SetDeviceStateFd, 0, p, []int{int(fd.Fd())})
	m, err := f.read()
	if err != nil {
		f.t.Fatalf("SET_DEVICE_STATE_FD: reply: %v", err)
	}
	defer m.CloseFds()
	if err := vu.CheckReply(vu.SetDeviceStateFd, m); err != nil {
		f.t.Fatalf("SET_DEVICE_STATE_FD: %v", err)
	}
	v, _ := vu.DecodeU64(m.Payload)
	return v
}

// save runs a save as QEMU does: it returns the state read and
// CHECK_DEVICE_STATE's answer, or the reply to SET_DEVICE_STATE_FD when it
// failed.
func (f *testFrontend) save() (state []byte, setReply, check uint64) {
	f.t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		f.t.Fatal(err)
	}
	defer r.Close()
	setReply = f.setStateFd(vu.TransferSave, vu.TransferPhaseStopped, w)
	w.Close()
	if setReply != vu.VringFileNoFd {
		return nil, setReply, 0
	}
	if state, err = io.ReadAll(r); err != nil {
		f.t.Fatal(err)
	}
	return state, setReply, f.getU64(vu.CheckDeviceState)
}

// load runs a load as QEMU does and returns CHECK_DEVICE_STATE's answer.
func (f *testFrontend) load(state []byte) uint64 {
	f.t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		f.t.Fatal(err)
	}
	defer w.Close()
	if v := f.setStateFd(vu.TransferLoad, vu.TransferPhaseStopped, r); v != vu.VringFileNoFd {
		f.t.Fatalf("SET_DEVICE_STATE_FD (load): %#x, want the no-fd flag alone", v)
	}
	r.Close()
	_, _ = w.Write(state) // fails (EPIPE) once the back-end stopped reading
	w.Close()
	return f.getU64(vu.CheckDeviceState)
}

// TestDeviceStateTransfer: the back-end offers DEVICE_STATE; a save
// through the front-end's pipe carries the device's state, and a load
// into another session gives it to that device; CHECK_DEVICE_STATE says
// 0 both times.
func TestDeviceStateTransfer(t *testing.T) {
	src, _ := newStateFrontend(t, []byte("state:objects"))
	if pf := src.getU64(vu.GetProtocolFeatures); pf&vu.ProtocolDeviceState == 0 {
		t.Fatalf("protocol features %#x without DEVICE_STATE", pf)
	}
	got, setReply, check := src.save()
	if setReply != vu.VringFileNoFd || check != 0 || string(got) != "state:objects" {
		t.Fatalf("save: state %q, SET_DEVICE_STATE_FD %#x, CHECK %d; want %q, %#x, 0",
			got, setReply, check, "state:objects", vu.VringFileNoFd)
	}
	dst, dev := newStateFrontend(t, nil)
	if check := dst.load(got); check != 0 {
		t.Fatalf("load: CHECK_DEVICE_STATE %d, want 0", check)
	}
	if st, n := dev.get(); string(st) != "state:objects" || n != 1 {
		t.Fatalf("destination state %q after %d loads, want %q after 1", st, n, "state:objects")
	}
	// A big state crosses the pipe while the front-end reads it.
	big := append([]byte("state:"), bytes.Repeat([]byte{0x5a}, 1<<20)...)
	src2, _ := newStateFrontend(t, big)
	got, _, check = src2.save()
	if check != 0 || !bytes.Equal(got, big) {
		t.Fatalf("save of 1 MiB: %d bytes, CHECK %d", len(got), check)
	}
	if check := dst.load(got); check != 0 {
		t.Fatal("load of 1 MiB failed")
	}
}

// TestDeviceStateRefused: what the back-end must refuse, each answered
// with a failure and leaving the device's state alone, the session
// serving on.
func TestDeviceStateRefused(t *testing.T) {
	t.Run("load refused by the device", func(t *testing.T) {
		f, dev := newStateFrontend(t, []byte("state:old"))
		for _, s := range [][]byte{nil, []byte("garbage"), []byte("stat")} {
			if check := f.load(s); check == 0 {
				t.Fatalf("load of %q: CHECK_DEVICE_STATE 0, want a failure", s)
			}
		}
		if st, n := dev.get(); string(st) != "state:old" || n != 0 {
			t.Fatalf("state %q after %d loads, want the old one", st, n)
		}
	})
	t.Run("load too long", func(t *testing.T) {
		f, dev := newStateFrontend(t, nil)
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		if v := f.setStateFd(vu.TransferLoad, vu.TransferPhaseStopped, r); v != vu.VringFileNoFd {
			t.Fatalf("SET_DEVICE_STATE_FD: %#x", v)
		}
		r.Close()
		chunk := append([]byte("state:"), make([]byte, 1<<20)...)
		written := 0
		for written <= MaxDeviceState {
			n, err := w.Write(chunk)
			written += n
			if err != nil {
				break // the back-end stopped reading past the bound
			}
		}
		w.Close()
		if written <= MaxDeviceState {
			t.Fatalf("the back-end stopped reading after %d bytes, below the bound", written)
		}
		if check := f.getU64(vu.CheckDeviceState); check == 0 {
			t.Fatal("CHECK_DEVICE_STATE 0 for a state past the bound")
		}
		if _, n := dev.get(); n != 0 {
			t.Fatal("the device loaded a state past the bound")
		}
	})
	t.Run("save refused by the device", func(t *testing.T) {
		f, dev := newStateFrontend(t, []byte("state:x"))
		dev.mu.Lock()
		dev.saveErr = errors.New("not transferable")
		dev.mu.Unlock()
		if _, setReply, _ := f.save(); setReply&0xff == 0 || setReply&vu.VringFileNoFd == 0 {
			t.Fatalf("SET_DEVICE_STATE_FD %#x, want a failure without an fd", setReply)
		}
		f.sync()
	})
	t.Run("ring running", func(t *testing.T) {
		f, _ := newStateFrontend(t, []byte("state:x"))
		f.setMemTable(f.region())
		f.startRing(0, 0)
		if _, setReply, _ := f.save(); setReply&0xff == 0 {
			t.Fatalf("SET_DEVICE_STATE_FD %#x with a ring running, want a failure", setReply)
		}
	})
	t.Run("phase and direction", func(t *testing.T) {
		f, _ := newStateFrontend(t, []byte("state:x"))
		for _, p := range [][2]uint32{{vu.TransferSave, 1}, {2, vu.TransferPhaseStopped}} {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			v := f.setStateFd(p[0], p[1], w)
			r.Close()
			w.Close()
			if v&0xff == 0 {
				t.Fatalf("direction %d phase %d: %#x, want a failure", p[0], p[1], v)
			}
		}
	})
	t.Run("check without a transfer", func(t *testing.T) {
		f, _ := newStateFrontend(t, []byte("state:x"))
		if check := f.getU64(vu.CheckDeviceState); check == 0 {
			t.Fatal("CHECK_DEVICE_STATE 0 without a transfer")
		}
	})
	t.Run("not negotiated", func(t *testing.T) {
		dev := &stateDevice{fakeDevice: newFakeDevice(2), state: []byte("state:x")}
		a, b := socketpair(t)
		s := newSession(b, dev, discardLog(), &Stats{})
		f := &testFrontend{t: t, conn: vu.NewConn(a), dev: dev.fakeDevice, sess: s, stats: &Stats{}, done: make(chan error, 1)}
		go func() { f.done <- s.serve() }()
		f.initMemory()
		t.Cleanup(f.close)
		f.negotiate(vu.ProtocolReplyAck)
		if _, setReply, _ := f.save(); setReply&0xff == 0 {
			t.Fatalf("SET_DEVICE_STATE_FD %#x without DEVICE_STATE negotiated, want a failure", setReply)
		}
	})
	t.Run("device without state", func(t *testing.T) {
		f := newFrontend(t, newFakeDevice(2))
		f.negotiate(vu.ProtocolReplyAck | vu.ProtocolDeviceState)
		if _, setReply, _ := f.save(); setReply&0xff == 0 {
			t.Fatalf("SET_DEVICE_STATE_FD %#x for a device that is no StateSaver, want a failure", setReply)
		}
	})
}
