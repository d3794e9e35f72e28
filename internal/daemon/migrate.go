package daemon

import (
	"fmt"

	"github.com/vrdma/vrdma/backend/rdma"
)

// Live migration between two QEMUs on this host (docs/state.md, "Through
// QEMU's device-state protocol"): the destination QEMU's device is added
// incoming (AddRequest.Incoming) with the source device's UUID; QEMU loads
// the source's state into it, which moves the identity over (rdma,
// identity.go). The state file follows the identity: an incoming device
// is not listed (a restart would bring back a device with nothing to
// load, under an identity the source holds), a migrated-in one is, and a
// migrated-out one is not any more (its identity is the destination's; it
// waits to be removed). The file is rewritten when the identity moves.

// migratedIn follows the load of a migration's state into the incoming
// device id: the state file lists it from now on, and its source no
// more. It runs on the device's session goroutine, inside its
// CHECK_DEVICE_STATE, so the save runs on a goroutine of its own: an
// upgrade holds d.mu while it waits for the sessions to pause.
func (d *Daemon) migratedIn(id string) {
	d.log.WithField("device", id).Info("device migrated in: it holds its identity, its source migrated out")
	// The device's server goroutine, which runs this, holds the count
	// above 0: Close's Wait cannot have returned.
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.mu.Lock()
		if !d.closed && d.state != nil {
			_ = d.saveLocked("the migration into device " + id) // a failure is a health problem (persistLocked)
		}
		d.mu.Unlock()
		d.notifyChanged()
	}()
}

// migratingLocked returns an error naming a device that takes part in a
// same-host migration that is not over (incoming, or migrated out and
// not removed): a live upgrade cannot hand such a device over (two
// devices of one identity, one of which holds nothing). d.mu is held.
func (d *Daemon) migratingLocked() error {
	for _, dv := range d.sortedLocked() {
		switch m := dv.Dev.Migration(); m {
		case rdma.MigrationIncoming, rdma.MigrationOut:
			return fmt.Errorf("device %s is %s (a migration on this host): finish it and remove the source before an upgrade", dv.ID, m)
		}
	}
	return nil
}

// prepareIncomingLocked checks spec against the devices served: a UUID
// has at most one incoming destination (the load moves the identity from
// the device holding it, which must be the source), and neither an
// incoming device nor any other may be added while one waits for it. An
// incoming spec gets its hook (migratedIn). d.mu is held.
func (d *Daemon) prepareIncomingLocked(spec *DeviceSpec) error {
	for _, o := range d.devices {
		if o.Dev.UUID() == spec.Device.UUID && o.Dev.Migration() == rdma.MigrationIncoming {
			return fmt.Errorf("%w: device %s is the incoming destination of uuid %s", ErrExists, o.ID, spec.Device.UUID)
		}
	}
	if spec.Device.Incoming {
		id := spec.ID
		spec.Device.OnMigratedIn = func() { d.migratedIn(id) }
	}
	return nil
}
