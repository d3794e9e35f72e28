package frontend

import (
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// Memory-table changes as a front-end may send them at any time (QEMU on
// memory hot-plug, or a hostile front-end): the guest memory file
// described as other regions, regions added and removed.

// SplitRegions describes the guest memory as regions cut at the given
// guest-physical addresses (ascending, inside the memory, page aligned):
// the same file, offsets and front-end addresses as MemoryRegion, so the
// guest's view is unchanged, but regions a back-end has not mapped yet.
// Cuts outside (0, MemorySize) or out of order are skipped.
func (f *Frontend) SplitRegions(at ...uint64) []vu.MemoryRegion {
	whole := f.MemoryRegion()
	var out []vu.MemoryRegion
	start := uint64(0)
	for _, a := range at {
		if a <= start || a >= whole.Size {
			continue
		}
		out = append(out, vu.MemoryRegion{GuestAddr: start, Size: a - start, UserAddr: UserBase + start, MmapOffset: start})
		start = a
	}
	return append(out, vu.MemoryRegion{GuestAddr: start, Size: whole.Size - start, UserAddr: UserBase + start, MmapOffset: start})
}

// SetMemTableRegions sends SET_MEM_TABLE with regions of the guest memory
// file (its descriptor once per region).
func (f *Frontend) SetMemTableRegions(regions []vu.MemoryRegion) error {
	fds := make([]int, len(regions))
	for i := range fds {
		fds[i] = f.fd
	}
	return f.Send(vu.SetMemTable, vu.MemTable{Regions: regions}.Encode(), fds)
}

// AddMemReg sends ADD_MEM_REG for region r of the guest memory file
// (CONFIGURE_MEM_SLOTS).
func (f *Frontend) AddMemReg(r vu.MemoryRegion) error {
	return f.Send(vu.AddMemReg, vu.MemRegionMsg{Region: r}.Encode(), []int{f.fd})
}

// RemMemReg sends REM_MEM_REG for region r (CONFIGURE_MEM_SLOTS).
func (f *Frontend) RemMemReg(r vu.MemoryRegion) error {
	return f.Send(vu.RemMemReg, vu.MemRegionMsg{Region: r}.Encode(), nil)
}
