package engine

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Errors of address translation inside an MR or ring.
var (
	ErrOutOfRange = errors.New("range outside the object")
	ErrNoMemory   = errors.New("device has no guest memory")
)

// extent is a run of guest-physically contiguous pages of an MR.
type extent struct {
	off uint64  // byte offset in the MR where the run starts
	gpa abi.GPA // guest-physical address of that byte
	len uint64
}

// MR is a registered memory region. Immutable after AddMR but for the
// window count (bindMu).
type MR struct {
	Key       uint32 // lkey and rkey
	PD        uint32
	Access    uint32
	IOVA      uint64
	Length    uint64
	PageShift uint // log2 of the size of the registered pages
	// DMA: a DMA MR (REG_MR flag DMA; NewDMAMR): its addresses are
	// guest-physical, translated through the device's current table at
	// each access; it has no extents, pins nothing and is local only.
	DMA bool
	// Fast: a fast registration of an ALLOC_MR MR (a REG_MR WQE; mw.go):
	// its pages are not pinned, so an SGE's range is checked against the
	// device's current table as a DMA MR's is (Local).
	Fast bool

	dev     *RNIC    // the owner, set by AddMR before the MR is reachable
	extents []extent // the MR's bytes as contiguous guest-physical runs

	// With a host NIC (hw.go): the registration, its rkey (Key is the
	// lkey) and the host view of the MR's pages it was made over.
	HW   NICMR
	RKey uint32
	view *memmap.View
	hwMu sync.Mutex // HW and view after AddMR (closeNIC may run twice)

	// Memory windows bound in the MR (mw.go): DEREG_MR, and the
	// invalidation of a fast registration, are refused while any are;
	// retired: the MR left its table, so no window may be bound in it
	// any more. Both protected by bindMu, a leaf.
	bindMu  sync.Mutex
	windows int
	retired bool
}

// NewMR builds an MR over pages of 1<<shift bytes: the MR's first byte is
// at offset iova mod (1<<shift) of pages[0], the following pages are used
// whole, the last up to the MR's end. GPA-adjacent pages are merged into
// one extent, so an MR over contiguous memory costs one extent whatever
// its size. Preconditions (checked by the control path): 12 ≤ shift ≤ 63,
// len(pages) == ceil((iova%(1<<shift) + length)/(1<<shift)), length > 0,
// every page aligned to its size.
func NewMR(key, pd, access uint32, iova, length uint64, pages []abi.GPA, shift uint) *MR {
	m := &MR{Key: key, PD: pd, Access: access, IOVA: iova, Length: length, PageShift: shift}
	size := uint64(1) << shift
	first := iova & (size - 1)
	var off uint64
	for i, p := range pages {
		start := p
		n := size
		if i == 0 {
			start += abi.GPA(first)
			n -= first
		}
		if n > length-off {
			n = length - off
		}
		if k := len(m.extents); k > 0 && m.extents[k-1].gpa+abi.GPA(m.extents[k-1].len) == start {
			m.extents[k-1].len += n
		} else {
			m.extents = append(m.extents, extent{off: off, gpa: start, len: n})
		}
		off += n
		if off >= length {
			break
		}
	}
	return m
}

// NewDMAMR builds a DMA MR (docs/spec.md § Kernel verbs and the GSI QP):
// "REG_MR with flags DMA registers the guest-physical address space
// itself, for local access". access is 0 or LOCAL_WRITE (checked by the
// control path).
func NewDMAMR(key, pd, access uint32) *MR {
	return &MR{Key: key, PD: pd, Access: access, DMA: true}
}

// NumExtents returns the number of guest-physically contiguous runs the
// MR is kept as (what it costs the device: the page list is not kept).
func (m *MR) NumExtents() int { return len(m.extents) }

// Extents calls fn for each guest-physically contiguous run of the MR's
// bytes, in order (at most one per page; adjacent pages merged); fn's
// error stops the walk and is returned.
func (m *MR) Extents(fn func(gpa abi.GPA, n uint64) error) error {
	for _, e := range m.extents {
		if err := fn(e.gpa, e.len); err != nil {
			return err
		}
	}
	return nil
}

