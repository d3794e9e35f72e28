package memmap

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// newLogFile returns a memfd of fileSize bytes and a second mapping of it
// through which the test reads the log as the front-end would.
func newLogFile(t *testing.T, name string, fileSize int) (fd int, view []byte) {
	t.Helper()
	fd, err := NewMemfd(name, uint64(fileSize))
	if err != nil {
		t.Fatal(err)
	}
	view, err = unix.Mmap(fd, 0, fileSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(view) })
	return fd, view
}

func dupFd(t *testing.T, fd int) int {
	t.Helper()
	d, err := unix.Dup(fd)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestMapDirtyLogRefuses(t *testing.T) {
	fd, _ := newLogFile(t, "log-refuse", 8192)
	defer unix.Close(fd)
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	tests := []struct {
		name         string
		fd           int
		size, offset uint64
		want         error
	}{
		{"zero size", fd, 0, 0, ErrBadLog},
		{"oversized", fd, MaxLogSize + 8, 0, ErrBadLog},
		{"odd size", fd, 12, 0, ErrBadLog},
		{"odd offset", fd, 8, 4, ErrBadLog},
		{"offset overflows", fd, 8, 1<<64 - 8, ErrOverflow},
		{"past the file", fd, 8192, 8, ErrBadLog},
		{"not a regular file", efd, 8, 0, ErrBadLog},
		{"bad fd", -1, 8, 0, ErrBadLog},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := countFDs(t)
			f := tc.fd
			if f >= 0 {
				f = dupFd(t, f)
			}
			l, err := MapDirtyLog(f, tc.size, tc.offset)
			if !errors.Is(err, tc.want) || l != nil {
				t.Fatalf("MapDirtyLog(%#x, %#x) = %v, %v; want nil, %v", tc.size, tc.offset, l, err, tc.want)
			}
			if got := countFDs(t); got != before {
				t.Errorf("fds %d after a refusal, want %d (the fd is closed in every case)", got, before)
			}
		})
	}
}

func TestDirtyLogMarksBits(t *testing.T) {
	const off = 4096 + 8
	fd, view := newLogFile(t, "log-bits", 3*4096)
	l, err := MapDirtyLog(fd, 64, off) // 512 pages: 2 MiB of guest memory
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	log := view[off : off+64]
	tab := EmptyTable()
	defer tab.Release()
	tab.MarkDirty(0, 4096) // no log: nothing
	if l.Test(0) {
		t.Fatal("a table without a log marked")
	}
	tl := tab.withLog(l)
	defer tl.Release()
	tl.MarkDirty(abi.GPA(9*4096+4095), 2)  // pages 9 and 10
	tl.MarkDirty(abi.GPA(63*4096), 2*4096) // pages 63 and 64: two words
	tl.MarkDirty(abi.GPA(200*4096+7), 1)   // page 200
	tl.MarkDirty(abi.GPA(300*4096), 0)     // nothing
	want := map[int]bool{9: true, 10: true, 63: true, 64: true, 200: true}
	for p := 0; p < 512; p++ {
		// "log[page / 8] |= 1 << page % 8"
		got := log[p/8]&(1<<(p%8)) != 0
		if got != want[p] {
			t.Errorf("page %d: bit %v, want %v", p, got, want[p])
		}
		if l.Test(abi.GPA(p*4096)) != want[p] {
			t.Errorf("Test(page %d) = %v, want %v", p, !want[p], want[p])
		}
	}
	for i, b := range view[:off] {
		if b != 0 {
			t.Fatalf("byte %d before the log's offset written", i)
		}
	}
	for i, b := range view[off+64:] {
		if b != 0 {
			t.Fatalf("byte %d after the log written", off+64+i)
		}
	}
	// Beyond the log: clipped, counted, nothing written outside.
	tl.MarkDirty(abi.GPA(511*4096), 3*4096)
	tl.MarkDirty(abi.GPA(1<<40), 4096)
	tl.MarkDirty(abi.GPA(1<<64-4096), 1<<20) // wraps
	if !l.Test(abi.GPA(511 * 4096)) {
		t.Error("last page not marked by a range that runs past the log")
	}
	if got := l.Missed(); got != 3 {
		t.Errorf("Missed = %d, want 3", got)
	}
	for i, b := range view[off+64:] {
		if b != 0 {
			t.Fatalf("byte %d after the log written", off+64+i)
		}
	}
	if !l.Covers(abi.GPA(511*4096), 4096) || l.Covers(abi.GPA(511*4096), 4097) || l.Covers(1<<64-1, 2) {
		t.Error("Covers wrong at the log's end")
	}
}

