package engine

import (
	"errors"

	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// RepointPeers runs after d took up the state of a device migrated to it
// (rdma.Device.LoadState): d has the source's UUID, so its port GID, GIDs
// and QP numbers. It connects the RC QPs of the fabric's other devices
// that were connected to the source, and whose dgid now resolves to d:
//
//   - a QP whose peer is the source's RNIC, on this daemon (a QP keeps the
//     device it resolved at INIT→RTR): a peer with d's port GID, the same
//     identity, that is not d;
//   - a QP imported (migrated too, before d) whose peer did not resolve
//     then: connected (RTR or RTS, not over the network) with no peer,
//     which only an import leaves (INIT→RTR refuses a dgid nobody holds).
//
// It returns how many it connected. Only a device of d's own identity is
// ever replaced, so no tenant's QP is moved to a device it did not
// connect to.
func (d *RNIC) RepointPeers() int {
	if d.fabric == nil {
		return 0
	}
	n := 0
	for _, o := range d.fabric.devices() {
		if o == d {
			continue
		}
		for _, q := range o.allQPs() {
			// The fabric lock is a leaf: resolve without q.mu, then set
			// the peer only if it is still the one looked at.
			q.mu.Lock()
			old, dgid, st, nq := q.peer, q.attr.DGID, q.attr.QPState, q.net
			q.mu.Unlock()
			if q.UD || old == d || (old != nil && old.gid != d.gid) {
				continue
			}
			if old == nil && (nq != nil || (st != abi.QPSRTR && st != abi.QPSRTS)) {
				continue
			}
			if d.fabric.Lookup(dgid) != d {
				continue
			}
			q.mu.Lock()
			if !q.dead && q.peer == old {
				q.peer = d
				n++
			}
			q.mu.Unlock()
		}
	}
	return n
}

// Handoff is an identity moved by Fabric.Handoff, until Commit or Undo.
type Handoff struct {
	f        *Fabric
	src, dst *RNIC
	gids     [abi.GIDTableLen]gidSlot // src's table as it was
	qpns     []uint32                 // src's QP numbers as they were
	udNet    []uint32                 // src's UD QPs detached from the network
	done     bool
}

// Handoff moves the identity of src, a migration's source on this fabric,
// to dst, its destination (docs/state.md, "Through QEMU's device-state
// protocol"): src's GID table (port GID, ADD_GID entries, network GIDs)
// becomes dst's and src's is emptied, the QP numbers src holds are dst's,
// dst becomes a member of the fabric, and src is migrated out (fenced for
// good: a requester still pointing at it holds its WQEs until it is
// repointed). From then on a lookup by GID or QP number finds dst. It is
// one step under the fabric's locks: no lookup sees both or neither.
//
// src must be a member with dst's port GID (the same UUID), fenced (its
// front-end suspended it: no request of src's is in flight) and not
// migrated out; dst must not be a member (an incoming device). The caller
// imports the state into dst and then calls Commit, or Undo if the import
// failed.
func (f *Fabric) Handoff(src, dst *RNIC) (*Handoff, error) {
	if src == dst || src.fabric != f || dst.fabric != f {
		return nil, errors.New("handoff: not two devices of this fabric")
	}
	h, err := f.handoffLocked(src, dst)
	if err != nil {
		return nil, err
	}
	h.detachUD()
	return h, nil
}

// handoffLocked is Handoff's step under the fabric's locks.
func (f *Fabric) handoffLocked(src, dst *RNIC) (*Handoff, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case !f.isMember(src):
		return nil, errors.New("handoff: the source is not on the fabric")
	case f.isMember(dst):
		return nil, errors.New("handoff: the destination is on the fabric already")
	case src.gid != dst.gid:
		return nil, &GIDError{GID: dst.gid, Err: errors.New("held by a device of another identity")}
	case src.migratedOut.Load():
		return nil, errors.New("handoff: the source migrated out already")
	case !src.fenced.Load():
		return nil, errors.New("handoff: the source is running (not suspended by its front-end)")
	}
	h := &Handoff{f: f, src: src, dst: dst, gids: src.gids}
	dst.gids = [abi.GIDTableLen]gidSlot{}
	for i, s := range h.gids {
		if !s.valid {
			continue
		}
		f.clearLocked(src, i)
		f.setLocked(dst, i, s.gid)
	}
	f.members[dst] = struct{}{}
	f.qpnMu.Lock()
	for num, o := range f.qpns {
		if o == src {
			f.qpns[num] = dst
			f.handed[num] = dst
			h.qpns = append(h.qpns, num)
		}
	}
	f.qpnMu.Unlock()
	src.migratedOut.Store(true)
	return h, nil
}

// detachUD detaches src's UD QPs from the network: their QP numbers are
// dst's now, and dst's import attaches its own (ReattachUD). src is
// fenced and suspended: no pass of its engine runs. It takes the QPs'
// mu and the network's locks, with no fabric lock held.
func (h *Handoff) detachUD() {
	for _, q := range h.src.allQPs() {
		if !q.UD {
			continue
		}
		q.mu.Lock()
		un := q.udNet
		q.udNet = nil
		q.mu.Unlock()
		if un != nil {
			un.conn.Close()
			h.udNet = append(h.udNet, q.Num)
		}
	}
}

