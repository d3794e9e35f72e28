package frontend

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// check verifies the allocator's invariants: free extents sorted,
// non-empty, page-aligned, coalesced, inside the arena, disjoint from every
// live allocation, and free+live covering the arena exactly.
func (a *allocator) check(t testing.TB, start, end uint64) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	var total uint64
	for i, e := range a.free {
		if e.start >= e.end || e.start%allocPage != 0 || e.end%allocPage != 0 || e.start < start || e.end > end {
			t.Fatalf("bad free extent %d: [%#x, %#x)", i, e.start, e.end)
		}
		if i > 0 && a.free[i-1].end >= e.start {
			t.Fatalf("free extents %d and %d touch or overlap: %v", i-1, i, a.free)
		}
		total += e.end - e.start
		for s, n := range a.live {
			if s < e.end && e.start < s+n {
				t.Fatalf("live [%#x, +%#x) overlaps free [%#x, %#x)", s, n, e.start, e.end)
			}
		}
	}
	var used uint64
	for _, n := range a.live {
		used += n
	}
	if used != a.used {
		t.Fatalf("used: got %d, want %d", a.used, used)
	}
	if total+used != end-start {
		t.Fatalf("free %d + live %d != arena %d", total, used, end-start)
	}
}

func TestAllocator(t *testing.T) {
	const start, end = 4096, 1 << 20 // 255 pages
	tests := []struct {
		name string
		run  func(t *testing.T, a *allocator)
	}{
		{"alignment", func(t *testing.T, a *allocator) {
			for _, align := range []uint64{1, 2, 8, 4096, 8192, 64 << 10} {
				s, err := a.alloc(100, align)
				if err != nil {
					t.Fatal(err)
				}
				if s%max(align, allocPage) != 0 {
					t.Errorf("align %d: got %#x", align, s)
				}
			}
			if _, err := a.alloc(1, 3); err == nil {
				t.Error("alignment 3 accepted")
			}
			if _, err := a.alloc(1, 0); err == nil {
				t.Error("alignment 0 accepted")
			}
		}},
		{"exhaustion", func(t *testing.T, a *allocator) {
			var got []uint64
			for {
				s, err := a.alloc(1, 1)
				if err != nil {
					if !errors.Is(err, ErrNoMemory) {
						t.Fatalf("got %v, want ErrNoMemory", err)
					}
					break
				}
				got = append(got, s)
			}
			if len(got) != (end-start)/allocPage {
				t.Fatalf("got %d pages, want %d", len(got), (end-start)/allocPage)
			}
			if _, err := a.alloc(0, 1); !errors.Is(err, ErrNoMemory) {
				t.Errorf("zero bytes: got %v", err)
			}
			if _, err := a.alloc(^uint64(0), 1); !errors.Is(err, ErrNoMemory) {
				t.Errorf("2^64-1 bytes: got %v", err)
			}
			if _, err := a.release(got[7]); err != nil {
				t.Fatal(err)
			}
			if s, err := a.alloc(10, 1); err != nil || s != got[7] {
				t.Errorf("after a free: got %#x, %v, want %#x", s, err, got[7])
			}
		}},
		{"coalesce", func(t *testing.T, a *allocator) {
			x, _ := a.alloc(3*allocPage, 1)
			y, _ := a.alloc(2*allocPage, 1)
			z, _ := a.alloc(1*allocPage, 1)
			for _, s := range []uint64{x, z, y} { // free the middle one last
				if _, err := a.release(s); err != nil {
					t.Fatal(err)
				}
				a.check(t, start, end)
			}
			if _, n := a.stats(); n != 1 {
				t.Errorf("got %d free extents, want 1", n)
			}
			// The whole arena is one block again.
			if s, err := a.alloc(end-start, 1); err != nil || s != start {
				t.Errorf("whole arena: got %#x, %v", s, err)
			}
		}},
		{"bad free", func(t *testing.T, a *allocator) {
			s, _ := a.alloc(2*allocPage, 1)
			for _, bad := range []uint64{0, s + allocPage, end, s + 1} {
				if _, err := a.release(bad); !errors.Is(err, ErrBadFree) {
					t.Errorf("free %#x: got %v, want ErrBadFree", bad, err)
				}
			}
			if n, err := a.release(s); err != nil || n != 2*allocPage {
				t.Fatalf("got %d, %v", n, err)
			}
			if _, err := a.release(s); !errors.Is(err, ErrBadFree) {
				t.Errorf("double free: got %v, want ErrBadFree", err)
			}
		}},
		{"first fit with alignment gap", func(t *testing.T, a *allocator) {
			p, _ := a.alloc(allocPage, 1) // 0x1000
			q, err := a.alloc(allocPage, 64<<10)
			if err != nil || q != 64<<10 {
				t.Fatalf("got %#x, %v", q, err)
			}
			// The gap [0x2000, 0x10000) is still usable.
			r, err := a.alloc(allocPage, 1)
			if err != nil || r != p+allocPage {
				t.Errorf("got %#x, %v, want %#x", r, err, p+allocPage)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAllocator(start, end)
			tt.run(t, a)
			a.check(t, start, end)
		})
	}
}

func TestAllocatorRandom(t *testing.T) {
	const start, end = 4096, 4 << 20
	a := newAllocator(start, end)
	r := rand.New(rand.NewPCG(1, 2))
	var live []uint64
	for i := range 5000 {
		if len(live) > 0 && r.IntN(2) == 0 {
			k := r.IntN(len(live))
			if _, err := a.release(live[k]); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			live = append(live[:k], live[k+1:]...)
		} else if s, err := a.alloc(uint64(r.IntN(5*allocPage)+1), 1<<r.IntN(15)); err == nil {
			live = append(live, s)
		} else if !errors.Is(err, ErrNoMemory) {
			t.Fatal(err)
		}
		if i%100 == 0 {
			a.check(t, start, end)
		}
	}
	for _, s := range live {
		if _, err := a.release(s); err != nil {
			t.Fatal(err)
		}
	}
	a.check(t, start, end)
	if u, n := a.stats(); u != 0 || n != 1 {
		t.Errorf("after freeing everything: used %d, %d extents; want 0, 1", u, n)
	}
}

// FuzzAllocator runs a script of allocations and frees: the invariants must
// hold after every step, and a failed allocation returns zero.
func FuzzAllocator(f *testing.F) {
	f.Add([]byte{0x01, 0x03, 0x10, 0x02, 0x80, 0x00})
	f.Fuzz(func(t *testing.T, script []byte) {
		const start, end = 4096, 256 << 10
		a := newAllocator(start, end)
		var live []uint64
		for i := 0; i+1 < len(script) && i < 400; i += 2 {
			op, arg := script[i], script[i+1]
			if op&1 == 1 && len(live) > 0 {
				k := int(arg) % len(live)
				if _, err := a.release(live[k]); err != nil {
					t.Fatal(err)
				}
				live = append(live[:k], live[k+1:]...)
			} else {
				s, err := a.alloc(uint64(arg)*512, 1<<(op>>4))
				if err != nil {
					if s != 0 {
						t.Fatalf("error %v with address %#x", err, s)
					}
				} else {
					live = append(live, s)
				}
			}
			a.check(t, start, end)
		}
	})
}
