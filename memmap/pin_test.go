package memmap

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// vmLck returns this process's locked memory in bytes, from
// /proc/self/status.
func vmLck(t testing.TB) uint64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatalf("open /proc/self/status: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmLck:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil {
			t.Fatalf("parse VmLck %q: %v", rest, err)
		}
		return kb * 1024
	}
	t.Fatal("no VmLck in /proc/self/status")
	return 0
}

// needMlock skips the test unless this process may lock enough memory.
func needMlock(t testing.TB, bytes uint64) {
	t.Helper()
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		t.Fatalf("getrlimit: %v", err)
	}
	if os.Geteuid() == 0 || lim.Cur == unix.RLIM_INFINITY || lim.Cur >= bytes+(1<<20) {
		return
	}
	want := unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &want); err != nil {
		t.Skipf("RLIMIT_MEMLOCK is %d and cannot be raised (%v): need root or CAP_IPC_LOCK", lim.Cur, err)
	}
}

// lockWatch checks that VmLck moves exactly as a test says it should.
type lockWatch struct {
	t    testing.TB
	base uint64
}

func watchLocks(t testing.TB) *lockWatch {
	t.Helper()
	needMlock(t, 64<<20)
	return &lockWatch{t: t, base: vmLck(t)}
}

// expect checks that VmLck is base+bytes.
func (w *lockWatch) expect(what string, bytes uint64) {
	w.t.Helper()
	if got := vmLck(w.t) - w.base; got != bytes {
		w.t.Errorf("%s: VmLck grew by %d, want %d", what, got, bytes)
	}
}

// checkPinner verifies the Pinner's internal invariants: every tracked
// region's extents are ordered, disjoint, inside the region, merged (no
// adjacent pinned pair with equal counts, no adjacent cached pair
// consecutive in the LRU list in address order), none held; the treap holds
// exactly the address list with the heap order of priorities; per-region and
// total counters equal the sums over the extents; the LRU list is a
// consistent doubly linked list of exactly the cached extents of tracked
// regions; the cache respects its bound and the quota; no fixup is pending;
// and the accounting (if any) equals the locked bytes.
func checkPinner(t testing.TB, p *Pinner) {
	t.Helper()
	checkPinnerShared(t, p, 0)
}

