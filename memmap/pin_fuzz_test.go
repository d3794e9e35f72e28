package memmap

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// pinKey names a page in the fuzz model: the index of its region in the
// fuzz target's region list and its page index in that region.
type pinKey struct {
	r   int
	idx uint64
}

// pinKeyMult is a page to pin or unpin mult times.
type pinKeyMult struct {
	pinKey
	mult uint32
}

// pinModel is the fuzz target's model of a Pinner, page by page: counts, an
// LRU list of cached pages, the locked pages, and the counters. It knows
// nothing of extents.
type pinModel struct {
	cfg        PinConfig
	cachePages uint64
	count      map[pinKey]uint32 // pages with a positive count
	lru        []pinKey          // cached pages, least recently released first
	all        map[int]bool      // regions pinned by pin=all
	locked     uint64            // pages pinned or cached
	others     *uint64           // pages locked by other Pinners on the same Accounting
	stats      PinStats          // CacheHits, CacheMisses, Evictions
}

// evict drops the n least recently released cached pages not in skip.
func (m *pinModel) evict(n uint64, skip map[pinKey]bool) {
	var kept []pinKey
	var gone uint64
	for _, k := range m.lru {
		if gone < n && !skip[k] {
			gone++
			continue
		}
		kept = append(kept, k)
	}
	m.lru = kept
	m.locked -= gone
	m.stats.Evictions += gone
}

// pin pins keys (in the order the Pinner's runs list them), all or nothing,
// and reports whether it succeeded (it fails only on a quota).
func (m *pinModel) pin(keys []pinKeyMult) bool {
	hits := map[pinKey]bool{}
	var misses uint64
	for _, k := range keys {
		if m.count[k.pinKey] == 0 {
			if slices.Contains(m.lru, k.pinKey) {
				hits[k.pinKey] = true
			} else {
				misses++
			}
		}
	}
	evictable := func() uint64 { return uint64(len(m.lru) - len(hits)) }
	if misses > 0 {
		if q := m.cfg.MaxPinned; q != 0 {
			quota := q / PageSize
			if m.locked+misses > quota {
				m.evict(min(m.locked+misses-quota, evictable()), hits)
			}
			if m.locked+misses > quota {
				return false
			}
		}
		if a := m.cfg.Accounting; a != nil && a.limit != 0 {
			cur, want := (m.locked+*m.others)*PageSize, misses*PageSize
			if cur+want > a.limit {
				m.evict(min((cur+want-a.limit+pageMask)/PageSize, evictable()), hits)
			}
			if (m.locked+*m.others)*PageSize+want > a.limit {
				return false
			}
		}
		m.locked += misses
	}
	for _, k := range keys {
		m.count[k.pinKey] += k.mult
	}
	m.lru = slices.DeleteFunc(m.lru, func(k pinKey) bool { return hits[k] })
	m.stats.CacheHits += uint64(len(hits))
	m.stats.CacheMisses += misses
	return true
}

// unpin drops pins of keys in order; pages reaching zero are cached (or
// unlocked), and the cache is trimmed.
func (m *pinModel) unpin(keys []pinKeyMult) {
	for _, k := range keys {
		c := m.count[k.pinKey]
		if c == 0 {
			continue
		}
		c -= min(c, k.mult)
		if c != 0 {
			m.count[k.pinKey] = c
			continue
		}
		delete(m.count, k.pinKey)
		if m.cachePages > 0 {
			m.lru = append(m.lru, k.pinKey)
		} else {
			m.locked--
		}
	}
	if n := uint64(len(m.lru)); n > m.cachePages {
		m.evict(n-m.cachePages, nil)
	}
}

// orphan is SetTable without region r: its pin=all pin and its cached
// pages go; the other pins on it stay (they are the pins' to drop).
func (m *pinModel) orphan(r int) {
	if m.all[r] {
		for k, c := range m.count {
			if k.r != r {
				continue
			}
			if c > 1 {
				m.count[k] = c - 1
				continue
			}
			delete(m.count, k)
			m.locked--
		}
	}
	m.lru = slices.DeleteFunc(m.lru, func(k pinKey) bool {
		if k.r == r {
			m.locked--
			return true
		}
		return false
	})
	delete(m.all, r)
}

// pinFuzzEnv is what the model needs to know about the mapped regions.
type pinFuzzEnv struct {
	regions []*Region
}

// index returns the index of the region with spec s.
func (env *pinFuzzEnv) index(s RegionSpec) int {
	for i, r := range env.regions {
		if r.Spec() == s {
			return i
		}
	}
	panic("unknown region")
}

