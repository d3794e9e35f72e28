package hostnet

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
)

// MaxEndpoints bounds the endpoints of a NetworkState: the daemon's
// addresses and every device's own (udp.MaxAddrs each).
const MaxEndpoints = 4096

// ErrState: a NetworkState (or a connection's state) that Adopt or
// Restore refuses; wrapped with what is wrong.
var ErrState = errors.New("hostnet: invalid network state")

// EndpointState names one listening endpoint of a NetworkState.
type EndpointState struct {
	// Addr is the host address the socket is bound to (netip's text:
	// dotted IPv4, or IPv6 without a zone).
	Addr string `json:"addr"`
	// Port is the UDP port it is bound to (4791 unless the network's
	// template says otherwise).
	Port uint16 `json:"port"`
	// FD is the index of the socket in the descriptor list that goes with
	// the state (Freeze's second result, Adopt's fds).
	FD int `json:"fd"`
}

// NetworkState is what a handover carries of a Network: its endpoints.
// The connections of its QPs are carried by their owners (rc.ConnState,
// FreezeConn and Restore), UD QPs are attached again (OpenUD).
type NetworkState struct {
	// Endpoints are the open endpoints, ordered by address, each once.
	Endpoints []EndpointState `json:"endpoints"`
}

// Freeze stops every endpoint's goroutines at a clean point
// (udp.Endpoint.Freeze: the datagrams that arrive stay queued in the
// sockets; no QP timer runs, nothing is retransmitted) and returns the
// network's state and a duplicate of each endpoint's socket, in the order
// the state's FD fields index (the caller owns them). Endpoints opened
// while frozen start frozen. On error nothing is frozen and no
// descriptor is returned. Thaw starts everything again (the handover was
// refused); otherwise the process exits with the network frozen.
func (n *Network) Freeze() (*NetworkState, []int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	eps := n.sortedLocked()
	st := &NetworkState{Endpoints: make([]EndpointState, 0, len(eps))}
	fds := make([]int, 0, len(eps))
	undo := func(err error) (*NetworkState, []int, error) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		if !n.frozen {
			for _, e := range eps {
				e.Thaw()
			}
		}
		return nil, nil, err
	}
	for _, e := range eps {
		if err := e.Freeze(); err != nil {
			return undo(fmt.Errorf("hostnet: freeze %v: %w", e.LocalAddr(), err))
		}
		fd, err := e.Dup()
		if err != nil {
			return undo(err)
		}
		la := e.LocalAddr()
		st.Endpoints = append(st.Endpoints, EndpointState{Addr: la.Addr().String(), Port: la.Port(), FD: len(fds)})
		fds = append(fds, fd)
	}
	n.frozen = true
	return st, fds, nil
}

// Thaw starts every endpoint again (udp.Endpoint.Thaw: each QP sends what
// it owes, a restored one retransmits from its oldest unacknowledged PSN).
// The new process of a handover calls it once the handover is committed;
// the old one when the handover was refused. It does nothing to a network
// that is not frozen.
func (n *Network) Thaw() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.frozen {
		return
	}
	n.frozen = false
	for _, e := range n.sortedLocked() {
		e.Thaw()
	}
}

// Frozen reports whether the network is frozen (Freeze or Adopt, no Thaw
// since).
func (n *Network) Frozen() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.frozen
}

