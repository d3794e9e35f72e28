package memmap

import (
	"errors"
	"math"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Layout of the translation tests: a and b are adjacent in guest-physical
// space (not in user space), c sits after a gap, top ends 0x1000 below 2^64.
const (
	gpaA, sizeA = 0x10000, 0x2000
	gpaB, sizeB = 0x12000, 0x1000
	gpaC, sizeC = 0x20000, 0x1000
	gpaTop      = math.MaxUint64 - 0x1fff
	sizeTop     = 0x1000
	uvaA        = 0x7f00_0000_0000
	uvaB        = 0x7f00_1000_0000
	uvaC        = 0x7f00_0000_2000 // adjacent to a in user space
	uvaTop      = math.MaxUint64 - 0x1fff
)

type fixture struct {
	regions map[string]*Region
	table   *Table
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{regions: map[string]*Region{
		"a":   mapNew(t, "a", sizeA, RegionSpec{GuestAddr: gpaA, Size: sizeA, UserAddr: uvaA}),
		"b":   mapNew(t, "b", sizeB, RegionSpec{GuestAddr: gpaB, Size: sizeB, UserAddr: uvaB}),
		"c":   mapNew(t, "c", sizeC, RegionSpec{GuestAddr: gpaC, Size: sizeC, UserAddr: uvaC}),
		"top": mapNew(t, "top", sizeTop, RegionSpec{GuestAddr: gpaTop, Size: sizeTop, UserAddr: uvaTop}),
	}}
	// Deliberately unsorted.
	tb, err := NewTable([]*Region{f.regions["top"], f.regions["c"], f.regions["a"], f.regions["b"]})
	if err != nil {
		t.Fatalf("NewTable: %v", err)
	}
	f.table = tb
	for _, r := range f.regions {
		r.Release() // the table keeps them
	}
	t.Cleanup(tb.Release)
	return f
}

func TestSlice(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		name   string
		gpa    uint64
		n      uint64
		region string // "" for nil result
		off    uint64
		want   error
	}{
		{"start of a", gpaA, 8, "a", 0, nil},
		{"inside a", gpaA + 0x100, 0x100, "a", 0x100, nil},
		{"whole a", gpaA, sizeA, "a", 0, nil},
		{"exactly at end of a", gpaA + sizeA - 4, 4, "a", sizeA - 4, nil},
		{"one past end of a", gpaA + sizeA - 4, 5, "", 0, ErrCrossesRegion},
		{"crossing a and b", gpaA + sizeA - 1, 2, "", 0, ErrCrossesRegion},
		{"start of b", gpaB, 1, "b", 0, nil},
		{"end of b into gap", gpaB + sizeB - 1, 2, "", 0, ErrCrossesRegion},
		{"gap after b", gpaB + sizeB, 1, "", 0, ErrNotMapped},
		{"before first", gpaA - 1, 1, "", 0, ErrNotMapped},
		{"below first, reaching in", gpaA - 1, 2, "", 0, ErrNotMapped},
		{"address zero", 0, 1, "", 0, ErrNotMapped},
		{"last byte of c", gpaC + sizeC - 1, 1, "c", sizeC - 1, nil},
		{"one past c", gpaC + sizeC, 1, "", 0, ErrNotMapped},
		{"n zero", gpaA, 0, "", 0, nil},
		{"n zero unmapped", 0, 0, "", 0, nil},
		{"n zero at max", math.MaxUint64, 0, "", 0, nil},
		{"top region", gpaTop, sizeTop, "top", 0, nil},
		{"past top region", gpaTop + sizeTop, 1, "", 0, ErrNotMapped},
		{"top crossing end", gpaTop + 1, sizeTop, "", 0, ErrCrossesRegion},
		{"overflow near 2^64", math.MaxUint64 - 1, 2, "", 0, ErrOverflow},
		{"overflow last byte", math.MaxUint64, 1, "", 0, ErrOverflow},
		{"overflow huge n", gpaA, math.MaxUint64, "", 0, ErrOverflow},
		{"huge n in range arithmetic", gpaA, math.MaxUint64 - gpaA, "", 0, ErrCrossesRegion},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := f.table.Slice(abi.GPA(tt.gpa), tt.n)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("Slice(%#x, %#x) error = %v, want %v", tt.gpa, tt.n, err, tt.want)
			}
			if err != nil {
				var re *RangeError
				if !errors.As(err, &re) || re.Space != SpaceGuest || re.Addr != tt.gpa || re.Len != tt.n {
					t.Errorf("got error %#v, want *RangeError{%s, %#x, %#x}", err, SpaceGuest, tt.gpa, tt.n)
				}
			}
			if tt.region == "" {
				if b != nil {
					t.Fatalf("got %d bytes, want nil", len(b))
				}
				return
			}
			want := f.regions[tt.region].Bytes()[tt.off:]
			if uint64(len(b)) != tt.n || uint64(cap(b)) != tt.n {
				t.Fatalf("got len %#x cap %#x, want both %#x", len(b), cap(b), tt.n)
			}
			if &b[0] != &want[0] {
				t.Errorf("got bytes at %p, want %s+%#x at %p", &b[0], tt.region, tt.off, &want[0])
			}
		})
	}
}

