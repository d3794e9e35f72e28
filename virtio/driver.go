package virtio

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// DriverQueueConfig configures the driver side of a split virtqueue.
type DriverQueueConfig struct {
	Size     uint16 // power of two, 1..MaxQueueSize
	EventIdx bool   // VIRTIO_F_EVENT_IDX negotiated
	Index    int    // queue index, for errors
}

// Buf is one buffer of a chain, by guest-physical address.
type Buf struct {
	Addr     abi.GPA
	Len      uint32
	Writable bool // device-writable (otherwise device-readable)
}

// DriverQueue is the driver side of a split virtqueue. It is not safe for
// concurrent use: callers serialise. It does not trust the device: the free
// list and chain bookkeeping live in host memory, never read back from the
// rings, and every used element is checked against the chains in flight.
type DriverQueue struct {
	// Immutable after NewDriverQueue.
	index    int
	size     uint16
	mask     uint16
	eventIdx bool
	rings    Rings

	// Owned by the caller.
	next       []uint16 // shadow of desc[i].next: free list and chains
	chainLen   []uint16 // per head: descriptors in the chain, 0 = not in flight
	writable   []uint64 // per head: device-writable bytes of the chain
	freeHead   uint16
	numFree    int
	inFlight   int    // chains in flight
	availIdx   uint16 // shadow of avail.idx (the driver is its only writer)
	oldAvail   uint16 // availIdx at the last NeedsKick
	lastUsed   uint16 // next used element to consume
	availFlags uint16 // shadow of avail.flags
	noIntr     bool   // interrupts disabled
	err        error  // sticky: non-nil once the device misbehaved
}

// NewDriverQueue zeroes r and returns the driver side of a split virtqueue
// over it, with every descriptor free and interrupts enabled.
func NewDriverQueue(cfg DriverQueueConfig, r Rings) (*DriverQueue, error) {
	if !validQueueSize(cfg.Size) {
		return nil, fmt.Errorf("queue %d: size %d is not a power of two in 1..%d: %w", cfg.Index, cfg.Size, MaxQueueSize, ErrInvalid)
	}
	r, err := checkRings(cfg.Size, r)
	if err != nil {
		return nil, fmt.Errorf("queue %d: %w", cfg.Index, err)
	}
	clear(r.Desc)
	clear(r.Avail)
	clear(r.Used)
	q := &DriverQueue{
		index:    cfg.Index,
		size:     cfg.Size,
		mask:     cfg.Size - 1,
		eventIdx: cfg.EventIdx,
		rings:    r,
		next:     make([]uint16, cfg.Size),
		chainLen: make([]uint16, cfg.Size),
		writable: make([]uint64, cfg.Size),
		numFree:  int(cfg.Size),
	}
	for i := range q.next {
		q.next[i] = uint16(i + 1) // the last one is never followed
	}
	abi.Fence()
	return q, nil
}

// Size returns the queue size.
func (q *DriverQueue) Size() uint16 { return q.size }

// Free returns the number of free descriptors.
func (q *DriverQueue) Free() int { return q.numFree }

// Err returns nil, or the error that broke the queue (it matches ErrBroken).
func (q *DriverQueue) Err() error { return q.err }

func checkBufs(bufs []Buf) error {
	seenWritable := false
	for i, b := range bufs {
		if b.Writable {
			seenWritable = true
		} else if seenWritable {
			return fmt.Errorf("buffer %d: readable after writable: %w", i, ErrInvalid)
		}
		if uint64(b.Addr) > math.MaxUint64-uint64(b.Len) {
			return fmt.Errorf("buffer %d: address %#x plus length %d overflows: %w", i, b.Addr, b.Len, ErrInvalid)
		}
	}
	return nil
}

func putDesc(table []byte, i uint16, addr uint64, n uint32, flags, next uint16) {
	off := int(i) * descSize
	d := table[off : off+descSize]
	binary.LittleEndian.PutUint64(d[0:8], addr)
	binary.LittleEndian.PutUint32(d[8:12], n)
	binary.LittleEndian.PutUint16(d[12:14], flags)
	binary.LittleEndian.PutUint16(d[14:16], next)
}

