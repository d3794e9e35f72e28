package memmap

import (
	"errors"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// owner is a pin owner for the tests (the backend uses its objects).
type owner struct{ name string }

// tracked returns the number of regions p tracks.
func tracked(p *Pinner) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byRegion)
}

// TestPinOwnerAcrossTableChange is security issue 25, item 4: an MR
// registered on table T1 keeps its pin when the front-end switches to T2,
// an MR registered on T2 over the same guest pages gets its own, and the
// first one's DEREG_MR never unpins the second one's pages. Before owners,
// SetTable forgot T1's region (MR1 lost its pin) and the device unpinned
// MR1 through T2 (it dropped MR2's pin).
func TestPinOwnerAcrossTableChange(t *testing.T) {
	tests := []struct {
		name string
		// next builds T2 from T1's region r1 and the file behind it.
		next func(t *testing.T, r1 *Region, file int) *Table
		// mr2 registers an MR on T2 at guest address 0.
		mr2 bool
		// pinnedBoth is PinnedBytes with MR1 and MR2 live; pinnedMR2 with
		// MR2 alone.
		pinnedBoth, pinnedMR2 uint64
		// tracked is the regions tracked with both MRs live.
		tracked int
	}{{
		name: "same region kept (Table.Reuse)",
		next: func(t *testing.T, r1 *Region, file int) *Table {
			return tableOf(t, r1)
		},
		mr2: true, pinnedBoth: 4 * pg, pinnedMR2: 4 * pg, tracked: 1,
	}, {
		name: "same file and offset mapped anew",
		next: func(t *testing.T, r1 *Region, file int) *Table {
			spec := r1.Spec()
			spec.UserAddr += 1 << 30 // a new Region: Reuse would not keep it
			r2, err := MapRegion(dupFD(t, file), spec)
			if err != nil {
				t.Fatal(err)
			}
			defer r2.Release()
			return tableOf(t, r2)
		},
		mr2: true, pinnedBoth: 8 * pg, pinnedMR2: 4 * pg, tracked: 2,
	}, {
		name: "other memory at the same address",
		next: func(t *testing.T, r1 *Region, file int) *Table {
			r2 := mapNew(t, "other", 16*pg, r1.Spec())
			defer r2.Release()
			return tableOf(t, r2)
		},
		mr2: true, pinnedBoth: 8 * pg, pinnedMR2: 4 * pg, tracked: 2,
	}, {
		name: "region removed (REM_MEM_REG)",
		next: func(t *testing.T, r1 *Region, file int) *Table {
			return EmptyTable()
		},
		pinnedBoth: 4 * pg, tracked: 1,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := watchLocks(t)
			live := liveMappings.Load()
			r1, file := mapNewFile(t, "t1", 16*pg, RegionSpec{GuestAddr: 0, Size: 16 * pg, UserAddr: 1 << 40})
			t1 := tableOf(t, r1)
			acct := NewAccounting(0)
			p := NewPinner(PinConfig{CacheBytes: 8 * pg, Accounting: acct})
			defer p.Close()
			if err := p.SetTable(t1); err != nil {
				t.Fatal(err)
			}
			mr1, mr2 := &owner{"mr1"}, &owner{"mr2"}
			if err := p.PinFor(mr1, t1, 0, 4*pg); err != nil {
				t.Fatalf("pin MR1: %v", err)
			}
			// SET_MEM_TABLE: the session swaps the table, then tells the
			// device; the old table goes once no worker holds it.
			t2 := tc.next(t, r1, file)
			if err := p.SetTable(t2); err != nil {
				t.Fatal(err)
			}
			t1.Release()
			r1.Release()
			checkPinner(t, p)
			if got := p.Stats().PinnedBytes; got != 4*pg {
				t.Errorf("after the table change: got %d bytes pinned, want %d (MR1 keeps its pin)", got, 4*pg)
			}
			if tc.mr2 {
				if err := p.PinFor(mr2, t2, 0, 4*pg); err != nil {
					t.Fatalf("pin MR2: %v", err)
				}
			}
			checkPinner(t, p)
			if got := p.Stats().PinnedBytes; got != tc.pinnedBoth {
				t.Errorf("MR1 and MR2 live: got %d bytes pinned, want %d", got, tc.pinnedBoth)
			}
			if got := tracked(p); got != tc.tracked {
				t.Errorf("MR1 and MR2 live: got %d regions tracked, want %d", got, tc.tracked)
			}
			w.expect("MR1 and MR2 live", tc.pinnedBoth)
			// DEREG_MR MR1.
			p.UnpinOwner(mr1)
			checkPinner(t, p)
			st := p.Stats()
			if st.PinnedBytes != tc.pinnedMR2 {
				t.Errorf("after DEREG_MR MR1: got %d bytes pinned, want %d", st.PinnedBytes, tc.pinnedMR2)
			}
			if tc.mr2 {
				for g := abi.GPA(0); g < 4*pg; g += pg {
					if got := pageCount(t, p, t2, g); got != 1 {
						t.Errorf("MR2's page %#x: got count %d, want 1", uint64(g), got)
					}
				}
				if got := p.OwnerPinned(mr2); got != 4*pg {
					t.Errorf("MR2 names %d bytes, want %d", got, 4*pg)
				}
			}
			if got := st.PinnedBytes + st.CachedBytes; acct.Pinned() != got {
				t.Errorf("accounting says %d bytes, the pinner %d", acct.Pinned(), got)
			}
			if got := tracked(p); tc.tracked == 2 && got != 1 {
				t.Errorf("after DEREG_MR MR1: got %d regions tracked, want 1 (the orphan forgotten)", got)
			}
			// A second DEREG_MR of MR1 (or any unknown owner) does nothing.
			p.UnpinOwner(mr1)
			if got := p.Stats().PinnedBytes; got != tc.pinnedMR2 {
				t.Errorf("after a second DEREG_MR MR1: got %d bytes pinned, want %d", got, tc.pinnedMR2)
			}
			p.UnpinOwner(mr2)
			checkPinner(t, p)
			if got := p.Stats().PinnedBytes; got != 0 {
				t.Errorf("all MRs gone: got %d bytes pinned, want 0", got)
			}
			if got := p.Owners(); got != 0 {
				t.Errorf("all MRs gone: got %d owners, want 0", got)
			}
			p.Close()
			t2.Release()
			w.expect("closed", 0)
			if got := acct.Pinned(); got != 0 {
				t.Errorf("after Close: accounting %d, want 0", got)
			}
			if got := liveMappings.Load(); got != live {
				t.Errorf("after Close: %d mappings live, want %d", got, live)
			}
		})
	}
}

