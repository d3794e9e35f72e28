package rdma

import (
	"fmt"
	"net/netip"

	"github.com/vrdma/vrdma/backend/rdma/engine"
)

// HostNIC is a host RDMA NIC a device's work can run on: the "verbs" RNIC
// (package backend/rdma/hostnic implements it over rdma-core's
// libibverbs). The device model, its rings and its control commands stay
// this package's and the engine's; the NIC holds the objects and moves the
// data (engine/nic.go has the seam).
type HostNIC interface {
	engine.NIC
	// Limits are the NIC's own; they cap the device's (Limits.Min).
	Limits() Limits
	// ActiveMTU is the host port's active MTU (abi.MTU256 … abi.MTU4096).
	ActiveMTU() uint32
	// GIDs are the host port's RoCE v2 GIDs, in the host table's order.
	GIDs() [][16]byte
}

// RNIC names what executes the device's work: "soft" (the software RNIC)
// or the host NIC's name ("verbs:mlx5_0:1").
func (d *Device) RNIC() string {
	if d.cfg.NIC != nil {
		return d.cfg.NIC.Name()
	}
	return "soft"
}

// Min returns l with every field capped by o's where o's is not zero.
func (l Limits) Min(o Limits) Limits {
	c := func(v *uint32, w uint32) {
		if w != 0 && w < *v {
			*v = w
		}
	}
	c(&l.MaxQP, o.MaxQP)
	c(&l.MaxQPWR, o.MaxQPWR)
	c(&l.MaxSGE, o.MaxSGE)
	c(&l.MaxCQ, o.MaxCQ)
	c(&l.MaxCQE, o.MaxCQE)
	c(&l.MaxMR, o.MaxMR)
	c(&l.MaxPD, o.MaxPD)
	c(&l.MaxAH, o.MaxAH)
	c(&l.MaxMRExtents, o.MaxMRExtents)
	c(&l.MaxInlineData, o.MaxInlineData)
	c(&l.MaxQPRdAtom, o.MaxQPRdAtom)
	c(&l.MaxSRQ, o.MaxSRQ)
	if o.MaxMRSize != 0 && o.MaxMRSize < l.MaxMRSize {
		l.MaxMRSize = o.MaxMRSize
	}
	return l
}

// selectGIDs returns the GIDs of nic's port a device may send from: those
// within the addresses its operator assigned (allowed), or every one when
// none are assigned. A device's QPs send from these GIDs only; the host
// NIC itself does not keep tenants apart, the operator's assignment does
// (docs/security.md).
func selectGIDs(nic HostNIC, allowed []netip.Prefix) ([][16]byte, error) {
	all := nic.GIDs()
	if len(all) == 0 {
		return nil, fmt.Errorf("%s has no RoCE v2 GID (is an address configured on its netdev?)", nic.Name())
	}
	if len(allowed) == 0 {
		return all, nil
	}
	var out [][16]byte
	for _, g := range all {
		a := netip.AddrFrom16(g).Unmap()
		for _, p := range allowed {
			if p.Contains(a) || p.Contains(netip.AddrFrom16(g)) {
				out = append(out, g)
				break
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("none of the device's assigned addresses %v is a GID of %s", allowed, nic.Name())
	}
	return out, nil
}
