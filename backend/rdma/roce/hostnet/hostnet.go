// Package hostnet is the host's RoCE network as the engine sees it
// (engine.Network): the UDP 4791 endpoints of the host addresses vrdmad was
// told to send from (package udp), and the choice of transport for each
// QP connected through them — plain RoCEv2 RC (package rc over
// udp.Endpoint.NewConn), what Linux rxe and RoCE NICs speak, or the
// multipath spray extension (package spray) between vrdma hosts.
//
// A QP sprays when it asks for more than one path (MODIFY_QP's PATHS,
// docs/spec.md) or, when it does not say, when the network's default
// (vrdmad --roce-paths) is more than one. Spraying is negotiated with the
// peer: a peer that does not answer (rxe, a vrdma QP set to one path) gets
// plain RC, after the negotiation's bounded wait. Its paths go from the
// device's addresses of the QP's family (the source GID's first) to the
// peer's addresses.
//
// A live upgrade of vrdmad hands the network over to the new process
// (handover.go): Freeze stops every endpoint (datagrams wait in the
// sockets) and returns the endpoints' addresses with duplicates of their
// sockets; the new process's Adopt serves the same sockets, frozen until
// its Thaw (after the handover is committed, so that a refused handover
// leaves everything to the old process). A plain RoCEv2 connection is
// carried as an rc.ConnState (FreezeConn, Restore); a sprayed one cannot be
// yet (ErrNotTransferable).
//
// Non-goals: routing and ECMP (the kernel's and the fabric's), source
// ports per path (paths differ by address pair; see package spray),
// carrying multipath (spray) connections across a handover.
package hostnet

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/spray"
	"github.com/vrdma/vrdma/backend/rdma/roce/ud"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
)

// MaxPaths bounds the paths of one QP.
const MaxPaths = 64

// Sentinels.
var (
	// ErrNoEndpoint: the source address has no endpoint (Listen first).
	ErrNoEndpoint = errors.New("hostnet: no endpoint on the source address")
	// ErrAddr: a destination the network cannot send to.
	ErrAddr = errors.New("hostnet: bad destination")
)

// Network is a set of endpoints, one per host address. The zero value is
// not usable; call New.
type Network struct {
	tmpl  udp.Config // immutable: every endpoint's configuration but Addr
	paths int        // immutable: a QP's paths when it does not say

	mu     sync.Mutex
	eps    map[netip.Addr]*udp.Endpoint // protected by mu
	pmtu   map[netip.Addr]roce.MTU      // protected by mu: the largest path MTU of each endpoint's link (none yet: ListenFree's address is on no interface)
	frozen bool                         // protected by mu: Freeze or Adopt without Thaw since; new endpoints start frozen
}

// New returns a network with no endpoint; tmpl configures the endpoints
// Listen opens (its Addr is ignored), paths (1 … MaxPaths; 0 means 1) is
// the paths a QP sprays over when it does not ask.
func New(tmpl udp.Config, paths int) (*Network, error) {
	if paths == 0 {
		paths = 1
	}
	if paths < 1 || paths > MaxPaths {
		return nil, fmt.Errorf("hostnet: %d paths, want 1 … %d", paths, MaxPaths)
	}
	return &Network{tmpl: tmpl, paths: paths, eps: make(map[netip.Addr]*udp.Endpoint), pmtu: make(map[netip.Addr]roce.MTU)}, nil
}

// Paths returns the default paths of a QP.
func (n *Network) Paths() int { return n.paths }

// Listen opens the endpoint of addr, or returns the one already open. On a
// frozen network (Freeze, Adopt) the new endpoint is frozen too, until
// Thaw.
func (n *Network) Listen(addr netip.Addr) (*udp.Endpoint, error) {
	return n.listen(addr, false)
}

// ListenFree is Listen for an address that need not be on an interface
// yet (udp.Config.FreeBind): a live migration's destination device opens
// the address that moves to this host with its VM. The link's path MTU
// is looked up again at each Connect until the address arrives.
func (n *Network) ListenFree(addr netip.Addr) (*udp.Endpoint, error) {
	return n.listen(addr, true)
}

func (n *Network) listen(addr netip.Addr, free bool) (*udp.Endpoint, error) {
	addr = addr.Unmap()
	n.mu.Lock()
	defer n.mu.Unlock()
	if e := n.eps[addr]; e != nil {
		return e, nil
	}
	cfg := n.tmpl
	cfg.Addr, cfg.FreeBind = addr, free
	e, err := udp.Listen(cfg)
	if err != nil {
		return nil, err
	}
	if n.frozen {
		_ = e.Freeze() // cannot fail: e is open
	}
	n.eps[addr] = e
	if m, ok := udp.FindLinkPMTU(addr); ok || !free {
		n.pmtu[addr] = m
	}
	return e, nil
}

// pmtuLocked is the path MTU of the link of the endpoint on addr (0:
// none known yet). Precondition: n.mu held.
func (n *Network) pmtuLocked(addr netip.Addr) roce.MTU {
	if m, ok := n.pmtu[addr]; ok {
		return m
	}
	if _, open := n.eps[addr]; !open {
		return 0
	}
	m, ok := udp.FindLinkPMTU(addr)
	if !ok {
		return 0
	}
	n.pmtu[addr] = m
	return m
}

// Endpoints returns the open endpoints, ordered by address.
func (n *Network) Endpoints() []*udp.Endpoint {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sortedLocked()
}

