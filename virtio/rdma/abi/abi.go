package abi

import (
	"encoding/binary"
	"fmt"
)

// DeviceID is the virtio device ID of the RDMA device ("RDMA device" in the
// virtio specification's device ID table). On PCI it is 1af4:106a.
const DeviceID = 42

// ABIVersion is the version in the config space; docs/spec.md describes it.
const ABIVersion = 1

// Queue indices.
const (
	ControlQueue       = 0 // driver → device commands, responses in place
	EventQueue         = 1 // device → driver events in buffers the driver keeps posted
	FirstDoorbellQueue = 2 // doorbell queues, one per driver CPU, from here on
)

// Opcode is a control command.
type Opcode uint16

// Control commands. Numbers are ABI: never reuse one.
const (
	CmdQueryDevice Opcode = 1
	CmdQueryPort   Opcode = 2
	CmdQueryGID    Opcode = 3
	CmdCreatePD    Opcode = 4
	CmdDestroyPD   Opcode = 5
	CmdRegMR       Opcode = 6
	CmdDeregMR     Opcode = 7
	CmdCreateCQ    Opcode = 8
	CmdDestroyCQ   Opcode = 9
	CmdCreateQP    Opcode = 10
	CmdModifyQP    Opcode = 11
	CmdQueryQP     Opcode = 12
	CmdDestroyQP   Opcode = 13
	CmdCreateAH    Opcode = 14
	CmdDestroyAH   Opcode = 15
	CmdReqNotifyCQ Opcode = 16
	CmdAddGID      Opcode = 17
	CmdDelGID      Opcode = 18
	CmdCreateSRQ   Opcode = 19
	CmdModifySRQ   Opcode = 20
	CmdQuerySRQ    Opcode = 21
	CmdDestroySRQ  Opcode = 22
	CmdAllocMW     Opcode = 23
	CmdDeallocMW   Opcode = 24
	CmdAllocMR     Opcode = 25
)

var opcodeNames = map[Opcode]string{
	CmdQueryDevice: "QUERY_DEVICE", CmdQueryPort: "QUERY_PORT", CmdQueryGID: "QUERY_GID",
	CmdCreatePD: "CREATE_PD", CmdDestroyPD: "DESTROY_PD", CmdRegMR: "REG_MR", CmdDeregMR: "DEREG_MR",
	CmdCreateCQ: "CREATE_CQ", CmdDestroyCQ: "DESTROY_CQ", CmdCreateQP: "CREATE_QP",
	CmdModifyQP: "MODIFY_QP", CmdQueryQP: "QUERY_QP", CmdDestroyQP: "DESTROY_QP",
	CmdCreateAH: "CREATE_AH", CmdDestroyAH: "DESTROY_AH", CmdReqNotifyCQ: "REQ_NOTIFY_CQ",
	CmdAddGID: "ADD_GID", CmdDelGID: "DEL_GID",
	CmdCreateSRQ: "CREATE_SRQ", CmdModifySRQ: "MODIFY_SRQ", CmdQuerySRQ: "QUERY_SRQ", CmdDestroySRQ: "DESTROY_SRQ",
	CmdAllocMW: "ALLOC_MW", CmdDeallocMW: "DEALLOC_MW", CmdAllocMR: "ALLOC_MR",
}

func (o Opcode) String() string {
	if n, ok := opcodeNames[o]; ok {
		return n
	}
	return fmt.Sprintf("Opcode(%d)", uint16(o))
}

// Status is the result of a control command.
type Status uint32

// Statuses. Numbers are ABI.
const (
	StatusOK          Status = 0 // success
	StatusInvalid     Status = 1 // malformed command or an argument out of range
	StatusNoResources Status = 2 // a limit of the device was reached
	StatusNotFound    Status = 3 // no such handle (PD, MR, CQ, QP, AH)
	StatusBusy        Status = 4 // the object still has children or users
	StatusAccess      Status = 5 // not allowed (wrong PD, access flags)
	StatusFault       Status = 6 // a guest-physical address is not in guest memory
	StatusUnsupported Status = 7 // unknown opcode or unsupported option
	StatusQuota       Status = 8 // pinning or rate quota exceeded
	StatusState       Status = 9 // illegal state transition
)

