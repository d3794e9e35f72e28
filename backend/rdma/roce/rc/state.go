package rc

import (
	"errors"
	"fmt"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// A connection's state as data (live upgrade of vrdmad, issue 29): what
// QP.Freeze exports and Restore takes up in another process, on the
// sockets the new process adopted (package hostnet). It holds what the
// protocol needs to go on where it stopped: the negotiated attributes, the
// requester's PSNs and its outstanding work requests, the responder's
// expected PSN, MSN, the message it is placing, its queued READ responses
// and atomic ACKs and its replay cache. The new QP goes back to the oldest
// unacknowledged PSN (go-back-N, as after a timeout): what was in flight is
// sent again with its PSNs, and the peer sees only duplicates, which it
// answers. Not carried, because the protocol rebuilds it: the congestion
// window (it starts as on a new QP), the retry and RNR counts and timers,
// the coalesced ACK (a re-ACK of the last PSN received replaces it), the
// sequence-NAK state, the counters.
//
// The state is input: Restore validates every field (Validate) as Post
// and Receive validate what a guest and a peer send, and the local memory
// and remote regions it names are resolved again through the Host.

// ErrConnState: a ConnState Restore refuses, wrapped with what is wrong.
var ErrConnState = errors.New("rc: invalid connection state")

// ErrFrozen: the QP is frozen (Freeze); it takes no work until Thaw.
var ErrFrozen = errors.New("rc: QP frozen")

// Bounds of the local memory a WQEState describes.
const (
	MaxStateSGEs   = 1024
	MaxStateInline = 64 << 10
	// maxTimeout bounds a restored retransmit timeout (MODIFY_QP's
	// largest, code 31, is about 2.4 hours).
	maxTimeout = 3 * time.Hour
)

// ConnState is a connected QP's transport state. Every PSN is 24 bits.
type ConnState struct {
	// QPN is the local QP number, DestQPN the peer's (24 bits).
	QPN     uint32 `json:"qpn"`
	DestQPN uint32 `json:"dest_qpn"`
	// PMTU is the path MTU in bytes: 256, 512, 1024, 2048 or 4096.
	PMTU int `json:"pmtu"`
	// SQSize bounds the outstanding send work requests (1 … 65536).
	SQSize int `json:"sq_size"`
	// TimeoutNS is the retransmit timeout in nanoseconds (1 ns … 3 hours);
	// RetryCnt (0-7) the retries after timeouts, RNRRetry (0-7, 7
	// without limit) those after RNR NAKs; MinRNRTimer (0-31) the RNR
	// timer code the responder sends.
	TimeoutNS   int64 `json:"timeout_ns"`
	RetryCnt    int   `json:"retry_cnt"`
	RNRRetry    int   `json:"rnr_retry"`
	MinRNRTimer uint8 `json:"min_rnr_timer"`
	// MaxRdAtomic bounds the READs and atomics in flight as requester,
	// MaxDestRdAtomic those the responder queues and remembers (1 …
	// 65536 each).
	MaxRdAtomic     int `json:"max_rd_atomic"`
	MaxDestRdAtomic int `json:"max_dest_rd_atomic"`
	// Window bounds the packets in flight (1 … 1<<20), Burst those one
	// call sends (1 … 1<<20).
	Window int `json:"window"`
	Burst  int `json:"burst"`
	// Started: the QP reached RTS (its requester's attributes are set
	// and it takes work). False: RTR, the requester is idle (no work
	// requests) and the owner calls Start later.
	Started bool `json:"started"`
	// Frozen: the QP was taken frozen for a live migration (its device
	// suspended with the VM; Freeze) and Restore makes it frozen: it
	// sends and takes nothing until its owner's Thaw, when the VM runs
	// at the destination. False (a live upgrade): it runs once its
	// endpoint does.
	Frozen bool `json:"frozen,omitempty"`

	// Local and Peer are the addresses the connection's packets go
	// between (netip's "addr:port" text); PeerSourcePort is the source
	// port learned from the peer (0: none learned yet). Package udp
	// fills them in and checks them; this package ignores them.
	Local          string `json:"local,omitempty"`
	Peer           string `json:"peer,omitempty"`
	PeerSourcePort uint16 `json:"peer_source_port,omitempty"`

	Requester RequesterState `json:"requester"`
	Responder ResponderState `json:"responder"`
}

// RequesterState is the send side's state.
type RequesterState struct {
	// NextPSN is the PSN the requester was about to send, UnackedPSN the
	// oldest not acknowledged, HighPSN the first never sent:
	// UnackedPSN ≤ NextPSN ≤ HighPSN. A restored QP sends from
	// UnackedPSN again.
	NextPSN    uint32 `json:"next_psn"`
	UnackedPSN uint32 `json:"unacked_psn"`
	HighPSN    uint32 `json:"high_psn"`
	// WQEs are the work requests not completed, oldest first (at most
	// SQSize); those started (sent at least in part) come first, their
	// PSNs contiguous from the oldest's.
	WQEs []WQEState `json:"wqes"`
}

// WQEState is an outstanding send work request.
type WQEState struct {
	// ID is what identifies its completion to the owner (SendWR.ID).
	ID uint64 `json:"id"`
	// Opcode is the operation (WROpcode: the device ABI's values).
	Opcode uint8 `json:"opcode"`
	// Length is the message length in bytes (8 for atomics).
	Length uint32 `json:"length"`
	// RemoteAddr and RKey name the target of WRITE, READ and atomics.
	RemoteAddr uint64 `json:"remote_addr"`
	RKey       uint32 `json:"rkey"`
	// Imm is the immediate data (a number), Invalidate the R_Key of a
	// SEND_WITH_INV, Compare and SwapAdd the atomic operands.
	Imm        uint32 `json:"imm"`
	Invalidate uint32 `json:"invalidate"`
	Compare    uint64 `json:"compare"`
	SwapAdd    uint64 `json:"swap_add"`
	// Fence and Solicited are the work request's flags.
	Fence     bool `json:"fence"`
	Solicited bool `json:"solicited"`
	// Started: its first packet was sent; PSN is then its first PSN (it
	// takes one PSN per packet, a READ one per response packet, an
	// atomic one).
	Started bool   `json:"started"`
	PSN     uint32 `json:"psn"`
	// Got is the bytes of a READ's response placed, in order (a multiple
	// of PMTU below Length); 0 for every other operation.
	Got uint32 `json:"got"`
	// Local describes its local memory, when the Buffer can say
	// (Describer); nil otherwise, and the owner's Rebuilder knows it by
	// ID.
	Local *LocalState `json:"local,omitempty"`
}

// LocalState describes the local memory of a work request: its SGEs, or
// the bytes of an inline message (not both).
type LocalState struct {
	SGEs   []SGEState `json:"sges,omitempty"`
	Inline []byte     `json:"inline,omitempty"`
}

// SGEState is one scatter/gather element: Length bytes at Addr of the MR
// of LKey.
type SGEState struct {
	LKey   uint32 `json:"lkey"`
	Addr   uint64 `json:"addr"`
	Length uint32 `json:"length"`
}

// ResponderState is the receive side's state.
type ResponderState struct {
	// ExpectedPSN is the PSN of the next request, MSN the messages
	// completed (24 bits).
	ExpectedPSN uint32 `json:"expected_psn"`
	MSN         uint32 `json:"msn"`
	// Recv is the receive a multi-packet SEND is being placed in, Write
	// the multi-packet WRITE being placed; at most one of them.
	Recv  *RecvState  `json:"recv,omitempty"`
	Write *WriteState `json:"write,omitempty"`
	// Responses are the queued READ responses and atomic ACKs, in PSN
	// order (at most MaxDestRdAtomic).
	Responses []ResponseState `json:"responses,omitempty"`
	// Replay are the READs and atomics remembered to answer duplicates,
	// oldest first (at most MaxDestRdAtomic).
	Replay []ReplayState `json:"replay,omitempty"`
}

// RecvState is a receive being filled by a SEND.
type RecvState struct {
	// ID and Length are those of the Recv Host.TakeRecv returned.
	ID     uint64 `json:"id"`
	Length uint32 `json:"length"`
	// Offset is the bytes placed (a positive multiple of PMTU, at most
	// Length).
	Offset uint32 `json:"offset"`
}

// WriteState is an RDMA WRITE being placed.
type WriteState struct {
	// RKey is the WRITE's R_Key, VA the next address, Left the bytes to
	// come, Total the message length (Total-Left a positive multiple of
	// PMTU).
	RKey  uint32 `json:"rkey"`
	VA    uint64 `json:"va"`
	Left  uint32 `json:"left"`
	Total uint32 `json:"total"`
}

// ResponseState is a queued response.
type ResponseState struct {
	// Atomic: an atomic ACK carrying Orig; otherwise READ response
	// packets for Left bytes from VA under RKey, the next of them the
	// first of the response when First.
	Atomic bool   `json:"atomic"`
	PSN    uint32 `json:"psn"` // the next packet's
	MSN    uint32 `json:"msn"`
	Orig   uint64 `json:"orig,omitempty"`
	RKey   uint32 `json:"rkey,omitempty"`
	VA     uint64 `json:"va,omitempty"`
	Left   uint32 `json:"left,omitempty"`
	First  bool   `json:"first,omitempty"`
}

// ReplayState is an executed READ (Read: its PSN, VA, RKey and Length) or
// atomic (its PSN and the original value Orig it returned).
type ReplayState struct {
	Read   bool   `json:"read"`
	PSN    uint32 `json:"psn"`
	Orig   uint64 `json:"orig,omitempty"`
	VA     uint64 `json:"va,omitempty"`
	RKey   uint32 `json:"rkey,omitempty"`
	Length uint32 `json:"length,omitempty"`
}

// Describer is a Buffer that describes itself as data for a ConnState
// (the engine's, over SGEs or inline bytes).
type Describer interface {
	Describe() LocalState
}

// Rebuilder is a Host that gives a restored QP its local memory again.
// Restore needs it when the state has a work request with data or a
// receive being filled.
type Rebuilder interface {
	// SendBuffer returns the local memory of the outstanding work
	// request w (Length > 0): its Local, or what the owner knows by ID.
	SendBuffer(w *WQEState) (Buffer, error)
	// RecvBuffer returns the memory of the receive r that a SEND was
	// being placed in (what TakeRecv had returned).
	RecvBuffer(r *RecvState) (Buffer, error)
}

// Freezer is a transport (Conn) whose state can be taken out: *QP and
// package udp's connections. The multipath spray transport is not one.
type Freezer interface {
	Freeze() (*ConnState, error)
	Thaw()
}

func stateErr(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrConnState}, a...)...)
}

