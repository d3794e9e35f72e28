package verbs

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// SRQInitAttr describes a shared receive queue to create, like
// ibv_srq_init_attr.
type SRQInitAttr struct {
	// MaxWR is the depth asked for; it is rounded up to a power of two.
	MaxWR int
	// MaxSGE bounds the SGEs of one receive WR; zero means one.
	MaxSGE int
	// Limit arms SRQ_LIMIT_REACHED from the start (0: not armed), as
	// ibv_srq_attr's srq_limit; at most the granted depth.
	Limit int
}

// SRQ is a shared receive queue: a ring of receive WQEs and a
// vrdma_srq_record in DMA memory, which the QPs created with it consume in
// ring order (docs/spec.md, "Shared receive queues"). PostRecv is safe for
// concurrent use; the ring is written only under mu.
type SRQ struct {
	ctx    *Context // immutable
	pd     *PD      // immutable
	num    uint32   // immutable
	db     int      // immutable: the doorbell queue a post notifies
	depth  uint32   // immutable, a power of two
	shift  uint     // immutable: log2 of the WQE stride
	maxSGE int      // immutable
	mem    DMABuf   // immutable: ring pages, then the record
	ring   []byte   // immutable view of the ring
	rec    []byte   // immutable view of the vrdma_srq_record

	mu sync.Mutex // protects pi and the ring
	pi uint32
}

// CreateSRQ creates a shared receive queue in pd (CREATE_SRQ), its ring and
// record in DMA memory as a QP's are, on a doorbell queue picked
// round-robin. A device whose max_srq is 0 gets ErrUnsupported without a
// command.
func (pd *PD) CreateSRQ(a SRQInitAttr) (*SRQ, error) {
	c := pd.ctx
	at := &c.attr
	if at.MaxSRQ == 0 {
		return nil, fmt.Errorf("create srq: %w: the device reports max_srq 0", ErrUnsupported)
	}
	maxSGE := a.MaxSGE
	if maxSGE == 0 {
		maxSGE = 1
	}
	switch {
	case a.MaxWR <= 0 || uint64(a.MaxWR) > uint64(at.MaxQPWR):
		return nil, argErr("max_wr", "%d not in [1, %d]", a.MaxWR, at.MaxQPWR)
	case maxSGE < 0 || uint64(maxSGE) > uint64(at.MaxSGE):
		return nil, argErr("max_sge", "%d not in [1, %d]", a.MaxSGE, at.MaxSGE)
	}
	depth := ceilPow2(uint32(a.MaxWR))
	if depth > at.MaxQPWR {
		return nil, argErr("max_wr", "%d rounds up to %d, above the device's %d", a.MaxWR, depth, at.MaxQPWR)
	}
	if a.Limit < 0 || uint64(a.Limit) > uint64(depth) {
		return nil, argErr("srq_limit", "%d not in [0, %d]", a.Limit, depth)
	}
	stride := max(ceilPow2(uint32(abi.RecvWQEHdrSize+abi.SGESize*maxSGE)), 1<<abi.MinRQWQEShift)
	if stride > abi.PageSize {
		return nil, argErr("max_sge", "WQE stride %d exceeds a page", stride)
	}
	ringBytes := uint64(depth) * uint64(stride)
	ringAlloc := (ringBytes + abi.PageSize - 1) &^ (abi.PageSize - 1)
	mem, err := c.allocDMA(ringAlloc+abi.SRQRecordSize, abi.PageSize)
	if err != nil {
		return nil, fmt.Errorf("create srq: %w", err)
	}
	fail := func(err error) (*SRQ, error) {
		c.t.FreeDMA(mem)
		return nil, err
	}
	pages, err := mem.PageAddrs(0, ringBytes)
	if err != nil {
		return fail(err)
	}
	recGPA, err := mem.GPA(ringAlloc)
	if err != nil {
		return fail(err)
	}
	inline, ind, plAddr, err := c.pageList(pages)
	if err != nil {
		return fail(err)
	}
	if ind != nil {
		defer c.t.FreeDMA(*ind)
	}
	db := int(c.nextDB.Add(1)-1) % int(c.conf.NumDoorbellQueues)
	req := abi.CreateSRQ{
		PDN: pd.num, MaxWR: depth, MaxSGE: uint32(maxSGE), SRQLimit: uint32(a.Limit),
		WQEShift: uint32(log2(stride)), DoorbellQueue: uint32(db), Record: uint64(recGPA),
		NPages: uint32(len(pages)), PageList: plAddr,
	}
	resp, err := c.command(abi.CmdCreateSRQ, append(abi.Marshal(&req), inline...), 8)
	if err != nil {
		return fail(err)
	}
	return &SRQ{
		ctx: c, pd: pd, num: binary.LittleEndian.Uint32(resp), db: db, depth: depth, shift: log2(stride),
		maxSGE: maxSGE, mem: mem,
		ring: mem.Buf[:ringBytes:ringBytes],
		rec:  mem.Buf[ringAlloc : ringAlloc+abi.SRQRecordSize : ringAlloc+abi.SRQRecordSize],
	}, nil
}

// Num returns the SRQ number (the handle SRQ_LIMIT_REACHED events carry).
func (s *SRQ) Num() uint32 { return s.num }

// PD returns the PD the SRQ was created in.
func (s *SRQ) PD() *PD { return s.pd }

// MaxWR returns the depth granted (rounded up to a power of two).
func (s *SRQ) MaxWR() int { return int(s.depth) }

// MaxSGE returns the SGEs a receive WR may carry.
func (s *SRQ) MaxSGE() int { return s.maxSGE }

