package vhostuser

import (
	"errors"
	"strconv"
)

// Message validation. Check and friends look at one message in isolation:
// payload size, fd count, and the bits of the payload that decide the fd
// count. They never close fds: on error the caller calls CloseFds (and,
// for a request, replies with an error if one was asked for).

// withReq fills in the request of an error a decoder returned.
func withReq(err error, req Request, backend bool) error {
	var me *MessageError
	if errors.As(err, &me) && me.Request == 0 {
		c := *me
		c.Request = req
		c.Backend = backend
		return &c
	}
	return err
}

func checkSize(req Request, backend bool, m *Message, want int) error {
	if len(m.Payload) != want {
		return &MessageError{Request: req, Backend: backend, Err: ErrInvalid,
			Reason: "payload is " + strconv.Itoa(len(m.Payload)) + " bytes, want " + strconv.Itoa(want)}
	}
	return nil
}

func checkFds(req Request, backend bool, m *Message, want int) error {
	if len(m.Fds) != want {
		return &MessageError{Request: req, Backend: backend, Err: ErrInvalid,
			Reason: "got " + strconv.Itoa(len(m.Fds)) + " fds, want " + strconv.Itoa(want)}
	}
	return nil
}

func check(req Request, backend bool, m *Message, size, fds int) error {
	if err := checkSize(req, backend, m, size); err != nil {
		return err
	}
	return checkFds(req, backend, m, fds)
}

// checkCommon validates what every message must satisfy: non-nil, payload
// length equal to the header's size, version 1.
func checkCommon(req Request, backend bool, m *Message) error {
	if m == nil {
		return &MessageError{Request: req, Backend: backend, Reason: "nil message", Err: ErrInvalid}
	}
	if uint64(len(m.Payload)) != uint64(m.Size) {
		return &MessageError{Request: req, Backend: backend, Err: ErrInvalid,
			Reason: "payload is " + strconv.Itoa(len(m.Payload)) + " bytes, header says " + strconv.Itoa(int(m.Size))}
	}
	if len(m.Payload) > MaxPayloadSize {
		return &MessageError{Request: req, Backend: backend, Reason: "payload too large", Err: ErrInvalid}
	}
	if m.Version() != FlagVersion {
		return &MessageError{Request: req, Backend: backend, Reason: "bad version", Err: ErrInvalid}
	}
	return nil
}

// Check validates a request from the front-end: payload size (exact where
// the spec fixes it) and fd count for its request type.
//
//   - SET_MEM_TABLE: 1..MaxFds regions, size 8+32*nregions, exactly
//     nregions fds ("The size and ordering of the fds matches the number
//     and ordering of memory regions").
//   - ADD_MEM_REG: one fd ("Exactly one file descriptor from which the
//     memory is mapped is passed in the ancillary data").
//   - REM_MEM_REG: none ("No file descriptors SHOULD be passed"); one that
//     arrives makes the message invalid and the caller closes it.
//   - SET_VRING_KICK/CALL/ERR: one fd unless bit 8 of the u64 is set, then
//     none; bits other than 0-8 are invalid.
//   - SET_LOG_BASE (log description, 16 bytes), SET_LOG_FD,
//     SET_BACKEND_REQ_FD, SET_INFLIGHT_FD, SET_DEVICE_STATE_FD,
//     GPU_SET_SOCKET: one fd.
//   - every other request: no fd.
//
// A request with FlagReply set and unknown request numbers are invalid.
// Errors are *MessageError wrapping ErrInvalid. Check never closes fds.
func Check(m *Message) error {
	var req Request
	if m != nil {
		req = m.Req()
	}
	if err := checkCommon(req, false, m); err != nil {
		return err
	}
	if m.IsReply() {
		return invalidf(req, "reply flag set on a request")
	}
	switch req {
	case GetFeatures, SetOwner, ResetOwner, GetProtocolFeatures, GetQueueNum,
		PostcopyAdvise, PostcopyListen, PostcopyEnd, ResetDevice, GetMaxMemSlots,
		GetStatus, CheckDeviceState:
		return check(req, false, m, 0, 0)
	case SetFeatures, SetProtocolFeatures, SendRarp, NetSetMTU, CloseCryptoSession, SetStatus:
		return check(req, false, m, U64Size, 0)
	case SetVringNum, SetVringBase, GetVringBase, SetVringEnable, SetVringEndian, VringKick:
		return check(req, false, m, VringStateSize, 0)
	case SetVringAddr:
		return check(req, false, m, VringAddrSize, 0)
	case SetMemTable:
		t, err := DecodeMemTable(m.Payload)
		if err != nil {
			return withReq(err, req, false)
		}
		if len(t.Regions) == 0 {
			return invalidf(req, "memory table has no regions")
		}
		return checkFds(req, false, m, len(t.Regions))
	case SetLogBase:
		return check(req, false, m, LogInfoSize, 1)
	case SetLogFd, SetBackendReqFd, GPUSetSocket:
		return check(req, false, m, 0, 1)
	case SetVringKick, SetVringCall, SetVringErr:
		if err := checkSize(req, false, m, U64Size); err != nil {
			return err
		}
		_, noFd, err := DecodeVringFile(le.Uint64(m.Payload))
		if err != nil {
			return withReq(err, req, false)
		}
		if noFd {
			return checkFds(req, false, m, 0)
		}
		return checkFds(req, false, m, 1)
	case IOTLBMsg:
		return check(req, false, m, IOTLBSize, 0)
	case GetConfig, SetConfig:
		if _, err := DecodeConfigMsg(m.Payload); err != nil {
			return withReq(err, req, false)
		}
		return checkFds(req, false, m, 0)
	case CreateCryptoSession:
		// The crypto session description is not fixed by the spec.
		return checkFds(req, false, m, 0)
	case GetInflightFd:
		return check(req, false, m, InflightInfoSize, 0)
	case SetInflightFd:
		return check(req, false, m, InflightInfoSize, 1)
	case AddMemReg:
		return check(req, false, m, MemRegionMsgSize, 1)
	case RemMemReg:
		return check(req, false, m, MemRegionMsgSize, 0)
	case GetSharedObject:
		return check(req, false, m, SharedObjectSize, 0)
	case SetDeviceStateFd:
		return check(req, false, m, DeviceStateTransferSize, 1)
	}
	return invalidf(req, "unknown request")
}

