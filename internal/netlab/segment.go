package netlab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// Segment makes one namespace per address, each with a veth v0 holding
// its address, whose other end is a port of bridge br0 in a namespace of
// its own ("sw"): hosts on one Ethernet segment, in the order of addrs,
// labelled a, b, c, … ARP requests name each host's own address
// (arp_announce 2), never a forged source, so a host that forges another's
// address (SpoofUDP) does not divert its traffic. At most 26 hosts.
func (l *Lab) Segment(addrs ...netip.Prefix) ([]*NS, error) {
	if len(addrs) > 26 {
		return nil, fmt.Errorf("segment of %d hosts, at most 26", len(addrs))
	}
	sw, err := l.AddNS("sw")
	if err != nil {
		return nil, err
	}
	if err := sw.AddBridge("br0"); err != nil {
		return nil, err
	}
	var out []*NS
	for i, p := range addrs {
		label := string(rune('a' + i))
		ns, err := l.AddNS(label)
		if err != nil {
			return nil, err
		}
		port := "p" + label
		for _, step := range []func() error{
			func() error { return l.Veth(ns, "v0", sw, port) },
			func() error { return sw.SetMaster(port, "br0") },
			func() error { return sw.SetUp(port, true) },
			func() error { return ns.AddAddr("v0", p) },
			func() error { return ns.SetUp("v0", true) },
			func() error { return ns.Sysctl("net.ipv4.conf.all.arp_announce", "2") },
		} {
			if err := step(); err != nil {
				return nil, err
			}
		}
		out = append(out, ns)
	}
	return out, nil
}

// SpoofUDP opens, in the namespace, an IPv4 UDP socket that sends from
// src, an address the namespace need not own (IP_TRANSPARENT and
// IP_FREEBIND; root), with DF and IPv4 Identification 0 as a RoCEv2
// sender's, so that an ICRC sealed over the forged addresses and ports is
// right: the attacker of spoofing tests. src must lie in Range4.
func (n *NS) SpoofUDP(src netip.AddrPort) (*net.UDPConn, error) {
	if err := checkAddr(src.Addr()); err != nil {
		return nil, err
	}
	var c *net.UDPConn
	err := n.Do(func() error {
		lc := net.ListenConfig{Control: func(_, _ string, raw syscall.RawConn) error {
			var serr error
			if err := raw.Control(func(fd uintptr) {
				for _, o := range [][2]int{{unix.IP_TRANSPARENT, 1}, {unix.IP_FREEBIND, 1}, {unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO}} {
					if serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, o[0], o[1]); serr != nil {
						return
					}
				}
			}); err != nil {
				return err
			}
			return serr
		}}
		pc, err := lc.ListenPacket(context.Background(), "udp4", src.String())
		if err != nil {
			return err
		}
		c = pc.(*net.UDPConn)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("spoofing socket %s/%s: %w", n.Label, src, err)
	}
	return c, nil
}
