package memmap

import (
	"encoding/binary"
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// fuzzReader decodes fuzz input; reads past the end return zeros.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) empty() bool { return len(r.b) == 0 }

func (r *fuzzReader) u8() uint8 {
	if len(r.b) == 0 {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *fuzzReader) u16() uint16 { return uint16(r.u8()) | uint16(r.u8())<<8 }

func (r *fuzzReader) u64() uint64 {
	var buf [8]byte
	n := copy(buf[:], r.b)
	r.b = r.b[n:]
	return binary.LittleEndian.Uint64(buf[:])
}

// modelFind returns the index of the spec holding addr in the given space,
// by linear scan, or -1.
func modelFind(specs []RegionSpec, user bool, addr uint64) int {
	for i, s := range specs {
		start := uint64(s.GuestAddr)
		if user {
			start = uint64(s.UserAddr)
		}
		if addr >= start && addr-start < s.Size {
			return i
		}
	}
	return -1
}

// fuzzFileSizes are the sizes of the memfds the fuzz target maps.
var fuzzFileSizes = [...]uint64{0x1000, 0x3000, 0x2000}

// FuzzTable decodes region specs and lookups, maps the regions over small
// memfds, builds tables with NewTable and With/Without, and checks every
// translation against a linear-scan model: a successful Slice lies exactly
// where the model says inside a mapped region, an error comes with a nil
// slice, and nothing leaks.
func FuzzTable(f *testing.F) {
	// One valid input: two GPA-adjacent regions and a few lookups.
	seed := []byte{
		2,                      // regions
		0x00,                   // mode: file 0, absolute addresses
		0, 0, 1, 0, 0, 0, 0, 0, // gpa 0x10000
		0, 0, 0, 0, 0, 0x7f, 0, 0, // uva 0x7f0000000000
		0x00, 0x10, // size 0x1000
		0x0d, // mode: file 1, adjacent gpa, adjacent uva
		0, 0, // deltas
		0x00, 0x20, // size 0x2000
		0x00,             // table build mode
		0, 0, 0x10, 0x10, // query: region 0, delta 0x10, n 0x10
		0, 0, 0xf0, 0x40, // query: region 0, delta 0xf0 (near end), n crossing
		1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, // query: absolute near 2^64
	}
	f.Add(seed)

	var fds [len(fuzzFileSizes)]int
	for i, size := range fuzzFileSizes {
		fd, err := NewMemfd("fuzz", size)
		if err != nil {
			f.Fatal(err)
		}
		fds[i] = fd
	}

	f.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})

	f.Fuzz(func(t *testing.T, data []byte) {
		live := liveMappings.Load()
		fdsBefore := countFDs(t)
		defer func() {
			if got := liveMappings.Load(); got != live {
				t.Errorf("liveMappings = %d, want %d (leak)", got, live)
			}
			if got := countFDs(t); got != fdsBefore {
				t.Errorf("got %d fds, want %d (leak)", got, fdsBefore)
			}
		}()
		r := &fuzzReader{b: data}

		// Regions.
		var regions []*Region
		defer func() {
			for _, rg := range regions {
				rg.Release()
			}
		}()
		var prev RegionSpec
		nRegions := int(r.u8() % (MaxRegions + 4))
		for range nRegions {
			mode := r.u8()
			file := int(mode) % len(fds)
			var s RegionSpec
			if mode&4 != 0 {
				s.GuestAddr = prev.GuestAddr + abi.GPA(prev.Size) + abi.GPA(r.u8())*0x100
			} else {
				s.GuestAddr = abi.GPA(r.u64())
			}
			if mode&8 != 0 {
				s.UserAddr = prev.UserAddr + UVA(prev.Size) + UVA(r.u8())*0x100
			} else {
				s.UserAddr = UVA(r.u64())
			}
			s.Size = uint64(r.u16())
			switch {
			case mode&0x20 != 0:
				s.MmapOffset = r.u64()
			case mode&0x10 != 0:
				s.MmapOffset = uint64(r.u16())
			}
			_, okG := s.GuestAddr.Add(s.Size)
			_, okU := s.UserAddr.Add(s.Size)
			end, okO := add(s.MmapOffset, s.Size)
			valid := s.Size != 0 && okG && okU && okO && end <= fuzzFileSizes[file]

			rg, err := MapRegion(dupFD(t, fds[file]), s)
			if (err == nil) != valid {
				t.Fatalf("MapRegion(%+v) on %#x-byte file: error %v, want valid=%v", s, fuzzFileSizes[file], err, valid)
			}
			if err != nil {
				if rg != nil {
					t.Fatalf("MapRegion returned a region with error %v", err)
				}
				continue
			}
			if uint64(len(rg.Bytes())) != s.Size || rg.Spec() != s {
				t.Fatalf("region has %d bytes and spec %+v, want %d and %+v", len(rg.Bytes()), rg.Spec(), s.Size, s)
			}
			regions = append(regions, rg)
			prev = s
		}

		// Tables: NewTable over everything, and With one by one.
		overlaps := false
		for i := range regions {
			for j := range i {
				a, b := regions[i].spec, regions[j].spec
				if a.GuestAddr < b.GuestAddr+abi.GPA(b.Size) && b.GuestAddr < a.GuestAddr+abi.GPA(a.Size) ||
					a.UserAddr < b.UserAddr+UVA(b.Size) && b.UserAddr < a.UserAddr+UVA(a.Size) {
					overlaps = true
				}
			}
		}
		all, err := NewTable(regions)
		if wantOK := !overlaps && len(regions) <= MaxRegions; (err == nil) != wantOK {
			t.Fatalf("NewTable(%d regions, overlap %v): error %v, want ok=%v", len(regions), overlaps, err, wantOK)
		}
		if err == nil {
			if all.Len() != len(regions) {
				t.Fatalf("NewTable Len() = %d, want %d", all.Len(), len(regions))
			}
			all.Release()
		} else if all != nil {
			t.Fatal("NewTable returned a table with an error")
		}

		tb := EmptyTable()
		defer func() { tb.Release() }()
		buildMode := r.u8()
		for i, rg := range regions {
			if buildMode&1 != 0 && i%2 == 1 {
				continue
			}
			nt, err := tb.With(rg)
			if err != nil {
				if nt != nil {
					t.Fatal("With returned a table with an error")
				}
				if !errors.Is(err, ErrOverlap) && !errors.Is(err, ErrTooManyRegions) {
					t.Fatalf("With: unexpected error %v", err)
				}
				continue
			}
			tb.Release()
			tb = nt
		}
		if buildMode&2 != 0 && tb.Len() > 0 {
			victim := tb.Regions()[int(buildMode>>2)%tb.Len()]
			nt, err := tb.Without(victim)
			if err != nil {
				t.Fatalf("Without(%+v) of a present region: %v", victim, err)
			}
			if nt.Len() != tb.Len()-1 {
				t.Fatalf("Without: Len() = %d, want %d", nt.Len(), tb.Len()-1)
			}
			tb.Release()
			tb = nt
		}
		specs := tb.Regions()
		byGPA := make(map[abi.GPA]*Region) // of the regions in tb: their GPAs are unique
		for _, rg := range tb.regions {
			byGPA[rg.spec.GuestAddr] = rg
		}

		// Lookups.
		for q := 0; q < 64 && !r.empty(); q++ {
			kind := r.u8()
			var addr, n uint64
			if kind&1 == 0 && len(specs) > 0 {
				s := specs[int(r.u8())%len(specs)]
				base := uint64(s.GuestAddr)
				if kind&2 != 0 {
					base = uint64(s.UserAddr)
				}
				addr = base + uint64(r.u8())*0x10 - 0x80 // may wrap: that is a lookup too
			} else {
				addr = r.u64()
			}
			if kind&4 != 0 {
				n = r.u64()
			} else {
				n = uint64(r.u16())
			}
			user := kind&2 != 0
			checkLookup(t, tb, specs, byGPA, user, addr, n)
		}
	})
}

