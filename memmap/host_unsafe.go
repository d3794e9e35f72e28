package memmap

import "unsafe"

// hostSpan returns the host address range [lo, hi) of b's bytes (0, 0 when
// b is empty).
func hostSpan(b []byte) (lo, hi uintptr) {
	if len(b) == 0 {
		return 0, 0
	}
	lo = uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return lo, lo + uintptr(len(b))
}

// MapsHost reports whether the host address addr lies in the mapping of one
// of t's regions, the whole mmap of its file included. Fault handlers use it
// to attribute a fault address (FaultAddr) to the guest whose memory
// faulted. It costs one comparison per region (at most MaxRegions) and is
// meant for that rare path. The answer holds while the caller keeps its
// reference on t: a released region's address range may be reused by a
// later mapping.
func (t *Table) MapsHost(addr uintptr) bool {
	if t == nil {
		return false
	}
	for _, r := range t.regions {
		if lo, hi := hostSpan(r.mapping); addr >= lo && addr < hi {
			return true
		}
	}
	return false
}

// HostAddr returns the host address of b's first byte (0 when b is empty),
// for a host NIC given guest memory to read during a call (inline data).
func HostAddr(b []byte) uintptr {
	lo, _ := hostSpan(b)
	return lo
}
