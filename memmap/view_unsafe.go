package memmap

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// ErrViewUnsupported reports guest memory that cannot be given a host view:
// a region that is not a shared mapping (mremap duplicates only shared
// ones), or guest pages whose host addresses are not page aligned.
var ErrViewUnsupported = errors.New("guest memory cannot be viewed contiguously (not a page-aligned shared mapping)")

// viewPage is the host's page size, the granule of a View.
var viewPage = uint64(unix.Getpagesize())

// Run is a guest-physically contiguous run of pages: GPA and Len are
// multiples of the host page size.
type Run struct {
	GPA abi.GPA
	Len uint64
}

// View is a host virtual range in which runs of guest pages, scattered in
// guest-physical memory, appear back to back: the host view of a memory
// region that a host RDMA NIC registers as one virtual range (its own
// translation table then maps the guest's pages; see
// backend/rdma/hostnic). Each run is a second mapping of the same pages of
// the guest's memory file (mremap with old_size 0 duplicates a shared
// mapping), so what the guest writes the view shows and the other way
// round, and the view stays valid after the table it was made from is
// released: it holds the file's pages itself until Close. It costs a VMA
// per region-contiguous piece of a run and no copy.
type View struct {
	base uintptr
	size uintptr
}

// MaxViewRuns bounds the runs of one view (each is a mapping of the host
// process; the kernel's default vm.max_map_count is 65530).
const MaxViewRuns = 4096

// NewView maps runs of t, in order, into a fresh contiguous host range.
// Every run must be page aligned (GPA and Len), lie in mapped guest memory
// and be backed by a shared mapping; errors wrap ErrViewUnsupported,
// ErrNotMapped or ErrOverflow. Nothing stays mapped on error.
func (t *Table) NewView(runs []Run) (*View, error) {
	if len(runs) == 0 || len(runs) > MaxViewRuns {
		return nil, fmt.Errorf("view of %d runs: %w", len(runs), ErrViewUnsupported)
	}
	var total uint64
	for _, r := range runs {
		if uint64(r.GPA)%viewPage != 0 || r.Len%viewPage != 0 || r.Len == 0 {
			return nil, fmt.Errorf("run %#x+%#x: %w", uint64(r.GPA), r.Len, ErrViewUnsupported)
		}
		n, ok := add(total, r.Len)
		if !ok || n > 1<<46 {
			return nil, fmt.Errorf("view of %#x bytes: %w", n, ErrOverflow)
		}
		total = n
	}
	// Reserve the whole range first, so the pieces land in it and nothing
	// else of the process can.
	base, _, errno := unix.Syscall6(unix.SYS_MMAP, 0, uintptr(total), unix.PROT_NONE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE, ^uintptr(0), 0)
	if errno != 0 {
		return nil, fmt.Errorf("reserve a view of %#x bytes: %w", total, errno)
	}
	v := &View{base: base, size: uintptr(total)}
	dst := base
	pieces := 0
	for _, r := range runs {
		err := t.ForEach(r.GPA, r.Len, func(b []byte) error {
			pieces++
			if pieces > MaxViewRuns {
				return fmt.Errorf("view of more than %d pieces: %w", MaxViewRuns, ErrViewUnsupported)
			}
			src := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
			if uint64(src)%viewPage != 0 || uint64(len(b))%viewPage != 0 {
				return fmt.Errorf("guest page at host %#x: %w", src, ErrViewUnsupported)
			}
			got, _, errno := unix.Syscall6(unix.SYS_MREMAP, src, 0, uintptr(len(b)),
				unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED, dst, 0)
			if errno != 0 {
				if errno == unix.EINVAL {
					return fmt.Errorf("duplicate host %#x+%#x: %w", src, len(b), ErrViewUnsupported)
				}
				return fmt.Errorf("duplicate host %#x+%#x: %w", src, len(b), errno)
			}
			if got != dst {
				return fmt.Errorf("mremap placed a piece at %#x, not %#x: %w", got, dst, ErrViewUnsupported)
			}
			dst += uintptr(len(b))
			return nil
		})
		if err != nil {
			v.Close()
			return nil, err
		}
	}
	return v, nil
}

// Addr is the view's first byte.
func (v *View) Addr() uintptr { return v.base }

// Len is the view's length in bytes.
func (v *View) Len() uint64 { return uint64(v.size) }

// Bytes returns the view as a slice (for tests and checks; the NIC is
// given Addr).
func (v *View) Bytes() []byte {
	if v == nil || v.base == 0 {
		return nil
	}
	// v.base is the address of a mapping outside Go's heap.
	p := *(*unsafe.Pointer)(unsafe.Pointer(&v.base))
	return unsafe.Slice((*byte)(p), v.size)
}

// Close unmaps the view (idempotent). The guest's memory is untouched.
func (v *View) Close() error {
	if v == nil || v.base == 0 {
		return nil
	}
	_, _, errno := unix.Syscall(unix.SYS_MUNMAP, v.base, v.size, 0)
	v.base, v.size = 0, 0
	if errno != 0 {
		return errno
	}
	return nil
}
