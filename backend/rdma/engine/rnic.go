package engine

import (
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// EventSink posts one event on the device's event queue. It may drop the
// event if the driver has no buffer posted. The engine calls it from any
// goroutine, possibly with engine locks held (see the lock order in doc.go):
// it must not call back into the engine.
type EventSink func(ev abi.Event)

// Stats are a device's data-path counters.
type Stats struct {
	BytesMoved       uint64                  // payload bytes copied by executed WQEs (as requester)
	Ops              [7]uint64               // executed send WQEs by send opcode
	CompletionErrors map[abi.WCStatus]uint64 // error CQEs (written or lost) by wc status
	EventsDropped    uint64                  // events raised while no EventSink was attached
	// WrongPeer counts requests that reached one of the device's QPs from
	// a QP it is not connected to (another tenant's, say): each was
	// answered as one to a QP that does not exist and touched nothing.
	WrongPeer uint64
	// UDDropped counts UD datagrams that reached the device and were
	// dropped: to a QP that does not exist, is not UD, is not in RTR or
	// RTS, holds another Q_Key or has no receive WQE.
	UDDropped uint64
	// FenceHeld counts the times a send WQE of the device was held at
	// its send queue's head because its same-host peer was fenced
	// (fence.go: a migration's suspended source, a paused VM); each
	// retry that finds the fence counts again.
	FenceHeld uint64
}

// maxWCStatus bounds the wc statuses counted in Stats.
const maxWCStatus = 32

// RNIC is one RDMA device's instance of the software RNIC: its objects,
// its guest memory while a front-end is connected, and its counters.
type RNIC struct {
	fabric *Fabric       // immutable
	gid    [16]byte      // immutable: the port GID, entry 0 of gids after a reset
	log    *logrus.Entry // immutable

	gids    [abi.GIDTableLen]gidSlot // the GID table (protected by fabric.mu)
	netGIDs [][16]byte               // the device's own network GIDs, if any (immutable after SetNetGIDs)
	allowed []netip.Prefix           // what ADD_GID may claim besides the port GID (protected by fabric.mu)

	// A host NIC executing the device's work (nic.go), or nil for the
	// software RNIC; set once by SetNIC before any object exists.
	nic      NIC
	nicStop  func()     // ends the watch of the NIC's events (protected by mu)
	nicGIDs  [][16]byte // the GIDs the operator gave the device (protected by mu)
	nicTable [][16]byte // its GID table as the guest filled it (protected by mu)

	mu     sync.RWMutex
	mem    *memmap.Memory // protected by mu; nil while detached
	events EventSink      // protected by mu
	wake   func(dbq int)  // protected by mu
	// The registry (registry.go): every object of the device, by handle.
	pds   map[uint32]*PD  // protected by mu
	mrs   map[uint32]*MR  // protected by mu
	cqs   map[uint32]*CQ  // protected by mu
	qps   map[uint32]*QP  // protected by mu
	ahs   map[uint32]*AH  // protected by mu
	srqs  map[uint32]*SRQ // protected by mu
	byDBQ map[int][]*QP   // protected by mu; each slice is immutable (copy on write)
	// srqByDBQ: the SRQs by doorbell queue, whose poll kicks their
	// waiters (protected by mu; each slice is immutable).
	srqByDBQ map[int][]*SRQ
	// Memory windows and ALLOC_MR MRs by index (bits 8–31 of their
	// keys, which never change), and how many ordinary MRs' keys hold
	// each index: an index names one object of the three (protected by
	// mu; mw.go).
	mws   map[uint32]*MW
	frmrs map[uint32]*FRMR
	mrIdx map[uint32]int
	gsi   *QP           // the device's GSI QP, which peers reach as QP 1 (protected by mu)
	rotor atomic.Uint32 // where PollBudget starts among a queue's QPs
	gen   atomic.Uint64 // bumped after an MR or QP leaves the tables (keyCache)
	seq   uint32        // handle sequence (protected by mu)

	bytesMoved    atomic.Uint64
	ops           [7]atomic.Uint64
	wcErrors      [maxWCStatus]atomic.Uint64
	eventsDropped atomic.Uint64
	wrongPeer     atomic.Uint64
	udDropped     atomic.Uint64
	fenceHeld     atomic.Uint64
	// mtu is the port's active MTU in bytes, the longest UD message
	// (SetActiveMTU; 0: 4096).
	mtu atomic.Uint32

	// fenced: no same-host request writes into the device (fence.go);
	// set by SetFence and Handoff, read under the responder QP's rqMu.
	// migratedOut: the device's identity moved to a migration's
	// destination (Fabric.Handoff); it stays fenced.
	fenced      atomic.Bool
	migratedOut atomic.Bool
}

// NewRNIC returns an RNIC with GID gid on fabric f. It does not register
// it: call f.Register. A nil log discards messages.
func NewRNIC(f *Fabric, gid [16]byte, log *logrus.Entry) *RNIC {
	if log == nil {
		l := logrus.New()
		l.SetLevel(logrus.PanicLevel)
		log = logrus.NewEntry(l)
	}
	return &RNIC{
		fabric:   f,
		gid:      gid,
		log:      log,
		pds:      make(map[uint32]*PD),
		mrs:      make(map[uint32]*MR),
		cqs:      make(map[uint32]*CQ),
		qps:      make(map[uint32]*QP),
		ahs:      make(map[uint32]*AH),
		srqs:     make(map[uint32]*SRQ),
		mws:      make(map[uint32]*MW),
		frmrs:    make(map[uint32]*FRMR),
		mrIdx:    make(map[uint32]int),
		srqByDBQ: make(map[int][]*SRQ),
		byDBQ:    make(map[int][]*QP),
		seq:      randomSeq(),
	}
}

// SetNetGIDs gives the device network GIDs of its own (the host
// addresses it may send from), instead of the fabric's; none keeps the
// fabric's. Call it before Fabric.Register.
func (d *RNIC) SetNetGIDs(gids [][16]byte) {
	if len(gids) > 0 {
		d.netGIDs = append([][16]byte(nil), gids...)
	}
}

// SetAllowedGIDs gives the device the addresses its operator assigned
// it: ADD_GID may then claim a GID within these prefixes (an IPv4 prefix
// covers the IPv4-mapped GIDs of its addresses), besides the port GID and
// the device's network GIDs, which it always may. None (the default)
// allows nothing more. Entries already in the table stay: a GID that
// leaves the assignment is the operator's to remove (a device reset).
func (d *RNIC) SetAllowedGIDs(prefixes []netip.Prefix) {
	var allowed []netip.Prefix
	for _, p := range prefixes {
		allowed = append(allowed, p.Masked())
	}
	if d.fabric != nil {
		d.fabric.mu.Lock()
		defer d.fabric.mu.Unlock()
	}
	d.allowed = allowed
}

// AllowedGIDs returns what SetAllowedGIDs gave.
func (d *RNIC) AllowedGIDs() []netip.Prefix {
	if d.fabric != nil {
		d.fabric.mu.RLock()
		defer d.fabric.mu.RUnlock()
	}
	return append([]netip.Prefix(nil), d.allowed...)
}

// SetActiveMTU sets the port's active MTU (abi.MTU256 … abi.MTU4096), which
// bounds a UD message. The default is abi.MTU4096.
func (d *RNIC) SetActiveMTU(mtu uint32) {
	if mtu >= abi.MTU256 && mtu <= abi.MTU4096 {
		d.mtu.Store(128 << mtu)
	}
}

// activeMTU is the port's active MTU in bytes.
func (d *RNIC) activeMTU() uint64 {
	if v := d.mtu.Load(); v != 0 {
		return uint64(v)
	}
	return 4096
}

// GID returns the device's GID.
func (d *RNIC) GID() [16]byte { return d.gid }

// Attach gives the device its guest memory and hooks while a front-end is
// connected: events posts to the event queue; wake(dbq) makes the engine of
// doorbell queue dbq run Poll soon. Any of them may be nil.
func (d *RNIC) Attach(mem *memmap.Memory, events EventSink, wake func(dbq int)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mem, d.events, d.wake = mem, events, wake
}

// Detach forgets the memory and hooks given to Attach (call it after Reset).
// Peers then find the device unreachable.
func (d *RNIC) Detach() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mem, d.events, d.wake = nil, nil, nil
}