// CheckReply validates m as the back-end's reply to a request req: FlagReply
// set, the same request number, and the reply's size and fd count.
//
//   - GET_FEATURES, GET_PROTOCOL_FEATURES, GET_QUEUE_NUM,
//     GET_MAX_MEM_SLOTS, GET_STATUS, CHECK_DEVICE_STATE, POSTCOPY_END,
//     IOTLB_MSG: u64; GET_VRING_BASE: vring state; no fd.
//   - GET_CONFIG: a config payload, or an empty one (failure).
//   - GET_INFLIGHT_FD: inflight description with one fd (none if
//     mmap_size is 0, a failure).
//   - SET_DEVICE_STATE_FD: u64; one fd unless bit 8 is set; an error code
//     in bits 0-7 with an fd is invalid ("The back-end must not both
//     indicate an error and return a file descriptor").
//   - SET_LOG_BASE: empty or u64. SET_MEM_TABLE: u64 (REPLY_ACK) or a
//     memory table (postcopy). ADD_MEM_REG/REM_MEM_REG: u64 or a single
//     region. POSTCOPY_ADVISE: empty or u64 with the userfaultfd.
//     GET_SHARED_OBJECT: empty, u64 or a UUID, with at most one fd.
//     CREATE_CRYPTO_SESSION: any size, no fd.
//   - every other known request: the REPLY_ACK u64, no fd.
func CheckReply(req Request, m *Message) error {
	if err := checkCommon(req, false, m); err != nil {
		return err
	}
	if !m.IsReply() {
		return invalidf(req, "reply flag not set")
	}
	if got := m.Req(); got != req {
		return invalidf(req, "reply is for %v", got)
	}
	n := len(m.Payload)
	switch req {
	case GetFeatures, GetProtocolFeatures, GetQueueNum, GetMaxMemSlots, GetStatus,
		CheckDeviceState, PostcopyEnd, IOTLBMsg:
		return check(req, false, m, U64Size, 0)
	case GetVringBase:
		return check(req, false, m, VringStateSize, 0)
	case GetConfig:
		if n != 0 {
			if _, err := DecodeConfigMsg(m.Payload); err != nil {
				return withReq(err, req, false)
			}
		}
		return checkFds(req, false, m, 0)
	case GetInflightFd:
		info, err := DecodeInflightInfo(m.Payload)
		if err != nil {
			return withReq(err, req, false)
		}
		if info.MmapSize == 0 && len(m.Fds) == 0 {
			return nil
		}
		return checkFds(req, false, m, 1)
	case SetDeviceStateFd:
		if err := checkSize(req, false, m, U64Size); err != nil {
			return err
		}
		u := le.Uint64(m.Payload)
		if rest := u &^ (VringFileIndexMask | VringFileNoFd); rest != 0 {
			return invalidf(req, "reply value %#x has reserved bits set", u)
		}
		if u&VringFileNoFd != 0 {
			return checkFds(req, false, m, 0)
		}
		if u&VringFileIndexMask != 0 {
			return invalidf(req, "reply reports error %d and returns an fd", u&VringFileIndexMask)
		}
		return checkFds(req, false, m, 1)
	case SetLogBase:
		if n != 0 && n != U64Size {
			return invalidf(req, "payload is %d bytes, want 0 or %d", n, U64Size)
		}
		return checkFds(req, false, m, 0)
	case SetMemTable:
		if n != U64Size {
			t, err := DecodeMemTable(m.Payload)
			if err != nil {
				return withReq(err, req, false)
			}
			if len(t.Regions) == 0 {
				return invalidf(req, "memory table has no regions")
			}
		}
		return checkFds(req, false, m, 0)
	case AddMemReg, RemMemReg:
		if n != U64Size && n != MemRegionMsgSize {
			return invalidf(req, "payload is %d bytes, want %d or %d", n, U64Size, MemRegionMsgSize)
		}
		return checkFds(req, false, m, 0)
	case PostcopyAdvise:
		if n != 0 && n != U64Size {
			return invalidf(req, "payload is %d bytes, want 0 or %d", n, U64Size)
		}
		return checkFds(req, false, m, 1)
	case GetSharedObject:
		if n != 0 && n != U64Size && n != SharedObjectSize {
			return invalidf(req, "payload is %d bytes, want 0, %d or %d", n, U64Size, SharedObjectSize)
		}
		if len(m.Fds) > 1 {
			return invalidf(req, "got %d fds, want at most 1", len(m.Fds))
		}
		return nil
	case CreateCryptoSession:
		return checkFds(req, false, m, 0)
	}
	if !req.Known() {
		return invalidf(req, "unknown request")
	}
	return check(req, false, m, U64Size, 0)
}

