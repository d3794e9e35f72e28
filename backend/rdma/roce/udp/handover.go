package udp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
)

// Handing an endpoint over to another process (live upgrade of vrdmad,
// package hostnet): the old process freezes the endpoint (its goroutines
// stop at a clean point; the datagrams that arrive meanwhile stay queued
// in the socket's receive buffer) and passes a duplicate of the socket
// (Dup); the new process adopts it (Adopt), frozen too, and starts it with
// Thaw once the handover is committed. The socket is never closed or bound
// again, so no datagram is lost in between; both processes hold it, and
// only the one whose endpoint runs reads it.

// ErrFrozen: the endpoint is frozen (Freeze, Adopt) and the operation needs
// it running.
var ErrFrozen = errors.New("udp: endpoint frozen")

// Freeze stops the endpoint's goroutines at a clean point: the receive
// goroutine after the batch it is handling (it calls recvmmsg no more:
// later datagrams stay in the socket's buffer), the timer and pump
// goroutines between two QPs. Then it flushes the send batch. QPs stay
// registered and Post still sends (the owner stops posting); nothing runs
// their timers or hands them packets until Thaw. It is idempotent and
// fails only after Close.
func (e *Endpoint) Freeze() error {
	e.runMu.Lock()
	defer e.runMu.Unlock()
	if e.ctx.Err() != nil {
		return ErrClosed
	}
	if e.frozen {
		return nil
	}
	e.frozen = true
	close(e.stop)
	// A deadline in the past fails every later raw Read before its
	// recvmmsg (the poller checks it first) and wakes one waiting for
	// data: no datagram is taken from the socket and dropped.
	if err := e.conn.SetReadDeadline(time.Unix(1, 0)); err != nil {
		e.log.WithError(err).Warn("udp: freeze: read deadline")
	}
	e.wg.Wait()
	e.flush()
	return nil
}

// Thaw starts the goroutines of a frozen endpoint (Freeze, Adopt) again,
// and has every RC QP flush the ACK it owes and send what it has (a QP
// restored from another process retransmits from its oldest
// unacknowledged PSN). It does nothing to a running or closed endpoint.
// Lock order: it takes each QP's lock after runMu.
func (e *Endpoint) Thaw() {
	e.runMu.Lock()
	defer e.runMu.Unlock()
	if !e.frozen || e.ctx.Err() != nil {
		return
	}
	_ = e.conn.SetReadDeadline(time.Time{})
	e.startLocked()
	for _, ent := range *e.table.Load() {
		if ent.qp != nil {
			ent.qp.Flush()
			ent.port.Wake()
		}
	}
}

// Frozen reports whether the endpoint's goroutines are stopped.
func (e *Endpoint) Frozen() bool {
	e.runMu.Lock()
	defer e.runMu.Unlock()
	return e.frozen
}

// Dup returns a duplicate of the endpoint's socket descriptor (close on
// exec), which the caller owns: what a handover passes to the new process.
func (e *Endpoint) Dup() (int, error) {
	fd := -1
	var derr error
	err := e.raw.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) })
	if err == nil {
		err = derr
	}
	if err != nil {
		return -1, fmt.Errorf("udp: dup %v: %w", e.local, err)
	}
	return fd, nil
}

// Adopt makes an endpoint of the socket fd, which another process bound
// (Dup there), instead of binding one: fd must be a UDP socket of
// cfg.Addr's family bound to cfg.Addr and cfg.Port (0: 4791). The socket
// options Listen sets are set again (the same values). The endpoint is
// frozen: Thaw starts it. Adopt takes fd over, also on error (it is closed
// then).
func Adopt(cfg Config, fd int) (*Endpoint, error) {
	if fd < 0 {
		return nil, fmt.Errorf("%w: descriptor %d", ErrConfig, fd)
	}
	if err := cfg.fill(); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := checkSocket(fd, netip.AddrPortFrom(cfg.Addr, cfg.Port)); err != nil {
		unix.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "roce-udp")
	pc, err := net.FilePacketConn(f) // a duplicate, in the runtime's poller
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("udp: adopt %v: %w", cfg.Addr, err)
	}
	conn, ok := pc.(*net.UDPConn)
	if !ok {
		pc.Close()
		return nil, fmt.Errorf("%w: descriptor %d is not a UDP socket", ErrConfig, fd)
	}
	return newEndpoint(cfg, conn)
}

