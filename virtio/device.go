package virtio

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// DeviceQueueConfig configures the device side of a split virtqueue.
type DeviceQueueConfig struct {
	Index     int    // queue index, for errors
	Size      uint16 // power of two, 1..MaxQueueSize
	EventIdx  bool   // VIRTIO_F_EVENT_IDX negotiated
	Indirect  bool   // VIRTIO_F_INDIRECT_DESC negotiated (an indirect descriptor otherwise is an error)
	LastAvail uint16 // from SET_VRING_BASE
	// UsedIdx, when KeepUsedIdx is set, is the used index to go on from
	// instead of the one found in the used ring: a back-end that takes a
	// running queue over from another process carries the device's own
	// copy (the driver can write the ring's).
	UsedIdx     uint16
	KeepUsedIdx bool
	// MaxChainBytes bounds the total length of a chain's buffers; a longer
	// chain is an error. Zero means 1<<32 - 1.
	MaxChainBytes uint64
}

// DeviceQueue is the device side of a split virtqueue. It is not safe for
// concurrent use: one worker owns it. The driver writes the rings
// concurrently; every field the driver writes is read once (atomically for
// indices, flags and event indices; descriptors are copied whole) and the copy
// is validated.
type DeviceQueue struct {
	// Immutable after NewDeviceQueue.
	index    int
	size     uint16
	mask     uint16
	eventIdx bool
	indirect bool
	maxBytes uint64

	// Owned by the worker that calls the methods.
	rings       Rings
	lastAvail   uint16  // next available-ring slot to process
	usedIdx     uint16  // shadow of used.idx (the device is its only writer)
	oldUsed     uint16  // usedIdx at the last NeedsNotify
	usedFlags   uint16  // shadow of used.flags
	flagsStored bool    // usedFlags was stored into these rings
	err         error   // sticky: non-nil once broken
	inIndirect  bool    // walk state, only meaningful inside Pop
	ulog        UsedLog // told of every store into the used ring; nil: none (SetUsedLog)
}

// NewDeviceQueue returns the device side of a split virtqueue over r.
// The used index starts at the value found in the used ring (as a restarted
// back-end must continue where the previous one stopped), or at
// cfg.UsedIdx with cfg.KeepUsedIdx.
func NewDeviceQueue(cfg DeviceQueueConfig, r Rings) (*DeviceQueue, error) {
	if !validQueueSize(cfg.Size) {
		return nil, fmt.Errorf("queue %d: size %d is not a power of two in 1..%d: %w", cfg.Index, cfg.Size, MaxQueueSize, ErrInvalid)
	}
	r, err := checkRings(cfg.Size, r)
	if err != nil {
		return nil, fmt.Errorf("queue %d: %w", cfg.Index, err)
	}
	maxBytes := cfg.MaxChainBytes
	if maxBytes == 0 {
		maxBytes = math.MaxUint32
	}
	q := &DeviceQueue{
		index:     cfg.Index,
		size:      cfg.Size,
		mask:      cfg.Size - 1,
		eventIdx:  cfg.EventIdx,
		indirect:  cfg.Indirect,
		maxBytes:  maxBytes,
		rings:     r,
		lastAvail: cfg.LastAvail,
	}
	q.usedIdx = abi.LoadUint16(r.Used, ringIdxOff)
	if cfg.KeepUsedIdx {
		q.usedIdx = cfg.UsedIdx
	}
	q.oldUsed = q.usedIdx
	return q, nil
}

// SetRings re-points the queue at new host views of its rings, e.g. after
// the memory table changed. The queue state (indices, broken state) is kept.
func (q *DeviceQueue) SetRings(r Rings) error {
	r, err := checkRings(q.size, r)
	if err != nil {
		return fmt.Errorf("queue %d: %w", q.index, err)
	}
	q.rings = r
	q.flagsStored = false
	return nil
}

