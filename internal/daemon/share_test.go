package daemon

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma"
)

// shareOf reads the "share" object of a decoded device answer.
func shareOf(t *testing.T, out map[string]any) Share {
	t.Helper()
	m, ok := out["share"].(map[string]any)
	if !ok {
		t.Fatalf("answer %v has no share object", out)
	}
	num := func(k string) float64 {
		v, ok := m[k].(float64)
		if !ok {
			t.Fatalf("share %v: %s is not a number", m, k)
		}
		return v
	}
	return Share{Weight: uint32(num("weight")), MaxBytesPerSec: uint64(num("max_bytes_per_s")), MaxOpsPerSec: uint64(num("max_ops_per_s"))}
}

// TestPatchShare: a share given at creation, shown by GET, changed field
// by field with PATCH; each answer is the device as it is now, and the
// live device has the share at once.
func TestPatchShare(t *testing.T) {
	d, h := testDaemon(t)
	dir := t.TempDir()
	code, out := call(t, h, "POST", "/v1/devices", addBody("vm1", filepath.Join(dir, "vm1.sock"), `,"share":{"weight":2,"max_ops_per_s":1000}`))
	if code != http.StatusCreated {
		t.Fatalf("POST: got %d %v, want 201", code, out)
	}
	if got, want := shareOf(t, out), (Share{Weight: 2, MaxOpsPerSec: 1000}); got != want {
		t.Errorf("POST answer: got share %+v, want %+v", got, want)
	}
	if code, out := call(t, h, "POST", "/v1/devices", addBody("vm2", filepath.Join(dir, "vm2.sock"), "")); code != http.StatusCreated {
		t.Fatalf("POST vm2: got %d %v, want 201", code, out)
	} else if got := shareOf(t, out); got != (Share{Weight: 1}) {
		t.Errorf("device without a share: got %+v, want weight 1 and no bounds", got)
	}
	dv, _ := d.Device("vm1")
	for _, step := range []struct {
		body string
		want Share      // as the API shows it
		live rdma.Share // as the device has it
	}{
		{`{"share":{"weight":5}}`, Share{Weight: 5, MaxOpsPerSec: 1000}, rdma.Share{Weight: 5, MaxOpsPerSec: 1000}},
		{`{"share":{"max_bytes_per_s":1048576}}`, Share{Weight: 5, MaxBytesPerSec: 1 << 20, MaxOpsPerSec: 1000}, rdma.Share{Weight: 5, MaxBytesPerSec: 1 << 20, MaxOpsPerSec: 1000}},
		{`{"share":{"max_ops_per_s":0}}`, Share{Weight: 5, MaxBytesPerSec: 1 << 20}, rdma.Share{Weight: 5, MaxBytesPerSec: 1 << 20}},
		{`{"share":{}}`, Share{Weight: 5, MaxBytesPerSec: 1 << 20}, rdma.Share{Weight: 5, MaxBytesPerSec: 1 << 20}},
		{`{"share":{"weight":0,"max_bytes_per_s":4096,"max_ops_per_s":7}}`, Share{Weight: 1, MaxBytesPerSec: 4096, MaxOpsPerSec: 7}, rdma.Share{MaxBytesPerSec: 4096, MaxOpsPerSec: 7}},
		{`{"share":{"weight":1000,"max_bytes_per_s":0}}`, Share{Weight: 1000, MaxOpsPerSec: 7}, rdma.Share{Weight: 1000, MaxOpsPerSec: 7}},
	} {
		code, out := call(t, h, "PATCH", "/v1/devices/vm1", step.body)
		if code != http.StatusOK || out["id"] != "vm1" {
			t.Fatalf("PATCH %s: got %d %v, want 200 with the device", step.body, code, out)
		}
		if got := shareOf(t, out); got != step.want {
			t.Errorf("PATCH %s: answer's share %+v, want %+v", step.body, got, step.want)
		}
		if got := dv.Dev.Share(); got != step.live {
			t.Errorf("PATCH %s: device's share %+v, want %+v", step.body, got, step.live)
		}
		if _, out := call(t, h, "GET", "/v1/devices/vm1", ""); shareOf(t, out) != step.want {
			t.Errorf("GET after PATCH %s: share %+v, want %+v", step.body, shareOf(t, out), step.want)
		}
	}
	// The other device is untouched.
	if dv2, _ := d.Device("vm2"); dv2.Dev.Share() != (rdma.Share{}) {
		t.Errorf("vm2's share: got %+v, want the zero share", dv2.Dev.Share())
	}
}

