package metrics

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// fakeSource is a Source with fixed values.
type fakeSource struct {
	mu      sync.Mutex
	devs    []DeviceStats
	pinned  uint64
	limit   uint64
	threads int
	roce    []RoCEEndpoint
	nics    []HostNIC
	// degraded and saveFailures are the daemon's health.
	degraded     bool
	saveFailures uint64
}

func (f *fakeSource) Snapshot() Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Snapshot{Devices: append([]DeviceStats(nil), f.devs...), PinnedBytes: f.pinned, PinnedLimitBytes: f.limit, EngineThreads: f.threads,
		RoCE: f.roce, HostNICs: f.nics, Degraded: f.degraded, StateSaveFailures: f.saveFailures}
}

// scrape serves h with httptest and returns the parsed families.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	ts := httptest.NewServer(h)
	defer ts.Close()
	return scrapeURL(t, ts.Client(), ts.URL+"/metrics")
}

func scrapeURL(t *testing.T, c *http.Client, url string) map[string]*dto.MetricFamily {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape: got status %d, want 200: %s", resp.StatusCode, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse scrape: %v", err)
	}
	return fams
}

// value returns the value of the series of name with exactly labels, and
// whether it exists.
func value(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		for _, l := range m.GetLabel() {
			if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		default:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

func dev(id string) map[string]string { return map[string]string{"device": id} }

func with(l map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for a, b := range l {
		out[a] = b
	}
	return out
}

func TestCollectorValues(t *testing.T) {
	a := DeviceStats{
		ID:        "vm1",
		Connected: true,
		Device: rdma.Stats{
			Commands: 11, Errors: 2, PDs: 1, MRs: 3, CQs: 2, QPs: 4, AHs: 5,
			Pin: memmap.PinStats{PinnedBytes: 8 << 20, CachedBytes: 1 << 20, CacheHits: 7, CacheMisses: 9, Evictions: 3},
			Engine: engine.Stats{
				BytesMoved:       123456,
				Ops:              [7]uint64{1, 2, 3, 4, 5, 6, 7},
				CompletionErrors: map[abi.WCStatus]uint64{abi.WCWRFlushErr: 12, abi.WCRemAccessErr: 1, 30: 2},
				EventsDropped:    4,
				WrongPeer:        6,
			},
			EventsLost: 6,
		},
		Server: backend.StatsSnapshot{Sessions: 3, Refused: 1, Messages: 100, ProtocolErrors: 2, RingErrors: 1, Interrupts: 50, MemTables: 2},
		Limits: Limits{Resources: [5]uint32{256, 4096, 1024, 32, 1024}, PinnedBytes: 64 << 20},
		Share:  rdma.Share{Weight: 4, MaxBytesPerSec: 1 << 30, MaxOpsPerSec: 100000},
	}
	b := DeviceStats{ID: "vm2"}
	src := &fakeSource{devs: []DeviceStats{a, b, a}, pinned: 9 << 20, limit: 1 << 30, threads: 2, degraded: true, saveFailures: 3}
	h, err := Handler(src, WithVersion("1.2.3"))
	if err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, h)

	tests := []struct {
		name   string
		labels map[string]string
		want   float64
		typ    dto.MetricType
	}{
		{"vrdma_pinned_bytes", dev("vm1"), 8 << 20, dto.MetricType_GAUGE},
		{"vrdma_pinned_bytes", dev("vm2"), 0, dto.MetricType_GAUGE},
		{"vrdma_map_cache_bytes", dev("vm1"), 1 << 20, dto.MetricType_GAUGE},
		{"vrdma_map_cache_hits_total", dev("vm1"), 7, dto.MetricType_COUNTER},
		{"vrdma_map_cache_misses_total", dev("vm1"), 9, dto.MetricType_COUNTER},
		{"vrdma_map_cache_evictions_total", dev("vm1"), 3, dto.MetricType_COUNTER},
		{"vrdma_resources", with(dev("vm1"), "type", "pd"), 1, dto.MetricType_GAUGE},
		{"vrdma_resources", with(dev("vm1"), "type", "mr"), 3, dto.MetricType_GAUGE},
		{"vrdma_resources", with(dev("vm1"), "type", "cq"), 2, dto.MetricType_GAUGE},
		{"vrdma_resources", with(dev("vm1"), "type", "qp"), 4, dto.MetricType_GAUGE},
		{"vrdma_resources", with(dev("vm1"), "type", "ah"), 5, dto.MetricType_GAUGE},
		{"vrdma_bytes_moved_total", dev("vm1"), 123456, dto.MetricType_COUNTER},
		{"vrdma_operations_total", with(dev("vm1"), "opcode", "send"), 1, dto.MetricType_COUNTER},
		{"vrdma_operations_total", with(dev("vm1"), "opcode", "send_with_imm"), 2, dto.MetricType_COUNTER},
		{"vrdma_operations_total", with(dev("vm1"), "opcode", "rdma_write"), 3, dto.MetricType_COUNTER},
		{"vrdma_operations_total", with(dev("vm1"), "opcode", "rdma_write_with_imm"), 4, dto.MetricType_COUNTER},
		{"vrdma_operations_total", with(dev("vm1"), "opcode", "rdma_read"), 5, dto.MetricType_COUNTER},
		{"vrdma_operations_total", with(dev("vm1"), "opcode", "atomic_cmp_swp"), 6, dto.MetricType_COUNTER},
		{"vrdma_operations_total", with(dev("vm1"), "opcode", "atomic_fetch_add"), 7, dto.MetricType_COUNTER},
		{"vrdma_completion_errors_total", with(dev("vm1"), "status", "wr_flush_err"), 12, dto.MetricType_COUNTER},
		{"vrdma_completion_errors_total", with(dev("vm1"), "status", "rem_access_err"), 1, dto.MetricType_COUNTER},
		{"vrdma_completion_errors_total", with(dev("vm1"), "status", "status_30"), 2, dto.MetricType_COUNTER},
		{"vrdma_completion_errors_total", with(dev("vm1"), "status", "loc_len_err"), 0, dto.MetricType_COUNTER},
		{"vrdma_completion_errors_total", with(dev("vm2"), "status", "general_err"), 0, dto.MetricType_COUNTER},
		{"vrdma_vhost_user_sessions_total", dev("vm1"), 3, dto.MetricType_COUNTER},
		{"vrdma_vhost_user_refused_total", dev("vm1"), 1, dto.MetricType_COUNTER},
		{"vrdma_vhost_user_messages_total", dev("vm1"), 100, dto.MetricType_COUNTER},
		{"vrdma_vhost_user_mem_tables_total", dev("vm1"), 2, dto.MetricType_COUNTER},
		{"vrdma_vhost_user_connected", dev("vm1"), 1, dto.MetricType_GAUGE},
		{"vrdma_vhost_user_connected", dev("vm2"), 0, dto.MetricType_GAUGE},
		{"vrdma_ring_errors_total", dev("vm1"), 1, dto.MetricType_COUNTER},
		{"vrdma_protocol_errors_total", dev("vm1"), 2, dto.MetricType_COUNTER},
		{"vrdma_interrupts_total", dev("vm1"), 50, dto.MetricType_COUNTER},
		{"vrdma_control_commands_total", dev("vm1"), 11, dto.MetricType_COUNTER},
		{"vrdma_control_command_errors_total", dev("vm1"), 2, dto.MetricType_COUNTER},
		{"vrdma_events_lost_total", dev("vm1"), 6, dto.MetricType_COUNTER},
		{"vrdma_events_dropped_total", dev("vm1"), 4, dto.MetricType_COUNTER},
		{"vrdma_wrong_peer_requests_total", dev("vm1"), 6, dto.MetricType_COUNTER},
		{"vrdma_resource_limit", with(dev("vm1"), "type", "pd"), 256, dto.MetricType_GAUGE},
		{"vrdma_resource_limit", with(dev("vm1"), "type", "mr"), 4096, dto.MetricType_GAUGE},
		{"vrdma_resource_limit", with(dev("vm1"), "type", "cq"), 1024, dto.MetricType_GAUGE},
		{"vrdma_resource_limit", with(dev("vm1"), "type", "qp"), 32, dto.MetricType_GAUGE},
		{"vrdma_resource_limit", with(dev("vm1"), "type", "ah"), 1024, dto.MetricType_GAUGE},
		{"vrdma_pinned_limit_bytes", dev("vm1"), 64 << 20, dto.MetricType_GAUGE},
		{"vrdma_share_weight", dev("vm1"), 4, dto.MetricType_GAUGE},
		{"vrdma_share_weight", dev("vm2"), 1, dto.MetricType_GAUGE}, // weight 0 is 1
		{"vrdma_rate_limit_bytes_per_second", dev("vm1"), 1 << 30, dto.MetricType_GAUGE},
		{"vrdma_rate_limit_operations_per_second", dev("vm1"), 100000, dto.MetricType_GAUGE},
		{"vrdma_engine_threads", nil, 2, dto.MetricType_GAUGE},
		{"vrdma_devices", nil, 2, dto.MetricType_GAUGE},
		{"vrdma_global_pinned_bytes", nil, 9 << 20, dto.MetricType_GAUGE},
		{"vrdma_global_pinned_limit_bytes", nil, 1 << 30, dto.MetricType_GAUGE},
		{"vrdma_health_degraded", nil, 1, dto.MetricType_GAUGE},
		{"vrdma_state_save_failures_total", nil, 3, dto.MetricType_COUNTER},
		{"vrdma_build_info", map[string]string{"version": "1.2.3", "revision": "unknown", "goversion": runtime.Version(),
			"goos": runtime.GOOS, "goarch": runtime.GOARCH}, 1, dto.MetricType_GAUGE},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s%v", tt.name, tt.labels), func(t *testing.T) {
			got, ok := value(fams, tt.name, tt.labels)
			if !ok {
				t.Fatalf("no series %s%v", tt.name, tt.labels)
			}
			if got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
			if typ := fams[tt.name].GetType(); typ != tt.typ {
				t.Errorf("got type %v, want %v", typ, tt.typ)
			}
		})
	}

	t.Run("series counts", func(t *testing.T) {
		// vm1 twice in the source is reported once.
		for name, want := range map[string]int{
			"vrdma_pinned_bytes":                     2,
			"vrdma_pinned_limit_bytes":               1, // vm2 has no quota: no series
			"vrdma_share_weight":                     2,
			"vrdma_rate_limit_bytes_per_second":      1, // vm2 has no bounds: no series
			"vrdma_rate_limit_operations_per_second": 1,
			"vrdma_resource_limit":                   len(ResourceTypes),
			"vrdma_build_info":                       1,
			"vrdma_resources":                        2 * len(ResourceTypes),
			"vrdma_operations_total":                 2 * len(Opcodes),
			"vrdma_completion_errors_total":          2*len(reportedStatuses) + 1,
		} {
			if got := len(fams[name].GetMetric()); got != want {
				t.Errorf("%s: got %d series, want %d", name, got, want)
			}
		}
	})
	t.Run("runtime collectors", func(t *testing.T) {
		for _, name := range []string{"go_goroutines", "process_open_fds"} {
			if fams[name] == nil {
				t.Errorf("no %s", name)
			}
		}
	})
	t.Run("names", func(t *testing.T) {
		var bad []string
		for name := range fams {
			if !strings.HasPrefix(name, "vrdma_") && !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") && !strings.HasPrefix(name, "promhttp_") {
				bad = append(bad, name)
			}
		}
		sort.Strings(bad)
		if len(bad) > 0 {
			t.Errorf("got metrics without the vrdma_ prefix: %v", bad)
		}
	})
}

