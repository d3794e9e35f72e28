package verbs

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// WC is a work completion, like ibv_wc.
type WC struct {
	WRID    uint64
	Status  abi.WCStatus // WCSuccess, WCLocLenErr, …
	Opcode  int          // WCOpSend, …, WCOpRecv
	ByteLen uint32
	Imm     uint32
	Flags   int // WCFlagWithImm
	QPNum   uint32
	SrcQP   uint32
	// VendorErr is the device's detail code for a failed completion.
	VendorErr uint32
}

// CQ is a completion queue: a ring of CQEs and a record in DMA memory the
// device writes and the driver reads. Poll is safe for concurrent use
// (serialised by a lock, as libibverbs providers do).
type CQ struct {
	ctx   *Context // immutable
	num   uint32   // immutable
	depth uint32   // immutable: entries, a power of two
	mem   DMABuf   // immutable: ring pages, then the record
	ring  []byte   // immutable: mem.Buf[:depth*CQESize]
	rec   []byte   // immutable: the vrdma_cq_record, shared with the device

	mu sync.Mutex // protects ci
	ci uint32     // consumer index (the driver is its only writer)
}

// CreateCQ creates a completion queue of at least cqe entries (rounded up
// to a power of two) with its ring and record in DMA memory (CREATE_CQ).
func (c *Context) CreateCQ(cqe int) (*CQ, error) {
	if cqe <= 0 || uint64(cqe) > uint64(c.attr.MaxCQE) {
		return nil, argErr("cqe", "%d not in [1, %d]", cqe, c.attr.MaxCQE)
	}
	depth := uint32(1) << bits.Len32(uint32(cqe-1))
	if uint64(depth) > uint64(c.attr.MaxCQE) {
		return nil, argErr("cqe", "%d rounds up to %d, above the device's %d", cqe, depth, c.attr.MaxCQE)
	}
	ringBytes := uint64(depth) * abi.CQESize
	npages := (ringBytes + abi.PageSize - 1) / abi.PageSize
	ringAlloc := npages * abi.PageSize
	mem, err := c.allocDMA(ringAlloc+abi.CQRecordSize, abi.PageSize)
	if err != nil {
		return nil, fmt.Errorf("create cq: %w", err)
	}
	pages, err := mem.PageAddrs(0, ringBytes)
	if err == nil && uint64(len(pages)) != npages {
		err = fmt.Errorf("%w: ring spans %d pages, want %d", ErrProtocol, len(pages), npages)
	}
	var recGPA abi.GPA
	if err == nil {
		recGPA, err = mem.GPA(ringAlloc)
	}
	var inline []byte
	var ind *DMABuf
	var plAddr uint64
	if err == nil {
		inline, ind, plAddr, err = c.pageList(pages)
	}
	if err != nil {
		c.t.FreeDMA(mem)
		return nil, err
	}
	if ind != nil {
		defer c.t.FreeDMA(*ind)
	}
	req := abi.Marshal(&abi.CreateCQ{CQE: depth, NPages: uint32(npages), Record: uint64(recGPA), PageList: plAddr})
	resp, err := c.command(abi.CmdCreateCQ, append(req, inline...), 8)
	if err != nil {
		c.t.FreeDMA(mem)
		return nil, err
	}
	cq := &CQ{ctx: c, num: binary.LittleEndian.Uint32(resp), depth: depth, mem: mem,
		ring: mem.Buf[:ringBytes:ringBytes], rec: mem.Buf[ringAlloc : ringAlloc+abi.CQRecordSize : ringAlloc+abi.CQRecordSize]}
	c.objMu.Lock()
	c.cqs[cq.num] = cq
	c.objMu.Unlock()
	return cq, nil
}

// Num returns the CQ number.
func (cq *CQ) Num() uint32 { return cq.num }

// CQE returns the number of entries (the rounded-up size).
func (cq *CQ) CQE() int { return int(cq.depth) }

// Poll copies up to len(wc) completions into wc and returns how many. It
// reads the producer index (acquire), copies the entries before it, then
// advances the consumer index. A producer index more than the ring ahead
// is a device protocol violation (ErrProtocol) and returns 0.
func (cq *CQ) Poll(wc []WC) (int, error) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	pi := abi.LoadUint32(cq.rec, abi.CQRecordPI)
	avail := pi - cq.ci
	if avail > cq.depth {
		return 0, fmt.Errorf("%w: cq %d: pi %d, ci %d, depth %d", ErrProtocol, cq.num, pi, cq.ci, cq.depth)
	}
	n := min(int(avail), len(wc))
	if n == 0 {
		return 0, nil
	}
	mask := cq.depth - 1
	for i := range n {
		off := int((cq.ci+uint32(i))&mask) * abi.CQESize
		e := cq.ring[off : off+abi.CQESize : off+abi.CQESize]
		w := &wc[i]
		w.WRID = binary.LittleEndian.Uint64(e[0:])
		w.Status = abi.WCStatus(e[8])
		w.Opcode = int(e[9])
		w.Flags = int(binary.LittleEndian.Uint16(e[10:]))
		w.QPNum = binary.LittleEndian.Uint32(e[12:])
		w.ByteLen = binary.LittleEndian.Uint32(e[16:])
		w.Imm = binary.LittleEndian.Uint32(e[20:])
		w.SrcQP = binary.LittleEndian.Uint32(e[24:])
		w.VendorErr = binary.LittleEndian.Uint32(e[28:])
	}
	cq.ci += uint32(n)
	abi.StoreUint32(cq.rec, abi.CQRecordCI, cq.ci)
	return n, nil
}

// ReqNotify arms the CQ for one CQ_COMPLETION event (REQ_NOTIFY_CQ); with
// solicitedOnly, only a solicited or failed completion triggers it.
func (cq *CQ) ReqNotify(solicitedOnly bool) error {
	req := abi.NotifyCQ{CQN: cq.num}
	if solicitedOnly {
		req.SolicitedOnly = 1
	}
	_, err := cq.ctx.command(abi.CmdReqNotifyCQ, abi.Marshal(&req), 0)
	return err
}

// Destroy destroys the CQ (DESTROY_CQ) and frees its memory; it fails with
// BUSY while a QP uses it.
func (cq *CQ) Destroy() error {
	if err := cq.ctx.handleCommand(abi.CmdDestroyCQ, cq.num); err != nil {
		return err
	}
	cq.ctx.objMu.Lock()
	delete(cq.ctx.cqs, cq.num)
	cq.ctx.objMu.Unlock()
	cq.ctx.t.FreeDMA(cq.mem)
	return nil
}
