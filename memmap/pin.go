package memmap

// PVDMA: on-demand pinning of guest pages with a map cache.
//
// # What is pinned
//
// A Pinner locks (mlock) the backend's own mapping of guest pages, so they
// stay resident while the device may DMA into them: the pages a REG_MR page
// list or a queue ring names (Pin, PinPages), or, with PinConfig.All, every
// page of every region as soon as SetTable sees it (the VFIO/SR-IOV
// baseline). A page is PageSize bytes of guest-physical space, identified by
// its GPA; in a region whose ends are not page aligned, the first and last
// page are only the part inside the region, and a page split between two
// GPA-adjacent regions is one page of each (two host pages, counted and
// locked separately). mlock also faults the pages in:
// a MAP_SHARED memfd page is allocated and zeroed on first touch, and
// mlock's populate step does that once, here, instead of on the data path.
//
// Pages are tracked per region (regionPins), keyed by the *Region, in
// chunks of 512 pages allocated on first touch, so a call costs
// O(pages touched) and a huge, mostly unpinned guest costs nothing. A
// tracked region carries one reference on its Region: its mapping (and the
// host addresses munlock is given) cannot go away, nor be reused by another
// mmap, while any of its pages is pinned or cached. A region is tracked from
// the first Pin (or pin=all SetTable) that touches it until a SetTable whose
// table no longer holds it, or Close: then all its pages are munlocked with
// one call, forgotten, and the reference released. Unpin of a forgotten
// region does nothing. Regions are identified by *Region, so a
// SET_MEM_TABLE that maps the same memory anew as new Regions drops the pins
// of the old ones: the caller re-pins what it still needs.
//
// A region is pinnable only if its guest-physical and host addresses are
// congruent modulo PageSize (GuestAddr ≡ MmapOffset), so that each guest
// page lies in exactly one host page of that region's mapping and munlock of
// one guest page never unlocks a host page that another pinned page shares.
// QEMU's regions always are; others are refused with ErrBadRegion.
//
// # Reference counts
//
// Each page has a count of the pins on it (overlapping MRs share pages):
// Pin adds one per page, PinPages one per occurrence of the page in its list,
// Unpin and UnpinPages subtract as much (never below zero: surplus unpins are
// ignored). A page whose count goes 0→1 is taken from the map cache if it is
// there (a hit: no system call), else locked (a miss). Misses are coalesced
// into one mlock per run of contiguous pages inside a region. Pin is all or
// nothing: on an error (translation, quota, mlock) every count, the cache
// membership of the hits (they go back to the cache, as most recently
// released) and the accounting are restored, and the runs this call locked
// are munlocked.
//
// # Map cache
//
// A page whose count drops to 0 stays locked in the map cache, an LRU list
// ordered by release time (pages released by one call in address order), so
// re-registering the same buffer costs no system call. Beyond
// PinConfig.CacheBytes the least recently released pages are munlocked, again
// one munlock per contiguous run. CacheBytes == 0 (or below PageSize)
// munlocks released pages at once.
//
// # Quota
//
// The device quota (PinConfig.MaxPinned) and the global limit
// (Accounting) bound the bytes a device keeps locked, pinned and cached
// alike: a cached page holds memory exactly as a pinned one does. A Pin that
// would go over either first evicts this Pinner's cache (oldest first, never
// the pages the Pin itself takes from the cache) and then, if still over,
// fails with a *QuotaError (ErrQuota) having pinned nothing. The global limit
// is reserved with a compare-and-swap, so concurrent devices never exceed it
// together. mlock's own failures (RLIMIT_MEMLOCK without CAP_IPC_LOCK,
// vm.max_map_count reached by VMAs split around scattered locked runs) are
// returned wrapped, not as ErrQuota.
//
// # Lock order
//
// Pinner.mu protects all of a Pinner's state and is held across the mlock
// and munlock calls (pinning is control path). Under it the Pinner takes
// region references (atomic) and updates its Accounting (atomic); it takes
// no other lock, and nothing calls into a Pinner while holding one of its
// own. Pinners never call each other, so a Pinner cannot evict another
// device's cache to make room under the global limit.

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// PageSize is the size of the pages a Pinner pins, in bytes.
const PageSize = 4096

