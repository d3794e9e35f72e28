package ibv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
)

// Constant types; the values are in zconst.go, generated from verbs.h.
type (
	WCStatus    uint32 // enum ibv_wc_status
	WCOpcode    uint32 // enum ibv_wc_opcode
	WCFlags     uint32 // enum ibv_wc_flags
	WROpcode    uint8  // enum ibv_wr_opcode (all values fit a byte)
	SendFlags   uint8  // enum ibv_send_flags (the four the package passes fit a byte)
	AccessFlags uint32 // enum ibv_access_flags
	QPState     uint32 // enum ibv_qp_state
	QPType      uint32 // enum ibv_qp_type
	QPAttrMask  uint32 // enum ibv_qp_attr_mask
	MTU         uint32 // enum ibv_mtu
	PortState   uint32 // enum ibv_port_state
	LinkLayer   uint8  // IBV_LINK_LAYER_*
	AtomicCap   uint32 // enum ibv_atomic_cap
	GIDType     uint32 // enum ibv_gid_type
	EventType   uint32 // enum ibv_event_type
)

// Errors. Failures of a verb are an *Error whose Err is the errno
// (errors.Is(err, syscall.ENOMEM) works).
var (
	// ErrNoCgo: the binary was built with CGO_ENABLED=0, so this package
	// cannot reach libibverbs at all.
	ErrNoCgo = errors.New("ibv: this binary was built without cgo (CGO_ENABLED=0); the host RDMA NIC needs a cgo build")
	// ErrLoad: libibverbs.so.1 could not be loaded (the *LoadError says why).
	ErrLoad = errors.New("ibv: libibverbs could not be loaded")
	// ErrNoDevice: Open named a device that does not exist.
	ErrNoDevice = errors.New("ibv: no such RDMA device")
	// ErrClosed: the object was closed or destroyed.
	ErrClosed = errors.New("ibv: object closed")
	// ErrInvalid: an argument the package checks itself was invalid.
	ErrInvalid = errors.New("ibv: invalid argument")
)

// LoadError says why Load failed; it matches ErrLoad.
type LoadError struct {
	Library string // the name given to dlopen
	Reason  string // dlerror(), or the missing symbol
}

func (e *LoadError) Error() string {
	return fmt.Sprintf("ibv: cannot load %s (%s): install the Debian packages libibverbs1 and ibverbs-providers (rdma-core)",
		e.Library, e.Reason)
}

func (e *LoadError) Is(target error) bool { return target == ErrLoad }

// Error is a failed verb: Op is the libibverbs function, Err the errno.
type Error struct {
	Op  string
	Err syscall.Errno
}

func (e *Error) Error() string { return fmt.Sprintf("ibv: %s: %v", e.Op, e.Err) }
func (e *Error) Unwrap() error { return e.Err }

// PostError is a PostSend or PostRecv that stopped at WR Index: the WRs
// before it were posted, it and those after were not. Err is the
// provider's errno, or ErrInvalid when the package rejected the WR itself
// (then Reason says why and nothing of the batch was posted).
type PostError struct {
	Op     string // "post_send" or "post_recv"
	Index  int
	Reason string
	Err    error
}

func (e *PostError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("ibv: %s: WR %d: %s", e.Op, e.Index, e.Reason)
	}
	return fmt.Sprintf("ibv: %s: WR %d: %v", e.Op, e.Index, e.Err)
}
func (e *PostError) Unwrap() error { return e.Err }

// DeviceInfo is one entry of Devices.
type DeviceInfo struct {
	Name string // e.g. "mlx5_0", "rxe0"
	GUID uint64 // node GUID as a number (ibv_get_device_guid, converted from big endian)
}

// DeviceAttr is ibv_query_device's answer (the fields vrdmad uses).
type DeviceAttr struct {
	FWVer           string
	NodeGUID        uint64 // as a number (converted from big endian)
	SysImageGUID    uint64 // as a number
	MaxMRSize       uint64
	PageSizeCap     uint64
	VendorID        uint32
	VendorPartID    uint32
	HWVer           uint32
	MaxQP           int
	MaxQPWR         int
	DeviceCapFlags  uint32
	MaxSGE          int
	MaxSGERd        int
	MaxCQ           int
	MaxCQE          int
	MaxMR           int
	MaxPD           int
	MaxQPRdAtom     int
	MaxQPInitRdAtom int
	MaxResRdAtom    int
	AtomicCap       AtomicCap
	MaxAH           int
	MaxSRQ          int
	MaxPKeys        int
	PhysPortCnt     int
}

