package controlapi

import (
	"net/url"
	"time"
)

// Paths of the control API.
const (
	// PathDevices lists (GET) and adds (POST) devices.
	PathDevices = "/v1/devices"
	// PathHealth is the daemon's health (GET).
	PathHealth = "/v1/health"
	// PathHealthAck acknowledges problems that stay until an operator
	// has seen them (POST, AckRequest).
	PathHealthAck = "/v1/health/ack"
)

// DevicePath is the path of one device (GET, PATCH, DELETE). The ID is escaped,
// so an ID that holds '/', '?' or '#' names no other resource.
func DevicePath(id string) string { return PathDevices + "/" + url.PathEscape(id) }

// DeviceInfo is a device as the control API shows it.
type DeviceInfo struct {
	ID          string `json:"id"`
	Socket      string `json:"socket"`
	UUID        string `json:"uuid"`
	Connected   bool   `json:"connected"`
	PinnedBytes uint64 `json:"pinned_bytes"`
	PDs         int    `json:"pds"`
	MRs         int    `json:"mrs"`
	CQs         int    `json:"cqs"`
	QPs         int    `json:"qps"`
	BytesMoved  uint64 `json:"bytes_moved"`
	Errors      uint64 `json:"errors"`
	Commands    uint64 `json:"commands"`
	Sessions    uint64 `json:"sessions"`
	RingErrors  uint64 `json:"ring_errors"`
	AHs         int    `json:"ahs"`
	CachedBytes uint64 `json:"map_cache_bytes"`
	CacheHits   uint64 `json:"map_cache_hits"`
	CacheMisses uint64 `json:"map_cache_misses"`
	EventsLost  uint64 `json:"events_lost"`
	GUID        string `json:"guid"`
	GID         string `json:"gid"`
	// MAC is the guest NIC the device pairs with (docs/spec.md, "The
	// device's MAC"): the EUI-48 in the GUID; empty when the GUID has no
	// ff:fe in its middle.
	MAC    string `json:"mac,omitempty"`
	Limits Limits `json:"limits"`
	// NumQueues is the number of virtqueues QEMU must create (num_vqs):
	// control, events and the doorbell queues.
	NumQueues int `json:"num_queues"`
	// Persisted is true for a device kept in the state file (added
	// through the API, with a state directory): it comes back with the
	// same identity when vrdmad restarts.
	Persisted bool `json:"persisted"`
	// Share is the device's part of the engine now. Its weight is the
	// one in effect (1 when none was set).
	Share Share `json:"share"`
	// GIDs are the filled entries of the device's GID table now: index 0
	// is the port GID (the "gid" field), the others the guest's driver
	// added (the RoCE GIDs of its interfaces' addresses) or the GIDs of
	// the host addresses its RoCE traffic leaves from (roce_bind, vrdmad
	// --roce-bind: entries 1, 2, …).
	GIDs []GIDEntry `json:"gids"`
	// RoCEBind are the device's own host addresses for RoCE (POST's
	// roce_bind); absent when it uses the daemon's.
	RoCEBind []string `json:"roce_bind,omitempty"`
	// Addresses are the prefixes the operator assigned the device (POST's
	// addresses and gids, each as a prefix: 10.11.0.5/32); ADD_GID may
	// claim only GIDs within them besides the port GID. Never null.
	Addresses []string `json:"addresses"`
	// RNIC is what executes the device's work: "soft" (the software RNIC
	// embedded in vrdmad) or "verbs:DEVICE:PORT" (the host's RDMA NIC
	// through rdma-core; vrdmad --rnic, POST's rnic).
	RNIC string `json:"rnic"`
	// Peer is the connected front-end (QEMU); absent while none is.
	Peer *Peer `json:"peer,omitempty"`
	// RefusedFrontEnds counts the front-ends turned away: a second one
	// while the device was connected (vhost-user serves one), or one whose
	// uid vrdmad --allow-uid leaves out.
	RefusedFrontEnds uint64 `json:"refused_front_ends"`
	// Migration is the device's part in a live migration between two
	// QEMUs on this host (docs/state.md, "Through QEMU's device-state
	// protocol"): MigrationIncoming, MigrationIn or MigrationOut; absent
	// for a device that took part in none.
	Migration string `json:"migration,omitempty"`
}

// Migration states of DeviceInfo.Migration.
const (
	// MigrationIncoming: added with incoming, no migration state loaded
	// yet: the device holds no GID and no QP number, and is not in the
	// state file.
	MigrationIncoming = "incoming"
	// MigrationIn: a migration's state was loaded into the incoming
	// device: it holds the identity (GIDs, QP numbers) and is saved in the
	// state file in place of the source.
	MigrationIn = "migrated-in"
	// MigrationOut: the device's identity moved to a migration's
	// destination: it serves no data path, is no longer in the state
	// file, and is left to be removed.
	MigrationOut = "migrated-out"
)

