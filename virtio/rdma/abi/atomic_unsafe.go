package abi

import (
	"sync/atomic"
	"unsafe"
)

// Shared-memory accessors. Rings live in memory that another party (the
// driver, or the device) writes concurrently, so the fields both sides touch
// (ring indices, flags, event indices) are read and written with atomic
// operations: a load is never torn or hoisted out of a loop by the compiler,
// and a store is sequentially consistent (a full barrier on amd64), which the
// virtio notification-suppression protocol needs between publishing an index
// and reading the other side's event index.
//
// Every accessor panics with an index-out-of-range error if the field does
// not lie wholly inside b, and requires natural alignment of the address
// (guaranteed by the ring layout checks of package virtio).

// LoadUint16 atomically loads the little-endian uint16 at b[off:off+2].
func LoadUint16(b []byte, off int) uint16 {
	_ = b[off+1]
	return load16((*uint16)(unsafe.Pointer(&b[off])))
}

// StoreUint16 atomically stores v at b[off:off+2].
func StoreUint16(b []byte, off int, v uint16) {
	_ = b[off+1]
	store16((*uint16)(unsafe.Pointer(&b[off])), v)
}

// LoadUint32 atomically loads the uint32 at b[off:off+4].
func LoadUint32(b []byte, off int) uint32 {
	_ = b[off+3]
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&b[off])))
}

// StoreUint32 atomically stores v at b[off:off+4].
func StoreUint32(b []byte, off int, v uint32) {
	_ = b[off+3]
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&b[off])), v)
}

// LoadUint64 atomically loads the uint64 at b[off:off+8].
func LoadUint64(b []byte, off int) uint64 {
	_ = b[off+7]
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&b[off])))
}

// StoreUint64 atomically stores v at b[off:off+8].
func StoreUint64(b []byte, off int, v uint64) {
	_ = b[off+7]
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&b[off])), v)
}

// Fence is a full memory barrier.
func Fence() {
	var x uint32
	atomic.AddUint32(&x, 0)
}

//go:noescape
func load16(addr *uint16) uint16

//go:noescape
func store16(addr *uint16, v uint16)

// CompareAndSwapUint64 atomically compares the uint64 at b[off:off+8] with
// old and, if equal, stores new (a locked 64-bit operation, atomic with
// respect to guest CPUs). It reports whether the swap happened. The caller
// checks alignment (8 bytes, for the operation to be a single cache line).
func CompareAndSwapUint64(b []byte, off int, old, new uint64) bool {
	_ = b[off+7]
	return atomic.CompareAndSwapUint64((*uint64)(unsafe.Pointer(&b[off])), old, new)
}

// AddUint64 atomically adds delta to the uint64 at b[off:off+8] and returns
// the new value. The caller checks alignment as for CompareAndSwapUint64.
func AddUint64(b []byte, off int, delta uint64) (new uint64) {
	_ = b[off+7]
	return atomic.AddUint64((*uint64)(unsafe.Pointer(&b[off])), delta)
}
