package memmap

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// span is one region's extent in one address space, [start, end), end
// exclusive (never overflows: RegionSpec.validate).
type span struct {
	start, end uint64
	peer       uint64 // start of the same region in the other address space
	data       []byte // the region's bytes; len(data) == end-start
}

// Table is an immutable set of regions, sorted by GuestAddr, with no overlap
// in guest-physical nor in front-end virtual space. It is reference counted:
// NewTable, EmptyTable, With and Without return a table with one reference,
// Memory.Acquire takes another, and the last Release drops the table's
// references on its regions. Lookups are O(log n) and allocation-free.
type Table struct {
	regions []*Region // immutable; sorted by GuestAddr; one reference each
	byGPA   []span    // immutable; same order as regions
	byUVA   []span    // immutable; sorted by UserAddr
	log     *DirtyLog // immutable; nil, or the dirty log writers mark (one reference)
	refs    atomic.Int64
	idle    chan struct{} // immutable; closed by the last Release
}

// EmptyTable returns a table with no regions and one reference.
func EmptyTable() *Table {
	t := &Table{idle: make(chan struct{})}
	t.refs.Store(1)
	return t
}

// NewTable returns a table of regions with one reference. It takes its own
// reference on each region, so the caller keeps (and must release) its own.
// It refuses more than MaxRegions regions, a nil or released region, and
// regions that overlap in either address space.
func NewTable(regions []*Region) (*Table, error) {
	if len(regions) > MaxRegions {
		return nil, fmt.Errorf("%d regions, at most %d: %w", len(regions), MaxRegions, ErrTooManyRegions)
	}
	rs := make([]*Region, len(regions))
	copy(rs, regions)
	for i, r := range rs {
		if r == nil {
			return nil, fmt.Errorf("region %d is nil: %w", i, ErrBadRegion)
		}
	}
	slices.SortFunc(rs, func(a, b *Region) int {
		switch {
		case a.spec.GuestAddr < b.spec.GuestAddr:
			return -1
		case a.spec.GuestAddr > b.spec.GuestAddr:
			return 1
		}
		return 0
	})
	t := &Table{
		regions: rs,
		byGPA:   make([]span, len(rs)),
		byUVA:   make([]span, len(rs)),
		idle:    make(chan struct{}),
	}
	for i, r := range rs {
		s := r.spec
		g, u := uint64(s.GuestAddr), uint64(s.UserAddr)
		// Regions passed validate in MapRegion: the ends do not overflow.
		t.byGPA[i] = span{start: g, end: g + s.Size, peer: u, data: r.data}
		t.byUVA[i] = span{start: u, end: u + s.Size, peer: g, data: r.data}
	}
	slices.SortFunc(t.byUVA, func(a, b span) int {
		switch {
		case a.start < b.start:
			return -1
		case a.start > b.start:
			return 1
		}
		return 0
	})
	if err := checkOverlap(t.byGPA, SpaceGuest); err != nil {
		return nil, err
	}
	if err := checkOverlap(t.byUVA, SpaceUser); err != nil {
		return nil, err
	}
	for i, r := range rs {
		if !r.tryRef() {
			for _, p := range rs[:i] {
				p.Release()
			}
			return nil, &RegionError{Spec: r.spec, Err: fmt.Errorf("already released: %w", ErrBadRegion)}
		}
	}
	t.refs.Store(1)
	return t, nil
}

// checkOverlap reports the first pair of overlapping spans of a sorted list.
func checkOverlap(ss []span, space string) error {
	for i := 1; i < len(ss); i++ {
		if p, c := ss[i-1], ss[i]; c.start < p.end {
			return &RangeError{Space: space, Addr: c.start, Len: c.end - c.start,
				Err: fmt.Errorf("with %#x+%#x: %w", p.start, p.end-p.start, ErrOverlap)}
		}
	}
	return nil
}

// Regions returns the specs of the table's regions, sorted by GuestAddr.
func (t *Table) Regions() []RegionSpec {
	specs := make([]RegionSpec, len(t.regions))
	for i, r := range t.regions {
		specs[i] = r.spec
	}
	return specs
}