// config is the Config of st (Clock nil), checked as New checks it.
func (st *ConnState) config() (Config, error) {
	if st.TimeoutNS <= 0 || st.TimeoutNS > int64(maxTimeout) {
		return Config{}, stateErr("timeout %d ns", st.TimeoutNS)
	}
	if st.Burst < 1 || st.Burst > MaxWindow {
		return Config{}, stateErr("burst %d", st.Burst)
	}
	c := Config{
		QPN: st.QPN, DestQPN: st.DestQPN, PMTU: roce.MTU(st.PMTU), SQSize: st.SQSize,
		Timeout: time.Duration(st.TimeoutNS), RetryCnt: st.RetryCnt, RNRRetry: st.RNRRetry, MinRNRTimer: st.MinRNRTimer,
		MaxRdAtomic: st.MaxRdAtomic, MaxDestRdAtomic: st.MaxDestRdAtomic, Window: st.Window, Burst: st.Burst,
	}
	// Every field must be set: a zero that fill would default is not
	// what the QP had.
	if c.SQSize == 0 || c.MaxRdAtomic == 0 || c.MaxDestRdAtomic == 0 || c.Window == 0 {
		return Config{}, stateErr("sq_size %d, max_rd_atomic %d, max_dest_rd_atomic %d, window %d",
			c.SQSize, c.MaxRdAtomic, c.MaxDestRdAtomic, c.Window)
	}
	chk := c
	if err := chk.fill(); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConnState, err)
	}
	return c, nil
}