// checkPinnerShared is checkPinner for a Pinner whose Accounting other
// Pinners share, locking others bytes.
func checkPinnerShared(t testing.TB, p *Pinner, others uint64) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	var pinned, cached uint64
	cachedExts := map[*extent]bool{}
	for r, rp := range p.byRegion {
		if rp.r != r {
			t.Fatalf("region %p: tracked under %p", rp.r, r)
		}
		if r.refs.Load() < 1 {
			t.Errorf("region gpa %#x: tracked with %d references", rp.start, r.refs.Load())
		}
		var rpin, rcache, n uint64
		var prev *extent
		var list []*extent
		for e := rp.head; e != nil; prev, e = e, e.next {
			if n++; n > rp.exts+1 || n > 1<<24 {
				t.Fatalf("region gpa %#x: address list longer than %d extents (cycle?)", rp.start, rp.exts)
			}
			list = append(list, e)
			switch {
			case e.rp != rp:
				t.Fatalf("extent [%d, %d] of region gpa %#x names another region", e.first, e.last, rp.start)
			case e.prev != prev:
				t.Fatalf("extent [%d, %d]: bad prev link", e.first, e.last)
			case e.first > e.last || e.last > rp.lastPage():
				t.Fatalf("extent [%d, %d] of a region of %d pages", e.first, e.last, rp.lastPage()+1)
			case prev != nil && prev.last >= e.first:
				t.Fatalf("extents [%d, %d] and [%d, %d] overlap or are out of order", prev.first, prev.last, e.first, e.last)
			case e.held:
				t.Errorf("extent [%d, %d] left held", e.first, e.last)
			}
			if prev != nil && prev.last+1 == e.first && prev.count == e.count && (e.count != 0 || prev.newer == e) {
				t.Errorf("region gpa %#x: extents [%d, %d] and [%d, %d] (count %d) not merged",
					rp.start, prev.first, prev.last, e.first, e.last, e.count)
			}
			if e.count > 0 {
				rpin += e.pages()
				if e.older != nil || e.newer != nil || p.oldest == e {
					t.Errorf("pinned extent [%d, %d] linked in the LRU list", e.first, e.last)
				}
			} else {
				rcache += e.pages()
				cachedExts[e] = true
			}
		}
		if n != rp.exts {
			t.Errorf("region gpa %#x: %d extents listed, counter says %d", rp.start, n, rp.exts)
		}
		var inorder []*extent
		var walk func(e *extent, lo, hi uint64, depth int) // keys in [lo, hi]
		walk = func(e *extent, lo, hi uint64, depth int) {
			if e == nil {
				return
			}
			if depth > 1000 || e.first < lo || e.first > hi {
				t.Fatalf("region gpa %#x: treap out of order at extent [%d, %d]", rp.start, e.first, e.last)
			}
			for _, c := range []*extent{e.left, e.right} {
				if c != nil && c.prio > e.prio {
					t.Errorf("region gpa %#x: treap heap order broken under [%d, %d]", rp.start, e.first, e.last)
				}
			}
			if e.first > 0 {
				walk(e.left, lo, e.first-1, depth+1)
			} else if e.left != nil {
				t.Fatalf("extent at page 0 has a left child")
			}
			inorder = append(inorder, e)
			walk(e.right, e.first+1, hi, depth+1)
		}
		walk(rp.root, 0, math.MaxUint64, 0)
		if !slices.Equal(inorder, list) {
			t.Errorf("region gpa %#x: treap holds %d extents, address list %d, or another order", rp.start, len(inorder), len(list))
		}
		if rpin != rp.pinned || rcache != rp.cached {
			t.Errorf("region gpa %#x: got %d pinned, %d cached pages, counters say %d, %d",
				rp.start, rpin, rcache, rp.pinned, rp.cached)
		}
		pinned += rpin
		cached += rcache
	}
	if pinned+cached != p.locked || cached != p.cached {
		t.Errorf("got %d pinned + %d cached pages, counters say locked %d, cached %d", pinned, cached, p.locked, p.cached)
	}
	n := uint64(0)
	var prev *extent
	for e := p.oldest; e != nil; prev, e = e, e.newer {
		if n++; n > uint64(len(cachedExts)) {
			t.Fatalf("LRU list longer than the %d cached extents (cycle or stray extent?)", len(cachedExts))
		}
		if !cachedExts[e] || e.older != prev {
			t.Fatalf("LRU node [%d, %d] count %d: not a cached extent of a tracked region, or bad older link", e.first, e.last, e.count)
		}
	}
	if n != uint64(len(cachedExts)) || p.newest != prev || n != p.lruLen {
		t.Errorf("LRU list has %d extents (counter %d), want %d; newest %p, want %p", n, p.lruLen, len(cachedExts), p.newest, prev)
	}
	if p.cached > p.cachePages {
		t.Errorf("%d pages cached, bound %d", p.cached, p.cachePages)
	}
	if q := p.cfg.MaxPinned; q != 0 && p.locked*PageSize > q {
		t.Errorf("%d bytes locked, quota %d", p.locked*PageSize, q)
	}
	if len(p.scratch.fix) != 0 || len(p.scratch.held) != 0 {
		t.Errorf("%d fixups and %d held extents left over", len(p.scratch.fix), len(p.scratch.held))
	}
	if a := p.cfg.Accounting; a != nil {
		if got := a.Pinned(); got != p.locked*PageSize+others {
			t.Errorf("accounting says %d bytes, pinner locks %d, others %d", got, p.locked*PageSize, others)
		}
	}
}

// pageCount returns the pin count of guest page gpa in the region holding
// it in t (0 if untracked, unlocked or cached).
func pageCount(t testing.TB, p *Pinner, tab *Table, gpa abi.GPA) uint32 {
	t.Helper()
	i := find(tab.byGPA, uint64(gpa))
	if i < 0 {
		t.Fatalf("gpa %#x not mapped", uint64(gpa))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	rp := p.byRegion[tab.regions[i]]
	if rp == nil {
		return 0
	}
	idx := uint64(gpa)>>pageShift - rp.first
	if e := rp.lowerBound(idx); e != nil && e.first <= idx {
		return e.count
	}
	return 0
}

// lruPage names a cached page: its region and guest page number.
type lruPage struct {
	r   *Region
	gpn uint64
}

// lruPages lists the cached pages from the least recently released.
func lruPages(p *Pinner) []lruPage {
	p.mu.Lock()
	defer p.mu.Unlock()
	var l []lruPage
	for e := p.oldest; e != nil; e = e.newer {
		for i := e.first; i <= e.last; i++ {
			l = append(l, lruPage{e.rp.r, e.rp.first + i})
		}
	}
	return l
}

// extents returns the number of extents tracked for r.
func extents(p *Pinner, r *Region) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rp := p.byRegion[r]; rp != nil {
		return rp.exts
	}
	return 0
}

