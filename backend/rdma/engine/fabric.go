package engine

import (
	"errors"
	"fmt"
	"net/netip"
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
	// ErrGIDNotAllowed: the device may not hold the GID: it is outside
	// the addresses its operator assigned (RNIC.SetAllowedGIDs), or it is
	// a network address of a host (this daemon's, or a remote peer's).
	ErrGIDNotAllowed = errors.New("gid not assigned to the device")
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
//
// A fabric may also reach other hosts through a Network (SetNetwork). The
// GIDs of the host addresses it sends from are network GIDs: every device
// has them in its table (entries 1, 2, … after a reset), they are shared
// rather than owned, and a dgid that no device owns is a peer on the
// network. A QP connected over the network is found by its QP number
// alone, so the fabric keeps QP numbers unique among its devices.
type Fabric struct {
	mu      sync.RWMutex
	byGID   map[[16]byte]*RNIC // protected by mu
	members map[*RNIC]struct{} // registered devices (protected by mu)
	net     Network            // protected by mu; nil: this host only
	netGIDs [][16]byte         // protected by mu; immutable slices

	// remote counts, per GID, the QPs connected over the network to a
	// peer with that GID: a remote host's address, which no device may
	// claim while it is in use (protected by mu).
	remote map[[16]byte]int
	// conns holds, per remote QP (its GID and number), the network QP
	// of this daemon connected to it: an RC QP has one peer, so a second
	// QP of this host may not connect to it (protected by mu).
	conns map[remoteQP]*netQP

	qpnMu sync.Mutex       // a leaf, taken under RNIC.mu
	qpns  map[uint32]*RNIC // QP numbers in use (protected by qpnMu)
	// handed are the QP numbers a Handoff gave a device that no QP of it
	// holds yet: its import claims them (ClaimHandle; protected by
	// qpnMu).
	handed map[uint32]*RNIC
}

// NewFabric returns an empty fabric.
func NewFabric() *Fabric {
	return &Fabric{byGID: make(map[[16]byte]*RNIC), members: make(map[*RNIC]struct{}),
		qpns: make(map[uint32]*RNIC), handed: make(map[uint32]*RNIC), remote: make(map[[16]byte]int), conns: make(map[remoteQP]*netQP)}
}

// SetNetwork gives the fabric its network and the GIDs of the host
// addresses that network sends from (IPv4-mapped or IPv6; at most
// abi.GIDTableLen−1 are used). Devices registered afterwards, and devices
// reset afterwards, have them at entries 1, 2, … of their tables.
func (f *Fabric) SetNetwork(n Network, gids [][16]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.net = n
	f.netGIDs = append([][16]byte(nil), gids...)
}

// network returns the fabric's network, or nil.
func (f *Fabric) network() Network {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.net
}

// netGIDsOf returns d's network GIDs: its own (RNIC.SetNetGIDs) or else the
// fabric's. Precondition: f.mu held.
func (f *Fabric) netGIDsOf(d *RNIC) [][16]byte {
	if d.netGIDs != nil {
		return d.netGIDs
	}
	return f.netGIDs
}

// isNetGIDLocked reports whether gid is one of d's network GIDs.
// Precondition: f.mu held.
func (f *Fabric) isNetGIDLocked(d *RNIC, gid [16]byte) bool {
	for _, g := range f.netGIDsOf(d) {
		if g == gid {
			return true
		}
	}
	return false
}

// resetTableLocked writes d's table as after a reset: the port GID at 0
// (empty if another device owns it), the network GIDs after it.
// Precondition: f.mu held, every entry of d empty.
func (f *Fabric) resetTableLocked(d *RNIC) {
	if o, ok := f.byGID[d.gid]; !ok || o == d {
		f.setLocked(d, 0, d.gid)
	}
	for i, g := range f.netGIDsOf(d) {
		if i+1 >= len(d.gids) {
			break
		}
		f.setLocked(d, i+1, g)
	}
}

// claimQPN records that d's QP num exists; false if another device's does.
func (f *Fabric) claimQPN(d *RNIC, num uint32) bool {
	f.qpnMu.Lock()
	defer f.qpnMu.Unlock()
	if o, ok := f.qpns[num]; ok && o != d {
		return false
	}
	f.qpns[num] = d
	return true
}

// qpnReserved reports whether any device holds or reserved QP num.
func (f *Fabric) qpnReserved(num uint32) bool {
	f.qpnMu.Lock()
	defer f.qpnMu.Unlock()
	_, ok := f.qpns[num]
	return ok
}

// qpnTaken reports whether another device than d has a QP num.
func (f *Fabric) qpnTaken(d *RNIC, num uint32) bool {
	f.qpnMu.Lock()
	defer f.qpnMu.Unlock()
	o, ok := f.qpns[num]
	return ok && o != d
}

// takeHanded claims QP number num for d's import if a Handoff gave it to
// d: true once (the number is d's already).
func (f *Fabric) takeHanded(d *RNIC, num uint32) bool {
	f.qpnMu.Lock()
	defer f.qpnMu.Unlock()
	if f.handed[num] != d || f.qpns[num] != d {
		return false
	}
	delete(f.handed, num)
	return true
}

// QPNOwner returns the device holding QP number num on the fabric, or nil.
func (f *Fabric) QPNOwner(num uint32) *RNIC {
	f.qpnMu.Lock()
	defer f.qpnMu.Unlock()
	return f.qpns[num]
}

// releaseQPN forgets d's QP num.
func (f *Fabric) releaseQPN(d *RNIC, num uint32) {
	f.qpnMu.Lock()
	defer f.qpnMu.Unlock()
	if f.qpns[num] == d {
		delete(f.qpns, num)
	}
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
	d.gids = [abi.GIDTableLen]gidSlot{}
	f.resetTableLocked(d)
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
	for i := range d.gids {
		f.clearLocked(d, i)
	}
	// Another device may have taken the port GID while d's entry 0 was
	// rewritten: entry 0 then stays empty rather than shared.
	f.resetTableLocked(d)
}

// SetGID writes entry index of d's table (ADD_GID). It fails with
// ErrGIDIndex for an index outside the table, with a *GIDError matching
// ErrGIDNotAllowed when d may not hold gid (mayHoldLocked), and with one
// matching ErrGIDTaken when another device holds it; then nothing
// changes. Not-allowed is decided first, so a device learns nothing of
// other devices' GIDs by trying them.
func (f *Fabric) SetGID(d *RNIC, index int, gid [16]byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.members[d]; !ok || index < 0 || index >= len(d.gids) {
		return ErrGIDIndex
	}
	if !f.mayHoldLocked(d, gid) {
		return &GIDError{GID: gid, Err: ErrGIDNotAllowed}
	}
	if o, ok := f.byGID[gid]; ok && o != d && !f.isNetGIDLocked(d, gid) {
		return &GIDError{GID: gid, Err: ErrGIDTaken}
	}
	f.clearLocked(d, index)
	f.setLocked(d, index, gid)
	return nil
}

// mayHoldLocked reports whether d may put gid in its table: its port GID
// (in both EUI-64 forms: flipUL) and its own network GIDs (shared) always; never a host's network address
// — a network GID of the fabric or of another device (the daemon's
// --roce-bind addresses, devices' roce_bind), nor the GID of a remote peer
// a QP is connected to over the network —, so that a local claim never
// shadows a network destination; otherwise only GIDs within the prefixes
// its operator assigned (RNIC.SetAllowedGIDs; none by default).
// Precondition: f.mu held.
func (f *Fabric) mayHoldLocked(d *RNIC, gid [16]byte) bool {
	if gid == d.gid || gid == flipUL(d.gid) || f.isNetGIDLocked(d, gid) {
		return true
	}
	if f.remote[gid] > 0 {
		return false
	}
	for _, g := range f.netGIDs {
		if g == gid {
			return false
		}
	}
	for o := range f.members {
		for _, g := range o.netGIDs {
			if g == gid {
				return false
			}
		}
	}
	a := netip.AddrFrom16(gid).Unmap()
	for _, p := range d.allowed {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// flipUL is gid with the universal/local bit of its interface identifier
// flipped: the port GID fe80::GUID in the form a guest's RoCE stack
// derives from the paired NIC's MAC (its default GID and IPv6 link-local
// address use the modified EUI-64). Device GUIDs are locally administered,
// so this form is never another device's port GID.
func flipUL(gid [16]byte) [16]byte {
	gid[8] ^= 0x02
	return gid
}

// remoteQP names a QP on another host.
type remoteQP struct {
	gid [16]byte
	qpn uint32
}

// claimConn records that n connects over the network to the QP qpn of the
// peer with gid, and so that gid is a network destination (mayHoldLocked).
// It fails if another QP of this daemon is connected to that QP: an RC QP
// answers one peer, and the peer's host tells this host's QPs apart by
// address and port alone (docs/security.md: a tenant of this host cannot
// borrow another tenant's connection to a remote QP).
func (f *Fabric) claimConn(gid [16]byte, qpn uint32, n *netQP) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := remoteQP{gid, qpn}
	if o := f.conns[k]; o != nil && o != n {
		return false
	}
	f.conns[k] = n
	f.remote[gid]++
	return true
}

// releaseConn undoes claimConn once n's transport closed.
func (f *Fabric) releaseConn(gid [16]byte, qpn uint32, n *netQP) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := remoteQP{gid, qpn}
	if f.conns[k] != n {
		return
	}
	delete(f.conns, k)
	if f.remote[gid]--; f.remote[gid] <= 0 {
		delete(f.remote, gid)
	}
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

// setLocked puts gid into entry i of d (empty). A network GID is shared,
// not owned: it stays out of byGID. Precondition: f.mu held, gid free or
// d's or a network GID of d.
func (f *Fabric) setLocked(d *RNIC, i int, gid [16]byte) {
	d.gids[i] = gidSlot{gid: gid, valid: true}
	if !f.isNetGIDLocked(d, gid) {
		f.byGID[gid] = d
	}
}

// NetGIDs returns d's network GIDs (RNIC.SetNetGIDs, else the fabric's).
func (f *Fabric) NetGIDs(d *RNIC) [][16]byte {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.netGIDsOf(d)
}

// IsNetGID reports whether gid is one of d's network GIDs: a host address
// the fabric's network sends from.
func (f *Fabric) IsNetGID(d *RNIC, gid [16]byte) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.net != nil && f.isNetGIDLocked(d, gid)
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