// Contains reports whether [addr, addr+n) lies within the MR's IOVA range;
// for a DMA MR, whether it is a range of the 64-bit guest-physical space
// (whether guest memory holds it is the table's to say: Local, Range).
func (m *MR) Contains(addr, n uint64) bool {
	if m.DMA {
		return n <= math.MaxUint64-addr
	}
	if addr < m.IOVA {
		return false
	}
	off := addr - m.IOVA
	return off <= m.Length && n <= m.Length-off
}

// Range calls fn with host views of [addr, addr+n) of the MR, in order, one
// per guest-physically contiguous run (split further where guest memory
// regions split). It checks the whole range first; fn's error stops the walk
// and is returned. Allocation-free.
func (m *MR) Range(t *memmap.Table, addr, n uint64, fn func([]byte) error) error {
	return m.rangeOver(t, addr, n, fn, false)
}

// RangeWrite is Range for a writer: fn writes into the views, and each is
// marked in t's dirty log after fn returns (memmap.Table.ForEachWrite).
// Every copy into guest memory through an MR goes through it (dirty.go).
func (m *MR) RangeWrite(t *memmap.Table, addr, n uint64, fn func([]byte) error) error {
	return m.rangeOver(t, addr, n, fn, true)
}

// rangeOver is Range, or RangeWrite with write.
func (m *MR) rangeOver(t *memmap.Table, addr, n uint64, fn func([]byte) error, write bool) error {
	if !m.Contains(addr, n) {
		return ErrOutOfRange
	}
	if n == 0 {
		return nil
	}
	if m.DMA {
		// ForEach checks the whole range in the current table before
		// the first view.
		if write {
			return t.ForEachWrite(abi.GPA(addr), n, fn)
		}
		return t.ForEach(abi.GPA(addr), n, fn)
	}
	off := addr - m.IOVA
	i := sort.Search(len(m.extents), func(i int) bool { return m.extents[i].off+m.extents[i].len > off })
	for ; n > 0 && i < len(m.extents); i++ {
		e := &m.extents[i]
		in := off - e.off
		k := e.len - in
		if k > n {
			k = n
		}
		var err error
		if write {
			err = t.ForEachWrite(e.gpa+abi.GPA(in), k, fn)
		} else {
			err = t.ForEach(e.gpa+abi.GPA(in), k, fn)
		}
		if err != nil {
			return err
		}
		off += k
		n -= k
	}
	return nil
}

// Local reports whether an SGE [addr, addr+n) of a local access (the
// QP's own gather or scatter list) lies within the MR: Contains, and for
// a DMA MR "[addr, addr+length) must lie in guest memory as the current
// memory table maps it when the device accesses it, else the WQE
// completes with LOC_PROT_ERR". t is the MR's device's table.
func (m *MR) Local(t *memmap.Table, addr, n uint64) bool {
	if !m.Contains(addr, n) {
		return false
	}
	if (!m.DMA && !m.Fast) || n == 0 {
		return true
	}
	// A fast registration pins nothing either: "it translates its pages
	// through the current memory table at each access, as for a DMA MR".
	return t != nil && m.Range(t, addr, n, func([]byte) error { return nil }) == nil
}

// Remote reports whether the MR may be reached by a remote access at all:
// a DMA MR "is never reached remotely (its rkey is not accepted for any
// remote access)", whatever its access flags.
func (m *MR) Remote() bool { return !m.DMA }

// Ring is a queue of fixed-size slots laid over guest pages (a QP's send
// or receive queue, a CQ). Slots never straddle pages: the stride is a
// power of two no larger than a page. Immutable.
type Ring struct {
	Pages  []abi.GPA
	Depth  uint32 // slots, a power of two
	Stride uint32 // bytes per slot, a power of two ≤ PageSize
}

// Slot returns the host view of slot i mod Depth.
func (r *Ring) Slot(t *memmap.Table, i uint32) ([]byte, error) {
	i &= r.Depth - 1
	byteOff := uint64(i) * uint64(r.Stride)
	page := byteOff / abi.PageSize
	if page >= uint64(len(r.Pages)) {
		return nil, ErrOutOfRange
	}
	return t.Slice(r.Pages[page]+abi.GPA(byteOff%abi.PageSize), uint64(r.Stride))
}

