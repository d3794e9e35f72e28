// Package daemon is vrdmad's core: the set of devices, each served on its
// own vhost-user socket, the HTTP/JSON control API on a unix socket, and
// the state file that brings the API's devices back after a restart.
// cmd/vrdmad is a thin flag parser around it, and tests run it in-process.
//
// Control API (api.go, share.go, health.go; docs/operations.md has curl
// examples): GET and POST /v1/devices, GET, PATCH and DELETE
// /v1/devices/{id}, GET /v1/health, POST /v1/health/ack. Every request
// that changes something, and every refusal, is logged with the caller's
// uid and pid (audit.go). PATCH changes a device's share of the engine
// (the one thing that changes while a device runs). A request is
// decoded once into a DeviceSpec and checked whole before anything is
// created; AddDevice then creates the device and its listener under
// Daemon.mu, so a failed add leaves nothing behind. Deleting a connected
// device closes its server: the front-end is disconnected and every pin
// and object is released.
//
// Sockets: a device's socket is created by AddDevice (DeviceSpec.Socket)
// or inherited, already listening (DeviceSpec.Listener: vrdmad --fd,
// systemd socket activation; see listeners.go, which checks such a file
// descriptor before anything uses it). An inherited socket file is never
// created, replaced or removed here.
//
// Persistence (state.go): after OpenState, every AddDevice of a spec with
// Persist set (the control API's), and every RemoveDevice and SetShare of
// such a device, rewrites DIR/devices.json atomically under Daemon.mu,
// from the device set itself, so the file always lists exactly the
// persisted devices of the last successful change. An add that cannot be
// saved is undone; a removal that cannot be saved still removes the
// device and says so; a share change that cannot be saved is not made;
// each failure makes the daemon degraded until a write succeeds
// (health.go). Restore brings the saved devices back without rewriting
// the file; Close stops every device without touching it, so they come
// back at the next start. The state directory is flock'ed for the
// daemon's lifetime: two daemons on one directory would overwrite each
// other's devices. A same-host migration (migrate.go) changes what is
// listed: an incoming device is not, until the load of a migration's
// state moves the identity to it; its source is not any more from then
// on (the file is rewritten then, on a goroutine: the load runs on the
// device's session, which an upgrade waits for under Daemon.mu).
//
// Lock order: Daemon.mu → (backend locks). Device servers run in their own
// goroutines; Close waits for all of them. The state file is written with
// Daemon.mu held.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/backend/rdma/hostnic"
	"github.com/vrdma/vrdma/backend/rdma/roce/hostnet"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/backend/rdma/sched"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/memmap"
)

// Errors of the device set.
var (
	ErrExists   = errors.New("device exists")
	ErrNotFound = errors.New("no such device")
	// ErrSocketInUse means the socket path of a new device is served by
	// another device or another process, or is not a socket.
	ErrSocketInUse = errors.New("socket path in use")
	// ErrClosed means the daemon is shutting down.
	ErrClosed = errors.New("daemon is shutting down")
	// ErrTooMany means the daemon serves MaxDevices devices already.
	ErrTooMany = errors.New("too many devices")
)

// DeviceSpec describes a device to add.
type DeviceSpec struct {
	ID string
	// Socket is the path of the vhost-user socket to create. With
	// Listener it is the inherited socket's name; empty means the
	// listener's bound path.
	Socket string
	// Listener, when set, is an inherited listening socket (vrdmad --fd,
	// systemd socket activation) served instead of creating Socket.
	// AddDevice owns it from the call on: it is closed when the device is
	// removed or the add fails. Such a device cannot be persisted.
	Listener *net.UnixListener
	Device   rdma.Config
	// MaxPinned, when not zero, replaces the daemon's per-device pin quota
	// (Config.Pin.MaxPinned) for this device.
	MaxPinned uint64
	// RoCEBind are the device's own host addresses for RoCE (the
	// control API's roce_bind); empty: the daemon's (Config.RoCEAddrs).
	RoCEBind []netip.Addr
	// RNIC is what executes the device's work ("soft" or
	// "verbs:DEVICE[:PORT]"); empty: the daemon's (Config.RNIC).
	RNIC string
	// Persist keeps the device in the state file (see OpenState), so it
	// comes back with the same identity when vrdmad restarts. The control
	// API sets it; devices from the command line have it clear. Without
	// a state directory it has no effect.
	Persist bool

	// adopt, when set, takes the device up from a live upgrade's handover
	// (takeover.go) instead of creating or inheriting its socket: the
	// server is adopted with its front-end, the device's objects are
	// imported, and nothing serves until ServeAdopted.
	adopt *adoption
}

