package daemon

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/backend/rdma/roce/hostnet"
	"github.com/vrdma/vrdma/internal/version"
)

// The new process's side of a live upgrade (handover.go has the design).
// Whatever fails before commit is abandoned whole: the process reports it
// and exits without closing, resetting or unmapping anything, because
// every descriptor it holds is shared with the old process, which goes on
// serving with them.

// commitTimeout bounds the wait for the old process's commit after
// "ready".
const commitTimeout = 30 * time.Second

// Incoming is a handover received by a new process.
type Incoming struct {
	H *Handover
	// Bytes is the document's size.
	Bytes int

	fds    []int         // the list; an entry is -1 once taken
	status *net.UnixConn // nil from the store
	store  bool          // from systemd's file-descriptor store (fdstore.go)
}

// ReceiveHandover reads the handover a new process was started for
// (HandoverEnv, or systemd's store: fdstore.go): nil, nil when it was not.
// It says "waiting" to the old process, which then freezes its devices and
// sends the document and the descriptors. An error is reported to the old
// process (which serves on) and the caller exits non-zero.
func ReceiveHandover() (*Incoming, error) {
	v, ok := os.LookupEnv(HandoverEnv)
	if !ok {
		return receiveFromStore()
	}
	os.Unsetenv(HandoverEnv)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q: want the status channel's descriptor", HandoverEnv, v)
	}
	unix.CloseOnExec(fd)
	sc, err := unixConn(fd)
	if err != nil {
		return nil, fmt.Errorf("handover status channel (fd %d): %w", fd, err)
	}
	in := &Incoming{status: sc}
	if err := writeStatus(sc, statusMsg{State: "waiting"}); err != nil {
		return nil, fmt.Errorf("handover status channel: %w", err)
	}
	m, fds, err := readStatusFDs(sc, time.Now().Add(readyTimeout))
	if err != nil {
		return nil, fmt.Errorf("handover: no state from the old vrdmad: %w", err)
	}
	if m.State != "state" || len(fds) != 1 || m.NumFDs < 0 || m.NumFDs > MaxHandoverFDs {
		closeAll(fds)
		return in, in.Refuse(fmt.Errorf("handover: a %q message with %d descriptors for %d, not the state", m.State, len(fds), m.NumFDs))
	}
	doc, err := readSealed(fds[0])
	if err != nil {
		return in, in.Refuse(fmt.Errorf("handover state: %w", err))
	}
	in.Bytes = len(doc)
	in.fds = make([]int, 0, m.NumFDs)
	for len(in.fds) < m.NumFDs {
		b, batch, err := readStatusFDs(sc, time.Now().Add(commitTimeout))
		if err != nil {
			return in, in.Refuse(fmt.Errorf("handover: descriptors: %w", err))
		}
		in.fds = append(in.fds, batch...)
		if b.State != "fds" || b.First != len(in.fds)-len(batch) || len(batch) == 0 || len(in.fds) > m.NumFDs {
			return in, in.Refuse(fmt.Errorf("handover: a %q message with descriptors %d+%d of %d", b.State, b.First, len(batch), m.NumFDs))
		}
	}
	h, err := DecodeHandover(doc)
	if err != nil {
		return in, in.Refuse(err)
	}
	if h.NumFDs != len(in.fds) {
		return in, in.Refuse(fmt.Errorf("handover state lists %d descriptors, %d were passed", h.NumFDs, len(in.fds)))
	}
	in.H = h
	return in, nil
}

