//go:build cgo && linux

package ibv

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// libName is the library Load opens (a variable so a test can name one
// that does not exist).
var libName = "libibverbs.so.1"

var (
	loadOnce sync.Once
	loadErr  error
)

// Load opens libibverbs.so.1 and resolves every function the package uses.
// It runs once; later calls return the first result. Every other entry
// point calls it, so calling it first only moves the error earlier (e.g.
// to vrdmad's start-up, to say the verbs RNIC is unavailable).
func Load() error {
	loadOnce.Do(func() { loadErr = load(libName) })
	return loadErr
}

func load(name string) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var buf [512]C.char
	if C.vibv_load(cname, &buf[0], C.size_t(len(buf))) != 0 {
		return &LoadError{Library: name, Reason: C.GoString(&buf[0])}
	}
	return nil
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) && e != 0 {
		return e
	}
	return syscall.EIO
}

// retErr turns a verb's return value (0, an errno value, or -errno) into
// an *Error.
func retErr(op string, ret C.int) error {
	if ret == 0 {
		return nil
	}
	if ret < 0 {
		ret = -ret
	}
	return &Error{Op: op, Err: syscall.Errno(ret)}
}

// Devices lists the host's RDMA devices. A host whose kernel has no RDMA
// verbs support (no ib_uverbs, no /sys/class/infiniband_verbs) has none:
// the list is empty and the error nil.
func Devices() ([]DeviceInfo, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	var n C.int
	list, err := C.vibv_get_device_list(&n)
	if list == nil {
		if e := errnoOf(err); e == syscall.ENOSYS || e == syscall.ENOENT {
			return nil, nil
		}
		return nil, &Error{Op: "ibv_get_device_list", Err: errnoOf(err)}
	}
	defer C.vibv_free_device_list(list)
	devs := unsafe.Slice(list, int(n))
	out := make([]DeviceInfo, 0, len(devs))
	for _, d := range devs {
		out = append(out, DeviceInfo{
			Name: C.GoString(C.vibv_get_device_name(d)),
			GUID: uint64(C.vibv_get_device_guid(d)),
		})
	}
	return out, nil
}

// Context is an open RDMA device (struct ibv_context). Its methods may be
// called from any goroutine; Close must not run concurrently with any
// other use of the context or of objects created from it.
type Context struct {
	ctx   *C.struct_ibv_context // immutable; freed by Close
	name  string                // immutable
	async *fdWaiter             // the async event fd; immutable

	nextCQ atomic.Uint64 // the last CQ id handed out (CQ.id)
	cqs    sync.Map      // CQ id (the C cq_context) → *CQ, while the CQ lives

	closeOnce sync.Once
	closeErr  error
}

// Open opens the RDMA device called name (as Devices lists it).
func Open(name string) (*Context, error) {
	if err := Load(); err != nil {
		return nil, err
	}
	var n C.int
	list, err := C.vibv_get_device_list(&n)
	if list == nil {
		e := errnoOf(err)
		if e == syscall.ENOSYS || e == syscall.ENOENT {
			return nil, fmt.Errorf("%w %q: no RDMA devices found (the kernel has no RDMA verbs support: %v)", ErrNoDevice, name, e)
		}
		return nil, &Error{Op: "ibv_get_device_list", Err: e}
	}
	defer C.vibv_free_device_list(list)
	var names []string
	for _, d := range unsafe.Slice(list, int(n)) {
		dn := C.GoString(C.vibv_get_device_name(d))
		if dn != name {
			names = append(names, dn)
			continue
		}
		ctx, err := C.vibv_open_device(d)
		if ctx == nil {
			return nil, &Error{Op: "ibv_open_device " + name, Err: errnoOf(err)}
		}
		c := &Context{ctx: ctx, name: name}
		c.async, err = newFdWaiter(int(C.vibv_async_fd(ctx)), name+" async")
		if err != nil {
			C.vibv_close_device(ctx)
			return nil, fmt.Errorf("ibv: open %q: async fd: %w", name, err)
		}
		return c, nil
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%w %q: no RDMA devices found", ErrNoDevice, name)
	}
	return nil, fmt.Errorf("%w %q: the host has %s", ErrNoDevice, name, strings.Join(names, ", "))
}

// Name is the device's name.
func (c *Context) Name() string { return c.name }