const (
	pageShift  = 12
	pageMask   = PageSize - 1
	chunkShift = 9 // 512 pages (2 MiB) per chunk
	chunkPages = 1 << chunkShift
	chunkMask  = chunkPages - 1

	slotShift = 48 // pageID: slot<<48 | page index in the region
	maxSlots  = 1 << 16
	idxMask   = 1<<slotShift - 1
)

var (
	// ErrQuota reports a pin that would exceed the device quota or the
	// global limit, even after evicting the map cache.
	ErrQuota = errors.New("pin quota exceeded")
	// ErrUnaligned reports a page address that is not a multiple of
	// PageSize.
	ErrUnaligned = errors.New("page address not page aligned")
	// ErrClosed reports a use of a closed Pinner.
	ErrClosed = errors.New("pinner closed")
)

// QuotaError reports a pin refused by a quota: Want more bytes to lock on
// top of Locked would exceed Limit. Global tells whether the limit is the
// Accounting's rather than the device's.
type QuotaError struct {
	Want, Locked, Limit uint64
	Global              bool
}

func (e *QuotaError) Error() string {
	which := "device"
	if e.Global {
		which = "global"
	}
	return fmt.Sprintf("%v: %s limit %d, %d locked, %d more wanted", ErrQuota, which, e.Limit, e.Locked, e.Want)
}

// Is reports whether target is ErrQuota.
func (e *QuotaError) Is(target error) bool { return target == ErrQuota }

// Accounting counts the bytes locked by all Pinners that share it (all
// devices of a daemon) and enforces an optional global limit on them.
type Accounting struct {
	limit  uint64        // immutable; 0 = none
	locked atomic.Uint64 // bytes locked (pinned and cached) by all Pinners
}

// NewAccounting returns an Accounting with a global limit of limit bytes;
// 0 means no limit.
func NewAccounting(limit uint64) *Accounting { return &Accounting{limit: limit} }

// Pinned returns the bytes all Pinners sharing a keep locked, pinned pages
// and map-cache pages alike.
func (a *Accounting) Pinned() uint64 { return a.locked.Load() }

// Limit returns the global limit (0 = none).
func (a *Accounting) Limit() uint64 { return a.limit }

// reserve adds n bytes unless that would exceed the limit or overflow.
func (a *Accounting) reserve(n uint64) bool {
	for {
		cur := a.locked.Load()
		s, ok := add(cur, n)
		if !ok || (a.limit != 0 && s > a.limit) {
			return false
		}
		if a.locked.CompareAndSwap(cur, s) {
			return true
		}
	}
}

// unreserve returns n bytes.
func (a *Accounting) unreserve(n uint64) { a.locked.Add(-n) }

// PinConfig configures a Pinner. The zero value pins on demand, keeps no
// cache, has no quota and no shared accounting.
type PinConfig struct {
	// All pins every region wholly as soon as SetTable sees it (pin=all,
	// the VFIO/SR-IOV baseline). Pin and Unpin still count references.
	All bool
	// CacheBytes bounds the map cache: bytes of released pages kept
	// locked. 0 keeps no cache.
	CacheBytes uint64
	// MaxPinned is the device quota: bytes kept locked, pinned and cached
	// pages together. 0 means none.
	MaxPinned uint64
	// Accounting is shared by all devices of a daemon; nil means none.
	Accounting *Accounting
}

// PinStats are a Pinner's counters. Hits, misses and evictions count pages.
type PinStats struct {
	PinnedBytes uint64 // bytes of pages with a positive count
	CachedBytes uint64 // bytes of released pages still locked in the map cache
	CacheHits   uint64 // pages whose count went 0→1 taken from the cache
	CacheMisses uint64 // pages whose count went 0→1 that had to be locked
	Evictions   uint64 // cached pages munlocked to respect CacheBytes or a quota
}

// pageID names a page of a tracked region: its slot<<slotShift | index.
type pageID uint64

const noPage = ^pageID(0)

