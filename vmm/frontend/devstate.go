package frontend

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// The device-state transfer of a migration, as QEMU 10 does it
// (vhost_save_backend_state, vhost_load_backend_state): a pipe whose one
// end goes to the back-end with SET_DEVICE_STATE_FD (direction, phase
// stopped), the state read or written through the other until the end
// of file, then CHECK_DEVICE_STATE. The rings must be stopped first
// (Stop): the device is suspended.

// MaxDeviceState bounds a state SaveDeviceState reads.
const MaxDeviceState = 64 << 20

// ErrDeviceState is the back-end's failure of a transfer: it refused
// SET_DEVICE_STATE_FD, or answered CHECK_DEVICE_STATE with an error.
var ErrDeviceState = errors.New("frontend: the back-end failed the device state transfer")

// SaveDeviceState asks the back-end for its device state (the source of
// a migration) and returns it.
func (f *Frontend) SaveDeviceState() ([]byte, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("frontend: %w", err)
	}
	defer r.Close()
	reply, err := f.setDeviceStateFd(vu.TransferSave, w)
	w.Close()
	if err != nil {
		return nil, err
	}
	if reply != nil {
		r.Close()
		r = reply
	}
	b, err := io.ReadAll(io.LimitReader(r, MaxDeviceState+1))
	if err != nil {
		return nil, fmt.Errorf("frontend: read device state: %w", err)
	}
	if len(b) > MaxDeviceState {
		return nil, fmt.Errorf("frontend: device state longer than %d bytes", MaxDeviceState)
	}
	r.Close()
	if err := f.CheckDeviceState(); err != nil {
		return nil, err
	}
	return b, nil
}

// LoadDeviceState gives state to the back-end (the destination of a
// migration), all of it then the end of file, and checks the result.
func (f *Frontend) LoadDeviceState(state []byte) error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("frontend: %w", err)
	}
	defer w.Close()
	reply, err := f.setDeviceStateFd(vu.TransferLoad, r)
	r.Close()
	if err != nil {
		return err
	}
	if reply != nil {
		w.Close()
		w = reply
	}
	_, werr := w.Write(state)
	w.Close()
	// A back-end that stopped reading (a state too long) makes the write
	// fail; its verdict is what counts.
	if err := f.CheckDeviceState(); err != nil {
		return err
	}
	if werr != nil {
		return fmt.Errorf("frontend: write device state: %w", werr)
	}
	return nil
}

// setDeviceStateFd sends SET_DEVICE_STATE_FD with the front-end's end of
// the channel for the back-end; it returns the back-end's own channel
// when it answered with one.
func (f *Frontend) setDeviceStateFd(dir uint32, end *os.File) (*os.File, error) {
	p := vu.DeviceStateTransfer{Direction: dir, Phase: vu.TransferPhaseStopped}
	m, err := f.Call(vu.SetDeviceStateFd, p.Encode(), []int{int(end.Fd())}, true)
	if err != nil {
		return nil, err
	}
	defer m.CloseFds()
	v, err := vu.DecodeU64(m.Payload)
	if err != nil {
		return nil, err
	}
	if v&0xff != 0 {
		return nil, fmt.Errorf("%w: SET_DEVICE_STATE_FD answered %#x", ErrDeviceState, v)
	}
	if v&vu.VringFileNoFd != 0 {
		return nil, nil
	}
	fd, err := m.TakeFd(0)
	if err != nil {
		return nil, err
	}
	unix.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "device-state"), nil
}

// CheckDeviceState sends CHECK_DEVICE_STATE: nil when the back-end's side
// of the last transfer succeeded.
func (f *Frontend) CheckDeviceState() error {
	v, err := f.callU64(vu.CheckDeviceState)
	if err != nil {
		return err
	}
	if v != 0 {
		return fmt.Errorf("%w: CHECK_DEVICE_STATE answered %d", ErrDeviceState, v)
	}
	return nil
}