// SetUsedLog makes the queue tell l of every store it makes into the used
// ring, after the store (dirty logging; nil: none).
func (q *DeviceQueue) SetUsedLog(l UsedLog) { q.ulog = l }

// logUsed tells the used log of a store of n bytes at offset off of the
// used ring.
func (q *DeviceQueue) logUsed(off, n int) {
	if q.ulog != nil {
		q.ulog.LogUsed(uint64(off), uint64(n))
	}
}

// Size returns the queue size.
func (q *DeviceQueue) Size() uint16 { return q.size }

// LastAvail returns the next available index to process (GET_VRING_BASE).
func (q *DeviceQueue) LastAvail() uint16 { return q.lastAvail }

// UsedIdx returns the used index the device publishes next (its copy of
// used.idx).
func (q *DeviceQueue) UsedIdx() uint16 { return q.usedIdx }

// Err returns nil, or the error that broke the queue (it matches ErrBroken).
func (q *DeviceQueue) Err() error { return q.err }

func (q *DeviceQueue) breakRing(reason, detail string) error {
	q.err = &RingError{Queue: q.index, Reason: reason, Detail: detail}
	return q.err
}

func (q *DeviceQueue) breakDesc(c *Chain, index uint16, reason string, err error) error {
	q.err = &DescriptorError{Queue: q.index, Head: c.Head, Index: index, Indirect: q.inIndirect, Reason: reason, Err: err}
	return q.err
}

// pending returns how many chains the driver has made available beyond
// lastAvail. "The driver MUST NOT ... make more than Queue Size buffers
// available" without the device having consumed them, so a larger distance
// breaks the queue.
func (q *DeviceQueue) pending() (uint16, error) {
	idx := abi.LoadUint16(q.rings.Avail, ringIdxOff)
	n := idx - q.lastAvail
	if n > q.size {
		return 0, q.breakRing(ReasonAvailIdx, fmt.Sprintf("avail idx %d, last avail %d, size %d", idx, q.lastAvail, q.size))
	}
	return n, nil
}

// AvailIdx returns the driver's available index as it is now (zero once
// the queue is broken). Callers compare two readings to learn whether the
// driver published anything in between.
func (q *DeviceQueue) AvailIdx() uint16 {
	if q.err != nil {
		return 0
	}
	return abi.LoadUint16(q.rings.Avail, ringIdxOff)
}

// HasAvail reports whether a chain is available.
func (q *DeviceQueue) HasAvail() (bool, error) {
	if q.err != nil {
		return false, q.err
	}
	n, err := q.pending()
	return n != 0, err
}

// desc is a validated-after-copy descriptor.
type desc struct {
	addr  uint64
	len   uint32
	flags uint16
	next  uint16
}

// readDesc copies the descriptor at index i of table once.
// Precondition: table holds at least (i+1)*16 bytes.
func readDesc(table []byte, i uint16) desc {
	var raw [descSize]byte
	off := int(i) * descSize
	copy(raw[:], table[off:off+descSize])
	return desc{
		addr:  binary.LittleEndian.Uint64(raw[0:8]),
		len:   binary.LittleEndian.Uint32(raw[8:12]),
		flags: binary.LittleEndian.Uint16(raw[12:14]),
		next:  binary.LittleEndian.Uint16(raw[14:16]),
	}
}

// Pop takes the next available chain into c. It returns (false, nil) when none
// is available. Any malformed input (see the package documentation) breaks
// the queue: Pop returns a *DescriptorError or *RingError, c is reset to
// empty, and from then on every call returns an error matching ErrBroken.
// The slices in c are views of guest memory obtained from mem, valid while
// the caller holds mem.
func (q *DeviceQueue) Pop(mem Memory, c *Chain) (bool, error) {
	c.reset(0)
	if q.err != nil {
		return false, q.err
	}
	n, err := q.pending()
	if err != nil || n == 0 {
		return false, err
	}
	// The load of avail.idx above is atomic and precedes this load of the
	// ring entry (amd64 does not reorder loads; the assembly accessor is a
	// compiler barrier), so the entry is the one the driver published.
	head := abi.LoadUint16(q.rings.Avail, ringOff+2*int(q.lastAvail&q.mask))
	c.Head = head
	if err := q.walk(mem, c); err != nil {
		c.reset(0)
		return false, err
	}
	c.marker, _ = mem.(DirtyMarker)
	q.lastAvail++
	return true, nil
}