// pageState is one page of a tracked region. A page is pinned (count > 0),
// cached (count == 0, cached, linked in the LRU list) or unlocked.
type pageState struct {
	count  uint32
	cached bool
	fresh  bool   // locked by the Pin in progress (a miss); false between calls
	prev   pageID // LRU links; valid while cached
	next   pageID
}

type pageChunk [chunkPages]pageState

// regionPins is the pin state of one tracked region. Protected by
// Pinner.mu.
type regionPins struct {
	r      *Region // one reference, held while tracked
	slot   uint64  // index in Pinner.slots
	start  uint64  // region's first guest-physical byte
	end    uint64  // one past its last (no overflow: RegionSpec.validate)
	first  uint64  // guest page number of page index 0
	chunks map[uint64]*pageChunk
	all    bool   // pinned wholly by pin=all
	pinned uint64 // pages with count > 0
	cached uint64 // pages in the cache
}

// chunk returns the chunk holding page idx, allocating it if asked (else
// nil if it was never touched).
func (rp *regionPins) chunk(idx uint64, alloc bool) *pageChunk {
	c := rp.chunks[idx>>chunkShift]
	if c == nil && alloc {
		c = new(pageChunk)
		rp.chunks[idx>>chunkShift] = c
	}
	return c
}

// page returns the state of page idx, or nil if its chunk was never
// touched.
func (rp *regionPins) page(idx uint64) *pageState {
	if c := rp.chunks[idx>>chunkShift]; c != nil {
		return &c[idx&chunkMask]
	}
	return nil
}

// holdsPage reports whether the page at guest-physical g lies wholly in
// the region.
func (rp *regionPins) holdsPage(g uint64) bool {
	return g >= rp.start && g < rp.end && rp.end-g >= PageSize
}

// id returns the pageID of page idx.
func (rp *regionPins) id(idx uint64) pageID { return pageID(rp.slot<<slotShift | idx) }

// hostRun returns the host bytes of pages [a, b] (indices, inclusive),
// clipped to the region.
func (rp *regionPins) hostRun(a, b uint64) []byte {
	lo := max((rp.first+a)<<pageShift, rp.start)
	hi := min((rp.first+b)<<pageShift|pageMask, rp.end-1) // inclusive
	d := rp.r.data
	return d[lo-rp.start : hi-rp.start+1]
}

// pinRun is a run of pages [first, last] of one region, each pinned or
// unpinned mult times.
type pinRun struct {
	rp          *regionPins
	first, last uint64
	mult        uint32
}

// Pinner pins guest pages for one device. It is safe for concurrent use.
type Pinner struct {
	cfg        PinConfig // immutable
	cachePages uint64    // immutable; CacheBytes / PageSize

	mu       sync.Mutex
	closed   bool                    // protected by mu
	byRegion map[*Region]*regionPins // protected by mu
	slots    []*regionPins           // protected by mu; nil entries are free
	free     []uint64                // protected by mu; free slot indices
	lruHead  pageID                  // protected by mu; least recently released
	lruTail  pageID                  // protected by mu; most recently released
	locked   uint64                  // protected by mu; pages pinned or cached
	cached   uint64                  // protected by mu; pages cached
	stats    PinStats                // protected by mu; counters only
	scratch  struct {
		runs, misses []pinRun
		pages        []GPA
	} // protected by mu; reused buffers
}

// NewPinner returns a Pinner configured by cfg.
func NewPinner(cfg PinConfig) *Pinner {
	return &Pinner{
		cfg:        cfg,
		cachePages: cfg.CacheBytes / PageSize,
		byRegion:   make(map[*Region]*regionPins),
		lruHead:    noPage,
		lruTail:    noPage,
	}
}

// Pin pins every page of guest-physical [gpa, gpa+n) in t (see the design
// notes above). The whole range must be mapped; it may span GPA-adjacent
// regions. n == 0 pins nothing. Errors: *RangeError (ErrNotMapped,
// ErrOverflow), *RegionError (ErrBadRegion: a region whose addresses are
// not page-congruent), *QuotaError (ErrQuota), ErrClosed, or a wrapped
// mlock error; on any error nothing was pinned.
//
// The caller holds a reference on t for the duration of the call.
func (p *Pinner) Pin(t *Table, gpa GPA, n uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	runs, err := p.rangeRuns(t, gpa, n, p.scratch.runs[:0])
	p.scratch.runs = runs[:0]
	if err != nil {
		return err
	}
	return p.pinRuns(runs)
}

