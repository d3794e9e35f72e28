package udp

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// batch is the memory of one sendmmsg or recvmmsg call: n message headers,
// each with one iovec over its own buffer and a socket address. It is
// allocated once; the headers point into it, so it must stay reachable
// while a call runs (it is a field of the Endpoint).
type batch struct {
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6 // large enough for an IPv4 address too
	bufs  [][]byte
}

func newBatch(n, size int) *batch {
	b := &batch{
		hdrs:  make([]unix.Mmsghdr, n),
		iovs:  make([]unix.Iovec, n),
		names: make([]unix.RawSockaddrInet6, n),
		bufs:  make([][]byte, n),
	}
	mem := make([]byte, n*size)
	for i := range n {
		b.bufs[i] = mem[i*size : (i+1)*size : (i+1)*size]
		b.iovs[i].Base = &b.bufs[i][0]
		b.iovs[i].SetLen(size)
		h := &b.hdrs[i].Hdr
		h.Iov = &b.iovs[i]
		h.SetIovlen(1)
		h.Name = (*byte)(unsafe.Pointer(&b.names[i]))
		h.Namelen = unix.SizeofSockaddrInet6
	}
	return b
}

// resetRecv readies message i for recvmmsg.
func (b *batch) resetRecv(i int) {
	b.iovs[i].SetLen(len(b.bufs[i]))
	b.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
	b.hdrs[i].Hdr.Flags = 0
	b.hdrs[i].Len = 0
}

// setSend readies message i for sendmmsg: n bytes of its buffer to ap.
func (b *batch) setSend(i, n int, ap netip.AddrPort) {
	b.iovs[i].SetLen(n)
	sa := &b.names[i]
	a := ap.Addr()
	port := ap.Port()
	if a.Is4() {
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		*s4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.As4()}
		p := (*[2]byte)(unsafe.Pointer(&s4.Port))
		p[0], p[1] = byte(port>>8), byte(port)
		b.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet4
		return
	}
	*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: a.As16()}
	p := (*[2]byte)(unsafe.Pointer(&sa.Port))
	p[0], p[1] = byte(port>>8), byte(port)
	b.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
}

// source returns the address recvmmsg stored for message i.
func (b *batch) source(i int) netip.AddrPort {
	sa := &b.names[i]
	switch sa.Family {
	case unix.AF_INET:
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		p := (*[2]byte)(unsafe.Pointer(&s4.Port))
		return netip.AddrPortFrom(netip.AddrFrom4(s4.Addr), uint16(p[0])<<8|uint16(p[1]))
	case unix.AF_INET6:
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(p[0])<<8|uint16(p[1]))
	}
	return netip.AddrPort{}
}

// mmsg calls sendmmsg or recvmmsg (trap) on fd for hdrs without blocking.
func mmsg(trap uintptr, fd uintptr, hdrs []unix.Mmsghdr) (int, unix.Errno) {
	n, _, e := unix.Syscall6(trap, fd, uintptr(unsafe.Pointer(&hdrs[0])), uintptr(len(hdrs)), unix.MSG_DONTWAIT, 0, 0)
	return int(n), e
}