func TestWCStatusName(t *testing.T) {
	tests := []struct {
		s    abi.WCStatus
		want string
	}{
		{abi.WCSuccess, "success"},
		{abi.WCLocLenErr, "loc_len_err"},
		{abi.WCLocQPOpErr, "loc_qp_op_err"},
		{abi.WCLocProtErr, "loc_prot_err"},
		{abi.WCWRFlushErr, "wr_flush_err"},
		{abi.WCBadRespErr, "bad_resp_err"},
		{abi.WCLocAccessErr, "loc_access_err"},
		{abi.WCRemInvReqErr, "rem_inv_req_err"},
		{abi.WCRemAccessErr, "rem_access_err"},
		{abi.WCRemOpErr, "rem_op_err"},
		{abi.WCRetryExcErr, "retry_exc_err"},
		{abi.WCRNRRetryExcErr, "rnr_retry_exc_err"},
		{abi.WCGeneralErr, "general_err"},
		{23, "tm_rndv_incomplete"},
		{24, "status_24"},
		{255, "status_255"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := WCStatusName(tt.s); got != tt.want {
				t.Errorf("WCStatusName(%d): got %q, want %q", tt.s, got, tt.want)
			}
		})
	}
}

func TestParseAddr(t *testing.T) {
	tests := []struct {
		addr, network, address string
		err                    error
	}{
		{"127.0.0.1:9464", "tcp", "127.0.0.1:9464", nil},
		{":9464", "tcp", ":9464", nil},
		{"[::1]:0", "tcp", "[::1]:0", nil},
		{"localhost:65535", "tcp", "localhost:65535", nil},
		{"unix:/run/vrdma/metrics.sock", "unix", "/run/vrdma/metrics.sock", nil},
		{"unix:", "", "", ErrInvalidAddr},
		{"unix:/" + strings.Repeat("x", 200), "", "", ErrInvalidAddr},
		{"unix:/a\x00b", "", "", ErrInvalidAddr},
		{"127.0.0.1", "", "", ErrInvalidAddr},
		{"127.0.0.1:http", "", "", ErrInvalidAddr},
		{"127.0.0.1:65536", "", "", ErrInvalidAddr},
		{"127.0.0.1:-1", "", "", ErrInvalidAddr},
		{"", "", "", ErrInvalidAddr},
		{"/run/x.sock", "", "", ErrInvalidAddr},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			network, address, err := ParseAddr(tt.addr)
			if !errors.Is(err, tt.err) {
				t.Fatalf("got error %v, want %v", err, tt.err)
			}
			if err != nil {
				var le *ListenError
				if !errors.As(err, &le) || le.Addr != tt.addr {
					t.Errorf("got %#v, want a *ListenError for %q", err, tt.addr)
				}
				if network != "" || address != "" {
					t.Errorf("error with a result: got %q %q", network, address)
				}
				return
			}
			if network != tt.network || address != tt.address {
				t.Errorf("got %q %q, want %q %q", network, address, tt.network, tt.address)
			}
		})
	}
}

