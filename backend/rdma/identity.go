package rdma

import (
	"errors"
	"fmt"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/backend/rdma/engine"
)

// A migration between two QEMUs served by the same vrdmad (docs/state.md,
// "Through QEMU's device-state protocol"): the destination is a second
// device of the source's UUID, created incoming (Config.Incoming). Its
// identity — GIDs and QP numbers, unique on a fabric — is the source's,
// so it holds none until a state is loaded into it: LoadState then moves
// them from the source (engine.Fabric.Handoff) in one step, and the
// source is migrated out. Between the source's suspension and the handoff
// the source is fenced (engine/fence.go): same-host peers hold their
// requests instead of writing into memory QEMU has copied already.

// Migration states of a device (Device.Migration; the control API's
// "migration").
const (
	// MigrationIncoming: created incoming, no state loaded yet: the
	// device holds no GID and no QP number, and peers cannot reach it.
	MigrationIncoming = "incoming"
	// MigrationIn: a state was loaded into a device created incoming;
	// it holds the identity and runs as any device.
	MigrationIn = "migrated-in"
	// MigrationOut: the device's identity moved to a migration's
	// destination: it is fenced for good and serves no data path; its
	// objects go when its front-end disconnects (or resets it).
	MigrationOut = "migrated-out"
)

// ErrIdentityHeld: an incoming device was started without a migration
// state while another device of this daemon holds its identity (the
// migration's source, running).
var ErrIdentityHeld = errors.New("the device's identity is held by another device of this vrdmad")

// ErrMigratedOut: the device's identity moved to a migration's
// destination; its objects are the destination's now.
var ErrMigratedOut = errors.New("the device migrated out: its identity is another device's")

var _ backend.Suspender = (*Device)(nil)

// Migration returns the device's migration state: "" (none),
// MigrationIncoming, MigrationIn or MigrationOut.
func (d *Device) Migration() string {
	if d.eng.MigratedOut() {
		return MigrationOut
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.incoming:
		return MigrationIncoming
	case d.migratedIn:
		return MigrationIn
	}
	return ""
}

// Suspend implements backend.Suspender. on: the front-end stopped every
// ring with the driver running (QEMU stopped the VM: a migration's
// source, or a pause): the device is fenced, so that no same-host peer
// writes into its memory from now on, and what the engine published
// lazily is stored (QEMU copies the memory after this). Off: a ring
// starts again: the fence lifts and held peers retry; a migrated-out
// device posts DEVICE_FATAL instead (its objects are the destination's:
// the migration failed after the destination took them, which QEMU does
// not do, or the front-end restarted a VM that migrated); an incoming
// device without a state takes its identity if nobody holds it (else it
// stays fenced and its control queue breaks: handleControl).
func (d *Device) Suspend(on bool) {
	if d.cfg.NIC != nil {
		return // a host NIC's DMA is not the engine's to fence
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if on {
		d.suspended = true
		d.eng.SetFence(true)
		if d.memory != nil && d.memory.Log() != nil {
			// A migration's switch-over (QEMU logs dirty pages): the
			// network QPs stop too (engine.RNIC.HoldNet). A pause
			// leaves them running, as a NIC's DMA goes on into a
			// paused VM.
			if n := d.eng.HoldNet(true); n > 0 {
				d.log.WithField("qps", n).Info("suspended for a migration: network QPs held")
			}
		}
		if err := d.publishAll(); err != nil {
			d.log.WithError(err).Warn("suspend: publishing the engine's indices")
		}
		return
	}
	d.suspended = false
	switch {
	case d.eng.MigratedOut():
		d.fatalPending.Store(true)
		d.log.Warn("rings started on a device that migrated out: DEVICE_FATAL")
	case d.incoming:
		if err := d.claimFreshLocked(); err != nil {
			d.log.WithError(err).Warn("incoming device started without a migration state")
		}
	default:
		d.eng.SetFence(false)
		// A failed migration's source goes on; a destination's
		// restored network QPs start (they retransmit what the
		// source had in flight).
		if n := d.eng.HoldNet(false); n > 0 {
			d.log.WithField("qps", n).Info("network QPs let go")
		}
	}
}

// claimFreshLocked makes an incoming device with no state an ordinary
// one when nobody holds its identity (a migration that never came): it
// registers on the fabric. Precondition: d.mu held, d.incoming.
func (d *Device) claimFreshLocked() error {
	if o := d.cfg.Fabric.IdentityHolder(d.eng.GID()); o != nil {
		return ErrIdentityHeld
	}
	if err := d.cfg.Fabric.Register(d.eng); err != nil {
		return fmt.Errorf("%w: %v", ErrIdentityHeld, err)
	}
	d.incoming = false
	if !d.suspended {
		d.eng.SetFence(false)
	}
	return nil
}

// serving reports whether the driver may issue commands: not while the
// device is incoming with its identity held elsewhere, nor once it
// migrated out. An incoming device whose identity is free takes it here.
func (d *Device) serving() error {
	if d.eng.MigratedOut() {
		return ErrMigratedOut
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.incoming {
		return d.claimFreshLocked()
	}
	return nil
}

// identityClaim is what LoadState did to take the identity of an
// incoming device, so that a failed load undoes it.
type identityClaim struct {
	handoff    *engine.Handoff // from the source on this fabric, or nil
	registered bool            // registered: nobody held the identity
}

// claimForLoad takes the identity for a state being loaded into an
// incoming device: from the device of this fabric with its port GID (the
// migration's source: the same UUID, suspended by its front-end),
// or by registering when none does (the source is on another host). A
// device that is not incoming keeps what it holds (nil claim).
// Precondition: d.mu held.
func (d *Device) claimForLoad() (*identityClaim, error) {
	if !d.incoming {
		return nil, nil
	}
	f := d.cfg.Fabric
	if o := f.Lookup(d.eng.GID()); o != nil && o.GID() != d.eng.GID() {
		return nil, fmt.Errorf("its port GID is held by a device of another identity")
	}
	src := f.IdentityHolder(d.eng.GID())
	if src == nil {
		if err := f.Register(d.eng); err != nil {
			return nil, err
		}
		return &identityClaim{registered: true}, nil
	}
	h, err := f.Handoff(src, d.eng)
	if err != nil {
		return nil, fmt.Errorf("take the identity from the source device: %w", err)
	}
	return &identityClaim{handoff: h}, nil
}

// undo gives back what claimForLoad took; the device stays incoming.
// Precondition: d.mu held.
func (c *identityClaim) undo(d *Device) {
	switch {
	case c == nil:
	case c.handoff != nil:
		c.handoff.Undo()
	case c.registered:
		d.cfg.Fabric.Unregister(d.eng)
	}
}

// commit ends a load that succeeded: the device is migrated in and
// unfenced (QEMU sends the state after the last of the memory: writes
// into it are the destination's), and the peers that were the source's
// are the device's, woken to retry what the fence held. Precondition:
// d.mu held.
func (c *identityClaim) commit(d *Device) {
	d.incoming, d.migratedIn = false, true
	if !d.suspended {
		d.eng.SetFence(false)
	}
	if c.handoff != nil {
		c.handoff.Commit()
	} else {
		d.eng.RepointPeers()
	}
}