func TestSliceUser(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		name   string
		uva    uint64
		n      uint64
		region string
		off    uint64
		want   error
	}{
		{"inside a", uvaA + 0x10, 0x10, "a", 0x10, nil},
		{"exactly at end of a", uvaA + sizeA - 1, 1, "a", sizeA - 1, nil},
		{"crossing a and c (adjacent in user space)", uvaA + sizeA - 1, 2, "", 0, ErrCrossesRegion},
		{"start of c", uvaC, sizeC, "c", 0, nil},
		{"b", uvaB + 0xfff, 1, "b", 0xfff, nil},
		{"gap", uvaB - 1, 1, "", 0, ErrNotMapped},
		{"top last byte", uvaTop + sizeTop - 1, 1, "top", sizeTop - 1, nil},
		{"past top", uvaTop + sizeTop, 1, "", 0, ErrNotMapped},
		{"overflow", math.MaxUint64 - 1, 2, "", 0, ErrOverflow},
		{"guest address is not user", gpaA, 1, "", 0, ErrNotMapped},
		{"n zero", 0, 0, "", 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := f.table.SliceUser(UVA(tt.uva), tt.n)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("SliceUser(%#x, %#x) error = %v, want %v", tt.uva, tt.n, err, tt.want)
			}
			var re *RangeError
			if err != nil && (!errors.As(err, &re) || re.Space != SpaceUser) {
				t.Errorf("got error %#v, want *RangeError in %s space", err, SpaceUser)
			}
			if tt.region == "" {
				if b != nil {
					t.Fatalf("got %d bytes, want nil", len(b))
				}
				return
			}
			want := f.regions[tt.region].Bytes()[tt.off:]
			if uint64(len(b)) != tt.n || &b[0] != &want[0] {
				t.Errorf("got %d bytes at %p, want %d at %s+%#x", len(b), &b[0], tt.n, tt.region, tt.off)
			}
		})
	}
}

