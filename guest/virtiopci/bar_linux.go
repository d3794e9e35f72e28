//go:build amd64

package virtiopci

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// mapBAR maps BAR i of the function at sysfs directory dir through
// resourceN (MAP_SHARED, O_RDWR|O_SYNC: uncached).
func mapBAR(dir string, i int) (*barRegs, func() error, error) {
	path := filepath.Join(dir, "resource"+strconv.Itoa(i))
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_SYNC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open BAR %d: %v: %w", i, err, ErrBAR)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("stat BAR %d: %v: %w", i, err, ErrBAR)
	}
	size := st.Size()
	if size <= 0 || size > 1<<32 {
		return nil, nil, fmt.Errorf("BAR %d of %d bytes: %w", i, size, ErrBAR)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap BAR %d (%s, %d bytes): %v (is a driver bound to the device?): %w", i, path, size, err, ErrBAR)
	}
	return &barRegs{mem: mem}, func() error { return unix.Munmap(mem) }, nil
}