// rangeKeys returns the keys of [gpa, gpa+n) in the regions of specs, in
// address order, and whether the range is mapped wholly (strict) or not.
func (env *pinFuzzEnv) rangeKeys(specs []RegionSpec, gpa, n uint64, mult uint32) ([]pinKeyMult, bool) {
	end, ok := add(gpa, n)
	if !ok {
		end = 1<<64 - 1 // Unpin's reach; Pin refuses the range
	}
	mapped := ok
	for a := gpa; mapped && a < end; {
		i := modelFind(specs, false, a)
		if i < 0 {
			mapped = false
			break
		}
		a = uint64(specs[i].GuestAddr) + specs[i].Size
	}
	var keys []pinKeyMult
	for _, s := range specs {
		lo, hi := max(gpa, uint64(s.GuestAddr)), min(end, uint64(s.GuestAddr)+s.Size)
		if lo >= hi {
			continue
		}
		ri := env.index(s)
		for pgn := lo >> pageShift; pgn <= (hi-1)>>pageShift; pgn++ {
			keys = append(keys, pinKeyMult{pinKey{ri, pgn - uint64(s.GuestAddr)>>pageShift}, mult})
		}
	}
	return keys, mapped
}

// pageKeys returns the keys of a page list as PinPages orders them and
// whether every page is aligned and mapped wholly; unaligned pages are
// left out.
func (env *pinFuzzEnv) pageKeys(specs []RegionSpec, pages []abi.GPA) ([]pinKeyMult, bool) {
	sorted := slices.Clone(pages)
	slices.Sort(sorted)
	var keys []pinKeyMult
	ok := true
	for i := 0; i < len(sorted); {
		j := i + 1
		for j < len(sorted) && sorted[j] == sorted[i] {
			j++
		}
		g := uint64(sorted[i])
		mult := uint32(j - i)
		i = j
		if g&pageMask != 0 {
			ok = false
			continue
		}
		k, mapped := env.rangeKeys(specs, g, PageSize, mult)
		ok = ok && mapped
		keys = append(keys, k...)
	}
	return keys, ok
}

// pinnerState returns the counts and the LRU list of p, page by page, in
// the model's terms.
func (env *pinFuzzEnv) pinnerState(p *Pinner) (map[pinKey]uint32, []pinKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	idx := map[*regionPins]int{}
	counts := map[pinKey]uint32{}
	for i, r := range env.regions {
		rp := p.byRegion[r]
		if rp == nil {
			continue
		}
		idx[rp] = i
		for e := rp.head; e != nil; e = e.next {
			for pg := e.first; e.count != 0 && pg <= e.last; pg++ {
				counts[pinKey{i, pg}] = e.count
			}
		}
	}
	var lru []pinKey
	for e := p.oldest; e != nil; e = e.newer {
		for pg := e.first; pg <= e.last; pg++ {
			lru = append(lru, pinKey{idx[e.rp], pg})
		}
	}
	return counts, lru
}

// smapsLockedRanges returns the address ranges of the VMAs that
// /proc/self/smaps shows with the "lo" (VM_LOCKED) flag.
func smapsLockedRanges(t testing.TB) [][2]uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatalf("read smaps: %v", err)
	}
	var locked [][2]uint64
	var start, end uint64
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "VmFlags:"); ok {
			if slices.Contains(strings.Fields(rest), "lo") {
				locked = append(locked, [2]uint64{start, end})
			}
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasSuffix(f[0], ":") {
			continue
		}
		s, e, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		if start, err = strconv.ParseUint(s, 16, 64); err != nil {
			t.Fatalf("smaps line %q: %v", line, err)
		}
		if end, err = strconv.ParseUint(e, 16, 64); err != nil {
			t.Fatalf("smaps line %q: %v", line, err)
		}
	}
	return locked
}

// checkSmaps checks that exactly the host pages of the model's locked pages
// (pinned or cached) are locked in each region's mapping.
func (env *pinFuzzEnv) checkSmaps(t testing.TB, m *pinModel) {
	t.Helper()
	ranges := smapsLockedRanges(t)
	for i, r := range env.regions {
		lo, hi := hostSpan(r.mapping)
		got := map[uintptr]bool{}
		for _, lr := range ranges {
			for a := max(lr[0], uint64(lo)); a < min(lr[1], uint64(hi)); a += PageSize {
				got[uintptr(a)] = true
			}
		}
		want := map[uintptr]bool{}
		s := r.Spec()
		for k := range m.count {
			if k.r == i {
				want[hostPage(r, s, k.idx)] = true
			}
		}
		for _, k := range m.lru {
			if k.r == i {
				want[hostPage(r, s, k.idx)] = true
			}
		}
		if !maps.Equal(got, want) {
			t.Fatalf("region %d: smaps shows %d locked pages, model %d (%v vs %v)", i, len(got), len(want), got, want)
		}
	}
}