// TestPinOwnerOrphanCache: the cached pages of a region that left the table
// are munlocked at once, and pages an owner releases there are not cached.
func TestPinOwnerOrphanCache(t *testing.T) {
	w := watchLocks(t)
	t1, regions := testTable(t, 16*pg, RegionSpec{GuestAddr: 0, Size: 16 * pg})
	p := NewPinner(PinConfig{CacheBytes: 8 * pg})
	defer p.Close()
	if err := p.SetTable(t1); err != nil {
		t.Fatal(err)
	}
	a, b := &owner{"a"}, &owner{"b"}
	if err := p.PinFor(a, t1, 0, 2*pg); err != nil {
		t.Fatal(err)
	}
	if err := p.PinPagesFor(b, t1, []abi.GPA{8 * pg, 10 * pg, 10 * pg}); err != nil {
		t.Fatal(err)
	}
	if got, want := p.OwnerPinned(b), uint64(3*pg); got != want {
		t.Errorf("b names %d bytes, want %d", got, want)
	}
	p.UnpinOwner(b)
	wantStats(t, p, PinStats{PinnedBytes: 2 * pg, CachedBytes: 2 * pg, CacheMisses: 4})
	w.expect("b cached", 4*pg)
	if err := p.SetTable(EmptyTable()); err != nil {
		t.Fatal(err)
	}
	checkPinner(t, p)
	wantStats(t, p, PinStats{PinnedBytes: 2 * pg, CacheMisses: 4})
	w.expect("orphaned", 2*pg)
	refs := regions[0].refs.Load()
	p.UnpinOwner(a)
	checkPinner(t, p)
	wantStats(t, p, PinStats{CacheMisses: 4})
	w.expect("a gone", 0)
	if got := regions[0].refs.Load(); got != refs-1 {
		t.Errorf("got %d references on the forgotten orphan, want %d", got, refs-1)
	}
}

