package verbs

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// maxInlinePageList bounds a page list sent inside the control request;
// longer lists go indirect, in a DMA buffer the request points at.
const maxInlinePageList = 60 << 10

// maxPendingEvents bounds the events GetCQEvent and GetAsyncEvent set
// aside for each other.
const maxPendingEvents = 256

// Context is an opened device, like ibv_context. Its methods are safe for
// concurrent use; the objects it creates document their own rules.
type Context struct {
	t    Transport      // immutable
	conf abi.Config     // immutable: config space read at Open
	attr abi.DeviceAttr // immutable: QUERY_DEVICE at Open

	nextDB  atomic.Uint32 // round-robin doorbell queue for new QPs
	mrShift atomic.Uint32 // largest REG_MR page shift to use

	cmdMu  sync.Mutex // serialises commands; protects closed
	closed bool

	objMu sync.Mutex     // protects cqs and qps
	cqs   map[uint32]*CQ // by CQ number, for events
	qps   map[uint32]*QP // by QP number

	evMu     sync.Mutex  // serialises event waiters; protects the lists
	cqEvents []uint32    // CQ numbers of CQ_COMPLETION events not yet returned
	async    []abi.Event // other events not yet returned
	lost     uint64      // events dropped because the lists were full
}

// Open reads the device's config space (checking its ABI version) and runs
// QUERY_DEVICE.
func Open(t Transport) (*Context, error) {
	raw, err := t.ReadConfig(0, abi.ConfigSize)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var conf abi.Config
	if err := abi.Unmarshal(raw, &conf); err != nil {
		return nil, fmt.Errorf("%w: config: %v", ErrProtocol, err)
	}
	if conf.ABIVersion != abi.ABIVersion {
		return nil, fmt.Errorf("%w: device ABI version %d, library speaks %d", ErrProtocol, conf.ABIVersion, abi.ABIVersion)
	}
	if conf.NumDoorbellQueues == 0 || conf.NumDoorbellQueues > 1024 {
		return nil, fmt.Errorf("%w: device reports %d doorbell queues", ErrProtocol, conf.NumDoorbellQueues)
	}
	c := &Context{t: t, conf: conf, cqs: map[uint32]*CQ{}, qps: map[uint32]*QP{}}
	resp, err := c.command(abi.CmdQueryDevice, nil, abi.DeviceAttrSize)
	if err != nil {
		return nil, err
	}
	if err := abi.Unmarshal(resp, &c.attr); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	if c.attr.PageSizeCap&abi.PageSize == 0 {
		return nil, fmt.Errorf("%w: device page sizes %#x lack 4 KiB", ErrProtocol, c.attr.PageSizeCap)
	}
	c.mrShift.Store(abi.PageShift)
	c.SetMaxMRPageShift(abi.MaxPageShift)
	return c, nil
}

// SetMaxMRPageShift bounds the pages RegMR describes a region with to
// 1<<shift bytes, and to the sizes the device supports from 4 KiB up
// (page_size_cap). By default RegMR uses the largest the buffer's layout
// and the device allow; 12 forces 4 KiB page lists (for a comparison, or a
// device that should see every page).
func (c *Context) SetMaxMRPageShift(shift uint) {
	s := uint(abi.PageShift)
	for s < min(shift, abi.MaxPageShift) && c.attr.PageSizeCap&(1<<(s+1)) != 0 {
		s++
	}
	c.mrShift.Store(uint32(s))
}

// Config returns the config space as read at Open.
func (c *Context) Config() abi.Config { return c.conf }

// Transport returns the transport the context runs on.
func (c *Context) Transport() Transport { return c.t }

// Close closes the transport. Objects are not destroyed one by one: the
// device destroys everything of a driver that goes away (reset or
// disconnect). Close is idempotent.
func (c *Context) Close() error {
	c.cmdMu.Lock()
	defer c.cmdMu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	return c.t.Close()
}

