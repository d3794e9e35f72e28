package engine

import (
	"encoding/binary"
	"errors"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// UD QPs (docs/spec.md § Semantics (UD)). A UD QP sends datagrams: each
// SEND names an AH of the QP's PD, a QP number and a Q_Key, and the
// datagram goes to that QP on the device owning the AH's dgid, on this
// daemon's fabric. The receiver takes it only as a UD QP in RTR or RTS
// with that Q_Key and a receive WQE posted (its own or its SRQ's), and
// finds there 40 bytes of network header before the payload; anything
// else drops it, counted on the receiving device (Stats.UDDropped). The
// sender completes once the datagram is delivered or dropped and never
// waits receiver-not-ready. A UD QP receives from any QP, which is what
// UD is: RC's rule that a QP answers only its peer (respond.go) is RC's,
// and an RC request never reaches a UD QP's receive queue, nor a UD
// datagram an RC QP's.

// The GSI QP (QP.GSI; docs/spec.md § Kernel verbs and the GSI QP) is a
// UD QP in every rule here but its address: peers name it QP 1
// (abi.GSIQPN) on its device (RNIC.GSI), its datagrams carry source QP 1,
// and its own number (the CREATE_QP handle) reaches nothing.

// srcQPN is the source QP number q's datagrams carry: 1 for the GSI QP.
func (q *QP) srcQPN() uint32 {
	if q.GSI {
		return abi.GSIQPN
	}
	return q.Num
}

// udDest is where a UD datagram goes: the GIDs it is sent from and to.
type udDest struct {
	sgid, dgid [16]byte
}

// udDestOf resolves the destination of the validated UD send WQE w: its
// AH ("an AH of the device in the QP's PD, else LOC_QP_OP_ERR", a
// destroyed AH included), or with AV its address vector, checked "exactly
// as CREATE_AH checks its addresses" (ResolveAH). One path for both, so
// an AV reaches exactly what an AH with its addresses would.
// Precondition: sqMu held.
func (q *QP) udDestOf(w *sendWQE) (udDest, bool) {
	d := q.Dev
	if w.flags&abi.WRFlagAV != 0 {
		if w.avSGIDIndex >= abi.GIDTableLen {
			return udDest{}, false
		}
		sgid, err := d.ResolveAH(w.avSGIDIndex, w.avDGID)
		if err != nil {
			return udDest{}, false
		}
		return udDest{sgid: sgid, dgid: w.avDGID}, true
	}
	ah := d.LookupAH(w.ah)
	if ah == nil || ah.PD != q.PD {
		return udDest{}, false
	}
	return udDest{sgid: ah.SGID, dgid: ah.DGID}, true
}

// udTarget returns the QP of peer a datagram to QP number num reaches:
// the GSI QP for 1, else a QP that is not the GSI QP ("peers never see"
// its handle), or nil.
func udTarget(sc *scratch, peer *RNIC, num uint32) *QP {
	if num == abi.GSIQPN {
		return peer.GSI()
	}
	pq := sc.keys.lookupQP(peer, num)
	if pq != nil && pq.GSI {
		return nil
	}
	return pq
}

// sendUD runs a validated send WQE (SEND or SEND_WITH_IMM: decodeSend)
// whose SGEs are in sc.lsge on the UD QP q. Precondition: sqMu held; q in
// RTS; t is q's device's table.
func (q *QP) sendUD(t *memmap.Table, w *sendWQE, sc *scratch, now int64) outcome {
	lsge, lmr, total, st := q.checkLocal(t, w, sc)
	if st != abi.WCSuccess {
		return failed(st)
	}
	d := q.Dev
	if total > d.activeMTU() {
		// "A message longer than the port's active_mtu bytes is
		// LOC_LEN_ERR."
		return failed(abi.WCLocLenErr)
	}
	dst, ok := q.udDestOf(w)
	if !ok {
		return failed(abi.WCLocQPOpErr)
	}
	qkey := w.remoteQKey
	if qkey&abi.QKeyUseQP != 0 {
		q.mu.Lock()
		qkey = q.attr.QKey
		q.mu.Unlock()
	}
	// A dgid nobody owns: a host on the network when sent from a
	// network GID (netud.go), else "datagrams to it are dropped as a
	// fabric drops them" (no device to count them).
	peer := d.resolveGID(dst.dgid)
	if peer == nil {
		q.mu.Lock()
		un := q.udNet
		q.mu.Unlock()
		if un != nil && d.fabric.IsNetGID(d, dst.sgid) {
			return un.send(t, w, sc, lsge, lmr, total, dst, qkey)
		}
		return succeeded(total)
	}
	pq := udTarget(sc, peer, w.remoteQPN)
	if pq == nil {
		peer.udDropped.Add(1)
		return succeeded(total)
	}
	pt := peer.acquire()
	if pt == nil {
		peer.udDropped.Add(1)
		return succeeded(total)
	}
	defer pt.Release()
	r := &sc.req
	*r = request{q: q, pq: pq, t: t, pt: pt, w: w, sc: sc, lsge: lsge, lmr: lmr, total: total,
		sgid: dst.sgid, now: now, ud: true, dgid: dst.dgid, qkey: qkey}
	o := r.respondContained() // a fault in the receiver's memory is the receiver's (fault.go)
	*r = request{}
	return o
}

// resolveGID returns the device of the fabric owning gid (d itself on no
// fabric, for its port GID), or nil.
func (d *RNIC) resolveGID(gid [16]byte) *RNIC {
	if d.fabric != nil {
		return d.fabric.Lookup(gid)
	}
	if gid == d.gid {
		return d
	}
	return nil
}

// deliver places the UD datagram r at the receiving QP r.pq, under its
// rqMu: it checks that pq takes it (a UD QP in RTR or RTS whose Q_Key is
// the one sent), takes a receive WQE (none: dropped), and writes the
// network header and the payload there. Errors of the receive WQE are the
// receiving QP's; the sender's outcome is success but for a failure of
// its own memory.
func (r *request) deliver() outcome {
	pq := r.pq
	pq.rqMu.Lock()
	defer pq.rqMu.Unlock()
	if fencedDrop(pq) {
		return succeeded(r.total)
	}
	pq.mu.Lock()
	st, dead, qkey := pq.attr.QPState, pq.dead, pq.attr.QKey
	pq.mu.Unlock()
	if dead || !pq.UD || (st != abi.QPSRTR && st != abi.QPSRTS) || qkey != r.qkey {
		pq.countUDDrop()
		return succeeded(r.total)
	}
	rv, o := r.takeRecv(0)
	if rv == nil {
		return o
	}
	putGRH(&r.sc.grh, r.sgid, r.dgid, r.total)
	return r.send(rv)
}

// RoCEv2 headers after the network header of a datagram, as a UD receive's
// GRH counts them: UDP, BTH, DETH, and the ICRC after the payload.
const udpHdr, bthHdr, dethHdr, icrcLen = 8, 12, 8, 4

// putGRH writes the 40-byte network header of a UD datagram of payload
// bytes from sgid to dgid (docs/spec.md § Semantics (UD)): for two
// IPv4-mapped GIDs, 20 zero bytes then an IPv4 header (version 4, IHL 5,
// total length as RoCEv2 would carry it, TTL 64, UDP, the addresses, its
// checksum); otherwise an IPv6 header (version 6, payload length, next
// header UDP, hop limit 64, the GIDs).
func putGRH(b *[abi.GRHSize]byte, sgid, dgid [16]byte, payload uint64) {
	clear(b[:])
	be := binary.BigEndian
	roce := udpHdr + bthHdr + dethHdr + payload + icrcLen // ≤ MTU + 32: fits 16 bits
	if isV4Mapped(sgid) && isV4Mapped(dgid) {
		h := b[20:40]
		h[0] = 0x45
		be.PutUint16(h[2:], uint16(20+roce))
		h[8] = 64
		h[9] = 17
		copy(h[12:16], sgid[12:])
		copy(h[16:20], dgid[12:])
		be.PutUint16(h[10:], ipv4Checksum(h))
		return
	}
	b[0] = 0x60
	be.PutUint16(b[4:], uint16(roce))
	b[6] = 17
	b[7] = 64
	copy(b[8:24], sgid[:])
	copy(b[24:40], dgid[:])
}

// isV4Mapped reports whether gid is an IPv4-mapped address (::ffff:a.b.c.d).
func isV4Mapped(gid [16]byte) bool {
	for _, c := range gid[:10] {
		if c != 0 {
			return false
		}
	}
	return gid[10] == 0xff && gid[11] == 0xff
}

// ipv4Checksum is the header checksum of the IPv4 header h (its checksum
// field zero): the ones' complement of the ones'-complement sum of its
// 16-bit words.
func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// ErrRemoteAH: an address handle to another host on a fabric whose
// network does not carry UD.
var ErrRemoteAH = errors.New("address handle to another host: the network does not carry UD")

// ResolveAH checks CREATE_AH's addresses (docs/spec.md § CREATE_AH) and
// returns the GID at sgidIndex, which the AH's datagrams are sent from:
// ErrGIDIndex for an empty entry. A network GID and a dgid no device of
// the fabric owns is a destination on another host, reached over RoCEv2
// (netud.go): ErrRemoteAH when the fabric's network does not carry UD,
// ErrAHFamily when the two addresses are of different families. A dgid
// nobody owns from the port GID is accepted.
func (d *RNIC) ResolveAH(sgidIndex uint32, dgid [16]byte) ([16]byte, error) {
	sgid, ok := d.GIDAt(int(sgidIndex))
	if !ok {
		return sgid, ErrGIDIndex
	}
	if d.NIC() == nil && d.fabric != nil && d.fabric.IsNetGID(d, sgid) && d.fabric.Lookup(dgid) == nil {
		switch {
		case d.fabric.udNetwork() == nil:
			return sgid, ErrRemoteAH
		case isV4Mapped(sgid) != isV4Mapped(dgid):
			return sgid, ErrAHFamily
		}
	}
	return sgid, nil
}
