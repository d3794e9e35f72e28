package rdma

import (
	"errors"
	"fmt"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Live upgrade (docs/state.md): a Device's objects, written out by one
// vrdmad (ExportState) and taken up by the next (ImportState,
// FinishImport) so that the guest cannot tell: same handles, keys, QP
// numbers, PSNs, ring positions, CQ indices and pins. An object is
// exported as the parameters of the command that created it (so that the
// importer rebuilds it through the very functions that build it for a
// guest, and validates it as they validate a guest's) plus the engine's
// state of it (engine/state.go).

// ErrNotTransferable: the device holds something this version cannot hand
// over (a QP connected over the network by multipath spray, a memory
// window, an ALLOC_MR MR, a host NIC); wrapped with what it is.
var ErrNotTransferable = errors.New("not transferable")

// DeviceState is everything a Device holds for its attached driver, as
// plain data. Slices are in handle order.
type DeviceState struct {
	// NodeGUID is the device's (derived from its UUID): ImportState
	// refuses a state written by another device.
	NodeGUID uint64 `json:"node_guid"`
	// HandleSeq is the position of the device's handle sequence: handles
	// and keys drawn after the import continue it.
	HandleSeq uint32 `json:"handle_seq"`
	// GIDs are the filled entries of the port's GID table (entry 0 is the
	// port GID; the others ADD_GID added, or the network GIDs).
	GIDs []GIDState `json:"gids"`
	// PDs are the protection domains' handles.
	PDs  []uint32   `json:"pds"`
	MRs  []MRState  `json:"mrs"`
	AHs  []AHState  `json:"ahs"`
	CQs  []CQState  `json:"cqs"`
	SRQs []SRQState `json:"srqs"`
	QPs  []QPState  `json:"qps"`
	// Counters are the device's counters.
	Counters CountersState `json:"counters"`
}

// GIDState is one filled entry of the GID table.
type GIDState struct {
	Index int      `json:"index"`
	GID   [16]byte `json:"gid"`
}

// MRState is an MR: REG_MR's request and the MR's pages.
type MRState struct {
	// Key is the MR's lkey and rkey.
	Key    uint32 `json:"key"`
	PD     uint32 `json:"pd"`
	Access uint32 `json:"access"`
	// DMA: a DMA MR (REG_MR flag DMA: no range, no pages).
	DMA       bool   `json:"dma,omitempty"`
	IOVA      uint64 `json:"iova"`
	Length    uint64 `json:"length"`
	PageShift uint32 `json:"page_shift"`
	// Extents are the MR's bytes as guest-physically contiguous runs, in
	// MR order (the page list, with adjacent pages merged).
	Extents []ExtentState `json:"extents"`
}

// ExtentState is a guest-physically contiguous run of an MR's bytes.
type ExtentState struct {
	GPA uint64 `json:"gpa"`
	Len uint64 `json:"len"`
}

// AHState is an address handle: CREATE_AH's request but the sgid index,
// which may have changed since (the AH keeps the GID it was created
// with: SGID).
type AHState struct {
	Handle uint32   `json:"handle"`
	PD     uint32   `json:"pd"`
	DGID   [16]byte `json:"dgid"`
	SGID   [16]byte `json:"sgid"`
}

// CQState is a CQ: CREATE_CQ's request and the engine's state of it.
type CQState struct {
	Handle uint32 `json:"handle"`
	// Depth is cqe; Pages the ring's 4 KiB pages; Record the doorbell
	// record's address; ArmRecord CREATE_CQ's flag ARM_RECORD.
	Depth     uint32         `json:"depth"`
	Pages     []uint64       `json:"pages"`
	Record    uint64         `json:"record"`
	ArmRecord bool           `json:"arm_record,omitempty"`
	State     engine.CQState `json:"state"`
}

// SRQState is an SRQ: CREATE_SRQ's request and the engine's state of it
// (its armed limit is there).
type SRQState struct {
	Handle        uint32          `json:"handle"`
	PD            uint32          `json:"pd"`
	MaxWR         uint32          `json:"max_wr"`
	MaxSGE        uint32          `json:"max_sge"`
	WQEShift      uint32          `json:"wqe_shift"`
	DoorbellQueue uint32          `json:"doorbell_queue"`
	Pages         []uint64        `json:"pages"`
	Record        uint64          `json:"record"`
	State         engine.SRQState `json:"state"`
}

// QPState is a QP: CREATE_QP's request and the engine's state of it
// (attributes, ring positions, RNR and lost-peer state, counters).
type QPState struct {
	// Num is the QP number.
	Num uint32 `json:"num"`
	// Type is qp_type: RC (2), UD (4) or GSI (1).
	Type     uint32 `json:"type"`
	PD       uint32 `json:"pd"`
	SendCQ   uint32 `json:"send_cq"`
	RecvCQ   uint32 `json:"recv_cq"`
	SRQ      uint32 `json:"srq,omitempty"` // 0: the QP has its own receive queue
	SigAll   bool   `json:"sq_sig_all,omitempty"`
	RQNotify bool   `json:"rq_notify,omitempty"` // CREATE_QP flag RQ_NOTIFY
	// The queues: depths, SGEs, inline bytes, WQE strides (log2), the
	// doorbell queue, the pages (the send queue's SQNPages first, then the
	// receive queue's) and the doorbell record's address.
	MaxSendWR     uint32         `json:"max_send_wr"`
	MaxRecvWR     uint32         `json:"max_recv_wr"`
	MaxSendSGE    uint32         `json:"max_send_sge"`
	MaxRecvSGE    uint32         `json:"max_recv_sge"`
	MaxInlineData uint32         `json:"max_inline_data"`
	SQWQEShift    uint32         `json:"sq_wqe_shift"`
	RQWQEShift    uint32         `json:"rq_wqe_shift"`
	DoorbellQueue uint32         `json:"doorbell_queue"`
	SQNPages      uint32         `json:"sq_npages"`
	Pages         []uint64       `json:"pages"`
	Record        uint64         `json:"record"`
	State         engine.QPState `json:"state"`
}

// CountersState are the device's counters: control commands and failed
// ones, events lost, and the engine's (engine.CountersState).
type CountersState struct {
	Commands   uint64               `json:"commands"`
	Errors     uint64               `json:"errors"`
	EventsLost uint64               `json:"events_lost"`
	Engine     engine.CountersState `json:"engine"`
}

// ExportState describes the device. Precondition: Quiesce'd, and its
// Server frozen (no command runs); with QPs connected over the network,
// the network frozen too (hostnet.Network.Freeze: their transports'
// states are read, engine/state_net.go). It fails with ErrNotTransferable
// (wrapped with what) for what this version cannot hand over.
func (d *Device) ExportState() (*DeviceState, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.res == nil {
		return nil, errors.New("rdma: export: no driver attached")
	}
	if d.cfg.NIC != nil {
		return nil, fmt.Errorf("rdma: export: %w: the device runs on a host NIC", ErrNotTransferable)
	}
	if err := d.eng.Transferable(); err != nil {
		return nil, fmt.Errorf("rdma: export: %w: %v", ErrNotTransferable, err)
	}
	if err := d.publishAll(); err != nil {
		return nil, fmt.Errorf("rdma: export: %w", err)
	}
	st := &DeviceState{NodeGUID: d.conf.NodeGUID, HandleSeq: d.eng.HandleSeq()}
	for _, g := range d.GIDs() {
		st.GIDs = append(st.GIDs, GIDState{Index: g.Index, GID: g.GID})
	}
	objs := d.eng.Objects()
	st.PDs = objs.PDs
	for _, mr := range objs.MRs {
		ms := MRState{Key: mr.Key, PD: mr.PD, Access: mr.Access, DMA: mr.DMA, IOVA: mr.IOVA, Length: mr.Length,
			PageShift: uint32(mr.PageShift)}
		_ = mr.Extents(func(gpa abi.GPA, n uint64) error {
			ms.Extents = append(ms.Extents, ExtentState{GPA: uint64(gpa), Len: n})
			return nil
		})
		st.MRs = append(st.MRs, ms)
	}
	for _, a := range objs.AHs {
		st.AHs = append(st.AHs, AHState{Handle: a.Num, PD: a.PD, DGID: a.DGID, SGID: a.SGID})
	}
	for _, c := range objs.CQs {
		es, err := c.ExportState()
		if err != nil {
			return nil, fmt.Errorf("rdma: export: %w", err)
		}
		st.CQs = append(st.CQs, CQState{Handle: c.Num, Depth: c.Ring.Depth, Pages: gpas(c.Ring.Pages),
			Record: uint64(c.Record), ArmRecord: c.ArmRecord, State: es})
	}
	for _, s := range objs.SRQs {
		st.SRQs = append(st.SRQs, SRQState{Handle: s.Num, PD: s.PD, MaxWR: s.Ring.Depth, MaxSGE: s.MaxSGE,
			WQEShift: log2(s.Ring.Stride), DoorbellQueue: uint32(s.DoorbellQueue), Pages: gpas(s.Ring.Pages),
			Record: uint64(s.Record), State: s.ExportState()})
	}
	for _, q := range objs.QPs {
		qs, err := exportQP(q)
		if err != nil {
			return nil, fmt.Errorf("rdma: export: %w", err)
		}
		st.QPs = append(st.QPs, qs)
	}
	st.Counters = CountersState{Commands: d.commands.Load(), Errors: d.errors.Load(), EventsLost: d.eventsLost.Load(),
		Engine: d.eng.Counters()}
	return st, nil
}

// exportQP describes q.
func exportQP(q *engine.QP) (QPState, error) {
	es, err := q.ExportState()
	if err != nil {
		return QPState{}, err
	}
	s := QPState{Num: q.Num, Type: abi.QPTypeRC, PD: q.PD, SendCQ: q.SendCQ.Num, RecvCQ: q.RecvCQ.Num,
		SigAll: q.SigAll, RQNotify: q.RQNotify, MaxSendWR: q.SQ.Depth, MaxSendSGE: q.MaxSendSGE,
		MaxRecvSGE: q.MaxRecvSGE, MaxInlineData: q.MaxInline, SQWQEShift: log2(q.SQ.Stride),
		DoorbellQueue: uint32(q.DoorbellQueue), SQNPages: uint32(len(q.SQ.Pages)), Record: uint64(q.Record), State: es}
	switch {
	case q.GSI:
		s.Type = abi.QPTypeGSI
	case q.UD:
		s.Type = abi.QPTypeUD
	}
	s.Pages = append(gpas(q.SQ.Pages), gpas(q.RQ.Pages)...)
	if q.SRQ != nil {
		s.SRQ = q.SRQ.Num
	} else {
		s.MaxRecvWR, s.RQWQEShift = q.RQ.Depth, log2(q.RQ.Stride)
	}
	return s, nil
}

func gpas(pages []abi.GPA) []uint64 {
	out := make([]uint64, len(pages))
	for i, p := range pages {
		out[i] = uint64(p)
	}
	return out
}

// pageGPAs is gpas' inverse, each entry checked to be aligned to 1<<shift
// (as pageList checks a guest's).
func pageGPAs(pages []uint64, shift uint) ([]abi.GPA, error) {
	out := make([]abi.GPA, len(pages))
	for i, p := range pages {
		if p&(1<<shift-1) != 0 {
			return nil, errStatus(abi.StatusInvalid)
		}
		out[i] = abi.GPA(p)
	}
	return out, nil
}

// importLimits bounds each slice of a DeviceState before anything is
// built: the device's own limits, which the create functions check again
// one object at a time.
func (d *Device) checkCounts(st *DeviceState) error {
	c := &d.conf
	switch {
	case len(st.GIDs) > abi.GIDTableLen:
		return fmt.Errorf("%d GIDs", len(st.GIDs))
	case uint64(len(st.PDs)) > uint64(c.MaxPD):
		return fmt.Errorf("%d PDs, the limit is %d", len(st.PDs), c.MaxPD)
	case uint64(len(st.MRs)) > uint64(c.MaxMR):
		return fmt.Errorf("%d MRs, the limit is %d", len(st.MRs), c.MaxMR)
	case uint64(len(st.AHs)) > uint64(c.MaxAH):
		return fmt.Errorf("%d AHs, the limit is %d", len(st.AHs), c.MaxAH)
	case uint64(len(st.CQs)) > uint64(c.MaxCQ):
		return fmt.Errorf("%d CQs, the limit is %d", len(st.CQs), c.MaxCQ)
	case uint64(len(st.SRQs)) > uint64(c.MaxSRQ):
		return fmt.Errorf("%d SRQs, the limit is %d", len(st.SRQs), c.MaxSRQ)
	case uint64(len(st.QPs)) > uint64(c.MaxQP):
		return fmt.Errorf("%d QPs, the limit is %d", len(st.QPs), c.MaxQP)
	}
	for _, m := range st.MRs {
		if uint64(len(m.Extents)) > uint64(d.cfg.Limits.MaxMRExtents) {
			return fmt.Errorf("MR %#x: %d extents", m.Key, len(m.Extents))
		}
	}
	return nil
}