// Add places one chain made of bufs (device-readable buffers first) in the
// descriptor table and publishes it in the available ring. It returns the
// chain's head, or ErrQueueFull when fewer than len(bufs) descriptors are free.
func (q *DriverQueue) Add(bufs []Buf) (head uint16, err error) {
	if q.err != nil {
		return 0, q.err
	}
	if len(bufs) == 0 {
		return 0, fmt.Errorf("queue %d: empty chain: %w", q.index, ErrInvalid)
	}
	if err := checkBufs(bufs); err != nil {
		return 0, fmt.Errorf("queue %d: %w", q.index, err)
	}
	if len(bufs) > q.numFree {
		return 0, ErrQueueFull
	}
	head = q.freeHead
	idx := head
	var wlen uint64
	for i, b := range bufs {
		flags := uint16(0)
		if b.Writable {
			flags |= DescFWrite
			wlen += uint64(b.Len)
		}
		nxt := q.next[idx]
		if i < len(bufs)-1 {
			flags |= DescFNext
		}
		putDesc(q.rings.Desc, idx, uint64(b.Addr), b.Len, flags, nxt&q.mask)
		if i < len(bufs)-1 {
			idx = nxt
		}
	}
	q.freeHead = q.next[idx] // may be == size when the list is now empty
	q.numFree -= len(bufs)
	q.publish(head, uint16(len(bufs)), wlen)
	return head, nil
}

// AddIndirect places one chain made of bufs in an indirect table and publishes
// it, using a single descriptor of the ring. table is the host view of the
// indirect table's memory at guest-physical address tableAddr; it must hold at
// least 16*len(bufs) bytes and stay untouched until the chain is used.
// VIRTIO_F_INDIRECT_DESC must have been negotiated.
func (q *DriverQueue) AddIndirect(tableAddr abi.GPA, table []byte, bufs []Buf) (head uint16, err error) {
	if q.err != nil {
		return 0, q.err
	}
	if len(bufs) == 0 || len(bufs) > MaxQueueSize {
		return 0, fmt.Errorf("queue %d: indirect chain of %d buffers: %w", q.index, len(bufs), ErrInvalid)
	}
	if err := checkBufs(bufs); err != nil {
		return 0, fmt.Errorf("queue %d: %w", q.index, err)
	}
	tlen := uint64(len(bufs)) * descSize
	if uint64(len(table)) < tlen || uint64(tableAddr) > math.MaxUint64-tlen {
		return 0, fmt.Errorf("queue %d: indirect table of %d bytes for %d buffers: %w", q.index, len(table), len(bufs), ErrInvalid)
	}
	if q.numFree < 1 {
		return 0, ErrQueueFull
	}
	var wlen uint64
	for i, b := range bufs {
		flags := uint16(0)
		if b.Writable {
			flags |= DescFWrite
			wlen += uint64(b.Len)
		}
		if i < len(bufs)-1 {
			flags |= DescFNext
		}
		putDesc(table, uint16(i), uint64(b.Addr), b.Len, flags, uint16(i+1))
	}
	head = q.freeHead
	putDesc(q.rings.Desc, head, uint64(tableAddr), uint32(tlen), DescFIndirect, 0)
	q.freeHead = q.next[head]
	q.numFree--
	q.publish(head, 1, wlen)
	return head, nil
}

// publish records the chain and makes it available: the ring entry is written
// before avail.idx, whose store is sequentially consistent.
func (q *DriverQueue) publish(head, n uint16, wlen uint64) {
	q.chainLen[head] = n
	q.writable[head] = wlen
	q.inFlight++
	binary.LittleEndian.PutUint16(q.rings.Avail[ringOff+2*int(q.availIdx&q.mask):], head)
	q.availIdx++
	abi.StoreUint16(q.rings.Avail, ringIdxOff, q.availIdx)
}

// NeedsKick reports whether the device wants a notification for the chains
// added since the previous call: with EVENT_IDX,
// vring_need_event(avail_event, new, old); otherwise unless the used ring's
// NO_NOTIFY flag is set.
func (q *DriverQueue) NeedsKick() bool {
	old, new := q.oldAvail, q.availIdx
	q.oldAvail = new
	if old == new {
		return false
	}
	// The seq-cst store of avail.idx in Add orders it before these loads.
	if q.eventIdx {
		return needEvent(abi.LoadUint16(q.rings.Used, availEventOff(q.size)), new, old)
	}
	return abi.LoadUint16(q.rings.Used, ringFlagsOff)&UsedFNoNotify == 0
}

