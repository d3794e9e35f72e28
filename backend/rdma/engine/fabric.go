package engine

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Fabric errors.
var (
	// ErrGIDTaken: another device of the fabric holds the GID.
	ErrGIDTaken = errors.New("gid already registered")
	// ErrGIDIndex: the index is outside the GID table, or names an empty
	// entry where a GID is needed.
	ErrGIDIndex = errors.New("gid index out of range or empty")
)

// GIDError is a Fabric error about one GID; it matches its Err.
type GIDError struct {
	GID [16]byte
	Err error
}

func (e *GIDError) Error() string { return fmt.Sprintf("gid %x: %v", e.GID, e.Err) }

// Unwrap returns the sentinel.
func (e *GIDError) Unwrap() error { return e.Err }

// gidSlot is one entry of a device's GID table.
type gidSlot struct {
	gid   [16]byte
	valid bool
}

// Fabric is the daemon-wide registry of devices by GID: a QP of one device
// reaches a QP of another by (GID, QP number). Every device has a GID table
// of abi.GIDTableLen entries (docs/spec.md, "The GID table"); a GID belongs to
// at most one device. The tables live here, under the fabric's lock, so a
// lookup and a table change never race. The zero value is not usable; call
// NewFabric.
type Fabric struct {
	mu      sync.RWMutex
	byGID   map[[16]byte]*RNIC // protected by mu
	members map[*RNIC]struct{} // registered devices (protected by mu)
}

// NewFabric returns an empty fabric.
func NewFabric() *Fabric {
	return &Fabric{byGID: make(map[[16]byte]*RNIC), members: make(map[*RNIC]struct{})}
}

// Register adds d with its GID table reset: entry 0 holds d's port GID. It
// fails with a *GIDError matching ErrGIDTaken if another device has that
// GID; registering d twice is a no-op.
func (f *Fabric) Register(d *RNIC) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.members[d]; ok {
		return nil
	}
	if o, ok := f.byGID[d.gid]; ok && o != d {
		return &GIDError{GID: d.gid, Err: ErrGIDTaken}
	}
	f.members[d] = struct{}{}
	d.gids = [abi.GIDTableLen]gidSlot{{gid: d.gid, valid: true}}
	f.byGID[d.gid] = d
	return nil
}

// Unregister removes d and every GID of its table; peers resolving them
// afterwards find nothing. QPs that already resolved d keep the pointer and
// find its QPs gone after Reset.
func (f *Fabric) Unregister(d *RNIC) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.members[d]; !ok {
		return
	}
	for i := range d.gids {
		f.clearLocked(d, i)
	}
	delete(f.members, d)
}

// ResetGIDs returns d's table to its state after Register (a device reset).
func (f *Fabric) ResetGIDs(d *RNIC) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.members[d]; !ok {
		return
	}
	for i := 1; i < len(d.gids); i++ {
		f.clearLocked(d, i)
	}
	if o, ok := f.byGID[d.gid]; ok && o != d {
		// Another device took the port GID while d's entry 0 was
		// rewritten: entry 0 stays empty rather than shared.
		f.clearLocked(d, 0)
		return
	}
	f.setLocked(d, 0, d.gid)
}

// SetGID writes entry index of d's table (ADD_GID). It fails with
// ErrGIDIndex for an index outside the table and with a *GIDError matching
// ErrGIDTaken when another device holds gid; then nothing changes.
func (f *Fabric) SetGID(d *RNIC, index int, gid [16]byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.members[d]; !ok || index < 0 || index >= len(d.gids) {
		return ErrGIDIndex
	}
	if o, ok := f.byGID[gid]; ok && o != d {
		return &GIDError{GID: gid, Err: ErrGIDTaken}
	}
	f.clearLocked(d, index)
	f.setLocked(d, index, gid)
	return nil
}

// ClearGID empties entry index of d's table (DEL_GID). It fails with
// ErrGIDIndex for an index outside the table or an empty entry.
func (f *Fabric) ClearGID(d *RNIC, index int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.members[d]; !ok || index < 0 || index >= len(d.gids) || !d.gids[index].valid {
		return ErrGIDIndex
	}
	f.clearLocked(d, index)
	return nil
}

// GIDAt returns entry index of d's table and whether it holds a GID.
func (f *Fabric) GIDAt(d *RNIC, index int) ([16]byte, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if _, ok := f.members[d]; !ok || index < 0 || index >= len(d.gids) || !d.gids[index].valid {
		return [16]byte{}, false
	}
	return d.gids[index].gid, true
}

// setLocked puts gid into entry i of d (empty). Precondition: f.mu held,
// gid free or d's.
func (f *Fabric) setLocked(d *RNIC, i int, gid [16]byte) {
	d.gids[i] = gidSlot{gid: gid, valid: true}
	f.byGID[gid] = d
}

// clearLocked empties entry i of d, and forgets the GID when no other entry
// of d holds it. Precondition: f.mu held.
func (f *Fabric) clearLocked(d *RNIC, i int) {
	s := d.gids[i]
	if !s.valid {
		return
	}
	d.gids[i] = gidSlot{}
	for _, o := range d.gids {
		if o.valid && o.gid == s.gid {
			return
		}
	}
	if f.byGID[s.gid] == d {
		delete(f.byGID, s.gid)
	}
}

// Lookup returns the device whose GID table holds gid, or nil.
func (f *Fabric) Lookup(gid [16]byte) *RNIC {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.byGID[gid]
}

// devices returns a snapshot of the registered devices.
func (f *Fabric) devices() []*RNIC {
	f.mu.RLock()
	defer f.mu.RUnlock()
	ds := make([]*RNIC, 0, len(f.members))
	for d := range f.members {
		ds = append(ds, d)
	}
	return ds
}
