package engine

import (
	"fmt"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// A QP's state for a handover (state.go): what it holds beyond CREATE_QP's
// parameters, its export, validation and import, and the peers and network
// attachments the importer sets up again.

// QPAttrState is a QP's current attributes (abi.QPAttr without qpn and
// attr_mask), as MODIFY_QP set them and QUERY_QP answers them.
type QPAttrState struct {
	State           uint32   `json:"qp_state"`
	AccessFlags     uint32   `json:"qp_access_flags"`
	PKeyIndex       uint32   `json:"pkey_index"`
	PortNum         uint32   `json:"port_num"`
	PathMTU         uint32   `json:"path_mtu"`
	DestQPNum       uint32   `json:"dest_qp_num"`
	RQPSN           uint32   `json:"rq_psn"`
	SQPSN           uint32   `json:"sq_psn"`
	MaxRdAtomic     uint32   `json:"max_rd_atomic"`
	MaxDestRdAtomic uint32   `json:"max_dest_rd_atomic"`
	MinRNRTimer     uint32   `json:"min_rnr_timer"`
	Timeout         uint32   `json:"timeout"`
	RetryCnt        uint32   `json:"retry_cnt"`
	RNRRetry        uint32   `json:"rnr_retry"`
	DGID            [16]byte `json:"dgid"`
	SGIDIndex       uint32   `json:"sgid_index"`
	HopLimit        uint32   `json:"hop_limit"`
	Paths           uint32   `json:"paths"`
	QKey            uint32   `json:"qkey"`
}

func attrState(a *abi.QPAttr) QPAttrState {
	return QPAttrState{State: a.QPState, AccessFlags: a.QPAccessFlags, PKeyIndex: a.PKeyIndex, PortNum: a.PortNum,
		PathMTU: a.PathMTU, DestQPNum: a.DestQPNum, RQPSN: a.RQPSN, SQPSN: a.SQPSN, MaxRdAtomic: a.MaxRdAtomic,
		MaxDestRdAtomic: a.MaxDestRdAtomic, MinRNRTimer: a.MinRNRTimer, Timeout: a.Timeout, RetryCnt: a.RetryCnt,
		RNRRetry: a.RNRRetry, DGID: a.DGID, SGIDIndex: a.SGIDIndex, HopLimit: a.HopLimit, Paths: a.Paths, QKey: a.QKey}
}

// Attr returns s as an abi.QPAttr of QP num.
func (s *QPAttrState) Attr(num uint32) abi.QPAttr {
	return abi.QPAttr{QPN: num, QPState: s.State, QPAccessFlags: s.AccessFlags, PKeyIndex: s.PKeyIndex,
		PortNum: s.PortNum, PathMTU: s.PathMTU, DestQPNum: s.DestQPNum, RQPSN: s.RQPSN, SQPSN: s.SQPSN,
		MaxRdAtomic: s.MaxRdAtomic, MaxDestRdAtomic: s.MaxDestRdAtomic, MinRNRTimer: s.MinRNRTimer,
		Timeout: s.Timeout, RetryCnt: s.RetryCnt, RNRRetry: s.RNRRetry, DGID: s.DGID, SGIDIndex: s.SGIDIndex,
		HopLimit: s.HopLimit, Paths: s.Paths, QKey: s.QKey}
}

// StashState is a receive WQE a QP with an SRQ consumed for a message its
// requester abandoned (it serves the QP's next message).
type StashState struct {
	WRID uint64     `json:"wr_id"`
	SGEs []SGEState `json:"sges"`
}

// SGEState is one scatter/gather entry.
type SGEState struct {
	Addr   uint64 `json:"addr"`
	Length uint32 `json:"length"`
	LKey   uint32 `json:"lkey"`
}

// QPCounters are a QP's error counters (counters.go), by wc status where
// they are kept so.
type QPCounters struct {
	Completions map[uint32]uint64 `json:"completions,omitempty"`
	Responder   map[uint32]uint64 `json:"responder,omitempty"`
	RNRSent     uint64            `json:"rnr_naks_sent,omitempty"`
	RNRRecv     uint64            `json:"rnr_naks_received,omitempty"`
	WrongPeer   uint64            `json:"wrong_peer,omitempty"`
	Malformed   uint64            `json:"malformed_wqes,omitempty"`
	UDDropped   uint64            `json:"ud_dropped,omitempty"`
}

// QPState is what a QP holds beyond CREATE_QP's parameters.
type QPState struct {
	Attr QPAttrState `json:"attr"`
	// Peer: the QP resolved its peer device at INIT→RTR (an RC QP); the
	// importer resolves it again by attr.dgid (RNIC.ResolvePeers). SGID
	// is the GID the QP sends from, resolved with it.
	Peer bool     `json:"peer"`
	SGID [16]byte `json:"sgid"`
	// LostPeer: the peer device was reset; sends outstanding then end
	// with RETRY_EXC_ERR (LostEnd: sq_pi then, if LostHaveEnd).
	LostPeer    bool   `json:"lost_peer"`
	LostEnd     uint32 `json:"lost_end"`
	LostHaveEnd bool   `json:"lost_have_end"`
	// Requester side: the next send WQE (sq_ci), the record's sq_pi as
	// last read, the RNR retries of the head WQE, and the flush of a
	// lost peer's sends (send WQEs before RetryEnd complete with
	// RETRY_EXC_ERR while RetryExc).
	SQCI     uint32 `json:"sq_ci"`
	SQPISeen uint32 `json:"sq_pi_seen"`
	RNRTries uint32 `json:"rnr_tries"`
	RetryExc bool   `json:"retry_exc"`
	RetryEnd uint32 `json:"retry_end"`
	// Responder side: the next receive WQE (rq_ci; 0 with an SRQ), the
	// record's rq_pi as last read, whether the QP flushes its receives
	// (ERR), the record's rq_notify as last stored, whether
	// QP_LAST_WQE_REACHED was posted, and an SRQ WQE kept for the next
	// message.
	RQCI       uint32      `json:"rq_ci"`
	RQPISeen   uint32      `json:"rq_pi_seen"`
	RQFlushing bool        `json:"rq_flushing"`
	RQNotify   uint32      `json:"rq_notify"`
	LastWQE    bool        `json:"last_wqe"`
	Stash      *StashState `json:"stash,omitempty"`
	// UDNet: a UD QP attached to the network (attached again at import).
	UDNet bool `json:"ud_net"`
	// Net: an RC QP connected over the network (RestoreNet rebuilds it
	// after ImportState). SGID is the network GID it sends from.
	Net      *NetQPState `json:"net,omitempty"`
	Counters QPCounters  `json:"counters"`
}

// ExportState returns q's state. Precondition: no engine pass runs (the device
// is quiesced) and, for a QP connected over the network, the network is
// frozen (state_net.go).
func (q *QP) ExportState() (QPState, error) {
	q.sqMu.Lock()
	defer q.sqMu.Unlock()
	// The transport's lock comes after sqMu and before rqMu and mu.
	q.mu.Lock()
	nq := q.net
	q.mu.Unlock()
	var ns *NetQPState
	if nq != nil {
		var err error
		if ns, err = nq.export(); err != nil {
			return QPState{}, err
		}
	}
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.net != nq {
		return QPState{}, fmt.Errorf("QP %d: its network transport changed during the export", q.Num)
	}
	if q.sqCI != q.sqCIPub {
		return QPState{}, fmt.Errorf("QP %d: sq_ci not published", q.Num)
	}
	s := QPState{
		Attr: attrState(&q.attr), Peer: q.peer != nil, SGID: q.sgid,
		LostPeer: q.lostPeer, LostEnd: q.lostEnd, LostHaveEnd: q.lostHaveEnd,
		SQCI: q.sqCI, SQPISeen: q.sqPISeen, RNRTries: q.rnrTries, RetryExc: q.retryExc, RetryEnd: q.retryEnd,
		RQCI: q.rqCI, RQPISeen: q.rqPISeen, RQFlushing: q.rqFlushing, RQNotify: q.rqNotifyPub, LastWQE: q.lastWQE,
		UDNet: q.udNet != nil, Net: ns,
	}
	if st := q.srqStash; st != nil {
		s.Stash = &StashState{WRID: st.wrID}
		for _, g := range st.sge {
			s.Stash.SGEs = append(s.Stash.SGEs, SGEState{Addr: g.Addr, Length: g.Length, LKey: g.LKey})
		}
	}
	if c := q.ctr.Load(); c != nil {
		s.Counters = QPCounters{Completions: map[uint32]uint64{}, Responder: map[uint32]uint64{},
			RNRSent: c.rnrSent.Load(), RNRRecv: c.rnrRecv.Load(), WrongPeer: c.wrongPeer.Load(),
			Malformed: c.malformed.Load(), UDDropped: c.udDropped.Load()}
		for i := range c.wc {
			if n := c.wc[i].Load(); n != 0 {
				s.Counters.Completions[uint32(i)] = n
			}
			if n := c.responder[i].Load(); n != 0 {
				s.Counters.Responder[uint32(i)] = n
			}
		}
	}
	return s, nil
}

// CheckAttr validates a QP's imported attributes as MODIFY_QP validates a
// guest's (checkValues), for a QP of the given kind.
func CheckAttr(s *QPAttrState, ud bool) error {
	a := s.Attr(0)
	// An attribute never set is zero: check the ones that are not, as
	// MODIFY_QP checks those its mask names.
	for _, f := range []struct {
		set bool
		bit uint32
	}{
		{a.QPAccessFlags != 0, abi.QPAttrAccessFlags}, {a.PKeyIndex != 0, abi.QPAttrPKeyIndex},
		{a.PortNum != 0, abi.QPAttrPort}, {a.DGID != [16]byte{} || a.SGIDIndex != 0 || a.HopLimit != 0, abi.QPAttrAV},
		{a.PathMTU != 0, abi.QPAttrPathMTU}, {a.Timeout != 0, abi.QPAttrTimeout}, {a.RetryCnt != 0, abi.QPAttrRetryCnt},
		{a.RNRRetry != 0, abi.QPAttrRNRRetry}, {a.RQPSN != 0, abi.QPAttrRQPSN}, {a.SQPSN != 0, abi.QPAttrSQPSN},
		{a.MinRNRTimer != 0, abi.QPAttrMinRNRTimer}, {a.Paths != 0, abi.QPAttrPaths}, {a.QKey != 0, abi.QPAttrQKey},
	} {
		if f.set {
			a.AttrMask |= f.bit
		}
	}
	switch a.QPState {
	case abi.QPSReset, abi.QPSInit, abi.QPSRTR, abi.QPSRTS, abi.QPSErr:
	default:
		return stateErr("qp_state %d", a.QPState)
	}
	if !checkValues(&a, ud) {
		return stateErr("attributes out of range")
	}
	return nil
}

// ImportState gives a QP being imported its state, after AddQP (which
// leaves it in RESET) and before any engine runs on the device. It
// validates st against the QP (CheckAttr, ring windows, the stash's SGE
// count); the peer is resolved later (ResolvePeers), the network
// transport rebuilt by RestoreNet (st.Net).
func (q *QP) ImportState(st *QPState) error {
	if err := CheckAttr(&st.Attr, q.UD); err != nil {
		return fmt.Errorf("QP %d: %w", q.Num, err)
	}
	switch {
	case st.Attr.State == abi.QPSReset && (st.Peer || st.UDNet || st.Net != nil):
		return stateErr("QP %d: a peer in RESET", q.Num)
	case st.Peer && st.Net != nil:
		return stateErr("QP %d: a peer on this host and on the network", q.Num)
	case st.Net != nil && q.UD:
		return stateErr("QP %d: a UD QP connected over the network", q.Num)
	case st.Peer && q.UD:
		return stateErr("QP %d: a UD QP with a peer", q.Num)
	case st.UDNet && !q.UD:
		return stateErr("QP %d: an RC QP attached to the UD network", q.Num)
	case st.RNRTries > 7:
		return stateErr("QP %d: rnr_tries %d", q.Num, st.RNRTries)
	case st.RQNotify > 1 || (st.RQNotify != 0 && !q.RQNotify):
		return stateErr("QP %d: rq_notify %d", q.Num, st.RQNotify)
	case q.SRQ != nil && (st.RQCI != 0 || st.RQPISeen != 0):
		return stateErr("QP %d: receive indices with an SRQ", q.Num)
	case st.Stash != nil && (q.SRQ == nil || len(st.Stash.SGEs) > int(min(q.SRQ.MaxSGE, maxRecvSGEs))):
		return stateErr("QP %d: a stashed receive WQE", q.Num)
	case (st.RQFlushing || st.LastWQE) && st.Attr.State != abi.QPSErr:
		return stateErr("QP %d: flushing out of ERR", q.Num)
	}
	for _, m := range []map[uint32]uint64{st.Counters.Completions, st.Counters.Responder} {
		for k := range m {
			if k >= maxWCStatus {
				return stateErr("QP %d: counter of wc status %d", q.Num, k)
			}
		}
	}
	q.sqMu.Lock()
	defer q.sqMu.Unlock()
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.attr = st.Attr.Attr(q.Num)
	q.sgid = st.SGID
	q.lostPeer, q.lostEnd, q.lostHaveEnd = st.LostPeer, st.LostEnd, st.LostHaveEnd
	q.sqCI, q.sqCIPub, q.sqPISeen = st.SQCI, st.SQCI, st.SQPISeen
	q.rnrTries, q.rnrWait = st.RNRTries, 0 // an RNR wait in progress: retried at once
	q.retryExc, q.retryEnd = st.RetryExc, st.RetryEnd
	q.rqCI, q.rqPISeen, q.rqFlushing, q.rqNotifyPub, q.lastWQE = st.RQCI, st.RQPISeen, st.RQFlushing, st.RQNotify, st.LastWQE
	q.srqStash = nil
	if st.Stash != nil {
		sg := &stash{wrID: st.Stash.WRID}
		for _, g := range st.Stash.SGEs {
			sg.sge = append(sg.sge, abi.SGE{Addr: g.Addr, Length: g.Length, LKey: g.LKey})
		}
		q.srqStash = sg
	}
	// The record holds these already (the exporter stored them).
	q.ciMu.Lock()
	q.ciDone[sqIdx].Store(st.SQCI)
	q.ciDone[rqIdx].Store(st.RQCI)
	q.ciStored = [2]uint32{st.SQCI, st.RQCI}
	q.ciMu.Unlock()
	q.ctr.Store(nil)
	if c := st.Counters; len(c.Completions)+len(c.Responder) > 0 || c.RNRSent+c.RNRRecv+c.WrongPeer+c.Malformed+c.UDDropped > 0 {
		n := new(qpCounters)
		for k, v := range c.Completions {
			n.wc[k].Store(v)
		}
		for k, v := range c.Responder {
			n.responder[k].Store(v)
		}
		n.rnrSent.Store(c.RNRSent)
		n.rnrRecv.Store(c.RNRRecv)
		n.wrongPeer.Store(c.WrongPeer)
		n.malformed.Store(c.Malformed)
		n.udDropped.Store(c.UDDropped)
		q.ctr.Store(n)
	}
	return nil
}

// ResolvePeers resolves again the peer device of every RC QP that had one
// (QPState.Peer), by its dgid on the fabric: every device of the daemon
// has been imported (its GIDs registered). A dgid no device owns any more
// leaves the QP without a peer, as a peer device that went would (its
// sends complete with RETRY_EXC_ERR).
func (d *RNIC) ResolvePeers(peers map[uint32]bool) {
	if d.fabric == nil {
		return
	}
	for _, q := range d.allQPs() {
		if !peers[q.Num] {
			continue
		}
		q.mu.Lock()
		dgid := q.attr.DGID
		q.mu.Unlock()
		p := d.fabric.Lookup(dgid)
		q.mu.Lock()
		q.peer = p
		q.mu.Unlock()
	}
}

// ReattachUD attaches the UD QP num to the fabric's UD network again, as
// INIT→RTR attached it (an import of a QP with QPState.UDNet). Without a
// network that carries UD the QP goes on with this host only, as it would
// have had there been none at RTR.
func (d *RNIC) ReattachUD(num uint32) error {
	q := d.LookupQP(num)
	if q == nil || !q.UD || d.fabric == nil {
		return stateErr("QP %d: no UD QP to attach to the network", num)
	}
	n := d.fabric.udNetwork()
	locals := d.fabric.NetGIDs(d)
	if n == nil || len(locals) == 0 {
		d.log.WithField("qp", num).Warn("import: no network carries UD here: the UD QP reaches this host only")
		return nil
	}
	un := newUDNet(q)
	conn, err := n.OpenUD(q.srcQPN(), locals, un)
	if err != nil && q.GSI {
		// As at INIT→RTR: the GSI QP goes on without the network
		// rather than leave its device without a MAD layer.
		d.log.WithError(err).WithField("qp", num).Warn("import: the GSI QP is not attached to the network")
		return nil
	}
	if err != nil {
		return fmt.Errorf("QP %d: attach to the network: %w", num, err)
	}
	un.conn = conn
	q.mu.Lock()
	q.udNet = un
	q.mu.Unlock()
	return nil
}
