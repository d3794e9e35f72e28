package memmap

import (
	"errors"
	"math"
	"math/bits"
	"slices"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// gpns returns the guest page numbers of a cached-page list.
func gpns(l []lruPage) []uint64 {
	var g []uint64
	for _, x := range l {
		g = append(g, x.gpn)
	}
	return g
}

// pageRange returns the guest page numbers [a, b].
func pageRange(a, b uint64) []uint64 {
	var g []uint64
	for i := a; i <= b; i++ {
		g = append(g, i)
	}
	return g
}

// treapDepth returns the depth of r's treap.
func treapDepth(p *Pinner, r *Region) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var depth func(e *extent) int
	depth = func(e *extent) int {
		if e == nil {
			return 0
		}
		return 1 + max(depth(e.left), depth(e.right))
	}
	return depth(p.byRegion[r].root)
}

func TestPinExtentsMerge(t *testing.T) {
	w := watchLocks(t)
	tab, regions := testTable(t, 64*pg, RegionSpec{GuestAddr: 0, Size: 64 * pg})
	p := NewPinner(PinConfig{CacheBytes: 64 * pg})
	defer p.Close()
	r := regions[0]

	// Overlapping ranges make extents with different counts; releasing
	// them all leaves one cached extent per release, merged where the
	// release order agrees with the address order.
	for _, rg := range [][2]uint64{{0, 8}, {4, 12}, {8, 16}} {
		if err := p.Pin(tab, abi.GPA(rg[0]*pg), (rg[1]-rg[0])*pg); err != nil {
			t.Fatal(err)
		}
	}
	checkPinner(t, p)
	// [0,4) 1, [4,8) 2, [8,12) 2, [12,16) 1: [4,12) is one extent.
	if got := extents(p, r); got != 3 {
		t.Errorf("got %d extents, want 3 (counts 1, 2, 1)", got)
	}
	p.Unpin(tab, 0, 8*pg)    // [0,4) cached; [4,8) 1
	p.Unpin(tab, 4*pg, 8*pg) // [4,8) cached after [0,4): merged; [8,12) 1
	checkPinner(t, p)
	if got := extents(p, r); got != 2 {
		t.Errorf("got %d extents, want 2 (cached [0,8), pinned [8,16))", got)
	}
	p.Unpin(tab, 8*pg, 8*pg)
	checkPinner(t, p)
	if got := extents(p, r); got != 1 {
		t.Errorf("got %d extents after releasing everything in address order, want 1", got)
	}
	if got, want := gpns(lruPages(p)), pageRange(0, 15); !slices.Equal(got, want) {
		t.Errorf("got cached pages %v, want %v", got, want)
	}
	w.expect("all cached", 16*pg)

	// Released in the opposite address order, adjacent extents stay apart:
	// one extent would list its pages in the wrong release order.
	if err := p.Pin(tab, 32*pg, 8*pg); err != nil {
		t.Fatal(err)
	}
	p.Unpin(tab, 36*pg, 4*pg)
	p.Unpin(tab, 32*pg, 4*pg)
	checkPinner(t, p)
	if got := extents(p, r); got != 3 {
		t.Errorf("got %d extents, want 3", got)
	}
	want := append(pageRange(0, 15), append(pageRange(36, 39), pageRange(32, 35)...)...)
	if got := gpns(lruPages(p)); !slices.Equal(got, want) {
		t.Errorf("got cached pages %v, want %v", got, want)
	}
}

