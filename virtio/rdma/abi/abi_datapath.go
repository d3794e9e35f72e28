package abi

import "fmt"

// The data path's structures and constants (docs/spec.md, § Doorbell
// queues and the data path, § Event queue): WQEs, CQEs, events, their
// sizes, access flags, QP states and attribute bits, opcodes and
// completion statuses.

// SGE is a scatter/gather entry (struct vrdma_sge).
type SGE struct {
	Addr   uint64 `spec:"addr"`
	Length uint32 `spec:"length"`
	LKey   uint32 `spec:"lkey"`
}

// SendWQE is a send WQE's header (struct vrdma_send_wqe).
type SendWQE struct {
	WRID       uint64 `spec:"wr_id"`
	Opcode     uint8  `spec:"opcode"`
	Flags      uint8  `spec:"flags"`
	NumSGE     uint16 `spec:"num_sge"`
	ImmData    uint32 `spec:"imm_data"`
	RemoteAddr uint64 `spec:"remote_addr"`
	RKey       uint32 `spec:"rkey"`
	InlineLen  uint32 `spec:"inline_len"`
	CompareAdd uint64 `spec:"compare_add"`
	Swap       uint64 `spec:"swap"`
	AH         uint32 `spec:"ah"`
	RemoteQPN  uint32 `spec:"remote_qpn"`
	RemoteQKey uint32 `spec:"remote_qkey"`
	Reserved   uint32 `spec:"reserved"`
}

// AV is the address vector a UD or GSI send WQE with WRFlagAV carries at
// offset SendWQEHdrSize (struct vrdma_av).
type AV struct {
	DGID      [16]byte `spec:"dgid"`
	SGIDIndex uint32   `spec:"sgid_index"`
	Reserved  [12]byte `spec:"reserved"`
}

// BindMWWQE is a send WQE with opcode WROpBindMW (struct vrdma_bind_mw_wqe).
type BindMWWQE struct {
	WRID      uint64   `spec:"wr_id"`
	Opcode    uint8    `spec:"opcode"`
	Flags     uint8    `spec:"flags"`
	Reserved  uint16   `spec:"reserved"`
	MW        uint32   `spec:"mw"`
	Addr      uint64   `spec:"addr"`
	NewRKey   uint32   `spec:"new_rkey"`
	LKey      uint32   `spec:"lkey"`
	Length    uint64   `spec:"length"`
	Access    uint32   `spec:"access"`
	Reserved2 [20]byte `spec:"reserved2"`
}

// RegMRWQE is a send WQE with opcode WROpRegMR (struct vrdma_reg_mr_wqe):
// fast registration.
type RegMRWQE struct {
	WRID      uint64 `spec:"wr_id"`
	Opcode    uint8  `spec:"opcode"`
	Flags     uint8  `spec:"flags"`
	Reserved  uint16 `spec:"reserved"`
	MR        uint32 `spec:"mr"`
	IOVA      uint64 `spec:"iova"`
	NewKey    uint32 `spec:"new_key"`
	Access    uint32 `spec:"access"`
	Length    uint64 `spec:"length"`
	PageList  uint64 `spec:"page_list"`
	NPages    uint32 `spec:"npages"`
	PageShift uint32 `spec:"page_shift"`
	Reserved2 uint64 `spec:"reserved2"`
}

// RecvWQE is a receive WQE's header (struct vrdma_recv_wqe).
type RecvWQE struct {
	WRID     uint64  `spec:"wr_id"`
	NumSGE   uint16  `spec:"num_sge"`
	Reserved [6]byte `spec:"reserved"`
}

// CQE is a completion queue entry (struct vrdma_cqe).
type CQE struct {
	WRID      uint64   `spec:"wr_id"`
	Status    WCStatus `spec:"status"`
	Opcode    uint8    `spec:"opcode"`
	WCFlags   uint16   `spec:"wc_flags"`
	QPNum     uint32   `spec:"qp_num"`
	ByteLen   uint32   `spec:"byte_len"`
	ImmData   uint32   `spec:"imm_data"`
	SrcQP     uint32   `spec:"src_qp"`
	VendorErr uint32   `spec:"vendor_err"`
}

// Event is an event queue message (struct vrdma_event).
type Event struct {
	Type     uint32 `spec:"type"`
	Handle   uint32 `spec:"handle"`
	Reserved uint64 `spec:"reserved"`
}

// Sizes of the data-path structures.
const (
	SGESize        = 16
	SendWQEHdrSize = 64
	AVSize         = 32
	RecvWQEHdrSize = 16
	CQESize        = 32
	EventSize      = 16
	PageShift      = 12 // the device's page: rings, pinning, page_size_cap
	PageSize       = 1 << PageShift
	MaxPageShift   = 30 // REG_MR's largest page_shift (1 GiB pages)
	MaxMsgSize     = 1 << 31
	MinSQWQEShift  = 6
	MinRQWQEShift  = 5
	MaxWQEShift    = 12
)

// Access flags (ibv_access_flags).
const (
	AccessLocalWrite   = 1
	AccessRemoteWrite  = 2
	AccessRemoteRead   = 4
	AccessRemoteAtomic = 8
	AccessAll          = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
	// AccessMWBind (IBV_ACCESS_MW_BIND): memory windows may be bound in
	// the MR. Not in AccessAll, which is what a QP or a window grants.
	AccessMWBind = 16
)

// Memory windows and fast registration (docs/spec.md § Memory windows and
// fast registration): MW types, the device_cap_flags bits that offer them,
// the most pages one fast registration lists, and a key's index/key-byte
// split.
const (
	MWType1               = 1
	MWType2               = 2
	DevCapMemWindow       = 0x20000
	DevCapMemMgtExt       = 0x200000
	DevCapMemWindowType2B = 0x1000000
	MaxFastRegPages       = 4096
	KeyByteMask           = 0xff
)

