package netlab

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
)

// MaxPaths bounds MultiPath's path count (path i uses 10.200.i.0/24).
const MaxPaths = 64

// Routing tables and rule priorities Divert uses in M: path i's traffic
// from A is looked up in table divertTable+2i, from B in divertTable+2i+1.
const (
	divertTable = 100
	divertPref  = 100
)

// Path is one of MultiPath's parallel paths; all fields are immutable.
//
//	A 10.200.i.1/25   p<i> ── ma<i> 10.200.i.2/25   (M)   10.200.i.130/25 mb<i> ── p<i>   10.200.i.129/25 B
//	  fd00:7672:i:a::1/64       fd00:7672:i:a::2/64         fd00:7672:i:b::2/64         fd00:7672:i:b::1/64
type Path struct {
	Index int
	// A and B are the path's IPv4 addresses in A and B; A6 and B6 the
	// IPv6 ones. A's route to B's addresses of path i goes through path
	// i only, and B's back likewise, so each (A, B) pair is one path.
	A, B, A6, B6 netip.Addr
	// ALink and BLink are the path's links in A and B ("p<i>").
	ALink, BLink string
	// MALink and MBLink are M's ends towards A ("ma<i>") and B ("mb<i>").
	MALink, MBLink string
	// MA, MB, MA6, MB6 are M's addresses on MALink and MBLink (the
	// gateways of A and B).
	MA, MB, MA6, MB6 netip.Addr
	// AMAC, MAMAC, MBMAC and BMAC are the fixed MAC addresses of ALink,
	// MALink, MBLink and BLink (02:76:72:<i>:<a1|a2|b2|b1>:00). Every
	// end has its peer as a permanent neighbour: no ARP or neighbour
	// discovery, and a packet sent while the path is down is dropped at
	// once instead of waiting in the neighbour queue (which the kernel
	// would send, seconds later, once the path is back).
	AMAC, MAMAC, MBMAC, BMAC string
}

// MultiPath is host A and host B joined through a middle namespace M by
// parallel paths; M forwards in the kernel until Divert hands a path to a
// user-space hop.
type MultiPath struct {
	lab     *Lab
	A, M, B *NS    // immutable
	Paths   []Path // immutable
}

// NewMultiPath builds A, M and B with paths (1..MaxPaths) parallel paths,
// all links up and routes in place, IPv4 and IPv6. In all three
// namespaces IPv6 addresses survive a link going down
// (keep_addr_on_down); M forwards (ip_forward, IPv6 forwarding) with
// reverse-path filtering off.
func (l *Lab) NewMultiPath(paths int) (*MultiPath, error) {
	if paths < 1 || paths > MaxPaths {
		return nil, fmt.Errorf("%w: %d paths (want 1..%d)", ErrName, paths, MaxPaths)
	}
	mp := &MultiPath{lab: l}
	var err error
	if mp.A, err = l.AddNS("a"); err != nil {
		return nil, err
	}
	if mp.M, err = l.AddNS("m"); err != nil {
		return nil, err
	}
	if mp.B, err = l.AddNS("b"); err != nil {
		return nil, err
	}
	// Before the links exist, so "default" reaches them.
	for _, n := range []*NS{mp.A, mp.M, mp.B} {
		for _, kv := range [][2]string{
			{"net.ipv6.conf.all.keep_addr_on_down", "1"},
			{"net.ipv6.conf.default.keep_addr_on_down", "1"},
			{"net.ipv6.conf.default.accept_dad", "0"},
		} {
			if err := n.Sysctl(kv[0], kv[1]); err != nil {
				return nil, err
			}
		}
	}
	for _, kv := range [][2]string{
		{"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.conf.default.rp_filter", "0"},
		{"net.ipv4.ip_forward", "1"},
		{"net.ipv6.conf.all.forwarding", "1"},
		{"net.ipv6.conf.default.forwarding", "1"},
	} {
		if err := mp.M.Sysctl(kv[0], kv[1]); err != nil {
			return nil, err
		}
	}
	for i := range paths {
		p := pathAddrs(i)
		if err := mp.addPath(p); err != nil {
			return nil, fmt.Errorf("path %d: %w", i, err)
		}
		mp.Paths = append(mp.Paths, p)
	}
	return mp, nil
}

