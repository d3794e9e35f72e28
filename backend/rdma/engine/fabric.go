package engine

import (
	"errors"
	"fmt"
	"sync"
)

// ErrGIDTaken is returned by Fabric.Register when another device has the GID.
var ErrGIDTaken = errors.New("gid already registered")

// GIDError is a Fabric error about one GID; it matches its Err.
type GIDError struct {
	GID [16]byte
	Err error
}

func (e *GIDError) Error() string { return fmt.Sprintf("gid %x: %v", e.GID, e.Err) }

// Unwrap returns the sentinel.
func (e *GIDError) Unwrap() error { return e.Err }

// Fabric is the daemon-wide registry of devices by GID: a QP of one device
// reaches a QP of another by (GID, QP number). The zero value is not usable;
// call NewFabric.
type Fabric struct {
	mu   sync.RWMutex
	devs map[[16]byte]*Device // protected by mu
}

// NewFabric returns an empty fabric.
func NewFabric() *Fabric { return &Fabric{devs: make(map[[16]byte]*Device)} }

// Register adds d under its GID. It fails with a *GIDError matching
// ErrGIDTaken if another device has the GID; registering d twice is a no-op.
func (f *Fabric) Register(d *Device) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if o, ok := f.devs[d.gid]; ok {
		if o == d {
			return nil
		}
		return &GIDError{GID: d.gid, Err: ErrGIDTaken}
	}
	f.devs[d.gid] = d
	return nil
}

// Unregister removes d; peers resolving its GID afterwards find nothing.
// QPs that already resolved d keep the pointer and find its QPs gone after
// Reset.
func (f *Fabric) Unregister(d *Device) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.devs[d.gid] == d {
		delete(f.devs, d.gid)
	}
}

// Lookup returns the device with gid, or nil.
func (f *Fabric) Lookup(gid [16]byte) *Device {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.devs[gid]
}

// devices returns a snapshot of the registered devices.
func (f *Fabric) devices() []*Device {
	f.mu.RLock()
	defer f.mu.RUnlock()
	ds := make([]*Device, 0, len(f.devs))
	for _, d := range f.devs {
		ds = append(ds, d)
	}
	return ds
}
