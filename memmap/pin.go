package memmap

// PVDMA: on-demand pinning of guest pages with a map cache.
//
// # What is pinned
//
// A Pinner locks (mlock) the backend's own mapping of guest pages, so they
// stay resident while the device may DMA into them: the pages a REG_MR names
// (Pin, once per guest-physically contiguous run of the MR, however large
// its pages; PinPages for 4 KiB page lists such as queue rings), or, with
// PinConfig.All, every page of every region as soon as SetTable sees it (the
// VFIO/SR-IOV baseline). A page is PageSize bytes of guest-physical space,
// identified by its GPA; in a region whose ends are not page aligned, the
// first and last page are only the part inside the region, and a page split
// between two GPA-adjacent regions is one page of each (two host pages,
// counted and locked separately). mlock also faults the pages in: a
// MAP_SHARED memfd page is allocated and zeroed on first touch, and mlock's
// populate step does that once, here, instead of on the data path.
//
// A tracked region (regionPins, keyed by its *Region) carries one reference
// on its Region: its mapping (and the host addresses munlock is given)
// cannot go away, nor be reused by another mmap, while any of its pages is
// pinned or cached. A pin is therefore a pin on the memory of one mapping
// (one file range), not on a guest-physical address: it stays on that
// memory whatever table is current later. A region is tracked from the
// first Pin (or pin=all SetTable) that touches it until no pin is left on
// it after it left the current table, or Close. At most maxTracked regions
// are tracked at once (ErrTooManyRegions), orphans included.
//
// # Owners and memory-table changes
//
// A device pins on behalf of an owner (an MR, a CQ's or QP's rings:
// PinFor, PinPagesFor): the Pinner records the runs of mapped pages each
// call pinned under the owner, and UnpinOwner drops exactly those pins, in
// the regions they were taken in, whatever table is current then. The
// rule across SET_MEM_TABLE, ADD_MEM_REG and REM_MEM_REG (SetTable):
//
//   - A region the new table still holds (the same *Region: Table.Reuse
//     keeps it when the front-end sends the same region again) keeps its
//     pins and its cached pages.
//   - A region the new table no longer holds is orphaned: its pin=all pin
//     is dropped and its cached pages are munlocked at once (no later pin
//     can find them: a region that left the current table never comes
//     back, Reuse only looks in the current table), but the pins live
//     owners hold stay, with the region's mapping, until their owners
//     unpin them; pages released there are munlocked, never cached. The
//     region is forgotten (its reference released, its mapping unmapped
//     once no table holds it either) when its last pin goes.
//   - A table that maps the same guest-physical range anew (new Regions,
//     even of the same file) is different memory to the Pinner: an object
//     registered after the change pins the new mapping, and the old
//     object's pins stay on the old one. So an object created on table T
//     keeps its pages locked until it is destroyed, and destroying it
//     never unpins pages another object holds; the same guest page pinned
//     through two mappings counts (and is locked) twice.
//
// The table-keyed Unpin and UnpinPages remain for callers that pin through
// one table (tests, benchmarks); they translate through the table given,
// so they are exact only with the table the pins were taken in.
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
// nothing: on an error (translation, count overflow, quota, mlock) every
// count, the cache membership and LRU order of every cached page, and the
// accounting are as before the call, and the runs this call locked are
// munlocked; only the evictions it made to fit a quota stay.
//
// # Extents
//
// The state is kept per extent, never per page, so that Pin and Unpin of a
// range that was pinned or released as a whole cost O(extents touched · log
// n), independent of its size: a 1 GiB REG_MR served by the map cache
// touches one extent. Each tracked region holds an interval map of extents
// (extent, pin_extent.go): maximal runs [first, last] of its pages (indices
// from the region's first page) with one pin count; count > 0 is pinned,
// count == 0 is in the map cache, a page in no extent is unlocked. Extents
// are disjoint, in a treap keyed by their first page (random priorities:
// O(log n) expected depth whatever order a driver pins in) and in a list in
// address order. An operation splits extents at its run bounds, updates the
// extents inside and fills the gaps, and merges back neighbours that are
// equal: adjacent pinned extents never have the same count, and an adjacent
// pair of cached extents is never consecutive in the LRU list in address
// order (that pair would be one extent). Every extent boundary therefore
// lies at an end of a run some live pin or cache release made: a region
// holds at most about two extents per live pinned run plus one per cached
// release, and never more extents than locked pages. A hostile driver that
// scatters 4 KiB pages over MaxMR (4096) MRs and its rings creates one
// extent per run it names, as many as the pages it may lock (bounded by
// MaxMRSize, the quotas and the cache size); with a treap that costs
// O(log n) per run and no memmove (a sorted slice would move O(n) entries
// per insertion in the worst order, O(n²) for n scattered pages).
//
// Pin works in phases so that failure needs no undo log: plan (split at the
// run bounds, check counts for overflow, mark the cached extents inside the
// runs held, collect the gaps as misses), reserve (quota, evicting unheld
// cache), mlock the misses, then commit (hits leave the cache, counts grow,
// gaps become extents, neighbours merge). Until commit nothing changed but
// the splits and held marks, which a failure reverts by merging at the same
// bounds. Freed extents are kept for reuse (maxSpare), so a steady
// register/deregister cycle allocates nothing.
//
// # Map cache
//
// A page whose count drops to 0 stays locked in the map cache, an LRU list
// of cached extents ordered by release time (pages released by one call in
// address order; pages of one extent are in address order), so
// re-registering the same buffer costs no system call. Beyond
// PinConfig.CacheBytes the least recently released pages are munlocked:
// whole extents from the old end, and the low part of the last one if only
// part of it has to go, one munlock per extent. CacheBytes == 0 (or below
// PageSize) munlocks released pages at once. Removing an extent from the
// list may make its older neighbour consecutive with an address successor:
// fixup merges such pairs at the end of each call. Hits, misses and
// evictions are counted in pages (PinStats).
//
// # Quota
//
// The device quota (PinConfig.MaxPinned) and the global limit
// (Accounting) bound the bytes a device keeps locked, pinned and cached
// alike: a cached page holds memory exactly as a pinned one does. A Pin that
// would go over either first evicts this Pinner's cache (oldest first, never
// the held pages the Pin itself takes from the cache) and then, if still
// over, fails with a *QuotaError (ErrQuota) having pinned nothing. The
// global limit is reserved with a compare-and-swap, so concurrent devices
// never exceed it together. mlock's own failures (RLIMIT_MEMLOCK without
// CAP_IPC_LOCK, vm.max_map_count reached by VMAs split around scattered
// locked runs) are returned wrapped, not as ErrQuota.
//
// # Lock order
//
// Pinner.mu protects all of a Pinner's state, extents included, and is held
// across the mlock and munlock calls (pinning is control path). Under it the
// Pinner takes region references (atomic) and updates its Accounting
// (atomic); it takes no other lock, and nothing calls into a Pinner while
// holding one of its own. Pinners never call each other, so a Pinner cannot
// evict another device's cache to make room under the global limit.

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// PageSize is the size of the pages a Pinner pins, in bytes.
const PageSize = 4096