// parseResponse checks a command's response: at least a header, a status,
// and on success exactly the response structure. It returns the structure.
func parseResponse(op abi.Opcode, resp []byte, respBody int) ([]byte, error) {
	if len(resp) < abi.RespHeaderSize {
		return nil, fmt.Errorf("%w: %s: response of %d bytes", ErrProtocol, op, len(resp))
	}
	if st := abi.Status(binary.LittleEndian.Uint32(resp)); st != abi.StatusOK {
		return nil, &CommandError{Op: op, Status: st}
	}
	if len(resp) != abi.RespHeaderSize+respBody {
		return nil, fmt.Errorf("%w: %s: response of %d bytes, want %d", ErrProtocol, op, len(resp), abi.RespHeaderSize+respBody)
	}
	return resp[abi.RespHeaderSize:], nil
}

// command runs one control command with request body req and a response
// body of respBody bytes, and returns the response body.
func (c *Context) command(op abi.Opcode, req []byte, respBody int) ([]byte, error) {
	buf := make([]byte, abi.CmdHeaderSize+len(req))
	binary.LittleEndian.PutUint16(buf, uint16(op))
	copy(buf[abi.CmdHeaderSize:], req)
	c.cmdMu.Lock()
	defer c.cmdMu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	resp, err := c.t.Command(buf, abi.RespHeaderSize+respBody)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return parseResponse(op, resp, respBody)
}

// handleCommand runs a command whose request is one handle and whose
// response is nothing (the DESTROY_* family).
func (c *Context) handleCommand(op abi.Opcode, h uint32) error {
	_, err := c.command(op, abi.Marshal(&abi.Handle{Handle: h}), 0)
	return err
}