func TestListenTCP(t *testing.T) {
	src := &fakeSource{devs: []DeviceStats{{ID: "d0"}}, pinned: 4096}
	s, err := Listen("127.0.0.1:0", src, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	url := "http://" + s.Addr().String()
	fams := scrapeURL(t, http.DefaultClient, url+"/metrics")
	if got, _ := value(fams, "vrdma_global_pinned_bytes", nil); got != 4096 {
		t.Errorf("vrdma_global_pinned_bytes: got %v, want 4096", got)
	}

	t.Run("other paths", func(t *testing.T) {
		resp, err := http.Get(url + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET /: got status %d, want 404", resp.StatusCode)
		}
	})
	t.Run("in use", func(t *testing.T) {
		s2, err := Listen(s.Addr().String(), src, nil)
		if err == nil {
			s2.Close()
			t.Fatal("second Listen on the same port: got nil error")
		}
		if !errors.Is(err, ErrAddrInUse) {
			t.Errorf("got %v, want ErrAddrInUse", err)
		}
		if s2 != nil {
			t.Errorf("error with a server: %v", s2)
		}
		if !strings.Contains(err.Error(), s.Addr().String()) || !strings.Contains(err.Error(), "in use") {
			t.Errorf("error %q does not name the address and say it is in use", err)
		}
	})
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := http.Get(url + "/metrics"); err == nil {
		t.Error("scrape after Close: got nil error")
	}
}

func TestListenUnix(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "metrics.sock")
	src := &fakeSource{pinned: 1}
	s, err := Listen("unix:"+path, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o660 {
		t.Errorf("socket mode: got %v, want 0660", got)
	}
	c := controlapi.HTTPClient(path, 0)
	fams := scrapeURL(t, c, "http://vrdmad/metrics")
	if got, ok := value(fams, "vrdma_devices", nil); !ok || got != 0 {
		t.Errorf("vrdma_devices: got %v (%v), want 0", got, ok)
	}

	t.Run("in use", func(t *testing.T) {
		_, err := Listen("unix:"+path, src, nil)
		if !errors.Is(err, ErrAddrInUse) {
			t.Errorf("got %v, want ErrAddrInUse", err)
		}
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after Close: got %v, want it removed", err)
	}

	t.Run("stale socket", func(t *testing.T) {
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
		s, err := Listen("unix:"+path, src, nil)
		if err != nil {
			t.Fatalf("over a stale socket: %v", err)
		}
		s.Close()
	})
	t.Run("not a socket", func(t *testing.T) {
		f := filepath.Join(dir, "file")
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Listen("unix:"+f, src, nil)
		if !errors.Is(err, ErrInvalidAddr) {
			t.Errorf("got %v, want ErrInvalidAddr", err)
		}
		if b, _ := os.ReadFile(f); string(b) != "x" {
			t.Errorf("the file was changed: got %q", b)
		}
	})
	t.Run("no directory", func(t *testing.T) {
		_, err := Listen("unix:"+filepath.Join(dir, "none", "m.sock"), src, nil)
		var le *ListenError
		if !errors.As(err, &le) || errors.Is(err, ErrAddrInUse) {
			t.Errorf("got %v, want a *ListenError that is not ErrAddrInUse", err)
		}
	})
}

// TestDaemonSource scrapes a real daemon with one device and a raw
// vhost-user connection to it.
func TestDaemonSource(t *testing.T) {
	l := logrus.New()
	l.SetOutput(io.Discard)
	d := daemon.New(logrus.NewEntry(l), daemon.Config{})
	defer d.Close()
	sock := filepath.Join(t.TempDir(), "dev0.sock")
	if _, err := d.AddDevice(daemon.DeviceSpec{ID: "dev0", Socket: sock, Device: rdma.Config{Share: rdma.Share{Weight: 3, MaxOpsPerSec: 5000}}}); err != nil {
		t.Fatal(err)
	}
	h, err := Handler(DaemonSource{D: d})
	if err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, h)
	for _, tt := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"vrdma_devices", nil, 1},
		{"vrdma_vhost_user_connected", dev("dev0"), 0},
		{"vrdma_vhost_user_sessions_total", dev("dev0"), 0},
		{"vrdma_resources", with(dev("dev0"), "type", "qp"), 0},
		{"vrdma_global_pinned_bytes", nil, 0},
		{"vrdma_resource_limit", with(dev("dev0"), "type", "qp"), 1024},
		{"vrdma_share_weight", dev("dev0"), 3},
		{"vrdma_rate_limit_operations_per_second", dev("dev0"), 5000},
		{"vrdma_engine_threads", nil, float64(d.EngineThreads())},
	} {
		if got, ok := value(fams, tt.name, tt.labels); !ok || got != tt.want {
			t.Errorf("before connecting: %s%v: got %v (present %v), want %v", tt.name, tt.labels, got, ok, tt.want)
		}
	}
	if _, ok := value(fams, "vrdma_rate_limit_bytes_per_second", dev("dev0")); ok {
		t.Error("vrdma_rate_limit_bytes_per_second present for a device without that bound")
	}
	// A share changed through the daemon shows at the next scrape.
	bps := uint64(1 << 20)
	if _, err := d.SetShare("dev0", daemon.SharePatch{MaxBytesPerSec: &bps}); err != nil {
		t.Fatal(err)
	}
	if got, ok := value(scrape(t, h), "vrdma_rate_limit_bytes_per_second", dev("dev0")); !ok || got != 1<<20 {
		t.Errorf("after SetShare: vrdma_rate_limit_bytes_per_second got %v (present %v), want %d", got, ok, 1<<20)
	}

	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A request the back-end does not know: a protocol error.
	var hdr [12]byte
	binary.LittleEndian.PutUint32(hdr[0:], 0x7fff)
	binary.LittleEndian.PutUint32(hdr[4:], 1) // version 1
	if _, err := c.Write(hdr[:]); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		fams = scrape(t, h)
		sess, _ := value(fams, "vrdma_vhost_user_sessions_total", dev("dev0"))
		msgs, _ := value(fams, "vrdma_vhost_user_messages_total", dev("dev0"))
		perr, _ := value(fams, "vrdma_protocol_errors_total", dev("dev0"))
		if sess == 1 && msgs == 1 && perr == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a bad message: got sessions %v, messages %v, protocol errors %v; want 1 each", sess, msgs, perr)
		}
		time.Sleep(20 * time.Millisecond)
	}

	if err := d.RemoveDevice("dev0"); err != nil {
		t.Fatal(err)
	}
	fams = scrape(t, h)
	if got, _ := value(fams, "vrdma_devices", nil); got != 0 {
		t.Errorf("after RemoveDevice: vrdma_devices got %v, want 0", got)
	}
	if n := len(fams["vrdma_pinned_bytes"].GetMetric()); n != 0 {
		t.Errorf("after RemoveDevice: got %d vrdma_pinned_bytes series, want 0", n)
	}
}

// TestConcurrentScrapes runs scrapes while the source changes (run with
// -race).
func TestConcurrentScrapes(t *testing.T) {
	src := &fakeSource{}
	h, err := Handler(src)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	defer ts.Close()
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				resp, err := ts.Client().Get(ts.URL)
				if err != nil {
					t.Error(err)
					return
				}
				p := expfmt.NewTextParser(model.UTF8Validation)
				_, err = p.TextToMetricFamilies(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Errorf("scrape: got status %d, error %v; want 200, nil", resp.StatusCode, err)
					return
				}
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				src.mu.Lock()
				src.devs = append(src.devs[:0], DeviceStats{ID: fmt.Sprintf("d%d", i), Device: rdma.Stats{QPs: j}})
				src.mu.Unlock()
			}
		}()
	}
	wg.Wait()
}