// Validate checks st as Restore takes it: the attributes as New checks
// them, every PSN 24 bits, the requester's work requests as Post checks
// them and consistent with its PSNs, the responder's message in progress,
// responses and replay cache within its bounds and before its expected
// PSN. Addresses (Local, Peer) are package udp's to check.
func (st *ConnState) Validate() error {
	if st == nil {
		return stateErr("none")
	}
	c, err := st.config()
	if err != nil {
		return err
	}
	if err := st.Requester.validate(&c, st.Started); err != nil {
		return err
	}
	return st.Responder.validate(&c)
}

func psn24(name string, v uint32) error {
	if !roce.PSN(v).Valid() {
		return stateErr("%s %#x beyond 24 bits", name, v)
	}
	return nil
}

func (r *RequesterState) validate(c *Config, started bool) error {
	for _, p := range []struct {
		n string
		v uint32
	}{{"next_psn", r.NextPSN}, {"unacked_psn", r.UnackedPSN}, {"high_psn", r.HighPSN}} {
		if err := psn24(p.n, p.v); err != nil {
			return err
		}
	}
	una, next, high := roce.PSN(r.UnackedPSN), roce.PSN(r.NextPSN), roce.PSN(r.HighPSN)
	if next.Diff(una) < 0 || high.Diff(next) < 0 {
		return stateErr("requester PSNs unacked %#x, next %#x, high %#x out of order", una, next, high)
	}
	if len(r.WQEs) > c.SQSize {
		return stateErr("%d work requests, send queue of %d", len(r.WQEs), c.SQSize)
	}
	if !started && len(r.WQEs) > 0 {
		return stateErr("%d work requests on a QP not started", len(r.WQEs))
	}
	pmtu := uint32(c.PMTU)
	var (
		nstarted int
		span     uint64 // PSNs from the first started one's to the end of the last's
		rd       int
	)
	for i := range r.WQEs {
		w := &r.WQEs[i]
		if err := w.validate(pmtu); err != nil {
			return fmt.Errorf("work request %d: %w", i, err)
		}
		if !w.Started {
			continue
		}
		if nstarted != i {
			return stateErr("work request %d started after one that was not", i)
		}
		if nstarted > 0 && roce.PSN(w.PSN) != roce.PSN(r.WQEs[0].PSN).Add(uint32(span)) {
			return stateErr("work request %d at PSN %#x, want %#x", i, w.PSN, roce.PSN(r.WQEs[0].PSN).Add(uint32(span)))
		}
		span += uint64(w.packets(c.PMTU))
		if span >= 1<<23 {
			return stateErr("work requests span %d PSNs", span)
		}
		if WROpcode(w.Opcode).needsResponse() {
			rd++
		}
		nstarted++
	}
	if rd > c.MaxRdAtomic {
		return stateErr("%d READs and atomics in flight, max_rd_atomic %d", rd, c.MaxRdAtomic)
	}
	if nstarted == 0 {
		if una != high {
			return stateErr("PSNs %#x to %#x unacknowledged without a work request sent", una, high)
		}
		return nil
	}
	first := roce.PSN(r.WQEs[0].PSN)
	last := &r.WQEs[nstarted-1]
	lastPSN := roce.PSN(last.PSN)
	// Every PSN before the oldest work request's was acknowledged (it
	// would have completed otherwise); some of the last started one's
	// was sent.
	if d := una.Diff(first); d < 0 || uint64(d) > span {
		return stateErr("oldest unacknowledged PSN %#x outside the work requests' %#x + %d", una, first, span)
	}
	if d := high.Diff(lastPSN); d <= 0 || uint32(d) > last.packets(c.PMTU) {
		return stateErr("high PSN %#x outside the last started work request's %#x + %d", high, lastPSN, last.packets(c.PMTU))
	}
	return nil
}