// PortAttr is ibv_query_port's answer.
type PortAttr struct {
	State         PortState
	MaxMTU        MTU
	ActiveMTU     MTU
	GIDTblLen     int
	PortCapFlags  uint32
	MaxMsgSz      uint32
	PKeyTblLen    int
	LID           uint16
	SMLID         uint16
	LMC           uint8
	ActiveWidth   uint8
	ActiveSpeed   uint8
	PhysState     uint8
	LinkLayer     LinkLayer
	PortCapFlags2 uint16
}

// GID is a 16-byte GID in network byte order (as on the wire and in sysfs).
type GID [16]byte

// String formats the GID as sysfs does (eight colon-separated groups).
func (g GID) String() string {
	return fmt.Sprintf("%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x",
		g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15])
}

// IsIPv4Mapped reports whether the GID is ::ffff:a.b.c.d (a RoCE v2 IPv4 GID).
func (g GID) IsIPv4Mapped() bool {
	for _, b := range g[:10] {
		if b != 0 {
			return false
		}
	}
	return g[10] == 0xff && g[11] == 0xff
}

// AHAttr is the address vector of an RC QP's path (struct ibv_ah_attr with
// its GRH; the fields a RoCE or IB RC bring-up sets).
type AHAttr struct {
	DGID         GID
	FlowLabel    uint32
	SGIDIndex    uint8
	HopLimit     uint8
	TrafficClass uint8
	DLID         uint16
	SL           uint8
	SrcPathBits  uint8
	StaticRate   uint8
	IsGlobal     bool // a GRH is present (always for RoCE)
	PortNum      uint8
}

// QPAttr is struct ibv_qp_attr, the fields RC bring-up needs. Which are
// used is said by the QPAttrMask given beside it.
type QPAttr struct {
	QPState         QPState
	CurQPState      QPState
	PathMTU         MTU
	QKey            uint32
	RQPSN           uint32
	SQPSN           uint32
	DestQPNum       uint32
	QPAccessFlags   AccessFlags
	Cap             QPCaps // Query only
	AH              AHAttr
	PKeyIndex       uint16
	SQDraining      bool // Query only
	MaxRdAtomic     uint8
	MaxDestRdAtomic uint8
	MinRNRTimer     uint8
	PortNum         uint8
	Timeout         uint8
	RetryCnt        uint8
	RNRRetry        uint8
}

// QPCaps are a QP's queue capacities.
type QPCaps struct {
	MaxSendWR     uint32
	MaxRecvWR     uint32
	MaxSendSGE    uint32
	MaxRecvSGE    uint32
	MaxInlineData uint32
}

// QPInit describes a QP to create (struct ibv_qp_init_attr).
type QPInit struct {
	Type   QPType // only QPTRC is supported
	SendCQ *CQ
	RecvCQ *CQ
	Caps   QPCaps // the requested capacities; the QP may get more (QP.Caps)
	SigAll bool   // every send WR completes with a WC, SendSignaled or not
}

// SGE is one scatter/gather element, laid out as struct ibv_sge. Addr is a
// host address in an MR or, for an MR registered with an IOVA, an address
// in that IOVA space.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send work request in a compact, fixed layout (struct
// vibv_send_wr in shim.h; TestLayouts checks they agree). Its scatter list
// is SGEs[FirstSGE : FirstSGE+NumSGE] of the SGE slice passed beside it.
//
// Imm is ibv_send_wr.imm_data, a __be32: the four bytes as they go on the
// wire, read as a native uint32. On a little-endian host the number 1 is
// therefore Imm = 0x01000000: Htonl(1), or binary.NativeEndian.Uint32 of
// the wire bytes. A guest's WQE that already holds the wire bytes passes
// them through unchanged.
type SendWR struct {
	WRID       uint64
	RemoteAddr uint64 // RDMA and atomic opcodes
	CompareAdd uint64 // ATOMIC_CMP_AND_SWP: compare; ATOMIC_FETCH_AND_ADD: add
	Swap       uint64 // ATOMIC_CMP_AND_SWP
	RKey       uint32 // RDMA and atomic opcodes
	Imm        uint32 // *_WITH_IMM; network byte order (see above)
	FirstSGE   uint32
	NumSGE     uint16
	Opcode     WROpcode
	SendFlags  SendFlags
}