// Close closes the device. Every PD, MR, CQ, QP and channel made from it
// must be gone first (libibverbs fails otherwise). It is idempotent.
func (c *Context) Close() error {
	c.closeOnce.Do(func() {
		c.async.close()
		c.closeErr = retErr("ibv_close_device", C.vibv_close_device(c.ctx))
	})
	return c.closeErr
}

// QueryDevice returns the device's attributes.
func (c *Context) QueryDevice() (DeviceAttr, error) {
	var a C.struct_ibv_device_attr
	if err := retErr("ibv_query_device", C.vibv_query_device(c.ctx, &a)); err != nil {
		return DeviceAttr{}, err
	}
	return DeviceAttr{
		FWVer:           C.GoString(&a.fw_ver[0]),
		NodeGUID:        be64(uint64(a.node_guid)),
		SysImageGUID:    be64(uint64(a.sys_image_guid)),
		MaxMRSize:       uint64(a.max_mr_size),
		PageSizeCap:     uint64(a.page_size_cap),
		VendorID:        uint32(a.vendor_id),
		VendorPartID:    uint32(a.vendor_part_id),
		HWVer:           uint32(a.hw_ver),
		MaxQP:           int(a.max_qp),
		MaxQPWR:         int(a.max_qp_wr),
		DeviceCapFlags:  uint32(a.device_cap_flags),
		MaxSGE:          int(a.max_sge),
		MaxSGERd:        int(a.max_sge_rd),
		MaxCQ:           int(a.max_cq),
		MaxCQE:          int(a.max_cqe),
		MaxMR:           int(a.max_mr),
		MaxPD:           int(a.max_pd),
		MaxQPRdAtom:     int(a.max_qp_rd_atom),
		MaxQPInitRdAtom: int(a.max_qp_init_rd_atom),
		MaxResRdAtom:    int(a.max_res_rd_atom),
		AtomicCap:       AtomicCap(a.atomic_cap),
		MaxAH:           int(a.max_ah),
		MaxSRQ:          int(a.max_srq),
		MaxPKeys:        int(a.max_pkeys),
		PhysPortCnt:     int(a.phys_port_cnt),
	}, nil
}

// be64 converts a __be64 read as a native integer into its value.
func be64(v uint64) uint64 {
	var b [8]byte
	*(*uint64)(unsafe.Pointer(&b[0])) = v
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

func checkPort(port int) error {
	if port < 1 || port > 255 {
		return fmt.Errorf("%w: port %d is not in 1..255", ErrInvalid, port)
	}
	return nil
}

// QueryPort returns the attributes of port (1-based).
func (c *Context) QueryPort(port int) (PortAttr, error) {
	if err := checkPort(port); err != nil {
		return PortAttr{}, err
	}
	var a C.struct_ibv_port_attr
	if err := retErr("ibv_query_port", C.vibv_query_port(c.ctx, C.uint8_t(port), &a)); err != nil {
		return PortAttr{}, err
	}
	return PortAttr{
		State:         PortState(a.state),
		MaxMTU:        MTU(a.max_mtu),
		ActiveMTU:     MTU(a.active_mtu),
		GIDTblLen:     int(a.gid_tbl_len),
		PortCapFlags:  uint32(a.port_cap_flags),
		MaxMsgSz:      uint32(a.max_msg_sz),
		PKeyTblLen:    int(a.pkey_tbl_len),
		LID:           uint16(a.lid),
		SMLID:         uint16(a.sm_lid),
		LMC:           uint8(a.lmc),
		ActiveWidth:   uint8(a.active_width),
		ActiveSpeed:   uint8(a.active_speed),
		PhysState:     uint8(a.phys_state),
		LinkLayer:     LinkLayer(a.link_layer),
		PortCapFlags2: uint16(a.port_cap_flags2),
	}, nil
}

// QueryGID returns entry index of port's GID table (network byte order).
func (c *Context) QueryGID(port, index int) (GID, error) {
	if err := checkPort(port); err != nil {
		return GID{}, err
	}
	if index < 0 || index > math.MaxInt32 {
		return GID{}, fmt.Errorf("%w: GID index %d", ErrInvalid, index)
	}
	var g C.union_ibv_gid
	if err := retErr("ibv_query_gid", C.vibv_query_gid(c.ctx, C.uint8_t(port), C.int(index), &g)); err != nil {
		return GID{}, err
	}
	return *(*GID)(unsafe.Pointer(&g)), nil
}

// GIDType returns the type of a GID table entry: through
// ibv_query_gid_ex where the library has it (rdma-core 32 and later),
// else from sysfs (/sys/class/infiniband/DEV/ports/N/gid_attrs/types/I).
func (c *Context) GIDType(port, index int) (GIDType, error) {
	if err := checkPort(port); err != nil {
		return 0, err
	}
	if index < 0 || index > math.MaxInt32 {
		return 0, fmt.Errorf("%w: GID index %d", ErrInvalid, index)
	}
	var t C.uint32_t
	switch ret := C.vibv_query_gid_type(c.ctx, C.uint32_t(port), C.uint32_t(index), &t); ret {
	case 0:
		return GIDType(t), nil
	case -1: // no ibv_query_gid_ex: sysfs
	default:
		return 0, retErr("ibv_query_gid_ex", ret)
	}
	return c.gidTypeSysfs(port, index)
}

// gidTypeSysfs is GIDType from sysfs.
func (c *Context) gidTypeSysfs(port, index int) (GIDType, error) {
	p := filepath.Join("/sys/class/infiniband", c.name, "ports", strconv.Itoa(port), "gid_attrs/types", strconv.Itoa(index))
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, fmt.Errorf("ibv: gid type: %w", err)
	}
	switch s := strings.TrimSpace(string(b)); s {
	case "RoCE v2":
		return GIDTypeRoCEv2, nil
	case "IB/RoCE v1":
		pa, err := c.QueryPort(port)
		if err != nil {
			return 0, err
		}
		if pa.LinkLayer == LinkLayerEthernet {
			return GIDTypeRoCEv1, nil
		}
		return GIDTypeIB, nil
	default:
		return 0, fmt.Errorf("ibv: gid type: %s: unknown type %q", p, s)
	}
}