var statusNames = map[Status]string{
	StatusOK: "OK", StatusInvalid: "INVALID", StatusNoResources: "NO_RESOURCES",
	StatusNotFound: "NOT_FOUND", StatusBusy: "BUSY", StatusAccess: "ACCESS", StatusFault: "FAULT",
	StatusUnsupported: "UNSUPPORTED", StatusQuota: "QUOTA", StatusState: "STATE",
}

func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("Status(%d)", uint32(s))
}

// Error makes a non-OK status an error.
func (s Status) Error() string { return "vrdma: command failed: " + s.String() }

// Wire structures. Every field is fixed-size and little-endian, packed
// without padding in declaration order; the `spec` tag names the field as
// docs/spec.md does, and a test checks every structure's offsets and size
// against the tables there.

// Config is the device config space (struct vrdma_config).
type Config struct {
	ABIVersion        uint32   `spec:"abi_version"`
	NumDoorbellQueues uint32   `spec:"num_doorbell_queues"`
	NodeGUID          uint64   `spec:"node_guid"`
	PortGID           [16]byte `spec:"port_gid"`
	MaxQP             uint32   `spec:"max_qp"`
	MaxQPWR           uint32   `spec:"max_qp_wr"`
	MaxSGE            uint32   `spec:"max_sge"`
	MaxCQ             uint32   `spec:"max_cq"`
	MaxCQE            uint32   `spec:"max_cqe"`
	MaxMR             uint32   `spec:"max_mr"`
	MaxPD             uint32   `spec:"max_pd"`
	MaxAH             uint32   `spec:"max_ah"`
	MaxMRSize         uint64   `spec:"max_mr_size"`
	MaxInlineData     uint32   `spec:"max_inline_data"`
	ActiveMTU         uint32   `spec:"active_mtu"`
	PortState         uint32   `spec:"port_state"`
	MaxQPRdAtom       uint32   `spec:"max_qp_rd_atom"`
	MaxSRQ            uint32   `spec:"max_srq"`
	DeviceCaps        uint32   `spec:"device_caps"`
}

// ConfigSize is the size of the config space.
const ConfigSize = 96

// CmdHeader starts every control command (struct vrdma_cmd_hdr).
type CmdHeader struct {
	Opcode   uint16 `spec:"opcode"`
	Flags    uint16 `spec:"flags"`
	Reserved uint32 `spec:"reserved"`
}

// RespHeader starts every control response (struct vrdma_resp_hdr).
type RespHeader struct {
	Status   uint32 `spec:"status"`
	Reserved uint32 `spec:"reserved"`
}

// Header sizes.
const (
	CmdHeaderSize  = 8
	RespHeaderSize = 8
)

// DeviceAttr is QUERY_DEVICE's response (struct vrdma_device_attr), shaped
// after ibv_device_attr.
type DeviceAttr struct {
	FWVer           uint64 `spec:"fw_ver"`
	NodeGUID        uint64 `spec:"node_guid"`
	SysImageGUID    uint64 `spec:"sys_image_guid"`
	MaxMRSize       uint64 `spec:"max_mr_size"`
	PageSizeCap     uint64 `spec:"page_size_cap"`
	VendorID        uint32 `spec:"vendor_id"`
	VendorPartID    uint32 `spec:"vendor_part_id"`
	HWVer           uint32 `spec:"hw_ver"`
	MaxQP           uint32 `spec:"max_qp"`
	MaxQPWR         uint32 `spec:"max_qp_wr"`
	DeviceCapFlags  uint32 `spec:"device_cap_flags"`
	MaxSGE          uint32 `spec:"max_sge"`
	MaxCQ           uint32 `spec:"max_cq"`
	MaxCQE          uint32 `spec:"max_cqe"`
	MaxMR           uint32 `spec:"max_mr"`
	MaxPD           uint32 `spec:"max_pd"`
	MaxQPRdAtom     uint32 `spec:"max_qp_rd_atom"`
	MaxQPInitRdAtom uint32 `spec:"max_qp_init_rd_atom"`
	AtomicCap       uint32 `spec:"atomic_cap"`
	MaxAH           uint32 `spec:"max_ah"`
	PhysPortCnt     uint32 `spec:"phys_port_cnt"`
	MaxInlineData   uint32 `spec:"max_inline_data"`
	MaxSRQ          uint32 `spec:"max_srq"`
}

// DeviceAttrSize is the size of DeviceAttr on the wire.
const DeviceAttrSize = 112

