package rdma

import (
	"errors"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The control side of docs/spec.md § Memory windows and fast
// registration: ALLOC_MW, DEALLOC_MW and ALLOC_MR make and free the
// objects that BIND_MW, REG_MR and LOCAL_INV WQEs change on the data path
// (package engine, mw.go). A host NIC's device has none of them.

// memExtFlags are the device_cap_flags of a device with memory windows
// and fast registration.
const memExtFlags = abi.DevCapMemWindow | abi.DevCapMemMgtExt | abi.DevCapMemWindowType2B

// deviceCapFlags is QUERY_DEVICE's device_cap_flags: "MEM_WINDOW,
// MEM_MGT_EXTENSIONS and MEM_WINDOW_TYPE_2B when the device has § Memory
// windows and fast registration" — a software RNIC; 0 with a host NIC.
func (d *Device) deviceCapFlags() uint32 {
	if d.eng.NIC() != nil {
		return 0
	}
	return memExtFlags
}

// mrAccess is the access REG_MR accepts: MW_BIND too "only where the
// device has MWs".
func (d *Device) mrAccess() uint32 {
	if d.eng.NIC() != nil {
		return abi.AccessAll
	}
	return abi.AccessAll | abi.AccessMWBind
}

// allocMW is ALLOC_MW: "type 1 or 2; other values INVALID ... A new MW is
// free ... MWs count against max_mr"; the response is its rkey, key byte
// random.
func (d *Device) allocMW(req []byte) (any, error) {
	var a abi.AllocMW
	if _, err := decode(req, &a, false); err != nil {
		return nil, err
	}
	switch {
	case d.eng.NIC() != nil:
		return nil, errStatus(abi.StatusUnsupported)
	case a.Type != abi.MWType1 && a.Type != abi.MWType2:
		return nil, errStatus(abi.StatusInvalid)
	case !d.eng.HasPD(a.PDN):
		return nil, errStatus(abi.StatusNotFound)
	case uint32(d.eng.Count(engine.KindMR)) >= d.conf.MaxMR:
		return nil, errStatus(abi.StatusNoResources)
	}
	key := d.eng.NewHandle(engine.KindMW, 32)
	if err := d.eng.AddMW(engine.NewMW(key, a.PDN, a.Type)); err != nil { // the PD was checked under d.mu
		return nil, errStatus(abi.StatusNotFound)
	}
	return &abi.Handle{Handle: key}, nil
}

// deallocMW is DEALLOC_MW: "names the MW by its rkey, any key byte; it
// frees a bound window too".
func (d *Device) deallocMW(key uint32) error {
	if d.eng.NIC() != nil {
		return errStatus(abi.StatusUnsupported)
	}
	if errors.Is(d.eng.RemoveMW(key), engine.ErrNoMW) {
		return errStatus(abi.StatusNotFound)
	}
	return nil
}

// allocMR is ALLOC_MR: "max_pages 1 … 4096 ... free (its keys reach
// nothing) until a REG_MR WQE registers memory in it ... The response's
// lkey and rkey are equal ... It counts against max_mr."
func (d *Device) allocMR(req []byte) (any, error) {
	var a abi.AllocMR
	if _, err := decode(req, &a, false); err != nil {
		return nil, err
	}
	switch {
	case d.eng.NIC() != nil:
		return nil, errStatus(abi.StatusUnsupported)
	case a.MaxPages == 0 || a.MaxPages > abi.MaxFastRegPages:
		return nil, errStatus(abi.StatusInvalid)
	case !d.eng.HasPD(a.PDN):
		return nil, errStatus(abi.StatusNotFound)
	case uint32(d.eng.Count(engine.KindMR)) >= d.conf.MaxMR:
		return nil, errStatus(abi.StatusNoResources)
	}
	key := d.eng.NewHandle(engine.KindMR, 32)
	if err := d.eng.AddFRMR(engine.NewFRMR(key, a.PDN, a.MaxPages, d.conf.MaxMRSize)); err != nil {
		return nil, errStatus(abi.StatusNotFound)
	}
	return &abi.MRKeys{LKey: key, RKey: key}, nil
}