func TestForEach(t *testing.T) {
	f := newFixture(t)
	type piece struct {
		region string
		off, n uint64
	}
	tests := []struct {
		name   string
		gpa, n uint64
		pieces []piece
		want   error
	}{
		{"inside a", gpaA + 1, 2, []piece{{"a", 1, 2}}, nil},
		{"across a and b", gpaA + sizeA - 3, 5, []piece{{"a", sizeA - 3, 3}, {"b", 0, 2}}, nil},
		{"all of a and b", gpaA, sizeA + sizeB, []piece{{"a", 0, sizeA}, {"b", 0, sizeB}}, nil},
		{"a, b and into gap", gpaA, sizeA + sizeB + 1, nil, ErrNotMapped},
		{"gap", gpaB + sizeB, 1, nil, ErrNotMapped},
		{"n zero", 0, 0, nil, nil},
		{"overflow", gpaTop, math.MaxUint64, nil, ErrOverflow},
		{"top to end", gpaTop, sizeTop + 1, nil, ErrNotMapped},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got [][]byte
			err := f.table.ForEach(abi.GPA(tt.gpa), tt.n, func(b []byte) error {
				got = append(got, b)
				return nil
			})
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("ForEach(%#x, %#x) error = %v, want %v", tt.gpa, tt.n, err, tt.want)
			}
			if err != nil && len(got) != 0 {
				t.Fatalf("fn called %d times before error, want 0", len(got))
			}
			if len(got) != len(tt.pieces) {
				t.Fatalf("got %d pieces, want %d", len(got), len(tt.pieces))
			}
			for i, p := range tt.pieces {
				want := f.regions[p.region].Bytes()[p.off:]
				if uint64(len(got[i])) != p.n || uint64(cap(got[i])) != p.n || &got[i][0] != &want[0] {
					t.Errorf("piece %d: got len %d cap %d at %p, want %d bytes at %s+%#x",
						i, len(got[i]), cap(got[i]), &got[i][0], p.n, p.region, p.off)
				}
			}
		})
	}
	t.Run("gap address", func(t *testing.T) {
		err := f.table.ForEach(gpaA, 0x10000, func([]byte) error { return nil })
		var re *RangeError
		if !errors.As(err, &re) || re.Addr != gpaB+sizeB || !errors.Is(err, ErrNotMapped) {
			t.Errorf("got %v, want ErrNotMapped at %#x", err, gpaB+sizeB)
		}
	})
	t.Run("fn error stops", func(t *testing.T) {
		stop := errors.New("stop")
		calls := 0
		err := f.table.ForEach(gpaA, sizeA+sizeB, func([]byte) error { calls++; return stop })
		if err != stop || calls != 1 {
			t.Errorf("got %v after %d calls, want stop after 1", err, calls)
		}
	})
}

func TestUserToGuest(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		uva  uint64
		gpa  uint64
		okay bool
	}{
		{uvaA, gpaA, true},
		{uvaA + sizeA - 1, gpaA + sizeA - 1, true},
		{uvaC, gpaC, true},
		{uvaB + 5, gpaB + 5, true},
		{uvaB + sizeB, 0, false},
		{uvaTop + sizeTop - 1, gpaTop + sizeTop - 1, true},
		{math.MaxUint64, 0, false},
		{0, 0, false},
	}
	for _, tt := range tests {
		got, ok := f.table.UserToGuest(UVA(tt.uva))
		if uint64(got) != tt.gpa || ok != tt.okay {
			t.Errorf("UserToGuest(%#x) = %#x, %v; want %#x, %v", tt.uva, got, ok, tt.gpa, tt.okay)
		}
	}
}