// ServedDevice is one device the daemon serves: its ID, the RDMA device and
// the vhost-user server on its socket.
type ServedDevice struct {
	ID        string
	Dev       *rdma.Device
	Server    *backend.Server
	MaxPinned uint64 // immutable; the device's pin quota, 0 for none

	roceBind []netip.Addr  // immutable: DeviceSpec.RoCEBind
	persist  bool          // immutable: listed in the state file (Persist, with a state directory)
	record   AddRequest    // immutable: its state-file record (when persist); the share saved is Dev.Share()
	done     chan struct{} // closed when Serve returned
	adopted  bool          // protected by Daemon.mu: taken over, not served yet (ServeAdopted)
}

// Persisted reports whether the device is kept in the state file.
func (dv *ServedDevice) Persisted() bool { return dv.listed() }

// listed reports whether the state file lists the device: a persisted
// device, but not while it waits for a migration's state (incoming: it
// holds no identity yet, and a restart would recreate it with nothing to
// load), nor once it migrated out (its identity is the destination's,
// which the file lists in its place).
func (dv *ServedDevice) listed() bool {
	if !dv.persist {
		return false
	}
	m := dv.Dev.Migration()
	return m != rdma.MigrationIncoming && m != rdma.MigrationOut
}

// Config is what every device of a daemon shares.
type Config struct {
	// Pin is the PVDMA configuration each device starts from (pin-all,
	// map cache, per-device quota); its Accounting is set by New.
	Pin memmap.PinConfig
	// GlobalMaxPinned bounds the pinned bytes of all devices together;
	// zero means no bound.
	GlobalMaxPinned uint64
	// Limits are the devices' default limits; zero fields take
	// rdma.DefaultLimits'. A device's own non-zero limits win.
	Limits rdma.Limits
	// MaxCommandsPerSec is each device's control-command rate bound
	// unless the device sets its own; zero means none.
	MaxCommandsPerSec int
	// Socket applies to every device socket: its mode, owner and the peer
	// uids allowed to connect (see backend.Config).
	Socket SocketConfig
	// Pool runs the doorbell queues of every device (rdma.Config.Pool);
	// nil means sched.Default(), the process-wide pool. The daemon does
	// not close it: its owner does, after Close.
	Pool *sched.Pool
	// RoCE carries the devices' traffic to other hosts (RoCEv2 over UDP
	// 4791); nil: devices reach this host's devices only. RoCEAddrs are
	// the addresses it listens on for every device (vrdmad --roce-bind;
	// their GIDs fill entries 1, 2, … of each device's table); a device
	// may name its own (DeviceSpec.RoCEBind), which the daemon opens on
	// demand. The daemon does not close it: its owner does, after Close.
	RoCE      *hostnet.Network
	RoCEAddrs []netip.Addr
	// RNIC is the devices' default RNIC ("soft" or "verbs:DEVICE[:PORT]",
	// vrdmad --rnic); empty means soft. OpenNIC opens a verbs one; nil
	// means hostnic.Open (rdma-core's libibverbs).
	RNIC    string
	OpenNIC func(hostnic.Spec) (rdma.HostNIC, error)
	// OnHandover, when set, is called once an upgrade has handed every
	// device over to the process pid (vrdmad tells systemd its new main
	// PID there).
	OnHandover func(pid int)
}

// SocketConfig is how device sockets are created and who may connect.
type SocketConfig struct {
	Mode      os.FileMode    // zero: 0600
	Owner     *backend.Owner // nil: the daemon's user
	AllowUIDs []uint32       // empty: anyone who can open the socket
}