// testTable maps the given specs over one memfd of fileSize bytes each and
// returns a table of them; everything is released at cleanup.
func testTable(t testing.TB, fileSize uint64, specs ...RegionSpec) (*Table, []*Region) {
	t.Helper()
	var regions []*Region
	for i, s := range specs {
		if s.UserAddr == 0 {
			s.UserAddr = UVA(s.GuestAddr) + 1<<40
		}
		regions = append(regions, mapNew(t, fmt.Sprintf("pin%d", i), fileSize, s))
	}
	tab, err := NewTable(regions)
	if err != nil {
		t.Fatalf("NewTable: %v", err)
	}
	t.Cleanup(func() {
		tab.Release()
		for _, r := range regions {
			r.Release()
		}
	})
	return tab, regions
}

const pg = PageSize

func wantStats(t testing.TB, p *Pinner, want PinStats) {
	t.Helper()
	if got := p.Stats(); got != want {
		t.Errorf("got stats %+v, want %+v", got, want)
	}
}

func TestPinRefcountShared(t *testing.T) {
	w := watchLocks(t)
	tab, _ := testTable(t, 16*pg, RegionSpec{GuestAddr: 0x100000, Size: 16 * pg})
	acct := NewAccounting(0)
	p := NewPinner(PinConfig{Accounting: acct})
	defer p.Close()

	// [0x100000, 0x103000) and [0x102800, 0x104000): page 0x102000 shared.
	if err := p.Pin(tab, 0x100000, 3*pg); err != nil {
		t.Fatalf("Pin A: %v", err)
	}
	if err := p.Pin(tab, 0x102800, 0x1800); err != nil {
		t.Fatalf("Pin B: %v", err)
	}
	checkPinner(t, p)
	for _, c := range []struct {
		gpa  abi.GPA
		want uint32
	}{{0x100000, 1}, {0x101000, 1}, {0x102000, 2}, {0x103000, 1}, {0x104000, 0}} {
		if got := pageCount(t, p, tab, c.gpa); got != c.want {
			t.Errorf("page %#x: got count %d, want %d", uint64(c.gpa), got, c.want)
		}
	}
	wantStats(t, p, PinStats{PinnedBytes: 4 * pg, CacheMisses: 4})
	w.expect("after two pins", 4*pg)
	if got := acct.Pinned(); got != 4*pg {
		t.Errorf("got accounting %d, want %d", got, 4*pg)
	}

	p.Unpin(tab, 0x100000, 3*pg)
	checkPinner(t, p)
	wantStats(t, p, PinStats{PinnedBytes: 2 * pg, CacheMisses: 4})
	w.expect("after unpin A", 2*pg)
	if got := pageCount(t, p, tab, 0x102000); got != 1 {
		t.Errorf("shared page: got count %d, want 1", got)
	}

	// A surplus unpin of A's pages changes nothing.
	p.Unpin(tab, 0x100000, 2*pg)
	w.expect("after surplus unpin", 2*pg)

	p.Unpin(tab, 0x102800, 0x1800)
	checkPinner(t, p)
	wantStats(t, p, PinStats{CacheMisses: 4})
	w.expect("after unpin B", 0)
	if got := acct.Pinned(); got != 0 {
		t.Errorf("got accounting %d, want 0", got)
	}
}