func TestTableEdits(t *testing.T) {
	f := newFixture(t)
	tb := f.table
	if got := tb.Len(); got != 4 {
		t.Fatalf("Len() = %d, want 4", got)
	}
	specs := tb.Regions()
	for i := 1; i < len(specs); i++ {
		if specs[i-1].GuestAddr >= specs[i].GuestAddr {
			t.Errorf("Regions() not sorted by GuestAddr: %+v", specs)
		}
	}

	tests := []struct {
		name string
		spec RegionSpec
		want error
	}{
		{"gpa overlap", RegionSpec{GuestAddr: gpaB + sizeB - 1, Size: 0x1000, UserAddr: 0x1000}, ErrOverlap},
		{"gpa contains", RegionSpec{GuestAddr: gpaA - 0x1000, Size: 0x10000, UserAddr: 0x1000}, ErrOverlap},
		{"uva overlap", RegionSpec{GuestAddr: 0x40000, Size: 0x1000, UserAddr: uvaC + sizeC - 1}, ErrOverlap},
		{"adjacent both", RegionSpec{GuestAddr: gpaC + sizeC, Size: 0x1000, UserAddr: uvaC + sizeC}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mapNew(t, "edit", tt.spec.Size, tt.spec)
			defer r.Release()
			nt, err := tb.With(r)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("With(%+v) error = %v, want %v", tt.spec, err, tt.want)
			}
			if err != nil {
				if nt != nil {
					t.Error("got a table with the error, want nil")
				}
				return
			}
			defer nt.Release()
			if nt.Len() != 5 || tb.Len() != 4 {
				t.Errorf("Len() = %d, old %d; want 5, 4", nt.Len(), tb.Len())
			}
			if _, err := nt.Slice(tt.spec.GuestAddr, tt.spec.Size); err != nil {
				t.Errorf("new region not translated: %v", err)
			}
			if _, err := tb.Slice(tt.spec.GuestAddr, 1); !errors.Is(err, ErrNotMapped) {
				t.Errorf("old table changed: got %v, want ErrNotMapped", err)
			}
			back, err := nt.Without(RegionSpec{GuestAddr: tt.spec.GuestAddr, Size: tt.spec.Size, UserAddr: tt.spec.UserAddr, MmapOffset: 99})
			if err != nil {
				t.Fatalf("Without: %v", err)
			}
			defer back.Release()
			if back.Len() != 4 {
				t.Errorf("Len() after Without = %d, want 4", back.Len())
			}
		})
	}

	t.Run("Without no match", func(t *testing.T) {
		for _, s := range []RegionSpec{
			{GuestAddr: gpaA, Size: sizeA, UserAddr: uvaA + 1},
			{GuestAddr: gpaA, Size: sizeA - 1, UserAddr: uvaA},
			{GuestAddr: gpaA + 1, Size: sizeA, UserAddr: uvaA},
		} {
			nt, err := tb.Without(s)
			if !errors.Is(err, ErrNotMapped) || nt != nil {
				t.Errorf("Without(%+v) = %v, %v; want nil, ErrNotMapped", s, nt, err)
			}
		}
	})

	t.Run("too many", func(t *testing.T) {
		r := mapNew(t, "many", 0x1000, RegionSpec{Size: 0x1000})
		defer r.Release()
		rs := make([]*Region, MaxRegions+1)
		for i := range rs {
			rs[i] = r
		}
		if _, err := NewTable(rs); !errors.Is(err, ErrTooManyRegions) {
			t.Errorf("NewTable(%d regions): got %v, want ErrTooManyRegions", len(rs), err)
		}
		cur := EmptyTable()
		for i := range MaxRegions {
			ri := mapNew(t, "many", 0x1000, RegionSpec{GuestAddr: abi.GPA(0x1000 * (i + 1)), Size: 0x1000, UserAddr: UVA(0x1000 * (i + 1))})
			nt, err := cur.With(ri)
			ri.Release()
			if err != nil {
				t.Fatalf("With region %d: %v", i, err)
			}
			cur.Release()
			cur = nt
		}
		defer cur.Release()
		if _, err := cur.With(r); !errors.Is(err, ErrTooManyRegions) {
			t.Errorf("With on a full table: got %v, want ErrTooManyRegions", err)
		}
	})

	t.Run("same region twice", func(t *testing.T) {
		r := f.regions["a"]
		if _, err := NewTable([]*Region{r, r}); !errors.Is(err, ErrOverlap) {
			t.Errorf("got %v, want ErrOverlap", err)
		}
	})
	t.Run("nil and released", func(t *testing.T) {
		if _, err := NewTable([]*Region{nil}); !errors.Is(err, ErrBadRegion) {
			t.Errorf("nil region: got %v, want ErrBadRegion", err)
		}
		if _, err := tb.With(nil); !errors.Is(err, ErrBadRegion) {
			t.Errorf("With(nil): got %v, want ErrBadRegion", err)
		}
		live := mapNew(t, "live", 0x1000, RegionSpec{GuestAddr: 0x1000, Size: 0x1000})
		defer live.Release()
		dead := mapNew(t, "dead", 0x1000, RegionSpec{GuestAddr: 0x2000, Size: 0x1000, UserAddr: 0x1000})
		dead.Release()
		if _, err := NewTable([]*Region{live, dead}); !errors.Is(err, ErrBadRegion) {
			t.Errorf("released region: got %v, want ErrBadRegion", err)
		}
		if got := live.refs.Load(); got != 1 {
			t.Errorf("live region has %d refs after failed NewTable, want 1", got)
		}
	})
}

func TestSliceAllocs(t *testing.T) {
	f := newFixture(t)
	n := testing.AllocsPerRun(100, func() {
		_, _ = f.table.Slice(gpaA+8, 8)
		_, _ = f.table.SliceUser(uvaB, 8)
		_, _ = f.table.UserToGuest(uvaC)
	})
	if n != 0 {
		t.Errorf("got %v allocations per lookup, want 0", n)
	}
}