func (q *DriverQueue) breakRing(reason, detail string) error {
	q.err = &RingError{Queue: q.index, Reason: reason, Detail: detail}
	return q.err
}

// HasUsed reports whether the device has returned a chain not yet taken
// with Used.
func (q *DriverQueue) HasUsed() bool {
	return q.err == nil && abi.LoadUint16(q.rings.Used, ringIdxOff) != q.lastUsed
}

// Used returns the next used element, if any, and frees its descriptors.
// A device that publishes more elements than chains are in flight, an
// out-of-range or not-in-flight head, or a length above the chain's writable
// bytes breaks the queue: the error matches ErrBroken, now and on every later
// call.
func (q *DriverQueue) Used() (head uint16, written uint32, ok bool, err error) {
	if q.err != nil {
		return 0, 0, false, q.err
	}
	idx := abi.LoadUint16(q.rings.Used, ringIdxOff)
	n := idx - q.lastUsed
	if n == 0 {
		return 0, 0, false, nil
	}
	if int(n) > q.inFlight {
		return 0, 0, false, q.breakRing(ReasonUsedIdx, fmt.Sprintf("used idx %d, last used %d, in flight %d", idx, q.lastUsed, q.inFlight))
	}
	off := ringOff + usedElemSize*int(q.lastUsed&q.mask)
	var raw [usedElemSize]byte
	copy(raw[:], q.rings.Used[off:off+usedElemSize])
	id := binary.LittleEndian.Uint32(raw[0:4])
	written = binary.LittleEndian.Uint32(raw[4:8])
	if id >= uint32(q.size) {
		return 0, 0, false, q.breakRing(ReasonUsedID, fmt.Sprintf("id %d, size %d", id, q.size))
	}
	head = uint16(id)
	cnt := q.chainLen[head]
	if cnt == 0 {
		return 0, 0, false, q.breakRing(ReasonUsedNotInFlight, fmt.Sprintf("id %d", id))
	}
	if uint64(written) > q.writable[head] {
		return 0, 0, false, q.breakRing(ReasonUsedLen, fmt.Sprintf("id %d, len %d, writable %d", id, written, q.writable[head]))
	}
	// Free the chain: walk the shadow links, bounded by the recorded count.
	last := head
	for i := uint16(1); i < cnt; i++ {
		last = q.next[last]
	}
	q.next[last] = q.freeHead
	q.freeHead = head
	q.numFree += int(cnt)
	q.chainLen[head] = 0
	q.writable[head] = 0
	q.inFlight--
	q.lastUsed++
	if q.eventIdx {
		q.storeUsedEvent()
	}
	return head, written, true, nil
}

// storeUsedEvent publishes used_event: the next element when interrupts are
// enabled, else one just behind it, which the device does not cross again
// until the index wraps.
func (q *DriverQueue) storeUsedEvent() {
	ev := q.lastUsed
	if q.noIntr {
		ev--
	}
	abi.StoreUint16(q.rings.Avail, usedEventOff(q.size), ev)
}

// EnableInterrupts asks the device to interrupt when it uses chains (EVENT_IDX:
// used_event = last used; otherwise clears NO_INTERRUPT). Callers re-check
// Used afterwards before sleeping.
func (q *DriverQueue) EnableInterrupts() {
	q.noIntr = false
	if q.eventIdx {
		q.storeUsedEvent()
		return
	}
	q.availFlags &^= AvailFNoInterrupt
	abi.StoreUint16(q.rings.Avail, ringFlagsOff, q.availFlags)
}

// DisableInterrupts tells the device that interrupts are not needed. It is a
// hint: the device may still interrupt.
func (q *DriverQueue) DisableInterrupts() {
	q.noIntr = true
	if q.eventIdx {
		q.storeUsedEvent()
		return
	}
	q.availFlags |= AvailFNoInterrupt
	abi.StoreUint16(q.rings.Avail, ringFlagsOff, q.availFlags)
}