// QueryDevice returns the device's attributes (QUERY_DEVICE).
func (c *Context) QueryDevice() (abi.DeviceAttr, error) {
	var a abi.DeviceAttr
	resp, err := c.command(abi.CmdQueryDevice, nil, abi.DeviceAttrSize)
	if err != nil {
		return a, err
	}
	if err := abi.Unmarshal(resp, &a); err != nil {
		return abi.DeviceAttr{}, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return a, nil
}

// QueryPort returns port 1's attributes (QUERY_PORT).
func (c *Context) QueryPort() (abi.PortAttr, error) {
	var a abi.PortAttr
	resp, err := c.command(abi.CmdQueryPort, abi.Marshal(&abi.PortReq{PortNum: 1}), 40)
	if err != nil {
		return a, err
	}
	if err := abi.Unmarshal(resp, &a); err != nil {
		return abi.PortAttr{}, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return a, nil
}

// QueryGID returns GID 0 of port 1 (QUERY_GID).
func (c *Context) QueryGID() ([16]byte, error) { return c.QueryGIDAt(0) }

// QueryGIDAt returns entry index of port 1's GID table (QUERY_GID): all
// zero for an empty entry. Entries 1, 2, … of a device whose daemon
// carries RoCE are its host addresses' GIDs (docs/spec.md).
func (c *Context) QueryGIDAt(index uint32) ([16]byte, error) {
	var g abi.GID
	resp, err := c.command(abi.CmdQueryGID, abi.Marshal(&abi.GIDReq{PortNum: 1, Index: index}), 16)
	if err != nil {
		return g.Raw, err
	}
	if err := abi.Unmarshal(resp, &g); err != nil {
		return [16]byte{}, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return g.Raw, nil
}

// pageList prepares a page list for a command: inline bytes, or a DMA
// buffer holding it (the caller frees it after the command) and its
// address.
func (c *Context) pageList(pages []uint64) (inline []byte, indirect *DMABuf, addr uint64, err error) {
	n := uint64(len(pages)) * 8
	if n <= maxInlinePageList {
		inline = make([]byte, n)
		for i, p := range pages {
			binary.LittleEndian.PutUint64(inline[8*i:], p)
		}
		return inline, nil, 0, nil
	}
	b, err := c.t.AllocDMA(n, abi.PageSize)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("page list: %w", err)
	}
	if err := checkDMA(b, n); err != nil {
		c.t.FreeDMA(b)
		return nil, nil, 0, err
	}
	if !b.Contiguous() {
		// "An indirect page list must lie in guest memory, in one memory
		// region": the device reads it as one guest-physical range.
		c.t.FreeDMA(b)
		return nil, nil, 0, fmt.Errorf("page list: %w: transport gave %d non-contiguous bytes", ErrProtocol, n)
	}
	for i, p := range pages {
		binary.LittleEndian.PutUint64(b.Buf[8*i:], p)
	}
	return nil, &b, uint64(b.Addr), nil
}

// allocDMA allocates a DMA buffer (zeroed by the transport) and checks its
// size.
func (c *Context) allocDMA(size, align uint64) (DMABuf, error) {
	b, err := c.t.AllocDMA(size, align)
	if err != nil {
		return DMABuf{}, err
	}
	if err := checkDMA(b, size); err != nil {
		c.t.FreeDMA(b)
		return DMABuf{}, err
	}
	b.Buf = b.Buf[:size:size]
	return b, nil
}

// PD is a protection domain.
type PD struct {
	ctx *Context // immutable
	num uint32   // immutable
}

// AllocPD creates a protection domain (CREATE_PD).
func (c *Context) AllocPD() (*PD, error) {
	resp, err := c.command(abi.CmdCreatePD, nil, 8)
	if err != nil {
		return nil, err
	}
	return &PD{ctx: c, num: binary.LittleEndian.Uint32(resp)}, nil
}

// Num returns the PD number.
func (pd *PD) Num() uint32 { return pd.num }

// Context returns the context the PD belongs to.
func (pd *PD) Context() *Context { return pd.ctx }

// Dealloc destroys the PD (DESTROY_PD); it fails with BUSY while MRs or
// QPs use it.
func (pd *PD) Dealloc() error { return pd.ctx.handleCommand(abi.CmdDestroyPD, pd.num) }

// Buffer is page-aligned DMA memory for memory regions: Bytes are this
// process's view of the bytes at guest-physical address Addr.
type Buffer struct {
	Bytes []byte
	Addr  abi.GPA

	ctx *Context
	dma DMABuf
}

// AllocBuffer allocates n bytes (rounded up to whole pages) of zeroed DMA
// memory.
func (c *Context) AllocBuffer(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, argErr("buffer size", "%d", n)
	}
	size := (uint64(n) + abi.PageSize - 1) &^ (abi.PageSize - 1)
	b, err := c.allocDMA(size, abi.PageSize)
	if err != nil {
		return nil, fmt.Errorf("alloc buffer: %w", err)
	}
	return &Buffer{Bytes: b.Buf[:n:n], Addr: b.Addr, ctx: c, dma: b}, nil
}

// Free gives the buffer back. Its MRs must have been deregistered.
func (b *Buffer) Free() {
	if b.ctx != nil {
		b.ctx.t.FreeDMA(b.dma)
		b.ctx, b.Bytes = nil, nil
	}
}

// DMA returns the DMA buffer behind b.
func (b *Buffer) DMA() DMABuf { return b.dma }

// MR is a registered memory region.
type MR struct {
	LKey, RKey uint32
	// Addr is the IOVA of the region's first byte: its guest-physical
	// address, as a kernel driver would use the virtual address.
	Addr   uint64
	Length uint64

	pd    *PD
	bytes []byte
}

// Bytes returns the region's memory.
func (mr *MR) Bytes() []byte { return mr.bytes }

// RegMR registers b.Bytes[off:off+length] with the given access flags
// (abi.AccessLocalWrite, …) in pd (REG_MR). The page list goes inline when it
// fits the request, else indirect.
func (pd *PD) RegMR(b *Buffer, off, length int, access int) (*MR, error) {
	if b == nil || b.ctx != pd.ctx {
		return nil, argErr("buffer", "not allocated by this context")
	}
	if off < 0 || length <= 0 || off > len(b.Bytes) || length > len(b.Bytes)-off {
		return nil, argErr("range", "[%d, +%d) outside a buffer of %d bytes", off, length, len(b.Bytes))
	}
	if access&^abi.AccessAll != 0 {
		return nil, argErr("access", "%#x", access)
	}
	iova, err := b.dma.GPA(uint64(off))
	if err != nil {
		return nil, err
	}
	pages, shift, err := b.dma.MRPages(uint64(off), uint64(length), uint(pd.ctx.mrShift.Load()))
	if err != nil {
		return nil, err
	}
	c := pd.ctx
	inline, ind, plAddr, err := c.pageList(pages)
	if err != nil {
		return nil, err
	}
	if ind != nil {
		defer c.t.FreeDMA(*ind)
	}
	req := abi.Marshal(&abi.RegMR{
		PDN: pd.num, Access: uint32(access), IOVA: uint64(iova), Length: uint64(length),
		PageShift: uint32(shift), NPages: uint32(len(pages)), PageList: plAddr,
	})
	resp, err := c.command(abi.CmdRegMR, append(req, inline...), 8)
	if err != nil {
		return nil, err
	}
	var k abi.MRKeys
	if err := abi.Unmarshal(resp, &k); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return &MR{LKey: k.LKey, RKey: k.RKey, Addr: uint64(iova), Length: uint64(length), pd: pd,
		bytes: b.Bytes[off : off+length : off+length]}, nil
}

// Dereg deregisters the region (DEREG_MR).
func (mr *MR) Dereg() error { return mr.pd.ctx.handleCommand(abi.CmdDeregMR, mr.LKey) }

// SGE returns a scatter/gather entry for mr's bytes [off, off+n).
func (mr *MR) SGE(off, n int) abi.SGE {
	return abi.SGE{Addr: mr.Addr + uint64(off), Length: uint32(n), LKey: mr.LKey}
}

// GetCQEvent waits up to timeout for a CQ_COMPLETION event (one per
// ReqNotify) and returns its CQ. Other events are set aside for
// GetAsyncEvent. Waiters are served one at a time.
func (c *Context) GetCQEvent(timeout time.Duration) (*CQ, error) {
	c.evMu.Lock()
	defer c.evMu.Unlock()
	deadline := time.Now().Add(timeout)
	for {
		for len(c.cqEvents) > 0 {
			n := c.cqEvents[0]
			c.cqEvents = c.cqEvents[1:]
			if cq := c.lookupCQ(n); cq != nil {
				return cq, nil
			}
		}
		ev, err := c.waitEvent(deadline)
		if err != nil {
			return nil, err
		}
		if ev.Type != abi.EventCQCompletion {
			c.setAside(ev)
			continue
		}
		if cq := c.lookupCQ(ev.Handle); cq != nil {
			return cq, nil
		}
		// An event for a CQ destroyed since: drop it.
	}
}

// GetAsyncEvent waits up to timeout for an event other than CQ_COMPLETION
// (CQ_ERROR, QP_FATAL, port and device events, SRQ_LIMIT_REACHED with the
// SRQ's number, QP_LAST_WQE_REACHED with the QP's), like
// ibv_get_async_event.
func (c *Context) GetAsyncEvent(timeout time.Duration) (abi.Event, error) {
	c.evMu.Lock()
	defer c.evMu.Unlock()
	deadline := time.Now().Add(timeout)
	for {
		if len(c.async) > 0 {
			ev := c.async[0]
			c.async = c.async[1:]
			return ev, nil
		}
		ev, err := c.waitEvent(deadline)
		if err != nil {
			return abi.Event{}, err
		}
		if ev.Type != abi.EventCQCompletion {
			return ev, nil
		}
		c.setAside(ev)
	}
}

// LostEvents counts events dropped because nobody collected them.
func (c *Context) LostEvents() uint64 {
	c.evMu.Lock()
	defer c.evMu.Unlock()
	return c.lost
}

func (c *Context) waitEvent(deadline time.Time) (abi.Event, error) {
	d := time.Until(deadline)
	if d <= 0 {
		return abi.Event{}, ErrTimeout
	}
	ev, err := c.t.WaitEvent(d)
	if err != nil {
		return abi.Event{}, fmt.Errorf("wait event: %w", err)
	}
	return ev, nil
}

// setAside keeps ev for the other kind of waiter. Precondition: evMu held.
func (c *Context) setAside(ev abi.Event) {
	if ev.Type == abi.EventCQCompletion {
		if len(c.cqEvents) >= maxPendingEvents {
			c.lost++
			return
		}
		c.cqEvents = append(c.cqEvents, ev.Handle)
		return
	}
	if len(c.async) >= maxPendingEvents {
		c.lost++
		return
	}
	c.async = append(c.async, ev)
}

func (c *Context) lookupCQ(n uint32) *CQ {
	c.objMu.Lock()
	defer c.objMu.Unlock()
	return c.cqs[n]
}
