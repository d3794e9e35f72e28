package hostnic

import (
	"fmt"
	"sync"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/backend/rdma/hostnic/ibv"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The device's terms (abi) to rdma-core's and back. Where the numbers
// agree (access flags, QP states and attribute masks, MTUs, completion
// statuses, opcodes and flags are ibverbs' own in docs/spec.md) they are
// still mapped by name, so a divergence is a compile-time or test failure
// rather than a silent one (TestMappings).

var wrOpcodes = [...]ibv.WROpcode{
	abi.WROpSend: ibv.WRSend, abi.WROpSendWithImm: ibv.WRSendWithImm,
	abi.WROpRDMAWrite: ibv.WRRDMAWrite, abi.WROpRDMAWriteWithImm: ibv.WRRDMAWriteWithImm,
	abi.WROpRDMARead: ibv.WRRDMARead, abi.WROpAtomicCmpSwp: ibv.WRAtomicCmpAndSwp,
	abi.WROpAtomicFetchAdd: ibv.WRAtomicFetchAndAdd,
}

func sendFlags(f uint8) ibv.SendFlags {
	var o ibv.SendFlags
	if f&abi.WRFlagSignaled != 0 {
		o |= ibv.SendSignaled
	}
	if f&abi.WRFlagInline != 0 {
		o |= ibv.SendInline
	}
	if f&abi.WRFlagFence != 0 {
		o |= ibv.SendFence
	}
	if f&abi.WRFlagSolicited != 0 {
		o |= ibv.SendSolicited
	}
	return o
}

func accessFlags(a uint32) ibv.AccessFlags {
	var o ibv.AccessFlags
	if a&abi.AccessLocalWrite != 0 {
		o |= ibv.AccessLocalWrite
	}
	if a&abi.AccessRemoteWrite != 0 {
		o |= ibv.AccessRemoteWrite
	}
	if a&abi.AccessRemoteRead != 0 {
		o |= ibv.AccessRemoteRead
	}
	if a&abi.AccessRemoteAtomic != 0 {
		o |= ibv.AccessRemoteAtomic
	}
	return o
}

var qpStates = [...]ibv.QPState{
	abi.QPSReset: ibv.QPSReset, abi.QPSInit: ibv.QPSInit, abi.QPSRTR: ibv.QPSRTR,
	abi.QPSRTS: ibv.QPSRTS, abi.QPSSQD: ibv.QPSSQD, abi.QPSSQE: ibv.QPSSQE, abi.QPSErr: ibv.QPSErr,
}

var attrMasks = [...]struct {
	from uint32
	to   ibv.QPAttrMask
}{
	{abi.QPAttrState, ibv.AttrState}, {abi.QPAttrAccessFlags, ibv.AttrAccessFlags},
	{abi.QPAttrPKeyIndex, ibv.AttrPKeyIndex}, {abi.QPAttrPort, ibv.AttrPort}, {abi.QPAttrAV, ibv.AttrAV},
	{abi.QPAttrPathMTU, ibv.AttrPathMTU}, {abi.QPAttrTimeout, ibv.AttrTimeout},
	{abi.QPAttrRetryCnt, ibv.AttrRetryCnt}, {abi.QPAttrRNRRetry, ibv.AttrRNRRetry},
	{abi.QPAttrRQPSN, ibv.AttrRQPSN}, {abi.QPAttrMaxQPRdAtomic, ibv.AttrMaxQPRdAtomic},
	{abi.QPAttrMinRNRTimer, ibv.AttrMinRNRTimer}, {abi.QPAttrSQPSN, ibv.AttrSQPSN},
	{abi.QPAttrMaxDestRdAtomic, ibv.AttrMaxDestRdAtomic}, {abi.QPAttrDestQPN, ibv.AttrDestQPN},
}

var mtus = [...]ibv.MTU{abi.MTU256: ibv.MTU256, abi.MTU512: ibv.MTU512, abi.MTU1024: ibv.MTU1024,
	abi.MTU2048: ibv.MTU2048, abi.MTU4096: ibv.MTU4096}

// wcStatus maps rdma-core's completion status (the same list as the
// device's, docs/spec.md) to the device's; an unknown one is GENERAL_ERR.
func wcStatus(s ibv.WCStatus) abi.WCStatus {
	if uint32(s) <= uint32(abi.WCGeneralErr) {
		return abi.WCStatus(s)
	}
	return abi.WCGeneralErr
}

func wcOpcode(o ibv.WCOpcode) uint8 {
	switch o {
	case ibv.WCOpSend:
		return abi.WCOpSend
	case ibv.WCOpRDMAWrite:
		return abi.WCOpRDMAWrite
	case ibv.WCOpRDMARead:
		return abi.WCOpRDMARead
	case ibv.WCOpCompSwap:
		return abi.WCOpCompSwap
	case ibv.WCOpFetchAdd:
		return abi.WCOpFetchAdd
	case ibv.WCOpRecvRDMAWithImm:
		return abi.WCOpRecvRDMAWithImm
	default:
		return abi.WCOpRecv
	}
}

type nicPD struct {
	n  *NIC
	pd *ibv.PD
}

func (p *nicPD) Close() error { return p.pd.Close() }

// RegMR registers [addr, addr+length) at iova (ibv_reg_mr_iova2).
func (p *nicPD) RegMR(addr uintptr, length, iova uint64, access uint32) (engine.NICMR, error) {
	mr, err := p.pd.RegMR(addr, length, iova, accessFlags(access))
	if err != nil {
		return nil, err
	}
	return nicMR{mr}, nil
}

type nicMR struct{ mr *ibv.MR }

func (m nicMR) Keys() (uint32, uint32) { return m.mr.LKey(), m.mr.RKey() }
func (m nicMR) Close() error           { return m.mr.Close() }

type nicCQ struct {
	n  *NIC
	cq *ibv.CQ
	id uint64
	wc []ibv.WC // Poll's scratch (the engine polls a CQ from one goroutine at a time)
}

// Poll converts up to len(out) host completions.
func (c *nicCQ) Poll(out []engine.NICWC) (int, error) {
	k, err := c.cq.Poll(c.wc[:min(len(out), len(c.wc))])
	if err != nil {
		return 0, err
	}
	for i := range k {
		w := &c.wc[i]
		o := &out[i]
		*o = engine.NICWC{WRID: w.WRID, Status: wcStatus(w.Status), Opcode: wcOpcode(w.Opcode),
			QPNum: w.QPNum, ByteLen: w.ByteLen, SrcQP: w.SrcQP, VendorErr: w.VendorErr}
		if w.WCFlags&ibv.WCWithImm != 0 {
			o.WCFlags, o.Imm = abi.WCFlagWithImm, w.ImmData
		}
	}
	c.n.polled.Add(uint64(k))
	return k, nil
}

func (c *nicCQ) Depth() uint32 { return uint32(max(c.cq.CQE(), 0)) }

func (c *nicCQ) Close() error {
	c.n.mu.Lock()
	delete(c.n.notify, c.id)
	c.n.mu.Unlock()
	return c.cq.Destroy()
}

// CreateQP creates a host RC QP on the PD.
func (p *nicPD) CreateQP(init engine.NICQPInit) (engine.NICQP, error) {
	s, ok1 := init.SendCQ.(*nicCQ)
	r, ok2 := init.RecvCQ.(*nicCQ)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("CQs of another NIC")
	}
	qp, err := p.pd.CreateQP(ibv.QPInit{Type: ibv.QPTRC, SendCQ: s.cq, RecvCQ: r.cq, Caps: ibv.QPCaps{
		MaxSendWR: init.MaxSendWR, MaxRecvWR: init.MaxRecvWR, MaxSendSGE: init.MaxSendSGE,
		MaxRecvSGE: init.MaxRecvSGE, MaxInlineData: init.MaxInline,
	}})
	if err != nil {
		return nil, err
	}
	// Scratch for one chain: the engine's batch (64 WQEs) of up to
	// MaxSendSGE SGEs each, plus an inline SGE per WQE.
	nsge := 64 * int(max(init.MaxSendSGE, init.MaxRecvSGE)+1)
	return &nicQP{n: p.n, qp: qp, swr: make([]ibv.SendWR, 64), rwr: make([]ibv.RecvWR, 64), sge: make([]ibv.SGE, nsge)}, nil
}

