package engine

import (
	"errors"
	"fmt"

	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// A network QP's state for a handover (state.go): the engine's side of the
// connection (netQP: the posted WQEs' slots, the receives the transport
// took, the remote QP claimed on the fabric) and the transport's
// (rc.ConnState). The export reads the transport with Freeze and lets it
// go again at once (Thaw): the daemon froze the network first (its
// goroutines are stopped, hostnet.Network.Freeze) and the device is
// quiesced (nothing posts), so nothing moves the connection until the
// network thaws — a refused handover goes on where it stopped, a committed
// one exits. The import rebuilds the netQP, claims the remote QP again and
// restores the connection on the network the new process adopted, still
// frozen (ConnRestorer): it sends nothing before the handover commits.

// ConnRestorer is a Network that rebuilds a connection from its state in
// the process its endpoints were handed over to (hostnet.Network.Restore).
type ConnRestorer interface {
	Restore(st *rc.ConnState, host rc.Host) (rc.Conn, error)
}

// NetQPState is a network QP's state: the engine's side and the
// transport's.
type NetQPState struct {
	// RemoteGID and RemoteQPN name the peer QP on the other host, which
	// the QP claims on the fabric (Fabric.claimConn).
	RemoteGID [16]byte `json:"remote_gid"`
	RemoteQPN uint32   `json:"remote_qpn"`
	// Tail is the sequence number of the next WQE posted to the
	// transport, Done that of the oldest not completed: Sends are the
	// WQEs Done … Tail-1, in order (at most the send queue's depth).
	Tail  uint64         `json:"tail"`
	Done  uint64         `json:"done"`
	Sends []NetSendState `json:"sends,omitempty"`
	// Recvs are the receive WQEs the transport consumed and has not
	// completed, oldest first (plain RC: at most the one a SEND is
	// being placed in).
	Recvs []NetRecvState `json:"recvs,omitempty"`
	// Closed: the transport was closed (the QP is in ERR and its
	// network WQEs completed); Conn is nil then, and required otherwise.
	Closed bool          `json:"closed,omitempty"`
	Conn   *rc.ConnState `json:"conn,omitempty"`
}

// NetSendState is a WQE the transport holds: what its completion needs.
// Its local memory is described in the transport's state (rc.WQEState's
// Local, by sendBuf.Describe).
type NetSendState struct {
	WRID      uint64 `json:"wr_id"`
	Opcode    uint8  `json:"opcode"`
	Signaled  bool   `json:"signaled,omitempty"`
	Solicited bool   `json:"solicited,omitempty"`
}

// NetRecvState is a receive WQE the transport consumed.
type NetRecvState struct {
	WRID uint64     `json:"wr_id"`
	SGEs []SGEState `json:"sges"`
}

// netTransferableLocked says why q's network transport cannot be handed over
// (nil: it can): a multipath (spray) connection is not an rc.Freezer.
// Precondition: q.mu held.
func (q *QP) netTransferableLocked() error {
	n := q.net
	if n == nil || n.closed.Load() || n.conn == nil {
		return nil
	}
	if _, ok := n.conn.(rc.Freezer); !ok {
		return fmt.Errorf("QP %d is connected over the network by multipath (spray), which cannot be handed over", q.Num)
	}
	return nil
}

// export describes n. Precondition: q.sqMu held, rqMu and mu not (the
// transport's lock is taken: lock order); the network is frozen and the
// device quiesced.
func (n *netQP) export() (*NetQPState, error) {
	q := n.q
	st := &NetQPState{RemoteGID: n.remote.gid, RemoteQPN: n.remote.qpn}
	if n.closed.Load() {
		// close completed everything it held (Conn.Close flushes;
		// the receives are flushed after it).
		st.Closed = true
		return st, nil
	}
	f, ok := n.conn.(rc.Freezer)
	if !ok {
		return nil, fmt.Errorf("QP %d: a multipath (spray) connection cannot be handed over", q.Num)
	}
	// What moves the connection must be stopped for good, not just for
	// the read: a packet accepted after it would be lost to the new
	// process (a live upgrade: the daemon froze the network) or to the
	// guest memory QEMU copied already (a migration: HoldNet froze the
	// QP when the VM stopped).
	held := n.held.Load()
	if !held && q.Dev != nil && q.Dev.fabric != nil {
		if fz, ok := q.Dev.fabric.network().(interface{ Frozen() bool }); ok && !fz.Frozen() {
			return nil, fmt.Errorf("QP %d: the network is not frozen, nor the QP held for a migration", q.Num)
		}
	}
	cs, err := f.Freeze()
	if err != nil {
		// A transport in error: the QP is in ERR and its next pass
		// closes it; the handover may be tried again then.
		return nil, fmt.Errorf("QP %d: network transport: %w", q.Num, err)
	}
	// Read what Freeze left (its lock orders the transport's earlier
	// writes of the slots and receives before these reads), then let the
	// QP go: nothing drives it while the network is frozen. A QP held
	// for a migration stays frozen, and so does its copy.
	if !held {
		defer f.Thaw()
	}
	cs.Frozen = held
	st.Conn = cs
	st.Tail, st.Done = n.tail, n.done.Load()
	for seq := st.Done; seq != st.Tail; seq++ {
		s := &n.slots[seq%uint64(len(n.slots))]
		st.Sends = append(st.Sends, NetSendState{WRID: s.wrID, Opcode: s.opcode, Signaled: s.signaled, Solicited: s.solicited})
	}
	for i := range n.recvOpen {
		b := &n.recvs[(n.recvHead+i)%len(n.recvs)]
		rs := NetRecvState{WRID: b.wrID, SGEs: []SGEState{}}
		for _, g := range b.sge {
			rs.SGEs = append(rs.SGEs, SGEState{Addr: g.Addr, Length: g.Length, LKey: g.LKey})
		}
		st.Recvs = append(st.Recvs, rs)
	}
	return st, nil
}

var _ rc.Describer = (*sendBuf)(nil)

// Describe describes b for the transport's state (rc.Describer): its SGEs,
// or its inline bytes.
func (b *sendBuf) Describe() rc.LocalState {
	if len(b.inline) > 0 {
		return rc.LocalState{Inline: append([]byte(nil), b.inline...)}
	}
	var l rc.LocalState
	for _, s := range b.sge {
		l.SGEs = append(l.SGEs, rc.SGEState{LKey: s.LKey, Addr: s.Addr, Length: s.Length})
	}
	return l
}

// checkNet validates st for QP q (attributes a) before anything is built.
func (q *QP) checkNet(st *NetQPState, a *QPAttrState) error {
	bad := func(format string, v ...any) error {
		return stateErr("QP %d: network: "+format, append([]any{q.Num}, v...)...)
	}
	depth := uint64(q.SQ.Depth)
	switch {
	case q.UD:
		return bad("a UD QP")
	case a.State != abi.QPSRTR && a.State != abi.QPSRTS && a.State != abi.QPSErr:
		return bad("in state %d", a.State)
	case st.RemoteQPN >= 1<<24 || st.RemoteGID == ([16]byte{}):
		return bad("remote QP %#x", st.RemoteQPN)
	case st.Closed && (a.State != abi.QPSErr || st.Conn != nil || len(st.Sends)+len(st.Recvs) > 0 || st.Tail != st.Done):
		return bad("a closed transport with work or a connection, or out of ERR")
	case !st.Closed && st.Conn == nil:
		return bad("no connection state")
	case st.Tail-st.Done > depth || uint64(len(st.Sends)) != st.Tail-st.Done:
		return bad("%d sends for sequence %d … %d (send queue of %d)", len(st.Sends), st.Done, st.Tail, depth)
	case len(st.Recvs) > 1:
		return bad("%d receives in progress", len(st.Recvs))
	}
	for i, s := range st.Sends {
		if !rc.WROpcode(s.Opcode).Valid() {
			return bad("send %d: opcode %d", i, s.Opcode)
		}
	}
	for i, r := range st.Recvs {
		if len(r.SGEs) > maxRecvSGEs {
			return bad("receive %d: %d SGEs", i, len(r.SGEs))
		}
	}
	if st.Closed {
		return nil
	}
	c := st.Conn
	// The transport must be this QP's, to the claimed remote QP, with the
	// attributes MODIFY_QP gave it (rcConfig).
	switch {
	case c.QPN != q.Num || c.DestQPN != st.RemoteQPN || c.DestQPN != a.DestQPNum:
		return bad("connection of QP %#x to %#x", c.QPN, c.DestQPN)
	case c.SQSize != int(q.SQ.Depth):
		return bad("connection's send queue of %d", c.SQSize)
	case a.PathMTU > abi.MTU4096 || c.PMTU > 128<<a.PathMTU:
		// The network lowers the QP's path MTU to its link's (hostnet
		// Connect): never above the attribute's.
		return bad("connection's MTU %d above the QP's path MTU %d", c.PMTU, 128<<a.PathMTU)
	case c.Started != (a.State != abi.QPSRTR):
		return bad("connection started %v in state %d", c.Started, a.State)
	case len(c.Requester.WQEs) != len(st.Sends):
		return bad("%d work requests in the connection, %d sends", len(c.Requester.WQEs), len(st.Sends))
	case (c.Responder.Recv != nil) != (len(st.Recvs) == 1):
		return bad("%d receives, receive in progress %v", len(st.Recvs), c.Responder.Recv != nil)
	case c.Responder.Recv != nil && c.Responder.Recv.ID != st.Recvs[0].WRID:
		return bad("receive %#x in progress, %#x consumed", c.Responder.Recv.ID, st.Recvs[0].WRID)
	}
	for i := range c.Requester.WQEs {
		w := &c.Requester.WQEs[i]
		if w.ID != st.Done+uint64(i) || w.Opcode != st.Sends[i].Opcode || w.Solicited != st.Sends[i].Solicited {
			return bad("work request %d (%#x, opcode %d) is not send %d", i, w.ID, w.Opcode, st.Done+uint64(i))
		}
	}
	return nil
}

// RestoreNet rebuilds the network side of QP q from st (QPState.Net): the
// slots and receives, the remote QP's claim on the fabric and the
// transport on the fabric's network (a ConnRestorer, frozen: it sends
// nothing until the network thaws). Its local memory is resolved again
// (lkeys checked as the engine checks a WQE's: the MRs must have been
// imported). It runs after ImportState; t is the device's table. On error
// nothing is claimed or registered; the caller destroys the QP.
func (q *QP) RestoreNet(t *memmap.Table, st *NetQPState) error {
	q.mu.Lock()
	a := attrState(&q.attr)
	sgid := q.sgid
	q.mu.Unlock()
	if err := q.checkNet(st, &a); err != nil {
		return err
	}
	d := q.Dev
	if d == nil || d.fabric == nil {
		return stateErr("QP %d: network: no fabric", q.Num)
	}
	f := d.fabric
	if !f.IsNetGID(d, sgid) {
		return stateErr("QP %d: network: it sends from %x, not a network GID of its device", q.Num, sgid)
	}
	if f.Lookup(st.RemoteGID) != nil {
		return stateErr("QP %d: network: the remote GID is a device's of this host", q.Num)
	}
	n := newNetQP(q)
	n.remote = remoteQP{st.RemoteGID, st.RemoteQPN}
	n.tail = st.Tail
	n.done.Store(st.Done)
	for i, s := range st.Sends {
		sl := &n.slots[(st.Done+uint64(i))%uint64(len(n.slots))]
		sl.wrID, sl.opcode, sl.signaled, sl.solicited = s.WRID, s.Opcode, s.Signaled, s.Solicited
	}
	for i := range st.Recvs {
		n.rebuildRecv(t, &n.recvs[i], &st.Recvs[i])
	}
	n.recvOpen = len(st.Recvs)
	if st.Closed {
		n.closed.Store(true)
		q.mu.Lock()
		q.net = n
		q.mu.Unlock()
		return nil
	}
	if !f.claimConn(n.remote.gid, n.remote.qpn, n) {
		return stateErr("QP %d: network: another QP of this host is connected to remote QP %#x", q.Num, st.RemoteQPN)
	}
	cr, ok := f.network().(ConnRestorer)
	if !ok {
		f.releaseConn(n.remote.gid, n.remote.qpn, n)
		return stateErr("QP %d: network: this host's network cannot restore a connection", q.Num)
	}
	n.restoreT = t
	conn, err := cr.Restore(st.Conn, n)
	n.restoreT = nil
	if err != nil {
		f.releaseConn(n.remote.gid, n.remote.qpn, n)
		return stateErr("QP %d: network: %v", q.Num, err)
	}
	n.conn = conn
	n.held.Store(st.Conn.Frozen) // a migration's: HoldNet(false) lets it go
	q.mu.Lock()
	q.net = n
	q.mu.Unlock()
	return nil
}

// rebuildRecv makes b the receive rs as takeRecvLocked made it: a receive
// whose SGEs no longer check fails to scatter (bad).
func (n *netQP) rebuildRecv(t *memmap.Table, b *recvBuf, rs *NetRecvState) {
	q := n.q
	b.wrID, b.sge, b.mr, b.bad = rs.WRID, b.sge[:0], b.mr[:0], false
	pd := q.recvPD()
	for _, g := range rs.SGEs {
		s := abi.SGE{Addr: g.Addr, Length: g.Length, LKey: g.LKey}
		mr := q.Dev.LookupMR(s.LKey)
		if mr == nil || mr.PD != pd || !mr.Local(t, s.Addr, uint64(s.Length)) || mr.Access&abi.AccessLocalWrite == 0 {
			b.bad = true
		}
		b.sge = append(b.sge, s)
		b.mr = append(b.mr, mr)
	}
}

var _ rc.Rebuilder = (*netQP)(nil)

// errRebuild is a restored work request's memory that does not check.
var errRebuild = errors.New("local memory does not check")

// SendBuffer rebuilds the local memory of the outstanding work request w
// (rc.Rebuilder, during RestoreNet): the slot of its sequence number gets
// w's inline bytes, or its SGEs with their MRs looked up again and
// checked as checkLocal checks a WQE's.
func (n *netQP) SendBuffer(w *rc.WQEState) (rc.Buffer, error) {
	q, t := n.q, n.restoreT
	if t == nil || w.ID-n.done.Load() >= n.tail-n.done.Load() {
		return nil, fmt.Errorf("work request %#x is not outstanding", w.ID)
	}
	s := &n.slots[w.ID%uint64(len(n.slots))]
	b := &s.buf
	b.sge, b.mr, b.inline = b.sge[:0], b.mr[:0], b.inline[:0]
	l := w.Local
	switch {
	case l == nil:
		return nil, fmt.Errorf("work request %#x: %w: not described", w.ID, errRebuild)
	case len(l.Inline) > 0:
		if len(l.Inline) > int(q.MaxInline) {
			return nil, fmt.Errorf("work request %#x: %w: %d inline bytes", w.ID, errRebuild, len(l.Inline))
		}
		b.inline = append(b.inline, l.Inline...)
		return b, nil
	case len(l.SGEs) > int(min(q.MaxSendSGE, maxSendSGEs)):
		return nil, fmt.Errorf("work request %#x: %w: %d SGEs", w.ID, errRebuild, len(l.SGEs))
	}
	op := s.opcode
	writesLocal := op == abi.WROpRDMARead || op == abi.WROpAtomicCmpSwp || op == abi.WROpAtomicFetchAdd
	for _, g := range l.SGEs {
		mr := q.Dev.LookupMR(g.LKey)
		if mr == nil || mr.PD != q.PD || !mr.Local(t, g.Addr, uint64(g.Length)) ||
			(writesLocal && mr.Access&abi.AccessLocalWrite == 0) {
			return nil, fmt.Errorf("work request %#x: %w: lkey %#x", w.ID, errRebuild, g.LKey)
		}
		b.sge = append(b.sge, abi.SGE{Addr: g.Addr, Length: g.Length, LKey: g.LKey})
		b.mr = append(b.mr, mr)
	}
	return b, nil
}

// RecvBuffer returns the receive a SEND was being placed in (rc.Rebuilder,
// during RestoreNet): the one the transport consumed, by its ID, with the
// capacity it had.
func (n *netQP) RecvBuffer(r *rc.RecvState) (rc.Buffer, error) {
	if n.recvOpen != 1 || n.recvs[0].wrID != r.ID {
		return nil, fmt.Errorf("receive %#x was not consumed", r.ID)
	}
	b := &n.recvs[0]
	var capacity uint64
	for _, s := range b.sge {
		capacity += uint64(s.Length)
	}
	if uint64(r.Length) != min(capacity, abi.MaxMsgSize) {
		return nil, fmt.Errorf("receive %#x of %d bytes, its SGEs hold %d", r.ID, r.Length, capacity)
	}
	return b, nil
}