// Atomic capabilities (ibv_atomic_cap).
const (
	AtomicNone = 0
	AtomicHCA  = 1
	AtomicGlob = 2
)

// Port states (ibv_port_state) and MTUs (ibv_mtu).
const (
	PortDown   = 1
	PortActive = 4

	MTU256  = 1
	MTU512  = 2
	MTU1024 = 3
	MTU2048 = 4
	MTU4096 = 5
)

// Marshal encodes a wire structure (a pointer to one of the types above).
func Marshal(v any) []byte {
	b, err := binary.Append(nil, binary.LittleEndian, v)
	if err != nil {
		panic(fmt.Sprintf("rdma: marshal %T: %v", v, err)) // a programming error: not a wire type
	}
	return b
}

// Unmarshal decodes b, which must be exactly the structure's size, into v.
func Unmarshal(b []byte, v any) error {
	n := binary.Size(v)
	if n < 0 {
		return fmt.Errorf("rdma: %T is not a wire type", v)
	}
	if len(b) != n {
		return fmt.Errorf("rdma: %T needs %d bytes, got %d", v, n, len(b))
	}
	_, err := binary.Decode(b, binary.LittleEndian, v)
	return err
}

// PortReq is QUERY_PORT's request (struct vrdma_port_req).
type PortReq struct {
	PortNum  uint32 `spec:"port_num"`
	Reserved uint32 `spec:"reserved"`
}

// PortAttr is QUERY_PORT's response (struct vrdma_port_attr).
type PortAttr struct {
	State        uint32 `spec:"state"`
	MaxMTU       uint32 `spec:"max_mtu"`
	ActiveMTU    uint32 `spec:"active_mtu"`
	GIDTblLen    uint32 `spec:"gid_tbl_len"`
	PortCapFlags uint32 `spec:"port_cap_flags"`
	MaxMsgSz     uint32 `spec:"max_msg_sz"`
	LinkLayer    uint32 `spec:"link_layer"`
	LID          uint32 `spec:"lid"`
	ActiveSpeed  uint32 `spec:"active_speed"`
	ActiveWidth  uint32 `spec:"active_width"`
}

// GIDReq is QUERY_GID's request (struct vrdma_gid_req).
type GIDReq struct {
	PortNum uint32 `spec:"port_num"`
	Index   uint32 `spec:"index"`
}

// GID is QUERY_GID's response (struct vrdma_gid).
type GID struct {
	Raw [16]byte `spec:"raw"`
}

// GIDTableLen is the number of entries of a device's GID table (QUERY_PORT's
// gid_tbl_len).
const GIDTableLen = 16

// GID types of ADD_GID (informational in version 1).
const (
	GIDTypeRoCEv1 = 0
	GIDTypeRoCEv2 = 1
)

// GIDEntry is ADD_GID's request (struct vrdma_gid_entry).
type GIDEntry struct {
	PortNum  uint32   `spec:"port_num"`
	Index    uint32   `spec:"index"`
	GID      [16]byte `spec:"gid"`
	GIDType  uint32   `spec:"gid_type"`
	Reserved uint32   `spec:"reserved"`
}

// Handle carries one handle (struct vrdma_handle).
type Handle struct {
	Handle   uint32 `spec:"handle"`
	Reserved uint32 `spec:"reserved"`
}

// RegMR is REG_MR's request (struct vrdma_reg_mr); an inline page list may
// follow it.
type RegMR struct {
	PDN       uint32 `spec:"pdn"`
	Access    uint32 `spec:"access"`
	IOVA      uint64 `spec:"iova"`
	Length    uint64 `spec:"length"`
	PageShift uint32 `spec:"page_shift"`
	NPages    uint32 `spec:"npages"`
	PageList  uint64 `spec:"page_list"`
	Flags     uint32 `spec:"flags"`
	Reserved  uint32 `spec:"reserved"`
}

// MRKeys is REG_MR's response (struct vrdma_mr_keys).
type MRKeys struct {
	LKey uint32 `spec:"lkey"`
	RKey uint32 `spec:"rkey"`
}

// CreateCQ is CREATE_CQ's request (struct vrdma_create_cq).
type CreateCQ struct {
	CQE      uint32 `spec:"cqe"`
	NPages   uint32 `spec:"npages"`
	Record   uint64 `spec:"record"`
	PageList uint64 `spec:"page_list"`
	Flags    uint32 `spec:"flags"`
	Reserved uint32 `spec:"reserved"`
}