// hostPage returns the host page holding page idx of region r.
func hostPage(r *Region, s RegionSpec, idx uint64) uintptr {
	g := max((uint64(s.GuestAddr)>>pageShift+idx)<<pageShift, uint64(s.GuestAddr))
	a := uintptr(unsafe.Pointer(&r.data[g-uint64(s.GuestAddr)]))
	return a &^ pageMask
}

// FuzzPinner runs a decoded sequence of Pin, PinPages, Unpin, UnpinPages,
// SetTable and other-device pins (sharing a global limit) on real memfd
// regions and checks after each the Pinner's invariants and that a per-page
// model agrees exactly: counts, the cached pages in LRU order, the counters,
// success or failure of every pin (all or nothing), VmLck, and (every few
// operations, as smaps is slower) which host pages are locked.
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
	// The other device's memory: its own mapping, D [0, 0x4000).
	otherTab, _ := testTable(f, 0x4000, RegionSpec{GuestAddr: 0, Size: 0x4000})
	env := &pinFuzzEnv{regions: regions}

	f.Add([]byte{
		0x03, 0x18, // config: cache 3 pages, quota 8 pages, accounting
		0x00, 0x00, 0x05, 0x00, 0x02, 0x00, // Pin 0x15000+0x2000 (A and B)
		0x02, 0x03, 0x10, 0x15, 0x15, // PinPages 0x10000, 0x15000, 0x15000
		0x01, 0x00, 0x05, 0x00, 0x02, 0x00, // Unpin 0x15000+0x2000
		0x04, 0x01, // SetTable without C
		0x03, 0x02, 0x10, 0x15, // UnpinPages 0x10000, 0x15000
	})
	f.Add([]byte{
		0x06, 0x46, 0x07, // config: cache 6 pages, quota 6, global limit 8 pages
		0x05, 0x00, 0x00, 0x02, // other device pins 3 pages
		0x00, 0x00, 0x00, 0x00, 0x30, 0x00, // Pin 0x10000+0x3000
		0x01, 0x00, 0x00, 0x00, 0x30, 0x00, // Unpin it: 3 cached
		0x00, 0x00, 0x10, 0x00, 0x40, 0x00, // Pin 0x11000+0x4000: 2 hits, 2 misses, evicts 1... then the limit
		0x05, 0x01, 0x00, 0x03, // other device unpins
		0x02, 0x04, 0x12, 0x12, 0x20, 0x21, // PinPages
		0x04, 0x00, // SetTable with C
	})

	f.Fuzz(func(t *testing.T, data []byte) {
		r := &fuzzReader{b: data}
		base := vmLck(t)
		cfg := PinConfig{CacheBytes: uint64(r.u8()%8) * pg}
		mode := r.u8()
		if q := mode & 0x0f; q != 0 {
			cfg.MaxPinned = uint64(q) * pg
		}
		switch {
		case mode&0x40 != 0:
			cfg.Accounting = NewAccounting(uint64(r.u8()%24+1) * pg)
		case mode&0x10 != 0:
			cfg.Accounting = NewAccounting(0)
		}
		cfg.All = mode&0x20 != 0
		p := NewPinner(cfg)
		var other *Pinner // another device on the same Accounting
		var otherPages uint64
		otherCount := map[uint64]uint32{}
		if cfg.Accounting != nil {
			other = NewPinner(PinConfig{Accounting: cfg.Accounting})
		}
		m := &pinModel{cfg: cfg, cachePages: cfg.CacheBytes / PageSize, count: map[pinKey]uint32{},
			all: map[int]bool{}, others: &otherPages}
		defer func() {
			p.Close()
			if other != nil {
				other.Close()
			}
			if got := vmLck(t); got != base {
				t.Errorf("after Close: VmLck %d, want %d", got, base)
			}
			if a := cfg.Accounting; a != nil && a.Pinned() != 0 {
				t.Errorf("after Close: accounting %d, want 0", a.Pinned())
			}
		}()
		cur := tab
		orphaned := map[int]bool{}
		setTable := func(next *Table) {
			cur = next
			err := p.SetTable(next)
			in := map[int]bool{}
			for _, s := range next.Regions() {
				in[env.index(s)] = true
			}
			for i := range regions {
				if !in[i] && !orphaned[i] {
					m.orphan(i)
					orphaned[i] = true
				}
				if in[i] {
					orphaned[i] = false
				}
			}
			wantOK := true
			if cfg.All {
				for _, s := range next.Regions() {
					i := env.index(s)
					if m.all[i] {
						continue
					}
					keys, _ := env.rangeKeys(next.Regions(), uint64(s.GuestAddr), s.Size, 1)
					if !m.pin(keys) {
						wantOK = false
						break
					}
					m.all[i] = true
				}
			}
			if (err == nil) != wantOK || (err != nil && !errors.Is(err, ErrQuota)) {
				t.Fatalf("SetTable: got %v, model says ok=%v", err, wantOK)
			}
		}
		if cfg.All {
			setTable(cur)
		}
		for ops := 0; !r.empty() && ops < 64; ops++ {
			specs := cur.Regions()
			what := ""
			switch op := r.u8() % 6; op {
			case 0, 1:
				gpa := 0x10000 + uint64(r.u16())<<4
				n := uint64(r.u16()) << 4
				if r.u8()&1 != 0 {
					gpa, n = r.u64(), r.u64()
				}
				keys, mapped := env.rangeKeys(specs, gpa, n, 1)
				if op == 1 {
					what = fmt.Sprintf("Unpin(%#x, %#x)", gpa, n)
					p.Unpin(cur, abi.GPA(gpa), n)
					m.unpin(keys)
					break
				}
				what = fmt.Sprintf("Pin(%#x, %#x)", gpa, n)
				err := p.Pin(cur, abi.GPA(gpa), n)
				checkPinResult(t, what, err, mapped, mapped && m.pin(keys))
			case 2, 3:
				pages := make([]abi.GPA, r.u8()%8)
				for i := range pages {
					pages[i] = abi.GPA(uint64(r.u8()) << pageShift)
					if pages[i]&0x80000 != 0 {
						pages[i] |= 0x123 // unaligned
					}
				}
				keys, valid := env.pageKeys(specs, pages)
				if op == 3 {
					what = fmt.Sprintf("UnpinPages(%#x)", pages)
					p.UnpinPages(cur, pages)
					m.unpin(keys)
					break
				}
				what = fmt.Sprintf("PinPages(%#x)", pages)
				err := p.PinPages(cur, pages)
				checkPinResult(t, what, err, valid, valid && m.pin(keys))
			case 4:
				next := tab
				if r.u8()&1 != 0 {
					next = noC
				}
				what = fmt.Sprintf("SetTable(%d regions)", next.Len())
				setTable(next)
			case 5:
				if other == nil {
					continue
				}
				b := r.u8()
				first, n := uint64(r.u8()%4), uint64(r.u8()%4)+1
				n = min(n, 4-first)
				if b&1 != 0 {
					what = fmt.Sprintf("other Unpin(%d, %d pages)", first, n)
					other.Unpin(otherTab, abi.GPA(first*pg), n*pg)
					for i := first; i < first+n; i++ {
						if c := otherCount[i]; c > 0 {
							if otherCount[i] = c - 1; c == 1 {
								otherPages--
							}
						}
					}
					break
				}
				what = fmt.Sprintf("other Pin(%d, %d pages)", first, n)
				var misses uint64
				for i := first; i < first+n; i++ {
					if otherCount[i] == 0 {
						misses++
					}
				}
				ok := true
				if a := cfg.Accounting; misses > 0 && a.limit != 0 && (m.locked+otherPages+misses)*pg > a.limit {
					ok = false
				}
				err := other.Pin(otherTab, abi.GPA(first*pg), n*pg)
				checkPinResult(t, what, err, true, ok)
				if ok {
					for i := first; i < first+n; i++ {
						otherCount[i]++
					}
					otherPages += misses
				}
			}
			checkPinnerShared(t, p, otherPages*pg)
			counts, lru := env.pinnerState(p)
			if !maps.Equal(counts, m.count) {
				t.Fatalf("after %s: got counts %v, model %v", what, counts, m.count)
			}
			if !slices.Equal(lru, m.lru) {
				t.Fatalf("after %s: got cached pages %v, model %v", what, lru, m.lru)
			}
			want := m.stats
			want.CachedBytes = uint64(len(m.lru)) * pg
			want.PinnedBytes = (m.locked - uint64(len(m.lru))) * pg
			if got := p.Stats(); got != want {
				t.Fatalf("after %s: got stats %+v, model %+v", what, got, want)
			}
			if got := vmLck(t) - base; got != (m.locked+otherPages)*pg {
				t.Fatalf("after %s: VmLck grew by %d, model locks %d + %d other pages", what, got, m.locked, otherPages)
			}
			if ops%4 == 3 {
				env.checkSmaps(t, m)
			}
		}
		env.checkSmaps(t, m)
	})
}

// checkPinResult checks a pin's error against the model: valid input fails
// only on a quota, invalid input always fails, and never with ErrQuota.
func checkPinResult(t *testing.T, what string, err error, valid, wantOK bool) {
	t.Helper()
	switch {
	case wantOK && err != nil:
		t.Fatalf("%s: got %v, model says it succeeds", what, err)
	case !wantOK && err == nil:
		t.Fatalf("%s succeeded, model says it fails", what)
	case err != nil && valid && !errors.Is(err, ErrQuota):
		t.Fatalf("%s: got %v, want ErrQuota", what, err)
	case err != nil && !valid && errors.Is(err, ErrQuota):
		t.Fatalf("%s: got %v for invalid input", what, err)
	}
}
