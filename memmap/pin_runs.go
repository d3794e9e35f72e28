package memmap

import (
	"fmt"
	"math"
	"slices"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The Pinner's mechanics (the design is in pin.go): tracking regions,
// turning a guest range or page list into runs of host pages, and the
// phases of a pin: plan, reserve, lock, commit.

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
	if len(p.byRegion) >= maxTracked {
		return nil, &RegionError{Spec: s, Err: fmt.Errorf("%d regions tracked: %w", len(p.byRegion), ErrTooManyRegions)}
	}
	if !r.tryRef() {
		return nil, &RegionError{Spec: s, Err: fmt.Errorf("already released: %w", ErrBadRegion)}
	}
	rp := &regionPins{
		r:     r,
		start: uint64(s.GuestAddr),
		end:   uint64(s.GuestAddr) + s.Size, // validated: no overflow
		first: uint64(s.GuestAddr) >> pageShift,
		// A region pinned through a table older than the last SetTable's
		// (a command that acquired its table before the swap) is an
		// orphan from the start.
		orphan: p.table != nil && !p.table[r],
	}
	p.byRegion[r] = rp
	return rp, nil
}

// forget munlocks all of rp's pages with one call, drops its extents from
// the cache and the accounting, and releases its region reference. The
// caller runs fixup afterwards.
func (p *Pinner) forget(rp *regionPins) {
	for e := rp.head; e != nil; { // bounded by rp.exts
		p.work++
		next := e.next
		if e.count == 0 {
			p.lruRemove(e)
		}
		p.freeExtent(e)
		e = next
	}
	rp.root, rp.head, rp.exts = nil, nil, 0
	if n := rp.pinned + rp.cached; n > 0 {
		// One call for the whole region: we hold the mapping, so munlock
		// cannot fail but on kernel bugs, and nothing can be done then.
		_ = unix.Munlock(rp.r.data)
		p.locked -= n
		p.cached -= rp.cached
		p.unaccount(n)
	}
	rp.pinned, rp.cached = 0, 0
	delete(p.byRegion, rp.r)
	rp.r.Release()
}

// orphan marks rp, which the current table no longer holds, an orphan:
// its pin=all pin is dropped, its cached pages are munlocked (no later pin
// can hit them), and it is forgotten if no pin is left on it.
func (p *Pinner) orphan(rp *regionPins) {
	rp.orphan = true
	if rp.all {
		rp.all = false
		p.unpinRuns([]pinRun{{rp: rp, first: 0, last: rp.lastPage(), mult: 1}})
	}
	p.dropCached(rp)
	if rp.pinned == 0 && rp.holds == 0 {
		p.forget(rp)
		p.fixup()
	}
}

// dropCached munlocks the cached extents of rp, one call each, and drops
// them from the cache and the accounting (not counted as evictions: the
// region left the table, as forget).
func (p *Pinner) dropCached(rp *regionPins) {
	for e := rp.head; e != nil; { // bounded by rp.exts
		p.work++
		next := e.next
		if e.count == 0 {
			n := p.dropExtent(e)
			p.cached -= n
			p.locked -= n
			p.unaccount(n)
		}
		e = next
	}
	p.fixup()
}

// dropExtent munlocks the cached (unpinned) extent e whole and removes it
// from the cache and its region, returning its pages; the caller settles
// the Pinner's totals.
func (p *Pinner) dropExtent(e *extent) uint64 {
	rp, n := e.rp, e.pages()
	_ = unix.Munlock(rp.hostRun(e.first, e.last))
	p.lruRemove(e)
	rp.unlink(e)
	p.freeExtent(e)
	rp.cached -= n
	return n
}

// dropEmptyOrphans forgets the orphaned regions of runs that no pin and no
// owner names any more.
func (p *Pinner) dropEmptyOrphans(runs []pinRun) {
	for _, r := range runs {
		rp := r.rp
		if rp.orphan && rp.pinned == 0 && rp.holds == 0 && p.byRegion[rp.r] == rp {
			p.forget(rp)
		}
	}
	p.fixup()
}

// unaccount returns n pages to the global accounting.
func (p *Pinner) unaccount(n uint64) {
	if a := p.cfg.Accounting; a != nil {
		a.unreserve(n * PageSize)
	}
}