func TestMemorySetLog(t *testing.T) {
	live := liveLogs.Load()
	r := mapNew(t, "log-guest", 1<<20, RegionSpec{GuestAddr: 0x100000, Size: 1 << 20, UserAddr: 0x7f0000000000})
	defer r.Release()
	m := NewMemory()
	m.Swap(tableOf(t, r))

	fd, view := newLogFile(t, "log-mem", 4096)
	l, err := MapDirtyLog(fd, 64, 0)
	if err != nil {
		t.Fatal(err)
	}
	if countMaps(t, "log-mem") != 2 {
		t.Fatalf("log mapped %d times, want 2 (the test's and the log's)", countMaps(t, "log-mem"))
	}
	held := m.Acquire() // a worker in the middle of a pass
	idle := m.SetLog(l)
	l.Release() // the Memory keeps its own
	select {
	case <-idle:
		t.Fatal("Idle closed while a worker holds the replaced table")
	default:
	}
	held.MarkDirty(0x100000, 1) // the old table has no log
	if view[0] != 0 {
		t.Fatal("the table acquired before SetLog marked in the new log")
	}
	held.Release()
	<-idle

	cur := m.Acquire()
	if !cur.Logging() || !l.CoversTable(cur) {
		t.Fatal("the current table does not log into the new log")
	}
	cur.MarkDirty(0x100000+5*4096, 8) // page 0x105
	cur.Release()
	if view[0x105/8]&(1<<(0x105%8)) == 0 {
		t.Error("page 0x105 not marked")
	}
	// A new memory table keeps the log (SET_MEM_TABLE while migrating).
	m.Swap(tableOf(t, r))
	cur = m.Acquire()
	if cur.DirtyLog() != l {
		t.Error("Swap dropped the dirty log")
	}
	cur.Release()
	// Logging off: the log is unmapped once no table holds it.
	<-m.SetLog(nil)
	cur = m.Acquire()
	if cur.Logging() {
		t.Error("logging still on after SetLog(nil)")
	}
	cur.Release()
	if got := countMaps(t, "log-mem"); got != 1 {
		t.Errorf("log still mapped after SetLog(nil): %d mappings, want 1 (the test's)", got)
	}
	m.Close()
	if got := liveLogs.Load(); got != live {
		t.Errorf("liveLogs = %d, want %d", got, live)
	}
}

// A front-end that shrinks its log's file makes marks fault: the fault is
// contained in the mark, the log stops, the caller goes on.
func TestDirtyLogShrunk(t *testing.T) {
	fd, err := NewMemfd("log-shrink", 2*4096)
	if err != nil {
		t.Fatal(err)
	}
	keep := dupFd(t, fd)
	defer unix.Close(keep)
	l, err := MapDirtyLog(fd, 2*4096, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	tab := EmptyTable().withLog(l)
	defer tab.Release()
	if err := unix.Ftruncate(keep, 0); err != nil {
		t.Fatal(err)
	}
	if err := Guard(func() { tab.MarkDirty(0, 4096) }); err != nil {
		t.Fatalf("a mark's fault reached the caller: %v", err)
	}
	if !l.Faulted() {
		t.Error("Faulted = false after a mark into a shrunk log")
	}
	if err := Guard(func() { tab.MarkDirty(1<<27, 4096) }); err != nil {
		t.Fatalf("mark after the fault: %v", err)
	}
}