// AsyncFd is the context's async event fd (non-blocking; libibverbs owns
// it). A caller with its own poll loop waits on it and calls
// TryGetAsyncEvent; GetAsyncEvent does both through Go's netpoller.
func (c *Context) AsyncFd() int { return c.async.fd }

// TryGetAsyncEvent returns the next async event, or ok=false when none is
// pending. The event is acknowledged before it returns.
func (c *Context) TryGetAsyncEvent() (ev AsyncEvent, ok bool, err error) {
	var e C.struct_vibv_async_event
	if r, err := C.vibv_get_async_event(c.ctx, &e); r != 0 {
		if en := errnoOf(err); en == syscall.EAGAIN || en == syscall.EINTR {
			return AsyncEvent{}, false, nil
		}
		return AsyncEvent{}, false, &Error{Op: "ibv_get_async_event", Err: errnoOf(err)}
	}
	ev = AsyncEvent{Type: EventType(e._type), Port: int(e.port_num)}
	if e.has_qp != 0 {
		ev.HasQP, ev.QPNum = true, uint32(e.qp_num)
	}
	if e.has_cq != 0 {
		if v, ok := c.cqs.Load(uint64(e.cq_context)); ok {
			ev.CQ = v.(*CQ)
			ev.CQContext = ev.CQ.userCtx
		}
	}
	return ev, true, nil
}

// GetAsyncEvent waits for the next async event, parked in Go's netpoller
// (no thread blocks). After Close it returns ErrClosed.
func (c *Context) GetAsyncEvent() (AsyncEvent, error) {
	var (
		ev  AsyncEvent
		err error
	)
	werr := c.async.wait(func() bool {
		var ok bool
		ev, ok, err = c.TryGetAsyncEvent()
		return ok || err != nil
	})
	if werr != nil {
		return AsyncEvent{}, werr
	}
	return ev, err
}

// fdWaiter parks goroutines on a libibverbs fd in the netpoller: a
// close-on-exec dup of the fd (set non-blocking, which the dup shares)
// wrapped in an *os.File. Closing it wakes every waiter with ErrClosed and
// returns only once none is inside its callback.
type fdWaiter struct {
	fd     int             // libibverbs' fd; immutable
	f      *os.File        // immutable
	rc     syscall.RawConn // immutable
	closed atomic.Bool     // close has begun
}

func newFdWaiter(fd int, name string) (*fdWaiter, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("set non-blocking: %w", err)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup: %w", err)
	}
	f := os.NewFile(uintptr(dup), name)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &fdWaiter{fd: fd, f: f, rc: rc}, nil
}

// wait calls try until it returns true, parking while the fd is not
// readable.
func (w *fdWaiter) wait(try func() bool) error {
	err := w.rc.Read(func(uintptr) bool { return try() })
	if err != nil && (w.closed.Load() || errors.Is(err, os.ErrClosed)) {
		return ErrClosed // the os error is internal/poll's "use of closed file"
	}
	return err
}