// walk fills c with the chain starting at c.Head.
func (q *DeviceQueue) walk(mem Memory, c *Chain) error {
	q.inIndirect = false
	idx := c.Head
	if idx >= q.size {
		return q.breakDesc(c, idx, ReasonHeadRange, nil)
	}
	// "A driver MUST NOT create a descriptor chain longer than the Queue
	// Size of the device": at most size descriptors, which also ends loops.
	for n := 0; ; n++ {
		if n >= int(q.size) {
			return q.breakDesc(c, idx, ReasonChainTooLong, nil)
		}
		d := readDesc(q.rings.Desc, idx)
		if d.flags&DescFIndirect != 0 {
			return q.walkIndirect(mem, c, idx, d)
		}
		if err := q.add(mem, c, idx, d); err != nil {
			return err
		}
		if d.flags&DescFNext == 0 {
			return nil
		}
		if d.next >= q.size {
			return q.breakDesc(c, idx, ReasonNextRange, nil)
		}
		idx = d.next
	}
}

// walkIndirect follows the indirect table that descriptor idx (copied as d)
// refers to. It ends the chain: an indirect descriptor carries no NEXT.
func (q *DeviceQueue) walkIndirect(mem Memory, c *Chain, idx uint16, d desc) error {
	switch {
	case !q.indirect:
		return q.breakDesc(c, idx, ReasonIndirectNotAllowed, nil)
	case d.flags&DescFNext != 0:
		// "A driver MUST NOT set both VIRTQ_DESC_F_INDIRECT and
		// VIRTQ_DESC_F_NEXT in flags."
		return q.breakDesc(c, idx, ReasonIndirectNext, nil)
	case d.len == 0:
		return q.breakDesc(c, idx, ReasonIndirectEmpty, nil)
	case d.len%descSize != 0:
		return q.breakDesc(c, idx, ReasonIndirectUnaligned, nil)
	case d.len/descSize > MaxQueueSize:
		return q.breakDesc(c, idx, ReasonIndirectTooLong, nil)
	}
	// The device MUST ignore the write-only flag of a descriptor that
	// refers to an indirect table.
	if d.addr > math.MaxUint64-uint64(d.len) {
		return q.breakDesc(c, idx, ReasonAddrOverflow, nil)
	}
	table, err := mem.Slice(abi.GPA(d.addr), uint64(d.len))
	if err != nil {
		return q.breakDesc(c, idx, ReasonIndirectMemory, err)
	}
	if uint64(len(table)) != uint64(d.len) {
		return q.breakDesc(c, idx, ReasonIndirectMemory, nil)
	}
	entries := uint16(d.len / descSize) // <= MaxQueueSize, fits
	q.inIndirect = true
	i := uint16(0)
	for n := uint16(0); ; n++ {
		if n >= entries {
			return q.breakDesc(c, i, ReasonChainTooLong, nil)
		}
		e := readDesc(table, i)
		if e.flags&DescFIndirect != 0 {
			// "The driver MUST NOT set the VIRTQ_DESC_F_INDIRECT
			// flag within an indirect descriptor."
			return q.breakDesc(c, i, ReasonIndirectNested, nil)
		}
		if err := q.add(mem, c, i, e); err != nil {
			return err
		}
		if e.flags&DescFNext == 0 {
			return nil
		}
		if e.next >= entries {
			return q.breakDesc(c, i, ReasonNextRange, nil)
		}
		i = e.next
	}
}