// Adopt makes this network, which has no endpoint yet, serve the
// endpoints of st over the sockets fds (the descriptor list of Freeze, in
// this process) instead of binding new ones: each socket must be a UDP
// socket bound to its endpoint's address and port (udp.Adopt). The
// network is frozen afterwards: nothing is read from the sockets and no QP
// sends until Thaw, so that a handover that is not committed leaves them
// to the old process untouched. Adopt takes every descriptor of fds over,
// also on error (those it does not keep are closed: they are
// duplicates), and adopts all of st or nothing.
func (n *Network) Adopt(st *NetworkState, fds []int) error {
	fds = append([]int(nil), fds...) // -1 marks those handed on
	closeAll := func() {
		for _, fd := range fds {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}
	addrs, err := n.checkState(st, len(fds))
	if err != nil {
		closeAll()
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.eps) > 0 {
		closeAll()
		return fmt.Errorf("%w: the network has %d endpoints already", ErrState, len(n.eps))
	}
	adopted := make([]*udp.Endpoint, 0, len(st.Endpoints))
	for i, es := range st.Endpoints {
		cfg := n.tmpl
		cfg.Addr, cfg.Port = addrs[i], es.Port
		fd := fds[es.FD]
		fds[es.FD] = -1 // udp.Adopt owns it from here
		e, err := udp.Adopt(cfg, fd)
		if err != nil {
			for _, a := range adopted {
				a.Close() // its duplicate only: the old process's socket stays open
			}
			closeAll()
			return fmt.Errorf("hostnet: endpoint %v: %w", addrs[i], err)
		}
		adopted = append(adopted, e)
	}
	closeAll() // descriptors no endpoint named
	for i, e := range adopted {
		n.eps[addrs[i]] = e
		if m, ok := udp.FindLinkPMTU(addrs[i]); ok {
			n.pmtu[addrs[i]] = m // else looked up at Connect (pmtuLocked)
		}
	}
	n.frozen = true
	return nil
}

// checkState checks st against a descriptor list of nfds entries: at most
// MaxEndpoints endpoints, each a unicast address given once, a port, and a
// descriptor index in range used once. It returns the addresses.
func (n *Network) checkState(st *NetworkState, nfds int) ([]netip.Addr, error) {
	if st == nil {
		return nil, fmt.Errorf("%w: none", ErrState)
	}
	if len(st.Endpoints) > MaxEndpoints {
		return nil, fmt.Errorf("%w: %d endpoints, at most %d", ErrState, len(st.Endpoints), MaxEndpoints)
	}
	addrs := make([]netip.Addr, len(st.Endpoints))
	seen := make(map[netip.Addr]bool, len(st.Endpoints))
	used := make(map[int]bool, len(st.Endpoints))
	for i, es := range st.Endpoints {
		a, err := netip.ParseAddr(es.Addr)
		switch {
		case err != nil || a.Zone() != "":
			return nil, fmt.Errorf("%w: endpoint %d: address %q", ErrState, i, es.Addr)
		case a.Unmap() != a || a.IsUnspecified() || a.IsMulticast():
			return nil, fmt.Errorf("%w: endpoint %d: %v is not a unicast host address", ErrState, i, a)
		case seen[a]:
			return nil, fmt.Errorf("%w: endpoint %d: %v given twice", ErrState, i, a)
		case es.Port == 0:
			return nil, fmt.Errorf("%w: endpoint %d: port 0", ErrState, i)
		case es.FD < 0 || es.FD >= nfds || used[es.FD]:
			return nil, fmt.Errorf("%w: endpoint %d: descriptor index %d (of %d, each once)", ErrState, i, es.FD, nfds)
		}
		seen[a], used[es.FD] = true, true
		addrs[i] = a
	}
	return addrs, nil
}

// sortedLocked returns the endpoints ordered by address. Precondition:
// n.mu held.
func (n *Network) sortedLocked() []*udp.Endpoint {
	es := make([]*udp.Endpoint, 0, len(n.eps))
	for _, e := range n.eps {
		es = append(es, e)
	}
	sort.Slice(es, func(i, j int) bool { return es[i].LocalAddr().Addr().Less(es[j].LocalAddr().Addr()) })
	return es
}

// ErrNotTransferable: a connection whose state cannot be carried over.
var ErrNotTransferable = errors.New("hostnet: connection cannot be handed over")

// FreezeConn freezes c, a connection Connect made, and returns its state
// (rc.Freezer). A plain RoCEv2 connection can be carried; a sprayed one
// (multipath, package spray) cannot yet: ErrNotTransferable, and c is
// left running.
func FreezeConn(c rc.Conn) (*rc.ConnState, error) {
	f, ok := c.(rc.Freezer)
	if !ok {
		return nil, fmt.Errorf("%w: a multipath (spray) connection (%T)", ErrNotTransferable, c)
	}
	return f.Freeze()
}

// ThawConn undoes FreezeConn (a handover that was refused).
func ThawConn(c rc.Conn) {
	if f, ok := c.(rc.Freezer); ok {
		f.Thaw()
	}
}

// Restore rebuilds a connection from st (FreezeConn's, in the process
// this network adopted its endpoints from) on the endpoint of st.Local,
// with host as Connect's (the engine's QP: it must be an rc.Rebuilder
// when the state has work requests with data or a receive being filled).
// It sends nothing until the network thaws. See udp.Endpoint.RestoreConn.
func (n *Network) Restore(st *rc.ConnState, host rc.Host) (rc.Conn, error) {
	if st == nil {
		return nil, fmt.Errorf("%w: no connection state", ErrState)
	}
	local, err := netip.ParseAddrPort(st.Local)
	if err != nil {
		return nil, fmt.Errorf("%w: local address %q", ErrState, st.Local)
	}
	n.mu.Lock()
	e := n.eps[local.Addr()]
	n.mu.Unlock()
	if e == nil {
		return nil, fmt.Errorf("%w: %v", ErrNoEndpoint, local.Addr())
	}
	c, err := e.RestoreConn(st, host)
	if err != nil {
		return nil, err
	}
	return c, nil
}
