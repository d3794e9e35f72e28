package main

import (
	"sync/atomic"
	"unsafe"
)

// loadByte reads b[i] with an atomic load of the aligned 32-bit word that
// holds it, so that a loop waiting for the device to write the byte reads
// memory on every turn. b must start 4-byte aligned (an MR's buffer
// starts on a page) and b[i] must exist.
func loadByte(b []byte, i int) byte {
	base := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if base&3 != 0 {
		panic("loadByte: unaligned buffer")
	}
	p := unsafe.Pointer(&b[i])
	off := uintptr(p) & 3
	word := (*uint32)(unsafe.Add(p, -int(off)))       // within b: base is aligned
	return byte(atomic.LoadUint32(word) >> (8 * off)) // little-endian (amd64, arm64)
}