// Daemon owns devices and the control API.
type Daemon struct {
	log    *logrus.Entry      // immutable
	cfg    Config             // immutable
	fabric *engine.Fabric     // immutable
	acct   *memmap.Accounting // immutable

	started time.Time     // immutable
	changed chan struct{} // immutable; capacity 1 (Changed)

	mu           sync.Mutex
	devices      map[string]*ServedDevice // protected by mu
	closed       bool                     // protected by mu
	http         *http.Server             // protected by mu
	httpLn       net.Listener             // protected by mu
	state        *stateStore              // protected by mu; nil: nothing persisted
	problems     []controlapi.Problem     // protected by mu; oldest first (health.go)
	saveFailures atomic.Uint64            // writes of the state file that failed
	metricsLn    net.Listener             // protected by mu; the metrics listener, handed over with the rest
	wg           sync.WaitGroup

	// upgradeMu serialises upgrades (taken before mu, never waited for);
	// handedOver is closed when this process has handed over and answered
	// (upgrade.go).
	upgradeMu  sync.Mutex
	handedOver chan struct{}
}

// New creates a daemon with no devices.
func New(log *logrus.Entry, cfg Config) *Daemon {
	acct := memmap.NewAccounting(cfg.GlobalMaxPinned)
	cfg.Pin.Accounting = acct
	f := engine.NewFabric()
	if cfg.RoCE != nil {
		f.SetNetwork(cfg.RoCE, addrGIDs(cfg.RoCEAddrs))
	}
	return &Daemon{log: log, cfg: cfg, fabric: f, acct: acct, devices: map[string]*ServedDevice{},
		started: time.Now(), changed: make(chan struct{}, 1), handedOver: make(chan struct{})}
}

// addrGIDs are the GIDs of host addresses (udp.GID).
func addrGIDs(as []netip.Addr) [][16]byte {
	gs := make([][16]byte, len(as))
	for i, a := range as {
		gs[i] = udp.GID(a)
	}
	return gs
}

// RoCE is the daemon's RoCEv2 network (Config.RoCE), or nil.
func (d *Daemon) RoCE() *hostnet.Network { return d.cfg.RoCE }

// PinnedBytes is the memory pinned by all devices.
func (d *Daemon) PinnedBytes() uint64 { return d.acct.Pinned() }

// EngineThreads is the number of engine workers the devices share (the
// pool's, Config.Pool).
func (d *Daemon) EngineThreads() int {
	if d.cfg.Pool != nil {
		return d.cfg.Pool.Workers()
	}
	return sched.Default().Workers()
}

// AddDevice creates a device and starts serving its socket. With
// spec.Persist and a state directory (OpenState), the device is saved in
// the state file before AddDevice returns; if that fails the device is
// not added.
func (d *Daemon) AddDevice(spec DeviceSpec) (*ServedDevice, error) {
	return d.addDevice(spec, true)
}

