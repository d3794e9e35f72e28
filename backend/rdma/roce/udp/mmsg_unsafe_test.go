package udp

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// putGROSize writes a UDP_GRO control message saying seg at the start of
// ctl (8-aligned, at least rxCtlSpace bytes) and returns its length: what
// the kernel writes, for tests.
func putGROSize(ctl []byte, seg int32) int {
	h := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_GRO
	h.SetLen(unix.CmsgLen(4))
	*(*int32)(unsafe.Pointer(&ctl[unix.CmsgLen(0)])) = seg
	return unix.CmsgSpace(4)
}

// unsafeAligned returns n zero bytes, 8-aligned, for control messages.
func unsafeAligned(n int) []byte {
	m := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&m[0])), n)
}

// cmsgAt is the control message header at the start of c (8-aligned, at
// least SizeofCmsghdr bytes).
func cmsgAt(c []byte) *unix.Cmsghdr { return (*unix.Cmsghdr)(unsafe.Pointer(&c[0])) }