// DoorbellQueue returns the doorbell queue the SRQ was created on.
func (s *SRQ) DoorbellQueue() int { return s.db }

// Modify applies the attributes selected by mask (abi.SRQAttr* bits)
// (MODIFY_SRQ); attr.SRQN and attr.AttrMask are filled in for you. LIMIT
// arms SRQ_LIMIT_REACHED at attr.SRQLimit WQEs (0 disarms). MAX_WR
// (resizing) is ErrUnsupported: the ring is this library's memory, sized
// at CreateSRQ.
func (s *SRQ) Modify(attr abi.SRQAttr, mask int) error {
	switch {
	case mask <= 0 || mask&^(abi.SRQAttrMaxWR|abi.SRQAttrLimit) != 0:
		return argErr("srq attr mask", "%#x", mask)
	case mask&abi.SRQAttrMaxWR != 0:
		return fmt.Errorf("modify srq %d: resize: %w", s.num, ErrUnsupported)
	case attr.SRQLimit > s.depth:
		return argErr("srq_limit", "%d above the depth %d", attr.SRQLimit, s.depth)
	}
	attr.SRQN = s.num
	attr.AttrMask = uint32(mask)
	_, err := s.ctx.command(abi.CmdModifySRQ, abi.Marshal(&attr), 0)
	return err
}

// ArmLimit arms SRQ_LIMIT_REACHED: the device posts it once the SRQ holds
// fewer than limit WQEs after consuming one (ibv_modify_srq with
// IBV_SRQ_LIMIT); 0 disarms.
func (s *SRQ) ArmLimit(limit uint32) error {
	return s.Modify(abi.SRQAttr{SRQLimit: limit}, abi.SRQAttrLimit)
}

// Query returns the SRQ's attributes (QUERY_SRQ): its depth and the armed
// limit (0 once the limit event fired). An answer for another SRQ, of
// another depth or with a limit above it is ErrProtocol.
func (s *SRQ) Query() (abi.SRQAttr, error) {
	resp, err := s.ctx.command(abi.CmdQuerySRQ, abi.Marshal(&abi.Handle{Handle: s.num}), 16)
	if err != nil {
		return abi.SRQAttr{}, err
	}
	var a abi.SRQAttr
	if err := abi.Unmarshal(resp, &a); err != nil {
		return abi.SRQAttr{}, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	if a.SRQN != s.num || a.MaxWR != s.depth || a.SRQLimit > a.MaxWR {
		return abi.SRQAttr{}, fmt.Errorf("%w: query srq %d: answer for srq %d, max_wr %d (want %d), srq_limit %d",
			ErrProtocol, s.num, a.SRQN, a.MaxWR, s.depth, a.SRQLimit)
	}
	return a, nil
}

// Destroy destroys the SRQ (DESTROY_SRQ) and frees its ring; it fails with
// BUSY while a QP was created with it.
func (s *SRQ) Destroy() error {
	if err := s.ctx.handleCommand(abi.CmdDestroySRQ, s.num); err != nil {
		return err
	}
	s.ctx.t.FreeDMA(s.mem)
	return nil
}

// PostRecv posts receive WRs to the SRQ, all or none (ErrQueueFull if they
// do not all fit), then the producer index. Like a QP's receive queue with
// RQ_NOTIFY, it takes the doorbell step only when the record's notify word
// says a message waits for a receive (docs/spec.md, struct
// vrdma_srq_record).
func (s *SRQ) PostRecv(wrs ...RecvWR) error {
	if len(wrs) == 0 {
		return nil
	}
	for i := range wrs {
		if len(wrs[i].SGL) > s.maxSGE {
			return fmt.Errorf("recv wr %d: %w", i, argErr("sge count", "%d above the SRQ's %d", len(wrs[i].SGL), s.maxSGE))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ci := abi.LoadUint32(s.rec, abi.SRQRecordCI)
	used := s.pi - ci
	if used > s.depth {
		return fmt.Errorf("%w: srq %d: consumer index %d behind producer %d by more than %d", ErrProtocol, s.num, ci, s.pi, s.depth)
	}
	if uint64(len(wrs)) > uint64(s.depth-used) {
		return ErrQueueFull
	}
	pi := s.pi
	stride := uint32(1) << s.shift
	for i := range wrs {
		off := (pi & (s.depth - 1)) * stride
		putRecvWQE(s.ring[off:off+stride:off+stride], &wrs[i])
		pi++
	}
	s.pi = pi
	// abi.StoreUint32 is sequentially consistent: the release that
	// publishes the WQEs and the full barrier before reading notify.
	abi.StoreUint32(s.rec, abi.SRQRecordPI, pi)
	if abi.LoadUint32(s.rec, abi.SRQRecordNotify) == 0 {
		return nil
	}
	return s.ctx.doorbell(s.db)
}

// putRecvWQE writes a receive WQE (header and SGEs) into w, one stride.
func putRecvWQE(w []byte, wr *RecvWR) {
	clear(w[:abi.RecvWQEHdrSize])
	binary.LittleEndian.PutUint64(w[0:], wr.WRID)
	binary.LittleEndian.PutUint16(w[8:], uint16(len(wr.SGL)))
	putSGL(w[abi.RecvWQEHdrSize:], wr.SGL)
}

// doorbell is the doorbell step of docs/spec.md ("Doorbell queues and the
// data path"): notify doorbell queue db unless its engine polls. The
// caller has published its producer index with a sequentially consistent
// store.
func (c *Context) doorbell(db int) error {
	if c.t.Polling(db) {
		return nil
	}
	return c.t.Notify(db)
}