// add validates one buffer descriptor and appends its memory to c.
func (q *DeviceQueue) add(mem Memory, c *Chain, idx uint16, d desc) error {
	write := d.flags&DescFWrite != 0
	// "The driver MUST place any device-writable descriptor elements after
	// any device-readable descriptor elements."
	if !write && c.sawWritable {
		return q.breakDesc(c, idx, ReasonReadAfterWrite, nil)
	}
	if write {
		c.sawWritable = true
	}
	total := c.ReadableLen + c.WritableLen // both bounded by maxBytes <= 2^64-2^32
	if uint64(d.len) > q.maxBytes-total {
		return q.breakDesc(c, idx, ReasonChainBytes, nil)
	}
	if d.addr > math.MaxUint64-uint64(d.len) {
		return q.breakDesc(c, idx, ReasonAddrOverflow, nil)
	}
	if d.len == 0 {
		return nil // nothing to translate or copy
	}
	b, err := mem.Slice(abi.GPA(d.addr), uint64(d.len))
	if err != nil {
		return q.breakDesc(c, idx, ReasonBufferMemory, err)
	}
	if uint64(len(b)) != uint64(d.len) {
		return q.breakDesc(c, idx, ReasonBufferMemory, nil)
	}
	b = b[:len(b):len(b)]
	if write {
		c.Writable = append(c.Writable, b)
		c.writableGPA = append(c.writableGPA, abi.GPA(d.addr))
		c.WritableLen += uint64(d.len)
	} else {
		c.Readable = append(c.Readable, b)
		c.ReadableLen += uint64(d.len)
	}
	return nil
}

// Push returns the chain with head to the driver with the number of bytes the
// device wrote into it, and publishes the used index. The element is written
// before the index, whose store is sequentially consistent, so the driver sees
// the element before the index.
func (q *DeviceQueue) Push(head uint16, written uint32) error {
	if q.err != nil {
		return q.err
	}
	if head >= q.size {
		return fmt.Errorf("queue %d: push head %d of %d: %w", q.index, head, q.size, ErrInvalid)
	}
	off := ringOff + usedElemSize*int(q.usedIdx&q.mask)
	binary.LittleEndian.PutUint32(q.rings.Used[off:off+4], uint32(head))
	binary.LittleEndian.PutUint32(q.rings.Used[off+4:off+8], written)
	q.usedIdx++
	abi.StoreUint16(q.rings.Used, ringIdxOff, q.usedIdx)
	q.logUsed(off, usedElemSize)
	q.logUsed(ringIdxOff, 2)
	return nil
}

// NeedsNotify reports whether the driver wants an interrupt for the chains
// pushed since the previous call. With EVENT_IDX it applies
// vring_need_event(used_event, new, old); otherwise it honours the
// available ring's NO_INTERRUPT flag. A broken queue never notifies.
func (q *DeviceQueue) NeedsNotify() bool {
	old, new := q.oldUsed, q.usedIdx
	q.oldUsed = new
	if q.err != nil || old == new {
		return false
	}
	// The seq-cst store of used.idx in Push orders it before these loads.
	if q.eventIdx {
		return needEvent(abi.LoadUint16(q.rings.Avail, usedEventOff(q.size)), new, old)
	}
	return abi.LoadUint16(q.rings.Avail, ringFlagsOff)&AvailFNoInterrupt == 0
}

// EnableNotify asks the driver to kick when it makes new chains available.
// Callers re-check HasAvail afterwards before sleeping; the sequentially
// consistent store is the full barrier that makes this race-free.
func (q *DeviceQueue) EnableNotify() {
	if q.eventIdx {
		abi.StoreUint16(q.rings.Used, availEventOff(q.size), q.lastAvail)
		q.logUsed(availEventOff(q.size), 2)
		return
	}
	q.usedFlags &^= UsedFNoNotify
	abi.StoreUint16(q.rings.Used, ringFlagsOff, q.usedFlags)
	q.logUsed(ringFlagsOff, 2)
}

