package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/version"
)

// The old process's side of a live upgrade (handover.go has the design).

// Errors of Upgrade. Either way the daemon goes on serving as before.
var (
	// ErrUpgrading: another upgrade is under way.
	ErrUpgrading = errors.New("an upgrade is under way")
	// ErrRefused: the new process did not take over (it said why, or it
	// died, or it did not answer in time).
	ErrRefused = errors.New("the new vrdmad did not take over")
)

// Timeouts of a handover, counted from the new process's start.
const (
	// readyTimeout bounds the new process's start and take-up: it maps
	// every guest memory and pins every registered page again.
	readyTimeout = 90 * time.Second
	// servingTimeout bounds the wait for "serving" after commit.
	servingTimeout = 10 * time.Second
)

// statusMsg is one message on the status channel (SOCK_SEQPACKET: one
// JSON object per message). The new process says "waiting" once started;
// the old one sends "state" and "fds"; the new one answers "ready" or
// "refused" (with Error), then, after the old one's "commit", "serving"
// (with PID, Version, Revision).
type statusMsg struct {
	State string `json:"state"`
	Error string `json:"error,omitempty"`
	// The old process's "state" (the document's memfd comes with it)
	// says how many descriptors follow, in "fds" messages from First on.
	NumFDs   int    `json:"num_fds,omitempty"`
	First    int    `json:"first,omitempty"`
	PID      int    `json:"pid,omitempty"`
	Version  string `json:"version,omitempty"`
	Revision string `json:"revision,omitempty"`
}

// frozen is what a handover stopped, so that a refusal can start it again.
type frozen struct {
	d        *Daemon
	servers  []*backend.Server
	quiesced []*rdma.Device
	network  bool
}

// thaw starts what freeze stopped, the network first (the reverse order).
func (f *frozen) thaw() {
	if f.network {
		f.d.cfg.RoCE.Thaw()
	}
	for _, dev := range f.quiesced {
		dev.Unquiesce()
	}
	for _, s := range f.servers {
		s.Thaw()
	}
}

// HandedOver is closed once this process has handed its devices over and
// answered the upgrade's request: the process must exit at once, without
// closing anything (the descriptors are the new process's now).
func (d *Daemon) HandedOver() <-chan struct{} { return d.handedOver }

// Upgrade hands every device over to a new vrdmad process running binary
// (empty: the file at this process's own path) with this process's
// arguments, and returns once the new process serves every device. From
// then on this daemon holds its lock for good and the caller must exit
// once it has answered (HandedOver). On any error the daemon serves as
// before: the devices are thawed, the new process is gone.
func (d *Daemon) Upgrade(binary string) (controlapi.UpgradeAnswer, error) {
	if !d.upgradeMu.TryLock() {
		return controlapi.UpgradeAnswer{}, ErrUpgrading
	}
	committed := false
	defer func() {
		if !committed {
			d.upgradeMu.Unlock()
		}
	}()
	binary, err := upgradeBinary(binary)
	if err != nil {
		return controlapi.UpgradeAnswer{}, err
	}
	log := d.log.WithField("binary", binary)
	// The new process starts while the devices run: their pause does not
	// include its start.
	np, err := startNew(binary)
	if err != nil {
		log.WithError(err).Error("upgrade refused: serving on")
		return controlapi.UpgradeAnswer{}, err
	}
	defer func() {
		if !committed {
			np.kill()
		}
	}()
	d.mu.Lock()
	defer func() {
		if !committed {
			d.mu.Unlock()
		}
	}()
	if d.closed {
		return controlapi.UpgradeAnswer{}, ErrClosed
	}
	start := time.Now()
	f := &frozen{d: d}
	h, fds, err := d.freezeLocked(f)
	defer fds.close()
	if err != nil {
		f.thaw()
		log.WithError(err).Error("upgrade refused: serving on")
		return controlapi.UpgradeAnswer{}, err
	}
	if v := os.Getenv(handoverTestVersionEnv); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			h.Version = n
		}
	}
	doc, err := json.Marshal(h)
	if err != nil {
		f.thaw()
		return controlapi.UpgradeAnswer{}, fmt.Errorf("handover state: %w", err)
	}
	log = log.WithFields(logrus.Fields{"pid": np.pid(), "devices": len(h.Devices), "fds": h.NumFDs, "state_bytes": len(doc)})
	log.Info("upgrade: devices frozen, handing them over to the new vrdmad")
	ans, err := np.handOver(doc, fds.fds, log)
	if err != nil {
		f.thaw()
		log.WithError(err).Error("upgrade refused: serving on")
		return controlapi.UpgradeAnswer{}, err
	}
	committed = true
	ans.Binary = binary
	ans.Devices = len(h.Devices)
	for _, hd := range h.Devices {
		if hd.Server.Session != nil {
			ans.Connected++
		}
	}
	ans.PauseMS = float64(time.Since(start).Microseconds()) / 1000
	ans.StateBytes = len(doc)
	log.WithField("pause_ms", ans.PauseMS).Info("upgrade: the new vrdmad serves every device; this one exits")
	if d.cfg.OnHandover != nil {
		d.cfg.OnHandover(ans.PID)
	}
	return ans, nil
}

