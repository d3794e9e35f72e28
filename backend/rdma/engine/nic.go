package engine

import (
	"errors"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The RNIC seam. A device's objects, rings, records, CQEs and events are
// the virtio device's (docs/spec.md), the same whichever RNIC executes its
// work. Who executes it is the seam: the software RNIC of this package
// ("soft": the requester and responder in engine.go and respond.go, over
// the Fabric and its Network) or a host RDMA NIC ("verbs": a NIC, given to
// the device with SetNIC, that package backend/rdma/hostnic implements
// over rdma-core's libibverbs). With a NIC, a guest PD, MR, CQ and QP are
// each backed by the NIC's object of that kind (the HW fields), the QP
// numbers and keys the guest sees are the NIC's, the NIC checks keys,
// access and ranges and moves the data, and the engine's part is the
// guest's rings: it posts the WQEs it reads to the host QP and turns the
// host's completions into CQEs (hw.go).

// ErrNICObject reports that the host NIC refused to create an object.
var ErrNICObject = errors.New("host NIC refused the object")

// NIC is a host RDMA NIC executing a device's work. Its methods may be
// called from any goroutine.
type NIC interface {
	// Name is the RNIC as vrdmad's --rnic names it ("verbs:rxe0:1").
	Name() string
	AllocPD() (NICPD, error)
	// CreateCQ creates a host CQ of at least depth entries. notify is
	// called (from a goroutine of the NIC's) after a completion arrives
	// on it; the NIC keeps the CQ armed.
	CreateCQ(depth uint32, notify func()) (NICCQ, error)
	// HostGIDIndex returns the index in the host port's GID table of gid.
	HostGIDIndex(gid [16]byte) (int, bool)
	// Watch calls fn with abi.EventPortActive, abi.EventPortError or
	// abi.EventDeviceFatal when the NIC's port or device changes, until
	// stop is called.
	Watch(fn func(event uint32)) (stop func())
}

// NICPD is a host protection domain.
type NICPD interface {
	// RegMR registers [addr, addr+length) of this process with the NIC at
	// iova: the NIC then translates iova … iova+length to those pages.
	RegMR(addr uintptr, length, iova uint64, access uint32) (NICMR, error)
	CreateQP(init NICQPInit) (NICQP, error)
	Close() error
}

// NICMR is a host memory registration.
type NICMR interface {
	Keys() (lkey, rkey uint32)
	Close() error
}

// NICCQ is a host completion queue.
type NICCQ interface {
	// Poll fills wc with up to len(wc) completions and returns how many.
	Poll(wc []NICWC) (int, error)
	// Depth is how many completions the CQ holds (at least what
	// CreateCQ asked).
	Depth() uint32
	Close() error
}

// NICQPInit is what a host RC QP is created with.
type NICQPInit struct {
	SendCQ, RecvCQ         NICCQ
	MaxSendWR, MaxRecvWR   uint32
	MaxSendSGE, MaxRecvSGE uint32
	MaxInline              uint32
}

// NICQP is a host RC QP. Post calls for one QP come from one goroutine at a
// time (the engine's pass over the QP, under sqMu).
type NICQP interface {
	Num() uint32
	// Modify applies a validated MODIFY_QP whose SGIDIndex the engine has
	// already translated to the host's GID table (NIC.HostGIDIndex).
	Modify(a *abi.QPAttr) error
	// PostSend posts wrs, whose SGEs are sges[w.FirstSGE:][:w.NumSGE], as
	// one chain, and returns how many were posted (all, or those before
	// the one the NIC refused, with the error).
	PostSend(wrs []NICSendWR, sges []abi.SGE) (int, error)
	PostRecv(wrs []NICRecvWR, sges []abi.SGE) (int, error)
	Close() error
}

// NICSendWR is a send work request for a host QP, in the device's terms
// (abi.WROp*, abi.WRFlag*); the NIC maps them to its own.
type NICSendWR struct {
	WRID       uint64
	RemoteAddr uint64
	CompareAdd uint64
	Swap       uint64
	// Inline data: InlineLen bytes at host address Inline, valid during
	// the post (INLINE flag).
	Inline    uintptr
	InlineLen uint32
	RKey      uint32
	Imm       uint32 // as the WQE holds it (the bytes travel unchanged)
	FirstSGE  uint32
	NumSGE    uint16
	Opcode    uint8
	Flags     uint8
}

// NICRecvWR is a receive work request for a host QP.
type NICRecvWR struct {
	WRID     uint64
	FirstSGE uint32
	NumSGE   uint32
}

// NICWC is a host completion in the device's terms (abi.WCStatus,
// abi.WCOp*, abi.WCFlag*).
type NICWC struct {
	WRID      uint64
	Status    abi.WCStatus
	Opcode    uint8
	WCFlags   uint16
	QPNum     uint32
	ByteLen   uint32
	Imm       uint32
	SrcQP     uint32
	VendorErr uint32
}

// SetNIC makes the device's work run on nic, with gids the GID table its
// guest sees (index i of the device's table is gids[i]; each must be in
// the host port's table). Call it before any object exists; a device with
// a NIC belongs to no Fabric.
func (d *RNIC) SetNIC(nic NIC, gids [][16]byte) {
	stop := nic.Watch(func(ev uint32) {
		// Handle 1: the port (docs/spec.md § Event queue).
		d.postEvent(ev, 1)
	})
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nic, d.nicStop = nic, stop
	d.nicGIDs = append([][16]byte(nil), gids...)
	d.nicTable = make([][16]byte, len(gids))
	copy(d.nicTable, gids)
}

// CloseNIC stops the device's watch of its NIC's events (the device goes
// away; its objects are gone already).
func (d *RNIC) CloseNIC() {
	d.mu.Lock()
	stop := d.nicStop
	d.nicStop = nil
	d.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// NIC returns the device's host NIC, or nil for the software RNIC.
func (d *RNIC) NIC() NIC {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.nic
}

// nicGIDAt is GIDAt for a device with a NIC.
func (d *RNIC) nicGIDAt(index int) ([16]byte, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if index < 0 || index >= len(d.nicTable) || d.nicTable[index] == ([16]byte{}) {
		return [16]byte{}, false
	}
	return d.nicTable[index], true
}

// nicSetGID is SetGID for a device with a NIC: the guest may fill an entry
// with one of the GIDs the operator gave it (its table after a reset), at
// any index; anything else is ErrGIDNotAllowed.
func (d *RNIC) nicSetGID(index int, gid [16]byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if index < 0 || index >= abi.GIDTableLen {
		return ErrGIDIndex
	}
	allowed := false
	for _, g := range d.nicGIDs {
		allowed = allowed || g == gid
	}
	if !allowed {
		return ErrGIDNotAllowed
	}
	for len(d.nicTable) <= index {
		d.nicTable = append(d.nicTable, [16]byte{})
	}
	d.nicTable[index] = gid
	return nil
}

// nicClearGID is ClearGID for a device with a NIC.
func (d *RNIC) nicClearGID(index int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if index < 0 || index >= len(d.nicTable) || d.nicTable[index] == ([16]byte{}) {
		return ErrGIDIndex
	}
	d.nicTable[index] = [16]byte{}
	return nil
}

// nicResetGIDs is ResetGIDs for a device with a NIC.
func (d *RNIC) nicResetGIDs() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nicTable = append(d.nicTable[:0], d.nicGIDs...)
}
