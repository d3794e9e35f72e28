package backend

import (
	"fmt"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// The guest memory table: SET_MEM_TABLE, ADD_MEM_REG and REM_MEM_REG map
// regions, swap the table the rings and the device read through, and tell
// the device.

// mapRegions maps the regions of a memory-table message, taking its fds.
// A region identical to one of the current table (same addresses, same
// file) is reused rather than mapped again, so the pins on it survive the
// front-end sending the table again. On error every region obtained so far
// is released.
func (s *session) mapRegions(m *vu.Message, regions []vu.MemoryRegion) ([]*memmap.Region, error) {
	cur := s.mem.Acquire()
	defer cur.Release()
	out := make([]*memmap.Region, 0, len(regions))
	for i, mr := range regions {
		fd, err := m.TakeFd(i)
		if err == nil {
			spec := memmap.RegionSpec{
				GuestAddr:  abi.GPA(mr.GuestAddr),
				Size:       mr.Size,
				UserAddr:   memmap.UVA(mr.UserAddr),
				MmapOffset: mr.MmapOffset,
			}
			r := cur.Reuse(fd, spec)
			if r == nil {
				r, err = memmap.MapRegion(fd, spec)
			}
			if err == nil {
				out = append(out, r)
				continue
			}
		}
		for _, r := range out {
			r.Release()
		}
		return nil, fmt.Errorf("region %d: %w", i, err)
	}
	return out, nil
}

func (s *session) setMemTable(m *vu.Message) error {
	mt, err := vu.DecodeMemTable(m.Payload)
	if err != nil {
		return err
	}
	regions, err := s.mapRegions(m, mt.Regions)
	if err != nil {
		return err
	}
	defer func() {
		for _, r := range regions {
			r.Release() // the table holds its own references
		}
	}()
	s.stats.memTables.Add(1)
	return s.editTable(func(*memmap.Table) (*memmap.Table, error) { return memmap.NewTable(regions) })
}

func (s *session) addMemReg(m *vu.Message) error {
	if s.protocol&vu.ProtocolConfigureMemSlots == 0 {
		return fmt.Errorf("%w: CONFIGURE_MEM_SLOTS not negotiated", errUnsupported)
	}
	rm, err := vu.DecodeMemRegionMsg(m.Payload)
	if err != nil {
		return err
	}
	regions, err := s.mapRegions(m, []vu.MemoryRegion{rm.Region})
	if err != nil {
		return err
	}
	defer regions[0].Release()
	return s.editTable(func(cur *memmap.Table) (*memmap.Table, error) { return cur.With(regions[0]) })
}

// editTable installs a table derived from the current one and tells the
// device.
func (s *session) editTable(edit func(cur *memmap.Table) (*memmap.Table, error)) error {
	cur := s.mem.Acquire()
	t, err := edit(cur)
	cur.Release()
	if err != nil {
		return err
	}
	s.mem.Swap(t)
	s.dev.MemoryChanged()
	return nil
}

func (s *session) remMemReg(m *vu.Message) error {
	if s.protocol&vu.ProtocolConfigureMemSlots == 0 {
		return fmt.Errorf("%w: CONFIGURE_MEM_SLOTS not negotiated", errUnsupported)
	}
	rm, err := vu.DecodeMemRegionMsg(m.Payload)
	if err != nil {
		return err
	}
	return s.editTable(func(cur *memmap.Table) (*memmap.Table, error) {
		return cur.Without(memmap.RegionSpec{
			GuestAddr: abi.GPA(rm.Region.GuestAddr),
			Size:      rm.Region.Size,
			UserAddr:  memmap.UVA(rm.Region.UserAddr),
		})
	})
}
