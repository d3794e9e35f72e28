package memmap

import (
	"errors"
	"math"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMapRegionRefuses(t *testing.T) {
	const fileSize = 0x3000
	tests := []struct {
		name string
		spec RegionSpec
		want error
	}{
		{"zero size", RegionSpec{GuestAddr: 0x1000, Size: 0}, ErrBadRegion},
		{"larger than file", RegionSpec{Size: fileSize + 1}, ErrFileTooSmall},
		{"offset past end", RegionSpec{Size: 0x1000, MmapOffset: fileSize - 0xfff}, ErrFileTooSmall},
		{"offset far past end", RegionSpec{Size: 1, MmapOffset: math.MaxInt64}, ErrFileTooSmall},
		{"guest overflow", RegionSpec{GuestAddr: math.MaxUint64 - 0xfff, Size: 0x1000}, ErrOverflow},
		{"guest end exactly 2^64", RegionSpec{GuestAddr: 1 << 63, Size: 1 << 63}, ErrOverflow},
		{"user overflow", RegionSpec{UserAddr: math.MaxUint64, Size: 1}, ErrOverflow},
		{"offset overflow", RegionSpec{Size: 0x1000, MmapOffset: math.MaxUint64 - 0x10}, ErrOverflow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := countFDs(t)
			fd, err := NewMemfd("refuse", fileSize)
			if err != nil {
				t.Fatal(err)
			}
			r, err := MapRegion(fd, tt.spec)
			if !errors.Is(err, tt.want) {
				t.Fatalf("MapRegion(%+v) error = %v, want %v", tt.spec, err, tt.want)
			}
			var re *RegionError
			if !errors.As(err, &re) || re.Spec != tt.spec {
				t.Errorf("got error %#v, want *RegionError with the spec", err)
			}
			if r != nil {
				t.Errorf("got region %p with error, want nil", r)
			}
			if after := countFDs(t); after != before {
				t.Errorf("got %d fds after failure, want %d (fd not closed)", after, before)
			}
		})
	}
}

func TestMapRegionBadFD(t *testing.T) {
	before := countFDs(t)
	if _, err := MapRegion(-1, RegionSpec{Size: 1}); !errors.Is(err, ErrBadRegion) {
		t.Errorf("fd -1: got %v, want ErrBadRegion", err)
	}
	// A pipe is not a regular file.
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[1])
	if _, err := MapRegion(p[0], RegionSpec{Size: 1}); !errors.Is(err, ErrBadRegion) {
		t.Errorf("pipe: got %v, want ErrBadRegion", err)
	}
	// A read-only fd cannot be mapped read/write: the mmap error is returned.
	f, err := os.CreateTemp(t.TempDir(), "ro")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(0x1000); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ro, err := unix.Open(f.Name(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := MapRegion(ro, RegionSpec{Size: 0x1000}); !errors.Is(err, unix.EACCES) {
		t.Errorf("read-only file: got %v, want EACCES", err)
	}
	if after := countFDs(t); after != before+1 { // p[1] still open
		t.Errorf("got %d fds, want %d", after, before+1)
	}
}

func TestMapRegionUnalignedOffset(t *testing.T) {
	fd, err := NewMemfd("unaligned", 0x3000)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("hello, region")
	if _, err := unix.Pwrite(fd, want, 0x1234); err != nil {
		t.Fatal(err)
	}
	spec := RegionSpec{GuestAddr: 0x5000, Size: 0x1dcc, UserAddr: 0x7f00_0000_1234, MmapOffset: 0x1234}
	r, err := MapRegion(dupFD(t, fd), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release()
	defer unix.Close(fd)
	if got := r.Spec(); got != spec {
		t.Errorf("Spec() = %+v, want %+v", got, spec)
	}
	b := r.Bytes()
	if uint64(len(b)) != spec.Size {
		t.Fatalf("len(Bytes()) = %#x, want %#x", len(b), spec.Size)
	}
	if got := string(b[:len(want)]); got != string(want) {
		t.Errorf("Bytes() starts with %q, want %q", got, want)
	}
	b[len(b)-1] = 0xa5 // the last byte of the file
	got := make([]byte, 1)
	if _, err := unix.Pread(fd, got, 0x2fff); err != nil {
		t.Fatal(err)
	}
	if got[0] != 0xa5 {
		t.Errorf("file byte 0x2fff = %#x, want 0xa5 (mapping not shared?)", got[0])
	}
}

// Regions are unmapped only after the last reference, whether held by the
// caller or by tables, is gone; a mapped region holds its one descriptor
// until then.
func TestRegionLifetime(t *testing.T) {
	const name = "lifetime"
	fdsBefore := countFDs(t)
	live := liveMappings.Load()
	r := mapNew(t, name, 0x2000, RegionSpec{GuestAddr: 0x1000, Size: 0x2000, UserAddr: 0x10000})
	if got := countMaps(t, name); got != 1 {
		t.Fatalf("got %d mappings of %s, want 1", got, name)
	}
	t1, err := NewTable([]*Region{r})
	if err != nil {
		t.Fatal(err)
	}
	t2, err := EmptyTable().With(r) // the empty table leaks nothing: no regions
	if err != nil {
		t.Fatal(err)
	}
	r.Release()
	t1.Release()
	if got := countMaps(t, name); got != 1 {
		t.Fatalf("after caller and t1 released: got %d mappings, want 1", got)
	}
	if got := countFDs(t); got != fdsBefore+1 {
		t.Fatalf("after caller and t1 released: got %d fds, want %d (the region keeps its fd)", got, fdsBefore+1)
	}
	dup, err := r.DupFd()
	if err != nil {
		t.Fatal(err)
	}
	if !r.SameFile(dup) {
		t.Error("DupFd: not the region's file")
	}
	unix.Close(dup)
	b, err := t2.Slice(0x2fff, 1)
	if err != nil {
		t.Fatal(err)
	}
	b[0] = 1 // still mapped
	t2.Release()
	if got := countMaps(t, name); got != 0 {
		t.Errorf("after last release: got %d mappings, want 0", got)
	}
	if got := countFDs(t); got != fdsBefore {
		t.Errorf("after last release: got %d fds, want %d", got, fdsBefore)
	}
	if got := liveMappings.Load(); got != live {
		t.Errorf("liveMappings = %d, want %d", got, live)
	}
}

func TestReleaseTooOftenPanics(t *testing.T) {
	r := mapNew(t, "twice", 0x1000, RegionSpec{Size: 0x1000})
	r.Release()
	func() {
		defer func() {
			if recover() == nil {
				t.Error("second Region.Release did not panic")
			}
		}()
		r.Release()
	}()
	tb := EmptyTable()
	tb.Release()
	defer func() {
		if recover() == nil {
			t.Error("second Table.Release did not panic")
		}
	}()
	tb.Release()
}

func TestNewMemfd(t *testing.T) {
	fd, err := NewMemfd("size", 0x1234)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 0x1234 {
		t.Errorf("size = %#x, want 0x1234", st.Size)
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("F_GETFD = %#x, %v; want FD_CLOEXEC", flags, err)
	}
	if err := SealSize(fd); err != nil {
		t.Fatalf("SealSize: %v", err)
	}
	if err := unix.Ftruncate(fd, 0); !errors.Is(err, unix.EPERM) {
		t.Errorf("ftruncate of sealed memfd: got %v, want EPERM", err)
	}
	if _, err := NewMemfd("huge", math.MaxUint64); !errors.Is(err, ErrOverflow) {
		t.Errorf("NewMemfd(2^64-1): got %v, want ErrOverflow", err)
	}
}
