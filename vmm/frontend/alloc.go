package frontend

import (
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// allocPage is the allocator's granule: every allocation is whole pages,
// page-aligned at least.
const allocPage = 4096

// Allocator errors.
var (
	// ErrNoMemory: no free extent of guest memory is large enough.
	ErrNoMemory = errors.New("frontend: guest memory exhausted")
	// ErrBadFree: Free of an address that is not the start of a live
	// allocation.
	ErrBadFree = errors.New("frontend: free of an address not allocated")
)

// extent is [start, end) of guest-physical memory.
type extent struct{ start, end uint64 }

// allocator is a first-fit free-list allocator over page-granular extents
// of guest memory. Free extents are kept sorted and coalesced, so two free
// extents never touch.
type allocator struct {
	mu   sync.Mutex
	free []extent          // protected by mu: sorted by start, coalesced
	live map[uint64]uint64 // protected by mu: start → size of each allocation
	used uint64            // protected by mu: bytes allocated
}

// newAllocator manages [start, end); both are rounded inwards to pages.
func newAllocator(start, end uint64) *allocator {
	s := (start + allocPage - 1) &^ (allocPage - 1)
	e := end &^ (allocPage - 1)
	a := &allocator{live: map[uint64]uint64{}}
	if s < e && s >= start {
		a.free = []extent{{s, e}}
	}
	return a
}

// alloc reserves n bytes (rounded up to whole pages) aligned to align (a
// power of two; at least a page) with the first free extent that fits.
func (a *allocator) alloc(n, align uint64) (uint64, error) {
	if align == 0 || align&(align-1) != 0 {
		return 0, fmt.Errorf("frontend: alignment %d is not a power of two", align)
	}
	align = max(align, allocPage)
	if n == 0 || n > ^uint64(0)-allocPage {
		return 0, fmt.Errorf("frontend: allocation of %d bytes: %w", n, ErrNoMemory)
	}
	size := (n + allocPage - 1) &^ (allocPage - 1)
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, e := range a.free {
		s := (e.start + align - 1) &^ (align - 1)
		if s < e.start || s >= e.end || size > e.end-s {
			continue
		}
		// Split e into [e.start, s) and [s+size, e.end), dropping empty parts.
		var repl []extent
		if s > e.start {
			repl = append(repl, extent{e.start, s})
		}
		if s+size < e.end {
			repl = append(repl, extent{s + size, e.end})
		}
		a.free = append(a.free[:i], append(repl, a.free[i+1:]...)...)
		a.live[s] = size
		a.used += size
		return s, nil
	}
	return 0, fmt.Errorf("frontend: %d bytes aligned to %d: %w", n, align, ErrNoMemory)
}

// release frees the allocation that starts at start and returns its size,
// coalescing it with free neighbours.
func (a *allocator) release(start uint64) (uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	size, ok := a.live[start]
	if !ok {
		return 0, fmt.Errorf("%w: %#x", ErrBadFree, start)
	}
	delete(a.live, start)
	a.used -= size
	e := extent{start, start + size}
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].start >= e.end })
	// a.free[i-1] (if any) ends at or before e.start; a.free[i] starts at or
	// after e.end.
	if i > 0 && a.free[i-1].end == e.start {
		e.start = a.free[i-1].start
		i--
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
	if i < len(a.free) && a.free[i].start == e.end {
		e.end = a.free[i].end
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
	a.free = append(a.free, extent{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = e
	return size, nil
}

// stats returns the allocated bytes and the number of free extents.
func (a *allocator) stats() (used uint64, extents int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.used, len(a.free)
}

// Alloc reserves n bytes of guest memory aligned to align (a power of two)
// and returns their guest-physical address and host view, zeroed. Memory is
// handed out in whole pages, page-aligned at least; Free gives it back. It
// is safe for concurrent use.
func (f *Frontend) Alloc(n, align uint64) (abi.GPA, []byte, error) {
	if f.mem == nil {
		return 0, nil, errors.New("frontend: closed")
	}
	start, err := f.alloc.alloc(n, align)
	if err != nil {
		return 0, nil, err
	}
	b := f.mem.Bytes()[start : start+n : start+n]
	clear(b)
	return abi.GPA(start), b, nil
}

// Free gives back the allocation that starts at gpa.
func (f *Frontend) Free(gpa abi.GPA) error {
	_, err := f.alloc.release(uint64(gpa))
	return err
}

// AllocatedBytes returns the guest memory currently allocated (whole
// pages).
func (f *Frontend) AllocatedBytes() uint64 {
	u, _ := f.alloc.stats()
	return u
}