func (w *fdWaiter) close() {
	w.closed.Store(true)
	w.f.Close()
}

// PD is a protection domain.
type PD struct {
	pd  *C.struct_ibv_pd // immutable; freed by Close
	ctx *Context         // immutable

	closeOnce sync.Once
	closeErr  error
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	pd, err := C.vibv_alloc_pd(c.ctx)
	if pd == nil {
		return nil, &Error{Op: "ibv_alloc_pd", Err: errnoOf(err)}
	}
	return &PD{pd: pd, ctx: c}, nil
}

// Close deallocates the PD (its MRs and QPs must be gone). Idempotent.
func (pd *PD) Close() error {
	pd.closeOnce.Do(func() { pd.closeErr = retErr("ibv_dealloc_pd", C.vibv_dealloc_pd(pd.pd)) })
	return pd.closeErr
}

// MR is a registered memory region.
type MR struct {
	mr     *C.struct_ibv_mr // immutable; freed by Close
	lkey   uint32           // immutable
	rkey   uint32           // immutable
	iova   uint64           // immutable
	length uint64           // immutable

	closeOnce sync.Once
	closeErr  error
}

// RegMR registers [addr, addr+length) of this process's memory with
// ibv_reg_mr_iova2, so that the device addresses it as [iova,
// iova+length): SGEs and remote addresses then use IOVA addresses (a
// guest's own addresses, for vrdmad). The caller owns the memory and keeps
// it mapped until Close; it is typically a view of guest memory mapped
// elsewhere, never Go-heap memory.
func (pd *PD) RegMR(addr uintptr, length, iova uint64, access AccessFlags) (*MR, error) {
	if length == 0 || addr == 0 {
		return nil, fmt.Errorf("%w: reg_mr of %d bytes at %#x", ErrInvalid, length, addr)
	}
	if iova+length < iova {
		return nil, fmt.Errorf("%w: reg_mr: iova %#x + %d overflows", ErrInvalid, iova, length)
	}
	mr, err := C.vibv_reg_mr_iova2(pd.pd, C.uintptr_t(addr), C.size_t(length), C.uint64_t(iova), C.uint(access))
	if mr == nil {
		return nil, &Error{Op: "ibv_reg_mr_iova2", Err: errnoOf(err)}
	}
	return &MR{mr: mr, lkey: uint32(mr.lkey), rkey: uint32(mr.rkey), iova: iova, length: length}, nil
}

func (mr *MR) LKey() uint32   { return mr.lkey }
func (mr *MR) RKey() uint32   { return mr.rkey }
func (mr *MR) IOVA() uint64   { return mr.iova }
func (mr *MR) Length() uint64 { return mr.length }

// Close deregisters the MR. Idempotent.
func (mr *MR) Close() error {
	mr.closeOnce.Do(func() { mr.closeErr = retErr("ibv_dereg_mr", C.vibv_dereg_mr(mr.mr)) })
	return mr.closeErr
}

// CompChannel is a completion channel: the fd on which armed CQs signal
// events. Its fd is non-blocking.
type CompChannel struct {
	ch  *C.struct_ibv_comp_channel // immutable; freed by Close
	ctx *Context                   // immutable
	w   *fdWaiter                  // immutable

	closeOnce sync.Once
	closeErr  error
}

// NewCompChannel creates a completion channel.
func (c *Context) NewCompChannel() (*CompChannel, error) {
	ch, err := C.vibv_create_comp_channel(c.ctx)
	if ch == nil {
		return nil, &Error{Op: "ibv_create_comp_channel", Err: errnoOf(err)}
	}
	w, err := newFdWaiter(int(C.vibv_comp_channel_fd(ch)), c.name+" comp channel")
	if err != nil {
		C.vibv_destroy_comp_channel(ch)
		return nil, fmt.Errorf("ibv: comp channel: %w", err)
	}
	return &CompChannel{ch: ch, ctx: c, w: w}, nil
}

// Fd is the channel's fd (non-blocking; libibverbs owns it).
func (ch *CompChannel) Fd() int { return ch.w.fd }