// CREATE_CQ flags.
const (
	// CQFlagArmRecord: the CQ's record is a CQArmRecord, and the driver arms
	// the CQ by writing its arm word (no REQ_NOTIFY_CQ command needed).
	CQFlagArmRecord = 1
)

// CQArmRecord is the record of a CQ created with CQFlagArmRecord (struct
// vrdma_cq_arm_record).
type CQArmRecord struct {
	PI       uint32 `spec:"pi"`
	CI       uint32 `spec:"ci"`
	Arm      uint32 `spec:"arm"`
	Reserved uint32 `spec:"reserved"`
}

// The arm word: bit 0 solicited-only, bits 1–31 a sequence number the driver
// changes at every arm.
const (
	CQArmSolicited = 1
	CQArmSeqShift  = 1
)

// CQRecord is a CQ's doorbell record (struct vrdma_cq_record).
type CQRecord struct {
	PI uint32 `spec:"pi"`
	CI uint32 `spec:"ci"`
}

// CreateQP is CREATE_QP's request (struct vrdma_create_qp).
type CreateQP struct {
	PDN           uint32 `spec:"pdn"`
	SendCQN       uint32 `spec:"send_cqn"`
	RecvCQN       uint32 `spec:"recv_cqn"`
	QPType        uint32 `spec:"qp_type"`
	MaxSendWR     uint32 `spec:"max_send_wr"`
	MaxRecvWR     uint32 `spec:"max_recv_wr"`
	MaxSendSGE    uint32 `spec:"max_send_sge"`
	MaxRecvSGE    uint32 `spec:"max_recv_sge"`
	MaxInlineData uint32 `spec:"max_inline_data"`
	SQWQEShift    uint32 `spec:"sq_wqe_shift"`
	RQWQEShift    uint32 `spec:"rq_wqe_shift"`
	DoorbellQueue uint32 `spec:"doorbell_queue"`
	Record        uint64 `spec:"record"`
	SQNPages      uint32 `spec:"sq_npages"`
	RQNPages      uint32 `spec:"rq_npages"`
	PageList      uint64 `spec:"page_list"`
	SQSigAll      uint32 `spec:"sq_sig_all"`
	Flags         uint32 `spec:"flags"`
	SRQN          uint32 `spec:"srqn"`
	Reserved      uint32 `spec:"reserved"`
}

// CreateQPV1Size is the size of CREATE_QP's request before SRQs (without
// srqn and reserved), which the device still accepts.
const CreateQPV1Size = 80

// CREATE_QP flags.
const (
	// QPFlagRQNotify: the QP's record is a QPNotifyRecord, whose rq_notify
	// word tells the driver when posting receives needs a notification
	// (only while the QP is in ERR); otherwise receives are posted with
	// no notification at all.
	QPFlagRQNotify = 1
	// QPFlagSRQ: the QP takes its receive WQEs from the SRQ srqn.
	QPFlagSRQ = 2
)

// QPNotifyRecord is the record of a QP created with QPFlagRQNotify (struct
// vrdma_qp_notify_record).
type QPNotifyRecord struct {
	SQPI     uint32 `spec:"sq_pi"`
	RQPI     uint32 `spec:"rq_pi"`
	SQCI     uint32 `spec:"sq_ci"`
	RQCI     uint32 `spec:"rq_ci"`
	RQNotify uint32 `spec:"rq_notify"`
	Reserved uint32 `spec:"reserved"`
}

// QPRecord is a QP's doorbell record (struct vrdma_qp_record).
type QPRecord struct {
	SQPI uint32 `spec:"sq_pi"`
	RQPI uint32 `spec:"rq_pi"`
	SQCI uint32 `spec:"sq_ci"`
	RQCI uint32 `spec:"rq_ci"`
}

// Offsets in a QP record and a CQ record, for atomic access.
const (
	QPRecordSQPI = 0
	QPRecordRQPI = 4
	QPRecordSQCI = 8
	QPRecordRQCI = 12
	QPRecordSize = 16

	QPRecordRQNotify   = 16
	QPNotifyRecordSize = 24

	CQRecordPI   = 0
	CQRecordCI   = 4
	CQRecordSize = 8

	CQRecordArm     = 8
	CQArmRecordSize = 16
)

