package rdma

import (
	"fmt"

	"github.com/vrdma/vrdma/memmap"
)

// Quiesce stops the device's data path for a handover (live upgrade): it
// returns once no engine pass runs on any of its doorbell queues, and
// none starts until Unquiesce; kicks and wakes that arrive meanwhile
// (a driver's doorbell, an RNR timer, a peer's state change) are
// remembered, not lost (the visit marks its queue missed). Lazily
// published indices are then published: the records show everything the
// engine did (a CQ armed through its record that fires posts its event, as
// the pass would have).
//
// The backend Server is frozen first (no command runs). A peer device's
// engine writes this device's receive queues and CQs: quiesce every device
// of the daemon before exporting any (ExportState publishes again).
func (d *Device) Quiesce() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.quiesced.Store(true)
	for _, db := range d.doorbells {
		if db != nil {
			// Waits out the visit in progress; later ones see quiesced.
			db.visitMu.Lock()
			db.visitMu.Unlock() //nolint:staticcheck // an empty critical section: a barrier
		}
	}
	return d.publishAll()
}

// Unquiesce undoes Quiesce (the handover was refused): every doorbell
// queue is polled once, so whatever was kicked meanwhile is served.
func (d *Device) Unquiesce() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.quiesced.Store(false)
	for _, db := range d.doorbells {
		if db != nil {
			db.missed.Store(false)
			db.task.Wake()
		}
	}
}

// publishAll stores what the engine published lazily (engine.Quiesced),
// containing a fault of the guest memory. Precondition: d.mu held; no
// engine pass runs on the device.
func (d *Device) publishAll() error {
	if d.memory == nil {
		return nil
	}
	t := d.memory.Acquire()
	if t == nil {
		return nil
	}
	defer t.Release()
	if err := memmap.Guard(func() { d.eng.Quiesced(t) }); err != nil {
		return fmt.Errorf("publish indices: %w", err)
	}
	return nil
}