// acquire returns the device's current table with a reference, or nil if
// the device is detached.
func (d *RNIC) acquire() *memmap.Table {
	d.mu.RLock()
	m := d.mem
	d.mu.RUnlock()
	if m == nil {
		return nil
	}
	return m.Acquire()
}

// postEvent raises an event on the device's event queue.
func (d *RNIC) postEvent(typ, handle uint32) {
	d.mu.RLock()
	ev := d.events
	d.mu.RUnlock()
	if ev == nil {
		d.eventsDropped.Add(1)
		return
	}
	ev(abi.Event{Type: typ, Handle: handle})
}

// wakeQueue asks the engine of doorbell queue dbq to poll soon.
func (d *RNIC) wakeQueue(dbq int) {
	d.mu.RLock()
	w := d.wake
	d.mu.RUnlock()
	if w != nil {
		w(dbq)
	}
}

// loseQPs tells the peers of ours, QPs of d about to be destroyed by
// Reset, that they are gone: every peer QP connected to one of them moves
// to ERR with a QP_FATAL event, and its send WQEs outstanding now will
// complete with RETRY_EXC_ERR.
func (d *RNIC) loseQPs(ours []*QP) {
	byNum := make(map[uint32]bool, len(ours))
	for _, q := range ours {
		byNum[q.Num] = true
	}
	var devs []*RNIC
	if d.fabric != nil {
		devs = d.fabric.devices()
	}
	for _, pd := range devs {
		if pd == d {
			continue
		}
		pt := pd.acquire()
		for _, pq := range pd.allQPs() {
			// The send WQEs posted now are the outstanding ones.
			end, haveEnd := uint32(0), false
			if pt != nil {
				end, haveEnd = loadSQPI(pt, pq) // guarded: fault.go
			}
			pq.mu.Lock()
			hit := !pq.dead && pq.peer == d && byNum[pq.attr.DestQPNum] &&
				(pq.attr.QPState == abi.QPSRTR || pq.attr.QPState == abi.QPSRTS)
			if hit {
				pq.attr.QPState = abi.QPSErr
				pq.lostPeer, pq.lostEnd, pq.lostHaveEnd = true, end, haveEnd
			}
			pq.mu.Unlock()
			if hit {
				pd.postEvent(abi.EventQPFatal, pq.Num)
				pd.wakeQueue(pq.DoorbellQueue)
			}
		}
		if pt != nil {
			pt.Release()
		}
	}
}

