package engine

import (
	"cmp"
	"slices"

	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Views of a device's objects for its operator (the daemon's resource
// listings, as iproute2's `rdma resource show` lists an RNIC's): each a
// value copied from the object under the object's own lock, so a view is
// consistent per object and the engine never waits for a reader for more
// than one object's copy. The registry is read under RNIC.mu only to
// collect the objects (never with an object lock held: RNIC.mu is below
// them in the lock order), and the objects are copied after it is
// released. A listing is a page: the objects whose handle is greater than
// after, in handle order, at most limit of them (limit < 0: all).
//
// Guest memory is read only for a CQ's record (its consumer index and
// arm word), under memmap.Guard: a front-end that shrank its memory
// costs the view those fields, never the daemon.

// Transport says how a QP reaches its peer.
type Transport string

// Transports.
const (
	// TransportNone: an RC QP not connected yet (RESET, INIT).
	TransportNone Transport = ""
	// TransportLocal: a device of this host (the same-host engine).
	TransportLocal Transport = "local"
	// TransportRoCE: another host, RoCEv2 over UDP (a UD QP: attached
	// to the device's host addresses, so it also reaches this host).
	TransportRoCE Transport = "roce"
	// TransportNIC: the host's RDMA NIC executes the QP (hw.go).
	TransportNIC Transport = "verbs"
)

// QPView is a QP as the resource views show it.
type QPView struct {
	QPN           uint32
	Type          uint32 // abi.QPTypeRC, abi.QPTypeUD or abi.QPTypeGSI
	State         uint32 // abi.QPSReset …
	PD            uint32
	SendCQ        uint32
	RecvCQ        uint32
	SRQ           uint32 // 0: the QP has its own receive queue
	DoorbellQueue int
	SQDepth       uint32
	RQDepth       uint32
	MaxSendSGE    uint32
	MaxRecvSGE    uint32
	MaxInline     uint32
	SigAll        bool
	Access        uint32 // qp_access_flags
	// The connection (RC, from INIT→RTR on): the peer's GID and QP
	// number, the GID index the QP sends from, the path MTU (abi.MTU*)
	// and the path count it asked for (0: the network's default).
	Transport Transport
	DestGID   [16]byte
	DestQPN   uint32
	SGIDIndex uint32
	PathMTU   uint32
	Paths     int
	// SQPSN and RQPSN are the next PSNs the transport sends and expects
	// for a QP on the network, else the ones MODIFY_QP gave (what
	// QUERY_QP answers); HasPSN is false where neither applies (a
	// sprayed QP's packets carry a sequence space of their own).
	SQPSN, RQPSN uint32
	HasPSN       bool
	QKey         uint32 // UD
	Errors       QPErrors
}

// CQView is a CQ as the resource views show it.
type CQView struct {
	CQN       uint32
	Depth     uint32 // cqe
	ArmRecord bool   // armed through its record's arm word
	// Armed: a completion notification is requested (REQ_NOTIFY_CQ, or
	// the record's arm word); SolicitedOnly: only for a solicited or
	// error completion. Unknown (false) when the record cannot be read.
	Armed, SolicitedOnly bool
	// Overrun: the CQ overflowed; it writes nothing any more (CQ_ERROR
	// was raised, its QPs moved to ERR).
	Overrun bool
	// Written counts the CQEs written since creation; PI is the
	// device's producer index; Pending the entries written and not yet
	// consumed by the driver (pi − the record's ci; 0 when the record
	// cannot be read).
	Written uint64
	PI      uint32
	Pending uint32
	// ErrorCQEs counts error completions pushed to the CQ, LostCQEs
	// completions it could not take (overrun).
	ErrorCQEs, LostCQEs uint64
	QPs                 int // QPs using the CQ (for either queue)
}

// MRKind says what registered an MR.
type MRKind string

// MR kinds.
const (
	MRUser MRKind = "user" // REG_MR over guest pages
	MRDMA  MRKind = "dma"  // REG_MR flags DMA: guest-physical addresses, local only
	MRFast MRKind = "fast" // ALLOC_MR, registered by REG_MR WQEs
)

// MRView is an MR as the resource views show it.
type MRView struct {
	LKey, RKey uint32
	PD         uint32
	Kind       MRKind
	// Valid: the MR holds a registration (always for user and DMA MRs;
	// for a fast one, between its REG_MR WQE and its invalidation).
	Valid     bool
	IOVA      uint64
	Length    uint64
	Access    uint32
	PageShift uint
	Extents   int // guest-physically contiguous runs
	Windows   int // memory windows bound in it
	MaxPages  uint32
	// PinnedBytes is what the MR holds pinned (the caller's pinner
	// fills it; a DMA or fast MR pins nothing).
	PinnedBytes uint64
}

// MWView is a memory window as the resource views show it.
type MWView struct {
	RKey   uint32
	PD     uint32
	Type   uint32 // abi.MWType1 or abi.MWType2
	Bound  bool
	MRKey  uint32 // the MR it is bound in
	Addr   uint64
	Length uint64
	Access uint32
	QPN    uint32 // a bound type 2 window's QP
}

// SRQView is a shared receive queue as the resource views show it.
type SRQView struct {
	SRQN          uint32
	PD            uint32
	Depth         uint32 // max_wr
	MaxSGE        uint32
	Limit         uint32 // armed limit, 0: none
	Stopped       bool   // its producer index ran away or its ring left guest memory
	QPs           int
	DoorbellQueue int
}

// PDView is a protection domain and what names it.
type PDView struct {
	PDN                      uint32
	MRs, MWs, QPs, SRQs, AHs int
}

// Census counts a device's objects by kind.
type Census struct {
	PDs, MRs, MWs, CQs, QPs, SRQs, AHs int
}

// Census returns the device's object counts (MRs counts ALLOC_MR MRs,
// MWs the windows, unlike Count(KindMR), which counts what max_mr bounds).
func (d *RNIC) Census() Census {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return Census{PDs: len(d.pds), MRs: len(d.mrs) + len(d.frmrs), MWs: len(d.mws), CQs: len(d.cqs),
		QPs: len(d.qps), SRQs: len(d.srqs), AHs: len(d.ahs)}
}

// keyed is an object with the handle it is listed by.
type keyed[T any] struct {
	h uint32
	v T
}

// pageOf sorts objs (collected with handles above the page's after) by
// handle and keeps the first limit. A page costs a pass over the kind's
// objects and a sort of those after the cursor: bounded by the device's
// limits, and nothing the engine waits for.
func pageOf[T any](objs []keyed[T], limit int) []keyed[T] {
	slices.SortFunc(objs, func(a, b keyed[T]) int { return cmp.Compare(a.h, b.h) })
	if limit >= 0 && len(objs) > limit {
		objs = objs[:limit]
	}
	return objs
}

// collect copies m's objects whose handle is above after, with their
// handles. Precondition: d.mu held.
func collect[T any](m map[uint32]T, after uint32) []keyed[T] {
	var out []keyed[T]
	for h, v := range m {
		if h > after {
			out = append(out, keyed[T]{h, v})
		}
	}
	return out
}

// QPViews lists the device's QPs by QP number (see the page rules above).
func (d *RNIC) QPViews(after uint32, limit int) []QPView {
	d.mu.RLock()
	qs := collect(d.qps, after)
	d.mu.RUnlock()
	qs = pageOf(qs, limit)
	out := make([]QPView, 0, len(qs))
	for _, k := range qs {
		out = append(out, k.v.snapshot())
	}
	return out
}

// snapshot copies the QP. It takes q.mu, then (with no lock held) the
// transport's lock for its report.
func (q *QP) snapshot() QPView {
	v := QPView{
		QPN: q.Num, Type: abi.QPTypeRC, PD: q.PD, DoorbellQueue: q.DoorbellQueue,
		SQDepth: q.SQ.Depth, RQDepth: q.RQ.Depth, MaxSendSGE: q.MaxSendSGE, MaxRecvSGE: q.MaxRecvSGE,
		MaxInline: q.MaxInline, SigAll: q.SigAll,
	}
	switch {
	case q.GSI:
		v.Type = abi.QPTypeGSI
	case q.UD:
		v.Type = abi.QPTypeUD
	}
	if q.SendCQ != nil {
		v.SendCQ = q.SendCQ.Num
	}
	if q.RecvCQ != nil {
		v.RecvCQ = q.RecvCQ.Num
	}
	if q.SRQ != nil {
		v.SRQ, v.RQDepth = q.SRQ.Num, 0
	}
	q.mu.Lock()
	a, peer, nq, un := q.attr, q.peer, q.net, q.udNet
	q.mu.Unlock()
	v.State, v.Access, v.QKey = a.QPState, a.QPAccessFlags, a.QKey
	v.Errors = q.ctr.Load().snapshot()
	switch {
	case q.HW != nil:
		v.Transport = TransportNIC
	case nq != nil, un != nil:
		v.Transport = TransportRoCE
	case q.UD, peer != nil:
		v.Transport = TransportLocal
	}
	if q.UD {
		return v
	}
	v.DestGID, v.DestQPN, v.SGIDIndex, v.PathMTU, v.Paths = a.DGID, a.DestQPNum, a.SGIDIndex, a.PathMTU, int(a.Paths)
	v.SQPSN, v.RQPSN, v.HasPSN = a.SQPSN, a.RQPSN, true
	if nq == nil {
		return v
	}
	if r, ok := nq.conn.(rc.Reporter); ok {
		rep := r.Report()
		v.SQPSN, v.RQPSN, v.HasPSN, v.Paths = rep.SQPSN, rep.RQPSN, rep.HasPSN, rep.Paths
		e := &v.Errors
		e.RNRNAKsSent += rep.RNRNAKsSent
		e.RNRNAKsReceived += rep.RNRNAKsRecv
		e.Retransmits, e.Timeouts = rep.Retransmits, rep.Timeouts
		e.SeqNAKsSent, e.SeqNAKsRecv = rep.SeqNAKsSent, rep.SeqNAKsRecv
		e.NAKsSent, e.NAKsRecv = rep.NAKsSent, rep.NAKsRecv
		e.Duplicates, e.DroppedPackets = rep.Duplicates, rep.Dropped
	}
	return v
}

// CQViews lists the device's CQs by CQ number.
func (d *RNIC) CQViews(after uint32, limit int) []CQView {
	d.mu.RLock()
	cs := collect(d.cqs, after)
	// The QPs using each CQ (CQ.Users counts a QP whose queues share
	// one CQ twice); QP.SendCQ and RecvCQ are immutable.
	users := make(map[*CQ]int)
	for _, q := range d.qps {
		if q.SendCQ != nil {
			users[q.SendCQ]++
		}
		if q.RecvCQ != nil && q.RecvCQ != q.SendCQ {
			users[q.RecvCQ]++
		}
	}
	d.mu.RUnlock()
	cs = pageOf(cs, limit)
	out := make([]CQView, 0, len(cs))
	if len(cs) == 0 {
		return out
	}
	t := d.acquire()
	if t != nil {
		defer t.Release()
	}
	for _, k := range cs {
		v := k.v.snapshot(t)
		v.QPs = users[k.v]
		out = append(out, v)
	}
	return out
}

// snapshot copies the CQ; t (nil: detached) is its device's table, for the
// record.
func (c *CQ) snapshot(t *memmap.Table) CQView {
	v := CQView{CQN: c.Num, Depth: c.Ring.Depth, ArmRecord: c.ArmRecord,
		ErrorCQEs: c.errCQEs.Load(), LostCQEs: c.lostCQEs.Load()}
	c.mu.Lock()
	v.Armed, v.SolicitedOnly, v.Overrun = c.armed, c.armed && c.solicitedOnly, c.overrun
	v.Written, v.PI = c.written, c.pi
	armSeen := c.armSeen
	c.mu.Unlock()
	if t == nil {
		return v
	}
	rec, err := t.Slice(c.Record, CQRecordSize(c.ArmRecord))
	if err != nil {
		return v
	}
	var ci, arm uint32
	if memmap.Guard(func() {
		ci = abi.LoadUint32(rec, abi.CQRecordCI)
		if c.ArmRecord {
			arm = abi.LoadUint32(rec, abi.CQRecordArm)
		}
	}) != nil {
		return v
	}
	if d := v.PI - ci; d <= v.Depth {
		v.Pending = d
	}
	if c.ArmRecord && !v.Overrun && arm>>abi.CQArmSeqShift != armSeen>>abi.CQArmSeqShift {
		v.Armed, v.SolicitedOnly = true, arm&abi.CQArmSolicited != 0
	}
	return v
}

// MRViews lists the device's MRs (user, DMA and ALLOC_MR ones) by lkey;
// pinned, if not nil, returns what an MR holds pinned. The keys of an
// ALLOC_MR MR change at each registration, so a page boundary may move
// past or back over one that changed meanwhile.
func (d *RNIC) MRViews(after uint32, limit int, pinned func(*MR) uint64) []MRView {
	type mrOrFast struct {
		m *MR
		f *FRMR
	}
	d.mu.RLock()
	var all []keyed[mrOrFast]
	for k, m := range d.mrs {
		if k > after {
			all = append(all, keyed[mrOrFast]{k, mrOrFast{m: m}})
		}
	}
	for _, f := range d.frmrs {
		if k := f.state.Load().key; k > after {
			all = append(all, keyed[mrOrFast]{k, mrOrFast{f: f}})
		}
	}
	d.mu.RUnlock()
	all = pageOf(all, limit)
	out := make([]MRView, 0, len(all))
	for _, k := range all {
		if f := k.v.f; f != nil {
			out = append(out, f.snapshot(k.h))
			continue
		}
		v := k.v.m.snapshot()
		if pinned != nil && v.Kind == MRUser {
			v.PinnedBytes = pinned(k.v.m)
		}
		out = append(out, v)
	}
	return out
}

// snapshot copies an MR registered by REG_MR.
func (m *MR) snapshot() MRView {
	v := MRView{LKey: m.Key, RKey: m.RKey, PD: m.PD, Kind: MRUser, Valid: true, IOVA: m.IOVA, Length: m.Length,
		Access: m.Access, PageShift: m.PageShift, Extents: len(m.extents)}
	if v.RKey == 0 {
		v.RKey = m.Key
	}
	if m.DMA {
		v.Kind, v.PageShift = MRDMA, 0
	}
	m.bindMu.Lock()
	v.Windows = m.windows
	m.bindMu.Unlock()
	return v
}

// snapshot copies an ALLOC_MR MR whose current key is key (as listed).
func (f *FRMR) snapshot(key uint32) MRView {
	v := MRView{LKey: key, RKey: key, PD: f.PD, Kind: MRFast, MaxPages: f.MaxPages}
	st := f.state.Load()
	if st.mr == nil || st.dead {
		return v
	}
	m := st.mr
	v.LKey, v.RKey = st.key, st.key
	v.Valid, v.IOVA, v.Length, v.Access, v.PageShift, v.Extents = true, m.IOVA, m.Length, m.Access, m.PageShift, len(m.extents)
	m.bindMu.Lock()
	v.Windows = m.windows
	m.bindMu.Unlock()
	return v
}

// MWViews lists the device's memory windows by current rkey.
func (d *RNIC) MWViews(after uint32, limit int) []MWView {
	d.mu.RLock()
	var ws []keyed[*MW]
	for _, w := range d.mws {
		if k := w.state.Load().key; k > after {
			ws = append(ws, keyed[*MW]{k, w})
		}
	}
	d.mu.RUnlock()
	ws = pageOf(ws, limit)
	out := make([]MWView, 0, len(ws))
	for _, k := range ws {
		w := k.v
		st := w.state.Load()
		v := MWView{RKey: st.key, PD: w.PD, Type: w.Type}
		if st.mr != nil && !st.dead {
			v.Bound, v.MRKey, v.Addr, v.Length, v.Access = true, st.mr.Key, st.addr, st.length, st.access
			if st.qp != nil {
				v.QPN = st.qp.Num
			}
		}
		out = append(out, v)
	}
	return out
}

// SRQViews lists the device's SRQs by SRQ number.
func (d *RNIC) SRQViews(after uint32, limit int) []SRQView {
	d.mu.RLock()
	ss := collect(d.srqs, after)
	d.mu.RUnlock()
	ss = pageOf(ss, limit)
	out := make([]SRQView, 0, len(ss))
	for _, k := range ss {
		s := k.v
		v := SRQView{SRQN: s.Num, PD: s.PD, Depth: s.Ring.Depth, MaxSGE: s.MaxSGE, QPs: int(s.Users.Load()),
			DoorbellQueue: s.DoorbellQueue}
		s.mu.Lock()
		v.Limit, v.Stopped = s.limit, s.stopped
		s.mu.Unlock()
		out = append(out, v)
	}
	return out
}

// PDViews lists the device's PDs by PD number, each with the objects
// naming it. The counts are taken in one pass over the registry under
// RNIC.mu (the objects' PDs are immutable).
func (d *RNIC) PDViews(after uint32, limit int) []PDView {
	d.mu.RLock()
	defer d.mu.RUnlock()
	ps := pageOf(collect(d.pds, after), limit)
	out := make([]PDView, 0, len(ps))
	idx := make(map[uint32]int, len(ps))
	for i, k := range ps {
		out = append(out, PDView{PDN: k.h})
		idx[k.h] = i
	}
	count := func(pd uint32, field func(*PDView) *int) {
		if i, ok := idx[pd]; ok {
			*field(&out[i])++
		}
	}
	for _, m := range d.mrs {
		count(m.PD, func(v *PDView) *int { return &v.MRs })
	}
	for _, f := range d.frmrs {
		count(f.PD, func(v *PDView) *int { return &v.MRs })
	}
	for _, w := range d.mws {
		count(w.PD, func(v *PDView) *int { return &v.MWs })
	}
	for _, q := range d.qps {
		count(q.PD, func(v *PDView) *int { return &v.QPs })
	}
	for _, s := range d.srqs {
		count(s.PD, func(v *PDView) *int { return &v.SRQs })
	}
	for _, a := range d.ahs {
		count(a.PD, func(v *PDView) *int { return &v.AHs })
	}
	return out
}