// packets is the PSNs w takes.
func (w *WQEState) packets(pmtu roce.MTU) uint32 {
	if WROpcode(w.Opcode).isAtomic() {
		return 1
	}
	return npkts(w.Length, pmtu)
}

func (w *WQEState) validate(pmtu uint32) error {
	op := WROpcode(w.Opcode)
	switch {
	case !op.Valid():
		return stateErr("opcode %d", w.Opcode)
	case w.Length > abi.MaxMsgSize:
		return stateErr("length %d", w.Length)
	case op.isAtomic() && (w.Length != 8 || w.RemoteAddr%8 != 0):
		return stateErr("atomic of %d bytes at %#x", w.Length, w.RemoteAddr)
	case !w.Started && (w.PSN != 0 || w.Got != 0):
		return stateErr("PSN %#x or got %d on a work request not started", w.PSN, w.Got)
	case w.Started && !roce.PSN(w.PSN).Valid():
		return stateErr("PSN %#x beyond 24 bits", w.PSN)
	case op != WRRDMARead && w.Got != 0:
		return stateErr("got %d on a %v", w.Got, op)
	case op == WRRDMARead && w.Got > 0 && (w.Got >= w.Length || w.Got%pmtu != 0):
		return stateErr("READ of %d bytes with %d placed", w.Length, w.Got)
	}
	l := w.Local
	if l == nil {
		return nil
	}
	switch {
	case len(l.SGEs) > 0 && len(l.Inline) > 0:
		return stateErr("both SGEs and inline bytes")
	case len(l.SGEs) > MaxStateSGEs:
		return stateErr("%d SGEs", len(l.SGEs))
	case len(l.Inline) > MaxStateInline:
		return stateErr("%d inline bytes", len(l.Inline))
	case len(l.Inline) > 0 && len(l.Inline) != int(w.Length):
		return stateErr("%d inline bytes for a message of %d", len(l.Inline), w.Length)
	}
	if len(l.SGEs) > 0 || (len(l.Inline) == 0 && w.Length > 0) {
		var sum uint64
		for i, s := range l.SGEs {
			if s.Addr+uint64(s.Length) < s.Addr {
				return stateErr("SGE %d: %d bytes at %#x wrap", i, s.Length, s.Addr)
			}
			sum += uint64(s.Length)
		}
		if sum != uint64(w.Length) {
			return stateErr("SGEs of %d bytes for a message of %d", sum, w.Length)
		}
	}
	return nil
}

