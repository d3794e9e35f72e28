package memmap

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The dirty log (vhost-user "Migration"): while a front-end migrates the
// guest, it gives the back-end a bitmap of the guest's 4 KiB pages
// (SET_LOG_BASE) and expects every page the back-end writes to be marked
// in it, so the memory it copies is exact. "The log covers from address 0
// to the maximum of guest regions. In pseudo-code, to mark page at addr as
// dirty: page = addr / VHOST_LOG_PAGE; log[page / 8] |= 1 << page % 8.
// Where addr is the guest physical address. Use atomic operations, as the
// log may be concurrently manipulated."
//
// A DirtyLog is that bitmap, mapped. A Table carries the log in use when
// it was installed (Memory.SetLog), and every writer of guest memory marks
// what it wrote through the table it wrote through (Table.MarkDirty), so a
// mark never needs more than the table the write already held.

// LogPageSize is the granule of the dirty log (VHOST_LOG_PAGE).
const LogPageSize = 0x1000

// logPageShift is log2(LogPageSize).
const logPageShift = 12

// MaxLogSize bounds a dirty log's size in bytes: 4 GiB of bitmap covers
// 128 TiB of guest-physical space, more than any front-end maps.
const MaxLogSize = 1 << 32

// ErrBadLog reports a dirty log that cannot be used: zero or oversized,
// misaligned offset or size, not a regular file, smaller than described.
var ErrBadLog = errors.New("bad dirty log")

// DirtyLog is a mapped vhost-user dirty log: bit i of byte j marks the
// guest page at guest-physical (8*j+i)*LogPageSize. It is reference
// counted like a Region: MapDirtyLog returns it with one reference, each
// Table holding it and the Memory using it take another, and the last
// Release unmaps it.
type DirtyLog struct {
	mapping []byte   // immutable; the whole mmap
	words   []uint64 // immutable; the log, as little-endian 64-bit words over the mapping
	pages   uint64   // immutable; pages covered: 8 * the log's size in bytes
	refs    atomic.Int64
	missed  atomic.Uint64 // atomic: page ranges (partly) beyond the log, not marked
	faulted atomic.Bool   // atomic: a mark faulted (the file shrank); no mark is made any more
}

// liveLogs counts mapped dirty logs, for tests.
var liveLogs atomic.Int64