// TryGetCQEvent returns the CQ of the next completion event, or ok=false
// when none is pending. The caller acknowledges it with cq.AckEvents
// (batched acks are fine; CQ.Destroy acks what is left).
func (ch *CompChannel) TryGetCQEvent() (cq *CQ, ok bool, err error) {
	for {
		var (
			ccq  *C.struct_ibv_cq
			cctx C.uintptr_t
		)
		if r, err := C.vibv_get_cq_event(ch.ch, &ccq, &cctx); r != 0 {
			if en := errnoOf(err); en == syscall.EAGAIN || en == syscall.EINTR {
				return nil, false, nil
			}
			return nil, false, &Error{Op: "ibv_get_cq_event", Err: errnoOf(err)}
		}
		if v, ok := ch.ctx.cqs.Load(uint64(cctx)); ok {
			cq := v.(*CQ)
			cq.unacked.Add(1)
			return cq, true, nil
		}
		// Not a CQ of this package (cannot happen): ack it and go on.
		C.vibv_ack_cq_events(ccq, 1)
	}
}

// GetCQEvent waits for the next completion event, parked in Go's
// netpoller, and returns its CQ (see TryGetCQEvent). After Close it
// returns ErrClosed.
func (ch *CompChannel) GetCQEvent() (*CQ, error) {
	var (
		cq  *CQ
		err error
	)
	werr := ch.w.wait(func() bool {
		var ok bool
		cq, ok, err = ch.TryGetCQEvent()
		return ok || err != nil
	})
	if werr != nil {
		return nil, werr
	}
	return cq, err
}

// Close wakes GetCQEvent waiters (ErrClosed) and destroys the channel;
// its CQs must be gone. Idempotent.
func (ch *CompChannel) Close() error {
	ch.closeOnce.Do(func() {
		ch.w.close()
		ch.closeErr = retErr("ibv_destroy_comp_channel", C.vibv_destroy_comp_channel(ch.ch))
	})
	return ch.closeErr
}

// CQ is a completion queue. Poll and ReqNotify may run concurrently with
// the use of other CQs and QPs; one CQ is polled by one goroutine at a
// time (libibverbs providers lock, but the order of WCs split between
// pollers means nothing). Destroy must not race Poll.
type CQ struct {
	cq      *C.struct_ibv_cq // immutable; freed by Destroy
	ctx     *Context         // immutable
	id      uint64           // the C cq_context: the key in ctx.cqs; immutable
	userCtx uint64           // immutable
	cqe     int              // immutable

	unacked atomic.Int64 // events returned by the channel, not yet acked

	destroyOnce sync.Once
	destroyErr  error
}

// CreateCQ creates a CQ of at least cqe entries. ch, if not nil, receives
// its events once armed with ReqNotify; userCtx is the caller's name for
// it (CQ.UserContext, AsyncEvent.CQContext).
func (c *Context) CreateCQ(cqe int, ch *CompChannel, userCtx uint64) (*CQ, error) {
	if cqe < 1 || cqe > math.MaxInt32 {
		return nil, fmt.Errorf("%w: CQ of %d entries", ErrInvalid, cqe)
	}
	cq := &CQ{ctx: c, id: c.nextCQ.Add(1), userCtx: userCtx}
	var cch *C.struct_ibv_comp_channel
	if ch != nil {
		cch = ch.ch
	}
	c.cqs.Store(cq.id, cq)
	ccq, err := C.vibv_create_cq(c.ctx, C.int(cqe), C.uintptr_t(cq.id), cch)
	if ccq == nil {
		c.cqs.Delete(cq.id)
		return nil, &Error{Op: "ibv_create_cq", Err: errnoOf(err)}
	}
	cq.cq = ccq
	cq.cqe = int(C.vibv_cq_cqe(ccq))
	return cq, nil
}

// CQE is the CQ's actual depth (at least what CreateCQ asked for).
func (cq *CQ) CQE() int { return cq.cqe }

// UserContext is the userCtx given to CreateCQ.
func (cq *CQ) UserContext() uint64 { return cq.userCtx }

// Poll fills wc with up to len(wc) completions (one call into C, no
// allocation) and returns how many.
func (cq *CQ) Poll(wc []WC) (int, error) {
	if len(wc) == 0 {
		return 0, nil
	}
	n := len(wc)
	if n > math.MaxInt32 {
		n = math.MaxInt32
	}
	r := C.vibv_poll_cq(cq.cq, C.int(n), (*C.struct_ibv_wc)(unsafe.Pointer(&wc[0])))
	if r < 0 {
		return 0, &Error{Op: "ibv_poll_cq", Err: syscall.Errno(-r)}
	}
	return int(r), nil
}