func TestPinErrors(t *testing.T) {
	w := watchLocks(t)
	// Two GPA-adjacent regions [0x10000, 0x14000) and [0x14000, 0x16000),
	// then a gap, then [0x20000, 0x21000).
	tab, _ := testTable(t, 8*pg,
		RegionSpec{GuestAddr: 0x10000, Size: 4 * pg},
		RegionSpec{GuestAddr: 0x14000, Size: 2 * pg, MmapOffset: 4 * pg},
		RegionSpec{GuestAddr: 0x20000, Size: pg})
	tests := []struct {
		name string
		gpa  abi.GPA
		n    uint64
		want error
	}{
		{"unmapped start", 0x0, pg, ErrNotMapped},
		{"runs off mapped memory", 0x12000, 5 * pg, ErrNotMapped},
		{"runs into gap by one byte", 0x10000, 6*pg + 1, ErrNotMapped},
		{"spans gap", 0x15000, 0xc000, ErrNotMapped},
		{"overflow", 0x10000, math.MaxUint64, ErrOverflow},
		{"near 2^64", math.MaxUint64 - 0xfff, 0x1000, ErrOverflow},
	}
	p := NewPinner(PinConfig{CacheBytes: 8 * pg})
	defer p.Close()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := p.Pin(tab, tt.gpa, tt.n)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Pin(%#x, %#x): got %v, want %v", uint64(tt.gpa), tt.n, err, tt.want)
			}
			var re *RangeError
			if !errors.As(err, &re) {
				t.Errorf("got %T, want *RangeError", err)
			}
			checkPinner(t, p)
			wantStats(t, p, PinStats{})
			w.expect("after failed pin", 0)
		})
	}
	t.Run("zero length", func(t *testing.T) {
		if err := p.Pin(tab, 0, 0); err != nil {
			t.Errorf("Pin(0, 0): got %v, want nil", err)
		}
		wantStats(t, p, PinStats{})
	})
	t.Run("across adjacent regions", func(t *testing.T) {
		if err := p.Pin(tab, 0x13800, 0x1000); err != nil {
			t.Fatalf("Pin: %v", err)
		}
		wantStats(t, p, PinStats{PinnedBytes: 2 * pg, CacheMisses: 2})
		w.expect("pinned across", 2*pg)
		p.Unpin(tab, 0x13800, 0x1000)
		checkPinner(t, p)
	})
}

func TestPinRollbackAfterMlockFailure(t *testing.T) {
	w := watchLocks(t)
	fdA, err := NewMemfd("rollA", 4*pg)
	if err != nil {
		t.Fatal(err)
	}
	fdB, err := NewMemfd("rollB", 4*pg)
	if err != nil {
		t.Fatal(err)
	}
	truncB := dupFD(t, fdB)
	defer unix.Close(truncB)
	ra, err := MapRegion(fdA, RegionSpec{GuestAddr: 0x10000, Size: 4 * pg, UserAddr: 0x10000})
	if err != nil {
		t.Fatal(err)
	}
	defer ra.Release()
	rb, err := MapRegion(fdB, RegionSpec{GuestAddr: 0x14000, Size: 4 * pg, UserAddr: 0x14000})
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Release()
	tab, err := NewTable([]*Region{ra, rb})
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Release()

	acct := NewAccounting(0)
	p := NewPinner(PinConfig{Accounting: acct, CacheBytes: 16 * pg})
	defer p.Close()
	// Cache page 0x10000 so the failing Pin also takes a hit to give back.
	if err := p.Pin(tab, 0x10000, pg); err != nil {
		t.Fatal(err)
	}
	p.Unpin(tab, 0x10000, pg)
	w.expect("one cached page", pg)

	// The front-end shrinks B's file: populating B's pages fails, after A's
	// run was locked.
	if err := unix.Ftruncate(truncB, 0); err != nil {
		t.Fatal(err)
	}
	err = p.Pin(tab, 0x10000, 8*pg)
	if err == nil {
		t.Fatal("Pin over a truncated region: got nil, want an mlock error")
	}
	if errors.Is(err, ErrQuota) {
		t.Errorf("got %v, want a non-quota error", err)
	}
	checkPinner(t, p)
	wantStats(t, p, PinStats{CachedBytes: pg, CacheMisses: 1})
	w.expect("after rollback", pg)
	if got := acct.Pinned(); got != pg {
		t.Errorf("got accounting %d, want %d", got, pg)
	}
	// The hit went back to the cache: it is hit again.
	if err := p.Pin(tab, 0x10000, pg); err != nil {
		t.Fatal(err)
	}
	wantStats(t, p, PinStats{PinnedBytes: pg, CacheHits: 1, CacheMisses: 1})
}

func TestPinRollbackCountOverflow(t *testing.T) {
	w := watchLocks(t)
	tab, _ := testTable(t, 8*pg, RegionSpec{GuestAddr: 0x10000, Size: 8 * pg})
	p := NewPinner(PinConfig{})
	defer p.Close()
	if err := p.Pin(tab, 0x13000, pg); err != nil {
		t.Fatal(err)
	}
	// Drive page 0x13000's count to the maximum by hand.
	p.mu.Lock()
	rp := p.byRegion[tab.regions[0]]
	if e := rp.lowerBound(3); e == nil || e.first != 3 || e.last != 3 {
		t.Fatalf("page 3 is not an extent of its own")
	} else {
		e.count = math.MaxUint32
	}
	p.mu.Unlock()
	err := p.Pin(tab, 0x10000, 8*pg)
	if !errors.Is(err, ErrOverflow) {
		t.Fatalf("got %v, want ErrOverflow", err)
	}
	checkPinner(t, p)
	w.expect("after overflow", pg)
	for i := range uint64(8) {
		want := uint32(0)
		if i == 3 {
			want = math.MaxUint32
		}
		if got := pageCount(t, p, tab, abi.GPA(0x10000+i*pg)); got != want {
			t.Errorf("page %d: got count %d, want %d", i, got, want)
		}
	}
}

