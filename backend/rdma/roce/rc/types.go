package rc

import (
	"errors"
	"fmt"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Sentinels of the errors the QP's methods return.
var (
	// ErrQueueFull: the send queue holds Config.SQSize work requests.
	ErrQueueFull = errors.New("rc: send queue full")
	// ErrState: the QP is in the error state (or closed); it takes no work.
	ErrState = errors.New("rc: QP in the error state")
	// ErrWR: a work request the protocol cannot carry.
	ErrWR = errors.New("rc: invalid work request")
	// ErrConfig: a Config New does not accept.
	ErrConfig = errors.New("rc: invalid config")
)

// WRError says why Post refused a work request; it matches ErrWR.
type WRError struct {
	ID     uint64
	Reason string
}

func (e *WRError) Error() string        { return fmt.Sprintf("rc: work request %#x: %s", e.ID, e.Reason) }
func (e *WRError) Is(target error) bool { return target == ErrWR }

// WROpcode is a send work request's operation. The values are those of the
// device ABI (abi.WROpSend ...), so the engine converts a WQE's opcode
// byte with a plain conversion after checking Valid.
type WROpcode uint8

// Work request opcodes.
const (
	WRSend             WROpcode = abi.WROpSend
	WRSendWithImm      WROpcode = abi.WROpSendWithImm
	WRRDMAWrite        WROpcode = abi.WROpRDMAWrite
	WRRDMAWriteWithImm WROpcode = abi.WROpRDMAWriteWithImm
	WRRDMARead         WROpcode = abi.WROpRDMARead
	WRAtomicCmpSwp     WROpcode = abi.WROpAtomicCmpSwp
	WRAtomicFetchAdd   WROpcode = abi.WROpAtomicFetchAdd
	// WRSendWithInv is a SEND whose last packet names an R_Key the
	// responder invalidates (SendWR.Invalidate, carried in the IETH).
	WRSendWithInv WROpcode = abi.WROpSendWithInv
)

// wrNames by opcode; "" marks the ABI's opcodes that are no transport
// operation (LOCAL_INV, which the engine runs itself).
var wrNames = [...]string{"SEND", "SEND_WITH_IMM", "RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "RDMA_READ",
	"ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD", "", "SEND_WITH_INV"}

// Valid reports whether o is one of the opcodes above.
func (o WROpcode) Valid() bool { return int(o) < len(wrNames) && wrNames[o] != "" }

func (o WROpcode) String() string {
	if o.Valid() {
		return wrNames[o]
	}
	return fmt.Sprintf("WROpcode(%d)", uint8(o))
}

func (o WROpcode) isAtomic() bool { return o == WRAtomicCmpSwp || o == WRAtomicFetchAdd }

// needsResponse: the requester waits for data (READ response, atomic ACK)
// rather than an ACK.
func (o WROpcode) needsResponse() bool { return o == WRRDMARead || o.isAtomic() }

// Buffer is local memory of one message, addressed by the offset in the
// message: the gathered data of a SEND or WRITE, the destination of a READ
// or of an atomic's original value (8 bytes, little-endian, as an RNIC
// writes it on x86), a receive's scatter list. The engine implements it
// over its SGE lists; the QP calls it with its lock held, within [0, length
// of the message).
type Buffer interface {
	Gather(off uint32, dst []byte) error
	Scatter(off uint32, src []byte) error
}

// SendWR is one send work request, copied by Post.
type SendWR struct {
	ID     uint64
	Opcode WROpcode
	// Length is the message length: the bytes Local gathers (SEND,
	// WRITE) or scatters (READ); 8 for atomics.
	Length uint32
	// RemoteAddr and RKey name the target of WRITE, READ and atomics.
	RemoteAddr uint64
	RKey       uint32
	// Imm is the immediate data (big-endian number, as verbs hand it).
	Imm uint32
	// Invalidate is the R_Key a SEND_WITH_INV asks the responder to
	// invalidate (a number, as every key).
	Invalidate uint32
	// Compare and SwapAdd are the atomic operands.
	Compare, SwapAdd uint64
	// Fence: start only when every earlier READ and atomic has completed.
	Fence bool
	// Solicited sets the BTH SE bit on the message's last packet.
	Solicited bool
	// Local is the message's local memory; nil only for Length 0.
	Local Buffer
}

// Completion is a send work request's completion, delivered in posting
// order (and every one, signaled or not: the engine filters).
type Completion struct {
	ID      uint64
	Opcode  WROpcode
	Status  abi.WCStatus
	ByteLen uint32
}

// Access is the remote access an incoming request needs (abi.Access*).
type Access uint32

// Remote access rights.
const (
	AccessRemoteWrite  Access = abi.AccessRemoteWrite
	AccessRemoteRead   Access = abi.AccessRemoteRead
	AccessRemoteAtomic Access = abi.AccessRemoteAtomic
)

// AtomicOp is the 8-byte operation of an incoming atomic request.
type AtomicOp uint8

// Atomic operations.
const (
	AtomicCmpSwp AtomicOp = iota
	AtomicFetchAdd
)

// Region is remote-accessible memory that Host.Resolve checked for a range:
// the QP calls it only for addresses inside that range. An MR object
// implements it (no allocation per packet).
type Region interface {
	WriteAt(va uint64, src []byte) error
	ReadAt(va uint64, dst []byte) error
	// Atomic performs op on the 8 bytes at va (8-aligned) atomically
	// and returns the value before it.
	Atomic(va uint64, op AtomicOp, compare, swapAdd uint64) (orig uint64, err error)
}

// Recv is a posted receive the responder consumed.
type Recv struct {
	ID  uint64
	Len uint32 // capacity of Buf
	Buf Buffer
}

// RecvCompletion is a receive completion.
type RecvCompletion struct {
	ID      uint64
	Status  abi.WCStatus
	ByteLen uint32
	Imm     uint32
	WithImm bool
	// Write: the receive was consumed by an RDMA WRITE with immediate
	// (IBV_WC_RECV_RDMA_WITH_IMM); ByteLen is then the WRITE's length.
	Write bool
	// Solicited: the message's last packet had the BTH SE bit (a CQ armed
	// for solicited completions fires).
	Solicited bool
	// WithInv: the message was a SEND with invalidate; InvRKey is the
	// key its IETH named, which Host.Invalidate freed.
	WithInv bool
	InvRKey uint32
}

// Host is what a QP needs from the device it belongs to. Every method is
// called with the QP's lock held: it must not call back into the QP.
type Host interface {
	// Resolve checks that rkey grants access to [va, va+length) and
	// returns the region; ok false makes the responder NAK with a remote
	// access error. A zero-length request names no memory: for length 0
	// only the QP's own access flags are checked (InfiniBand; rkey and va
	// are not looked at) and the region is nil.
	Resolve(rkey uint32, va uint64, length uint32, access Access) (r Region, ok bool)
	// TakeRecv consumes the next posted receive; ok false makes the
	// responder send an RNR NAK and leave the request for a retry.
	TakeRecv() (r Recv, ok bool)
	// RecvDone reports a receive completion.
	RecvDone(c RecvCompletion)
	// Invalidate answers the IETH of a SEND with invalidate: whether
	// rkey names what a remote invalidation may free for this QP, and
	// with commit, frees it. false makes the responder NAK with an
	// invalid request (the requester's REM_INV_REQ_ERR). The responder
	// checks (commit false) before it takes a receive for a one-packet
	// message, so that an RNR NAK invalidates nothing, and commits once
	// the receive is taken.
	Invalidate(rkey uint32, commit bool) bool
	// SendDone reports a send work request's completion.
	SendDone(c Completion)
}

// Failer is a Host that is told when the QP enters the error state on its
// own — a request it refused with a fatal NAK (fatal true: the engine
// raises QP_FATAL, as for a responder error on one host), retries run out,
// a fatal NAK received — but not when the owner closed it. Failed is
// called with the QP's lock held, before the flushed completions.
type Failer interface {
	Failed(fatal bool)
}

// Conn is a connected QP's transport as the engine drives it: *QP (plain
// RC, what rxe speaks) and the multipath spray transport implement it.
// The engine makes a Conn at MODIFY_QP INIT→RTR, calls Start at RTR→RTS,
// posts its send work requests to it and closes it when the QP leaves
// RTR/RTS or is destroyed; completions come back through the Host.
type Conn interface {
	// Start gives the requester its attributes (RTR→RTS); see QP.Start.
	Start(cfg Config) error
	// Post queues a send work request; ErrQueueFull means "try again
	// after a completion", ErrState that the transport failed (the Host
	// saw the completion that says why).
	Post(wr SendWR) error
	// Close flushes what is outstanding (SendDone with WCWRFlushErr) and
	// stops receiving; it is idempotent.
	Close()
}

// Port carries a QP's packets to its peer (package udp implements it).
// The QP calls Send and Wake with its lock held, Flush mostly without it
// (so that the system call does not hold up the QP).
type Port interface {
	// Send transmits one packet, BTH to ICRC, the ICRC not yet computed:
	// the Port knows the IP and UDP headers and seals it. pkt is valid
	// only during the call. A packet the Port cannot send is lost, as on
	// the wire; the protocol recovers it. The Port may queue it until
	// Flush.
	Send(pkt []byte)
	// Flush pushes out what Send queued. The QP calls it after each
	// Post, Tick and Pump that sent packets (the Pump after a Wake when
	// it asked for one) and in Flush; after Receive the owner calls
	// QP.Flush.
	Flush()
	// Wake asks for a call of QP.Pump soon, from a goroutine holding no
	// QP lock: the QP stopped after Config.Burst packets with more to
	// send. It must not block.
	Wake()
}

// InPlacePort is a Port in whose memory the QP can build a packet with a
// payload (a SEND or WRITE request, a READ response), so that the payload
// is copied once, from the local memory (Buffer.Gather, Region.ReadAt)
// straight into what the Port sends: Reserve returns room for a packet of
// n bytes, the QP writes the payload and then the headers there, and
// Commit seals and queues it (as Send would) or, given nil, gives the room
// back. The QP calls Commit after every Reserve, calling nothing else of
// the Port in between, with its lock held; the Port may hold a lock of its
// own from Reserve to Commit. n is at most the largest packet (BTH, RETH,
// ImmDt, roce.MaxPayload, ICRC). Package udp's ports implement it; any
// other Port gets each packet through Send.
type InPlacePort interface {
	Port
	Reserve(n int) []byte
	Commit(pkt []byte)
}

// Config is a connected QP's attributes, as MODIFY_QP to RTR and RTS sets
// them.
type Config struct {
	// QPN is the local QP number, DestQPN the peer's (24 bits).
	QPN, DestQPN uint32
	// SQPSN is the first PSN the requester sends, RQPSN the first the
	// responder expects (24 bits).
	SQPSN, RQPSN roce.PSN
	// PMTU is the path MTU (roce.MTU256 ... roce.MTU4096).
	PMTU roce.MTU
	// SQSize bounds the outstanding send work requests (0: 256).
	SQSize int
	// Timeout is the retransmit timeout (0: 20 ms); RetryCnt (0-7) the
	// retransmissions after timeouts without progress before the head
	// work request fails with WCRetryExcErr (a PSN sequence NAK makes
	// the requester go back without using one up).
	Timeout  time.Duration
	RetryCnt int
	// RNRRetry (0-7, 7 meaning without limit) bounds the retries after
	// RNR NAKs before WCRNRRetryExcErr.
	RNRRetry int
	// MinRNRTimer (0-31) is the RNR timer code the responder sends.
	MinRNRTimer uint8
	// MaxRdAtomic (0: 16) bounds the READs and atomics in flight as
	// requester; MaxDestRdAtomic (0: 128) those the responder queues
	// (and its atomic replay cache).
	MaxRdAtomic, MaxDestRdAtomic int
	// Window bounds the packets in flight (0: 512; at most 1<<20).
	Window int
	// Burst bounds the packets one call sends before it asks for Wake
	// (0: 32).
	Burst int
	// Clock returns the time (nil: time.Now); tests drive timers with it.
	Clock func() time.Time
}

// Defaults and limits.
const (
	DefaultSQSize          = 256
	DefaultTimeout         = 20 * time.Millisecond
	DefaultMaxRdAtomic     = 16
	DefaultMaxDestRdAtomic = 128
	DefaultWindow          = 512
	DefaultBurst           = 32
	MaxWindow              = 1 << 20
	MaxSQSize              = 1 << 16
	// ackEvery: the requester asks for an ACK at least every ackEvery
	// packets of a long message (rxe: RXE_MAX_PKT_PER_ACK).
	ackEvery = 64
)

func (c *Config) fill() error {
	if c.SQSize == 0 {
		c.SQSize = DefaultSQSize
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxRdAtomic == 0 {
		c.MaxRdAtomic = DefaultMaxRdAtomic
	}
	if c.MaxDestRdAtomic == 0 {
		c.MaxDestRdAtomic = DefaultMaxDestRdAtomic
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Burst == 0 {
		c.Burst = DefaultBurst
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	switch {
	case c.QPN > roce.QPNMask || c.DestQPN > roce.QPNMask:
		return fmt.Errorf("%w: QPN %#x or DestQPN %#x beyond 24 bits", ErrConfig, c.QPN, c.DestQPN)
	case !c.SQPSN.Valid() || !c.RQPSN.Valid():
		return fmt.Errorf("%w: PSN beyond 24 bits", ErrConfig)
	case !c.PMTU.Valid():
		return fmt.Errorf("%w: path MTU %d", ErrConfig, int(c.PMTU))
	case c.SQSize < 1 || c.SQSize > MaxSQSize:
		return fmt.Errorf("%w: SQSize %d not in [1, %d]", ErrConfig, c.SQSize, MaxSQSize)
	case c.Timeout < 0 || c.RetryCnt < 0 || c.RetryCnt > 7 || c.RNRRetry < 0 || c.RNRRetry > 7 || c.MinRNRTimer > 31:
		return fmt.Errorf("%w: timeout %v, retry_cnt %d, rnr_retry %d, min_rnr_timer %d", ErrConfig, c.Timeout, c.RetryCnt, c.RNRRetry, c.MinRNRTimer)
	case c.MaxRdAtomic < 1 || c.MaxRdAtomic > 1<<16 || c.MaxDestRdAtomic < 1 || c.MaxDestRdAtomic > 1<<16:
		return fmt.Errorf("%w: max_rd_atomic %d, max_dest_rd_atomic %d", ErrConfig, c.MaxRdAtomic, c.MaxDestRdAtomic)
	case c.Window < 1 || c.Window > MaxWindow || c.Burst < 1:
		return fmt.Errorf("%w: window %d, burst %d", ErrConfig, c.Window, c.Burst)
	}
	return nil
}

// rnrTimes is the IBA RNR timer table (Vol 1, 9.7.5.2.8), by code.
var rnrTimes = [32]time.Duration{
	655360 * time.Microsecond, 10 * time.Microsecond, 20 * time.Microsecond, 30 * time.Microsecond,
	40 * time.Microsecond, 60 * time.Microsecond, 80 * time.Microsecond, 120 * time.Microsecond,
	160 * time.Microsecond, 240 * time.Microsecond, 320 * time.Microsecond, 480 * time.Microsecond,
	640 * time.Microsecond, 960 * time.Microsecond, 1280 * time.Microsecond, 1920 * time.Microsecond,
	2560 * time.Microsecond, 3840 * time.Microsecond, 5120 * time.Microsecond, 7680 * time.Microsecond,
	10240 * time.Microsecond, 15360 * time.Microsecond, 20480 * time.Microsecond, 30720 * time.Microsecond,
	40960 * time.Microsecond, 61440 * time.Microsecond, 81920 * time.Microsecond, 122880 * time.Microsecond,
	163840 * time.Microsecond, 245760 * time.Microsecond, 327680 * time.Microsecond, 491520 * time.Microsecond,
}

// RNRTime returns the wait an RNR timer code (0-31) stands for.
func RNRTime(code uint8) time.Duration { return rnrTimes[code&31] }

// TimeoutDuration converts the 5-bit local ACK timeout of MODIFY_QP
// (4.096 µs × 2^code; 0 means infinite, returned as 0) to a duration.
func TimeoutDuration(code uint8) time.Duration {
	if code == 0 || code > 31 {
		return 0
	}
	return time.Duration(4096<<code) * time.Nanosecond
}