type nicQP struct {
	n   *NIC
	qp  *ibv.QP
	mu  sync.Mutex // the scratch (the engine posts from one pass at a time; this makes it safe anyway)
	swr []ibv.SendWR
	rwr []ibv.RecvWR
	sge []ibv.SGE
}

func (q *nicQP) Num() uint32  { return q.qp.Num() }
func (q *nicQP) Close() error { return q.qp.Destroy() }

// Modify applies a validated MODIFY_QP: the device's attributes, its port
// being the NIC's port and its address vector a RoCE v2 GRH.
func (q *nicQP) Modify(a *abi.QPAttr) error {
	var mask ibv.QPAttrMask
	for _, m := range attrMasks {
		if a.AttrMask&m.from != 0 {
			mask |= m.to
		}
	}
	if a.QPState >= uint32(len(qpStates)) || (a.AttrMask&abi.QPAttrPathMTU != 0 && (a.PathMTU < abi.MTU256 || a.PathMTU > abi.MTU4096)) {
		return fmt.Errorf("attributes out of range")
	}
	port := uint8(q.n.spec.Port)
	x := ibv.QPAttr{
		QPState: qpStates[a.QPState], QPAccessFlags: accessFlags(a.QPAccessFlags), PKeyIndex: uint16(a.PKeyIndex),
		PortNum: port, DestQPNum: a.DestQPNum, RQPSN: a.RQPSN, SQPSN: a.SQPSN,
		MaxRdAtomic: uint8(a.MaxRdAtomic), MaxDestRdAtomic: uint8(a.MaxDestRdAtomic), MinRNRTimer: uint8(a.MinRNRTimer),
		Timeout: uint8(a.Timeout), RetryCnt: uint8(a.RetryCnt), RNRRetry: uint8(a.RNRRetry),
	}
	if a.AttrMask&abi.QPAttrPathMTU != 0 {
		x.PathMTU = min(mtus[a.PathMTU], q.n.port.ActiveMTU)
	}
	if a.AttrMask&abi.QPAttrAV != 0 {
		hop := uint8(a.HopLimit)
		if hop == 0 {
			hop = 64
		}
		x.AH = ibv.AHAttr{DGID: a.DGID, SGIDIndex: uint8(a.SGIDIndex), HopLimit: hop, IsGlobal: true, PortNum: port}
	}
	return q.qp.Modify(&x, mask)
}

