package main

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// mmsgBatch is the memory of the roce section's raw sendmmsg and recvmmsg
// calls on a connected UDP socket (so no addresses): n headers with one
// iovec each, all over one buffer (the blast sends the same bytes every
// time and the receiver only counts). It must stay reachable while a
// call runs.
type mmsgBatch struct {
	hdrs []unix.Mmsghdr
	iovs []unix.Iovec
	buf  []byte
}

// newMmsgBatch returns n messages of size bytes each.
func newMmsgBatch(n, size int) *mmsgBatch {
	b := &mmsgBatch{hdrs: make([]unix.Mmsghdr, n), iovs: make([]unix.Iovec, n), buf: make([]byte, size)}
	for i := range n {
		b.iovs[i].Base = &b.buf[0]
		b.iovs[i].SetLen(size)
		b.hdrs[i].Hdr.Iov = &b.iovs[i]
		b.hdrs[i].Hdr.SetIovlen(1)
	}
	return b
}

// mmsgCall calls sendmmsg or recvmmsg (trap) on fd for hdrs without
// blocking.
func mmsgCall(trap uintptr, fd uintptr, hdrs []unix.Mmsghdr) (int, unix.Errno) {
	n, _, e := unix.Syscall6(trap, fd, uintptr(unsafe.Pointer(&hdrs[0])), uintptr(len(hdrs)), unix.MSG_DONTWAIT, 0, 0)
	return int(n), e
}
