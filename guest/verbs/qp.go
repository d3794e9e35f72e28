package verbs

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// QPCap are a QP's queue capacities, like ibv_qp_cap. Zero SGE counts mean
// one. A QP with an SRQ has no receive queue: MaxRecvWR and MaxRecvSGE are
// ignored, and Cap reports them as zero.
type QPCap struct {
	MaxSendWR, MaxRecvWR, MaxSendSGE, MaxRecvSGE, MaxInlineData int
}

// QPInitAttr describes a QP to create, like ibv_qp_init_attr.
type QPInitAttr struct {
	// Type is abi.QPTypeRC or abi.QPTypeUD; zero means RC.
	Type           int
	SendCQ, RecvCQ *CQ
	// SRQ, when set, is the shared receive queue the QP takes its receive
	// WQEs from, instead of a receive queue of its own (PostRecv is then
	// ErrInvalid: post to the SRQ). It may belong to another PD of the
	// same context, as in verbs.
	SRQ *SRQ
	Cap QPCap
	// SigAll makes every send WR complete with a CQE, as if SIGNALED.
	SigAll bool
}

// SendWR is a send work request, like ibv_send_wr. Opcode is an abi.WROp*
// value, Flags abi.WRFlag* bits; a non-empty Inline carries the data in the
// WQE (SGL must then be empty; the INLINE flag is set for you). On a UD QP
// (SEND and SEND_WITH_IMM only, no FENCE) AH, RemoteQPN and RemoteQKey
// address the datagram, as ibv_send_wr's wr.ud; they must be zero on an RC
// QP, whose RDMA and atomic fields a UD QP ignores.
type SendWR struct {
	WRID       uint64
	Opcode     int
	Flags      int
	SGL        []abi.SGE
	Inline     []byte
	Imm        uint32
	RemoteAddr uint64
	RKey       uint32
	CompareAdd uint64
	Swap       uint64
	// AH is the destination of a UD send: an AH of the QP's PD.
	AH *AH
	// RemoteQPN is the destination QP number (24 bits) of a UD send.
	RemoteQPN uint32
	// RemoteQKey is the Q_Key a UD send carries; with abi.QKeyUseQP set
	// (bit 31) the device sends the QP's own Q_Key instead.
	RemoteQKey uint32
}

// RecvWR is a receive work request.
type RecvWR struct {
	WRID uint64
	SGL  []abi.SGE
}

// QP is an RC or UD queue pair: send and receive rings (or an SRQ) and a
// record in DMA memory. PostSend and PostRecv are each safe for concurrent
// use (a lock per queue); the rings are written only under those locks.
type QP struct {
	ctx    *Context // immutable
	pd     *PD      // immutable
	num    uint32   // immutable
	typ    int      // immutable: abi.QPTypeRC or abi.QPTypeUD
	sendCQ *CQ      // immutable
	recvCQ *CQ      // immutable
	srq    *SRQ     // immutable: nil unless created with one
	db     int      // immutable: doorbell queue
	cap    QPCap    // immutable: the capacities granted
	psn    uint32   // immutable: initial send PSN, random, 24 bits

	sqDepth, rqDepth uint32 // immutable, powers of two (rqDepth 0 with an SRQ)
	sqShift, rqShift uint   // immutable: log2 of the WQE strides
	mem              DMABuf // immutable: SQ pages, RQ pages, record
	sq, rq           []byte // immutable views of the rings (rq nil with an SRQ)
	rec              []byte // immutable view of the vrdma_qp_record

	sqMu sync.Mutex // protects sqPI and the SQ ring
	sqPI uint32

	rqMu sync.Mutex // protects rqPI and the RQ ring
	rqPI uint32
}

func ceilPow2(n uint32) uint32 {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len32(n-1)
}

func log2(n uint32) uint { return uint(bits.TrailingZeros32(n)) }

