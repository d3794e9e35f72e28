package engine

import "time"

// Fencing (docs/state.md, "Through QEMU's device-state protocol"): while a
// device is fenced, no same-host requester writes into its guest memory.
// A device is fenced while its front-end has it suspended (every ring
// stopped, the VM stopped: a migration's source between QEMU's last RAM
// pass and the end of the migration, or a paused VM), while it waits for a
// migration's state (an incoming device), and for good once its identity
// moved to a migration's destination (migrated out).
//
// What a fence does to a request into the device:
//
//   - RC: the requester holds the WQE at the head of its send queue, as
//     after receiver-not-ready but without consuming an RNR retry (the
//     peer is not refusing, it is not there yet), and retries it when the
//     fence lifts or the fabric points it at the destination
//     (kickRequesters), or when its backstop timer fires (fenceDelay).
//   - UD, same host or from the network: the datagram is dropped and
//     counted (Stats.UDDropped), as a wire drops datagrams to a port that
//     is down; a UD QP that held its head would stop sending to every
//     other destination too.
//
// The fence is checked under the responder QP's rqMu, which every request
// holds while it touches the responder's memory (respond, deliver,
// udNet.receive): SetFence(true) takes every QP's rqMu once after setting
// the flag, so when it returns no request that started before is still
// writing, and none that starts after writes. What requesters published
// lazily (publishPeer) stores indices the device's own publication
// (Quiesced) stores too: the same values.

// fenceDelay is the first backstop wait of a fenced WQE; each further
// wait doubles it up to fenceDelayMax. Lifting the fence and a handoff
// wake the requesters at once: the timer only bounds a wake that was
// missed, and the backoff keeps a long pause (a stopped VM) from costing
// its peers more than a few wake-ups a second.
const (
	fenceDelay    = time.Millisecond
	fenceDelayMax = 128 * time.Millisecond
)

// SetFence fences the device (on) or lifts its fence. Fencing returns once
// no request into the device is in flight; it must not be called with any
// QP lock held. A migrated-out device stays fenced: lifting its fence is a
// no-op (it returns false). Lifting wakes every requester of the fabric
// whose peer is the device.
func (d *RNIC) SetFence(on bool) bool {
	if on {
		d.fenced.Store(true)
		for _, q := range d.allQPs() {
			// A barrier: the request in progress under rqMu ends,
			// the ones after see the flag.
			q.rqMu.Lock()
			q.rqMu.Unlock() //nolint:staticcheck // an empty critical section: a barrier
		}
		return true
	}
	if d.migratedOut.Load() {
		return false
	}
	if d.fenced.Swap(false) {
		d.kickRequesters()
	}
	return true
}

// Fenced reports whether the device is fenced.
func (d *RNIC) Fenced() bool { return d.fenced.Load() }

// MigratedOut reports whether the device's identity (GIDs, QP numbers)
// moved to a migration's destination (Fabric.Handoff).
func (d *RNIC) MigratedOut() bool { return d.migratedOut.Load() }

// kickRequesters makes every RC QP of the fabric's other devices whose
// peer is d retry its head WQE now (a WQE held by d's fence).
func (d *RNIC) kickRequesters() {
	if d.fabric == nil {
		return
	}
	for _, o := range d.fabric.devices() {
		if o == d {
			continue
		}
		for _, q := range o.allQPs() {
			q.mu.Lock()
			hit := q.peer == d && !q.dead
			q.mu.Unlock()
			if hit {
				q.rnrKick.Store(true)
				o.wakeQueue(q.DoorbellQueue)
			}
		}
	}
}

// fenceHold holds the head WQE of q, whose peer is fenced: it is retried
// after the backstop delay or when kicked. Precondition: q's sqMu held.
func (q *QP) fenceHold(now int64) outcome {
	delay := min(fenceDelay<<q.fenceWaits, fenceDelayMax)
	if delay < fenceDelayMax {
		q.fenceWaits++
	}
	q.Dev.fenceHeld.Add(1)
	return q.holdHead(now, delay)
}

// fencedDrop reports whether a datagram for pq must be dropped because
// its device is fenced, and counts it. Precondition: pq's rqMu held.
func fencedDrop(pq *QP) bool {
	if pq.Dev == nil || !pq.Dev.fenced.Load() {
		return false
	}
	pq.countUDDrop()
	return true
}
