package daemon

import (
	"fmt"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/backend/rdma/hostnic"
)

// pickRNIC gives spec's device the host NIC its RNIC names, if any.
func (d *Daemon) pickRNIC(spec *DeviceSpec) error {
	name := spec.RNIC
	if name == "" {
		name = d.cfg.RNIC
	}
	if name == "" {
		name = "soft"
	}
	s, err := hostnic.ParseSpec(name)
	if err != nil {
		return err
	}
	if !s.Verbs {
		return nil
	}
	if len(spec.RoCEBind) > 0 {
		return fmt.Errorf("rnic %s: roce_bind is the software RNIC's network; a verbs device sends through its NIC", s)
	}
	open := d.cfg.OpenNIC
	if open == nil {
		open = func(s hostnic.Spec) (rdma.HostNIC, error) { return hostnic.Open(s, d.log) }
	}
	nic, err := open(s)
	if err != nil {
		return err
	}
	spec.Device.NIC = nic
	return nil
}
