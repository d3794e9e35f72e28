package virtiopci

import (
	"fmt"
	"sync"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// HugePageSize is the size of the pages DMA memory comes from: 2 MiB,
// physically contiguous each.
const HugePageSize = 2 << 20

const (
	minDMAAlign = 64      // every allocation is at least cache-line aligned
	maxDMASize  = 1 << 40 // bounds one allocation
	pagesPerHP  = HugePageSize / abi.PageSize
)

// pageSource hands out hugepages: n of them mapped at mem (n*HugePageSize
// bytes, zeroed, locked), with the guest-physical address of each.
type pageSource interface {
	Map(n int) (mem []byte, gpas []uint64, err error)
	Unmap(mem []byte) error
}

// DMA allocates device-visible memory from hugepages. Allocations of up to
// HugePageSize bytes come from shared hugepages and never straddle one, so
// they are physically contiguous; larger ones get hugepages of their own and
// a page table (verbs.DMABuf.Pages) unless those happen to be contiguous. It
// is safe for concurrent use.
type DMA struct {
	src pageSource // immutable

	mu    sync.Mutex
	slabs []*slab                 // protected by mu: hugepages for small allocations
	live  map[abi.GPA]*allocation // protected by mu: by address of the first byte
	pages int                     // protected by mu: hugepages mapped
	limit int                     // immutable: most hugepages to map, 0 = no limit
}

// slab is one hugepage split into small allocations.
type slab struct {
	mem  []byte
	gpa  uint64
	free []extent // sorted by offset, coalesced
}

type extent struct{ off, n uint64 }

type allocation struct {
	slab   *slab  // nil for a large allocation
	off, n uint64 // within the slab
	mem    []byte // a large allocation's mapping
}

// newDMA returns an allocator over src that maps at most limit hugepages
// (0: no limit).
func newDMA(src pageSource, limit int) *DMA {
	return &DMA{src: src, live: make(map[abi.GPA]*allocation), limit: limit}
}

// Alloc returns size zeroed bytes aligned to align (a power of two, at most
// HugePageSize).
func (d *DMA) Alloc(size, align uint64) (verbs.DMABuf, error) {
	if size == 0 || size > maxDMASize {
		return verbs.DMABuf{}, fmt.Errorf("dma: size %d: %w", size, ErrDMA)
	}
	if align == 0 {
		align = 1
	}
	if align&(align-1) != 0 || align > HugePageSize {
		return verbs.DMABuf{}, fmt.Errorf("dma: alignment %d: %w", align, ErrDMA)
	}
	align = max(align, minDMAAlign)
	n := (size + minDMAAlign - 1) &^ (minDMAAlign - 1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if n > HugePageSize {
		return d.allocLarge(size)
	}
	for _, s := range d.slabs {
		if b, ok := d.carve(s, n, align, size); ok {
			return b, nil
		}
	}
	if err := d.reserve(1); err != nil {
		return verbs.DMABuf{}, err
	}
	mem, gpas, err := d.src.Map(1)
	if err != nil {
		d.pages--
		return verbs.DMABuf{}, err
	}
	if len(mem) != HugePageSize || len(gpas) != 1 {
		d.src.Unmap(mem)
		d.pages--
		return verbs.DMABuf{}, fmt.Errorf("dma: page source gave %d bytes, %d addresses: %w", len(mem), len(gpas), ErrHugepages)
	}
	s := &slab{mem: mem, gpa: gpas[0], free: []extent{{0, HugePageSize}}}
	d.slabs = append(d.slabs, s)
	b, ok := d.carve(s, n, align, size)
	if !ok {
		return verbs.DMABuf{}, fmt.Errorf("dma: %d bytes do not fit a fresh hugepage: %w", n, ErrDMA)
	}
	return b, nil
}

// reserve counts n more hugepages against the limit. Precondition: mu held.
func (d *DMA) reserve(n int) error {
	if d.limit > 0 && (n > d.limit || d.pages > d.limit-n) {
		return fmt.Errorf("dma: %d more hugepages would exceed the limit of %d: %w", n, d.limit, ErrHugepages)
	}
	d.pages += n
	return nil
}

// carve takes n bytes aligned to align (a guest-physical alignment) from s,
// first fit. Precondition: mu held.
func (d *DMA) carve(s *slab, n, align, size uint64) (verbs.DMABuf, bool) {
	for i, e := range s.free {
		// Align the guest-physical address; the slab's base is 2 MiB
		// aligned, so this aligns the offset too.
		a := (s.gpa + e.off + align - 1) &^ (align - 1)
		off := a - s.gpa
		if off < e.off || off-e.off > e.n || e.n-(off-e.off) < n {
			continue
		}
		// Split e into [e.off, off) and [off+n, e.off+e.n).
		var rest []extent
		if off > e.off {
			rest = append(rest, extent{e.off, off - e.off})
		}
		if end := e.off + e.n; off+n < end {
			rest = append(rest, extent{off + n, end - off - n})
		}
		s.free = append(s.free[:i], append(rest, s.free[i+1:]...)...)
		buf := s.mem[off : off+size : off+size]
		clear(buf)
		gpa := abi.GPA(s.gpa + off)
		d.live[gpa] = &allocation{slab: s, off: off, n: n}
		return verbs.DMABuf{Addr: gpa, Buf: buf}, true
	}
	return verbs.DMABuf{}, false
}

// allocLarge maps hugepages of their own for size bytes. Precondition: mu
// held.
func (d *DMA) allocLarge(size uint64) (verbs.DMABuf, error) {
	np := int((size + HugePageSize - 1) / HugePageSize)
	if err := d.reserve(np); err != nil {
		return verbs.DMABuf{}, err
	}
	mem, gpas, err := d.src.Map(np)
	if err != nil {
		d.pages -= np
		return verbs.DMABuf{}, err
	}
	if len(mem) != np*HugePageSize || len(gpas) != np {
		d.src.Unmap(mem)
		d.pages -= np
		return verbs.DMABuf{}, fmt.Errorf("dma: page source gave %d bytes, %d addresses for %d hugepages: %w", len(mem), len(gpas), np, ErrHugepages)
	}
	b := verbs.DMABuf{Addr: abi.GPA(gpas[0]), Buf: mem[:size:size]}
	contiguous := true
	for i := 1; i < np; i++ {
		if gpas[i] != gpas[i-1]+HugePageSize {
			contiguous = false
		}
	}
	if !contiguous {
		b.Pages = hugeToPages(gpas, size)
	}
	d.live[b.Addr] = &allocation{mem: mem}
	return b, nil
}

// hugeToPages expands hugepage addresses into the 4 KiB page table of a
// buffer of size bytes starting at the first hugepage.
func hugeToPages(gpas []uint64, size uint64) []uint64 {
	n := (size + abi.PageSize - 1) / abi.PageSize
	pages := make([]uint64, n)
	for i := range pages {
		pages[i] = gpas[i/pagesPerHP] + uint64(i%pagesPerHP)*abi.PageSize
	}
	return pages
}

// Free gives b back. Unknown buffers are ignored.
func (d *DMA) Free(b verbs.DMABuf) {
	if b.Buf == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	a, ok := d.live[b.Addr]
	if !ok {
		return
	}
	delete(d.live, b.Addr)
	if a.slab == nil {
		d.pages -= len(a.mem) / HugePageSize
		d.src.Unmap(a.mem)
		return
	}
	a.slab.release(extent{a.off, a.n})
}

// release returns e to s's free list, coalescing with its neighbours.
func (s *slab) release(e extent) {
	i := 0
	for i < len(s.free) && s.free[i].off < e.off {
		i++
	}
	s.free = append(s.free[:i], append([]extent{e}, s.free[i:]...)...)
	if i+1 < len(s.free) && s.free[i].off+s.free[i].n == s.free[i+1].off {
		s.free[i].n += s.free[i+1].n
		s.free = append(s.free[:i+1], s.free[i+2:]...)
	}
	if i > 0 && s.free[i-1].off+s.free[i-1].n == s.free[i].off {
		s.free[i-1].n += s.free[i].n
		s.free = append(s.free[:i], s.free[i+1:]...)
	}
}

// Close unmaps every hugepage. Buffers still live become invalid.
func (d *DMA) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var first error
	for _, a := range d.live {
		if a.slab == nil {
			if err := d.src.Unmap(a.mem); err != nil && first == nil {
				first = err
			}
		}
	}
	for _, s := range d.slabs {
		if err := d.src.Unmap(s.mem); err != nil && first == nil {
			first = err
		}
	}
	d.slabs, d.live, d.pages = nil, make(map[abi.GPA]*allocation), 0
	return first
}

// Hugepages returns the number of hugepages mapped.
func (d *DMA) Hugepages() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pages
}
