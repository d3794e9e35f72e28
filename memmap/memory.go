package memmap

import "sync/atomic"

// Memory holds the current Table of one device and swaps it while workers
// run. A worker Acquires a table, uses it for a batch and Releases it; a
// region is unmapped only when no table holding it is referenced any more.
type Memory struct {
	cur atomic.Pointer[Table] // never nil; holds one reference on the table
	gen atomic.Uint64         // incremented after each Swap has installed its table
}

// NewMemory returns a Memory holding an empty table.
func NewMemory() *Memory {
	m := &Memory{}
	m.cur.Store(EmptyTable())
	return m
}

// Acquire returns the current table with a reference the caller must
// Release. It never returns nil, takes no lock and does not allocate.
//
// The reference is taken by a CAS that refuses a table whose count reached
// zero: such a table was swapped out and released between the load and the
// CAS, and the loop loads the newer table Swap installed before releasing it.
func (m *Memory) Acquire() *Table {
	for {
		t := m.cur.Load()
		if t.tryRef() {
			return t
		}
	}
}

// Swap installs t, taking over the caller's reference on it, and releases
// the Memory's reference on the previous table. A nil t installs an empty
// table.
func (m *Memory) Swap(t *Table) {
	if t == nil {
		t = EmptyTable()
	}
	old := m.cur.Swap(t)
	m.gen.Add(1)
	old.Release()
}

// Generation returns the number of Swaps so far. The table is installed
// before the generation is incremented, so a worker that reads Generation
// and then Acquires gets a table at least as new as that generation; when
// the value changes it must re-translate the ring addresses it cached.
func (m *Memory) Generation() uint64 { return m.gen.Load() }

// Close swaps in an empty table. The regions are unmapped once the workers
// have released the tables they still hold.
func (m *Memory) Close() { m.Swap(EmptyTable()) }
