package metrics

import (
	"fmt"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/backend/rdma/hostnic"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// DeviceStats is one device's counters as a Source reports them.
type DeviceStats struct {
	ID        string
	Connected bool // a vhost-user front-end is connected now
	Device    rdma.Stats
	Server    backend.StatsSnapshot
	Limits    Limits
	// Share is the device's part of the engine (weight 0 is exported as
	// 1, the weight in effect; a zero bound is not exported).
	Share rdma.Share
}

// Limits are a device's resource limits and pin quota, exported as
// gauges. A zero field is not exported (no limit known).
type Limits struct {
	// Resources by type, indexed as ResourceTypes (pd, mr, cq, qp, ah).
	Resources [5]uint32
	// PinnedBytes is the device's pin quota; zero means none.
	PinnedBytes uint64
}

// Snapshot is what a Source reports at one scrape.
type Snapshot struct {
	Devices []DeviceStats
	// PinnedBytes is the memory pinned by all devices together.
	PinnedBytes uint64
	// PinnedLimitBytes bounds PinnedBytes (--global-max-pinned); zero
	// means none and is not exported.
	PinnedLimitBytes uint64
	// EngineThreads is the number of engine workers the devices share;
	// zero means unknown and is not exported.
	EngineThreads int
	// RoCE are the daemon's RoCEv2 endpoints (vrdmad --roce-bind, a
	// device's roce_bind), one per host address.
	RoCE []RoCEEndpoint
	// HostNICs are the host RDMA NICs the daemon's verbs devices run on
	// (vrdmad --rnic verbs:DEVICE[:PORT]), one per host port.
	HostNICs []HostNIC
	// Degraded is the daemon's health (GET /v1/health): true while it
	// lists a problem.
	Degraded bool
	// StateSaveFailures counts the writes of the state file that failed.
	StateSaveFailures uint64
}

// HostNIC is one host NIC's counters; Name (verbs:DEVICE:PORT) is the
// value of the rnic label.
type HostNIC struct {
	Name  string
	Stats hostnic.Stats
}

// RoCEEndpoint is one RoCEv2 endpoint's counters; Addr is the value of
// the address label.
type RoCEEndpoint struct {
	Addr     string
	Counters udp.Counters
}

// RoCEDropReasons are the values of vrdma_roce_rx_dropped_total's reason
// label: why a datagram reached no QP.
var RoCEDropReasons = [...]string{"truncated", "malformed", "icrc", "unknown_qp", "wrong_peer"}

func roceDrops(c *udp.Counters) [len(RoCEDropReasons)]uint64 {
	return [...]uint64{c.RxTruncated, c.RxMalformed, c.RxICRC, c.RxUnknownQP, c.RxWrongPeer}
}

// Source is what a Collector reads at scrape time. Implementations must be
// safe for concurrent use: scrapes may overlap.
type Source interface {
	Snapshot() Snapshot
}

// DaemonSource is the Source of a running daemon.
type DaemonSource struct {
	D *daemon.Daemon
	// GlobalMaxPinned is the daemon's bound on the pinned bytes of all
	// devices (daemon.Config.GlobalMaxPinned); zero means none.
	GlobalMaxPinned uint64
}

// Snapshot implements Source.
func (s DaemonSource) Snapshot() Snapshot {
	devs := s.D.Devices()
	out := make([]DeviceStats, 0, len(devs))
	for _, dv := range devs {
		cs := dv.Dev.ConfigSpace()
		out = append(out, DeviceStats{
			ID:        dv.ID,
			Connected: dv.Server.Connected(),
			Device:    dv.Dev.Stats(),
			Server:    dv.Server.Stats(),
			Limits: Limits{
				Resources:   [5]uint32{cs.MaxPD, cs.MaxMR, cs.MaxCQ, cs.MaxQP, cs.MaxAH},
				PinnedBytes: dv.MaxPinned,
			},
			Share: dv.Dev.Share(),
		})
	}
	var roce []RoCEEndpoint
	if n := s.D.RoCE(); n != nil {
		for _, e := range n.Endpoints() {
			roce = append(roce, RoCEEndpoint{Addr: e.LocalAddr().Addr().String(), Counters: e.Counters()})
		}
	}
	var nics []HostNIC
	for _, n := range hostnic.Opened() {
		nics = append(nics, HostNIC{Name: n.Name(), Stats: n.Stats()})
	}
	return Snapshot{Devices: out, PinnedBytes: s.D.PinnedBytes(), PinnedLimitBytes: s.GlobalMaxPinned, EngineThreads: s.D.EngineThreads(),
		RoCE: roce, HostNICs: nics, Degraded: s.D.Degraded(), StateSaveFailures: s.D.StateSaveFailures()}
}

// Opcodes names the send opcodes, indexed as rdma.Stats.Engine.Ops is
// (by the WQE opcode, abi.WROp*): the values of the opcode label.
var Opcodes = [len(rdma.Stats{}.Engine.Ops)]string{
	abi.WROpSend:             "send",
	abi.WROpSendWithImm:      "send_with_imm",
	abi.WROpRDMAWrite:        "rdma_write",
	abi.WROpRDMAWriteWithImm: "rdma_write_with_imm",
	abi.WROpRDMARead:         "rdma_read",
	abi.WROpAtomicCmpSwp:     "atomic_cmp_swp",
	abi.WROpAtomicFetchAdd:   "atomic_fetch_add",
}

// wcStatusNames are the ibv_wc_status names (IBV_WC_ prefix dropped,
// lower-case) by value.
var wcStatusNames = [...]string{
	0:  "success",
	1:  "loc_len_err",
	2:  "loc_qp_op_err",
	3:  "loc_eec_op_err",
	4:  "loc_prot_err",
	5:  "wr_flush_err",
	6:  "mw_bind_err",
	7:  "bad_resp_err",
	8:  "loc_access_err",
	9:  "rem_inv_req_err",
	10: "rem_access_err",
	11: "rem_op_err",
	12: "retry_exc_err",
	13: "rnr_retry_exc_err",
	14: "loc_rdd_viol_err",
	15: "rem_inv_rd_req_err",
	16: "rem_abort_err",
	17: "inv_eecn_err",
	18: "inv_eec_state_err",
	19: "fatal_err",
	20: "resp_timeout_err",
	21: "general_err",
	22: "tm_err",
	23: "tm_rndv_incomplete",
}

// reportedStatuses are the error statuses the engine produces; each is
// reported for every device even at zero, so rate() works from the first
// error on.
var reportedStatuses = []abi.WCStatus{
	abi.WCLocLenErr, abi.WCLocQPOpErr, abi.WCLocProtErr, abi.WCWRFlushErr,
	abi.WCBadRespErr, abi.WCLocAccessErr, abi.WCRemInvReqErr, abi.WCRemAccessErr,
	abi.WCRemOpErr, abi.WCRetryExcErr, abi.WCRNRRetryExcErr, abi.WCGeneralErr,
}

// WCStatusName is the status label value of a work completion status: its
// ibv_wc_status name without IBV_WC_, lower-case ("wr_flush_err"), or
// "status_N" for a value without a name.
func WCStatusName(s abi.WCStatus) string {
	if int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("status_%d", s)
}

// ResourceTypes are the values of the type label of vrdma_resources and
// vrdma_resource_limit, in the order of Limits.Resources.
var ResourceTypes = [5]string{"pd", "mr", "cq", "qp", "ah"}

// Collector is a prometheus.Collector over a Source.
type Collector struct {
	src Source // immutable

	pinned, cacheBytes, cacheHits, cacheMisses, cacheEvictions              *prometheus.Desc
	resources, bytesMoved, ops, wcErrors                                    *prometheus.Desc
	sessions, refused, messages, connected                                  *prometheus.Desc
	ringErrors, protoErrors, interrupts, memTables                          *prometheus.Desc
	commands, commandErrors, eventsLost, eventsDropped                      *prometheus.Desc
	wrongPeer, udDropped                                                    *prometheus.Desc
	resourceLimit, pinnedLimit                                              *prometheus.Desc
	shareWeight, rateLimitBytes, rateLimitOps                               *prometheus.Desc
	devices, globalPinned, globalPinnedLimit, buildInfo                     *prometheus.Desc
	engineThreads, degraded, saveFailures                                   *prometheus.Desc
	build                                                                   BuildInfo
	roceRx, roceDelivered, roceDropped, roceRecovered, roceTx, roceTxErrors *prometheus.Desc
	nicPosted, nicPostSeconds, nicCompletions, nicCQEvents, nicAsyncEvents  *prometheus.Desc
}

// BuildInfo labels vrdma_build_info.
type BuildInfo struct {
	Version   string // the program's version ("devel" when empty)
	Revision  string // VCS revision ("unknown" when empty)
	GoVersion string // runtime.Version() when empty
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a Collector reading src at every scrape; bi labels
// vrdma_build_info (its zero fields are filled in, see BuildInfo).
func NewCollector(src Source, bi BuildInfo) *Collector {
	dev := []string{"device"}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("vrdma_"+name, help, append(dev[:1:1], labels...), nil)
	}
	return &Collector{
		src:            src,
		pinned:         d("pinned_bytes", "Bytes of guest memory pinned (mlocked) for registered memory regions."),
		cacheBytes:     d("map_cache_bytes", "Bytes of released pins kept locked in the map cache."),
		cacheHits:      d("map_cache_hits_total", "Pages pinned again from the map cache, without a new mlock."),
		cacheMisses:    d("map_cache_misses_total", "Pages pinned that had to be mlocked."),
		cacheEvictions: d("map_cache_evictions_total", "Cached pages unlocked to respect the cache size or a pin quota."),
		resources:      d("resources", "RDMA objects the guest has created, by type.", "type"),
		bytesMoved:     d("bytes_moved_total", "Payload bytes moved by successful work requests (as requester)."),
		ops:            d("operations_total", "Successful send-queue work requests, by opcode.", "opcode"),
		wcErrors:       d("completion_errors_total", "Error work completions (written or lost), by ibv_wc_status.", "status"),
		sessions:       d("vhost_user_sessions_total", "vhost-user front-end connections accepted."),
		refused:        d("vhost_user_refused_total", "vhost-user connections refused because a front-end was connected."),
		messages:       d("vhost_user_messages_total", "vhost-user messages handled."),
		connected:      d("vhost_user_connected", "1 while a vhost-user front-end is connected, else 0."),
		ringErrors:     d("ring_errors_total", "Virtqueues put in the broken state because of bad guest input."),
		protoErrors:    d("protocol_errors_total", "vhost-user protocol errors (bad messages from the front-end)."),
		interrupts:     d("interrupts_total", "Used-buffer notifications sent to the guest."),
		memTables:      d("vhost_user_mem_tables_total", "Memory tables installed by the front-end."),
		commands:       d("control_commands_total", "Control-queue commands executed."),
		commandErrors:  d("control_command_errors_total", "Control-queue commands that failed."),
		eventsLost:     d("events_lost_total", "Asynchronous events the guest did not receive (event queue full)."),
		eventsDropped:  d("events_dropped_total", "Asynchronous events raised while no guest was attached."),
		wrongPeer: d("wrong_peer_requests_total",
			"Requests that reached one of the device's QPs from a QP it is not connected to (another tenant's, say): answered as to a QP that does not exist."),
		udDropped: d("ud_dropped_total",
			"UD datagrams that reached the device and were dropped: to a QP that does not exist, is not UD, is not in RTR or RTS, holds another Q_Key or has no receive WQE."),
		resourceLimit:  d("resource_limit", "Most RDMA objects of a type the guest may create (device limit).", "type"),
		pinnedLimit:    d("pinned_limit_bytes", "Pin quota of the device in bytes; absent when it has none."),
		shareWeight:    d("share_weight", "Weight of the device in the engine's round robin over busy devices (1 to 1000)."),
		rateLimitBytes: d("rate_limit_bytes_per_second", "Bound on the payload bytes the device moves per second; absent when it has none."),
		rateLimitOps:   d("rate_limit_operations_per_second", "Bound on the work requests the device executes per second; absent when it has none."),
		devices:        prometheus.NewDesc("vrdma_devices", "Devices the daemon serves.", nil, nil),
		globalPinned:   prometheus.NewDesc("vrdma_global_pinned_bytes", "Bytes of guest memory pinned by all devices together.", nil, nil),
		globalPinnedLimit: prometheus.NewDesc("vrdma_global_pinned_limit_bytes",
			"Bound on the bytes pinned by all devices together (--global-max-pinned); absent when there is none.", nil, nil),
		engineThreads: prometheus.NewDesc("vrdma_engine_threads", "Engine workers serving the doorbell queues of all devices (--engine-threads).", nil, nil),
		degraded: prometheus.NewDesc("vrdma_health_degraded",
			"1 while the daemon is degraded (GET /v1/health lists a problem: the state file could not be written, or an unusable one was set aside), else 0.", nil, nil),
		saveFailures: prometheus.NewDesc("vrdma_state_save_failures_total",
			"Writes of the device state file that failed (the change was undone, or a removed device is still listed).", nil, nil),
		roceRx: prometheus.NewDesc("vrdma_roce_rx_datagrams_total", "UDP datagrams received by a RoCEv2 endpoint (one per host address).",
			[]string{"address"}, nil),
		roceDelivered: prometheus.NewDesc("vrdma_roce_rx_delivered_total", "Received RoCEv2 packets handed to a QP.",
			[]string{"address"}, nil),
		roceDropped: prometheus.NewDesc("vrdma_roce_rx_dropped_total", "Received datagrams dropped before any QP saw them, by reason.",
			[]string{"address", "reason"}, nil),
		roceRecovered: prometheus.NewDesc("vrdma_roce_rx_recovered_ipv4_id_total",
			"IPv4 RoCEv2 packets whose ICRC matched only with their sender's IP identification (Linux rxe's).", []string{"address"}, nil),
		roceTx: prometheus.NewDesc("vrdma_roce_tx_datagrams_total", "RoCEv2 packets sent.", []string{"address"}, nil),
		roceTxErrors: prometheus.NewDesc("vrdma_roce_tx_errors_total", "RoCEv2 packets the socket refused (lost; the transport recovers them).",
			[]string{"address"}, nil),
		nicPosted: prometheus.NewDesc("vrdma_hostnic_posted_work_requests_total",
			"Work requests (send and receive) posted to a host RDMA NIC by the verbs devices on it.", []string{"rnic"}, nil),
		nicPostSeconds: prometheus.NewDesc("vrdma_hostnic_post_seconds_total",
			"Time spent inside ibv_post_send and ibv_post_recv of a host RDMA NIC (the provider's part of a work request's cost).", []string{"rnic"}, nil),
		nicCompletions: prometheus.NewDesc("vrdma_hostnic_completions_total", "Work completions polled from a host RDMA NIC's CQs.", []string{"rnic"}, nil),
		nicCQEvents:    prometheus.NewDesc("vrdma_hostnic_cq_events_total", "Completion events of a host RDMA NIC's completion channel.", []string{"rnic"}, nil),
		nicAsyncEvents: prometheus.NewDesc("vrdma_hostnic_async_events_total", "Asynchronous events of a host RDMA NIC (port, QP and device events).", []string{"rnic"}, nil),
		buildInfo: prometheus.NewDesc("vrdma_build_info", "Always 1; the labels describe the running build.",
			[]string{"version", "revision", "goversion", "goos", "goarch"}, nil),
		build: bi.withDefaults(),
	}
}

func (bi BuildInfo) withDefaults() BuildInfo {
	if bi.Version == "" {
		bi.Version = "devel"
	}
	if bi.Revision == "" {
		bi.Revision = "unknown"
	}
	if bi.GoVersion == "" {
		bi.GoVersion = runtime.Version()
	}
	return bi
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.pinned, c.cacheBytes, c.cacheHits, c.cacheMisses, c.cacheEvictions,
		c.resources, c.bytesMoved, c.ops, c.wcErrors,
		c.sessions, c.refused, c.messages, c.connected,
		c.ringErrors, c.protoErrors, c.interrupts, c.memTables,
		c.commands, c.commandErrors, c.eventsLost, c.eventsDropped, c.wrongPeer, c.udDropped,
		c.resourceLimit, c.pinnedLimit,
		c.shareWeight, c.rateLimitBytes, c.rateLimitOps,
		c.devices, c.globalPinned, c.globalPinnedLimit, c.buildInfo, c.engineThreads, c.degraded, c.saveFailures,
		c.roceRx, c.roceDelivered, c.roceDropped, c.roceRecovered, c.roceTx, c.roceTxErrors,
		c.nicPosted, c.nicPostSeconds, c.nicCompletions, c.nicCQEvents, c.nicAsyncEvents,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	snap := c.src.Snapshot()
	seen := make(map[string]bool, len(snap.Devices))
	n := 0
	for i := range snap.Devices {
		ds := &snap.Devices[i]
		if seen[ds.ID] {
			continue
		}
		seen[ds.ID] = true
		n++
		c.collectDevice(ch, ds)
	}
	ch <- prometheus.MustNewConstMetric(c.devices, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(c.globalPinned, prometheus.GaugeValue, float64(snap.PinnedBytes))
	if snap.PinnedLimitBytes != 0 {
		ch <- prometheus.MustNewConstMetric(c.globalPinnedLimit, prometheus.GaugeValue, float64(snap.PinnedLimitBytes))
	}
	if snap.EngineThreads != 0 {
		ch <- prometheus.MustNewConstMetric(c.engineThreads, prometheus.GaugeValue, float64(snap.EngineThreads))
	}
	degraded := 0.0
	if snap.Degraded {
		degraded = 1
	}
	ch <- prometheus.MustNewConstMetric(c.degraded, prometheus.GaugeValue, degraded)
	ch <- prometheus.MustNewConstMetric(c.saveFailures, prometheus.CounterValue, float64(snap.StateSaveFailures))
	for i := range snap.RoCE {
		e := &snap.RoCE[i]
		k := &e.Counters
		counter := func(d *prometheus.Desc, v uint64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{e.Addr}, labels...)...)
		}
		counter(c.roceRx, k.RxDatagrams)
		counter(c.roceDelivered, k.RxDelivered)
		for j, v := range roceDrops(k) {
			counter(c.roceDropped, v, RoCEDropReasons[j])
		}
		counter(c.roceRecovered, k.RxRecoveredID)
		counter(c.roceTx, k.TxDatagrams)
		counter(c.roceTxErrors, k.TxErrors)
	}
	for i := range snap.HostNICs {
		n := &snap.HostNICs[i]
		counter := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, n.Name)
		}
		counter(c.nicPosted, float64(n.Stats.Posted))
		counter(c.nicPostSeconds, float64(n.Stats.PostNanos)/1e9)
		counter(c.nicCompletions, float64(n.Stats.Completions))
		counter(c.nicCQEvents, float64(n.Stats.CQEvents))
		counter(c.nicAsyncEvents, float64(n.Stats.AsyncEvents))
	}
	b := c.build
	ch <- prometheus.MustNewConstMetric(c.buildInfo, prometheus.GaugeValue, 1, b.Version, b.Revision, b.GoVersion, runtime.GOOS, runtime.GOARCH)
}