// PinPages pins the pages whose guest-physical addresses are listed (as
// REG_MR's page list gives them): each must be page aligned
// (*RangeError with ErrUnaligned) and mapped wholly, possibly across two
// GPA-adjacent regions. A page listed k times is pinned k times. It is all
// or nothing, as Pin. The list is copied; the caller keeps it.
func (p *Pinner) PinPages(t *Table, pages []GPA) error {
	if len(pages) == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	runs, err := p.pageRuns(t, pages, true, p.scratch.runs[:0])
	p.scratch.runs = runs[:0]
	if err != nil {
		return err
	}
	return p.pinRuns(runs)
}

// Unpin drops one pin on every page of [gpa, gpa+n) in t. Pages that are
// not mapped in t, of regions no longer tracked, or not pinned are skipped.
// t must hold the same regions as the table the pages were pinned in for
// those pages (an older table whose regions were since replaced unpins
// nothing, which is right; a newer table holding new regions at the same
// addresses would unpin pins taken there).
func (p *Pinner) Unpin(t *Table, gpa GPA, n uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || n == 0 {
		return
	}
	end, ok := add(uint64(gpa), n)
	if !ok {
		end = math.MaxUint64 // unpin up to the end of the address space
	}
	runs := p.scratch.runs[:0]
	ss := t.byGPA
	i := sort.Search(len(ss), func(i int) bool { return ss[i].end > uint64(gpa) })
	for ; i < len(ss) && ss[i].start < end; i++ {
		rp := p.byRegion[t.regions[i]]
		if rp == nil {
			continue
		}
		s, e := max(uint64(gpa), ss[i].start), min(end, ss[i].end)
		runs = append(runs, pinRun{rp: rp, first: s>>pageShift - rp.first, last: (e-1)>>pageShift - rp.first, mult: 1})
	}
	p.scratch.runs = runs[:0]
	p.unpinRuns(runs)
}

// UnpinPages drops one pin per listed page occurrence, as PinPages took
// them; entries that are unaligned, unmapped, untracked or not pinned are
// skipped. The same caveat about t holds as for Unpin.
func (p *Pinner) UnpinPages(t *Table, pages []GPA) {
	if len(pages) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	runs, _ := p.pageRuns(t, pages, false, p.scratch.runs[:0])
	p.scratch.runs = runs[:0]
	p.unpinRuns(runs)
}

// SetTable is called after every table swap with the new table (the caller
// holds a reference on it during the call; the Pinner keeps none on the
// table, only on the regions it tracks). Regions of no longer present are
// forgotten: their pages are munlocked and their counts dropped. With
// PinConfig.All, every region of t not yet pinned wholly is pinned wholly;
// the first failure is returned (the table is still adopted, and the
// regions that could not be pinned are retried at the next SetTable).
func (p *Pinner) SetTable(t *Table) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	keep := make(map[*Region]bool, len(t.regions))
	for _, r := range t.regions {
		keep[r] = true
	}
	for r, rp := range p.byRegion {
		if !keep[r] {
			p.forget(rp)
		}
	}
	if !p.cfg.All {
		return nil
	}
	for _, r := range t.regions {
		rp, err := p.track(r)
		if err != nil {
			return fmt.Errorf("pin all: %w", err)
		}
		if rp.all {
			continue
		}
		run := pinRun{rp: rp, first: 0, last: (rp.end-1)>>pageShift - rp.first, mult: 1}
		if err := p.pinRuns([]pinRun{run}); err != nil {
			return fmt.Errorf("pin all gpa %#x+%#x: %w", rp.start, rp.end-rp.start, err)
		}
		rp.all = true
	}
	return nil
}