// slotGPA returns the guest-physical address of slot i mod Depth (for the
// dirty log; Slot has checked it when the slot was written).
func (r *Ring) slotGPA(i uint32) abi.GPA {
	i &= r.Depth - 1
	byteOff := uint64(i) * uint64(r.Stride)
	page := byteOff / abi.PageSize
	if page >= uint64(len(r.Pages)) {
		return 0
	}
	return r.Pages[page] + abi.GPA(byteOff%abi.PageSize)
}

// CQ is a completion queue in guest memory.
type CQ struct {
	Num       uint32
	Dev       *RNIC // owner: its guest memory holds the ring and record
	Ring      Ring  // Stride == CQESize
	Record    abi.GPA
	ArmRecord bool // the record is an abi.CQArmRecord: the driver arms through its arm word

	Users atomic.Int32 // QPs using the CQ (control path: DESTROY_CQ is BUSY while > 0)

	// Counted on error paths only (counters.go): error CQEs pushed to the
	// CQ (written or lost), and CQEs lost (overrun, or the CQ's memory
	// gone).
	errCQEs, lostCQEs atomic.Uint64

	mu            sync.Mutex
	pi            uint32 // next CQE index (protected by mu)
	armed         bool   // REQ_NOTIFY_CQ pending (protected by mu)
	solicitedOnly bool   // protected by mu
	overrun       bool   // protected by mu
	dead          bool   // destroyed (protected by mu)
	written       uint64 // CQEs written since creation (protected by mu; pi wraps)
	unpublished   bool   // pi advanced past the record's (lazy push; protected by mu)
	ciSeen        uint32 // the record's ci as last read (protected by mu)
	// lazy lists the QPs whose completions were pushed lazily since pi
	// was last stored: their consumer indices are stored before it
	// (ci.go; protected by mu).
	lazy []*QP

	// Arming through the record (ArmRecord; protected by mu): armSeen is the
	// arm word the device last acted on; pendAny and pendSolicited say
	// whether completions written since pi was last stored include any, and
	// a solicited or error one.
	armSeen       uint32
	pendAny       bool
	pendSolicited bool

	// With a host NIC (hw.go): the host CQ whose completions become this
	// CQ's entries, polled under hwMu into hwWC.
	HW   NICCQ
	hwMu sync.Mutex
	hwWC []NICWC
	// hwFree is the host CQ's room: the completions it can still take
	// from work requests posted on QPs using it (hw.go).
	hwFree    atomic.Int64
	hwWaiting atomic.Bool // a pass found no room: the next poll wakes the queues
}

