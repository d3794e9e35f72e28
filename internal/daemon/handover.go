package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/backend/rdma/roce/hostnet"
)

// Live upgrade: one vrdmad process hands every device over to another
// (docs/state.md is the normative description of what follows).
//
// The old process freezes every device (its vhost-user server stops at a
// message boundary and its rings' workers stop; the device's data path is
// quiesced), the RoCE network and nothing else, and describes them in one
// JSON document, the handover state, beside a list of descriptors: the
// listening sockets, the front-ends' connections, eventfds and guest
// memory files, the RoCE sockets, the control and metrics listeners and
// the locked state directory. The new process receives both, takes the
// devices up without serving them (every guest page of a registered MR is
// pinned again, in its own mappings, while the old process still holds its
// pins), and says whether it is ready. Only then does the old process let
// it serve (commit), and it exits as soon as the new one says it serves,
// without closing, unlinking or resetting anything. A new process that
// cannot read the state (an unknown format version, a state that fails
// validation, a device it cannot rebuild) refuses before commit, and the
// old one thaws and goes on as if nothing happened.
//
// The new process is started before anything is frozen, so that the
// devices' pause does not include its start (exec, runtime, flags, the
// engine pool): it says "waiting" on the status channel when it can take
// the devices up, and only then does the old process freeze and send the
// document and the descriptors over that channel.
//
// The document names descriptors by their index in the list: descriptor i
// is the i-th passed after the document (exec), or the one named
// "vrdmad-fd-i" in systemd's file-descriptor store (fdstore.go). Each
// consumer (a device's server, the RoCE network) owns a contiguous range
// of the list, so its own indexes are relative to that range.

const (
	// HandoverFormat is the handover document's "format".
	HandoverFormat = "vrdmad-handover"
	// HandoverVersion is the version this vrdmad writes, and the newest it
	// reads. A document of a newer version is refused: the old process
	// keeps serving.
	HandoverVersion = 1
	// HandoverEnv, set in a new process's environment, says that it was
	// started to take over: its value is the descriptor of the status
	// channel, a SOCK_SEQPACKET socket to the old process.
	HandoverEnv = "VRDMAD_HANDOVER"
	// HandoverStatusFD is the status channel's descriptor in a new process
	// started by exec.
	HandoverStatusFD = 3
	// maxFDsPerMessage bounds the descriptors of one status message (the
	// kernel's SCM_MAX_FD is 253).
	maxFDsPerMessage = 250
	// MaxHandoverBytes bounds the document a new process reads.
	MaxHandoverBytes = 256 << 20
	// MaxHandoverFDs bounds the descriptor list: every device's server
	// and the network, with room (a connected device holds about a dozen).
	MaxHandoverFDs = 1 << 20
)

// handoverTestVersionEnv makes the old process write another version
// number (tests: a take-over refused for a version it cannot read).
const handoverTestVersionEnv = "VRDMAD_TEST_HANDOVER_VERSION"

// Handover is the handover document.
type Handover struct {
	Format  string       `json:"format"`
	Version int          `json:"version"`
	From    HandoverFrom `json:"from"`
	// NumFDs is the length of the descriptor list.
	NumFDs int `json:"num_fds"`
	// Control, Metrics and StateDir index the list: the control API's
	// listener, the metrics listener and the flock'ed state directory;
	// -1 for none.
	Control  int `json:"control"`
	Metrics  int `json:"metrics"`
	StateDir int `json:"state_dir"`
	// RoCE is the RoCE network's endpoints, over FDs; absent without one.
	RoCE *HandoverRoCE `json:"roce,omitempty"`
	// Devices are every device the old process served.
	Devices []HandoverDevice `json:"devices"`
	// Aliases name list entries that are an earlier entry's open file
	// (a handover through systemd's store keeps one of each: fdstore.go).
	Aliases []FDAlias `json:"aliases,omitempty"`
}

// HandoverFrom identifies the process that wrote a document.
type HandoverFrom struct {
	PID      int       `json:"pid"`
	Version  string    `json:"version"`
	Revision string    `json:"revision,omitempty"`
	Written  time.Time `json:"written"`
}

// FDRange is a consumer's part of the descriptor list: Count descriptors
// from index Base.
type FDRange struct {
	Base  int `json:"base"`
	Count int `json:"count"`
}

// HandoverRoCE is the RoCE network's state.
type HandoverRoCE struct {
	FDs     FDRange               `json:"fds"`
	Network *hostnet.NetworkState `json:"network"`
}

// HandoverDevice is one device: how to create it again (Record, the POST
// /v1/devices body with its identity), its vhost-user server (Server,
// whose descriptor indexes are relative to FDs) and, when a front-end is
// connected, the objects its driver made (Device).
type HandoverDevice struct {
	Record  AddRequest          `json:"record"`
	Persist bool                `json:"persist"`
	FDs     FDRange             `json:"fds"`
	Server  backend.ServerState `json:"server"`
	Device  *rdma.DeviceState   `json:"device,omitempty"`
}