// Connect makes a QP in RTR connected from the host address of sgid to
// the host address of dgid (engine.Network). locals are the GIDs of the
// device's host addresses (sgid among them) that spray paths may leave
// from; paths is the QP's choice (0: the network's default).
func (n *Network) Connect(sgid, dgid [16]byte, locals [][16]byte, paths int, cfg rc.Config, host rc.Host) (rc.Conn, error) {
	src, dst := udp.AddrOfGID(sgid), udp.AddrOfGID(dgid)
	if !dst.IsValid() || dst.IsUnspecified() || dst.IsMulticast() || dst.Is4() != src.Is4() {
		return nil, fmt.Errorf("%w: %v from %v", ErrAddr, dst, src)
	}
	if paths == 0 {
		paths = n.paths
	}
	if paths < 1 || paths > MaxPaths {
		return nil, fmt.Errorf("hostnet: %d paths, want 1 … %d", paths, MaxPaths)
	}
	n.mu.Lock()
	e, pmtu := n.eps[src], n.pmtuLocked(src)
	eps := []*udp.Endpoint{e}
	for _, g := range locals {
		a := udp.AddrOfGID(g)
		if o := n.eps[a]; o != nil && a != src && a.Is4() == src.Is4() {
			eps = append(eps, o)
			// Every path carries the QP's packets: the smallest link
			// bounds the path MTU.
			if m := n.pmtuLocked(a); m != 0 && (pmtu == 0 || m < pmtu) {
				pmtu = m
			}
		}
	}
	n.mu.Unlock()
	if e == nil {
		return nil, fmt.Errorf("%w: %v", ErrNoEndpoint, src)
	}
	// Both ends of a link lower the path MTU alike, as rxe lowers a QP's
	// to its port's active MTU.
	if pmtu != 0 && cfg.PMTU > pmtu {
		cfg.PMTU = pmtu
	}
	if cfg.Burst == 0 {
		// A burst fills one sendmmsg batch of the endpoint.
		cfg.Burst = udp.DefaultBatch
	}
	peer := netip.AddrPortFrom(dst, roce.UDPPort)
	if paths == 1 {
		c, err := e.NewConn(cfg, peer, host)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
	c, err := spray.New(spray.Config{RC: cfg, Locals: eps, Peer: peer, Paths: paths}, host)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Close closes every endpoint (their QPs are closed: flushed).
func (n *Network) Close() error {
	n.mu.Lock()
	eps := n.eps
	n.eps = make(map[netip.Addr]*udp.Endpoint)
	n.mu.Unlock()
	var errs []error
	for _, e := range eps {
		errs = append(errs, e.Close())
	}
	return errors.Join(errs...)
}

// gsiQPN is the QP number of every device's GSI QP (docs/spec.md § Kernel
// verbs and the GSI QP): the one number two attachments may ask for at
// the same address.
const gsiQPN = 1

// OpenUD attaches the UD QP qpn to the network (engine.UDNetwork): it
// receives, through h, the UD datagrams to qpn at every host address of
// locals (its device's network GIDs) that has an endpoint, and sends from
// them. It fails if none has one, or if qpn is in use on one of them.
//
// QP 1 is the exception: the GSI QPs of devices that share a host address
// (the daemon's --roce-bind) all ask for it there, and a datagram to QP 1
// at that address names no device. The first attachment keeps it; a later
// one is attached, for receiving and sending alike, only at its addresses
// where QP 1 is free (so that no reply to its datagrams reaches another
// device's GSI QP), and fails only if that leaves none.
func (n *Network) OpenUD(qpn uint32, locals [][16]byte, h ud.Host) (ud.Conn, error) {
	c := &udConn{qpn: qpn, h: h, eps: make(map[netip.Addr]*udp.Endpoint)}
	n.mu.Lock()
	for _, g := range locals {
		a := udp.AddrOfGID(g)
		if e := n.eps[a]; e != nil {
			c.eps[a] = e
		}
	}
	n.mu.Unlock()
	if len(c.eps) == 0 {
		return nil, fmt.Errorf("%w: none of %d addresses", ErrNoEndpoint, len(locals))
	}
	var taken error
	for a, e := range c.eps {
		err := e.RegisterUD(qpn, h)
		switch {
		case err == nil:
		case qpn == gsiQPN && errors.Is(err, udp.ErrQPN):
			delete(c.eps, a)
			taken = err
		default:
			delete(c.eps, a)
			c.Close()
			return nil, err
		}
	}
	if len(c.eps) == 0 {
		return nil, fmt.Errorf("hostnet: QP 1 held at every address: %w", taken)
	}
	return c, nil
}

// udConn is a UD QP attached to endpoints (ud.Conn).
type udConn struct {
	qpn uint32
	h   ud.Host
	eps map[netip.Addr]*udp.Endpoint // immutable after OpenUD

	mu     sync.Mutex
	psn    roce.PSN // the next datagram's (protected by mu)
	closed bool     // protected by mu
}

// Send sends d from the address of sgid to the address of dgid.
func (c *udConn) Send(sgid, dgid [16]byte, d *ud.Datagram) error {
	src, dst := udp.AddrOfGID(sgid), udp.AddrOfGID(dgid)
	e := c.eps[src]
	if e == nil {
		return fmt.Errorf("%w: %v", ErrNoEndpoint, src)
	}
	if !dst.IsValid() || dst.IsUnspecified() || dst.IsMulticast() || dst.Is4() != src.Is4() {
		return fmt.Errorf("%w: %v from %v", ErrAddr, dst, src)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return udp.ErrClosed
	}
	psn := c.psn
	c.psn = c.psn.Add(1)
	c.mu.Unlock()
	return e.SendUD(dst, psn, d)
}

// Close unregisters the QP from its endpoints.
func (c *udConn) Close() {
	c.mu.Lock()
	done := c.closed
	c.closed = true
	c.mu.Unlock()
	if done {
		return
	}
	for _, e := range c.eps {
		e.UnregisterUD(c.qpn, c.h)
	}
}