// Stats returns the device's counters.
func (d *RNIC) Stats() Stats {
	s := Stats{
		BytesMoved:       d.bytesMoved.Load(),
		CompletionErrors: make(map[abi.WCStatus]uint64),
		EventsDropped:    d.eventsDropped.Load(),
		WrongPeer:        d.wrongPeer.Load(),
		UDDropped:        d.udDropped.Load(),
		FenceHeld:        d.fenceHeld.Load(),
	}
	for i := range s.Ops {
		s.Ops[i] = d.ops[i].Load()
	}
	for i := range d.wcErrors {
		if n := d.wcErrors[i].Load(); n != 0 {
			s.CompletionErrors[abi.WCStatus(i)] = n
		}
	}
	return s
}

// SetGID writes entry index of the device's GID table (ADD_GID); see
// Fabric.SetGID.
func (d *RNIC) SetGID(index int, gid [16]byte) error {
	if d.NIC() != nil {
		return d.nicSetGID(index, gid)
	}
	if d.fabric == nil {
		return ErrGIDIndex
	}
	return d.fabric.SetGID(d, index, gid)
}

// ClearGID empties entry index of the device's GID table (DEL_GID).
func (d *RNIC) ClearGID(index int) error {
	if d.NIC() != nil {
		return d.nicClearGID(index)
	}
	if d.fabric == nil {
		return ErrGIDIndex
	}
	return d.fabric.ClearGID(d, index)
}

// GIDAt returns entry index of the device's GID table and whether it holds
// a GID. A device on no fabric has its port GID at entry 0 only.
func (d *RNIC) GIDAt(index int) ([16]byte, bool) {
	if d.NIC() != nil {
		return d.nicGIDAt(index)
	}
	if d.fabric == nil {
		return d.gid, index == 0
	}
	return d.fabric.GIDAt(d, index)
}

// ResetGIDs returns the GID table to its state after a device reset: the
// port GID at entry 0, the rest empty.
func (d *RNIC) ResetGIDs() {
	if d.NIC() != nil {
		d.nicResetGIDs()
		return
	}
	if d.fabric != nil {
		d.fabric.ResetGIDs(d)
	}
}
