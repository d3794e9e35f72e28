package udp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"sync"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
)

// Network is a set of endpoints, one per host address, as the engine sees
// the network (it implements engine.Network): a QP connects from the
// endpoint of its source GID's address to its destination GID's address.
// The zero value is not usable; call NewNetwork.
type Network struct {
	tmpl Config // immutable: every endpoint's configuration but Addr

	mu   sync.Mutex
	eps  map[netip.Addr]*Endpoint // protected by mu
	pmtu map[netip.Addr]roce.MTU  // protected by mu: the largest path MTU of each endpoint's link
}

// ErrNoEndpoint: the source address has no endpoint (Listen first).
var ErrNoEndpoint = errors.New("udp: no endpoint on the source address")

// NewNetwork returns a network with no endpoint; tmpl configures the
// endpoints Listen opens (its Addr is ignored).
func NewNetwork(tmpl Config) *Network {
	return &Network{tmpl: tmpl, eps: make(map[netip.Addr]*Endpoint), pmtu: make(map[netip.Addr]roce.MTU)}
}

// Listen opens the endpoint of addr, or returns the one already open.
func (n *Network) Listen(addr netip.Addr) (*Endpoint, error) {
	addr = addr.Unmap()
	n.mu.Lock()
	defer n.mu.Unlock()
	if e := n.eps[addr]; e != nil {
		return e, nil
	}
	cfg := n.tmpl
	cfg.Addr = addr
	e, err := Listen(cfg)
	if err != nil {
		return nil, err
	}
	n.eps[addr] = e
	n.pmtu[addr] = LinkPMTU(addr)
	return e, nil
}

// headroom is what a RoCEv2 packet adds to its payload, at most: IPv4 (20
// bytes; IPv6 adds 20 more), UDP, BTH, RETH with ImmDt, ICRC.
const headroom = 20 + 8 + roce.BTHLen + roce.RETHLen + roce.ImmDtLen + roce.ICRCLen

// LinkPMTU is the largest IBA path MTU whose packets fit the MTU of the
// link that holds addr (what rxe calls the port's active MTU): 1024 on a
// 1500-byte Ethernet link, 4096 from 4160 bytes on (4096 when no link
// holds addr).
func LinkPMTU(addr netip.Addr) roce.MTU {
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
		return roce.MTU4096
	}
	room := link - headroom
	if addr.Is6() {
		room -= 20
	}
	for m := roce.MTU4096; m > roce.MTU256; m /= 2 {
		if int(m) <= room {
			return m
		}
	}
	return roce.MTU256
}

// Endpoints returns the open endpoints, ordered by address.
func (n *Network) Endpoints() []*Endpoint {
	n.mu.Lock()
	defer n.mu.Unlock()
	es := make([]*Endpoint, 0, len(n.eps))
	for _, e := range n.eps {
		es = append(es, e)
	}
	sort.Slice(es, func(i, j int) bool { return es[i].cfg.Addr.Less(es[j].cfg.Addr) })
	return es
}

// GID is the GID of a host address: IPv4-mapped for IPv4 (::ffff:a.b.c.d),
// the address itself for IPv6.
func GID(a netip.Addr) [16]byte { return a.Unmap().As16() }

// AddrOfGID is the host address of a GID: IPv4 for an IPv4-mapped GID.
func AddrOfGID(gid [16]byte) netip.Addr { return netip.AddrFrom16(gid).Unmap() }

// Connect makes a QP in RTR on the endpoint of sgid's address, sending to
// dgid's address on port 4791 (engine.Network).
func (n *Network) Connect(sgid, dgid [16]byte, cfg rc.Config, host rc.Host) (rc.Conn, error) {
	src, dst := AddrOfGID(sgid), AddrOfGID(dgid)
	n.mu.Lock()
	e, pmtu := n.eps[src], n.pmtu[src]
	n.mu.Unlock()
	if e == nil {
		return nil, fmt.Errorf("%w: %v", ErrNoEndpoint, src)
	}
	if !dst.IsValid() || dst.IsUnspecified() || dst.IsMulticast() || dst.Is4() != src.Is4() {
		return nil, fmt.Errorf("%w: destination %v from %v", ErrConfig, dst, src)
	}
	// Both ends of a link lower the path MTU alike, as rxe lowers a QP's
	// to its port's active MTU.
	if pmtu != 0 && cfg.PMTU > pmtu {
		cfg.PMTU = pmtu
	}
	c, err := e.NewConn(cfg, netip.AddrPortFrom(dst, 0), host)
	if err != nil {
		return nil, err
	}
	return c, nil
}

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

// Close closes every endpoint (their QPs are closed: flushed).
func (n *Network) Close() error {
	n.mu.Lock()
	eps := n.eps
	n.eps = make(map[netip.Addr]*Endpoint)
	n.mu.Unlock()
	var errs []error
	for _, e := range eps {
		errs = append(errs, e.Close())
	}
	return errors.Join(errs...)
}