func TestPinQuota(t *testing.T) {
	w := watchLocks(t)
	tab, _ := testTable(t, 64*pg, RegionSpec{GuestAddr: 0, Size: 64 * pg})
	p := NewPinner(PinConfig{MaxPinned: 8 * pg, CacheBytes: 8 * pg})
	defer p.Close()

	if err := p.Pin(tab, 0, 6*pg); err != nil { // pages 0-5
		t.Fatal(err)
	}
	p.Unpin(tab, 0, 6*pg) // 6 cached
	// 4 new pages: 6+4 > 8, so the 2 oldest cached pages are evicted.
	if err := p.Pin(tab, 16*pg, 4*pg); err != nil {
		t.Fatalf("Pin within quota after eviction: %v", err)
	}
	checkPinner(t, p)
	wantStats(t, p, PinStats{PinnedBytes: 4 * pg, CachedBytes: 4 * pg, CacheMisses: 10, Evictions: 2})
	w.expect("after eviction", 8*pg)
	if got := pageCount(t, p, tab, 0); got != 0 {
		t.Errorf("page 0 count %d, want 0", got)
	}

	// The Pin's own hits are never evicted to make room for its misses:
	// cached pages 2-5 plus 5 new ones is 4 pinned + 9 > 8.
	err := p.Pin(tab, 2*pg, 9*pg)
	var qe *QuotaError
	if !errors.Is(err, ErrQuota) || !errors.As(err, &qe) || qe.Global {
		t.Fatalf("got %v, want a device *QuotaError", err)
	}
	checkPinner(t, p)
	// Nothing pinned, and the cache was evicted first (the hits, given
	// back, are cached again).
	wantStats(t, p, PinStats{PinnedBytes: 4 * pg, CachedBytes: 4 * pg, CacheMisses: 10, Evictions: 2})
	w.expect("after quota failure", 8*pg)

	// 5 new pages: evicts all 4 cached pages, then 4+5 > 8 still fails.
	err = p.Pin(tab, 32*pg, 5*pg)
	if !errors.Is(err, ErrQuota) {
		t.Fatalf("got %v, want ErrQuota", err)
	}
	checkPinner(t, p)
	wantStats(t, p, PinStats{PinnedBytes: 4 * pg, CacheMisses: 10, Evictions: 6})
	w.expect("after eviction and failure", 4*pg)

	// Exactly at the quota works.
	if err := p.Pin(tab, 32*pg, 4*pg); err != nil {
		t.Fatalf("Pin up to the quota: %v", err)
	}
	w.expect("at quota", 8*pg)
}

func TestPinGlobalLimit(t *testing.T) {
	w := watchLocks(t)
	tab1, _ := testTable(t, 16*pg, RegionSpec{GuestAddr: 0, Size: 16 * pg})
	tab2, _ := testTable(t, 16*pg, RegionSpec{GuestAddr: 0, Size: 16 * pg})
	acct := NewAccounting(10 * pg)
	p1 := NewPinner(PinConfig{Accounting: acct, CacheBytes: 16 * pg})
	p2 := NewPinner(PinConfig{Accounting: acct})
	defer p1.Close()
	defer p2.Close()

	if err := p1.Pin(tab1, 0, 6*pg); err != nil {
		t.Fatal(err)
	}
	p1.Unpin(tab1, 0, 3*pg) // 3 pinned, 3 cached
	if err := p2.Pin(tab2, 0, 4*pg); err != nil {
		t.Fatal(err)
	}
	if got := acct.Pinned(); got != 10*pg {
		t.Fatalf("got accounting %d, want %d", got, 10*pg)
	}
	// p2 cannot evict p1's cache.
	err := p2.Pin(tab2, 8*pg, pg)
	var qe *QuotaError
	if !errors.As(err, &qe) || !qe.Global {
		t.Fatalf("got %v, want a global *QuotaError", err)
	}
	// p1 evicts its own cache to make room.
	if err := p1.Pin(tab1, 8*pg, 2*pg); err != nil {
		t.Fatalf("Pin after own eviction: %v", err)
	}
	if s := p1.Stats(); s.Evictions != 2 || s.CachedBytes != pg {
		t.Errorf("got p1 stats %+v, want 2 evictions, 1 page cached", s)
	}
	if got := acct.Pinned(); got != 10*pg {
		t.Errorf("got accounting %d, want %d", got, 10*pg)
	}
	w.expect("two devices", 10*pg)
	p1.Close()
	p2.Close()
	if got := acct.Pinned(); got != 0 {
		t.Errorf("after Close: got accounting %d, want 0", got)
	}
	w.expect("closed", 0)
}