// Close munlocks everything, forgets all pins, releases the region
// references and returns the accounting to zero. It is idempotent; later
// Pins fail with ErrClosed and later Unpins do nothing.
func (p *Pinner) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	for _, rp := range p.byRegion {
		p.forget(rp)
	}
	p.closed = true
}

// Stats returns the Pinner's counters.
func (p *Pinner) Stats() PinStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.CachedBytes = p.cached * PageSize
	s.PinnedBytes = (p.locked - p.cached) * PageSize
	return s
}

// track returns the state of region r, tracking it (and taking a reference)
// if it is not yet.
func (p *Pinner) track(r *Region) (*regionPins, error) {
	if rp := p.byRegion[r]; rp != nil {
		return rp, nil
	}
	s := r.spec
	if (uint64(s.GuestAddr)-s.MmapOffset)&pageMask != 0 {
		return nil, &RegionError{Spec: s,
			Err: fmt.Errorf("guest address and file offset differ modulo %d: %w", PageSize, ErrBadRegion)}
	}
	if len(p.free) == 0 && len(p.slots) >= maxSlots {
		return nil, &RegionError{Spec: s, Err: fmt.Errorf("%d regions tracked: %w", len(p.slots), ErrTooManyRegions)}
	}
	if !r.tryRef() {
		return nil, &RegionError{Spec: s, Err: fmt.Errorf("already released: %w", ErrBadRegion)}
	}
	rp := &regionPins{
		r:      r,
		start:  uint64(s.GuestAddr),
		end:    uint64(s.GuestAddr) + s.Size, // validated: no overflow
		first:  uint64(s.GuestAddr) >> pageShift,
		chunks: make(map[uint64]*pageChunk),
	}
	if n := len(p.free); n > 0 {
		rp.slot = p.free[n-1]
		p.free = p.free[:n-1]
		p.slots[rp.slot] = rp
	} else {
		rp.slot = uint64(len(p.slots))
		p.slots = append(p.slots, rp)
	}
	p.byRegion[r] = rp
	return rp, nil
}

// forget munlocks all of rp's pages, drops it from the cache and the
// accounting, releases its region reference and frees its slot.
func (p *Pinner) forget(rp *regionPins) {
	if rp.cached > 0 {
		for ci, c := range rp.chunks {
			for j := range c {
				if c[j].cached {
					p.lruUnlink(rp.id(ci<<chunkShift|uint64(j)), c)
					c[j].cached = false
				}
			}
		}
	}
	if n := rp.pinned + rp.cached; n > 0 {
		// One call for the whole region: we hold the mapping, so munlock
		// cannot fail but on kernel bugs, and nothing can be done then.
		_ = unix.Munlock(rp.r.data)
		p.locked -= n
		p.cached -= rp.cached
		p.unaccount(n)
	}
	delete(p.byRegion, rp.r)
	p.slots[rp.slot] = nil
	p.free = append(p.free, rp.slot)
	rp.r.Release()
	rp.chunks = nil
}

// unaccount returns n pages to the global accounting.
func (p *Pinner) unaccount(n uint64) {
	if a := p.cfg.Accounting; a != nil {
		a.unreserve(n * PageSize)
	}
}

// rangeRuns appends the runs covering guest-physical [gpa, gpa+n) of t,
// which must be mapped wholly, tracking the regions.
func (p *Pinner) rangeRuns(t *Table, gpa GPA, n uint64, runs []pinRun) ([]pinRun, error) {
	if n == 0 {
		return runs, nil
	}
	start := uint64(gpa)
	end, ok := add(start, n)
	if !ok {
		return runs, &RangeError{Space: SpaceGuest, Addr: start, Len: n, Err: ErrOverflow}
	}
	first := find(t.byGPA, start)
	if first < 0 {
		return runs, &RangeError{Space: SpaceGuest, Addr: start, Len: n, Err: ErrNotMapped}
	}
	last := first
	for t.byGPA[last].end < end { // bounded by the number of regions
		next := last + 1
		if next == len(t.byGPA) || t.byGPA[next].start != t.byGPA[last].end {
			a := t.byGPA[last].end
			return runs, &RangeError{Space: SpaceGuest, Addr: a, Len: end - a, Err: ErrNotMapped}
		}
		last = next
	}
	for i := first; i <= last; i++ {
		rp, err := p.track(t.regions[i])
		if err != nil {
			return runs, err
		}
		s, e := max(start, rp.start), min(end, rp.end)
		runs = append(runs, pinRun{rp: rp, first: s>>pageShift - rp.first, last: (e-1)>>pageShift - rp.first, mult: 1})
	}
	return runs, nil
}