// upgradeBinary checks the binary to hand over to: an absolute path to an
// executable regular file; empty means this process's own path (which
// os.Executable reads without the " (deleted)" a package upgrade leaves).
func upgradeBinary(p string) (string, error) {
	if p == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("this vrdmad's own path: %w", err)
		}
		p = exe
	}
	if !filepath.IsAbs(p) {
		return "", reqErr("binary", "%q is not an absolute path", p)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", reqErr("binary", "%v", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return "", reqErr("binary", "%s is not an executable file", p)
	}
	return p, nil
}

// freezeLocked stops every device and the network (f records what it
// stopped) and describes them. d.mu is held.
func (d *Daemon) freezeLocked(f *frozen) (*Handover, *fdList, error) {
	fds := &fdList{}
	h := &Handover{Format: HandoverFormat, Version: HandoverVersion, Control: -1, Metrics: -1, StateDir: -1,
		From: HandoverFrom{PID: os.Getpid(), Version: version.Version, Revision: version.Revision(), Written: time.Now().UTC()}}
	if err := d.migratingLocked(); err != nil {
		return nil, fds, err
	}
	devs := d.sortedLocked()
	// The servers first: no command runs, no ring worker, no new
	// front-end; then the devices' data paths; then the network, whose
	// receive side delivers into the devices' QPs.
	states := make([]*backend.ServerState, len(devs))
	sfds := make([][]int, len(devs))
	for i, dv := range devs {
		st, own, err := dv.Server.Freeze()
		if err != nil {
			return nil, fds, fmt.Errorf("device %s: freeze: %w", dv.ID, err)
		}
		f.servers = append(f.servers, dv.Server)
		states[i], sfds[i] = st, own
		// The list owns them from here, also on error.
		h.Devices = append(h.Devices, HandoverDevice{Record: dv.handoverRecord(), Persist: dv.persist, FDs: fds.take(own), Server: *st})
	}
	for _, dv := range devs {
		if err := dv.Dev.Quiesce(); err != nil {
			return nil, fds, fmt.Errorf("device %s: quiesce: %w", dv.ID, err)
		}
		f.quiesced = append(f.quiesced, dv.Dev)
	}
	if n := d.cfg.RoCE; n != nil {
		st, own, err := n.Freeze()
		if err != nil {
			return nil, fds, fmt.Errorf("RoCE network: freeze: %w", err)
		}
		f.network = true
		h.RoCE = &HandoverRoCE{FDs: fds.take(own), Network: st}
	}
	for i, dv := range devs {
		if states[i].Session == nil {
			continue
		}
		ds, err := dv.Dev.ExportState()
		if err != nil {
			return nil, fds, fmt.Errorf("device %s: %w", dv.ID, err)
		}
		h.Devices[i].Device = ds
	}
	var err error
	if d.httpLn != nil {
		if h.Control, err = fds.dupListener(d.httpLn); err != nil {
			return nil, fds, fmt.Errorf("control socket: %w", err)
		}
	}
	if d.metricsLn != nil {
		if h.Metrics, err = fds.dupListener(d.metricsLn); err != nil {
			return nil, fds, fmt.Errorf("metrics listener: %w", err)
		}
	}
	if d.state != nil {
		if h.StateDir, err = fds.dupFile(d.state.dirf); err != nil {
			return nil, fds, fmt.Errorf("state directory: %w", err)
		}
	}
	h.NumFDs = len(fds.fds)
	return h, fds, nil
}

