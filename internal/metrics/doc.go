// Package metrics exports vrdmad's counters to Prometheus.
//
// A [Collector] reads a [Source] (in vrdmad, the daemon's device set) at
// scrape time: every value is taken from the counters the devices already
// keep (rdma.Device.Stats, backend.Server.Stats, the daemon's pin
// accounting), so the data path never updates a metric. [Listen] serves
// the collector (plus the Go runtime and process collectors) on /metrics
// over TCP ("host:port") or a unix socket ("unix:PATH").
//
// Metric names all start with vrdma_ and per-device series carry the label
// device (the device ID); the other labels have fixed value sets (type,
// opcode, status), so series grow with devices only. Besides the counters
// and gauges of each device there are its limits (vrdma_resource_limit,
// vrdma_pinned_limit_bytes), its share of the engine (vrdma_share_weight,
// vrdma_rate_limit_bytes_per_second, vrdma_rate_limit_operations_per_second),
// the daemon's totals (vrdma_engine_threads among them), the counters of
// each host RDMA NIC the verbs devices run on (vrdma_hostnic_*, label
// rnic: work requests posted, time inside ibv_post_send/recv,
// completions, events), the daemon's health (vrdma_health_degraded,
// vrdma_state_save_failures_total) and vrdma_build_info (its version and
// revision labels from internal/version).
// The names follow Prometheus's conventions as `promtool check metrics`
// enforces them (counters end in _total, gauges do not, base units, help
// text everywhere); the tests run promtool on a live scrape.
// docs/packaging.md lists them; the names are a contract with dashboards
// and alerts, so renaming one is a breaking change (vrdma_pinned_bytes_total,
// a gauge, became vrdma_global_pinned_bytes for the convention).
//
// Non-goals: pushing metrics, histograms of per-operation latency (that
// would need work on the data path), and authentication: bind the TCP
// address to loopback or a management network, or use a unix socket.
//
// Invariants:
//   - A scrape never blocks the data path for longer than the stats calls
//     it makes (each takes a device's own lock briefly).
//   - A scrape never fails because of the values it reads: a device seen
//     twice is reported once, a completion status without a name is
//     reported as "status_N".
//
// Lock order: Collector holds no lock; Source implementations take their
// own (daemon.Daemon.mu, then each device's locks, one at a time).
package metrics
