package memmap

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// countFDs returns the number of open fds of this process.
func countFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("read /proc/self/fd: %v", err)
	}
	return len(ents) - 1 // ReadDir's own fd
}

// countMaps returns the number of /proc/self/maps lines naming memfd name.
func countMaps(t testing.TB, name string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatalf("read /proc/self/maps: %v", err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "/memfd:"+name+" ") || strings.HasSuffix(l, "/memfd:"+name) {
			n++
		}
	}
	return n
}

// mapNew maps spec over a fresh memfd of fileSize bytes named name.
func mapNew(t testing.TB, name string, fileSize uint64, spec RegionSpec) *Region {
	t.Helper()
	fd, err := NewMemfd(name, fileSize)
	if err != nil {
		t.Fatalf("NewMemfd: %v", err)
	}
	r, err := MapRegion(fd, spec)
	if err != nil {
		t.Fatalf("MapRegion(%+v): %v", spec, err)
	}
	return r
}

// tableOf is the table of regions rs; the caller keeps its own references.
func tableOf(t testing.TB, rs ...*Region) *Table {
	t.Helper()
	tab, err := NewTable(rs)
	if err != nil {
		t.Fatalf("NewTable: %v", err)
	}
	return tab
}

// dupFD duplicates fd with close-on-exec.
func dupFD(t testing.TB, fd int) int {
	t.Helper()
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("dup: %v", err)
	}
	return d
}

// mapNewFile is mapNew that also returns a descriptor of the region's file
// (closed when the test ends), for tests that shrink the file behind the
// mapping: the region's own fd is the region's.
func mapNewFile(t testing.TB, name string, fileSize uint64, spec RegionSpec) (*Region, int) {
	t.Helper()
	fd, err := NewMemfd(name, fileSize)
	if err != nil {
		t.Fatalf("NewMemfd: %v", err)
	}
	file := dupFD(t, fd)
	t.Cleanup(func() { unix.Close(file) })
	r, err := MapRegion(fd, spec)
	if err != nil {
		t.Fatalf("MapRegion(%+v): %v", spec, err)
	}
	return r, file
}
