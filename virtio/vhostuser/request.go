package vhostuser

import "strconv"

// Request is a front-end request number (the "request" header field of a
// message the front-end sends on the main socket).
type Request uint32

// Front-end requests, numbered as in vhost-user.rst "Front-end message types".
const (
	GetFeatures         Request = 1
	SetFeatures         Request = 2
	SetOwner            Request = 3
	ResetOwner          Request = 4
	SetMemTable         Request = 5
	SetLogBase          Request = 6
	SetLogFd            Request = 7
	SetVringNum         Request = 8
	SetVringAddr        Request = 9
	SetVringBase        Request = 10
	GetVringBase        Request = 11
	SetVringKick        Request = 12
	SetVringCall        Request = 13
	SetVringErr         Request = 14
	GetProtocolFeatures Request = 15
	SetProtocolFeatures Request = 16
	GetQueueNum         Request = 17
	SetVringEnable      Request = 18
	SendRarp            Request = 19
	NetSetMTU           Request = 20
	SetBackendReqFd     Request = 21
	IOTLBMsg            Request = 22
	SetVringEndian      Request = 23
	GetConfig           Request = 24
	SetConfig           Request = 25
	CreateCryptoSession Request = 26
	CloseCryptoSession  Request = 27
	PostcopyAdvise      Request = 28
	PostcopyListen      Request = 29
	PostcopyEnd         Request = 30
	GetInflightFd       Request = 31
	SetInflightFd       Request = 32
	GPUSetSocket        Request = 33
	ResetDevice         Request = 34
	VringKick           Request = 35
	GetMaxMemSlots      Request = 36
	AddMemReg           Request = 37
	RemMemReg           Request = 38
	SetStatus           Request = 39
	GetStatus           Request = 40
	GetSharedObject     Request = 41
	SetDeviceStateFd    Request = 42
	CheckDeviceState    Request = 43
)

// maxRequest is the highest front-end request number this package knows.
const maxRequest = CheckDeviceState

var requestNames = [...]string{
	GetFeatures:         "GET_FEATURES",
	SetFeatures:         "SET_FEATURES",
	SetOwner:            "SET_OWNER",
	ResetOwner:          "RESET_OWNER",
	SetMemTable:         "SET_MEM_TABLE",
	SetLogBase:          "SET_LOG_BASE",
	SetLogFd:            "SET_LOG_FD",
	SetVringNum:         "SET_VRING_NUM",
	SetVringAddr:        "SET_VRING_ADDR",
	SetVringBase:        "SET_VRING_BASE",
	GetVringBase:        "GET_VRING_BASE",
	SetVringKick:        "SET_VRING_KICK",
	SetVringCall:        "SET_VRING_CALL",
	SetVringErr:         "SET_VRING_ERR",
	GetProtocolFeatures: "GET_PROTOCOL_FEATURES",
	SetProtocolFeatures: "SET_PROTOCOL_FEATURES",
	GetQueueNum:         "GET_QUEUE_NUM",
	SetVringEnable:      "SET_VRING_ENABLE",
	SendRarp:            "SEND_RARP",
	NetSetMTU:           "NET_SET_MTU",
	SetBackendReqFd:     "SET_BACKEND_REQ_FD",
	IOTLBMsg:            "IOTLB_MSG",
	SetVringEndian:      "SET_VRING_ENDIAN",
	GetConfig:           "GET_CONFIG",
	SetConfig:           "SET_CONFIG",
	CreateCryptoSession: "CREATE_CRYPTO_SESSION",
	CloseCryptoSession:  "CLOSE_CRYPTO_SESSION",
	PostcopyAdvise:      "POSTCOPY_ADVISE",
	PostcopyListen:      "POSTCOPY_LISTEN",
	PostcopyEnd:         "POSTCOPY_END",
	GetInflightFd:       "GET_INFLIGHT_FD",
	SetInflightFd:       "SET_INFLIGHT_FD",
	GPUSetSocket:        "GPU_SET_SOCKET",
	ResetDevice:         "RESET_DEVICE",
	VringKick:           "VRING_KICK",
	GetMaxMemSlots:      "GET_MAX_MEM_SLOTS",
	AddMemReg:           "ADD_MEM_REG",
	RemMemReg:           "REM_MEM_REG",
	SetStatus:           "SET_STATUS",
	GetStatus:           "GET_STATUS",
	GetSharedObject:     "GET_SHARED_OBJECT",
	SetDeviceStateFd:    "SET_DEVICE_STATE_FD",
	CheckDeviceState:    "CHECK_DEVICE_STATE",
}

// Known reports whether r is a request number this package knows.
func (r Request) Known() bool {
	return r >= GetFeatures && r <= maxRequest
}

// String returns the spec's name without the VHOST_USER_ prefix, e.g.
// "SET_MEM_TABLE", or "Request(N)" for an unknown number.
func (r Request) String() string {
	if r.Known() {
		return requestNames[r]
	}
	return "Request(" + strconv.FormatUint(uint64(r), 10) + ")"
}

