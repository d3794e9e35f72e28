package rdma

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
)

var opcodeNames = map[Opcode]string{
	CmdQueryDevice: "QUERY_DEVICE", CmdQueryPort: "QUERY_PORT", CmdQueryGID: "QUERY_GID",
	CmdCreatePD: "CREATE_PD", CmdDestroyPD: "DESTROY_PD", CmdRegMR: "REG_MR", CmdDeregMR: "DEREG_MR",
	CmdCreateCQ: "CREATE_CQ", CmdDestroyCQ: "DESTROY_CQ", CmdCreateQP: "CREATE_QP",
	CmdModifyQP: "MODIFY_QP", CmdQueryQP: "QUERY_QP", CmdDestroyQP: "DESTROY_QP",
	CmdCreateAH: "CREATE_AH", CmdDestroyAH: "DESTROY_AH", CmdReqNotifyCQ: "REQ_NOTIFY_CQ",
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
	Reserved          [8]byte  `spec:"reserved"`
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
	Reserved        uint32 `spec:"reserved"`
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
