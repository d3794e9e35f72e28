package virtio

import (
	"fmt"
	"reflect"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Feature bits (virtio 1.2 §6, "Reserved Feature Bits") as uint64 masks.
const (
	FeatureIndirectDesc     uint64 = 1 << 28
	FeatureEventIdx         uint64 = 1 << 29
	FeatureVersion1         uint64 = 1 << 32
	FeatureAccessPlatform   uint64 = 1 << 33
	FeatureRingPacked       uint64 = 1 << 34
	FeatureInOrder          uint64 = 1 << 35
	FeatureNotificationData uint64 = 1 << 38
)

// Device status bits (virtio 1.2 §2.1).
const (
	StatusAcknowledge uint8 = 1
	StatusDriver      uint8 = 2
	StatusDriverOK    uint8 = 4
	StatusFeaturesOK  uint8 = 8
	StatusNeedsReset  uint8 = 64
	StatusFailed      uint8 = 128
)

// Descriptor flags (struct virtq_desc.flags).
const (
	DescFNext     uint16 = 1
	DescFWrite    uint16 = 2
	DescFIndirect uint16 = 4
)

// Ring flags: AvailFNoInterrupt in the available ring (driver to device),
// UsedFNoNotify in the used ring (device to driver).
const (
	AvailFNoInterrupt uint16 = 1
	UsedFNoNotify     uint16 = 1
)

// MaxQueueSize is the largest split virtqueue ("Queue Size corresponds to the
// maximum number of buffers in the virtqueue ... The maximum Queue Size value
// is 32768").
const MaxQueueSize = 32768

// Alignments of the three ring parts (virtio 1.2 §2.7, table "Virtqueue Part
// Alignment").
const (
	DescAlign  = 16
	AvailAlign = 2
	UsedAlign  = 4
)

// Ring layout. All offsets are in bytes from the start of the respective part.
const (
	descSize     = 16 // struct virtq_desc: le64 addr, le32 len, le16 flags, le16 next
	usedElemSize = 8  // struct virtq_used_elem: le32 id, le32 len

	ringFlagsOff = 0 // le16 flags in both avail and used rings
	ringIdxOff   = 2 // le16 idx in both avail and used rings
	ringOff      = 4 // first ring entry in both avail and used rings
)

// DescTableSize is the size in bytes of the descriptor table of a queue of
// n entries.
func DescTableSize(n uint16) uint64 { return descSize * uint64(n) }

// AvailRingSize is the size in bytes of the available ring of a queue of n
// entries, used_event included.
func AvailRingSize(n uint16) uint64 { return 6 + 2*uint64(n) }

// UsedRingSize is the size in bytes of the used ring of a queue of n entries,
// avail_event included.
func UsedRingSize(n uint16) uint64 { return 6 + usedElemSize*uint64(n) }

// usedEventOff is the offset of used_event in the available ring.
func usedEventOff(n uint16) int { return ringOff + 2*int(n) }

// availEventOff is the offset of avail_event in the used ring.
func availEventOff(n uint16) int { return ringOff + usedElemSize*int(n) }

// needEvent reports whether moving an index from old to new crosses event,
// i.e. whether the other side asked to be notified (vring_need_event). All
// arithmetic is modulo 2^16.
func needEvent(event, new, old uint16) bool {
	return new-event-1 < new-old
}

// Memory is how a queue reaches guest-physical memory (descriptor buffers and
// indirect tables). Slice returns a host view of exactly n bytes at gpa, or an
// error if any byte of the range is not guest memory; the whole range must lie
// inside one region. *memmap.Table implements it.
type Memory interface {
	Slice(gpa abi.GPA, n uint64) ([]byte, error)
}

// Rings are host views of the three parts of a split virtqueue, already
// translated by the caller. Each must be at least as long as DescTableSize,
// AvailRingSize and UsedRingSize say, and start at an address aligned to
// DescAlign, AvailAlign and UsedAlign respectively.
type Rings struct {
	Desc, Avail, Used []byte
}

// validQueueSize reports whether n is a valid split-queue size: "Queue Size
// value is always a power of 2", at most MaxQueueSize.
func validQueueSize(n uint16) bool {
	return n != 0 && n <= MaxQueueSize && n&(n-1) == 0
}

// checkRings validates r for a queue of size n and returns it with each part
// cut to its exact length (and capacity), so that no later indexing can reach
// past the ring.
func checkRings(n uint16, r Rings) (Rings, error) {
	parts := [...]struct {
		name  string
		b     *[]byte
		size  uint64
		align uintptr
	}{
		{"descriptor table", &r.Desc, DescTableSize(n), DescAlign},
		{"available ring", &r.Avail, AvailRingSize(n), AvailAlign},
		{"used ring", &r.Used, UsedRingSize(n), UsedAlign},
	}
	for _, p := range parts {
		b := *p.b
		if uint64(len(b)) < p.size {
			return Rings{}, fmt.Errorf("%s is %d bytes, want at least %d: %w", p.name, len(b), p.size, ErrInvalid)
		}
		if addr := reflect.ValueOf(&b[0]).Pointer(); addr%p.align != 0 {
			return Rings{}, fmt.Errorf("%s at %#x is not %d-byte aligned: %w", p.name, addr, p.align, ErrInvalid)
		}
		*p.b = b[:p.size:p.size]
	}
	return r, nil
}