// TestPatchShareErrors: bad patches answer 4xx with the API's error
// shape and change nothing.
func TestPatchShareErrors(t *testing.T) {
	d, h := testDaemon(t)
	if code, out := call(t, h, "POST", "/v1/devices", addBody("vm1", filepath.Join(t.TempDir(), "vm1.sock"), `,"share":{"weight":3}`)); code != http.StatusCreated {
		t.Fatalf("POST: got %d %v", code, out)
	}
	tests := []struct {
		name, method, path, body string
		wantCode                 int
		wantErr                  string
		wantAllow                string // the Allow header of a 405
	}{
		{"weight too big", "PATCH", "/v1/devices/vm1", `{"share":{"weight":1001}}`, 400, "share.weight: 1001 out of range [0, 1000]", ""},
		{"bytes too small", "PATCH", "/v1/devices/vm1", `{"share":{"max_bytes_per_s":4095}}`, 400, "share.max_bytes_per_s: 4095 below 4096", ""},
		{"negative", "PATCH", "/v1/devices/vm1", `{"share":{"weight":-1}}`, 400, "malformed JSON", ""},
		{"weight overflows", "PATCH", "/v1/devices/vm1", `{"share":{"weight":4294967296}}`, 400, "malformed JSON", ""},
		{"string", "PATCH", "/v1/devices/vm1", `{"share":{"weight":"2"}}`, 400, "malformed JSON", ""},
		{"unknown id", "PATCH", "/v1/devices/nope", `{"share":{"weight":2}}`, 404, "no such device: nope", ""},
		{"unknown id, garbage", "PATCH", "/v1/devices/nope", `garbage`, 404, "no such device: nope", ""},
		{"garbage", "PATCH", "/v1/devices/vm1", "\x00\x01garbage", 400, "malformed JSON", ""},
		{"empty body", "PATCH", "/v1/devices/vm1", ``, 400, "malformed JSON", ""},
		{"no share", "PATCH", "/v1/devices/vm1", `{}`, 400, "share: required", ""},
		{"null share", "PATCH", "/v1/devices/vm1", `{"share":null}`, 400, "share: required", ""},
		{"share not an object", "PATCH", "/v1/devices/vm1", `{"share":3}`, 400, "malformed JSON", ""},
		{"fields at the top", "PATCH", "/v1/devices/vm1", `{"weight":2}`, 400, "unknown field", ""},
		{"unknown share field", "PATCH", "/v1/devices/vm1", `{"share":{"weight":2,"burst":9}}`, 400, "unknown field", ""},
		{"other fields", "PATCH", "/v1/devices/vm1", `{"share":{"weight":2},"limits":{"max_qps":1}}`, 400, "unknown field", ""},
		{"trailing data", "PATCH", "/v1/devices/vm1", `{"share":{"weight":2}}{}`, 400, "trailing data", ""},
		{"too large", "PATCH", "/v1/devices/vm1", `{"share":{"weight":2` + strings.Repeat(" ", maxRequestBody) + `}}`, 413, "larger than", ""},
		{"PUT on a device", "PUT", "/v1/devices/vm1", `{"share":{"weight":2}}`, 405, "not allowed", "GET, HEAD, PATCH, DELETE"},
		{"POST on a device", "POST", "/v1/devices/vm1", `{"share":{"weight":2}}`, 405, "not allowed", "GET, HEAD, PATCH, DELETE"},
		{"PATCH on the list", "PATCH", "/v1/devices", `{"share":{"weight":2}}`, 405, "not allowed", "GET, HEAD, POST"},
		{"PATCH on health", "PATCH", "/v1/health", `{}`, 405, "not allowed", "GET, HEAD"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(tt.method, tt.path, strings.NewReader(tt.body))
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.wantCode || !strings.Contains(rec.Body.String(), tt.wantErr) {
				t.Errorf("got %d %s, want %d with %q", rec.Code, rec.Body, tt.wantCode, tt.wantErr)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" || !strings.HasPrefix(rec.Body.String(), `{`) {
				t.Errorf("got Content-Type %q body %q, want a JSON error", ct, rec.Body)
			}
			if got := rec.Header().Get("Allow"); got != tt.wantAllow {
				t.Errorf("Allow: got %q, want %q", got, tt.wantAllow)
			}
			if tt.wantAllow != "" && !strings.Contains(rec.Body.String(), tt.wantAllow) {
				t.Errorf("405 body %s does not list the allowed methods %q", rec.Body, tt.wantAllow)
			}
		})
	}
	dv, _ := d.Device("vm1")
	if got := dv.Dev.Share(); got != (rdma.Share{Weight: 3}) {
		t.Errorf("share after the bad patches: got %+v, want weight 3 as created", got)
	}
}

