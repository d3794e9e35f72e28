package rdma

import "github.com/vrdma/vrdma/backend/rdma/engine"

// Resource views: the device's objects as its operator lists them (the
// daemon's GET /v1/devices/{id}/qps and friends). The engine copies each
// object under its own lock (engine/snapshot.go); a listing is a page of
// the objects whose handle is above after, in handle order, at most limit
// (limit < 0: all). None of them waits for the data path.

// Census counts the device's objects by kind.
func (d *Device) Census() engine.Census { return d.eng.Census() }

// QPViews lists the device's QPs.
func (d *Device) QPViews(after uint32, limit int) []engine.QPView { return d.eng.QPViews(after, limit) }

// CQViews lists the device's CQs.
func (d *Device) CQViews(after uint32, limit int) []engine.CQView { return d.eng.CQViews(after, limit) }

// SRQViews lists the device's SRQs.
func (d *Device) SRQViews(after uint32, limit int) []engine.SRQView {
	return d.eng.SRQViews(after, limit)
}

// MWViews lists the device's memory windows.
func (d *Device) MWViews(after uint32, limit int) []engine.MWView { return d.eng.MWViews(after, limit) }

// PDViews lists the device's PDs with the objects naming each.
func (d *Device) PDViews(after uint32, limit int) []engine.PDView { return d.eng.PDViews(after, limit) }

// MRViews lists the device's MRs with the bytes each holds pinned. It
// holds d.mu, as a command does, so the pinner (gone while detached) is
// the one the MRs were pinned by.
func (d *Device) MRViews(after uint32, limit int) []engine.MRView {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pinner
	return d.eng.MRViews(after, limit, func(m *engine.MR) uint64 {
		if p == nil {
			return 0
		}
		return p.OwnerPinned(m)
	})
}
