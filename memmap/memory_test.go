package memmap

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

func TestMemoryBasics(t *testing.T) {
	live := liveMappings.Load()
	m := NewMemory()
	tb := m.Acquire()
	if tb == nil || tb.Len() != 0 {
		t.Fatalf("Acquire on a new Memory = %v, want an empty table", tb)
	}
	tb.Release()
	if g := m.Generation(); g != 0 {
		t.Errorf("Generation() = %d, want 0", g)
	}
	r := mapNew(t, "mem", 0x1000, RegionSpec{GuestAddr: 0x1000, Size: 0x1000})
	nt, err := NewTable([]*Region{r})
	if err != nil {
		t.Fatal(err)
	}
	r.Release()
	m.Swap(nt)
	if g := m.Generation(); g != 1 {
		t.Errorf("Generation() after Swap = %d, want 1", g)
	}
	held := m.Acquire()
	if held != nt {
		t.Fatalf("Acquire returned %p, want the swapped-in table %p", held, nt)
	}
	m.Close()
	if g := m.Generation(); g != 2 {
		t.Errorf("Generation() after Close = %d, want 2", g)
	}
	if got := countMaps(t, "mem"); got != 1 {
		t.Errorf("got %d mappings while a worker holds the table, want 1", got)
	}
	if b, err := held.Slice(0x1fff, 1); err != nil {
		t.Fatal(err)
	} else {
		b[0] = 7
	}
	held.Release()
	if got := countMaps(t, "mem"); got != 0 {
		t.Errorf("got %d mappings after the last Release, want 0", got)
	}
	empty := m.Acquire()
	if empty.Len() != 0 {
		t.Errorf("after Close Acquire has %d regions, want 0", empty.Len())
	}
	empty.Release()
	m.Swap(nil)
	if g := m.Generation(); g != 3 {
		t.Errorf("Generation() after Swap(nil) = %d, want 3", g)
	}
	m.Close()
	if got := liveMappings.Load(); got != live {
		t.Errorf("liveMappings = %d, want %d", got, live)
	}
}

func TestAcquireAllocs(t *testing.T) {
	m := NewMemory()
	defer m.Close()
	if n := testing.AllocsPerRun(100, func() { m.Acquire().Release() }); n != 0 {
		t.Errorf("got %v allocations per Acquire/Release, want 0", n)
	}
}

// Workers Acquire, translate, write and Release in a loop while another
// goroutine adds and removes regions; every removed region is unmapped as soon
// as the last worker lets go of it. A refcount bug shows up as a fault (caught
// by Guard), a write into the wrong region, a leak, or a race report.
func TestMemorySwapRace(t *testing.T) {
	const (
		workers = 4
		rounds  = 1000
		base    = 0x100000
		size    = 0x1000
	)
	fdsBefore := countFDs(t)
	live := liveMappings.Load()

	m := NewMemory()
	stable := mapNew(t, "stable", size, RegionSpec{GuestAddr: base, Size: size, UserAddr: base})
	tb, err := NewTable([]*Region{stable})
	if err != nil {
		t.Fatal(err)
	}
	stable.Release()
	m.Swap(tb)

	var (
		done   atomic.Bool
		wg     sync.WaitGroup
		hits   atomic.Int64
		misses atomic.Int64
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !done.Load(); i++ {
				err := Guard(func() {
					tb := m.Acquire()
					defer tb.Release()
					b, err := tb.Slice(base+abi.GPA(w*8), 8)
					if err != nil {
						t.Errorf("stable region: %v", err)
						return
					}
					abi.StoreUint64(b, 0, uint64(i))
					// The moving region, if present, holds its own round
					// number in its first word; each worker writes its slot.
					mv, err := tb.Slice(2*base, size)
					if errors.Is(err, ErrNotMapped) {
						misses.Add(1)
						return
					}
					if err != nil {
						t.Errorf("moving region: %v", err)
						return
					}
					round := abi.LoadUint64(mv, 0)
					abi.StoreUint64(mv, 8+8*w, round)
					if abi.LoadUint64(mv, 0) != round {
						t.Errorf("moving region changed its tag under a held table")
					}
					hits.Add(1)
				})
				if err != nil {
					t.Errorf("worker %d: %v", w, err)
					return
				}
				runtime.Gosched() // end of a batch
			}
		}()
	}

	for round := range rounds {
		spec := RegionSpec{GuestAddr: 2 * base, Size: size, UserAddr: 2 * base}
		r := mapNew(t, "moving", size, spec)
		abi.StoreUint64(r.Bytes(), 0, uint64(round))
		cur := m.Acquire()
		nt, err := cur.With(r)
		cur.Release()
		r.Release()
		if err != nil {
			t.Fatalf("round %d With: %v", round, err)
		}
		seen := hits.Load()
		m.Swap(nt)
		// Let the workers use the region before it goes away again.
		for deadline := time.Now().Add(20 * time.Millisecond); hits.Load() <= seen && time.Now().Before(deadline); {
			runtime.Gosched()
		}
		cur = m.Acquire()
		nt, err = cur.Without(spec)
		cur.Release()
		if err != nil {
			t.Fatalf("round %d Without: %v", round, err)
		}
		m.Swap(nt)
	}
	done.Store(true)
	wg.Wait()
	if g := m.Generation(); g != 1+2*rounds {
		t.Errorf("Generation() = %d, want %d", g, 1+2*rounds)
	}
	m.Close()
	if got := liveMappings.Load(); got != live {
		t.Errorf("liveMappings = %d, want %d (leak)", got, live)
	}
	if got := countFDs(t); got != fdsBefore {
		t.Errorf("got %d fds, want %d (leak)", got, fdsBefore)
	}
	if got := countMaps(t, "moving") + countMaps(t, "stable"); got != 0 {
		t.Errorf("got %d mappings left, want 0", got)
	}
	if hits.Load() == 0 || misses.Load() == 0 {
		t.Errorf("moving region seen %d times, absent %d times; want both > 0", hits.Load(), misses.Load())
	}
}