// MapDirtyLog maps size bytes at offset of fd (SET_LOG_BASE's mmap_size
// and mmap_offset), MAP_SHARED, read/write. It takes ownership of fd and
// closes it in every case: the mapping keeps the file. It refuses (errors
// wrap ErrBadLog or ErrOverflow) a zero size or one above MaxLogSize, an
// offset or size that is not a multiple of 8 (the log is an array of
// 64-bit words; QEMU's offset is 0 and its size a multiple of 8), an
// overflow of offset+size, an fd that is not a regular file and a file
// smaller than offset+size.
func MapDirtyLog(fd int, size, offset uint64) (*DirtyLog, error) {
	if fd < 0 {
		return nil, fmt.Errorf("dirty log fd %d: %w", fd, ErrBadLog)
	}
	defer unix.Close(fd)
	if !littleEndian() {
		return nil, fmt.Errorf("dirty log on a big-endian host: %w", ErrBadLog)
	}
	switch {
	case size == 0 || size > MaxLogSize:
		return nil, fmt.Errorf("dirty log of %#x bytes (1..%#x): %w", size, uint64(MaxLogSize), ErrBadLog)
	case size%8 != 0 || offset%8 != 0:
		return nil, fmt.Errorf("dirty log at %#x+%#x is not 8-byte aligned: %w", offset, size, ErrBadLog)
	}
	end, ok := add(offset, size)
	if !ok || end > math.MaxInt64 {
		return nil, fmt.Errorf("dirty log at %#x+%#x: %w", offset, size, ErrOverflow)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("dirty log: fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("dirty log is not a regular file (mode %#o): %w", st.Mode, ErrBadLog)
	}
	if st.Size < 0 || uint64(st.Size) < end {
		return nil, fmt.Errorf("dirty log file of %d bytes, need %d: %w", st.Size, end, ErrBadLog)
	}
	page := uint64(unix.Getpagesize())
	head := offset % page
	m, err := unix.Mmap(fd, int64(offset-head), int(head+size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("dirty log: mmap: %w", err)
	}
	liveLogs.Add(1)
	l := &DirtyLog{mapping: m, words: wordsOf(m[head : head+size]), pages: size * 8}
	l.refs.Store(1)
	return l, nil
}

// Size returns the log's size in bytes.
func (l *DirtyLog) Size() uint64 { return l.pages / 8 }

// Covers reports whether the log has a bit for every page of [gpa,
// gpa+n) (n == 0: the page of gpa).
func (l *DirtyLog) Covers(gpa abi.GPA, n uint64) bool {
	last := uint64(gpa)
	if n > 0 {
		e, ok := add(last, n-1)
		if !ok {
			return false
		}
		last = e
	}
	return last>>logPageShift < l.pages
}

// CoversTable reports whether the log covers every region of t, by
// guest-physical address.
func (l *DirtyLog) CoversTable(t *Table) bool {
	for _, s := range t.byGPA {
		if !l.Covers(abi.GPA(s.start), s.end-s.start) {
			return false
		}
	}
	return true
}

// Missed returns how many marks fell (partly) beyond the log's end and
// were not made there (a front-end whose log does not cover what the
// device writes; the session refuses such logs, so this stays 0).
func (l *DirtyLog) Missed() uint64 { return l.missed.Load() }

// Faulted reports whether a mark faulted: the front-end shrank the log's
// file. No mark is made after that.
func (l *DirtyLog) Faulted() bool { return l.faulted.Load() }

// mark sets the bits of the pages [gpa, gpa+n) touches, atomically (an OR
// per 64-page word), clipped to the log. A fault (the front-end shrank the
// log's file) is contained here, whichever guest's worker marks: the log
// stops, and nothing else of the worker's pass is affected. The loop is
// bounded by the log's size in words.
func (l *DirtyLog) mark(gpa, n uint64) {
	if n == 0 || l.faulted.Load() {
		return
	}
	first := gpa >> logPageShift
	last := uint64(math.MaxUint64) >> logPageShift
	if e, ok := add(gpa, n-1); ok {
		last = e >> logPageShift
	}
	if last >= l.pages {
		l.missed.Add(1)
		if first >= l.pages {
			return
		}
		last = l.pages - 1
	}
	defer l.contain()
	for w := first >> 6; w <= last>>6; w++ {
		lo, hi := uint64(0), uint64(63)
		if w == first>>6 {
			lo = first & 63
		}
		if w == last>>6 {
			hi = last & 63
		}
		mask := (^uint64(0) >> (63 - hi + lo)) << lo
		atomic.OrUint64(&l.words[w], mask)
	}
}

// contain recovers a memory fault of mark (the log's file shrank) and
// stops the log; any other panic goes on.
func (l *DirtyLog) contain() {
	r := recover()
	if r == nil {
		return
	}
	if _, ok := FaultAddr(r); !ok {
		panic(r)
	}
	l.faulted.Store(true)
}

// Test reports whether the bit of the page holding gpa is set (for tests
// and checks).
func (l *DirtyLog) Test(gpa abi.GPA) bool {
	p := uint64(gpa) >> logPageShift
	if p >= l.pages {
		return false
	}
	return atomic.LoadUint64(&l.words[p>>6])&(1<<(p&63)) != 0
}

// tryRef takes a reference unless the log was already released.
func (l *DirtyLog) tryRef() bool {
	for {
		n := l.refs.Load()
		if n <= 0 {
			return false
		}
		if l.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release drops a reference; the last one unmaps the log. Releasing more
// references than were taken panics.
func (l *DirtyLog) Release() {
	switch n := l.refs.Add(-1); {
	case n > 0:
		return
	case n < 0:
		panic("memmap: DirtyLog released too many times")
	}
	_ = unix.Munmap(l.mapping) // ours and valid: fails only on kernel bugs
	l.words = nil
	liveLogs.Add(-1)
}

// MarkDirty marks the guest pages of [gpa, gpa+n) in the table's dirty
// log, if it has one; without one it is a nil check. Every writer of guest
// memory calls it after its write, with the guest-physical range it wrote
// and the table it wrote through, before it releases that table (engine
// and virtio document their writers). gpa need not be mapped (a used
// ring's log address, VHOST_VRING_F_LOG, may lie outside guest memory).
func (t *Table) MarkDirty(gpa abi.GPA, n uint64) {
	if t.log != nil {
		t.log.mark(uint64(gpa), n)
	}
}

// Logging reports whether the table marks writes in a dirty log.
func (t *Table) Logging() bool { return t.log != nil }

// DirtyLog returns the table's dirty log, nil when it has none. It is
// valid while the caller holds a reference on t.
func (t *Table) DirtyLog() *DirtyLog { return t.log }
