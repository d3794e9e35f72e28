package memmap

import "math/rand/v2"

// The Pinner's extent map: see "Extents" in pin.go's design notes.

// maxSpare bounds the freed extents a Pinner keeps for reuse, so that a
// steady register/deregister cycle allocates nothing while a region with
// many extents, once forgotten, returns its memory to the collector.
const maxSpare = 1024

// extent is a maximal run [first, last] of pages of one tracked region
// (indices relative to the region's first page) that share a state: count
// pins (count > 0), or in the map cache (count == 0). Pages of the region
// in no extent are unlocked. All fields are protected by Pinner.mu.
type extent struct {
	rp          *regionPins // owner; nil once freed
	first, last uint64      // page indices in rp, inclusive; first is the treap key
	count       uint32      // pins on each page; 0: cached
	held        bool        // cached, and taken by the Pin in progress
	prio        uint32      // treap priority (random)
	left, right *extent     // treap children
	prev, next  *extent     // neighbours in address order, in rp
	older       *extent     // LRU neighbours while cached: older was released before
	newer       *extent
}

// pages returns the number of pages of e.
func (e *extent) pages() uint64 { return e.last - e.first + 1 }

// around returns the last extent of rp that starts before page idx (a) and
// the first that starts at or after it (b); a.next == b.
func (rp *regionPins) around(idx uint64) (a, b *extent) {
	for t := rp.root; t != nil; {
		if t.first < idx {
			a, t = t, t.right
		} else {
			b, t = t, t.left
		}
	}
	return a, b
}

// lowerBound returns the first extent of rp (in address order) that ends at
// or after page idx, or nil.
func (rp *regionPins) lowerBound(idx uint64) *extent {
	a, b := rp.around(idx)
	if a != nil && a.last >= idx {
		return a
	}
	return b
}

// link inserts e (first, last set; not in rp) into rp right after the
// extent after (nil: as the first extent). The caller keeps the address
// order: after.last < e.first and e.last < after.next.first.
func (rp *regionPins) link(e, after *extent) {
	e.rp = rp
	e.prev = after
	if after != nil {
		e.next, after.next = after.next, e
	} else {
		e.next, rp.head = rp.head, e
	}
	if e.next != nil {
		e.next.prev = e
	}
	e.prio = rand.Uint32()
	rp.root = treapInsert(rp.root, e)
	rp.exts++
}

// unlink removes e from rp's treap and address list; e's LRU links are
// left alone.
func (rp *regionPins) unlink(e *extent) {
	rp.root = treapDelete(rp.root, e.first)
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		rp.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	}
	e.prev, e.next = nil, nil
	rp.exts--
}

// treapInsert inserts e (no key equal to e.first in t) under t and returns
// the new root. Recursion depth is the treap's depth, O(log n) expected
// whatever the insertion order, since priorities are random.
func treapInsert(t, e *extent) *extent {
	if t == nil {
		e.left, e.right = nil, nil
		return e
	}
	if e.first < t.first {
		t.left = treapInsert(t.left, e)
		if t.left.prio > t.prio {
			l := t.left
			t.left, l.right = l.right, t
			return l
		}
		return t
	}
	t.right = treapInsert(t.right, e)
	if t.right.prio > t.prio {
		r := t.right
		t.right, r.left = r.left, t
		return r
	}
	return t
}

// treapDelete removes the extent keyed first from t and returns the new
// root.
func treapDelete(t *extent, first uint64) *extent {
	switch {
	case t == nil:
		return nil
	case first < t.first:
		t.left = treapDelete(t.left, first)
		return t
	case first > t.first:
		t.right = treapDelete(t.right, first)
		return t
	}
	j := treapJoin(t.left, t.right)
	t.left, t.right = nil, nil
	return j
}

// treapJoin joins two treaps, every key of a below every key of b.
func treapJoin(a, b *extent) *extent {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case a.prio > b.prio:
		a.right = treapJoin(a.right, b)
		return a
	}
	b.left = treapJoin(a, b.left)
	return b
}