// TestSharePersisted: shares given at creation and by PATCH are saved and
// come back after a restart; a file with a share is version 2, and one
// without shares goes back to version 1.
func TestSharePersisted(t *testing.T) {
	state, socks := t.TempDir(), t.TempDir()
	d1 := stateDaemon(t, state)
	h := d1.Handler()
	for _, body := range []string{
		addBody("vm1", filepath.Join(socks, "vm1.sock"), `,"share":{"weight":4,"max_bytes_per_s":1073741824}`),
		addBody("vm2", filepath.Join(socks, "vm2.sock"), `,"limits":{"max_qps":8}`),
	} {
		if code, out := call(t, h, "POST", "/v1/devices", body); code != http.StatusCreated {
			t.Fatalf("POST %s: got %d %v", body, code, out)
		}
	}
	if code, out := call(t, h, "PATCH", "/v1/devices/vm2", `{"share":{"max_ops_per_s":50000}}`); code != http.StatusOK {
		t.Fatalf("PATCH: got %d %v", code, out)
	}
	// A command-line device can be patched too; it is not saved.
	if _, err := d1.AddDevice(DeviceSpec{ID: "cli", Socket: filepath.Join(socks, "cli.sock")}); err != nil {
		t.Fatal(err)
	}
	if code, out := call(t, h, "PATCH", "/v1/devices/cli", `{"share":{"weight":9}}`); code != http.StatusOK || shareOf(t, out).Weight != 9 {
		t.Fatalf("PATCH cli: got %d %v, want 200 with weight 9", code, out)
	}
	doc := readState(t, state)
	if doc.Version != StateVersion || len(doc.Devices) != 2 {
		t.Fatalf("state file: got version %d with %d devices, want %d with 2 (vm1, vm2)", doc.Version, len(doc.Devices), StateVersion)
	}
	want := map[string]rdma.Share{
		"vm1": {Weight: 4, MaxBytesPerSec: 1 << 30},
		"vm2": {MaxOpsPerSec: 50000},
	}
	for _, r := range doc.Devices {
		w := want[r.ID]
		if r.Share == nil || *r.Share != (Share{Weight: w.Weight, MaxBytesPerSec: w.MaxBytesPerSec, MaxOpsPerSec: w.MaxOpsPerSec}) {
			t.Errorf("state file: %s has share %+v, want %+v", r.ID, r.Share, w)
		}
	}
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}

	d2 := stateDaemon(t, state)
	for id, w := range want {
		dv, ok := d2.Device(id)
		if !ok {
			t.Fatalf("%s not restored", id)
		}
		if got := dv.Dev.Share(); got != w {
			t.Errorf("%s after the restart: share %+v, want %+v", id, got, w)
		}
	}
	if dv, _ := d2.Device("vm2"); dv.Info().Limits.MaxQPs != 8 {
		t.Errorf("vm2 after the restart: max_qps %d, want 8", dv.Info().Limits.MaxQPs)
	}
	// Back to the zero share everywhere: the file is version 1 again,
	// without share keys.
	h2 := d2.Handler()
	for id := range want {
		if code, out := call(t, h2, "PATCH", "/v1/devices/"+id, `{"share":{"weight":0,"max_bytes_per_s":0,"max_ops_per_s":0}}`); code != http.StatusOK {
			t.Fatalf("PATCH %s: got %d %v", id, code, out)
		}
	}
	b, err := os.ReadFile(filepath.Join(state, StateFile))
	if err != nil {
		t.Fatal(err)
	}
	if doc := readState(t, state); doc.Version != stateVersionNoShare || strings.Contains(string(b), `"share"`) {
		t.Errorf("state file without shares: got version %d\n%s\nwant version %d and no share key", doc.Version, b, stateVersionNoShare)
	}
}

