package rdma

import (
	"errors"
	"net/netip"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The port's GID table: what the control API shows of it, the operator's
// assignment, and the driver's ADD_GID and DEL_GID.

// GIDEntry is a filled entry of the port's GID table.
type GIDEntry struct {
	Index int
	GID   [16]byte
}

// GIDs returns the filled entries of the port's GID table in index order:
// entry 0, the port GID, and those the driver added (ADD_GID).
func (d *Device) GIDs() []GIDEntry {
	var out []GIDEntry
	for i := range abi.GIDTableLen {
		if g, ok := d.eng.GIDAt(i); ok {
			out = append(out, GIDEntry{Index: i, GID: g})
		}
	}
	return out
}

func (d *Device) hasGID(index uint32) bool {
	_, ok := d.eng.GIDAt(int(index))
	return ok
}

// SetAllowedGIDs replaces the addresses the operator assigned the device
// (Config.AllowedGIDs); entries already in its GID table stay.
func (d *Device) SetAllowedGIDs(prefixes []netip.Prefix) { d.eng.SetAllowedGIDs(prefixes) }

// AllowedGIDs returns the addresses the operator assigned the device.
func (d *Device) AllowedGIDs() []netip.Prefix { return d.eng.AllowedGIDs() }

// addGID writes an entry of the port's GID table (docs/spec.md, "The GID
// table"): "ADD_GID of a GID the operator did not assign to the device
// answers ACCESS … of a GID that another device's table holds answers BUSY
// and changes nothing."
func (d *Device) addGID(req []byte) error {
	var g abi.GIDEntry
	if _, err := decode(req, &g, false); err != nil {
		return err
	}
	if g.PortNum != 1 || g.Index >= abi.GIDTableLen || g.GIDType > abi.GIDTypeRoCEv2 ||
		g.Reserved != 0 || g.GID == ([16]byte{}) {
		return errStatus(abi.StatusInvalid)
	}
	if err := d.eng.SetGID(int(g.Index), g.GID); err != nil {
		if errors.Is(err, engine.ErrGIDNotAllowed) {
			d.log.WithField("gid", netip.AddrFrom16(g.GID).String()).Debug("ADD_GID: not assigned to the device")
			return errStatus(abi.StatusAccess)
		}
		if errors.Is(err, engine.ErrGIDTaken) {
			return errStatus(abi.StatusBusy)
		}
		return errStatus(abi.StatusInvalid)
	}
	return nil
}

// delGID empties an entry of the port's GID table.
func (d *Device) delGID(req []byte) error {
	var g abi.GIDReq
	if _, err := decode(req, &g, false); err != nil {
		return err
	}
	if g.PortNum != 1 || g.Index >= abi.GIDTableLen {
		return errStatus(abi.StatusInvalid)
	}
	if err := d.eng.ClearGID(int(g.Index)); err != nil {
		return errStatus(abi.StatusNotFound)
	}
	return nil
}