// PostSend posts wrs as one chain.
func (q *nicQP) PostSend(wrs []engine.NICSendWR, sges []abi.SGE) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(wrs) > len(q.swr) {
		wrs = wrs[:len(q.swr)]
	}
	nsge := 0
	for i := range wrs {
		w := &wrs[i]
		o := &q.swr[i]
		if int(w.Opcode) >= len(wrOpcodes) {
			return 0, fmt.Errorf("send opcode %d", w.Opcode)
		}
		*o = ibv.SendWR{WRID: w.WRID, RemoteAddr: w.RemoteAddr, CompareAdd: w.CompareAdd, Swap: w.Swap,
			RKey: w.RKey, Imm: w.Imm, FirstSGE: uint32(nsge), Opcode: wrOpcodes[w.Opcode], SendFlags: sendFlags(w.Flags)}
		if w.Flags&abi.WRFlagInline != 0 {
			if nsge == len(q.sge) {
				return 0, fmt.Errorf("SGE scratch full")
			}
			q.sge[nsge] = ibv.SGE{Addr: uint64(w.Inline), Length: w.InlineLen}
			o.NumSGE = 1
			nsge++
			continue
		}
		if nsge+int(w.NumSGE) > len(q.sge) {
			return 0, fmt.Errorf("SGE scratch full")
		}
		for _, s := range sges[w.FirstSGE : w.FirstSGE+uint32(w.NumSGE)] {
			q.sge[nsge] = ibv.SGE{Addr: s.Addr, Length: s.Length, LKey: s.LKey}
			nsge++
		}
		o.NumSGE = w.NumSGE
	}
	t := time.Now()
	n, err := q.qp.PostSend(q.swr[:len(wrs)], q.sge[:nsge])
	q.n.postNs.Add(uint64(time.Since(t)))
	q.n.posted.Add(uint64(n))
	return n, err
}

// PostRecv posts wrs as one chain.
func (q *nicQP) PostRecv(wrs []engine.NICRecvWR, sges []abi.SGE) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(wrs) > len(q.rwr) {
		wrs = wrs[:len(q.rwr)]
	}
	nsge := 0
	for i := range wrs {
		w := &wrs[i]
		if nsge+int(w.NumSGE) > len(q.sge) {
			return 0, fmt.Errorf("SGE scratch full")
		}
		q.rwr[i] = ibv.RecvWR{WRID: w.WRID, FirstSGE: uint32(nsge), NumSGE: w.NumSGE}
		for _, s := range sges[w.FirstSGE : w.FirstSGE+w.NumSGE] {
			q.sge[nsge] = ibv.SGE{Addr: s.Addr, Length: s.Length, LKey: s.LKey}
			nsge++
		}
	}
	t := time.Now()
	n, err := q.qp.PostRecv(q.rwr[:len(wrs)], q.sge[:nsge])
	q.n.postNs.Add(uint64(time.Since(t)))
	q.n.posted.Add(uint64(n))
	return n, err
}
