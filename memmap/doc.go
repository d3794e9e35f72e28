// Package memmap maps a vhost-user front-end's guest memory into the
// backend and translates addresses into it.
//
// The front-end (QEMU, or vmm/frontend) describes guest RAM as up to
// MaxRegions regions, each an fd plus RegionSpec (SET_MEM_TABLE, ADD_MEM_REG,
// REM_MEM_REG). MapRegion maps one; NewTable, Table.With and Table.Without
// build immutable tables of them; Memory publishes the current table to the
// workers of one device and swaps it while they run. Tables translate
// guest-physical addresses (GPA, descriptor and WQE addresses) and front-end
// virtual addresses (UVA, SET_VRING_ADDR) to host bytes. Every translation
// checks the whole range: Slice never returns bytes that cross a region
// boundary, and ForEach splits a range explicitly across GPA-adjacent
// regions. Guard contains the SIGBUS a front-end causes by shrinking the
// file behind a region.
//
// Pinner (pin.go) is PVDMA: it pins exactly the guest pages a device
// registers, refcounted, with a bounded map cache of released pins and
// per-device and global quotas; its comment block describes it.
// Table.Reuse keeps a region's mapping (and its pins) when a front-end
// sends the same memory table again.
//
// Pins are exact across memory-table changes (security issue 25): a
// device pins on behalf of an owner (PinFor, PinPagesFor; an MR, a ring),
// the pin is on the pages of the region mapping it was taken in, and
// UnpinOwner drops exactly those, never by translating guest-physical
// addresses through the table current then. A region that leaves the
// table (SET_MEM_TABLE, REM_MEM_REG) keeps its mapping and the pins live
// owners hold until they go; its pin=all pin and its cached pages are
// dropped at once. So a table change never drops a live object's pin, and
// destroying an object never unpins pages another object holds.
//
// DirtyLog (dirty.go) is a front-end's dirty log during a migration: a
// bitmap of 4 KiB guest-physical pages. Memory.SetLog gives it to the
// current table and every table installed after it (Swap carries it); a
// writer marks what it wrote through the table it wrote through
// (Table.MarkDirty, Table.ForEachWrite), after the write, with an atomic
// OR, and nothing when the table has no log (one nil check). The list of
// writers is complete because every write into guest memory needs a
// table's host view, and the packages that write (virtio's used ring and
// Chain.Scatter, the engine) each route their writes through one or two
// marking functions (their doc.go files say which). SetLog's Idle channel
// tells when no worker still writes through a table from before. A mark
// clips to the log (counted: Missed) and contains a fault of the log's
// file (Faulted).
//
// Non-goals: anything of the vhost-user wire
// (package virtio/vhostuser decodes messages; this package only sees
// RegionSpecs and fds); and what the guest shares with the host. The
// guest-physical address type (abi.GPA) and the atomic accessors for ring
// fields belong to the device ABI, package virtio/rdma/abi, which both
// sides import. memmap is host memory: the backend uses it (and the
// front-end that plays QEMU, vrdmad's device manager, integration tests);
// the guest never does (internal/layout's test enforces both).
//
// # Invariants
//
//   - Every Region passed MapRegion's checks: Size > 0, GuestAddr+Size,
//     UserAddr+Size and MmapOffset+Size do not overflow, and the file held
//     MmapOffset+Size bytes when it was mapped. A Region owns its mapping
//     and the fd MapRegion was given (one descriptor per region, which a
//     live upgrade duplicates with DupFd to hand the file on); both go
//     away on the last Release. Table.Reuse closes the fd of the region it
//     did not need to map.
//   - A Table is immutable after construction: at most MaxRegions regions,
//     sorted by GuestAddr, no two overlapping in guest-physical nor in
//     front-end virtual space. It holds one reference on each region while
//     its own count is positive.
//   - Reference counts never rise from zero: tryRef refuses a released
//     object. Memory.cur is never nil and always carries one reference on
//     the table it points to; Swap installs the new table before it
//     releases the old one, so Acquire's retry loop always finds a live
//     table.
//   - A slice returned by Slice, SliceUser or ForEach has its capacity equal
//     to its length, so append cannot reach beyond the range, and it is
//     valid only while the caller holds a reference on the table.
//   - Guest memory may change or vanish at any time (the front-end and the
//     guest write it concurrently; a front-end may truncate the file): copy
//     guest structures once before validating them, use abi's atomic
//     accessors for shared ring fields, and touch guest memory under Guard.
//   - A Pinner's pinned bytes are exactly the pages its owners' pins and
//     the pin=all pins name, counted per mapping (a guest page pinned
//     through two mappings of it counts twice); a region it tracks is in
//     the current table or still pinned by a live owner, and at most
//     maxTracked regions are tracked.
//
// # Lock order
//
// Tables and regions have no mutexes: Memory.cur, Memory.gen and the
// reference counts are atomics; tables, regions and dirty logs are
// otherwise immutable. Memory.mu serialises the installers (Swap, SetLog)
// only; Acquire takes no lock. A Pinner has one mutex, Pinner.mu (see pin.go): under it it
// takes region references and updates its Accounting, both atomics, and
// nothing else. Release of a table
// releases its regions after its own count reached zero; nothing acquires
// in the opposite direction.
package memmap