const (
	pageShift = 12
	pageMask  = PageSize - 1

	// maxTracked bounds the regions a Pinner tracks at once: those of the
	// current table and the orphans, regions of older tables that live
	// owners still pin. Each keeps a mapping of the daemon alive, so a
	// front-end that switches tables over and over while it keeps objects
	// registered in each is refused new pins (ErrTooManyRegions) rather
	// than allowed to pile up mappings (vm.max_map_count is per process,
	// shared by every device of the daemon).
	maxTracked = 8 * MaxRegions
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

// regionPins is the pin state of one tracked region: its extent map.
// Protected by Pinner.mu.
type regionPins struct {
	r      *Region // one reference, held while tracked
	start  uint64  // region's first guest-physical byte
	end    uint64  // one past its last (no overflow: RegionSpec.validate)
	first  uint64  // guest page number of page index 0
	root   *extent // treap of the extents, keyed by first page
	head   *extent // lowest extent; the address list follows next
	exts   uint64  // number of extents
	all    bool    // pinned wholly by pin=all
	orphan bool    // not in the table of the last SetTable: nothing cached
	holds  uint64  // runs of owners' pin sets naming this region
	pinned uint64  // pages with count > 0
	cached uint64  // pages in the cache
}

// holdsPage reports whether the page at guest-physical g lies wholly in
// the region.
func (rp *regionPins) holdsPage(g uint64) bool {
	return g >= rp.start && g < rp.end && rp.end-g >= PageSize
}

// lastPage returns the index of the region's last page.
func (rp *regionPins) lastPage() uint64 { return (rp.end-1)>>pageShift - rp.first }

// hostRun returns the host bytes of pages [a, b] (indices, inclusive),
// clipped to the region.
func (rp *regionPins) hostRun(a, b uint64) []byte {
	lo := max((rp.first+a)<<pageShift, rp.start)
	hi := min((rp.first+b)<<pageShift|pageMask, rp.end-1) // inclusive
	d := rp.r.data
	return d[lo-rp.start : hi-rp.start+1]
}

// pinRun is a run of pages [first, last] of one region, each pinned or
// unpinned mult times. The runs of one call are sorted by guest-physical
// address and disjoint; those of one region are consecutive in the list.
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
	table    map[*Region]bool        // protected by mu; regions of the last SetTable (nil: none yet)
	owners   map[any]*pinSet         // protected by mu; what each owner pinned
	oldest   *extent                 // protected by mu; LRU list: least recently released
	newest   *extent                 // protected by mu; most recently released
	lruLen   uint64                  // protected by mu; extents in the LRU list
	locked   uint64                  // protected by mu; pages pinned or cached
	cached   uint64                  // protected by mu; pages cached
	stats    PinStats                // protected by mu; counters only
	work     uint64                  // protected by mu; extents and runs visited (tests)
	spare    []*extent               // protected by mu; freed extents for reuse
	scratch  struct {
		runs, misses []pinRun
		pages        []abi.GPA
		held, fix    []*extent
	} // protected by mu; reused buffers
}

