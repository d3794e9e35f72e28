package memmap

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
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

// checkPinner verifies the Pinner's internal invariants: per-region and
// total counters match the page states, the LRU list holds exactly the
// cached pages, no page is left fresh, and the accounting (if any, and not
// shared) equals the locked bytes.
func checkPinner(t testing.TB, p *Pinner) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	var pinned, cached uint64
	for r, rp := range p.byRegion {
		if rp.r != r || p.slots[rp.slot] != rp {
			t.Fatalf("region %p: tracking maps disagree", r)
		}
		var rpin, rcache uint64
		for _, c := range rp.chunks {
			for i := range c {
				ps := &c[i]
				if ps.fresh {
					t.Errorf("page left fresh")
				}
				if ps.count > 0 {
					rpin++
					if ps.cached {
						t.Errorf("pinned page marked cached")
					}
				} else if ps.cached {
					rcache++
				}
			}
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
	prev := noPage
	for id := p.lruHead; id != noPage; n++ {
		if n > cached {
			t.Fatalf("LRU list longer than %d cached pages (cycle?)", cached)
		}
		rp := p.slots[uint64(id)>>slotShift]
		ps := rp.page(uint64(id) & idxMask)
		if ps == nil || !ps.cached || ps.count != 0 || ps.prev != prev {
			t.Fatalf("LRU node %#x: bad state %+v (prev want %#x)", uint64(id), ps, uint64(prev))
		}
		prev, id = id, ps.next
	}
	if n != cached || p.lruTail != prev {
		t.Errorf("LRU list has %d nodes, want %d; tail %#x, want %#x", n, cached, uint64(p.lruTail), uint64(prev))
	}
	if a := p.cfg.Accounting; a != nil {
		if got := a.Pinned(); got != p.locked*PageSize {
			t.Errorf("accounting says %d bytes, pinner locks %d", got, p.locked*PageSize)
		}
	}
}

// pageCount returns the pin count of guest page gpa in the region holding
// it in t (0 if untracked).
func pageCount(t testing.TB, p *Pinner, tab *Table, gpa GPA) uint32 {
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
	ps := rp.page(uint64(gpa)>>pageShift - rp.first)
	if ps == nil {
		return 0
	}
	return ps.count
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
		gpa  GPA
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
		gpa  GPA
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
	rp.page(3).count = math.MaxUint32
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
		if got := pageCount(t, p, tab, GPA(0x10000+i*pg)); got != want {
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
	a, b, c := GPA(0x40000), GPA(0x48000), GPA(0x50000)
	for _, g := range []GPA{a, b, c} {
		if err := p.Pin(tab, g, 2*pg); err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range []GPA{a, b, c} {
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
			pages []GPA
			want  error
		}{
			{[]GPA{0x10000, 0x10800}, ErrUnaligned},
			{[]GPA{0x10000, 0x14000}, ErrNotMapped},
			{[]GPA{0x13000, 0x20000}, ErrNotMapped},
			{[]GPA{0xfffffffffffff000}, ErrOverflow},
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
	pages := []GPA{0x13000, 0x11000, 0x10000, 0x13000}
	if err := p.PinPages(tab, pages); err != nil {
		t.Fatal(err)
	}
	checkPinner(t, p)
	wantStats(t, p, PinStats{PinnedBytes: 4 * pg, CacheMisses: 4})
	w.expect("pinned pages", 4*pg)
	if got := pageCount(t, p, tab, 0x13000); got != 2 {
		t.Errorf("duplicated page: got count %d, want 2", got)
	}
	p.UnpinPages(tab, []GPA{0x13000, 0x10001, 0x40000})
	if got := pageCount(t, p, tab, 0x13000); got != 1 {
		t.Errorf("after one unpin: got count %d, want 1", got)
	}
	p.UnpinPages(tab, []GPA{0x10000, 0x11000, 0x13000})
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
	if err := p.PinPages(tab, []GPA{30 * pg, 31 * pg}); err != nil {
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
				gpa := GPA(rng.Uint64N(256*pg - 1))
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
				pages := []GPA{GPA(rng.Uint64N(256)) * pg, GPA(rng.Uint64N(256)) * pg}
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

// pinModel is the fuzz target's model: pin counts per (region, page).
type pinModel map[[2]uint64]uint32

// FuzzPinner runs a decoded sequence of Pin, PinPages, Unpin, UnpinPages
// and SetTable calls on real memfd regions and checks, after each, the
// pinner's invariants, that VmLck matches what it says it locks, that a
// failed pin changed no count, and that a successful one changed the counts
// exactly as a per-byte model says.
func FuzzPinner(f *testing.F) {
	needMlock(f, 1<<20)
	// Regions: A [0x10000, 0x15800), B [0x15800, 0x18000) (adjacent, the
	// boundary inside a page), C [0x20000, 0x24000).
	specs := []RegionSpec{
		{GuestAddr: 0x10000, Size: 0x5800},
		{GuestAddr: 0x15800, Size: 0x2800, MmapOffset: 0x5800},
		{GuestAddr: 0x20000, Size: 0x4000},
	}
	tab, regions := testTable(f, 0x8000, specs...)
	noC, err := tab.Without(regions[2].Spec())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(noC.Release)

	f.Add([]byte{
		0x03, 0x18, // config: cache 3 pages, quota 8 pages, accounting
		0x00, 0x00, 0x05, 0x00, 0x02, 0x00, // Pin 0x15000+0x2000 (A and B)
		0x02, 0x03, 0x10, 0x15, 0x15, // PinPages 0x10000, 0x15000, 0x15000
		0x01, 0x00, 0x05, 0x00, 0x02, 0x00, // Unpin 0x15000+0x2000
		0x04, 0x01, // SetTable without C
		0x03, 0x02, 0x10, 0x15, // UnpinPages 0x10000, 0x15000
	})

	f.Fuzz(func(t *testing.T, data []byte) {
		r := &fuzzReader{b: data}
		base := vmLck(t)
		cfg := PinConfig{CacheBytes: uint64(r.u8()%8) * pg}
		mode := r.u8()
		if q := mode & 0x0f; q != 0 {
			cfg.MaxPinned = uint64(q) * pg
		}
		if mode&0x10 != 0 {
			cfg.Accounting = NewAccounting(0)
		}
		cfg.All = mode&0x20 != 0
		p := NewPinner(cfg)
		defer func() {
			p.Close()
			if got := vmLck(t); got != base {
				t.Errorf("after Close: VmLck %d, want %d", got, base)
			}
			if a := cfg.Accounting; a != nil && a.Pinned() != 0 {
				t.Errorf("after Close: accounting %d, want 0", a.Pinned())
			}
		}()
		cur := tab
		snapshot := func() pinModel {
			m := pinModel{}
			p.mu.Lock()
			defer p.mu.Unlock()
			for i, rg := range regions {
				rp := p.byRegion[rg]
				if rp == nil {
					continue
				}
				for ci, c := range rp.chunks {
					for j := range c {
						if c[j].count != 0 {
							m[[2]uint64{uint64(i), ci<<chunkShift | uint64(j)}] = c[j].count
						}
					}
				}
			}
			return m
		}
		// expectPin returns the model counts after pinning [gpa, gpa+n)
		// mult times, or false if that range is not wholly mapped in cur.
		expectPin := func(m pinModel, gpa, n uint64, mult uint32) bool {
			end, ok := add(gpa, n)
			if !ok {
				return false
			}
			specs := cur.Regions()
			for a := gpa; a < end; {
				i := modelFind(specs, false, a)
				if i < 0 {
					return false
				}
				a = uint64(specs[i].GuestAddr) + specs[i].Size
			}
			for i, s := range specs {
				ri := 0
				for k, rg := range regions {
					if rg.Spec() == s {
						ri = k
					}
				}
				lo, hi := max(gpa, uint64(s.GuestAddr)), min(end, uint64(s.GuestAddr)+s.Size)
				_ = i
				if lo >= hi {
					continue
				}
				for pgn := lo >> pageShift; pgn <= (hi-1)>>pageShift; pgn++ {
					m[[2]uint64{uint64(ri), pgn - uint64(s.GuestAddr)>>pageShift}] += mult
				}
			}
			return true
		}
		if cfg.All {
			if err := p.SetTable(cur); err != nil && !errors.Is(err, ErrQuota) {
				t.Fatalf("SetTable: %v", err)
			}
		}
		for ops := 0; !r.empty() && ops < 64; ops++ {
			before := snapshot()
			var err error
			want := pinModel{}
			for k, v := range before {
				want[k] = v
			}
			wantOK := true
			pinning := false
			switch op := r.u8() % 5; op {
			case 0, 1:
				gpa := 0x10000 + uint64(r.u16())<<4
				n := uint64(r.u16()) << 4
				if r.u8()&1 != 0 {
					gpa, n = r.u64(), r.u64()
				}
				if op == 0 {
					pinning = true
					wantOK = expectPin(want, gpa, n, 1)
					err = p.Pin(cur, GPA(gpa), n)
				} else {
					p.Unpin(cur, GPA(gpa), n)
				}
			case 2, 3:
				k := int(r.u8() % 8)
				pages := make([]GPA, k)
				for i := range pages {
					pages[i] = GPA(uint64(r.u8()) << pageShift)
					if pages[i]&0x80000 != 0 {
						pages[i] |= 0x123 // unaligned
					}
				}
				if op == 2 {
					pinning = true
					for _, g := range pages {
						if g&pageMask != 0 || !expectPin(want, uint64(g), pg, 1) {
							wantOK = false
						}
					}
					err = p.PinPages(cur, pages)
				} else {
					p.UnpinPages(cur, pages)
				}
			case 4:
				if r.u8()&1 != 0 {
					cur = noC
				} else {
					cur = tab
				}
				err = p.SetTable(cur)
				if err != nil && !errors.Is(err, ErrQuota) {
					t.Fatalf("SetTable: %v", err)
				}
			}
			checkPinner(t, p)
			s := p.Stats()
			if got := vmLck(t) - base; got != s.PinnedBytes+s.CachedBytes {
				t.Fatalf("VmLck grew by %d, pinner says %d pinned + %d cached", got, s.PinnedBytes, s.CachedBytes)
			}
			if cfg.MaxPinned != 0 && s.PinnedBytes+s.CachedBytes > cfg.MaxPinned {
				t.Fatalf("locked %d bytes over quota %d", s.PinnedBytes+s.CachedBytes, cfg.MaxPinned)
			}
			if cfg.CacheBytes < s.CachedBytes {
				t.Fatalf("cached %d bytes over bound %d", s.CachedBytes, cfg.CacheBytes)
			}
			if !pinning {
				continue
			}
			after := snapshot()
			if err != nil {
				if wantOK && !errors.Is(err, ErrQuota) {
					t.Fatalf("pin failed unexpectedly: %v", err)
				}
				if fmt.Sprint(after) != fmt.Sprint(before) {
					t.Fatalf("failed pin (%v) changed counts: %v -> %v", err, before, after)
				}
				continue
			}
			if !wantOK {
				t.Fatalf("pin succeeded, model says it must fail")
			}
			if fmt.Sprint(after) != fmt.Sprint(want) {
				t.Fatalf("got counts %v, want %v", after, want)
			}
		}
	})
}
