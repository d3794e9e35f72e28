// Package daemon is vrdmad's core: the set of devices, each served on its
// own vhost-user socket, and the HTTP/JSON control API on a unix socket.
// cmd/vrdmad is a thin flag parser around it, and tests run it in-process.
//
// Control API (api.go; docs/operations.md has curl examples): GET and POST
// /v1/devices, GET and DELETE /v1/devices/{id}, GET /v1/health. A request
// is decoded once into a DeviceSpec and checked whole before anything is
// created; AddDevice then creates the device and its listener under
// Daemon.mu, so a failed add leaves nothing behind. Deleting a connected
// device closes its server: the front-end is disconnected and every pin
// and object is released.
//
// Lock order: Daemon.mu → (backend locks). Device servers run in their own
// goroutines; Close waits for all of them.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/backend/rdma/engine"
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
)

// DeviceSpec describes a device to add.
type DeviceSpec struct {
	ID     string
	Socket string
	Device rdma.Config
	// MaxPinned, when not zero, replaces the daemon's per-device pin quota
	// (Config.Pin.MaxPinned) for this device.
	MaxPinned uint64
}

// Device is one served device.
type Device struct {
	ID        string
	Dev       *rdma.Device
	Server    *backend.Server
	MaxPinned uint64 // immutable; the device's pin quota, 0 for none

	done chan struct{} // closed when Serve returned
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

	mu      sync.Mutex
	devices map[string]*Device // protected by mu
	closed  bool               // protected by mu
	http    *http.Server       // protected by mu
	httpLn  net.Listener       // protected by mu
	wg      sync.WaitGroup
}

// New creates a daemon with no devices.
func New(log *logrus.Entry, cfg Config) *Daemon {
	acct := memmap.NewAccounting(cfg.GlobalMaxPinned)
	cfg.Pin.Accounting = acct
	return &Daemon{log: log, cfg: cfg, fabric: engine.NewFabric(), acct: acct, devices: map[string]*Device{}}
}

// PinnedBytes is the memory pinned by all devices.
func (d *Daemon) PinnedBytes() uint64 { return d.acct.Pinned() }

// AddDevice creates a device and starts serving its socket.
func (d *Daemon) AddDevice(spec DeviceSpec) (*Device, error) {
	if spec.ID == "" || spec.Socket == "" {
		return nil, errors.New("device id and socket are required")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if _, ok := d.devices[spec.ID]; ok {
		return nil, fmt.Errorf("%w: %s", ErrExists, spec.ID)
	}
	for _, o := range d.devices {
		if o.Server.Socket() == spec.Socket {
			return nil, fmt.Errorf("%w: %s is served by device %s", ErrSocketInUse, spec.Socket, o.ID)
		}
	}
	if err := checkSocketFree(spec.Socket); err != nil {
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
	log := d.log.WithField("device", spec.ID)
	dev, err := rdma.New(spec.Device, rdma.WithLogger(log))
	if err != nil {
		return nil, err
	}
	sc := d.cfg.Socket
	srv, err := backend.Listen(backend.Config{Socket: spec.Socket, Device: dev, Mode: sc.Mode, Owner: sc.Owner, AllowUIDs: sc.AllowUIDs}, backend.WithLogger(log))
	if err != nil {
		dev.Close()
		return nil, err
	}
	dv := &Device{ID: spec.ID, Dev: dev, Server: srv, MaxPinned: spec.Device.Pin.MaxPinned, done: make(chan struct{})}
	d.devices[spec.ID] = dv
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer close(dv.done)
		if err := srv.Serve(context.Background()); err != nil {
			log.WithError(err).Error("device server stopped")
		}
	}()
	log.WithField("socket", spec.Socket).Info("device added")
	return dv, nil
}

// checkSocketFree fails with ErrSocketInUse when path exists and is not a
// socket, or is a socket some process accepts connections on. A socket
// file nobody listens on is stale; the back-end replaces it.
func checkSocketFree(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("socket %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%w: %s exists and is not a socket", ErrSocketInUse, path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%w: another process listens on %s", ErrSocketInUse, path)
	}
	return nil
}

// RemoveDevice stops serving a device: a connected front-end is
// disconnected and everything it owned released.
func (d *Daemon) RemoveDevice(id string) error {
	d.mu.Lock()
	dv, ok := d.devices[id]
	if ok {
		delete(d.devices, id)
	}
	d.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	err := dv.Server.Close()
	<-dv.done
	dv.Dev.Close()
	d.log.WithField("device", id).Info("device removed")
	return err
}

// Device returns a device by ID.
func (d *Daemon) Device(id string) (*Device, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	dv, ok := d.devices[id]
	return dv, ok
}

// Devices returns the devices sorted by ID.
func (d *Daemon) Devices() []*Device {
	d.mu.Lock()
	out := make([]*Device, 0, len(d.devices))
	for _, dv := range d.devices {
		out = append(out, dv)
	}
	d.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// ServeControl serves the control API on a unix socket at path.
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
	srv := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 5 * time.Second}
	d.mu.Lock()
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

// Close removes every device and stops the control API.
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
		errs = append(errs, d.RemoveDevice(id))
	}
	d.wg.Wait()
	return errors.Join(errs...)
}