// Region returns region i of the table, in GuestAddr order (the order of
// Regions), or nil when i is out of range. It is valid while the caller
// holds a reference on t.
func (t *Table) Region(i int) *Region {
	if i < 0 || i >= len(t.regions) {
		return nil
	}
	return t.regions[i]
}

// Len returns the number of regions.
func (t *Table) Len() int { return len(t.regions) }

// With returns a new table holding t's regions and r (ADD_MEM_REG). t and r
// are unchanged; the caller keeps its references on both.
func (t *Table) With(r *Region) (*Table, error) {
	if r == nil {
		return nil, fmt.Errorf("nil region: %w", ErrBadRegion)
	}
	if len(t.regions) >= MaxRegions {
		return nil, &RegionError{Spec: r.spec,
			Err: fmt.Errorf("table has %d regions: %w", len(t.regions), ErrTooManyRegions)}
	}
	rs := make([]*Region, 0, len(t.regions)+1)
	rs = append(rs, t.regions...)
	rs = append(rs, r)
	return t.carryLog(NewTable(rs))
}

// Without returns a new table holding t's regions except the one whose
// GuestAddr, Size and UserAddr match spec (REM_MEM_REG; MmapOffset is not
// compared). It returns a *RangeError with ErrNotMapped if none matches.
// t is unchanged.
func (t *Table) Without(spec RegionSpec) (*Table, error) {
	for i, r := range t.regions {
		s := r.spec
		if s.GuestAddr != spec.GuestAddr || s.Size != spec.Size || s.UserAddr != spec.UserAddr {
			continue
		}
		rs := make([]*Region, 0, len(t.regions)-1)
		rs = append(rs, t.regions[:i]...)
		rs = append(rs, t.regions[i+1:]...)
		return t.carryLog(NewTable(rs))
	}
	return nil, &RangeError{Space: SpaceGuest, Addr: uint64(spec.GuestAddr), Len: spec.Size, Err: ErrNotMapped}
}

// carryLog gives a table derived from t (With, Without) t's dirty log.
func (t *Table) carryLog(n *Table, err error) (*Table, error) {
	if err != nil || t.log == nil {
		return n, err
	}
	if !t.log.tryRef() {
		panic("memmap: a live table's dirty log was released")
	}
	n.log = t.log
	return n, nil
}

// withLog returns a table with t's regions and the dirty log l (nil: none),
// with one reference. t is unchanged; the caller keeps its reference.
// Precondition: the caller holds references on t and l.
func (t *Table) withLog(l *DirtyLog) *Table {
	n := &Table{regions: t.regions, byGPA: t.byGPA, byUVA: t.byUVA, idle: make(chan struct{})}
	for _, r := range t.regions {
		if !r.tryRef() {
			panic("memmap: a live table's region was released")
		}
	}
	if l != nil {
		if !l.tryRef() {
			panic("memmap: withLog of a released dirty log")
		}
		n.log = l
	}
	n.refs.Store(1)
	return n
}

// Idle returns a channel that is closed once the table's last reference
// is released: every worker that held it has let it go (Memory.SetLog).
func (t *Table) Idle() <-chan struct{} { return t.idle }

// find returns the index of the span holding addr, or -1.
func find(ss []span, addr uint64) int {
	// Binary search for the first span starting after addr.
	lo, hi := 0, len(ss)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if ss[m].start <= addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 || addr >= ss[lo-1].end {
		return -1
	}
	return lo - 1
}

// slice translates [addr, addr+n) within one span.
func slice(ss []span, space string, addr, n uint64) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	end, ok := add(addr, n)
	if !ok {
		return nil, &RangeError{Space: space, Addr: addr, Len: n, Err: ErrOverflow}
	}
	i := find(ss, addr)
	if i < 0 {
		return nil, &RangeError{Space: space, Addr: addr, Len: n, Err: ErrNotMapped}
	}
	s := &ss[i]
	if end > s.end {
		return nil, &RangeError{Space: space, Addr: addr, Len: n, Err: ErrCrossesRegion}
	}
	off := addr - s.start
	return s.data[off : off+n : off+n], nil
}