// TestPinOwnerPinAll: with pin=all, a table change drops the old regions'
// whole-region pins but not the pins live objects hold there.
func TestPinOwnerPinAll(t *testing.T) {
	w := watchLocks(t)
	t1, _ := testTable(t, 16*pg, RegionSpec{GuestAddr: 0, Size: 16 * pg})
	t2, _ := testTable(t, 8*pg, RegionSpec{GuestAddr: 0, Size: 8 * pg})
	acct := NewAccounting(0)
	p := NewPinner(PinConfig{All: true, CacheBytes: 4 * pg, Accounting: acct})
	defer p.Close()
	steps := []struct {
		name   string
		do     func() error
		pinned uint64
	}{
		{"pin=all T1", func() error { return p.SetTable(t1) }, 16 * pg},
		{"MR on T1", func() error { return p.PinFor("mr", t1, 4*pg, 4*pg) }, 16 * pg},
		{"switch to T2", func() error { return p.SetTable(t2) }, 8*pg + 4*pg},
		{"MR on T2", func() error { return p.PinFor("mr2", t2, 0, 2*pg) }, 8*pg + 4*pg},
		{"DEREG_MR the T1 MR", func() error { p.UnpinOwner("mr"); return nil }, 8 * pg},
		{"DEREG_MR the T2 MR", func() error { p.UnpinOwner("mr2"); return nil }, 8 * pg},
		{"back to T1", func() error { return p.SetTable(t1) }, 16 * pg},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		checkPinner(t, p)
		st := p.Stats()
		if st.PinnedBytes != s.pinned || st.CachedBytes != 0 {
			t.Errorf("%s: got %d bytes pinned, %d cached, want %d and 0", s.name, st.PinnedBytes, st.CachedBytes, s.pinned)
		}
		if got := acct.Pinned(); got != s.pinned {
			t.Errorf("%s: got accounting %d, want %d", s.name, got, s.pinned)
		}
		w.expect(s.name, s.pinned)
	}
	p.Close()
	w.expect("closed", 0)
}

// TestPinOwnerOrphanBound: a front-end that switches tables over and over
// while its objects pin each one cannot make the daemon keep more than
// maxTracked mappings; the pin that would is refused, and everything is
// released once the objects go.
func TestPinOwnerOrphanBound(t *testing.T) {
	needMlock(t, 1<<20)
	live := liveMappings.Load()
	p := NewPinner(PinConfig{})
	defer p.Close()
	var owners []*owner
	refused := false
	for i := 0; i <= maxTracked && !refused; i++ {
		r := mapNew(t, "churn", pg, RegionSpec{GuestAddr: 0, Size: pg})
		tab := tableOf(t, r)
		r.Release()
		if err := p.SetTable(tab); err != nil {
			t.Fatal(err)
		}
		o := &owner{}
		switch err := p.PinFor(o, tab, 0, pg); {
		case errors.Is(err, ErrTooManyRegions):
			refused = true
			if i != maxTracked {
				t.Errorf("refused at table %d, want %d", i, maxTracked)
			}
		case err != nil:
			t.Fatal(err)
		default:
			owners = append(owners, o)
		}
		tab.Release()
	}
	if !refused {
		t.Fatalf("%d tables pinned, want a refusal after %d", maxTracked+1, maxTracked)
	}
	if got := p.Stats().PinnedBytes; got != uint64(len(owners))*pg {
		t.Errorf("got %d bytes pinned, want %d", got, uint64(len(owners))*pg)
	}
	for _, o := range owners {
		p.UnpinOwner(o)
	}
	checkPinner(t, p)
	if got := tracked(p); got != 0 {
		t.Errorf("all objects gone: got %d regions tracked, want 0", got)
	}
	p.Close()
	if got := liveMappings.Load(); got != live {
		t.Errorf("after Close: %d mappings live, want %d", got, live)
	}
}

// TestPinOwnerErrors: a failed pin leaves the owner's earlier pins alone;
// nil owners and closed pinners are refused.
func TestPinOwnerErrors(t *testing.T) {
	needMlock(t, 1<<20)
	tab, _ := testTable(t, 8*pg, RegionSpec{GuestAddr: 0, Size: 8 * pg})
	p := NewPinner(PinConfig{MaxPinned: 4 * pg})
	o := &owner{}
	if err := p.PinFor(o, tab, 0, 2*pg); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"quota", p.PinFor(o, tab, 2*pg, 4*pg), ErrQuota},
		{"not mapped", p.PinFor(o, tab, 8*pg, pg), ErrNotMapped},
		{"unaligned page", p.PinPagesFor(o, tab, []abi.GPA{pg + 1}), ErrUnaligned},
		{"nil owner", p.PinFor(nil, tab, 0, pg), ErrBadRegion},
	}
	for _, tc := range tests {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	if got := p.OwnerPinned(o); got != 2*pg {
		t.Errorf("after failed pins: owner names %d bytes, want %d", got, 2*pg)
	}
	checkPinner(t, p)
	p.Close()
	if err := p.PinFor(o, tab, 0, pg); !errors.Is(err, ErrClosed) {
		t.Errorf("PinFor after Close: got %v, want ErrClosed", err)
	}
	p.UnpinOwner(o) // does nothing
}