// pageRuns appends the runs for a page list: sorted, duplicates folded into
// multiplicities, adjacent pages of one region with one multiplicity merged.
// With strict, every page must be aligned and mapped wholly and regions are
// tracked; without, bad or untracked pages are skipped.
func (p *Pinner) pageRuns(t *Table, pages []GPA, strict bool, runs []pinRun) ([]pinRun, error) {
	sorted := append(p.scratch.pages[:0], pages...)
	defer func() { p.scratch.pages = sorted[:0] }()
	slices.Sort(sorted)
	var hint *regionPins // the region of the previous page, if it held it wholly
	for i := 0; i < len(sorted); {
		g := sorted[i]
		j := i + 1
		for j < len(sorted) && sorted[j] == g {
			j++
		}
		count := j - i
		i = j
		mult := uint32(min(count, math.MaxUint32))
		if uint64(g)&pageMask != 0 {
			if strict {
				return runs, &RangeError{Space: SpaceGuest, Addr: uint64(g), Len: PageSize, Err: ErrUnaligned}
			}
			continue
		}
		if hint != nil && hint.holdsPage(uint64(g)) {
			// Fast path: the page lies wholly in the previous page's region.
			idx := uint64(g)>>pageShift - hint.first
			if k := len(runs) - 1; k >= 0 && runs[k].rp == hint && runs[k].mult == mult && runs[k].last+1 == idx {
				runs[k].last = idx
			} else {
				runs = append(runs, pinRun{rp: hint, first: idx, last: idx, mult: mult})
			}
			continue
		}
		hint = nil
		before := len(runs)
		var err error
		if strict {
			runs, err = p.rangeRuns(t, g, PageSize, runs)
			if err != nil {
				return runs, err
			}
		} else {
			runs = p.lookupRuns(t, g, runs)
		}
		// Set the multiplicity and merge with the previous run if possible.
		for k := before; k < len(runs); k++ {
			runs[k].mult = mult
		}
		if len(runs) == before+1 {
			if cur := runs[before]; cur.rp.holdsPage(uint64(g)) {
				hint = cur.rp
			}
		}
		if before > 0 && len(runs) == before+1 {
			prev, cur := &runs[before-1], runs[before]
			if prev.rp == cur.rp && prev.mult == cur.mult && prev.last+1 == cur.first {
				prev.last = cur.last
				runs = runs[:before]
			}
		}
	}
	return runs, nil
}

// lookupRuns appends the runs of tracked regions holding parts of the page
// at g (aligned), without tracking anything.
func (p *Pinner) lookupRuns(t *Table, g GPA, runs []pinRun) []pinRun {
	start := uint64(g)
	end, ok := add(start, PageSize)
	if !ok {
		end = math.MaxUint64
	}
	ss := t.byGPA
	i := sort.Search(len(ss), func(i int) bool { return ss[i].end > start })
	for ; i < len(ss) && ss[i].start < end; i++ {
		if rp := p.byRegion[t.regions[i]]; rp != nil {
			idx := start>>pageShift - rp.first
			runs = append(runs, pinRun{rp: rp, first: idx, last: idx, mult: 1})
		}
	}
	return runs
}