// ReqNotify arms the CQ: its next completion (solicitedOnly: the next
// solicited or error completion) raises one event on its channel.
func (cq *CQ) ReqNotify(solicitedOnly bool) error {
	s := C.int(0)
	if solicitedOnly {
		s = 1
	}
	return retErr("ibv_req_notify_cq", C.vibv_req_notify_cq(cq.cq, s))
}

// AckEvents acknowledges n events GetCQEvent returned for this CQ (more
// than are outstanding are ignored).
func (cq *CQ) AckEvents(n int) {
	for {
		have := cq.unacked.Load()
		k := int64(n)
		if k > have {
			k = have
		}
		if k <= 0 {
			return
		}
		if cq.unacked.CompareAndSwap(have, have-k) {
			C.vibv_ack_cq_events(cq.cq, C.uint(k))
			return
		}
	}
}

// Destroy acknowledges the CQ's outstanding events and destroys it (its
// QPs must be gone). Idempotent.
func (cq *CQ) Destroy() error {
	cq.destroyOnce.Do(func() {
		if n := cq.unacked.Swap(0); n > 0 {
			C.vibv_ack_cq_events(cq.cq, C.uint(n))
		}
		cq.destroyErr = retErr("ibv_destroy_cq", C.vibv_destroy_cq(cq.cq))
		if cq.destroyErr == nil {
			cq.ctx.cqs.Delete(cq.id)
		}
	})
	return cq.destroyErr
}

// QP is a queue pair with its work-request scratch (C memory sized at
// create time). PostSend and PostRecv each hold a mutex of their own (the
// scratch); different QPs never contend.
type QP struct {
	pd   *PD    // immutable
	num  uint32 // immutable
	caps QPCaps // immutable

	sendMu sync.Mutex // guards q's send scratch; with recvMu, q itself
	recvMu sync.Mutex // guards q's receive scratch
	q      *C.struct_vibv_qp
}

// CreateQP creates an RC QP.
func (pd *PD) CreateQP(init QPInit) (*QP, error) {
	if init.Type != QPTRC {
		return nil, fmt.Errorf("%w: QP type %d (only RC)", ErrInvalid, init.Type)
	}
	if init.SendCQ == nil || init.RecvCQ == nil {
		return nil, fmt.Errorf("%w: QP without send or receive CQ", ErrInvalid)
	}
	var a C.struct_ibv_qp_init_attr
	a.send_cq = init.SendCQ.cq
	a.recv_cq = init.RecvCQ.cq
	a.qp_type = C.enum_ibv_qp_type(init.Type)
	a.cap.max_send_wr = C.uint32_t(init.Caps.MaxSendWR)
	a.cap.max_recv_wr = C.uint32_t(init.Caps.MaxRecvWR)
	a.cap.max_send_sge = C.uint32_t(init.Caps.MaxSendSGE)
	a.cap.max_recv_sge = C.uint32_t(init.Caps.MaxRecvSGE)
	a.cap.max_inline_data = C.uint32_t(init.Caps.MaxInlineData)
	if init.SigAll {
		a.sq_sig_all = 1
	}
	q, err := C.vibv_create_qp(pd.pd, &a)
	if q == nil {
		return nil, &Error{Op: "ibv_create_qp", Err: errnoOf(err)}
	}
	return &QP{
		pd:  pd,
		num: uint32(C.vibv_qp_num(q)),
		caps: QPCaps{
			MaxSendWR:     uint32(a.cap.max_send_wr),
			MaxRecvWR:     uint32(a.cap.max_recv_wr),
			MaxSendSGE:    uint32(a.cap.max_send_sge),
			MaxRecvSGE:    uint32(a.cap.max_recv_sge),
			MaxInlineData: uint32(a.cap.max_inline_data),
		},
		q: q,
	}, nil
}

// Num is the QP number.
func (qp *QP) Num() uint32 { return qp.num }

// Caps are the QP's actual capacities (at least those asked for).
func (qp *QP) Caps() QPCaps { return qp.caps }

// Destroy destroys the QP and frees its scratch; posts after it return
// ErrClosed. Idempotent.
func (qp *QP) Destroy() error {
	qp.sendMu.Lock()
	defer qp.sendMu.Unlock()
	qp.recvMu.Lock()
	defer qp.recvMu.Unlock()
	if qp.q == nil {
		return nil
	}
	if err := retErr("ibv_destroy_qp", C.vibv_destroy_qp(qp.q)); err != nil {
		return err
	}
	qp.q = nil
	return nil
}

