package metrics

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/backend/rdma/hostnic"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/internal/daemon"
)

// scrapeText returns the text exposition of GET url.
func scrapeText(t *testing.T, c *http.Client, url string) []byte {
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
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: got status %d, error %v; want 200, nil", resp.StatusCode, err)
	}
	return b
}

// TestLint runs the Prometheus client's linter (the rules promtool check
// metrics applies) over a scrape with every series present: without
// promtool installed, the conventions are still checked.
func TestLint(t *testing.T) {
	src := &fakeSource{devs: []DeviceStats{
		{ID: "vm1", Connected: true, Limits: Limits{Resources: [5]uint32{1, 2, 3, 4, 5}, PinnedBytes: 1 << 30},
			Share: rdma.Share{Weight: 2, MaxBytesPerSec: 1 << 30, MaxOpsPerSec: 1000}},
		{ID: "vm2"},
	}, pinned: 1 << 20, limit: 1 << 34, threads: 2,
		roce: []RoCEEndpoint{{Addr: "192.0.2.1", Counters: udp.Counters{RxDatagrams: 10, RxDelivered: 7, RxICRC: 2, RxUnknownQP: 1, TxDatagrams: 9}}},
		nics: []HostNIC{{Name: "verbs:rxe0:1", Stats: hostnic.Stats{Posted: 1000, PostNanos: 2_500_000_000, Completions: 990, CQEvents: 5}}}}
	h, err := Handler(src, WithVersion("1.2.3"))
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	defer ts.Close()
	body := scrapeText(t, ts.Client(), ts.URL+"/metrics")
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	for _, name := range []string{"vrdma_build_info", "vrdma_resource_limit", "vrdma_pinned_limit_bytes", "vrdma_global_pinned_limit_bytes",
		"vrdma_roce_rx_datagrams_total", "vrdma_roce_rx_dropped_total", "vrdma_roce_tx_errors_total"} {
		if !bytes.Contains(body, []byte("\n# HELP "+name+" ")) {
			t.Errorf("scrape lacks %s with help text", name)
		}
	}
	for _, series := range []string{`vrdma_roce_rx_dropped_total{address="192.0.2.1",reason="icrc"} 2`,
		`vrdma_roce_rx_dropped_total{address="192.0.2.1",reason="unknown_qp"} 1`, `vrdma_roce_rx_delivered_total{address="192.0.2.1"} 7`,
		`vrdma_hostnic_posted_work_requests_total{rnic="verbs:rxe0:1"} 1000`, `vrdma_hostnic_post_seconds_total{rnic="verbs:rxe0:1"} 2.5`,
		`vrdma_hostnic_completions_total{rnic="verbs:rxe0:1"} 990`} {
		if !bytes.Contains(body, []byte(series)) {
			t.Errorf("scrape lacks %s", series)
		}
	}
}

// TestPromtool runs `promtool check metrics` (Debian package prometheus)
// on a live scrape of a daemon with two devices, one of them with limits
// and a pin quota: it must pass with no output, warnings included. Skips
// without promtool, except under CI=true.
func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("promtool not found (CI=true): apt-get install prometheus")
		}
		t.Skipf("promtool not found (apt-get install prometheus): %v", err)
	}
	l := logrus.New()
	l.SetOutput(io.Discard)
	d := daemon.New(logrus.NewEntry(l), daemon.Config{GlobalMaxPinned: 8 << 30})
	defer d.Close()
	dir := t.TempDir()
	for _, spec := range []daemon.DeviceSpec{
		{ID: "vm1", Socket: filepath.Join(dir, "vm1.sock")},
		{ID: "vm2", Socket: filepath.Join(dir, "vm2.sock"), MaxPinned: 1 << 30,
			Device: rdma.Config{ID: "vm2", Limits: rdma.Limits{MaxQP: 32, MaxCQ: 64, MaxMR: 128},
				Share: rdma.Share{Weight: 5, MaxBytesPerSec: 1 << 30, MaxOpsPerSec: 250000}}},
	} {
		if _, err := d.AddDevice(spec); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Listen("127.0.0.1:0", DaemonSource{D: d, GlobalMaxPinned: 8 << 30}, nil, WithVersion("1.2.3+test"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	body := scrapeText(t, http.DefaultClient, "http://"+s.Addr().String()+"/metrics")
	for _, want := range []string{
		`vrdma_build_info{goarch=`, `version="1.2.3+test"`,
		`vrdma_resource_limit{device="vm2",type="qp"} 32`,
		`vrdma_pinned_limit_bytes{device="vm2"} 1.073741824e+09`,
		`vrdma_global_pinned_limit_bytes 8.589934592e+09`,
		`vrdma_share_weight{device="vm1"} 1`,
		`vrdma_share_weight{device="vm2"} 5`,
		`vrdma_rate_limit_bytes_per_second{device="vm2"} 1.073741824e+09`,
		`vrdma_rate_limit_operations_per_second{device="vm2"} 250000`,
		`vrdma_engine_threads `,
		"\nvrdma_health_degraded 0\n",
		"\nvrdma_state_save_failures_total 0\n",
	} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("scrape lacks %q", want)
		}
	}

	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Errorf("promtool check metrics: got error %v, output:\n%s\nwant neither", err, out)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("scrape (vrdma_ series):\n%s", vrdmaLines(body))
	}
}

func vrdmaLines(body []byte) string {
	var b strings.Builder
	for _, line := range strings.Split(string(body), "\n") {
		if strings.Contains(line, "vrdma_") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}