// checkSocket checks that fd is a UDP socket bound to want.
func checkSocket(fd int, want netip.AddrPort) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: descriptor %d: %s", ErrConfig, fd, fmt.Sprintf(format, a...))
	}
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return bad("not a socket (%v)", err)
	}
	proto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err != nil || typ != unix.SOCK_DGRAM || proto != unix.IPPROTO_UDP {
		return bad("not a UDP socket (type %d, protocol %d)", typ, proto)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return bad("getsockname: %v", err)
	}
	var got netip.AddrPort
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		got = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		if a.ZoneId != 0 {
			return bad("bound to a scoped address")
		}
		got = netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
	default:
		return bad("not an IP socket")
	}
	// The family must be the address's: an IPv6 socket bound to a
	// v4-mapped address is not what Listen makes for IPv4.
	if got.Addr().Is4() != want.Addr().Is4() || got != want {
		return bad("bound to %v, want %v", got, want)
	}
	return nil
}

var _ rc.Freezer = (*Conn)(nil)

// Freeze freezes the connection's QP (rc.QP.Freeze) and returns its state
// with the connection's addresses: the endpoint's (Local), the peer's
// (Peer) and the source port learned from the peer (PeerSourcePort).
func (c *Conn) Freeze() (*rc.ConnState, error) {
	st, err := c.QP.Freeze()
	if err != nil {
		return nil, err
	}
	st.Local = c.e.local.String()
	if ent := (*c.e.table.Load())[c.QPN()]; ent != nil && ent.qp == c.QP {
		st.Peer = ent.port.peer.String()
		if v := ent.srcPub.Load(); v != 0 {
			st.PeerSourcePort = uint16(v)
		}
	}
	return st, nil
}

// RestoreConn rebuilds a connection of this endpoint from st (Conn.Freeze's
// in another process, rc.Restore with host): st.Local must be the
// endpoint's address and port, st.Peer an address of its family with a
// port; the learned source port is kept. The QP sends nothing until the
// endpoint runs (Thaw) and then retransmits from its oldest unacknowledged
// PSN. On error nothing was registered and nothing completed.
func (e *Endpoint) RestoreConn(st *rc.ConnState, host rc.Host) (*Conn, error) {
	if st == nil {
		return nil, fmt.Errorf("%w: no state", rc.ErrConnState)
	}
	local, err := netip.ParseAddrPort(st.Local)
	if err != nil || local != e.local {
		return nil, fmt.Errorf("%w: local address %q, the endpoint's is %v", rc.ErrConnState, st.Local, e.local)
	}
	peer, err := netip.ParseAddrPort(st.Peer)
	if err != nil || peer.Addr().Zone() != "" || peer.Addr().Unmap() != peer.Addr() || peer.Port() == 0 ||
		peer.Addr().IsUnspecified() || peer.Addr().IsMulticast() || peer.Addr().Is4() != e.cfg.Addr.Is4() {
		return nil, fmt.Errorf("%w: peer %q for an endpoint on %v", rc.ErrConnState, st.Peer, e.local)
	}
	p := e.newPort(peer)
	qp, err := rc.Restore(st, host, p)
	if err != nil {
		return nil, err
	}
	p.qp = qp
	ent := &qpEntry{qp: qp, port: p, peer: peer.Addr()}
	if st.PeerSourcePort != 0 {
		ent.src.Learn(st.PeerSourcePort, true)
		ent.srcPub.Store(1<<16 | uint32(st.PeerSourcePort))
	}
	if err := e.insert(st.QPN, ent); err != nil {
		return nil, err
	}
	return &Conn{QP: qp, e: e}, nil
}