func TestPinExtentsFixup(t *testing.T) {
	tab, regions := testTable(t, 64*pg, RegionSpec{GuestAddr: 0, Size: 64 * pg})
	p := NewPinner(PinConfig{CacheBytes: 64 * pg})
	defer p.Close()
	// Release A = [0,4), then X = [32,36), then B = [4,8): A and B are
	// adjacent but X lies between them in the LRU list.
	for _, g := range []uint64{0, 32, 4} {
		if err := p.Pin(tab, abi.GPA(g*pg), 4*pg); err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range []uint64{0, 32, 4} {
		p.Unpin(tab, abi.GPA(g*pg), 4*pg)
	}
	checkPinner(t, p)
	if got := extents(p, regions[0]); got != 3 {
		t.Fatalf("got %d extents, want 3", got)
	}
	// Re-pinning X takes it out of the list: A and B become consecutive
	// and merge.
	if err := p.Pin(tab, 32*pg, 4*pg); err != nil {
		t.Fatal(err)
	}
	checkPinner(t, p)
	if got := extents(p, regions[0]); got != 2 {
		t.Errorf("got %d extents, want 2 (A+B cached, X pinned)", got)
	}
	if s := p.Stats(); s.CacheHits != 4 || s.CachedBytes != 8*pg {
		t.Errorf("got stats %+v, want 4 hits, 8 pages cached", s)
	}
}

func TestPinHitsNeverEvicted(t *testing.T) {
	w := watchLocks(t)
	tab, _ := testTable(t, 32*pg, RegionSpec{GuestAddr: 0, Size: 32 * pg})
	p := NewPinner(PinConfig{CacheBytes: 16 * pg, MaxPinned: 8 * pg})
	defer p.Close()
	// Cache H = [2,6) (oldest) then U = [8,12).
	for _, g := range []uint64{2, 8} {
		if err := p.Pin(tab, abi.GPA(g*pg), 4*pg); err != nil {
			t.Fatal(err)
		}
	}
	p.Unpin(tab, 2*pg, 4*pg)
	p.Unpin(tab, 8*pg, 4*pg)
	// Pin [0,4): misses [0,2), hits [2,4), the oldest cached pages.
	// 8 locked + 2 > 8: two pages go, the oldest this Pin does not take:
	// H's [4,6), not its [2,4).
	if err := p.Pin(tab, 0, 4*pg); err != nil {
		t.Fatal(err)
	}
	checkPinner(t, p)
	wantStats(t, p, PinStats{PinnedBytes: 4 * pg, CachedBytes: 4 * pg, CacheHits: 2, CacheMisses: 10, Evictions: 2})
	if got, want := gpns(lruPages(p)), pageRange(8, 11); !slices.Equal(got, want) {
		t.Errorf("got cached pages %v, want %v", got, want)
	}
	for g, want := range map[uint64]uint32{0: 1, 1: 1, 2: 1, 3: 1, 4: 0, 5: 0, 6: 0} {
		if got := pageCount(t, p, tab, abi.GPA(g*pg)); got != want {
			t.Errorf("page %d: got count %d, want %d", g, got, want)
		}
	}
	w.expect("after pin with eviction", 8*pg)
}

func TestPinCacheSplitOrder(t *testing.T) {
	tab, _ := testTable(t, 32*pg, RegionSpec{GuestAddr: 0, Size: 32 * pg})
	p := NewPinner(PinConfig{CacheBytes: 32 * pg})
	defer p.Close()
	// E = [0,8) released first, F = [16,24) after.
	for _, g := range []uint64{0, 16} {
		if err := p.Pin(tab, abi.GPA(g*pg), 8*pg); err != nil {
			t.Fatal(err)
		}
	}
	p.Unpin(tab, 0, 8*pg)
	p.Unpin(tab, 16*pg, 8*pg)
	// Taking [3,5) from the middle of E leaves [0,3) and [5,8) in E's
	// place, before F.
	if err := p.PinPages(tab, []abi.GPA{3 * pg, 4 * pg}); err != nil {
		t.Fatal(err)
	}
	checkPinner(t, p)
	want := append(append(pageRange(0, 2), pageRange(5, 7)...), pageRange(16, 23)...)
	if got := gpns(lruPages(p)); !slices.Equal(got, want) {
		t.Errorf("got cached pages %v, want %v", got, want)
	}
	// Released again, the pages go to the new end.
	p.UnpinPages(tab, []abi.GPA{4 * pg, 3 * pg})
	checkPinner(t, p)
	want = append(want, 3, 4)
	if got := gpns(lruPages(p)); !slices.Equal(got, want) {
		t.Errorf("got cached pages %v, want %v", got, want)
	}
}

func TestPinRollbackKeepsCacheOrder(t *testing.T) {
	w := watchLocks(t)
	tab, regions := testTable(t, 32*pg, RegionSpec{GuestAddr: 0, Size: 32 * pg})
	p := NewPinner(PinConfig{CacheBytes: 32 * pg})
	defer p.Close()
	// D = [20,22), E = [0,10), F = [12,16) released in this order; page 18
	// pinned with the largest count.
	for _, rg := range [][2]uint64{{20, 2}, {0, 10}, {12, 4}} {
		if err := p.Pin(tab, abi.GPA(rg[0]*pg), rg[1]*pg); err != nil {
			t.Fatal(err)
		}
		p.Unpin(tab, abi.GPA(rg[0]*pg), rg[1]*pg)
	}
	if err := p.Pin(tab, 18*pg, pg); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.byRegion[regions[0]].lowerBound(18).count = math.MaxUint32
	p.mu.Unlock()
	before, exts := lruPages(p), extents(p, regions[0])
	stats := p.Stats()

	// Hits in E and F, a miss at 17, then the count overflow at 18: the
	// plan split E and F and held the hits, and must put them back.
	err := p.PinPages(tab, []abi.GPA{3 * pg, 4 * pg, 13 * pg, 17 * pg, 18 * pg})
	if !errors.Is(err, ErrOverflow) {
		t.Fatalf("got %v, want ErrOverflow", err)
	}
	checkPinner(t, p)
	if got := lruPages(p); !slices.Equal(got, before) {
		t.Errorf("cache order changed by a failed pin: %v, want %v", gpns(got), gpns(before))
	}
	if got := extents(p, regions[0]); got != exts {
		t.Errorf("got %d extents after the failed pin, want %d", got, exts)
	}
	wantStats(t, p, stats)
	w.expect("after failed pin", 17*pg)
}

// TestPinCachedSizeIndependent checks that a Pin served by the map cache
// (and its Unpin) does the same work for 1 MiB and for 1 GiB: the same
// number of extents visited, no allocation, one extent.
func TestPinCachedSizeIndependent(t *testing.T) {
	big := uint64(1 << 30)
	if testing.Short() {
		big = 64 << 20
	}
	needMlock(t, big+(1<<20))
	type result struct {
		pinWork, unpinWork uint64
		allocs             float64
	}
	measure := func(size uint64) result {
		t.Helper()
		// A sparse memfd: only the cold Pin below touches its pages.
		tab, regions := testTable(t, size, RegionSpec{GuestAddr: 1 << 32, Size: size})
		p := NewPinner(PinConfig{CacheBytes: size})
		defer p.Close()
		if err := p.Pin(tab, 1<<32, size); err != nil {
			t.Fatal(err)
		}
		p.Unpin(tab, 1<<32, size)
		var res result
		p.mu.Lock()
		w0 := p.work
		p.mu.Unlock()
		if err := p.Pin(tab, 1<<32, size); err != nil {
			t.Fatal(err)
		}
		p.mu.Lock()
		w1 := p.work
		p.mu.Unlock()
		p.Unpin(tab, 1<<32, size)
		p.mu.Lock()
		res.pinWork, res.unpinWork = w1-w0, p.work-w1
		p.mu.Unlock()
		res.allocs = testing.AllocsPerRun(20, func() {
			if err := p.Pin(tab, 1<<32, size); err != nil {
				t.Fatal(err)
			}
			p.Unpin(tab, 1<<32, size)
		})
		checkPinner(t, p)
		if got := extents(p, regions[0]); got != 1 {
			t.Errorf("size %d: got %d extents, want 1", size, got)
		}
		if s := p.Stats(); s.CacheMisses != size/PageSize || s.CacheHits != 22*size/PageSize || s.Evictions != 0 {
			t.Errorf("size %d: got stats %+v, want one miss per page, then hits only", size, s)
		}
		return res
	}
	small, large := measure(1<<20), measure(big)
	if small != large || small.allocs != 0 {
		t.Errorf("cached Pin+Unpin of 1 MiB: %+v; of %d MiB: %+v; want equal work and no allocation", small, big>>20, large)
	}
	if small.pinWork > 4 || small.unpinWork > 4 {
		t.Errorf("cached Pin visited %d, Unpin %d extents or runs, want a handful", small.pinWork, small.unpinWork)
	}
}

// TestPinScattered plays a hostile driver: thousands of one-page pins in
// descending order, every other page. The treap stays shallow, the work of
// a later pin does not grow with the number of extents, and pinning the
// whole range merges everything back into one extent.
func TestPinScattered(t *testing.T) {
	const pages = 8192
	w := watchLocks(t)
	tab, regions := testTable(t, pages*pg, RegionSpec{GuestAddr: 0, Size: pages * pg})
	r := regions[0]
	p := NewPinner(PinConfig{CacheBytes: pages * pg})
	defer p.Close()
	for i := uint64(pages - 2); i < pages; i -= 2 {
		if err := p.Pin(tab, abi.GPA(i*pg), pg); err != nil {
			t.Fatal(err)
		}
	}
	checkPinner(t, p)
	const n = pages / 2
	if got := extents(p, r); got != n {
		t.Fatalf("got %d extents, want %d", got, n)
	}
	// A random treap of n nodes has depth about 3·log2(n) at worst in
	// practice; 6·log2(n) is never reached.
	if d, limit := treapDepth(p, r), 6*bits.Len(n); d > limit {
		t.Errorf("treap depth %d for %d extents, want at most %d", d, n, limit)
	}
	p.mu.Lock()
	w0 := p.work
	p.mu.Unlock()
	if err := p.Pin(tab, 4001*pg, 3*pg); err != nil { // [4001, 4004): two gaps, two extents
		t.Fatal(err)
	}
	p.mu.Lock()
	if got := p.work - w0; got > 6 {
		t.Errorf("a 3-page pin among %d extents visited %d", n, got)
	}
	p.mu.Unlock()
	p.Unpin(tab, 4001*pg, 3*pg)
	// Release everything in the order pinned: no two releases are
	// adjacent in address order, so every cached page is an extent of its
	// own (as many as the cache holds).
	for i := uint64(pages - 2); i < pages; i -= 2 {
		p.Unpin(tab, abi.GPA(i*pg), pg)
	}
	checkPinner(t, p)
	// Pinning all of it takes every cached page and fills every gap.
	if err := p.Pin(tab, 0, pages*pg); err != nil {
		t.Fatal(err)
	}
	checkPinner(t, p)
	if got := extents(p, r); got != 1 {
		t.Errorf("got %d extents after pinning the whole region, want 1", got)
	}
	if s := p.Stats(); s.CacheHits != n+2 || s.PinnedBytes != pages*pg || s.CachedBytes != 0 {
		t.Errorf("got stats %+v, want %d hits and everything pinned", s, n+2)
	}
	w.expect("all pinned", pages*pg)
	p.Unpin(tab, 0, pages*pg)
	checkPinner(t, p)
	if got := extents(p, r); got != 1 {
		t.Errorf("got %d extents after releasing the whole region, want 1", got)
	}
}

func TestPinTooManyRegions(t *testing.T) {
	tab, regions := testTable(t, 4*pg, RegionSpec{GuestAddr: 0, Size: 4 * pg})
	refs := regions[0].refs.Load()
	p := NewPinner(PinConfig{})
	defer p.Close()
	// Placeholders stand for maxTracked regions tracked through older
	// tables; they are taken out again before Close.
	placeholders := make([]Region, maxTracked)
	p.mu.Lock()
	for i := range placeholders {
		p.byRegion[&placeholders[i]] = &regionPins{r: &placeholders[i]}
	}
	p.mu.Unlock()
	err := p.Pin(tab, 0, pg)
	var re *RegionError
	if !errors.Is(err, ErrTooManyRegions) || !errors.As(err, &re) {
		t.Fatalf("got %v, want a *RegionError with ErrTooManyRegions", err)
	}
	if got := regions[0].refs.Load(); got != refs {
		t.Errorf("got %d references on a refused region, want %d", got, refs)
	}
	p.mu.Lock()
	for i := range placeholders {
		delete(p.byRegion, &placeholders[i])
	}
	p.mu.Unlock()
	if err := p.Pin(tab, 0, pg); err != nil {
		t.Fatalf("Pin with room to track: %v", err)
	}
	checkPinner(t, p)
}
