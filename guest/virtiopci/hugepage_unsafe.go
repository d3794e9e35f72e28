package virtiopci

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugeSource maps anonymous 2 MiB hugepages, locks them and reads their
// physical (guest-physical, in a VM) addresses from /proc/self/pagemap.
type hugeSource struct {
	pagemap *os.File // immutable
}

func newHugeSource() (*hugeSource, error) {
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, ErrHugepages)
	}
	return &hugeSource{pagemap: f}, nil
}

// Map implements pageSource.
func (h *hugeSource) Map(n int) ([]byte, []uint64, error) {
	if n <= 0 || n > maxDMASize/HugePageSize {
		return nil, nil, fmt.Errorf("map %d hugepages: %w", n, ErrDMA)
	}
	if err := ensureHugepages(n); err != nil {
		return nil, nil, err
	}
	mem, err := unix.Mmap(-1, 0, n*HugePageSize, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_HUGETLB|unix.MAP_POPULATE)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap %d hugepages: %v: %w", n, err, ErrHugepages)
	}
	fail := func(err error) ([]byte, []uint64, error) {
		unix.Munmap(mem)
		return nil, nil, err
	}
	if err := unix.Mlock(mem); err != nil {
		return fail(fmt.Errorf("mlock %d hugepages: %v: %w", n, err, ErrHugepages))
	}
	gpas := make([]uint64, n)
	for i := range gpas {
		p := mem[i*HugePageSize : (i+1)*HugePageSize]
		p[0] = 0 // touch: fault it in if MAP_POPULATE did not
		pa, err := physAddr(h.pagemap, uintptr(unsafe.Pointer(&p[0])))
		if err != nil {
			return fail(err)
		}
		if pa%HugePageSize != 0 {
			return fail(fmt.Errorf("hugepage %d at physical %#x is not 2 MiB aligned: %w", i, pa, ErrHugepages))
		}
		gpas[i] = pa
	}
	return mem, gpas, nil
}

// Unmap implements pageSource.
func (h *hugeSource) Unmap(mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	return unix.Munmap(mem)
}

func (h *hugeSource) Close() error { return h.pagemap.Close() }