func (r *ResponderState) validate(c *Config) error {
	if err := psn24("expected_psn", r.ExpectedPSN); err != nil {
		return err
	}
	if r.MSN > roce.MSNMask {
		return stateErr("MSN %#x beyond 24 bits", r.MSN)
	}
	epsn, pmtu := roce.PSN(r.ExpectedPSN), uint32(c.PMTU)
	if r.Recv != nil && r.Write != nil {
		return stateErr("a SEND and a WRITE in progress")
	}
	if v := r.Recv; v != nil && (v.Length > abi.MaxMsgSize || v.Offset == 0 || v.Offset > v.Length || v.Offset%pmtu != 0) {
		return stateErr("SEND into a receive of %d bytes at offset %d", v.Length, v.Offset)
	}
	if w := r.Write; w != nil {
		done := w.Total - w.Left
		if w.Total > abi.MaxMsgSize || w.Left >= w.Total || done%pmtu != 0 || w.VA+uint64(w.Left) < w.VA {
			return stateErr("WRITE of %d bytes with %d left at %#x", w.Total, w.Left, w.VA)
		}
	}
	if len(r.Responses) > c.MaxDestRdAtomic || len(r.Replay) > c.MaxDestRdAtomic {
		return stateErr("%d responses and %d remembered requests, max_dest_rd_atomic %d", len(r.Responses), len(r.Replay), c.MaxDestRdAtomic)
	}
	for i := range r.Responses {
		j := &r.Responses[i]
		p := roce.PSN(j.PSN)
		switch {
		case !p.Valid() || j.MSN > roce.MSNMask:
			return stateErr("response %d: PSN %#x, MSN %#x", i, j.PSN, j.MSN)
		case !p.Before(epsn):
			return stateErr("response %d: PSN %#x not before the expected %#x", i, p, epsn)
		case i > 0 && !p.After(roce.PSN(r.Responses[i-1].PSN)):
			return stateErr("response %d: PSN %#x out of order", i, p)
		case j.Atomic && (j.RKey != 0 || j.VA != 0 || j.Left != 0 || j.First):
			return stateErr("response %d: atomic ACK with READ fields", i)
		case !j.Atomic && (j.Orig != 0 || j.Left > abi.MaxMsgSize || (!j.First && j.Left == 0) || j.VA+uint64(j.Left) < j.VA):
			return stateErr("response %d: READ of %d bytes at %#x", i, j.Left, j.VA)
		}
	}
	for i := range r.Replay {
		e := &r.Replay[i]
		p := roce.PSN(e.PSN)
		switch {
		case !p.Valid() || !p.Before(epsn):
			return stateErr("remembered request %d: PSN %#x (expected %#x)", i, e.PSN, epsn)
		case e.Read && (e.Orig != 0 || e.Length > abi.MaxMsgSize):
			return stateErr("remembered READ %d: %d bytes", i, e.Length)
		case !e.Read && (e.VA != 0 || e.RKey != 0 || e.Length != 0):
			return stateErr("remembered atomic %d with READ fields", i)
		}
	}
	return nil
}