// CreateQP creates an RC or UD QP in pd (CREATE_QP). Queue depths are
// rounded up to powers of two; the QP's doorbell queue is picked
// round-robin. With a.SRQ the QP has no receive queue (flags SRQ, srqn).
func (pd *PD) CreateQP(a QPInitAttr) (*QP, error) {
	c := pd.ctx
	if a.SendCQ == nil || a.RecvCQ == nil || a.SendCQ.ctx != c || a.RecvCQ.ctx != c {
		return nil, argErr("cq", "send and receive CQs of this context are required")
	}
	typ := a.Type
	if typ == 0 {
		typ = abi.QPTypeRC
	}
	if typ != abi.QPTypeRC && typ != abi.QPTypeUD {
		return nil, argErr("qp type", "%d (RC %d and UD %d are supported)", a.Type, abi.QPTypeRC, abi.QPTypeUD)
	}
	if a.SRQ != nil && a.SRQ.ctx != c {
		return nil, argErr("srq", "not of this context")
	}
	cp := a.Cap
	if cp.MaxSendSGE == 0 {
		cp.MaxSendSGE = 1
	}
	if cp.MaxRecvSGE == 0 {
		cp.MaxRecvSGE = 1
	}
	if a.SRQ != nil {
		cp.MaxRecvWR, cp.MaxRecvSGE = 0, 0
	}
	at := &c.attr
	switch {
	case cp.MaxSendWR <= 0 || uint64(cp.MaxSendWR) > uint64(at.MaxQPWR):
		return nil, argErr("max_send_wr", "%d not in [1, %d]", cp.MaxSendWR, at.MaxQPWR)
	case a.SRQ == nil && (cp.MaxRecvWR <= 0 || uint64(cp.MaxRecvWR) > uint64(at.MaxQPWR)):
		return nil, argErr("max_recv_wr", "%d not in [1, %d]", cp.MaxRecvWR, at.MaxQPWR)
	case cp.MaxSendSGE < 0 || uint64(cp.MaxSendSGE) > uint64(at.MaxSGE):
		return nil, argErr("max_send_sge", "%d not in [1, %d]", cp.MaxSendSGE, at.MaxSGE)
	case a.SRQ == nil && (cp.MaxRecvSGE < 0 || uint64(cp.MaxRecvSGE) > uint64(at.MaxSGE)):
		return nil, argErr("max_recv_sge", "%d not in [1, %d]", cp.MaxRecvSGE, at.MaxSGE)
	case cp.MaxInlineData < 0 || uint64(cp.MaxInlineData) > uint64(at.MaxInlineData):
		return nil, argErr("max_inline_data", "%d not in [0, %d]", cp.MaxInlineData, at.MaxInlineData)
	}
	sqDepth := ceilPow2(uint32(cp.MaxSendWR))
	var rqDepth, rqStride uint32
	if a.SRQ == nil {
		rqDepth = ceilPow2(uint32(cp.MaxRecvWR))
		rqStride = max(ceilPow2(uint32(abi.RecvWQEHdrSize+abi.SGESize*cp.MaxRecvSGE)), 1<<abi.MinRQWQEShift)
	}
	if sqDepth > at.MaxQPWR || rqDepth > at.MaxQPWR {
		return nil, argErr("queue depth", "%d/%d round up above the device's %d", cp.MaxSendWR, cp.MaxRecvWR, at.MaxQPWR)
	}
	sqStride := ceilPow2(uint32(max(abi.SendWQEHdrSize+abi.SGESize*cp.MaxSendSGE, abi.SendWQEHdrSize+cp.MaxInlineData)))
	if sqStride > abi.PageSize || rqStride > abi.PageSize {
		return nil, argErr("qp cap", "WQE strides %d/%d exceed a page", sqStride, rqStride)
	}
	cp.MaxSendWR, cp.MaxRecvWR = int(sqDepth), int(rqDepth)
	sqBytes, rqBytes := uint64(sqDepth)*uint64(sqStride), uint64(rqDepth)*uint64(rqStride)
	sqAlloc := (sqBytes + abi.PageSize - 1) &^ (abi.PageSize - 1)
	rqAlloc := (rqBytes + abi.PageSize - 1) &^ (abi.PageSize - 1)
	mem, err := c.allocDMA(sqAlloc+rqAlloc+abi.QPNotifyRecordSize, abi.PageSize)
	if err != nil {
		return nil, fmt.Errorf("create qp: %w", err)
	}
	fail := func(err error) (*QP, error) {
		c.t.FreeDMA(mem)
		return nil, err
	}
	sqPages, err := mem.PageAddrs(0, sqBytes)
	if err != nil {
		return fail(err)
	}
	var rqPages []uint64
	if rqBytes > 0 {
		if rqPages, err = mem.PageAddrs(sqAlloc, rqBytes); err != nil {
			return fail(err)
		}
	}
	recGPA, err := mem.GPA(sqAlloc + rqAlloc)
	if err != nil {
		return fail(err)
	}
	inline, ind, plAddr, err := c.pageList(append(sqPages, rqPages...))
	if err != nil {
		return fail(err)
	}
	if ind != nil {
		defer c.t.FreeDMA(*ind)
	}
	db := int(c.nextDB.Add(1)-1) % int(c.conf.NumDoorbellQueues)
	req := abi.CreateQP{
		PDN: pd.num, SendCQN: a.SendCQ.num, RecvCQN: a.RecvCQ.num, QPType: uint32(typ),
		MaxSendWR: sqDepth, MaxRecvWR: rqDepth,
		MaxSendSGE: uint32(cp.MaxSendSGE), MaxRecvSGE: uint32(cp.MaxRecvSGE), MaxInlineData: uint32(cp.MaxInlineData),
		SQWQEShift: uint32(log2(sqStride)), DoorbellQueue: uint32(db), Record: uint64(recGPA),
		SQNPages: uint32(len(sqPages)), RQNPages: uint32(len(rqPages)), PageList: plAddr,
		Flags: abi.QPFlagRQNotify,
	}
	var rqShift uint
	if a.SRQ != nil {
		// "rq_wqe_shift … 0 with SRQ", and so are the receive queue's
		// depth, SGEs and pages.
		req.Flags |= abi.QPFlagSRQ
		req.SRQN = a.SRQ.num
	} else {
		rqShift = log2(rqStride)
		req.RQWQEShift = uint32(rqShift)
	}
	if a.SigAll {
		req.SQSigAll = 1
	}
	body := abi.Marshal(&req)
	if a.SRQ == nil {
		// The 80-byte layout before SRQs, which every revision of the
		// device accepts, so the library also drives an older daemon.
		body = body[:abi.CreateQPV1Size]
	}
	resp, err := c.command(abi.CmdCreateQP, append(body, inline...), 8)
	if err != nil {
		return fail(err)
	}
	recOff := sqAlloc + rqAlloc
	qp := &QP{
		ctx: c, pd: pd, num: binary.LittleEndian.Uint32(resp), typ: typ, sendCQ: a.SendCQ, recvCQ: a.RecvCQ, srq: a.SRQ,
		db: db, cap: cp, sqDepth: sqDepth, rqDepth: rqDepth, sqShift: log2(sqStride), rqShift: rqShift, mem: mem,
		sq:  mem.Buf[:sqBytes:sqBytes],
		rec: mem.Buf[recOff : recOff+abi.QPNotifyRecordSize : recOff+abi.QPNotifyRecordSize],
		psn: randomPSN(),
	}
	if rqBytes > 0 {
		qp.rq = mem.Buf[sqAlloc : sqAlloc+rqBytes : sqAlloc+rqBytes]
	}
	c.objMu.Lock()
	c.qps[qp.num] = qp
	c.objMu.Unlock()
	return qp, nil
}