// checkLookup compares Slice/SliceUser, ForEach and UserToGuest with the
// linear-scan model.
func checkLookup(t *testing.T, tb *Table, specs []RegionSpec, byGPA map[abi.GPA]*Region, user bool, addr, n uint64) {
	t.Helper()
	var (
		b   []byte
		err error
	)
	if user {
		b, err = tb.SliceUser(UVA(addr), n)
	} else {
		b, err = tb.Slice(abi.GPA(addr), n)
	}
	if err != nil && b != nil {
		t.Fatalf("lookup %#x+%#x: error %v with %d bytes, want nil", addr, n, err, len(b))
	}
	end, noOverflow := add(addr, n)
	i := modelFind(specs, user, addr)
	var want error
	switch {
	case n == 0:
	case !noOverflow:
		want = ErrOverflow
	case i < 0:
		want = ErrNotMapped
	default:
		s := specs[i]
		start := uint64(s.GuestAddr)
		if user {
			start = uint64(s.UserAddr)
		}
		if end-start > s.Size {
			want = ErrCrossesRegion
		}
	}
	if !errors.Is(err, want) || (err == nil) != (want == nil) {
		t.Fatalf("lookup user=%v %#x+%#x: error %v, want %v", user, addr, n, err, want)
	}
	if err == nil && n > 0 {
		s := specs[i]
		start := uint64(s.GuestAddr)
		if user {
			start = uint64(s.UserAddr)
		}
		mem := byGPA[s.GuestAddr].Bytes()
		off := addr - start
		if uint64(len(b)) != n || uint64(cap(b)) != n || &b[0] != &mem[off] {
			t.Fatalf("lookup %#x+%#x: got len %d cap %d at %p, want region %#x+%#x at %p",
				addr, n, len(b), cap(b), &b[0], s.GuestAddr, off, &mem[off])
		}
		b[0], b[n-1] = 1, 2 // must be writable mapped memory
	}
	if n == 0 && b != nil {
		t.Fatalf("lookup with n == 0 returned %d bytes, want nil", len(b))
	}

	if user {
		g, ok := tb.UserToGuest(UVA(addr))
		if j := modelFind(specs, true, addr); (j >= 0) != ok ||
			ok && uint64(g) != uint64(specs[j].GuestAddr)+addr-uint64(specs[j].UserAddr) {
			t.Fatalf("UserToGuest(%#x) = %#x, %v; model says region %d", addr, g, ok, j)
		}
		return
	}

	// ForEach: pieces must be consecutive, each inside the region the model
	// finds, and add up to n; an error means no piece was delivered.
	var pieces [][]byte
	ferr := tb.ForEach(abi.GPA(addr), n, func(p []byte) error {
		pieces = append(pieces, p)
		return nil
	})
	if len(pieces) > len(specs) {
		t.Fatalf("ForEach: %d pieces for %d regions", len(pieces), len(specs))
	}
	if ferr != nil {
		if len(pieces) != 0 {
			t.Fatalf("ForEach error %v after %d pieces, want none", ferr, len(pieces))
		}
		if err == nil && n > 0 {
			t.Fatalf("ForEach(%#x+%#x) = %v, but Slice succeeded", addr, n, ferr)
		}
		if !errors.Is(ferr, ErrNotMapped) && !errors.Is(ferr, ErrOverflow) {
			t.Fatalf("ForEach: unexpected error %v", ferr)
		}
		if noOverflow && modelCovers(specs, addr, end) {
			t.Fatalf("ForEach(%#x+%#x) = %v, but the model covers the range", addr, n, ferr)
		}
		return
	}
	a := addr
	for k, p := range pieces {
		j := modelFind(specs, false, a)
		if j < 0 {
			t.Fatalf("ForEach piece %d at %#x: not in any region", k, a)
		}
		s := specs[j]
		off := a - uint64(s.GuestAddr)
		mem := byGPA[s.GuestAddr].Bytes()
		if len(p) == 0 || uint64(len(p)) > s.Size-off || cap(p) != len(p) || &p[0] != &mem[off] {
			t.Fatalf("ForEach piece %d: %d bytes at %p, want inside region %#x at offset %#x", k, len(p), &p[0], s.GuestAddr, off)
		}
		a += uint64(len(p))
	}
	if a-addr != n {
		t.Fatalf("ForEach pieces cover %#x bytes, want %#x", a-addr, n)
	}
}

// modelCovers reports whether GPA-adjacent specs cover [addr, end) whole.
func modelCovers(specs []RegionSpec, addr, end uint64) bool {
	for range len(specs) + 1 {
		if addr >= end {
			return true
		}
		j := modelFind(specs, false, addr)
		if j < 0 {
			return false
		}
		addr = uint64(specs[j].GuestAddr) + specs[j].Size
	}
	return addr >= end
}