// Peer is a device's connected front-end: the process that connected to
// its socket, as the kernel saw it then (SO_PEERCRED), and since when.
type Peer struct {
	PID int32  `json:"pid"`
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	// ConnectedSince is when its session started (RFC 3339).
	ConnectedSince time.Time `json:"connected_since"`
}

// GIDEntry is one filled entry of a device's GID table.
type GIDEntry struct {
	Index int `json:"index"`
	// GID in IPv6 notation (an IPv4-mapped GID as ::ffff:a.b.c.d).
	GID string `json:"gid"`
}

// Share is a device's part of the daemon's engine when devices compete
// for it: its weight in the round robin over busy devices and optional
// bounds on its data path.
type Share struct {
	// Weight: a device of weight 4 gets four times the engine time of a
	// device of weight 1 while both are busy. 0 means 1; at most 1000.
	Weight uint32 `json:"weight"`
	// MaxBytesPerSec bounds the payload the device's work requests move
	// per second; 0 means no bound, else at least 4096.
	MaxBytesPerSec uint64 `json:"max_bytes_per_s"`
	// MaxOpsPerSec bounds the work requests the device executes per
	// second; 0 means no bound.
	MaxOpsPerSec uint64 `json:"max_ops_per_s"`
}

// SharePatch changes some fields of a device's share: an absent (nil)
// field keeps its value, 0 in a max removes the bound, weight 0 means 1.
type SharePatch struct {
	Weight         *uint32 `json:"weight,omitempty"`
	MaxBytesPerSec *uint64 `json:"max_bytes_per_s,omitempty"`
	MaxOpsPerSec   *uint64 `json:"max_ops_per_s,omitempty"`
}

// PatchRequest is the body of PATCH /v1/devices/{id}. Share is required
// (it is the one thing a device changes while it runs).
type PatchRequest struct {
	Share *SharePatch `json:"share,omitempty"`
}

// Limits are the per-device limits the control API sets and shows.
type Limits struct {
	// MaxQPs, MaxCQs and MaxMRs bound the device's QPs, CQs and MRs.
	MaxQPs uint32 `json:"max_qps"`
	MaxCQs uint32 `json:"max_cqs"`
	MaxMRs uint32 `json:"max_mrs"`
	// MaxPinnedBytes is the device's pin quota; 0 means none.
	MaxPinnedBytes uint64 `json:"max_pinned_bytes"`
}

// AddRequest is the body of POST /v1/devices. Zero or absent fields take
// the daemon's defaults. The daemon checks it (internal/daemon
// DecodeAddRequest); the client sends it as it is.
type AddRequest struct {
	// ID names the device; it is also the QEMU device id vrdmactl vm attach
	// uses: a letter, then letters, digits, '-', '.', '_'; at most 64.
	ID string `json:"id"`
	// Socket is the absolute path of the vhost-user socket to serve.
	Socket string `json:"socket"`
	// Limits; absent or zero fields keep the defaults (rdma.DefaultLimits,
	// vrdmad --max-pinned).
	Limits *Limits `json:"limits,omitempty"`
	// GUID is the node GUID ("0211:2233:4455:6677" or 16 hex digits), a
	// locally administered unicast EUI-64; GID is port GID 0 (fe80::/64
	// with the GUID as interface ID); UUID identifies the device. Each is
	// derived from the others when absent, and from a random UUID when all
	// are; given together they must agree.
	GUID string `json:"guid,omitempty"`
	GID  string `json:"gid,omitempty"`
	UUID string `json:"uuid,omitempty"`
	// MAC pairs the device with the guest NIC of that address
	// ("52:54:00:12:34:56"): the node GUID is its EUI-64 (ff:fe inserted),
	// which must agree with guid, gid and uuid when they are given too.
	// The guest's kernel driver binds the RDMA port to that NIC.
	MAC string `json:"mac,omitempty"`
	// DoorbellQueues is the number of doorbell queues (one per guest
	// vCPU); 0 means 1.
	DoorbellQueues int `json:"doorbell_queues,omitempty"`
	// Share is the device's initial part of the engine; absent: weight 1,
	// no bounds. PATCH /v1/devices/{id} changes it later.
	Share *Share `json:"share,omitempty"`
	// RoCEBind are host addresses (IPv4 or IPv6, at most 15) the device's
	// RDMA traffic to other hosts leaves from, as RoCEv2 on UDP 4791,
	// instead of the daemon's (vrdmad --roce-bind). Their GIDs fill
	// entries 1, 2, … of the device's GID table.
	RoCEBind []string `json:"roce_bind,omitempty"`
	// Addresses are what the operator assigns the device, each an IP
	// address or a prefix ("10.11.0.5", "10.11.0.0/24", "2001:db8::/64";
	// at most 64): the guest's driver may add the GID of an address
	// within them to its GID table (ADD_GID), as a RoCE driver does for
	// its interface's addresses. GIDs is the same in GID notation (an
	// IPv4-mapped GID as ::ffff:a.b.c.d, a prefix as GID/len); the two
	// lists are merged. Without either the device holds only its port
	// GID and its network GIDs (docs/security.md).
	Addresses []string `json:"addresses,omitempty"`
	GIDs      []string `json:"gids,omitempty"`
	// RNIC chooses what executes the device's work: "soft" (the software
	// RNIC) or "verbs:DEVICE[:PORT]" (the host's RDMA NIC, e.g.
	// "verbs:mlx5_0" or "verbs:rxe0:1", through rdma-core's libibverbs:
	// guest memory is registered with the NIC at the guest's addresses
	// and the NIC moves the data). Absent: the daemon's default (vrdmad
	// --rnic). A verbs device sends from the NIC port's GIDs within
	// addresses (all of them when none are assigned) and takes no
	// roce_bind.
	RNIC string `json:"rnic,omitempty"`
	// Incoming makes the device the destination of a live migration: it
	// may share its UUID (guid, gid, mac) with a device of this vrdmad,
	// the source, and holds no GID and no QP number until QEMU loads the
	// source's state into it, which moves them over (from another host's
	// vrdmad: registers them). Its RoCEBind addresses are bound before
	// they are on an interface (IP_FREEBIND): they move to this host with
	// the VM. It is not saved in the state file until then. The soft RNIC
	// only; the UUID (or guid, gid, mac) is required.
	Incoming bool `json:"incoming,omitempty"`
}

