package memmap

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestTableReuse(t *testing.T) {
	fd, err := NewMemfd("reuse", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	spec := RegionSpec{GuestAddr: 0, Size: 1 << 20, UserAddr: 0x1000_0000}
	r, err := MapRegion(dupFD(t, fd), spec)
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := NewTable([]*Region{r})
	r.Release()
	if err != nil {
		t.Fatal(err)
	}
	defer tbl.Release()
	before := countFDs(t)

	// Same file, same spec: the region comes back and the new fd is closed.
	got := tbl.Reuse(dupFD(t, fd), spec)
	if got != tbl.regions[0] {
		t.Fatalf("Reuse of the same memory returned %p, want %p", got, tbl.regions[0])
	}
	got.Release()
	if n := countFDs(t); n != before {
		t.Fatalf("fds %d -> %d: Reuse did not close the duplicate", before, n)
	}

	// Another file, or another spec: nil, and the fd stays the caller's.
	other, err := NewMemfd("other", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if r := tbl.Reuse(other, spec); r != nil {
		t.Fatal("Reuse matched a different file")
	}
	if _, err := unix.FcntlInt(uintptr(other), unix.F_GETFD, 0); err != nil {
		t.Fatalf("Reuse closed an fd it did not take: %v", err)
	}
	unix.Close(other)
	moved := spec
	moved.GuestAddr = 1 << 30
	d := dupFD(t, fd)
	if r := tbl.Reuse(d, moved); r != nil {
		t.Fatal("Reuse matched a different spec")
	}
	unix.Close(d)
}