// newExtent returns a zeroed extent, reused if one is spare.
func (p *Pinner) newExtent() *extent {
	if n := len(p.spare); n > 0 {
		e := p.spare[n-1]
		p.spare[n-1] = nil
		p.spare = p.spare[:n-1]
		return e
	}
	return new(extent)
}

// freeExtent clears e (already out of its region and the LRU list) and
// keeps it for reuse. A freed extent has a nil rp.
func (p *Pinner) freeExtent(e *extent) {
	*e = extent{}
	if len(p.spare) < maxSpare {
		p.spare = append(p.spare, e)
	}
}

// lruPush appends the cached extent e as the most recently released.
func (p *Pinner) lruPush(e *extent) { p.lruInsertAfter(e, p.newest) }

// lruInsertAfter inserts the cached extent e right after at in the LRU
// list (at == nil: as the oldest).
func (p *Pinner) lruInsertAfter(e, at *extent) {
	e.older = at
	if at != nil {
		e.newer, at.newer = at.newer, e
	} else {
		e.newer, p.oldest = p.oldest, e
	}
	if e.newer != nil {
		e.newer.older = e
	} else {
		p.newest = e
	}
	p.lruLen++
}

// lruRemove takes e out of the LRU list. Its older neighbour now precedes
// another extent, with which it may have to merge: it is queued for fixup.
func (p *Pinner) lruRemove(e *extent) {
	if e.older != nil {
		e.older.newer = e.newer
		p.scratch.fix = append(p.scratch.fix, e.older)
	} else {
		p.oldest = e.newer
	}
	if e.newer != nil {
		e.newer.older = e.older
	} else {
		p.newest = e.older
	}
	e.older, e.newer = nil, nil
	p.lruLen--
}

// mergeable reports whether b, the address successor of a, continues a:
// adjacent pages, no Pin in progress on either, and the same count; cached
// extents also have to be consecutive in the LRU list in address order, so
// that the merged extent still lists its pages in release order.
func mergeable(a, b *extent) bool {
	return a != nil && b != nil && a.next == b && a.last+1 == b.first &&
		a.count == b.count && !a.held && !b.held && (a.count != 0 || a.newer == b)
}

// tryMerge merges b into a if mergeable(a, b) and reports whether it did.
func (p *Pinner) tryMerge(a, b *extent) bool {
	if !mergeable(a, b) {
		return false
	}
	a.rp.unlink(b)
	a.last = b.last
	if b.count == 0 {
		p.lruRemove(b) // b.older == a
	}
	p.freeExtent(b)
	return true
}

// split cuts e at page idx (e.first < idx <= e.last): e keeps
// [e.first, idx-1] and the returned new extent takes [idx, e.last] with
// e's state, right after e in address order and, if cached, in the LRU list
// (pages of one extent are released in address order).
func (p *Pinner) split(e *extent, idx uint64) *extent {
	f := p.newExtent()
	f.first, f.last, f.count, f.held = idx, e.last, e.count, e.held
	e.last = idx - 1
	e.rp.link(f, e)
	if f.count == 0 {
		p.lruInsertAfter(f, e)
	}
	return f
}

// splitAt makes page idx of rp start an extent if an extent holds it.
func (p *Pinner) splitAt(rp *regionPins, idx uint64) {
	if a, _ := rp.around(idx); a != nil && a.last >= idx {
		p.split(a, idx)
	}
}

// mergeAt merges the extents on both sides of the boundary before page idx
// if they are mergeable.
func (p *Pinner) mergeAt(rp *regionPins, idx uint64) {
	if a, b := rp.around(idx); b != nil && b.first == idx {
		p.tryMerge(a, b)
	}
}

// fixup merges the cached extents queued by lruRemove with their address
// successors where they became mergeable, and empties the queue. Freed
// extents (nil rp) are skipped; a queued extent freed and reused since is
// only checked, which is harmless.
func (p *Pinner) fixup() {
	for i := 0; i < len(p.scratch.fix); i++ { // merges may queue more
		a := p.scratch.fix[i]
		for a.rp != nil && p.tryMerge(a, a.next) {
			p.work++
		}
	}
	clear(p.scratch.fix)
	p.scratch.fix = p.scratch.fix[:0]
}
