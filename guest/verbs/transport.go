package verbs

import (
	"fmt"
	"math/bits"
	"time"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Transport is how the library reaches a device: virtio-user on the host
// (vmm/frontend) now, the guest's virtio-pci later. Implementations must be
// safe for concurrent use: the library calls Notify and Polling from the
// posting goroutines and Command from any goroutine.
type Transport interface {
	// ReadConfig reads n bytes of device config space at off.
	ReadConfig(off, n int) ([]byte, error)
	// Command runs one control command: req is the whole request (header
	// included), respLen the size of the device-writable buffer (response
	// header included). It returns what the device wrote.
	Command(req []byte, respLen int) ([]byte, error)
	// AllocDMA returns size bytes of device-visible (guest) memory aligned
	// to align, zeroed.
	AllocDMA(size, align uint64) (DMABuf, error)
	// FreeDMA gives back a buffer from AllocDMA.
	FreeDMA(b DMABuf)
	// Notify sends a virtio notification to doorbell queue i (virtqueue
	// 2+i).
	Notify(doorbellQueue int) error
	// Polling reports bit 0 (VIRTQ_USED_F_NO_NOTIFY) of the used ring flags
	// of doorbell queue i: set while the device's engine polls.
	Polling(doorbellQueue int) bool
	// WaitEvent returns the next event-queue message, waiting up to
	// timeout; the transport keeps the event queue stocked.
	WaitEvent(timeout time.Duration) (abi.Event, error)
	// Close releases the transport's resources.
	Close() error
}

// DMABuf is device-visible memory: Buf is this process's view of the bytes
// at guest-physical address Addr. The host transport hands out
// guest-physically contiguous buffers (Pages nil). A guest transport whose
// buffers are contiguous only within pages fills Pages; PageAddrs and GPA,
// the only two places that turn an offset into a guest-physical address,
// follow it.
type DMABuf struct {
	Addr abi.GPA
	Buf  []byte
	// Pages, when non-nil, are the guest-physical addresses of the 4 KiB
	// pages that hold Buf, in order: Buf[0] is at Addr, in page Pages[0]
	// (Addr&^(PageSize-1) == Pages[0]), and Buf[i] is at
	// Pages[(Addr%PageSize+i)/PageSize] + (Addr+i)%PageSize. Nil: Buf is
	// contiguous from Addr.
	Pages []uint64
}

// Contiguous reports whether b's bytes are guest-physically contiguous.
func (b DMABuf) Contiguous() bool {
	if b.Pages == nil {
		return true
	}
	for i := 1; i < len(b.Pages); i++ {
		if b.Pages[i] != b.Pages[i-1]+abi.PageSize {
			return false
		}
	}
	return true
}

// GPA returns the guest-physical address of byte off of b (off ==
// len(b.Buf) gives the address just past the end).
func (b DMABuf) GPA(off uint64) (abi.GPA, error) {
	if off > uint64(len(b.Buf)) {
		return 0, argErr("offset", "%d beyond a buffer of %d bytes", off, len(b.Buf))
	}
	if b.Pages != nil {
		return b.tableGPA(off)
	}
	a, ok := b.Addr.Add(off)
	if !ok {
		return 0, argErr("offset", "address %#x + %d overflows", uint64(b.Addr), off)
	}
	return a, nil
}

// tableGPA is GPA through the page table. Precondition: off <= len(b.Buf).
func (b DMABuf) tableGPA(off uint64) (abi.GPA, error) {
	o := uint64(b.Addr)%abi.PageSize + off
	i := o >> abi.PageShift
	if i < uint64(len(b.Pages)) {
		return abi.GPA(b.Pages[i] + o%abi.PageSize), nil
	}
	if off == uint64(len(b.Buf)) && o%abi.PageSize == 0 && i == uint64(len(b.Pages)) && i > 0 {
		a, ok := add64(b.Pages[i-1], abi.PageSize)
		if ok {
			return abi.GPA(a), nil
		}
	}
	return 0, fmt.Errorf("%w: page table of %d pages does not cover byte %d", ErrProtocol, len(b.Pages), off)
}

// PageAddrs returns the guest-physical addresses of the 4 KiB pages that
// hold b.Buf[off:off+n], in order (the first one page-aligned downwards):
// the page list REG_MR, CREATE_CQ and CREATE_QP take.
func (b DMABuf) PageAddrs(off, n uint64) ([]uint64, error) {
	if n == 0 {
		return nil, argErr("length", "zero")
	}
	end, ok := add64(off, n)
	if !ok || end > uint64(len(b.Buf)) {
		return nil, argErr("range", "[%d, +%d) outside a buffer of %d bytes", off, n, len(b.Buf))
	}
	if b.Pages != nil {
		o := uint64(b.Addr)%abi.PageSize + off
		first, last := o>>abi.PageShift, (o+n-1)>>abi.PageShift
		if last >= uint64(len(b.Pages)) {
			return nil, fmt.Errorf("%w: page table of %d pages does not cover [%d, +%d)", ErrProtocol, len(b.Pages), off, n)
		}
		pages := make([]uint64, last-first+1)
		copy(pages, b.Pages[first:last+1])
		return pages, nil
	}
	start, err := b.GPA(off)
	if err != nil {
		return nil, err
	}
	first := uint64(start) &^ (abi.PageSize - 1)
	last, ok := add64(uint64(start), n-1)
	if !ok {
		return nil, argErr("range", "address %#x + %d overflows", uint64(start), n)
	}
	np := (last>>abi.PageShift - first>>abi.PageShift) + 1
	pages := make([]uint64, np)
	for i := range pages {
		pages[i] = first + uint64(i)<<abi.PageShift
	}
	return pages, nil
}

// MRPages returns the page list REG_MR takes for b.Buf[off:off+n] in the
// largest pages, up to 1<<maxShift bytes (maxShift is clamped to
// [abi.PageShift, abi.MaxPageShift]), that b's guest-physical layout allows, with
// their shift. Page k of the list covers the MR's
// bytes from its first one's address rounded down to the page size, so
// memory that is guest-physically contiguous takes one or two pages
// whatever its size, and hugepage-backed buffers take one entry per huge
// page. A larger page is allowed when every break in guest-physical
// contiguity falls on a boundary of that size on both sides (the address
// the MR's byte has and the guest-physical address it lands on).
func (b DMABuf) MRPages(off, n uint64, maxShift uint) ([]uint64, uint, error) {
	maxShift = min(max(maxShift, abi.PageShift), abi.MaxPageShift)
	if b.Pages == nil {
		start, err := b.GPA(off)
		if err != nil {
			return nil, 0, err
		}
		if n == 0 {
			return nil, 0, argErr("length", "zero")
		}
		if end, ok := add64(off, n); !ok || end > uint64(len(b.Buf)) {
			return nil, 0, argErr("range", "[%d, +%d) outside a buffer of %d bytes", off, n, len(b.Buf))
		}
		if _, ok := add64(uint64(start), n); !ok {
			return nil, 0, argErr("range", "address %#x + %d overflows", uint64(start), n)
		}
		shift := min(maxShift, uint(max(abi.PageShift, bits.Len64(n-1))))
		size := uint64(1) << shift
		base := uint64(start) &^ (size - 1)
		np := (uint64(start)&(size-1) + n + size - 1) >> shift
		pages := make([]uint64, np)
		for k := range pages {
			pages[k] = base + uint64(k)<<shift
		}
		return pages, shift, nil
	}
	small, err := b.PageAddrs(off, n)
	if err != nil {
		return nil, 0, err
	}
	iova, err := b.GPA(off)
	if err != nil {
		return nil, 0, err
	}
	// Virtual address of 4 KiB page i: v0 + i·4096; small[0] == v0.
	v0 := uint64(iova) &^ (abi.PageSize - 1)
	shift := maxShift
	for i := 1; i < len(small) && shift > abi.PageShift; i++ {
		if small[i] != small[i-1]+abi.PageSize {
			v := v0 + uint64(i)<<abi.PageShift
			shift = min(shift, uint(bits.TrailingZeros64(v)), uint(bits.TrailingZeros64(small[i])))
		}
	}
	shift = max(shift, abi.PageShift)
	shift = min(shift, uint(max(abi.PageShift, bits.Len64(n-1))))
	if shift == abi.PageShift {
		return small, abi.PageShift, nil
	}
	size := uint64(1) << shift
	base := uint64(iova) &^ (size - 1)
	np := (uint64(iova)&(size-1) + n + size - 1) >> shift
	pages := make([]uint64, np)
	pages[0] = small[0] &^ (size - 1)
	for k := uint64(1); k < np; k++ {
		// The first 4 KiB page of big page k.
		pages[k] = small[(base+k<<shift-v0)>>abi.PageShift]
	}
	return pages, shift, nil
}

func add64(a, b uint64) (uint64, bool) {
	s := a + b
	return s, s >= a
}

// mul64 returns a*b and whether it fits.
func mul64(a, b uint64) (uint64, bool) {
	if a != 0 && b > ^uint64(0)/a {
		return 0, false
	}
	return a * b, true
}

func checkDMA(b DMABuf, size uint64) error {
	if uint64(len(b.Buf)) < size {
		return fmt.Errorf("%w: transport gave %d bytes for %d", ErrProtocol, len(b.Buf), size)
	}
	return nil
}