// Modify applies the fields of attr that mask names (ibv_modify_qp).
func (qp *QP) Modify(attr *QPAttr, mask QPAttrMask) error {
	var a C.struct_ibv_qp_attr
	attrToC(attr, &a)
	qp.sendMu.Lock()
	defer qp.sendMu.Unlock()
	if qp.q == nil {
		return ErrClosed
	}
	return retErr("ibv_modify_qp", C.vibv_modify_qp(qp.q, &a, C.int(mask)))
}

// Query returns the QP's attributes (those mask names are valid; the
// provider may fill more).
func (qp *QP) Query(mask QPAttrMask) (QPAttr, error) {
	var (
		a    C.struct_ibv_qp_attr
		init C.struct_ibv_qp_init_attr
	)
	qp.sendMu.Lock()
	defer qp.sendMu.Unlock()
	if qp.q == nil {
		return QPAttr{}, ErrClosed
	}
	if err := retErr("ibv_query_qp", C.vibv_query_qp(qp.q, &a, C.int(mask), &init)); err != nil {
		return QPAttr{}, err
	}
	return attrFromC(&a), nil
}

func ahToC(h *AHAttr, c *C.struct_ibv_ah_attr) {
	c.grh.dgid = *(*C.union_ibv_gid)(unsafe.Pointer(&h.DGID))
	c.grh.flow_label = C.uint32_t(h.FlowLabel)
	c.grh.sgid_index = C.uint8_t(h.SGIDIndex)
	c.grh.hop_limit = C.uint8_t(h.HopLimit)
	c.grh.traffic_class = C.uint8_t(h.TrafficClass)
	c.dlid = C.uint16_t(h.DLID)
	c.sl = C.uint8_t(h.SL)
	c.src_path_bits = C.uint8_t(h.SrcPathBits)
	c.static_rate = C.uint8_t(h.StaticRate)
	if h.IsGlobal {
		c.is_global = 1
	}
	c.port_num = C.uint8_t(h.PortNum)
}

func ahFromC(c *C.struct_ibv_ah_attr) AHAttr {
	return AHAttr{
		DGID:         *(*GID)(unsafe.Pointer(&c.grh.dgid)),
		FlowLabel:    uint32(c.grh.flow_label),
		SGIDIndex:    uint8(c.grh.sgid_index),
		HopLimit:     uint8(c.grh.hop_limit),
		TrafficClass: uint8(c.grh.traffic_class),
		DLID:         uint16(c.dlid),
		SL:           uint8(c.sl),
		SrcPathBits:  uint8(c.src_path_bits),
		StaticRate:   uint8(c.static_rate),
		IsGlobal:     c.is_global != 0,
		PortNum:      uint8(c.port_num),
	}
}

func attrToC(q *QPAttr, c *C.struct_ibv_qp_attr) {
	c.qp_state = C.enum_ibv_qp_state(q.QPState)
	c.cur_qp_state = C.enum_ibv_qp_state(q.CurQPState)
	c.path_mtu = C.enum_ibv_mtu(q.PathMTU)
	c.qkey = C.uint32_t(q.QKey)
	c.rq_psn = C.uint32_t(q.RQPSN)
	c.sq_psn = C.uint32_t(q.SQPSN)
	c.dest_qp_num = C.uint32_t(q.DestQPNum)
	c.qp_access_flags = C.uint(q.QPAccessFlags)
	c.cap.max_send_wr = C.uint32_t(q.Cap.MaxSendWR)
	c.cap.max_recv_wr = C.uint32_t(q.Cap.MaxRecvWR)
	c.cap.max_send_sge = C.uint32_t(q.Cap.MaxSendSGE)
	c.cap.max_recv_sge = C.uint32_t(q.Cap.MaxRecvSGE)
	c.cap.max_inline_data = C.uint32_t(q.Cap.MaxInlineData)
	ahToC(&q.AH, &c.ah_attr)
	c.pkey_index = C.uint16_t(q.PKeyIndex)
	c.max_rd_atomic = C.uint8_t(q.MaxRdAtomic)
	c.max_dest_rd_atomic = C.uint8_t(q.MaxDestRdAtomic)
	c.min_rnr_timer = C.uint8_t(q.MinRNRTimer)
	c.port_num = C.uint8_t(q.PortNum)
	c.timeout = C.uint8_t(q.Timeout)
	c.retry_cnt = C.uint8_t(q.RetryCnt)
	c.rnr_retry = C.uint8_t(q.RNRRetry)
}