// RecvWR is a receive work request (struct vibv_recv_wr).
type RecvWR struct {
	WRID     uint64
	FirstSGE uint32
	NumSGE   uint32
}

// WC is a work completion laid out exactly as struct ibv_wc, so PollCQ
// fills the caller's slice directly. ImmData is __be32 like SendWR.Imm
// (valid when WCFlags has WCWithImm; with WCWithInv it is the invalidated
// rkey in host order).
type WC struct {
	WRID         uint64
	Status       WCStatus
	Opcode       WCOpcode
	VendorErr    uint32
	ByteLen      uint32
	ImmData      uint32
	QPNum        uint32
	SrcQP        uint32
	WCFlags      WCFlags
	PKeyIndex    uint16
	SLID         uint16
	SL           uint8
	DLIDPathBits uint8
	_            [2]byte
}

// AsyncEvent is one asynchronous event, already acknowledged.
type AsyncEvent struct {
	Type EventType
	// QPNum names the QP for QP events (HasQP).
	QPNum uint32
	HasQP bool
	// CQ is the CQ of EventCQErr (nil for other types, or when the CQ is
	// no longer known), CQContext its user context.
	CQ        *CQ
	CQContext uint64
	// Port is the port of port events (0 otherwise).
	Port int
}

var wcStatusNames = map[WCStatus]string{
	WCSuccess: "success", WCLocLenErr: "local length error", WCLocQPOpErr: "local QP operation error",
	WCLocEECOpErr: "local EE context operation error", WCLocProtErr: "local protection error",
	WCWRFlushErr: "WR flushed", WCMWBindErr: "memory window bind error", WCBadRespErr: "bad response",
	WCLocAccessErr: "local access error", WCRemInvReqErr: "remote invalid request",
	WCRemAccessErr: "remote access error", WCRemOpErr: "remote operation error",
	WCRetryExcErr: "transport retry counter exceeded", WCRNRRetryExcErr: "RNR retry counter exceeded",
	WCLocRDDViolErr: "local RDD violation", WCRemInvRdReqErr: "remote invalid RD request",
	WCRemAbortErr: "operation aborted", WCInvEECNErr: "invalid EE context number",
	WCInvEECStateErr: "invalid EE context state", WCFatalErr: "fatal error",
	WCRespTimeoutErr: "response timeout", WCGeneralErr: "general error",
}

func (s WCStatus) String() string {
	if n, ok := wcStatusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("WC status %d", uint32(s))
}

var eventNames = map[EventType]string{
	EventCQErr: "CQ error", EventQPFatal: "QP fatal", EventQPReqErr: "QP request error",
	EventQPAccessErr: "QP access error", EventCommEst: "communication established",
	EventSQDrained: "SQ drained", EventPathMig: "path migrated", EventPathMigErr: "path migration error",
	EventDeviceFatal: "device fatal", EventPortActive: "port active", EventPortErr: "port error",
	EventLIDChange: "LID change", EventPKeyChange: "P_Key change", EventSMChange: "SM change",
	EventSRQErr: "SRQ error", EventSRQLimitReached: "SRQ limit reached",
	EventQPLastWQEReached: "last WQE reached", EventClientReregister: "client reregister",
	EventGIDChange: "GID change", EventWQFatal: "WQ fatal",
}

func (t EventType) String() string {
	if n, ok := eventNames[t]; ok {
		return n
	}
	return fmt.Sprintf("event %d", uint32(t))
}

var qpStateNames = map[QPState]string{
	QPSReset: "RESET", QPSInit: "INIT", QPSRTR: "RTR", QPSRTS: "RTS", QPSSQD: "SQD", QPSSQE: "SQE", QPSErr: "ERR",
}

func (s QPState) String() string {
	if n, ok := qpStateNames[s]; ok {
		return n
	}
	return fmt.Sprintf("QP state %d", uint32(s))
}

// Htonl converts a number into the __be32 form of SendWR.Imm (htonl).
func Htonl(v uint32) uint32 {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return binary.NativeEndian.Uint32(b[:])
}

// Ntohl converts WC.ImmData (a __be32) into its number (ntohl).
func Ntohl(v uint32) uint32 { return Htonl(v) }

// Bytes is the MTU in bytes (0 for an unknown value).
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}