// DisableNotify tells the driver that kicks are not needed (the device is
// polling). It is a hint: the driver may still kick.
func (q *DeviceQueue) DisableNotify() {
	if q.eventIdx {
		// An avail_event just behind what the device has consumed is not
		// crossed again until the index wraps.
		abi.StoreUint16(q.rings.Used, availEventOff(q.size), q.lastAvail-1)
		q.logUsed(availEventOff(q.size), 2)
		return
	}
	q.usedFlags |= UsedFNoNotify
	abi.StoreUint16(q.rings.Used, ringFlagsOff, q.usedFlags)
	q.logUsed(ringFlagsOff, 2)
}

// SetUsedFlagNoNotify sets or clears VIRTQ_USED_F_NO_NOTIFY in the used
// ring's flags whether or not EVENT_IDX was negotiated. Device types whose
// queues carry no buffers (vrdma's doorbell queues) use the flag as their
// own "engine is polling" signal; see docs/spec.md.
//
// It stores only when the flag changes: a polling engine calls it on every
// pass, and the driver reads the word on every doorbell, so a store each
// time would bounce the cache line between their cores.
func (q *DeviceQueue) SetUsedFlagNoNotify(on bool) {
	f := q.usedFlags &^ UsedFNoNotify
	if on {
		f |= UsedFNoNotify
	}
	if f == q.usedFlags && q.flagsStored {
		return
	}
	q.usedFlags, q.flagsStored = f, true
	abi.StoreUint16(q.rings.Used, ringFlagsOff, f)
	q.logUsed(ringFlagsOff, 2)
}

// Chain is one descriptor chain popped by DeviceQueue.Pop. It is reused across
// Pop calls so that Pop allocates nothing in steady state. Readable and
// Writable are views of guest memory, valid while the caller holds the Memory
// it passed to Pop; zero-length descriptors contribute no slice.
//
// A device writes into the writable buffers with Scatter, which marks what
// it wrote in the Memory's dirty log (DirtyMarker); writing into Writable
// directly is not logged.
type Chain struct {
	Head        uint16
	Readable    [][]byte // device-readable buffers, in order
	Writable    [][]byte // device-writable buffers, in order
	ReadableLen uint64
	WritableLen uint64

	sawWritable bool        // a writable descriptor (possibly empty) was seen
	writableGPA []abi.GPA   // guest-physical address of each Writable buffer
	marker      DirtyMarker // the Memory Pop translated through, if it logs writes
}

func (c *Chain) reset(head uint16) {
	clear(c.Readable)
	clear(c.Writable)
	c.Head = head
	c.Readable = c.Readable[:0]
	c.Writable = c.Writable[:0]
	c.writableGPA = c.writableGPA[:0]
	c.marker = nil
	c.ReadableLen = 0
	c.WritableLen = 0
	c.sawWritable = false
}

// Gather copies the readable bytes of c into dst, in order, and returns the
// number of bytes copied (at most len(dst)).
func (c *Chain) Gather(dst []byte) int {
	n := 0
	for _, b := range c.Readable {
		if n == len(dst) {
			break
		}
		n += copy(dst[n:], b)
	}
	return n
}

// Scatter copies src into the writable buffers of c, in order, and returns the
// number of bytes copied (at most WritableLen). It marks the bytes it wrote
// in the dirty log of the Memory Pop translated through (DirtyMarker).
func (c *Chain) Scatter(src []byte) int {
	n := 0
	for i, b := range c.Writable {
		if n == len(src) {
			break
		}
		k := copy(b, src[n:])
		if c.marker != nil && i < len(c.writableGPA) {
			c.marker.MarkDirty(c.writableGPA[i], uint64(k))
		}
		n += k
	}
	return n
}
