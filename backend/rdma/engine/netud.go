package engine

import (
	"errors"
	"math/bits"

	"github.com/vrdma/vrdma/backend/rdma/roce/ud"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// UD datagrams between hosts (docs/wire.md § UD). A UD QP of a device
// with network GIDs is attached to the fabric's network when it enters
// RTR (Modify), if the network carries UD (UDNetwork), and detached at
// RESET and destroy (closeNet). Its send WQEs to an AH whose sgid is a
// network GID and whose dgid no device of this daemon owns leave as one
// RoCEv2 packet each (sendUD → udNet.send), completing once handed to the
// socket; datagrams arriving for its QP number at one of its device's host
// addresses are delivered by udNet.Receive with the same rules as a
// same-host datagram (deliver): state, Q_Key, a receive WQE, its SGEs,
// its room for the GRH and the payload, every drop counted.

// UDNetwork is a Network that also carries UD datagrams (package roce/ud;
// hostnet's does). Without it CREATE_AH to another host is ErrRemoteAH.
type UDNetwork interface {
	// OpenUD attaches UD QP qpn to the host addresses of locals (its
	// device's network GIDs): h receives what arrives for qpn there.
	OpenUD(qpn uint32, locals [][16]byte, h ud.Host) (ud.Conn, error)
}

// ErrAHFamily: an AH from a network GID to a destination on another host
// of the other address family (IPv4 and IPv6): no packet can go there.
var ErrAHFamily = errors.New("address handle across address families")

// udNetwork returns the fabric's network if it carries UD, else nil.
func (f *Fabric) udNetwork() UDNetwork {
	n, _ := f.network().(UDNetwork)
	return n
}

// udNet is a UD QP's attachment to the network (ud.Host).
type udNet struct {
	q    *QP     // immutable
	conn ud.Conn // immutable once set by Modify

	// The receive side's, protected by q.rqMu: the receive WQE copy,
	// its SGEs and their MRs, the mover that scatters, the GRH.
	wqe  [abi.PageSize]byte
	sges [maxRecvSGEs]abi.SGE
	mrs  [maxRecvSGEs]*MR
	mv   mover
	grh  [ud.GRHSize]byte

	// The send side's, protected by q.sqMu: the gathered payload.
	buf      []byte
	gatherFn func([]byte) error
}

func newUDNet(q *QP) *udNet {
	u := &udNet{q: q}
	u.mv.init()
	u.gatherFn = u.gather
	return u
}

func (u *udNet) gather(view []byte) error {
	u.buf = append(u.buf, view...)
	return nil
}

// send sends the validated UD send WQE w (its local SGEs checked: lsge,
// lmr, total ≤ the active MTU) to dst.dgid on another host with
// Q_Key qkey. The send completes successfully once the datagram is handed
// to the socket, or lost as a network loses it (a refused destination is
// logged at debug level). Precondition: sqMu held; t is q's device's
// table.
func (u *udNet) send(t *memmap.Table, w *sendWQE, sc *scratch, lsge []abi.SGE, lmr []*MR, total uint64, dst udDest, qkey uint32) outcome {
	q := u.q
	u.buf = u.buf[:0]
	if w.flags&abi.WRFlagInline != 0 {
		off := w.dataOff()
		u.buf = append(u.buf, sc.wqe[off:off+int(w.inlineLen)]...)
	} else {
		for i := range lsge {
			if err := lmr[i].Range(t, lsge[i].Addr, uint64(lsge[i].Length), u.gatherFn); err != nil {
				return failed(abi.WCLocProtErr)
			}
		}
	}
	if uint64(len(u.buf)) != total {
		return failed(abi.WCLocProtErr)
	}
	d := ud.Datagram{
		SrcQPN: q.srcQPN(), DestQPN: w.remoteQPN, QKey: qkey,
		// The WQE holds imm_data as the guest stored the big-endian
		// word; the wire takes it as a number.
		Imm: bits.ReverseBytes32(w.imm), WithImm: w.opcode == abi.WROpSendWithImm,
		Solicited: w.flags&abi.WRFlagSolicited != 0,
		Payload:   u.buf,
	}
	if err := u.conn.Send(dst.sgid, dst.dgid, &d); err != nil {
		q.Dev.log.WithError(err).WithField("qp", q.Num).Debug("UD datagram not sent")
	}
	return succeeded(total)
}

// Receive delivers a datagram that arrived for the QP (ud.Host), under
// the device's table; a fault in the QP's memory moves it to ERR.
func (u *udNet) Receive(a *ud.Arrival) {
	q := u.q
	d := q.Dev
	t := d.acquire()
	if t == nil {
		d.udDropped.Add(1)
		return
	}
	defer t.Release()
	var err error
	func() {
		defer containFault(&err)
		u.receive(t, a)
	}()
	if err != nil {
		q.toErr(false)
	}
}

// receive is deliver's rules for a datagram from the network: the QP
// takes it only as a UD QP in RTR or RTS whose Q_Key is the one sent, with
// a receive WQE posted (its own or its SRQ's); else it is dropped and
// counted. A receive WQE that does not decode, names memory the QP may
// not write or is too small for the GRH and the payload completes in
// error and moves the QP to ERR ("A receive WQE too small for 40 +
// payload completes with LOC_LEN_ERR and moves the receiving QP to ERR").
func (u *udNet) receive(t *memmap.Table, a *ud.Arrival) {
	q := u.q
	d := q.Dev
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	if fencedDrop(q) {
		return
	}
	q.mu.Lock()
	st, dead, qkey := q.attr.QPState, q.dead, q.attr.QKey
	q.mu.Unlock()
	if dead || (st != abi.QPSRTR && st != abi.QPSRTS) || qkey != a.QKey {
		q.countUDDrop()
		return
	}
	rec, err := t.Slice(q.Record, QPRecordSize(q.RQNotify))
	if err != nil {
		q.toErr(false)
		return
	}
	wrID, nr, res := q.takeRecvWQE(t, rec, u.wqe[:], u.sges[:], nil)
	switch res {
	case takeEmpty, takeStopped:
		q.countUDDrop()
		return
	case takeBroken:
		q.toErr(false)
		return
	case takeBad:
		u.complete(t, wrID, abi.WCLocQPOpErr, a)
		q.toErr(false)
		return
	}
	sges, mrs := u.sges[:nr], u.mrs[:nr]
	pd := q.recvPD()
	var capacity uint64
	for i := range sges {
		s := &sges[i]
		mr := d.LookupMR(s.LKey)
		if mr == nil || mr.PD != pd || !mr.Local(t, s.Addr, uint64(s.Length)) || mr.Access&abi.AccessLocalWrite == 0 {
			clear(mrs)
			u.complete(t, wrID, abi.WCLocProtErr, a)
			q.toErr(false)
			return
		}
		mrs[i] = mr
		capacity += uint64(s.Length)
	}
	defer clear(mrs) // no MR reference outlives the delivery
	if uint64(ud.GRHSize+len(a.Payload)) > capacity {
		u.complete(t, wrID, abi.WCLocLenErr, a)
		q.toErr(false)
		return
	}
	a.PutGRH(&u.grh)
	u.mv.start(t, sges, mrs)
	if err := u.mv.srcFn(u.grh[:]); err == nil {
		err = u.mv.srcFn(a.Payload)
	}
	if err != nil {
		u.complete(t, wrID, abi.WCLocProtErr, a)
		q.toErr(false)
		return
	}
	u.complete(t, wrID, abi.WCSuccess, a)
}

// complete consumes the receive WQE wrID took and completes it with st:
// rq_ci is stored before the CQE is visible (ci.go). Precondition:
// q.rqMu held.
func (u *udNet) complete(t *memmap.Table, wrID uint64, st abi.WCStatus, a *ud.Arrival) {
	q := u.q
	q.consumeRQ()
	e := abi.CQE{WRID: wrID, Status: st, Opcode: abi.WCOpRecv, QPNum: q.Num, SrcQP: a.SrcQPN}
	if st == abi.WCSuccess {
		e.ByteLen = uint32(ud.GRHSize + len(a.Payload))
		e.WCFlags = abi.WCFlagGRH
		if a.WithImm {
			e.WCFlags |= abi.WCFlagWithImm
			e.ImmData = bits.ReverseBytes32(a.Imm)
		}
	}
	q.storeCIOn(t)
	q.Dev.complete(q.RecvCQ, t, &e, a.Solicited)
}