// closeAll closes every descriptor of fds.
func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// readSealed reads a sealed memfd whole (bounded by MaxHandoverBytes).
func readSealed(fd int) ([]byte, error) {
	f := os.NewFile(uintptr(fd), "vrdmad-handover-state")
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() > MaxHandoverBytes {
		return nil, fmt.Errorf("not a regular file of at most %d bytes", MaxHandoverBytes)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_WRITE == 0 {
		return nil, errors.New("not a sealed memfd")
	}
	return io.ReadAll(io.NewSectionReader(f, 0, fi.Size()))
}

// Refuse tells the old process that this one will not take over, and
// returns err for the caller, which exits.
func (in *Incoming) Refuse(err error) error {
	if in.status != nil {
		writeStatus(in.status, statusMsg{State: "refused", Error: err.Error()})
	}
	return err
}

// take returns the descriptors of r and marks them taken.
func (in *Incoming) take(r FDRange) []int {
	out := make([]int, r.Count)
	for i := range out {
		out[i] = in.fds[r.Base+i]
		in.fds[r.Base+i] = -1
	}
	return out
}

// takeOne returns descriptor i as a file (nil for -1).
func (in *Incoming) takeOne(i int, name string) *os.File {
	if i < 0 {
		return nil
	}
	fd := in.take(FDRange{i, 1})[0]
	return os.NewFile(uintptr(fd), name)
}

// RoCE returns the RoCE network's state and descriptors (nil without one).
func (in *Incoming) RoCE() (*hostnet.NetworkState, []int) {
	if in.H.RoCE == nil {
		return nil, nil
	}
	return in.H.RoCE.Network, in.take(in.H.RoCE.FDs)
}

// Listeners returns the control API's and the metrics listeners (nil for
// none).
func (in *Incoming) Listeners() (control, metrics net.Listener, err error) {
	open := func(i int, name string) (net.Listener, error) {
		f := in.takeOne(i, name)
		if f == nil {
			return nil, nil
		}
		defer f.Close()
		ln, err := net.FileListener(f)
		if err != nil {
			return nil, fmt.Errorf("%s listener: %w", name, err)
		}
		if ul, ok := ln.(*net.UnixListener); ok {
			// The socket file is the old process's creation, and stays.
			ul.SetUnlinkOnClose(false)
		}
		return ln, nil
	}
	if control, err = open(in.H.Control, "control"); err != nil {
		return nil, nil, err
	}
	if metrics, err = open(in.H.Metrics, "metrics"); err != nil {
		return nil, nil, err
	}
	return control, metrics, nil
}

// Ready tells the old process that every device is taken up, and waits
// for its commit. After an error the caller exits without serving.
func (in *Incoming) Ready() error {
	if in.store {
		return nil
	}
	if err := writeStatus(in.status, statusMsg{State: "ready"}); err != nil {
		return fmt.Errorf("handover: ready: %w", err)
	}
	m, err := readStatus(in.status, time.Now().Add(commitTimeout))
	if err != nil {
		return fmt.Errorf("handover: no commit from the old vrdmad: %w", err)
	}
	if m.State != "commit" {
		return fmt.Errorf("handover: the old vrdmad said %q, not commit", m.State)
	}
	return nil
}

// Serving tells the old process that this one serves every device; the
// old one exits. Descriptors of the list nobody took are closed.
func (in *Incoming) Serving() {
	if in.status != nil {
		writeStatus(in.status, statusMsg{State: "serving", PID: os.Getpid(), Version: version.Version, Revision: version.Revision()})
		in.status.Close()
	}
	for i, fd := range in.fds {
		if fd >= 0 {
			unix.Close(fd)
			in.fds[i] = -1
		}
	}
}

// adoption is what AddDevice needs to take a device up from a handover
// instead of creating its socket.
type adoption struct {
	hd  *HandoverDevice
	fds []int
}

// TakeOver creates the handover's devices, each serving the socket, the
// front-end and the guest objects the old process had, without starting
// them (ServeAdopted does, after commit), and takes over the state
// directory when both processes have one (stateDir, vrdmad's
// --state-dir: the lock the old one holds is this one's from now on). The
// RoCE network must have adopted its endpoints already (RoCE).
func (d *Daemon) TakeOver(in *Incoming, stateDir string) error {
	if f := in.takeOne(in.H.StateDir, "state-dir"); f != nil {
		if stateDir == "" {
			f.Close()
		} else if err := d.openInheritedState(stateDir, f); err != nil {
			return err
		}
	} else if stateDir != "" {
		if _, err := d.OpenState(stateDir); err != nil {
			return err
		}
	}
	var devs []*rdma.Device
	for i := range in.H.Devices {
		hd := &in.H.Devices[i]
		spec, err := requestSpec(hd.Record)
		if err != nil {
			return fmt.Errorf("device %s: record: %w", hd.Record.ID, err)
		}
		spec.Persist = hd.Persist
		spec.adopt = &adoption{hd: hd, fds: in.take(hd.FDs)}
		dv, err := d.addDevice(spec, false)
		if err != nil {
			return fmt.Errorf("device %s: %w", hd.Record.ID, err)
		}
		devs = append(devs, dv.Dev)
	}
	if err := rdma.FinishImport(devs); err != nil {
		return err
	}
	return nil
}

// ServeAdopted starts serving every device TakeOver made.
func (d *Daemon) ServeAdopted() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, dv := range d.devices {
		if dv.adopted {
			dv.adopted = false
			d.serveLocked(dv)
		}
	}
}

// openInheritedState makes dir, whose descriptor (holding the lock) the
// old process passed, this daemon's state directory, without restoring
// anything: its devices came with the handover.
func (d *Daemon) openInheritedState(dir string, f *os.File) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != nil {
		f.Close()
		return errors.New("state directory is open already")
	}
	s, err := inheritStateStore(dir, f)
	if err != nil {
		return err
	}
	d.state = s
	return nil
}
