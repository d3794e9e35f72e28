package memmap

import (
	"fmt"
	"math"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// MaxRegions is the number of memory slots the backend offers through
// GET_MAX_MEM_SLOTS, and the most regions a Table holds.
const MaxRegions = 32

// maxMapAlign bounds the alignment taken from st_blksize (hugetlbfs reports
// its huge page size there, and mmap offsets into it must be aligned to it).
const maxMapAlign = 1 << 30

// liveMappings counts regions that are mapped and not yet unmapped. Tests and
// fuzz targets use it to prove that nothing leaks.
var liveMappings atomic.Int64

// RegionSpec is one vhost-user memory region as the front-end describes it
// (struct vhost_user_memory_region): Size bytes at guest-physical GuestAddr,
// mapped by the front-end at UserAddr, found at MmapOffset of the region's fd.
type RegionSpec struct {
	GuestAddr  abi.GPA
	Size       uint64
	UserAddr   UVA
	MmapOffset uint64
}

// validate checks the spec's arithmetic: non-zero size and no overflow of
// any end address.
func (s RegionSpec) validate() error {
	if s.Size == 0 {
		return fmt.Errorf("zero size: %w", ErrBadRegion)
	}
	if _, ok := s.GuestAddr.Add(s.Size); !ok {
		return fmt.Errorf("guest address: %w", ErrOverflow)
	}
	if _, ok := s.UserAddr.Add(s.Size); !ok {
		return fmt.Errorf("user address: %w", ErrOverflow)
	}
	if _, ok := add(s.MmapOffset, s.Size); !ok {
		return fmt.Errorf("mmap offset: %w", ErrOverflow)
	}
	return nil
}

// Region is one mapped memory region. It owns its mapping and is reference
// counted: MapRegion returns it with one reference, each Table holding it
// takes another, and the last Release unmaps it.
//
// It keeps the region's descriptor, one per region, closed with the
// mapping on the last Release: the mapping alone would hold the file open,
// and pinning (mlock), SIGBUS containment (Guard) and reconnects need no
// fd, but a live upgrade hands the file to the next back-end process
// (DupFd; backend/doc.go, "Live upgrade").
type Region struct {
	spec    RegionSpec // immutable
	fd      int        // immutable; the file mapped, owned, closed by the last Release
	dev     uint64     // immutable; the file's device and inode, for SameFile
	ino     uint64     // immutable; unique while the mapping keeps the file
	mapping []byte     // immutable; the whole mmap, from the aligned offset
	data    []byte     // immutable; exactly [MmapOffset, MmapOffset+Size) of the file
	refs    atomic.Int64
}

// MapRegion maps spec.Size bytes at spec.MmapOffset of fd, MAP_SHARED,
// read/write.
//
// It takes ownership of fd in every case: the region keeps it until its
// last Release, and an error closes it. It refuses a zero Size (ErrBadRegion), any overflow
// of GuestAddr+Size, UserAddr+Size or MmapOffset+Size (ErrOverflow), an fd
// that is not a regular file (ErrBadRegion), and a file smaller than
// MmapOffset+Size (ErrFileTooSmall); errors are *RegionError. MmapOffset need
// not be page aligned: the mapping starts at the alignment boundary below it
// and Bytes exposes exactly [MmapOffset, MmapOffset+Size).
//
// The returned region has one reference, owned by the caller.
func MapRegion(fd int, spec RegionSpec) (*Region, error) {
	r, err := mapRegion(fd, spec)
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, &RegionError{Spec: spec, Err: err}
	}
	return r, nil
}

func mapRegion(fd int, spec RegionSpec) (*Region, error) {
	if fd < 0 {
		return nil, fmt.Errorf("fd %d: %w", fd, ErrBadRegion)
	}
	if err := spec.validate(); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("not a regular file (mode %#o): %w", st.Mode, ErrBadRegion)
	}
	end := spec.MmapOffset + spec.Size // checked by validate
	if st.Size < 0 || uint64(st.Size) < end {
		return nil, fmt.Errorf("file size %d, need %d: %w", st.Size, end, ErrFileTooSmall)
	}
	align := uint64(unix.Getpagesize())
	if bs := uint64(st.Blksize); bs > align && bs <= maxMapAlign && bs&(bs-1) == 0 {
		align = bs
	}
	head := spec.MmapOffset % align
	mapOff := spec.MmapOffset - head // <= file size <= MaxInt64
	mapLen, ok := add(spec.Size, head)
	if !ok || mapLen > math.MaxInt {
		return nil, fmt.Errorf("mapping length: %w", ErrOverflow)
	}
	m, err := unix.Mmap(fd, int64(mapOff), int(mapLen), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	liveMappings.Add(1)
	r := &Region{
		spec:    spec,
		fd:      fd,
		dev:     uint64(st.Dev),
		ino:     uint64(st.Ino),
		mapping: m,
		data:    m[head:mapLen:mapLen],
	}
	r.refs.Store(1)
	return r, nil
}

// Spec returns the region's description.
func (r *Region) Spec() RegionSpec { return r.spec }

// DupFd returns a new descriptor (close-on-exec) of the file the region
// maps, owned by the caller. Precondition: the caller holds a reference.
func (r *Region) DupFd() (int, error) {
	fd, err := unix.FcntlInt(uintptr(r.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("memmap: dup region fd: %w", err)
	}
	return fd, nil
}

// Bytes returns the region's memory, exactly Size bytes. The slice is valid
// only while the caller holds a reference (its own, or one of a Table that
// holds the region).
func (r *Region) Bytes() []byte { return r.data }

// tryRef takes a reference unless the region was already released.
func (r *Region) tryRef() bool {
	for {
		n := r.refs.Load()
		if n <= 0 {
			return false
		}
		if r.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release drops a reference; the last one unmaps the region. Releasing more
// references than were taken panics.
func (r *Region) Release() {
	switch n := r.refs.Add(-1); {
	case n > 0:
		return
	case n < 0:
		panic("memmap: Region released too many times")
	}
	// An error cannot be acted upon here: the mapping is ours and valid,
	// so munmap fails only on kernel bugs.
	_ = unix.Munmap(r.mapping)
	unix.Close(r.fd)
	liveMappings.Add(-1)
}

// SameFile reports whether fd refers to the file the region maps (same
// device and inode). The region's mapping keeps that inode alive, so no
// other file can have taken its number meanwhile.
func (r *Region) SameFile(fd int) bool {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return false
	}
	return uint64(st.Dev) == r.dev && uint64(st.Ino) == r.ino
}

// Reuse looks in t for a region with exactly spec that maps the same file
// as fd. If there is one it closes fd (the region keeps its own) and
// returns the region with a new
// reference: a front-end that sends the same memory table again (QEMU does
// at every device start) keeps the same mappings, and with them the pins
// PVDMA holds on them. Otherwise it returns nil and leaves fd alone.
func (t *Table) Reuse(fd int, spec RegionSpec) *Region {
	for _, r := range t.regions {
		if r.spec == spec && r.SameFile(fd) && r.tryRef() {
			unix.Close(fd)
			return r
		}
	}
	return nil
}