func (c *Collector) collectDevice(ch chan<- prometheus.Metric, ds *DeviceStats) {
	id := ds.ID
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{id}, labels...)...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{id}, labels...)...)
	}
	st, sv := &ds.Device, &ds.Server

	gauge(c.pinned, float64(st.Pin.PinnedBytes))
	gauge(c.cacheBytes, float64(st.Pin.CachedBytes))
	counter(c.cacheHits, st.Pin.CacheHits)
	counter(c.cacheMisses, st.Pin.CacheMisses)
	counter(c.cacheEvictions, st.Pin.Evictions)

	for i, n := range []int{st.PDs, st.MRs, st.CQs, st.QPs, st.AHs} {
		gauge(c.resources, float64(n), ResourceTypes[i])
	}
	for i, n := range ds.Limits.Resources {
		if n != 0 {
			gauge(c.resourceLimit, float64(n), ResourceTypes[i])
		}
	}
	if q := ds.Limits.PinnedBytes; q != 0 {
		gauge(c.pinnedLimit, float64(q))
	}
	w := ds.Share.Weight
	if w == 0 {
		w = 1
	}
	gauge(c.shareWeight, float64(w))
	if b := ds.Share.MaxBytesPerSec; b != 0 {
		gauge(c.rateLimitBytes, float64(b))
	}
	if o := ds.Share.MaxOpsPerSec; o != 0 {
		gauge(c.rateLimitOps, float64(o))
	}
	counter(c.bytesMoved, st.Engine.BytesMoved)
	for op, n := range st.Engine.Ops {
		counter(c.ops, n, Opcodes[op])
	}
	done := make(map[string]bool, len(reportedStatuses)+len(st.Engine.CompletionErrors))
	for _, s := range reportedStatuses {
		name := WCStatusName(s)
		done[name] = true
		counter(c.wcErrors, st.Engine.CompletionErrors[s], name)
	}
	for s, n := range st.Engine.CompletionErrors {
		if name := WCStatusName(s); !done[name] {
			done[name] = true
			counter(c.wcErrors, n, name)
		}
	}

	counter(c.sessions, sv.Sessions)
	counter(c.refused, sv.Refused)
	counter(c.messages, sv.Messages)
	connected := 0.0
	if ds.Connected {
		connected = 1
	}
	gauge(c.connected, connected)
	counter(c.ringErrors, sv.RingErrors)
	counter(c.protoErrors, sv.ProtocolErrors)
	counter(c.interrupts, sv.Interrupts)
	counter(c.memTables, sv.MemTables)

	counter(c.commands, st.Commands)
	counter(c.commandErrors, st.Errors)
	counter(c.eventsLost, st.EventsLost)
	counter(c.eventsDropped, st.Engine.EventsDropped)
	counter(c.wrongPeer, st.Engine.WrongPeer)
	counter(c.udDropped, st.Engine.UDDropped)
}
