package udp

import (
	"fmt"
	"net/netip"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/ud"
)

// UD datagrams (docs/wire.md § UD). A UD QP is registered under its QP
// number with RegisterUD on the endpoints of the host addresses it may be
// reached at; what arrives for that number with a UD opcode goes to its
// ud.Host from any source address and port (UD is connectionless), after
// the endpoint checked the whole packet: roce.Parse (the lengths, the
// opcode, the pad), the ICRC, and the P_Key. An RC packet to a UD QP and
// a UD packet to an RC QP count as malformed, as rxe drops a packet whose
// transport is not its QP's (rxe_recv.c, check_type_state). SendUD sends
// one from the endpoint's address and port: one packet, no ACK, no retry.

// pkeyDefault is the default P_Key, full member: what UD packets carry.
const pkeyDefault = 0xffff

// pkeyMatch reports whether a packet's P_Key matches the default
// partition, as rxe's pkey_match: the same low 15 bits, and at least one
// of the two a full member (ours is).
func pkeyMatch(pkey uint16) bool { return pkey&0x7fff == pkeyDefault&0x7fff }

// RegisterUD makes h the receiver of the UD packets to qpn. It fails with
// ErrQPN if qpn is in use, ErrConfig beyond Config.MaxQPs and ErrClosed
// after Close.
func (e *Endpoint) RegisterUD(qpn uint32, h ud.Host) error {
	if qpn > roce.QPNMask || h == nil {
		return fmt.Errorf("%w: QPN %#x", ErrConfig, qpn)
	}
	return e.insert(qpn, &qpEntry{ud: h})
}

// UnregisterUD forgets qpn if h is its UD receiver; later packets count as
// RxUnknownQP. A Receive already running may still end after it returns.
func (e *Endpoint) UnregisterUD(qpn uint32, h ud.Host) {
	e.tableMu.Lock()
	defer e.tableMu.Unlock()
	old := *e.table.Load()
	if ent, ok := old[qpn]; !ok || ent.ud != h {
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

// receiveUD hands the UD packet p from src, whose ICRC matched with the
// IPv4 ID id, to h. The receive goroutine's.
func (e *Endpoint) receiveUD(h ud.Host, p *roce.Packet, src netip.AddrPort, id uint16) Verdict {
	if !pkeyMatch(p.BTH.PKey) {
		return Malformed
	}
	a := &e.rxUD
	*a = ud.Arrival{
		Datagram: ud.Datagram{
			SrcQPN: p.DETH.SrcQP, DestQPN: p.BTH.DestQP, QKey: p.DETH.QKey,
			Imm: p.ImmDt, WithImm: p.BTH.Opcode == roce.OpUDSendOnlyWithImmediate,
			Solicited: p.BTH.SE, Payload: p.Payload,
		},
		Src: src.Addr().Unmap(), Dst: e.cfg.Addr, IPv4ID: id, SrcPort: src.Port(),
	}
	h.Receive(a)
	a.Payload = nil
	return Delivered
}

// SendUD sends d to dst, UDP port 4791, from the endpoint's address and
// port, with psn in its BTH (a receiver ignores it). It returns an error,
// sending nothing, for a destination of another family or one no packet
// goes to, a QP number beyond 24 bits or a payload over roce.MaxPayload;
// otherwise the packet was handed to the socket (flushed with what the
// send batch held), and a datagram the kernel refuses is counted
// (TxErrors) and lost, as a network loses datagrams.
func (e *Endpoint) SendUD(dst netip.Addr, psn roce.PSN, d *ud.Datagram) error {
	dst = dst.Unmap()
	if !dst.IsValid() || dst.IsUnspecified() || dst.IsMulticast() || dst.Is4() != e.cfg.Addr.Is4() {
		return fmt.Errorf("%w: UD destination %v from %v", ErrConfig, dst, e.cfg.Addr)
	}
	op := roce.OpUDSendOnly
	if d.WithImm {
		op = roce.OpUDSendOnlyWithImmediate
	}
	p := roce.Packet{
		BTH:   roce.BTH{Opcode: op, SE: d.Solicited, PKey: pkeyDefault, DestQP: d.DestQPN, PSN: psn & roce.PSNMask},
		DETH:  roce.DETH{QKey: d.QKey, SrcQP: d.SrcQPN},
		ImmDt: d.Imm,
	}
	n := len(d.Payload)
	if n > roce.MaxPayload {
		return fmt.Errorf("%w: UD payload of %d bytes", ErrConfig, n)
	}
	hl := op.HeaderLen()
	size := hl + n + (-n & 3) + roce.ICRCLen
	peer := netip.AddrPortFrom(dst, roce.UDPPort)
	flow := roce.NewFlow(roce.IPHeader{Src: e.cfg.Addr, Dst: dst, FlagsFragment: roce.IPv4DF}, e.local.Port(), roce.UDPPort)
	e.txMu.Lock()
	defer e.txMu.Unlock()
	i := e.txN
	b := e.tx.bufs[i][:size]
	copy(b[hl:], d.Payload)
	if err := p.Encode(b, n); err != nil {
		return err
	}
	if err := flow.Seal(b); err != nil {
		return err
	}
	e.tx.setSend(i, size, peer)
	e.txDst[i], e.txLen[i] = peer, size
	e.txN++
	e.flushLocked()
	return nil
}