// Slice returns the host bytes for guest-physical [gpa, gpa+n). The whole
// range must lie inside one region; otherwise it returns a *RangeError with
// ErrOverflow, ErrNotMapped (gpa is in no region) or ErrCrossesRegion. The
// slice's capacity is n. n == 0 returns (nil, nil). The bytes are valid while
// the caller holds a reference on t.
func (t *Table) Slice(gpa abi.GPA, n uint64) ([]byte, error) {
	return slice(t.byGPA, SpaceGuest, uint64(gpa), n)
}

// SliceUser is Slice in front-end virtual space (vring addresses of
// SET_VRING_ADDR).
func (t *Table) SliceUser(uva UVA, n uint64) ([]byte, error) {
	return slice(t.byUVA, SpaceUser, uint64(uva), n)
}

// ForEach splits guest-physical [gpa, gpa+n) across GPA-adjacent regions and
// calls fn for each piece in address order. The whole range is checked before
// fn is first called: a gap or an unmapped end is a *RangeError with
// ErrNotMapped (Addr is the first unmapped address), an overflow one with
// ErrOverflow. fn's first error stops the walk and is returned as is. The
// loops are bounded by the number of regions. n == 0 calls nothing.
func (t *Table) ForEach(gpa abi.GPA, n uint64, fn func([]byte) error) error {
	return t.forEach(gpa, n, fn, nil)
}

// ForEachWrite is ForEach for a writer of guest memory: after fn returns
// for a piece, an error included (fn may have written part of it), the
// piece's pages are marked in the table's dirty log (MarkDirty).
func (t *Table) ForEachWrite(gpa abi.GPA, n uint64, fn func([]byte) error) error {
	return t.forEach(gpa, n, fn, t.log)
}

// forEach is ForEach, marking each piece in log after fn when log is not
// nil.
func (t *Table) forEach(gpa abi.GPA, n uint64, fn func([]byte) error, log *DirtyLog) error {
	if n == 0 {
		return nil
	}
	start := uint64(gpa)
	end, ok := add(start, n)
	if !ok {
		return &RangeError{Space: SpaceGuest, Addr: start, Len: n, Err: ErrOverflow}
	}
	first := find(t.byGPA, start)
	if first < 0 {
		return &RangeError{Space: SpaceGuest, Addr: start, Len: n, Err: ErrNotMapped}
	}
	last := first
	for t.byGPA[last].end < end {
		next := last + 1
		if next == len(t.byGPA) || t.byGPA[next].start != t.byGPA[last].end {
			a := t.byGPA[last].end
			return &RangeError{Space: SpaceGuest, Addr: a, Len: end - a, Err: ErrNotMapped}
		}
		last = next
	}
	addr := start
	for i := first; i <= last; i++ {
		s := &t.byGPA[i]
		lo := addr - s.start
		hi := min(end, s.end) - s.start
		err := fn(s.data[lo:hi:hi])
		if log != nil {
			log.mark(addr, hi-lo)
		}
		if err != nil {
			return err
		}
		addr = s.end
	}
	return nil
}

// UserToGuest translates a front-end virtual address to guest-physical.
func (t *Table) UserToGuest(uva UVA) (abi.GPA, bool) {
	i := find(t.byUVA, uint64(uva))
	if i < 0 {
		return 0, false
	}
	s := &t.byUVA[i]
	return abi.GPA(s.peer + (uint64(uva) - s.start)), true
}

// tryRef takes a reference unless the table was already released.
func (t *Table) tryRef() bool {
	for {
		n := t.refs.Load()
		if n <= 0 {
			return false
		}
		if t.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release drops a reference; the last one drops the table's references on
// its regions. Releasing more references than were taken panics.
func (t *Table) Release() {
	switch n := t.refs.Add(-1); {
	case n > 0:
		return
	case n < 0:
		panic("memmap: Table released too many times")
	}
	for _, r := range t.regions {
		r.Release()
	}
	if t.log != nil {
		t.log.Release()
	}
	close(t.idle)
}