func TestPinCacheLRU(t *testing.T) {
	w := watchLocks(t)
	tab, _ := testTable(t, 32*pg, RegionSpec{GuestAddr: 0x40000, Size: 32 * pg})
	p := NewPinner(PinConfig{CacheBytes: 4*pg + 100}) // 4 pages
	defer p.Close()
	a, b, c := abi.GPA(0x40000), abi.GPA(0x48000), abi.GPA(0x50000)
	for _, g := range []abi.GPA{a, b, c} {
		if err := p.Pin(tab, g, 2*pg); err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range []abi.GPA{a, b, c} {
		p.Unpin(tab, g, 2*pg)
	}
	// Cache bound 4 pages: a, released first, was munlocked.
	checkPinner(t, p)
	wantStats(t, p, PinStats{CachedBytes: 4 * pg, CacheMisses: 6, Evictions: 2})
	w.expect("cache full", 4*pg)

	// Re-pinning b hits the cache and makes no system call.
	if err := p.Pin(tab, b, 2*pg); err != nil {
		t.Fatal(err)
	}
	wantStats(t, p, PinStats{PinnedBytes: 2 * pg, CachedBytes: 2 * pg, CacheHits: 2, CacheMisses: 6, Evictions: 2})
	// Re-pinning a misses.
	if err := p.Pin(tab, a, 2*pg); err != nil {
		t.Fatal(err)
	}
	wantStats(t, p, PinStats{PinnedBytes: 4 * pg, CachedBytes: 2 * pg, CacheHits: 2, CacheMisses: 8, Evictions: 2})
	w.expect("two pinned, one cached", 6*pg)
	// Release b then a: c is now the oldest and goes first.
	p.Unpin(tab, b, 2*pg)
	p.Unpin(tab, a, 2*pg)
	checkPinner(t, p)
	wantStats(t, p, PinStats{CachedBytes: 4 * pg, CacheHits: 2, CacheMisses: 8, Evictions: 4})
	if err := p.Pin(tab, c, 2*pg); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.CacheHits != 2 || s.CacheMisses != 10 {
		t.Errorf("c re-pinned: got %+v, want a miss (c was evicted)", s)
	}
	if err := p.Pin(tab, b, 2*pg); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.CacheHits != 4 {
		t.Errorf("b re-pinned: got %+v, want a hit", s)
	}
	checkPinner(t, p)
}

func TestPinPages(t *testing.T) {
	w := watchLocks(t)
	// Region A ends, and B starts, in the middle of page 0x11000.
	tab, _ := testTable(t, 8*pg,
		RegionSpec{GuestAddr: 0x10000, Size: 0x1800},
		RegionSpec{GuestAddr: 0x11800, Size: 0x2800, MmapOffset: 0x1800})
	p := NewPinner(PinConfig{})
	defer p.Close()

	t.Run("refused", func(t *testing.T) {
		for _, c := range []struct {
			pages []abi.GPA
			want  error
		}{
			{[]abi.GPA{0x10000, 0x10800}, ErrUnaligned},
			{[]abi.GPA{0x10000, 0x14000}, ErrNotMapped},
			{[]abi.GPA{0x13000, 0x20000}, ErrNotMapped},
			{[]abi.GPA{0xfffffffffffff000}, ErrOverflow},
		} {
			if err := p.PinPages(tab, c.pages); !errors.Is(err, c.want) {
				t.Errorf("PinPages(%#x): got %v, want %v", c.pages, err, c.want)
			}
			checkPinner(t, p)
			wantStats(t, p, PinStats{})
			w.expect("refused", 0)
		}
	})
	// Unsorted, with a duplicate, and page 0x11000 straddling A and B (one
	// host page of each mapping).
	pages := []abi.GPA{0x13000, 0x11000, 0x10000, 0x13000}
	if err := p.PinPages(tab, pages); err != nil {
		t.Fatal(err)
	}
	checkPinner(t, p)
	wantStats(t, p, PinStats{PinnedBytes: 4 * pg, CacheMisses: 4})
	w.expect("pinned pages", 4*pg)
	if got := pageCount(t, p, tab, 0x13000); got != 2 {
		t.Errorf("duplicated page: got count %d, want 2", got)
	}
	p.UnpinPages(tab, []abi.GPA{0x13000, 0x10001, 0x40000})
	if got := pageCount(t, p, tab, 0x13000); got != 1 {
		t.Errorf("after one unpin: got count %d, want 1", got)
	}
	p.UnpinPages(tab, []abi.GPA{0x10000, 0x11000, 0x13000})
	checkPinner(t, p)
	wantStats(t, p, PinStats{CacheMisses: 4})
	w.expect("unpinned pages", 0)
}

func TestPinMisalignedRegion(t *testing.T) {
	tab, _ := testTable(t, 4*pg, RegionSpec{GuestAddr: 0x10000, Size: 2 * pg, MmapOffset: 0x800})
	p := NewPinner(PinConfig{})
	defer p.Close()
	if err := p.Pin(tab, 0x10000, pg); !errors.Is(err, ErrBadRegion) {
		t.Errorf("got %v, want ErrBadRegion", err)
	}
	checkPinner(t, p)
	all := NewPinner(PinConfig{All: true})
	defer all.Close()
	if err := all.SetTable(tab); !errors.Is(err, ErrBadRegion) {
		t.Errorf("pin=all SetTable: got %v, want ErrBadRegion", err)
	}
}

func TestPinAll(t *testing.T) {
	w := watchLocks(t)
	tab, regions := testTable(t, 16*pg,
		RegionSpec{GuestAddr: 0, Size: 16 * pg},
		RegionSpec{GuestAddr: 1 << 32, Size: 8 * pg})
	refs0, refs1 := regions[0].refs.Load(), regions[1].refs.Load()
	acct := NewAccounting(0)
	p := NewPinner(PinConfig{All: true, CacheBytes: 4 * pg, Accounting: acct})
	defer p.Close()
	if err := p.SetTable(tab); err != nil {
		t.Fatalf("SetTable: %v", err)
	}
	checkPinner(t, p)
	wantStats(t, p, PinStats{PinnedBytes: 24 * pg, CacheMisses: 24})
	w.expect("pin=all", 24*pg)
	if got := regions[1].refs.Load(); got != refs1+1 {
		t.Errorf("got %d references on a pinned region, want %d", got, refs1+1)
	}
	// Idempotent for regions already pinned.
	if err := p.SetTable(tab); err != nil {
		t.Fatal(err)
	}
	w.expect("pin=all again", 24*pg)
	// MRs count on top; releasing them keeps the pages pinned.
	if err := p.Pin(tab, 0, 4*pg); err != nil {
		t.Fatal(err)
	}
	p.Unpin(tab, 0, 4*pg)
	wantStats(t, p, PinStats{PinnedBytes: 24 * pg, CacheMisses: 24})
	if got := pageCount(t, p, tab, 0); got != 1 {
		t.Errorf("got count %d, want 1", got)
	}
	// Remove the second region: its pages are forgotten and unlocked, and
	// its reference dropped.
	smaller, err := tab.Without(regions[1].Spec())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SetTable(smaller); err != nil {
		t.Fatal(err)
	}
	checkPinner(t, p)
	wantStats(t, p, PinStats{PinnedBytes: 16 * pg, CacheMisses: 24})
	w.expect("region removed", 16*pg)
	if got := acct.Pinned(); got != 16*pg {
		t.Errorf("got accounting %d, want %d", got, 16*pg)
	}
	if got := regions[1].refs.Load(); got != refs1 {
		t.Errorf("got %d references on a forgotten region, want %d", got, refs1)
	}
	// Unpinning in the removed region (through the old table) is a no-op.
	p.Unpin(tab, 1<<32, 8*pg)
	checkPinner(t, p)
	p.Close()
	w.expect("closed", 0)
	smaller.Release()
	if got := regions[0].refs.Load(); got != refs0 {
		t.Errorf("got %d references after Close, want %d", got, refs0)
	}
}

func TestPinAllQuota(t *testing.T) {
	w := watchLocks(t)
	tab, _ := testTable(t, 16*pg,
		RegionSpec{GuestAddr: 0, Size: 8 * pg},
		RegionSpec{GuestAddr: 1 << 20, Size: 8 * pg, MmapOffset: 8 * pg})
	p := NewPinner(PinConfig{All: true, MaxPinned: 12 * pg})
	defer p.Close()
	if err := p.SetTable(tab); !errors.Is(err, ErrQuota) {
		t.Fatalf("got %v, want ErrQuota", err)
	}
	checkPinner(t, p)
	w.expect("one region pinned", 8*pg)
}

func TestPinClose(t *testing.T) {
	w := watchLocks(t)
	live := liveMappings.Load()
	regions := []*Region{
		mapNew(t, "close0", 32*pg, RegionSpec{GuestAddr: 0, Size: 16 * pg}),
		mapNew(t, "close1", 32*pg, RegionSpec{GuestAddr: 16 * pg, Size: 16 * pg, MmapOffset: 16 * pg, UserAddr: 16 * pg}),
	}
	tab, err := NewTable(regions)
	if err != nil {
		t.Fatal(err)
	}
	acct := NewAccounting(0)
	p := NewPinner(PinConfig{CacheBytes: 8 * pg, Accounting: acct})
	if err := p.SetTable(tab); err != nil {
		t.Fatal(err)
	}
	if err := p.Pin(tab, 0, 24*pg); err != nil {
		t.Fatal(err)
	}
	if err := p.PinPages(tab, []abi.GPA{30 * pg, 31 * pg}); err != nil {
		t.Fatal(err)
	}
	p.Unpin(tab, 0, 4*pg)
	w.expect("before Close", 26*pg)
	if got := acct.Pinned(); got != 26*pg {
		t.Errorf("got accounting %d, want %d", got, 26*pg)
	}
	// The pinner's references keep the regions mapped after the table and
	// the caller let go.
	tab.Release()
	for _, r := range regions {
		r.Release()
	}
	if got := liveMappings.Load(); got != live+2 {
		t.Errorf("got %d live mappings, want %d", got, live+2)
	}
	p.Close()
	p.Close() // idempotent
	w.expect("after Close", 0)
	if got := acct.Pinned(); got != 0 {
		t.Errorf("got accounting %d, want 0", got)
	}
	if got := liveMappings.Load(); got != live {
		t.Errorf("got %d live mappings, want %d", got, live)
	}
	wantStats(t, p, PinStats{CacheMisses: 26})
	if err := p.Pin(EmptyTable(), 0, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("Pin after Close: got %v, want ErrClosed", err)
	}
	if err := p.SetTable(EmptyTable()); !errors.Is(err, ErrClosed) {
		t.Errorf("SetTable after Close: got %v, want ErrClosed", err)
	}
}

func TestPinConcurrent(t *testing.T) {
	w := watchLocks(t)
	tab, _ := testTable(t, 256*pg,
		RegionSpec{GuestAddr: 0, Size: 128 * pg},
		RegionSpec{GuestAddr: 128 * pg, Size: 128 * pg, MmapOffset: 128 * pg})
	acct := NewAccounting(200 * pg)
	p := NewPinner(PinConfig{CacheBytes: 32 * pg, MaxPinned: 160 * pg, Accounting: acct})
	defer p.Close()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 300 {
				gpa := abi.GPA(rng.Uint64N(256*pg - 1))
				n := 1 + rng.Uint64N(min(32*pg, 256*pg-uint64(gpa)))
				if rng.IntN(2) == 0 {
					if err := p.Pin(tab, gpa, n); err != nil {
						if !errors.Is(err, ErrQuota) {
							t.Errorf("Pin: %v", err)
						}
						continue
					}
					p.Unpin(tab, gpa, n)
					continue
				}
				pages := []abi.GPA{abi.GPA(rng.Uint64N(256)) * pg, abi.GPA(rng.Uint64N(256)) * pg}
				if err := p.PinPages(tab, pages); err != nil {
					if !errors.Is(err, ErrQuota) {
						t.Errorf("PinPages: %v", err)
					}
					continue
				}
				p.UnpinPages(tab, pages)
			}
		}()
	}
	wg.Wait()
	checkPinner(t, p)
	s := p.Stats()
	if s.PinnedBytes != 0 || s.CachedBytes > 32*pg {
		t.Errorf("got stats %+v, want nothing pinned and at most 32 pages cached", s)
	}
	w.expect("after concurrent use", s.CachedBytes)
}
