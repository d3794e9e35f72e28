package udp

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"sync"

	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
)

// Network is a set of endpoints, one per host address, as the engine sees
// the network (it implements engine.Network): a QP connects from the
// endpoint of its source GID's address to its destination GID's address.
// The zero value is not usable; call NewNetwork.
type Network struct {
	tmpl Config // immutable: every endpoint's configuration but Addr

	mu  sync.Mutex
	eps map[netip.Addr]*Endpoint // protected by mu
}

// ErrNoEndpoint: the source address has no endpoint (Listen first).
var ErrNoEndpoint = errors.New("udp: no endpoint on the source address")

// NewNetwork returns a network with no endpoint; tmpl configures the
// endpoints Listen opens (its Addr is ignored).
func NewNetwork(tmpl Config) *Network {
	return &Network{tmpl: tmpl, eps: make(map[netip.Addr]*Endpoint)}
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
	return e, nil
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
	e := n.eps[src]
	n.mu.Unlock()
	if e == nil {
		return nil, fmt.Errorf("%w: %v", ErrNoEndpoint, src)
	}
	if !dst.IsValid() || dst.IsUnspecified() || dst.IsMulticast() || dst.Is4() != src.Is4() {
		return nil, fmt.Errorf("%w: destination %v from %v", ErrConfig, dst, src)
	}
	c, err := e.NewConn(cfg, netip.AddrPortFrom(dst, 0), host)
	if err != nil {
		return nil, err
	}
	return c, nil
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