// IdentityHolder returns the registered device whose port GID is gid and
// that did not migrate out — a migration's source, whether or not its
// table still holds that GID (a driver may delete entry 0) — or nil.
func (f *Fabric) IdentityHolder(gid [16]byte) *RNIC {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if o := f.byGID[gid]; o != nil && o.gid == gid && !o.migratedOut.Load() {
		return o
	}
	for o := range f.members {
		if o.gid == gid && !o.migratedOut.Load() {
			return o
		}
	}
	return nil
}

// isMember reports whether d is registered. Precondition: f.mu held.
func (f *Fabric) isMember(d *RNIC) bool {
	_, ok := f.members[d]
	return ok
}

// Commit ends the handoff: the identity stays dst's. dst's peers on the
// fabric are connected to it (RepointPeers) and woken.
func (h *Handoff) Commit() {
	if h.done {
		return
	}
	h.done = true
	f := h.f
	f.qpnMu.Lock()
	for num, o := range f.handed {
		if o == h.dst {
			// The state held no QP of this number: free it.
			delete(f.handed, num)
			if f.qpns[num] == h.dst {
				delete(f.qpns, num)
			}
		}
	}
	f.qpnMu.Unlock()
	h.dst.RepointPeers()
	h.dst.kickRequesters()
}

// Undo gives the identity back to src as it was before Handoff (the load
// into dst failed; dst has released its objects): dst leaves the fabric
// with an empty table, src's table and QP numbers are restored, src is no
// longer migrated out (it stays fenced while its front-end has it
// suspended), and a peer that connected to dst meanwhile is connected to
// src again.
func (h *Handoff) Undo() {
	if h.done {
		return
	}
	h.done = true
	f, src, dst := h.f, h.src, h.dst
	f.mu.Lock()
	for i := range dst.gids {
		f.clearLocked(dst, i)
	}
	delete(f.members, dst)
	for i, s := range h.gids {
		if !s.valid {
			continue
		}
		f.clearLocked(src, i)
		if o, ok := f.byGID[s.gid]; ok && o != src && !f.isNetGIDLocked(src, s.gid) {
			continue // taken meanwhile (never by dst: it left)
		}
		f.setLocked(src, i, s.gid)
	}
	f.qpnMu.Lock()
	for num, o := range f.qpns {
		if o == dst {
			delete(f.qpns, num)
		}
	}
	for num, o := range f.handed {
		if o == dst {
			delete(f.handed, num)
		}
	}
	for _, num := range h.qpns {
		if _, ok := f.qpns[num]; !ok {
			f.qpns[num] = src
		}
	}
	f.qpnMu.Unlock()
	src.migratedOut.Store(false)
	f.mu.Unlock()
	for _, num := range h.udNet {
		if err := src.ReattachUD(num); err != nil {
			src.log.WithError(err).WithField("qp", num).Warn("handoff undone: the UD QP is not attached to the network again")
		}
	}
	src.RepointPeers()
}

// Unresolved returns the numbers of d's RC QPs that are connected (RTR,
// RTS or SQD), not over the network, and have no peer device: after a
// migration's load on a daemon where the source did not run, the QPs
// whose peer stayed on the source's host. Nothing on this host can carry
// them (a same-host QP does not become a RoCEv2 one).
func (d *RNIC) Unresolved() []uint32 {
	var out []uint32
	for _, q := range d.allQPs() {
		q.mu.Lock()
		st, peer, nq := q.attr.QPState, q.peer, q.net
		q.mu.Unlock()
		if q.UD || nq != nil || peer != nil {
			continue
		}
		if st == abi.QPSRTR || st == abi.QPSRTS || st == abi.QPSSQD {
			out = append(out, q.Num)
		}
	}
	return out
}

// HoldNet freezes (on) the transports of d's QPs connected over the
// network, or lets go (off) the ones it froze and the ones restored
// frozen from a migration's state (RestoreNet). A live migration's source
// holds them when its VM stops (rdma.Device.Suspend while QEMU logs dirty
// pages): from then on a packet from the peer is dropped rather than
// written into guest memory QEMU has copied or acknowledged in a state
// already saved, and nothing is sent, so the state SaveState writes is
// the connection's last. The peer retransmits what it sends meanwhile (RC
// covers the blackout). If the migration fails, the source's rings start
// again and HoldNet(false) resumes the QPs where they stopped; if it
// succeeds, the destination's first ring start lets the restored copies
// go, and they retransmit from their oldest unacknowledged PSN. A
// multipath (spray) connection cannot be frozen: it runs on, and the
// save refuses it. It returns how many QPs it froze or let go.
func (d *RNIC) HoldNet(on bool) int {
	n := 0
	for _, q := range d.allQPs() {
		q.mu.Lock()
		nq := q.net
		q.mu.Unlock()
		if nq == nil || nq.conn == nil || nq.closed.Load() {
			continue
		}
		f, ok := nq.conn.(rc.Freezer)
		if !ok {
			continue
		}
		if on {
			if nq.held.Load() {
				continue
			}
			if _, err := f.Freeze(); err != nil {
				continue // in error: the QP is in ERR, nothing to carry
			}
			nq.held.Store(true)
			n++
			continue
		}
		if nq.held.Swap(false) {
			f.Thaw()
			n++
			// A WQE the frozen transport refused waits at the head.
			d.wakeQueue(q.DoorbellQueue)
		}
	}
	return n
}