// Removed is the answer of DELETE /v1/devices/{id}. (The fields are in
// key order: the answer reads as it did when it was a map.)
type Removed struct {
	ID      string `json:"id"`
	Removed bool   `json:"removed"`
	// StillListed is true when the device is gone but the state file
	// could not be rewritten without it: it comes back at the next start
	// unless a later change is saved. Warning then says so, for a person.
	StillListed bool   `json:"still_listed,omitempty"`
	Warning     string `json:"warning,omitempty"`
}

// Health statuses.
const (
	// StatusOK: no problem.
	StatusOK = "ok"
	// StatusDegraded: the daemon serves, but Problems lists something an
	// operator must look at.
	StatusDegraded = "degraded"
)

// Problem kinds.
const (
	// ProblemStateSave: the last write of the state file failed, so it
	// may not list the devices served. Cleared by the next write that
	// succeeds (any saved change, or SIGHUP).
	ProblemStateSave = "state_save_failed"
	// ProblemStateSetAside: a state file that could not be used was moved
	// aside (File) and its devices are not served. Cleared by an
	// acknowledgement (POST /v1/health/ack).
	ProblemStateSetAside = "state_file_set_aside"
)

// Health is the answer of GET /v1/health. (The fields are in key order,
// as above.)
type Health struct {
	// Devices is the number of devices the daemon serves.
	Devices int `json:"devices"`
	// EngineThreads is the number of engine workers the devices share
	// (vrdmad --engine-threads).
	EngineThreads int `json:"engine_threads"`
	// PinnedBytes is the guest memory pinned over all devices.
	PinnedBytes uint64 `json:"pinned_bytes"`
	// Problems are why Status is degraded, oldest first; never null.
	Problems []Problem `json:"problems"`
	// Revision is the source revision vrdmad was built from ("" when the
	// build recorded none).
	Revision string `json:"revision"`
	// Started is when the daemon started (RFC 3339, UTC).
	Started time.Time `json:"started"`
	// Status is StatusOK, or StatusDegraded while Problems is not empty.
	Status string `json:"status"`
	// UptimeSeconds is the time since Started, in whole seconds.
	UptimeSeconds int64 `json:"uptime_seconds"`
	// Version is vrdmad's release version ("devel" for a build from a
	// checkout).
	Version string `json:"version"`
}

// Problem is one reason a daemon is degraded.
type Problem struct {
	// ID names the problem in POST /v1/health/ack.
	ID string `json:"id"`
	// Kind is ProblemStateSave or ProblemStateSetAside; a client should
	// show an unknown kind as it shows the others.
	Kind string `json:"kind"`
	// Since is when the daemon found the problem (RFC 3339, UTC).
	Since time.Time `json:"since"`
	// Message says what is wrong and what to do.
	Message string `json:"message"`
	// File is the file concerned: the state file that could not be
	// written, or the copy an unusable one was moved to.
	File string `json:"file,omitempty"`
	// NeedsAck: only an acknowledgement clears the problem. Otherwise it
	// clears when its cause is gone.
	NeedsAck bool `json:"needs_ack"`
}

// AckRequest is the body of POST /v1/health/ack. An empty ID (or an
// empty body) acknowledges every problem that needs it.
type AckRequest struct {
	ID string `json:"id,omitempty"`
}

// AckAnswer is the answer of POST /v1/health/ack.
type AckAnswer struct {
	// Acknowledged are the IDs of the problems cleared; never null.
	Acknowledged []string `json:"acknowledged"`
	// Health is the daemon's health afterwards.
	Health Health `json:"health"`
}

// ErrorAnswer is the body of every answer that is not 2xx.
type ErrorAnswer struct {
	Error string `json:"error"`
}