// Num returns the QP number.
func (qp *QP) Num() uint32 { return qp.num }

// Type returns abi.QPTypeRC or abi.QPTypeUD.
func (qp *QP) Type() int { return qp.typ }

// SRQ returns the shared receive queue the QP was created with, or nil.
func (qp *QP) SRQ() *SRQ { return qp.srq }

// PSN returns the QP's initial send PSN: 24 random bits drawn from
// crypto/rand at CreateQP, as perftest draws lrand48() & 0xffffff. It is
// what the peer passes as remotePSN to its ConnectRC (the responder
// expects it) and what this QP's ConnectRC sets as sq_psn. A random start
// makes an off-path spoofer guess the 24-bit PSN window (docs/wire.md,
// "Security") instead of knowing that every connection starts at 0.
func (qp *QP) PSN() uint32 { return qp.psn }

// randomPSN draws a 24-bit PSN from crypto/rand (which does not fail: Go's
// crypto/rand.Read panics rather than return an error since Go 1.24).
func randomPSN() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint32(b[:]) & 0xffffff
}

// Cap returns the capacities granted (depths rounded up).
func (qp *QP) Cap() QPCap { return qp.cap }

// DoorbellQueue returns the doorbell queue the QP was created on.
func (qp *QP) DoorbellQueue() int { return qp.db }

// Modify applies the attributes selected by mask (abi.QPAttr* bits) (MODIFY_QP).
// attr.QPN and attr.AttrMask are filled in for you.
func (qp *QP) Modify(attr abi.QPAttr, mask int) error {
	if mask <= 0 || uint64(mask) > 0xffffffff {
		return argErr("attr mask", "%#x", mask)
	}
	attr.QPN = qp.num
	attr.AttrMask = uint32(mask)
	_, err := qp.ctx.command(abi.CmdModifyQP, abi.Marshal(&attr), 0)
	return err
}