// QP is a queue pair: RC, or UD (UD). The exported fields are immutable
// after AddQP.
type QP struct {
	Num           uint32
	PD            uint32
	Dev           *RNIC
	SendCQ        *CQ
	RecvCQ        *CQ
	SQ, RQ        Ring
	Record        abi.GPA
	MaxSendSGE    uint32
	MaxRecvSGE    uint32
	MaxInline     uint32
	SigAll        bool
	DoorbellQueue int
	RQNotify      bool // the record is an abi.QPNotifyRecord (CREATE_QP flag RQ_NOTIFY); immutable
	// UD: a UD QP (qp_type 4): it sends datagrams to the WQE's AH and
	// QP number and receives from any UD QP with its Q_Key (ud.go).
	UD bool
	// GSI: the device's GSI QP (qp_type 1; UD is set too): peers address
	// it as QP 1 and its datagrams carry source QP 1 (ud.go).
	GSI bool
	// SRQ: the QP takes its receive WQEs from this SRQ of its device and
	// has no receive queue of its own (RQ is empty, MaxRecvSGE 0).
	SRQ *SRQ

	// With a host NIC (hw.go): the host QP the guest's WQEs are posted to
	// and what the engine keeps of them until they complete.
	HW NICQP
	hw *hwQP

	// sqMu serialises the requester side: the engine of DoorbellQueue holds
	// it while it works on the QP, Modify holds it to discard WQEs at
	// RESET, RemoveQP to wait for the engine's pass to end.
	sqMu sync.Mutex

	mu          sync.Mutex
	attr        abi.QPAttr // current attributes; attr.QPState is the state (protected by mu)
	peer        *RNIC      // resolved at INIT→RTR (protected by mu)
	sgid        [16]byte   // the GID the QP sends from, resolved with peer (protected by mu)
	net         *netQP     // connected over the network at INIT→RTR, else nil (protected by mu)
	udNet       *udNet     // a UD QP attached to the network at INIT→RTR, else nil (protected by mu)
	dead        bool       // destroyed (protected by mu)
	lostPeer    bool       // the peer device was reset: outstanding sends end with RETRY_EXC_ERR (protected by mu)
	lostEnd     uint32     // sq_pi when the peer was lost, if lostHaveEnd (protected by mu)
	lostHaveEnd bool       // protected by mu

	// Requester side (protected by sqMu).
	sqCI     uint32      // next send WQE to execute
	sqPISeen uint32      // the record's sq_pi as last read
	rnrWait  int64       // monotonic ns (see monoNow) before which the head WQE must not be retried
	rnrTries uint32      // RNR retries of the head WQE so far
	rnrTimer *time.Timer // wakes the engine when rnrWait passes; created at the first RNR
	retryExc bool        // send WQEs before retryEnd complete with RETRY_EXC_ERR (peer lost)
	retryEnd uint32      // see retryExc
	sc       *scratch    // per-QP scratch, allocated on first use

	// fenceWaits counts the waits of the head WQE for a fenced peer
	// (fence.go): each doubles the backstop delay (protected by sqMu).
	fenceWaits uint8

	// Published once per poll pass rather than per WQE (protected by
	// sqMu): the record's sq_ci, the send CQ's pi and the device counters.
	sqCIPub   uint32 // sq_ci as last handed to storeCI
	cqPending bool   // the send CQ has lazily pushed entries
	// peerPend is a same-host responder QP whose receive completions this
	// QP's messages pushed lazily (respond.go): publish publishes them.
	peerPend  *QP
	opsPend   [7]uint32 // successful WQEs by opcode, not yet in RNIC.ops
	bytesPend uint64    // bytes moved, not yet in RNIC.bytesMoved

	// rnrKick: the responder's driver posted a receive after this QP's
	// head WQE met an empty receive queue, so the RNR wait ends now
	// (set by the responder's engine, consumed by this QP's pass).
	rnrKick atomic.Bool

	// The record's consumer indices (ci.go).
	ciState

	// ctr: the QP's error counters, made by its first error
	// (counters.go).
	ctr atomic.Pointer[qpCounters]

	// Responder side: the receive queue is consumed by peers' engines, and
	// every remote operation targeting this QP runs under rqMu, so that
	// RemoveQP, after taking it, knows no responder work is in flight.
	rqMu     sync.Mutex
	rqCI     uint32 // next receive WQE (protected by rqMu)
	rqPISeen uint32 // the record's rq_pi as last read by the responder (protected by rqMu)

	// rnrWaiter is the requester QP whose message found the receive queue
	// empty, until this QP's engine sees a receive posted and kicks it
	// (written under rqMu; read without it as a hint).
	rnrWaiter atomic.Pointer[QP]
	// rqFlushing: the QP is in ERR and its receives are being flushed
	// (protected by rqMu).
	rqFlushing bool
	// rqNotifyPub is the record's rq_notify word as last stored (RQNotify
	// QPs only; protected by rqMu): 1 while rqFlushing or rnrWaiter is set.
	rqNotifyPub uint32
	// With an SRQ (protected by rqMu): a WQE consumed for a message its
	// requester abandoned (srq.go), and whether QP_LAST_WQE_REACHED was
	// posted since the QP last left RESET.
	srqStash *stash
	lastWQE  bool
}

// recvPD is the PD whose MRs the QP's receive SGEs name: its SRQ's, if it
// has one ("its PD need not be the QP's, as in verbs").
func (q *QP) recvPD() uint32 {
	if q.SRQ != nil {
		return q.SRQ.PD
	}
	return q.PD
}

// recvDepth is how many receive WQEs the QP may hold consumed at once.
func (q *QP) recvDepth() uint32 {
	if q.SRQ != nil {
		return q.SRQ.Ring.Depth
	}
	return q.RQ.Depth
}

// State returns the QP's state.
func (q *QP) State() uint32 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.attr.QPState
}

// Attr returns a copy of the QP's attributes.
func (q *QP) Attr() abi.QPAttr {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.attr
}

func (q *QP) String() string { return fmt.Sprintf("qp %d", q.Num) }