// addDevice is AddDevice; save=false leaves the state file alone
// (Restore).
func (d *Daemon) addDevice(spec DeviceSpec, save bool) (dv *ServedDevice, err error) {
	if spec.Listener != nil {
		defer func() {
			if err != nil && spec.Listener != nil { // not yet the server's
				spec.Listener.Close()
			}
		}()
		spec.Listener.SetUnlinkOnClose(false)
		if spec.Socket == "" {
			spec.Socket = spec.Listener.Addr().String()
		}
		if spec.Persist {
			return nil, errors.New("a device on an inherited socket cannot be persisted")
		}
	}
	if spec.ID == "" || spec.Socket == "" {
		return nil, errors.New("device id and socket are required")
	}
	if spec.Persist && spec.Device.UUID == uuid.Nil {
		spec.Device.UUID = uuid.New() // a saved device keeps one identity
	}
	rec := spec.record()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if _, ok := d.devices[spec.ID]; ok {
		return nil, fmt.Errorf("%w: %s", ErrExists, spec.ID)
	}
	if len(d.devices) >= MaxDevices {
		return nil, fmt.Errorf("%w: %d devices served", ErrTooMany, len(d.devices))
	}
	for _, o := range d.devices {
		if o.Server.Socket() == spec.Socket {
			return nil, fmt.Errorf("%w: %s is served by device %s", ErrSocketInUse, spec.Socket, o.ID)
		}
	}
	if err := d.prepareIncomingLocked(&spec); err != nil {
		return nil, err
	}
	if spec.Listener == nil && spec.adopt == nil {
		if err := checkSocketFree(spec.Socket); err != nil {
			return nil, err
		}
	}
	if len(spec.RoCEBind) > 0 {
		if d.cfg.RoCE == nil {
			return nil, errors.New("roce_bind: this daemon has no RoCE network")
		}
		listen := d.cfg.RoCE.Listen
		if spec.Device.Incoming {
			// A migration's destination: the addresses move here with
			// the VM, after the switch-over (docs/operations.md).
			listen = d.cfg.RoCE.ListenFree
		}
		for _, a := range spec.RoCEBind {
			if _, err := listen(a); err != nil {
				return nil, fmt.Errorf("roce_bind %s: %w", a, err)
			}
		}
		spec.Device.NetGIDs = addrGIDs(spec.RoCEBind)
	}
	if err := d.pickRNIC(&spec); err != nil {
		return nil, err
	}
	spec.Device.ID = spec.ID
	spec.Device.Fabric = d.fabric
	spec.Device.Limits = spec.Device.Limits.WithDefaults(d.cfg.Limits)
	if spec.Device.MaxCommandsPerSec == 0 {
		spec.Device.MaxCommandsPerSec = d.cfg.MaxCommandsPerSec
	}
	if spec.Device.Pin == (memmap.PinConfig{}) {
		spec.Device.Pin = d.cfg.Pin
	}
	if spec.MaxPinned != 0 {
		spec.Device.Pin.MaxPinned = spec.MaxPinned
	}
	spec.Device.Pin.Accounting = d.acct
	if spec.Device.Pool == nil {
		spec.Device.Pool = d.cfg.Pool
	}
	log := d.log.WithField("device", spec.ID)
	dev, err := rdma.New(spec.Device, rdma.WithLogger(log))
	if err != nil {
		return nil, err
	}
	sc := d.cfg.Socket
	bcfg := backend.Config{Socket: spec.Socket, Device: dev, Mode: sc.Mode, Owner: sc.Owner, AllowUIDs: sc.AllowUIDs}
	var srv *backend.Server
	if spec.adopt != nil {
		// A failure here is abandoned, not undone (takeover.go): the
		// caller exits without touching what the old process serves on.
		hd := spec.adopt.hd
		if srv, err = backend.Adopt(bcfg, &hd.Server, spec.adopt.fds, backend.WithLogger(log)); err != nil {
			return nil, fmt.Errorf("take over the vhost-user server: %w", err)
		}
		if hd.Device != nil {
			if err := dev.ImportState(hd.Device); err != nil {
				return nil, fmt.Errorf("take over the device's objects: %w", err)
			}
		}
	} else if spec.Listener != nil {
		srv, err = backend.FromListener(spec.Listener, bcfg, backend.WithLogger(log))
		spec.Listener = nil // the server owns it now, also on failure
	} else {
		srv, err = backend.Listen(bcfg, backend.WithLogger(log))
	}
	if err != nil {
		dev.Close()
		return nil, err
	}
	dv = &ServedDevice{ID: spec.ID, Dev: dev, Server: srv, MaxPinned: spec.Device.Pin.MaxPinned,
		persist: spec.Persist && d.state != nil, record: rec, done: make(chan struct{}), roceBind: spec.RoCEBind}
	d.devices[spec.ID] = dv
	if dv.persist && save {
		if err := d.saveLocked("the addition of device " + spec.ID + " (not added)"); err != nil {
			delete(d.devices, spec.ID)
			srv.Close()
			dev.Close()
			return nil, fmt.Errorf("%w: save: %w", ErrState, err)
		}
	}
	if spec.adopt != nil {
		dv.adopted = true
		log.WithFields(logrus.Fields{"socket": spec.Socket, "connected": spec.adopt.hd.Server.Session != nil}).Info("device taken over")
		return dv, nil
	}
	d.serveLocked(dv)
	log.WithFields(logrus.Fields{"socket": spec.Socket, "persisted": dv.persist}).Info("device added")
	d.notifyChanged()
	return dv, nil
}

// serveLocked starts serving dv's socket. d.mu is held.
func (d *Daemon) serveLocked(dv *ServedDevice) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer close(dv.done)
		if err := dv.Server.Serve(context.Background()); err != nil {
			d.log.WithField("device", dv.ID).WithError(err).Error("device server stopped")
		}
	}()
}

// saveLocked writes the state file from the persisted devices; change
// says what is lost if it fails (persistLocked). d.mu is held and d.state
// is not nil.
func (d *Daemon) saveLocked(change string) error {
	return d.persistLocked(d.recordsLocked("", rdma.Share{}), change)
}

