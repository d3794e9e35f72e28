package memmap

import (
	"fmt"
	"math"

	"golang.org/x/sys/unix"
)

// NewMemfd creates an anonymous memory file of size bytes with
// MFD_CLOEXEC|MFD_ALLOW_SEALING, for front-ends and tests. The caller owns
// the returned fd.
func NewMemfd(name string, size uint64) (int, error) {
	if size > math.MaxInt64 {
		return -1, fmt.Errorf("memfd %q size %#x: %w", name, size, ErrOverflow)
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("memfd_create %q: %w", name, err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("memfd %q truncate to %d: %w", name, size, err)
	}
	return fd, nil
}

// SealSize applies F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL to a memfd created
// with MFD_ALLOW_SEALING, as QEMU does for its memfd backends, so that the
// file behind a region can no longer shrink under the backend.
func SealSize(fd int) error {
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS,
		unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fmt.Errorf("seal fd %d: %w", fd, err)
	}
	return nil
}