// pinRuns pins the pages of runs, all or nothing. Runs are disjoint.
func (p *Pinner) pinRuns(runs []pinRun) error {
	// Phase 1: count. Hits leave the cache; misses are collected.
	misses := p.scratch.misses[:0]
	defer func() { p.scratch.misses = misses[:0] }()
	var hits, nmiss uint64
	for ri, run := range runs {
		var c *pageChunk
		for idx := run.first; idx <= run.last; idx++ {
			if c == nil || idx&chunkMask == 0 {
				c = run.rp.chunk(idx, true)
			}
			ps := &c[idx&chunkMask]
			if ps.count > math.MaxUint32-run.mult {
				p.rollback(runs[:ri], run.rp, run.first, idx, run.mult)
				return &RangeError{Space: SpaceGuest, Addr: (run.rp.first + idx) << pageShift, Len: PageSize,
					Err: fmt.Errorf("pin count: %w", ErrOverflow)}
			}
			old := ps.count
			ps.count += run.mult
			if old != 0 {
				continue
			}
			run.rp.pinned++
			if ps.cached {
				p.lruUnlink(run.rp.id(idx), c)
				ps.cached = false
				run.rp.cached--
				p.cached--
				hits++
				continue
			}
			ps.fresh = true
			nmiss++
			if k := len(misses) - 1; k >= 0 && misses[k].rp == run.rp && misses[k].last+1 == idx {
				misses[k].last = idx
			} else {
				misses = append(misses, pinRun{rp: run.rp, first: idx, last: idx})
			}
		}
	}
	// Phase 2: quota, evicting the cache first.
	if err := p.reserve(nmiss); err != nil {
		p.rollback(runs, nil, 0, 0, 0)
		return err
	}
	// Phase 3: lock the misses.
	for k, m := range misses {
		if err := unix.Mlock(m.rp.hostRun(m.first, m.last)); err != nil {
			// A failed mlock may leave its range marked locked: undo it too.
			for _, u := range misses[:k+1] {
				_ = unix.Munlock(u.rp.hostRun(u.first, u.last))
			}
			p.locked -= nmiss
			p.unaccount(nmiss)
			p.rollback(runs, nil, 0, 0, 0)
			return fmt.Errorf("mlock gpa %#x+%#x: %w", (m.rp.first+m.first)<<pageShift,
				(m.last-m.first+1)<<pageShift, err)
		}
	}
	for _, m := range misses {
		var c *pageChunk
		for idx := m.first; idx <= m.last; idx++ {
			if c == nil || idx&chunkMask == 0 {
				c = m.rp.chunk(idx, false)
			}
			c[idx&chunkMask].fresh = false
		}
	}
	p.stats.CacheHits += hits
	p.stats.CacheMisses += nmiss
	return nil
}

// rollback undoes phase 1 of pinRuns for the complete runs done and, if
// part is not nil, for pages [from, to) of the run in progress of part.
// Hits go back to the cache as most recently released.
func (p *Pinner) rollback(done []pinRun, part *regionPins, from, to uint64, mult uint32) {
	undo := func(rp *regionPins, idx uint64, mult uint32) {
		c := rp.chunk(idx, false)
		ps := &c[idx&chunkMask]
		ps.count -= mult
		if ps.count != 0 {
			return
		}
		rp.pinned--
		if ps.fresh {
			ps.fresh = false
			return
		}
		ps.cached = true
		rp.cached++
		p.cached++
		p.lruPush(rp.id(idx), c)
	}
	for _, run := range done {
		for idx := run.first; idx <= run.last; idx++ {
			undo(run.rp, idx, run.mult)
		}
	}
	if part != nil {
		for idx := from; idx < to; idx++ {
			undo(part, idx, mult)
		}
	}
}

// reserve accounts n more locked pages against the device quota and the
// global limit, evicting the cache to make room; on failure nothing is
// reserved (the evictions stay).
func (p *Pinner) reserve(n uint64) error {
	if n == 0 {
		return nil
	}
	want := n * PageSize // n <= pages of the address space: no overflow
	if q := p.cfg.MaxPinned; q != 0 {
		quota := q / PageSize
		if p.locked+n > quota {
			p.evict(min(p.locked+n-quota, p.cached))
		}
		if p.locked+n > quota {
			return &QuotaError{Want: want, Locked: p.locked * PageSize, Limit: q}
		}
	}
	if a := p.cfg.Accounting; a != nil && !a.reserve(want) {
		if a.limit != 0 {
			if cur := a.locked.Load(); cur+want > a.limit {
				short := (cur + want - a.limit + pageMask) / PageSize
				p.evict(min(short, p.cached))
			}
		}
		if !a.reserve(want) {
			return &QuotaError{Want: want, Locked: a.locked.Load(), Limit: a.limit, Global: true}
		}
	}
	p.locked += n
	return nil
}

