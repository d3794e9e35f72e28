package udp

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vrdma/vrdma/backend/rdma/roce"
)

// GID is the GID of a host address: IPv4-mapped for IPv4 (::ffff:a.b.c.d),
// the address itself for IPv6.
func GID(a netip.Addr) [16]byte { return a.Unmap().As16() }

// AddrOfGID is the host address of a GID: IPv4 for an IPv4-mapped GID.
func AddrOfGID(gid [16]byte) netip.Addr { return netip.AddrFrom16(gid).Unmap() }

// MaxAddrs bounds the host addresses of one device: the GID table's
// entries after the port GID.
const MaxAddrs = 15

// ParseHostAddrs parses the host addresses RoCE traffic may leave from
// (vrdmad --roce-bind, the control API's roce_bind): unicast IPv4 or IPv6
// addresses that are not link-local (the ICRC covers the address, so it
// must be the one peers send to), each once, at most MaxAddrs.
func ParseHostAddrs(ss []string) ([]netip.Addr, error) {
	if len(ss) > MaxAddrs {
		return nil, fmt.Errorf("%d addresses, at most %d", len(ss), MaxAddrs)
	}
	var out []netip.Addr
	for _, s := range ss {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("%q is not an IP address", s)
		}
		a = a.Unmap()
		if a.IsUnspecified() || a.IsMulticast() || a.IsLinkLocalUnicast() || a.IsInterfaceLocalMulticast() {
			return nil, fmt.Errorf("%s is not a unicast host address", a)
		}
		for _, o := range out {
			if o == a {
				return nil, fmt.Errorf("%s given twice", a)
			}
		}
		out = append(out, a)
	}
	return out, nil
}

// headroom is what a RoCEv2 packet adds to its payload, at most: IPv4 (20
// bytes; IPv6 adds 20 more), UDP, BTH, RETH with ImmDt, ICRC.
const headroom = 20 + 8 + roce.BTHLen + roce.RETHLen + roce.ImmDtLen + roce.ICRCLen

// LinkPMTU is the largest IBA path MTU whose packets fit the MTU of the
// link that holds addr (what rxe calls the port's active MTU): 1024 on a
// 1500-byte Ethernet link, 4096 from 4160 bytes on (4096 when no link
// holds addr).
func LinkPMTU(addr netip.Addr) roce.MTU {
	m, _ := FindLinkPMTU(addr)
	return m
}

// FindLinkPMTU is LinkPMTU, and whether an interface has addr (false:
// MTU4096, as LinkPMTU says for an address on no interface — one bound
// with Config.FreeBind that has not arrived yet).
func FindLinkPMTU(addr netip.Addr) (roce.MTU, bool) {
	link := 0
	ifs, _ := net.Interfaces()
	for _, ifc := range ifs {
		as, _ := ifc.Addrs()
		for _, a := range as {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Unmap() == addr {
				link = ifc.MTU
			}
		}
	}
	if link == 0 {
		return roce.MTU4096, false
	}
	room := link - headroom
	if addr.Is6() {
		room -= 20
	}
	for m := roce.MTU4096; m > roce.MTU256; m /= 2 {
		if int(m) <= room {
			return m, true
		}
	}
	return roce.MTU256, true
}
