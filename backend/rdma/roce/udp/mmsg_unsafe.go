package udp

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// batch is the memory of one sendmmsg or recvmmsg call: n message headers,
// each with one iovec over its own buffer, a socket address and, for a
// receive batch with UDP_GRO, ctlSize bytes of control messages. It is
// allocated once; the headers point into it, so it must stay reachable
// while a call runs (it is a field of the Endpoint).
type batch struct {
	hdrs    []unix.Mmsghdr
	iovs    []unix.Iovec
	names   []unix.RawSockaddrInet6 // large enough for an IPv4 address too
	bufs    [][]byte
	ctls    [][]byte // nil without control space
	ctlSize int
}

// newBatch returns n messages of size bytes each, with ctlSize bytes of
// control space each (a multiple of 8; 0: none).
func newBatch(n, size, ctlSize int) *batch {
	b := &batch{
		hdrs:    make([]unix.Mmsghdr, n),
		iovs:    make([]unix.Iovec, n),
		names:   make([]unix.RawSockaddrInet6, n),
		bufs:    make([][]byte, n),
		ctlSize: ctlSize,
	}
	mem := make([]byte, n*size)
	var ctl []uint64 // 8-aligned: the kernel writes cmsghdrs there
	if ctlSize > 0 {
		b.ctls = make([][]byte, n)
		ctl = make([]uint64, n*ctlSize/8)
	}
	for i := range n {
		b.bufs[i] = mem[i*size : (i+1)*size : (i+1)*size]
		b.iovs[i].Base = &b.bufs[i][0]
		b.iovs[i].SetLen(size)
		h := &b.hdrs[i].Hdr
		h.Iov = &b.iovs[i]
		h.SetIovlen(1)
		h.Name = (*byte)(unsafe.Pointer(&b.names[i]))
		h.Namelen = unix.SizeofSockaddrInet6
		if ctlSize > 0 {
			b.ctls[i] = unsafe.Slice((*byte)(unsafe.Pointer(&ctl[i*ctlSize/8])), ctlSize)
			h.Control = &b.ctls[i][0]
			h.SetControllen(ctlSize)
		}
	}
	return b
}

// resetRecv readies message i for recvmmsg.
func (b *batch) resetRecv(i int) {
	b.iovs[i].SetLen(len(b.bufs[i]))
	b.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
	b.hdrs[i].Hdr.Flags = 0
	b.hdrs[i].Len = 0
	if b.ctlSize > 0 {
		b.hdrs[i].Hdr.SetControllen(b.ctlSize)
	}
}

// control returns the control messages recvmmsg stored for message i.
func (b *batch) control(i int) []byte {
	if b.ctlSize == 0 {
		return nil
	}
	n := int(b.hdrs[i].Hdr.Controllen)
	if n < 0 || n > b.ctlSize {
		n = b.ctlSize
	}
	return b.ctls[i][:n]
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

// sendPlan is the messages of one flush (planRuns): each one packet of the
// send batch, or a run of them sent as one UDP_SEGMENT super-datagram.
// Like batch, it must stay reachable while a call runs.
type sendPlan struct {
	hdrs []unix.Mmsghdr
	runs []run
	ctl  []uint64 // one gsoCtlSpace per message, 8-aligned
}

func newSendPlan(n int) *sendPlan {
	return &sendPlan{hdrs: make([]unix.Mmsghdr, n), runs: make([]run, 0, n), ctl: make([]uint64, n*gsoCtlSpace/8)}
}

// build fills the headers of p.runs over the packets of b: message m
// covers the iovecs of its run, goes to the address of its first packet
// and, for a run of two or more, carries a UDP_SEGMENT control message
// with the run's segment size.
func (p *sendPlan) build(b *batch) {
	for m, r := range p.runs {
		h := &p.hdrs[m]
		src := &b.hdrs[r.first].Hdr
		*h = unix.Mmsghdr{}
		h.Hdr.Iov = &b.iovs[r.first]
		h.Hdr.SetIovlen(r.n)
		h.Hdr.Name = src.Name
		h.Hdr.Namelen = src.Namelen
		if r.n > 1 {
			c := unsafe.Slice((*byte)(unsafe.Pointer(&p.ctl[m*gsoCtlSpace/8])), gsoCtlSpace)
			ch := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
			ch.Level, ch.Type = unix.SOL_UDP, unix.UDP_SEGMENT
			ch.SetLen(unix.CmsgLen(2))
			*(*uint16)(unsafe.Pointer(&c[unix.CmsgLen(0)])) = uint16(r.seg)
			h.Hdr.Control = &c[0]
			h.Hdr.SetControllen(unix.CmsgSpace(2))
		}
	}
}

// groSize returns the gso_size of the UDP_GRO control message in ctl, if
// there is one: the size of each datagram the kernel coalesced into the
// buffer but the last. It walks at most len(ctl)/SizeofCmsghdr headers and
// stops at the first malformed one; it does not allocate. ctl must be
// 8-aligned (batch's control space is).
func groSize(ctl []byte) (int, bool) {
	for off := 0; off+unix.SizeofCmsghdr <= len(ctl); {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[off]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(ctl)-off {
			return 0, false
		}
		if h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && l >= unix.CmsgLen(4) {
			return int(*(*int32)(unsafe.Pointer(&ctl[off+unix.CmsgLen(0)]))), true
		}
		off += unix.CmsgSpace(l - unix.SizeofCmsghdr)
	}
	return 0, false
}