// QP types (ibv_qp_type).
const (
	QPTypeGSI = 1 // IB_QPT_GSI: QP1 (docs/spec.md § Kernel verbs and the GSI QP)
	QPTypeRC  = 2
	QPTypeUD  = 4
)

// GSI: the QP number peers address a device's GSI QP by, its well-known
// Q_Key, the device_caps bit that offers it (with DMA MRs and AVs), and
// REG_MR's DMA flag.
const (
	GSIQPN       = 1
	GSIQKey      = 0x80010000
	DeviceCapGSI = 1
	RegMRFlagDMA = 1
)

// UD: a remote_qkey with this bit set sends the QP's own Q_Key; GRHSize is
// the network header a UD receive buffer starts with.
const (
	QKeyUseQP = 0x80000000
	GRHSize   = 40
)

// QP states (ibv_qp_state).
const (
	QPSReset = 0
	QPSInit  = 1
	QPSRTR   = 2
	QPSRTS   = 3
	QPSSQD   = 4
	QPSSQE   = 5
	QPSErr   = 6
)

// QP attribute mask bits (ibv_qp_attr_mask).
const (
	QPAttrState           = 0x1
	QPAttrAccessFlags     = 0x8
	QPAttrPKeyIndex       = 0x10
	QPAttrPort            = 0x20
	QPAttrQKey            = 0x40
	QPAttrAV              = 0x80
	QPAttrPathMTU         = 0x100
	QPAttrTimeout         = 0x200
	QPAttrRetryCnt        = 0x400
	QPAttrRNRRetry        = 0x800
	QPAttrRQPSN           = 0x1000
	QPAttrMaxQPRdAtomic   = 0x2000
	QPAttrMinRNRTimer     = 0x8000
	QPAttrSQPSN           = 0x10000
	QPAttrMaxDestRdAtomic = 0x20000
	QPAttrDestQPN         = 0x100000
	// QPAttrPaths is vrdma's: the paths a QP to another host sprays over.
	QPAttrPaths = 0x80000000
)

// Send opcodes (struct vrdma_send_wqe.opcode).
const (
	WROpSend             = 0
	WROpSendWithImm      = 1
	WROpRDMAWrite        = 2
	WROpRDMAWriteWithImm = 3
	WROpRDMARead         = 4
	WROpAtomicCmpSwp     = 5
	WROpAtomicFetchAdd   = 6
	WROpLocalInv         = 7
	WROpSendWithInv      = 8
	WROpBindMW           = 9
	WROpRegMR            = 10
)

// Send WQE flags.
const (
	WRFlagSignaled  = 1
	WRFlagInline    = 2
	WRFlagFence     = 4
	WRFlagSolicited = 8
	WRFlagAV        = 16
)

// WCStatus is a completion's status (ibv_wc_status), the CQE's status byte.
type WCStatus uint8

// Completion statuses (ibv_wc_status).
const (
	WCSuccess        WCStatus = 0
	WCLocLenErr      WCStatus = 1
	WCLocQPOpErr     WCStatus = 2
	WCLocProtErr     WCStatus = 4
	WCWRFlushErr     WCStatus = 5
	WCMWBindErr      WCStatus = 6
	WCBadRespErr     WCStatus = 7
	WCLocAccessErr   WCStatus = 8
	WCRemInvReqErr   WCStatus = 9
	WCRemAccessErr   WCStatus = 10
	WCRemOpErr       WCStatus = 11
	WCRetryExcErr    WCStatus = 12
	WCRNRRetryExcErr WCStatus = 13
	WCGeneralErr     WCStatus = 21
)

var wcStatusNames = map[WCStatus]string{
	WCSuccess: "SUCCESS", WCLocLenErr: "LOC_LEN_ERR", WCLocQPOpErr: "LOC_QP_OP_ERR",
	WCLocProtErr: "LOC_PROT_ERR", WCWRFlushErr: "WR_FLUSH_ERR", WCMWBindErr: "MW_BIND_ERR", WCBadRespErr: "BAD_RESP_ERR",
	WCLocAccessErr: "LOC_ACCESS_ERR", WCRemInvReqErr: "REM_INV_REQ_ERR", WCRemAccessErr: "REM_ACCESS_ERR",
	WCRemOpErr: "REM_OP_ERR", WCRetryExcErr: "RETRY_EXC_ERR", WCRNRRetryExcErr: "RNR_RETRY_EXC_ERR",
	WCGeneralErr: "GENERAL_ERR",
}

// String returns the status's name as docs/spec.md and ibv_wc_status_str
// spell it (without the IBV_WC_ prefix).
func (s WCStatus) String() string {
	if n, ok := wcStatusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("WCStatus(%d)", uint8(s))
}

// Completion opcodes (ibv_wc_opcode) and flags.
const (
	WCOpSend            = 0
	WCOpRDMAWrite       = 1
	WCOpRDMARead        = 2
	WCOpCompSwap        = 3
	WCOpFetchAdd        = 4
	WCOpBindMW          = 5
	WCOpLocalInv        = 6
	WCOpRegMR           = 10
	WCOpRecv            = 128
	WCOpRecvRDMAWithImm = 129

	WCFlagGRH     = 1
	WCFlagWithImm = 2
	WCFlagWithInv = 4
)

// Event types.
const (
	EventCQCompletion = 1
	EventCQError      = 2
	EventQPFatal      = 3
	EventPortActive   = 4
	EventPortError    = 5
	EventDeviceFatal  = 6
	EventSRQLimit     = 7
	EventQPLastWQE    = 8
)