// NewPinner returns a Pinner configured by cfg.
func NewPinner(cfg PinConfig) *Pinner {
	return &Pinner{
		cfg:        cfg,
		cachePages: cfg.CacheBytes / PageSize,
		byRegion:   make(map[*Region]*regionPins),
		owners:     make(map[any]*pinSet),
	}
}

// Pin pins every page of guest-physical [gpa, gpa+n) in t (see the design
// notes above). The whole range must be mapped; it may span GPA-adjacent
// regions. n == 0 pins nothing. Its cost does not depend on n but on the
// extents the range touches. Errors: *RangeError (ErrNotMapped,
// ErrOverflow), *RegionError (ErrBadRegion: a region whose addresses are
// not page-congruent; ErrTooManyRegions), *QuotaError (ErrQuota),
// ErrClosed, or a wrapped mlock error; on any error nothing was pinned.
//
// The caller holds a reference on t for the duration of the call.
func (p *Pinner) Pin(t *Table, gpa abi.GPA, n uint64) error {
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

// PinPages pins the pages whose guest-physical addresses are listed (as a
// 4 KiB REG_MR page list or a ring gives them): each must be page aligned
// (*RangeError with ErrUnaligned) and mapped wholly, possibly across two
// GPA-adjacent regions. A page listed k times is pinned k times. It is all
// or nothing, as Pin. The list is copied; the caller keeps it.
func (p *Pinner) PinPages(t *Table, pages []abi.GPA) error {
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
func (p *Pinner) Unpin(t *Table, gpa abi.GPA, n uint64) {
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
	p.dropEmptyOrphans(runs)
}

// UnpinPages drops one pin per listed page occurrence, as PinPages took
// them; entries that are unaligned, unmapped, untracked or not pinned are
// skipped. The same caveat about t holds as for Unpin.
func (p *Pinner) UnpinPages(t *Table, pages []abi.GPA) {
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
	p.dropEmptyOrphans(runs)
}

// SetTable is called after every table swap with the new table (the caller
// holds a reference on it during the call; the Pinner keeps none on the
// table, only on the regions it tracks). Regions no longer present are
// orphaned (see "Owners and memory-table changes" above): their pin=all
// pin and their cached pages go, the pins owners hold stay until they are
// unpinned, and a region left with no pin is forgotten. With
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
	p.table = keep
	for r, rp := range p.byRegion { // deleting while ranging is allowed
		switch {
		case keep[r]:
			rp.orphan = false
		case !rp.orphan:
			p.orphan(rp)
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
		run := pinRun{rp: rp, first: 0, last: rp.lastPage(), mult: 1}
		if err := p.pinRuns([]pinRun{run}); err != nil {
			return fmt.Errorf("pin all gpa %#x+%#x: %w", rp.start, rp.end-rp.start, err)
		}
		rp.all = true
	}
	return nil
}

// Close munlocks everything, forgets all pins (owners' included), releases
// the region references and returns the accounting to zero. It is
// idempotent; later Pins fail with ErrClosed and later Unpins do nothing.
func (p *Pinner) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	for _, rp := range p.byRegion {
		p.forget(rp)
	}
	p.fixup()
	clear(p.owners)
	p.spare = nil
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