// BackendRequest is a back-end request number: a message the back-end sends
// to the front-end on the channel set up by SET_BACKEND_REQ_FD.
type BackendRequest uint32

// Back-end requests, numbered as in vhost-user.rst "Back-end message types".
const (
	BackendIOTLBMsg             BackendRequest = 1
	BackendConfigChangeMsg      BackendRequest = 2
	BackendVringHostNotifierMsg BackendRequest = 3
	BackendVringCall            BackendRequest = 4
	BackendVringErr             BackendRequest = 5
	BackendSharedObjectAdd      BackendRequest = 6
	BackendSharedObjectRemove   BackendRequest = 7
	BackendSharedObjectLookup   BackendRequest = 8
	maxBackendRequest                          = BackendSharedObjectLookup
)

var backendRequestNames = [...]string{
	BackendIOTLBMsg:             "BACKEND_IOTLB_MSG",
	BackendConfigChangeMsg:      "BACKEND_CONFIG_CHANGE_MSG",
	BackendVringHostNotifierMsg: "BACKEND_VRING_HOST_NOTIFIER_MSG",
	BackendVringCall:            "BACKEND_VRING_CALL",
	BackendVringErr:             "BACKEND_VRING_ERR",
	BackendSharedObjectAdd:      "BACKEND_SHARED_OBJECT_ADD",
	BackendSharedObjectRemove:   "BACKEND_SHARED_OBJECT_REMOVE",
	BackendSharedObjectLookup:   "BACKEND_SHARED_OBJECT_LOOKUP",
}

// Known reports whether r is a back-end request number this package knows.
func (r BackendRequest) Known() bool {
	return r >= BackendIOTLBMsg && r <= maxBackendRequest
}

// String returns the spec's name without the VHOST_USER_ prefix, e.g.
// "BACKEND_CONFIG_CHANGE_MSG", or "BackendRequest(N)" for an unknown number.
func (r BackendRequest) String() string {
	if r.Known() {
		return backendRequestNames[r]
	}
	return "BackendRequest(" + strconv.FormatUint(uint64(r), 10) + ")"
}

// Protocol feature bits (VHOST_USER_PROTOCOL_F_*), as masks. They are
// negotiated with GET/SET_PROTOCOL_FEATURES once FeatureProtocolFeatures
// is offered.
const (
	ProtocolMQ                  uint64 = 1 << 0
	ProtocolLogShmfd            uint64 = 1 << 1
	ProtocolRARP                uint64 = 1 << 2
	ProtocolReplyAck            uint64 = 1 << 3
	ProtocolMTU                 uint64 = 1 << 4
	ProtocolBackendReq          uint64 = 1 << 5
	ProtocolCrossEndian         uint64 = 1 << 6
	ProtocolCryptoSession       uint64 = 1 << 7
	ProtocolPagefault           uint64 = 1 << 8
	ProtocolConfig              uint64 = 1 << 9
	ProtocolBackendSendFd       uint64 = 1 << 10
	ProtocolHostNotifier        uint64 = 1 << 11
	ProtocolInflightShmfd       uint64 = 1 << 12
	ProtocolResetDevice         uint64 = 1 << 13
	ProtocolInbandNotifications uint64 = 1 << 14
	ProtocolConfigureMemSlots   uint64 = 1 << 15
	ProtocolStatus              uint64 = 1 << 16
	ProtocolXenMmap             uint64 = 1 << 17
	ProtocolSharedObject        uint64 = 1 << 18
	ProtocolDeviceState         uint64 = 1 << 19
)

// FeatureProtocolFeatures is VHOST_USER_F_PROTOCOL_FEATURES, virtio feature
// bit 30: offered in GET_FEATURES, it gates protocol feature negotiation.
const FeatureProtocolFeatures uint64 = 1 << 30

// Header flag bits.
const (
	// FlagVersion is the only protocol version (flags bits 0-1).
	FlagVersion uint32 = 1
	// FlagVersionMask selects the version bits.
	FlagVersionMask uint32 = 0x3
	// FlagReply marks a reply ("needs to be sent on each reply from the
	// back-end").
	FlagReply uint32 = 1 << 2
	// FlagNeedReply asks for a REPLY_ACK u64 (0 = success).
	FlagNeedReply uint32 = 1 << 3
)

// Limits.
const (
	// HeaderSize is the size of the request, flags and size fields.
	HeaderSize = 12
	// MaxPayloadSize bounds a message's payload. A larger announced size
	// is a protocol error: the connection must be closed.
	MaxPayloadSize = 4096
	// MaxFds bounds the ancillary fds accepted with one message (one per
	// memory slot in SET_MEM_TABLE).
	MaxFds = 32
	// MaxConfigSize is VHOST_USER_MAX_CONFIG_SIZE, the largest config
	// space access of GET_CONFIG/SET_CONFIG.
	MaxConfigSize = 256
)