// pathAddrs returns path i's names and addresses (see Path).
func pathAddrs(i int) Path {
	v4 := func(host byte) netip.Addr { return netip.AddrFrom4([4]byte{10, 200, byte(i), host}) }
	v6 := func(side byte, host byte) netip.Addr {
		// fd00:7672:<i>:<side>::<host>
		return netip.AddrFrom16([16]byte{0xfd, 0, 0x76, 0x72, 0, byte(i), 0, side,
			15: host})
	}
	mac := func(end byte) string { return fmt.Sprintf("02:76:72:%02x:%02x:00", i, end) }
	return Path{
		Index: i,
		A:     v4(1), MA: v4(2), B: v4(129), MB: v4(130),
		A6: v6(0xa, 1), MA6: v6(0xa, 2), B6: v6(0xb, 1), MB6: v6(0xb, 2),
		AMAC: mac(0xa1), MAMAC: mac(0xa2), MBMAC: mac(0xb2), BMAC: mac(0xb1),
		ALink: fmt.Sprintf("p%d", i), BLink: fmt.Sprintf("p%d", i),
		MALink: fmt.Sprintf("ma%d", i), MBLink: fmt.Sprintf("mb%d", i),
	}
}

func (mp *MultiPath) addPath(p Path) error {
	l := mp.lab
	if err := l.veth(mp.A, p.ALink, p.AMAC, mp.M, p.MALink, p.MAMAC); err != nil {
		return err
	}
	if err := l.veth(mp.M, p.MBLink, p.MBMAC, mp.B, p.BLink, p.BMAC); err != nil {
		return err
	}
	type end struct {
		ns     *NS
		link   string
		v4, v6 netip.Addr
	}
	for _, e := range []end{
		{mp.A, p.ALink, p.A, p.A6}, {mp.M, p.MALink, p.MA, p.MA6},
		{mp.M, p.MBLink, p.MB, p.MB6}, {mp.B, p.BLink, p.B, p.B6},
	} {
		if err := e.ns.AddAddr(e.link, netip.PrefixFrom(e.v4, 25)); err != nil {
			return err
		}
		if err := e.ns.AddAddr(e.link, netip.PrefixFrom(e.v6, 64)); err != nil {
			return err
		}
		if err := e.ns.SetUp(e.link, true); err != nil {
			return err
		}
	}
	for _, r := range []struct {
		ns *NS
		Route
	}{
		{mp.A, Route{Dst: netip.PrefixFrom(p.B, 25), Via: p.MA, Dev: p.ALink, Src: p.A}},
		{mp.A, Route{Dst: netip.PrefixFrom(p.B6, 64), Via: p.MA6, Dev: p.ALink, Src: p.A6}},
		{mp.B, Route{Dst: netip.PrefixFrom(p.A, 25), Via: p.MB, Dev: p.BLink, Src: p.B}},
		{mp.B, Route{Dst: netip.PrefixFrom(p.A6, 64), Via: p.MB6, Dev: p.BLink, Src: p.B6}},
	} {
		if err := r.ns.AddRoute(r.Route); err != nil {
			return err
		}
	}
	for _, e := range []struct {
		ns   *NS
		link string
		mac  string
		ips  []netip.Addr
	}{
		{mp.A, p.ALink, p.MAMAC, []netip.Addr{p.MA, p.MA6}},
		{mp.B, p.BLink, p.MBMAC, []netip.Addr{p.MB, p.MB6}},
	} {
		if err := e.ns.addNeigh(e.link, e.mac, e.ips...); err != nil {
			return err
		}
	}
	return mp.mNeighbours(p)
}

// mNeighbours sets M's permanent neighbour entries of path p (an
// administrative down of the link deletes them).
func (mp *MultiPath) mNeighbours(p Path) error {
	if err := mp.M.addNeigh(p.MALink, p.AMAC, p.A, p.A6); err != nil {
		return err
	}
	return mp.M.addNeigh(p.MBLink, p.BMAC, p.B, p.B6)
}

