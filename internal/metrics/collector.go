package metrics

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/internal/daemon"
	abi "github.com/vrdma/vrdma/virtio/rdma"
)

// DeviceStats is one device's counters as a Source reports them.
type DeviceStats struct {
	ID        string
	Connected bool // a vhost-user front-end is connected now
	Device    rdma.Stats
	Server    backend.StatsSnapshot
}

// Source is what a Collector reads at scrape time. Implementations must be
// safe for concurrent use: scrapes may overlap.
type Source interface {
	// Snapshot returns every device's counters and the bytes pinned by
	// all devices together.
	Snapshot() (devices []DeviceStats, pinnedBytes uint64)
}

// DaemonSource is the Source of a running daemon.
type DaemonSource struct {
	D *daemon.Daemon
}

// Snapshot implements Source.
func (s DaemonSource) Snapshot() ([]DeviceStats, uint64) {
	devs := s.D.Devices()
	out := make([]DeviceStats, 0, len(devs))
	for _, dv := range devs {
		out = append(out, DeviceStats{
			ID:        dv.ID,
			Connected: dv.Server.Connected(),
			Device:    dv.Dev.Stats(),
			Server:    dv.Server.Stats(),
		})
	}
	return out, s.D.PinnedBytes()
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
var reportedStatuses = []uint8{
	abi.WCLocLenErr, abi.WCLocQPOpErr, abi.WCLocProtErr, abi.WCWRFlushErr,
	abi.WCBadRespErr, abi.WCLocAccessErr, abi.WCRemInvReqErr, abi.WCRemAccessErr,
	abi.WCRemOpErr, abi.WCRetryExcErr, abi.WCRNRRetryExcErr, abi.WCGeneralErr,
}

// WCStatusName is the status label value of a work completion status: its
// ibv_wc_status name without IBV_WC_, lower-case ("wr_flush_err"), or
// "status_N" for a value without a name.
func WCStatusName(s uint8) string {
	if int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("status_%d", s)
}

// Resource types, the values of vrdma_resources' type label.
var ResourceTypes = []string{"pd", "mr", "cq", "qp", "ah"}

// Collector is a prometheus.Collector over a Source.
type Collector struct {
	src Source // immutable

	pinned, cacheBytes, cacheHits, cacheMisses, cacheEvictions *prometheus.Desc
	resources, bytesMoved, ops, wcErrors                       *prometheus.Desc
	sessions, refused, messages, connected                     *prometheus.Desc
	ringErrors, protoErrors, interrupts, memTables             *prometheus.Desc
	commands, commandErrors, eventsLost, eventsDropped         *prometheus.Desc
	devices, pinnedTotal                                       *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a Collector reading src at every scrape.
func NewCollector(src Source) *Collector {
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
		devices:        prometheus.NewDesc("vrdma_devices", "Devices the daemon serves.", nil, nil),
		pinnedTotal:    prometheus.NewDesc("vrdma_pinned_bytes_total", "Bytes of guest memory pinned by all devices together.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.pinned, c.cacheBytes, c.cacheHits, c.cacheMisses, c.cacheEvictions,
		c.resources, c.bytesMoved, c.ops, c.wcErrors,
		c.sessions, c.refused, c.messages, c.connected,
		c.ringErrors, c.protoErrors, c.interrupts, c.memTables,
		c.commands, c.commandErrors, c.eventsLost, c.eventsDropped,
		c.devices, c.pinnedTotal,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	devs, pinned := c.src.Snapshot()
	seen := make(map[string]bool, len(devs))
	n := 0
	for i := range devs {
		ds := &devs[i]
		if seen[ds.ID] {
			continue
		}
		seen[ds.ID] = true
		n++
		c.collectDevice(ch, ds)
	}
	ch <- prometheus.MustNewConstMetric(c.devices, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(c.pinnedTotal, prometheus.GaugeValue, float64(pinned))
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
}
