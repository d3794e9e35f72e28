package udp

import (
	"fmt"
	"net/netip"

	"github.com/vrdma/vrdma/backend/rdma/roce"
)

// VendorOpcodes is the first BTH opcode of the manufacturer-specific range
// (IBA: transport type 0b110 and 0b111, opcodes 0xC0-0xFF). An Endpoint
// does not parse packets with these opcodes: it checks their BTH, ICRC and
// QPN and hands them to the QPN's PacketHandler (the multipath spray
// extension, docs/wire.md § 9, package roce/spray). Linux rxe drops them
// on an RC QP (rxe_recv.c, check_type_state: the transport bits are not
// RC's).
const VendorOpcodes roce.Opcode = 0xC0

// Verdict is what a PacketHandler made of a packet, for the endpoint's
// counters.
type Verdict uint8

// Verdicts.
const (
	// Delivered: the handler took the packet (RxDelivered), whatever its
	// protocol then did with it (the handler counts its own drops).
	Delivered Verdict = iota
	// WrongPeer: the source address is none of the QP's peer's
	// (RxWrongPeer).
	WrongPeer
	// Malformed: the handler cannot parse it (RxMalformed).
	Malformed
)

// PacketHandler is a QP transport registered with Register, in place of
// the RC QP that NewQP registers: it gets the QPN's packets from every
// endpoint it is registered with, with the source address and the endpoint
// they came through. The endpoint's goroutines call it without holding
// any of the endpoint's locks; it may call Route.Send and Route.Flush of
// any endpoint, and Wake.
type PacketHandler interface {
	// ReceiveRC gets an RC packet (roce.Parse accepted it, the ICRC is
	// verified); p and its payload are valid during the call only.
	ReceiveRC(p *roce.Packet, src netip.AddrPort, via *Endpoint) Verdict
	// ReceiveVendor gets a packet of the vendor range, BTH to ICRC: TVer
	// is 0, the length a multiple of 4 of at least BTH and ICRC, the ICRC
	// verified. pkt is valid during the call only.
	ReceiveVendor(pkt []byte, src netip.AddrPort, via *Endpoint) Verdict
	// Flush follows a receive batch that delivered to the handler.
	Flush()
	// Tick is called every Config.Tick by via's timer goroutine.
	Tick(via *Endpoint)
	// Close is called by Unregister and when the endpoint closes; it must
	// be idempotent.
	Close()
}

// vendorWellFormed checks what the endpoint checks of a vendor packet.
func vendorWellFormed(b []byte) bool {
	return len(b) >= roce.BTHLen+roce.ICRCLen && len(b)%4 == 0 && b[1]&0x0f == 0
}

// Register makes h the receiver of the packets to qpn. It fails with
// ErrQPN if qpn is in use, ErrConfig beyond Config.MaxQPs and ErrClosed
// after Close.
func (e *Endpoint) Register(qpn uint32, h PacketHandler) error {
	if qpn > roce.QPNMask || h == nil {
		return fmt.Errorf("%w: QPN %#x", ErrConfig, qpn)
	}
	return e.insert(qpn, &qpEntry{h: h})
}

// Unregister forgets qpn if h is its handler, without calling h.Close;
// later packets count as RxUnknownQP. It works after Close too.
func (e *Endpoint) Unregister(qpn uint32, h PacketHandler) {
	e.tableMu.Lock()
	defer e.tableMu.Unlock()
	old := *e.table.Load()
	if ent, ok := old[qpn]; !ok || ent.h != h {
		return
	}
	m := make(map[uint32]*qpEntry, len(old))
	for k, v := range old {
		if k != qpn {
			m[k] = v
		}
	}
	e.table.Store(&m)
}

// Wake runs f soon on the endpoint's pump goroutine. The caller queues at
// most one f at a time per registered QPN (there is room for
// Config.MaxQPs); false means it was not queued (no room, or an endpoint
// built without goroutines) and the caller must not count on it.
func (e *Endpoint) Wake(f func()) bool {
	select {
	case e.wakes <- f:
		return true
	default:
		return false
	}
}

// Route sends packets from an endpoint to one peer address: the ICRC is
// sealed over the endpoint's address and port and the peer's.
type Route struct{ p *port }

// Route returns a Route to peer (port 0: roce.UDPPort), which must be of
// the endpoint's address family.
func (e *Endpoint) Route(peer netip.AddrPort) (*Route, error) {
	peer = netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port())
	if peer.Port() == 0 {
		peer = netip.AddrPortFrom(peer.Addr(), roce.UDPPort)
	}
	if !peer.Addr().IsValid() || peer.Addr().IsUnspecified() || peer.Addr().Is4() != e.cfg.Addr.Is4() {
		return nil, fmt.Errorf("%w: peer %v for an endpoint on %v", ErrConfig, peer, e.cfg.Addr)
	}
	return &Route{p: e.newPort(peer)}, nil
}

// Send seals pkt (BTH to ICRC, the ICRC a placeholder) and queues it in the
// endpoint's send batch; a full batch leaves at once. pkt is not kept.
func (r *Route) Send(pkt []byte) { r.p.e.send(r.p, pkt) }

// Flush sends what the endpoint's batch holds.
func (r *Route) Flush() { r.p.e.flush() }

// Peer returns the peer's address and port.
func (r *Route) Peer() netip.AddrPort { return r.p.peer }

// Endpoint returns the endpoint the route sends from.
func (r *Route) Endpoint() *Endpoint { return r.p.e }

func (ent *qpEntry) flush() {
	if ent.ud != nil {
		return
	}
	if ent.h != nil {
		ent.h.Flush()
		return
	}
	ent.qp.Flush()
}

func (ent *qpEntry) tick(e *Endpoint) {
	if ent.ud != nil {
		return
	}
	if ent.h != nil {
		ent.h.Tick(e)
		return
	}
	ent.qp.Tick()
}

func (ent *qpEntry) close() {
	if ent.ud != nil {
		return // the UD QP's owner closes it (ud.Conn)
	}
	if ent.h != nil {
		ent.h.Close()
		return
	}
	ent.qp.Close()
}

// Flush sends what the endpoint's send batch holds.
func (e *Endpoint) Flush() { e.flush() }