func backendInvalidf(req BackendRequest, reason string) error {
	return &MessageError{Request: Request(req), Backend: true, Reason: reason, Err: ErrInvalid}
}

// CheckBackendRequest validates a request the back-end sent on the
// back-end channel (for the front-end side): IOTLB_MSG struct
// vhost_iotlb_msg; CONFIG_CHANGE_MSG empty; VRING_HOST_NOTIFIER_MSG vring
// area with one fd unless bit 8 of its u64 is set; VRING_CALL/ERR vring
// state; SHARED_OBJECT_* a UUID; no other fds.
func CheckBackendRequest(m *Message) error {
	var req BackendRequest
	if m != nil {
		req = BackendRequest(m.Request)
	}
	r := Request(req)
	if err := checkCommon(r, true, m); err != nil {
		return err
	}
	if m.IsReply() {
		return backendInvalidf(req, "reply flag set on a request")
	}
	switch req {
	case BackendIOTLBMsg:
		return check(r, true, m, IOTLBSize, 0)
	case BackendConfigChangeMsg:
		return check(r, true, m, 0, 0)
	case BackendVringHostNotifierMsg:
		a, err := DecodeVringArea(m.Payload)
		if err != nil {
			return withReq(err, r, true)
		}
		_, noFd, err := DecodeVringFile(a.U64)
		if err != nil {
			return withReq(err, r, true)
		}
		if noFd {
			return checkFds(r, true, m, 0)
		}
		return checkFds(r, true, m, 1)
	case BackendVringCall, BackendVringErr:
		return check(r, true, m, VringStateSize, 0)
	case BackendSharedObjectAdd, BackendSharedObjectRemove, BackendSharedObjectLookup:
		return check(r, true, m, SharedObjectSize, 0)
	}
	return backendInvalidf(req, "unknown back-end request")
}

// CheckBackendReply validates the front-end's reply to back-end request
// req: FlagReply, the same number, a u64; SHARED_OBJECT_LOOKUP may carry
// one fd when the u64 is 0 (success), every other reply none.
func CheckBackendReply(req BackendRequest, m *Message) error {
	r := Request(req)
	if err := checkCommon(r, true, m); err != nil {
		return err
	}
	if !m.IsReply() {
		return backendInvalidf(req, "reply flag not set")
	}
	if got := BackendRequest(m.Request); got != req {
		return backendInvalidf(req, "reply is for "+got.String())
	}
	if !req.Known() {
		return backendInvalidf(req, "unknown back-end request")
	}
	if err := checkSize(r, true, m, U64Size); err != nil {
		return err
	}
	if req == BackendSharedObjectLookup && le.Uint64(m.Payload) == 0 && len(m.Fds) == 1 {
		return nil
	}
	return checkFds(r, true, m, 0)
}