// DecodeHandover reads a handover document: the format, a version this
// vrdmad reads, and that every descriptor range lies within the list and
// no two overlap. The parts are checked again, whole, by whoever takes
// them up (backend.Adopt, rdma.Device.ImportState, hostnet.Network.Adopt).
func DecodeHandover(data []byte) (*Handover, error) {
	if len(data) > MaxHandoverBytes {
		return nil, fmt.Errorf("handover state: %d bytes, more than %d", len(data), MaxHandoverBytes)
	}
	// The format and version first, alone: a newer version may have
	// changed everything else.
	var head struct {
		Format  string `json:"format"`
		Version int    `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("handover state: malformed JSON: %w", err)
	}
	if head.Format != HandoverFormat {
		return nil, fmt.Errorf("handover state: format %q, want %q", head.Format, HandoverFormat)
	}
	if head.Version < 1 || head.Version > HandoverVersion {
		return nil, fmt.Errorf("%w: handover state version %d; this vrdmad reads versions 1 to %d", ErrHandoverVersion, head.Version, HandoverVersion)
	}
	var h Handover
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return nil, fmt.Errorf("handover state: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("handover state: trailing data after the JSON object")
	}
	if err := h.check(); err != nil {
		return nil, fmt.Errorf("handover state: %w", err)
	}
	return &h, nil
}

// ErrHandoverVersion is a handover document of a version this vrdmad
// cannot read.
var ErrHandoverVersion = errors.New("unknown handover state version")

// check checks what DecodeHandover promises.
func (h *Handover) check() error {
	if h.NumFDs < 0 || h.NumFDs > MaxHandoverFDs {
		return fmt.Errorf("num_fds %d out of range [0, %d]", h.NumFDs, MaxHandoverFDs)
	}
	if len(h.Devices) > MaxDevices {
		return fmt.Errorf("%d devices, more than %d", len(h.Devices), MaxDevices)
	}
	if err := h.checkAliases(); err != nil {
		return err
	}
	used := make([]bool, h.NumFDs)
	claim := func(what string, r FDRange) error {
		if r.Base < 0 || r.Count < 0 || r.Count > h.NumFDs || r.Base > h.NumFDs-r.Count {
			return fmt.Errorf("%s: descriptors [%d, +%d) outside the list of %d", what, r.Base, r.Count, h.NumFDs)
		}
		for i := r.Base; i < r.Base+r.Count; i++ {
			if used[i] {
				return fmt.Errorf("%s: descriptor %d is claimed twice", what, i)
			}
			used[i] = true
		}
		return nil
	}
	for _, one := range []struct {
		what string
		i    int
	}{{"control", h.Control}, {"metrics", h.Metrics}, {"state_dir", h.StateDir}} {
		if one.i == -1 {
			continue
		}
		if err := claim(one.what, FDRange{one.i, 1}); err != nil {
			return err
		}
	}
	if h.RoCE != nil {
		if h.RoCE.Network == nil {
			return errors.New("roce: no network state")
		}
		if err := claim("roce", h.RoCE.FDs); err != nil {
			return err
		}
	}
	ids := make(map[string]bool, len(h.Devices))
	sockets := make(map[string]bool, len(h.Devices))
	for i := range h.Devices {
		hd := &h.Devices[i]
		if err := checkID(hd.Record.ID); err != nil {
			return fmt.Errorf("device %d: %w", i, err)
		}
		if ids[hd.Record.ID] || sockets[hd.Record.Socket] {
			return fmt.Errorf("device %s: id or socket %s listed twice", hd.Record.ID, hd.Record.Socket)
		}
		ids[hd.Record.ID], sockets[hd.Record.Socket] = true, true
		if err := claim("device "+hd.Record.ID, hd.FDs); err != nil {
			return err
		}
		if hd.Device != nil && hd.Server.Session == nil {
			return fmt.Errorf("device %s: objects without a connected front-end", hd.Record.ID)
		}
	}
	return nil
}

// fdList collects the descriptors of a handover in order. It owns them:
// close releases every one.
type fdList struct{ fds []int }

// take appends a consumer's descriptors and returns their range.
func (l *fdList) take(fds []int) FDRange {
	r := FDRange{Base: len(l.fds), Count: len(fds)}
	l.fds = append(l.fds, fds...)
	return r
}

// syscallConn is what SyscallConn returns.
type syscallConn = interface {
	Control(func(fd uintptr)) error
}

// dupRaw appends a dup of the descriptor behind rc (a listener's or a
// file's) and returns its index.
func (l *fdList) dupRaw(rc syscallConn) (int, error) {
	nfd := -1
	var derr error
	if err := rc.Control(func(fd uintptr) {
		nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, derr
	}
	l.fds = append(l.fds, nfd)
	return len(l.fds) - 1, nil
}

func (l *fdList) close() {
	for _, fd := range l.fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	l.fds = nil
}

// dupListener appends a dup of ln's descriptor (a *net.UnixListener or
// *net.TCPListener) and returns its index.
func (l *fdList) dupListener(ln net.Listener) (int, error) {
	var rc syscallConn
	var err error
	switch t := ln.(type) {
	case *net.UnixListener:
		rc, err = t.SyscallConn()
	case *net.TCPListener:
		rc, err = t.SyscallConn()
	default:
		return -1, fmt.Errorf("listener %s of type %T cannot be handed over", ln.Addr(), ln)
	}
	if err != nil {
		return -1, err
	}
	return l.dupRaw(rc)
}

// dupFile appends a dup of f's descriptor and returns its index.
func (l *fdList) dupFile(f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return -1, err
	}
	return l.dupRaw(rc)
}
