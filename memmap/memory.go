package memmap

import (
	"sync"
	"sync/atomic"
)

// Memory holds the current Table of one device and swaps it while workers
// run. A worker Acquires a table, uses it for a batch and Releases it; a
// region is unmapped only when no table holding it is referenced any more.
//
// Memory also holds the dirty log in use (SetLog): every table it installs
// marks into it, so the log follows the memory table across Swaps.
type Memory struct {
	cur atomic.Pointer[Table] // never nil; holds one reference on the table
	gen atomic.Uint64         // incremented after each Swap has installed its table

	mu  sync.Mutex // serialises Swap and SetLog (installers; Acquire takes no lock)
	log *DirtyLog  // protected by mu; the log of every table installed now (one reference), or nil
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
//
// The table installed marks into the Memory's dirty log (SetLog): a table
// built without it (NewTable) is replaced by a copy that has it.
func (m *Memory) Swap(t *Table) {
	if t == nil {
		t = EmptyTable()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if t.log != m.log {
		n := t.withLog(m.log)
		t.Release()
		t = n
	}
	old := m.cur.Swap(t)
	m.gen.Add(1)
	old.Release()
}

// SetLog makes l the dirty log of the current table and of every table
// installed after it (nil: no log). It takes its own reference on l and
// drops the one it held on the previous log. The current table is
// replaced by a copy with the same regions (the generation does not
// change: ring translations stay valid) and l.
//
// It returns the replaced table's Idle channel: workers that acquired it
// before SetLog may still write through it, marking in the previous log
// (or none). Once the channel is closed every write from then on marks l:
// a front-end told "logging" after that loses no page (vhost-user's
// SET_LOG_BASE and SET_FEATURES answers wait for it). The caller must not
// hold a reference on the current table, or the channel stays open.
func (m *Memory) SetLog(l *DirtyLog) <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if l != nil && !l.tryRef() {
		panic("memmap: SetLog of a released dirty log")
	}
	if m.log != nil {
		m.log.Release() // tables holding it keep their own references
	}
	m.log = l
	cur := m.cur.Load() // mu held: no Swap can release it meanwhile
	n := cur.withLog(l)
	old := m.cur.Swap(n)
	idle := old.idle
	old.Release()
	return idle
}

// Log returns the dirty log tables are installed with, nil when none; it
// is valid while the caller keeps the Memory from changing it (the
// session goroutine that calls SetLog).
func (m *Memory) Log() *DirtyLog {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.log
}

// Generation returns the number of Swaps so far. The table is installed
// before the generation is incremented, so a worker that reads Generation
// and then Acquires gets a table at least as new as that generation; when
// the value changes it must re-translate the ring addresses it cached.
func (m *Memory) Generation() uint64 { return m.gen.Load() }

// Close swaps in an empty table and drops the dirty log. The regions and
// the log are unmapped once the workers have released the tables they
// still hold.
func (m *Memory) Close() {
	m.SetLog(nil)
	m.Swap(EmptyTable())
}