func attrFromC(c *C.struct_ibv_qp_attr) QPAttr {
	return QPAttr{
		QPState:       QPState(c.qp_state),
		CurQPState:    QPState(c.cur_qp_state),
		PathMTU:       MTU(c.path_mtu),
		QKey:          uint32(c.qkey),
		RQPSN:         uint32(c.rq_psn),
		SQPSN:         uint32(c.sq_psn),
		DestQPNum:     uint32(c.dest_qp_num),
		QPAccessFlags: AccessFlags(c.qp_access_flags),
		Cap: QPCaps{
			MaxSendWR:     uint32(c.cap.max_send_wr),
			MaxRecvWR:     uint32(c.cap.max_recv_wr),
			MaxSendSGE:    uint32(c.cap.max_send_sge),
			MaxRecvSGE:    uint32(c.cap.max_recv_sge),
			MaxInlineData: uint32(c.cap.max_inline_data),
		},
		AH:              ahFromC(&c.ah_attr),
		PKeyIndex:       uint16(c.pkey_index),
		SQDraining:      c.sq_draining != 0,
		MaxRdAtomic:     uint8(c.max_rd_atomic),
		MaxDestRdAtomic: uint8(c.max_dest_rd_atomic),
		MinRNRTimer:     uint8(c.min_rnr_timer),
		PortNum:         uint8(c.port_num),
		Timeout:         uint8(c.timeout),
		RetryCnt:        uint8(c.retry_cnt),
		RNRRetry:        uint8(c.rnr_retry),
	}
}

// PostSend posts wrs, in order, with one call into C: the WRs become an
// ibv_send_wr chain in the QP's scratch (split into chunks of the QP's
// send depth, up to 4096 WRs, when longer) posted with ibv_post_send. WR
// i's scatter list is sges[wrs[i].FirstSGE:][:wrs[i].NumSGE]; SGEs are
// copied, so both slices may be reused once PostSend returns (and, for
// SendInline, so may the data). It returns how many WRs were posted: all
// of them with a nil error, else the index of the first that was not
// (*PostError). It does not allocate.
func (qp *QP) PostSend(wrs []SendWR, sges []SGE) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	if len(wrs) > math.MaxUint32 || len(sges) > math.MaxUint32 {
		return 0, &PostError{Op: "post_send", Reason: "batch too large", Err: ErrInvalid}
	}
	var sp *C.struct_ibv_sge
	if len(sges) > 0 {
		sp = (*C.struct_ibv_sge)(unsafe.Pointer(&sges[0]))
	}
	qp.sendMu.Lock()
	if qp.q == nil {
		qp.sendMu.Unlock()
		return 0, ErrClosed
	}
	r := C.vibv_post_send(qp.q, (*C.struct_vibv_send_wr)(unsafe.Pointer(&wrs[0])), C.uint32_t(len(wrs)), sp, C.uint32_t(len(sges)))
	qp.sendMu.Unlock()
	return postResult("post_send", int64(r))
}

// PostRecv posts receive WRs like PostSend.
func (qp *QP) PostRecv(wrs []RecvWR, sges []SGE) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	if len(wrs) > math.MaxUint32 || len(sges) > math.MaxUint32 {
		return 0, &PostError{Op: "post_recv", Reason: "batch too large", Err: ErrInvalid}
	}
	var sp *C.struct_ibv_sge
	if len(sges) > 0 {
		sp = (*C.struct_ibv_sge)(unsafe.Pointer(&sges[0]))
	}
	qp.recvMu.Lock()
	if qp.q == nil {
		qp.recvMu.Unlock()
		return 0, ErrClosed
	}
	r := C.vibv_post_recv(qp.q, (*C.struct_vibv_recv_wr)(unsafe.Pointer(&wrs[0])), C.uint32_t(len(wrs)), sp, C.uint32_t(len(sges)))
	qp.recvMu.Unlock()
	return postResult("post_recv", int64(r))
}

func postResult(op string, r int64) (int, error) {
	n, code := int(uint64(r)>>32), int32(uint32(r))
	switch code {
	case 0:
		return n, nil
	case C.VIBV_POST_BAD_SGE_RANGE:
		return 0, &PostError{Op: op, Index: n, Reason: "SGE range outside the SGE slice", Err: ErrInvalid}
	case C.VIBV_POST_TOO_MANY_SGE:
		return 0, &PostError{Op: op, Index: n, Reason: "more SGEs than the QP's max", Err: ErrInvalid}
	}
	return n, &PostError{Op: op, Index: n, Err: syscall.Errno(code)}
}
