package backend

import (
	"time"
)

// The description of a frozen Server (Freeze) that another process adopts
// (Adopt) to go on serving its socket and its connected front-end: a live
// upgrade of vrdmad (backend/doc.go, "Live upgrade"). It is written into
// the handover state as JSON. Every descriptor it names is an index into
// the []int that travels beside it (-1: none); each is named at most once.
// Adopt validates all of it as hostile input.

// ServerState describes a frozen Server.
type ServerState struct {
	// Listener is the listening socket (required).
	Listener int `json:"listener"`
	// UnlinkOnClose tells whether Close removes the socket file (a socket
	// made by Listen; not one from FromListener).
	UnlinkOnClose bool `json:"unlink_on_close"`
	// Stats are the server's counters, which go on counting.
	Stats StatsSnapshot `json:"stats"`
	// Session is the connected front-end's session; nil when none is.
	Session *SessionState `json:"session,omitempty"`
}

// SessionState describes the session of a connected front-end: what it
// negotiated and set up, as the session's messages left it.
type SessionState struct {
	Conn        int    `json:"conn"`         // the vhost-user connection
	Backend     int    `json:"backend"`      // the backend channel (SET_BACKEND_REQ_FD), -1 none
	Features    uint64 `json:"features"`     // acked virtio features (SET_FEATURES)
	Protocol    uint64 `json:"protocol"`     // acked protocol features
	ProtocolSet bool   `json:"protocol_set"` // SET_PROTOCOL_FEATURES was received
	Owner       bool   `json:"owner"`        // SET_OWNER was received
	Status      uint8  `json:"status"`       // the device status (SET_STATUS)
	// Resumed is Host.Resumed: the front-end restarted rings from indices
	// the back-end never produced (set before the handover, not by it).
	Resumed bool `json:"resumed"`
	// ConfigChangePending: the device asked for a config-change interrupt
	// while the session was frozen; it is sent when the session runs.
	ConfigChangePending bool `json:"config_change_pending"`
	// Since is when the front-end connected (Server.Peer).
	Since   time.Time     `json:"since"`
	Regions []RegionState `json:"regions"` // the memory table, at most memmap.MaxRegions
	Rings   []RingState   `json:"rings"`   // one per queue: Device.NumQueues
}

// RegionState is one region of the memory table, as the front-end
// described it; FD is the index of its file.
type RegionState struct {
	GuestAddr  uint64 `json:"guest_addr"`
	Size       uint64 `json:"size"`
	UserAddr   uint64 `json:"user_addr"`
	MmapOffset uint64 `json:"mmap_offset"`
	FD         int    `json:"fd"`
}

// RingState is one ring's configuration and, when started, its device
// queue's indices. The notification suppression state (flags, event
// indices) lives in guest memory and needs nothing here.
type RingState struct {
	Num     uint16 `json:"num"`      // SET_VRING_NUM; 0: not set
	Desc    uint64 `json:"desc"`     // front-end virtual addresses (SET_VRING_ADDR)
	Avail   uint64 `json:"avail"`    //
	Used    uint64 `json:"used"`     //
	AddrSet bool   `json:"addr_set"` // SET_VRING_ADDR was received
	// Base is the next available index of SET_VRING_BASE (or of the last
	// GET_VRING_BASE, with BaseOurs), what a stopped ring starts from.
	Base     uint16 `json:"base"`
	BaseOurs bool   `json:"base_ours"`
	Started  bool   `json:"started"` // the ring runs (a kick fd arrived, not stopped since)
	Enabled  bool   `json:"enabled"` // SET_VRING_ENABLE (or no protocol features)
	// Broken is why the ring is broken ("" when it is not): it does
	// nothing until the front-end sets it up again.
	Broken string `json:"broken,omitempty"`
	// LastAvail (the next available index to pop) and UsedIdx (the
	// device's used index) of a started ring's device queue.
	LastAvail uint16 `json:"last_avail"`
	UsedIdx   uint16 `json:"used_idx"`
	Kick      int    `json:"kick"` // eventfds; -1 none
	Call      int    `json:"call"`
	Err       int    `json:"err"`
}
