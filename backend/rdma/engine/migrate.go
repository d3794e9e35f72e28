package engine

import "github.com/vrdma/vrdma/virtio/rdma/abi"

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