// QPAttr is MODIFY_QP's request and QUERY_QP's response (struct vrdma_qp_attr).
type QPAttr struct {
	QPN             uint32   `spec:"qpn"`
	AttrMask        uint32   `spec:"attr_mask"`
	QPState         uint32   `spec:"qp_state"`
	QPAccessFlags   uint32   `spec:"qp_access_flags"`
	PKeyIndex       uint32   `spec:"pkey_index"`
	PortNum         uint32   `spec:"port_num"`
	PathMTU         uint32   `spec:"path_mtu"`
	DestQPNum       uint32   `spec:"dest_qp_num"`
	RQPSN           uint32   `spec:"rq_psn"`
	SQPSN           uint32   `spec:"sq_psn"`
	MaxRdAtomic     uint32   `spec:"max_rd_atomic"`
	MaxDestRdAtomic uint32   `spec:"max_dest_rd_atomic"`
	MinRNRTimer     uint32   `spec:"min_rnr_timer"`
	Timeout         uint32   `spec:"timeout"`
	RetryCnt        uint32   `spec:"retry_cnt"`
	RNRRetry        uint32   `spec:"rnr_retry"`
	DGID            [16]byte `spec:"dgid"`
	SGIDIndex       uint32   `spec:"sgid_index"`
	HopLimit        uint32   `spec:"hop_limit"`
	Paths           uint32   `spec:"paths"`
	QKey            uint32   `spec:"qkey"`
}

// CreateAH is CREATE_AH's request (struct vrdma_create_ah).
type CreateAH struct {
	PDN       uint32   `spec:"pdn"`
	PortNum   uint32   `spec:"port_num"`
	DGID      [16]byte `spec:"dgid"`
	SGIDIndex uint32   `spec:"sgid_index"`
	Reserved  uint32   `spec:"reserved"`
}

// AllocMW is ALLOC_MW's request (struct vrdma_alloc_mw).
type AllocMW struct {
	PDN  uint32 `spec:"pdn"`
	Type uint32 `spec:"type"`
}

// AllocMR is ALLOC_MR's request (struct vrdma_alloc_mr): an MR for fast
// registration.
type AllocMR struct {
	PDN      uint32 `spec:"pdn"`
	MaxPages uint32 `spec:"max_pages"`
}

// CreateSRQ is CREATE_SRQ's request (struct vrdma_create_srq).
type CreateSRQ struct {
	PDN           uint32 `spec:"pdn"`
	MaxWR         uint32 `spec:"max_wr"`
	MaxSGE        uint32 `spec:"max_sge"`
	SRQLimit      uint32 `spec:"srq_limit"`
	WQEShift      uint32 `spec:"wqe_shift"`
	DoorbellQueue uint32 `spec:"doorbell_queue"`
	Record        uint64 `spec:"record"`
	NPages        uint32 `spec:"npages"`
	Reserved      uint32 `spec:"reserved"`
	PageList      uint64 `spec:"page_list"`
}

// SRQRecord is an SRQ's record (struct vrdma_srq_record).
type SRQRecord struct {
	PI       uint32 `spec:"pi"`
	CI       uint32 `spec:"ci"`
	Notify   uint32 `spec:"notify"`
	Reserved uint32 `spec:"reserved"`
}

// Offsets in an SRQ record, for atomic access.
const (
	SRQRecordPI     = 0
	SRQRecordCI     = 4
	SRQRecordNotify = 8
	SRQRecordSize   = 16
)

// SRQAttr is MODIFY_SRQ's request and QUERY_SRQ's response (struct
// vrdma_srq_attr).
type SRQAttr struct {
	SRQN     uint32 `spec:"srqn"`
	AttrMask uint32 `spec:"attr_mask"`
	MaxWR    uint32 `spec:"max_wr"`
	SRQLimit uint32 `spec:"srq_limit"`
}

// SRQ attribute mask bits (ibv_srq_attr_mask).
const (
	SRQAttrMaxWR = 1
	SRQAttrLimit = 2
)

// NotifyCQ is REQ_NOTIFY_CQ's request (struct vrdma_notify_cq).
type NotifyCQ struct {
	CQN           uint32 `spec:"cqn"`
	SolicitedOnly uint32 `spec:"solicited_only"`
}

// Link layer (ibv_port_attr.link_layer).
const LinkLayerEthernet = 2