// rangeRuns appends the runs covering guest-physical [gpa, gpa+n) of t,
// which must be mapped wholly, tracking the regions.
func (p *Pinner) rangeRuns(t *Table, gpa abi.GPA, n uint64, runs []pinRun) ([]pinRun, error) {
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
func (p *Pinner) pageRuns(t *Table, pages []abi.GPA, strict bool, runs []pinRun) ([]pinRun, error) {
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
func (p *Pinner) lookupRuns(t *Table, g abi.GPA, runs []pinRun) []pinRun {
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

// continued reports whether runs[i+1] starts right after runs[i] in the
// same region: the extent after runs[i] is then not final until runs[i+1]
// is done.
func continued(runs []pinRun, i int) bool {
	return i+1 < len(runs) && runs[i+1].rp == runs[i].rp && runs[i+1].first == runs[i].last+1
}

// pinRuns pins the pages of runs, all or nothing (see the design notes:
// plan, reserve, mlock, commit).
func (p *Pinner) pinRuns(runs []pinRun) error {
	held := p.scratch.held[:0]
	misses := p.scratch.misses[:0]
	defer func() {
		clear(held)
		p.scratch.held = held[:0]
		p.scratch.misses = misses[:0]
	}()
	// Plan: split at the run bounds, so that every extent lies wholly
	// inside or outside the runs; hold the cached extents inside; collect
	// the gaps as misses.
	var hits, nmiss uint64
	for i, r := range runs {
		rp := r.rp
		p.splitAt(rp, r.first)
		p.splitAt(rp, r.last+1)
		e := rp.lowerBound(r.first)
		for pos := r.first; pos <= r.last; { // bounded by the extents in the run
			p.work++
			if e != nil && e.first == pos {
				if e.count > math.MaxUint32-r.mult {
					p.unplan(runs[:i+1], held)
					p.fixup()
					return &RangeError{Space: SpaceGuest, Addr: (rp.first + pos) << pageShift, Len: PageSize,
						Err: fmt.Errorf("pin count: %w", ErrOverflow)}
				}
				if e.count == 0 {
					e.held = true
					held = append(held, e)
					hits += e.pages()
				}
				pos, e = e.last+1, e.next
				continue
			}
			end := r.last
			if e != nil && e.first <= r.last {
				end = e.first - 1
			}
			if k := len(misses) - 1; k >= 0 && misses[k].rp == rp && misses[k].last+1 == pos {
				misses[k].last = end
			} else {
				misses = append(misses, pinRun{rp: rp, first: pos, last: end})
			}
			nmiss += end - pos + 1
			pos = end + 1
		}
	}
	// Reserve: quota, evicting the unheld cache first.
	if err := p.reserve(nmiss, hits); err != nil {
		p.unplan(runs, held)
		p.fixup()
		return err
	}
	// Lock the misses.
	for k, m := range misses {
		if err := unix.Mlock(m.rp.hostRun(m.first, m.last)); err != nil {
			// A failed mlock may leave its range marked locked: undo it too.
			for _, u := range misses[:k+1] {
				_ = unix.Munlock(u.rp.hostRun(u.first, u.last))
			}
			p.locked -= nmiss
			p.unaccount(nmiss)
			p.unplan(runs, held)
			p.fixup()
			return fmt.Errorf("mlock gpa %#x+%#x: %w", (m.rp.first+m.first)<<pageShift,
				(m.last-m.first+1)<<pageShift, err)
		}
	}
	// Commit.
	for i, r := range runs {
		p.commitRun(r, continued(runs, i))
	}
	p.fixup()
	p.stats.CacheHits += hits
	p.stats.CacheMisses += nmiss
	return nil
}

// unplan reverts the plan of runs: the held extents are released and the
// splits at the run bounds merged back.
func (p *Pinner) unplan(runs []pinRun, held []*extent) {
	for _, e := range held {
		e.held = false
	}
	for _, r := range runs {
		p.work++
		p.mergeAt(r.rp, r.first)
		p.mergeAt(r.rp, r.last+1)
	}
}

// commitRun applies a planned run: held extents leave the cache, every
// extent inside gains r.mult pins, gaps become extents, and each extent
// merges with its predecessor (already final), the last one also with its
// successor unless the next run continues there.
func (p *Pinner) commitRun(r pinRun, cont bool) {
	rp := r.rp
	prev, e := rp.around(r.first) // no extent straddles r.first after the plan
	var cur *extent
	for pos := r.first; pos <= r.last; { // bounded by the extents in the run
		p.work++
		if e != nil && e.first == pos {
			cur, e = e, e.next
			if cur.count == 0 { // a hit
				n := cur.pages()
				p.lruRemove(cur)
				cur.held = false
				rp.cached -= n
				rp.pinned += n
				p.cached -= n
			}
			cur.count += r.mult
		} else {
			end := r.last
			if e != nil && e.first <= r.last {
				end = e.first - 1
			}
			cur = p.newExtent()
			cur.first, cur.last, cur.count = pos, end, r.mult
			rp.link(cur, prev)
			rp.pinned += end - pos + 1
		}
		pos = cur.last + 1
		if pv := cur.prev; p.tryMerge(pv, cur) {
			cur = pv
		}
		prev = cur
	}
	if cur != nil && !cont {
		p.tryMerge(cur, cur.next)
	}
}

// reserve accounts n more locked pages against the device quota and the
// global limit, evicting the cache (but for the hits pages the Pin in
// progress holds) to make room; on failure nothing is reserved (the
// evictions stay).
func (p *Pinner) reserve(n, hits uint64) error {
	if n == 0 {
		return nil
	}
	want := n * PageSize // n <= pages of the address space: no overflow
	if q := p.cfg.MaxPinned; q != 0 {
		quota := q / PageSize
		if p.locked+n > quota {
			p.evict(min(p.locked+n-quota, p.cached-hits))
		}
		if p.locked+n > quota {
			return &QuotaError{Want: want, Locked: p.locked * PageSize, Limit: q}
		}
	}
	if a := p.cfg.Accounting; a != nil && !a.reserve(want) {
		if a.limit != 0 {
			cur := a.locked.Load()
			if s, ok := add(cur, want); !ok {
				p.evict(p.cached - hits)
			} else if s > a.limit {
				p.evict(min((s-a.limit+pageMask)/PageSize, p.cached-hits))
			}
		}
		if !a.reserve(want) {
			return &QuotaError{Want: want, Locked: a.locked.Load(), Limit: a.limit, Global: true}
		}
	}
	p.locked += n
	return nil
}

// unpinRuns drops the pins of runs; pages reaching zero go to the cache (as
// most recently released, in run order) or are munlocked, and the cache is
// trimmed to its bound.
func (p *Pinner) unpinRuns(runs []pinRun) {
	unlock := p.scratch.misses[:0]
	defer func() { p.scratch.misses = unlock[:0] }()
	var nunlock uint64
	for i, r := range runs {
		rp := r.rp
		var cur *extent                                                   // the last extent this run left in the map
		for e := rp.lowerBound(r.first); e != nil && e.first <= r.last; { // bounded by the extents in the run
			p.work++
			if e.count == 0 {
				e = e.next // cached: a surplus unpin
				continue
			}
			if e.first < r.first {
				e = p.split(e, r.first)
			}
			if e.last > r.last {
				p.split(e, r.last+1)
			}
			next := e.next
			e.count -= min(e.count, r.mult)
			if e.count == 0 {
				n := e.pages()
				rp.pinned -= n
				if p.cachePages > 0 && !rp.orphan {
					p.lruPush(e)
					rp.cached += n
					p.cached += n
				} else {
					if k := len(unlock) - 1; k >= 0 && unlock[k].rp == rp && unlock[k].last+1 == e.first {
						unlock[k].last = e.last
					} else {
						unlock = append(unlock, pinRun{rp: rp, first: e.first, last: e.last})
					}
					nunlock += n
					rp.unlink(e)
					p.freeExtent(e)
					e = nil
				}
			}
			if e != nil {
				if pv := e.prev; p.tryMerge(pv, e) {
					e = pv
				}
			}
			cur, e = e, next
		}
		if cur != nil && !continued(runs, i) {
			p.tryMerge(cur, cur.next)
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
	p.fixup()
}

// evict munlocks the n least recently released cached pages that no Pin in
// progress holds: whole extents from the old end of the list, then the low
// part of the next one, one munlock per extent. The caller runs fixup.
func (p *Pinner) evict(n uint64) {
	var count uint64
	for e := p.oldest; e != nil && count < n; { // bounded by the cached extents
		p.work++
		next := e.newer
		if e.held {
			e = next
			continue
		}
		rp := e.rp
		size := e.pages()
		if size <= n-count {
			p.dropExtent(e)
		} else {
			size = n - count
			_ = unix.Munlock(rp.hostRun(e.first, e.first+size-1))
			e.first += size // stays between its neighbours: the treap order holds
			rp.cached -= size
		}
		count += size
		e = next
	}
	p.cached -= count
	p.locked -= count
	p.unaccount(count)
	p.stats.Evictions += count
}