// TestOldStateFile: a state file as vrdmad wrote it before shares existed
// is read as it is (every device weight 1, no bounds), and the first
// PATCH rewrites it with the share and everything else kept.
func TestOldStateFile(t *testing.T) {
	state, socks := t.TempDir(), t.TempDir()
	sock := filepath.Join(socks, "vm1.sock")
	old := fmt.Sprintf(`{
  "version": 1,
  "devices": [
    {
      "id": "vm1",
      "socket": %q,
      "limits": {
        "max_qps": 64,
        "max_cqs": 0,
        "max_mrs": 0,
        "max_pinned_bytes": 536870912
      },
      "guid": "0211:2233:4455:6677",
      "uuid": "02112233-4455-6677-8f1e-6a0c2b9d4e10",
      "doorbell_queues": 2
    }
  ]
}
`, sock)
	if err := os.WriteFile(filepath.Join(state, StateFile), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	d := stateDaemon(t, state)
	dv, ok := d.Device("vm1")
	if !ok {
		t.Fatal("vm1 not restored from the old file")
	}
	info := dv.Info()
	if info.Share != (Share{Weight: 1}) || dv.Dev.Share() != (rdma.Share{}) || info.Limits.MaxQPs != 64 || info.GUID != "0211:2233:4455:6677" || info.NumQueues != 4 {
		t.Fatalf("vm1 from the old file: got %+v (device share %+v)", info, dv.Dev.Share())
	}
	if code, out := call(t, d.Handler(), "PATCH", "/v1/devices/vm1", `{"share":{"weight":7}}`); code != http.StatusOK {
		t.Fatalf("PATCH: got %d %v", code, out)
	}
	doc := readState(t, state)
	if doc.Version != StateVersion || len(doc.Devices) != 1 {
		t.Fatalf("state file after PATCH: got version %d, %d devices; want %d, 1", doc.Version, len(doc.Devices), StateVersion)
	}
	r := doc.Devices[0]
	if r.Share == nil || *r.Share != (Share{Weight: 7}) || r.Limits == nil || r.Limits.MaxQPs != 64 || r.Limits.MaxPinnedBytes != 512<<20 ||
		r.UUID != "02112233-4455-6677-8f1e-6a0c2b9d4e10" || r.DoorbellQueues != 2 || r.Socket != sock {
		t.Errorf("state file after PATCH: got %+v (share %+v), want the old record with share weight 7", r, r.Share)
	}
}

// TestSetShareNotSaved: a PATCH of a persisted device whose state file
// cannot be written answers 500 and leaves the share as it was.
func TestSetShareNotSaved(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	d := stateDaemon(t, state)
	h := d.Handler()
	if code, out := call(t, h, "POST", "/v1/devices", addBody("vm1", filepath.Join(t.TempDir(), "vm1.sock"), `,"share":{"weight":2}`)); code != http.StatusCreated {
		t.Fatalf("POST: got %d %v", code, out)
	}
	if err := os.RemoveAll(state); err != nil {
		t.Fatal(err)
	}
	code, out := call(t, h, "PATCH", "/v1/devices/vm1", `{"share":{"weight":9}}`)
	if msg, _ := out["error"].(string); code != http.StatusInternalServerError || !strings.Contains(msg, "device state") || !strings.Contains(msg, "unchanged") {
		t.Errorf("PATCH with the state directory gone: got %d %v, want 500 naming the device state", code, out)
	}
	dv, _ := d.Device("vm1")
	if got := dv.Dev.Share(); got != (rdma.Share{Weight: 2}) {
		t.Errorf("share after the failed save: got %+v, want weight 2 as before", got)
	}
	_, err := d.SetShare("vm1", SharePatch{})
	if !errors.Is(err, ErrState) {
		t.Errorf("SetShare: got %v, want ErrState", err)
	}
	if _, err := d.SetShare("nope", SharePatch{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("SetShare of no device: got %v, want ErrNotFound", err)
	}
}

// TestSetShareConcurrent: patches of different fields of one device at
// the same time each keep the other's fields (run with -race).
func TestSetShareConcurrent(t *testing.T) {
	d, _ := testDaemon(t)
	if _, err := d.AddDevice(DeviceSpec{ID: "vm1", Socket: filepath.Join(t.TempDir(), "vm1.sock")}); err != nil {
		t.Fatal(err)
	}
	const n = 200
	var wg sync.WaitGroup
	for _, set := range []func(i int) SharePatch{
		func(i int) SharePatch { w := uint32(i); return SharePatch{Weight: &w} },
		func(i int) SharePatch { o := uint64(i) * 10; return SharePatch{MaxOpsPerSec: &o} },
		func(i int) SharePatch { b := uint64(i) << 20; return SharePatch{MaxBytesPerSec: &b} },
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= n; i++ {
				if _, err := d.SetShare("vm1", set(i)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	dv, _ := d.Device("vm1")
	if got, want := dv.Dev.Share(), (rdma.Share{Weight: n, MaxOpsPerSec: n * 10, MaxBytesPerSec: n << 20}); got != want {
		t.Errorf("after concurrent patches: got %+v, want %+v", got, want)
	}
}

func FuzzDecodePatchRequest(f *testing.F) {
	f.Add([]byte(`{"share":{"weight":4,"max_bytes_per_s":1073741824,"max_ops_per_s":100000}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := DecodePatchRequest(body)
		if err != nil {
			if p != (SharePatch{}) {
				t.Fatalf("error %v with a non-zero patch %+v", err, p)
			}
			if !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("got %v, want ErrInvalidRequest", err)
			}
			return
		}
		s, err := checkShare(p, rdma.Share{})
		if err != nil {
			t.Fatalf("accepted patch %+v fails on a device: %v", p, err)
		}
		if s.Check() != nil || s.Weight > rdma.MaxWeight {
			t.Fatalf("accepted share %+v", s)
		}
	})
}