// unpinRuns drops the pins of runs; pages reaching zero go to the cache or
// are munlocked, and the cache is trimmed to its bound.
func (p *Pinner) unpinRuns(runs []pinRun) {
	unlock := p.scratch.misses[:0]
	defer func() { p.scratch.misses = unlock[:0] }()
	var nunlock uint64
	for _, run := range runs {
		var c *pageChunk
		for idx := run.first; idx <= run.last; idx++ {
			if idx == run.first || idx&chunkMask == 0 {
				c = run.rp.chunk(idx, false)
			}
			if c == nil {
				continue // never pinned
			}
			ps := &c[idx&chunkMask]
			if ps.count == 0 {
				continue // a surplus unpin
			}
			ps.count -= min(ps.count, run.mult)
			if ps.count != 0 {
				continue
			}
			run.rp.pinned--
			if p.cachePages > 0 {
				ps.cached = true
				run.rp.cached++
				p.cached++
				p.lruPush(run.rp.id(idx), c)
				continue
			}
			nunlock++
			if k := len(unlock) - 1; k >= 0 && unlock[k].rp == run.rp && unlock[k].last+1 == idx {
				unlock[k].last = idx
			} else {
				unlock = append(unlock, pinRun{rp: run.rp, first: idx, last: idx})
			}
		}
	}
	for _, u := range unlock {
		_ = unix.Munlock(u.rp.hostRun(u.first, u.last))
	}
	p.locked -= nunlock
	p.unaccount(nunlock)
	if p.cached > p.cachePages {
		p.evict(p.cached - p.cachePages)
	}
}

// evict munlocks the n least recently released cached pages, one munlock
// per run of pages adjacent in the list and in the region.
func (p *Pinner) evict(n uint64) {
	var (
		run   pinRun
		have  bool
		count uint64
	)
	flush := func() {
		if have {
			_ = unix.Munlock(run.rp.hostRun(run.first, run.last))
		}
	}
	for ; count < n && p.lruHead != noPage; count++ {
		id := p.lruHead
		rp := p.slots[uint64(id)>>slotShift]
		idx := uint64(id) & idxMask
		c := rp.chunk(idx, false)
		p.lruUnlink(id, c)
		c[idx&chunkMask].cached = false
		rp.cached--
		if have && run.rp == rp && run.last+1 == idx {
			run.last = idx
			continue
		}
		flush()
		run, have = pinRun{rp: rp, first: idx, last: idx}, true
	}
	flush()
	p.cached -= count
	p.locked -= count
	p.unaccount(count)
	p.stats.Evictions += count
}

// node returns the state of page id; c is the chunk of page near, used
// without a map lookup when id is in it too.
func (p *Pinner) node(id, near pageID, c *pageChunk) *pageState {
	if uint64(id)>>chunkShift == uint64(near)>>chunkShift {
		return &c[uint64(id)&chunkMask]
	}
	return p.slots[uint64(id)>>slotShift].page(uint64(id) & idxMask)
}

// lruPush appends page id (in chunk c, not in the list) as most recently
// released.
func (p *Pinner) lruPush(id pageID, c *pageChunk) {
	ps := &c[uint64(id)&chunkMask]
	ps.prev, ps.next = p.lruTail, noPage
	if p.lruTail != noPage {
		p.node(p.lruTail, id, c).next = id
	} else {
		p.lruHead = id
	}
	p.lruTail = id
}

// lruUnlink removes page id (in chunk c) from the list.
func (p *Pinner) lruUnlink(id pageID, c *pageChunk) {
	ps := &c[uint64(id)&chunkMask]
	if ps.prev != noPage {
		p.node(ps.prev, id, c).next = ps.next
	} else {
		p.lruHead = ps.next
	}
	if ps.next != noPage {
		p.node(ps.next, id, c).prev = ps.prev
	} else {
		p.lruTail = ps.prev
	}
	ps.prev, ps.next = noPage, noPage
}