// addNeigh makes ips on link permanent neighbours with the address mac.
func (n *NS) addNeigh(link, mac string, ips ...netip.Addr) error {
	for _, ip := range ips {
		if err := checkAddr(ip); err != nil {
			return err
		}
		if _, err := n.IP("neigh", "replace", ip.String(), "lladdr", mac, "dev", link,
			"nud", "permanent"); err != nil {
			return fmt.Errorf("neighbour %s/%s: %w", n.Label, link, err)
		}
	}
	return nil
}

// SetPathUp sets both of M's links of path i down or up: a path that
// fails in the middle. A's and B's ends stay administratively up (they
// lose carrier), so their routes and addresses stay; M's connected routes
// come back with the links.
func (mp *MultiPath) SetPathUp(i int, up bool) error {
	if i < 0 || i >= len(mp.Paths) {
		return fmt.Errorf("%w: path %d of %d", ErrName, i, len(mp.Paths))
	}
	p := mp.Paths[i]
	if err := errors.Join(mp.M.SetUp(p.MALink, up), mp.M.SetUp(p.MBLink, up)); err != nil {
		return err
	}
	if up {
		return mp.mNeighbours(p)
	}
	return nil
}

// Divert hands path i's forwarding in M to user space: it creates two TUN
// devices in M, "hopa<i>" and "hopb<i>", and policy rules so that every
// packet arriving on MALink (from A) is routed into hopa<i> and every
// packet arriving on MBLink (from B) into hopb<i>. fromA yields what A
// sent, fromB what B sent. A packet written back into either TUN is routed
// by M's main table, which sends it out of the link towards its
// destination with its addresses unchanged.
//
// mtu is the TUNs' MTU (0: 1500, the veths' MTU); a reader's buffers must
// hold that much.
//
// The TUNs vanish when the files are closed; the rules then find an empty
// table and M forwards the path in the kernel again.
func (mp *MultiPath) Divert(i, mtu int) (fromA, fromB *os.File, err error) {
	if i < 0 || i >= len(mp.Paths) {
		return nil, nil, fmt.Errorf("%w: path %d of %d", ErrName, i, len(mp.Paths))
	}
	p := mp.Paths[i]
	m := mp.M
	var files []*os.File
	defer func() {
		if err != nil {
			for _, f := range files {
				f.Close()
			}
		}
	}()
	// M must send nothing of its own into the TUNs, so that a hop sees
	// only A's and B's packets. A device made while IPv6 forwarding is its
	// default joins the all-routers groups and reports them with MLD when
	// it comes up (and turning its forwarding off later sends a leave
	// report): so new devices in M start without it (forwarding itself
	// stays on: net.ipv6.conf.all.forwarding), and the TUNs get no
	// multicast and no link-local address.
	if err := m.Sysctl("net.ipv6.conf.default.forwarding", "0"); err != nil {
		return nil, nil, err
	}
	for side, in := range []string{p.MALink, p.MBLink} {
		tun := fmt.Sprintf("hop%c%d", "ab"[side], i)
		f, err := m.OpenTUN(tun)
		if err != nil {
			return nil, nil, err
		}
		files = append(files, f)
		if _, err := m.IP("link", "set", "dev", tun, "multicast", "off", "addrgenmode", "none"); err != nil {
			return nil, nil, fmt.Errorf("tun %s: %w", tun, err)
		}
		if mtu != 0 {
			if err := m.SetMTU(tun, mtu); err != nil {
				return nil, nil, err
			}
		}
		if err := m.SetUp(tun, true); err != nil {
			return nil, nil, err
		}
		table := divertTable + 2*i + side
		for _, dst := range []netip.Prefix{Range4, Range6} {
			if err := m.AddRoute(Route{Dst: dst, Dev: tun, Table: table}); err != nil {
				return nil, nil, err
			}
		}
		pref := divertPref + 2*i + side
		for _, fam := range []string{"-4", "-6"} {
			// A rule left by an earlier Divert of this path (its TUN
			// gone) would make the add below fail with EEXIST.
			m.IP(fam, "rule", "del", "pref", strconv.Itoa(pref)) //nolint:errcheck // usually absent
		}
		if err := m.AddRuleIIF(in, table, pref); err != nil {
			return nil, nil, err
		}
	}
	return files[0], files[1], nil
}