// sortedLocked lists the devices by ID. d.mu is held.
func (d *Daemon) sortedLocked() []*ServedDevice {
	out := make([]*ServedDevice, 0, len(d.devices))
	for _, dv := range d.devices {
		out = append(out, dv)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// handoverRecord is the POST /v1/devices body that creates the device
// again with its identity: the state-file record with the UUID the device
// really has (a command-line device's is drawn at its creation).
func (dv *ServedDevice) handoverRecord() AddRequest {
	r := dv.record
	r.UUID = dv.Dev.UUID().String()
	r.GUID, r.GID, r.MAC = "", "", ""
	r.Share = shareRecord(dv.Dev.Share())
	return r
}

// handoverEnviron is this process's environment without what describes
// descriptors this process inherited (socket activation) or a handover,
// and without WATCHDOG_PID, which names this process: the new one pings
// systemd's watchdog as the main process once this one has named it so
// (Config.OnHandover sends MAINPID=).
func handoverEnviron() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case HandoverEnv, "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "WATCHDOG_PID", handoverTestVersionEnv:
			continue
		}
		out = append(out, kv)
	}
	return out
}

// sealedMemfd is a memfd holding data, sealed against every change.
func sealedMemfd(name string, data []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// readStatus reads one status message before deadline.
func readStatus(c net.Conn, deadline time.Time) (statusMsg, error) {
	var m statusMsg
	buf := make([]byte, 64<<10)
	c.SetReadDeadline(deadline)
	n, err := c.Read(buf)
	if err != nil {
		return m, err
	}
	if n == 0 {
		return m, errors.New("end of the status channel")
	}
	if err := json.Unmarshal(buf[:n], &m); err != nil {
		return m, fmt.Errorf("status message: %w", err)
	}
	return m, nil
}

// writeStatus sends one status message.
func writeStatus(c net.Conn, m statusMsg) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Write(b)
	return err
}

// postUpgrade is POST /v1/daemon/upgrade. Its answer is the old process's
// last word: once it is flushed, HandedOver closes and vrdmad exits.
func (d *Daemon) postUpgrade(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req controlapi.UpgradeRequest
	if !decodeOptionalBody(w, body, &req) {
		return
	}
	ans, err := d.Upgrade(req.Binary)
	switch {
	case errors.Is(err, ErrInvalidRequest):
		writeError(w, http.StatusBadRequest, err.Error())
		return
	case errors.Is(err, ErrUpgrading), errors.Is(err, ErrRefused):
		writeError(w, http.StatusConflict, err.Error())
		return
	case errors.Is(err, ErrClosed):
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	case err != nil:
		// The devices could not be frozen or described (a device holds
		// what this version cannot hand over): nothing was handed over.
		writeError(w, http.StatusConflict, "upgrade: "+err.Error())
		return
	}
	w.Header().Set("Connection", "close")
	writeJSON(w, http.StatusOK, ans)
	http.NewResponseController(w).Flush()
	close(d.handedOver)
}

// SetMetricsListener tells the daemon the metrics server's listener, which
// an upgrade hands over with the rest.
func (d *Daemon) SetMetricsListener(ln net.Listener) {
	d.mu.Lock()
	d.metricsLn = ln
	d.mu.Unlock()
}

// GlobalMaxPinned is the bound on all devices' pinned bytes
// (Config.GlobalMaxPinned; 0: none).
func (d *Daemon) GlobalMaxPinned() uint64 { return d.cfg.GlobalMaxPinned }