// recordsLocked are the state-file records of the persisted devices, each
// with its device's share now, but device next's with share (a change
// being saved before it is made). d.mu is held.
func (d *Daemon) recordsLocked(next string, share rdma.Share) []AddRequest {
	recs := make([]AddRequest, 0, len(d.devices))
	for _, dv := range d.devices {
		if !dv.listed() {
			continue
		}
		r := dv.record
		if dv.ID == next {
			r.Share = shareRecord(share)
		} else {
			r.Share = shareRecord(dv.Dev.Share())
		}
		recs = append(recs, r)
	}
	return recs
}

// RemoveDevice stops serving a device: a connected front-end is
// disconnected and everything it owned released. A persisted device is
// also dropped from the state file; if that write fails, the device is
// removed all the same and the error (ErrState) says the file still
// lists it.
func (d *Daemon) RemoveDevice(id string) error {
	stopErr, saveErr := d.removeDevice(id, false)
	return errors.Join(stopErr, saveErr)
}

// removeDevice stops device id and, unless the daemon is shutting down,
// drops it from the state file. stopErr is ErrNotFound or how its server
// stopped; saveErr (ErrState) says the state file still lists the
// device, which is gone all the same. At shutdown a device is "stopped",
// not "removed": the next start serves it again.
func (d *Daemon) removeDevice(id string, shutdown bool) (stopErr, saveErr error) {
	d.mu.Lock()
	dv, ok := d.devices[id]
	if ok {
		delete(d.devices, id)
		if dv.persist && !shutdown && d.state != nil {
			if err := d.saveLocked("the removal of device " + id + " (removed all the same)"); err != nil {
				saveErr = fmt.Errorf("%w: device %s removed, but the state file still lists it "+
					"(it comes back at the next start unless a later change is saved): %w", ErrState, id, err)
			}
		}
	}
	d.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, id), nil
	}
	stopErr = dv.Server.Close()
	<-dv.done
	dv.Dev.Close()
	log := d.log.WithField("device", id)
	if shutdown {
		log.WithField("persisted", dv.persist).Info("device stopped")
	} else {
		log.Info("device removed")
	}
	d.notifyChanged()
	return stopErr, saveErr
}

// Device returns a device by ID.
func (d *Daemon) Device(id string) (*ServedDevice, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	dv, ok := d.devices[id]
	return dv, ok
}

// Devices returns the devices sorted by ID.
func (d *Daemon) Devices() []*ServedDevice {
	d.mu.Lock()
	out := make([]*ServedDevice, 0, len(d.devices))
	for _, dv := range d.devices {
		out = append(out, dv)
	}
	d.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// ServeControl serves the control API on a unix socket it creates at
// path (mode 0600).
func (d *Daemon) ServeControl(path string) error {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("control socket %s exists and is not a socket", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return fmt.Errorf("control socket %s is in use", path)
		}
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("control socket: %w", err)
	}
	return d.ServeControlListener(ln)
}

// ServeControlListener serves the control API on ln, a listening socket
// the caller made or inherited (socket activation: its file, mode and
// owner are left as they are). The daemon owns ln from the call on.
func (d *Daemon) ServeControlListener(ln net.Listener) error {
	path := ln.Addr().String()
	srv := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 5 * time.Second, ConnContext: peerContext}
	d.mu.Lock()
	if d.closed || d.http != nil {
		closed := d.closed
		d.mu.Unlock()
		ln.Close()
		if closed {
			return ErrClosed
		}
		return errors.New("control API is served already")
	}
	d.http, d.httpLn = srv, ln
	d.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.WithError(err).Error("control API stopped")
		}
	}()
	d.log.WithField("socket", path).Info("control API serving")
	return nil
}

// Close stops every device and the control API, and releases the state
// directory. The state file is left as it is: persisted devices come back
// at the next start.
func (d *Daemon) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	srv := d.http
	ids := make([]string, 0, len(d.devices))
	for id := range d.devices {
		ids = append(ids, id)
	}
	d.mu.Unlock()
	var errs []error
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		errs = append(errs, srv.Shutdown(ctx))
		cancel()
	}
	for _, id := range ids {
		stopErr, _ := d.removeDevice(id, true)
		errs = append(errs, stopErr)
	}
	d.wg.Wait()
	d.mu.Lock()
	if d.state != nil {
		d.state.close()
		d.state = nil
	}
	d.mu.Unlock()
	return errors.Join(errs...)
}
