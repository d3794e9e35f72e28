package rdma

import (
	"errors"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The address handle commands: CREATE_AH and DESTROY_AH.

func (d *Device) createAH(req []byte) (any, error) {
	var c abi.CreateAH
	if _, err := decode(req, &c, false); err != nil {
		return nil, err
	}
	h, err := d.addAH(&c, 0)
	if err != nil {
		return nil, err
	}
	return &abi.Handle{Handle: h}, nil
}

// addAH checks a CREATE_AH request and adds the AH with handle want (0:
// a new one).
func (d *Device) addAH(c *abi.CreateAH, want uint32) (uint32, error) {
	switch {
	case c.Reserved != 0 || c.PortNum != 1 || c.SGIDIndex >= abi.GIDTableLen:
		return 0, errStatus(abi.StatusInvalid)
	case !d.hasGID(c.SGIDIndex):
		return 0, errStatus(abi.StatusInvalid)
	case !d.eng.HasPD(c.PDN):
		return 0, errStatus(abi.StatusNotFound)
	case uint32(d.eng.Count(engine.KindAH)) >= d.conf.MaxAH:
		return 0, errStatus(abi.StatusNoResources)
	}
	sgid, err := d.eng.ResolveAH(c.SGIDIndex, c.DGID)
	switch {
	case errors.Is(err, engine.ErrRemoteAH):
		// "When the daemon's network does not carry UD, CREATE_AH
		// answers UNSUPPORTED rather than making an AH whose datagrams
		// would vanish."
		return 0, errStatus(abi.StatusUnsupported)
	case err != nil:
		return 0, errStatus(abi.StatusInvalid)
	}
	h, err := d.newHandle(engine.KindAH, 32, want)
	if err != nil {
		return 0, err
	}
	if err := d.eng.AddAH(&engine.AH{Num: h, PD: c.PDN, DGID: c.DGID, SGID: sgid}); err != nil {
		return 0, errStatus(abi.StatusNotFound)
	}
	return h, nil
}

func (d *Device) destroyAH(h uint32) error {
	if d.eng.RemoveAH(h) == nil {
		return errStatus(abi.StatusNotFound)
	}
	return nil
}