// Query returns the QP's attributes (QUERY_QP).
func (qp *QP) Query() (abi.QPAttr, error) {
	var a abi.QPAttr
	resp, err := qp.ctx.command(abi.CmdQueryQP, abi.Marshal(&abi.Handle{Handle: qp.num}), 96)
	if err != nil {
		return a, err
	}
	if err := abi.Unmarshal(resp, &a); err != nil {
		return abi.QPAttr{}, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return a, nil
}

// Default connection parameters of ConnectRC.
const (
	DefaultMinRNRTimer = 12
	DefaultTimeout     = 14
	DefaultRetryCnt    = 7
	DefaultRNRRetry    = 7
)

// ConnectRC moves the QP RESET → INIT → RTR → RTS towards the peer QP
// remoteQPN on the device with GID remoteGID, allowing the peer the remote
// access flags in access — what perftest does after exchanging (GID, QPN,
// PSN). remotePSN is the peer's initial send PSN (its PSN(), or what the
// peer sent in the exchange): RTR sets rq_psn to it; RTS sets sq_psn to
// qp.PSN(). It connects from GID index 0 with a 4096-byte path MTU;
// ConnectRCOpts chooses.
func (qp *QP) ConnectRC(remoteGID [16]byte, remoteQPN, remotePSN uint32, access int) error {
	return qp.ConnectRCOpts(remoteGID, remoteQPN, remotePSN, access, ConnectOpts{})
}

// ConnectOpts are ConnectRCOpts' choices; zero fields take ConnectRC's.
type ConnectOpts struct {
	// SGIDIndex is the local GID the QP sends from (perftest's -x): a
	// network GID (an entry ≥ 1 on a daemon with RoCE) to reach a peer
	// on another host.
	SGIDIndex uint32
	// PathMTU is an abi.MTU256 … abi.MTU4096 code; 0 means MTU4096. The
	// device may lower it to what its network link carries.
	PathMTU uint32
	// Paths asks a QP to another host to spray over that many paths
	// (MODIFY_QP's PATHS, 1 … 64); 0 leaves it to the device.
	Paths uint32
	// Timeout is the local ACK timeout code (4.096 µs × 2^Timeout, 1 …
	// 31; ibv_qp_attr.timeout); 0 means DefaultTimeout. Its retries
	// (DefaultRetryCnt) span the longest blackout the QP survives: a
	// peer's live migration, say (docs/operations.md).
	Timeout uint8
}

// ConnectRCOpts is ConnectRC with opts.
func (qp *QP) ConnectRCOpts(remoteGID [16]byte, remoteQPN, remotePSN uint32, access int, opts ConnectOpts) error {
	if qp.typ != abi.QPTypeRC {
		return argErr("qp type", "ConnectRC on a QP of type %d (a UD QP takes ReadyUD)", qp.typ)
	}
	mtu := opts.PathMTU
	if mtu == 0 {
		mtu = abi.MTU4096
	}
	timeout := uint32(opts.Timeout)
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	rd := qp.ctx.attr.MaxQPRdAtom
	rtrMask := abi.QPAttrState | abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN | abi.QPAttrRQPSN | abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer
	if opts.Paths != 0 {
		rtrMask |= abi.QPAttrPaths
	}
	steps := []struct {
		name string
		attr abi.QPAttr
		mask int
	}{
		{"init", abi.QPAttr{QPState: abi.QPSInit, PKeyIndex: 0, PortNum: 1, QPAccessFlags: uint32(access)},
			abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrAccessFlags},
		{"rtr", abi.QPAttr{QPState: abi.QPSRTR, PathMTU: mtu, DestQPNum: remoteQPN, RQPSN: remotePSN & 0xffffff, MaxDestRdAtomic: rd,
			MinRNRTimer: DefaultMinRNRTimer, DGID: remoteGID, SGIDIndex: opts.SGIDIndex, HopLimit: 1, Paths: opts.Paths},
			rtrMask},
		{"rts", abi.QPAttr{QPState: abi.QPSRTS, SQPSN: qp.psn, Timeout: timeout, RetryCnt: DefaultRetryCnt,
			RNRRetry: DefaultRNRRetry, MaxRdAtomic: rd},
			abi.QPAttrState | abi.QPAttrSQPSN | abi.QPAttrTimeout | abi.QPAttrRetryCnt | abi.QPAttrRNRRetry | abi.QPAttrMaxQPRdAtomic},
	}
	for _, s := range steps {
		if err := qp.Modify(s.attr, s.mask); err != nil {
			return fmt.Errorf("qp %d to %s: %w", qp.num, s.name, err)
		}
	}
	return nil
}

// Destroy destroys the QP (DESTROY_QP) and frees its rings.
func (qp *QP) Destroy() error {
	if err := qp.ctx.handleCommand(abi.CmdDestroyQP, qp.num); err != nil {
		return err
	}
	qp.ctx.objMu.Lock()
	delete(qp.ctx.qps, qp.num)
	qp.ctx.objMu.Unlock()
	qp.ctx.t.FreeDMA(qp.mem)
	return nil
}

// checkSend validates one send WR against the QP's type and capacities.
func (qp *QP) checkSend(wr *SendWR) error {
	if wr.Opcode < abi.WROpSend || wr.Opcode > abi.WROpAtomicFetchAdd {
		return argErr("opcode", "%d", wr.Opcode)
	}
	if wr.Flags&^(abi.WRFlagSignaled|abi.WRFlagInline|abi.WRFlagFence|abi.WRFlagSolicited) != 0 {
		return argErr("send flags", "%#x", wr.Flags)
	}
	if qp.typ == abi.QPTypeUD {
		// docs/spec.md, "Semantics (UD)": "SEND and SEND_WITH_IMM only
		// (other opcodes and FENCE are LOC_QP_OP_ERR)", to an "AH of the
		// device in the QP's PD".
		switch {
		case wr.Opcode != abi.WROpSend && wr.Opcode != abi.WROpSendWithImm:
			return argErr("opcode", "%d on a UD QP", wr.Opcode)
		case wr.Flags&abi.WRFlagFence != 0:
			return argErr("send flags", "FENCE on a UD QP")
		case wr.AH == nil:
			return argErr("ah", "a UD send needs one")
		case wr.AH.pd != qp.pd:
			return argErr("ah", "not of the QP's PD")
		case wr.RemoteQPN > 0xffffff:
			return argErr("remote qpn", "%#x beyond 24 bits", wr.RemoteQPN)
		}
	} else if wr.AH != nil || wr.RemoteQPN != 0 || wr.RemoteQKey != 0 {
		return argErr("ud address", "on an RC QP")
	}
	if len(wr.Inline) > 0 || wr.Flags&abi.WRFlagInline != 0 {
		if len(wr.SGL) != 0 {
			return argErr("inline", "with a scatter/gather list")
		}
		if len(wr.Inline) > qp.cap.MaxInlineData {
			return argErr("inline", "%d bytes above the QP's %d", len(wr.Inline), qp.cap.MaxInlineData)
		}
		if wr.Opcode > abi.WROpRDMAWriteWithImm {
			return argErr("inline", "with opcode %d", wr.Opcode)
		}
		return nil
	}
	if len(wr.SGL) > qp.cap.MaxSendSGE {
		return argErr("sge count", "%d above the QP's %d", len(wr.SGL), qp.cap.MaxSendSGE)
	}
	return nil
}

// free returns the free slots of a queue. Precondition: the queue's lock.
func (qp *QP) free(pi uint32, ciOff int, depth uint32) (uint32, error) {
	ci := abi.LoadUint32(qp.rec, ciOff)
	used := pi - ci
	if used > depth {
		return 0, fmt.Errorf("%w: qp %d: consumer index %d behind producer %d by more than %d", ErrProtocol, qp.num, ci, pi, depth)
	}
	return depth - used, nil
}

// ring publishes a producer index and rings the doorbell: the seq-cst store
// (release) orders the WQEs before it, the fence orders it before reading
// the doorbell queue's NO_NOTIFY flag, and the queue is notified only when
// the engine is not polling.
func (qp *QP) ring(off int, pi uint32) error {
	abi.StoreUint32(qp.rec, off, pi)
	abi.Fence()
	return qp.ctx.doorbell(qp.db)
}

// PostSend posts send WRs: it checks them all and the free slots (nothing
// is posted if one is bad, or ErrQueueFull if they do not all fit), writes
// the WQEs, then the send producer index, and notifies the doorbell queue
// unless the engine is polling.
func (qp *QP) PostSend(wrs ...SendWR) error {
	if len(wrs) == 0 {
		return nil
	}
	for i := range wrs {
		if err := qp.checkSend(&wrs[i]); err != nil {
			return fmt.Errorf("send wr %d: %w", i, err)
		}
	}
	qp.sqMu.Lock()
	defer qp.sqMu.Unlock()
	free, err := qp.free(qp.sqPI, abi.QPRecordSQCI, qp.sqDepth)
	if err != nil {
		return err
	}
	if uint64(len(wrs)) > uint64(free) {
		return ErrQueueFull
	}
	pi := qp.sqPI
	stride := uint32(1) << qp.sqShift
	for i := range wrs {
		wr := &wrs[i]
		off := (pi & (qp.sqDepth - 1)) * stride
		w := qp.sq[off : off+stride : off+stride]
		clear(w[:abi.SendWQEHdrSize])
		flags := wr.Flags
		binary.LittleEndian.PutUint64(w[0:], wr.WRID)
		w[8] = uint8(wr.Opcode)
		binary.LittleEndian.PutUint32(w[12:], wr.Imm)
		if wr.AH != nil {
			// Checked: a UD QP, whose RDMA and atomic fields stay zero.
			binary.LittleEndian.PutUint32(w[48:], wr.AH.num)
			binary.LittleEndian.PutUint32(w[52:], wr.RemoteQPN)
			binary.LittleEndian.PutUint32(w[56:], wr.RemoteQKey)
		} else {
			binary.LittleEndian.PutUint64(w[16:], wr.RemoteAddr)
			binary.LittleEndian.PutUint32(w[24:], wr.RKey)
			binary.LittleEndian.PutUint64(w[32:], wr.CompareAdd)
			binary.LittleEndian.PutUint64(w[40:], wr.Swap)
		}
		if len(wr.Inline) > 0 || flags&abi.WRFlagInline != 0 {
			flags |= abi.WRFlagInline
			binary.LittleEndian.PutUint32(w[28:], uint32(len(wr.Inline)))
			copy(w[abi.SendWQEHdrSize:], wr.Inline)
		} else {
			binary.LittleEndian.PutUint16(w[10:], uint16(len(wr.SGL)))
			putSGL(w[abi.SendWQEHdrSize:], wr.SGL)
		}
		w[9] = uint8(flags)
		pi++
	}
	qp.sqPI = pi
	return qp.ring(abi.QPRecordSQPI, pi)
}

func putSGL(b []byte, sgl []abi.SGE) {
	for i, s := range sgl {
		e := b[i*abi.SGESize : i*abi.SGESize+abi.SGESize]
		binary.LittleEndian.PutUint64(e[0:], s.Addr)
		binary.LittleEndian.PutUint32(e[8:], s.Length)
		binary.LittleEndian.PutUint32(e[12:], s.LKey)
	}
}

// PostRecv posts receive WRs, all or none (ErrQueueFull if they do not
// fit), then the receive producer index and, unless the engine polls, a
// doorbell notification. A QP with an SRQ has no receive queue: post to
// the SRQ (ErrInvalid).
func (qp *QP) PostRecv(wrs ...RecvWR) error {
	if qp.srq != nil {
		return argErr("post recv", "qp %d takes its receives from srq %d", qp.num, qp.srq.num)
	}
	if len(wrs) == 0 {
		return nil
	}
	for i := range wrs {
		if len(wrs[i].SGL) > qp.cap.MaxRecvSGE {
			return fmt.Errorf("recv wr %d: %w", i, argErr("sge count", "%d above the QP's %d", len(wrs[i].SGL), qp.cap.MaxRecvSGE))
		}
	}
	qp.rqMu.Lock()
	defer qp.rqMu.Unlock()
	free, err := qp.free(qp.rqPI, abi.QPRecordRQCI, qp.rqDepth)
	if err != nil {
		return err
	}
	if uint64(len(wrs)) > uint64(free) {
		return ErrQueueFull
	}
	pi := qp.rqPI
	stride := uint32(1) << qp.rqShift
	for i := range wrs {
		wr := &wrs[i]
		off := (pi & (qp.rqDepth - 1)) * stride
		putRecvWQE(qp.rq[off:off+stride:off+stride], wr)
		pi++
	}
	qp.rqPI = pi
	// RQ_NOTIFY (docs/spec.md, struct vrdma_qp_notify_record): the
	// device reads rq_pi when a message arrives, and asks for the doorbell
	// only while the QP is in ERR or a message waits for a receive.
	abi.StoreUint32(qp.rec, abi.QPRecordRQPI, pi)
	if abi.LoadUint32(qp.rec, abi.QPRecordRQNotify) == 0 {
		return nil
	}
	return qp.ring(abi.QPRecordRQPI, pi)
}
